"""workshop.cloud: network, role, preflight, cost and cleanup, against moto (no credentials).

moto 5.2.5 lacks three of the APIs used here: SageMaker StopTrainingJob, IAM
SimulatePrincipalPolicy and Service Quotas ListServiceQuotas (`NotImplementedError`
in-process). Their tests use botocore's Stubber on a real client instead, with response
shapes from the services' API references (botocore validates them against its service
models, so a wrong field name fails the test).
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from conftest import quota_client, service_quota

from workshop import REPO_ROOT, account, cloud, runner
from workshop import jobs as sj
from workshop.cloud import aws
from workshop.errors import WorkshopError
from workshop.labs import get_lab

REGION = "us-east-1"
ACCOUNT = "123456789012"
USER = "alice"


@pytest.fixture
def aws_user() -> str:
    return USER


@pytest.fixture(autouse=True)
def isolated(no_aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cloud.network, "POLL_S", 0.01)


@pytest.fixture
def boto(moto_session: Any) -> Any:
    """Plain moto (conftest's moto_session)."""
    return moto_session


def tagged_leftovers(boto: Any) -> list[str]:
    """Every EC2 and IAM resource carrying the workshop tag."""
    ec2 = boto.client("ec2")
    tag = [{"Name": f"tag:{cloud.TAG_WORKSHOP}", "Values": [aws.WORKSHOP_NAME]}]
    found = [v["VpcId"] for v in ec2.describe_vpcs(Filters=tag)["Vpcs"]]
    found += [s["SubnetId"] for s in ec2.describe_subnets(Filters=tag)["Subnets"]]
    found += [g["GroupId"] for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]]
    found += [r["RouteTableId"] for r in ec2.describe_route_tables(Filters=tag)["RouteTables"]]
    found += [e["VpcEndpointId"] for e in ec2.describe_vpc_endpoints(Filters=tag)["VpcEndpoints"]
              if e["State"].lower() != "deleted"]
    found += [n["NatGatewayId"] for n in ec2.describe_nat_gateways(Filters=tag)["NatGateways"] if n["State"] != "deleted"]
    found += [i["InternetGatewayId"] for i in ec2.describe_internet_gateways(Filters=tag)["InternetGateways"]]
    found += [a["AllocationId"] for a in ec2.describe_addresses(Filters=tag)["Addresses"]]
    found += [r["RoleName"] for r in boto.client("iam").list_roles()["Roles"] if r["RoleName"].startswith(aws.WORKSHOP_NAME)]
    return found


# --------------------------------------------------------------------------- network


