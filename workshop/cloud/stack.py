"""The organizer's CloudFormation template for a room of attendees sharing one AWS account.

`python -m workshop event template --attendees 30 --repository URL > workshop-event.yaml` (see
`workshop.event`). For each attendee: a notebook instance (this repository as its default code
repository, the lifecycle configuration below), the role it runs as (`notebook_policy`: what an
attendee does from the notebook, scoped to their own jobs, role, S3 prefixes and logs), and their
SageMaker execution role, named and written exactly as `python -m workshop role` writes it
(`workshop.cloud.role.role_name`, `role_policy`: the same function, with CloudFormation's `Fn::Sub`
for the region, account and partition). Optionally each attendee's workshop network, the resources
`workshop.cloud.network.ensure_network` creates, with the same tags, so that a notebook's
`network=True` finds it and creates nothing. One lifecycle configuration runs the notebook-instance
scripts (`scripts/notebook-instance/`), variables first.

The names line up with what the workshop computes on the notebook instance: there the login is
`ec2-user`, so `workshop.cloud.aws.user_prefix()` reads the instance's name from
`/opt/ml/metadata/resource-metadata.json` and derives the user from it (`user_on_instance`), and
the role, job names, S3 prefixes and tags all follow from that user.

This module knows no lab: the job keys (for the role's S3 prefixes) and the scripts are given.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workshop.cloud import aws
from workshop.cloud.common import TAG_RESOURCE, TAG_STACK, workshop_tags
from workshop.cloud.network import DEFAULT_CIDR, INTERFACE_ENDPOINTS
from workshop.cloud.role import role_name, role_policy, s3_prefixes, trust_policy
from workshop.cloud.room import room_prefix
from workshop.errors import WorkshopError

# CloudFormation's limits (AWS CloudFormation User Guide, "Quotas"), checked before anything is written.
MAX_RESOURCES = 500
MAX_OUTPUTS = 200
# Each lifecycle script's Content, base64-encoded (AWS::SageMaker::NotebookInstanceLifecycleConfig).
LIFECYCLE_MAX_CHARS = 16384
# A template larger than this must be deployed from S3 (`aws cloudformation deploy --s3-bucket ...`).
TEMPLATE_BODY_MAX_BYTES = 51200
TEMPLATE_MAX_BYTES = 1_000_000  # from S3

DEFAULT_PLATFORM = "notebook-al2023-v1"  # Amazon Linux 2023, JupyterLab 4: the platform's current default
DEFAULT_NOTEBOOK_TYPE = "ml.t3.medium"  # 2 vCPUs, 4 GiB: `python -m workshop run all` peaks at 2.8 GiB
# The ML storage volume, the only storage a stop/start keeps. The environment and one run of every lab
# fit the platform's default 5 GB with 1.6 GB to spare (scripts/simulate_notebook_instance.sh); 20 GB
# leaves room for an attendee's further runs, checkpoints and profiler traces, for about USD 0.01 each
# over a three-hour event.
DEFAULT_VOLUME_GB = 20
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")  # notebook instance names
VARIABLE_PATTERN = re.compile(r"^WORKSHOP_[A-Z0-9_]+$")
NOTEBOOK_POLICY_NAME = "workshop-notebook"
# CloudFormation's values for what `role_policy` takes as plain strings; `Fn::Sub` fills them in.
REGION, ACCOUNT, PARTITION = "${AWS::Region}", "${AWS::AccountId}", "${AWS::Partition}"
DEFAULT_BUCKET = f"sagemaker-{REGION}-{ACCOUNT}"  # the SDK's default bucket, as the notebook's SDK names it
_PSEUDO = re.compile(r"\$\{AWS::[A-Za-z]+\}")


@dataclass(frozen=True)
class Attendee:
    number: int
    notebook_instance: str  # the instance's name
    user: str  # what `aws.user_prefix()` computes on that instance

    @property
    def logical(self) -> str:
        """The stem of this attendee's logical ids in the template, e.g. `Attendee07`."""
        return f"Attendee{self.number:02d}"


