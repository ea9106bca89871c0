"""An organizer's room (`workshop.event`, `workshop.cloud.stack/quotas/room/sweep`): the CloudFormation
template (linted with cfn-lint, deployed in moto), the names and roles it makes against what the
workshop computes on a notebook instance, the attendees' notebook-role policy, the room's preflight
(Service Quotas through botocore's Stubber: moto lacks them), the shared data, and the teardown.

moto's CloudFormation creates `AWS::SageMaker::NotebookInstance`, `...NotebookInstanceLifecycleConfig`,
`AWS::IAM::Role` and the EC2 network types; `tests/fake_aws_apis.py` makes it keep what CloudFormation
keeps (the notebook instance's name and properties, EC2 resources' own tags). No test trains.
"""

from __future__ import annotations

import ast
import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.stub import Stubber
from conftest import service_quota

from workshop import REPO_ROOT, account, cloud, event
from workshop.__main__ import main
from workshop.cloud import aws, stack, sweep
from workshop.cloud.room import ROOM_USER, room_channel_uris, room_prefix
from workshop.errors import WorkshopError
from workshop.labs import LABS, get_lab

REGION = "us-east-1"
ACCOUNT = "123456789012"
BUCKET = f"sagemaker-{REGION}-{ACCOUNT}"
REPO = "https://github.com/example/distributed-training-workshop.git"


@pytest.fixture
def aws_user() -> str:
    return "organizer"


