"""The Horovod launcher (lab 2): a `DistributedConfig` for Horovod jobs, the launcher, and its wheel store.

    from workshop.launchers.horovod import Horovod
    ModelTrainer(..., distributed=Horovod(framework="pytorch", install="wheel"))   # + channel `horovod`
    LocalCluster(..., distributed=Horovod(framework="pytorch"))                    # same driver

SDK v3's `MPI()` starts the wrong number of ranks on more than one host (it passes the
per-host count as `mpirun -np`), and no current SageMaker image ships Horovod. The workshop's
driver (`workshop/drivers/horovod/hvd_driver.py`) starts exactly hosts x processes-per-host
ranks with Horovod's own rendezvous and rank plan (what `horovodrun --gloo` does, without
ssh), once every host has reported ready.

Horovod is built once per training image and Horovod version, not on every host of every
job: `run_on_sagemaker` looks for the wheel in the user's S3 prefix
(`<workshop>/<user>/horovod/<version>-r<patch revision>/<image repository>/<image tag>/`, see
`wheel_prefix`); when it is missing, a one-host *build job* on the same image
(`hvd_build.py`, the set-up's patched `build_horovod.sh`) builds it with the wheels of the
dependencies the image lacks, and `build_wheel` stores them there. Every job then gets them
as input channel `horovod` and its driver installs them with `pip install --no-index`, so
only the build job needs PyPI. An image with Horovod built in (`image_uri=`, from
2_horovod/docker/Dockerfile) skips all of it. The wheel is CPU-only (Gloo): GPU instance types
are refused unless the image is yours.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import re
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import field_validator
from sagemaker.train.distributed import DistributedConfig

from workshop.cloud import aws
from workshop.cloud.prices import INSTANCE_PRICES
from workshop.errors import WorkshopError
from workshop.jobs import SOURCE_IGNORE_PATTERNS, JobPlan, PrepStep, is_gpu_instance, submit
from workshop.launchers.base import LauncherBase
from workshop.spec import Lab, load_module

DRIVER_DIR = Path(__file__).resolve().parent.parent / "drivers" / "horovod"
DRIVER_SCRIPT = "hvd_driver.py"
HOROVOD_VERSION = "0.28.1"
REBUILD = "`make horovod` (builds Horovod 0.28.1 with the workshop's patches; ~5 min the first time, ~1 min from the cached wheel)"
# Measured on this workshop's 2-core machines: 218-528 s for both frameworks. One framework
# on a 4-8 vCPU training instance is quicker; the estimate below is what the notebook states.
BUILD_MINUTES_ESTIMATE = (4, 8)
# build_horovod.sh's PATCH_REV (= scripts/build_horovod.sh's): part of the wheel's S3 key, so
# a changed patch set builds anew. A test keeps the three equal.
BUILD_REV = 3
BUILD_SCRIPT = "hvd_build.py"  # the build job's entry script, in DRIVER_DIR
BUILD_RECORD = "horovod-build.json"  # what hvd_build.py leaves next to the wheels
BUILD_MAX_RUN_S = 3600  # the build job's max_run: SageMaker stops (and stops billing) it then
WHEEL_CHANNEL = "horovod"  # the input channel of wheels (SM_CHANNEL_HOROVOD in the driver)
MANIFEST = "manifest.json"  # written last under the wheel prefix: the wheels are complete
PURPOSE_TAG = "workshop-purpose"
GPU_FIX = (
    "use a CPU instance type (e.g. instance_type='ml.c5.2xlarge': the workshop's wheel uses Gloo), or an "
    "image whose Horovod is built with NCCL (2_horovod/docker/Dockerfile on a GPU base image with "
    "--build-arg HOROVOD_GPU=--gpu, pushed to ECR) passed as image_uri"
)


class Horovod(DistributedConfig):
    """Horovod ranks on every host, Gloo controller, Horovod's rendezvous on algo-1.

    framework: "pytorch" or "tensorflow": which of Horovod's extensions the script needs.
    install: "none" (the image has Horovod) or "wheel" (install it from the job's `horovod`
        input channel, the wheel built once for the image; no index, no PyPI).
    process_count_per_node: ranks per host; None: one per GPU, one on CPU instances.
    gloo_timeout_s: how long a rank waits for a peer before failing (a dead peer ends the job);
        it starts only once every host is ready.
    rendezvous_wait_s: how long each host waits, from its driver's start, for every other host to
        report ready (instances start and finish their set-up minutes apart).
    """

    framework: Literal["pytorch", "tensorflow"] = "pytorch"
    install: Literal["none", "wheel"] = "none"
    process_count_per_node: int | None = None
    gloo_timeout_s: int = 60
    rendezvous_wait_s: int = 1800
    grace_s: int = 60

    @field_validator("install", mode="before")
    @classmethod
    def _no_build_per_host(cls, value: Any) -> Any:
        if value == "build":
            raise ValueError(
                "install='build' is gone: it built Horovod on every host of every job (minutes each, "
                "hosts finishing apart, PyPI needed). Use install='wheel' with the `horovod` channel "
                "(run_on_sagemaker builds the wheel once per image and adds it), or an image with "
                "Horovod and install='none'"
            )
        return value

    @property
    def driver_dir(self) -> str:
        return str(DRIVER_DIR)

    @property
    def driver_script(self) -> str:
        return DRIVER_SCRIPT


def load_driver() -> ModuleType:
    """The driver as a module (its `rank_plan`, `rank_env`), for tests and notebooks."""
    return load_module(DRIVER_DIR / DRIVER_SCRIPT, "hvd_driver")


_EXTENSION_DIR = {"pytorch": ("torch", "torch", "mpi_lib_v2"), "tensorflow": ("tensorflow", "tensorflow", "mpi_lib")}


def _distribution_version(package: str) -> str:
    """The installed version of `package` or of its CPU-only distribution: requirements.txt installs
    `tensorflow-cpu`, which provides the same `tensorflow` module."""
    for name in (package, f"{package}-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    raise importlib.metadata.PackageNotFoundError(package)


def check_installed(framework: str) -> None:
    """Fail with the fix unless this environment's Horovod was built for `framework` as installed.

    Reads metadata only (no framework import): Horovod records the framework versions it was
    built against in `horovod/metadata.json`, and each framework's extension is a shared library.
    """
    if framework not in _EXTENSION_DIR:
        raise WorkshopError(f"Unknown Horovod framework {framework!r}.", "use 'pytorch' or 'tensorflow'.")
    try:
        version = importlib.metadata.version("horovod")
    except importlib.metadata.PackageNotFoundError:
        raise WorkshopError(
            "Horovod is not installed in this environment (it is not on PyPI as a wheel, and no "
            "framework wheel includes it).",
            f"run {REBUILD}.",
        ) from None
    spec = importlib.util.find_spec("horovod")
    root = Path(spec.origin).parent if spec and spec.origin else None
    subdir, package, library = _EXTENSION_DIR[framework]
    if root is None or not any((root / subdir).glob(f"{library}*.so")):
        raise WorkshopError(
            f"Horovod {version} here was built without {framework} support (no "
            f"horovod/{subdir}/{library}*.so).",
            f"rebuild it with {framework}: {REBUILD} (set HOROVOD_WITH_{framework.upper()}=1 if you build it yourself).",
        )
    try:
        built_for = json.loads((root / "metadata.json").read_text()).get(framework)
        installed = _distribution_version(package)
    except (OSError, ValueError, importlib.metadata.PackageNotFoundError):
        return
    if built_for and built_for.split("+")[0] != installed.split("+")[0]:
        raise WorkshopError(
            f"Horovod {version} was built against {package} {built_for}, but {package} {installed} is "
            "installed: its extension would fail to load or crash.",
            f"rebuild it: {REBUILD}.",
        )


# --------------------------------------------------------------------------- the wheel store


def image_key(image_uri: str) -> str:
    """`<account>.dkr.ecr.<region>.amazonaws.com/pytorch-training:2.9-cpu-py312` ->
    `pytorch-training/2.9-cpu-py312`: the repository and tag carry framework, version, cpu/gpu
    and Python; the registry (one per region) does not change what is inside."""
    match = re.fullmatch(r"[^/]+/(?P<repo>[^:@]+)(?::(?P<tag>[^@/]+))?(?:@sha256:(?P<digest>[0-9a-f]{64}))?", image_uri)
    if not match:
        raise WorkshopError(f"Not a container image URI: {image_uri!r}.", "pass e.g. '<registry>/<repository>:<tag>'.")
    tag = match["tag"] or "latest"
    if match["digest"]:
        tag += f"-sha256-{match['digest'][:16]}"
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', match['repo'])}/{re.sub(r'[^A-Za-z0-9._-]+', '-', tag)}"


def wheel_prefix(image_uri: str, user: str | None = None, key_prefix: str | None = None) -> str:
    """The S3 key prefix of the Horovod wheels built for `image_uri`, in the user's own prefix
    (`<workshop>/<user>/`, which the workshop role may read and the user may write), after the
    SDK's default key prefix if its config sets one (`key_prefix`; None: read from the config)."""
    key_prefix = aws.sdk_key_prefix() if key_prefix is None else key_prefix
    return aws.s3_key(key_prefix, aws.WORKSHOP_NAME, user or aws.user_prefix(), "horovod",
                      f"{HOROVOD_VERSION}-r{BUILD_REV}", image_key(image_uri))


