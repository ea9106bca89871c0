"""The workshop's waits for SageMaker jobs, against a fake service whose jobs run after their Create call.

`workshop.jobs.submit` starts a training job and follows it to its end: every secondary status the job
passes through (also those shorter than a poll), and its CloudWatch lines while it trains, in the order
they happened. `workshop.jobs.tuning.follow_tuning` follows a tuning job and its trials. Ctrl-C (a
notebook's interrupt) stops a wait, not the job: the workshop says so, with the command that stops it,
and the command line's last line does not claim that everything stopped.

Against a fake that ran each job inside its Create call, the wait only ever saw ended jobs: its
polling, its log tail and its Ctrl-C were never exercised while a job ran.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from pathlib import Path
from typing import Any

import pytest
from test_fake_lifecycle import _RELEASED, script, trainer

from workshop.jobs.submit import StillRunning, submit

submit_module = importlib.import_module("workshop.jobs.submit")  # `workshop.jobs.submit` is also its function


@pytest.fixture
def aws_user() -> str:
    return "alice"


@pytest.fixture
def fake(no_aws: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import fake_sagemaker

    monkeypatch.setattr(submit_module, "POLL_S", 0.5)  # the fake's jobs take seconds, not minutes
    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=1.0) as running:
        yield running


class Printed:
    """What the wait prints, each line with the fake job's status when it was printed; `on(text, act)`
    runs `act` once when a line containing `text` is printed."""

    def __init__(self, fake: Any):
        self.fake = fake
        self.lines: list[tuple[str, str | None]] = []
        self.actions: list[tuple[str, Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        line = " ".join(str(a) for a in args)
        status = self.fake.jobs[-1].status if self.fake.jobs else None
        self.lines.append((line, status))
        for text, act in list(self.actions):
            if text in line:
                self.actions.remove((text, act))
                act()

    def on(self, text: str, act: Any) -> None:
        self.actions.append((text, act))

    def index(self, text: str) -> int:
        found = [i for i, (line, _) in enumerate(self.lines) if text in line]
        assert found, f"{text!r} was not printed: {[line for line, _ in self.lines]}"
        return found[0]


@pytest.mark.slow
def test_the_wait_follows_a_running_job_showing_each_secondary_status_and_its_logs_while_it_trains(
        fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's script waits until the workshop has printed its first line, so that line can only have
    been printed while the job ran (else the script gives up after 300 s and the job fails)."""
    release = tmp_path / "release"
    printed = Printed(fake)
    printed.on("[algo-1] first line: waiting for the release", release.touch)
    monkeypatch.setattr(submit_module, "print", printed, raising=False)
    result = submit(trainer(fake, script(tmp_path, _RELEASED), hyperparameters={"release": str(release)}), {})
    assert result.status == "Completed", result.failure_reason
    name = result.job_name
    first = printed.index("[algo-1] first line: waiting for the release")
    assert printed.lines[first][1] == "InProgress"  # printed while the job trained
    order = [printed.index(f"[sagemaker] {name}: {status}") for status in
             ("Starting - Launching the simulated hosts", "Downloading - Downloading input data", "Training - ")]
    order += [first, printed.index("[algo-1] last line: released")]
    order += [printed.index(f"[sagemaker] {name}: {status}") for status in ("Uploading - ", "Completed - ")]
    assert order == sorted(order), [line for line, _ in printed.lines]
    assert sum(f"[sagemaker] {name}: " in line for line, _ in printed.lines) == 5  # each status once


