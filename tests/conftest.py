"""Shared fixtures: the MNIST subset once per session, and no data downloads in tests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workshop import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures"
PROBE_CODE = FIXTURES / "probe"


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory) -> Path:
    """The 5,000-digit subset as train/test channels (tests never download)."""
    from workshop.datasets.mnist import prepare_mnist

    root = tmp_path_factory.mktemp("mnist")
    prepare_mnist(root, source="subset")
    return root


@pytest.fixture(scope="session")
def channels(mnist_dir) -> dict[str, Path]:
    return {"train": mnist_dir / "train", "test": mnist_dir / "test"}


@pytest.fixture(autouse=True)
def _offline_mnist(monkeypatch):
    monkeypatch.setenv("WORKSHOP_MNIST_SOURCE", os.environ.get("WORKSHOP_MNIST_SOURCE", "subset"))


def isolate_aws(mp: pytest.MonkeyPatch, tmp: Path, user: str) -> None:
    """No credentials, no AWS or SDK config of the person running the tests, not on SageMaker."""
    from workshop.cloud import aws

    for key in list(os.environ):
        if key.startswith(("AWS_", "SAGEMAKER_")):
            mp.delenv(key)
    empty = tmp / "aws-empty"
    empty.write_text("")
    sdk_config = tmp / "sagemaker-config.yaml"
    sdk_config.write_text("SchemaVersion: '1.0'\n")
    mp.setenv("AWS_CONFIG_FILE", str(empty))
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata probe either
    mp.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(sdk_config))
    mp.setenv("SAGEMAKER_ADMIN_CONFIG_OVERRIDE", str(sdk_config))
    mp.delenv(aws.ROLE_ENV, raising=False)
    mp.setenv(aws.USER_ENV, user)
    mp.setattr(aws, "NOTEBOOK_METADATA_FILE", str(tmp / "no-such-metadata.json"))


def repo_path(*parts: str) -> Path:
    return REPO_ROOT.joinpath(*parts)


@contextlib.contextmanager
def strict_moto(mp: pytest.MonkeyPatch, tmp: Path, user: str, region: str = "us-east-1") -> Iterator[Any]:
    """moto with throwaway credentials, and the AWS APIs it lacks (IAM's policy simulator,
    StopTrainingJob) from fake_aws_apis; yields a boto3 session. Nothing of the caller's AWS."""
    import boto3
    import fake_aws_apis
    from moto import mock_aws

    isolate_aws(mp, tmp, user)
    mp.setenv("AWS_ACCESS_KEY_ID", "testing")
    mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    mp.setenv("AWS_DEFAULT_REGION", region)
    fake_aws_apis.install()
    try:
        with mock_aws():
            yield boto3.Session(region_name=region)
    finally:
        fake_aws_apis.uninstall()


def service_quota(name: str, value: float, code: str) -> dict[str, Any]:
    """One entry of Service Quotas' ListServiceQuotas for SageMaker."""
    return {"ServiceCode": "sagemaker", "ServiceName": "Amazon SageMaker", "QuotaCode": code,
            "QuotaName": name, "Value": value, "Unit": "None", "Adjustable": True, "GlobalQuota": False}


def quota_client(quotas: list[dict[str, Any]], region: str = "us-east-1") -> Any:
    """A Service Quotas client answering ListServiceQuotas once with `quotas`, from botocore's
    Stubber (moto 5.2.5 does not implement it; the Stubber checks the shape against the model)."""
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("service-quotas", region_name=region, aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_response("list_service_quotas", {"Quotas": quotas}, {"ServiceCode": "sagemaker"})
    stub.activate()
    return client
