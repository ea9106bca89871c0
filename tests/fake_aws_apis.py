"""AWS APIs that moto 5.2.5 lacks, answered the way the real services answer them.

    import fake_aws_apis
    fake_aws_apis.install()        # idempotent; every in-process client and moto server is covered
    ...                            # under moto's mock_aws()
    fake_aws_apis.uninstall()      # idempotent too

What it adds, by patching moto's response classes (as `tests/fake_sagemaker.py` patches
`SageMakerResponse.create_training_job`), so that every boto3 client in the process, whichever
session made it, is covered, and a `ThreadedMotoServer` too:

- **IAM `SimulatePrincipalPolicy` and `SimulateCustomPolicy`** (`IamResponse`). The principal's
  real policy documents are read from moto's IAM backend (a role's or user's inline policies and
  attached managed policies; for a user also its groups' inline and attached policies; for a
  group its own) and evaluated as IAM's policy simulator does:
  explicit Deny wins over any Allow; otherwise an Allow needs a statement that matches the
  action (`Action`/`NotAction`, `*` and `?` wildcards, case-insensitive), the resource
  (`Resource`/`NotResource`, wildcards, ARN segments matched one by one; no `ResourceArns`
  means the resource `*`, which only a `*` pattern matches, so a statement scoped to specific
  resources does NOT match it) and whose `Condition` holds for the supplied `ContextEntries`;
  everything else is an `implicitDeny`. A principal's permissions boundary (roles), or
  `PermissionsBoundaryPolicyInputList`, must allow the action too
  (`PermissionsBoundaryDecisionDetail`). Results: one per (action, resource), in that order,
  with `EvalDecision` `allowed`/`implicitDeny`/`explicitDeny`, `MatchedStatements` (the deny
  statements for an explicit deny, the allow statements for an allow, none for an implicit
  deny; `SourcePolicyId`, `SourcePolicyType` and the statement's start and end in the document
  as 1-based line/column, the end being the column after its closing brace),
  `MissingContextValues` (condition keys of matching statements that the request did not
  supply; under `ResourceSpecificResults` when `ResourceArns` were given), and `MaxItems`/
  `Marker`/`IsTruncated` pagination. moto's serializer writes the XML from botocore's own
  model of the operation, so botocore parses exactly the documented structure.

  Conditions: the operators `String*` (Equals, NotEquals, EqualsIgnoreCase,
  NotEqualsIgnoreCase, Like, NotLike), `Arn*` (Equals, Like, NotEquals, NotLike), `Numeric*`,
  `Date*`, `Bool`, `IpAddress`/`NotIpAddress` and `Null`, with `...IfExists` and the
  `ForAllValues:`/`ForAnyValue:` set qualifiers; a key absent from the context makes a
  positive operator false and a negated one (`StringNotEquals`, `ArnNotLike`, ...) true, as IAM
  documents (so a statement conditioned on a key the simulation does not supply does not
  apply). Policy variables (`${aws:username}`, `${key, 'default'}`, `${*}`, `${?}`, `${$}`) in
  resources and string values are resolved from the context; an unresolved one matches nothing.
  **Not evaluated, on purpose conservative:** any other operator (`Binary*`, anything unknown)
  makes an Allow statement not apply and a Deny statement apply, so the fake never allows what
  IAM might deny. Not simulated at all (the call raises `NotImplementedError`, as moto does for
  what it lacks): resource-based policies (`ResourcePolicy`, `ResourceOwner`, `CallerArn`),
  `ResourceHandlingOption`, `PolicyExclusionList`, and Organizations policies
  (`OrderedOrganizationPolicyInputList`; no SCP is ever applied).

- **SageMaker `StopTrainingJob`** (`SageMakerResponse`). An `InProgress` job becomes `Stopping`
  (status and secondary status, with a `SecondaryStatusTransitions` entry), then `on_stop` (if
  set) is called with the job's name, then the job is `Stopped` unless the hook already moved it
  on. Stopping a job in any other status fails like the real service: `ValidationException`,
  "The request was rejected because the training job is in status Completed." An unknown job
  is a `ValidationException` "Requested resource not found." (what the service answers for
  training jobs; its API reference lists `ResourceNotFound`, so callers should accept both).

- **SageMaker `ListTrainingJobsForHyperParameterTuningJob`** (`SageMakerResponse`). The training
  jobs of a tuning job are moto's training jobs that `link_trial()` tied to it (DescribeTrainingJob
  then says `TuningJobArn`); each is summarised (`trial_summary()`) from moto's own objects:
  `TrainingJobName`, `TrainingJobArn`, `TuningJobName`, `CreationTime`, `TrainingStartTime`,
  `TrainingEndTime` (once ended), `TrainingJobStatus`, `TunedHyperParameters` (the job's values of
  the tuning job's ParameterRanges), `FailureReason` (if any),
  `FinalHyperParameterTuningJobObjectiveMetric` (the job's FinalMetricDataList value of the
  objective metric, with the objective's Type) and `ObjectiveStatus` (Pending while it runs;
  Succeeded once Completed or Stopped with the metric; Failed otherwise). As documented:
  `StatusEquals` filters, `SortBy` Name (default), CreationTime, Status or
  FinalObjectiveMetricValue (which leaves out the jobs without the metric), `SortOrder` Ascending
  (default) or Descending, `MaxResults` 1-100 (default 10) with `NextToken`. An unknown tuning job
  is `ResourceNotFound` (moto's DescribeHyperParameterTuningJob answer).

- **SageMaker `StopHyperParameterTuningJob`** (`SageMakerResponse`). An `InProgress` tuning job
  becomes `Stopping`, and each of its `InProgress` training jobs is stopped as StopTrainingJob
  stops one (through `on_stop`); the tuning job is `Stopped` once none of them runs any more,
  unless whoever launches its training jobs (`tests/fake_sagemaker.py` sets the moto object's
  `launching` while it does) ends it. Any other status: `ValidationException` "The request was
  rejected because the tuning job is in status Completed." (StopTrainingJob's wording).

- **CloudFormation `AWS::SageMaker::NotebookInstance` as CloudFormation creates it**
  (`FakeSagemakerNotebookInstance`). moto names the instance `<stack>-<logical id>-<random>` and
  keeps only `InstanceType` and `RoleArn`; CloudFormation uses `NotebookInstanceName` and every
  other property. Here the instance gets its name, `Tags`, `VolumeSizeInGB`, `LifecycleConfigName`,
  `DefaultCodeRepository`, `AdditionalCodeRepositories`, `DirectInternetAccess`, `RootAccess`,
  `SubnetId` and `SecurityGroupIds` (moto's own `CreateNotebookInstance` checks them); moto has no
  field for `PlatformIdentifier`, which is not kept.

- **CloudFormation tags on EC2 resources** (`ResourceMap.create`). moto's CloudFormation tags every
  EC2 resource with the stack's `aws:cloudformation:*` tags but drops some resources' own `Tags`
  property (`AWS::EC2::VPCEndpoint`'s); CloudFormation applies them. Here each EC2 resource of a new
  stack gets its `Tags`, with their intrinsic functions (`Ref: AWS::StackName`) resolved. And an
  `AWS::IAM::Role`'s inline `Policies` are kept as JSON text, as IAM keeps every policy document
  (moto keeps CloudFormation's as a Python dict, whose `GetRolePolicy` answer is its `repr`).

- **CloudFormation `AWS::EC2::SubnetRouteTableAssociation`** (`SubnetRouteTableAssociation`). moto
  records it aside and leaves the route table with no association; CloudFormation associates the
  subnet with the route table (DescribeRouteTables lists it), and the stack's deletion disassociates it.

`on_stop`: None by default; `tests/fake_sagemaker.py` sets it to a callable(job_name) that
really stops a job it is running (and returns True: the job is then left `Stopping` for the fake
to end). `set_training_job_status()` moves a moto job to another status (moto completes every job
at once, so a test that needs a running job sets `InProgress`).
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

__all__ = [
    "Evaluation",
    "SourcePolicy",
    "evaluate",
    "install",
    "installed",
    "link_trial",
    "on_stop",
    "set_training_job_status",
    "simulate",
    "trial_summary",
    "tuned_names",
    "tuning_trials",
    "uninstall",
]

# Called with the job name by StopTrainingJob (and for each running trial by
# StopHyperParameterTuningJob), after the job is marked Stopping (None: no hook). A hook that
# returns True has started the stop and ends the job itself; otherwise the job is then Stopped.
on_stop: Callable[[str], Any] | None = None

_lock = threading.Lock()
_saved: dict[tuple[type, str], Any] = {}  # (class, attribute) -> what was there (_MISSING: nothing)
_MISSING = object()
DEFAULT_MAX_ITEMS = 100

# --------------------------------------------------------------------------- policies


@dataclass(frozen=True)
class SourcePolicy:
    """One policy document in a simulation, named as the simulator names it."""

    policy_id: str  # SourcePolicyId: the inline policy's name, the managed policy's name, "PolicyInputList.1"
    policy_type: str  # SourcePolicyType: user, group, role, aws-managed, user-managed, none
    document: Mapping[str, Any]
    text: str | None = None  # the document as stored (for statement positions)

    @classmethod
    def parse(cls, policy_id: str, policy_type: str, document: str | Mapping[str, Any]) -> SourcePolicy:
        if isinstance(document, str):
            text = document
            try:
                parsed = json.loads(text)
            except ValueError:
                text = unquote(document)  # IAM hands documents out URL-encoded
                parsed = json.loads(text)
            return cls(policy_id, policy_type, parsed, text)
        return cls(policy_id, policy_type, document, None)

    def statements(self) -> list[Mapping[str, Any]]:
        statements = self.document.get("Statement", [])
        return [statements] if isinstance(statements, Mapping) else list(statements)


@dataclass
class Evaluation:
    """The simulator's verdict for one action on one resource."""

    action: str
    resource: str
    decision: str  # allowed, implicitDeny, explicitDeny
    matched: list[tuple[SourcePolicy, int]] = field(default_factory=list)  # (policy, statement index)
    missing_context: list[str] = field(default_factory=list)
    allowed_by_boundary: bool | None = None  # None: no permissions boundary


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return [value] if isinstance(value, (str, int, float, bool)) else list(value)


