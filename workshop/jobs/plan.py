"""A job request, and the plan it becomes once every offline check has passed.

`JobRequest` is what the caller asks for (the lab and whatever it overrides); `plan_job` checks
it without AWS (hyperparameters through the lab script's own parser and against what
CreateTrainingJob and the container accept, instance type and count, `max_run`, smddp's
instance types, the image's support window, the VPC settings, the launcher's and the lab's own
checks) and settles the image, job name, tags and metric definitions in a `JobPlan`. Every user
error is raised here, before anything is looked up, uploaded or created.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workshop.cloud import aws
from workshop.cloud.network import EGRESS_CHOICES, network_hourly_usd
from workshop.cloud.role import role_name, s3_prefixes
from workshop.errors import WorkshopError
from workshop.jobs.checks import (
    MAX_RUNTIME_LIMIT_S,
    check_hyperparameters,
    check_instance_type,
    check_request_fields,
    family,
    given_role,
    gpus_per_instance,
    is_gpu_instance,
    kind,
    training_instance_types,
)
from workshop.jobs.common import CHECKPOINT_DIR, check_s3_uri, say, split_s3
from workshop.jobs.images import (
    SMDDP_IMAGE,
    SMDDP_INSTANCE_TYPES,
    check_image_supported,
    image_support,
    retrieve_image,
)
from workshop.metrics import sagemaker_metric_definitions
from workshop.spec import Lab, SageMakerDefaults, check_max_restarts

# The base job name leaves room for "-" and the SDK's 14-digit timestamp in 63 characters.
BASE_JOB_NAME_MAX = 63 - 15


class LauncherNotSupported(WorkshopError, NotImplementedError):
    """The lab's launcher cannot start a SageMaker job (it runs on the local cluster only)."""


@dataclass(frozen=True)
class JobRequest:
    """What the caller asks for: the lab, and every setting that may override its defaults.

    None means the lab's default (from the route's `SageMakerDefaults`). `plan_job` checks it;
    `build_trainer`, `dry_run` and `workshop.runner.run_on_sagemaker` take one (or a lab and
    these fields as keywords: `JobRequest.of`). `network` (True/"endpoints" or "nat") runs the
    job in the workshop VPC; `role` is an ARN or role name (else `$WORKSHOP_ROLE_ARN`, the
    notebook's role, or the workshop's own role).
    """

    lab: Lab
    hyperparameters: Mapping[str, Any] | None = None
    route: str | None = None  # lab 4: "fsdp" (default) or "smp"
    instance_type: str | None = None
    instance_count: int | None = None
    procs_per_host: int | None = None
    max_run_s: int | None = None
    region: str | None = None
    role: str | None = None
    network: bool | str = False
    subnets: Sequence[str] | None = None
    security_group_ids: Sequence[str] | None = None
    checkpoint_s3_uri: str | None = None
    output_s3_uri: str | None = None
    base_job_name: str | None = None
    tags: Mapping[str, str] | Sequence[Any] | None = None
    image_uri: str | None = None  # your own training image instead of the lab's framework image
    allow_unsupported_image: bool = False  # run a framework image past its end of patch anyway
    max_restarts: int = 0  # restarts of every rank after a failure (torchrun labs), 0: none
    spot: bool = False  # managed spot training: cheaper instances SageMaker may reclaim and restart
    max_wait_s: int | None = None  # spot: the job's whole time, waiting included (default 2 x max_run_s)

    @classmethod
    def of(cls, request: JobRequest | Lab, **fields: Any) -> JobRequest:
        """`request` with `fields` replaced, or a new request for the lab `request`."""
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"unknown job setting(s): {', '.join(unknown)}")
        if isinstance(request, JobRequest):
            return dataclasses.replace(request, **fields) if fields else request
        if not isinstance(request, Lab):
            raise WorkshopError(f"Not a lab or a job request: {request!r}.",
                                "pass workshop.labs.get_lab('<name>') (the jobs layer takes Lab objects).")
        return cls(lab=request, **fields)