def wheel_channel_uri(bucket: str, image_uri: str, user: str | None = None) -> str:
    """The `horovod` input channel: the folder of wheels under `wheel_prefix`."""
    return f"s3://{bucket}/{wheel_prefix(image_uri, user)}/wheels"


def find_wheel(boto: Any, bucket: str, image_uri: str, user: str | None = None) -> dict[str, Any] | None:
    """The manifest of the wheels built for `image_uri`, or None if there are none (yet).

    The manifest is written after the wheels, so one that lists wheels all present means a
    complete build. Read-only: nothing is created."""
    from botocore.exceptions import ClientError

    s3 = aws.as_boto_session(boto).client("s3")
    prefix = wheel_prefix(image_uri, user)
    try:
        manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST}")["Body"].read())
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound"):
            return None
        raise WorkshopError(
            f"Could not look for the Horovod wheel at s3://{bucket}/{prefix}/{MANIFEST}: {code or exc}.",
            f"allow s3:GetObject and s3:ListBucket on s3://{bucket}/{aws.WORKSHOP_NAME}/<you>/ for your user.",
        ) from None
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/wheels/").get("Contents", [])
    present = {o["Key"].rsplit("/", 1)[-1] for o in listed}
    wheels = manifest.get("wheels") or []
    if not any(w.startswith(f"horovod-{HOROVOD_VERSION}-") for w in wheels) or not set(wheels) <= present:
        return None  # an incomplete upload: build again
    return manifest


