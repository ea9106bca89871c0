"""The exact CreateTrainingJob request SDK v3 would send, with no credentials at all.

`train(dry_run=True)` is not dry: it builds the request with `_create_training_job_args`, which
uploads the source code and the SDK's drivers to S3 (and creates the default bucket), then
returns None without the request. Hence `dry_run` runs the SDK's real `ModelTrainer(...)` and
`train()` inside moto's in-process fake AWS and takes the request from botocore's
`before-parameter-build` event, then stops it there.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tarfile
from collections.abc import Iterator, Mapping
from typing import Any

from workshop.cloud import aws
from workshop.cloud.preflight import dry_run_lines
from workshop.errors import WorkshopError
from workshop.jobs.checks import check_role, given_role, refuse_invalid_request
from workshop.jobs.common import input_data, say, split_s3
from workshop.jobs.plan import (
    JobPlan,
    JobRequest,
    check_internet,
    describe_plan,
    network_egress,
    plan_job,
    prepare_launcher,
)
from workshop.jobs.shapes import model_source
from workshop.jobs.trainer import build_from_plan
from workshop.jobs.tuning import (
    TRIAL_PROGRAM,
    TuningPlan,
    build_tuner,
    describe_tuning,
    plan_tuning,
    staged_source,
)
from workshop.search import Objective, SearchSpace
from workshop.spec import Lab

# A dry run needs some role ARN; moto's account id makes it obviously not yours.
PLACEHOLDER_ACCOUNT = "123456789012"


PLACEHOLDER_ROLE_ARN = f"arn:aws:iam::{PLACEHOLDER_ACCOUNT}:role/WorkshopDryRunPlaceholder"


DRY_RUN_REGION = "us-east-1"  # when no region is configured: a dry run needs one for the image


DRY_RUN_SUBNET = "subnet-0123456789abcdef0"  # placeholders a dry run with network=... shows


DRY_RUN_SECURITY_GROUP = "sg-0123456789abcdef0"


class DryRunRequest(dict):
    """The CreateTrainingJob (or CreateHyperParameterTuningJob) request, exactly as the SDK handed
    it to botocore (a plain dict).

    Also carries what the request only points at: `sm_drivers` (the text of `distributed.json`,
    `sourcecode.json` and `sm_train.sh` as uploaded to the `sm_drivers` channel) and
    `code_files` (the files of the `code` channel).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sm_drivers: dict[str, str] = {}
        self.code_files: list[str] = []
        self.input_channels: list[dict[str, Any]] | None = None  # a tuning request's: its definition's
        # (member, pattern, why) for each pattern the check could not translate from Java: not checked
        self.unchecked: list[tuple[str, str, str]] = []

    def channel(self, name: str) -> str | None:
        """The S3 URI of input channel `name`, if the request has it."""
        channels = self.get("InputDataConfig", []) if self.input_channels is None else self.input_channels
        for channel in channels:
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


def data_uris(plan: JobPlan, bucket: str) -> dict[str, str]:
    """Where the lab's data channels are in `bucket` (its data source's S3 prefix); a data source's channels
    that are S3 URIs already (its `s3_channels`, e.g. a script of your own's) are read from there."""
    prefix = plan.lab.data.s3_prefix()
    given = dict(getattr(plan.lab.data, "s3_channels", None) or {})
    return {channel: given.get(channel) or f"s3://{bucket}/{prefix}/{channel}" for channel in plan.lab.data.channels}


