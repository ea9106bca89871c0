"""Build, dry-run and submit a lab's SageMaker training job with SDK v3 `ModelTrainer`.

The path every notebook and the CLI take in `sagemaker` mode is `run_lab_on_sagemaker`:

1. `plan_job` checks everything that can be checked without AWS (hyperparameters through the
   lab script's own parser and against what CreateTrainingJob and the container accept,
   instance type and count against the service model, `max_run`, smddp's instance types, the
   image's support window, the VPC settings, the launcher) and settles the image, job name,
   tags and metric definitions;
2. credentials, then the execution role (`workshop.aws`);
   and the preflight (`workshop.infra.preflight`: permission simulation, the Service Quotas
   value for the instance type, the cost estimate), before anything is created or uploaded;
3. the workshop network and role if asked for (`workshop.infra`), and `build_trainer` turns
   the plan into a `ModelTrainer`;
4. the MNIST channels go to S3 once (`workshop.data.upload_channels`);
5. `submit` starts the job, streams its CloudWatch logs, and returns a `JobResult`.

Every user error is a `WorkshopError` raised in steps 1-3, before any data is uploaded or any
job created. `dry_run` runs steps 1 and 3 and the SDK's real `train()` inside moto's
in-process fake AWS, and returns the exact CreateTrainingJob request the SDK sends, with no
credentials and nothing spent.

Facts relied on (SageMaker Python SDK 3.27, `sagemaker/train/model_trainer.py` unless noted):
- `ModelTrainer(...)` resolves the role at construction (`model_post_init` ->
  `TrainDefaults.get_role` -> `sagemaker/core/helper/iam_role_resolver.py:
  resolve_and_validate_role`), validating it through IAM `SimulatePrincipalPolicy` unless the
  environment says `SAGEMAKER_VALIDATE_ROLE=false`; an ARN is taken as is, without an IAM call.
  The same constructor resolves the output path through `Session.default_bucket()`.
- `train(dry_run=True)` is not dry: it builds the request with `_create_training_job_args`,
  which uploads the source code and the SDK's drivers to S3 (and creates the default bucket),
  then returns None without the request. Hence the moto sandbox in `dry_run`.
- With `source_code`, the SDK adds two input channels, `code` (the lab's `code/` folder) and
  `sm_drivers` (its drivers, `sm_train.sh`, `sourcecode.json`, `distributed.json`), and runs
  `/bin/bash -c .../sm_drivers/sm_train.sh` as the container entrypoint. `Torchrun` leaves no
  trace in the request itself: it is `distributed.json` (`Torchrun.model_dump()`, e.g.
  `{"process_count_per_node": 1, "smp": null}`) in the `sm_drivers` channel, which
  `torchrun_driver.py` reads as `SM_DISTRIBUTED_CONFIG`.
- Job names are `<base_job_name>-<%Y%m%d%H%M%S>` cut at 63 characters
  (`sagemaker/train/utils.py: _get_unique_name`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import difflib
import functools
import io
import json
import os
import re
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workshop import aws
from workshop.errors import WorkshopError
from workshop.labs import Lab, get_lab
from workshop.metrics import parse_lines, sagemaker_metric_definitions
from workshop.runtime.contract import (
    RESERVED_CHANNELS,  # taken by SDK v3 (see the module docstring)
)

if TYPE_CHECKING:
    from sagemaker.train.distributed import DistributedConfig
    from sagemaker.train.model_trainer import ModelTrainer

__all__ = [
    "CHECKPOINT_DIR",
    "DryRunRequest",
    "IMAGE_SUPPORT",
    "ImageSupport",
    "JobPlan",
    "JobResult",
    "LauncherNotSupported",
    "PLACEHOLDER_ROLE_ARN",
    "PrepStep",
    "SMDDP_INSTANCE_TYPES",
    "build_trainer",
    "check_hyperparameters",
    "check_image_supported",
    "check_internet",
    "check_role",
    "data_prefix",
    "dry_run",
    "gpus_per_instance",
    "image_support",
    "job_records",
    "plan_job",
    "prepare_launcher",
    "register_launcher",
    "run_lab_on_sagemaker",
    "submit",
    "today",
    "training_instance_types",
]

# Where CheckpointConfig syncs with S3 inside the container; scripts find it in
# SM_CHECKPOINT_DIR, which the local cluster sets too, so one name serves both runtimes.
CHECKPOINT_DIR = "/opt/ml/checkpoints"
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
# CreateTrainingJob's StoppingCondition.MaxRuntimeInSeconds allows at most 28 days.
MAX_RUNTIME_LIMIT_S = 28 * 24 * 3600
# A dry run needs some role ARN; moto's account id makes it obviously not yours.
PLACEHOLDER_ACCOUNT = "123456789012"
PLACEHOLDER_ROLE_ARN = f"arn:aws:iam::{PLACEHOLDER_ACCOUNT}:role/WorkshopDryRunPlaceholder"
DRY_RUN_REGION = "us-east-1"  # when no region is configured: a dry run needs one for the image
DRY_RUN_SUBNET = "subnet-0123456789abcdef0"  # placeholders a dry run with network=... shows
DRY_RUN_SECURITY_GROUP = "sg-0123456789abcdef0"
# The SDK's default ignore list for source_dir (`SourceCode.ignore_patterns`) plus byte code.
SOURCE_IGNORE_PATTERNS = [".env", ".git", "__pycache__", ".DS_Store", ".cache", ".ipynb_checkpoints", "*.pyc"]
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
POLL_S = 15.0
TERMINAL_STATUSES = ("Completed", "Failed", "Stopped")
# The base job name leaves room for "-" and the SDK's 14-digit timestamp in 63 characters.
BASE_JOB_NAME_MAX = 63 - 15
_VALIDATE_ROLE_ENV = "SAGEMAKER_VALIDATE_ROLE"


def _say(message: str) -> None:
    print(f"[sagemaker] {message}", flush=True)


class LauncherNotSupported(WorkshopError, NotImplementedError):
    """The lab's SageMaker launcher has no job builder yet (later labs register theirs)."""


# --------------------------------------------------------------------------- launchers

LauncherFactory = Callable[["JobPlan"], "DistributedConfig"]
LAUNCHERS: dict[str, LauncherFactory] = {}


@dataclass(frozen=True)
class PrepStep:
    """Work a launcher needs done in AWS before its job starts (e.g. lab 2's one-time Horovod
    build job). Run by `run_lab_on_sagemaker` after every check passed, with the final plan
    (network included), the role ARN and the SageMaker session."""

    what: str  # one line, printed before it runs (what it creates, what it costs)
    run: Callable[[JobPlan, str, Any], Any]  # its result is not used


# Optional per-launcher hooks, next to the factory:
# - check(plan) -> plan: offline, at the end of `plan_job` (refuse what cannot work, add notes);
# - prepare(plan, bucket, boto) -> (plan, steps): once the bucket is known (boto None in a dry
#   run: nothing may be looked up), before anything is created; may add input channels
#   (`JobPlan.extra_inputs`), internet needs (`JobPlan.internet_needs`) and `PrepStep`s.
LauncherCheck = Callable[["JobPlan"], "JobPlan"]
LauncherPrepare = Callable[["JobPlan", str, Any], "tuple[JobPlan, list[PrepStep]]"]
LAUNCHER_CHECKS: dict[str, LauncherCheck] = {}
LAUNCHER_PREPARE: dict[str, LauncherPrepare] = {}


def register_launcher(
    name: str, *, check: LauncherCheck | None = None, prepare: LauncherPrepare | None = None
) -> Callable[[LauncherFactory], LauncherFactory]:
    """Register how a `SageMakerDefaults.launcher` becomes an SDK `DistributedConfig`.

    Labs 1, 2 and 4 add theirs (a parameter-server driver, an MPI driver with the right
    `-np`, `Torchrun(smp=...)`), so this module need not know them; `check` and `prepare`
    are the optional hooks described above.
    """

    def decorator(factory: LauncherFactory) -> LauncherFactory:
        LAUNCHERS[name] = factory
        if check is not None:
            LAUNCHER_CHECKS[name] = check
        if prepare is not None:
            LAUNCHER_PREPARE[name] = prepare
        return factory

    return decorator