def user_on_instance(notebook_instance: str) -> str:
    """The user `aws.user_prefix()` computes on a notebook instance called `notebook_instance`
    (its login is `ec2-user`, so the instance's name from the resource metadata counts)."""
    return aws.short_user_name(aws.sanitize_name(notebook_instance, 256)) or "user"


def notebook_role_name(user: str) -> str:
    """The notebook instance's own role: after the workshop's name, a '.' (which no user prefix
    has, so it never equals `role_name` of another user), then `notebook-<user>`."""
    return f"{aws.WORKSHOP_NAME}.notebook-{user}"[:64]


def attendees(count: int, *, first: int = 1, name_prefix: str = "attendee") -> list[Attendee]:
    """`count` attendees numbered from `first`: notebook instances `<name_prefix>-01`, `-02`, ..."""
    if count < 1 or first < 1:
        raise WorkshopError(f"--attendees must be at least 1 and --first at least 1, got {count} and {first}.",
                            "pass e.g. --attendees 30.")
    width = max(2, len(str(first + count - 1)))
    out = []
    for number in range(first, first + count):
        name = f"{name_prefix}-{number:0{width}d}"
        if not NAME_PATTERN.match(name) or len(name) > 63:
            raise WorkshopError(f"{name!r} is not a notebook instance name (letters, digits and '-', at most 63).",
                                "pass --name-prefix with letters, digits and '-' only, e.g. --name-prefix attendee.")
        out.append(Attendee(number, name, user_on_instance(name)))
    users = [a.user for a in out]
    if len(set(users)) != len(users):
        raise WorkshopError("Two attendees would have the same workshop user name.", "pass a shorter --name-prefix.")
    return out


