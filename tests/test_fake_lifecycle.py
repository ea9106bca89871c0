"""The fake SageMaker's jobs live as the service's do: they run after their Create call has returned,
pass through their secondary statuses while the SDK polls, log to CloudWatch as they go, stop when
asked, run a tuning job's trials side by side, and count against the account's instance quota.

A real CreateTrainingJob returns at once; the job is InProgress (Starting, Downloading, Training,
Uploading) for minutes, its hosts' lines reach CloudWatch while it trains, and StopTrainingJob stops it
(Stopping, then Stopped). A tuning job runs up to MaxParallelTrainingJobs trials at once, each trial's
instances counted against the account's quota for its instance type with every other running job's; a
request over it is ResourceLimitExceeded. The slow tests run tiny scripts that wait for a file the test
writes, so what they check happens while the job runs, whatever the machine's load; each wait has a
deadline, after which the script fails and says why.
"""

from __future__ import annotations

import io
import re
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import tuning_request

IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch:2.13-cpu-amzn2023-sagemaker"  # lab 3's image
GROUP = "/aws/sagemaker/TrainingJobs"
DEADLINE_S = 300  # how long a script waits for the test (and the test for a script) before it fails
QUOTA = "ml.m5.xlarge for training job usage"

# Prints a line, waits until the test writes its `--release` file, prints another, ends.
_RELEASED = '''\
import argparse, pathlib, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--release")
parser.add_argument("--deadline", type=float, default=300)
args, _ = parser.parse_known_args()
print("first line: waiting for the release", flush=True)
deadline = time.monotonic() + args.deadline
while not pathlib.Path(args.release).exists():
    if time.monotonic() > deadline:
        print("never released", flush=True)
        sys.exit(3)
    time.sleep(0.1)
print("last line: released", flush=True)
'''


@pytest.fixture
def aws_user() -> str:
    return "alice"


@pytest.fixture
def fake(no_aws: None, tmp_path: Path):
    import fake_sagemaker

    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=1.0) as running:
        yield running


def _boto(fake: Any) -> Any:
    import boto3

    return boto3.Session(region_name=fake.region)


def trainer(fake: Any, code: Path, hosts: int = 1, instance_type: str = "ml.m5.xlarge",
            hyperparameters: dict[str, Any] | None = None) -> Any:
    """An SDK v3 ModelTrainer of `code`/train.py, as the workshop builds one (no launcher: one process per host)."""
    from sagemaker.core.training.configs import Compute, SourceCode, StoppingCondition
    from sagemaker.train.model_trainer import ModelTrainer

    from workshop.cloud import aws

    return ModelTrainer(
        sagemaker_session=aws.sagemaker_session(_boto(fake)), role=fake.role_arn, training_image=IMAGE,
        base_job_name="alice-life", source_code=SourceCode(source_dir=str(code), entry_script="train.py"),
        compute=Compute(instance_type=instance_type, instance_count=hosts),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=600), hyperparameters=hyperparameters or {},
    )


def script(tmp_path: Path, text: str) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(text)
    return code


def cloudwatch(fake: Any, job: str) -> list[str]:
    """Every line of the job's CloudWatch streams, as they are now."""
    client = _boto(fake).client("logs")
    try:
        streams = client.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix=job + "/")["logStreams"]
    except client.exceptions.ResourceNotFoundException:
        return []
    return [e["message"] for s in streams for e in client.get_log_events(
        logGroupName=GROUP, logStreamName=s["logStreamName"], startFromHead=True)["events"]]


