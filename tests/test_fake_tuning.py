"""The fake SageMaker runs hyperparameter tuning jobs as the service and the framework images do.

CreateHyperParameterTuningJob is checked as the service checks it (a bad request is a
ValidationException and nothing runs), then its trials run as real training jobs, up to
MaxParallelTrainingJobs at once (test_fake_lifecycle.py shows them side by side, and the instance
quota). A tuning job has no ContainerEntrypoint, so each trial runs what a framework image runs with
`sagemaker_program`: the `sagemaker-training` toolkit's plain `python <program> --key value` on
every host. The slow tests build the request with the real SDK (`HyperparameterTuner` over a
`ModelTrainer`) and train lab 3's script on the MNIST subset; the last one reproduces
sagemaker-python-sdk issue #5610 (a `Torchrun()` trainer tuned on 2 instances trains a world of
one on each host).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from conftest import LAB3_IMAGE, repo_path, tuning_request

IMAGE = LAB3_IMAGE
LAB3_CODE = repo_path("3_data_parallel", "code")
QUICK = {"epochs": 1, "max-steps": 5, "log-interval": 1, "batch-size": 32}  # a few seconds per host


@pytest.fixture
def aws_user() -> str:
    return "alice"


@pytest.fixture
def fake(no_aws: None, tmp_path: Path):
    import fake_sagemaker

    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=1.0) as running:
        yield running


def _sagemaker(fake: Any, validate: bool = True) -> Any:
    import boto3

    config = None if validate else Config(parameter_validation=False)  # reach the service's own checks
    return boto3.Session(region_name=fake.region).client("sagemaker", config=config)


def upload_mnist(fake: Any, channels: dict[str, Path]) -> dict[str, str]:
    """The train and test channels in the fake's S3 (the SDK's default bucket), as S3 URIs."""
    import boto3

    from workshop.cloud import aws

    boto = boto3.Session(region_name=fake.region)
    bucket = aws.sagemaker_session(boto).default_bucket()
    s3 = boto.client("s3")
    uris = {}
    for name, folder in channels.items():
        for path in sorted(Path(folder).iterdir()):
            s3.upload_file(str(path), bucket, f"alice/mnist/{name}/{path.name}")
        uris[name] = f"s3://{bucket}/alice/mnist/{name}"
    return uris


def tuner(fake: Any, *, lrs: list[str], hosts: int, torchrun: bool = False) -> Any:
    """SDK 3.27's HyperparameterTuner over a ModelTrainer of lab 3, as the workshop builds one: the
    lab's image, its metric definitions, a Grid over `lr`."""
    import boto3
    from sagemaker.core.parameter import CategoricalParameter
    from sagemaker.core.training.configs import Compute, SourceCode, StoppingCondition
    from sagemaker.train.distributed import Torchrun
    from sagemaker.train.model_trainer import ModelTrainer
    from sagemaker.train.tuner import HyperparameterTuner

    from workshop.cloud import aws
    from workshop.metrics import sagemaker_metric_definitions

    boto = boto3.Session(region_name=fake.region)
    trainer = ModelTrainer(
        sagemaker_session=aws.sagemaker_session(boto), role=fake.role_arn, training_image=IMAGE,
        base_job_name="alice-tune", source_code=SourceCode(source_dir=str(LAB3_CODE), entry_script="train.py"),
        distributed=Torchrun(process_count_per_node=1) if torchrun else None,
        compute=Compute(instance_type="ml.m5.xlarge", instance_count=hosts),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=600), hyperparameters=dict(QUICK),
    )
    return HyperparameterTuner(
        trainer, "test_accuracy", {"lr": CategoricalParameter(lrs)},
        metric_definitions=sagemaker_metric_definitions(["test_accuracy", "train_loss"]),
        strategy="Grid", objective_type="Maximize", max_jobs=None, max_parallel_jobs=2,
        base_tuning_job_name="alice-tune",
    )


