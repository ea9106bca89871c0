"""The SageMaker job path: a `JobRequest` is checked into a `JobPlan`, built into an SDK v3
`ModelTrainer`, dry-run or submitted, and its logs and results read back.

    from workshop.jobs import JobRequest, dry_run, plan_job
    request = JobRequest(get_lab("data_parallel"), hyperparameters={"epochs": 3}, instance_count=2)
    dry_run(request)                       # the exact CreateTrainingJob request, no account needed

- `plan`: `JobRequest`, `JobPlan`, `plan_job` (every offline check), the launcher's `prepare`
  step, the internet check, the S3 locations against the workshop role's; `checks`: what
  CreateTrainingJob and the container accept; `shapes`: every constraint of the service model;
  `images`: which image, and its support window;
- `trainer`: the plan as a `ModelTrainer`; `dry_run`: the request, under moto, offline;
- `submit`: start, follow the logs, `JobResult`.

It knows no particular lab: the lab's launcher and data source come with the request's `Lab`.
The whole flow for a lab (credentials, preflight, network, data upload, submit) is
`workshop.runner.run_on_sagemaker`.
"""

from workshop.jobs.checks import (
    check_hyperparameters,
    check_role,
    gpus_per_instance,
    is_gpu_instance,
    training_instance_types,
)
from workshop.jobs.common import CHECKPOINT_DIR, SOURCE_IGNORE_PATTERNS
from workshop.jobs.dry_run import (
    DRY_RUN_SECURITY_GROUP,
    DRY_RUN_SUBNET,
    PLACEHOLDER_ROLE_ARN,
    DryRunRequest,
    dry_run,
)
from workshop.jobs.images import (
    IMAGE_SUPPORT,
    PYTORCH_IMAGE,
    SMDDP_INSTANCE_TYPES,
    ImageSupport,
    check_image_supported,
    image_support,
    today,
)
from workshop.jobs.plan import (
    JobPlan,
    JobRequest,
    LauncherNotSupported,
    PrepStep,
    check_internet,
    check_s3_scope,
    describe_plan,
    network_egress,
    plan_job,
    prepare_launcher,
)
from workshop.jobs.submit import LOG_GROUP, JobResult, console_url, job_records, logs_url, submit
from workshop.jobs.trainer import build_from_plan, build_trainer

__all__ = [
    "CHECKPOINT_DIR", "DRY_RUN_SECURITY_GROUP", "DRY_RUN_SUBNET", "DryRunRequest", "IMAGE_SUPPORT", "ImageSupport", "JobPlan", "JobRequest", "JobResult",
    "LOG_GROUP", "LauncherNotSupported", "PLACEHOLDER_ROLE_ARN", "PYTORCH_IMAGE", "PrepStep", "SMDDP_INSTANCE_TYPES",
    "SOURCE_IGNORE_PATTERNS", "build_from_plan", "build_trainer", "check_hyperparameters", "check_image_supported",
    "check_internet", "check_role", "check_s3_scope", "console_url", "describe_plan", "dry_run", "gpus_per_instance", "image_support",
    "is_gpu_instance", "job_records", "logs_url", "network_egress", "plan_job", "prepare_launcher", "submit", "today",
    "training_instance_types",
]
