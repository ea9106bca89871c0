"""The SageMaker side of a `ModelTrainer` of your own, for a notebook whose one switch is `mode`: the settings
that say where and as whom the job runs (`sagemaker_settings`), and `submit_trainer`, which sends the very
object `train_locally` ran, after the same checks, preflight, cost bound and confirmation as every lab's job.

    trainer = ModelTrainer(**sagemaker_settings(mode), source_code=..., compute=..., ...)
    workshop.train_locally(trainer)                       # both modes: the simulated hosts first
    if mode == "sagemaker":
        job = submit_trainer(trainer, confirm_cost=confirm_cost)
"""

from __future__ import annotations

import os
from typing import Any

from workshop.cloud import aws
from workshop.errors import WorkshopError
from workshop.jobs.common import say
from workshop.jobs.dry_run import PLACEHOLDER_ACCOUNT, PLACEHOLDER_ROLE_ARN
from workshop.jobs.plan import BASE_JOB_NAME_MAX, JobRequest, describe_plan, plan_job
from workshop.jobs.submit import JobResult, submit
from workshop.spec import SCRIPT_KEY

VALIDATE_ROLE = "SAGEMAKER_VALIDATE_ROLE"
DRY_RUN_REGION = "us-east-1"


def base_job_name() -> str:
    """`<you>-script`: the name of your scripts' jobs, which the workshop's role and cleanup cover."""
    return aws.sanitize_name(f"{aws.user_prefix()}-{SCRIPT_KEY}", BASE_JOB_NAME_MAX)


def sagemaker_settings(mode: str, *, region: str | None = None, role: str | None = None) -> dict[str, Any]:
    """`sagemaker_session=`, `role=` and `base_job_name=` for `ModelTrainer(...)`, by `mode`.

    "sagemaker": your AWS session (its region, or `region`) and the execution role the labs use
    (`workshop.cloud.role.resolve_role`: `role`, `$WORKSHOP_ROLE_ARN`, the notebook's role, or the workshop's),
    which the SDK checks through IAM when the trainer is built. "local": no AWS account at all: a session that
    only knows a region and a placeholder role; nothing is sent to AWS, so the SDK's role check (an IAM call) is
    off in this process while the mode is local (`SAGEMAKER_VALIDATE_ROLE=false`, said once).
    """
    if mode not in ("local", "sagemaker"):
        raise WorkshopError(f"mode must be 'local' or 'sagemaker', not {mode!r}.", "set mode in the parameters cell.")
    if mode == "local":
        import boto3

        boto = boto3.Session(region_name=region or aws.boto_session(None).region_name or DRY_RUN_REGION)
        if os.environ.get(VALIDATE_ROLE) != "false":
            os.environ[VALIDATE_ROLE] = "false"
            os.environ["_WORKSHOP_SET_VALIDATE_ROLE"] = "1"
            say(f"local mode: no AWS account is used; the trainer gets the placeholder role {PLACEHOLDER_ROLE_ARN} "
                f"and the SDK's role check (an IAM call) is off ({VALIDATE_ROLE}=false) while the mode is local")
        session = aws.sagemaker_session(boto)
        # The trainer's default output path names the SDK's bucket, which it would look up (an STS call) as it is
        # built: a placeholder account's bucket instead (the SDK's own attribute for a bucket already known).
        session._default_bucket = f"sagemaker-{boto.region_name}-{PLACEHOLDER_ACCOUNT}"  # noqa: SLF001
        return {"sagemaker_session": session, "role": role or PLACEHOLDER_ROLE_ARN, "base_job_name": base_job_name()}
    if os.environ.pop("_WORKSHOP_SET_VALIDATE_ROLE", None):  # set by a local-mode call above: the SDK checks again
        os.environ.pop(VALIDATE_ROLE, None)
    from workshop.cloud.role import resolve_role

    boto = aws.boto_session(region)
    if not boto.region_name:
        raise WorkshopError("No AWS region configured.",
                            "pass region='us-east-1', or `export AWS_DEFAULT_REGION=us-east-1`.")
    identity = aws.require_credentials(boto)
    arn = resolve_role(role, boto)
    say(f"calling AWS as {identity} in {boto.region_name}; the job runs as {arn}")
    return {"sagemaker_session": aws.sagemaker_session(boto), "role": arn, "base_job_name": base_job_name()}


def submit_trainer(trainer: Any, *, confirm_cost: Any = False, wait: bool = True) -> JobResult:
    """Send `trainer` itself to SageMaker: the checks `train_locally` makes (what SageMaker would refuse), then the
    preflight of a lab's job (the role's permissions, the Service Quotas value for its instance type, the cost
    bound: instances x price x its `max_runtime_in_seconds`), then the cost must be confirmed (`confirm_cost=True`,
    or `WORKSHOP_CONFIRM_COST=1`), and only then `trainer.train()`, followed to its end (`workshop.jobs.submit`).
    The SDK uploads its source folder and its local channels, as it does for any trainer."""
    from sagemaker.train.model_trainer import Mode

    from workshop.cloud.cost import require_confirmation
    from workshop.cloud.preflight import preflight
    from workshop.script_mode.trainer import trainer_job

    if getattr(trainer, "training_mode", None) == Mode.LOCAL_CONTAINER:
        raise WorkshopError("This trainer is built for the SDK's Docker mode (Mode.LOCAL_CONTAINER).",
                            "build it with sagemaker_settings('sagemaker') (no training_mode=) to submit it.")
    if trainer.role == PLACEHOLDER_ROLE_ARN:
        raise WorkshopError("This trainer has the placeholder role of local mode.",
                            "set mode = 'sagemaker' and build the trainer again with sagemaker_settings(mode).")
    boto = trainer.sagemaker_session.boto_session
    say("step 1/3: checking the job (what SageMaker would refuse, the plan)")
    job = trainer_job(trainer)
    stop = trainer.stopping_condition
    request = JobRequest.of(job.spec, instance_type=trainer.compute.instance_type,
                            instance_count=trainer.compute.instance_count, procs_per_host=job.procs_per_host,
                            hyperparameters=job.hyperparameters, image_uri=trainer.training_image, role=trainer.role,
                            base_job_name=trainer.base_job_name,
                            max_run_s=getattr(stop, "max_runtime_in_seconds", None) or job.spec.sagemaker.max_run_s)
    plan = plan_job(request, region=boto.region_name)
    describe_plan(plan)
    say("step 2/3: the preflight checks")
    report = preflight(plan, trainer.role, boto)
    bound = report.cost.bound()
    how = require_confirmation("this job", bound, confirm_cost)
    say(f"cost confirmed ({how}): {bound}")
    say("step 3/3: submitting the trainer (the SDK uploads its source folder and local channels)")
    return submit(trainer, {}, wait=wait, logs=wait)
