"""AWS plumbing for `sagemaker` mode: sessions, credentials, the training role, names, buckets.

Everything here either answers a question without spending anything (which region, which
role, which name prefix) or fails with a `WorkshopError` that names its fix, so that
`workshop.jobs` can check everything before it creates anything.

Telemetry: SDK v3 sends a usage event from every `ModelTrainer.train()` unless the SDK
config says `SageMaker.PythonSDK.Modules.TelemetryOptOut: true`. The SDK reads that flag from
the `sagemaker_config` of the `Session` the trainer holds
(`sagemaker/core/telemetry/telemetry_logging.py: _telemetry_emitter` ->
`resolve_value_from_config(config_path=TELEMETRY_OPT_OUT_PATH, sagemaker_session=...)`), and a
`Session` takes that config as a constructor argument
(`sagemaker/core/helper/session_helper.py: Session(sagemaker_config=...)`). So
`sagemaker_session()` below loads the user's own SDK config (admin and user files, exactly
as the SDK would) and adds the opt-out to it in memory: nothing is written to the user's
home, no environment variable is changed, and the user's other SDK defaults still apply.
"""

from __future__ import annotations

import copy
import getpass
import hashlib
import json
import os
import re
import unicodedata
from typing import TYPE_CHECKING, Any

from workshop.errors import WorkshopError

if TYPE_CHECKING:  # imported lazily at run time: boto3/sagemaker are slow to import
    import boto3
    from sagemaker.core.helper.session_helper import Session

WORKSHOP_NAME = "distributed-training-workshop"
ROLE_ENV = "WORKSHOP_ROLE_ARN"
USER_ENV = "WORKSHOP_USER"
# Written by SageMaker on notebook instances and in Studio; the SDK's execution-role lookup
# reads it (`sagemaker/core/helper/session_helper.py: NOTEBOOK_METADATA_FILE`).
NOTEBOOK_METADATA_FILE = "/opt/ml/metadata/resource-metadata.json"
# Longest user prefix: job names are `<user>-<lab>-<14-digit timestamp>`, at most 63 chars.
USER_PREFIX_MAX = 16
# A longer name keeps its head and gets this many hex digits of its SHA-256 (24 bits: among a
# hundred attendees whose names share a long head, the chance of any two colliding is 3 in 10,000).
USER_HASH_CHARS = 6
# Login names that say nothing about who is running (SageMaker notebook instances are all
# `ec2-user`, Studio is `sagemaker-user`): on SageMaker, the resource name is used instead.
_GENERIC_LOGINS = {"ec2-user", "sagemaker-user", "root", "jovyan", "ubuntu", "user", "admin"}
ROLE_ARN_PATTERN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
ROLE_NAME_PATTERN = re.compile(r"^[\w+=,.@-]{1,64}$")

TELEMETRY_OPT_OUT: dict[str, Any] = {
    "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}
}

CREDENTIALS_FIX = (
    "configure credentials with `aws configure` (or `aws sso login`), or select a profile "
    "with `export AWS_PROFILE=<name>`, or run on a SageMaker notebook instance or Studio, "
    "whose execution role provides them; or keep mode = 'local', which needs no AWS account."
)


def boto_session(region: str | None = None) -> boto3.Session:
    """A boto3 session in `region` (or boto3's own choice: AWS_REGION, the profile, ...).

    Creating it never calls AWS; an unknown `AWS_PROFILE` becomes a WorkshopError here
    instead of a botocore traceback later.
    """
    import boto3
    from botocore.exceptions import ProfileNotFound

    try:
        return boto3.Session(region_name=region)
    except ProfileNotFound as exc:
        raise WorkshopError(f"AWS profile not found: {exc}", CREDENTIALS_FIX) from None


def as_boto_session(session: Any) -> boto3.Session:
    """The boto3 session behind a boto3 session, a SageMaker `Session`, or None (a new one)."""
    if session is None:
        return boto_session()
    return getattr(session, "boto_session", session)


