"""tests/fake_aws_apis.py: IAM's policy simulator, SageMaker's StopTrainingJob, and the tuning-job APIs
(ListTrainingJobsForHyperParameterTuningJob, StopHyperParameterTuningJob), added to moto.

Every case goes through a real boto3 client, so the XML (IAM) and JSON (SageMaker) that the
fake writes are parsed by botocore against its own service models, as a real answer would be.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import fake_aws_apis
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's


@pytest.fixture
def aws_user() -> str:
    return "alice"


@pytest.fixture
def boto(strict_moto_session: Any) -> Any:
    """conftest's strict_moto_session: moto plus fake_aws_apis."""
    return strict_moto_session


def _doc(*statements: dict[str, Any]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)}, indent=2)


def _role(boto: Any, name: str, *statements: dict[str, Any]) -> str:
    iam = boto.client("iam")
    arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=_doc(
        {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ))["Role"]["Arn"]
    if statements:
        iam.put_role_policy(RoleName=name, PolicyName=f"{name}-inline", PolicyDocument=_doc(*statements))
    return arn


def _decisions(boto: Any, arn: str, actions: list[str], **kwargs: Any) -> dict[str, str]:
    results = boto.client("iam").simulate_principal_policy(PolicySourceArn=arn, ActionNames=actions, **kwargs)
    return {r["EvalActionName"]: r["EvalDecision"] for r in results["EvaluationResults"]}