_VARIABLE = re.compile(r"\$\{([^}]*)\}")


def _pattern_regex(pattern: str, context: Mapping[str, list[str]], *, wildcards: bool,
                   ignore_case: bool = False) -> re.Pattern[str] | None:
    """A regex for an IAM pattern: `*` and `?` wildcards (if `wildcards`), policy variables
    resolved from `context`. None when a variable cannot be resolved (it matches nothing)."""
    out: list[str] = []
    pos = 0
    for m in _VARIABLE.finditer(pattern):
        out.append(_glob_part(pattern[pos : m.start()], wildcards))
        name = m.group(1).strip()
        if name in ("*", "?", "$"):
            out.append(re.escape(name))
        else:
            default = None
            if "," in name:
                name, _, rest = name.partition(",")
                name, rest = name.strip(), rest.strip()
                if len(rest) >= 2 and rest[0] == rest[-1] == "'":
                    default = rest[1:-1]
            values = context.get(name.lower())
            if values is not None and len(values) == 1:
                out.append(re.escape(values[0]))
            elif default is not None:
                out.append(re.escape(default))
            else:
                return None
        pos = m.end()
    out.append(_glob_part(pattern[pos:], wildcards))
    return re.compile("".join(out), re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def _glob_part(text: str, wildcards: bool) -> str:
    if not wildcards:
        return re.escape(text)
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in text)


