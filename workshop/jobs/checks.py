"""What CreateTrainingJob and the container accept, checked offline: instance types (and their
GPUs), hyperparameters, role ARNs. Read from botocore's bundled SageMaker service model and
the SDK's tables, so the checks follow the installed SDK."""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from workshop.cloud import aws
from workshop.errors import WorkshopError

# CreateTrainingJob's StoppingCondition.MaxRuntimeInSeconds allows at most 28 days.
MAX_RUNTIME_LIMIT_S = 28 * 24 * 3600


def family(instance_type: str) -> str:
    return instance_type.split(".")[1] if instance_type.count(".") == 2 else ""


def kind(instance_type: str) -> str:
    """"gpu" (g, p), "neuron" (trn, inf: AWS Trainium/Inferentia) or "cpu"."""
    name = family(instance_type)
    if name.startswith(("trn", "inf")):
        return "neuron"
    return "gpu" if is_gpu_instance(instance_type) else "cpu"


def is_gpu_instance(instance_type: str) -> bool:
    """GPU families start with g or p: the same rule the SDK uses to pick the image
    (`sagemaker/core/image_uris.py: _processor`)."""
    return family(instance_type)[:1] in ("g", "p")


def gpus_per_instance(instance_type: str, region: str = "us-east-1") -> int:
    """GPUs of one instance: the SDK's table (`sagemaker/core/instance_types_gpu_info.py`),
    else a rule of thumb for the g families it lacks (1 GPU, 4 at 12/24xlarge, 8 at 48xlarge)."""
    if not is_gpu_instance(instance_type):
        return 0
    from sagemaker.core import instance_types_gpu_info

    info = instance_types_gpu_info.retrieve(region).get(instance_type) or (
        instance_types_gpu_info.retrieve("us-east-1").get(instance_type)
    )
    if info:
        return int(info["Count"])
    size = instance_type.rsplit(".", 1)[-1]
    if family(instance_type).startswith("p"):
        return {"2xlarge": 1, "8xlarge": 4}.get(size, 8)
    return {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8}.get(size, 1)


@functools.lru_cache(maxsize=1)
def create_training_job_shapes() -> dict[str, Any]:
    """CreateTrainingJob's input constraints, read offline from botocore's bundled SageMaker
    service model (the same file the API's validation is generated from)."""
    import botocore
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    members = model.operation_model("CreateTrainingJob").input_shape.members
    hps = members["HyperParameters"]
    return {
        "instance_types": tuple(members["ResourceConfig"].members["InstanceType"].enum),
        "role_arn": members["RoleArn"].metadata,  # min, max, pattern
        "hp_count": hps.metadata.get("max", 100),
        "hp_key": hps.key.metadata,  # HyperParameterKey: max 256, pattern .*
        "hp_value": hps.value.metadata,  # HyperParameterValue: max 2500, pattern .*
        "source": f"botocore {botocore.__version__}'s SageMaker service model",
    }


def training_instance_types() -> tuple[str, ...]:
    """Every value of CreateTrainingJob's `TrainingInstanceType` enum."""
    return create_training_job_shapes()["instance_types"]


def check_instance_type(instance_type: str) -> None:
    known = training_instance_types()
    if instance_type in known:
        return
    near = difflib.get_close_matches(instance_type, known, n=3, cutoff=0.6) or ["ml.g5.xlarge", "ml.m5.xlarge"]
    raise WorkshopError(
        f"{instance_type} is not a SageMaker training instance type: CreateTrainingJob would reject it "
        f"({create_training_job_shapes()['source']} lists {len(known)}).",
        f"pick one of CreateTrainingJob's TrainingInstanceType values, e.g. {', '.join(near)}; if AWS added "
        "the type recently, upgrade botocore (pip install -U botocore).",
    )


# Java's `.` (AWS validates the model's patterns as Java regular expressions) matches no line terminator.
_LINE_TERMINATORS = ("\n", "\r", "\u0085", "\u2028", "\u2029")