def prepare_launcher(plan: JobPlan, bucket: str, boto: Any) -> tuple[JobPlan, list[PrepStep]]:
    """The launcher's `prepare` hook (see `register_launcher`), or the plan unchanged."""
    prepare = LAUNCHER_PREPARE.get(plan.lab.sagemaker.launcher)
    if prepare is None:
        return plan, []
    plan, steps = prepare(plan, bucket, boto)
    return plan, list(steps)


def internet_needs(plan: JobPlan) -> list[tuple[str, str]]:
    """(why, fix) for everything the job must fetch from the internet at run time: the
    launcher's needs, and a `requirements.txt` in the code folder, which `sm_train.sh` installs
    from PyPI before the driver starts."""
    needs = list(plan.internet_needs)
    requirements = plan.lab.source_dir / "requirements.txt"
    if requirements.is_file():
        needs.append((
            f"sm_train.sh installs {plan.lab.folder}/code/requirements.txt from PyPI when the job starts",
            "remove requirements.txt from the code folder and pass an image that has those packages as image_uri",
        ))
    return needs


def check_internet(plan: JobPlan, egress: str | None) -> JobPlan:
    """Refuse a job that needs the internet in a network without a route to it.

    The workshop network with interface endpoints only (`network=True`/"endpoints") reaches
    AWS services and nothing else; "nat" and SageMaker's own network (no VPC) reach the
    internet. For subnets of the caller's own, the route cannot be known here: a note says so.
    """
    needs = internet_needs(plan)
    if not needs:
        return plan
    why = "; ".join(w for w, _ in needs)
    if egress == "endpoints":
        from workshop import infra

        raise WorkshopError(
            f"This job needs the internet ({why}), and the workshop network with interface endpoints "
            "(network=True or 'endpoints') has no route to it: the job would fail after its instances started.",
            f"run it with network='nat' (CLI: --network nat; a NAT gateway, about ${infra.network_hourly_usd('nat'):.3f}/h "
            "while the network exists) or without the workshop network (network=False, CLI: --network none); or "
            + "; or ".join(f for _, f in needs) + ".",
        )
    if plan.subnets and egress is None:
        note = (f"this job needs the internet ({why}); in your subnets it has it only through a NAT gateway "
                "or similar route, which cannot be checked from here: without one the job fails at its start")
        if note not in plan.notes:
            plan = dataclasses.replace(plan, notes=(*plan.notes, note))
    return plan


@register_launcher("torchrun")
def _torchrun(plan: JobPlan) -> DistributedConfig:
    """SDK v3's own `Torchrun` driver; None processes per node means one per GPU."""
    from sagemaker.train.distributed import Torchrun

    return Torchrun(process_count_per_node=plan.procs_per_host)


# --------------------------------------------------------------------------- instance facts


def _family(instance_type: str) -> str:
    return instance_type.split(".")[1] if instance_type.count(".") == 2 else ""


def _kind(instance_type: str) -> str:
    """"gpu" (g, p), "neuron" (trn, inf: AWS Trainium/Inferentia) or "cpu"."""
    family = _family(instance_type)
    if family.startswith(("trn", "inf")):
        return "neuron"
    return "gpu" if is_gpu_instance(instance_type) else "cpu"


def is_gpu_instance(instance_type: str) -> bool:
    """GPU families start with g or p: the same rule the SDK uses to pick the image
    (`sagemaker/core/image_uris.py: _processor`)."""
    return _family(instance_type)[:1] in ("g", "p")


def gpus_per_instance(instance_type: str, region: str = "us-east-1") -> int:
    """GPUs of one instance: the SDK's table (`sagemaker/core/instance_types_gpu_info.py`),
    else a rule of thumb for the g families it lacks (1 GPU, 4 at 12/24xlarge, 8 at 48xlarge)."""
    if not is_gpu_instance(instance_type):
        return 0
    from sagemaker.core import instance_types_gpu_info

    info = instance_types_gpu_info.retrieve(region).get(instance_type) or (
        instance_types_gpu_info.retrieve("us-east-1").get(instance_type)
    )
    if info:
        return int(info["Count"])
    size = instance_type.rsplit(".", 1)[-1]
    if _family(instance_type).startswith("p"):
        return {"2xlarge": 1, "8xlarge": 4}.get(size, 8)
    return {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8}.get(size, 1)


# --------------------------------------------------------------------------- images


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


# --------------------------------------------------------------------------- what CreateTrainingJob accepts


@functools.lru_cache(maxsize=1)
def _create_training_job_shapes() -> dict[str, Any]:
    """CreateTrainingJob's input constraints, read offline from botocore's bundled SageMaker
    service model (the same file the API's validation is generated from)."""
    import botocore
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    members = model.operation_model("CreateTrainingJob").input_shape.members
    hps = members["HyperParameters"]
    return {
        "instance_types": tuple(members["ResourceConfig"].members["InstanceType"].enum),
        "role_arn": members["RoleArn"].metadata,  # min, max, pattern
        "hp_count": hps.metadata.get("max", 100),
        "hp_key": hps.key.metadata,  # HyperParameterKey: max 256, pattern .*
        "hp_value": hps.value.metadata,  # HyperParameterValue: max 2500, pattern .*
        "source": f"botocore {botocore.__version__}'s SageMaker service model",
    }


def training_instance_types() -> tuple[str, ...]:
    """Every value of CreateTrainingJob's `TrainingInstanceType` enum."""
    return _create_training_job_shapes()["instance_types"]


def _check_instance_type(instance_type: str) -> None:
    known = training_instance_types()
    if instance_type in known:
        return
    near = difflib.get_close_matches(instance_type, known, n=3, cutoff=0.6) or ["ml.g5.xlarge", "ml.m5.xlarge"]
    raise WorkshopError(
        f"{instance_type} is not a SageMaker training instance type: CreateTrainingJob would reject it "
        f"({_create_training_job_shapes()['source']} lists {len(known)}).",
        f"pick one of CreateTrainingJob's TrainingInstanceType values, e.g. {', '.join(near)}; if AWS added "
        "the type recently, upgrade botocore (pip install -U botocore).",
    )


# Java's `.` (AWS validates the model's patterns as Java regular expressions) matches no line terminator.
_LINE_TERMINATORS = ("\n", "\r", "\u0085", "\u2028", "\u2029")
_HP_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ENV_FILE = "/opt/ml/input/sm_training.env"


def check_hyperparameters(hyperparameters: Mapping[str, Any]) -> None:
    """Refuse the hyperparameters that CreateTrainingJob rejects or the container cannot receive.

    - CreateTrainingJob (the service model): at most 100 of them; keys up to 256 characters, values
      up to 2,500, each matching `.*`, so no line break.
    - SDK v3's `sm_train.sh` runs `container_drivers/scripts/environment.py`, which writes every
      hyperparameter into `/opt/ml/input/sm_training.env` as `export SM_HP_<KEY>='<value>'` (key
      upper-cased, dashes to underscores) and all of them as `export SM_HPS='<json>'`, with no
      escaping, then `source`s the file under `set -e`: a single quote anywhere in a key or value
      ends the string early, and a key with characters other than letters, digits, `-` and `_` makes
      an invalid variable name; either fails the job before the script starts.

    Values are checked as the SDK sends them (`safe_serialize`: text as is, anything else as JSON).
    """
    shapes = _create_training_job_shapes()
    most = shapes["hp_count"]
    if len(hyperparameters) > most:
        raise WorkshopError(
            f"{len(hyperparameters)} hyperparameters; CreateTrainingJob takes at most {most} ({shapes['source']}).",
            "pass fewer: group related settings into one JSON value, or put them in a file of a data channel.",
        )
    env_names: dict[str, str] = {}
    for key, value in hyperparameters.items():
        if not isinstance(key, str):
            raise WorkshopError(f"Hyperparameter name {key!r} is not text.", "use names like 'epochs' or 'batch-size'.")
        text = value if isinstance(value, str) else json.dumps(value)
        for what, item, limit in (("name", key, shapes["hp_key"].get("max", 256)),
                                  ("value", text, shapes["hp_value"].get("max", 2500))):
            shown = item if len(item) <= 60 else item[:57] + "..."
            if len(item) > limit:
                raise WorkshopError(
                    f"Hyperparameter {what} {shown!r} is {len(item)} characters, longer than {limit} characters, "
                    f"CreateTrainingJob's limit ({shapes['source']}).",
                    "shorten it, or pass large settings as a file in a data channel.",
                )
            if "'" in item:
                raise WorkshopError(
                    f"Hyperparameter {key!r}: its {what} {shown!r} contains a single quote ('), which the container "
                    f"cannot receive: SDK v3's sm_train.sh writes each hyperparameter into {_ENV_FILE} as "
                    "export SM_HP_<KEY>='<value>' (and all of them inside SM_HPS='<json>') without escaping, "
                    "then sources it, so the quote ends the string early and the job fails before the script starts.",
                    "leave the single quote out (rephrase, or use a typographic apostrophe), or pass the text in a "
                    "file of a data channel.",
                )
            if any(t in item for t in _LINE_TERMINATORS):
                raise WorkshopError(
                    f"Hyperparameter {key!r}: its {what} {shown!r} contains a line break, which CreateTrainingJob "
                    f"rejects: each key and value must match the pattern `.*` ({shapes['source']}), and `.` "
                    "matches no line break.",
                    "put it on one line (e.g. join the lines with '; '), or pass multi-line text in a file of a "
                    "data channel.",
                )
        if not _HP_KEY.fullmatch(key):
            raise WorkshopError(
                f"Hyperparameter name {key!r} cannot be part of an environment variable name: sm_train.sh exports "
                f"it as SM_HP_{key.replace('-', '_').upper()} in {_ENV_FILE}, and bash refuses that name, which "
                "fails the job at start.",
                "use only letters, digits, '-' and '_' in hyperparameter names (the script's flags have that form).",
            )
        name = "SM_HP_" + key.replace("-", "_").upper()
        if name in env_names:
            raise WorkshopError(
                f"Hyperparameters {env_names[name]!r} and {key!r} both become {name} in the container's "
                f"{_ENV_FILE}; one would silently replace the other.",
                "pass one of them only (scripts read '-' and '_' the same way).",
            )
        env_names[name] = key