def _dry_run_from_plan(plan: JobPlan, role: str, inputs: Mapping[str, str] | None,
                       tuning: TuningPlan | None = None) -> DryRunRequest:
    """The request under moto: CreateTrainingJob, or with `tuning`, CreateHyperParameterTuningJob."""
    try:
        import boto3
        from moto import mock_aws
    except ImportError:
        raise WorkshopError(
            "A dry run needs moto (a fake AWS, in-process).", "pip install 'moto[s3]' (the version in requirements.txt)."
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
        operation = "CreateHyperParameterTuningJob" if tuning else "CreateTrainingJob"
        boto.events.register(f"before-parameter-build.sagemaker.{operation}", capture)
        session = aws.sagemaker_session(boto)
        trainer = build_from_plan(plan, role, session, validate_role=False)
        data = dict(inputs) if inputs is not None else data_uris(plan, session.default_bucket())
        data = {**data, **dict(plan.extra_inputs)}  # plus the launcher's channels
        try:
            if tuning:
                with staged_source(plan.lab) as staged:
                    build_tuner(tuning, trainer, staged).tune(inputs=data, job_name=tuning.name, wait=False)
            else:
                trainer.train(input_data_config=input_data(data), wait=False, logs=False)
        except _Captured:
            pass
        if not captured:
            raise RuntimeError(f"The SageMaker SDK did not call {operation}; cannot dry-run.")
        # The whole service model, not only what botocore checks before sending (required members,
        # types, minimums): a dry run shows only a request the service would take.
        unchecked = refuse_invalid_request(operation, captured)
        request = DryRunRequest(captured)
        request.unchecked = unchecked
        s3 = boto.client("s3")
        if tuning:
            definition = request.get("TrainingJobDefinition", {})
            request.input_channels = definition.get("InputDataConfig", [])
            program = definition.get("StaticHyperParameters", {}).get("sagemaker_submit_directory")
            if program:
                bucket, key = split_s3(program)
                with contextlib.suppress(Exception):
                    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
                    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                        request.code_files = sorted(m.name for m in tar.getmembers() if m.isfile())
        drivers = request.channel("sm_drivers")
        if drivers:
            bucket, prefix = split_s3(drivers)
            for name in _DRIVER_FILES:
                with contextlib.suppress(Exception):
                    body = s3.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read()
                    request.sm_drivers[name] = body.decode()
        code = request.channel("code")
        if code:
            bucket, prefix = split_s3(code)
            listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
            request.code_files = sorted(o["Key"][len(prefix) + 1 :] for o in listing)
    return request


def _print_dry_run(plan: JobPlan, request: DryRunRequest, role_is_placeholder: bool) -> None:
    print(json.dumps(request, indent=2, sort_keys=False, default=str), flush=True)
    if request.input_channels is not None:  # a tuning job: the code goes as the toolkit's tarball
        static = request.get("TrainingJobDefinition", {}).get("StaticHyperParameters", {})
        say(f"source code: {static.get('sagemaker_submit_directory')} <- {plan.lab.source_dir} plus "
            f"{TRIAL_PROGRAM} ({', '.join(request.code_files) or 'no files'})")
        say(f"each trial: the image's toolkit runs {static.get('sagemaker_program')} on every host, which runs "
            f"the job's sm_train.sh and its {plan.lab.launcher.name} driver (SDK issue #5610: not the plain script)")
    else:
        say(
            f"source code: {request.channel('code')} <- {plan.lab.source_dir} "
            f"({', '.join(request.code_files) or 'no files'})"
        )
    say(f"SDK drivers: {request.channel('sm_drivers')}")
    if "distributed.json" in request.sm_drivers:
        say(f"  distributed.json (read by the {plan.lab.launcher.name} driver): {request.sm_drivers['distributed.json']}")
    placeholders = [f"account {PLACEHOLDER_ACCOUNT} and its bucket (yours: sagemaker-{plan.region}-<your account id>)"]
    if role_is_placeholder:
        placeholders.append(f"role {PLACEHOLDER_ROLE_ARN}")
    say("placeholders: " + "; ".join(placeholders))
    say(f"request: checked against every constraint of {model_source()} (lengths, patterns, enums, sizes)"
        + "".join(f"; NOT checked: {member} against the pattern {pattern} ({why})"
                  for member, pattern, why in request.unchecked))
    say("dry run: nothing was uploaded or created in AWS and nothing was spent.")


def dry_run(
    request: JobRequest | Lab,
    *,
    inputs: Mapping[str, str] | None = None,
    show: bool = True,
    train_samples: int | None = None,
    space: SearchSpace | None = None,
    objective: Objective | None = None,
    parallel: int | None = None,
    **fields: Any,
) -> DryRunRequest:
    """The exact CreateTrainingJob request SDK v3 would send for a `JobRequest` (or a lab and
    its fields as keywords), with no credentials at all.

    With a search `space` (`workshop.search`), the CreateHyperParameterTuningJob request of a
    tuning job over that job instead (`objective`: default the lab's accuracy; `parallel`: trials
    at once), with its cost bound for every trial.

    Runs the SDK's real `ModelTrainer(...)` and `train()` against moto's in-process fake AWS
    and takes the request from botocore's `before-parameter-build` event, then stops it
    there. `inputs`: channel -> S3 URI (default: where `workshop.runner.run_on_sagemaker` would
    upload the lab's data). Without a role, a placeholder ARN is used.
    `show` prints the request as JSON, with where the source code and drivers went.
    `train_samples` (the prepared training set's size) lets the script check each rank's share.
    A `network` (True, "endpoints" or "nat") shows the job in the workshop network, with
    placeholder subnet and security group ids (`workshop.cloud.network.ensure_network` makes real ones).
    Also prints the network, role and cost, and which preflight checks need an account.
    Like the real path, it refuses what CreateTrainingJob would reject (the role's form
    included) before anything is built.
    """
    request = JobRequest.of(request, **fields)
    role_arn = _dry_run_role(request.role)
    egress = network_egress(request.network, request.subnets)
    if egress:
        request = JobRequest.of(request, subnets=[DRY_RUN_SUBNET], security_group_ids=[DRY_RUN_SECURITY_GROUP])
    region, region_note = request.region, ""
    if not region:
        with contextlib.suppress(WorkshopError):
            region = aws.boto_session().region_name
    if not region:
        region, region_note = DRY_RUN_REGION, " (no region configured: the dry run's default)"
    plan = plan_job(request, region=region, train_samples=train_samples)
    # The launcher's channels at the placeholder account's bucket; nothing is looked up.
    plan, _ = prepare_launcher(plan, f"sagemaker-{region}-{PLACEHOLDER_ACCOUNT}", None)
    plan = check_internet(plan, egress)
    tuning = None
    if space is not None:
        tuning = plan_tuning(plan, space, objective or Objective.parse(plan.lab, None), parallel, train_samples)
    if show:
        if region_note:
            say(f"region {region}{region_note}")
        describe_plan(plan)
        for line in describe_tuning(tuning) if tuning else ():
            say(line)
        for line in dry_run_lines(plan, role_arn, egress, trials=tuning.n_trials if tuning else 1,
                                  parallel=tuning.max_parallel if tuning else 1):
            say(line)
    request = _dry_run_from_plan(plan, role_arn, inputs, tuning)
    if show:
        _print_dry_run(plan, request, role_arn == PLACEHOLDER_ROLE_ARN)
    return request


def _dry_run_role(role: str | None) -> str:
    """The role a dry run shows: the given one (a bare name in the placeholder account),
    `$WORKSHOP_ROLE_ARN`, or the placeholder. Its form is checked as CreateTrainingJob would;
    nothing is looked up: no credentials here."""
    role, source = given_role(role)
    if not role:
        return PLACEHOLDER_ROLE_ARN
    check_role(role, source)
    if role.startswith("arn:"):
        return role
    return f"arn:aws:iam::{PLACEHOLDER_ACCOUNT}:role/{role}"


def dry_run_trainer(trainer: Any, *, inputs: Mapping[str, str] | None = None, show: bool = True,
                    region: str | None = None) -> DryRunRequest:
    """The CreateTrainingJob request a `ModelTrainer` of your own would send once its mode is SageMaker's,
    with no credentials at all, checked against every constraint of botocore's service model.

    The trainer itself is not touched: a copy of it (every setting you gave it, as you gave it) is built
    against moto's in-process fake AWS, with its mode `SAGEMAKER_TRAINING_JOB` (a `LOCAL_CONTAINER` trainer
    included: the request is what flipping its mode would send), role validation off and your role (or a
    placeholder), and its `train()` is stopped at botocore's `before-parameter-build` event, as `dry_run`
    does for a lab. Local channels and the source folder go to the fake S3, as the SDK uploads them.
    `inputs`: more channels, name -> URI or local path, as `train(input_data_config=...)` takes them.
    A request the service would refuse raises a WorkshopError naming each member and the fix.
    """
    try:
        import boto3
        from moto import mock_aws
        from sagemaker.core.training.configs import InputData
        from sagemaker.train.model_trainer import Mode
    except ImportError as exc:
        raise WorkshopError(f"A dry run needs moto and the SageMaker SDK: {exc}.",
                            "pip install -r requirements.txt (the versions the workshop pins).") from None
    given = {name: getattr(trainer, name) for name in trainer.model_fields_set
             if name not in ("sagemaker_session", "role", "training_mode")}
    session_region = getattr(getattr(trainer, "sagemaker_session", None), "boto_region_name", None)
    region = region or session_region or DRY_RUN_REGION
    role = getattr(trainer, "role", None) or PLACEHOLDER_ROLE_ARN
    check_role(role, "the trainer's role")
    captured: dict[str, Any] = {}

    def capture(params: dict[str, Any], **_: Any) -> None:
        captured.update(copy.deepcopy(params))
        raise _Captured

    validate = os.environ.get("SAGEMAKER_VALIDATE_ROLE")
    with _isolated_aws_env(), mock_aws():
        os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"  # moto has no iam:SimulatePrincipalPolicy
        try:
            boto = boto3.Session(region_name=region, aws_access_key_id="dry-run", aws_secret_access_key="dry-run")
            boto.events.register("before-parameter-build.sagemaker.CreateTrainingJob", capture)
            session = aws.sagemaker_session(boto)
            try:
                clone = type(trainer)(**given, sagemaker_session=session, role=role, training_mode=Mode.SAGEMAKER_TRAINING_JOB)
                extra = [InputData(channel_name=name, data_source=str(uri)) for name, uri in (inputs or {}).items()]
                clone.train(input_data_config=extra or None, wait=False, logs=False)
            except _Captured:
                pass
            except (ValueError, TypeError) as exc:  # the SDK's own checks (pydantic's ValidationError is one)
                raise WorkshopError(f"The SageMaker SDK refused the trainer as a SageMaker job: {exc}",
                                    "change what it names in the ModelTrainer(...) call.") from None
        finally:
            if validate is None:
                os.environ.pop("SAGEMAKER_VALIDATE_ROLE", None)
            else:
                os.environ["SAGEMAKER_VALIDATE_ROLE"] = validate
        if not captured:
            raise RuntimeError("The SageMaker SDK did not call CreateTrainingJob; cannot dry-run.")
        unchecked = refuse_invalid_request("CreateTrainingJob", captured)
        request = DryRunRequest(captured)
        request.unchecked = unchecked
        s3 = boto.client("s3")
        drivers = request.channel("sm_drivers")
        if drivers:
            bucket, prefix = split_s3(drivers)
            for name in _DRIVER_FILES:
                with contextlib.suppress(Exception):
                    request.sm_drivers[name] = s3.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read().decode()
        code = request.channel("code")
        if code:
            bucket, prefix = split_s3(code)
            listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
            request.code_files = sorted(o["Key"][len(prefix) + 1:] for o in listing)
    if show:
        print(json.dumps(request, indent=2, default=str), flush=True)
        say(f"source code: {request.channel('code')} ({', '.join(request.code_files) or 'no files'})")
        if "distributed.json" in request.sm_drivers:
            say(f"  distributed.json: {request.sm_drivers['distributed.json']}")
        say(f"placeholders: account {PLACEHOLDER_ACCOUNT} and its bucket"
            + (f"; role {PLACEHOLDER_ROLE_ARN}" if role == PLACEHOLDER_ROLE_ARN else ""))
        say(f"request: checked against every constraint of {model_source()} (lengths, patterns, enums, sizes)"
            + "".join(f"; NOT checked: {member} against the pattern {pattern} ({why})"
                      for member, pattern, why in request.unchecked))
        say("dry run: nothing was uploaded or created in AWS and nothing was spent.")
    return request
