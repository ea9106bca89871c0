"""Everything the workshop created for one user, found by its tags and deleted: running jobs
stopped, the network, the role, and (opt-in) the user's S3 prefixes. Running it twice is harmless."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workshop.cloud import aws
from workshop.cloud.common import POLL_S, TAG_USER, TAG_WORKSHOP, aws_error, code_of, say
from workshop.cloud.network import NETWORK_TIMEOUT_S, delete_network
from workshop.cloud.role import delete_role, s3_prefixes, sdk_session

# What a user's running jobs of each kind are listed and stopped by: (list call, its summaries'
# key, the prefix of its name and ARN fields, stop call).
_JOB_KINDS = {
    "training": ("list_training_jobs", "TrainingJobSummaries", "TrainingJob", "stop_training_job"),
    "tuning": ("list_hyper_parameter_tuning_jobs", "HyperParameterTuningJobSummaries", "HyperParameterTuningJob",
               "stop_hyper_parameter_tuning_job"),
}


def _stop_tagged(sm: Any, kind: str, user: str) -> list[str]:
    """Stop this user's InProgress workshop jobs of `kind` (by their tags); returns their names.
    Their names start with the user's prefix, so NameContains finds them."""
    lister, summaries, prefix, stopper = _JOB_KINDS[kind]
    stopped = []
    for page in sm.get_paginator(lister).paginate(StatusEquals="InProgress", NameContains=user):
        for job in page[summaries]:
            tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=job[f"{prefix}Arn"]).get("Tags", [])}
            if tags.get(TAG_WORKSHOP) == aws.WORKSHOP_NAME and tags.get(TAG_USER) == user:
                getattr(sm, stopper)(**{f"{prefix}Name": job[f"{prefix}Name"]})
                stopped.append(job[f"{prefix}Name"])
    return stopped


def stop_user_jobs(sm: Any, user: str) -> list[str]:
    """Stop this user's InProgress workshop training jobs (by their tags); returns their names."""
    return _stop_tagged(sm, "training", user)


def stop_user_tuning_jobs(sm: Any, user: str) -> list[str]:
    """Stop this user's InProgress workshop tuning jobs (by their tags), which stops their
    trials; returns their names (a tuning job's name keeps the user's prefix, at most 16 of its 32
    characters)."""
    return _stop_tagged(sm, "tuning", user)


def delete_s3_prefixes(s3: Any, bucket: str, prefixes: Sequence[str]) -> int:
    """Delete every object under `prefixes` in `bucket`; returns how many."""
    count = 0
    for prefix in prefixes:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
                count += len(keys)
    return count


@dataclass
class CleanupReport:
    stopped_jobs: list[str] = field(default_factory=list)
    network: list[str] = field(default_factory=list)
    role: list[str] = field(default_factory=list)
    s3_objects: int | None = None  # None: S3 was left alone

    @property
    def nothing(self) -> bool:
        return not (self.stopped_jobs or self.network or self.role or self.s3_objects)

    def lines(self) -> list[str]:
        return [
            f"stopped jobs: {', '.join(self.stopped_jobs) or 'none running'}",
            f"network deleted: {', '.join(self.network) or 'none found'}",
            f"role deleted: {', '.join(self.role) or 'none created by the workshop'}",
            "S3: left as is (pass delete_s3=True / --delete-s3 to delete your workshop prefixes)"
            if self.s3_objects is None else f"S3: deleted {self.s3_objects} object(s)",
        ]


def cleanup(session: Any = None, *, job_keys: Sequence[str], delete_s3: bool = False, user: str | None = None,
            timeout_s: float = NETWORK_TIMEOUT_S, poll_s: float = POLL_S, show: bool = True) -> CleanupReport:
    """Stop this user's running workshop jobs (tuning jobs too), delete the network and the role the workshop
    created, and (opt-in) the user's S3 prefixes (those of `job_keys`' jobs and the shared data).
    Running it twice is harmless."""
    from botocore.exceptions import BotoCoreError, ClientError

    boto = aws.as_boto_session(session)
    aws.require_credentials(boto)
    user = user or aws.user_prefix()
    report = CleanupReport()
    sm = boto.client("sagemaker")
    try:  # tuning jobs first: stopping one stops its trials, which are training jobs too
        report.stopped_jobs = [f"{name} (tuning)" for name in stop_user_tuning_jobs(sm, user)]
        report.stopped_jobs += stop_user_jobs(sm, user)
    except NotImplementedError:  # a fake AWS without StopTrainingJob
        say("could not stop jobs here (StopTrainingJob or StopHyperParameterTuningJob not available)")
    except (BotoCoreError, ClientError) as exc:
        raise aws_error("Stopping your training and tuning jobs failed", exc) from None
    report.network = delete_network(boto, user=user, timeout_s=timeout_s, poll_s=poll_s)
    report.role = delete_role(boto, user=user)
    if delete_s3:
        s3 = boto.client("s3")
        sm_session = sdk_session(session, boto)  # the SDK's bucket and key prefix, as the jobs used them
        bucket = aws.sdk_bucket(sm_session)
        try:
            s3.head_bucket(Bucket=bucket)
            report.s3_objects = delete_s3_prefixes(s3, bucket, s3_prefixes(job_keys, user, aws.sdk_key_prefix(sm_session)))
        except ClientError as exc:
            if code_of(exc) not in ("404", "NoSuchBucket", "NotFound"):
                raise aws_error(f"Deleting your objects in {bucket} failed", exc) from None
            report.s3_objects = 0
    if show:
        for line in report.lines():
            say(line)
    return report