def _glob(pattern: str, value: str, context: Mapping[str, list[str]], *, ignore_case: bool = False) -> bool:
    regex = _pattern_regex(pattern, context, wildcards=True, ignore_case=ignore_case)
    return regex is not None and regex.fullmatch(value) is not None


def _action_matches(pattern: str, action: str) -> bool:
    # Actions are case-insensitive; no policy variables there.
    return _glob(pattern, action, {}, ignore_case=True)


def _resource_matches(pattern: str, resource: str, context: Mapping[str, list[str]]) -> bool:
    """ARN patterns match segment by segment (a wildcard in the region does not reach into the
    account); the last segment, the resource itself, may contain ':' and '/'. A resource of
    `*` (no ResourceArns) is matched by `*` only."""
    if pattern == "*":
        return True
    p_parts = pattern.split(":", 5)
    r_parts = resource.split(":", 5)
    if len(p_parts) == 6 and len(r_parts) == 6 and p_parts[0] == "arn":
        return all(_glob(p, r, context) for p, r in zip(p_parts, r_parts, strict=True))
    return _glob(pattern, resource, context)


# Condition operators: name -> (kind, negated)
_OPERATORS: dict[str, tuple[str, bool]] = {
    "stringequals": ("string", False),
    "stringnotequals": ("string", True),
    "stringequalsignorecase": ("string-ci", False),
    "stringnotequalsignorecase": ("string-ci", True),
    "stringlike": ("like", False),
    "stringnotlike": ("like", True),
    "arnequals": ("arn", False),
    "arnlike": ("arn", False),
    "arnnotequals": ("arn", True),
    "arnnotlike": ("arn", True),
    "numericequals": ("num-eq", False),
    "numericnotequals": ("num-eq", True),
    "numericlessthan": ("num-lt", False),
    "numericlessthanequals": ("num-le", False),
    "numericgreaterthan": ("num-gt", False),
    "numericgreaterthanequals": ("num-ge", False),
    "dateequals": ("date-eq", False),
    "datenotequals": ("date-eq", True),
    "datelessthan": ("date-lt", False),
    "datelessthanequals": ("date-le", False),
    "dategreaterthan": ("date-gt", False),
    "dategreaterthanequals": ("date-ge", False),
    "bool": ("bool", False),
    "ipaddress": ("ip", False),
    "notipaddress": ("ip", True),
}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _date(text: str) -> _dt.datetime | None:
    text = str(text).strip()
    number = _number(text)
    if number is not None:
        return _dt.datetime.fromtimestamp(number, tz=_dt.UTC)
    try:
        parsed = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=_dt.UTC)


_ORDER = {
    "eq": lambda a, b: a == b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}


def _value_matches(kind: str, value: str, expected: str, context: Mapping[str, list[str]]) -> bool:
    """One context value against one policy value, for the positive form of the operator."""
    value, expected = str(value), str(expected)
    if kind == "string":
        regex = _pattern_regex(expected, context, wildcards=False)
        return regex is not None and regex.fullmatch(value) is not None
    if kind == "string-ci":
        regex = _pattern_regex(expected, context, wildcards=False, ignore_case=True)
        return regex is not None and regex.fullmatch(value) is not None
    if kind == "like":
        return _glob(expected, value, context)
    if kind == "arn":
        return _resource_matches(expected, value, context) if expected != "*" else True
    if kind == "bool":
        return value.lower() == expected.lower()
    if kind.startswith("num-"):
        a, b = _number(value), _number(expected)
        return a is not None and b is not None and _ORDER[kind[4:]](a, b)
    if kind.startswith("date-"):
        a, b = _date(value), _date(expected)
        return a is not None and b is not None and _ORDER[kind[5:]](a, b)
    if kind == "ip":
        try:
            return ipaddress.ip_address(value) in ipaddress.ip_network(expected, strict=False)
        except ValueError:
            return False
    raise AssertionError(kind)


def _condition_holds(condition: Mapping[str, Any], context: Mapping[str, list[str]],
                     missing: set[str]) -> bool | None:
    """True/False, or None when an operator is not evaluated here (see the module docstring).
    Adds the keys the condition names but the context lacks to `missing`."""
    verdict: bool | None = True
    for operator, block in condition.items():
        name = operator
        qualifier = ""
        if ":" in name:
            qualifier, _, name = name.partition(":")
            qualifier = qualifier.lower()
            if qualifier not in ("forallvalues", "foranyvalue"):
                return None
        if_exists = name.lower().endswith("ifexists")
        base = name[: -len("IfExists")] if if_exists else name
        if not isinstance(block, Mapping):
            return None
        for key, expected in block.items():
            expected_values = [str(v).lower() if isinstance(v, bool) else str(v) for v in _as_list(expected)]
            values = context.get(key.lower())
            if base.lower() == "null":
                if values is None:
                    missing.add(key)
                want_absent = any(v.lower() == "true" for v in expected_values)
                holds = (values is None) == want_absent
            elif base.lower() not in _OPERATORS:
                return None
            else:
                kind, negated = _OPERATORS[base.lower()]
                if values is None:
                    missing.add(key)
                    holds = if_exists or qualifier == "forallvalues" or (negated and qualifier != "foranyvalue")
                else:
                    def positive(v: str, kind: str = kind, expected: list[str] = expected_values) -> bool:
                        return any(_value_matches(kind, v, e, context) for e in expected)

                    if qualifier == "forallvalues":
                        holds = all((not positive(v)) if negated else positive(v) for v in values)
                    elif qualifier == "foranyvalue":
                        holds = any((not positive(v)) if negated else positive(v) for v in values)
                    elif negated:
                        holds = not any(positive(v) for v in values)
                    else:
                        holds = any(positive(v) for v in values)
            if not holds:
                verdict = False
    return verdict