@dataclass(frozen=True)
class PrepStep:
    """Work a launcher needs done in AWS before its job starts (e.g. lab 2's one-time Horovod
    build job). Run by `workshop.runner.run_on_sagemaker` after every check passed, with the final plan
    (network included), the role ARN and the SageMaker session."""

    what: str  # one line, printed before it runs (what it creates, what it costs)
    run: Callable[[JobPlan, str, Any], Any]  # its result is not used
    cost: str = ""  # what it can cost at most, one phrase ("at most $0.41 for ..."), confirmed with the job's


@dataclass(frozen=True)
class JobPlan:
    """Everything about a job that is decided before AWS is touched."""

    lab: Lab
    sagemaker: SageMakerDefaults  # the route's defaults the plan was made from
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
    max_restarts: int = 0  # restarts of every rank after a failure (the launcher's elastic agent)
    spot: bool = False  # managed spot training
    max_wait_s: int | None = None  # spot only: MaxWaitTimeInSeconds

    def allows(self, instance_type: str) -> bool:
        """Whether this job, as planned, could run on `instance_type` instead: a training type the
        route and the image support, of the planned type's kind (GPU, Trainium/Inferentia or plain
        CPU: the image and the build differ), with a GPU per process."""
        if instance_type not in training_instance_types():
            return False
        if self.allowed_instance_types and instance_type not in self.allowed_instance_types:
            return False
        if kind(instance_type) != kind(self.instance_type):
            return False
        gpu = is_gpu_instance(instance_type)
        if gpu and family(instance_type) in self.excluded_instance_families:
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