def host_logs(fake: Any, job: str) -> dict[str, list[str]]:
    """Each host's CloudWatch lines of a training job (stream `<job>/algo-N-<epoch>`)."""
    import boto3

    client = boto3.Session(region_name=fake.region).client("logs")
    group = "/aws/sagemaker/TrainingJobs"
    streams = client.describe_log_streams(logGroupName=group, logStreamNamePrefix=job + "/")["logStreams"]
    return {
        s["logStreamName"].split("/")[-1].rsplit("-", 1)[0]: [
            e["message"] for e in client.get_log_events(logGroupName=group, logStreamName=s["logStreamName"],
                                                        startFromHead=True)["events"]
        ]
        for s in streams
    }


def configuration(lines: list[str]) -> dict[str, Any]:
    """The `Configuration: {...}` line lab 3's script prints on rank 0."""
    found = [json.loads(line.split("Configuration: ", 1)[1]) for line in lines if line.startswith("Configuration: ")]
    assert len(found) == 1, lines
    return found[0]


# --------------------------------------------------------------------------- the request, checked


_CONTINUOUS_LR = {"ContinuousParameterRanges": [{"Name": "lr", "MinValue": "0.001", "MaxValue": "0.1"}]}
_INVALID = {
    "name too long": ({"HyperParameterTuningJobName": "a" * 33}, "Member must have length less than or equal to 32"),
    "name pattern": ({"HyperParameterTuningJobName": "alice_tune"}, "Member must satisfy regular expression pattern"),
    "objective not a metric": ({"Config.HyperParameterTuningJobObjective": {"Type": "Maximize", "MetricName": "accuracy"}},
                               "A metric is required for this hyperparameter tuning job objective. Provide a metric "
                               "in the metric definitions."),
    "grid of a continuous range": ({"Config.ParameterRanges": _CONTINUOUS_LR},
                                   "Only categorical parameters are supported when using the grid search strategy"),
    "grid of the wrong size": ({"Limits.MaxNumberOfTrainingJobs": 3},
                               "must equal the total number of distinct categorical combinations possible (2)"),
    "tuned and static": ({"Definition.StaticHyperParameters": {"lr": "0.1", "sagemaker_program": "train.py"}},
                         "lr are both static"),
    "no parallel jobs": ({"Limits.MaxParallelTrainingJobs": 0}, "Member must have value greater than or equal to 1"),
    "several definitions": ({"TrainingJobDefinitions": [{"DefinitionName": "a", **tuning_request()["TrainingJobDefinition"]}]},
                            "fake_sagemaker does not simulate TrainingJobDefinitions"),  # whole: the model needs it
    "too few combinations": ({"Config.Strategy": "Random", "Limits.MaxNumberOfTrainingJobs": 3},
                             "You don't have enough combinations of hyperparameter ranges"),
    "log scale below zero": ({"Config.Strategy": "Random", "Limits.MaxNumberOfTrainingJobs": 3, "Config.ParameterRanges": {
        "ContinuousParameterRanges": [{"Name": "lr", "MinValue": "0", "MaxValue": "0.1", "ScalingType": "Logarithmic"}]}},
        "Logarithmic scaling works only for ranges that have values greater than 0"),
    "random without a count": ({"Config.Strategy": "Random", "Config.ParameterRanges": _CONTINUOUS_LR},
                               "needs ResourceLimits.MaxNumberOfTrainingJobs"),
}


@pytest.mark.parametrize("case", list(_INVALID))
def test_bad_requests_are_validation_exceptions_and_nothing_runs(fake: Any, case: str) -> None:
    changes, message = _INVALID[case]
    sm = _sagemaker(fake, validate=False)
    with pytest.raises(ClientError) as err:
        sm.create_hyper_parameter_tuning_job(**tuning_request(**copy.deepcopy(changes)))
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert message in err.value.response["Error"]["Message"]
    assert fake.tuning_jobs == [] and fake.jobs == []  # nothing ran ...
    assert sm.list_hyper_parameter_tuning_jobs()["HyperParameterTuningJobSummaries"] == []  # ... or was recorded
    assert sm.list_training_jobs()["TrainingJobSummaries"] == []


