"""workshop.jobs and workshop.cloud.aws: the SageMaker job, checked against a fake AWS.

No test touches the network or a real account: AWS is moto, in-process; every test starts
with no AWS credentials, empty AWS config files, instance metadata disabled and its own SDK
config files. Most tests use a tiny lab (a `train.py` with only `build_parser`/`check_args`),
so they test the job builder, not lab 3's script; one dry-runs the real lab 3.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import tarfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from conftest import isolate_aws, quota_client, service_quota

from workshop import jobs as sj
from workshop import metrics, runner
from workshop.cloud import aws
from workshop.datasets import mnist
from workshop.datasets.mnist import MNIST
from workshop.errors import WorkshopError
from workshop.labs import Lab, SageMakerDefaults, get_lab
from workshop.launchers.base import LauncherBase
from workshop.launchers.torchrun import TorchrunLauncher

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's account
DEFAULT_BUCKET = f"sagemaker-{REGION}-{ACCOUNT}"
GPU_IMAGE = f"763104351884.dkr.ecr.{REGION}.amazonaws.com/pytorch:2.13-cu133-amzn2023-sagemaker"
SMDDP_IMAGE = f"763104351884.dkr.ecr.{REGION}.amazonaws.com/pytorch-training:2.5-gpu-py311"
TRAIN_PY = '''
import argparse


def build_parser():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--backend", choices=("auto", "gloo", "nccl", "smddp"), default="auto")
    return p


def check_args(args, world_size=1, train_samples=None):
    if args.epochs < 1:
        raise ValueError(f"--epochs must be at least 1, got {args.epochs}")
    if train_samples is not None and train_samples < world_size:
        raise ValueError(f"{train_samples} training samples for {world_size} ranks")
'''


# --------------------------------------------------------------------------- fixtures


pytestmark = pytest.mark.usefixtures("no_aws")  # conftest: no credentials, empty AWS and SDK config


class LocalOnly(LauncherBase):
    """A launcher that runs on the local cluster only."""

    name = "local_only"
    on_sagemaker = False


def make_lab(root: Path, launcher: LauncherBase | None = None, key: str = "tiny_ddp") -> Lab:
    """A lab whose script only parses its flags: the job builder under test, not a model."""
    code = root / key / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text(textwrap.dedent(TRAIN_PY))
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"not uploaded")
    return Lab(
        key=key,
        folder=str(root / key),  # absolute: REPO_ROOT / folder is then this folder
        title="Tiny DDP",
        strategy="test",
        launcher=launcher or TorchrunLauncher(),
        data=MNIST,
        sagemaker=SageMakerDefaults(
            framework="pytorch-amzn2023",
            framework_version="2.13",
            py_version="py312",
            instance_type="ml.g5.xlarge",
            instance_count=2,
            max_run_s=1800,
        ),
    )


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    return make_lab(tmp_path)


@dataclass
class FakeAws:
    boto: Any  # boto3.Session with moto's throwaway keys
    role_arn: str

    def training_jobs(self) -> list[dict[str, Any]]:
        return self.boto.client("sagemaker").list_training_jobs()["TrainingJobSummaries"]

    def objects(self) -> list[str]:
        s3 = self.boto.client("s3")
        return [
            f"{b['Name']}/{o['Key']}"
            for b in s3.list_buckets()["Buckets"]
            for o in s3.list_objects_v2(Bucket=b["Name"]).get("Contents", [])
        ]

    def read(self, uri: str) -> bytes:
        bucket, _, key = uri[len("s3://") :].partition("/")
        return self.boto.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()


@pytest.fixture
def fake_aws(moto_session: Any) -> FakeAws:
    """moto with credentials, a region (conftest's moto_session), the training role and the SDK's default bucket."""
    boto = moto_session
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    }
    role = boto.client("iam").create_role(RoleName="WorkshopTraining", AssumeRolePolicyDocument=json.dumps(trust))
    boto.client("s3").create_bucket(Bucket=DEFAULT_BUCKET)
    return FakeAws(boto=boto, role_arn=role["Role"]["Arn"])


def channel_uris(request: dict[str, Any]) -> dict[str, str]:
    return {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]}


# --------------------------------------------------------------------------- dry run


@dataclass
class SharedDryRun:
    lab: Lab
    request: sj.DryRunRequest
    printed: str
    telemetry_sent: list[Any]
    credentials_after: Any


@pytest.fixture(scope="module")
def shared_dry_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedDryRun]:
    """One dry run (each costs seconds: the SDK validates its config with jsonschema on every
    lookup), read by several tests; SDK telemetry sends are recorded instead of sent."""
    from sagemaker.core.telemetry import telemetry_logging

    tmp = tmp_path_factory.mktemp("dry-run")
    with pytest.MonkeyPatch.context() as mp:
        isolate_aws(mp, tmp, "Alice Example")
        sent: list[Any] = []
        mp.setattr(telemetry_logging, "_send_telemetry_request", lambda *a, **k: sent.append(a))
        lab = make_lab(tmp)
        assert boto3.Session().get_credentials() is None  # truly none, from any source
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            request = sj.dry_run(lab, hyperparameters={"epochs": 2, "lr": 0.05}, instance_count=2, procs_per_host=1)
        yield SharedDryRun(lab, request, out.getvalue(), sent, boto3.Session().get_credentials())


def test_dry_run_needs_no_credentials(shared_dry_run: SharedDryRun) -> None:
    request = shared_dry_run.request
    assert isinstance(request, dict) and json.loads(json.dumps(request)) == request
    assert re.fullmatch(r"alice-example-tiny-ddp-\d{14}", request["TrainingJobName"])
    spec = request["AlgorithmSpecification"]
    assert spec["TrainingImage"] == GPU_IMAGE
    assert spec["ContainerEntrypoint"] == ["/bin/bash"]
    assert "sm_drivers/sm_train.sh" in spec["ContainerArguments"][-1]
    assert request["ResourceConfig"] == {"InstanceType": "ml.g5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30}
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 1800}
    assert request["CheckpointConfig"]["LocalPath"] == "/opt/ml/checkpoints"
    assert request["CheckpointConfig"]["S3Uri"].startswith(f"s3://{DEFAULT_BUCKET}/alice-example-tiny-ddp/")
    assert request["Environment"] == {"SM_CHECKPOINT_DIR": "/opt/ml/checkpoints"}
    assert request["HyperParameters"] == {"epochs": "2", "lr": "0.05"}
    assert request["RoleArn"] == sj.PLACEHOLDER_ROLE_ARN
    assert "VpcConfig" not in request
    tags = {t["Key"]: t["Value"] for t in request["Tags"]}
    assert tags == {"workshop": aws.WORKSHOP_NAME, "workshop-user": "alice-example", "workshop-lab": "tiny_ddp"}

    uris = channel_uris(request)
    assert sorted(uris) == ["code", "sm_drivers", "test", "train"]
    assert uris["train"] == f"s3://{DEFAULT_BUCKET}/{aws.WORKSHOP_NAME}/alice-example/data/mnist/train"
    assert request.code_files == ["train.py"]  # __pycache__ stays home
    assert json.loads(request.sm_drivers["distributed.json"]) == {"process_count_per_node": 1, "smp": None}
    assert "torchrun_driver.py" in request.sm_drivers["sm_train.sh"]

    out = shared_dry_run.printed
    assert f'"TrainingImage": "{GPU_IMAGE}"' in out
    assert f"source code: {uris['code']}" in out
    assert "nothing was uploaded or created" in out
    # The dry run's throwaway keys and moto are gone again.
    assert shared_dry_run.credentials_after is None


def test_metric_definitions_match_the_scripts_lines(shared_dry_run: SharedDryRun) -> None:
    spec = shared_dry_run.request["AlgorithmSpecification"]
    definitions = {d["Name"]: d["Regex"] for d in spec["MetricDefinitions"]}
    assert set(definitions) == set(shared_dry_run.lab.metrics)
    lines = [
        metrics.format_line(rank=0, epoch=1, step=40, train_loss=0.1834),
        metrics.format_line(rank=0, epoch=1, test_loss=0.0912, test_accuracy=0.971, samples_per_sec=812.4),
    ]
    expected = {"train_loss": 0.1834, "test_loss": 0.0912, "test_accuracy": 0.971, "samples_per_sec": 812.4}
    for name, value in expected.items():
        found = [m for m in (re.search(definitions[name], line) for line in lines) if m]
        assert len(found) == 1 and float(found[0].group(1)) == pytest.approx(value), name
        # Rank 0's lines only: the other ranks print the same names.
        assert not re.search(definitions[name], metrics.format_line(rank=1, **{name: value}))


def test_sdk_telemetry_is_opted_out(shared_dry_run: SharedDryRun) -> None:
    assert shared_dry_run.telemetry_sent == []  # the dry run ran the decorated ModelTrainer.train
    config = aws.sagemaker_session(boto3.Session(region_name=REGION)).sagemaker_config
    assert config["SageMaker"]["PythonSDK"]["Modules"]["TelemetryOptOut"] is True


def test_dry_run_vpc_region_and_smddp_image(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    request = sj.dry_run(
        lab,
        hyperparameters={"backend": "smddp"},
        instance_type="ml.p4d.24xlarge",
        region="eu-west-1",
        subnets=["subnet-0abc"],
        security_group_ids=["sg-0def"],
        role="MyTrainingRole",
        max_run_s=600,
        tags={"team": "ml"},
        allow_unsupported_image=True,  # smddp exists only in images past their end of patch
    )
    assert request["AlgorithmSpecification"]["TrainingImage"] == SMDDP_IMAGE.replace(REGION, "eu-west-1")
    assert request["VpcConfig"] == {"Subnets": ["subnet-0abc"], "SecurityGroupIds": ["sg-0def"]}
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 600}
    assert request["RoleArn"] == f"arn:aws:iam::{ACCOUNT}:role/MyTrainingRole"
    assert {"Key": "team", "Value": "ml"} in request["Tags"]
    # procs_per_host not given: the Torchrun driver starts one process per GPU.
    assert json.loads(request.sm_drivers["distributed.json"])["process_count_per_node"] is None
    out = capsys.readouterr().out
    assert "PyTorch 2.5 (py311) image, the newest that ships smddp" in out
    assert "WARNING: The PyTorch 2.5 training image passed its end of patch on 2025-10-29" in out


def test_dry_run_of_the_real_lab_3() -> None:
    lab = get_lab("data_parallel")
    if not lab.entry_path.is_file():
        pytest.skip(f"{lab.entry_path} is not written yet")
    request = sj.dry_run(lab, hyperparameters={"epochs": 1}, show=False)
    assert request["AlgorithmSpecification"]["TrainingImage"] == GPU_IMAGE
    assert request["ResourceConfig"]["InstanceCount"] == lab.sagemaker.instance_count
    assert "train.py" in request.code_files


# --------------------------------------------------------------------------- real SDK path, fake AWS


def test_build_and_submit(lab: Lab, fake_aws: FakeAws, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")  # moto lacks iam:SimulatePrincipalPolicy
    trainer = sj.build_trainer(
        lab,
        hyperparameters={"epochs": 3},
        role=fake_aws.role_arn,
        instance_type="ml.g5.12xlarge",  # 4 GPUs: room for 2 ranks per host
        instance_count=2,
        procs_per_host=2,
        region=REGION,
        subnets=["subnet-1"],
        security_group_ids=["sg-1"],
    )
    sent: dict[str, Any] = {}
    trainer.sagemaker_session.boto_session.events.register(
        "before-parameter-build.sagemaker.CreateTrainingJob", lambda params, **_: sent.update(params)
    )
    inputs = {"train": f"s3://{DEFAULT_BUCKET}/data/train", "test": f"s3://{DEFAULT_BUCKET}/data/test"}
    result = sj.submit(trainer, inputs, wait=True, logs=True)

    assert result.ok and result.status == "Completed"
    assert result.job_name == sent["TrainingJobName"]
    assert result.job_name.startswith("alice-example-tiny-ddp-")
    assert result.model_artifact == f"s3://{DEFAULT_BUCKET}/alice-example-tiny-ddp/{result.job_name}/output/model.tar.gz"
    assert result.console_url.endswith(f"#/jobs/{result.job_name}")
    assert sent["StoppingCondition"] == {"MaxRuntimeInSeconds": 1800}
    assert sent["Environment"] == {"SM_CHECKPOINT_DIR": "/opt/ml/checkpoints"}
    assert [d["Name"] for d in sent["AlgorithmSpecification"]["MetricDefinitions"]] == list(lab.metrics)

    # What SageMaker (moto) recorded.
    described = fake_aws.boto.client("sagemaker").describe_training_job(TrainingJobName=result.job_name)
    assert described["AlgorithmSpecification"]["TrainingImage"] == GPU_IMAGE
    assert described["ResourceConfig"]["InstanceType"] == "ml.g5.12xlarge"
    assert described["ResourceConfig"]["InstanceCount"] == 2
    assert described["StoppingCondition"]["MaxRuntimeInSeconds"] == 1800
    assert described["CheckpointConfig"]["LocalPath"] == "/opt/ml/checkpoints"
    assert described["HyperParameters"] == {"epochs": "3"}
    assert described["RoleArn"] == fake_aws.role_arn
    assert described["VpcConfig"] == {"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1"]}
    assert channel_uris(described)["train"] == inputs["train"]
    tags = fake_aws.boto.client("sagemaker").list_tags(ResourceArn=described["TrainingJobArn"])["Tags"]
    assert {"Key": "workshop-user", "Value": "alice-example"} in tags
    assert {"Key": "workshop-lab", "Value": "tiny_ddp"} in tags

    # Torchrun is not in the request: it travels as sm_drivers/distributed.json.
    drivers = channel_uris(described)["sm_drivers"]
    assert json.loads(fake_aws.read(f"{drivers}/distributed.json")) == {"process_count_per_node": 2, "smp": None}
    assert "torchrun_driver.py" in fake_aws.read(f"{drivers}/sm_train.sh").decode()
    source = json.loads(fake_aws.read(f"{drivers}/sourcecode.json"))
    assert source["entry_script"] == "train.py" and source["source_dir"] == str(lab.source_dir)
    assert fake_aws.read(f"{channel_uris(described)['code']}/train.py").decode() == (lab.source_dir / "train.py").read_text()


def test_sdk_role_check_against_moto_names_the_switch(lab: Lab, fake_aws: FakeAws) -> None:
    # The SDK checks the role with iam:SimulatePrincipalPolicy, which moto lacks.
    with pytest.raises(WorkshopError, match="IAM role check") as info:
        sj.build_trainer(lab, hyperparameters={}, role=fake_aws.role_arn, region=REGION)
    assert "SAGEMAKER_VALIDATE_ROLE=false" in info.value.fix
    trainer = sj.build_trainer(lab, hyperparameters={}, role=fake_aws.role_arn, region=REGION, validate_role=False)
    assert trainer.role == fake_aws.role_arn
    assert "SAGEMAKER_VALIDATE_ROLE" not in os.environ  # set only while the trainer was built


def test_run_lab_on_sagemaker_end_to_end(
    lab: Lab, fake_aws: FakeAws, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")
    monkeypatch.setenv(aws.ROLE_ENV, fake_aws.role_arn)
    result = runner.run_on_sagemaker(
        lab, hosts=2, procs_per_host=1, hyperparameters={"epochs": 1}, data_dir=data_dir, region=REGION,
        confirm_cost=True,
    )
    assert isinstance(result, sj.JobResult) and result.status == "Completed"
    described = fake_aws.boto.client("sagemaker").describe_training_job(TrainingJobName=result.job_name)
    uris = channel_uris(described)
    for channel in ("train", "test"):
        assert uris[channel] == f"s3://{DEFAULT_BUCKET}/{mnist.data_prefix()}/{channel}"
        assert f"{DEFAULT_BUCKET}/{mnist.data_prefix()}/{channel}/mnist.npz" in fake_aws.objects()
    out = capsys.readouterr().out
    for step in range(1, 6):
        assert f"step {step}/5" in out
    assert [j["TrainingJobName"] for j in fake_aws.training_jobs()] == [result.job_name]


def test_run_lab_dry_run_mode_needs_no_credentials(lab: Lab, data_dir: Path) -> None:
    request = runner.run_on_sagemaker(
        lab, hosts=3, procs_per_host=None, hyperparameters={"lr": 0.1}, data_dir=data_dir, dry_run=True
    )
    assert isinstance(request, sj.DryRunRequest)
    assert request["ResourceConfig"]["InstanceCount"] == 3
    assert request["HyperParameters"] == {"lr": "0.1"}


def test_a_damaged_channel_file_is_refused_before_anything_is_uploaded_or_created(
    lab: Lab, fake_aws: FakeAws, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")
    monkeypatch.setenv(aws.ROLE_ENV, fake_aws.role_arn)
    damaged = data_dir / "train" / "mnist.npz"
    np.savez(damaged, images=np.zeros((4, 28, 28), np.uint8))  # no labels
    for dry_run in (True, False):
        with pytest.raises(WorkshopError) as info:
            runner.run_on_sagemaker(lab, hosts=2, procs_per_host=1, hyperparameters={}, data_dir=data_dir,
                                    region=REGION, dry_run=dry_run, network=not dry_run)
        assert str(damaged) in info.value.message and "has no array 'labels'" in info.value.message
        assert f"delete {damaged}" in info.value.fix
    assert not any(mnist.data_prefix() in key for key in fake_aws.objects())  # nothing uploaded
    assert fake_aws.training_jobs() == []
    from workshop.cloud.network import find_network

    assert find_network(fake_aws.boto) is None  # nor the workshop network created


def test_job_records_read_cloudwatch_like_a_local_run(fake_aws: FakeAws) -> None:
    logs = fake_aws.boto.client("logs")
    logs.create_log_group(logGroupName=sj.LOG_GROUP)
    job = "alice-example-tiny-ddp-20260101000000"
    lines = {
        "algo-1-1700000000": [
            "torchrun starting",
            metrics.format_line(rank=0, epoch=1, step=10, train_loss=0.5),
            metrics.format_line(rank=0, epoch=1, test_accuracy=0.9),
        ],
        "algo-2-1700000001": [metrics.format_line(rank=1, epoch=1, step=10, train_loss=0.6)],
    }
    now_ms = int(time.time() * 1000)  # CloudWatch (and moto) reject events older than 14 days
    for stream, messages in lines.items():
        logs.create_log_stream(logGroupName=sj.LOG_GROUP, logStreamName=f"{job}/{stream}")
        logs.put_log_events(
            logGroupName=sj.LOG_GROUP,
            logStreamName=f"{job}/{stream}",
            logEvents=[{"timestamp": now_ms + i, "message": m} for i, m in enumerate(messages)],
        )
    records = sj.job_records(job, fake_aws.boto)
    assert records == [
        {"rank": 0, "epoch": 1, "step": 10, "train_loss": 0.5, "host": "algo-1"},
        {"rank": 0, "epoch": 1, "test_accuracy": 0.9, "host": "algo-1"},
        {"rank": 1, "epoch": 1, "step": 10, "train_loss": 0.6, "host": "algo-2"},
    ]
    # The same records a local run's prefixed output gives.
    local = metrics.parse_lines(
        [f"[algo-1/0] {lines['algo-1-1700000000'][1]}", f"[algo-2/1] {lines['algo-2-1700000001'][0]}"]
    )
    assert metrics.series(records, "train_loss") == metrics.series(local, "train_loss")
    assert sj.job_records("no-such-job", fake_aws.boto) == []


def test_download_model(fake_aws: FakeAws, tmp_path: Path) -> None:
    uri = f"s3://{DEFAULT_BUCKET}/job/output/model.tar.gz"
    result = sj.JobResult(
        job_name="job",
        status="Completed",
        final_metrics={},
        model_artifact=uri,
        console_url=sj.console_url("job", REGION),
        region=REGION,
        boto_session=fake_aws.boto,
    )
    with pytest.raises(WorkshopError, match="No model at"):
        result.download_model(tmp_path / "missing")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        payload = b"weights"
        info = tarfile.TarInfo("model.pt")
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    fake_aws.boto.client("s3").put_object(Bucket=DEFAULT_BUCKET, Key="job/output/model.tar.gz", Body=buffer.getvalue())
    dest = result.download_model(tmp_path / "model")
    assert (dest / "model.pt").read_bytes() == b"weights"


# --------------------------------------------------------------------------- errors create nothing


def test_no_credentials_in_sagemaker_mode(
    lab: Lab, fake_aws: FakeAws, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(key, raising=False)  # moto set its own; take them away
    with pytest.raises(WorkshopError, match="No AWS credentials") as info:
        runner.run_on_sagemaker(
            lab, hosts=2, procs_per_host=1, hyperparameters={}, data_dir=data_dir, role=fake_aws.role_arn
        )
    assert "aws configure" in info.value.fix and "AWS_PROFILE" in info.value.fix
    assert "SageMaker notebook instance" in info.value.fix
    assert fake_aws.training_jobs() == [] and fake_aws.objects() == []


def test_no_role(lab: Lab, fake_aws: FakeAws, data_dir: Path) -> None:
    with pytest.raises(WorkshopError, match="No IAM role") as info:
        runner.run_on_sagemaker(lab, hosts=2, procs_per_host=1, hyperparameters={}, data_dir=data_dir)
    assert "role=" in info.value.fix and aws.ROLE_ENV in info.value.fix and "notebook instance" in info.value.fix
    assert fake_aws.training_jobs() == [] and fake_aws.objects() == []


@pytest.mark.parametrize("dry_run", [False, True], ids=["sagemaker", "dry-run"])
@pytest.mark.parametrize(
    ("hyperparameters", "instance_type", "message"),
    [
        ({"backend": "smddp"}, "ml.g5.xlarge", "backend=smddp does not run on ml.g5.xlarge"),
        ({"epochs": "three"}, None, "invalid int value: 'three'"),
        ({"epochs": 0}, None, "--epochs must be at least 1"),
        ({"backend": "nccl"}, "ml.m5.xlarge", "backend=nccl needs GPUs"),
    ],
    ids=["smddp-on-g5", "non-numeric", "check_args", "nccl-on-cpu"],
)
def test_invalid_jobs_create_nothing(
    lab: Lab,
    fake_aws: FakeAws,
    data_dir: Path,
    dry_run: bool,
    hyperparameters: dict[str, Any],
    instance_type: str | None,
    message: str,
) -> None:
    with pytest.raises(WorkshopError, match=re.escape(message)):
        runner.run_on_sagemaker(
            lab,
            hosts=2,
            procs_per_host=1,
            hyperparameters=hyperparameters,
            data_dir=data_dir,
            instance_type=instance_type,
            role=fake_aws.role_arn,
            dry_run=dry_run,
        )
    assert fake_aws.training_jobs() == [] and fake_aws.objects() == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"instance_count": 0}, "The instance count must be"),
        ({"procs_per_host": 0}, "Processes per host must be"),
        ({"procs_per_host": 2}, "2 processes per host do not fit ml.g5.xlarge, which has 1 GPU"),
        ({"max_run_s": 0}, "max_run_s must be"),
        ({"max_run_s": 30 * 24 * 3600}, "max_run_s must be"),
        ({"instance_type": "g5.xlarge"}, "Not a SageMaker training instance type"),
        ({"subnets": ["subnet-1"]}, "needs both subnets and security groups"),
        ({"output_s3_uri": "/tmp/out"}, "output_s3_uri must be an s3:// URI"),
    ],
)
def test_plan_rejects(lab: Lab, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkshopError, match=re.escape(message)):
        sj.plan_job(lab, hyperparameters={}, region=REGION, **kwargs)


def test_plan_picks_cpu_or_gpu_image_and_world_size(lab: Lab) -> None:
    cpu = sj.plan_job(lab, hyperparameters={}, region=REGION, instance_type="ml.m5.xlarge", instance_count=3)
    assert cpu.image_uri.endswith("pytorch:2.13-cpu-amzn2023-sagemaker") and cpu.world_size == 3
    gpu = sj.plan_job(lab, hyperparameters={"backend": "smddp"}, region=REGION, instance_type="ml.p4d.24xlarge",
                      allow_unsupported_image=True)
    assert gpu.image_uri == SMDDP_IMAGE and gpu.procs_per_host is None and gpu.world_size == 2 * 8
    assert sj.plan_job(lab, hyperparameters={}, region=REGION, instance_type="ml.g5.12xlarge", procs_per_host=4).world_size == 8


def test_local_only_launchers_are_refused_on_sagemaker(tmp_path: Path) -> None:
    local_lab = make_lab(tmp_path, launcher=LocalOnly(), key="tiny_local")
    with pytest.raises(sj.LauncherNotSupported, match="'local_only'.*local cluster only") as info:
        sj.dry_run(local_lab, hyperparameters={})
    assert isinstance(info.value, WorkshopError) and isinstance(info.value, NotImplementedError)


def test_reserved_channel_names(lab: Lab, fake_aws: FakeAws, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")
    trainer = sj.build_trainer(lab, hyperparameters={}, role=fake_aws.role_arn, region=REGION)
    with pytest.raises(WorkshopError, match="reserved"):
        sj.submit(trainer, {"code": f"s3://{DEFAULT_BUCKET}/x"})
    assert fake_aws.training_jobs() == []


# --------------------------------------------------------------------------- workshop.cloud.aws


def test_user_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(aws.USER_ENV, "Jörg O'Brien_the-Third!!")
    # Too long for 16 characters: its head and a hash of the whole name (see test_infra_strict).
    assert aws.user_prefix() == "jorg-o-br-c682a8"
    monkeypatch.setenv(aws.USER_ENV, "!!!")
    assert aws.user_prefix() == "user"
    # On SageMaker everyone is ec2-user: the notebook instance's name says who it is.
    monkeypatch.delenv(aws.USER_ENV)
    monkeypatch.setattr(aws, "_login_name", lambda: "ec2-user")
    metadata = tmp_path / "resource-metadata.json"
    metadata.write_text(json.dumps({"ResourceName": "Attendee-07"}))
    monkeypatch.setattr(aws, "NOTEBOOK_METADATA_FILE", str(metadata))
    assert aws.user_prefix() == "attendee-07"


def test_resolve_role(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_aws: FakeAws) -> None:
    explicit = f"arn:aws:iam::{ACCOUNT}:role/Explicit"
    assert aws.resolve_role(explicit) == explicit
    assert aws.resolve_role("WorkshopTraining", fake_aws.boto) == fake_aws.role_arn  # a name, via IAM
    with pytest.raises(WorkshopError, match="does not exist"):
        aws.resolve_role("NoSuchRole", fake_aws.boto)
    monkeypatch.setenv(aws.ROLE_ENV, fake_aws.role_arn)
    assert aws.resolve_role(None, fake_aws.boto) == fake_aws.role_arn
    # On a notebook instance: the SDK's own lookup, which reads the metadata file.
    import sagemaker.core.helper.session_helper as session_helper

    monkeypatch.delenv(aws.ROLE_ENV)
    notebook_role = f"arn:aws:iam::{ACCOUNT}:role/service-role/AmazonSageMaker-ExecutionRole-1"
    metadata = tmp_path / "resource-metadata.json"
    metadata.write_text(json.dumps({"ResourceName": "nb", "ExecutionRoleArn": notebook_role}))
    monkeypatch.setattr(aws, "NOTEBOOK_METADATA_FILE", str(metadata))
    monkeypatch.setattr(session_helper, "NOTEBOOK_METADATA_FILE", str(metadata))
    assert aws.resolve_role(None, fake_aws.boto) == notebook_role


def test_require_credentials(fake_aws: FakeAws, monkeypatch: pytest.MonkeyPatch) -> None:
    assert aws.require_credentials(fake_aws.boto).startswith(f"arn:aws:sts::{ACCOUNT}:")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(WorkshopError, match="No AWS region"):
        aws.require_credentials(boto3.Session(aws_access_key_id="a", aws_secret_access_key="b"))


def test_default_bucket_is_the_sdks(fake_aws: FakeAws) -> None:
    assert aws.default_bucket(fake_aws.boto) == DEFAULT_BUCKET


# --------------------------------------------------------------------------- images (issue 11, defect 5)

AMZN2023_GPU_IMAGE = f"763104351884.dkr.ecr.{REGION}.amazonaws.com/pytorch:2.13-cu133-amzn2023-sagemaker"


def test_pytorch_labs_use_a_supported_image_with_the_pinned_torch() -> None:
    """Labs 2 (PyTorch), 3 and 4 run the image whose PyTorch is the one CI runs locally."""
    import torch

    pinned = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    for key in ("horovod_pytorch", "data_parallel", "model_parallel"):
        lab = get_lab(key)
        plan = sj.plan_job(lab, hyperparameters={}, region=REGION)  # the lab's own instance type
        variant = "cu133" if sj.is_gpu_instance(plan.instance_type) else "cpu"
        assert plan.image_uri == AMZN2023_GPU_IMAGE.replace("cu133", variant), key
        assert lab.sagemaker.framework_version == pinned, key
        support = sj.image_support(lab.sagemaker.framework, lab.sagemaker.framework_version)
        assert support is not None and support.end_of_patch > sj.today(), key


def _old_image_lab(root: Path) -> Lab:
    lab = make_lab(root, key="tiny_old")
    old = SageMakerDefaults(framework="pytorch", framework_version="2.9", py_version="py312",
                            instance_type="ml.g5.xlarge", instance_count=2)
    return dataclasses.replace(lab, sagemaker=old)


def test_plan_refuses_an_image_past_its_end_of_patch(tmp_path: Path) -> None:
    lab = _old_image_lab(tmp_path)
    with pytest.raises(WorkshopError, match=re.escape("PyTorch 2.9 training image passed its end of patch on 2026-10-15")) as info:
        sj.plan_job(lab, hyperparameters={}, region=REGION)
    assert "pytorch-amzn2023" in info.value.fix and "allow_unsupported_image=True" in info.value.fix
    plan = sj.plan_job(lab, hyperparameters={}, region=REGION, allow_unsupported_image=True)
    assert plan.image_uri.endswith("pytorch-training:2.9-gpu-py312")
    assert any(n.startswith("WARNING: ") and "end of patch" in n for n in plan.notes)


def test_smddp_is_refused_unless_the_unsupported_image_is_asked_for(lab: Lab) -> None:
    with pytest.raises(WorkshopError, match="backend=smddp needs SageMaker's data-parallel library") as info:
        sj.plan_job(lab, hyperparameters={"backend": "smddp"}, region=REGION, instance_type="ml.p4d.24xlarge")
    assert "2025-10-29" in info.value.message
    assert "backend=nccl" in info.value.fix and "allow_unsupported_image=True" in info.value.fix
    plan = sj.plan_job(lab, hyperparameters={"backend": "smddp"}, region=REGION, instance_type="ml.p4d.24xlarge",
                       allow_unsupported_image=True)
    assert plan.image_uri == SMDDP_IMAGE
    assert any("WARNING" in n and "2025-10-29" in n for n in plan.notes)


def test_cuda_13_images_refuse_volta_instances(lab: Lab) -> None:
    with pytest.raises(WorkshopError, match="ml.p3.2xlarge") as info:
        sj.plan_job(lab, hyperparameters={}, region=REGION, instance_type="ml.p3.2xlarge", instance_count=1)
    assert "ml.g5.xlarge" in info.value.fix


# --------------------------------------------------------------------------- bad input (issue 11)


@pytest.mark.parametrize(
    ("role", "message"),
    [
        ("not a role!", "not an IAM role ARN or role name: 'not a role!'"),
        ("arn:aws:iam::1234:role/Short", "not an IAM role ARN or role name"),
        ("arn:aws:iam::123456789012:user/alice", "not an IAM role ARN or role name"),
    ],
    ids=["words", "short-account", "user-arn"],
)
def test_dry_run_refuses_a_role_createtrainingjob_would_reject(lab: Lab, role: str, message: str) -> None:
    with pytest.raises(WorkshopError, match=re.escape(message)) as info:
        sj.dry_run(lab, hyperparameters={}, role=role, show=False)
    assert "arn:aws:iam::<12-digit account>:role/<name>" in info.value.fix


def test_dry_run_refuses_a_bad_role_in_the_environment(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(aws.ROLE_ENV, "arn:aws:iam::123456789012:role/has space")
    with pytest.raises(WorkshopError, match=aws.ROLE_ENV):
        sj.dry_run(lab, hyperparameters={}, show=False)


def test_plan_refuses_an_instance_type_sagemaker_training_does_not_have(lab: Lab) -> None:
    with pytest.raises(WorkshopError, match=re.escape("ml.nosuch.xlarge is not a SageMaker training instance type")):
        sj.plan_job(lab, hyperparameters={}, region=REGION, instance_type="ml.nosuch.xlarge")
    with pytest.raises(WorkshopError, match="not a SageMaker training instance type") as info:
        sj.plan_job(lab, hyperparameters={}, region=REGION, instance_type="ml.g5.xxlarge")
    assert "ml.g5.xlarge" in info.value.fix  # the nearest real names


@pytest.mark.parametrize(
    ("hyperparameters", "message"),
    [
        ({"note": "it's"}, "contains a single quote"),
        ({"it's": 1}, "contains a single quote"),
        ({"note": {"who": "O'Brien"}}, "contains a single quote"),  # JSON-encoded, then written the same way
        ({"note": "two\nlines"}, "contains a line break"),
        ({"a.b": 1}, "cannot be part of an environment variable name"),
        ({"log-interval": 1, "log_interval": 2}, "both become SM_HP_LOG_INTERVAL"),
        ({"k" * 257: 1}, "longer than 256 characters"),
        ({"note": "x" * 2501}, "longer than 2500 characters"),
        ({f"k{i}": i for i in range(101)}, "101 hyperparameters; CreateTrainingJob takes at most 100"),
    ],
    ids=["quote-in-value", "quote-in-key", "quote-in-json", "newline", "dot-in-key", "same-env-name",
         "long-key", "long-value", "too-many"],
)
def test_plan_refuses_hyperparameters_the_container_cannot_receive(
    lab: Lab, hyperparameters: dict[str, Any], message: str
) -> None:
    with pytest.raises(WorkshopError, match=re.escape(message)) as info:
        sj.plan_job(lab, hyperparameters=hyperparameters, region=REGION)
    assert info.value.fix


def test_the_env_file_breaks_exactly_where_the_plan_refuses(tmp_path: Path) -> None:
    """The SDK's own env writer (`container_drivers/scripts/environment.py`) and bash: a single
    quote breaks `source sm_training.env`; the values the plan accepts come through intact."""
    import shutil
    import subprocess

    from sagemaker.train.container_drivers.common.utils import safe_serialize

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")

    def sourced(value: str) -> subprocess.CompletedProcess[str]:
        env_file = tmp_path / "sm_training.env"
        env_file.write_text(f"export SM_HP_NOTE='{safe_serialize(value)}'\n"
                            f"export SM_HPS='{safe_serialize({'note': value})}'\n")
        return subprocess.run([bash, "-c", f'set -e; source {env_file}; printf %s "$SM_HP_NOTE"'],
                              capture_output=True, text=True, timeout=30)

    accepted = "a b $HOME `x` \\ \"q\" -- é"
    sj.check_hyperparameters({"note": accepted})
    assert sourced(accepted).stdout == accepted
    broken = sourced("it's")
    assert broken.returncode != 0 or broken.stdout != "it's"  # what the plan refuses


@pytest.mark.parametrize(
    ("args", "message", "fix"),
    [
        (["--role", "not a role!"], "is not an IAM role ARN or role name", "arn:aws:iam::<12-digit account>:role/<name>"),
        (["--role", "arn:aws:iam::12345:role/Training"], "is not an IAM role ARN or role name", "12-digit account"),
        (["--instance-type", "ml.nosuch.xlarge"], "ml.nosuch.xlarge is not a SageMaker training instance type",
         "TrainingInstanceType"),
        (["--hp", "model-dir=/opt/ml/model/it's"], "contains a single quote", "sm_training.env"),
    ],
    ids=["role-words", "role-arn", "instance-type", "quote"],
)
def test_cli_dry_run_refuses_bad_input_with_the_fix(
    args: list[str], message: str, fix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from workshop.__main__ import main

    code = main(["run", "data_parallel", "--mode", "sagemaker", "--dry-run", *args])
    captured = capsys.readouterr()
    assert code == 2, captured.out[-2000:]
    assert message in captured.err and "Fix:" in captured.err and fix in captured.err
    assert '"TrainingJobName"' not in captured.out  # no request was built


def test_real_path_refuses_a_malformed_role_before_asking_for_credentials(lab: Lab, data_dir: Path) -> None:
    # No credentials at all (the autouse fixture): the role's form is checked first.
    with pytest.raises(WorkshopError, match="not an IAM role ARN or role name"):
        runner.run_on_sagemaker(lab, hosts=2, procs_per_host=1, hyperparameters={}, data_dir=data_dir,
                                role="not a role!", region=REGION)


# --------------------------------------------------------------------------- preflight suggests only usable types


def _quota(instance_type: str, value: float, code: str) -> dict[str, Any]:
    return service_quota(f"{instance_type} for training job usage", value, code)


def _stub_quotas(boto: Any, quotas: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """`boto`'s Service Quotas client answers from a Stubber (moto 5.2.5 lacks ListServiceQuotas);
    every other client stays moto's. A root caller needs no permission simulation."""
    sq = quota_client(quotas, REGION)
    original = boto.client
    monkeypatch.setattr(boto, "client", lambda name, *a, **k: sq if name == "service-quotas" else original(name, *a, **k))


ROOT = f"arn:aws:iam::{ACCOUNT}:root"
QUOTAS = [
    _quota("ml.p4d.24xlarge", 0.0, "L-P4D"),
    _quota("ml.p5.48xlarge", 2.0, "L-P5"),
    _quota("ml.g5.12xlarge", 4.0, "L-G512"),
    _quota("ml.p3.2xlarge", 8.0, "L-P32"),
    _quota("ml.g5.xlarge", 0.0, "L-G5X"),
    _quota("ml.g4dn.xlarge", 4.0, "L-G4X"),
    _quota("ml.c5.2xlarge", 4.0, "L-C52"),
    _quota("ml.c5.xlarge", 0.0, "L-C5X"),
    _quota("ml.trn1.2xlarge", 8.0, "L-TRN1"),
]


def test_preflight_suggests_only_instance_types_the_route_can_use(
    fake_aws: FakeAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workshop import cloud

    mp = get_lab("model_parallel")
    smp = sj.plan_job(mp, route="smp", hyperparameters={}, region=REGION, allow_unsupported_image=True)
    smp_types = mp.sagemaker_route("smp").instance_types
    assert smp.instance_type == "ml.p4d.24xlarge" and set(smp.allowed_instance_types) == set(smp_types)
    assert set(smp_types) == {"ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge"}
    _stub_quotas(fake_aws.boto, QUOTAS, monkeypatch)
    with pytest.raises(WorkshopError, match="quota for ml.p4d.24xlarge") as info:
        cloud.preflight(smp, fake_aws.role_arn, fake_aws.boto, identity=ROOT)
    assert "ml.p5.48xlarge, whose quota allows 2" in info.value.fix
    assert "ml.g5" not in info.value.fix and "ml.p3" not in info.value.fix  # SMP cannot run there

    # Lab 3 on GPUs: any GPU type with quota, except Volta (p3), which the CUDA 13 image cannot use.
    ddp = sj.plan_job(get_lab("data_parallel"), hyperparameters={}, region=REGION)
    _stub_quotas(fake_aws.boto, QUOTAS, monkeypatch)
    with pytest.raises(WorkshopError, match="quota for ml.g5.xlarge") as info:
        cloud.preflight(ddp, fake_aws.role_arn, fake_aws.boto, identity=ROOT)
    assert "ml.g4dn.xlarge" in info.value.fix and "ml.p3" not in info.value.fix and "ml.c5" not in info.value.fix

    # On CPU (gloo): CPU types only; Trainium is not a CPU instance for a PyTorch CPU image.
    cpu = sj.plan_job(get_lab("data_parallel"), hyperparameters={}, region=REGION, instance_type="ml.c5.xlarge")
    _stub_quotas(fake_aws.boto, QUOTAS, monkeypatch)
    with pytest.raises(WorkshopError, match="quota for ml.c5.xlarge") as info:
        cloud.preflight(cpu, fake_aws.role_arn, fake_aws.boto, identity=ROOT)
    assert "ml.c5.2xlarge, whose quota allows 2" in info.value.fix and "trn1" not in info.value.fix
