"""workshop.cloud and the SageMaker job against the stricter fake AWS: moto plus
`tests/fake_aws_apis.py` (IAM's policy simulator and StopTrainingJob), with the SDK's own role
validation left on, as it is on a real account.

- The workshop's role passes the SDK's role check (issue 11, defect 1), and a role that lacks a
  smoke-test action is refused with the fix named.
- The preflight's simulation of the caller finds a missing permission.
- Two attendees in one account never touch each other's network, role, S3 objects or jobs
  (defect 2).
- The role policy, cleanup and the preflight follow the bucket and key prefix the SDK really
  uses, from the user's SDK config (defect 6, in part).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import boto3
import fake_aws_apis
import pytest

from workshop import account, cloud
from workshop import jobs as sj
from workshop.cloud import aws
from workshop.datasets import mnist
from workshop.errors import WorkshopError
from workshop.labs import get_lab

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's
USER = "alice"
# A custom image: these tests are about IAM, S3 and names, not about which framework image a lab uses.
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/workshop-test:1"


@pytest.fixture
def aws_user() -> str:
    return USER


@pytest.fixture
def boto(strict_moto_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """moto with the simulator, credentials and a region; no SAGEMAKER_VALIDATE_ROLE anywhere."""
    monkeypatch.setattr(cloud.network, "POLL_S", 0.01)
    return strict_moto_session


def _trainer(role_arn: str, **kwargs: Any) -> Any:
    return sj.build_trainer(get_lab("data_parallel"), hyperparameters={"epochs": 1}, role=role_arn, region=REGION,
                            instance_type="ml.m5.xlarge", instance_count=2, image_uri=IMAGE, **kwargs)


# --------------------------------------------------------------------------- defect 1: the role


def test_the_workshop_role_passes_the_sdks_own_role_validation(boto: Any) -> None:
    from sagemaker.core.helper import iam_role_resolver

    role = account.ensure_role(boto)
    assert os.environ.get("SAGEMAKER_VALIDATE_ROLE") is None  # the SDK validates, as on a real account
    # The SDK's own verdict on its smoke-test actions, simulated without resources or context.
    assert iam_role_resolver._evaluate_permissions(boto.client("iam"), role.arn, "training") == (True, [])
    trainer = _trainer(role.arn)
    assert trainer.role == role.arn
    # Still least privilege.
    policy = boto.client("iam").get_role_policy(RoleName=role.name, PolicyName="workshop-training")["PolicyDocument"]
    assert cloud.wildcard_violations(policy) == []
    metrics = [st for st in policy["Statement"] if "cloudwatch:PutMetricData" in st["Action"]]
    assert metrics == [{"Sid": "TrainingMetrics", "Effect": "Allow", "Action": ["cloudwatch:PutMetricData"], "Resource": "*"}]


def test_a_role_missing_a_smoke_test_action_is_refused_with_the_fix(boto: Any) -> None:
    iam = boto.client("iam")
    role = account.ensure_role(boto)
    policy = iam.get_role_policy(RoleName=role.name, PolicyName="workshop-training")["PolicyDocument"]
    for statement in policy["Statement"]:
        if "ec2:DescribeSubnets" in statement["Action"]:
            statement["Action"].remove("ec2:DescribeSubnets")
    iam.put_role_policy(RoleName=role.name, PolicyName="workshop-training", PolicyDocument=json.dumps(policy))
    with pytest.raises(WorkshopError, match="Missing permissions: ec2:DescribeSubnets") as info:
        _trainer(role.arn)
    assert role.arn in info.value.message
    assert "python -m workshop role" in info.value.fix and "SAGEMAKER_VALIDATE_ROLE=false" in info.value.fix
    # The fix works: ensure_role rewrites the policy.
    account.ensure_role(boto)
    assert _trainer(role.arn).role == role.arn


def _attendee(boto: Any) -> Any:
    """A boto3 session of a new IAM user `attendee` (moto answers its STS identity)."""
    iam = boto.client("iam")
    iam.create_user(UserName="attendee")
    key = iam.create_access_key(UserName="attendee")["AccessKey"]
    return boto3.Session(region_name=REGION, aws_access_key_id=key["AccessKeyId"],
                         aws_secret_access_key=key["SecretAccessKey"])


def _grant(boto: Any, statements: list[dict[str, Any]]) -> None:
    boto.client("iam").put_user_policy(UserName="attendee", PolicyName="workshop-attendee", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": statements}))


def test_preflight_simulates_the_callers_permissions_and_reports_what_is_missing(boto: Any) -> None:
    role = account.ensure_role(boto)
    plan = sj.plan_job(get_lab("data_parallel"), hyperparameters={}, region=REGION,
                       instance_type="ml.m5.xlarge", instance_count=2, image_uri=IMAGE)
    bucket = f"arn:aws:s3:::sagemaker-{REGION}-{ACCOUNT}"
    statements = [
        {"Effect": "Allow", "Action": ["sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:AddTags"],
         "Resource": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{plan.base_job_name}-*"},
        {"Effect": "Allow", "Action": ["s3:PutObject", "s3:GetObject"], "Resource": f"{bucket}/*"},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket},
        {"Effect": "Allow", "Action": "logs:GetLogEvents", "Resource": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/*"},
    ]
    caller = _attendee(boto)
    _grant(boto, statements)
    assert aws.require_credentials(caller) == f"arn:aws:iam::{ACCOUNT}:user/attendee"
    with pytest.raises(WorkshopError, match=r"user/attendee is missing permissions the job needs: iam:PassRole\.") as info:
        cloud.preflight(plan, role.arn, caller, show=False)
    assert role.arn in info.value.fix
    # PassRole as administrators (and the SDK's own policies) write it: only to SageMaker. The
    # request that passes the role carries iam:PassedToService, so the simulation must too.
    pass_role = {"Effect": "Allow", "Action": "iam:PassRole", "Resource": role.arn,
                 "Condition": {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}}
    _grant(boto, [*statements, pass_role])
    report = cloud.preflight(plan, role.arn, caller, show=False)
    assert "may pass the role and create the job (8 actions simulated)" in report.permissions
    pass_role["Condition"]["StringEquals"]["iam:PassedToService"] = "ec2.amazonaws.com"
    _grant(boto, [*statements, pass_role])
    with pytest.raises(WorkshopError, match=r"missing permissions the job needs: iam:PassRole\."):
        cloud.preflight(plan, role.arn, caller, show=False)
    # A scoped resource is simulated against the job's real resources, not "*".
    _grant(boto, [statements[0], *statements[2:], pass_role | {"Condition": {}}])
    with pytest.raises(WorkshopError, match=r"needs: s3:GetObject, s3:PutObject\."):
        cloud.preflight(plan, role.arn, caller, show=False)


# --------------------------------------------------------------------------- defect 2: attendees


def test_user_prefixes_of_names_sharing_a_long_prefix_stay_distinct(monkeypatch: pytest.MonkeyPatch,
                                                                   no_aws: None) -> None:
    def prefix(name: str) -> str:
        monkeypatch.setenv(aws.USER_ENV, name)
        return aws.user_prefix()

    names = [f"workshop-participant-{n:02d}" for n in range(1, 101)]
    prefixes = [prefix(n) for n in names]
    assert len(set(prefixes)) == len(names)  # a hundred attendees, a hundred identities
    assert all(len(p) <= aws.USER_PREFIX_MAX for p in prefixes)
    assert prefix("workshop-participant-01") == prefixes[0]  # stable
    assert prefixes[0].startswith("workshop-")  # what a person sees starts like their name
    # Short names are kept as they are; the longest base job name still fits SageMaker's 63.
    assert prefix("Alice Example") == "alice-example" and prefix("attendee-07") == "attendee-07"
    assert prefix("sixteen-chars-ok") == "sixteen-chars-ok"
    longest_lab = max(len(key) for key in __import__("workshop.labs", fromlist=["LABS"]).LABS)
    assert len(f"{prefixes[0]}-{longest_lab * 'x'}-20261123000000") <= 63


def _running_job(boto: Any, plan: Any, name: str) -> str:
    """A training job tagged as the workshop tags its jobs, InProgress (moto ends jobs at once)."""
    boto.client("sagemaker").create_training_job(
        TrainingJobName=name,
        AlgorithmSpecification={"TrainingImage": plan.image_uri, "TrainingInputMode": "File"},
        RoleArn=f"arn:aws:iam::{ACCOUNT}:role/{cloud.role_name()}",
        OutputDataConfig={"S3OutputPath": f"s3://sagemaker-{REGION}-{ACCOUNT}/{plan.base_job_name}"},
        ResourceConfig={"InstanceType": plan.instance_type, "InstanceCount": plan.instance_count, "VolumeSizeInGB": 30},
        StoppingCondition={"MaxRuntimeInSeconds": plan.max_run_s},
        Tags=plan.tags,
    )
    fake_aws_apis.set_training_job_status(name, "InProgress", region=REGION, account=ACCOUNT)
    return name


def _ec2_of(boto: Any, user: str) -> list[str]:
    """Every EC2 resource tagged as this user's."""
    ec2 = boto.client("ec2")
    mine = [{"Name": f"tag:{cloud.TAG_USER}", "Values": [user]}]
    found = [v["VpcId"] for v in ec2.describe_vpcs(Filters=mine)["Vpcs"]]
    found += [s["SubnetId"] for s in ec2.describe_subnets(Filters=mine)["Subnets"]]
    found += [g["GroupId"] for g in ec2.describe_security_groups(Filters=mine)["SecurityGroups"]]
    found += [r["RouteTableId"] for r in ec2.describe_route_tables(Filters=mine)["RouteTables"]]
    found += [e["VpcEndpointId"] for e in ec2.describe_vpc_endpoints(Filters=mine)["VpcEndpoints"]
              if e["State"].lower() != "deleted"]
    return sorted(found)