def publish_wheels(boto: Any, bucket: str, image_uri: str, build_dir: Path, job_name: str,
                   user: str | None = None) -> dict[str, Any]:
    """Upload the wheels a build job left (`build_dir/wheels`, `build_dir/horovod-build.json`)
    under `wheel_prefix`, the manifest last. Returns the manifest."""
    record_path = build_dir / BUILD_RECORD
    wheels = sorted((build_dir / "wheels").glob("*.whl"))
    if not record_path.is_file() or not any(w.name.startswith(f"horovod-{HOROVOD_VERSION}-") for w in wheels):
        raise WorkshopError(
            f"The Horovod build job {job_name} left no horovod-{HOROVOD_VERSION} wheel and build record "
            f"(found: {', '.join(w.name for w in wheels) or 'nothing'}).",
            "read the build job's log above; run again to retry, or pass an image with Horovod as image_uri.",
        )
    record = json.loads(record_path.read_text())
    s3 = aws.as_boto_session(boto).client("s3")
    prefix = wheel_prefix(image_uri, user)
    for wheel in wheels:
        s3.upload_file(str(wheel), bucket, f"{prefix}/wheels/{wheel.name}")
    manifest = {
        **record,
        "image_uri": image_uri,
        "build_job": job_name,
        "built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wheels": [w.name for w in wheels],
        "channel": f"s3://{bucket}/{prefix}/wheels",
    }
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST}", Body=json.dumps(manifest, indent=1).encode())
    return manifest


def build_cost_lines(instance_type: str) -> list[str]:
    """What the one-time build job costs: an estimate, and its bound (max_run)."""
    price = INSTANCE_PRICES.get(instance_type)
    low, high = BUILD_MINUTES_ESTIMATE
    if price is None:
        return [f"1 x {instance_type} for about {low}-{high} min (no price on record for it)"]
    hourly = price.usd_per_hour
    return [
        f"1 x {instance_type} for about {low}-{high} min of compiling (an estimate from 2-core machines, not "
        f"measured on SageMaker): about ${hourly * low / 60:.2f}-${hourly * high / 60:.2f} at ${hourly:.3f}/h; "
        f"at most ${hourly * BUILD_MAX_RUN_S / 3600:.2f} (max_run {BUILD_MAX_RUN_S} s); once per image, "
        "not per job or host"
    ]