def _statement_applies(statement: Mapping[str, Any], action: str, resource: str,
                       context: Mapping[str, list[str]], missing: set[str]) -> bool | None:
    """Whether the statement covers this request: True, False, or None (not evaluated here)."""
    if "Action" in statement:
        if not any(_action_matches(p, action) for p in _as_list(statement["Action"])):
            return False
    elif "NotAction" in statement:
        if any(_action_matches(p, action) for p in _as_list(statement["NotAction"])):
            return False
    else:
        return False
    if "Resource" in statement:
        if not any(_resource_matches(p, resource, context) for p in _as_list(statement["Resource"])):
            return False
    elif "NotResource" in statement:
        if any(_resource_matches(p, resource, context) for p in _as_list(statement["NotResource"])):
            return False
    else:
        return False
    condition = statement.get("Condition")
    if not condition:
        return True
    if not isinstance(condition, Mapping):
        return None
    return _condition_holds(condition, context, missing)


def _context(entries: Iterable[Mapping[str, Any]] | Mapping[str, Any] | None) -> dict[str, list[str]]:
    """ContextEntries (or a plain {key: value(s)} mapping) as lower-case key -> string values."""
    out: dict[str, list[str]] = {}
    if entries is None:
        return out
    if isinstance(entries, Mapping):
        items = [(k, v) for k, v in entries.items()]
    else:
        items = [(e["ContextKeyName"], e.get("ContextKeyValues", [])) for e in entries]
    for key, values in items:
        out.setdefault(str(key).lower(), []).extend(
            str(v).lower() if isinstance(v, bool) else str(v) for v in _as_list(values)
        )
    return out


def _verdict(policies: Sequence[SourcePolicy], action: str, resource: str,
             context: Mapping[str, list[str]], missing: set[str]) -> tuple[str, list[tuple[SourcePolicy, int]]]:
    allows: list[tuple[SourcePolicy, int]] = []
    denies: list[tuple[SourcePolicy, int]] = []
    for policy in policies:
        for index, statement in enumerate(policy.statements()):
            effect = statement.get("Effect")
            applies = _statement_applies(statement, action, resource, context, missing)
            if effect == "Deny" and applies is not False:  # not evaluated: a Deny applies
                denies.append((policy, index))
            elif effect == "Allow" and applies is True:  # not evaluated: an Allow does not
                allows.append((policy, index))
    if denies:
        return "explicitDeny", denies
    if allows:
        return "allowed", allows
    return "implicitDeny", []


def evaluate(policies: Sequence[SourcePolicy], action: str, resource: str = "*",
             context: Iterable[Mapping[str, Any]] | Mapping[str, Any] | None = None,
             boundary: Sequence[SourcePolicy] | None = None) -> Evaluation:
    """IAM's verdict on `action` over `resource` under identity `policies` (and a permissions
    `boundary`, if any), with the request context `context` (ContextEntries, or {key: values})."""
    ctx = _context(context)
    missing: set[str] = set()
    decision, matched = _verdict(policies, action, resource, ctx, missing)
    allowed_by_boundary = None
    if boundary is not None:
        b_decision, b_matched = _verdict(boundary, action, resource, ctx, missing)
        allowed_by_boundary = b_decision == "allowed"
        if b_decision == "explicitDeny" and decision != "explicitDeny":
            decision, matched = "explicitDeny", b_matched
        elif decision == "allowed" and not allowed_by_boundary:
            decision, matched = "implicitDeny", []
    return Evaluation(action=action, resource=resource, decision=decision, matched=matched,
                      missing_context=sorted(missing), allowed_by_boundary=allowed_by_boundary)


def simulate(documents: Sequence[str | Mapping[str, Any]], action: str, resource: str = "*",
             context: Iterable[Mapping[str, Any]] | Mapping[str, Any] | None = None) -> str:
    """The decision for plain policy documents (as SimulateCustomPolicy would give it)."""
    policies = [SourcePolicy.parse(f"PolicyInputList.{i}", "none", d) for i, d in enumerate(documents, 1)]
    return evaluate(policies, action, resource, context).decision


# --------------------------------------------------------------------------- statement positions


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _statement_spans(text: str) -> list[tuple[int, int]]:
    """Character offsets (start, end) of each statement object in a policy document's text."""
    decoder = json.JSONDecoder()
    i = _skip_ws(text, 0)
    if text[i : i + 1] != "{":
        return []
    i += 1
    while True:
        i = _skip_ws(text, i)
        if text[i : i + 1] == "}":
            return []
        key, i = decoder.raw_decode(text, i)
        i = _skip_ws(text, i)
        i = _skip_ws(text, i + 1)  # past ':'
        if key == "Statement":
            if text[i] == "{":
                _, end = decoder.raw_decode(text, i)
                return [(i, end)]
            spans = []
            i += 1  # past '['
            while True:
                i = _skip_ws(text, i)
                if text[i] == "]":
                    return spans
                _, end = decoder.raw_decode(text, i)
                spans.append((i, end))
                i = _skip_ws(text, end)
                if text[i] == ",":
                    i += 1
        _, i = decoder.raw_decode(text, i)
        i = _skip_ws(text, i)
        if text[i : i + 1] == ",":
            i += 1