def test_trials_of_a_grid_and_of_a_seeded_random_search() -> None:
    import fake_sagemaker

    grid = tuning_request(**{"Config.ParameterRanges": {"CategoricalParameterRanges": [
        {"Name": "lr", "Values": ["0.01", "0.05"]}, {"Name": "batch-size", "Values": ["32", "64"]}]}})
    config = grid["HyperParameterTuningJobConfig"]
    assert fake_sagemaker.validate_tuning_request(grid)
    assert fake_sagemaker.tuning_trial_values(config) == ("Grid", [
        {"lr": "0.01", "batch-size": "32"}, {"lr": "0.01", "batch-size": "64"},
        {"lr": "0.05", "batch-size": "32"}, {"lr": "0.05", "batch-size": "64"}])
    ranges = {"IntegerParameterRanges": [{"Name": "batch-size", "MinValue": "16", "MaxValue": "128"}],
              "ContinuousParameterRanges": [{"Name": "lr", "MinValue": "0.001", "MaxValue": "0.1",
                                             "ScalingType": "Logarithmic"}]}
    search = tuning_request(**{"Config.Strategy": "Random", "Config.RandomSeed": 7, "Limits.MaxNumberOfTrainingJobs": 40,
                         "Config.ParameterRanges": ranges})
    config = search["HyperParameterTuningJobConfig"]
    fake_sagemaker.validate_tuning_request(search)
    strategy, trials = fake_sagemaker.tuning_trial_values(config)
    assert strategy == "Random" and len(trials) == 40
    assert trials == fake_sagemaker.tuning_trial_values(config)[1]  # the seed decides
    assert all(0.001 <= float(t["lr"]) <= 0.1 and 16 <= int(t["batch-size"]) <= 128 for t in trials)
    assert 10 <= sum(float(t["lr"]) < 0.01 for t in trials) <= 30  # log scale: about half below the geometric middle
    assert fake_sagemaker.tuning_trial_values({**config, "Strategy": "Bayesian"})[0] == "Random"


# --------------------------------------------------------------------------- tuning jobs that train