def build_cost_bound(instance_type: str) -> str:
    """The build job's cost bound in one phrase, confirmed together with the training job's."""
    price = INSTANCE_PRICES.get(instance_type)
    hours = BUILD_MAX_RUN_S / 3600
    if price is None:
        return f"the one-time Horovod build job (1 x {instance_type} for {hours:g} h; no price on record)"
    return (f"at most ${price.usd_per_hour * hours:.2f} for the one-time Horovod build job "
            f"(1 x {instance_type} x ${price.usd_per_hour:.3f}/h x {hours:g} h)")


def build_wheel(plan: JobPlan, role_arn: str, session: Any, *, logs: bool = True) -> dict[str, Any]:
    """Run the one-host build job for `plan.image_uri` and store its wheels; returns the manifest.

    Same image, role, network, bucket prefixes and tags as the lab's jobs (its base job name is
    the lab's, which the workshop role's S3 prefixes cover), one instance of the plan's type,
    SDK v3's basic script driver running `hvd_build.py` from the driver folder. The wheels come
    back in the job's `model.tar.gz` and go to `wheel_channel_uri`.
    """
    from sagemaker.core.training.configs import (
        Compute,
        Networking,
        SourceCode,
        StoppingCondition,
        Tag,
    )
    from sagemaker.train.model_trainer import ModelTrainer

    staging = aws.default_bucket(session)  # the SDK stages the build job's code there: created if missing
    uri = dict(plan.extra_inputs).get(WHEEL_CHANNEL) or wheel_channel_uri(staging, plan.image_uri)
    bucket = uri[len("s3://"):].split("/", 1)[0]
    framework = plan.lab.launcher.framework
    tags = [*plan.tags, {"Key": PURPOSE_TAG, "Value": "horovod-build"}]
    try:
        trainer = ModelTrainer(
            sagemaker_session=session,
            role=role_arn,
            base_job_name=plan.base_job_name,  # the lab's: the workshop role may use its S3 prefix
            training_image=plan.image_uri,
            source_code=SourceCode(source_dir=str(DRIVER_DIR), entry_script=BUILD_SCRIPT,
                                   ignore_patterns=SOURCE_IGNORE_PATTERNS),
            compute=Compute(instance_type=plan.instance_type, instance_count=1,
                            volume_size_in_gb=plan.sagemaker.volume_size_gb),
            networking=(Networking(subnets=plan.subnets, security_group_ids=plan.security_group_ids)
                        if plan.subnets else None),
            stopping_condition=StoppingCondition(max_runtime_in_seconds=BUILD_MAX_RUN_S),
            hyperparameters={"frameworks": framework},
            tags=[Tag(key=t["Key"], value=t["Value"]) for t in tags],
        )
    except Exception as exc:  # noqa: BLE001 - the SDK's own checks, said as the workshop says them
        raise WorkshopError(f"Could not set up the Horovod build job: {exc}",
                            "check the role and region; see workshop.jobs.build_trainer.") from None
    result = submit(trainer, {}, wait=True, logs=logs)
    if not result.ok:
        raise WorkshopError(
            f"The Horovod build job {result.job_name} ended {result.status}: {result.failure_reason}",
            "read its log above ([hvd_build] and [build_horovod] lines). A build needs PyPI: in your own "
            "subnets give it a NAT route. Or pass an image with Horovod built in as image_uri "
            "(2_horovod/docker/Dockerfile).",
        )
    with tempfile.TemporaryDirectory(prefix="horovod-build-") as tmp:
        result.download_model(tmp)
        manifest = publish_wheels(session.boto_session, bucket, plan.image_uri, Path(tmp), result.job_name)
    print(f"[horovod] wheel for {plan.image_uri} stored at {manifest['channel']} ({manifest['source']}); "
          "every later job of this image installs it from there", flush=True)
    return manifest


# --------------------------------------------------------------------------- the launcher's hooks