def check_role(role: str, source: str = "role") -> str:
    """`role` if CreateTrainingJob could take it (as an ARN: its RoleArn pattern and length) or it
    is an IAM role name that resolves to one; WorkshopError otherwise. Offline."""
    role = str(role).strip()
    shape = _create_training_job_shapes()["role_arn"]
    if role.startswith("arn:"):
        ok = (bool(aws._ROLE_ARN.match(role)) and bool(re.fullmatch(shape["pattern"], role))
              and shape.get("min", 20) <= len(role) <= shape.get("max", 2048))
    else:
        ok = bool(aws._ROLE_NAME.match(role))
    if not ok:
        raise WorkshopError(
            f"{source} is not an IAM role ARN or role name: {role!r}.",
            "use the form arn:aws:iam::<12-digit account>:role/<name>, or a role name (letters, digits and "
            "+=,.@_-, up to 64 characters).",
        )
    return role


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class JobPlan:
    """Everything about a job that is decided before AWS is touched."""

    lab: Lab
    region: str
    hyperparameters: dict[str, Any]
    instance_type: str
    instance_count: int
    procs_per_host: int | None  # None: the launcher's default (one per GPU)
    world_size: int
    image_uri: str
    max_run_s: int
    base_job_name: str
    tags: list[dict[str, str]]
    environment: dict[str, str]
    metric_definitions: list[dict[str, str]]
    subnets: list[str] | None = None
    security_group_ids: list[str] | None = None
    checkpoint_s3_uri: str | None = None
    output_s3_uri: str | None = None
    notes: tuple[str, ...] = ()
    custom_image: bool = False  # image_uri was the caller's, not SageMaker's framework image
    # What the route can run on, for checks and for what preflight may suggest instead: only these
    # types (empty: any training type), never these families (e.g. p3 for a CUDA 13 image).
    allowed_instance_types: tuple[str, ...] = ()
    excluded_instance_families: tuple[str, ...] = ()
    # Input channels the launcher adds (channel, S3 URI), e.g. lab 2's `horovod` wheels.
    extra_inputs: tuple[tuple[str, str], ...] = ()
    # (why, fix) for what the launcher must fetch from the internet at run time (`check_internet`).
    internet_needs: tuple[tuple[str, str], ...] = ()

    def allows(self, instance_type: str) -> bool:
        """Whether this job, as planned, could run on `instance_type` instead: a training type the
        route and the image support, of the planned type's kind (GPU, Trainium/Inferentia or plain
        CPU: the image and the build differ), with a GPU per process."""
        if instance_type not in training_instance_types():
            return False
        if self.allowed_instance_types and instance_type not in self.allowed_instance_types:
            return False
        if _kind(instance_type) != _kind(self.instance_type):
            return False
        gpu = is_gpu_instance(instance_type)
        if gpu and _family(instance_type) in self.excluded_instance_families:
            return False
        return not (gpu and self.procs_per_host and gpus_per_instance(instance_type, self.region) < self.procs_per_host)


