"""The workshop's SageMaker execution role: least privilege, one per user, created or reused.

The S3 prefixes the role may use are the user's own: the shared data (`<workshop>/<user>/`) and
the jobs' files, which SDK v3 keys by base job name. The base job names are given by the caller
(`workshop.account` passes every lab's), so this module knows no lab.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workshop.cloud import aws
from workshop.cloud.common import TAG_STACK, TAG_WORKSHOP, aws_error, code_of, say, workshop_tags
from workshop.cloud.room import room_prefix
from workshop.errors import WorkshopError


def role_name(user: str | None = None) -> str:
    """The workshop's execution role for this user (IAM role names: at most 64 characters)."""
    return f"{aws.WORKSHOP_NAME}-{user or aws.user_prefix()}"[:64]


def trust_policy(*, account: str | None) -> dict[str, Any]:
    """SageMaker may assume the role; with `account`, only on behalf of that account.

    The `aws:SourceAccount` condition is the one the SDK's own training role carries
    (`sagemaker/core/helper/iam_policies.py`, `IAM_POLICY_CONFIG["training"]["trust_policy"]`, the
    account substituted by `iam_role_resolver._scope_trust_policy_to_account`): another account's
    SageMaker cannot be made to act with this role (the cross-service confused deputy). None: no
    condition, for a role SageMaker assumes outside the SDK's templates (an event's notebook role:
    nothing the workshop relies on shows that SageMaker sets the key when it starts a notebook)."""
    statement: dict[str, Any] = {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"},
                                 "Action": "sts:AssumeRole"}
    if account is not None:
        statement["Condition"] = {"StringEquals": {"aws:SourceAccount": account}}
    return {"Version": "2012-10-17", "Statement": [statement]}


def s3_prefixes(job_keys: Sequence[str], user: str | None = None, key_prefix: str | None = None) -> list[str]:
    """The S3 key prefixes the workshop writes for a user in the default bucket: the shared data
    channels (`<workshop>/<user>/`) and the jobs of each of `job_keys` (SDK v3 keys code, drivers
    and outputs by the base job name, `<user>-<key>/`), each after the SDK's default key prefix if
    the SDK config sets one (`key_prefix`; None: read it from the config, `aws.sdk_key_prefix()`).

    The keys are listed, not matched by a wildcard: `<user>-*` would also match another user whose
    name starts with `<user>-`."""
    user = user or aws.user_prefix()
    key_prefix = aws.sdk_key_prefix() if key_prefix is None else key_prefix
    bases = [aws.sanitize_name(f"{user}-{key}", 48) for key in job_keys]
    return [aws.s3_key(key_prefix, aws.WORKSHOP_NAME, user) + "/", *(aws.s3_key(key_prefix, base) + "/" for base in bases)]


def role_policy(*, region: str, account: str, bucket: str, job_keys: Sequence[str], user: str | None = None,
                partition: str = "aws", key_prefix: str | None = None) -> dict[str, Any]:
    """Least privilege for a workshop training job. No `*` action anywhere; the few actions
    on `*` are those AWS defines no resource type for (ecr:GetAuthorizationToken,
    cloudwatch:PutMetricData, ec2:Describe*-style reads and the network-interface calls a VPC
    job's ENIs need), each named explicitly. S3: the user's prefixes (`s3_prefixes`, after
    `key_prefix`) in `bucket`, which must be where the SDK will put the job's files
    (`aws.sdk_bucket`, `aws.sdk_key_prefix`); and, to read only, the room's shared data
    (`workshop.cloud.room`), which an event's organizer uploads once for every attendee."""
    user = user or aws.user_prefix()
    prefixes = s3_prefixes(job_keys, user, key_prefix)
    room = room_prefix(key_prefix)
    bucket_arn = f"arn:{partition}:s3:::{bucket}"
    log_group = f"arn:{partition}:logs:{region}:{account}:log-group:/aws/sagemaker/TrainingJobs"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "WorkshopObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": [f"{bucket_arn}/{p}*" for p in prefixes],
            },
            {
                "Sid": "RoomData",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"{bucket_arn}/{room}*"],
            },
            {
                "Sid": "WorkshopListing",
                "Effect": "Allow",
                "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
                "Resource": [bucket_arn],
                "Condition": {"StringLike": {"s3:prefix": [f"{p}*" for p in [*prefixes, room]] + [""]}},
            },
            {
                "Sid": "PullTrainingImages",
                "Effect": "Allow",
                "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
                # The Deep Learning Container accounts differ by region (763104351884 in most).
                "Resource": [f"arn:{partition}:ecr:{region}:*:repository/*"],
            },
            {
                "Sid": "EcrToken",
                "Effect": "Allow",
                "Action": ["ecr:GetAuthorizationToken"],
                "Resource": "*",  # this action has no resource type
            },
            {
                "Sid": "TrainingLogs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                "Resource": [log_group, f"{log_group}:*"],
            },
            {
                "Sid": "TrainingMetrics",
                "Effect": "Allow",
                "Action": ["cloudwatch:PutMetricData"],
                # No resource type, and no condition: SDK v3 checks the role when a ModelTrainer
                # is built by simulating this action (iam:SimulatePrincipalPolicy) with no context
                # keys, and a statement conditioned on `cloudwatch:namespace` does not apply to
                # such a simulation, so the SDK would reject the role (RoleValidationError). The
                # SDK's own training role grants it the same way. One action, metrics only.
                "Resource": "*",
            },
            {
                "Sid": "VpcJobNetworkInterfaces",
                "Effect": "Allow",
                "Action": [
                    "ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission",
                    "ec2:DeleteNetworkInterface", "ec2:DeleteNetworkInterfacePermission",
                    "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions",
                    "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups",
                ],
                "Resource": "*",  # the Describe calls have no resource type; creates name the VPC below
            },
        ],
    }