@pytest.mark.slow
def test_ctrl_c_while_waiting_stops_the_wait_says_the_job_goes_on_and_how_to_stop_it(
        fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    printed = Printed(fake)

    def interrupt() -> None:
        raise KeyboardInterrupt

    printed.on("[algo-1] training", interrupt)
    monkeypatch.setattr(submit_module, "print", printed, raising=False)
    code = script(tmp_path, "import time\nprint('training', flush=True)\ntime.sleep(300)\n")
    with pytest.raises(StillRunning) as stopped:
        submit(trainer(fake, code), {})
    [run] = fake.jobs
    command = f"aws sagemaker stop-training-job --training-job-name {run.name} --region {fake.region}"
    assert str(stopped.value) == (
        f"[sagemaker] stopped waiting for job {run.name}; it keeps running on SageMaker, and is billed, until it ends "
        f"or reaches its max_run of 600 s. Stop it with: {command}")
    assert stopped.value._render_traceback_() == [str(stopped.value)]  # a notebook shows that line, no traceback
    sm = boto3.Session(region_name=fake.region).client("sagemaker")
    assert sm.describe_training_job(TrainingJobName=run.name)["TrainingJobStatus"] == "InProgress"  # it goes on
    sm.stop_training_job(TrainingJobName=run.name)  # what the command does
    fake.wait(run.name, timeout_s=120)
    assert sm.describe_training_job(TrainingJobName=run.name)["TrainingJobStatus"] == "Stopped"


# A process that submits a job to the fake and waits for it, as `python -m workshop run --mode sagemaker` does,
# taking Ctrl-C (SIGINT) as a terminal's foreground job does whatever it inherited; after the interrupt it
# says what it caught and what SageMaker says of the job then.
_SUBMITTER = """
import importlib, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
sys.path.insert(0, sys.argv[1])
import boto3, fake_sagemaker
from test_fake_lifecycle import script, trainer
from workshop.jobs.submit import StillRunning, submit
importlib.import_module("workshop.jobs.submit").POLL_S = 0.5
with fake_sagemaker.FakeSageMaker(workdir=sys.argv[2] + "/fake", start_skew_s=0) as fake:
    code = script(fake.root.parent, "import time\\nprint('training', flush=True)\\ntime.sleep(300)\\n")
    try:
        submit(trainer(fake, code), {})
    except StillRunning as exc:
        print("CAUGHT", exc, flush=True)
        name = fake.jobs[-1].name
        status = boto3.Session(region_name=fake.region).client("sagemaker").describe_training_job(TrainingJobName=name)
        print("THEN", status["TrainingJobStatus"], flush=True)
"""


@pytest.mark.slow
def test_sigint_while_waiting_leaves_the_job_running_and_says_how_to_stop_it(no_aws: None, tmp_path: Path) -> None:
    import queue
    import signal
    import subprocess
    import sys
    import threading

    child = tmp_path / "submitter.py"
    child.write_text(_SUBMITTER)
    proc = subprocess.Popen([sys.executable, str(child), str(Path(__file__).parent), str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while not any(line.startswith("[algo-1] training") for line in out):  # the wait shows the job training
            assert proc.poll() is None and time.monotonic() < deadline, "".join(out)
            with contextlib.suppress(queue.Empty):
                out.append(lines.get(timeout=0.5))
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
        reader.join(10)
        while not lines.empty():
            out.append(lines.get())
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(out)
    assert proc.returncode == 0, text
    caught = [line for line in out if line.startswith("CAUGHT ")]
    assert caught and "stopped waiting for job alice-life-" in caught[0], text
    assert "it keeps running on SageMaker, and is billed, until it ends or reaches its max_run of 600 s" in caught[0]
    assert "Stop it with: aws sagemaker stop-training-job --training-job-name alice-life-" in caught[0]
    assert "THEN InProgress\n" in out  # the interrupt stopped the wait, not the job


def test_ctrl_c_while_following_a_tuning_job_says_it_goes_on_and_how_to_stop_it(
        strict_moto_session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's tuning job, made InProgress as a running one: the wait prints its status, and Ctrl-C then
    says the tuning job goes on (starting its remaining trials), with the command that stops it."""
    from moto.sagemaker.models import sagemaker_backends

    from workshop.jobs import tuning

    sm = strict_moto_session.client("sagemaker")
    sm.create_hyper_parameter_tuning_job(
        HyperParameterTuningJobName="alice-tune-1",
        HyperParameterTuningJobConfig={"Strategy": "Grid", "ResourceLimits": {"MaxParallelTrainingJobs": 2},
                                       "HyperParameterTuningJobObjective": {"Type": "Maximize", "MetricName": "acc"}},
        TrainingJobDefinition={"AlgorithmSpecification": {"TrainingImage": "image", "TrainingInputMode": "File"},
                               "RoleArn": "arn:aws:iam::123456789012:role/r", "OutputDataConfig": {"S3OutputPath": "s3://b/o"},
                               "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1},
                               "StoppingCondition": {"MaxRuntimeInSeconds": 60}})
    job = sagemaker_backends["123456789012"]["us-east-1"].hyper_parameter_tuning_jobs["alice-tune-1"]
    job.hyper_parameter_tuning_job_status = "InProgress"
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        raise KeyboardInterrupt

    monkeypatch.setattr(tuning, "say", say)
    with pytest.raises(StillRunning) as stopped:
        tuning.follow_tuning(strict_moto_session, "alice-tune-1")
    assert said == ["tuning job alice-tune-1: InProgress, 0 training job(s) running"]
    assert str(stopped.value) == (
        "[sagemaker] stopped waiting for tuning job alice-tune-1; it keeps running on SageMaker, and is billed, until "
        "it ends (it goes on starting its remaining trials). Stop it with: aws sagemaker "
        "stop-hyper-parameter-tuning-job --hyper-parameter-tuning-job-name alice-tune-1 --region us-east-1")


def test_the_command_line_says_the_job_goes_on_when_ctrl_c_stopped_only_its_wait(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Its last line used to be "every process the workshop started has been stopped", after the line
    saying the SageMaker job goes on."""
    import workshop.__main__ as cli

    line = "[sagemaker] stopped waiting for job j; it keeps running on SageMaker ... Stop it with: aws sagemaker ..."

    def run_one(*args: Any) -> None:
        raise StillRunning(line)

    monkeypatch.setattr(cli, "run_one", run_one)
    assert cli.main(["run", "data_parallel", "--mode", "sagemaker", "--yes"]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err == [line, "Interrupted: the workshop stopped waiting; the job on SageMaker goes on (above: how to "
                         "stop it)."]


def test_a_poll_shows_every_status_since_the_last_one_in_order_with_the_log_lines_between(
        strict_moto_session: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One poll that finds a job ended (its statuses and lines all new) prints them in the order they
    happened, statuses and lines interleaved by their times; a line logged in the millisecond a status
    began comes before it (the host printed it before SageMaker saw the change)."""
    from datetime import UTC, datetime, timedelta

    import fake_aws_apis

    boto = strict_moto_session
    sm, logs = boto.client("sagemaker"), boto.client("logs")
    sm.create_training_job(TrainingJobName="j", AlgorithmSpecification={"TrainingImage": "i", "TrainingInputMode": "File"},
                           RoleArn="arn:aws:iam::123456789012:role/r", OutputDataConfig={"S3OutputPath": "s3://b/o"},
                           ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1},
                           StoppingCondition={"MaxRuntimeInSeconds": 60})
    job = fake_aws_apis.set_training_job_status("j", "Completed")
    t0 = (datetime.now(UTC) - timedelta(hours=1)).replace(microsecond=0)
    job.secondary_status_transitions = [
        {"Status": status, "StartTime": t0 + timedelta(seconds=i * 10), "EndTime": t0 + timedelta(seconds=i * 10 + 10),
         "StatusMessage": f"{status.lower()} message"}
        for i, status in enumerate(("Starting", "Downloading", "Training", "Uploading", "Completed"))]
    logs.create_log_group(logGroupName=submit_module.LOG_GROUP)
    ms = int(t0.timestamp() * 1000)
    for host, offsets in (("algo-1", (21, 35)), ("algo-2", (25, 30))):
        logs.create_log_stream(logGroupName=submit_module.LOG_GROUP, logStreamName=f"j/{host}-1")
        logs.put_log_events(logGroupName=submit_module.LOG_GROUP, logStreamName=f"j/{host}-1",
                            logEvents=[{"timestamp": ms + s * 1000, "message": f"{host} at {s} s"} for s in offsets])
    submit_module._wait("j", boto, logs=True)
    assert capsys.readouterr().out.splitlines() == [
        "[sagemaker] j: Starting - starting message", "[sagemaker] j: Downloading - downloading message",
        "[sagemaker] j: Training - training message", "[algo-1] algo-1 at 21 s", "[algo-2] algo-2 at 25 s",
        "[algo-2] algo-2 at 30 s", "[sagemaker] j: Uploading - uploading message",  # logged as Uploading began
        "[algo-1] algo-1 at 35 s",  # a line after Uploading began
        "[sagemaker] j: Completed - completed message"]