@pytest.mark.slow
def test_a_grid_over_lr_runs_one_training_job_per_value_and_reports_the_best(fake: Any, channels: dict[str, Path]) -> None:
    inputs = upload_mnist(fake, channels)
    tune = tuner(fake, lrs=["0.001", "0.05"], hosts=1)
    tune.tune(inputs=inputs, wait=True)  # the SDK waits for Completed
    sm = _sagemaker(fake)
    name = tune.latest_tuning_job.hyper_parameter_tuning_job_name
    described = sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
    assert described["HyperParameterTuningJobStatus"] == "Completed", described.get("FailureReason")
    assert described["TrainingJobStatusCounters"] == {"Completed": 2, "InProgress": 0, "RetryableError": 0,
                                                      "NonRetryableError": 0, "Stopped": 0}
    assert described["ObjectiveStatusCounters"] == {"Succeeded": 2, "Pending": 0, "Failed": 0}
    assert "OverallBestTrainingJob" not in described and "TuningJobCompletionDetails" not in described
    assert described["ConsumedResources"]["RuntimeInSeconds"] >= 1

    [record] = fake.tuning_jobs
    assert [t.hyperparameters["lr"] for t in record.trials] == [0.001, 0.05]
    listed = sm.list_training_jobs_for_hyper_parameter_tuning_job(HyperParameterTuningJobName=name,
                                                                 SortBy="CreationTime")["TrainingJobSummaries"]
    assert [s["TrainingJobName"] for s in listed] == [t.name for t in record.trials]
    accuracy = {}
    for summary, run in zip(listed, record.trials, strict=True):
        assert re.fullmatch(rf"{name}-00[12]-[0-9a-f]{{8}}", summary["TrainingJobName"])
        assert summary["TuningJobName"] == name and summary["TrainingJobStatus"] == "Completed"
        assert summary["ObjectiveStatus"] == "Succeeded" and run.launch == "toolkit"
        lr = summary["TunedHyperParameters"]["lr"]
        job = sm.describe_training_job(TrainingJobName=summary["TrainingJobName"])
        assert job["TuningJobArn"] == described["HyperParameterTuningJobArn"]
        assert job["HyperParameters"]["lr"] == lr and job["HyperParameters"]["_tuning_objective_metric"] == "test_accuracy"
        assert "ContainerEntrypoint" not in job["AlgorithmSpecification"]
        # The toolkit ran the script itself, with this trial's lr, from /opt/ml/code ...
        lines = host_logs(fake, summary["TrainingJobName"])["algo-1"]
        command = [line for line in lines if line.endswith(" train.py --batch-size 32 --epochs 1 "
                                                           f"--log-interval 1 --lr {lr} --max-steps 5")]
        assert command, lines
        config = configuration(lines)
        assert config["args"]["lr"] == float(lr) and config["world_size"] == 1
        assert config["args"]["train"] == "/opt/ml/input/data/train"
        # ... and the objective is the last test_accuracy its log printed.
        value = summary["FinalHyperParameterTuningJobObjectiveMetric"]["Value"]
        printed = [float(m.group(1)) for line in lines if (m := re.search(r"METRICS rank=0 .*test_accuracy=(\S+)", line))]
        assert value == pytest.approx(printed[-1]) and job["FinalMetricDataList"]
        accuracy[summary["TrainingJobName"]] = value
    best = max(accuracy, key=accuracy.get)
    assert described["BestTrainingJob"]["TrainingJobName"] == best == tune.best_training_job()
    assert described["BestTrainingJob"]["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] == accuracy[best]
    assert record.best_training_job == best
    by_value = sm.list_training_jobs_for_hyper_parameter_tuning_job(
        HyperParameterTuningJobName=name, SortBy="FinalObjectiveMetricValue", SortOrder="Descending", MaxResults=1)
    assert [s["TrainingJobName"] for s in by_value["TrainingJobSummaries"]] == [best] and by_value["NextToken"]


@pytest.mark.slow
def test_sdk_issue_5610_a_torchrun_trainer_tuned_on_two_instances_trains_a_world_of_one_per_host(
        fake: Any, channels: dict[str, Path]) -> None:
    """sagemaker-python-sdk #5610, still so in SDK 3.27: the tuning API has no ContainerEntrypoint,
    so the trials never run the uploaded sm_train.sh (and its Torchrun driver). The image's toolkit
    runs `python train.py` on each of the 2 hosts: two separate worlds of one, no torchrun, each
    host training on the whole data set by itself."""
    inputs = upload_mnist(fake, channels)
    tune = tuner(fake, lrs=["0.05"], hosts=2, torchrun=True)
    tune.tune(inputs=inputs, wait=True)
    [record] = fake.tuning_jobs
    [trial] = record.trials
    assert record.status == "Completed" and trial.status == "Completed", trial.failure_reason
    assert trial.hosts == 2 and trial.launch == "toolkit" and trial.runtime == "container"
    described = _sagemaker(fake).describe_training_job(TrainingJobName=trial.name)
    channel_names = [c["ChannelName"] for c in described["InputDataConfig"]]
    assert "sm_drivers" in channel_names and "code" not in channel_names  # the tuner uploaded the driver ...
    logs = host_logs(fake, trial.name)
    assert sorted(logs) == ["algo-1", "algo-2"]
    for host, lines in logs.items():
        config = configuration(lines)  # every host is rank 0 of its own world
        assert config["world_size"] == 1 and config["host"] == host, config
        assert any(line.startswith("World size 1: ") for line in lines)
        assert not any("torchrun" in line or "Running Torchrun Driver" in line for line in lines)  # ... never run
        assert any(re.search(r" train\.py --batch-size 32 --epochs 1 --log-interval 1 --lr 0\.05 --max-steps 5$", line)
                   for line in lines)
        env = _training_env(lines)
        assert env["current_host"] == host and env["hosts"] == ["algo-1", "algo-2"]
        assert env["channel_input_dirs"] == {name: f"/opt/ml/input/data/{name}" for name in ("sm_drivers", "test", "train")}
        assert env["hyperparameters"] == {"batch-size": 32, "epochs": 1, "log-interval": 1, "lr": 0.05, "max-steps": 5}
        assert env["module_dir"].endswith("/sourcedir.tar.gz") and env["user_entry_point"] == "train.py"
    # Each host computed its own final accuracy: two models, not one trained together.
    finals = [float(m.group(1)) for lines in logs.values() for line in lines
              if (m := re.search(r"final_test_accuracy=(\S+)", line))]
    assert len(finals) == 2


def _training_env(lines: list[str]) -> dict[str, Any]:
    """SM_TRAINING_ENV, as the toolkit logs it ("Environment variables:" then `SM_TRAINING_ENV=...`)."""
    found = [line.split("=", 1)[1] for line in lines if line.startswith("SM_TRAINING_ENV=")]
    assert len(found) == 1, lines
    return json.loads(found[0])


def test_a_job_without_entrypoint_runs_the_toolkit_only_where_the_container_runtime_can(
        fake: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The toolkit path needs each host's own /opt/ml (the container runtime): elsewhere the job
    fails saying so; a job with neither an entrypoint nor a sagemaker_program is not simulated."""
    from workshop.runtime import hostns

    sm = _sagemaker(fake)
    job = {"AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
           "RoleArn": fake.role_arn, "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
           "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1},
           "StoppingCondition": {"MaxRuntimeInSeconds": 60}}
    sm.create_training_job(TrainingJobName="bare", **job)
    fake.wait("bare", timeout_s=120)
    failed = sm.describe_training_job(TrainingJobName="bare")
    assert failed["TrainingJobStatus"] == "Failed" and "no sagemaker_program" in failed["FailureReason"]
    monkeypatch.setattr(hostns, "available", lambda: (False, "no unprivileged user namespaces here"))
    sm.create_training_job(TrainingJobName="toolkit", HyperParameters={
        "sagemaker_program": "train.py", "sagemaker_submit_directory": "s3://bucket/sourcedir.tar.gz"}, **job)
    fake.wait("toolkit", timeout_s=120)
    failed = sm.describe_training_job(TrainingJobName="toolkit")
    assert failed["TrainingJobStatus"] == "Failed"
    assert "framework toolkit" in failed["FailureReason"] and "no unprivileged user namespaces here" in failed["FailureReason"]


@pytest.mark.slow
def test_stopping_a_tuning_job_stops_its_running_trial_and_starts_no_other(fake: Any, tmp_path: Path) -> None:
    import io
    import tarfile
    import time

    import boto3

    script = b"import time\nprint('training started', flush=True)\ntime.sleep(300)\n"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(script)
        tar.addfile(info, io.BytesIO(script))
    s3 = boto3.Session(region_name=fake.region).client("s3")
    s3.create_bucket(Bucket="bucket")
    s3.put_object(Bucket="bucket", Key="src/sourcedir.tar.gz", Body=archive.getvalue())
    request = tuning_request(**{"Definition.StaticHyperParameters": {
        "sagemaker_program": "train.py", "sagemaker_submit_directory": "s3://bucket/src/sourcedir.tar.gz"}})
    t0 = time.monotonic()
    sm = _sagemaker(fake)
    sm.create_hyper_parameter_tuning_job(**request)  # returns at once, the tuning job InProgress
    assert sm.describe_hyper_parameter_tuning_job(
        HyperParameterTuningJobName="alice-tune-1")["HyperParameterTuningJobStatus"] == "InProgress"
    deadline = time.monotonic() + 120
    while not any("training started" in p.read_text() for p in tmp_path.glob("fake/*-001-*/hosts/logs/algo-1.log")):
        assert time.monotonic() < deadline, fake.tuning_summary()
        time.sleep(0.2)
    sm.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName="alice-tune-1")
    assert sm.describe_hyper_parameter_tuning_job(
        HyperParameterTuningJobName="alice-tune-1")["HyperParameterTuningJobStatus"] in ("Stopping", "Stopped")
    fake.wait("alice-tune-1", timeout_s=120)
    assert time.monotonic() - t0 < 120  # the trial did not sleep its 300 s
    described = sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName="alice-tune-1")
    assert described["HyperParameterTuningJobStatus"] == "Stopped"
    assert described["TrainingJobStatusCounters"]["Stopped"] == 1
    [trial] = sm.list_training_jobs_for_hyper_parameter_tuning_job(HyperParameterTuningJobName="alice-tune-1")["TrainingJobSummaries"]
    assert trial["TrainingJobStatus"] == "Stopped" and trial["TunedHyperParameters"] == {"lr": "0.01"}
    job = sm.describe_training_job(TrainingJobName=trial["TrainingJobName"])
    assert [t["Status"] for t in job["SecondaryStatusTransitions"]][-2:] == ["Stopping", "Stopped"]
    assert fake.tuning_jobs[0].status == "Stopped" and [t.status for t in fake.tuning_jobs[0].trials] == ["Stopped"]