def sub(value: Any) -> Any:
    """`value` with every string that names a CloudFormation pseudo parameter (`${AWS::Region}`)
    as `{"Fn::Sub": ...}`, any other `${` escaped as `${!` (Fn::Sub's literal), recursively."""
    if isinstance(value, dict):
        return {k: sub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [sub(v) for v in value]
    if isinstance(value, str) and _PSEUDO.search(value):
        parts = _PSEUDO.split(value)
        names = _PSEUDO.findall(value)
        text = "".join(p.replace("${", "${!") + n for p, n in zip(parts, [*names, ""], strict=True))
        return {"Fn::Sub": text}
    return value


def notebook_policy(*, user: str, notebook_instance: str, job_keys: Sequence[str], region: str = REGION,
                    account: str = ACCOUNT, partition: str = PARTITION, bucket: str = DEFAULT_BUCKET,
                    key_prefix: str = "") -> dict[str, Any]:
    """What an attendee does from their notebook, and nothing of another attendee's: start, follow
    and stop their own training and tuning jobs (names `<user>-...`, as every workshop job's name
    starts: `workshop.jobs.plan_job`), pass their own execution role to SageMaker, read and write
    their S3 prefixes (those the execution role has, `s3_prefixes`) and read the room's data, read
    their jobs' logs, simulate their own permissions and read Service Quotas (the preflight), and
    read the network (an event's stack makes the network; attendees create none). No `*` action;
    `*` resources only for actions AWS gives no resource type (List*, Describe*).

    Job names are matched as `<user>-*`: another user whose name is `<user>-<more>` would match, so
    an event's attendees get names that are not such prefixes of each other (`attendees`)."""
    arn = f"arn:{partition}"
    execution_role = f"{arn}:iam::{account}:role/{role_name(user)}"
    own_role = f"{arn}:iam::{account}:role/{notebook_role_name(user)}"
    sagemaker = f"{arn}:sagemaker:{region}:{account}"
    bucket_arn = f"{arn}:s3:::{bucket}"
    prefixes = s3_prefixes(job_keys, user, key_prefix)
    room = room_prefix(key_prefix)
    log_group = f"{arn}:logs:{region}:{account}:log-group:/aws/sagemaker/TrainingJobs"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "OwnJobs",
                "Effect": "Allow",
                "Action": [
                    "sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob",
                    "sagemaker:CreateHyperParameterTuningJob", "sagemaker:DescribeHyperParameterTuningJob",
                    "sagemaker:StopHyperParameterTuningJob", "sagemaker:ListTrainingJobsForHyperParameterTuningJob",
                    "sagemaker:AddTags", "sagemaker:ListTags",
                ],
                "Resource": [f"{sagemaker}:training-job/{user}-*", f"{sagemaker}:hyper-parameter-tuning-job/{user}-*"],
            },
            {
                "Sid": "ListJobs",  # cleanup lists running jobs, then reads each one's tags (above)
                "Effect": "Allow",
                "Action": ["sagemaker:ListTrainingJobs", "sagemaker:ListHyperParameterTuningJobs"],
                "Resource": "*",  # no resource type
            },
            {
                "Sid": "OwnNotebook",  # the SDK's execution-role look-up reads it
                "Effect": "Allow",
                "Action": ["sagemaker:DescribeNotebookInstance"],
                "Resource": [f"{sagemaker}:notebook-instance/{notebook_instance.lower()}"],
            },
            {
                "Sid": "PassOwnExecutionRole",
                "Effect": "Allow",
                "Action": ["iam:PassRole"],
                "Resource": [execution_role],
                "Condition": {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            },
            {
                "Sid": "ReadOwnRoles",  # the role look-up, cleanup's tag check, the preflight's and SDK's simulations
                "Effect": "Allow",
                "Action": ["iam:GetRole", "iam:ListRoleTags", "iam:SimulatePrincipalPolicy"],
                "Resource": [execution_role, own_role],
            },
            {
                "Sid": "OwnObjects",
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
                "Sid": "Listing",
                "Effect": "Allow",
                "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
                "Resource": [bucket_arn],
                # IfExists: the SDK checks the bucket with HeadBucket, which has no prefix; listing
                # shows names only, and names within a prefix only where one is given.
                "Condition": {"StringLikeIfExists": {"s3:prefix": [f"{p}*" for p in [*prefixes, room]] + [""]}},
            },
            {
                "Sid": "DefaultBucket",  # the SDK creates its default bucket if the organizer has not
                "Effect": "Allow",
                "Action": ["s3:CreateBucket"],
                "Resource": [bucket_arn],
            },
            {
                "Sid": "FindBuckets",  # the SDK's default-bucket check reads the bucket list
                "Effect": "Allow",
                "Action": ["s3:ListAllMyBuckets"],
                "Resource": "*",  # no resource type
            },
            {
                "Sid": "OwnLogs",
                "Effect": "Allow",
                "Action": ["logs:GetLogEvents"],
                "Resource": [f"{log_group}:log-stream:{user}-*"],
            },
            {
                "Sid": "FindLogs",
                "Effect": "Allow",
                "Action": ["logs:DescribeLogStreams"],
                "Resource": [log_group, f"{log_group}:*"],
            },
            {
                "Sid": "Quotas",  # the preflight's quota check
                "Effect": "Allow",
                "Action": ["servicequotas:ListServiceQuotas"],
                "Resource": "*",  # no resource type
            },
            {
                "Sid": "ReadNetwork",  # network=True finds the network the event's stack made
                "Effect": "Allow",
                "Action": [
                    "ec2:DescribeVpcs", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:DescribeRouteTables",
                    "ec2:DescribeVpcEndpoints", "ec2:DescribeNatGateways", "ec2:DescribeInternetGateways",
                    "ec2:DescribeAddresses", "ec2:DescribeAvailabilityZones",
                ],
                "Resource": "*",  # no resource type
            },
        ],
    }


