"""Start a job, follow its CloudWatch logs to the end, and read what it left (`JobResult`)."""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workshop.cloud import aws
from workshop.errors import WorkshopError
from workshop.jobs.common import input_data, say, split_s3
from workshop.metrics import parse_lines

if TYPE_CHECKING:
    from sagemaker.train.model_trainer import ModelTrainer

LOG_GROUP = "/aws/sagemaker/TrainingJobs"


# How often a wait asks SageMaker and CloudWatch for news. A guided workshop's attendees share one account,
# whose request rates are shared too (CloudWatch Logs' DescribeLogStreams: 5 per second per account and
# region): 30 attendees polling every 15 s stay well under it.
POLL_S = 15.0


TERMINAL_STATUSES = ("Completed", "Failed", "Stopped")


class StillRunning(KeyboardInterrupt):
    """Ctrl-C (a notebook's interrupt) while the workshop waited for a SageMaker job or tuning job: the
    wait stopped, the job did not (it runs on SageMaker, and is billed, until it ends or reaches its
    limit). Its message is the one line that says so and how to stop it; IPython shows it in place of
    the traceback (`_render_traceback_`), and an `except KeyboardInterrupt` still stops on it."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def stop_command(job_name: str, region: str, tuning: bool = False) -> str:
    """The AWS CLI command that stops a training job (or a tuning job and its running training jobs)."""
    if tuning:
        return (f"aws sagemaker stop-hyper-parameter-tuning-job --hyper-parameter-tuning-job-name {job_name} "
                f"--region {region}")
    return f"aws sagemaker stop-training-job --training-job-name {job_name} --region {region}"


def interrupted_wait(exc: KeyboardInterrupt, what: str, limit: str, command: str) -> KeyboardInterrupt:
    """What a wait raises on Ctrl-C: `StillRunning` saying that `what` keeps running until `limit`, and
    `command` stops it; on SIGTERM (`Terminated`, which the command line reports itself) the same line
    is printed and the SIGTERM goes on."""
    from workshop.runtime.processes import Terminated

    message = f"stopped waiting for {what}; it keeps running on SageMaker, and is billed, until {limit}. Stop it with: {command}"
    if isinstance(exc, Terminated):
        say(message)
        exc.still_running = message  # the command line's last line says the job goes on
        return exc
    return StillRunning(f"[sagemaker] {message}")


def console_url(job_name: str, region: str) -> str:
    return f"https://{region}.console.aws.amazon.com/sagemaker/home?region={region}#/jobs/{job_name}"


def logs_url(job_name: str, region: str) -> str:
    return (
        f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logStream:"
        f"group={LOG_GROUP};prefix={job_name}/;streamFilter=typeLogStreamPrefix"
    )


@dataclass
class JobResult:
    """What a finished (or started) job left: status, metrics, where the model is."""

    job_name: str
    status: str
    final_metrics: dict[str, float]
    model_artifact: str | None
    console_url: str
    region: str
    failure_reason: str | None = None
    boto_session: Any = field(default=None, repr=False, compare=False)
    # DescribeTrainingJob's TrainingTimeInSeconds (the job's training time) and BillableTimeInSeconds
    # (what is billed: on managed spot, only the seconds the instances ran, interruptions' waits not).
    training_time_s: int | None = None
    billable_time_s: int | None = None
    spot: bool = False

    def spot_line(self) -> str | None:
        """For a managed spot job that ran: the seconds billed against the seconds trained (None otherwise)."""
        if not self.spot or not self.training_time_s or self.billable_time_s is None:
            return None
        saved = 1 - self.billable_time_s / self.training_time_s
        return (f"managed spot: billable {self.billable_time_s} s of {self.training_time_s} s training: a saving "
                f"of {saved:.0%} (1 - billable / training, AWS's formula for managed spot training)")

    @property
    def ok(self) -> bool:
        return self.status == "Completed"

    def metric(self, name: str) -> float | None:
        return self.final_metrics.get(name)

    def records(self) -> list[dict[str, Any]]:
        """The job's METRICS lines from CloudWatch, as `workshop.metrics` records."""
        return job_records(self.job_name, self.boto_session)

    @property
    def output_artifact(self) -> str | None:
        """Where SageMaker put `output.tar.gz`: every host's /opt/ml/output/data (SM_OUTPUT_DATA_DIR),
        beside model.tar.gz; None when the job left no model artifact."""
        if not self.model_artifact:
            return None
        return self.model_artifact.rsplit("/", 1)[0] + "/output.tar.gz"

    def download_model(self, dest: str | os.PathLike[str]) -> Path:
        """Fetch `model.tar.gz` and extract it into `dest`; returns `dest`."""
        return self._download(self.model_artifact, dest, "model",
                              "SageMaker uploads model.tar.gz when the job completes, with whatever the script "
                              "wrote to SM_MODEL_DIR (/opt/ml/model); check the job's logs.")

    def download_output(self, dest: str | os.PathLike[str]) -> Path:
        """Fetch `output.tar.gz` (what the scripts wrote to SM_OUTPUT_DATA_DIR on every host, e.g.
        profiler traces) and extract it into `dest`; returns `dest`."""
        return self._download(self.output_artifact, dest, "output data",
                              "SageMaker uploads output.tar.gz when the job completes, with whatever the script "
                              "wrote to SM_OUTPUT_DATA_DIR (/opt/ml/output/data); check the job's logs.")

    def _download(self, uri: str | None, dest: str | os.PathLike[str], what: str, fix: str) -> Path:
        from botocore.exceptions import ClientError

        if not uri:
            raise WorkshopError(
                f"Job {self.job_name} has no {what} artifact (status {self.status}).",
                "artifacts exist only after the job completes; check the status and the logs.",
            )
        dest_path = Path(dest).expanduser()
        s3 = aws.as_boto_session(self.boto_session).client("s3")
        bucket, key = split_s3(uri)
        try:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            raise WorkshopError(f"No {what} at {uri} ({code or exc}); the job's status is {self.status}.", fix) from None
        dest_path.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
            _safe_extract(archive, dest_path)
        print(f"{what.capitalize()} from {uri} -> {dest_path}", flush=True)
        return dest_path