def check_plan(plan: JobPlan) -> JobPlan:
    """Offline: the workshop's wheel is CPU-only, so GPU instance types need an image of yours."""
    if not is_gpu_instance(plan.instance_type):
        return plan
    if not plan.custom_image:
        raise WorkshopError(
            f"{plan.instance_type} has GPUs, but the Horovod the workshop builds for SageMaker's images is "
            "CPU-only (Gloo, no NCCL): its ranks would leave the GPUs idle and train on the CPU.",
            GPU_FIX + ".",
        )
    note = ("GPU instance with your image: its Horovod must be built with NCCL (horovod.*.nccl_built()); "
            "the driver refuses to start ranks on a GPU host otherwise")
    return dataclasses.replace(plan, notes=(*plan.notes, note))


def prepare_plan(plan: JobPlan, bucket: str, boto: Any) -> tuple[JobPlan, list[PrepStep]]:
    """The `horovod` channel, and a build job first when S3 has no wheel for the image yet."""
    if plan.custom_image:
        return plan, []
    uri = wheel_channel_uri(bucket, plan.image_uri)
    plan = dataclasses.replace(plan, extra_inputs=(*plan.extra_inputs, (WHEEL_CHANNEL, uri)))
    cost = build_cost_lines(plan.instance_type)[0]
    if boto is None:  # a dry run: no look-up
        note = (f"Horovod: channel `{WHEEL_CHANNEL}` = {uri}, the wheel built once for this image; a real run "
                f"looks it up there, and if it is missing first runs a one-host build job that needs PyPI ({cost})")
        return dataclasses.replace(plan, notes=(*plan.notes, note)), []
    manifest = find_wheel(boto, bucket, plan.image_uri)
    if manifest is not None:
        note = (f"Horovod: wheel found at {uri} (built {manifest.get('built_at', '?')} by job "
                f"{manifest.get('build_job', '?')}); the hosts install it from channel `{WHEEL_CHANNEL}`, no build, no PyPI")
        return dataclasses.replace(plan, notes=(*plan.notes, note)), []
    need = (
        f"no Horovod wheel for this image in {uri.rsplit('/wheels', 1)[0]} yet, and the one-host job that builds "
        "it downloads Horovod's source and dependencies from PyPI",
        "build the wheel once outside this network: run the lab once with network='nat' or network=False (its "
        "build job stores the wheel in S3, and later jobs in the endpoints-only network install it from there "
        "without PyPI), or pass an image with Horovod built in as image_uri (2_horovod/docker/Dockerfile)",
    )
    note = f"Horovod: no wheel for this image at {uri} yet: a one-host build job runs first ({cost})"
    plan = dataclasses.replace(plan, internet_needs=(*plan.internet_needs, need), notes=(*plan.notes, note))
    step = PrepStep(
        what=f"Horovod: building the wheel once for {plan.image_uri} with a one-host build job; it goes to {uri}",
        run=build_wheel,
        cost=build_cost_bound(plan.instance_type),
    )
    return plan, [step]


class HorovodLauncher(LauncherBase):
    """Horovod's ranks through the workshop's driver, in both runtimes, for one framework's script."""

    name = "horovod"

    def __init__(self, framework: Literal["pytorch", "tensorflow"]):
        self.framework = framework

    def __repr__(self) -> str:
        return f"HorovodLauncher({self.framework!r})"

    def local_config(self, lab: Lab, procs_per_host: int | None) -> Horovod:
        check_installed(self.framework)  # before any process starts: a missing build says how to get one
        return Horovod(framework=self.framework, process_count_per_node=procs_per_host)

    def sagemaker_config(self, plan: JobPlan) -> Horovod:
        # SageMaker's framework images have no Horovod: the hosts install the wheel built once
        # for the image from channel `horovod` (added by prepare). An image of your own
        # (image_uri=..., e.g. from 2_horovod/docker/Dockerfile) has it.
        return Horovod(
            framework=self.framework,
            install="none" if plan.custom_image else "wheel",
            process_count_per_node=plan.procs_per_host,
        )

    def check(self, plan: JobPlan) -> JobPlan:
        return check_plan(plan)

    def prepare(self, plan: JobPlan, bucket: str, boto: Any) -> tuple[JobPlan, list[PrepStep]]:
        return prepare_plan(plan, bucket, boto)