def shipped_policy_documents(job_keys: Sequence[str], region: str = "us-east-1", account: str = "123456789012",
                             bucket: str = "sagemaker-us-east-1-123456789012") -> dict[str, dict[str, Any]]:
    """Every IAM policy document this package writes, by name (for the wildcard check)."""
    return {
        "trust_policy": trust_policy(account=account),
        "role_policy": role_policy(region=region, account=account, bucket=bucket, job_keys=job_keys, user="alice", key_prefix=""),
    }


def wildcard_violations(document: dict[str, Any]) -> list[str]:
    """Allow statements that grant `*` (or `service:*`, or NotAction) over `*` resources."""
    statements = document.get("Statement", [])
    statements = [statements] if isinstance(statements, dict) else statements
    bad = []
    for i, st in enumerate(statements):
        if st.get("Effect") != "Allow":
            continue
        as_list = lambda v: [v] if isinstance(v, str) else list(v or [])  # noqa: E731
        actions = as_list(st.get("Action"))
        resources = as_list(st.get("Resource")) or ["*"] * ("NotResource" in st)
        wide_action = "NotAction" in st or any(a == "*" or a.endswith(":*") for a in actions)
        if wide_action and ("*" in resources or "NotResource" in st):
            bad.append(f"statement {st.get('Sid', i)}: {actions or 'NotAction'} on {resources}")
    return bad


@dataclass
class RoleInfo:
    arn: str
    name: str
    created: bool


def sdk_session(session: Any, boto: Any) -> Any:
    """`session` if it is a SageMaker `Session`, else one over `boto`: what says where the SDK
    puts a job's files (its default bucket and key prefix, from the user's SDK config)."""
    return session if hasattr(session, "default_bucket") else aws.sagemaker_session(boto)


def account_of(boto: Any) -> tuple[str, str]:
    identity = boto.client("sts").get_caller_identity()
    return identity["Account"], identity["Arn"].split(":")[1]


def ensure_role(session: Any = None, *, job_keys: Sequence[str], user: str | None = None,
                bucket: str | None = None) -> RoleInfo:
    """Create or reuse this user's workshop execution role; its inline policy is (re)written
    each time, so it follows the code. Tagged like everything else, which is how cleanup knows
    it is the workshop's to delete. Its S3 access is to `bucket` (default: the bucket the SDK
    will use, `aws.sdk_bucket`) under the SDK's key prefix, if the SDK config sets one, for the
    jobs of `job_keys` (`s3_prefixes`)."""
    from botocore.exceptions import BotoCoreError, ClientError

    boto = aws.as_boto_session(session)
    sm_session = sdk_session(session, boto)
    user = user or aws.user_prefix()
    name = role_name(user)
    iam = boto.client("iam")
    try:
        account, partition = account_of(boto)
        bucket = bucket or aws.sdk_bucket(sm_session)
        created = False
        try:
            role = iam.get_role(RoleName=name)["Role"]
            tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name).get("Tags", [])}
            if tags.get(TAG_WORKSHOP) != aws.WORKSHOP_NAME:
                raise WorkshopError(f"IAM role {name} exists but was not created by the workshop.",
                                    f"pass role='{role['Arn']}' to use it as is, or set WORKSHOP_USER to another name.")
            if tags.get(TAG_STACK):  # an event's stack made it with this policy; attendees may not rewrite it
                return RoleInfo(arn=role["Arn"], name=name, created=False)
        except ClientError as exc:
            if code_of(exc) != "NoSuchEntity":
                raise
            role = iam.create_role(
                RoleName=name, AssumeRolePolicyDocument=json.dumps(trust_policy(account=account)),
                Description="distributed-training-workshop: SageMaker training jobs (least privilege)",
                Tags=workshop_tags(user), MaxSessionDuration=3600,
            )["Role"]
            created = True
        policy = role_policy(region=boto.region_name, account=account, bucket=bucket, job_keys=job_keys, user=user,
                             partition=partition,
                             key_prefix=aws.sdk_key_prefix(sm_session))
        iam.put_role_policy(RoleName=name, PolicyName="workshop-training", PolicyDocument=json.dumps(policy))
    except (BotoCoreError, ClientError) as exc:
        raise aws_error(f"Creating the IAM role {name} failed", exc) from None
    return RoleInfo(arn=role["Arn"], name=name, created=created)


