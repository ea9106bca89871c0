"""The training images: which one a job runs (`sagemaker.core.image_uris.retrieve`, offline), and
how long AWS patches it (`IMAGE_SUPPORT`): an image past its end of patch is refused unless asked for."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from workshop.errors import WorkshopError

# The PyTorch labs run the SageMaker PyTorch 2.13 training image (SDK 3.27's `pytorch-amzn2023`
# family: Amazon Linux 2023, Python 3.12, CPU and CUDA 13.3 GPU variants), the PyTorch this
# project pins (torch==2.13.0), so what CI runs locally is what the job runs. End of patch
# 2027-07-20 (see IMAGE_SUPPORT). It has no smddp and no SMP.
PYTORCH_IMAGE = {"framework": "pytorch-amzn2023", "framework_version": "2.13", "py_version": "py312"}
# SMDDP runs only on these (AWS Developer Guide, "Supported frameworks, AWS Regions, and
# instances types", docs.aws.amazon.com/sagemaker/latest/dg/distributed-data-parallel-support.html:
# ml.p4d.24xlarge, ml.p4de.24xlarge, and ml.p3dn.24xlarge whose support is discontinued; the
# SMDDP FAQ: "only supports ... P4d and P4de instances"). No P5-class type is listed there, and
# SDK 3.27's own table (`sagemaker/core/fw_utils.py: SM_DATAPARALLEL_SUPPORTED_INSTANCE_TYPES`)
# is older still (p3.16xlarge, p3dn.24xlarge, p4d, p4de).
SMDDP_INSTANCE_TYPES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge")


# smddp ships in the PyTorch 2.5 training image (and the SMP images), not in newer ones: the
# PyTorch 2.11+ images on Amazon Linux 2023 are built without it (their Dockerfile and lock files,
# aws/deep-learning-containers docker/pytorch/), and both images that have it are past end of patch.
SMDDP_IMAGE = {"framework": "pytorch", "framework_version": "2.5", "py_version": "py311"}


DLC = "github.com/aws/deep-learning-containers"  # the images' own repository: their specs and dates


@dataclass(frozen=True)
class ImageSupport:
    """How long AWS patches a SageMaker framework training image.

    The Deep Learning Containers framework support policy (aws.github.io/deep-learning-containers/
    reference/support_policy/): security patches and fixes until the end of patch, none after.
    """

    label: str
    python: str
    end_of_patch: datetime.date
    source: str
    # GPU families the image cannot drive: CUDA 13 dropped Volta and older (p3: V100, p2: K80).
    no_gpu_families: tuple[str, ...] = ()


# (image family for sagemaker.core.image_uris.retrieve, major.minor) -> support, as published on
# 2026-11-23. `pytorch-amzn2023` is SDK 3.27's family for the Amazon Linux 2023 images (repository
# `pytorch`, tags `2.13-cpu-amzn2023-sagemaker` and `2.13-cu133-amzn2023-sagemaker`; no py_version in
# the tag, so `retrieve` ignores the one it is given): PyTorch 2.13.0, Python 3.12 in /opt/venv,
# CPU and GPU (CUDA 13.3, NCCL 2.30.7, EFA), no smddp, no SMP.
IMAGE_SUPPORT: dict[tuple[str, str], ImageSupport] = {
    ("pytorch-amzn2023", "2.13"): ImageSupport(
        "PyTorch 2.13 training image (Amazon Linux 2023)", "py312", datetime.date(2027, 7, 20),
        f"{DLC} docs/src/data/pytorch/2.13-cuda-sagemaker.yml and 2.13-cpu-sagemaker.yml (GA 2026-07-20)",
        no_gpu_families=("p2", "p3"),
    ),
    ("pytorch", "2.10"): ImageSupport(
        "PyTorch 2.10 training image", "py313", datetime.date(2027, 1, 21),
        f"{DLC} docs/src/data/pytorch-training/2.10-gpu-sagemaker.yml (GA 2026-01-21)", no_gpu_families=("p2", "p3"),
    ),
    ("pytorch", "2.9"): ImageSupport(
        "PyTorch 2.9 training image", "py312", datetime.date(2026, 10, 15),
        f"{DLC} docs/src/data/pytorch-training/2.9-gpu-sagemaker.yml (GA 2025-10-15)", no_gpu_families=("p2", "p3"),
    ),
    ("pytorch", "2.5"): ImageSupport(
        "PyTorch 2.5 training image", "py311", datetime.date(2025, 10, 29),
        f"{DLC} docs/src/legacy/legacy_support.yml (GA 2024-10-29)",
    ),
    ("pytorch-smp", "2.5"): ImageSupport(
        "SageMaker model-parallel (SMP v2) image, PyTorch 2.5.1", "py311", datetime.date(2025, 10, 29),
        "AWS publishes no end of patch for SMP images; its PyTorch 2.5's, "
        f"{DLC} docs/src/legacy/legacy_support.yml, applies",
    ),
    ("tensorflow", "2.21"): ImageSupport(
        "TensorFlow 2.21 training image", "py312", datetime.date(2027, 7, 10),
        f"{DLC} docs/src/data/tensorflow-training/2.21-cpu-sagemaker.yml (GA 2026-07-10)",
    ),
}


def today() -> datetime.date:
    """The date image support is checked against (one function, so a test can fix it)."""
    return datetime.date.today()


def image_support(framework: str, version: str) -> ImageSupport | None:
    """`IMAGE_SUPPORT`'s entry for an image family and version ("2.5.1" is "2.5"), or None."""
    return IMAGE_SUPPORT.get((framework, ".".join(str(version).split(".")[:2])))