def lifecycle_content(script: str, variables: Mapping[str, str], what: str) -> str:
    """`script` as a lifecycle configuration's Content: `export NAME=value` lines for `variables`
    after its `#!` line (a bash one if it has none), base64-encoded; refused over the limit."""
    for name in variables:
        if not VARIABLE_PATTERN.match(name):
            raise WorkshopError(f"Lifecycle variable {name!r} is not WORKSHOP_ plus capitals.",
                                "name it like WORKSHOP_WHEELHOUSE.")
    lines = script.splitlines(keepends=True)
    shebang = lines[0] if lines and lines[0].startswith("#!") else "#!/bin/bash\n"
    body = lines[1:] if lines and lines[0].startswith("#!") else lines
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())
    content = base64.b64encode((shebang + exports + "".join(body)).encode()).decode()
    if len(content) > LIFECYCLE_MAX_CHARS:
        raise WorkshopError(
            f"The {what} lifecycle script is {len(content):,} characters base64-encoded, over CloudFormation's "
            f"{LIFECYCLE_MAX_CHARS:,} for a lifecycle configuration.",
            "shorten the script (long work belongs in a script of the checkout it runs in the background).",
        )
    return content


def _tags(user: str, resource: str, name: bool = False) -> list[dict[str, Any]]:
    extra = {TAG_RESOURCE: resource, **({"Name": f"{aws.WORKSHOP_NAME}-{user}-{resource}"} if name else {})}
    return [*workshop_tags(user, **extra), {"Key": TAG_STACK, "Value": {"Ref": "AWS::StackName"}}]


def _vpc_blocks(count: int) -> list[ipaddress.IPv4Network]:
    """A /16 each, in the order `ensure_network` picks free blocks: its default, then 10.80-10.249."""
    blocks = [ipaddress.ip_network(DEFAULT_CIDR)]
    blocks += [b for b in (ipaddress.ip_network(f"10.{i}.0.0/16") for i in range(80, 250)) if b != blocks[0]]
    if count > len(blocks):
        raise WorkshopError(f"{count} attendee networks need {count} /16 blocks; 10.80-10.249 has {len(blocks)}.",
                            "give fewer attendees a network per stack (--attendees, --first).")
    return blocks[:count]


def _network(a: Attendee, block: ipaddress.IPv4Network) -> dict[str, Any]:
    """The attendee's workshop network as `ensure_network(egress="endpoints")` builds it: one VPC, one
    private subnet in one AZ, its route table, a security group admitting only itself, an S3 gateway
    endpoint and the interface endpoints; each piece with the tags `ensure_network` finds it by."""
    ref = lambda kind: {"Ref": f"{a.logical}{kind}"}  # noqa: E731
    subnet = next(block.subnets(new_prefix=min(28, block.prefixlen + 4)))  # ensure_network's first block
    out: dict[str, Any] = {
        f"{a.logical}Vpc": {"Type": "AWS::EC2::VPC", "Properties": {
            "CidrBlock": str(block), "EnableDnsSupport": True, "EnableDnsHostnames": True,
            "Tags": _tags(a.user, "vpc", name=True)}},
        f"{a.logical}Subnet": {"Type": "AWS::EC2::Subnet", "Properties": {
            "VpcId": ref("Vpc"), "CidrBlock": str(subnet),
            "AvailabilityZone": {"Fn::Select": [0, {"Fn::GetAZs": ""}]},
            "Tags": _tags(a.user, "private-subnet", name=True)}},
        f"{a.logical}RouteTable": {"Type": "AWS::EC2::RouteTable", "Properties": {
            "VpcId": ref("Vpc"), "Tags": _tags(a.user, "private-rt", name=True)}},
        f"{a.logical}SubnetRoutes": {"Type": "AWS::EC2::SubnetRouteTableAssociation", "Properties": {
            "SubnetId": ref("Subnet"), "RouteTableId": ref("RouteTable")}},
        f"{a.logical}SecurityGroup": {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupName": f"{aws.WORKSHOP_NAME}-{a.user}", "VpcId": ref("Vpc"),
            "GroupDescription": "distributed-training-workshop: all traffic between the hosts of a job, nothing else",
            "Tags": _tags(a.user, "security-group", name=True)}},
        # Self-referencing: every member may reach every other on every port; nothing from outside.
        f"{a.logical}SecurityGroupSelf": {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {
            "GroupId": ref("SecurityGroup"), "IpProtocol": "-1", "SourceSecurityGroupId": ref("SecurityGroup"),
            "Description": "the hosts of a job, and the interface endpoints"}},
        f"{a.logical}S3Endpoint": {"Type": "AWS::EC2::VPCEndpoint", "Properties": {
            "VpcEndpointType": "Gateway", "VpcId": ref("Vpc"),
            "ServiceName": {"Fn::Sub": "com.amazonaws.${AWS::Region}.s3"}, "RouteTableIds": [ref("RouteTable")],
            "Tags": _tags(a.user, "s3-endpoint", name=True)}},
    }
    for service in INTERFACE_ENDPOINTS:
        logical = f"{a.logical}Endpoint" + "".join(p.capitalize() for p in service.split("."))
        out[logical] = {"Type": "AWS::EC2::VPCEndpoint", "Properties": {
            "VpcEndpointType": "Interface", "VpcId": ref("Vpc"),
            "ServiceName": {"Fn::Sub": f"com.amazonaws.${{AWS::Region}}.{service}"},
            "SubnetIds": [ref("Subnet")], "SecurityGroupIds": [ref("SecurityGroup")], "PrivateDnsEnabled": True,
            "Tags": _tags(a.user, f"endpoint-{service}", name=True)}}
    return out


