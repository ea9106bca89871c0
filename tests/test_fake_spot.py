"""The fake SageMaker runs managed spot training jobs as the service does, interruptions included.

CreateTrainingJob with `EnableManagedSpotTraining` is checked as the service checks it (a bad
request is a ValidationException and nothing runs). A spot job is then interrupted as many times as
the fake is told (`FakeSageMaker(spot_interruptions=N)`): once its hosts have written a checkpoint,
every host gets SIGTERM, the checkpoint folder goes to `CheckpointConfig.S3Uri`, and the job starts
again on new hosts from the input channels and that checkpoint, until it ends. The slow tests run lab
3's real script through the workshop (`run_on_sagemaker(..., spot=True)`), and a tiny script that
outlives the job's MaxWaitTimeInSeconds.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch:2.13-cpu-amzn2023-sagemaker"  # lab 3's image
GROUP = "/aws/sagemaker/TrainingJobs"


@pytest.fixture
def aws_user() -> str:
    return "alice"


@pytest.fixture
def fake(no_aws: None, tmp_path: Path):
    import fake_sagemaker

    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=1.0, spot_interruptions=1) as running:
        yield running


def _sagemaker(fake: Any) -> Any:
    import boto3

    # No client-side validation: the request reaches the service's (the fake's) own checks.
    return boto3.Session(region_name=fake.region).client("sagemaker", config=Config(parameter_validation=False))


def streams(fake: Any, job: str) -> dict[str, list[str]]:
    """Every CloudWatch stream of a job (`<job>/algo-N-<epoch>`, one per host per attempt) -> its lines."""
    import boto3

    client = boto3.Session(region_name=fake.region).client("logs")
    found = client.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix=job + "/")["logStreams"]
    return {
        s["logStreamName"].split("/", 1)[1]: [
            e["message"] for e in client.get_log_events(logGroupName=GROUP, logStreamName=s["logStreamName"],
                                                        startFromHead=True)["events"]
        ]
        for s in found
    }


# --------------------------------------------------------------------------- the request, checked


def _job(**changes: Any) -> dict[str, Any]:
    """A CreateTrainingJob request for a spot job, with `changes` ("Stopping.Key" reaches into the
    StoppingCondition, "Resource.Key" into the ResourceConfig; None removes)."""
    request: dict[str, Any] = {
        "TrainingJobName": "alice-spot-1",
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/FakeSageMakerTrainingRole",
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600, "MaxWaitTimeInSeconds": 1200},
        "EnableManagedSpotTraining": True,
        "CheckpointConfig": {"S3Uri": "s3://bucket/checkpoints", "LocalPath": "/opt/ml/checkpoints"},
    }
    for key, value in changes.items():
        where, _, name = key.rpartition(".")
        target = {"": request, "Stopping": request["StoppingCondition"], "Resource": request["ResourceConfig"]}[where]
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value
    return request


_INVALID = {
    "max wait without spot": ({"EnableManagedSpotTraining": None},
                              "Invalid MaxWaitTimeInSeconds. It is only supported when EnableManagedSpotTraining is set to true"),
    "max wait on a job that says no to spot": ({"EnableManagedSpotTraining": False},
                                               "It is only supported when EnableManagedSpotTraining is set to true"),
    "spot without max wait": ({"Stopping.MaxWaitTimeInSeconds": None}, "MaxWaitTimeInSeconds must be given"),
    "max wait below max runtime": ({"Stopping.MaxWaitTimeInSeconds": 599},
                                   "(599) must be equal to or greater than MaxRuntimeInSeconds (600)"),
    "max wait below the default runtime": ({"Stopping.MaxRuntimeInSeconds": None, "Stopping.MaxWaitTimeInSeconds": 3600},
                                           "(3600) must be equal to or greater than MaxRuntimeInSeconds (86400, its default"),
    "spot with instance preferences": ({"Resource.InstancePreferences": [{"InstanceType": "ml.m5.xlarge", "InstanceCount": 1}]},
                                       "InstancePreferences is mutually exclusive with EnableManagedSpotTraining"),
}


@pytest.mark.parametrize("case", list(_INVALID))
def test_bad_spot_requests_are_validation_exceptions_and_nothing_runs(fake: Any, case: str) -> None:
    changes, message = _INVALID[case]
    sm = _sagemaker(fake)
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**_job(**copy.deepcopy(changes)))
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert message in err.value.response["Error"]["Message"]
    assert fake.jobs == []  # nothing ran ...
    assert sm.list_training_jobs()["TrainingJobSummaries"] == []  # ... or was recorded


def test_a_tuning_job_whose_training_jobs_break_the_spot_rules_is_refused() -> None:
    """The same rules hold for a tuning job's TrainingJobDefinition (users have quoted the service's
    "Invalid MaxWaitTimeInSeconds" answer to CreateHyperParameterTuningJob too)."""
    import fake_sagemaker
    from moto.sagemaker.exceptions import ValidationError

    job = _job(EnableManagedSpotTraining=None)
    request = {
        "HyperParameterTuningJobName": "alice-tune-1",
        "HyperParameterTuningJobConfig": {
            "Strategy": "Grid", "ResourceLimits": {"MaxParallelTrainingJobs": 1},
            "HyperParameterTuningJobObjective": {"Type": "Maximize", "MetricName": "test_accuracy"},
            "ParameterRanges": {"CategoricalParameterRanges": [{"Name": "lr", "Values": ["0.01", "0.05"]}]},
        },
        "TrainingJobDefinition": {
            **{k: job[k] for k in ("RoleArn", "OutputDataConfig", "ResourceConfig", "StoppingCondition")},
            "AlgorithmSpecification": {**job["AlgorithmSpecification"], "MetricDefinitions": [
                {"Name": "test_accuracy", "Regex": "test_accuracy=(\\S+)"}]},
        },
    }
    with pytest.raises(ValidationError, match="It is only supported when EnableManagedSpotTraining is set to true"):
        fake_sagemaker.validate_tuning_request(request)
    request["TrainingJobDefinition"]["EnableManagedSpotTraining"] = True
    assert fake_sagemaker.validate_tuning_request(request)  # spot, with a wait bound: accepted
    fake_sagemaker.validate_training_request(_job())  # and a valid spot training job too


def test_spot_settings_of_the_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    import fake_sagemaker

    settings = ("FAKE_SAGEMAKER_SPOT_INTERRUPTIONS", "FAKE_SAGEMAKER_SPOT_CHECKPOINT_WAIT_S",
                "FAKE_SAGEMAKER_SPOT_RESTART_WAIT_S")
    for name, value in zip(settings, ("2", "15", "0.5"), strict=True):
        monkeypatch.setenv(name, value)
    fake = fake_sagemaker.FakeSageMaker()
    assert (fake.spot_interruptions, fake.spot_checkpoint_wait_s, fake.spot_restart_wait_s) == (2, 15.0, 0.5)
    assert fake_sagemaker.FakeSageMaker(spot_interruptions=0).spot_interruptions == 0  # the argument wins
    for name in settings:
        monkeypatch.delenv(name)
    fake = fake_sagemaker.FakeSageMaker()
    assert (fake.spot_interruptions, fake.spot_checkpoint_wait_s, fake.spot_restart_wait_s) == (0, 60.0, 5.0)
    with pytest.raises(ValueError, match="must be 0 or more"):
        fake_sagemaker.FakeSageMaker(spot_interruptions=-1)


@pytest.mark.parametrize(("path", "counts"), [
    ("checkpoint.pt", True), ("step-40/__0_0.distcp", True), ("ckpt-3.index", True),
    ("checkpoint.pt.tmp", False), ("progress.json", False), ("fault.json", False),  # written, or a record
    ("step-40.partial/meta.pt", False), ("ckpt-3_temp/part-00000", False), ("x.tempstate123", False),
])
def test_what_the_spot_watcher_takes_for_a_checkpoint(path: str, counts: bool) -> None:
    import fake_sagemaker

    assert fake_sagemaker._is_checkpoint(path) is counts


# --------------------------------------------------------------------------- spot jobs that train


@pytest.mark.slow
def test_lab3_on_spot_is_interrupted_once_and_completes_from_its_checkpoint(fake: Any, mnist_dir: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """Lab 3 on 2 spot instances, through the workshop: the fake interrupts it once its rank 0 has
    written checkpoint.pt; the second attempt, on new hosts with the checkpoint from S3, says it
    resumed from it and trains to the end; billing counts the hosts' seconds, not the wait."""
    import boto3

    from workshop.labs import get_lab
    from workshop.runner import run_on_sagemaker

    hyperparameters = {"epochs": 2, "checkpoint-every": 5, "log-interval": 5}
    result = run_on_sagemaker(get_lab("data_parallel"), hosts=2, procs_per_host=1, spot=True, max_run_s=900,
                              hyperparameters=hyperparameters, data_dir=mnist_dir, confirm_cost=True)
    assert result.status == "Completed", result.failure_reason
    assert result.spot_line() in capsys.readouterr().out
    boto = boto3.Session(region_name=fake.region)
    described = boto.client("sagemaker").describe_training_job(TrainingJobName=result.job_name)
    assert described["EnableManagedSpotTraining"] is True
    assert described["StoppingCondition"] == {"MaxRuntimeInSeconds": 900, "MaxWaitTimeInSeconds": 1800}
    assert [t["Status"] for t in described["SecondaryStatusTransitions"]] == [
        "Starting", "Downloading", "Training", "Interrupted", "Starting", "Downloading", "Training", "Uploading",
        "Completed"]
    [run] = fake.jobs
    assert run.spot and run.interruptions == 1
    assert [a["outcome"] for a in run.attempts] == ["interrupted", "completed"]
    assert "checkpoint.pt" in run.attempts[0]["reclaimed"]
    assert (Path(run.workdir) / "attempt-2" / "hosts" / "algo-1").is_dir()  # new hosts, their own folders

    # Billing: TrainingTimeInSeconds is the job's wall clock, BillableTimeInSeconds its hosts' seconds.
    training, billable = described["TrainingTimeInSeconds"], described["BillableTimeInSeconds"]
    assert billable == int(sum(a["hosts_s"] for a in run.attempts)) == run.billable_time_s
    assert 0 < billable < training == run.training_time_s
    # ... and the workshop reports both, with AWS's savings formula.
    assert (result.spot, result.training_time_s, result.billable_time_s) == (True, training, billable)
    assert result.spot_line() == (f"managed spot: billable {billable} s of {training} s training: a saving of "
                                  f"{1 - billable / training:.0%} (1 - billable / training, AWS's formula for "
                                  "managed spot training)")

    # One stream per host per attempt; the second attempt resumed from the first one's checkpoint.
    lines = streams(fake, result.job_name)
    first, second = (sorted(a["log_streams"]) for a in run.attempts)
    assert sorted(lines) == sorted(s.split("/", 1)[1] for s in first + second) and len(lines) == 4
    text = {which: [line for s in names for line in lines[s.split("/", 1)[1]]] for which, names in (("first", first),
                                                                                                     ("second", second))}
    assert not any("resumed from" in line for line in text["first"])
    resumed = [m for line in text["second"] if (m := re.match(r"resumed from (\S+) at step (\d+) \(restart 0\)", line))]
    assert len(resumed) == 1, text["second"]
    step = int(resumed[0].group(2))
    assert resumed[0].group(1) == "/opt/ml/checkpoints/checkpoint.pt" and step >= 5 and step % 5 == 0
    steps_done = [int(m.group(1)) for line in text["first"] if (m := re.search(r"METRICS rank=0 .*\bstep=(\d+)", line))]
    # The first attempt trained (its last lines may be lost with its hosts: torchrun relays them late) ...
    assert steps_done and min(steps_done) <= step
    steps_again = [int(m.group(1)) for line in text["second"] if (m := re.search(r"METRICS rank=0 .*\bstep=(\d+)", line))]
    assert min(steps_again) > step  # ... and the second one went on from there

    # The checkpoint is in S3, and the model is a normal one.
    bucket, _, prefix = described["CheckpointConfig"]["S3Uri"][len("s3://"):].partition("/")
    keys = [o["Key"] for o in boto.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    assert f"{prefix.rstrip('/')}/checkpoint.pt" in keys
    [final] = [float(m.group(1)) for line in text["second"] if (m := re.search(r"final_test_accuracy=(\S+)", line))]
    assert final >= 0.9 and result.final_metrics["test_accuracy"] == pytest.approx(final)  # FinalMetricDataList
    assert run.final_metrics == result.final_metrics
    print(f"spot: attempts {run.attempts}; training {training} s, billable {billable} s; resumed at step {step}; "
          f"final test accuracy {final:.4f}")



@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from workshop.datasets.corpus import prepare_corpus

    return prepare_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.slow
def test_lab4_on_two_spot_instances_resumes_from_the_shards_every_host_uploaded(fake: Any, corpus: Any) -> None:
    """Lab 4 on 2 spot instances: each host writes its own ranks' shards (and a copy of the index) into a
    checkpoint folder of its own, and every host's folder syncs with the one S3 URI, so S3 holds the whole
    checkpoint and the second attempt's hosts download it whole. Before: the fake gave every host one
    folder, which hid that the first save fails on SageMaker ("lacks __1_0.distcp")."""
    import boto3

    from workshop.labs import get_lab
    from workshop.runner import run_on_sagemaker

    hyperparameters = {"steps": 40, "checkpoint-every": 10, "log-interval": 5, "layers": 2, "d-model": 64,
                       "seq-len": 32, "batch-size": 8}
    result = run_on_sagemaker(get_lab("model_parallel"), hosts=2, procs_per_host=1, spot=True, max_run_s=900,
                              hyperparameters=hyperparameters, data_dir=corpus.root, confirm_cost=True)
    assert result.status == "Completed", result.failure_reason
    [run] = fake.jobs
    assert [a["outcome"] for a in run.attempts] == ["interrupted", "completed"]
    lines = streams(fake, result.job_name)
    second = [line for s in run.attempts[1]["log_streams"] for line in lines[s.split("/", 1)[1]]]
    resumed = [m for line in second if (m := re.match(r"resumed from /opt/ml/checkpoints/step-(\d+) at step \d+ \(restart 0\)", line))]
    if resumed:  # the usual case: the interruption came once both hosts had renamed their step-N.partial
        assert int(resumed[0].group(1)) % 10 == 0 and len(resumed) == 1
    else:  # it came between the two hosts' renames: a save cut short, as a .partial folder on one host is
        assert any(re.match(r"The checkpoint /opt/ml/checkpoints/step-\d+ is incomplete: ", line) for line in second), second
    assert not any(line.startswith("Fetched ") for line in second)  # every host downloaded every file
    # S3 holds every host's files together (and what the rotation deleted, deleted); no host held them all.
    described = boto3.Session(region_name=fake.region).client("sagemaker").describe_training_job(
        TrainingJobName=result.job_name)
    bucket, _, prefix = described["CheckpointConfig"]["S3Uri"][len("s3://"):].partition("/")
    keys = {o["Key"][len(prefix.rstrip("/")) + 1:]
            for o in boto3.Session(region_name=fake.region).client("s3").list_objects_v2(
                Bucket=bucket, Prefix=prefix)["Contents"]}
    step40 = {".metadata", "meta.pt", "checksums.json", "__0_0.distcp", "__1_0.distcp"}
    assert {k.split("/", 1)[1] for k in keys if k.startswith("step-40/")} == step40
    assert {k.split("/", 1)[0] for k in keys if k.startswith("step-")} == {"step-30", "step-40"}, sorted(keys)
    hosts = Path(run.workdir) / "attempt-2" / "hosts"
    for host, own in (("algo-1", "__0_0.distcp"), ("algo-2", "__1_0.distcp")):
        held = {p.name for p in (hosts / host / "checkpoints" / "step-40").iterdir()}
        assert held == {".metadata", "meta.pt", "checksums.json", own}, (host, held)


_SLEEPER = '''\
import os, pathlib, sys, time
folder = pathlib.Path("/opt/ml/checkpoints")
state = folder / "state.txt"
print("found checkpoint: " + state.read_text() if state.exists() else "no checkpoint", flush=True)
folder.mkdir(parents=True, exist_ok=True)
state.write_text("written by " + os.environ.get("SM_CURRENT_HOST", "?"))
print("checkpoint written; training for a long time", flush=True)
time.sleep(300)
'''


@pytest.mark.slow
def test_a_spot_job_that_outlives_its_max_wait_is_stopped(fake: Any, tmp_path: Path) -> None:
    """MaxWaitTimeInSeconds bounds the whole job, interruptions included: a script that trains
    forever is interrupted once (after its checkpoint), starts again from that checkpoint, and is
    stopped when the wait bound has passed (Stopping, then MaxWaitTimeExceeded)."""
    import boto3
    from sagemaker.core.training.configs import (
        CheckpointConfig,
        Compute,
        SourceCode,
        StoppingCondition,
    )
    from sagemaker.train.model_trainer import ModelTrainer

    from workshop.cloud import aws

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(_SLEEPER)
    boto = boto3.Session(region_name=fake.region)
    session = aws.sagemaker_session(boto)
    trainer = ModelTrainer(
        sagemaker_session=session, role=fake.role_arn, training_image=IMAGE, base_job_name="alice-sleeper",
        source_code=SourceCode(source_dir=str(code), entry_script="train.py"),
        compute=Compute(instance_type="ml.m5.xlarge", instance_count=1, enable_managed_spot_training=True),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=25, max_wait_time_in_seconds=25),
        checkpoint_config=CheckpointConfig(s3_uri=f"s3://{aws.default_bucket(session)}/alice/sleeper-checkpoints",
                                           local_path="/opt/ml/checkpoints"),
    )
    trainer.train(wait=False, logs=False)
    name = trainer._latest_training_job.training_job_name
    fake.wait(name)
    described = boto.client("sagemaker").describe_training_job(TrainingJobName=name)
    assert (described["TrainingJobStatus"], described["SecondaryStatus"]) == ("Stopped", "MaxWaitTimeExceeded")
    assert described["FailureReason"] == "Training job reached its MaxWaitTimeInSeconds of 25 s."
    assert [t["Status"] for t in described["SecondaryStatusTransitions"]] == [
        "Starting", "Downloading", "Training", "Interrupted", "Starting", "Downloading", "Training", "Stopping",
        "MaxWaitTimeExceeded"]
    [run] = fake.jobs
    assert [a["outcome"] for a in run.attempts] == ["interrupted", "timed out"] and run.interruptions == 1
    lines = streams(fake, name)
    first, second = (a["log_streams"][0].split("/", 1)[1] for a in run.attempts)
    assert "no checkpoint" in lines[first] and "found checkpoint: written by algo-1" in lines[second]
    assert described["BillableTimeInSeconds"] < described["TrainingTimeInSeconds"] <= 25 + 15  # stopped near 25 s