def require_credentials(session: Any = None) -> str:
    """Fail early, naming the fix, unless `session` has credentials and a region.

    Returns the caller's identity ARN (one read-only STS call), which also catches expired
    or invalid credentials before anything is uploaded or created.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    boto = as_boto_session(session)
    try:
        credentials = boto.get_credentials()
    except BotoCoreError as exc:  # e.g. an SSO token that has expired
        raise WorkshopError(f"AWS credentials could not be loaded: {exc}", CREDENTIALS_FIX) from None
    if credentials is None:
        raise WorkshopError("No AWS credentials found (boto3 found none).", CREDENTIALS_FIX)
    if not boto.region_name:
        raise WorkshopError(
            "No AWS region configured.",
            "pass region='us-east-1' (CLI: --region), or `export AWS_DEFAULT_REGION=us-east-1`, "
            "or `aws configure set region us-east-1`.",
        )
    try:
        return boto.client("sts").get_caller_identity()["Arn"]
    except (BotoCoreError, ClientError) as exc:
        raise WorkshopError(f"AWS rejected the credentials: {exc}", CREDENTIALS_FIX) from None


def on_sagemaker() -> bool:
    """True on a SageMaker notebook instance or in Studio (where the SDK can find the role)."""
    return os.path.isfile(NOTEBOOK_METADATA_FILE)


def _notebook_metadata() -> dict[str, Any]:
    try:
        with open(NOTEBOOK_METADATA_FILE, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _role_arn(role: str, session: Any, source: str) -> str:
    """A role ARN from an ARN or a bare role name (looked up in IAM, like the SDK does)."""
    role = role.strip()
    if ROLE_ARN_PATTERN.match(role):
        return role
    if not ROLE_NAME_PATTERN.match(role):
        raise WorkshopError(
            f"{source} is not an IAM role ARN or role name: {role!r}.",
            "use the form arn:aws:iam::<12-digit account>:role/<name>.",
        )
    from botocore.exceptions import BotoCoreError, ClientError

    boto = as_boto_session(session)
    try:
        return boto.client("iam").get_role(RoleName=role)["Role"]["Arn"]
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchEntity", "NoSuchEntityException"):
            raise WorkshopError(
                f"IAM role {role!r} ({source}) does not exist in this account.",
                "check the name, or pass the full role ARN.",
            ) from None
        # No iam:GetRole permission: build the ARN from the account (roles without a path).
        try:
            identity = boto.client("sts").get_caller_identity()
        except (BotoCoreError, ClientError):
            raise WorkshopError(
                f"Could not resolve IAM role name {role!r}: {exc}", "pass the full role ARN."
            ) from None
        partition = identity["Arn"].split(":")[1]
        return f"arn:{partition}:iam::{identity['Account']}:role/{role}"
    except BotoCoreError as exc:
        raise WorkshopError(f"Could not resolve IAM role name {role!r}: {exc}", "pass the full role ARN.") from None


def resolve_role(role: str | None = None, session: Any = None) -> str:
    """The IAM role SageMaker training jobs run as.

    In order: the `role` argument; `$WORKSHOP_ROLE_ARN`; on a SageMaker notebook instance or
    in Studio, the notebook's execution role (the SDK's own lookup,
    `sagemaker.core.helper.session_helper.get_execution_role`). Anything else is a
    WorkshopError naming all three ways, raised before anything is created.
    """
    if role:
        return _role_arn(role, session, "the role argument")
    from_env = os.environ.get(ROLE_ENV, "").strip()
    if from_env:
        return _role_arn(from_env, session, f"${ROLE_ENV}")
    if on_sagemaker():
        from botocore.exceptions import BotoCoreError, ClientError
        from sagemaker.core.helper.session_helper import get_execution_role

        try:
            return get_execution_role(sagemaker_session(as_boto_session(session)))
        except (ValueError, BotoCoreError, ClientError) as exc:
            raise WorkshopError(
                f"Running on SageMaker, but its execution role could not be found: {exc}",
                f"pass role='arn:aws:iam::<account>:role/<name>' or set ${ROLE_ENV}.",
            ) from None
    raise WorkshopError(
        "No IAM role for the SageMaker training job.",
        "pass role='arn:aws:iam::<account>:role/<name>' (CLI: --role), "
        f"or `export {ROLE_ENV}=arn:aws:iam::<account>:role/<name>`, "
        "or run on a SageMaker notebook instance or in Studio, whose execution role is used. "
        "The role must trust sagemaker.amazonaws.com and may read/write the workshop's bucket.",
    )


def sanitize_name(text: str, max_length: int) -> str:
    """`text` as a piece of a SageMaker resource name: `[a-z0-9-]`, no leading/trailing '-'.

    SageMaker job names must match `^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}` (CreateTrainingJob
    API reference), and S3 keys and tags are happy with the same characters.
    """
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    name = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    return name[:max_length].strip("-")


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return ""


def user_prefix() -> str:
    """Short, name-safe id of the person running, so many attendees can share one account.

    `$WORKSHOP_USER` if set, else the login name; on SageMaker, where every attendee's login
    is the same (`ec2-user`, `sagemaker-user`), the Studio user profile or notebook instance
    name instead. Job names, S3 prefixes and tags all start from it. At most 16 characters;
    longer names end in a short hash of the whole name (`short_user_name`), so names sharing a
    long prefix stay distinct.
    """
    raw = os.environ.get(USER_ENV, "").strip()
    if not raw:
        raw = _login_name()
        if raw.lower() in _GENERIC_LOGINS and on_sagemaker():
            metadata = _notebook_metadata()
            raw = metadata.get("UserProfileName") or metadata.get("ResourceName") or raw
    return short_user_name(sanitize_name(raw, 256)) or "user"


def short_user_name(name: str, max_length: int = USER_PREFIX_MAX) -> str:
    """`name` (already sanitized) if it fits in `max_length`; otherwise its first characters, '-',
    and `USER_HASH_CHARS` hex digits of a hash of the whole name.

    Cutting alone made `workshop-participant-01` and `-02` both `workshop-partici`: one role, one
    VPC, one set of job tags and S3 prefixes for two people, so one attendee's cleanup deleted the
    other's. With the hash they become `workshop-693775` and `workshop-88c5fd`: distinct, the
    same on every run and machine, recognisably the person's name at the start (in job names, tags
    and the console), and short enough that `<user>-<lab>-<timestamp>` job names fit in 63.
    Names that fit are left as they are, so nobody's existing resources change name.
    """
    if len(name) <= max_length:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:USER_HASH_CHARS]
    head = name[: max_length - USER_HASH_CHARS - 1].rstrip("-")
    return f"{head}-{digest}" if head else digest


def sdk_config() -> dict[str, Any]:
    """The SDK config the user already has (admin and user files), plus the telemetry opt-out.

    Loaded with the SDK's own loader (`sagemaker.core.config.config.load_sagemaker_config`, which
    honours SAGEMAKER_ADMIN_CONFIG_OVERRIDE / SAGEMAKER_USER_CONFIG_OVERRIDE), merged in memory.
    """
    from sagemaker.core.config.config import load_sagemaker_config

    config = copy.deepcopy(load_sagemaker_config() or {})
    config.setdefault("SchemaVersion", "1.0")
    modules = config.setdefault("SageMaker", {}).setdefault("PythonSDK", {}).setdefault("Modules", {})
    modules.update(TELEMETRY_OPT_OUT["SageMaker"]["PythonSDK"]["Modules"])
    return config


def sagemaker_session(session: Any = None, region: str | None = None) -> Session:
    """A SageMaker SDK `Session` over `session` (or a new boto3 session), telemetry opted out.

    Creating it calls no AWS API; it needs a region (SDK: "Must setup local AWS configuration
    with a region supported by SageMaker"), which becomes a WorkshopError here.
    """
    from sagemaker.core.helper.session_helper import Session

    boto = boto_session(region) if session is None else as_boto_session(session)
    if not boto.region_name:
        raise WorkshopError(
            "No AWS region configured.",
            "pass region='us-east-1' (CLI: --region), or `export AWS_DEFAULT_REGION=us-east-1`.",
        )
    return Session(boto_session=boto, sagemaker_config=sdk_config())


def default_bucket(session: Any = None) -> str:
    """The SDK's default bucket, `sagemaker-<region>-<account>` unless the SDK config names
    another (`sdk_bucket`), created if missing (free).

    The same bucket `ModelTrainer` stages code and writes outputs to
    (`Session.default_bucket()`), so the workshop's data sits next to its jobs.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    sm_session = session if hasattr(session, "default_bucket") else sagemaker_session(session)
    try:
        return sm_session.default_bucket()
    except (BotoCoreError, ClientError) as exc:
        raise WorkshopError(
            f"Could not find or create the SageMaker default bucket: {exc}",
            "allow s3:CreateBucket, s3:ListBucket, s3:GetBucketLocation on "
            "arn:aws:s3:::sagemaker-<region>-<account> for this user or role.",
        ) from None


# Where SDK v3 puts a job's files (ModelTrainer: `s3://<bucket>/<prefix>/<base job name>/...`):
# `Session.default_bucket()` and `Session.default_bucket_prefix`, which the Session reads from the
# SDK config keys below when they are set (`sagemaker/core/helper/session_helper.py`,
# `SESSION_DEFAULT_S3_BUCKET_PATH`, `SESSION_DEFAULT_S3_OBJECT_KEY_PREFIX_PATH`). The workshop's
# role policy, its data prefix, cleanup and the preflight follow the same two values.
SDK_BUCKET_KEY = "SageMaker.PythonSDK.Modules.Session.DefaultS3Bucket"
SDK_KEY_PREFIX_KEY = "SageMaker.PythonSDK.Modules.Session.DefaultS3ObjectKeyPrefix"


def s3_key(key_prefix: str | None, *parts: str) -> str:
    """`parts` joined with '/', after `key_prefix` (the SDK's default key prefix) if there is one,
    joined as SDK v3 joins it (`f"{default_bucket_prefix}/{key}"`)."""
    key = "/".join(p for p in parts if p)
    return f"{key_prefix}/{key}" if key_prefix else key


def sdk_key_prefix(session: Any = None) -> str:
    """The key prefix SDK v3 puts before every S3 key it writes for a job, or '' if none.

    `session`: a SageMaker `Session` (its `default_bucket_prefix`), or anything else: the user's
    SDK config (`SDK_KEY_PREFIX_KEY`), read locally with no AWS call.
    """
    if session is not None and hasattr(session, "default_bucket_prefix"):
        return session.default_bucket_prefix or ""
    from sagemaker.core.common_utils import get_config_value

    return get_config_value(SDK_KEY_PREFIX_KEY, sdk_config()) or ""


def sdk_bucket(session: Any = None) -> str:
    """The name of the bucket SDK v3 will stage code in and write outputs to, creating nothing.

    A bucket the SDK config names (`SDK_BUCKET_KEY`) or the `Session` was given, else
    `sagemaker-<region>-<account>` (one STS call): the name `default_bucket()` would create.
    """
    from botocore.exceptions import BotoCoreError, ClientError
    from sagemaker.core.common_utils import get_config_value

    sm_session = session if hasattr(session, "default_bucket") else sagemaker_session(session)
    named = (
        getattr(sm_session, "_default_bucket", None)  # already resolved by default_bucket()
        or getattr(sm_session, "_default_bucket_name_override", None)  # the Session's own resolution
        or get_config_value(SDK_BUCKET_KEY, getattr(sm_session, "sagemaker_config", None))
    )
    if named:
        return named
    try:
        return sm_session.generate_default_sagemaker_bucket_name(sm_session.boto_session)
    except (BotoCoreError, ClientError) as exc:
        raise WorkshopError(f"Could not name the SageMaker default bucket (sts:GetCallerIdentity): {exc}",
                            CREDENTIALS_FIX) from None