_HP_KEY = re.compile(r"[A-Za-z0-9_-]+")


_ENV_FILE = "/opt/ml/input/sm_training.env"


def check_hyperparameters(hyperparameters: Mapping[str, Any]) -> None:
    """Refuse the hyperparameters that CreateTrainingJob rejects or the container cannot receive.

    - CreateTrainingJob (the service model): at most 100 of them; keys up to 256 characters, values
      up to 2,500, each matching `.*`, so no line break.
    - SDK v3's `sm_train.sh` runs `container_drivers/scripts/environment.py`, which writes every
      hyperparameter into `/opt/ml/input/sm_training.env` as `export SM_HP_<KEY>='<value>'` (key
      upper-cased, dashes to underscores) and all of them as `export SM_HPS='<json>'`, with no
      escaping, then `source`s the file under `set -e`: a single quote anywhere in a key or value
      ends the string early, and a key with characters other than letters, digits, `-` and `_` makes
      an invalid variable name; either fails the job before the script starts.

    Values are checked as the SDK sends them (`safe_serialize`: text as is, anything else as JSON).
    """
    shapes = create_training_job_shapes()
    most = shapes["hp_count"]
    if len(hyperparameters) > most:
        raise WorkshopError(
            f"{len(hyperparameters)} hyperparameters; CreateTrainingJob takes at most {most} ({shapes['source']}).",
            "pass fewer: group related settings into one JSON value, or put them in a file of a data channel.",
        )
    env_names: dict[str, str] = {}
    for key, value in hyperparameters.items():
        if not isinstance(key, str):
            raise WorkshopError(f"Hyperparameter name {key!r} is not text.", "use names like 'epochs' or 'batch-size'.")
        text = value if isinstance(value, str) else json.dumps(value)
        for what, item, limit in (("name", key, shapes["hp_key"].get("max", 256)),
                                  ("value", text, shapes["hp_value"].get("max", 2500))):
            shown = item if len(item) <= 60 else item[:57] + "..."
            if len(item) > limit:
                raise WorkshopError(
                    f"Hyperparameter {what} {shown!r} is {len(item)} characters, longer than {limit} characters, "
                    f"CreateTrainingJob's limit ({shapes['source']}).",
                    "shorten it, or pass large settings as a file in a data channel.",
                )
            if "'" in item:
                raise WorkshopError(
                    f"Hyperparameter {key!r}: its {what} {shown!r} contains a single quote ('), which the container "
                    f"cannot receive: SDK v3's sm_train.sh writes each hyperparameter into {_ENV_FILE} as "
                    "export SM_HP_<KEY>='<value>' (and all of them inside SM_HPS='<json>') without escaping, "
                    "then sources it, so the quote ends the string early and the job fails before the script starts.",
                    "leave the single quote out (rephrase, or use a typographic apostrophe), or pass the text in a "
                    "file of a data channel.",
                )
            if any(t in item for t in _LINE_TERMINATORS):
                raise WorkshopError(
                    f"Hyperparameter {key!r}: its {what} {shown!r} contains a line break, which CreateTrainingJob "
                    f"rejects: each key and value must match the pattern `.*` ({shapes['source']}), and `.` "
                    "matches no line break.",
                    "put it on one line (e.g. join the lines with '; '), or pass multi-line text in a file of a "
                    "data channel.",
                )
        if not _HP_KEY.fullmatch(key):
            raise WorkshopError(
                f"Hyperparameter name {key!r} cannot be part of an environment variable name: sm_train.sh exports "
                f"it as SM_HP_{key.replace('-', '_').upper()} in {_ENV_FILE}, and bash refuses that name, which "
                "fails the job at start.",
                "use only letters, digits, '-' and '_' in hyperparameter names (the script's flags have that form).",
            )
        name = "SM_HP_" + key.replace("-", "_").upper()
        if name in env_names:
            raise WorkshopError(
                f"Hyperparameters {env_names[name]!r} and {key!r} both become {name} in the container's "
                f"{_ENV_FILE}; one would silently replace the other.",
                "pass one of them only (scripts read '-' and '_' the same way).",
            )
        env_names[name] = key