def test_one_attendees_cleanup_leaves_another_attendees_things_alone(boto: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    s3, sm, iam = boto.client("s3"), boto.client("sagemaker"), boto.client("iam")
    bucket = f"sagemaker-{REGION}-{ACCOUNT}"
    s3.create_bucket(Bucket=bucket)
    attendees: dict[str, dict[str, Any]] = {}
    for n, name in enumerate(("workshop-participant-01", "workshop-participant-02"), 1):
        monkeypatch.setenv(aws.USER_ENV, name)
        user = aws.user_prefix()
        net = cloud.ensure_network(boto)
        role = account.ensure_role(boto)
        plan = sj.plan_job(get_lab("data_parallel"), hyperparameters={}, region=REGION,
                           instance_type="ml.m5.xlarge", instance_count=2, image_uri=IMAGE)
        job = _running_job(boto, plan, f"{plan.base_job_name}-2026112300000{n}")
        keys = [f"{mnist.data_prefix()}/{channel}/mnist.npz" for channel in ("train", "test")]
        keys.append(f"{plan.base_job_name}/{job}/input/code/train.py")
        for key in keys:
            s3.put_object(Bucket=bucket, Key=key, Body=name.encode())
        attendees[name] = {"user": user, "vpc": net.vpc_id, "ec2": _ec2_of(boto, user), "role": role.name,
                           "keys": keys, "job": job}
    one, two = attendees.values()
    assert one["user"] != two["user"] and one["vpc"] != two["vpc"] and one["role"] != two["role"]
    assert not set(one["keys"]) & set(two["keys"])

    monkeypatch.setenv(aws.USER_ENV, "workshop-participant-01")
    report = account.cleanup(boto, delete_s3=True, show=False)

    # Attendee 1's things are gone ...
    assert report.stopped_jobs == [one["job"]]
    assert sm.describe_training_job(TrainingJobName=one["job"])["TrainingJobStatus"] == "Stopped"
    assert _ec2_of(boto, one["user"]) == [] and report.role == [one["role"]]
    assert report.s3_objects == len(one["keys"])
    # ... and attendee 2's are untouched: network, role and policy, S3 objects, running job.
    assert _ec2_of(boto, two["user"]) == two["ec2"] and two["vpc"] in two["ec2"]
    assert iam.get_role_policy(RoleName=two["role"], PolicyName="workshop-training")["PolicyDocument"]
    left = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))
    assert left == sorted(two["keys"])
    assert sm.describe_training_job(TrainingJobName=two["job"])["TrainingJobStatus"] == "InProgress"