def _position(text: str, offset: int) -> dict[str, int]:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return {"Line": line, "Column": column}


def _statement_shape(policy: SourcePolicy, index: int) -> dict[str, Any]:
    out: dict[str, Any] = {"SourcePolicyId": policy.policy_id, "SourcePolicyType": policy.policy_type}
    if policy.text is not None:
        try:
            spans = _statement_spans(policy.text)
        except (ValueError, IndexError):
            spans = []
        if index < len(spans):
            start, end = spans[index]
            out["StartPosition"] = _position(policy.text, start)
            out["EndPosition"] = _position(policy.text, end)
    return out


# --------------------------------------------------------------------------- IAM handlers


def _iam_errors() -> Any:
    from moto.iam import exceptions

    return exceptions


def _principal_policies(backend: Any, arn: str, account: str) -> tuple[list[SourcePolicy], list[SourcePolicy] | None]:
    """(identity policies, permissions boundary or None) of the user, group or role `arn`."""
    errors = _iam_errors()
    match = re.fullmatch(r"arn:aws[a-z-]*:iam::(\d{12}):(user|group|role)/(?:[\w+=,.@/-]*/)?([\w+=,.@-]+)", arn or "")
    if not match:
        raise errors.InvalidInput(f"Invalid ARN {arn!r} for PolicySourceArn: use the ARN of a user, group or role.")
    arn_account, kind, name = match.groups()
    if arn_account != account:
        raise errors.NoSuchEntity(f"The {kind} with name {name} cannot be found.")

    def managed(entity: Any) -> list[SourcePolicy]:
        out = []
        for policy_arn, policy in entity.managed_policies.items():
            version = next((v for v in policy.versions if v.is_default), policy.versions[0])
            kind_ = "aws-managed" if ":iam::aws:policy/" in policy_arn else "user-managed"
            out.append(SourcePolicy.parse(policy.name, kind_, version.document))
        return out

    def inline(entity: Any, kind_: str) -> list[SourcePolicy]:
        return [SourcePolicy.parse(name_, kind_, doc) for name_, doc in entity.policies.items()]

    try:
        if kind == "role":
            entity = backend.get_role(name)
        elif kind == "user":
            entity = backend.get_user(name)
        else:
            entity = backend.get_group(name)
    except errors.IAMException:
        raise errors.NoSuchEntity(f"The {kind} with name {name} cannot be found.") from None
    policies = inline(entity, kind) + managed(entity)
    if kind == "user":
        for group in backend.get_groups_for_user(name):
            policies += inline(group, "group") + managed(group)
    boundary = None
    boundary_arn = getattr(entity, "permissions_boundary_arn", None)
    if boundary_arn:
        policy = backend.get_policy(boundary_arn)
        version = next((v for v in policy.versions if v.is_default), policy.versions[0])
        kind_ = "aws-managed" if ":iam::aws:policy/" in boundary_arn else "user-managed"
        boundary = [SourcePolicy.parse(policy.name, kind_, version.document)]
    return policies, boundary


def _input_policies(response: Any, param: str) -> list[SourcePolicy]:
    errors = _iam_errors()
    out = []
    for i, text in enumerate(response._get_param(param) or [], 1):
        try:
            out.append(SourcePolicy.parse(f"{param}.{i}", "none", text))
        except ValueError:
            raise errors.InvalidInput(f"{param}.{i} is not a valid JSON policy document.") from None
    return out


def _refuse_unsimulated(response: Any, params: Sequence[str]) -> None:
    given = [p for p in params if response._get_param(p)]
    if given:
        raise NotImplementedError(
            f"fake_aws_apis does not simulate {', '.join(given)} (resource-based, Organizations "
            "and scenario policies); see tests/fake_aws_apis.py"
        )


def _simulation_result(response: Any, policies: list[SourcePolicy], boundary: list[SourcePolicy] | None) -> Any:
    from moto.core.responses import ActionResult

    errors = _iam_errors()
    actions = response._get_param("ActionNames") or []
    resource_arns = response._get_param("ResourceArns") or []
    context = response._get_param("ContextEntries") or []
    resources = resource_arns or ["*"]
    results = []
    for action in actions:
        for resource in resources:
            ev = evaluate(policies, action, resource, context, boundary)
            matched = [_statement_shape(p, i) for p, i in ev.matched]
            result: dict[str, Any] = {
                "EvalActionName": action,
                "EvalResourceName": resource,
                "EvalDecision": ev.decision,
                "MatchedStatements": matched,
                "MissingContextValues": ev.missing_context if not resource_arns else [],
            }
            if ev.allowed_by_boundary is not None:
                result["PermissionsBoundaryDecisionDetail"] = {"AllowedByPermissionsBoundary": ev.allowed_by_boundary}
            if resource_arns:
                specific: dict[str, Any] = {
                    "EvalResourceName": resource,
                    "EvalResourceDecision": ev.decision,
                    "MatchedStatements": matched,
                    "MissingContextValues": ev.missing_context,
                }
                if ev.allowed_by_boundary is not None:
                    specific["PermissionsBoundaryDecisionDetail"] = {
                        "AllowedByPermissionsBoundary": ev.allowed_by_boundary
                    }
                result["ResourceSpecificResults"] = [specific]
            results.append(result)
    marker = response._get_param("Marker")
    start = 0
    if marker:
        if not str(marker).isdigit() or int(marker) > len(results):
            raise errors.InvalidInput(f"Invalid Marker {marker!r}.")
        start = int(marker)
    max_items = int(response._get_param("MaxItems") or DEFAULT_MAX_ITEMS)
    if not 1 <= max_items <= 1000:
        raise errors.InvalidInput("MaxItems must be between 1 and 1000.")
    page = results[start : start + max_items]
    out: dict[str, Any] = {"EvaluationResults": page, "IsTruncated": start + max_items < len(results)}
    if out["IsTruncated"]:
        out["Marker"] = str(start + max_items)
    return ActionResult(out)