@pytest.mark.parametrize("egress", ["endpoints", "nat"])
def test_network_topology_security_idempotence_and_teardown(boto: Any, egress: str) -> None:
    ec2 = boto.client("ec2")
    net = cloud.ensure_network(boto, egress=egress)
    # One VPC, tagged with the workshop and the user.
    vpc = ec2.describe_vpcs(VpcIds=[net.vpc_id])["Vpcs"][0]
    tags = {t["Key"]: t["Value"] for t in vpc["Tags"]}
    assert tags[cloud.TAG_WORKSHOP] == aws.WORKSHOP_NAME and tags[cloud.TAG_USER] == USER
    # One availability zone for every subnet.
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [net.vpc_id]}])["Subnets"]
    assert {s["AvailabilityZone"] for s in subnets} == {net.availability_zone}
    assert len(net.subnet_ids) == 1 and all(not s.get("MapPublicIpOnLaunch") for s in subnets if s["SubnetId"] in net.subnet_ids)
    # The security group admits all traffic from itself and nothing from anywhere else.
    sg = ec2.describe_security_groups(GroupIds=[net.security_group_id])["SecurityGroups"][0]
    assert sg["IpPermissions"], "no ingress at all"
    for rule in sg["IpPermissions"]:
        assert rule["IpProtocol"] == "-1"
        assert not rule.get("IpRanges") and not rule.get("Ipv6Ranges") and not rule.get("PrefixListIds")
        assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [net.security_group_id]
    # The S3 gateway endpoint is on the private subnet's route table.
    s3 = ec2.describe_vpc_endpoints(VpcEndpointIds=[net.s3_endpoint_id])["VpcEndpoints"][0]
    assert s3["VpcEndpointType"] == "Gateway" and s3["ServiceName"] == f"com.amazonaws.{REGION}.s3"
    assert net.route_table_id in s3["RouteTableIds"]
    rt = ec2.describe_route_tables(RouteTableIds=[net.route_table_id])["RouteTables"][0]
    assert net.subnet_ids[0] in [a.get("SubnetId") for a in rt["Associations"]]
    if egress == "endpoints":
        assert set(net.interface_endpoint_ids) == set(cloud.INTERFACE_ENDPOINTS)
        for endpoint in ec2.describe_vpc_endpoints(VpcEndpointIds=list(net.interface_endpoint_ids.values()))["VpcEndpoints"]:
            assert endpoint["VpcEndpointType"] == "Interface" and endpoint["SubnetIds"] == net.subnet_ids
            assert [g["GroupId"] for g in endpoint["Groups"]] == [net.security_group_id]
        assert net.nat_gateway_id is None
    else:
        assert any(r.get("NatGatewayId") == net.nat_gateway_id for r in rt["Routes"])
        assert not net.interface_endpoint_ids
    # Every resource is tagged with the workshop and the user.
    for resource in infra_resources(ec2, net):
        assert {t["Key"]: t["Value"] for t in resource["Tags"]}.get(cloud.TAG_USER) == USER, resource
    # Again: the same ids, nothing created.
    again = cloud.ensure_network(boto, egress=egress)
    assert again.created == [] and again.vpc_id == net.vpc_id and again.subnet_ids == net.subnet_ids
    assert again.security_group_id == net.security_group_id and again.s3_endpoint_id == net.s3_endpoint_id
    assert again.interface_endpoint_ids == net.interface_endpoint_ids and again.nat_gateway_id == net.nat_gateway_id
    # Tear down: nothing tagged left; twice is harmless.
    deleted = cloud.delete_network(boto)
    assert net.vpc_id in deleted and net.security_group_id in deleted
    assert tagged_leftovers(boto) == []
    assert cloud.delete_network(boto) == []


def infra_resources(ec2: Any, net: cloud.Network) -> list[dict[str, Any]]:
    vpc = [{"Name": "vpc-id", "Values": [net.vpc_id]}]
    return [
        *ec2.describe_subnets(Filters=vpc)["Subnets"],
        ec2.describe_security_groups(GroupIds=[net.security_group_id])["SecurityGroups"][0],
        ec2.describe_route_tables(RouteTableIds=[net.route_table_id])["RouteTables"][0],
        *ec2.describe_vpc_endpoints(Filters=vpc)["VpcEndpoints"],
    ]