def check_role(role: str, source: str = "role") -> str:
    """`role` if CreateTrainingJob could take it (as an ARN: its RoleArn pattern and length) or it
    is an IAM role name that resolves to one; WorkshopError otherwise. Offline."""
    role = str(role).strip()
    shape = create_training_job_shapes()["role_arn"]
    if role.startswith("arn:"):
        ok = (bool(aws.ROLE_ARN_PATTERN.match(role)) and bool(re.fullmatch(shape["pattern"], role))
              and shape.get("min", 20) <= len(role) <= shape.get("max", 2048))
    else:
        ok = bool(aws.ROLE_NAME_PATTERN.match(role))
    if not ok:
        raise WorkshopError(
            f"{source} is not an IAM role ARN or role name: {role!r}.",
            "use the form arn:aws:iam::<12-digit account>:role/<name>, or a role name (letters, digits and "
            "+=,.@_-, up to 64 characters).",
        )
    return role


def given_role(role: str | None) -> tuple[str, str]:
    """(role, where it came from): the argument, else `$WORKSHOP_ROLE_ARN`; ("", "") for neither."""
    if role is not None and str(role).strip():
        return str(role).strip(), "role"
    env = os.environ.get(aws.ROLE_ENV, "").strip()
    return (env, f"${aws.ROLE_ENV}") if env else ("", "")


# What to change when a member of the request breaks the service model: the member (its path in a
# CreateTrainingJob request, or under a tuning job's TrainingJobDefinition) -> the fix. Longest first.
_MEMBER_FIXES: tuple[tuple[str, str], ...] = (
    ("AlgorithmSpecification.MetricDefinitions",
     "the metric definitions are the lab's METRICS (workshop.metrics.sagemaker_metric_definitions): at most 40, "
     "each name 1 to 255 characters and each regex 1 to 500, on one line; define fewer or shorter metrics in the "
     "lab's spec"),
    ("AlgorithmSpecification.TrainingImage", "pass an image_uri of at most 255 characters, on one line"),
    ("ResourceConfig.InstanceType", "pass one of CreateTrainingJob's training instance types as instance_type"),
    ("CheckpointConfig", "pass checkpoint_s3_uri='s3://<bucket>/<prefix>': at most 1,024 characters, on one line"),
    ("OutputDataConfig", "pass output_s3_uri='s3://<bucket>/<prefix>': at most 1,024 characters, on one line"),
    ("InputDataConfig", "pass inputs={'train': 's3://<bucket>/<prefix>', ...}: channel names of letters, digits, "
                        "'.', '-' and '_' (at most 64), S3 URIs of at most 1,024 characters on one line, at most 20 "
                        "channels"),
    ("TrainingJobName", "pass a base_job_name of letters, digits and '-' (not at either end): the SDK adds '-' and a "
                        "14-digit timestamp, and the job name has at most 63 characters"),
    ("HyperParameterTuningJobName", "tuning job names are the base job name cut to 19 characters plus a "
                                    "timestamp: pass a base_job_name of letters, digits and '-'"),
    ("Tags", "pass tags={'key': 'value'} whose keys (1 to 128 characters) and values (up to 256) hold only letters, "
             "digits, spaces and _ . : / = + - @, keys not starting with 'aws:', at most 47 of them (the workshop adds its 3: workshop, "
             "workshop-user, workshop-lab)"),
    ("HyperParameters", "pass at most 100 hyperparameters, names up to 256 characters and values up to 2,500, each "
                        "on one line"),
    ("StaticHyperParameters", "pass at most 100 hyperparameters, names up to 256 characters and values up to 2,500, "
                              "each on one line"),
    ("Environment", "the job's environment comes from the workshop and the lab's launcher (JobPlan.environment): "
                    "variable names of letters, digits and '_' not starting with a digit, values up to 512 "
                    "characters, at most 100 variables (48 in a tuning job)"),
    ("VpcConfig", "pass subnets=[...] (1 to 16) and security_group_ids=[...] (1 to 5) as their ids "
                  "(subnet-..., sg-...), or network=True for the workshop's network"),
    ("RoleArn", "pass role='arn:aws:iam::<12-digit account>:role/<name>'"),
    ("StoppingCondition", "pass max_run_s (and, for spot, max_wait_s) of at least 1 second"),
)


