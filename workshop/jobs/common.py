"""What the SageMaker job modules share: how they speak, and the container's fixed paths."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from workshop.errors import WorkshopError
from workshop.runtime.contract import RESERVED_CHANNELS  # taken by SDK v3's code and drivers

# Where CheckpointConfig syncs with S3 inside the container; scripts find it in
# SM_CHECKPOINT_DIR, which the local cluster sets too, so one name serves both runtimes.
CHECKPOINT_DIR = "/opt/ml/checkpoints"


# The SDK's default ignore list for source_dir (`SourceCode.ignore_patterns`) plus byte code.
SOURCE_IGNORE_PATTERNS = [".env", ".git", "__pycache__", ".DS_Store", ".cache", ".ipynb_checkpoints", "*.pyc"]


def say(message: str) -> None:
    print(f"[sagemaker] {message}", flush=True)


def check_s3_uri(value: str | None, what: str) -> str | None:
    if value is not None and not (isinstance(value, str) and re.match(r"^s3://[^/]+", value)):
        raise WorkshopError(f"{what} must be an s3:// URI, got {value!r}.", f"pass e.g. {what}='s3://bucket/prefix'.")
    return value


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def input_data(inputs: Mapping[str, str]) -> list[Any]:
    from sagemaker.core.training.configs import InputData

    channels = []
    for name, uri in inputs.items():
        if name in RESERVED_CHANNELS:
            raise WorkshopError(
                f"Input channel name {name!r} is reserved by SDK v3 (code and drivers).",
                "rename the channel, e.g. 'train' or 'test'.",
            )
        check_s3_uri(uri, f"inputs[{name!r}]")
        channels.append(InputData(channel_name=name, data_source=uri))
    return channels