def _positive_int(value: Any, what: str, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkshopError(f"{what} must be a whole number of at least 1, got {value!r}.", fix)
    return value


def _id_list(value: Any, what: str) -> list[str] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    if not items or not all(isinstance(v, str) and v.strip() for v in items):
        raise WorkshopError(f"{what} must be a list of IDs, got {value!r}.", f"pass e.g. {what}=['...'].")
    return [v.strip() for v in items]


def _s3_uri(value: str | None, what: str) -> str | None:
    if value is not None and not (isinstance(value, str) and re.match(r"^s3://[^/]+", value)):
        raise WorkshopError(f"{what} must be an s3:// URI, got {value!r}.", f"pass e.g. {what}='s3://bucket/prefix'.")
    return value


def _tags(user: str, lab: Lab, extra: Mapping[str, str] | Sequence[Any] | None) -> list[dict[str, str]]:
    """Workshop, user and lab tags (so a shared account can tell attendees' jobs apart)."""
    tags = {"workshop": aws.WORKSHOP_NAME, "workshop-user": user, "workshop-lab": lab.key}
    if isinstance(extra, Mapping):
        tags.update({str(k): str(v) for k, v in extra.items()})
    elif extra:
        for tag in extra:
            if isinstance(tag, Mapping):
                key, value = tag.get("Key", tag.get("key")), tag.get("Value", tag.get("value"))
            else:
                key, value = getattr(tag, "key", None), getattr(tag, "value", None)
            if key is None or value is None:
                raise WorkshopError(f"Tag {tag!r} has no key or value.", "pass tags={'key': 'value'}.")
            tags[str(key)] = str(value)
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _retrieve_image(
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


def plan_job(
    lab: Lab | str,
    *,
    hyperparameters: Mapping[str, Any] | None,
    region: str,
    instance_type: str | None = None,
    instance_count: int | None = None,
    procs_per_host: int | None = None,
    subnets: Sequence[str] | None = None,
    security_group_ids: Sequence[str] | None = None,
    max_run_s: int | None = None,
    checkpoint_s3_uri: str | None = None,
    output_s3_uri: str | None = None,
    base_job_name: str | None = None,
    tags: Mapping[str, str] | Sequence[Any] | None = None,
    train_samples: int | None = None,
    image_uri: str | None = None,
    allow_unsupported_image: bool = False,
) -> JobPlan:
    """Check a job and settle its details, offline. Every user error is raised here.

    `train_samples` (when the data is known) lets the script's `check_args` check the
    per-rank share of the data too. `image_uri` replaces the lab's SageMaker framework image
    (e.g. lab 2's image with Horovod built in, from 2_horovod/docker/Dockerfile).
    Besides the lab's own checks, it refuses what CreateTrainingJob would reject (an instance
    type it does not list, hyperparameters over its limits) or the container could not receive
    (`check_hyperparameters`), and an image past its end of patch (`IMAGE_SUPPORT`) unless
    `allow_unsupported_image`.
    """
    lab = get_lab(lab) if isinstance(lab, str) else lab
    defaults = lab.sagemaker
    if defaults is None:
        raise WorkshopError(f"Lab {lab.key!r} has no SageMaker settings.", "run it with mode = 'local'.")
    if defaults.launcher not in LAUNCHERS:
        raise LauncherNotSupported(
            f"Lab {lab.key!r} launches with {defaults.launcher!r} on SageMaker, which "
            "workshop.sagemaker_jobs cannot build yet (known: " + ", ".join(sorted(LAUNCHERS)) + ").",
            "run this lab with mode = 'local' for now.",
        )
    hyperparameters = dict(hyperparameters or {})
    check_hyperparameters(hyperparameters)
    notes: list[str] = []

    instance_type = defaults.instance_type if instance_type is None else instance_type
    if not isinstance(instance_type, str) or not re.fullmatch(r"ml\.[a-z0-9-]+\.[a-z0-9]+", instance_type):
        raise WorkshopError(
            f"Not a SageMaker training instance type: {instance_type!r}.",
            "use the ml. form, e.g. instance_type='ml.g5.xlarge' (or 'ml.m5.xlarge' for CPU).",
        )
    _check_instance_type(instance_type)
    allowed = tuple(getattr(defaults, "instance_types", ()) or ())
    if allowed and instance_type not in allowed:
        raise WorkshopError(
            f"Lab {lab.key!r} runs on SageMaker only on {', '.join(allowed)} (its route needs them), not {instance_type}.",
            f"pick one of those, e.g. instance_type={allowed[0]!r}.",
        )
    count_fix = "pass hosts=1 or more (CLI: --hosts)."
    count = defaults.instance_count if instance_count is None else instance_count
    instance_count = _positive_int(count, "The instance count", count_fix)
    procs = procs_per_host if procs_per_host is not None else defaults.procs_per_host
    if procs is not None:
        procs = _positive_int(procs, "Processes per host", "pass procs_per_host=1 or more, or None for one per GPU.")
    gpus = gpus_per_instance(instance_type, region)
    if procs is not None and gpus and procs > gpus:
        raise WorkshopError(
            f"{procs} processes per host do not fit {instance_type}, which has {gpus} GPU"
            f"{'s' if gpus > 1 else ''}: each rank drives one GPU.",
            f"pass procs_per_host={gpus} or fewer (None: one per GPU), or an instance type with more GPUs.",
        )
    world_size = instance_count * (procs or max(gpus, 1))

    max_run_s = defaults.max_run_s if max_run_s is None else max_run_s
    if isinstance(max_run_s, bool) or not isinstance(max_run_s, int) or not 0 < max_run_s <= MAX_RUNTIME_LIMIT_S:
        raise WorkshopError(
            f"max_run_s must be a whole number of seconds in 1..{MAX_RUNTIME_LIMIT_S}, got {max_run_s!r}.",
            "pass e.g. max_run_s=3600: SageMaker stops (and stops billing) the job after it.",
        )

    subnets = _id_list(subnets, "subnets")
    security_group_ids = _id_list(security_group_ids, "security_group_ids")
    if (subnets is None) != (security_group_ids is None):
        raise WorkshopError(
            "A VPC job needs both subnets and security groups (CreateTrainingJob VpcConfig).",
            "pass both subnets=[...] and security_group_ids=[...], or neither.",
        )
    checkpoint_s3_uri = _s3_uri(checkpoint_s3_uri, "checkpoint_s3_uri")
    output_s3_uri = _s3_uri(output_s3_uri, "output_s3_uri")

    framework, version, py_version = defaults.framework, defaults.framework_version, defaults.py_version
    # Only the SMP images need it (REFERENCE.md: without it the pytorch-smp tag is wrong);
    # read with getattr so labs can add the field to SageMakerDefaults when they need it.
    container_version = getattr(defaults, "container_version", None)
    backend = str(hyperparameters.get("backend", "")).strip().lower()
    if backend == "smddp":
        if instance_type not in SMDDP_INSTANCE_TYPES:
            raise WorkshopError(
                f"backend=smddp does not run on {instance_type}: SageMaker's data parallelism "
                f"library supports only {', '.join(SMDDP_INSTANCE_TYPES)}.",
                "use backend=auto or nccl on this instance type, or instance_type='ml.p4d.24xlarge'.",
            )
        if framework.split("-")[0] != "pytorch":
            raise WorkshopError(
                f"backend=smddp needs a PyTorch image; lab {lab.key!r} uses {framework}.",
                "drop the backend hyperparameter.",
            )
        if framework != "pytorch-smp" and image_support(framework, version) != image_support(
            SMDDP_IMAGE["framework"], SMDDP_IMAGE["framework_version"]
        ):
            old = image_support(SMDDP_IMAGE["framework"], SMDDP_IMAGE["framework_version"])
            if not allow_unsupported_image:
                raise WorkshopError(
                    "backend=smddp needs SageMaker's data-parallel library (smdistributed.dataparallel), "
                    "which ships only in the PyTorch 2.5 training image and the SMP v2 image; both passed "
                    f"their end of patch on {old.end_of_patch}, and no supported image has it (the "
                    f"{defaults.framework} {defaults.framework_version} image this lab uses is built without it).",
                    "use backend=nccl (or auto, which picks NCCL on GPUs): it is what the supported images use "
                    "on p4d/p5, over EFA; or pass allow_unsupported_image=True (CLI: --allow-unsupported-image) "
                    "to run the unpatched PyTorch 2.5 image anyway.",
                )
            framework, version, py_version = SMDDP_IMAGE.values()
            container_version = None
            notes.append(
                f"backend=smddp: using the PyTorch {version} ({py_version}) image, the newest that "
                f"ships smddp, instead of the lab's {defaults.framework} {defaults.framework_version} "
                f"({defaults.py_version})."
            )
    elif backend == "nccl" and not gpus:
        raise WorkshopError(
            f"backend=nccl needs GPUs, and {instance_type} has none.",
            "use backend=auto or gloo on CPU instances, or a GPU instance type such as ml.g5.xlarge.",
        )

    lab.validate_hyperparameters(hyperparameters, world_size=world_size, train_samples=train_samples)
    custom_image = image_uri is not None
    if custom_image:
        if not isinstance(image_uri, str) or not re.fullmatch(r"[\w.-]+(:\d+)?/[\w./-]+(:[\w.-]+|@sha256:[0-9a-f]{64})", image_uri):
            raise WorkshopError(
                f"Not a container image URI: {image_uri!r}.",
                "pass e.g. image_uri='123456789012.dkr.ecr.us-east-1.amazonaws.com/workshop-horovod:0.28.1'.",
            )
        notes.append(f"image: {image_uri} (yours, instead of the {framework} {version} framework image)")
        excluded: tuple[str, ...] = ()
    else:
        notes.append(check_image_supported(framework, version, allow_unsupported_image=allow_unsupported_image))
        support = image_support(framework, version)
        excluded = support.no_gpu_families if support else ()
        if is_gpu_instance(instance_type) and _family(instance_type) in excluded:
            raise WorkshopError(
                f"The {support.label} cannot use the GPUs of {instance_type}: it is built with CUDA 13, which "
                f"dropped support for the GPUs of the {', '.join(excluded)} families (Volta and older).",
                "use a newer GPU instance type, e.g. ml.g5.xlarge (A10G), ml.g4dn.xlarge (T4) or ml.p4d.24xlarge (A100).",
            )
        image_uri = _retrieve_image(framework, version, py_version, region, instance_type, container_version)

    user = aws.user_prefix()
    base = aws.sanitize_name(base_job_name or f"{user}-{lab.key}", BASE_JOB_NAME_MAX)
    if not base:
        raise WorkshopError(f"Invalid base job name {base_job_name!r}.", "use letters, digits and '-'.")

    plan = JobPlan(
        lab=lab,
        region=region,
        hyperparameters=hyperparameters,
        instance_type=instance_type,
        instance_count=instance_count,
        procs_per_host=procs,
        world_size=world_size,
        image_uri=image_uri,
        max_run_s=max_run_s,
        base_job_name=base,
        tags=_tags(user, lab, tags),
        environment={"SM_CHECKPOINT_DIR": CHECKPOINT_DIR},
        metric_definitions=sagemaker_metric_definitions(lab.metrics),
        subnets=subnets,
        security_group_ids=security_group_ids,
        checkpoint_s3_uri=checkpoint_s3_uri,
        output_s3_uri=output_s3_uri,
        notes=tuple(notes),
        custom_image=custom_image,
        allowed_instance_types=allowed,
        excluded_instance_families=excluded,
    )
    check = LAUNCHER_CHECKS.get(defaults.launcher)  # the launcher's own offline checks
    return check(plan) if check else plan


def _describe_plan(plan: JobPlan) -> None:
    procs = f"{plan.procs_per_host} process(es) per host" if plan.procs_per_host else "one process per GPU"
    _say(
        f"lab {plan.lab.key}: {plan.instance_count} x {plan.instance_type}, {procs} "
        f"(world size {plan.world_size}), max run {plan.max_run_s} s, region {plan.region}"
    )
    _say(f"image {plan.image_uri}")
    for note in plan.notes:
        _say(note)


# --------------------------------------------------------------------------- the trainer


@contextlib.contextmanager
def _role_validation(enabled: bool | None) -> Iterator[None]:
    """Set SAGEMAKER_VALIDATE_ROLE while a ModelTrainer is constructed (None: leave it).

    The environment variable is the SDK's only switch for the IAM check it runs at
    construction (`iam_role_resolver.resolve_and_validate_role`); `TrainDefaults.get_role`
    passes no `validate_role` through. Restored afterwards, so nothing leaks.
    """
    if enabled is None:
        yield
        return
    saved = os.environ.get(_VALIDATE_ROLE_ENV)
    os.environ[_VALIDATE_ROLE_ENV] = "true" if enabled else "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(_VALIDATE_ROLE_ENV, None)
        else:
            os.environ[_VALIDATE_ROLE_ENV] = saved


def _build_from_plan(plan: JobPlan, role: str, session: Any, validate_role: bool | None) -> ModelTrainer:
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
    from sagemaker.core.helper.iam_role_resolver import RoleValidationError
    from sagemaker.core.training.configs import (
        CheckpointConfig,
        Compute,
        MetricDefinition,
        Networking,
        OutputDataConfig,
        SourceCode,
        StoppingCondition,
        Tag,
    )
    from sagemaker.train.model_trainer import ModelTrainer

    lab = plan.lab
    if not lab.entry_path.is_file():
        raise WorkshopError(f"Lab {lab.key!r} has no entry script {lab.entry_path}.", "check the lab's code/ folder.")
    networking = None
    if plan.subnets:
        networking = Networking(subnets=plan.subnets, security_group_ids=plan.security_group_ids)
    try:
        with _role_validation(validate_role):
            trainer = ModelTrainer(
                sagemaker_session=session,
                role=role,
                base_job_name=plan.base_job_name,
                training_image=plan.image_uri,
                source_code=SourceCode(
                    source_dir=str(lab.source_dir),
                    entry_script=lab.entry_script,
                    ignore_patterns=SOURCE_IGNORE_PATTERNS,
                ),
                distributed=LAUNCHERS[lab.sagemaker.launcher](plan),
                compute=Compute(
                    instance_type=plan.instance_type,
                    instance_count=plan.instance_count,
                    volume_size_in_gb=lab.sagemaker.volume_size_gb,
                ),
                networking=networking,
                stopping_condition=StoppingCondition(max_runtime_in_seconds=plan.max_run_s),
                checkpoint_config=CheckpointConfig(s3_uri=plan.checkpoint_s3_uri, local_path=CHECKPOINT_DIR),
                output_data_config=(
                    OutputDataConfig(s3_output_path=plan.output_s3_uri, compression_type="GZIP")
                    if plan.output_s3_uri
                    else None
                ),
                environment=dict(plan.environment),
                hyperparameters=dict(plan.hyperparameters),
                tags=[Tag(key=t["Key"], value=t["Value"]) for t in plan.tags],
            )
    except RoleValidationError as exc:
        raise WorkshopError(
            f"The role {role} cannot run SageMaker training jobs: {exc}",
            f"grant {role} the missing permissions listed above; or create (or update) the workshop's "
            "own least-privilege role, which has them, with `python -m workshop role` "
            "(workshop.infra.ensure_role()) and pass its ARN; or pass another role. "
            f"{_VALIDATE_ROLE_ENV}=false skips this check, and the job then fails inside SageMaker instead.",
        ) from None
    except NoCredentialsError:
        raise WorkshopError("No AWS credentials found.", aws.CREDENTIALS_FIX) from None
    except NotImplementedError as exc:  # moto in-process lacks iam:SimulatePrincipalPolicy
        raise WorkshopError(
            f"The SDK's IAM role check failed: {exc} (a fake AWS such as moto?).",
            f"pass validate_role=False, or set {_VALIDATE_ROLE_ENV}=false, when AWS is simulated.",
        ) from None
    except (BotoCoreError, ClientError) as exc:
        raise WorkshopError(f"SageMaker setup failed: {exc}", "check the region, credentials and S3 access.") from None
    except ValueError as exc:  # the SDK's own checks (pydantic's ValidationError is one)
        raise WorkshopError(f"SageMaker SDK rejected the job: {exc}") from None
    return trainer.with_metric_definitions(
        [MetricDefinition(name=m["Name"], regex=m["Regex"]) for m in plan.metric_definitions]
    )


def _resolve_region(region: str | None, sagemaker_session: Any) -> str:
    session_region = getattr(sagemaker_session, "boto_region_name", None) if sagemaker_session else None
    if region and session_region and region != session_region:
        raise WorkshopError(
            f"region={region!r} differs from the session's region {session_region!r}.",
            "pass one of them only.",
        )
    resolved = region or session_region or aws.boto_session().region_name
    if not resolved:
        raise WorkshopError(
            "No AWS region configured.",
            "pass region='us-east-1' (CLI: --region), or `export AWS_DEFAULT_REGION=us-east-1`.",
        )
    return resolved


def build_trainer(
    lab: Lab | str,
    *,
    hyperparameters: Mapping[str, Any] | None,
    role: str,
    instance_type: str | None = None,
    instance_count: int | None = None,
    procs_per_host: int | None = None,
    sagemaker_session: Any = None,
    region: str | None = None,
    subnets: Sequence[str] | None = None,
    security_group_ids: Sequence[str] | None = None,
    max_run_s: int | None = None,
    checkpoint_s3_uri: str | None = None,
    output_s3_uri: str | None = None,
    base_job_name: str | None = None,
    tags: Mapping[str, str] | Sequence[Any] | None = None,
    validate_role: bool | None = None,
    image_uri: str | None = None,
    allow_unsupported_image: bool = False,
) -> ModelTrainer:
    """The lab's SDK v3 `ModelTrainer`, checked by `plan_job` first.

    Image from `sagemaker.core.image_uris.retrieve` (CPU or GPU by instance type; the PyTorch
    2.5 image for smddp, only with `allow_unsupported_image`), the lab's `code/` as `SourceCode`, the lab's launcher as
    `distributed`, a `StoppingCondition` on every job, a `CheckpointConfig` with
    `SM_CHECKPOINT_DIR` pointing at it, `METRICS` regexes, and workshop/user/lab tags.
    `validate_role`: None leaves the SDK's IAM check (iam:SimulatePrincipalPolicy) as the
    environment says; without IAM access it only warns, but moto does not implement the call,
    so pass False (or set SAGEMAKER_VALIDATE_ROLE=false) against a fake AWS.
    Constructing it calls AWS: the SDK resolves the default bucket for the output path.
    """
    region = _resolve_region(region, sagemaker_session)
    plan = plan_job(
        lab,
        hyperparameters=hyperparameters,
        region=region,
        instance_type=instance_type,
        instance_count=instance_count,
        procs_per_host=procs_per_host,
        subnets=subnets,
        security_group_ids=security_group_ids,
        max_run_s=max_run_s,
        checkpoint_s3_uri=checkpoint_s3_uri,
        output_s3_uri=output_s3_uri,
        base_job_name=base_job_name,
        tags=tags,
        image_uri=image_uri,
        allow_unsupported_image=allow_unsupported_image,
    )
    _describe_plan(plan)
    session = sagemaker_session or aws.sagemaker_session(region=region)
    return _build_from_plan(plan, role, session, validate_role)


# --------------------------------------------------------------------------- dry run


class DryRunRequest(dict):
    """The CreateTrainingJob request, exactly as the SDK handed it to botocore (a plain dict).

    Also carries what the request only points at: `sm_drivers` (the text of `distributed.json`,
    `sourcecode.json` and `sm_train.sh` as uploaded to the `sm_drivers` channel) and
    `code_files` (the files of the `code` channel).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sm_drivers: dict[str, str] = {}
        self.code_files: list[str] = []

    def channel(self, name: str) -> str | None:
        """The S3 URI of input channel `name`, if the request has it."""
        for channel in self.get("InputDataConfig", []):
            if channel["ChannelName"] == name:
                return channel["DataSource"]["S3DataSource"]["S3Uri"]
        return None


class _Captured(Exception):
    """Raised from the botocore hook so the request is never sent, not even to moto."""


_DRIVER_FILES = ("distributed.json", "sourcecode.json", "sm_train.sh")


@contextlib.contextmanager
def _isolated_aws_env() -> Iterator[None]:
    """No trace of the user's AWS setup while the dry run's fake AWS runs.

    moto intercepts botocore in-process; on top, no profile, credential file, endpoint URL or
    instance-metadata lookup can reach a real account, and throwaway keys are set.
    """
    remove = [
        k
        for k in os.environ
        if k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                 "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")
        or k.startswith(("AWS_ENDPOINT_URL", "AWS_CONTAINER_"))
    ]
    overrides = {
        "AWS_ACCESS_KEY_ID": "dry-run",
        "AWS_SECRET_ACCESS_KEY": "dry-run",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true",
    }
    saved = {k: os.environ.get(k) for k in [*remove, *overrides]}
    for key in remove:
        os.environ.pop(key, None)
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def _input_data(inputs: Mapping[str, str]) -> list[Any]:
    from sagemaker.core.training.configs import InputData

    channels = []
    for name, uri in inputs.items():
        if name in RESERVED_CHANNELS:
            raise WorkshopError(
                f"Input channel name {name!r} is reserved by SDK v3 (code and drivers).",
                "rename the channel, e.g. 'train' or 'test'.",
            )
        _s3_uri(uri, f"inputs[{name!r}]")
        channels.append(InputData(channel_name=name, data_source=uri))
    return channels


def data_prefix(user: str | None = None, key_prefix: str | None = None) -> str:
    """S3 key prefix of the MNIST channels: one copy per user, shared by every lab, under the
    SDK's default key prefix when the SDK config sets one (`key_prefix`; None: read it from the
    config), next to the jobs' own files, where the workshop role may read it."""
    key_prefix = aws.sdk_key_prefix() if key_prefix is None else key_prefix
    return aws.s3_key(key_prefix, aws.WORKSHOP_NAME, user or aws.user_prefix(), "data/mnist")


def _data_uris(bucket: str) -> dict[str, str]:
    from workshop.data import CHANNELS

    return {channel: f"s3://{bucket}/{data_prefix()}/{channel}" for channel in CHANNELS}


def _dry_run_from_plan(plan: JobPlan, role: str, inputs: Mapping[str, str] | None) -> DryRunRequest:
    try:
        import boto3
        from moto import mock_aws
    except ImportError:
        raise WorkshopError(
            "A dry run needs moto (a fake AWS, in-process).", "pip install 'moto[server]' (see requirements.txt)."
        ) from None

    captured: dict[str, Any] = {}

    def capture(params: dict[str, Any], **_: Any) -> None:
        captured.update(copy.deepcopy(params))
        raise _Captured

    with _isolated_aws_env(), mock_aws():
        boto = boto3.Session(
            region_name=plan.region, aws_access_key_id="dry-run", aws_secret_access_key="dry-run"
        )
        # Registered before any client exists: clients copy the session's handlers.
        boto.events.register("before-parameter-build.sagemaker.CreateTrainingJob", capture)
        session = aws.sagemaker_session(boto)
        trainer = _build_from_plan(plan, role, session, validate_role=False)
        data = dict(inputs) if inputs is not None else _data_uris(session.default_bucket())
        channels = _input_data({**data, **dict(plan.extra_inputs)})  # plus the launcher's channels
        try:
            trainer.train(input_data_config=channels, wait=False, logs=False)
        except _Captured:
            pass
        if not captured:
            raise RuntimeError("The SageMaker SDK did not call CreateTrainingJob; cannot dry-run.")
        request = DryRunRequest(captured)
        s3 = boto.client("s3")
        drivers = request.channel("sm_drivers")
        if drivers:
            bucket, prefix = _split_s3(drivers)
            for name in _DRIVER_FILES:
                with contextlib.suppress(Exception):
                    body = s3.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read()
                    request.sm_drivers[name] = body.decode()
        code = request.channel("code")
        if code:
            bucket, prefix = _split_s3(code)
            listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
            request.code_files = sorted(o["Key"][len(prefix) + 1 :] for o in listing)
    return request


def _print_dry_run(plan: JobPlan, request: DryRunRequest, role_is_placeholder: bool) -> None:
    print(json.dumps(request, indent=2, sort_keys=False, default=str), flush=True)
    _say(
        f"source code: {request.channel('code')} <- {plan.lab.source_dir} "
        f"({', '.join(request.code_files) or 'no files'})"
    )
    _say(f"SDK drivers: {request.channel('sm_drivers')}")
    if "distributed.json" in request.sm_drivers:
        _say(f"  distributed.json (read by the {plan.lab.sagemaker.launcher} driver): {request.sm_drivers['distributed.json']}")
    placeholders = [f"account {PLACEHOLDER_ACCOUNT} and its bucket (yours: sagemaker-{plan.region}-<your account id>)"]
    if role_is_placeholder:
        placeholders.append(f"role {PLACEHOLDER_ROLE_ARN}")
    _say("placeholders: " + "; ".join(placeholders))
    _say("dry run: nothing was uploaded or created in AWS and nothing was spent.")


def dry_run(
    lab: Lab | str,
    *,
    hyperparameters: Mapping[str, Any] | None,
    role: str | None = None,
    instance_type: str | None = None,
    instance_count: int | None = None,
    procs_per_host: int | None = None,
    region: str | None = None,
    subnets: Sequence[str] | None = None,
    security_group_ids: Sequence[str] | None = None,
    max_run_s: int | None = None,
    checkpoint_s3_uri: str | None = None,
    output_s3_uri: str | None = None,
    base_job_name: str | None = None,
    tags: Mapping[str, str] | Sequence[Any] | None = None,
    inputs: Mapping[str, str] | None = None,
    show: bool = True,
    train_samples: int | None = None,
    network: bool | str = False,
    image_uri: str | None = None,
    allow_unsupported_image: bool = False,
) -> DryRunRequest:
    """The exact CreateTrainingJob request SDK v3 would send, with no credentials at all.

    Runs the SDK's real `ModelTrainer(...)` and `train()` against moto's in-process fake AWS
    and takes the request from botocore's `before-parameter-build` event, then stops it
    there. Same arguments as `build_trainer`, plus `inputs` (channel -> S3 URI; default: where
    `run_lab_on_sagemaker` would upload MNIST). Without a role, a placeholder ARN is used.
    `show` prints the request as JSON, with where the source code and drivers went.
    `train_samples` (the prepared training set's size) lets the script check each rank's share.
    `network` (True, "endpoints" or "nat"): show the job in the workshop network, with
    placeholder subnet and security group ids (`workshop.infra.ensure_network` makes real ones).
    Also prints the network, role and cost, and which preflight checks need an account.
    Like the real path, it refuses what CreateTrainingJob would reject (the role's form
    included) before anything is built.
    """
    from workshop import infra

    role_arn = _dry_run_role(role)
    egress = network_egress(network, subnets)
    if egress:
        subnets, security_group_ids = [DRY_RUN_SUBNET], [DRY_RUN_SECURITY_GROUP]
    region_note = ""
    if not region:
        with contextlib.suppress(WorkshopError):
            region = aws.boto_session().region_name
    if not region:
        region, region_note = DRY_RUN_REGION, " (no region configured: the dry run's default)"
    plan = plan_job(
        lab,
        hyperparameters=hyperparameters,
        region=region,
        instance_type=instance_type,
        instance_count=instance_count,
        procs_per_host=procs_per_host,
        subnets=subnets,
        security_group_ids=security_group_ids,
        max_run_s=max_run_s,
        checkpoint_s3_uri=checkpoint_s3_uri,
        output_s3_uri=output_s3_uri,
        base_job_name=base_job_name,
        tags=tags,
        train_samples=train_samples,
        image_uri=image_uri,
        allow_unsupported_image=allow_unsupported_image,
    )
    # The launcher's channels at the placeholder account's bucket; nothing is looked up.
    plan, _ = prepare_launcher(plan, f"sagemaker-{region}-{PLACEHOLDER_ACCOUNT}", None)
    plan = check_internet(plan, egress)
    if show:
        if region_note:
            _say(f"region {region}{region_note}")
        _describe_plan(plan)
    if show:
        for line in infra.dry_run_lines(plan, role_arn, egress):
            _say(line)
    request = _dry_run_from_plan(plan, role_arn, inputs)
    if show:
        _print_dry_run(plan, request, role_arn == PLACEHOLDER_ROLE_ARN)
    return request


# `run_lab_on_sagemaker` takes a `dry_run` flag, which shadows the function's name there.
_dry_run = dry_run


def network_egress(network: bool | str | None, subnets: Sequence[str] | None = None) -> str | None:
    """`network=` as `workshop.infra`'s egress choice: None (no workshop VPC), "endpoints", "nat"."""
    from workshop import infra

    if network in (None, False, "", "none"):
        return None
    egress = "endpoints" if network is True else network
    if egress not in infra.EGRESS_CHOICES:
        raise WorkshopError(f"network must be True, False, 'endpoints' or 'nat', got {network!r}.",
                            "pass network=True (interface endpoints) or network='nat'.")
    if subnets:
        raise WorkshopError("Pass either network=... (the workshop VPC) or subnets=..., not both.",
                            "drop one of them.")
    return egress


def _given_role(role: str | None) -> tuple[str, str]:
    """(role, where it came from): the argument, else `$WORKSHOP_ROLE_ARN`; ("", "") for neither."""
    if role is not None and str(role).strip():
        return str(role).strip(), "role"
    env = os.environ.get(aws.ROLE_ENV, "").strip()
    return (env, f"${aws.ROLE_ENV}") if env else ("", "")


def _dry_run_role(role: str | None) -> str:
    """The role a dry run shows: the given one (a bare name in the placeholder account),
    `$WORKSHOP_ROLE_ARN`, or the placeholder. Its form is checked as CreateTrainingJob would;
    nothing is looked up: no credentials here."""
    role, source = _given_role(role)
    if not role:
        return PLACEHOLDER_ROLE_ARN
    check_role(role, source)
    if role.startswith("arn:"):
        return role
    return f"arn:aws:iam::{PLACEHOLDER_ACCOUNT}:role/{role}"


# --------------------------------------------------------------------------- results and logs


def console_url(job_name: str, region: str) -> str:
    return f"https://{region}.console.aws.amazon.com/sagemaker/home?region={region}#/jobs/{job_name}"


def logs_url(job_name: str, region: str) -> str:
    return (
        f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logStream:"
        f"group={LOG_GROUP};prefix={job_name}/;streamFilter=typeLogStreamPrefix"
    )


@dataclass
class JobResult:
    """What a finished (or started) job left: status, metrics, where the model is."""

    job_name: str
    status: str
    final_metrics: dict[str, float]
    model_artifact: str | None
    console_url: str
    region: str
    failure_reason: str | None = None
    boto_session: Any = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "Completed"

    def metric(self, name: str) -> float | None:
        return self.final_metrics.get(name)

    def records(self) -> list[dict[str, Any]]:
        """The job's METRICS lines from CloudWatch, as `workshop.metrics` records."""
        return job_records(self.job_name, self.boto_session)

    def download_model(self, dest: str | os.PathLike[str]) -> Path:
        """Fetch `model.tar.gz` and extract it into `dest`; returns `dest`."""
        from botocore.exceptions import ClientError

        if not self.model_artifact:
            raise WorkshopError(
                f"Job {self.job_name} has no model artifact (status {self.status}).",
                "a model exists only after the job completes; check the status and the logs.",
            )
        dest_path = Path(dest).expanduser()
        s3 = aws.as_boto_session(self.boto_session).client("s3")
        bucket, key = _split_s3(self.model_artifact)
        try:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            raise WorkshopError(
                f"No model at {self.model_artifact} ({code or exc}); the job's status is {self.status}.",
                "SageMaker uploads model.tar.gz when the job completes, with whatever the script "
                "wrote to SM_MODEL_DIR (/opt/ml/model); check the job's logs.",
            ) from None
        dest_path.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
            _safe_extract(archive, dest_path)
        print(f"Model from {self.model_artifact} -> {dest_path}", flush=True)
        return dest_path


def _safe_extract(archive: tarfile.TarFile, dest: Path) -> None:
    """Extract refusing absolute paths, `..` and links out of `dest` (tarfile's "data" filter
    where this Python has it, 3.11.4+; the same check by hand before that)."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, filter="data")
        return
    root = dest.resolve()
    for member in archive.getmembers():
        target = (root / member.name).resolve()
        outside = root != target and root not in target.parents
        if outside or member.issym() or member.islnk():
            raise WorkshopError(f"Unsafe path in model.tar.gz: {member.name!r}.", "inspect the archive by hand.")
    archive.extractall(dest)


def _stream_host(stream_name: str) -> str:
    """`<job>/algo-1-1700000000` -> `algo-1`."""
    tail = stream_name.rsplit("/", 1)[-1]
    match = re.match(r"^(algo-\d+)", tail)
    return match.group(1) if match else tail


class _LogTail:
    """Reads each of a job's CloudWatch streams forward from where it last stopped."""

    def __init__(self, job_name: str, boto: Any):
        self.job_name = job_name
        self.client = boto.client("logs")
        self.tokens: dict[str, str | None] = {}

    def _streams(self) -> list[str]:
        from botocore.exceptions import ClientError

        names: list[str] = []
        kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": self.job_name + "/"}
        try:
            while True:
                page = self.client.describe_log_streams(**kwargs)
                names += [s["logStreamName"] for s in page.get("logStreams", [])]
                if not page.get("nextToken"):
                    break
                kwargs["nextToken"] = page["nextToken"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
        return sorted(names)

    def new_lines(self) -> Iterator[tuple[str, str]]:
        """(host, message) for every event logged since the last call."""
        for stream in self._streams():
            while True:
                kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": True}
                if self.tokens.get(stream):
                    kwargs["nextToken"] = self.tokens[stream]
                page = self.client.get_log_events(**kwargs)
                for event in page.get("events", []):
                    for line in event["message"].splitlines():
                        yield _stream_host(stream), line
                token = page.get("nextForwardToken")
                done = token == self.tokens.get(stream) or not page.get("events")
                self.tokens[stream] = token
                if done:
                    break


def job_records(job_name: str, session: Any = None) -> list[dict[str, Any]]:
    """The METRICS records of a SageMaker job, read from its CloudWatch log streams.

    Lines are prefixed `[algo-N] ` as the local cluster prefixes them, so
    `workshop.metrics.parse_lines` gives the same records (with `host` and `rank`) for a
    SageMaker job as for a local run, and the same plots follow.
    """
    tail = _LogTail(job_name, aws.as_boto_session(session))
    return parse_lines(f"[{host}] {line}" for host, line in tail.new_lines())


def _result(job_name: str, boto: Any) -> JobResult:
    description = boto.client("sagemaker").describe_training_job(TrainingJobName=job_name)
    region = boto.region_name
    return JobResult(
        job_name=job_name,
        status=description["TrainingJobStatus"],
        final_metrics={m["MetricName"]: m["Value"] for m in description.get("FinalMetricDataList", [])},
        model_artifact=description.get("ModelArtifacts", {}).get("S3ModelArtifacts"),
        console_url=console_url(job_name, region),
        region=region,
        failure_reason=description.get("FailureReason"),
        boto_session=boto,
    )


def _wait(job_name: str, boto: Any, logs: bool) -> None:
    """Poll the job until it ends, printing its log lines as `[algo-N] ...`.

    The workshop's own loop rather than the SDK's `TrainingJob.wait(logs=True)`, whose
    CloudWatch client ignores the session's region (`sagemaker/core/utils/logs.py:
    MultiLogStreamHandler` uses the default `CloudWatchLogsClient()`).
    """
    client = boto.client("sagemaker")
    tail = _LogTail(job_name, boto) if logs else None
    last = None
    try:
        while True:
            description = client.describe_training_job(TrainingJobName=job_name)
            status = description["TrainingJobStatus"]
            secondary = description.get("SecondaryStatus")
            if (status, secondary) != last:
                _say(f"{job_name}: {status}" + (f" ({secondary})" if secondary else ""))
                last = (status, secondary)
            if tail is not None:
                for host, line in tail.new_lines():
                    print(f"[{host}] {line}", flush=True)
            if status in TERMINAL_STATUSES:
                return
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        _say(
            f"stopped waiting; the job keeps running until it ends or max_run. Stop it with: "
            f"aws sagemaker stop-training-job --training-job-name {job_name} --region {boto.region_name}"
        )
        raise


def submit(trainer: ModelTrainer, inputs: Mapping[str, str], *, wait: bool = True, logs: bool = True) -> JobResult:
    """Start the job with `inputs` (channel -> S3 URI) and, if `wait`, follow it to the end.

    Returns a `JobResult` also for a failed job (its `status` and `failure_reason` say so);
    raises WorkshopError when SageMaker refuses to create the job.
    """
    from botocore.exceptions import ClientError

    channels = _input_data(inputs)
    boto = trainer.sagemaker_session.boto_session
    _say(f"creating the training job ({', '.join(f'{c}={u}' for c, u in inputs.items())})")
    try:
        trainer.train(input_data_config=channels, wait=False, logs=False)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        fix = {
            "ResourceLimitExceeded": "request a quota increase for this instance type (Service Quotas, "
            "'training job usage'), or use fewer or other instances.",
            "AccessDeniedException": "allow sagemaker:CreateTrainingJob and iam:PassRole on the role.",
            "ValidationException": "check the instance type, role and S3 URIs in the message.",
        }.get(code, "see the message; `dry_run` shows the request that was sent.")
        raise WorkshopError(f"SageMaker refused the job: {exc}", fix) from None
    job_name = trainer._latest_training_job.training_job_name  # documented in ModelTrainer's docstring
    _say(f"job {job_name} created")
    _say(f"console: {console_url(job_name, boto.region_name)}")
    _say(f"logs:    {logs_url(job_name, boto.region_name)}")
    if wait:
        _wait(job_name, boto, logs)
    result = _result(job_name, boto)
    if result.status == "Failed":
        _say(f"job {job_name} FAILED: {result.failure_reason}")
    elif wait:
        metrics = ", ".join(f"{k}={v:g}" for k, v in result.final_metrics.items()) or "none reported"
        _say(f"job {job_name} {result.status}; final metrics: {metrics}; model: {result.model_artifact}")
    return result


# --------------------------------------------------------------------------- the one call


def _prepared(data_dir: Any) -> bool:
    from workshop.data import CHANNELS, NPZ_NAME, MnistChannels

    if isinstance(data_dir, MnistChannels):
        return True
    root = Path(data_dir).expanduser()
    return all((root / channel / NPZ_NAME).is_file() for channel in CHANNELS)


def _train_samples(data_dir: Any) -> int | None:
    """How many training samples the prepared `train` channel holds (None if unknown)."""
    from workshop.data import NPZ_NAME, MnistChannels

    if isinstance(data_dir, MnistChannels):
        return data_dir.n_train
    try:
        import numpy as np

        with np.load(Path(data_dir).expanduser() / "train" / NPZ_NAME) as npz:
            return int(npz["labels"].shape[0])
    except (OSError, KeyError, ValueError):
        return None


def run_lab_on_sagemaker(
    lab: Lab | str,
    *,
    hosts: int | None,
    procs_per_host: int | None,
    hyperparameters: Mapping[str, Any] | None,
    data_dir: str | os.PathLike[str] | Any,
    instance_type: str | None = None,
    dry_run: bool = False,
    role: str | None = None,
    region: str | None = None,
    subnets: Sequence[str] | None = None,
    security_group_ids: Sequence[str] | None = None,
    max_run_s: int | None = None,
    wait: bool = True,
    network: bool | str = False,
    create_role: bool = False,
    image_uri: str | None = None,
    allow_unsupported_image: bool = False,
) -> JobResult | DryRunRequest:
    """Run a lab as a SageMaker training job (or, with `dry_run`, show the request only).

    Checks the job, then credentials and role, builds the trainer, uploads the MNIST channels
    from `data_dir` once, and submits; every step is printed. All user errors are raised
    before anything is uploaded or created. A dry run needs no credentials and no role.

    `network` (True/"endpoints" or "nat") runs the job in the workshop's own VPC
    (`workshop.infra.ensure_network`, created or reused; it costs per hour while it exists, so
    run `workshop.infra.cleanup()` when done); `create_role` creates or reuses the workshop's
    least-privilege execution role (`workshop.infra.ensure_role`) when no role is given.
    `image_uri`: your own training image instead of the lab's framework image.
    `allow_unsupported_image`: run a framework image past its end of patch anyway (smddp needs one).
    """
    from workshop import infra

    lab = get_lab(lab) if isinstance(lab, str) else lab
    egress = network_egress(network, subnets)
    if dry_run:
        _say("dry run: checking the job (no AWS account is used)")
        if not _prepared(data_dir):
            _say(f"(the MNIST channels in {data_dir} are not prepared yet; a real run prepares them)")
        return _dry_run(
            lab,
            train_samples=_train_samples(data_dir) if _prepared(data_dir) else None,
            hyperparameters=hyperparameters,
            role=role,
            instance_type=instance_type,
            instance_count=hosts,
            procs_per_host=procs_per_host,
            region=region,
            subnets=subnets,
            security_group_ids=security_group_ids,
            max_run_s=max_run_s,
            network=network,
            image_uri=image_uri,
            allow_unsupported_image=allow_unsupported_image,
        )

    _say("step 1/5: checking the job")
    boto = aws.boto_session(region)
    if not boto.region_name:
        raise WorkshopError(
            "No AWS region configured.",
            "pass region='us-east-1' (CLI: --region), or `export AWS_DEFAULT_REGION=us-east-1`.",
        )
    plan = plan_job(
        lab,
        hyperparameters=hyperparameters,
        region=boto.region_name,
        instance_type=instance_type,
        instance_count=hosts,
        procs_per_host=procs_per_host,
        subnets=subnets,
        security_group_ids=security_group_ids,
        max_run_s=max_run_s,
        image_uri=image_uri,
        allow_unsupported_image=allow_unsupported_image,
    )
    plan = check_internet(plan, egress)
    given_role, role_source = _given_role(role)
    if given_role:
        check_role(given_role, role_source)  # its form, before credentials are looked for
    _describe_plan(plan)
    _say("step 2/5: AWS credentials, the execution role, and the preflight checks")
    identity = aws.require_credentials(boto)
    _say(f"calling AWS as {identity} in {boto.region_name}")
    creating_role = create_role and not role and not os.environ.get(aws.ROLE_ENV)
    if creating_role:  # created in step 3, after the preflight; its ARN is known already
        partition, account = identity.split(":")[1], identity.split(":")[4]
        role_arn = f"arn:{partition}:iam::{account}:role/{infra.role_name()}"
    else:
        role_arn = infra.resolve_role(role, boto)
    _say(f"the job runs as {role_arn}")
    # The launcher's own look-ups (read-only, e.g. lab 2's Horovod wheel in S3), then the
    # internet check again with what they found; the bucket is named, not created, here.
    session = aws.sagemaker_session(boto)
    known = len(plan.notes)
    plan, prep_steps = prepare_launcher(plan, aws.sdk_bucket(session), boto)
    plan = check_internet(plan, egress)
    for note in plan.notes[known:]:
        _say(note)
    infra.preflight(plan, role_arn, boto, identity=identity, network_egress=egress, creating_role=creating_role)
    if not _prepared(data_dir):
        from workshop.data import prepare_mnist

        _say(f"preparing the MNIST channels in {data_dir}")
        data_dir = prepare_mnist(data_dir)
    # Now that the data is known, the script checks each rank's share of it.
    lab.validate_hyperparameters(
        plan.hyperparameters, world_size=plan.world_size, train_samples=_train_samples(data_dir)
    )

    _say("step 3/5: " + ("the workshop role, " if creating_role else "") + ("the workshop network, " if egress else "")
         + "building the ModelTrainer")
    if creating_role:
        created = infra.ensure_role(boto)
        _say(f"role {created.arn} " + ("created" if created.created else "reused"))
    if egress:
        net = infra.ensure_network(boto, egress=egress)
        for line in net.lines():
            _say(line)
        plan = dataclasses.replace(plan, **net.job_args())
    for step in prep_steps:  # e.g. lab 2's one-time Horovod build job
        _say(step.what)
        step.run(plan, role_arn, session)
    trainer = _build_from_plan(plan, role_arn, session, validate_role=None)

    _say("step 4/5: uploading the MNIST channels (unchanged files are skipped)")
    from workshop.data import upload_channels

    bucket = aws.default_bucket(session)
    inputs = dict(upload_channels(data_dir, bucket, data_prefix(key_prefix=aws.sdk_key_prefix(session)),
                                  boto_session=boto))
    inputs.update(plan.extra_inputs)  # the launcher's channels (lab 2: `horovod`, its wheels)

    _say("step 5/5: submitting")
    return submit(trainer, inputs, wait=wait, logs=wait)
from workshop import horovod as _horovod  # noqa: E402,F401  (registers its launcher)
from workshop import model_parallel as _model_parallel  # noqa: E402,F401  (registers its launcher)
from workshop import parameter_server as _parameter_server  # noqa: E402,F401  (registers its launcher)