def test_network_errors_name_the_fix(boto: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    default_cidr = boto.client("ec2").describe_vpcs()["Vpcs"][0]["CidrBlock"]  # moto's default VPC
    with pytest.raises(WorkshopError, match=f"overlaps VPC .*{re.escape(default_cidr)}") as info:
        cloud.ensure_network(boto, cidr=default_cidr)
    assert "cidr='10.80.0.0/16'" in info.value.fix
    with pytest.raises(WorkshopError, match="egress must be one of"):
        cloud.ensure_network(boto, egress="vpn")
    assert tagged_leftovers(boto) == []  # nothing was created
    # Polling has a timeout, and says what it last saw.
    monkeypatch.setattr(cloud.network, "_endpoints_state", lambda ec2, ids: (False, '{"vpce-1": "pending"}'))
    with pytest.raises(WorkshopError, match="Timed out after 0.05 s .*pending"):
        cloud.ensure_network(boto, timeout_s=0.05)
    cloud.delete_network(boto)
    assert tagged_leftovers(boto) == []


def test_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with pytest.raises(WorkshopError, match="No AWS credentials") as info:
        account.cleanup()
    assert "aws configure" in info.value.fix


# --------------------------------------------------------------------------- role and policies


def test_role_is_least_privilege_idempotent_and_deleted(boto: Any) -> None:
    iam = boto.client("iam")
    info = account.ensure_role(boto)
    assert info.created and info.name == f"{aws.WORKSHOP_NAME}-{USER}"
    role = iam.get_role(RoleName=info.name)["Role"]
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    policy = iam.get_role_policy(RoleName=info.name, PolicyName="workshop-training")["PolicyDocument"]
    assert cloud.wildcard_violations(policy) == []
    s3 = [st for st in policy["Statement"] if st["Sid"] == "WorkshopObjects"][0]
    bucket = f"arn:aws:s3:::sagemaker-{REGION}-{ACCOUNT}"
    assert f"{bucket}/{aws.WORKSHOP_NAME}/{USER}/*" in s3["Resource"]
    assert all(r.startswith(bucket + "/") for r in s3["Resource"])
    assert account.ensure_role(boto).created is False
    # Off SageMaker, with no role given, the workshop role is found by name.
    assert cloud.resolve_role(None, boto) == info.arn
    assert cloud.delete_role(boto) == [info.name] and cloud.delete_role(boto) == []
    with pytest.raises(WorkshopError, match="No IAM role") as err:
        cloud.resolve_role(None, boto)
    assert "python -m workshop role" in err.value.fix and aws.ROLE_ENV in err.value.fix


def test_only_sagemaker_acting_for_this_account_may_assume_the_role(boto: Any) -> None:
    """The trust policy carries the `aws:SourceAccount` condition of the SDK's own training role
    (`sagemaker.core.helper.iam_policies`, its placeholder set to the account as the SDK sets it):
    another account's SageMaker cannot be made to act with the workshop's role."""
    import fake_aws_apis
    from sagemaker.core.helper.iam_policies import IAM_POLICY_CONFIG
    from sagemaker.core.helper.iam_role_resolver import IamRoleResolver

    info = account.ensure_role(boto)
    trust = boto.client("iam").get_role(RoleName=info.name)["Role"]["AssumeRolePolicyDocument"]
    sdk = IamRoleResolver._scope_trust_policy_to_account(IAM_POLICY_CONFIG["training"]["trust_policy"], ACCOUNT)
    assert trust == sdk == cloud.trust_policy(account=ACCOUNT)
    # As IAM evaluates the condition (the trust statement read as one on any resource: the evaluator
    # matches resources, a trust policy names principals).
    statement = {k: v for k, v in trust["Statement"][0].items() if k != "Principal"}
    document = {"Version": "2012-10-17", "Statement": [{**statement, "Resource": "*"}]}
    assert fake_aws_apis.simulate([document], "sts:AssumeRole", context={"aws:SourceAccount": ACCOUNT}) == "allowed"
    for context in ({"aws:SourceAccount": "999999999999"}, {}):  # another account's job; no account said
        assert fake_aws_apis.simulate([document], "sts:AssumeRole", context=context) == "implicitDeny"


def test_a_role_the_workshop_did_not_create_is_left_alone(boto: Any) -> None:
    iam = boto.client("iam")
    iam.create_role(RoleName=cloud.role_name(), AssumeRolePolicyDocument=json.dumps(cloud.trust_policy(account=ACCOUNT)))
    with pytest.raises(WorkshopError, match="not created by the workshop"):
        account.ensure_role(boto)
    assert cloud.delete_role(boto) == []
    assert iam.get_role(RoleName=cloud.role_name())


def _policy_documents_in_repo() -> dict[str, dict[str, Any]]:
    """Policy documents shipped as JSON files, or as dict literals in Python code."""
    docs: dict[str, dict[str, Any]] = {}
    skip = {".venv", ".git", "runs", "data", "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache"}
    for root, dirs, files in os.walk(REPO_ROOT):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            path = Path(root, name)
            if path == Path(__file__):  # this file's literals are the check's deliberately bad examples
                continue
            if path.suffix == ".json" and path.stat().st_size < 1_000_000:
                try:
                    doc = json.loads(path.read_text())
                except (ValueError, UnicodeDecodeError):
                    continue
                if isinstance(doc, dict) and "Statement" in doc:
                    docs[str(path)] = doc
            elif path.suffix == ".py":
                try:
                    tree = ast.parse(path.read_text())
                except (SyntaxError, UnicodeDecodeError):
                    continue
                for node in ast.walk(tree):
                    if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "Statement" for k in node.keys):
                        try:
                            docs[f"{path}:{node.lineno}"] = ast.literal_eval(node)
                        except ValueError:
                            pass  # built with variables: covered through shipped_policy_documents()
    return docs