def stack_role(session: Any = None, user: str | None = None) -> str | None:
    """The ARN of the execution role an event's CloudFormation stack made for this user (the workshop's
    role, tagged with the stack's name), or None (no such role, or no permission to read it)."""
    from botocore.exceptions import BotoCoreError, ClientError

    iam = aws.as_boto_session(session).client("iam")
    name = role_name(user)
    try:
        tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name).get("Tags", [])}
        if tags.get(TAG_WORKSHOP) != aws.WORKSHOP_NAME or not tags.get(TAG_STACK):
            return None
        return iam.get_role(RoleName=name)["Role"]["Arn"]
    except (BotoCoreError, ClientError):
        return None


def resolve_role(role: str | None = None, session: Any = None) -> str:
    """`workshop.aws.resolve_role`, then (off SageMaker, with no role given) this user's
    workshop role if it exists, instead of failing like the SDK's `get_execution_role()`.

    On SageMaker with no role given, an event's attendee gets the execution role the event's stack
    made for them (`stack_role`), not their notebook's own role: the notebook's role may start and
    follow their jobs, the execution role is what the jobs themselves may do."""
    if not role and not os.environ.get(aws.ROLE_ENV, "").strip() and aws.on_sagemaker():
        arn = stack_role(session)
        if arn:
            say(f"using {arn}, the execution role the event's stack made for you")
            return arn
    try:
        return aws.resolve_role(role, session)
    except WorkshopError as exc:
        if role or not exc.message.startswith("No IAM role"):
            raise
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            arn = aws.as_boto_session(session).client("iam").get_role(RoleName=role_name())["Role"]["Arn"]
        except (BotoCoreError, ClientError):
            raise WorkshopError(
                exc.message,
                f"{exc.fix} Or create the workshop's least-privilege role: `python -m workshop role` "
                "(workshop.account.ensure_role()), which is then found by name.",
            ) from None
        say(f"using the workshop role {arn} (no role given, not on SageMaker)")
        return arn


def delete_role(session: Any = None, *, user: str | None = None, include_stack: bool = False) -> list[str]:
    """Delete this user's workshop role if the workshop created it (tagged); [] otherwise. A role an
    event's stack made (`TAG_STACK`) is left to the stack and its organizer unless `include_stack`."""
    from botocore.exceptions import BotoCoreError, ClientError

    iam = aws.as_boto_session(session).client("iam")
    name = role_name(user)
    try:
        try:
            tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name).get("Tags", [])}
        except ClientError as exc:
            if code_of(exc) == "NoSuchEntity":
                return []
            raise
        if tags.get(TAG_WORKSHOP) != aws.WORKSHOP_NAME:
            return []
        if tags.get(TAG_STACK) and not include_stack:
            say(f"role {name}: kept, made by the event's stack {tags[TAG_STACK]} (the organizer's "
                "`python -m workshop event cleanup` deletes it)")
            return []
        for policy in iam.list_role_policies(RoleName=name)["PolicyNames"]:
            iam.delete_role_policy(RoleName=name, PolicyName=policy)
        for attached in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]:
            iam.detach_role_policy(RoleName=name, PolicyArn=attached["PolicyArn"])
        iam.delete_role(RoleName=name)
    except (BotoCoreError, ClientError) as exc:
        raise aws_error(f"Deleting the IAM role {name} failed", exc) from None
    return [name]
