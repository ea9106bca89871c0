"""A checked `JobPlan` becomes the lab's SDK v3 `ModelTrainer`.

Facts relied on (SageMaker Python SDK 3.27, `sagemaker/train/model_trainer.py` unless noted):
- `ModelTrainer(...)` resolves the role at construction (`model_post_init` ->
  `TrainDefaults.get_role` -> `sagemaker/core/helper/iam_role_resolver.py:
  resolve_and_validate_role`), validating it through IAM `SimulatePrincipalPolicy` unless the
  environment says `SAGEMAKER_VALIDATE_ROLE=false`; an ARN is taken as is, without an IAM call.
  The same constructor resolves the output path through `Session.default_bucket()`.
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
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from workshop.cloud import aws
from workshop.errors import WorkshopError
from workshop.jobs.common import CHECKPOINT_DIR, SOURCE_IGNORE_PATTERNS
from workshop.jobs.plan import JobPlan, JobRequest, describe_plan, plan_job, route_requirements
from workshop.spec import Lab

if TYPE_CHECKING:
    from sagemaker.train.model_trainer import ModelTrainer

_VALIDATE_ROLE_ENV = "SAGEMAKER_VALIDATE_ROLE"


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


def build_from_plan(plan: JobPlan, role: str, session: Any, validate_role: bool | None) -> ModelTrainer:
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
                    requirements=route_requirements(plan),  # sm_train.sh pip-installs it before the driver starts
                ),
                distributed=lab.launcher.sagemaker_config(plan),
                compute=Compute(
                    instance_type=plan.instance_type,
                    instance_count=plan.instance_count,
                    volume_size_in_gb=plan.sagemaker.volume_size_gb,
                    enable_managed_spot_training=plan.spot or None,
                ),
                networking=networking,
                stopping_condition=StoppingCondition(max_runtime_in_seconds=plan.max_run_s,
                                                     max_wait_time_in_seconds=plan.max_wait_s),
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
            "(workshop.account.ensure_role()) and pass its ARN; or pass another role. "
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
    request: JobRequest | Lab, *, sagemaker_session: Any = None, validate_role: bool | None = None, **fields: Any
) -> ModelTrainer:
    """The lab's SDK v3 `ModelTrainer` for a `JobRequest` (or a lab and its fields), checked by
    `plan_job` first; the request must name the `role` (an ARN: nothing is looked up).

    Image from `sagemaker.core.image_uris.retrieve` (CPU or GPU by instance type; the PyTorch
    2.5 image for smddp, only with `allow_unsupported_image`), the lab's `code/` as `SourceCode`,
    the lab's launcher as `distributed`, a `StoppingCondition` on every job, a `CheckpointConfig`
    with `SM_CHECKPOINT_DIR` pointing at it, `METRICS` regexes, and workshop/user/lab tags.
    `validate_role`: None leaves the SDK's IAM check (iam:SimulatePrincipalPolicy) as the
    environment says; without IAM access it only warns, but moto does not implement the call,
    so pass False (or set SAGEMAKER_VALIDATE_ROLE=false) against a fake AWS.
    Constructing it calls AWS: the SDK resolves the default bucket for the output path.
    """
    request = JobRequest.of(request, **fields)
    if not request.role:
        raise WorkshopError("build_trainer needs the execution role's ARN.", "pass role='arn:aws:iam::<account>:role/<name>'.")
    region = _resolve_region(request.region, sagemaker_session)
    plan = plan_job(request, region=region)
    describe_plan(plan)
    session = sagemaker_session or aws.sagemaker_session(region=region)
    return build_from_plan(plan, request.role, session, validate_role)