def _member_fix(path: str) -> str | None:
    bare = path.removeprefix("TrainingJobDefinition.")
    for member, fix in _MEMBER_FIXES:
        if bare == member or bare.startswith((member + ".", member + "[", member + " ")):
            return fix
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 70 else text[:67] + "..."


def _rule_for_people(rule: str) -> str:
    """The service's rule, with a long enum list cut short."""
    head, sep, values = rule.partition("enum value set: [")
    if sep and values.count(",") >= 8:
        listed = values.rstrip("]").split(", ")
        return f"{head}enum value set of {len(listed)} values ({', '.join(listed[:4])}, ...)"
    return rule


def request_refusal(operation: str, report: Any, *, built_by_workshop: bool = True) -> WorkshopError:
    """The WorkshopError for a request that breaks the service model (`workshop.jobs.shapes.Report`):
    each member's path, its value, the rule it breaks (the service's words), and how to fix each."""
    from workshop.jobs.shapes import model_source

    lines, fixes = [], []
    for v in report.violations:
        value = "" if v.value is None else f" = {_shown(v.value)}"
        lines.append(f"  {v.path}{value}: {_rule_for_people(v.rule)}")
        fix = _member_fix(v.path)
        if fix is None:
            fix = ("this part of the request is the workshop's own doing: report it as a bug with this message"
                   if built_by_workshop else f"change {v.path} to satisfy the rule")
        if fix not in fixes:
            fixes.append(fix)
    count = len(report.violations)
    return WorkshopError(
        f"SageMaker would refuse this {operation} request with a ValidationException ({count} "
        f"violation{'s' if count != 1 else ''} of {model_source()}):\n" + "\n".join(lines),
        "; ".join(fixes) + ".",
    )


def refuse_invalid_request(operation: str, params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Refuse `params` (a whole `operation` request) if it breaks the service model (WorkshopError
    with each member, rule and fix); returns the members whose pattern could not be checked."""
    from workshop.jobs import shapes

    report = shapes.check_request(operation, params)
    if report.violations:
        raise request_refusal(operation, report)
    return report.unchecked


# AWS reserves the `aws:` prefix for its own tags (the tagging rules of every service, not in the model).
_RESERVED_TAG_PREFIX = "aws:"


def check_request_fields(members: Mapping[str, Any]) -> None:
    """Refuse the parts of a CreateTrainingJob request a plan settles (dotted member path -> value,
    e.g. {"Tags": [...], "CheckpointConfig.S3Uri": "s3://..."}) where they break the service model
    or AWS's tag rules, before anything is looked up or created."""
    from workshop.jobs import shapes

    report = shapes.check_members("CreateTrainingJob", members)
    for i, tag in enumerate(members.get("Tags") or []):
        key = tag.get("Key") if isinstance(tag, Mapping) else None
        if isinstance(key, str) and key.lower().startswith(_RESERVED_TAG_PREFIX):
            report.violations.append(shapes.Violation(
                f"Tags[{i}].Key", f"tags.{i + 1}.member.key", "AWS reserves tag keys that start with 'aws:'", key))
    if report.violations:
        raise request_refusal("CreateTrainingJob", report, built_by_workshop=False)