def _simulate_principal_policy(self: Any) -> Any:
    _refuse_unsimulated(self, ("ResourcePolicy", "ResourceOwner", "CallerArn", "ResourceHandlingOption",
                               "PolicyExclusionList"))
    policies, boundary = _principal_policies(self.backend, self._get_param("PolicySourceArn"), self.current_account)
    policies += _input_policies(self, "PolicyInputList")
    given_boundary = _input_policies(self, "PermissionsBoundaryPolicyInputList")
    return _simulation_result(self, policies, given_boundary or boundary)


def _simulate_custom_policy(self: Any) -> Any:
    _refuse_unsimulated(self, ("ResourcePolicy", "ResourceOwner", "CallerArn", "ResourceHandlingOption",
                               "OrderedOrganizationPolicyInputList"))
    boundary = _input_policies(self, "PermissionsBoundaryPolicyInputList")
    return _simulation_result(self, _input_policies(self, "PolicyInputList"), boundary or None)


# --------------------------------------------------------------------------- SageMaker handlers


def _now() -> _dt.datetime:
    from moto.core.utils import utcnow

    return utcnow()


_STATUS_MESSAGES = {
    "Starting": "Preparing the instances for training",
    "Training": "Training image download completed. Training in progress.",
    "Stopping": "Stopping the training job",
    "Stopped": "Training job stopped",
    "Completed": "Training job completed",
    "Failed": "Training job failed",
}
_SECONDARY = {"InProgress": "Training", "Stopping": "Stopping", "Stopped": "Stopped",
              "Completed": "Completed", "Failed": "Failed"}


def _transition(job: Any, status: str, secondary: str | None = None) -> None:
    """Move a moto training job to `status`, recording the secondary-status transition."""
    now = _now()
    secondary = secondary or _SECONDARY[status]
    transitions = list(getattr(job, "secondary_status_transitions", None) or [])
    if transitions and transitions[-1].get("EndTime") is None:
        transitions[-1] = {**transitions[-1], "EndTime": now}  # the previous phase ends now
    entry: dict[str, Any] = {"Status": secondary, "StartTime": now,
                             "StatusMessage": _STATUS_MESSAGES.get(secondary, secondary)}
    if status in ("Stopped", "Completed", "Failed"):
        entry["EndTime"] = now
    transitions.append(entry)
    job.secondary_status_transitions = transitions
    job.training_job_status = status
    job.secondary_status = secondary
    job.last_modified_time = now
    if status in ("Stopped", "Completed", "Failed"):
        job.training_end_time = now
    else:
        job.training_end_time = None


def set_training_job_status(job_name: str, status: str, *, region: str = "us-east-1",
                            account: str = "123456789012", secondary: str | None = None) -> Any:
    """Put moto's training job `job_name` in `status` (e.g. InProgress, which moto never reports
    by itself), with a SecondaryStatusTransitions entry; returns moto's job object."""
    from moto.sagemaker.models import sagemaker_backends

    job = sagemaker_backends[account][region].training_jobs[job_name]
    if status == "InProgress":
        # A running job has no end yet.
        job.secondary_status_transitions = [
            {"Status": "Starting", "StartTime": job.creation_time, "EndTime": job.creation_time,
             "StatusMessage": _STATUS_MESSAGES["Starting"]}
        ]
    _transition(job, status, secondary)
    return job


def _stop_training_job(self: Any) -> Any:
    from moto.core.responses import EmptyResult
    from moto.sagemaker.exceptions import ValidationError

    name = self._get_param("TrainingJobName")
    job = self.sagemaker_backend.training_jobs.get(name)
    if job is None:
        raise ValidationError(message="Requested resource not found.")
    if job.training_job_status != "InProgress":
        raise ValidationError(
            message=f"The request was rejected because the training job is in status {job.training_job_status}."
        )
    _stop_running_training_job(job)
    return EmptyResult()


def _stop_running_training_job(job: Any) -> bool:
    """InProgress -> Stopping, the `on_stop` hook, then Stopped unless the hook moved the job on or
    answered True (the stop is under way: whoever runs the job ends it). True when still Stopping."""
    _transition(job, "Stopping")
    hook = on_stop
    under_way = hook(job.training_job_name) is True if hook is not None else False
    if job.training_job_status == "Stopping" and not under_way:
        _transition(job, "Stopped")
    return job.training_job_status == "Stopping"


# --------------------------------------------------------------------------- SageMaker tuning jobs

_TUNING_RANGE_KEYS = ("IntegerParameterRanges", "ContinuousParameterRanges", "CategoricalParameterRanges")


def link_trial(trial: Any, tuning_job: Any) -> None:
    """Make moto's training job `trial` one of `tuning_job`'s training jobs (DescribeTrainingJob
    then says `TuningJobArn`, and the tuning APIs below list it)."""
    trial.tuning_job_arn = tuning_job.arn


def tuning_trials(backend: Any, tuning_job: Any) -> list[Any]:
    """The training jobs a tuning job launched, oldest first."""
    # list() copies the jobs at once: the fake adds trials from another thread meanwhile
    trials = [j for j in list(backend.training_jobs.values()) if getattr(j, "tuning_job_arn", None) == tuning_job.arn]
    return sorted(trials, key=lambda j: (j.creation_time, j.training_job_name))


def tuned_names(tuning_job: Any) -> list[str]:
    ranges = (tuning_job.hyper_parameter_tuning_job_config or {}).get("ParameterRanges") or {}
    return [r["Name"] for key in _TUNING_RANGE_KEYS for r in ranges.get(key) or []]