# --------------------------------------------------------------------------- defect 6: the SDK's bucket and prefix

TEAM_BUCKET = "team-ml-artifacts"
TEAM_PREFIX = "teams/vision"
TEAM_SDK_CONFIG = f"""SchemaVersion: '1.0'
SageMaker:
  PythonSDK:
    Modules:
      Session:
        DefaultS3Bucket: {TEAM_BUCKET}
        DefaultS3ObjectKeyPrefix: {TEAM_PREFIX}
"""


def _decision(boto: Any, principal: str, action: str, resource: str, **context: str) -> str:
    entries = [{"ContextKeyName": k.replace("__", ":"), "ContextKeyValues": [v], "ContextKeyType": "string"}
               for k, v in context.items()]
    result = boto.client("iam").simulate_principal_policy(
        PolicySourceArn=principal, ActionNames=[action], ResourceArns=[resource], ContextEntries=entries)
    return result["EvaluationResults"][0]["EvalDecision"]


def test_role_preflight_and_cleanup_follow_the_bucket_and_prefix_the_sdk_uses(
        boto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "team-sdk-config.yaml"
    config.write_text(TEAM_SDK_CONFIG)
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(config))
    s3, sm = boto.client("s3"), boto.client("sagemaker")
    s3.create_bucket(Bucket=TEAM_BUCKET)
    role = account.ensure_role(boto)
    trainer = _trainer(role.arn)  # the SDK's role validation on
    assert mnist.data_prefix() == f"{TEAM_PREFIX}/{aws.WORKSHOP_NAME}/{USER}/data/mnist"
    from workshop.datasets import (
        corpus,  # lab 4's corpus sits under the same prefix, where the role reads
    )

    assert corpus.data_prefix() == f"{TEAM_PREFIX}/{aws.WORKSHOP_NAME}/{USER}/data/pydoc-corpus"
    assert any(corpus.data_prefix().startswith(p) for p in account.s3_prefixes())
    inputs = {c: f"s3://{TEAM_BUCKET}/{mnist.data_prefix()}/{c}" for c in ("train", "test")}
    for uri in inputs.values():
        s3.put_object(Bucket=TEAM_BUCKET, Key=f"{uri.split('/', 3)[3]}/mnist.npz", Body=b"x")
    others = [f"{TEAM_PREFIX}/someone-else-data-parallel/code/train.py", "outside-the-prefix.txt"]
    for key in others:
        s3.put_object(Bucket=TEAM_BUCKET, Key=key, Body=b"not yours")
    result = sj.submit(trainer, inputs, wait=False, logs=False)

    described = sm.describe_training_job(TrainingJobName=result.job_name)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=TEAM_BUCKET)["Contents"] if o["Key"] not in others)
    assert any(k.endswith("/input/code/train.py") for k in keys) and any(k.endswith("sm_train.sh") for k in keys)
    assert all(k.startswith(f"{TEAM_PREFIX}/") for k in keys)  # the SDK staged everything under the prefix
    # The role may read every object the job reads, at its real key ...
    for key in keys:
        assert _decision(boto, role.arn, "s3:GetObject", f"arn:aws:s3:::{TEAM_BUCKET}/{key}") == "allowed", key
    # ... list each channel's prefix, as SageMaker does to download it ...
    for channel in described["InputDataConfig"]:
        bucket, _, prefix = channel["DataSource"]["S3DataSource"]["S3Uri"][len("s3://"):].partition("/")
        assert bucket == TEAM_BUCKET
        assert _decision(boto, role.arn, "s3:ListBucket", f"arn:aws:s3:::{bucket}", s3__prefix=prefix) == "allowed", prefix
    # ... and write the model and checkpoints where the job says.
    output = described["OutputDataConfig"]["S3OutputPath"].rstrip("/")
    model = f"{output}/{result.job_name}/output/model.tar.gz"
    checkpoint = f"{described['CheckpointConfig']['S3Uri'].rstrip('/')}/step-1.pt"
    for uri in (model, checkpoint):
        assert uri.startswith(f"s3://{TEAM_BUCKET}/{TEAM_PREFIX}/")
        assert _decision(boto, role.arn, "s3:PutObject", f"arn:aws:s3:::{uri[len('s3://'):]}") == "allowed", uri
    # Nothing outside the user's prefixes, and not the bucket the SDK would use without the config.
    for outside in (f"{TEAM_BUCKET}/{others[0]}", f"{TEAM_BUCKET}/{others[1]}",
                    f"sagemaker-{REGION}-{ACCOUNT}/{mnist.data_prefix()}/train/mnist.npz"):
        assert _decision(boto, role.arn, "s3:GetObject", f"arn:aws:s3:::{outside}") == "implicitDeny", outside

    # The preflight simulates the caller against that bucket and prefix too: a caller allowed
    # exactly there passes.
    caller = _attendee(boto)
    _grant(boto, [
        {"Effect": "Allow", "Action": ["sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:AddTags",
                                       "logs:GetLogEvents"], "Resource": "*"},
        {"Effect": "Allow", "Action": ["s3:PutObject", "s3:GetObject"], "Resource": f"arn:aws:s3:::{TEAM_BUCKET}/{TEAM_PREFIX}/*"},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{TEAM_BUCKET}"},
        {"Effect": "Allow", "Action": "iam:PassRole", "Resource": role.arn},
    ])
    plan = sj.plan_job(get_lab("data_parallel"), hyperparameters={}, region=REGION,
                       instance_type="ml.m5.xlarge", instance_count=2, image_uri=IMAGE)
    assert "may pass the role" in cloud.preflight(plan, role.arn, caller, show=False).permissions

    # Cleanup deletes the user's objects there, and only those.
    report = account.cleanup(boto, delete_s3=True, show=False)
    assert report.s3_objects == len(keys)
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket=TEAM_BUCKET)["Contents"]) == sorted(others)
