"""Before anything is created or uploaded: the caller's permissions (simulated), the Service
Quotas value for the instance type, and the cost bound. A dry run says what it cannot check."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workshop.cloud import aws
from workshop.cloud.common import TAG_USER, code_of, say
from workshop.cloud.cost import CostEstimate, estimate_cost
from workshop.cloud.network import (
    DEFAULT_CIDR,
    INTERFACE_ENDPOINTS,
    find_network,
    network_hourly_usd,
)
from workshop.cloud.prices import INSTANCE_PRICES
from workshop.cloud.role import role_name, sdk_session
from workshop.errors import WorkshopError

# What the caller needs to run a job (the job's own needs are the role's policy), simulated
# against the resources the job really uses: a policy scoped to, say, the SageMaker bucket
# would show as a false "implicitDeny" if simulated against "*".
NETWORK_ACTIONS = (
    "ec2:CreateVpc", "ec2:CreateSubnet", "ec2:CreateSecurityGroup", "ec2:AuthorizeSecurityGroupIngress",
    "ec2:CreateRouteTable", "ec2:CreateVpcEndpoint", "ec2:CreateTags", "ec2:DescribeVpcs",
)


NAT_ACTIONS = ("ec2:CreateNatGateway", "ec2:AllocateAddress", "ec2:CreateInternetGateway", "ec2:CreateRoute")


ROLE_ACTIONS = ("iam:CreateRole", "iam:PutRolePolicy", "iam:TagRole", "iam:GetRole")


# A tuning job's own actions (its trials are training jobs: the job checks cover them).
TUNING_ACTIONS = (
    "sagemaker:CreateHyperParameterTuningJob", "sagemaker:DescribeHyperParameterTuningJob",
    "sagemaker:ListTrainingJobsForHyperParameterTuningJob", "sagemaker:StopHyperParameterTuningJob",
)


# What IAM sees when CreateTrainingJob passes the role. Administrators (and the SDK's own
# policies) allow iam:PassRole only under this condition, which a simulation without the key
# would not apply: the caller would be told, wrongly, that PassRole is missing.
PASS_ROLE_CONTEXT = [
    {"ContextKeyName": "iam:PassedToService", "ContextKeyValues": ["sagemaker.amazonaws.com"], "ContextKeyType": "string"}
]


def job_permission_checks(
    *, region: str, account: str, partition: str, base_job_name: str, user: str | None = None,
    bucket: str | None = None, key_prefix: str = "",
) -> list[tuple[tuple[str, ...], str | None]]:
    """(actions, resource ARN) groups a caller needs to start and follow a workshop job, in the
    bucket and under the key prefix the SDK will use (default: `sagemaker-<region>-<account>`,
    no prefix; `preflight` passes the SDK session's)."""
    bucket = bucket or f"sagemaker-{region}-{account}"
    data_prefix = aws.s3_key(key_prefix, aws.WORKSHOP_NAME, user or aws.user_prefix(), "data")
    logs = f"arn:{partition}:logs:{region}:{account}:log-group:/aws/sagemaker/TrainingJobs:log-stream:{base_job_name}-x"
    return [
        (("sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:AddTags"),
         f"arn:{partition}:sagemaker:{region}:{account}:training-job/{base_job_name}-x"),
        (("s3:PutObject", "s3:GetObject"), f"arn:{partition}:s3:::{bucket}/{data_prefix}/x"),
        (("s3:ListBucket",), f"arn:{partition}:s3:::{bucket}"),
        (("logs:GetLogEvents",), logs),
    ]


def _principal(iam: Any, caller_arn: str) -> str | None:
    """The IAM principal to simulate for the caller's STS identity (None: cannot simulate)."""
    parts = caller_arn.split(":", 5)
    if len(parts) < 6:
        return None
    partition, service, account, resource = parts[1], parts[2], parts[4], parts[5]
    if service == "iam" and resource.startswith("user/"):
        return caller_arn
    if service == "sts" and resource.startswith("assumed-role/"):
        name = resource.split("/")[1]
        try:
            return iam.get_role(RoleName=name)["Role"]["Arn"]  # with its path
        except Exception:  # noqa: BLE001 - no iam:GetRole: the path-less ARN is the best guess
            return f"arn:{partition}:iam::{account}:role/{name}"
    return None  # root, federated users: nothing to simulate


def check_permissions(iam: Any, caller_arn: str, role_arn: str,
                      checks: Sequence[tuple[Sequence[str], str | None]]) -> str:
    """Simulate the caller's policies for each (actions, resource ARN or None for "*") group,
    and iam:PassRole on `role_arn`.

    Raises a WorkshopError listing every denied action; returns a one-line status otherwise,
    also when the simulation itself is not possible (no permission to simulate, a fake AWS).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    principal = _principal(iam, caller_arn)
    if principal is None:
        return f"permissions: not simulated for {caller_arn} (root or federated identity)"
    groups = [*checks, (("iam:PassRole",), role_arn)]
    denied: list[str] = []
    try:
        for names, resource in groups:
            kwargs: dict[str, Any] = {"PolicySourceArn": principal, "ActionNames": list(names)}
            if resource:
                kwargs["ResourceArns"] = [resource]
            if "iam:PassRole" in names:
                kwargs["ContextEntries"] = PASS_ROLE_CONTEXT
            for page in iam.get_paginator("simulate_principal_policy").paginate(**kwargs):
                denied += [r["EvalActionName"] for r in page["EvaluationResults"] if r["EvalDecision"] != "allowed"]
    except NotImplementedError:  # moto in-process
        return "permissions: not simulated (iam:SimulatePrincipalPolicy is not available here)"
    except ClientError as exc:
        return f"permissions: not simulated ({code_of(exc) or exc}: you may lack iam:SimulatePrincipalPolicy)"
    except BotoCoreError as exc:
        return f"permissions: not simulated ({exc})"
    if denied:
        raise WorkshopError(
            f"{principal} is missing permissions the job needs: {', '.join(sorted(set(denied)))}.",
            "ask your administrator to allow these actions (iam:PassRole on "
            f"{role_arn}), or run on a SageMaker notebook instance whose role has them.",
        )
    count = sum(len(names) for names, _ in groups)
    return f"permissions: {principal} may pass the role and create the job ({count} actions simulated)"


def _training_quotas(sq: Any, spot: bool = False) -> dict[str, tuple[float, str]]:
    """Service Quotas of SageMaker: '<type> for training job usage' (with `spot`: '<type> for spot
    training job usage', a quota of its own) -> (value, quota code)."""
    suffix = " for spot training job usage" if spot else " for training job usage"
    out: dict[str, tuple[float, str]] = {}
    for page in sq.get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker"):
        for quota in page["Quotas"]:
            name = quota.get("QuotaName", "")
            if name.endswith(suffix) and (spot or " spot " not in name):
                out[name.split(" ")[0]] = (quota.get("Value", 0.0), quota.get("QuotaCode", ""))
    return out


def _cheaper_with_quota(
    quotas: dict[str, tuple[float, str]], instance_type: str, count: int,
    allowed: Callable[[str], bool] | None = None,
) -> list[str]:
    """Up to 3 other types whose quota allows `count`, cheapest first: GPU or CPU like
    `instance_type`, and, given `allowed` (the job plan's `allows`), only types the job's route
    and image can use (e.g. SMP: p4d/p4de/p5 only; a CUDA 13 image: no p3)."""
    gpu = instance_type.split(".")[1][:1] in ("g", "p")
    ok = [t for t, (v, _) in quotas.items() if v >= count and t != instance_type
          and (t.split(".")[1][:1] in ("g", "p")) == gpu and (allowed is None or allowed(t))]
    return sorted(ok, key=lambda t: (INSTANCE_PRICES[t].usd_per_hour if t in INSTANCE_PRICES else 1e9, t))[:3]


def check_quota(sq: Any, instance_type: str, count: int, region: str,
                allowed: Callable[[str], bool] | None = None, per_job: int | None = None, spot: bool = False) -> str:
    """The account's Service Quotas value for `instance_type` training instances.

    `allowed` (the job plan's `allows`): what an alternative instance type must satisfy, so a
    refusal never suggests a type the job's route or image cannot use. `per_job`: a tuning job's
    instances per trial, when `count` is that times the trials running at once."""
    from botocore.exceptions import BotoCoreError, ClientError

    kind = "spot training" if spot else "training"
    try:
        quotas = _training_quotas(sq, spot)
    except NotImplementedError:
        return "quota: not checked (Service Quotas is not available here)"
    except ClientError as exc:
        return f"quota: not checked ({code_of(exc) or exc}: you may lack servicequotas:ListServiceQuotas)"
    except BotoCoreError as exc:
        return f"quota: not checked ({exc})"
    if not quotas:
        return f"quota: not checked (Service Quotas listed no SageMaker {kind} quotas)"
    if instance_type not in quotas:
        offered = _cheaper_with_quota(quotas, instance_type, 1, allowed) or sorted(
            t for t in quotas if allowed is None or allowed(t))[:3]
        raise WorkshopError(
            f"{instance_type} is not offered for SageMaker {kind} in {region} (no {kind} quota for it).",
            f"choose another instance type, e.g. {', '.join(offered)}, or another region.",
        )
    value, code = quotas[instance_type]
    if value >= count:
        return f"quota: {instance_type} for {kind}: {value:g} (need {count})"
    smaller = _cheaper_with_quota(quotas, instance_type, count, allowed)
    alternatives = f" or use {', '.join(smaller)}, whose quota allows {count}" if smaller else ""
    what = "is zero" if value == 0 else f"is {value:g}"
    if per_job and per_job < count:  # a tuning job: fewer trials at once may fit
        fits = int(value) // per_job
        needs = f"the tuning job needs {count} ({count // per_job} trials at once x {per_job})"
        fewer = f", or run with parallel={fits} (CLI: --parallel {fits})" if fits >= 1 else ""
    else:
        needs = f"the job needs {count}"
        fewer = "" if value == 0 else f", or run with hosts={int(value)}"
    raise WorkshopError(
        f"Your account's quota for {instance_type} {kind} instances in {region} {what}; {needs}.",
        f"request an increase: aws service-quotas request-service-quota-increase --service-code sagemaker "
        f"--quota-code {code} --desired-value {count} --region {region}{alternatives}{fewer}.",
    )


def _network_exists(boto: Any) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return find_network(boto) is not None
    except (BotoCoreError, ClientError, WorkshopError):
        return False  # not readable, or not one network: checked as if it were to be created


@dataclass
class PreflightReport:
    identity: str | None
    role_arn: str
    permissions: str
    quota: str
    cost: CostEstimate

    def lines(self) -> list[str]:
        return [f"role: {self.role_arn}", self.permissions, self.quota, *self.cost.lines()]


def preflight(
    plan: Any,
    role_arn: str,
    session: Any = None,
    *,
    identity: str | None = None,
    network_egress: str | None = None,
    creating_role: bool = False,
    show: bool = True,
    tuning: Any = None,
) -> PreflightReport:
    """Permissions, quota and cost, before anything is created or uploaded.

    `plan` is a `workshop.jobs.JobPlan`. Raises WorkshopError for missing
    permissions, a too-small quota and an instance type the region lacks. `tuning`: a
    `workshop.jobs.tuning.TuningPlan` over `plan`: its permissions, its trials at once against
    the quota, every trial in the cost.
    """
    boto = aws.as_boto_session(session)
    identity = identity or aws.require_credentials(boto)
    partition, account = identity.split(":")[1], identity.split(":")[4]
    sm_session = sdk_session(session, boto)  # where the SDK will put the job's files
    checks = job_permission_checks(region=boto.region_name, account=account, partition=partition,
                                   base_job_name=plan.base_job_name, bucket=aws.sdk_bucket(sm_session),
                                   key_prefix=aws.sdk_key_prefix(sm_session))
    if network_egress:
        # A network that exists (the user's, or the one an event's stack made for them) is reused:
        # creating it needs no permission then, only a NAT gateway still to be added does.
        needed = (() if _network_exists(boto) else NETWORK_ACTIONS) + (NAT_ACTIONS if network_egress == "nat" else ())
        if needed:
            checks.append((needed, None))
    if creating_role:
        checks.append((ROLE_ACTIONS, f"arn:{partition}:iam::{account}:role/{role_name()}"))
    if tuning is not None:
        checks.append((TUNING_ACTIONS, f"arn:{partition}:sagemaker:{boto.region_name}:{account}:"
                                       f"hyper-parameter-tuning-job/{tuning.name}"))
    parallel = tuning.max_parallel if tuning is not None else 1
    report = PreflightReport(
        identity=identity,
        role_arn=role_arn,
        permissions=check_permissions(boto.client("iam"), identity, role_arn, checks),
        quota=check_quota(boto.client("service-quotas"), plan.instance_type, plan.instance_count * parallel,
                          boto.region_name, allowed=getattr(plan, "allows", None),
                          per_job=plan.instance_count if tuning is not None else None,
                          spot=bool(getattr(plan, "spot", False))),
        cost=estimate_cost(plan.instance_type, plan.instance_count, plan.max_run_s, lab_key=plan.lab.key,
                           network_egress=network_egress, trials=tuning.n_trials if tuning is not None else 1,
                           spot=bool(getattr(plan, "spot", False)), parallel=parallel),
    )
    if show:
        for line in report.lines():
            say(line)
    return report


def dry_run_lines(plan: Any, role_arn: str, network_egress: str | None, *, trials: int = 1,
                  parallel: int = 1) -> list[str]:
    """What a dry run can say without an account: the network and role it would use, the cost,
    and which checks need credentials."""
    if network_egress:
        out = [
            f"network: would create or reuse VPC {DEFAULT_CIDR} tagged {TAG_USER}={aws.user_prefix()}: one private "
            f"subnet in one AZ, a self-only security group, an S3 gateway endpoint, "
            + ("a NAT gateway" if network_egress == "nat" else "interface endpoints " + ", ".join(INTERFACE_ENDPOINTS))
            + f" (${network_hourly_usd(network_egress):.3f}/h while it exists); placeholder ids below",
        ]
    else:
        out = ["network: none (SageMaker's own network; pass network=True for the workshop VPC)"]
    out.append(f"role: {role_arn}")
    out += estimate_cost(plan.instance_type, plan.instance_count, plan.max_run_s, lab_key=plan.lab.key,
                         network_egress=network_egress, trials=trials, spot=bool(getattr(plan, "spot", False)),
                         parallel=parallel).lines()
    need = plan.instance_count * parallel
    out.append("preflight needing an account (skipped in a dry run): credentials (sts:GetCallerIdentity), "
               "the role (iam:GetRole), permissions (iam:SimulatePrincipalPolicy), "
               f"the {plan.instance_type} quota (Service Quotas; this needs {need})")
    return out