def trial_summary(trial: Any, tuning_job: Any) -> dict[str, Any]:
    """A HyperParameterTrainingJobSummary of `trial`, from what moto's objects hold: its status and
    times, its values of the tuned hyperparameters, and its final value of the tuning objective
    (FinalMetricDataList), with ObjectiveStatus Pending while it runs, Succeeded when it ended
    (Completed, or Stopped) having reported the objective, Failed otherwise."""
    objective = (tuning_job.hyper_parameter_tuning_job_config or {}).get("HyperParameterTuningJobObjective") or {}
    status = trial.training_job_status
    summary: dict[str, Any] = {
        "TrainingJobName": trial.training_job_name,
        "TrainingJobArn": trial.arn,
        "TuningJobName": tuning_job.hyper_parameter_tuning_job_name,
        "CreationTime": trial.creation_time,
        "TrainingStartTime": getattr(trial, "training_start_time", None),
        "TrainingJobStatus": status,
        "TunedHyperParameters": {k: trial.hyper_parameters[k] for k in tuned_names(tuning_job)
                                 if k in (trial.hyper_parameters or {})},
    }
    if status in ("Completed", "Failed", "Stopped") and getattr(trial, "training_end_time", None):
        summary["TrainingEndTime"] = trial.training_end_time
    reason = getattr(trial, "failure_reason", None)
    if reason:
        summary["FailureReason"] = reason
    value = next((m["Value"] for m in getattr(trial, "final_metric_data_list", None) or []
                  if objective and m.get("MetricName") == objective.get("MetricName")), None)
    if value is not None:
        summary["FinalHyperParameterTuningJobObjectiveMetric"] = {
            "Type": objective["Type"], "MetricName": objective["MetricName"], "Value": float(value)}
    if status in ("InProgress", "Stopping"):
        summary["ObjectiveStatus"] = "Pending"
    else:
        summary["ObjectiveStatus"] = "Succeeded" if value is not None and status in ("Completed", "Stopped") else "Failed"
    return {k: v for k, v in summary.items() if v is not None}


def _tuning_job(backend: Any, name: str) -> Any:
    from moto.sagemaker.exceptions import ResourceNotFound

    job = backend.hyper_parameter_tuning_jobs.get(name)
    if job is None:  # moto's own answer for DescribeHyperParameterTuningJob
        raise ResourceNotFound(message=f"Could not find hyper parameter tuning job '{name}'.")
    return job


_TRIAL_SORT_KEYS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "Name": lambda s: s["TrainingJobName"],
    "CreationTime": lambda s: (s["CreationTime"], s["TrainingJobName"]),
    "Status": lambda s: (s["TrainingJobStatus"], s["TrainingJobName"]),
    "FinalObjectiveMetricValue": lambda s: (s["FinalHyperParameterTuningJobObjectiveMetric"]["Value"], s["TrainingJobName"]),
}


def _list_training_jobs_for_hyper_parameter_tuning_job(self: Any) -> Any:
    from moto.core.responses import ActionResult
    from moto.sagemaker.exceptions import ValidationError

    tuning_job = _tuning_job(self.sagemaker_backend, self._get_param("HyperParameterTuningJobName"))
    summaries = [trial_summary(t, tuning_job) for t in tuning_trials(self.sagemaker_backend, tuning_job)]
    status = self._get_param("StatusEquals")
    if status:
        summaries = [s for s in summaries if s["TrainingJobStatus"] == status]
    sort_by = self._get_param("SortBy") or "Name"
    sort_order = self._get_param("SortOrder") or "Ascending"
    if sort_by not in _TRIAL_SORT_KEYS or sort_order not in ("Ascending", "Descending"):
        raise ValidationError(message=f"Invalid SortBy {sort_by!r} or SortOrder {sort_order!r}.")
    if sort_by == "FinalObjectiveMetricValue":  # "any training jobs that did not return an objective metric are not listed"
        summaries = [s for s in summaries if "FinalHyperParameterTuningJobObjectiveMetric" in s]
    summaries.sort(key=_TRIAL_SORT_KEYS[sort_by], reverse=sort_order == "Descending")
    max_results = int(self._get_param("MaxResults") or 10)  # the documented default
    if not 1 <= max_results <= 100:
        raise ValidationError(message=f"1 validation error detected: Value '{max_results}' at 'maxResults' failed to "
                                      "satisfy constraint: Member must have value between 1 and 100")
    token = self._get_param("NextToken")
    start = 0
    if token:
        if not str(token).isdigit() or int(token) > len(summaries):
            raise ValidationError(message="Invalid pagination token.")
        start = int(token)
    page = summaries[start : start + max_results]
    out: dict[str, Any] = {"TrainingJobSummaries": page}
    if start + max_results < len(summaries):
        out["NextToken"] = str(start + max_results)
    return ActionResult(out)


def _stop_hyper_parameter_tuning_job(self: Any) -> Any:
    from moto.core.responses import EmptyResult
    from moto.sagemaker.exceptions import ValidationError

    tuning_job = _tuning_job(self.sagemaker_backend, self._get_param("HyperParameterTuningJobName"))
    status = tuning_job.hyper_parameter_tuning_job_status
    if status != "InProgress":
        raise ValidationError(message=f"The request was rejected because the tuning job is in status {status}.")
    now = _now()
    tuning_job.hyper_parameter_tuning_job_status = "Stopping"
    tuning_job.last_modified_time = now
    still_stopping = False
    for trial in tuning_trials(self.sagemaker_backend, tuning_job):
        if trial.training_job_status == "InProgress":
            still_stopping |= _stop_running_training_job(trial)
    if not still_stopping and not getattr(tuning_job, "launching", False):
        # Nothing of it runs any more, and nobody launches its trials: it has stopped. (Whoever runs
        # its trials, tests/fake_sagemaker.py, ends a tuning job it runs itself.)
        tuning_job.hyper_parameter_tuning_job_status = "Stopped"
        tuning_job.hyper_parameter_tuning_end_time = tuning_job.last_modified_time = _now()
    return EmptyResult()