def _role(name: str, description: str, policy_name: str, policy: dict[str, Any], tags: list[dict[str, Any]],
          account: str | None) -> dict[str, Any]:
    return {"Type": "AWS::IAM::Role", "Properties": {
        "RoleName": name, "Description": description, "MaxSessionDuration": 3600,
        "AssumeRolePolicyDocument": sub(trust_policy(account=account)),
        "Policies": [{"PolicyName": policy_name, "PolicyDocument": sub(policy)}],
        "Tags": tags}}


def template(
    people: Sequence[Attendee],
    *,
    job_keys: Sequence[str],
    repository: str,
    on_create: str,
    on_start: str,
    variables: Mapping[str, str] | None = None,
    instance_type: str = DEFAULT_NOTEBOOK_TYPE,
    volume_gb: int = DEFAULT_VOLUME_GB,
    platform: str = DEFAULT_PLATFORM,
    with_network: bool = False,
) -> dict[str, Any]:
    """The template, as a dict (see the module docstring). Refuses, naming the fix, what CloudFormation
    or SageMaker would refuse at deploy time: too many resources or outputs, a lifecycle script over the
    limit, a repository that is not an https URL, a volume under 5 GB."""
    if not re.match(r"^https://[^/]+/.+", repository or ""):
        raise WorkshopError(f"The default code repository must be an https URL, got {repository!r}.",
                            "pass --repository https://github.com/<owner>/<repository>.git (a public one, or one "
                            "the notebook instances can clone).")
    if not 5 <= volume_gb <= 16384:
        raise WorkshopError(f"--volume-gb must be 5 to 16384, got {volume_gb}.",
                            f"pass e.g. --volume-gb {DEFAULT_VOLUME_GB}.")
    variables = dict(variables or {})
    resources: dict[str, Any] = {
        "LifecycleConfig": {"Type": "AWS::SageMaker::NotebookInstanceLifecycleConfig", "Properties": {
            "OnCreate": [{"Content": lifecycle_content(on_create, variables, "on-create")}],
            "OnStart": [{"Content": lifecycle_content(on_start, variables, "on-start")}],
        }},
    }
    outputs: dict[str, Any] = {}
    blocks = _vpc_blocks(len(people)) if with_network else []
    for i, a in enumerate(people):
        execution = role_policy(region=REGION, account=ACCOUNT, bucket=DEFAULT_BUCKET, job_keys=job_keys,
                                user=a.user, partition=PARTITION, key_prefix="")
        resources[f"{a.logical}ExecutionRole"] = _role(
            role_name(a.user), "distributed-training-workshop: SageMaker training jobs (least privilege)",
            "workshop-training", execution, _tags(a.user, "execution-role"), account=ACCOUNT)
        resources[f"{a.logical}NotebookRole"] = _role(
            notebook_role_name(a.user), f"distributed-training-workshop: notebook instance {a.notebook_instance}",
            NOTEBOOK_POLICY_NAME, notebook_policy(user=a.user, notebook_instance=a.notebook_instance, job_keys=job_keys),
            _tags(a.user, "notebook-role"), account=None)
        resources[f"{a.logical}Notebook"] = {"Type": "AWS::SageMaker::NotebookInstance", "Properties": {
            "NotebookInstanceName": a.notebook_instance,
            "InstanceType": instance_type,
            "VolumeSizeInGB": volume_gb,
            "PlatformIdentifier": platform,
            "RoleArn": {"Fn::GetAtt": [f"{a.logical}NotebookRole", "Arn"]},
            "LifecycleConfigName": {"Fn::GetAtt": ["LifecycleConfig", "NotebookInstanceLifecycleConfigName"]},
            "DefaultCodeRepository": repository,
            "DirectInternetAccess": "Enabled",  # the set-up installs from PyPI; the jobs' network is separate
            "Tags": _tags(a.user, "notebook-instance"),
        }}
        if with_network:
            resources.update(_network(a, blocks[i]))
        outputs[f"{a.logical}Notebook"] = {
            "Description": f"attendee {a.number}: notebook instance {a.notebook_instance} (workshop user {a.user}); "
                           "open it signed in to the console",
            "Value": {"Fn::Sub": "https://${AWS::Region}.console.aws.amazon.com/sagemaker/home?region=${AWS::Region}"
                                 f"#/notebook-instances/openNotebook/${{{a.logical}Notebook.NotebookInstanceName}}?view=lab"},
        }
    if len(resources) > MAX_RESOURCES or len(outputs) > MAX_OUTPUTS:
        per = (len(resources) - 1) // len(people)
        fits = min((MAX_RESOURCES - 1) // per, MAX_OUTPUTS)
        raise WorkshopError(
            f"{len(people)} attendees make {len(resources)} resources and {len(outputs)} outputs; one CloudFormation "
            f"stack holds at most {MAX_RESOURCES} and {MAX_OUTPUTS}.",
            f"split the room into stacks of at most {fits} attendees: e.g. --attendees {fits} --first 1, then "
            f"--attendees {fits} --first {fits + 1}, each its own stack.",
        )
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": f"distributed-training-workshop: {len(people)} attendee(s), notebook instances {people[0].notebook_instance}"
                       f" to {people[-1].notebook_instance} ({instance_type}, {volume_gb} GB), their roles"
                       + (" and workshop networks" if with_network else "")
                       + ". Generated by `python -m workshop event template`; delete with `python -m workshop event cleanup`.",
        "Resources": resources,
        "Outputs": outputs,
    }


def check_size(text: str, people: int) -> None:
    """Refuse a template over CloudFormation's 1 MB (from S3), naming how many attendees fit a stack."""
    size = len(text.encode())
    if size > TEMPLATE_MAX_BYTES:
        fits = people * TEMPLATE_MAX_BYTES // size
        raise WorkshopError(
            f"The template for {people} attendees is {size:,} bytes; CloudFormation takes at most {TEMPLATE_MAX_BYTES:,}.",
            f"split the room into stacks of at most {fits} attendees: e.g. --attendees {fits} --first 1, then "
            f"--attendees {fits} --first {fits + 1}, each its own stack.",
        )


def to_yaml(document: Mapping[str, Any]) -> str:
    """The template as YAML, in the order it was built (long-form intrinsic functions, no tags)."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # repeated tag lists stay written out, not anchored
            return True

    return yaml.dump(json.loads(json.dumps(document)), Dumper=_Dumper, sort_keys=False, width=120,
                     default_flow_style=False)
