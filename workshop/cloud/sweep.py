"""A room's teardown: everything the workshop made in an account and region, whoever's, found by
the workshop's tags, listed, then stopped and deleted (`python -m workshop event cleanup`).

`inventory` only reads: running workshop tuning and training jobs, workshop notebook instances
(and the lifecycle configurations only they use), workshop networks (every user's), workshop roles
(execution and notebook roles), and the event's CloudFormation stack if named. `teardown` then, in
dependency order: stops the tuning jobs (which stops their trials) and the training jobs; deletes
the stack and waits for it; stops and deletes the notebook instances; deletes the networks, the
roles and the lifecycle configurations. Only what carries the tag `workshop=distributed-training-workshop`
is touched; running it again finds nothing.

SageMaker keeps a record of every training and tuning job; stopped jobs cost nothing and there is no
API to delete a training job, so "deleting" a job here means stopping it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workshop.cloud import aws
from workshop.cloud.common import POLL_S, TAG_USER, TAG_WORKSHOP, aws_error, code_of, poll, say
from workshop.cloud.network import NETWORK_TIMEOUT_S, delete_network
from workshop.errors import WorkshopError

STACK_TIMEOUT_S = 1800.0  # a stack stops its notebook instances before deleting them: minutes each
NOTEBOOK_TIMEOUT_S = 900.0  # InService -> Stopped takes a few minutes


@dataclass(frozen=True)
class Item:
    kind: str  # "tuning job", "training job", "notebook instance", "network", "role", "lifecycle configuration", "stack"
    name: str
    user: str = ""
    state: str = ""


@dataclass
class Inventory:
    stack: Item | None = None
    tuning_jobs: list[Item] = field(default_factory=list)
    training_jobs: list[Item] = field(default_factory=list)
    notebooks: list[Item] = field(default_factory=list)
    networks: list[Item] = field(default_factory=list)  # one per user: name = the user's VPC ids
    roles: list[Item] = field(default_factory=list)
    lifecycle_configs: list[Item] = field(default_factory=list)

    def items(self) -> list[Item]:
        return [*([self.stack] if self.stack else []), *self.tuning_jobs, *self.training_jobs, *self.notebooks,
                *self.networks, *self.roles, *self.lifecycle_configs]

    @property
    def empty(self) -> bool:
        return not self.items()

    def table(self) -> str:
        rows = [(i.kind, i.name, i.user or "-", i.state or "-") for i in self.items()]
        if not rows:
            return "nothing tagged by the workshop here"
        headers = ("what", "name", "user", "state")
        widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=True)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
        return "\n".join([line(headers), line(tuple("-" * w for w in widths)), *map(line, rows)])


def _tags(pairs: list[dict[str, str]]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in pairs}


def _ours(tags: dict[str, str]) -> bool:
    return tags.get(TAG_WORKSHOP) == aws.WORKSHOP_NAME


def _running_jobs(sm: Any, lister: str, key: str, prefix: str, kind: str) -> list[Item]:
    found = []
    for page in sm.get_paginator(lister).paginate(StatusEquals="InProgress"):
        for job in page[key]:
            tags = _tags(sm.list_tags(ResourceArn=job[f"{prefix}Arn"]).get("Tags", []))
            if _ours(tags):
                found.append(Item(kind, job[f"{prefix}Name"], tags.get(TAG_USER, ""), "InProgress"))
    return found


def _stack(cfn: Any, name: str) -> Item | None:
    from botocore.exceptions import ClientError

    try:
        stack = cfn.describe_stacks(StackName=name)["Stacks"][0]
    except ClientError as exc:
        if code_of(exc) == "ValidationError":  # "Stack with id X does not exist"
            return None
        raise
    if stack["StackStatus"] == "DELETE_COMPLETE":
        return None
    return Item("stack", name, "", stack["StackStatus"])


def inventory(session: Any = None, *, stack: str | None = None) -> Inventory:
    """Everything the workshop made here, by its tags (and the stack `stack`, if it exists). Reads only."""
    from botocore.exceptions import BotoCoreError, ClientError

    boto = aws.as_boto_session(session)
    sm, iam, ec2 = boto.client("sagemaker"), boto.client("iam"), boto.client("ec2")
    inv = Inventory()
    try:
        if stack:
            inv.stack = _stack(boto.client("cloudformation"), stack)
        inv.tuning_jobs = _running_jobs(sm, "list_hyper_parameter_tuning_jobs", "HyperParameterTuningJobSummaries",
                                        "HyperParameterTuningJob", "tuning job")
        inv.training_jobs = _running_jobs(sm, "list_training_jobs", "TrainingJobSummaries", "TrainingJob", "training job")
        configs: dict[str, bool] = {}  # lifecycle configuration -> used by a notebook instance that stays
        for page in sm.get_paginator("list_notebook_instances").paginate():
            for nb in page["NotebookInstances"]:
                tags = _tags(sm.list_tags(ResourceArn=nb["NotebookInstanceArn"]).get("Tags", []))
                config = nb.get("NotebookInstanceLifecycleConfigName")
                if _ours(tags):
                    inv.notebooks.append(Item("notebook instance", nb["NotebookInstanceName"], tags.get(TAG_USER, ""),
                                              nb.get("NotebookInstanceStatus", "")))
                    if config:
                        configs.setdefault(config, False)
                elif config:
                    configs[config] = True
        inv.lifecycle_configs = [Item("lifecycle configuration", c) for c, kept in sorted(configs.items()) if not kept]
        tag = [{"Name": f"tag:{TAG_WORKSHOP}", "Values": [aws.WORKSHOP_NAME]}]
        vpcs: dict[str, list[str]] = {}
        for vpc in ec2.describe_vpcs(Filters=tag)["Vpcs"]:
            vpcs.setdefault(_tags(vpc.get("Tags", [])).get(TAG_USER, ""), []).append(vpc["VpcId"])
        for address in ec2.describe_addresses(Filters=tag)["Addresses"]:  # a NAT's address, left by a partial delete
            vpcs.setdefault(_tags(address.get("Tags", [])).get(TAG_USER, ""), []).append(address["AllocationId"])
        inv.networks = [Item("network", ", ".join(ids), user) for user, ids in sorted(vpcs.items()) if user]
        for page in iam.get_paginator("list_roles").paginate():
            for role in page["Roles"]:
                if not role["RoleName"].startswith(aws.WORKSHOP_NAME):
                    continue  # every workshop role's name starts with it; others are not read
                tags = _tags(iam.list_role_tags(RoleName=role["RoleName"]).get("Tags", []))
                if _ours(tags):
                    inv.roles.append(Item("role", role["RoleName"], tags.get(TAG_USER, "")))
    except (BotoCoreError, ClientError) as exc:
        raise aws_error("Listing the workshop's resources failed", exc) from None
    return inv


def _tolerate(call: Callable[[], Any], *codes: str) -> bool:
    """Run `call`; False if AWS answered one of `codes` (already stopped, already gone)."""
    from botocore.exceptions import ClientError

    try:
        call()
        return True
    except ClientError as exc:
        if code_of(exc) in codes:
            return False
        raise


def _delete_stack(cfn: Any, name: str, timeout_s: float, poll_s: float) -> None:
    cfn.delete_stack(StackName=name)

    def gone() -> tuple[bool, str]:
        item = _stack(cfn, name)
        if item is None:
            return True, "DELETE_COMPLETE"
        if item.state == "DELETE_FAILED":
            reason = cfn.describe_stacks(StackName=name)["Stacks"][0].get("StackStatusReason", "no reason given")
            raise WorkshopError(f"Deleting the stack {name} failed: {reason}.",
                                "see its events in the CloudFormation console, then run `event cleanup` again.")
        return False, item.state

    poll(gone, f"the stack {name} to be deleted", timeout_s, poll_s)


def _notebook_state(sm: Any, name: str) -> str:
    from botocore.exceptions import ClientError

    try:
        return sm.describe_notebook_instance(NotebookInstanceName=name)["NotebookInstanceStatus"]
    except ClientError as exc:
        if code_of(exc) == "ValidationException":  # RecordNotFound: gone already
            return "Deleted"
        raise


def _delete_notebook(sm: Any, name: str, timeout_s: float, poll_s: float) -> bool:
    """Stop (waiting for Pending and Updating to settle), then delete; False if it was gone already."""
    def settled() -> tuple[bool, str]:
        state = _notebook_state(sm, name)
        if state == "InService":
            _tolerate(lambda: sm.stop_notebook_instance(NotebookInstanceName=name), "ValidationException")
            state = _notebook_state(sm, name)  # Stopping, for the few minutes a stop takes
        return state in ("Stopped", "Failed", "Deleting", "Deleted"), state

    poll(settled, f"notebook instance {name} to stop", timeout_s, poll_s)
    if _notebook_state(sm, name) in ("Deleting", "Deleted"):
        return False
    return _tolerate(lambda: sm.delete_notebook_instance(NotebookInstanceName=name), "ValidationException")


def _delete_role(iam: Any, name: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        for policy in iam.list_role_policies(RoleName=name)["PolicyNames"]:
            iam.delete_role_policy(RoleName=name, PolicyName=policy)
        for attached in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]:
            iam.detach_role_policy(RoleName=name, PolicyArn=attached["PolicyArn"])
        iam.delete_role(RoleName=name)
    except ClientError as exc:
        if code_of(exc) == "NoSuchEntity":
            return False
        raise
    return True


def teardown(session: Any, found: Inventory, *, timeout_s: float = STACK_TIMEOUT_S,
             network_timeout_s: float = NETWORK_TIMEOUT_S, poll_s: float = POLL_S) -> list[str]:
    """Stop and delete what `inventory` found, in dependency order; returns one line per thing done.
    Everything the stack deleted is then looked up again by its tags, so nothing is deleted twice."""
    from botocore.exceptions import BotoCoreError, ClientError

    boto = aws.as_boto_session(session)
    sm, iam = boto.client("sagemaker"), boto.client("iam")
    done: list[str] = []

    def did(line: str) -> None:
        done.append(line)
        say(line)

    try:
        for job in found.tuning_jobs:  # first: stopping one stops its trials, which are training jobs too
            if _tolerate(lambda j=job: sm.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName=j.name),
                         "ValidationException", "ResourceNotFound"):
                did(f"stopped tuning job {job.name} ({job.user})")
        for job in found.training_jobs:
            if _tolerate(lambda j=job: sm.stop_training_job(TrainingJobName=j.name),
                         "ValidationException", "ResourceNotFound"):
                did(f"stopped training job {job.name} ({job.user})")
        stack_left = None
        if found.stack:
            name = found.stack.name
            say(f"deleting the stack {name} (it stops and deletes its notebook instances: minutes)")
            try:
                _delete_stack(boto.client("cloudformation"), name, timeout_s, poll_s)
                did(f"deleted stack {name}")
            except (ClientError, WorkshopError) as exc:
                # E.g. a VPC that still holds a stopped job's network interfaces: what is left is
                # deleted by its tags below (with retries while AWS releases them), then the stack again.
                say(f"the stack {name} could not be deleted yet ({getattr(exc, 'message', exc)}); deleting what "
                    "is left by its tags, then the stack again")
                stack_left = name
            found = inventory(boto)  # what the stack did not make (or could not delete) is still there
        for nb in found.notebooks:
            if _delete_notebook(sm, nb.name, min(timeout_s, NOTEBOOK_TIMEOUT_S), poll_s):
                did(f"deleted notebook instance {nb.name} ({nb.user})")
        for net in found.networks:
            ids = delete_network(boto, user=net.user, timeout_s=network_timeout_s, poll_s=poll_s, include_stack=True)
            if ids:
                did(f"deleted network of {net.user}: {len(ids)} resource(s) ({', '.join(i for i in ids if i.startswith('vpc-'))})")
        for role in found.roles:
            if _delete_role(iam, role.name):
                did(f"deleted role {role.name}")
        for config in found.lifecycle_configs:
            if _tolerate(lambda c=config: sm.delete_notebook_instance_lifecycle_config(
                    NotebookInstanceLifecycleConfigName=c.name), "ValidationException"):
                did(f"deleted lifecycle configuration {config.name}")
        if stack_left:
            _delete_stack(boto.client("cloudformation"), stack_left, timeout_s, poll_s)
            did(f"deleted stack {stack_left}")
    except (BotoCoreError, ClientError) as exc:
        raise aws_error(f"The room's cleanup stopped (done so far: {len(done)} step(s)); run it again to go on", exc) from None
    return done