def until(what: str, check: Any, deadline_s: float = DEADLINE_S) -> Any:
    """Poll `check()` until it returns something true; fail, saying `what`, after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {deadline_s} s: {what}"
        time.sleep(0.2)


# --------------------------------------------------------------------------- the quota, without training


def test_a_job_over_the_instance_quota_is_refused_as_the_service_refuses_it(no_aws: None, tmp_path: Path) -> None:
    """CreateTrainingJob over the account's quota for its instance type is ResourceLimitExceeded, in
    the service's words, and nothing is recorded or run; the workshop's `submit` says which quota and
    how to raise it."""
    import fake_sagemaker

    from workshop.errors import WorkshopError
    from workshop.jobs.submit import submit

    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", quotas={QUOTA: 1}) as running:
        sm = _boto(running).client("sagemaker")
        request = {"AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
                   "RoleArn": running.role_arn, "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
                   "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 1},
                   "StoppingCondition": {"MaxRuntimeInSeconds": 60}}
        with pytest.raises(ClientError) as err:
            sm.create_training_job(TrainingJobName="alice-over", **request)
        assert err.value.response["Error"]["Code"] == "ResourceLimitExceeded"
        assert err.value.response["Error"]["Message"] == (
            f"The account-level service limit '{QUOTA}' is 1 Instances, with current utilization of 0 Instances and "
            "a request delta of 2 Instances. Please contact AWS support to request an increase for this limit.")
        assert running.jobs == [] and sm.list_training_jobs()["TrainingJobSummaries"] == []
        with pytest.raises(WorkshopError) as refused:
            submit(trainer(running, script(tmp_path, "print('never runs')\n"), hosts=2), {})
        assert "ResourceLimitExceeded" in refused.value.message and QUOTA in refused.value.message
        assert "request a quota increase" in refused.value.fix
        assert running.jobs == [] and sm.list_training_jobs()["TrainingJobSummaries"] == []


def test_the_preflight_reads_the_quotas_the_fake_enforces(no_aws: None, tmp_path: Path) -> None:
    """The fake answers Service Quotas' ListServiceQuotas (moto lacks it) with the quotas it holds jobs
    to, so the workshop's preflight checks what CreateTrainingJob will enforce: 4 per instance type by
    default (on demand and spot each), or what the fake was given."""
    import fake_sagemaker

    from workshop.cloud.preflight import check_quota
    from workshop.errors import WorkshopError

    spot = "ml.g5.xlarge for spot training job usage"
    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", quotas={spot: 0}) as running:
        sq = _boto(running).client("service-quotas")
        assert check_quota(sq, "ml.g5.xlarge", 4, running.region) == "quota: ml.g5.xlarge for training: 4 (need 4)"
        with pytest.raises(WorkshopError, match=r"quota for ml.g5.xlarge training instances in us-east-1 is 4; "
                                                r"the tuning job needs 6 \(3 trials at once x 2\)") as err:
            check_quota(sq, "ml.g5.xlarge", 6, running.region, per_job=2)
        assert "--parallel 2" in err.value.fix
        with pytest.raises(WorkshopError, match="spot training instances in us-east-1 is zero"):
            check_quota(sq, "ml.g5.xlarge", 1, running.region, spot=True)
        listed = [q for page in sq.get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker")
                  for q in page["Quotas"]]
        assert {q["QuotaName"] for q in listed} >= {QUOTA, spot, "ml.p4d.24xlarge for training job usage"}
        assert len({q["QuotaCode"] for q in listed}) == len(listed) and len(listed) > 100  # more than one page
        assert running.quota("ml.g5.xlarge", spot=True) == (spot, 0)


def test_the_fakes_quota_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import fake_sagemaker

    monkeypatch.setenv("FAKE_SAGEMAKER_INSTANCE_QUOTA", "8")
    assert fake_sagemaker.FakeSageMaker().quota("ml.g5.xlarge") == ("ml.g5.xlarge for training job usage", 8)
    assert fake_sagemaker.FakeSageMaker(instance_quota=2).quota("ml.c5.2xlarge", spot=True) == (
        "ml.c5.2xlarge for spot training job usage", 2)
    monkeypatch.delenv("FAKE_SAGEMAKER_INSTANCE_QUOTA")
    assert fake_sagemaker.FakeSageMaker().quota("ml.g5.xlarge")[1] == 4
    with pytest.raises(ValueError, match="0 or more"):
        fake_sagemaker.FakeSageMaker(quotas={QUOTA: -1})


# --------------------------------------------------------------------------- a job's life


@pytest.mark.slow
def test_a_job_runs_on_after_its_create_call_through_its_secondary_statuses_logging_as_it_goes(
        fake: Any, tmp_path: Path) -> None:
    release = tmp_path / "release"
    job = trainer(fake, script(tmp_path, _RELEASED), hyperparameters={"release": str(release)})
    job.train(wait=False, logs=False)
    name = job._latest_training_job.training_job_name
    sm = _boto(fake).client("sagemaker")
    described = sm.describe_training_job(TrainingJobName=name)
    assert described["TrainingJobStatus"] == "InProgress"  # the call returned; the job runs
    assert "ModelArtifacts" not in described and "TrainingEndTime" not in described
    # Its first line is in CloudWatch while it trains, before it can end.
    until("the job's first line in CloudWatch", lambda: "first line: waiting for the release" in cloudwatch(fake, name))
    described = sm.describe_training_job(TrainingJobName=name)
    assert (described["TrainingJobStatus"], described["SecondaryStatus"]) == ("InProgress", "Training")
    assert [t["Status"] for t in described["SecondaryStatusTransitions"]] == ["Starting", "Downloading", "Training"]
    assert "EndTime" not in described["SecondaryStatusTransitions"][-1]
    assert fake.jobs[-1].status == "InProgress"
    release.touch()
    fake.wait(name)
    described = sm.describe_training_job(TrainingJobName=name)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    transitions = described["SecondaryStatusTransitions"]
    assert [(t["Status"], t["StatusMessage"]) for t in transitions] == [
        ("Starting", "Launching the simulated hosts"), ("Downloading", "Downloading input data"),
        ("Training", "Training in progress (local cluster)"), ("Uploading", "Uploading generated training model"),
        ("Completed", "Training job completed")]
    for before, after in zip(transitions, transitions[1:], strict=False):
        assert before["StartTime"] <= before["EndTime"] == after["StartTime"]
    assert described["ModelArtifacts"]["S3ModelArtifacts"].endswith(f"/{name}/output/model.tar.gz")
    assert described["TrainingStartTime"] <= described["TrainingEndTime"]
    lines = cloudwatch(fake, name)
    assert lines.index("first line: waiting for the release") < lines.index("last line: released")


@pytest.mark.slow
def test_stop_training_job_stops_a_running_job(fake: Any, tmp_path: Path) -> None:
    """StopTrainingJob from the caller (not from another thread while Create blocks): the job says
    Stopping at once, its hosts get SIGTERM, and it ends Stopped long before its script would."""
    job = trainer(fake, script(tmp_path, "import time\nprint('training', flush=True)\ntime.sleep(300)\n"))
    t0 = time.monotonic()
    job.train(wait=False, logs=False)
    name = job._latest_training_job.training_job_name
    until("the job's first line in CloudWatch", lambda: "training" in cloudwatch(fake, name))
    sm = _boto(fake).client("sagemaker")
    sm.stop_training_job(TrainingJobName=name)
    described = sm.describe_training_job(TrainingJobName=name)
    assert (described["TrainingJobStatus"], described["SecondaryStatus"]) == ("Stopping", "Stopping")
    fake.wait(name, timeout_s=120)
    assert time.monotonic() - t0 < 200  # not the script's 300 s
    described = sm.describe_training_job(TrainingJobName=name)
    assert (described["TrainingJobStatus"], described["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert [t["Status"] for t in described["SecondaryStatusTransitions"]] == [
        "Starting", "Downloading", "Training", "Stopping", "Stopped"]
    with pytest.raises(ClientError, match="training job is in status Stopped"):
        sm.stop_training_job(TrainingJobName=name)


@pytest.mark.slow
def test_stopping_a_job_leaves_another_fakes_job_of_the_same_name_running(fake: Any, tmp_path: Path) -> None:
    """Two test processes (make test's two workers) each run a fake, and job names are the SDK's base name
    and a timestamp to the second: two tests' jobs can share a name. Stopping one must signal its own
    hosts only. Before, the fake SIGTERMed every process of the machine carrying the local cluster's
    marker and that TRAINING_JOB_NAME, and a job of the other worker failed with exit status 143."""
    import os
    import subprocess
    import sys

    from workshop.runtime.processes import MARKER

    job = trainer(fake, script(tmp_path, "import time\nprint('training', flush=True)\ntime.sleep(300)\n"))
    job.train(wait=False, logs=False)
    name = job._latest_training_job.training_job_name
    until("the job's first line in CloudWatch", lambda: "training" in cloudwatch(fake, name))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                             env={**os.environ, MARKER: "another-local-cluster", "TRAINING_JOB_NAME": name})
    try:
        _boto(fake).client("sagemaker").stop_training_job(TrainingJobName=name)
        fake.wait(name, timeout_s=120)
        time.sleep(1.0)  # the fake signals each half second while the stopped run ends
        assert other.poll() is None, f"the other job's process was stopped too (exit status {other.returncode})"
    finally:
        other.kill()
        other.wait()


# --------------------------------------------------------------------------- trials at once, and the quota

# Each host of each trial says it started, then waits until every host of both trials has, and until the
# test writes `release`; then it prints its objective. Run one trial after another, the first waits in vain.
_TRIAL = '''\
import argparse, os, pathlib, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--lr")
parser.add_argument("--rendezvous")
args, _ = parser.parse_known_args()
folder = pathlib.Path(args.rendezvous)
(folder / f"started-{args.lr}-{os.environ['SM_CURRENT_HOST']}").touch()
deadline = time.monotonic() + 300
while len(list(folder.glob("started-*"))) < 4 or not (folder / "release").exists():
    if time.monotonic() > deadline:
        print("the other trial never ran at the same time as this one", flush=True)
        sys.exit(3)
    time.sleep(0.1)
print(f"test_accuracy={args.lr}", flush=True)
'''


@pytest.mark.slow
def test_a_tuning_job_runs_two_trials_at_once_and_a_third_over_the_quota_is_refused(fake: Any, tmp_path: Path) -> None:
    """MaxParallelTrainingJobs 3, three trials of 2 x ml.m5.xlarge, a quota of 4 for that type: two trials
    run at once (4 instances); the third would need 2 more, so it fails with ResourceLimitExceeded (what
    the service does then is not documented: the fake takes the stricter reading); a CreateTrainingJob
    for one more instance of that type is refused meanwhile, one of another type is not."""
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        body = _TRIAL.encode()
        info = tarfile.TarInfo("train.py")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    boto = _boto(fake)
    boto.client("s3").create_bucket(Bucket="bucket")
    boto.client("s3").put_object(Bucket="bucket", Key="src/sourcedir.tar.gz", Body=archive.getvalue())
    sm = boto.client("sagemaker")
    sm.create_hyper_parameter_tuning_job(**tuning_request(**{  # Grid, Maximize test_accuracy, 600 s per trial
        "HyperParameterTuningJobName": "alice-tune-at-once", "Limits.MaxParallelTrainingJobs": 3,
        "Config.ParameterRanges": {"CategoricalParameterRanges": [{"Name": "lr", "Values": ["0.1", "0.2", "0.3"]}]},
        "Definition.StaticHyperParameters": {"sagemaker_program": "train.py", "rendezvous": str(rendezvous),
                                             "sagemaker_submit_directory": "s3://bucket/src/sourcedir.tar.gz"},
        "Definition.AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File", "MetricDefinitions": [
            {"Name": "test_accuracy", "Regex": "test_accuracy=(\\S+)"}]},
        "Definition.RoleArn": fake.role_arn,
        "Definition.ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30},
    }))
    until("both trials' 4 hosts running at once", lambda: len(list(rendezvous.glob("started-*"))) == 4)
    described = sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName="alice-tune-at-once")
    assert described["HyperParameterTuningJobStatus"] == "InProgress"
    assert described["TrainingJobStatusCounters"] == {"Completed": 0, "InProgress": 2, "RetryableError": 0,
                                                      "NonRetryableError": 1, "Stopped": 0}
    trials = sm.list_training_jobs_for_hyper_parameter_tuning_job(
        HyperParameterTuningJobName="alice-tune-at-once", SortBy="Name")["TrainingJobSummaries"]
    assert [t["TrainingJobStatus"] for t in trials] == ["InProgress", "InProgress", "Failed"]
    assert re.fullmatch(r"alice-tune-at-once-003-[0-9a-f]{8}", trials[2]["TrainingJobName"])
    assert trials[2]["FailureReason"] == (
        f"ResourceLimitExceeded: The account-level service limit '{QUOTA}' is 4 Instances, with current utilization "
        "of 4 Instances and a request delta of 2 Instances. Please contact AWS support to request an increase for "
        "this limit.")
    # Another job of that type is refused while the trials hold the quota; another type has its own.
    job = {"AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"}, "RoleArn": fake.role_arn,
           "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"}, "StoppingCondition": {"MaxRuntimeInSeconds": 60}}
    with pytest.raises(ClientError, match="current utilization of 4 Instances and a request delta of 1 Instances") as err:
        sm.create_training_job(TrainingJobName="alice-one-more", ResourceConfig={
            "InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1}, **job)
    assert err.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    sm.create_training_job(TrainingJobName="alice-other-type", ResourceConfig={  # no entrypoint: fails at once
        "InstanceType": "ml.c5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1}, **job)
    (rendezvous / "release").touch()
    fake.wait("alice-tune-at-once")
    fake.wait("alice-other-type")
    described = sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName="alice-tune-at-once")
    assert described["HyperParameterTuningJobStatus"] == "Completed", described.get("FailureReason")
    assert described["TrainingJobStatusCounters"]["Completed"] == 2
    assert described["BestTrainingJob"]["TunedHyperParameters"] == {"lr": "0.2"}
    [record] = fake.tuning_jobs
    assert record.most_at_once == 2 and [t.status for t in record.trials] == ["Completed", "Completed", "Failed"]
    first, second, _ = record.trials
    assert second.started_at < first.ended_at and first.started_at < second.ended_at  # they overlapped
    assert sm.describe_training_job(TrainingJobName="alice-other-type")["FailureReason"].startswith("ClientError")