def test_install_and_uninstall_are_idempotent() -> None:
    from moto.iam.responses import IamResponse
    from moto.sagemaker.responses import SageMakerResponse

    fake_aws_apis.uninstall()  # not installed: harmless
    fake_aws_apis.install()
    fake_aws_apis.install()
    assert fake_aws_apis.installed() and hasattr(IamResponse, "simulate_principal_policy")
    fake_aws_apis.uninstall()
    fake_aws_apis.uninstall()
    assert not fake_aws_apis.installed()
    assert not hasattr(IamResponse, "simulate_principal_policy")
    assert not hasattr(SageMakerResponse, "stop_training_job")  # moto as it was
    with mock_aws(), pytest.raises(NotImplementedError):
        boto3.client("iam", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x").simulate_custom_policy(
            PolicyInputList=[_doc({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"})], ActionNames=["s3:GetObject"])


# --------------------------------------------------------------------------- the evaluator


def test_allow_explicit_deny_and_implicit_deny(boto: Any) -> None:
    statements = (
        {"Sid": "Reads", "Effect": "Allow", "Action": ["ec2:Describe*", "ECR:GetAuthorizationToken"], "Resource": "*"},
        {"Sid": "NoVpcs", "Effect": "Deny", "Action": "ec2:DescribeVpcs", "Resource": "*"},
    )
    arn = _role(boto, "r1", *statements)
    assert _decisions(boto, arn, ["ec2:DescribeSubnets", "ec2:describedhcpoptions", "ecr:GetAuthorizationToken",
                                  "ec2:DescribeVpcs", "ec2:CreateVpc", "s3:GetObject"]) == {
        "ec2:DescribeSubnets": "allowed",  # a wildcard action
        "ec2:describedhcpoptions": "allowed",  # actions are case-insensitive
        "ecr:GetAuthorizationToken": "allowed",
        "ec2:DescribeVpcs": "explicitDeny",  # the Deny beats the Allow of ec2:Describe*
        "ec2:CreateVpc": "implicitDeny",
        "s3:GetObject": "implicitDeny",
    }
    # MatchedStatements: the deny alone for an explicit deny, with where it is in the document.
    result = boto.client("iam").simulate_principal_policy(PolicySourceArn=arn, ActionNames=["ec2:DescribeVpcs"])
    (matched,) = result["EvaluationResults"][0]["MatchedStatements"]
    assert matched["SourcePolicyId"] == "r1-inline" and matched["SourcePolicyType"] == "role"
    lines = _doc(*statements).splitlines()  # the text stored: the deny statement's braces
    first = next(n for n, line in enumerate(lines, 1) if '"NoVpcs"' in line) - 1
    last = next(n for n, line in enumerate(lines, 1) if n > first and line == "    }")
    assert lines[first - 1] == "    {"
    assert matched["StartPosition"] == {"Line": first, "Column": 5}
    assert matched["EndPosition"] == {"Line": last, "Column": 6}  # the column after the closing brace
    assert result["EvaluationResults"][0]["EvalResourceName"] == "*"
    assert result["IsTruncated"] is False


def test_not_action_and_not_resource(boto: Any) -> None:
    arn = _role(
        boto, "r2",
        {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "s3:DeleteObject", "NotResource": "arn:aws:s3:::scratch/*"},
    )
    assert _decisions(boto, arn, ["sqs:SendMessage", "iam:CreateRole", "IAM:PassRole"]) == {
        "sqs:SendMessage": "allowed", "iam:CreateRole": "implicitDeny", "IAM:PassRole": "implicitDeny",
    }
    deletes = boto.client("iam").simulate_principal_policy(
        PolicySourceArn=arn, ActionNames=["s3:DeleteObject"],
        ResourceArns=["arn:aws:s3:::scratch/tmp.txt", "arn:aws:s3:::precious/data.csv"],
    )["EvaluationResults"]
    assert [(r["EvalResourceName"], r["EvalDecision"]) for r in deletes] == [
        ("arn:aws:s3:::scratch/tmp.txt", "allowed"), ("arn:aws:s3:::precious/data.csv", "explicitDeny"),
    ]
    assert deletes[0]["ResourceSpecificResults"][0]["EvalResourceDecision"] == "allowed"


def test_a_resource_scoped_statement_does_not_match_star(boto: Any) -> None:
    arn = _role(boto, "r3", {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
                             "Resource": "arn:aws:s3:::bucket/team/*"})
    assert _decisions(boto, arn, ["s3:GetObject"]) == {"s3:GetObject": "implicitDeny"}  # no ResourceArns: "*"

    def on(resource: str) -> str:
        return _decisions(boto, arn, ["s3:PutObject"], ResourceArns=[resource])["s3:PutObject"]

    assert on("arn:aws:s3:::bucket/team/a/b.txt") == "allowed"
    assert on("arn:aws:s3:::bucket/other/b.txt") == "implicitDeny"
    assert on("arn:aws:s3:::bucket/*") == "implicitDeny"  # what ModelTrainer's staging check asks
    # ARN segments are matched one by one: a region wildcard does not swallow the account.
    logs = _role(boto, "r3b", {"Effect": "Allow", "Action": "logs:PutLogEvents",
                               "Resource": "arn:aws:logs:*:111122223333:log-group:/aws/sagemaker/*"})
    put = lambda r: _decisions(boto, logs, ["logs:PutLogEvents"], ResourceArns=[r])["logs:PutLogEvents"]  # noqa: E731
    assert put("arn:aws:logs:eu-west-1:111122223333:log-group:/aws/sagemaker/TrainingJobs:log-stream:j/algo-1") == "allowed"
    assert put("arn:aws:logs:eu-west-1:444455556666:log-group:/aws/sagemaker/TrainingJobs") == "implicitDeny"


def test_conditions(boto: Any) -> None:
    arn = _role(
        boto, "r4",
        {"Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*",
         "Condition": {"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/*"}}},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::bucket",
         "Condition": {"StringLike": {"s3:prefix": ["team/*", ""]}}},
        {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "*", "Condition": {"Bool": {"aws:SecureTransport": "true"}}},
        {"Effect": "Deny", "Action": "sqs:SendMessage", "Resource": "*", "Condition": {"Null": {"aws:SourceVpc": "true"}}},
        {"Effect": "Allow", "Action": "sns:Publish", "Resource": "*",
         "Condition": {"StringEqualsIfExists": {"aws:RequestedRegion": "us-east-1"}}},
        {"Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*",
         "Condition": {"ArnLike": {"aws:SourceArn": "arn:aws:sagemaker:*:123456789012:training-job/*"}}},
        {"Effect": "Allow", "Action": "sts:TagSession", "Resource": "*", "Condition": {"BinaryEquals": {"aws:k1": "QmluYXJ5"}}},
        {"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "*",
         "Condition": {"StringNotEquals": {"aws:PrincipalTag/team": "blocked"}}},
    )

    iam = boto.client("iam")
    # The condition key is absent: the statement does not apply, and the key is reported missing.
    (result,) = iam.simulate_principal_policy(PolicySourceArn=arn, ActionNames=["cloudwatch:PutMetricData"])["EvaluationResults"]
    assert result["EvalDecision"] == "implicitDeny" and result["MissingContextValues"] == ["cloudwatch:namespace"]
    # ... and with the key in ContextEntries it does.
    namespace = [{"ContextKeyName": "cloudwatch:namespace", "ContextKeyValues": ["/aws/sagemaker/TrainingJobs"],
                  "ContextKeyType": "string"}]
    assert _decisions(boto, arn, ["cloudwatch:PutMetricData"], ContextEntries=namespace) == {"cloudwatch:PutMetricData": "allowed"}
    namespace[0]["ContextKeyValues"] = ["MyApp"]
    assert _decisions(boto, arn, ["cloudwatch:PutMetricData"], ContextEntries=namespace) == {"cloudwatch:PutMetricData": "implicitDeny"}

    def listing(prefix: str) -> str:
        return _decisions(boto, arn, ["s3:ListBucket"], ResourceArns=["arn:aws:s3:::bucket"], ContextEntries=[
            {"ContextKeyName": "s3:prefix", "ContextKeyValues": [prefix], "ContextKeyType": "string"}])["s3:ListBucket"]

    assert listing("team/x/") == "allowed" and listing("") == "allowed" and listing("other/") == "implicitDeny"
    # Bool, and a Deny whose Null condition holds when the key is absent.
    secure = {"ContextKeyName": "aws:SecureTransport", "ContextKeyValues": ["true"], "ContextKeyType": "boolean"}
    vpc = {"ContextKeyName": "aws:SourceVpc", "ContextKeyValues": ["vpc-1"], "ContextKeyType": "string"}
    assert _decisions(boto, arn, ["sqs:SendMessage"], ContextEntries=[secure]) == {"sqs:SendMessage": "explicitDeny"}
    assert _decisions(boto, arn, ["sqs:SendMessage"], ContextEntries=[secure, vpc]) == {"sqs:SendMessage": "allowed"}
    # IfExists: absent is fine, present must match.
    assert _decisions(boto, arn, ["sns:Publish"]) == {"sns:Publish": "allowed"}
    region = {"ContextKeyName": "aws:RequestedRegion", "ContextKeyValues": ["eu-west-1"], "ContextKeyType": "string"}
    assert _decisions(boto, arn, ["sns:Publish"], ContextEntries=[region]) == {"sns:Publish": "implicitDeny"}
    # ArnLike.
    source = {"ContextKeyName": "aws:SourceArn", "ContextKeyValues": [f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-job/j-1"],
              "ContextKeyType": "string"}
    assert _decisions(boto, arn, ["kms:Decrypt"], ContextEntries=[source]) == {"kms:Decrypt": "allowed"}
    assert _decisions(boto, arn, ["kms:Decrypt"]) == {"kms:Decrypt": "implicitDeny"}
    # An operator the fake does not evaluate never allows.
    k = {"ContextKeyName": "aws:k1", "ContextKeyValues": ["QmluYXJ5"], "ContextKeyType": "binary"}
    assert _decisions(boto, arn, ["sts:TagSession"], ContextEntries=[k]) == {"sts:TagSession": "implicitDeny"}
    # A negated operator holds when the key is absent (IAM's rule), and fails on a match.
    assert _decisions(boto, arn, ["dynamodb:GetItem"]) == {"dynamodb:GetItem": "allowed"}
    tag = {"ContextKeyName": "aws:PrincipalTag/team", "ContextKeyValues": ["blocked"], "ContextKeyType": "string"}
    assert _decisions(boto, arn, ["dynamodb:GetItem"], ContextEntries=[tag]) == {"dynamodb:GetItem": "implicitDeny"}


def test_managed_policies_groups_and_boundaries(boto: Any) -> None:
    iam = boto.client("iam")
    managed = iam.create_policy(PolicyName="ReadTeamBucket", PolicyDocument=_doc(
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::team/*"}))["Policy"]["Arn"]
    arn = _role(boto, "r5")
    iam.attach_role_policy(RoleName="r5", PolicyArn=managed)
    result = iam.simulate_principal_policy(PolicySourceArn=arn, ActionNames=["s3:GetObject"],
                                           ResourceArns=["arn:aws:s3:::team/x"])["EvaluationResults"][0]
    assert result["EvalDecision"] == "allowed"
    assert result["MatchedStatements"][0]["SourcePolicyId"] == "ReadTeamBucket"
    assert result["MatchedStatements"][0]["SourcePolicyType"] == "user-managed"
    # A user's groups count too.
    iam.create_user(UserName="bob")
    iam.create_group(GroupName="readers")
    iam.add_user_to_group(GroupName="readers", UserName="bob")
    iam.attach_group_policy(GroupName="readers", PolicyArn=managed)
    iam.put_group_policy(GroupName="readers", PolicyName="no-deletes", PolicyDocument=_doc(
        {"Effect": "Deny", "Action": "s3:Delete*", "Resource": "*"}))
    iam.put_user_policy(UserName="bob", PolicyName="own", PolicyDocument=_doc(
        {"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::bob/*"}))
    bob = f"arn:aws:iam::{ACCOUNT}:user/bob"
    on = lambda action, r: _decisions(boto, bob, [action], ResourceArns=[r])[action]  # noqa: E731
    assert on("s3:GetObject", "arn:aws:s3:::team/x") == "allowed"
    assert on("s3:PutObject", "arn:aws:s3:::bob/x") == "allowed"
    assert on("s3:DeleteObject", "arn:aws:s3:::bob/x") == "explicitDeny"
    # A permissions boundary must allow the action too.
    boundary = iam.create_policy(PolicyName="OnlyS3", PolicyDocument=_doc(
        {"Effect": "Allow", "Action": "s3:PutObject", "Resource": "*"}))["Policy"]["Arn"]
    iam.put_role_permissions_boundary(RoleName="r5", PermissionsBoundary=boundary)
    result = iam.simulate_principal_policy(PolicySourceArn=arn, ActionNames=["s3:GetObject"],
                                           ResourceArns=["arn:aws:s3:::team/x"])["EvaluationResults"][0]
    assert result["EvalDecision"] == "implicitDeny"
    assert result["PermissionsBoundaryDecisionDetail"] == {"AllowedByPermissionsBoundary": False}


def test_custom_policy_pagination_and_errors(boto: Any) -> None:
    iam = boto.client("iam")
    policy = _doc({"Effect": "Allow", "Action": "ec2:Describe*", "Resource": "*"})
    actions = [f"ec2:Describe{n}" for n in ("Vpcs", "Subnets", "SecurityGroups", "DhcpOptions", "NetworkInterfaces")]
    pages = list(iam.get_paginator("simulate_custom_policy").paginate(
        PolicyInputList=[policy], ActionNames=actions, PaginationConfig={"PageSize": 2}))
    assert [len(p["EvaluationResults"]) for p in pages] == [2, 2, 1]
    assert [p["IsTruncated"] for p in pages] == [True, True, False] and pages[0]["Marker"]
    assert {r["EvalDecision"] for p in pages for r in p["EvaluationResults"]} == {"allowed"}
    assert pages[0]["EvaluationResults"][0]["MatchedStatements"][0]["SourcePolicyId"] == "PolicyInputList.1"
    assert fake_aws_apis.simulate([policy], "ec2:DescribeVpcs") == "allowed"
    with pytest.raises(ClientError) as err:
        iam.simulate_principal_policy(PolicySourceArn=f"arn:aws:iam::{ACCOUNT}:role/nobody", ActionNames=["s3:GetObject"])
    assert err.value.response["Error"]["Code"] == "NoSuchEntity"
    with pytest.raises(NotImplementedError, match="ResourcePolicy"):
        iam.simulate_principal_policy(PolicySourceArn=_role(boto, "r6"), ActionNames=["s3:GetObject"],
                                      ResourcePolicy=policy)


def test_the_sdks_role_validation_against_the_simulator(boto: Any) -> None:
    """`resolve_and_validate_role` as ModelTrainer calls it: allowed, denied, and its message."""
    from sagemaker.core.helper import iam_role_resolver as resolver

    smoke = resolver._get_smoke_test_actions("training")
    assert "cloudwatch:PutMetricData" in smoke and "ec2:DescribeVpcs" in smoke
    good = _role(boto, "good", {"Effect": "Allow", "Action": smoke, "Resource": "*"})
    assert resolver._evaluate_permissions(boto.client("iam"), good, "training") == (True, [])
    session = type("S", (), {"boto_session": boto})()
    assert resolver.resolve_and_validate_role(good, sagemaker_session=session) == good
    short = _role(boto, "short", {"Effect": "Allow", "Action": [a for a in smoke if a != "ec2:DescribeSubnets"], "Resource": "*"})
    with pytest.raises(resolver.RoleValidationError, match="Missing permissions: ec2:DescribeSubnets"):
        resolver.resolve_and_validate_role(short, sagemaker_session=session)


# --------------------------------------------------------------------------- StopTrainingJob


def _job(boto: Any, name: str) -> None:
    boto.client("sagemaker").create_training_job(
        TrainingJobName=name,
        AlgorithmSpecification={"TrainingImage": "img", "TrainingInputMode": "File"},
        RoleArn=f"arn:aws:iam::{ACCOUNT}:role/r",
        OutputDataConfig={"S3OutputPath": "s3://bucket/out"},
        ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1},
        StoppingCondition={"MaxRuntimeInSeconds": 60},
    )


def test_stop_training_job(boto: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sm = boto.client("sagemaker")
    _job(boto, "running")
    fake_aws_apis.set_training_job_status("running", "InProgress", region=REGION, account=ACCOUNT)
    assert sm.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"][0]["TrainingJobName"] == "running"
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(fake_aws_apis, "on_stop", lambda name: seen.append(
        (name, sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"])))
    sm.stop_training_job(TrainingJobName="running")
    assert seen == [("running", "Stopping")]  # the hook runs while the job is Stopping
    described = sm.describe_training_job(TrainingJobName="running")
    assert described["TrainingJobStatus"] == "Stopped" and described["SecondaryStatus"] == "Stopped"
    assert [t["Status"] for t in described["SecondaryStatusTransitions"]] == ["Starting", "Training", "Stopping", "Stopped"]
    assert all("EndTime" in t for t in described["SecondaryStatusTransitions"])
    assert "TrainingEndTime" in described
    # Only a running job can be stopped; the messages are the service's.
    for status in ("Stopped", "Completed"):
        name = "done" if status == "Completed" else "running"
        if status == "Completed":
            _job(boto, name)  # moto completes jobs at once
        with pytest.raises(ClientError) as err:
            sm.stop_training_job(TrainingJobName=name)
        assert err.value.response["Error"]["Code"] == "ValidationException"
        assert err.value.response["Error"]["Message"] == f"The request was rejected because the training job is in status {status}."
    with pytest.raises(ClientError) as err:
        sm.stop_training_job(TrainingJobName="no-such-job")
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert err.value.response["Error"]["Message"] == "Requested resource not found."
    # A hook that finishes the stop itself is left to do so.
    _job(boto, "fails-while-stopping")
    fake_aws_apis.set_training_job_status("fails-while-stopping", "InProgress", region=REGION, account=ACCOUNT)
    monkeypatch.setattr(fake_aws_apis, "on_stop", lambda name: fake_aws_apis.set_training_job_status(
        name, "Failed", region=REGION, account=ACCOUNT))
    sm.stop_training_job(TrainingJobName="fails-while-stopping")
    assert sm.describe_training_job(TrainingJobName="fails-while-stopping")["TrainingJobStatus"] == "Failed"


# --------------------------------------------------------------------------- tuning jobs' training jobs


def _tuning_job_with_trials(boto: Any) -> tuple[Any, Any]:
    """moto's tuning job `tune` (Maximize acc over lr) and its training jobs tune-001 (Completed,
    acc 0.9), tune-002 (Failed, no metric), tune-003 (Completed, acc 0.95), tune-004 (running), as
    tests/fake_sagemaker.py links them; returns (moto's backend, its tuning job)."""
    from moto.sagemaker.models import sagemaker_backends

    sm = boto.client("sagemaker")
    sm.create_hyper_parameter_tuning_job(
        HyperParameterTuningJobName="tune",
        HyperParameterTuningJobConfig={
            "Strategy": "Grid", "ResourceLimits": {"MaxParallelTrainingJobs": 1},
            "HyperParameterTuningJobObjective": {"Type": "Maximize", "MetricName": "acc"},
            "ParameterRanges": {"CategoricalParameterRanges": [{"Name": "lr", "Values": ["1", "2", "3", "4"]}]},
        },
        TrainingJobDefinition={
            "StaticHyperParameters": {"epochs": "1"},
            "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File",
                                       "MetricDefinitions": [{"Name": "acc", "Regex": "acc=(\\S+)"}]},
            "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/r", "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
            "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1},
            "StoppingCondition": {"MaxRuntimeInSeconds": 60},
        },
    )
    backend = sagemaker_backends[ACCOUNT][REGION]
    tuning = backend.hyper_parameter_tuning_jobs["tune"]
    for number, (status, acc) in enumerate([("Completed", 0.9), ("Failed", None), ("Completed", 0.95),
                                            ("InProgress", None)], 1):
        name = f"tune-{number:03d}-0123abcd"
        sm.create_training_job(
            TrainingJobName=name, HyperParameters={"epochs": "1", "lr": str(number)},
            AlgorithmSpecification={"TrainingImage": "img", "TrainingInputMode": "File"},
            RoleArn=f"arn:aws:iam::{ACCOUNT}:role/r", OutputDataConfig={"S3OutputPath": "s3://bucket/out"},
            ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1},
            StoppingCondition={"MaxRuntimeInSeconds": 60},
        )
        job = fake_aws_apis.set_training_job_status(name, status, region=REGION, account=ACCOUNT)
        job.final_metric_data_list = [{"MetricName": "acc", "Value": acc, "Timestamp": job.creation_time}] if acc else []
        if status == "Failed":
            job.failure_reason = "AlgorithmError: boom"
        fake_aws_apis.link_trial(job, tuning)
    return backend, tuning


def test_list_training_jobs_for_hyper_parameter_tuning_job(boto: Any) -> None:
    sm = boto.client("sagemaker")
    _tuning_job_with_trials(boto)
    arn = sm.describe_training_job(TrainingJobName="tune-001-0123abcd")["TuningJobArn"]
    assert arn == sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName="tune")["HyperParameterTuningJobArn"]
    listed = sm.list_training_jobs_for_hyper_parameter_tuning_job(HyperParameterTuningJobName="tune")
    summaries = listed["TrainingJobSummaries"]
    assert [s["TrainingJobName"] for s in summaries] == [f"tune-00{i}-0123abcd" for i in (1, 2, 3, 4)]  # by Name
    assert "NextToken" not in listed
    first, failed, _, running = summaries
    assert first["TuningJobName"] == "tune" and first["TrainingJobArn"].endswith(":training-job/tune-001-0123abcd")
    assert first["TunedHyperParameters"] == {"lr": "1"}  # the tuned ones only
    assert first["FinalHyperParameterTuningJobObjectiveMetric"] == {"Type": "Maximize", "MetricName": "acc", "Value": 0.9}
    assert first["ObjectiveStatus"] == "Succeeded" and first["TrainingJobStatus"] == "Completed"
    assert {"CreationTime", "TrainingStartTime", "TrainingEndTime"} <= set(first)
    assert failed["ObjectiveStatus"] == "Failed" and failed["FailureReason"] == "AlgorithmError: boom"
    assert "FinalHyperParameterTuningJobObjectiveMetric" not in failed
    assert running["ObjectiveStatus"] == "Pending" and "TrainingEndTime" not in running
    # Sorting, filtering, pages: as documented.
    best = sm.list_training_jobs_for_hyper_parameter_tuning_job(
        HyperParameterTuningJobName="tune", SortBy="FinalObjectiveMetricValue", SortOrder="Descending")
    assert [s["TrainingJobName"][:8] for s in best["TrainingJobSummaries"]] == ["tune-003", "tune-001"]
    completed = sm.list_training_jobs_for_hyper_parameter_tuning_job(HyperParameterTuningJobName="tune",
                                                                     StatusEquals="Completed")
    assert len(completed["TrainingJobSummaries"]) == 2
    pages = list(sm.get_paginator("list_training_jobs_for_hyper_parameter_tuning_job").paginate(
        HyperParameterTuningJobName="tune", SortBy="Status", PaginationConfig={"PageSize": 3}))
    assert [len(p["TrainingJobSummaries"]) for p in pages] == [3, 1]
    statuses = [s["TrainingJobStatus"] for p in pages for s in p["TrainingJobSummaries"]]
    assert statuses == sorted(statuses)
    with pytest.raises(ClientError) as err:
        sm.list_training_jobs_for_hyper_parameter_tuning_job(HyperParameterTuningJobName="no-such-tuning-job")
    assert err.value.response["Error"]["Code"] == "ResourceNotFound"


def test_stop_hyper_parameter_tuning_job(boto: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sm = boto.client("sagemaker")
    _, tuning = _tuning_job_with_trials(boto)
    with pytest.raises(ClientError) as err:  # moto's tuning jobs are Completed at once
        sm.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName="tune")
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert err.value.response["Error"]["Message"] == "The request was rejected because the tuning job is in status Completed."
    tuning.hyper_parameter_tuning_job_status = "InProgress"
    seen: list[tuple[str, str, str]] = []
    monkeypatch.setattr(fake_aws_apis, "on_stop", lambda name: seen.append(
        (name, sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"],
         sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName="tune")["HyperParameterTuningJobStatus"])))
    sm.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName="tune")
    assert seen == [("tune-004-0123abcd", "Stopping", "Stopping")]  # only the running one, through the hook
    described = sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName="tune")
    assert described["HyperParameterTuningJobStatus"] == "Stopped" and "HyperParameterTuningEndTime" in described
    statuses = {s["TrainingJobName"][:8]: s["TrainingJobStatus"] for s in sm.list_training_jobs_for_hyper_parameter_tuning_job(
        HyperParameterTuningJobName="tune")["TrainingJobSummaries"]}
    assert statuses == {"tune-001": "Completed", "tune-002": "Failed", "tune-003": "Completed", "tune-004": "Stopped"}
    # A hook that takes the stop over (the fake SageMaker, running the trial) leaves both Stopping.
    tuning.hyper_parameter_tuning_job_status = "InProgress"
    fake_aws_apis.set_training_job_status("tune-004-0123abcd", "InProgress", region=REGION, account=ACCOUNT)
    monkeypatch.setattr(fake_aws_apis, "on_stop", lambda name: True)
    sm.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName="tune")
    assert sm.describe_training_job(TrainingJobName="tune-004-0123abcd")["TrainingJobStatus"] == "Stopping"
    assert sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName="tune")["HyperParameterTuningJobStatus"] == "Stopping"
    with pytest.raises(ClientError) as err:
        sm.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName="no-such-tuning-job")
    assert err.value.response["Error"]["Code"] == "ResourceNotFound"
