"""The fake SageMaker runs jobs as the service does: sm_train.sh on algo-N hosts, the job's network.

Each test submits a real SDK v3 `ModelTrainer` job (the probe script of tests/fixtures) to
`tests/fake_sagemaker.py` and checks what the service would have done with it: the SDK's own
`sm_train.sh` and driver on hosts named `algo-N`, the master at `algo-1:7777`, hosts that start
apart, and a network that reaches the internet only where the job's VPC routes there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import PROBE_CODE

from workshop.runtime import hostns

IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.9-cpu-py312"


@pytest.fixture
def aws_user() -> str:
    return "alice"


@pytest.fixture
def fake(no_aws: None, tmp_path: Path):
    import fake_sagemaker

    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=3.0) as running:
        yield running


def train(fake: Any, code: Path, *, hosts: int = 2, networking: Any = None, requirements: str | None = None,
          hyperparameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """Submit one job through the SDK (as the workshop does) and return DescribeTrainingJob."""
    import boto3
    from sagemaker.core.training.configs import Compute, SourceCode, StoppingCondition
    from sagemaker.train.distributed import Torchrun
    from sagemaker.train.model_trainer import ModelTrainer

    from workshop.cloud import aws

    boto = boto3.Session(region_name=fake.region)
    trainer = ModelTrainer(
        sagemaker_session=aws.sagemaker_session(boto), role=fake.role_arn, training_image=IMAGE,
        base_job_name="alice-probe",
        source_code=SourceCode(source_dir=str(code), entry_script="train.py", requirements=requirements),
        distributed=Torchrun(process_count_per_node=1),
        compute=Compute(instance_type="ml.m5.xlarge", instance_count=hosts),
        networking=networking, stopping_condition=StoppingCondition(max_runtime_in_seconds=600),
        hyperparameters=hyperparameters or {"epochs": 2},
    )
    trainer.train(wait=False, logs=False)  # returns at once, as on SageMaker
    name = trainer._latest_training_job.training_job_name
    fake.wait(name)
    return boto.client("sagemaker").describe_training_job(TrainingJobName=name)


def logs(fake: Any, job: str) -> dict[str, list[str]]:
    import boto3

    client = boto3.Session(region_name=fake.region).client("logs")
    streams = client.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix=job + "/")
    return {
        s["logStreamName"].split("/")[-1].rsplit("-", 1)[0]: [
            e["message"] for e in client.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs",
                                                        logStreamName=s["logStreamName"], startFromHead=True)["events"]
        ]
        for s in streams["logStreams"]
    }


def rank_env(fake: Any, rank: int) -> dict[str, Any]:
    run = fake.jobs[-1]
    found = list(Path(run.workdir).rglob(f"env-rank{rank}.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


@pytest.mark.slow
def test_hosts_run_the_sdks_sm_train_sh_as_algo_n(fake: Any) -> None:
    described = train(fake, PROBE_CODE)
    run = fake.jobs[-1]
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    assert run.runtime == "container" and run.network.startswith("internet")
    lines = logs(fake, described["TrainingJobName"])
    assert sorted(lines) == ["algo-1", "algo-2"]
    for host, host_lines in lines.items():
        # The SDK's generated script, its environment file and its Torchrun driver ran on each host.
        assert "Starting training script" in host_lines and "Running Torchrun Driver" in host_lines
        rank = int(host[-1]) - 1
        assert any(f"--master_addr=algo-1 --master_port=7777 --node_rank={rank} train.py --epochs 2" in line
                   for line in host_lines), host_lines
    env = rank_env(fake, 1)
    # algo-2 by name to its peers, but its hostname is an instance's: SageMaker does not promise algo-N.
    assert env["SM_CURRENT_HOST"] == "algo-2" and env["hostname"] == hostns.instance_hostname("algo-2")
    assert env["MASTER_ADDR"] == "algo-1" and env["algo-1"] == "127.0.0.1"
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "ml.m5.xlarge"
    assert env["SM_MODEL_DIR"] == "/opt/ml/model" and env["cwd"] == "/opt/ml/input/data/code"
    assert any("starting 3 s after the first host" in line for line in lines["algo-2"])


@pytest.mark.slow
def test_a_vpc_without_a_route_out_has_no_pypi(fake: Any, tmp_path: Path) -> None:
    """The workshop's endpoints-only VPC: a job that installs requirements fails as on SageMaker,
    where pip cannot reach PyPI; with a NAT gateway the job has the internet."""
    from sagemaker.core.training.configs import Networking

    from workshop import cloud

    code = tmp_path / "code"
    shutil.copytree(PROBE_CODE, code)
    (code / "requirements.txt").write_text("six==1.16.0\n")
    net = cloud.ensure_network(egress="endpoints", poll_s=0.01)
    networking = Networking(subnets=net.subnet_ids, security_group_ids=net.security_group_ids)
    described = train(fake, code, networking=networking, requirements="requirements.txt")
    assert described["TrainingJobStatus"] == "Failed"
    assert "no route to the internet" in fake.jobs[-1].network
    host_lines = logs(fake, described["TrainingJobName"])["algo-1"]
    assert "Installing requirements" in host_lines
    assert any("six" in line and ("No matching distribution" in line or "ERROR" in line) for line in host_lines)
    assert not any("Running Torchrun Driver" == line for line in host_lines)  # set -e: it never trained

    cloud.delete_network(poll_s=0.01)
    nat = cloud.ensure_network(egress="nat", poll_s=0.01)
    described = train(fake, PROBE_CODE, networking=Networking(subnets=nat.subnet_ids,
                                                              security_group_ids=nat.security_group_ids))
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    assert fake.jobs[-1].network.startswith("internet (VPC subnets")
    assert rank_env(fake, 0)["interfaces"] == ["lo"]  # a network of its own ...
    assert rank_env(fake, 0)["HTTPS_PROXY"].startswith("http://127.0.0.1:")  # ... with a way out


@pytest.mark.parametrize(("image", "same"), [
    ("763104351884.dkr.ecr.us-east-1.amazonaws.com/tensorflow-training:2.21-cpu-py312", True),
    ("658645717510.dkr.ecr.us-east-1.amazonaws.com/smdistributed-modelparallel:2.5.1-gpu-py311-cu124", False),
    ("763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.9-gpu-py312", False),
])
def test_the_fake_says_whether_the_image_carries_the_framework_it_runs_with(image: str, same: bool) -> None:
    """A job runs here with this environment's torch/TensorFlow; the fake says when that is not
    the image's version (then the job proves nothing about that image's framework)."""
    import fake_sagemaker

    note = fake_sagemaker.image_framework_note(image)
    assert ("the same" in note and "NOT" not in note) == same, note


@pytest.mark.slow
def test_every_hosts_model_and_output_data_are_aggregated_into_one_archive_each(fake: Any, tmp_path: Path) -> None:
    """The service aggregates every host's /opt/ml/model into model.tar.gz and every host's
    /opt/ml/output/data into output.tar.gz beside it (not rank 0's host's alone): a job whose
    hosts each write a file of their own finds them all in the archives."""
    import io
    import tarfile

    import boto3

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import os, pathlib, socket\n"
        "host = os.environ.get('SM_CURRENT_HOST') or socket.gethostname()\n"
        "for var, stem in (('SM_MODEL_DIR', 'weights'), ('SM_OUTPUT_DATA_DIR', 'trace')):  # one rank per host\n"
        "    folder = pathlib.Path(os.environ[var])\n"
        "    folder.mkdir(parents=True, exist_ok=True)\n"
        "    (folder / f'{stem}-{host}.txt').write_text(host)\n"
    )
    described = train(fake, code, hosts=2)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    model = described["ModelArtifacts"]["S3ModelArtifacts"]
    s3 = boto3.Session(region_name=fake.region).client("s3")

    def members(uri: str) -> dict[str, str]:
        bucket, key = uri[len("s3://"):].split("/", 1)
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
            return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}

    assert members(model) == {"weights-algo-1.txt": "algo-1", "weights-algo-2.txt": "algo-2"}
    output = model.rsplit("/", 1)[0] + "/output.tar.gz"
    assert output == fake.jobs[-1].output_artifact
    assert members(output) == {"trace-algo-1.txt": "algo-1", "trace-algo-2.txt": "algo-2"}