@pytest.fixture
def boto(strict_moto_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """moto with IAM's simulator, StopTrainingJob and CloudFormation's notebook instances (fake_aws_apis)."""
    monkeypatch.setattr(cloud.network, "POLL_S", 0.01)
    return strict_moto_session


def deploy(boto: Any, count: int, *, with_network: bool = False, name: str = "room", **kwargs: Any) -> dict[str, Any]:
    document = event.event_template(count, repository=REPO, with_network=with_network, **kwargs)
    cfn = boto.client("cloudformation")
    cfn.create_stack(StackName=name, TemplateBody=stack.to_yaml(document), Capabilities=["CAPABILITY_NAMED_IAM"])
    assert cfn.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    return document


def on_instance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> None:
    """This process as a notebook instance called `name` sees itself: login ec2-user, the
    resource metadata SageMaker writes, no WORKSHOP_USER."""
    metadata = tmp_path / f"resource-metadata-{name}.json"
    metadata.write_text(json.dumps({"ResourceArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:notebook-instance/{name}",
                                    "ResourceName": name}))
    monkeypatch.setattr(aws, "NOTEBOOK_METADATA_FILE", str(metadata))
    monkeypatch.setattr(aws.getpass, "getuser", lambda: "ec2-user")
    monkeypatch.delenv(aws.USER_ENV, raising=False)


def tags_of(pairs: list[dict[str, str]]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in pairs}


# --------------------------------------------------------------------------- the template, linted


def lint(text: str) -> list[str]:
    from cfnlint.api import ManualArgs
    from cfnlint.api import lint as cfn_lint

    return [f"{m.rule.id} {m.message} ({m.path})" for m in cfn_lint(text, config=ManualArgs(regions=[REGION]))]


# One attendee each way (with and without the workshop network: the notebooks' properties differ), and a room of 30
# with its network: the most resources a template holds (30 without a network are the same notebooks, fewer
# resources: cfn-lint took 24 s on them for nothing the other three do not check).
@pytest.mark.parametrize(("count", "with_network"), [(1, False), (1, True), (30, True)])
def test_cfn_lint_passes_the_template(count: int, with_network: bool) -> None:
    text = stack.to_yaml(event.event_template(count, repository=REPO, with_network=with_network))
    assert lint(text) == []  # no error, warning or informational finding
    if count == 1 and not with_network:
        # ... and cfn-lint does check it: a type SageMaker does not have and a volume under 5 GB are errors.
        broken = text.replace("InstanceType: ml.t3.medium", "InstanceType: ml.t3.gigantic").replace(
            "VolumeSizeInGB: 20", "VolumeSizeInGB: 2")
        assert {finding.split()[0] for finding in lint(broken)} == {"E3030", "E3034"}


def test_the_cli_writes_the_template_and_refuses_what_cloudformation_would(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["event", "template", "--attendees", "3", "--repository", REPO, "--volume-gb", "25"]) == 0
    out, err = capsys.readouterr()
    document = yaml.safe_load(out)
    notebooks = {k: v["Properties"] for k, v in document["Resources"].items() if v["Type"] == "AWS::SageMaker::NotebookInstance"}
    assert sorted(p["NotebookInstanceName"] for p in notebooks.values()) == ["attendee-01", "attendee-02", "attendee-03"]
    assert {p["VolumeSizeInGB"] for p in notebooks.values()} == {25}
    assert {p["DefaultCodeRepository"] for p in notebooks.values()} == {REPO}
    assert {p["PlatformIdentifier"] for p in notebooks.values()} == {stack.DEFAULT_PLATFORM}
    assert "10 resources" in err and "CAPABILITY_NAMED_IAM" in err
    # 36 attendees with networks are 505 resources: more than one stack holds, so it says how to split.
    assert main(["event", "template", "--attendees", "36", "--repository", REPO, "--with-network"]) == 2
    err = capsys.readouterr().err
    assert "505 resources" in err and "--attendees 35 --first 1" in err and "--first 36" in err
    # 100 attendees without networks fit in 500 resources but not in CloudFormation's 1 MB.
    assert main(["event", "template", "--attendees", "100", "--repository", REPO]) == 2
    out, err = capsys.readouterr()
    # (about 80 a stack: each attendee's role names an S3 prefix per lab and one for their own scripts' jobs)
    assert out == "" and "CloudFormation takes at most 1,000,000" in err and re.search(r"stacks of at most [6-9]\d ", err)
    assert main(["event", "template", "--attendees", "2", "--repository", "git@github.com:o/r.git"]) == 2
    assert "https URL" in capsys.readouterr().err
    assert main(["event", "template", "--attendees", "2", "--repository", REPO, "--name-prefix", "a_b"]) == 2


def test_lifecycle_scripts_get_their_variables_and_stay_under_the_limit(tmp_path: Path) -> None:
    script = "#!/bin/bash\nset -eu\necho \"wheels from ${WORKSHOP_WHEELHOUSE:-nowhere}\"\n"
    content = stack.lifecycle_content(script, {"WORKSHOP_WHEELHOUSE": "s3://room-bucket/wheels dir"}, "on-create")
    text = base64.b64decode(content).decode()
    assert text.splitlines()[:2] == ["#!/bin/bash", "export WORKSHOP_WHEELHOUSE='s3://room-bucket/wheels dir'"]
    path = tmp_path / "on-create.sh"
    path.write_text(text)
    assert subprocess.run(["bash", str(path)], capture_output=True, text=True).stdout == \
        "wheels from s3://room-bucket/wheels dir\n"
    # The checkout's own scripts, as the template embeds them: bash, within CloudFormation's limit.
    document = event.event_template(1, repository=REPO, wheelhouse="s3://room-bucket/wheels")
    config = document["Resources"]["LifecycleConfig"]["Properties"]
    for hook, name in (("OnCreate", "on-create.sh"), ("OnStart", "on-start.sh")):
        content = config[hook][0]["Content"]
        assert len(content) <= stack.LIFECYCLE_MAX_CHARS
        decoded = base64.b64decode(content).decode()
        assert "export WORKSHOP_WHEELHOUSE=s3://room-bucket/wheels\n" in decoded
        assert decoded.endswith((REPO_ROOT / "scripts" / "notebook-instance" / name).read_text().split("\n", 1)[1])
        (tmp_path / name).write_text(decoded)
        assert subprocess.run(["bash", "-n", str(tmp_path / name)]).returncode == 0
    # Over the limit: refused, naming it.
    with pytest.raises(WorkshopError, match="over CloudFormation's 16,384"):
        stack.lifecycle_content("#!/bin/bash\n" + "echo x\n" * 2000, {}, "on-start")
    with pytest.raises(WorkshopError, match="not WORKSHOP_"):
        stack.lifecycle_content(script, {"PATH": "/tmp"}, "on-create")


# --------------------------------------------------------------------------- deployed in moto


def test_the_stack_makes_what_the_workshop_looks_for_on_each_notebook_instance(
        boto: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    document = deploy(boto, 3, wheelhouse="s3://room-bucket/wheels")
    sm, iam = boto.client("sagemaker"), boto.client("iam")
    notebooks = sm.list_notebook_instances()["NotebookInstances"]
    assert sorted(n["NotebookInstanceName"] for n in notebooks) == ["attendee-01", "attendee-02", "attendee-03"]
    outputs = {o["OutputKey"]: o["OutputValue"]
               for o in boto.client("cloudformation").describe_stacks(StackName="room")["Stacks"][0]["Outputs"]}
    for summary in notebooks:
        name = summary["NotebookInstanceName"]
        nb = sm.describe_notebook_instance(NotebookInstanceName=name)
        # On that instance, the workshop computes its user from the instance's name ...
        on_instance(monkeypatch, tmp_path, name)
        user = aws.user_prefix()
        assert user == name
        # ... and finds the tags, the roles and the policy the stack made for exactly that user.
        tags = tags_of(sm.list_tags(ResourceArn=nb["NotebookInstanceArn"])["Tags"])
        assert tags == {"workshop": aws.WORKSHOP_NAME, "workshop-user": user, "workshop-resource": "notebook-instance",
                        "workshop-stack": "room"}
        assert nb["RoleArn"] == iam.get_role(RoleName=stack.notebook_role_name(user))["Role"]["Arn"]
        assert nb["VolumeSizeInGB"] == stack.DEFAULT_VOLUME_GB and nb["InstanceType"] == stack.DEFAULT_NOTEBOOK_TYPE
        assert nb["DefaultCodeRepository"] == REPO and nb["DirectInternetAccess"] == "Enabled"
        config = sm.describe_notebook_instance_lifecycle_config(
            NotebookInstanceLifecycleConfigName=nb["NotebookInstanceLifecycleConfigName"])
        assert "export WORKSHOP_WHEELHOUSE=s3://room-bucket/wheels" in base64.b64decode(config["OnCreate"][0]["Content"]).decode()
        execution = iam.get_role(RoleName=cloud.role_name())["Role"]
        assert cloud.resolve_role(None, boto) == execution["Arn"]  # not the notebook's own role
        # Only SageMaker acting for this account may assume it, as `python -m workshop role` writes it.
        assert execution["AssumeRolePolicyDocument"] == cloud.trust_policy(account=ACCOUNT)
        notebook_role = iam.get_role(RoleName=stack.notebook_role_name(user))["Role"]
        assert notebook_role["AssumeRolePolicyDocument"] == cloud.trust_policy(account=None)
        policy = iam.get_role_policy(RoleName=cloud.role_name(), PolicyName="workshop-training")["PolicyDocument"]
        # Exactly what `python -m workshop role` writes for this user, region, account and bucket.
        assert policy == account.role_policy(region=REGION, account=ACCOUNT, bucket=BUCKET, key_prefix="")
        assert cloud.wildcard_violations(policy) == []
        assert tags_of(iam.list_role_tags(RoleName=cloud.role_name())["Tags"])["workshop-user"] == user
        assert outputs[f"Attendee{int(name[-2:]):02d}Notebook"].endswith(f"/notebook-instances/openNotebook/{name}?view=lab")
        # `role` on the instance reuses it as the stack wrote it (the attendee may not rewrite it).
        info = account.ensure_role(boto)
        assert not info.created and info.arn == execution["Arn"]
    assert len(iam.list_roles()["Roles"]) == 6 and len(document["Outputs"]) == 3


def test_a_room_of_30_deploys_30_instances_and_30_execution_roles_with_the_workshops_policy(boto: Any) -> None:
    deploy(boto, 30)
    sm, iam = boto.client("sagemaker"), boto.client("iam")
    names = sorted(n["NotebookInstanceName"] for n in sm.list_notebook_instances(MaxResults=100)["NotebookInstances"])
    assert names == [f"attendee-{i:02d}" for i in range(1, 31)]
    for name in names:
        nb = sm.describe_notebook_instance(NotebookInstanceName=name)
        assert tags_of(sm.list_tags(ResourceArn=nb["NotebookInstanceArn"])["Tags"])["workshop-user"] == name
        assert nb["RoleArn"].endswith(f"role/{stack.notebook_role_name(name)}")
        policy = iam.get_role_policy(RoleName=cloud.role_name(name), PolicyName="workshop-training")["PolicyDocument"]
        assert policy == account.role_policy(region=REGION, account=ACCOUNT, bucket=BUCKET, user=name, key_prefix="")
    assert len(boto.client("cloudformation").describe_stacks(StackName="room")["Stacks"][0]["Outputs"]) == 30


def test_a_long_instance_name_gets_the_users_hashed_name_everywhere(boto: Any, monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    deploy(boto, 1, name_prefix="workshop-participant")
    [nb] = boto.client("sagemaker").list_notebook_instances()["NotebookInstances"]
    on_instance(monkeypatch, tmp_path, nb["NotebookInstanceName"])
    user = aws.user_prefix()
    assert nb["NotebookInstanceName"] == "workshop-participant-01" and user != nb["NotebookInstanceName"]
    assert boto.client("iam").get_role(RoleName=cloud.role_name())["Role"]["RoleName"] == f"{aws.WORKSHOP_NAME}-{user}"


def test_the_stacks_network_is_found_by_ensure_network_and_kept_by_the_attendees_cleanup(
        boto: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    deploy(boto, 2, with_network=True)
    on_instance(monkeypatch, tmp_path, "attendee-02")
    calls = _recorded_calls(monkeypatch)
    net = cloud.ensure_network(boto)
    assert net.created == []  # every piece found by its tags: nothing created, associated or authorized
    assert {op for _, op, _ in calls} <= {"DescribeVpcs", "DescribeSubnets", "DescribeRouteTables",
                                          "DescribeSecurityGroups", "DescribeVpcEndpoints"}, calls
    assert set(net.interface_endpoint_ids) == set(cloud.INTERFACE_ENDPOINTS) and net.cidr == "10.80.0.0/16"
    ec2 = boto.client("ec2")
    sg = ec2.describe_security_groups(GroupIds=[net.security_group_id])["SecurityGroups"][0]
    assert [p["GroupId"] for rule in sg["IpPermissions"] for p in rule["UserIdGroupPairs"]] == [net.security_group_id]
    assert not any(rule.get("IpRanges") for rule in sg["IpPermissions"])
    # The notebooks' last cell (cleanup) leaves the stack's role and network to the organizer.
    report = account.cleanup(boto, show=False)
    assert report.role == [] and report.network == []
    assert cloud.find_network(boto) == net.vpc_id
    assert boto.client("iam").get_role(RoleName=cloud.role_name())


# --------------------------------------------------------------------------- the attendee's notebook role


def _decision(boto: Any, principal: str, action: str, resource: str, context: list[dict[str, Any]] | None = None) -> str:
    kwargs: dict[str, Any] = {"PolicySourceArn": principal, "ActionNames": [action], "ResourceArns": [resource]}
    if context:
        kwargs["ContextEntries"] = context
    return boto.client("iam").simulate_principal_policy(**kwargs)["EvaluationResults"][0]["EvalDecision"]


def as_role(boto: Any, role_arn: str) -> Any:
    """A session as the notebook instance's role (what the workshop runs as on it)."""
    credentials = boto.client("sts").assume_role(RoleArn=role_arn, RoleSessionName="SageMaker")["Credentials"]
    return boto3.Session(aws_access_key_id=credentials["AccessKeyId"], aws_secret_access_key=credentials["SecretAccessKey"],
                         aws_session_token=credentials["SessionToken"], region_name=REGION)


def test_the_notebook_role_allows_the_attendees_workflow_and_nothing_of_anothers(
        boto: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from workshop import jobs

    deploy(boto, 2)
    iam = boto.client("iam")
    me = iam.get_role(RoleName=stack.notebook_role_name("attendee-01"))["Role"]["Arn"]
    mine, theirs = (iam.get_role(RoleName=cloud.role_name(u))["Role"]["Arn"] for u in ("attendee-01", "attendee-02"))
    sagemaker = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}"
    s3 = f"arn:aws:s3:::{BUCKET}"
    allowed = [
        ("sagemaker:CreateTrainingJob", f"{sagemaker}:training-job/attendee-01-data-parallel-20261124000000"),
        ("sagemaker:StopTrainingJob", f"{sagemaker}:training-job/attendee-01-model-parallel-20261124000000"),
        ("sagemaker:CreateHyperParameterTuningJob", f"{sagemaker}:hyper-parameter-tuning-job/attendee-01-data-p-1124000000"),
        ("sagemaker:StopHyperParameterTuningJob", f"{sagemaker}:hyper-parameter-tuning-job/attendee-01-data-p-1124000000"),
        ("s3:PutObject", f"{s3}/attendee-01-data-parallel/code/train.py"),
        ("s3:PutObject", f"{s3}/{aws.WORKSHOP_NAME}/attendee-01/data/mnist/train/mnist.npz"),
        ("s3:GetObject", f"{s3}/{room_prefix('')}data/mnist/train/mnist.npz"),
        ("logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/TrainingJobs:log-stream:attendee-01-data-parallel-1/algo-1"),
        ("iam:GetRole", mine),
    ]
    denied = [
        ("sagemaker:CreateTrainingJob", f"{sagemaker}:training-job/attendee-02-data-parallel-20261124000000"),
        ("sagemaker:StopTrainingJob", f"{sagemaker}:training-job/attendee-02-data-parallel-20261124000000"),
        ("sagemaker:StopHyperParameterTuningJob", f"{sagemaker}:hyper-parameter-tuning-job/attendee-02-data-p-1124000000"),
        ("s3:GetObject", f"{s3}/attendee-02-data-parallel/output/model.tar.gz"),
        ("s3:PutObject", f"{s3}/{room_prefix('')}data/mnist/train/mnist.npz"),  # the room's data: read only
        ("iam:PutRolePolicy", mine),  # an attendee cannot widen their own execution role
        ("iam:DeleteRole", mine),
        ("ec2:CreateVpc", "*"),
    ]
    for action, resource in allowed:
        assert _decision(boto, me, action, resource) == "allowed", (action, resource)
    for action, resource in denied:
        assert _decision(boto, me, action, resource) != "allowed", (action, resource)
    context = cloud.PASS_ROLE_CONTEXT
    assert _decision(boto, me, "iam:PassRole", mine, context) == "allowed"
    assert _decision(boto, me, "iam:PassRole", theirs, context) != "allowed"
    # The workshop's own preflight, run as the notebook's role on attendee-01's instance, passes.
    on_instance(monkeypatch, tmp_path, "attendee-01")
    session = as_role(boto, me)
    plan = jobs.plan_job(get_lab("data_parallel"), hyperparameters={}, region=REGION)
    report = cloud.preflight(plan, mine, session, tuning=None, show=False)
    assert "may pass the role and create the job" in report.permissions, report.permissions
    assert cloud.wildcard_violations(stack.notebook_policy(user="a", notebook_instance="a", job_keys=list(LABS))) == []


# --------------------------------------------------------------------------- the room's preflight


class WithQuotas:
    """A boto3 session whose Service Quotas client is a Stubber's (moto has no Service Quotas): it
    answers ListServiceQuotas for SageMaker, then (given `vpc`) for VPC, checked against botocore's model."""

    def __init__(self, session: Any, sagemaker: list[dict[str, Any]], vpc: list[dict[str, Any]] | None = None) -> None:
        self._session = session
        self.quotas = boto3.client("service-quotas", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
        self.stub = Stubber(self.quotas)
        for service, quotas in (("sagemaker", sagemaker), ("vpc", vpc)):
            if quotas is not None:
                self.stub.add_response("list_service_quotas", {"Quotas": quotas}, {"ServiceCode": service})
        self.stub.activate()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def client(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.quotas if name == "service-quotas" else self._session.client(name, *args, **kwargs)


ROOM_QUOTAS = [  # what a young account shows (codes as Service Quotas lists them)
    service_quota("ml.g5.xlarge for training job usage", 2.0, "L-G5X"),
    service_quota("ml.g5.xlarge for spot training job usage", 0.0, "L-G5XS"),
    service_quota("ml.c5.2xlarge for training job usage", 20.0, "L-C52"),
    service_quota("Number of instances across all training jobs", 4.0, "L-00C91CB5"),
    service_quota("Number of instances across all spot training jobs", 4.0, "L-SPOT"),
    service_quota("ml.t3.medium for notebook instance usage", 40.0, "L-T3M"),
    service_quota("Total number of notebook instances", 20.0, "L-NBT"),
]


def test_the_room_preflight_sums_the_labs_over_attendees_against_the_quotas(
        boto: Any, capsys: pytest.CaptureFixture[str]) -> None:
    report = event.preflight(30, hours=3, session=WithQuotas(boto, ROOM_QUOTAS))
    rows = {q.quota: q for q in report.quotas}
    # Per attendee at most: lab 1's 3 x ml.c5.2xlarge; the search's 2 trials x 2 x ml.g5.xlarge; the fault-tolerance spot job.
    assert (rows["ml.c5.2xlarge for training job usage"].need, rows["ml.c5.2xlarge for training job usage"].status) == (90, "SHORT")
    assert (rows["ml.g5.xlarge for training job usage"].need, rows["ml.g5.xlarge for training job usage"].status) == (120, "SHORT")
    assert "job_parallelism.ipynb" in rows["ml.g5.xlarge for training job usage"].why
    assert rows["ml.g5.xlarge for spot training job usage"].need == 60
    assert rows["Number of instances across all training jobs"].need == 120
    assert (rows["ml.t3.medium for notebook instance usage"].need, rows["ml.t3.medium for notebook instance usage"].status) == (30, "ok")
    assert rows["Total number of notebook instances"].status == "SHORT"
    requests = report.increases()
    assert ("aws service-quotas request-service-quota-increase --service-code sagemaker --quota-code L-G5X "
            f"--desired-value 120 --region {REGION}") in requests
    assert any("--quota-code L-NBT --desired-value 30" in r for r in requests)
    assert not any("L-T3M" in r for r in requests)
    # The cost bound, from the price table: every lab's jobs at max_run, the notebook instance for the event.
    g5, c5 = 1.408, 0.408
    jobs = (3 * c5 + 2 * c5 + c5 + 2 * c5 + c5  # labs 1 and 2, with lab 2's two one-time Horovod builds
            + 2 * g5 + 2 * g5 * 0.5 * 2  # lab 3's job, fault tolerance's two jobs
            + 6 * 1 * g5 * 0.5 + 6 * 2 * g5 * 0.5  # the search at world sizes 1 and 2
            + 2 * g5 * 0.5)  # lab 4
    per_attendee = jobs + 0.05 * 3 + 20 * 0.14 * 3 / 730
    assert report.per_attendee_usd == pytest.approx(per_attendee)
    assert report.total_usd == pytest.approx(30 * per_attendee)
    out = capsys.readouterr().out
    assert "every attendee runs the same step at the same time" in out
    assert f"30 attendee(s): at most ${30 * per_attendee:,.2f}" in out and "L-G5X --desired-value 120" in out
    assert "is empty: run `python -m workshop event data`" in out
    assert all("unverified" in price.source for price in cloud.prices.NOTEBOOK_PRICES.values())


def test_the_room_preflight_with_networks_counts_the_vpcs_already_there(boto: Any) -> None:
    vpc = [service_quota("VPCs per Region", 5.0, "L-F678F1CE")]
    report = event.preflight(4, session=WithQuotas(boto, ROOM_QUOTAS, vpc), with_network=True, show=False)
    [row] = [q for q in report.quotas if q.quota == event.VPC_QUOTA]
    assert row.need == 5 and row.status == "ok"  # 4 attendees and moto's default VPC
    assert any(c.what.startswith("its workshop network") and c.usd == pytest.approx(0.04 * 3) for c in report.costs)


def test_the_room_preflight_without_service_quotas_says_so_and_still_prices(boto: Any) -> None:
    report = event.preflight(2, session=boto, show=False)  # moto: no Service Quotas
    assert report.quota_note and {q.status for q in report.quotas} == {"not checked"}
    assert report.increases() == [] and report.total_usd > 0
    assert "Quotas not checked" in "\n".join(report.lines())


def test_every_notebook_job_the_specs_list_matches_its_notebook() -> None:
    """The specs' notebook jobs (what the room is planned for) against each notebook's parameters cell."""
    checked = 0
    for lab in LABS.values():
        for entry in lab.notebook_jobs:
            path = lab.path / entry.notebook
            cell = next(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
            params = {t.id: ast.literal_eval(node.value) for node in ast.parse("".join(cell["source"])).body
                      if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
            assert params["max_run_s"] == entry.max_run_s, entry
            assert params["instance_type"] == lab.sagemaker_route(entry.route).instance_type, entry
            sizes = params.get("world_sizes") or (params["hosts"],)
            assert entry.instance_count in sizes, entry
            if "lrs" in params:  # a search: one trial per learning rate, `parallel` at once
                assert (entry.jobs, entry.parallel) == (len(params["lrs"]), params["parallel"]), entry
            checked += 1
    assert checked >= 5


# --------------------------------------------------------------------------- the room's data


def test_the_rooms_data_is_uploaded_once_and_the_jobs_use_it(boto: Any, tmp_path: Path, data_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from workshop import runner
    from workshop.datasets.mnist import MNIST

    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")
    out = event.upload_data(boto, directory=tmp_path / "organizer", show=False)
    assert set(out) == {lab.data.name for lab in LABS.values()}
    s3 = boto.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys and all(k.startswith(room_prefix("")) for k in keys)
    uploaded = {k: s3.head_object(Bucket=BUCKET, Key=k)["ETag"] for k in keys}
    event.upload_data(boto, directory=tmp_path / "organizer", show=False)  # again: nothing changes
    assert {k: s3.head_object(Bucket=BUCKET, Key=k)["ETag"] for k in keys} == uploaded
    # An attendee's job whose channels are the room's copy uses it, uploading no data of its own ...
    organizer_mnist = tmp_path / "organizer" / "mnist"
    role = account.ensure_role(boto)
    result = runner.run_on_sagemaker("data_parallel", hosts=2, hyperparameters={"epochs": 1}, data_dir=organizer_mnist,
                                     region=REGION, role=role.arn, wait=False, confirm_cost=True)
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in
                boto.client("sagemaker").describe_training_job(TrainingJobName=result.job_name)["InputDataConfig"]}
    room_mnist = f"s3://{BUCKET}/{MNIST.s3_prefix(ROOM_USER, '')}"
    assert channels["train"] == f"{room_mnist}/train" and channels["test"] == f"{room_mnist}/test"
    assert not [k for k in (o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]) if "/organizer/data/" in k]
    # ... which its execution role may read (and list), as SageMaker does to download it.
    for key in keys:
        assert _decision(boto, role.arn, "s3:GetObject", f"arn:aws:s3:::{BUCKET}/{key}") == "allowed", key
    listing = [{"ContextKeyName": "s3:prefix", "ContextKeyValues": [f"{MNIST.s3_prefix(ROOM_USER, '')}/train"],
                "ContextKeyType": "string"}]
    assert _decision(boto, role.arn, "s3:ListBucket", f"arn:aws:s3:::{BUCKET}", listing) == "allowed"
    # Other channels than the room's (here 4 digits, not the organizer's data): the job uploads its own.
    assert room_channel_uris(boto, BUCKET, MNIST.s3_prefix(ROOM_USER, ""), MNIST.prepared(data_dir).dirs) is None
    result = runner.run_on_sagemaker("data_parallel", hosts=2, hyperparameters={"epochs": 1, "batch-size": 2},
                                     data_dir=data_dir, region=REGION, role=role.arn, wait=False, confirm_cost=True)
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in
                boto.client("sagemaker").describe_training_job(TrainingJobName=result.job_name)["InputDataConfig"]}
    assert channels["train"] == f"s3://{BUCKET}/{MNIST.s3_prefix()}/train"


# --------------------------------------------------------------------------- the room's teardown


def _running_job(boto: Any, name: str, user: str | None, role_arn: str) -> None:
    import fake_aws_apis

    tags = [] if user is None else cloud.workshop_tags(user)
    boto.client("sagemaker").create_training_job(
        TrainingJobName=name, RoleArn=role_arn, Tags=tags,
        AlgorithmSpecification={"TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/x:1", "TrainingInputMode": "File"},
        OutputDataConfig={"S3OutputPath": f"s3://{BUCKET}/{name}"}, StoppingCondition={"MaxRuntimeInSeconds": 60},
        ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30})
    fake_aws_apis.set_training_job_status(name, "InProgress", region=REGION, account=ACCOUNT)


def _untagged_things(boto: Any) -> tuple[str, str, str]:
    """A notebook instance and two roles that are not the workshop's (one named like its roles)."""
    iam, sm = boto.client("iam"), boto.client("sagemaker")
    trust = json.dumps(cloud.trust_policy(account=ACCOUNT))
    arn = iam.create_role(RoleName="team-notebook", AssumeRolePolicyDocument=trust)["Role"]["Arn"]
    iam.create_role(RoleName=f"{aws.WORKSHOP_NAME}-lookalike", AssumeRolePolicyDocument=trust)
    sm.create_notebook_instance(NotebookInstanceName="team-analysis", InstanceType="ml.t3.medium", RoleArn=arn,
                                Tags=[{"Key": "team", "Value": "analytics"}])
    return "team-analysis", "team-notebook", f"{aws.WORKSHOP_NAME}-lookalike"


def _state(boto: Any) -> dict[str, Any]:
    sm, iam, ec2 = boto.client("sagemaker"), boto.client("iam"), boto.client("ec2")
    return {
        "notebooks": sorted(n["NotebookInstanceName"] for n in sm.list_notebook_instances()["NotebookInstances"]),
        "roles": sorted(r["RoleName"] for r in iam.list_roles()["Roles"]),
        "vpcs": sorted(v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]),
        "running": sorted(j["TrainingJobName"] for j in sm.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]),
    }


def test_event_cleanup_lists_first_refuses_unconfirmed_then_deletes_only_the_workshops(
        boto: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    deploy(boto, 2, with_network=True)
    iam = boto.client("iam")
    _running_job(boto, "attendee-01-data-parallel-20261124000001", "attendee-01",
                 iam.get_role(RoleName=cloud.role_name("attendee-01"))["Role"]["Arn"])
    monkeypatch.setenv(aws.USER_ENV, "solo-learner")  # someone's own workshop network, made outside the stack
    own = cloud.ensure_network(boto)
    notebook, role, lookalike = _untagged_things(boto)
    _running_job(boto, "team-job-1", None, iam.get_role(RoleName=role)["Role"]["Arn"])
    before = _state(boto)
    workshop = [{"Name": "tag:workshop", "Values": [aws.WORKSHOP_NAME]}]
    ours = {v["VpcId"] for v in boto.client("ec2").describe_vpcs(Filters=workshop)["Vpcs"]}
    assert len(ours) == 3 and own.vpc_id in ours

    # Not confirmed (no --yes, not a terminal): the list, exit status 2, nothing stopped or deleted.
    monkeypatch.setattr("sys.stdin", None)
    assert main(["event", "cleanup"]) == 2
    out, err = capsys.readouterr()
    assert "attendee-01-data-parallel-20261124000001" in out and "attendee-02" in out and own.vpc_id in out
    assert notebook not in out and lookalike not in out and "team-job-1" not in out
    assert "Nothing was stopped or deleted" in err and "--yes" in err
    assert _state(boto) == before

    # Confirmed: every workshop thing is gone, whoever's; the rest stays.
    done = event.cleanup(boto, confirm=True, show=False)
    assert "stopped training job attendee-01-data-parallel-20261124000001 (attendee-01)" in done
    after = _state(boto)
    assert after["notebooks"] == [notebook]
    assert after["roles"] == sorted([role, lookalike])
    assert after["running"] == ["team-job-1"]
    assert after["vpcs"] == sorted(set(before["vpcs"]) - ours)  # moto's default VPC stays
    assert sweep.inventory(boto).empty
    assert event.cleanup(boto, confirm=True, show=False) == []  # again: nothing to do


@pytest.mark.parametrize("with_network", [False, True])
def test_event_cleanup_deletes_the_stack_when_asked(boto: Any, capsys: pytest.CaptureFixture[str], with_network: bool) -> None:
    deploy(boto, 2, with_network=with_network)
    notebook, role, lookalike = _untagged_things(boto)
    assert main(["event", "cleanup", "--stack", "room", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "deleted stack room" in out
    if with_network:
        # moto's CloudFormation deletes no VPC endpoint, so its DeleteStack fails on the VPCs (DependencyViolation).
        # CloudFormation deletes them, but fails the same way on a VPC that still holds a stopped job's network
        # interfaces: either way what is left goes by its tags (with retries), then the stack is deleted again.
        assert "could not be deleted yet" in out and "deleted network of attendee-02" in out
    assert sweep.inventory(boto, stack="room").empty  # the stack too
    state = _state(boto)
    assert state["notebooks"] == [notebook] and state["roles"] == sorted([role, lookalike])


# --------------------------------------------------------------------------- every call an attendee's notebook makes

# IAM's action for an API operation where they differ (S3's reads and writes; the rest are the operation's name).
S3_ACTIONS = {"HeadObject": "GetObject", "HeadBucket": "ListBucket", "ListObjectsV2": "ListBucket",
              "ListObjects": "ListBucket", "ListBuckets": "ListAllMyBuckets", "CreateMultipartUpload": "PutObject",
              "UploadPart": "PutObject", "CompleteMultipartUpload": "PutObject", "DeleteObjects": "DeleteObject"}
NO_PERMISSION = {("sts", "GetCallerIdentity"), ("sts", "AssumeRole")}  # GetCallerIdentity needs none; AssumeRole is the test's


def _recorded_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, dict[str, Any]]]:
    """Every AWS API call any boto3 client of this process makes from now on: (IAM prefix, operation, params)."""
    from botocore.client import BaseClient

    calls: list[tuple[str, str, dict[str, Any]]] = []
    real = BaseClient._make_api_call

    def record(self: Any, operation: str, params: dict[str, Any]) -> Any:
        prefix = {"monitoring": "cloudwatch"}.get(self.meta.service_model.signing_name, self.meta.service_model.signing_name)
        calls.append((prefix, operation, dict(params)))
        return real(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", record)
    return calls


def _resource(prefix: str, operation: str, params: dict[str, Any], user: str) -> str | None:
    """The resource ARN IAM authorizes a call on, where the call names one (None: no resource type, or not derived)."""
    sagemaker = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}"
    if prefix == "s3" and "Key" in params:
        return f"arn:aws:s3:::{params['Bucket']}/{params['Key']}"
    if prefix == "s3" and "Bucket" in params and operation not in ("HeadBucket", "ListObjectsV2", "ListObjects"):
        return f"arn:aws:s3:::{params['Bucket']}"
    if prefix == "sagemaker" and "TrainingJobName" in params:
        return f"{sagemaker}:training-job/{params['TrainingJobName'].lower()}"
    if prefix == "sagemaker" and "HyperParameterTuningJobName" in params:
        return f"{sagemaker}:hyper-parameter-tuning-job/{params['HyperParameterTuningJobName'].lower()}"
    if prefix == "sagemaker" and "ResourceArn" in params:
        return params["ResourceArn"]
    if prefix == "iam" and "RoleName" in params:
        return f"arn:aws:iam::{ACCOUNT}:role/{params['RoleName']}"
    if prefix == "iam" and "PolicySourceArn" in params:
        return params["PolicySourceArn"]
    return None


def test_every_call_the_workshop_makes_from_an_attendees_notebook_is_allowed_by_its_role(
        boto: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data_dir: Path) -> None:
    """A job (in the stack's network), a tuning job and the notebooks' cleanup, run as attendee-01's
    notebook role on attendee-01's instance: every API call they make is one its policy allows, on
    the resource the call names (IAM's simulator, `fake_aws_apis`)."""
    from workshop import runner
    from workshop.search import Objective, SearchSpace

    deploy(boto, 1, with_network=True)
    boto.client("s3").create_bucket(Bucket=BUCKET)  # `event data` (or the SDK) makes it
    notebook_role = boto.client("iam").get_role(RoleName=stack.notebook_role_name("attendee-01"))["Role"]["Arn"]
    credentials = boto.client("sts").assume_role(RoleArn=notebook_role, RoleSessionName="SageMaker")["Credentials"]
    for name, key in (("AWS_ACCESS_KEY_ID", "AccessKeyId"), ("AWS_SECRET_ACCESS_KEY", "SecretAccessKey"),
                      ("AWS_SESSION_TOKEN", "SessionToken")):
        monkeypatch.setenv(name, credentials[key])
    on_instance(monkeypatch, tmp_path, "attendee-01")
    calls = _recorded_calls(monkeypatch)
    lab = get_lab("data_parallel")
    hps = {"epochs": 1, "batch-size": 2}
    runner.run_on_sagemaker(lab, hosts=2, hyperparameters=hps, data_dir=data_dir, region=REGION, network=True,
                            wait=False, confirm_cost=True)
    runner.run_on_sagemaker(lab, hosts=1, hyperparameters=hps, data_dir=data_dir, region=REGION, wait=False,
                            confirm_cost=True, space=SearchSpace.parse(lab, {"lr": [0.01, 0.02]}, fixed=hps),
                            objective=Objective.parse(lab, None), parallel=2)
    account.cleanup(show=False)
    monkeypatch.undo()  # the organizer's credentials again, and boto3 as it was, for the checks below

    policy = stack.notebook_policy(user="attendee-01", notebook_instance="attendee-01", job_keys=list(LABS),
                                   region=REGION, account=ACCOUNT, partition="aws", bucket=BUCKET)
    granted = {a for st in policy["Statement"] for a in st["Action"]}
    made = {(p, op) for p, op, _ in calls if (p, op) not in NO_PERMISSION}
    actions = {f"{p}:{S3_ACTIONS.get(op, op) if p == 's3' else op}" for p, op in made}
    assert {"sagemaker:CreateTrainingJob", "sagemaker:CreateHyperParameterTuningJob", "s3:PutObject",
            "iam:SimulatePrincipalPolicy", "ec2:DescribeVpcEndpoints"} <= actions  # the calls were seen
    assert actions - granted == set(), "calls the notebook role does not allow"
    denied = []
    for prefix, operation, params in calls:
        if (prefix, operation) in NO_PERMISSION:
            continue
        resource = _resource(prefix, operation, params, "attendee-01")
        action = f"{prefix}:{S3_ACTIONS.get(operation, operation) if prefix == 's3' else operation}"
        if resource and _decision(boto, notebook_role, action, resource) != "allowed":
            denied.append((action, resource))
    assert denied == []