def _safe_extract(archive: tarfile.TarFile, dest: Path) -> None:
    """Extract refusing absolute paths, `..` and links out of `dest` (tarfile's "data" filter
    where this Python has it, 3.11.4+; the same check by hand before that)."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, filter="data")
        return
    root = dest.resolve()
    for member in archive.getmembers():
        target = (root / member.name).resolve()
        outside = root != target and root not in target.parents
        if outside or member.issym() or member.islnk():
            raise WorkshopError(f"Unsafe path in the archive: {member.name!r}.", "inspect the archive by hand.")
    archive.extractall(dest)


def _stream_host(stream_name: str) -> str:
    """`<job>/algo-1-1700000000` -> `algo-1`."""
    tail = stream_name.rsplit("/", 1)[-1]
    match = re.match(r"^(algo-\d+)", tail)
    return match.group(1) if match else tail


class _LogTail:
    """Reads each of a job's CloudWatch streams forward from where it last stopped."""

    def __init__(self, job_name: str, boto: Any):
        self.job_name = job_name
        self.client = boto.client("logs")
        self.tokens: dict[str, str | None] = {}

    def _streams(self) -> list[str]:
        from botocore.exceptions import ClientError

        names: list[str] = []
        kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": self.job_name + "/"}
        try:
            while True:
                page = self.client.describe_log_streams(**kwargs)
                names += [s["logStreamName"] for s in page.get("logStreams", [])]
                if not page.get("nextToken"):
                    break
                kwargs["nextToken"] = page["nextToken"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
        return sorted(names)

    def new_lines(self) -> Iterator[tuple[str, str]]:
        """(host, message) for every event logged since the last call."""
        for _, host, line in self.new_events():
            yield host, line

    def new_events(self) -> Iterator[tuple[int, str, str]]:
        """(timestamp in ms, host, message) for every event logged since the last call, stream by stream."""
        for stream in self._streams():
            while True:
                kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": True}
                if self.tokens.get(stream):
                    kwargs["nextToken"] = self.tokens[stream]
                page = self.client.get_log_events(**kwargs)
                for event in page.get("events", []):
                    for line in event["message"].splitlines():
                        yield int(event.get("timestamp") or 0), _stream_host(stream), line
                token = page.get("nextForwardToken")
                done = token == self.tokens.get(stream) or not page.get("events")
                self.tokens[stream] = token
                if done:
                    break


def job_records(job_name: str, session: Any = None) -> list[dict[str, Any]]:
    """The METRICS records of a SageMaker job, read from its CloudWatch log streams.

    Lines are prefixed `[algo-N] ` as the local cluster prefixes them, so
    `workshop.metrics.parse_lines` gives the same records (with `host` and `rank`) for a
    SageMaker job as for a local run, and the same plots follow.
    """
    tail = _LogTail(job_name, aws.as_boto_session(session))
    return parse_lines(f"[{host}] {line}" for host, line in tail.new_lines())


def _result(job_name: str, boto: Any) -> JobResult:
    description = boto.client("sagemaker").describe_training_job(TrainingJobName=job_name)
    region = boto.region_name
    return JobResult(
        job_name=job_name,
        status=description["TrainingJobStatus"],
        final_metrics={m["MetricName"]: m["Value"] for m in description.get("FinalMetricDataList", [])},
        model_artifact=description.get("ModelArtifacts", {}).get("S3ModelArtifacts"),
        console_url=console_url(job_name, region),
        region=region,
        failure_reason=description.get("FailureReason"),
        boto_session=boto,
        training_time_s=description.get("TrainingTimeInSeconds"),
        billable_time_s=description.get("BillableTimeInSeconds"),
        spot=bool(description.get("EnableManagedSpotTraining")),
    )


def _ms(when: Any) -> int:
    return int(when.timestamp() * 1000) if hasattr(when, "timestamp") else 0


def _wait(job_name: str, boto: Any, logs: bool) -> None:
    """Poll the job until it ends, printing each of its secondary statuses (Starting, Downloading,
    Training, Uploading, ... as `<job>: Training - <message>`: every one SageMaker went through, also
    between two polls) and, with `logs`, its log lines as `[algo-N] ...`, in the order they happened.

    The workshop's own loop rather than the SDK's `TrainingJob.wait(logs=True)`, whose
    CloudWatch client ignores the session's region (`sagemaker/core/utils/logs.py:
    MultiLogStreamHandler` uses the default `CloudWatchLogsClient()`).

    Ctrl-C stops the wait, not the job: `StillRunning` says so, and how to stop it.
    """
    client = boto.client("sagemaker")
    tail = _LogTail(job_name, boto) if logs else None
    shown, shown_message, last_status = 0, None, None
    limit = "it ends"
    try:
        while True:
            description = client.describe_training_job(TrainingJobName=job_name)
            status = description["TrainingJobStatus"]
            max_run = (description.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
            limit = f"it ends or reaches its max_run of {max_run} s" if max_run else "it ends"
            # (when, 0 for a log line or 1 for a status, the line): a line logged in the millisecond a status
            # began was printed before SageMaker saw the change
            news: list[tuple[int, int, str]] = []
            transitions = description.get("SecondaryStatusTransitions") or []
            for i, transition in enumerate(transitions):
                message = transition.get("StatusMessage") or ""
                if i < shown - 1 or (i == shown - 1 and message == shown_message):
                    continue  # shown already (the current status is shown again when its message changes)
                when = _ms(transition.get("StartTime")) if i >= shown else int(time.time() * 1000)
                news.append((when, 1, f"[sagemaker] {job_name}: {transition['Status']}" + (f" - {message}" if message else "")))
            if transitions:
                shown, shown_message = len(transitions), transitions[-1].get("StatusMessage") or ""
            elif status != last_status:
                news.append((0, 1, f"[sagemaker] {job_name}: {status}"))
            last_status = status
            if tail is not None:
                news += [(when, 0, f"[{host}] {line}") for when, host, line in tail.new_events()]
            for _, _, line in sorted(news, key=lambda item: (item[0], item[1])):
                print(line, flush=True)
            if status in TERMINAL_STATUSES:
                return
            time.sleep(POLL_S)
    except KeyboardInterrupt as exc:
        raise interrupted_wait(exc, f"job {job_name}", limit, stop_command(job_name, boto.region_name)) from None


def submit(trainer: ModelTrainer, inputs: Mapping[str, str], *, wait: bool = True, logs: bool = True) -> JobResult:
    """Start the job with `inputs` (channel -> S3 URI) and, if `wait`, follow it to the end.

    Returns a `JobResult` also for a failed job (its `status` and `failure_reason` say so);
    raises WorkshopError when SageMaker refuses to create the job.
    """
    from botocore.exceptions import ClientError

    channels = input_data(inputs)
    boto = trainer.sagemaker_session.boto_session
    say(f"creating the training job ({', '.join(f'{c}={u}' for c, u in inputs.items())})")
    try:
        trainer.train(input_data_config=channels, wait=False, logs=False)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        fix = {
            "ResourceLimitExceeded": "request a quota increase for this instance type (Service Quotas, "
            "'training job usage'), or use fewer or other instances.",
            "AccessDeniedException": "allow sagemaker:CreateTrainingJob and iam:PassRole on the role.",
            "ValidationException": "check the instance type, role and S3 URIs in the message.",
        }.get(code, "see the message; `dry_run` shows the request that was sent.")
        raise WorkshopError(f"SageMaker refused the job: {exc}", fix) from None
    job_name = trainer._latest_training_job.training_job_name  # documented in ModelTrainer's docstring
    say(f"job {job_name} created")
    say(f"console: {console_url(job_name, boto.region_name)}")
    say(f"logs:    {logs_url(job_name, boto.region_name)}")
    if wait:
        _wait(job_name, boto, logs)
    result = _result(job_name, boto)
    if result.status == "Failed":
        say(f"job {job_name} FAILED: {result.failure_reason}")
    elif wait:
        metrics = ", ".join(f"{k}={v:g}" for k, v in result.final_metrics.items()) or "none reported"
        say(f"job {job_name} {result.status}; final metrics: {metrics}; model: {result.model_artifact}")
    if wait and result.spot_line():
        say(result.spot_line())
    return result