def test_no_policy_grants_wildcard_actions_on_wildcard_resources() -> None:
    documents = {**account.shipped_policy_documents(), **_policy_documents_in_repo()}
    assert "role_policy" in documents and "trust_policy" in documents
    assert any("test_sagemaker_jobs.py" in name for name in documents)  # the literal scan finds literals
    for name, document in documents.items():
        assert cloud.wildcard_violations(document) == [], name
    # ... and the check catches what it must.
    bad = {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    assert cloud.wildcard_violations(bad)
    assert cloud.wildcard_violations({"Statement": {"Effect": "Allow", "Action": ["*"], "Resource": ["*"]}})
    assert cloud.wildcard_violations({"Statement": [{"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}]})
    assert not cloud.wildcard_violations({"Statement": [{"Effect": "Deny", "Action": "*", "Resource": "*"}]})


# --------------------------------------------------------------------------- preflight (Stubber)


def _plan(instance_type: str = "ml.g5.xlarge", count: int = 2) -> sj.JobPlan:
    return sj.plan_job(get_lab("data_parallel"), hyperparameters={}, region=REGION,
                       instance_type=instance_type, instance_count=count)


QUOTAS = [
    service_quota("ml.g5.xlarge for training job usage", 0.0, "L-G5X"),
    service_quota("ml.g4dn.xlarge for training job usage", 4.0, "L-G4X"),
    service_quota("ml.c5.2xlarge for training job usage", 1.0, "L-C52"),
    service_quota("ml.m5.xlarge for training job usage", 8.0, "L-M5X"),
    service_quota("Number of instances across all training jobs", 10.0, "L-ALL"),
]


def test_quota_checks() -> None:
    assert "quota: ml.g4dn.xlarge for training: 4 (need 2)" == cloud.check_quota(quota_client(QUOTAS, REGION), "ml.g4dn.xlarge", 2, REGION)
    with pytest.raises(WorkshopError, match="quota for ml.g5.xlarge training instances in us-east-1 is zero") as info:
        cloud.check_quota(quota_client(QUOTAS, REGION), "ml.g5.xlarge", 2, REGION)
    assert "--quota-code L-G5X --desired-value 2" in info.value.fix
    assert "ml.g4dn.xlarge, whose quota allows 2" in info.value.fix  # a smaller GPU instance
    with pytest.raises(WorkshopError, match="is 1; the job needs 2") as info:
        cloud.check_quota(quota_client(QUOTAS, REGION), "ml.c5.2xlarge", 2, REGION)
    assert "ml.m5.xlarge" in info.value.fix and "hosts=1" in info.value.fix
    with pytest.raises(WorkshopError, match="ml.p4d.24xlarge is not offered for SageMaker training in us-east-1") as info:
        cloud.check_quota(quota_client(QUOTAS, REGION), "ml.p4d.24xlarge", 1, REGION)
    assert "ml.g4dn.xlarge" in info.value.fix


def _iam_client(denied: list[str], checks: list[tuple[tuple[str, ...], str | None]], role_arn: str):
    # Stubber: moto 5.2.5 does not implement SimulatePrincipalPolicy.
    client = boto3.client("iam", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    user = f"arn:aws:iam::{ACCOUNT}:user/alice"
    for names, resource in [*checks, (("iam:PassRole",), role_arn)]:
        results = [{"EvalActionName": a, "EvalResourceName": resource or "*",
                    "EvalDecision": "implicitDeny" if a in denied else "allowed"} for a in names]
        expected = {"PolicySourceArn": user, "ActionNames": list(names)}
        if resource:
            expected["ResourceArns"] = [resource]
        if "iam:PassRole" in names:
            expected["ContextEntries"] = cloud.PASS_ROLE_CONTEXT
        stub.add_response("simulate_principal_policy", {"EvaluationResults": results, "IsTruncated": False}, expected)
    stub.activate()
    return client, user


def test_permission_simulation_lists_what_is_missing() -> None:
    role = f"arn:aws:iam::{ACCOUNT}:role/r"
    checks = cloud.job_permission_checks(region=REGION, account=ACCOUNT, partition="aws", base_job_name="alice-data-parallel")
    # Simulated against the job's real resources, not "*": the bucket, the data prefix, the job.
    assert (("s3:ListBucket",), f"arn:aws:s3:::sagemaker-{REGION}-{ACCOUNT}") in checks
    client, user = _iam_client([], checks, role)
    assert "may pass the role and create the job (8 actions simulated)" in cloud.check_permissions(client, user, role, checks)
    client, user = _iam_client(["sagemaker:CreateTrainingJob", "iam:PassRole"], checks, role)
    with pytest.raises(WorkshopError, match="missing permissions the job needs: iam:PassRole, sagemaker:CreateTrainingJob") as info:
        cloud.check_permissions(client, user, role, checks)
    assert role in info.value.fix
    # Root cannot be simulated (and needs not be).
    assert cloud.check_permissions(None, f"arn:aws:iam::{ACCOUNT}:root", role, checks).startswith("permissions: not simulated")


def test_preflight_under_moto_skips_what_moto_lacks_and_prints_cost(boto: Any, capsys: pytest.CaptureFixture[str]) -> None:
    report = cloud.preflight(_plan(), f"arn:aws:iam::{ACCOUNT}:role/r", boto)
    assert "not simulated" in report.permissions and "not checked" in report.quota
    assert report.cost.upper_bound_usd == pytest.approx(2 * 1.408)
    out = capsys.readouterr().out
    assert "$2.82 = 2 x ml.g5.xlarge x $1.408/h x 1 h" in out and cloud.PRICES_DATE in out


def test_cost_estimate_and_price_table() -> None:
    est = cloud.estimate_cost("ml.p4d.24xlarge", 2, 7200, network_egress="endpoints")
    assert est.upper_bound_usd == pytest.approx(2 * 37.688 * 2)
    assert est.network_hourly_usd == pytest.approx(0.04)
    assert any("$0.040 per hour" in line for line in est.lines())
    assert cloud.estimate_cost("ml.x9.huge", 1, 3600).hourly_usd is None
    for name, price in {**cloud.INSTANCE_PRICES, **cloud.NETWORK_PRICES}.items():
        assert price.source and (price.verified or "unverified" in price.source or price.usd_per_hour == 0), name
    assert cloud.network_hourly_usd("nat") == pytest.approx(0.05)


# --------------------------------------------------------------------------- cleanup (Stubber for stop)


def test_stop_user_jobs_stops_only_this_users_workshop_jobs() -> None:
    # Stubber: moto 5.2.5 does not implement StopTrainingJob.
    client = boto3.client("sagemaker", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/"
    jobs = [
        {"TrainingJobName": n, "TrainingJobArn": arn + n, "CreationTime": "2026-11-22T00:00:00Z",
         "TrainingJobStatus": "InProgress"}
        for n in ("alice-data-parallel-1", "alice-other-2")
    ]
    stub.add_response("list_training_jobs", {"TrainingJobSummaries": jobs},
                      {"StatusEquals": "InProgress", "NameContains": USER})
    stub.add_response("list_tags", {"Tags": [{"Key": "workshop", "Value": aws.WORKSHOP_NAME},
                                             {"Key": "workshop-user", "Value": USER}]}, {"ResourceArn": arn + jobs[0]["TrainingJobName"]})
    stub.add_response("stop_training_job", {}, {"TrainingJobName": "alice-data-parallel-1"})
    stub.add_response("list_tags", {"Tags": [{"Key": "project", "Value": "not the workshop"}]},
                      {"ResourceArn": arn + jobs[1]["TrainingJobName"]})
    with stub:
        assert cloud.stop_user_jobs(client, USER) == ["alice-data-parallel-1"]
        stub.assert_no_pending_responses()


def test_cleanup_deletes_network_role_and_opt_in_s3(boto: Any) -> None:
    s3 = boto.client("s3")
    bucket = f"sagemaker-{REGION}-{ACCOUNT}"
    s3.create_bucket(Bucket=bucket)
    mine = [f"{aws.WORKSHOP_NAME}/{USER}/data/mnist/train/mnist.npz", f"{USER}-data-parallel/job/output/model.tar.gz"]
    others = [f"{aws.WORKSHOP_NAME}/bob/data/mnist/train/mnist.npz", "alice-unrelated/x"]
    for key in mine + others:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    cloud.ensure_network(boto)
    account.ensure_role(boto)
    report = account.cleanup(boto, show=False)
    assert report.network and report.role and report.s3_objects is None
    assert tagged_leftovers(boto) == []
    assert len(s3.list_objects_v2(Bucket=bucket)["Contents"]) == 4  # S3 is opt-in
    again = account.cleanup(boto, delete_s3=True, show=False)
    assert again.network == [] and again.role == [] and again.s3_objects == 2
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]) == sorted(others)


# --------------------------------------------------------------------------- wiring


def test_run_lab_on_sagemaker_with_network_and_role(boto: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")
    sdk_config = tmp_path / "sdk.yaml"
    sdk_config.write_text("SchemaVersion: '1.0'\n")
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(sdk_config))
    monkeypatch.setenv("SAGEMAKER_ADMIN_CONFIG_OVERRIDE", str(sdk_config))
    data = tmp_path / "mnist"
    for channel in ("train", "test"):
        (data / channel).mkdir(parents=True)
        np.savez(data / channel / "mnist.npz", images=np.zeros((4, 28, 28), np.uint8), labels=np.arange(4))
    result = runner.run_on_sagemaker("data_parallel", hosts=2, procs_per_host=None, hyperparameters={"epochs": 1, "batch-size": 2},
                                     data_dir=data, region=REGION, network=True, create_role=True, wait=False,
                                     confirm_cost=True)
    described = boto.client("sagemaker").describe_training_job(TrainingJobName=result.job_name)
    net_vpc = cloud.find_network(boto)
    subnets = boto.client("ec2").describe_subnets(Filters=[{"Name": "vpc-id", "Values": [net_vpc]}])["Subnets"]
    assert described["VpcConfig"]["Subnets"] == [s["SubnetId"] for s in subnets]
    assert described["RoleArn"].endswith(f"role/{cloud.role_name()}")
    out = capsys.readouterr().out
    assert out.index("[infra] cost: at most") < out.index("step 3/5") < out.index("network: VPC")
    account.cleanup(boto, show=False)
    assert tagged_leftovers(boto) == []


def test_dry_run_prints_network_role_preflight_and_cost(capsys: pytest.CaptureFixture[str]) -> None:
    request = sj.dry_run(get_lab("data_parallel"), hyperparameters={"epochs": 1}, network=True)
    assert request["VpcConfig"] == {"SecurityGroupIds": [sj.DRY_RUN_SECURITY_GROUP], "Subnets": [sj.DRY_RUN_SUBNET]}
    out = capsys.readouterr().out
    for expected in ("network: would create or reuse VPC", "role: arn:aws:iam::123456789012:role/WorkshopDryRunPlaceholder",
                     "cost: at most $2.82", "preflight needing an account", cloud.PRICES_DATE):
        assert expected in out, expected
    with pytest.raises(WorkshopError, match="either network"):
        sj.dry_run(get_lab("data_parallel"), hyperparameters={}, network=True, subnets=["subnet-1"], security_group_ids=["sg-1"])