def plan_job(
    request: JobRequest | Lab, *, region: str | None = None, train_samples: int | None = None, **fields: Any
) -> JobPlan:
    """Check a job request and settle its details, offline. Every user error is raised here.

    `request` is a `JobRequest`, or a lab with the request's fields as keywords. `region` (else
    the request's) picks the image. `train_samples` (when the data is known) lets the script's
    `check_args` check the per-rank share of the data too. `image_uri` replaces the lab's
    SageMaker framework image (e.g. lab 2's image with Horovod built in, from
    2_horovod/docker/Dockerfile). Besides the script's own checks, it refuses what
    CreateTrainingJob would reject (an instance type it does not list, hyperparameters over its
    limits) or the container could not receive (`check_hyperparameters`), and an image past its
    end of patch (`IMAGE_SUPPORT`) unless `allow_unsupported_image`; then the launcher's checks
    and the lab's own (`Lab.sagemaker_check`) run on the plan.
    """
    request = JobRequest.of(request, **fields)
    lab = request.lab
    region = region or request.region
    if not region:
        raise WorkshopError(
            "No AWS region configured.",
            "pass region='us-east-1' (CLI: --region), or `export AWS_DEFAULT_REGION=us-east-1`.",
        )
    defaults = lab.sagemaker_route(request.route)
    if not getattr(lab.launcher, "on_sagemaker", True):
        raise LauncherNotSupported(
            f"Lab {lab.key!r} launches with {lab.launcher.name!r}, which runs on the local cluster only.",
            "run this lab with mode = 'local'.",
        )
    hyperparameters = request.hyperparameters
    instance_type, instance_count, procs_per_host = request.instance_type, request.instance_count, request.procs_per_host
    subnets, security_group_ids, max_run_s = request.subnets, request.security_group_ids, request.max_run_s
    image_uri, allow_unsupported_image = request.image_uri, request.allow_unsupported_image
    # The route's own script flags first (lab 4's deepspeed route: a ZeRO sharding), under the caller's.
    hyperparameters = {**defaults.hyperparameters, **dict(hyperparameters or {})}
    check_hyperparameters(hyperparameters)
    notes: list[str] = []

    instance_type = defaults.instance_type if instance_type is None else instance_type
    if not isinstance(instance_type, str) or not re.fullmatch(r"ml\.[a-z0-9-]+\.[a-z0-9]+", instance_type):
        raise WorkshopError(
            f"Not a SageMaker training instance type: {instance_type!r}.",
            "use the ml. form, e.g. instance_type='ml.g5.xlarge' (or 'ml.m5.xlarge' for CPU).",
        )
    check_instance_type(instance_type)
    allowed = tuple(getattr(defaults, "instance_types", ()) or ())
    if allowed and instance_type not in allowed:
        raise WorkshopError(
            f"Lab {lab.key!r}'s {defaults.route!r} route runs on SageMaker only on {', '.join(allowed)}"
            + (f" ({defaults.description})" if defaults.description else "") + f", not {instance_type}.",
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
    max_restarts = check_max_restarts(lab, request.max_restarts)

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
    checkpoint_s3_uri = check_s3_uri(request.checkpoint_s3_uri, "checkpoint_s3_uri")
    output_s3_uri = check_s3_uri(request.output_s3_uri, "output_s3_uri")
    spot, max_wait_s = bool(request.spot), request.max_wait_s
    if max_wait_s is not None and not spot:
        raise WorkshopError("max_wait_s applies to spot jobs only.", "pass spot=True (CLI: --spot), or drop max_wait_s.")
    if spot:
        max_wait_s = 2 * max_run_s if max_wait_s is None else max_wait_s
        if isinstance(max_wait_s, bool) or not isinstance(max_wait_s, int) or not max_run_s <= max_wait_s <= MAX_RUNTIME_LIMIT_S:
            raise WorkshopError(
                f"max_wait_s ({max_wait_s!r}) must be at least max_run_s ({max_run_s} s), and at most "
                f"{MAX_RUNTIME_LIMIT_S} s: it bounds the whole job, training plus waiting for spot capacity.",
                f"pass max_wait_s={2 * max_run_s} (CLI: --max-wait {2 * max_run_s}), or a shorter max_run_s.",
            )
        notes.append(f"spot: managed spot training, up to {max_wait_s} s in all (training and waiting for capacity); "
                     "SageMaker restarts the job after an interruption and it resumes from its checkpoint in S3 "
                     + (f"({checkpoint_s3_uri})" if checkpoint_s3_uri else "(the SDK's default, <output>/<job>/checkpoints)"))
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

    parsed = lab.validate_hyperparameters(hyperparameters, world_size=world_size, train_samples=train_samples)
    flag = lab.checkpoint_flag
    if spot and flag and not getattr(parsed, flag.replace("-", "_"), 1):
        raise WorkshopError(
            f"A spot job of lab {lab.key!r} with {flag} 0 writes no checkpoint, so each interruption would "
            "start it over from the first step: spot needs checkpoints to resume from.",
            f"pass hyperparameters={{'{flag}': 50}} (CLI: --hp {flag}=50), or drop spot.",
        )
    custom_image = image_uri is not None
    if custom_image:
        if not isinstance(image_uri, str) or not re.fullmatch(r"[\w.-]+(:\d+)?/[\w./-]+(:[\w.-]+|@sha256:[0-9a-f]{64})", image_uri):
            raise WorkshopError(
                f"Not a container image URI: {image_uri!r}.",
                "pass e.g. image_uri='123456789012.dkr.ecr.us-east-1.amazonaws.com/workshop-horovod:0.28.1'.",
            )
        notes.append(f"image: {image_uri} (yours, instead of the {framework} {version} framework image)")
        if defaults.requirements:
            notes.append(f"the {defaults.route!r} route's {lab.code_folder}/{defaults.requirements} is not installed "
                         "at the job's start: your image must have those packages")
        excluded: tuple[str, ...] = ()
    else:
        notes.append(check_image_supported(framework, version, allow_unsupported_image=allow_unsupported_image,
                                           fix=defaults.unsupported_image_fix))
        if defaults.requirements:
            listed = lab.source_dir / defaults.requirements
            if not listed.is_file():
                raise WorkshopError(f"Lab {lab.key!r}'s {defaults.route!r} route installs {listed}, which is not there.",
                                    f"add it to {lab.code_folder}/, or correct the route's requirements= in its lab.py.")
            pins = [line.strip() for line in listed.read_text().splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
            notes.append(f"the {defaults.route!r} route's job installs {lab.code_folder}/{defaults.requirements} "
                         f"({', '.join(pins)}) from PyPI when it starts, before its driver: it needs the internet")
        support = image_support(framework, version)
        excluded = support.no_gpu_families if support else ()
        if is_gpu_instance(instance_type) and family(instance_type) in excluded:
            raise WorkshopError(
                f"The {support.label} cannot use the GPUs of {instance_type}: it is built with CUDA 13, which "
                f"dropped support for the GPUs of the {', '.join(excluded)} families (Volta and older).",
                "use a newer GPU instance type, e.g. ml.g5.xlarge (A10G), ml.g4dn.xlarge (T4) or ml.p4d.24xlarge (A100).",
            )
        image_uri = retrieve_image(framework, version, py_version, region, instance_type, container_version)

    user = aws.user_prefix()
    base = aws.sanitize_name(request.base_job_name or f"{user}-{lab.key}", BASE_JOB_NAME_MAX)
    if not base:
        raise WorkshopError(f"Invalid base job name {request.base_job_name!r}.", "use letters, digits and '-'.")

    plan = JobPlan(
        lab=lab,
        sagemaker=defaults,
        region=region,
        hyperparameters=hyperparameters,
        instance_type=instance_type,
        instance_count=instance_count,
        procs_per_host=procs,
        world_size=world_size,
        image_uri=image_uri,
        max_run_s=max_run_s,
        base_job_name=base,
        tags=_tags(user, lab, request.tags),
        environment={**lab.environment, "SM_CHECKPOINT_DIR": CHECKPOINT_DIR},
        metric_definitions=sagemaker_metric_definitions(lab.metrics),
        subnets=subnets,
        security_group_ids=security_group_ids,
        checkpoint_s3_uri=checkpoint_s3_uri,
        output_s3_uri=output_s3_uri,
        notes=tuple(notes),
        custom_image=custom_image,
        allowed_instance_types=allowed,
        excluded_instance_families=excluded,
        max_restarts=max_restarts,
        spot=spot,
        max_wait_s=max_wait_s,
    )
    plan = lab.launcher.check(plan)  # the launcher's own offline checks
    plan = lab.sagemaker_check(plan) if lab.sagemaker_check else plan
    # What the plan puts into the request as it is, against the service model (and AWS's tag rules).
    check_request_fields({
        "Tags": plan.tags, "Environment": plan.environment,
        "AlgorithmSpecification.MetricDefinitions": plan.metric_definitions,
        "CheckpointConfig.S3Uri": plan.checkpoint_s3_uri, "OutputDataConfig.S3OutputPath": plan.output_s3_uri,
    })
    return check_s3_scope(plan, request.role)


def _configured_bucket() -> str | None:
    """The bucket the user's SDK config names for the SDK's files (DefaultS3Bucket), read offline."""
    from sagemaker.core.common_utils import get_config_value

    return get_config_value(aws.SDK_BUCKET_KEY, aws.sdk_config()) or None


def check_s3_scope(plan: JobPlan, role: str | None, bucket: str | None = None,
                   key_prefix: str | None = None) -> JobPlan:
    """Refuse S3 locations the job's role could not use, where that role is the workshop's own.

    The workshop's execution role (`workshop.cloud.role.role_policy`, and an event's stack role,
    which has the same name and policy) may read and write only under the user's S3 prefixes in
    the SDK's bucket: the data (`<workshop>/<user>/`) and each lab's jobs (`<user>-<lab>/`, after the
    SDK's key prefix). A `checkpoint_s3_uri` or `output_s3_uri` elsewhere, or a `base_job_name`
    other than the lab's (the SDK stages the job's code and drivers under it), would fail inside
    the running job with AccessDenied; they are refused here, with the place that works.

    It applies when the job runs as that role: `role` (else `$WORKSHOP_ROLE_ARN`) names it, or no
    role is given off SageMaker (the workshop then finds its role by name). A role of the user's
    own is not checked (a note says so); on SageMaker with no role given the role is not known yet
    (the notebook's, or an event's stack role): `workshop.runner.run_on_sagemaker` checks again
    once it is. `bucket`: the bucket the SDK will use, once known; else the SDK config's, or any
    `sagemaker-<region>-<account>`. `key_prefix`: the SDK's key prefix (default: its config's).
    """
    given, _ = given_role(role)
    what = [(name, uri) for name, uri in (("checkpoint_s3_uri", plan.checkpoint_s3_uri),
                                          ("output_s3_uri", plan.output_s3_uri)) if uri]
    lab_base = aws.sanitize_name(f"{aws.user_prefix()}-{plan.lab.key}", BASE_JOB_NAME_MAX)
    custom_base = plan.base_job_name != lab_base
    if not what and not custom_base:
        return plan
    names = ", ".join([n for n, _ in what] + ["base_job_name"] * custom_base)
    workshop_role = role_name()
    if given:
        if given.rsplit("/", 1)[-1] != workshop_role:
            note = f"{names}: not checked against the S3 access of {given}, a role of your own (not {workshop_role})"
            return plan if note in plan.notes else dataclasses.replace(plan, notes=(*plan.notes, note))
    elif aws.on_sagemaker() and bucket is None:
        note = f"{names}: checked against the role's S3 access once the role is known (before anything is created)"
        return plan if note in plan.notes else dataclasses.replace(plan, notes=(*plan.notes, note))
    key_prefix = aws.sdk_key_prefix() if key_prefix is None else key_prefix
    bucket = bucket or _configured_bucket()
    prefixes = s3_prefixes([plan.lab.key], key_prefix=key_prefix)
    shown_bucket = bucket or f"sagemaker-{plan.region}-<your account>"
    places = " and ".join(f"s3://{shown_bucket}/{p}" for p in prefixes)
    why = (f"the workshop's execution role {workshop_role} may read and write only under {places} (for lab "
           f"{plan.lab.key!r})")
    other_role = "; or run as a role of your own that may use it (role='arn:aws:iam::<account>:role/<name>')"
    for name, uri in what:
        uri_bucket, key = split_s3(uri)
        bucket_ok = uri_bucket == bucket if bucket else re.fullmatch(rf"sagemaker-{re.escape(plan.region)}-\d{{12}}",
                                                                      uri_bucket)
        if bucket_ok and any(key.startswith(p) for p in prefixes):
            continue
        suggested = f"s3://{shown_bucket}/{prefixes[-1]}{'checkpoints' if name.startswith('checkpoint') else 'output'}"
        raise WorkshopError(
            f"{name}={uri!r} is outside what the job's role may use: {why}, so the job would fail with "
            "AccessDenied once it started (" + ("syncing its checkpoints" if name.startswith("checkpoint")
                                                   else "uploading its model") + ").",
            f"pass {name}={suggested!r}, or leave it out (the SDK's default is under the job's own prefix, "
            f"s3://{shown_bucket}/{prefixes[-1]}){other_role}.",
        )
    if custom_base:
        staged = aws.s3_key(key_prefix, plan.base_job_name) + "/"
        if not any(staged.startswith(p) for p in prefixes):
            raise WorkshopError(
                f"base_job_name={plan.base_job_name!r}: the SDK stages the job's code and drivers under "
                f"s3://{shown_bucket}/{staged}, outside what the job's role may use: {why}, so the job could not "
                "read its own code (AccessDenied).",
                f"leave base_job_name out (the workshop names the job {lab_base}-<timestamp>)"
                f"{other_role}.",
            )
    return plan


def describe_plan(plan: JobPlan) -> None:
    procs = f"{plan.procs_per_host} process(es) per host" if plan.procs_per_host else "one process per GPU"
    say(
        f"{plan.lab.job_label}: {plan.instance_count} x {plan.instance_type}, {procs} "
        f"(world size {plan.world_size}), max run {plan.max_run_s} s, region {plan.region}"
    )
    if plan.max_restarts:
        say(f"restarts: up to {plan.max_restarts} restart(s) of every rank after a failure (torchrun's elastic "
            "agent); the script resumes from its latest checkpoint")
    say(f"image {plan.image_uri}")
    for note in plan.notes:
        say(note)


def prepare_launcher(plan: JobPlan, bucket: str, boto: Any) -> tuple[JobPlan, list[PrepStep]]:
    """The launcher's `prepare` step (see `workshop.spec.Launcher.prepare`): the plan with the
    launcher's channels and internet needs, and the set-up steps it needs run first."""
    plan, steps = plan.lab.launcher.prepare(plan, bucket, boto)
    return plan, list(steps)


def route_requirements(plan: JobPlan) -> str | None:
    """The requirements file (in the lab's code/ folder) the job installs at its start: its route's
    (`SageMakerDefaults.requirements`), unless the job runs your own image, which must have them."""
    return None if plan.custom_image else plan.sagemaker.requirements


def internet_needs(plan: JobPlan) -> list[tuple[str, str]]:
    """(why, fix) for everything the job must fetch from the internet at run time: the
    launcher's needs, the route's requirements (`route_requirements`), and a `requirements.txt`
    in the code folder, which `sm_train.sh` installs from PyPI before the driver starts."""
    needs = list(plan.internet_needs)
    installs = route_requirements(plan)
    if installs:
        needs.append((
            f"the {plan.sagemaker.route!r} route's job installs {plan.lab.code_folder}/{installs} from PyPI when it starts",
            "pass an image that has those packages as image_uri (the job then installs nothing)",
        ))
    requirements = plan.lab.source_dir / "requirements.txt"
    if requirements.is_file() and installs != "requirements.txt":  # (that one is said above)
        needs.append((
            f"sm_train.sh installs {plan.lab.code_folder}/requirements.txt from PyPI when the job starts",
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
        raise WorkshopError(
            f"This job needs the internet ({why}), and the workshop network with interface endpoints "
            "(network=True or 'endpoints') has no route to it: the job would fail after its instances started.",
            f"run it with network='nat' (CLI: --network nat; a NAT gateway, about ${network_hourly_usd('nat'):.3f}/h "
            "while the network exists) or without the workshop network (network=False, CLI: --network none); or "
            + "; or ".join(f for _, f in needs) + ".",
        )
    if plan.subnets and egress is None:
        note = (f"this job needs the internet ({why}); in your subnets it has it only through a NAT gateway "
                "or similar route, which cannot be checked from here: without one the job fails at its start")
        if note not in plan.notes:
            plan = dataclasses.replace(plan, notes=(*plan.notes, note))
    return plan


def network_egress(network: bool | str | None, subnets: Sequence[str] | None = None) -> str | None:
    """`network=` as `workshop.cloud.network`'s egress choice: None (no workshop VPC), "endpoints", "nat"."""
    if network in (None, False, "", "none"):
        return None
    egress = "endpoints" if network is True else network
    if egress not in EGRESS_CHOICES:
        raise WorkshopError(f"network must be True, False, 'endpoints' or 'nat', got {network!r}.",
                            "pass network=True (interface endpoints) or network='nat'.")
    if subnets:
        raise WorkshopError("Pass either network=... (the workshop VPC) or subnets=..., not both.",
                            "drop one of them.")
    return egress