def newest_supported_image(framework: str) -> tuple[str, str] | None:
    """(family, version) of the newest image of the same framework still in its patch window."""
    base = framework.split("-")[0]
    alive = [(key, s) for key, s in IMAGE_SUPPORT.items() if key[0].split("-")[0] == base and s.end_of_patch >= today()]
    if not alive:
        return None
    key, _ = max(alive, key=lambda item: tuple(int(x) for x in item[0][1].split(".")))
    return key


def check_image_supported(
    framework: str, version: str, *, allow_unsupported_image: bool = False, fix: str | None = None
) -> str:
    """A line about the image's support window; raises WorkshopError (naming `fix`) when the image is
    past its end of patch, unless `allow_unsupported_image`, which turns it into a WARNING line.

    Refused rather than warned about by default: a job on such an image runs a framework stack that
    no longer gets security fixes, in the user's account, and the workshop's promise is a run that
    works on today's supported stack. The opt-in keeps the old routes (smddp, SMP) reachable.
    """
    support = image_support(framework, version)
    if support is None:
        return (f"image support: no end-of-patch date on record for {framework} {version}; check "
                "https://aws.github.io/deep-learning-containers/reference/support_policy/")
    if today() <= support.end_of_patch:
        return f"image: {support.label}, {support.python}, patched until {support.end_of_patch} ({support.source})"
    message = (f"The {support.label} passed its end of patch on {support.end_of_patch}: AWS no longer "
               f"fixes or patches it ({support.source}).")
    if allow_unsupported_image:
        return f"WARNING: {message} Running it anyway, as asked (allow_unsupported_image=True)."
    if fix is None:
        newest = newest_supported_image(framework)
        fix = (f"use a supported image, e.g. the {newest[0]} {newest[1]} family the labs use, " if newest else
               "use a supported image, ")
        fix += "or pass allow_unsupported_image=True (CLI: --allow-unsupported-image) to run it anyway."
    raise WorkshopError(message, fix)


def retrieve_image(
    framework: str,
    version: str,
    py_version: str,
    region: str,
    instance_type: str,
    container_version: str | None = None,
) -> str:
    """The training image URI, offline (`sagemaker.core.image_uris.retrieve` reads the SDK's
    bundled `image_uri_config/*.json`); CPU or GPU follows from the instance type."""
    from sagemaker.core import image_uris

    try:
        return image_uris.retrieve(
            framework,
            region=region,
            version=version,
            py_version=py_version,
            instance_type=instance_type,
            image_scope="training",
            container_version=container_version,
        )
    except ValueError as exc:
        raise WorkshopError(
            f"No SageMaker {framework} {version} ({py_version}) training image for "
            f"{instance_type} in {region}: {exc}",
            "choose another instance type or region (see the lab's SageMakerDefaults).",
        ) from None