# --------------------------------------------------------------------------- CloudFormation


_NOTEBOOK_PROPERTIES = {  # CloudFormation property -> moto's create_notebook_instance argument
    "Tags": "tags", "VolumeSizeInGB": "volume_size_in_gb", "LifecycleConfigName": "lifecycle_config_name",
    "DefaultCodeRepository": "default_code_repository", "AdditionalCodeRepositories": "additional_code_repositories",
    "DirectInternetAccess": "direct_internet_access", "RootAccess": "root_access", "SubnetId": "subnet_id",
    "SecurityGroupIds": "security_group_ids", "KmsKeyId": "kms_key_id",
}


def _notebook_name_property() -> str:
    return "NotebookInstanceName"


def _notebook_from_cloudformation(cls: Any, resource_name: str, cloudformation_json: Any, account_id: str,
                                  region_name: str, **kwargs: Any) -> Any:
    from moto.sagemaker.models import sagemaker_backends

    properties = cloudformation_json["Properties"]
    extra = {arg: properties[prop] for prop, arg in _NOTEBOOK_PROPERTIES.items() if prop in properties}
    return sagemaker_backends[account_id][region_name].create_notebook_instance(
        notebook_instance_name=resource_name, instance_type=properties["InstanceType"],
        role_arn=properties["RoleArn"], **extra)


def _subnet_association_from_cloudformation(cls: Any, resource_name: str, cloudformation_json: Any, account_id: str,
                                            region_name: str, **kwargs: Any) -> Any:
    from moto.ec2.models import ec2_backends

    properties = cloudformation_json["Properties"]
    backend = ec2_backends[account_id][region_name]
    association = backend.create_subnet_association(route_table_id=properties["RouteTableId"],
                                                    subnet_id=properties["SubnetId"])
    association.association_id = backend.associate_route_table(properties["RouteTableId"],
                                                               subnet_id=properties["SubnetId"])
    return association


def _delete_subnet_association(self: Any, account_id: str, region_name: str) -> None:
    from moto.ec2.models import ec2_backends

    backend = ec2_backends[account_id][region_name]
    backend.subnet_associations.pop(f"{self.route_table_id}:{self.subnet_id}", None)
    if getattr(self, "association_id", None):
        backend.disassociate_route_table(self.association_id)


def _create_stack_resources(self: Any, template: Any) -> Any:
    from moto.cloudformation.parsing import ResourceMap, clean_json
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.core import TaggedEC2Resource
    from moto.iam.models import Role

    result = _saved[(ResourceMap, "create")](self, template)
    backend = ec2_backends[self._account_id][self._region_name]
    for logical, resource_json in template["Resources"].items():
        tags = (resource_json.get("Properties") or {}).get("Tags")
        instance = self[logical]
        if isinstance(instance, Role):
            instance.policies = {k: v if isinstance(v, str) else json.dumps(v) for k, v in instance.policies.items()}
        elif tags and isinstance(instance, TaggedEC2Resource):
            resolved = clean_json(tags, self)
            backend.create_tags([instance.physical_resource_id], {t["Key"]: t["Value"] for t in resolved})
    return result


# --------------------------------------------------------------------------- install


def _patches() -> list[tuple[type, str, Any]]:
    from moto.cloudformation.parsing import ResourceMap
    from moto.ec2.models.subnets import SubnetRouteTableAssociation
    from moto.iam.responses import IamResponse
    from moto.sagemaker.models import FakeSagemakerNotebookInstance
    from moto.sagemaker.responses import SageMakerResponse

    return [
        (FakeSagemakerNotebookInstance, "cloudformation_name_type", staticmethod(_notebook_name_property)),
        (FakeSagemakerNotebookInstance, "create_from_cloudformation_json", classmethod(_notebook_from_cloudformation)),
        (ResourceMap, "create", _create_stack_resources),
        (SubnetRouteTableAssociation, "create_from_cloudformation_json",
         classmethod(_subnet_association_from_cloudformation)),
        (SubnetRouteTableAssociation, "delete", _delete_subnet_association),
        (IamResponse, "simulate_principal_policy", _simulate_principal_policy),
        (IamResponse, "simulate_custom_policy", _simulate_custom_policy),
        (SageMakerResponse, "stop_training_job", _stop_training_job),
        (SageMakerResponse, "list_training_jobs_for_hyper_parameter_tuning_job",
         _list_training_jobs_for_hyper_parameter_tuning_job),
        (SageMakerResponse, "stop_hyper_parameter_tuning_job", _stop_hyper_parameter_tuning_job),
    ]


def installed() -> bool:
    return bool(_saved)


def install() -> None:
    """Add the APIs above to moto's response classes. Calling it again changes nothing."""
    with _lock:
        if _saved:
            return
        for cls, name, handler in _patches():
            _saved[(cls, name)] = cls.__dict__.get(name, _MISSING)
            setattr(cls, name, handler)


def uninstall() -> None:
    """Put moto back as it was. Safe to call when not installed."""
    with _lock:
        for (cls, name), original in _saved.items():
            if original is _MISSING:
                if name in cls.__dict__:
                    delattr(cls, name)
            else:
                setattr(cls, name, original)
        _saved.clear()
