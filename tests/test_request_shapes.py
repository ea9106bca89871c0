"""Requests checked against the whole SageMaker service model, as the service checks them.

botocore checks required members, types and minimums before it sends a request; the service also
refuses what breaks a maximum length, a list's or map's size, an enum or a pattern (a Java regular
expression over the whole value). `workshop.jobs.shapes` checks all of it: the dry run refuses such
a request with the member, the rule and the fix, `plan_job` refuses what the user passed (tags, S3
URIs) before anything starts, and the fake SageMaker answers a ValidationException in the service's
words before it records or runs anything. `plan_job` also refuses a checkpoint or output S3 URI (or
a base job name) the workshop's execution role could not use: the job would fail with AccessDenied.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from conftest import LAB3_IMAGE, tuning_request

from workshop import jobs as sj
from workshop import runner
from workshop.cloud import aws
from workshop.errors import WorkshopError
from workshop.jobs import shapes
from workshop.labs import get_lab
from workshop.search import SearchSpace

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's account, and the dry run's placeholder
BUCKET = f"sagemaker-{REGION}-{ACCOUNT}"
LAB3 = get_lab("data_parallel")
IMAGE = LAB3_IMAGE
USER = "alice"


@pytest.fixture
def aws_user() -> str:
    return USER


pytestmark = pytest.mark.usefixtures("no_aws")  # conftest: no credentials, empty AWS and SDK config


# --------------------------------------------------------------------------- Java patterns, as the service reads them


TAG = r"([\p{L}\p{Z}\p{N}_.:/=+\-@]*)"  # TagKey, TagValue
JOB_NAME = r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"  # TrainingJobName
S3_URI = r"(https|s3)://([^/]+)/?(.*)"  # S3Uri


@pytest.mark.parametrize(("pattern", "value", "matches"), [
    (TAG, "team a", True), (TAG, "équipe-1", True), (TAG, "٣", True),  # letters and digits of any script
    (TAG, "a\u00a0b", True),  # \p{Z}: a no-break space is a separator
    (TAG, "a&b", False), (TAG, "x\n", False), (TAG, "😀", False),  # not a letter, number or separator
    (JOB_NAME, "alice-data-parallel-20261124", True), (JOB_NAME, "a_b", False),  # the whole value, not a prefix
    (JOB_NAME, "a" * 63, True), (JOB_NAME, "a-", False), (JOB_NAME, "é", False),
    (r".*", "one line", True), (r".*", "two\nlines", False),  # Java's . matches no line terminator ...
    (r".*", "a\rb", False), (r".*", "a\u2028b", False), (r".*", "a\u0085b", False),  # ... of any kind
    (r"[\S\s]*", "two\nlines", True),
    (r"arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+", "arn:aws:iam::123456789012:role/x", True),
    (r"arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+", "arn:aws:iam::١٢٣٤٥٦٧٨٩٠١٢:role/x", False),  # \d: ASCII
    (r"arn:[\p{Alnum}\-]+:lambda:.*", "arn:aws:lambda:f", True), (r"arn:[\p{Alnum}\-]+:lambda:.*", "arn:awsé:lambda:f", False),
    (r"[\u0020-\uD7FF\uE000-\uFFFD\uD800\uDC00-\uDBFF\uDFFF\t]*", "ok 😀\t", True),  # a surrogate pair: one code point
    (r"(arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:[a-z\-]*\/)?([a-zA-Z0-9]([a-zA-Z0-9-]){0,62})(?<!-)", "algo-", False),
    (S3_URI, "s3://bucket/key", True), (S3_URI, "s3://bucket/a\nb", False), (S3_URI, "gs://bucket/key", False),
])
def test_patterns_are_read_as_java_reads_them_over_the_whole_value(pattern: str, value: str, matches: bool) -> None:
    assert (shapes.java_regex(pattern).fullmatch(value) is not None) is matches


@pytest.mark.parametrize("pattern", [r"[a-z&&[^aeiou]]", r"\p{IsLatin}+", r"(?i)abc", r"[a-c[x-z]]"])
def test_what_cannot_be_translated_is_reported_unchecked_never_passed(pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(shapes.JavaPatternError):
        shapes.java_regex(pattern)
    # A member with such a pattern is named as not checked, and is not counted as a pass.
    shape = shapes.input_shape("CreateTrainingJob", "Tags").member.members["Key"]
    monkeypatch.setitem(shape.metadata, "pattern", pattern)
    report = shapes.check_members("CreateTrainingJob", {"Tags": [{"Key": "k", "Value": "v"}]})
    assert report.unchecked == [("Tags[0].Key", pattern, report.unchecked[0][2])] and not report.violations


def test_every_pattern_the_workshops_requests_can_reach_is_checked() -> None:
    for operation in ("CreateTrainingJob", "CreateHyperParameterTuningJob"):
        found = shapes.patterns(operation)
        assert len(found) > 20, operation
        for pattern in found.values():
            shapes.java_regex(pattern)  # raises JavaPatternError if not translated


# --------------------------------------------------------------------------- the checker and the service's words


def _job(**changes: Any) -> dict[str, Any]:
    """A valid CreateTrainingJob request, with `changes` ("A.B": value reaches into member A; None removes)."""
    request: dict[str, Any] = {
        "TrainingJobName": "alice-data-parallel-20261124120000",
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File",
                                   "MetricDefinitions": [{"Name": "test_accuracy", "Regex": "test_accuracy=(\\S+)"}]},
        "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/FakeSageMakerTrainingRole",
        "OutputDataConfig": {"S3OutputPath": f"s3://{BUCKET}/alice-data-parallel"},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "HyperParameters": {"epochs": "1"},
        "Environment": {"SM_CHECKPOINT_DIR": "/opt/ml/checkpoints"},
        "CheckpointConfig": {"S3Uri": f"s3://{BUCKET}/alice-data-parallel/checkpoints", "LocalPath": "/opt/ml/checkpoints"},
        "Tags": [{"Key": "workshop", "Value": "distributed-training-workshop"}],
    }
    for key, value in changes.items():
        *parents, name = key.split(".")
        target = request
        for parent in parents:
            target = target[parent]
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value
    return request


def _metrics(n: int, name: str = "m", regex: str = "m=(\\S+)") -> list[dict[str, str]]:
    return [{"Name": f"{name}{i}", "Regex": regex} for i in range(n)]


# case -> (changes, the member's path (for each rule it breaks), one of the service's clauses)
INVALID: dict[str, tuple[dict[str, Any], str | tuple[str, ...], str]] = {
    "job name pattern": ({"TrainingJobName": "alice_job"}, "TrainingJobName",
                         "Value 'alice_job' at 'trainingJobName' failed to satisfy constraint: Member must satisfy "
                         f"regular expression pattern: {JOB_NAME}"),
    "job name length": ({"TrainingJobName": "a" * 64}, ("TrainingJobName", "TrainingJobName"),  # its pattern too
                        f"Value '{'a' * 64}' at 'trainingJobName' failed to satisfy constraint: Member must have "
                        "length less than or equal to 63"),
    "tag key pattern": ({"Tags": [{"Key": "cost&center", "Value": "ml"}]}, "Tags[0].Key",
                        "Value 'cost&center' at 'tags.1.member.key' failed to satisfy constraint: Member must "
                        f"satisfy regular expression pattern: {TAG}"),
    "tag key length": ({"Tags": [{"Key": "k" * 129, "Value": "v"}]}, "Tags[0].Key",
                       "at 'tags.1.member.key' failed to satisfy constraint: Member must have length less than or "
                       "equal to 128"),
    "empty tag key": ({"Tags": [{"Key": "", "Value": "v"}]}, "Tags[0].Key",
                      "Value '' at 'tags.1.member.key' failed to satisfy constraint: Member must have length greater "
                      "than or equal to 1"),
    "tag value length": ({"Tags": [{"Key": "k", "Value": "ok"}, {"Key": "team", "Value": "v" * 257}]}, "Tags[1].Value",
                         "at 'tags.2.member.value' failed to satisfy constraint: Member must have length less than or "
                         "equal to 256"),
    "tag value pattern": ({"Tags": [{"Key": "owner", "Value": "alice@example.com; bob"}]}, "Tags[0].Value",
                          "Value 'alice@example.com; bob' at 'tags.1.member.value' failed to satisfy constraint: "
                          "Member must satisfy regular expression pattern"),
    "51 tags": ({"Tags": [{"Key": f"k{i}", "Value": "v"} for i in range(51)]}, "Tags",
                "at 'tags' failed to satisfy constraint: Member must have length less than or equal to 50"),
    "environment key": ({"Environment": {"SM_CHECKPOINT_DIR": "/opt/ml/checkpoints", "1ST_TRY": "yes"}},
                        "Environment key '1ST_TRY'",
                        "Value '{SM_CHECKPOINT_DIR=/opt/ml/checkpoints, 1ST_TRY=yes}' at 'environment' failed to "
                        "satisfy constraint: Map keys must satisfy constraint: [Member must satisfy regular "
                        "expression pattern: [a-zA-Z_][a-zA-Z0-9_]*]"),
    "environment key with a dash": ({"Environment": {"MY-VAR": "x"}}, "Environment key 'MY-VAR'",
                                    "Map keys must satisfy constraint: [Member must satisfy regular expression pattern"),
    "environment value": ({"Environment": {"NOTE": "n" * 513}}, "Environment['NOTE']",
                          "at 'environment' failed to satisfy constraint: Map value must satisfy constraint: [Member "
                          "must have length less than or equal to 512]"),
    "101 environment variables": ({"Environment": {f"V{i}": "x" for i in range(101)}}, "Environment",
                                  "Member must have length less than or equal to 100"),
    "41 metric definitions": ({"AlgorithmSpecification.MetricDefinitions": _metrics(41)},
                              "AlgorithmSpecification.MetricDefinitions",
                              "at 'algorithmSpecification.metricDefinitions' failed to satisfy constraint: Member "
                              "must have length less than or equal to 40"),
    "metric name length": ({"AlgorithmSpecification.MetricDefinitions": _metrics(1, name="n" * 255)},
                           "AlgorithmSpecification.MetricDefinitions[0].Name",
                           "at 'algorithmSpecification.metricDefinitions.1.member.name' failed to satisfy "
                           "constraint: Member must have length less than or equal to 255"),
    "metric regex length": ({"AlgorithmSpecification.MetricDefinitions": _metrics(1, regex="r" * 501)},
                            "AlgorithmSpecification.MetricDefinitions[0].Regex",
                            "at 'algorithmSpecification.metricDefinitions.1.member.regex' failed to satisfy "
                            "constraint: Member must have length less than or equal to 500"),
    "metric regex on two lines": ({"AlgorithmSpecification.MetricDefinitions": _metrics(1, regex="a=(\\S+)\nb")},
                                  "AlgorithmSpecification.MetricDefinitions[0].Regex",
                                  "Member must satisfy regular expression pattern: .+"),
    "101 hyperparameters": ({"HyperParameters": {f"h{i}": "1" for i in range(101)}}, "HyperParameters",
                            "at 'hyperParameters' failed to satisfy constraint: Member must have length less than or "
                            "equal to 100"),
    "hyperparameter value length": ({"HyperParameters": {"notes": "n" * 2501}}, "HyperParameters['notes']",
                                    "at 'hyperParameters' failed to satisfy constraint: Map value must satisfy "
                                    "constraint: [Member must have length less than or equal to 2500]"),
    "hyperparameter name length": ({"HyperParameters": {"h" * 257: "1"}}, f"HyperParameters key {'h' * 257!r}",
                                   "Map keys must satisfy constraint: [Member must have length less than or equal "
                                   "to 256]"),
    "output S3 URI": ({"OutputDataConfig.S3OutputPath": "bucket/output"}, "OutputDataConfig.S3OutputPath",
                      "Value 'bucket/output' at 'outputDataConfig.s3OutputPath' failed to satisfy constraint: Member "
                      f"must satisfy regular expression pattern: {S3_URI}"),
    "checkpoint S3 URI on two lines": ({"CheckpointConfig.S3Uri": f"s3://{BUCKET}/ckpt\nx"}, "CheckpointConfig.S3Uri",
                                       "at 'checkpointConfig.s3Uri' failed to satisfy constraint: Member must satisfy "
                                       "regular expression pattern"),
    "checkpoint S3 URI length": ({"CheckpointConfig.S3Uri": f"s3://{BUCKET}/" + "k" * 1000}, "CheckpointConfig.S3Uri",
                                 "at 'checkpointConfig.s3Uri' failed to satisfy constraint: Member must have length "
                                 "less than or equal to 1024"),
    "input channel S3 URI": ({"InputDataConfig": [{"ChannelName": "train", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": "s3:/bucket/train"}}}]}, "InputDataConfig[0].DataSource.S3DataSource.S3Uri",
        "at 'inputDataConfig.1.member.dataSource.s3DataSource.s3Uri' failed to satisfy constraint"),
    "instance type": ({"ResourceConfig.InstanceType": "ml.m5.huge"}, "ResourceConfig.InstanceType",
                      "at 'resourceConfig.instanceType' failed to satisfy constraint: Member must satisfy enum value "
                      "set: [ml.m4.xlarge"),
    "no role": ({"RoleArn": None}, "RoleArn",
                "Value null at 'roleArn' failed to satisfy constraint: Member must not be null"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_the_checker_finds_each_broken_constraint_with_the_services_words(case: str) -> None:
    changes, path, clause = INVALID[case]
    report = shapes.check_request("CreateTrainingJob", _job(**copy.deepcopy(changes)))
    assert [v.path for v in report.violations] == (list(path) if isinstance(path, tuple) else [path])
    message = shapes.service_message(report.violations)
    count = len(report.violations)
    assert message.startswith(f"{count} validation error{'s' * (count > 1)} detected: ") and clause in message, message


def test_a_valid_request_passes_and_several_violations_are_counted() -> None:
    assert not shapes.check_request("CreateTrainingJob", _job())
    report = shapes.check_request("CreateTrainingJob", _job(TrainingJobName="a_b", Environment={"1X": "y", "2Y": "z"}))
    message = shapes.service_message(report.violations)
    # Two keys of one map are one clause, as the service folds a map's keys.
    assert message.startswith("2 validation errors detected: ") and message.count("Map keys") == 1, message


# --------------------------------------------------------------------------- the fake answers a ValidationException


@pytest.fixture
def fake(no_aws: None, tmp_path: Path):
    import fake_sagemaker

    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=0.0) as running:
        yield running


def _sagemaker(fake: Any) -> Any:
    import boto3

    # No client-side validation: the request reaches the service's (the fake's) own checks.
    return boto3.Session(region_name=fake.region).client("sagemaker", config=Config(parameter_validation=False))


@pytest.mark.parametrize("case", [c for c in INVALID if c != "no role"])
def test_the_fake_refuses_what_breaks_the_model_before_recording_or_running_anything(fake: Any, case: str) -> None:
    changes, _, clause = INVALID[case]
    sm = _sagemaker(fake)
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**_job(**copy.deepcopy(changes)))
    assert err.value.response["Error"]["Code"] == "ValidationException"
    message = err.value.response["Error"]["Message"]
    assert re.match(r"[12] validation errors? detected: ", message) and clause in message, message
    assert fake.jobs == []  # nothing ran ...
    assert sm.list_training_jobs()["TrainingJobSummaries"] == []  # ... or was recorded


def test_the_fake_checks_a_tuning_jobs_definition_and_tags_too() -> None:
    import fake_sagemaker
    from moto.sagemaker.exceptions import ValidationError

    request = tuning_request(**{"Definition.Environment": _job()["Environment"],
                                "Tags": [{"Key": "workshop", "Value": "distributed-training-workshop"}]})
    assert fake_sagemaker.validate_tuning_request(copy.deepcopy(request))
    bad = copy.deepcopy(request)
    bad["TrainingJobDefinition"]["Environment"] = {f"V{i}": "x" for i in range(49)}  # a tuning job's limit: 48
    with pytest.raises(ValidationError, match="at 'trainingJobDefinition.environment' failed to satisfy constraint: "
                                              "Member must have length less than or equal to 48"):
        fake_sagemaker.validate_tuning_request(bad)
    bad = copy.deepcopy(request)
    bad["Tags"].append({"Key": "note", "Value": "a|b"})
    with pytest.raises(ValidationError, match=re.escape("Value 'a|b' at 'tags.2.member.value'")):
        fake_sagemaker.validate_tuning_request(bad)


# --------------------------------------------------------------------------- the dry run and the plan refuse, with the fix


@pytest.mark.parametrize(("tags", "path", "fix"), [
    ({"cost&center": "ml"}, "Tags[3].Key", "_ . : / = + - @"),
    ({"owner": "x" * 257}, "Tags[3].Value", "values (up to 256)"),
    ({"aws:team": "ml"}, "Tags[3].Key", "not starting with 'aws:'"),
    ({f"k{i}": "v" for i in range(48)}, "Tags", "at most 47 of them (the workshop adds its 3"),
])
def test_the_dry_run_refuses_tags_the_service_would_refuse_with_the_fix(tags: dict[str, str], path: str, fix: str) -> None:
    with pytest.raises(WorkshopError) as err:
        sj.dry_run(LAB3, tags=tags, show=False)
    assert "SageMaker would refuse this CreateTrainingJob request with a ValidationException" in err.value.message
    assert f"\n  {path}" in err.value.message and fix in err.value.fix, err.value


def test_the_dry_run_checks_the_whole_request_it_captured() -> None:
    """What no plan check sees (here an input channel's URI, and an environment a launcher got
    wrong) is refused by the dry run's check of the request the SDK built, with the member, the
    rule and the fix."""
    with pytest.raises(WorkshopError) as err:
        sj.dry_run(LAB3, inputs={"train": "s3://bucket/train\nset", "test": "s3://bucket/test"}, show=False)
    assert "InputDataConfig[0].DataSource.S3DataSource.S3Uri = 's3://bucket/train\\nset'" in err.value.message
    assert "Member must satisfy regular expression pattern: (https|s3)://([^/]+)/?(.*)" in err.value.message
    assert "pass inputs=" in err.value.fix

    from workshop.jobs.dry_run import _dry_run_from_plan

    plan = sj.plan_job(LAB3, region=REGION)
    plan = dataclasses.replace(plan, environment={**plan.environment, "2ND_TRY": "yes"})
    with pytest.raises(WorkshopError) as err:
        _dry_run_from_plan(plan, sj.PLACEHOLDER_ROLE_ARN, None)
    assert "Environment key '2ND_TRY' = '2ND_TRY': Member must satisfy regular expression pattern: " \
           "[a-zA-Z_][a-zA-Z0-9_]*" in err.value.message
    assert "the lab's launcher (JobPlan.environment)" in err.value.fix


def test_the_plan_refuses_metric_definitions_the_service_would_refuse(tmp_path: Path) -> None:
    lab = dataclasses.replace(LAB3, metrics=tuple(f"metric_{i}" for i in range(41)))
    with pytest.raises(WorkshopError) as err:
        sj.plan_job(lab, region=REGION)
    assert "AlgorithmSpecification.MetricDefinitions" in err.value.message
    assert "Member must have length less than or equal to 40" in err.value.message
    assert "at most 40" in err.value.fix and "lab's METRICS" in err.value.fix


@pytest.mark.parametrize("kwargs", [
    {}, {"spot": True}, {"max_restarts": 1, "instance_count": 2},
    {"space": ["lr=0.01,0.02"]}, {"space": ["lr=0.001:0.1:log", "batch-size=32,64"], "trials": 4},
], ids=["default", "spot", "elastic-restarts", "grid", "random"])
def test_every_request_the_workshop_dry_runs_passes_the_whole_model(kwargs: dict[str, Any]) -> None:
    space = kwargs.pop("space", None)
    trials = kwargs.pop("trials", None)
    if space is not None:
        kwargs["space"] = SearchSpace.parse(LAB3, space, trials=trials, seed=1)
    request = sj.dry_run(LAB3, show=False, **kwargs)
    operation = "CreateHyperParameterTuningJob" if space else "CreateTrainingJob"
    report = shapes.check_request(operation, request)
    assert not report.violations and not report.unchecked and request.unchecked == []


@pytest.mark.parametrize("key", ["parameter_server", "horovod_pytorch", "horovod_tensorflow", "model_parallel"])
def test_every_labs_dry_run_passes_the_whole_model(key: str) -> None:
    report = shapes.check_request("CreateTrainingJob", sj.dry_run(get_lab(key), show=False))
    assert not report.violations and not report.unchecked


# --------------------------------------------------------------------------- S3 locations the workshop's role can use


MINE = f"s3://{BUCKET}/{USER}-data-parallel"


@pytest.mark.parametrize(("kwargs", "message", "fix"), [
    ({"checkpoint_s3_uri": "s3://my-team-bucket/checkpoints"}, "checkpoint_s3_uri='s3://my-team-bucket/checkpoints' is "
     "outside what the job's role may use", f"pass checkpoint_s3_uri='s3://sagemaker-{REGION}-<your account>/"
     f"{USER}-data-parallel/checkpoints'"),
    ({"output_s3_uri": f"s3://{BUCKET}/models"}, "uploading its model", "output_s3_uri="),
    ({"checkpoint_s3_uri": f"s3://{BUCKET}/{USER}-data-parallel-v2/ckpt"}, "syncing its checkpoints", "leave it out"),
    ({"checkpoint_s3_uri": f"s3://{BUCKET}/bob-data-parallel/ckpt"}, "distributed-training-workshop/alice/", "role="),
    ({"base_job_name": "experiment-7"}, "the SDK stages the job's code and drivers under", "leave base_job_name out"),
])
def test_the_plan_refuses_s3_locations_outside_the_workshop_roles_prefixes(
        kwargs: dict[str, Any], message: str, fix: str) -> None:
    with pytest.raises(WorkshopError) as err:
        sj.plan_job(LAB3, region=REGION, **kwargs)
    assert message in err.value.message and "AccessDenied" in err.value.message
    assert fix in err.value.fix and "role of your own" in err.value.fix
    with pytest.raises(WorkshopError):  # the dry run too, and with the workshop's role named
        sj.dry_run(LAB3, show=False, role=f"arn:aws:iam::{ACCOUNT}:role/distributed-training-workshop-{USER}", **kwargs)


def test_s3_locations_inside_the_prefixes_or_under_a_role_of_ones_own_pass(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    plan = sj.plan_job(LAB3, region=REGION, checkpoint_s3_uri=f"{MINE}/checkpoints", output_s3_uri=f"{MINE}/out")
    assert plan.checkpoint_s3_uri == f"{MINE}/checkpoints"
    request = sj.dry_run(LAB3, show=False, checkpoint_s3_uri=f"{MINE}/checkpoints")
    assert request["CheckpointConfig"]["S3Uri"] == f"{MINE}/checkpoints"
    # A role of the user's own: its access is not the workshop's to know; the plan says so.
    own = f"arn:aws:iam::{ACCOUNT}:role/TeamTraining"
    plan = sj.plan_job(LAB3, region=REGION, role=own, checkpoint_s3_uri="s3://team/ckpt")
    assert f"checkpoint_s3_uri: not checked against the S3 access of {own}, a role of your own" in "\n".join(plan.notes)
    # On SageMaker with no role given, the role is not known until it is resolved (then checked).
    monkeypatch.setattr(aws, "NOTEBOOK_METADATA_FILE", str(tmp_path / "metadata.json"))
    (tmp_path / "metadata.json").write_text(json.dumps({"ResourceName": "alice-notebook"}))
    plan = sj.plan_job(LAB3, region=REGION, checkpoint_s3_uri="s3://team/ckpt")
    assert any("once the role is known" in note for note in plan.notes)


def test_the_bucket_and_key_prefix_are_those_the_sdk_config_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "team-sdk-config.yaml"
    config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      Session:\n"
                      "        DefaultS3Bucket: team-ml-artifacts\n        DefaultS3ObjectKeyPrefix: teams/vision\n")
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(config))
    inside = f"s3://team-ml-artifacts/teams/vision/{USER}-data-parallel/checkpoints"
    assert sj.plan_job(LAB3, region=REGION, checkpoint_s3_uri=inside).checkpoint_s3_uri == inside
    for outside in (f"s3://team-ml-artifacts/{USER}-data-parallel/checkpoints",  # without the key prefix
                    f"{MINE}/checkpoints"):  # the bucket the SDK would use without the config
        with pytest.raises(WorkshopError) as err:
            sj.plan_job(LAB3, region=REGION, checkpoint_s3_uri=outside)
        assert f"pass checkpoint_s3_uri='{inside}'" in err.value.fix
    with pytest.raises(WorkshopError, match="the workshop names the job alice-data-parallel-<timestamp>"):
        sj.plan_job(LAB3, region=REGION, base_job_name="vision-exp")


def test_the_real_path_checks_the_bucket_of_the_account_once_it_is_known(moto_session: Any, tmp_path: Path) -> None:
    """Offline, any `sagemaker-<region>-<account>` bucket may be the SDK's; with credentials the
    account is known, and another account's bucket is refused before anything is created."""
    boto = moto_session
    other = f"s3://sagemaker-{REGION}-999999999999/{USER}-data-parallel/checkpoints"
    sj.plan_job(LAB3, region=REGION, checkpoint_s3_uri=other)  # offline: the form fits
    with pytest.raises(WorkshopError) as err:
        runner.run_on_sagemaker(LAB3, hosts=1, create_role=True, checkpoint_s3_uri=other, data_dir=tmp_path / "data",
                                region=REGION)
    assert f"s3://{BUCKET}/{USER}-data-parallel/" in err.value.message and other in err.value.message
    assert f"pass checkpoint_s3_uri='s3://{BUCKET}/{USER}-data-parallel/checkpoints'" in err.value.fix
    assert boto.client("iam").list_roles()["Roles"] == []  # nothing created
    assert boto.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []
    assert boto.client("s3").list_buckets()["Buckets"] == []
