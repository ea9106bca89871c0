"""Job parallelism: `python -m workshop tune` (workshop.tuning, workshop.search, workshop.jobs.tuning).

Fast tests: the search's parsing and every refusal before anything starts, the trials' core
shares, the result table, the SageMaker dry run's request and cost, the quota for trials at once,
cleanup of tuning jobs. Slow tests (marked): the command from the issue, a failing trial among
good ones, and Ctrl-C stopping every trial with nothing left running.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import quota_client, service_quota

from workshop import REPO_ROOT
from workshop.__main__ import main
from workshop.errors import WorkshopError
from workshop.labs import get_lab
from workshop.search import Objective, SearchSpace
from workshop.tuning import Trial, TuneResult, core_shares

LAB = get_lab("data_parallel")
REGION = "us-east-1"


# --------------------------------------------------------------------------- the search


def test_a_grid_is_every_combination_in_order():
    space = SearchSpace.parse(LAB, ["lr=0.01,0.05", "batch-size=32,64"])
    assert space.is_grid and space.names == ["lr", "batch-size"]
    assert space.trials() == [
        {"lr": "0.01", "batch-size": "32"}, {"lr": "0.01", "batch-size": "64"},
        {"lr": "0.05", "batch-size": "32"}, {"lr": "0.05", "batch-size": "64"},
    ]


def test_random_draws_are_seeded_typed_and_inside_the_range():
    space = SearchSpace.parse(LAB, ["lr=0.001:0.1:log", "batch-size=16:128"], trials=20, seed=7)
    trials = space.trials()
    assert trials == SearchSpace.parse(LAB, ["lr=0.001:0.1:log", "batch-size=16:128"], trials=20, seed=7).trials()
    assert trials != SearchSpace.parse(LAB, ["lr=0.001:0.1:log", "batch-size=16:128"], trials=20, seed=8).trials()
    assert all(0.001 <= float(t["lr"]) <= 0.1 and 16 <= int(t["batch-size"]) <= 128 for t in trials)
    # On a log scale about half the draws fall below the geometric middle (0.01), not a tenth.
    assert 4 <= sum(float(t["lr"]) < 0.01 for t in trials) <= 16


def test_fewer_trials_than_the_grid_are_distinct_combinations_and_more_run_the_grid_once():
    space = SearchSpace.parse(LAB, ["lr=0.01,0.02,0.04", "batch-size=32,64"], trials=4)
    combos = [tuple(t.values()) for t in space.trials()]
    assert len(combos) == 4 and len(set(combos)) == 4
    whole = SearchSpace.parse(LAB, ["lr=0.01,0.02"], trials=5)
    assert whole.is_grid and len(whole.trials()) == 2 and "running each once" in whole.notes[0]


def test_the_objective_defaults_to_the_labs_accuracy_and_minimizes_a_loss():
    assert Objective.parse(LAB, None) == Objective("test_accuracy", maximize=True)
    assert Objective.parse(LAB, "test_loss") == Objective("test_loss", maximize=False)
    assert Objective.parse(LAB, "test_loss:max").maximize
    with pytest.raises(WorkshopError, match="prints no metric 'accuracy'"):
        Objective.parse(LAB, "accuracy")


BAD_INPUT = [
    (["--param", "lrr=0.01,0.02"], "has no hyperparameter --lrr", "did you mean lr"),
    (["--param", "lr=0.01,fast"], "'fast' is not a valid float", "--param lr="),
    (["--param", "batch-size=32,6.5"], "'6.5' is not a valid int", "batch-size"),
    (["--param", "backend=gloo,mpi"], "not one of train.py's choices", "auto, gloo, nccl, smddp"),
    (["--param", "lr="], "lists no values", "at least one value"),
    (["--param", "lr=,"], "lists no values", "at least one value"),
    (["--param", "lr=0.001:0.1"], "is a range", "--trials N"),
    (["--param", "lr=0.1:0.01", "--trials", "3"], "LOW < HIGH", "0.001:0.1:log"),
    (["--param", "backend=a:b", "--trials", "3"], "only for a number", "list the values"),
    (["--param", "lr=0.01", "--param", "lr=0.02"], "given more than once", "each searched name once"),
    (["--param", "lr=0.01,0.02", "--hp", "lr=0.03"], "searched (--param) and fixed (--hp)", "drop --hp lr"),
    (["--param", "train=a,b"], "has no hyperparameter --train", "its hyperparameters:"),
    (["--param", "lr=0.01,0.02", "--parallel", "0"], "--parallel must be at least 1", "--parallel 2"),
    (["--param", "lr=0.01,0.02", "--objective", "speed"], "prints no metric 'speed'", "test_accuracy"),
    (["--param", "lr=0.01,0.02", "--hp", "epochs=0"], "--epochs must be at least 1", "--hp epochs="),
    (["--param", "lr=0.01,0.02", "--region", "eu-west-1"], "apply to --mode sagemaker", "--mode sagemaker"),
    (["--param", "lr=0.01,0.02", "--dry-run"], "--dry-run applies to --mode sagemaker", "--mode sagemaker"),
    (["--param", "epochs=1,-1"], "--epochs must be at least 1", "epochs"),
]


@pytest.mark.parametrize(("args", "error", "fix"), BAD_INPUT, ids=[" ".join(a[:2]) + f" #{i}" for i, (a, _, _) in enumerate(BAD_INPUT)])
def test_bad_input_is_refused_with_its_fix_before_any_trial_starts(args, error, fix, tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("a trial started"))
    code = main(["tune", "data_parallel", *args, "--workdir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert error in err and "Fix:" in err and fix in err.split("Fix:", 1)[1], err
    assert not started and not list(tmp_path.rglob("trial.json"))


def test_a_cluster_too_big_for_this_machine_at_the_parallelism_asked_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a trial started"))
    cores = len(os.sched_getaffinity(0))
    code = main(["tune", "data_parallel", "--param", "lr=0.01,0.02,0.04,0.08", "--parallel", "4",
                 "--hosts", str(5 * cores), "--workdir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "4 trial(s) at once" in err and "--parallel 1" in err, err


def test_each_trial_slot_gets_its_own_cores_or_a_fair_share():
    assert core_shares([0, 1], 2) == [(0,), (1,)]
    assert core_shares([0, 1, 2, 3], 2) == [(0, 1), (2, 3)]
    assert core_shares([0, 1, 2, 3, 4], 2) == [(0, 1, 2), (3, 4)]
    assert core_shares([0, 1], 3) == [(0,), (1,), (0,)]
    assert core_shares([5], 1) == [(5,)]


def test_the_table_marks_the_best_trial_and_shows_failures():
    space = SearchSpace.parse(LAB, ["lr=0.01,0.05,0.2"])
    trials = [Trial(1, {"lr": "0.01"}, "ok", 0.82, 21.0), Trial(2, {"lr": "0.05"}, "ok", 0.94, 20.5),
              Trial(3, {"lr": "0.2"}, "failed", None, 3.0, failure="RuntimeError: loss is nan\nmore")]
    result = TuneResult(LAB, Objective("test_accuracy"), space, trials, "local", layout="2 x 1")
    assert result.best is trials[1] and result.failed == [trials[2]]
    table = result.table()
    assert re.search(r"^2 \*\s+0\.05\s+0\.9400", table, re.MULTILINE), table
    assert "failed: RuntimeError: loss is nan" in table and "more" not in table
    assert result.table(markdown=True).splitlines()[1] == "|---|---|---|---|---|"
    assert result.by(lr=0.05) is trials[1]
    loss = TuneResult(LAB, Objective("test_loss", maximize=False), space,
                      [Trial(1, {"lr": "0.01"}, "ok", 0.3), Trial(2, {"lr": "0.05"}, "ok", 0.2)], "local")
    assert loss.best.index == 2


# --------------------------------------------------------------------------- SageMaker, offline


def test_the_sagemaker_dry_run_is_one_tuning_job_whose_trials_run_the_distributed_driver(no_aws, capsys):
    code = main(["tune", "data_parallel", "--param", "lr=0.01,0.05", "--mode", "sagemaker", "--dry-run",
                 "--hosts", "2", "--parallel", "2", "--hp", "epochs=1"])
    out = capsys.readouterr().out
    assert code == 0
    request = json.loads(out[out.index("\n{") + 1 : out.index("\n}\n") + 2])
    config = request["HyperParameterTuningJobConfig"]
    assert config["Strategy"] == "Grid"
    assert config["ResourceLimits"] == {"MaxParallelTrainingJobs": 2}  # Grid: the service counts the grid
    assert config["HyperParameterTuningJobObjective"] == {"Type": "Maximize", "MetricName": "test_accuracy"}
    assert config["ParameterRanges"]["CategoricalParameterRanges"] == [{"Name": "lr", "Values": ["0.01", "0.05"]}]
    definition = request["TrainingJobDefinition"]
    static = definition["StaticHyperParameters"]
    # SDK issue #5610: the toolkit runs `sagemaker_program`; it must be the workshop's trial entry,
    # which hands over to sm_train.sh and torchrun, not the lab's script run plainly.
    assert static["sagemaker_program"] == "workshop_trial.py" and static["epochs"] == "1"
    assert "lr" not in static
    assert "test_accuracy" in [m["Name"] for m in definition["AlgorithmSpecification"]["MetricDefinitions"]]
    assert {c["ChannelName"] for c in definition["InputDataConfig"]} == {"train", "test", "sm_drivers"}
    assert definition["ResourceConfig"]["InstanceCount"] == 2
    # No shared checkpoint prefix: a trial must not resume another's checkpoint (and the tuner would
    # send CheckpointConfig without the S3Uri the API requires; the dry run validates as botocore does).
    assert "CheckpointConfig" not in definition
    assert len(request["HyperParameterTuningJobName"]) <= 32
    assert {"Key": "workshop-lab", "Value": "data_parallel"} in request["Tags"]
    assert "cost: at most $5.63 = 2 trials x 2 x ml.g5.xlarge x $1.408/h x 1 h" in out
    assert "quota (Service Quotas; this needs 4)" in out
    assert "(arguments.py, checkpointing.py, contract.py, fault_tolerance.py, step_profiler.py, train.py, workshop_trial.py)" in out  # the packed source dir: the lab's code/ and the trial entry


def test_a_range_becomes_a_random_search_with_its_scale(no_aws, capsys):
    from workshop.jobs import dry_run

    space = SearchSpace.parse(LAB, ["lr=0.001:0.1:log", "batch-size=32,64"], trials=6, seed=3)
    request = dry_run(LAB, show=False, space=space, parallel=3, instance_count=1)
    config = request["HyperParameterTuningJobConfig"]
    assert config["Strategy"] == "Random" and config["RandomSeed"] == 3
    assert config["ResourceLimits"] == {"MaxNumberOfTrainingJobs": 6, "MaxParallelTrainingJobs": 3}
    ranges = config["ParameterRanges"]
    assert ranges["ContinuousParameterRanges"] == [
        {"Name": "lr", "MinValue": "0.001", "MaxValue": "0.1", "ScalingType": "Logarithmic"}]
    assert ranges["CategoricalParameterRanges"] == [{"Name": "batch-size", "Values": ["32", "64"]}]


def test_the_quota_is_checked_for_every_trial_running_at_once():
    from workshop.cloud.preflight import check_quota

    quotas = [service_quota("ml.g5.xlarge for training job usage", 2, "L-G5X")]
    assert "need 2" in check_quota(quota_client(quotas), "ml.g5.xlarge", 2, REGION, per_job=2)
    with pytest.raises(WorkshopError) as info:
        check_quota(quota_client(quotas), "ml.g5.xlarge", 4, REGION, per_job=2)
    text = str(info.value)
    assert "the tuning job needs 4 (2 trials at once x 2)" in text and "--parallel 1" in text
    with pytest.raises(WorkshopError, match="needs 6 .* is zero|is 2; the tuning job needs 6") as info:
        check_quota(quota_client(quotas), "ml.g5.xlarge", 6, REGION, per_job=3)
    assert "--parallel" not in str(info.value)  # not even one 3-instance trial fits


def test_cleanup_stops_only_this_users_running_workshop_tuning_jobs():
    from workshop import cloud
    from workshop.cloud.cleanup import stop_user_tuning_jobs

    class FakeSM:
        def __init__(self):
            self.stopped = []

        def get_paginator(self, name):
            assert name == "list_hyper_parameter_tuning_jobs"
            jobs = [("alice-data-paral-1123120000", "alice"), ("alice-other-1123120000", None),
                    ("alice2-data-para-1123120000", "alice2")]
            summaries = [{"HyperParameterTuningJobName": n, "HyperParameterTuningJobArn": f"arn:{n}:{u}"} for n, u in jobs]

            class Pages:
                def paginate(self, **kw):
                    assert kw == {"StatusEquals": "InProgress", "NameContains": "alice"}
                    return [{"HyperParameterTuningJobSummaries": summaries}]

            return Pages()

        def list_tags(self, ResourceArn):
            user = ResourceArn.rsplit(":", 1)[1]
            return {"Tags": [] if user == "None" else cloud.workshop_tags(user=user)}

        def stop_hyper_parameter_tuning_job(self, HyperParameterTuningJobName):
            self.stopped.append(HyperParameterTuningJobName)

    sm = FakeSM()
    assert stop_user_tuning_jobs(sm, "alice") == ["alice-data-paral-1123120000"] == sm.stopped


# --------------------------------------------------------------------------- slow: trials really run


def _tune_cli(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workshop", "tune", "data_parallel", *args],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, **kw)


@pytest.mark.slow
def test_the_issues_command_prints_the_table_and_the_best_trial(tmp_path, mnist_dir):
    proc = _tune_cli("--param", "lr=0.01,0.05", "--parallel", "2", "--hp", "epochs=1", "--workdir", str(tmp_path),
                     "--data-dir", str(mnist_dir))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert re.search(r"^trial\s+lr\s+test_accuracy\s+wall time\s+status$", out, re.MULTILINE), out
    rows = re.findall(r"^(\d)( \*)?\s+(0\.0[15])\s+(0\.\d{4})\s+[\d.]+ s\s+ok$", out, re.MULTILINE)
    assert len(rows) == 2 and sum(bool(star) for _, star, _, _ in rows) == 1, out
    best = max(rows, key=lambda r: float(r[3]))
    assert best[1] == " *" and f"best: trial {best[0]} (lr={best[2]})" in out
    cores = len(os.sched_getaffinity(0))
    assert f"at most 2 at once on {cores} core(s)" in out
    folder = next(tmp_path.glob("runs/tune-data-parallel-*"))
    saved = json.loads((folder / "tune.json").read_text())
    assert [t["status"] for t in saved["trials"]] == ["ok", "ok"]
    if cores >= 2:  # each trial pinned to cores of its own
        assert set(saved["trials"][0]["cores"]).isdisjoint(saved["trials"][1]["cores"])
    assert (folder / "tune.png").stat().st_size > 10_000
    for trial in saved["trials"]:  # each a whole local-cluster job of its own
        assert (Path(trial["folder"]) / "run/logs/algo-2.log").is_file()


@pytest.mark.slow
def test_a_failing_trial_is_reported_and_the_others_finish(tmp_path, mnist_dir):
    # backend=nccl passes the parser (a valid choice) and fails inside the ranks: no GPU here.
    proc = _tune_cli("--param", "backend=gloo,nccl", "--hosts", "1", "--parallel", "1", "--hp", "epochs=1",
                     "--hp", "max-steps=5", "--workdir", str(tmp_path), "--data-dir", str(mnist_dir))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out
    assert re.search(r"^1 \*\s+gloo\s+0\.\d{4}\s+[\d.]+ s\s+ok$", out, re.MULTILINE), out
    assert re.search(r"^2\s+nccl\s+-\s+[\d.]+ s\s+failed: .*", out, re.MULTILINE), out
    assert "trial 2/2 FAILED" in out and "needs CUDA GPUs" in out


def _carrying(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("TUNE_TEST_TOKEN") == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


@pytest.mark.slow
def test_ctrl_c_stops_every_trial_and_leaves_nothing_running(tmp_path, mnist_dir):
    token = uuid.uuid4().hex
    # The child takes Ctrl-C as a terminal's foreground job does, whatever this test inherited.
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT]); "
            "from workshop.__main__ import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "tune", "data_parallel", "--param", "lr=0.01,0.02,0.04", "--parallel", "2",
         "--hosts", "1", "--hp", "epochs=20", "--workdir", str(tmp_path), "--data-dir", str(mnist_dir)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TUNE_TEST_TOKEN": token})
    try:
        deadline = time.monotonic() + 300
        logs = []
        while len(logs) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)  # both running trials (each a job of 1 host) have training ranks up
            logs = [p for p in tmp_path.glob("runs/tune-*/trial-*/run/logs/algo-1.log") if "METRICS" in p.read_text()]
        assert len(logs) == 2, proc.stdout.read() if proc.poll() is not None else "trials never trained"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 130, out
        assert "Ctrl-C: stopping 2 running trial(s)" in out and "every process the workshop started" in out
        assert re.search(r"^3\s+0\.04\s+-\s+-\s+stopped", out, re.MULTILINE), out  # never started
        deadline = time.monotonic() + 30
        while (left := _carrying(token)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"{len(left)} processes outlived the search: {[p.cmdline()[:4] for p in left[:5]]}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in _carrying(token):
            p.kill()


def test_more_trials_at_once_than_the_quota_allows_is_refused_before_anything_is_created(
        strict_moto_session, monkeypatch, tmp_path):
    from workshop.cloud import aws
    from workshop.tuning import tune

    boto = strict_moto_session
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
    role = boto.client("iam").create_role(RoleName="WorkshopTraining", AssumeRolePolicyDocument=json.dumps(trust))
    sq = quota_client([service_quota("ml.g5.xlarge for training job usage", 2, "L-G5X")], REGION)
    original = boto.client
    monkeypatch.setattr(boto, "client", lambda name, *a, **k: sq if name == "service-quotas" else original(name, *a, **k))
    monkeypatch.setattr(aws, "boto_session", lambda region=None, **kw: boto)
    data = tmp_path / "mnist"
    for channel in ("train", "test"):
        (data / channel).mkdir(parents=True)
    with pytest.raises(WorkshopError) as info:
        tune(LAB, ["lr=0.01,0.05"], mode="sagemaker", hosts=2, parallel=2, hyperparameters={"epochs": 1},
             role=role["Role"]["Arn"], data_dir=data)
    assert "the tuning job needs 4 (2 trials at once x 2)" in info.value.message
    assert "--parallel 1" in info.value.fix
    sm = original("sagemaker")
    assert sm.list_hyper_parameter_tuning_jobs()["HyperParameterTuningJobSummaries"] == []
    assert sm.list_training_jobs()["TrainingJobSummaries"] == []
    s3 = original("s3")
    assert [o for b in s3.list_buckets()["Buckets"] for o in s3.list_objects_v2(Bucket=b["Name"]).get("Contents", [])] == []


# --------------------------------------------------------------------------- slow: a tuning job on the fake


@pytest.mark.slow
def test_on_the_fake_service_each_trial_is_a_whole_distributed_job(no_aws, tmp_path, mnist_dir, capsys, monkeypatch):
    """The workaround for sagemaker-python-sdk#5610, end to end: `tune(mode="sagemaker")` on 2
    instances. The fake runs each trial as the image's toolkit does (test_fake_tuning.py shows the
    SDK's tuner alone gets two worlds of one); with workshop_trial.py every trial is one world of 2
    ranks, started by torchrun on both hosts, and the table is the service's own results."""
    import fake_sagemaker
    from test_fake_tuning import configuration, host_logs

    from workshop.tuning import tune

    monkeypatch.setenv("WORKSHOP_USER", "alice")
    monkeypatch.setattr(importlib.import_module("workshop.jobs.submit"), "POLL_S", 1.0)  # the waits' polls
    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=1.0) as fake:
        result = tune(LAB, ["lr=0.02,0.05"], mode="sagemaker", hosts=2, parallel=2, data_dir=mnist_dir, confirm_cost=True,
                      hyperparameters={"epochs": 1, "max-steps": 8, "log-interval": 2})
        out = capsys.readouterr().out
        [record] = fake.tuning_jobs
        assert record.status == "Completed" and len(record.trials) == 2
        assert record.most_at_once == 2  # --parallel 2: both trials ran at once, 4 instances (the quota's 4)
        for trial in record.trials:  # the workshop followed each trial to its end
            assert re.search(rf"\[sagemaker\] training job {trial.name} \(lr=[\d.]+\): Completed, objective 0\.\d+", out)
        for trial in record.trials:
            assert trial.status == "Completed" and trial.launch == "toolkit", trial.failure_reason
            logs = host_logs(fake, trial.name)
            assert sorted(logs) == ["algo-1", "algo-2"]
            everything = [line for lines in logs.values() for line in lines]
            assert any(line.startswith("workshop_trial: running sm_train.sh") for line in everything)
            # It wrote nothing under /opt/ml/input (the fake mounts the service's part read-only): the
            # environment file is in its own folder next to the code.
            assert any(line == "Environment variables written to /opt/ml/code/.workshop-trial/sm_training.env "
                       "by workshop_trial.py" for line in everything)
            assert sum("torchrun --nnodes=2" in line for line in everything) == 2  # the SDK's driver, on each host
            assert configuration(logs["algo-1"])["world_size"] == 2  # one world of 2, not two of 1
            assert not any(line.startswith("Configuration: ") for line in logs["algo-2"])  # rank 1: no rank-0 lines
            assert not any("--sagemaker_program" in line or "_tuning_objective_metric" in line for line in everything
                           if "train.py" in line)  # the reserved entries never reach the script
    assert result.tuning_job == record.name and [t.status for t in result.trials] == ["ok", "ok"]
    best = max(result.trials, key=lambda t: t.metric)
    assert result.best is best and record.best_training_job == best.job_name
    assert f"tuning job {record.name}: Completed; best trial {best.job_name}" in out
    assert re.search(rf"^{best.index} \*\s+{best.hyperparameters['lr']}\s+0\.\d{{4}}", out, re.MULTILINE), out


@pytest.mark.parametrize("launcher", ["torchrun", "elastic torchrun", "no launcher"])
def test_a_trial_finds_in_the_sdks_sm_train_sh_every_line_it_points_elsewhere(launcher, tmp_path):
    """workshop_trial.py runs a copy of the job's sm_train.sh with the lines that name /opt/ml/input's
    environment file and code channel replaced (a trial writes nothing there, and has no code channel):
    each is in the script this SDK generates, once, whatever the launcher."""
    from sagemaker.train.distributed import Torchrun

    from workshop.jobs.tuning import TRIAL_DRIVER
    from workshop.launchers.configs import ElasticTorchrun
    from workshop.runtime.contract import write_sm_drivers
    from workshop.spec import load_module

    distributed = {"torchrun": Torchrun(process_count_per_node=1),
                   "elastic torchrun": ElasticTorchrun(process_count_per_node=1, max_restarts=1),
                   "no launcher": None}[launcher]
    drivers = write_sm_drivers(tmp_path / "sm_drivers", LAB.source_dir, LAB.entry_script, distributed)
    script = (drivers / "sm_train.sh").read_text()
    trial = load_module(TRIAL_DRIVER, "workshop_trial_under_test")
    for step in (trial.ENVIRONMENT_STEP, trial.SOURCE_STEP, trial.CODE_STEP):
        assert script.count(step) == 1 and any(line.strip() == step for line in script.splitlines()), (step, script)


def test_a_local_search_says_which_trials_are_still_running_while_none_ends(tmp_path, monkeypatch):
    """No more than HEARTBEAT_S without a line: a trial that runs on gets a 'still running' line
    (here the trial waits until that line is printed, then ends)."""
    from workshop import tuning

    flag = tmp_path / "heartbeat-seen"
    lines: list[str] = []

    def start(lab, trial, base, hosts, procs, data_dir, cores, folder):
        trial.folder = folder / f"trial-{trial.index:03d}"
        trial.folder.mkdir(parents=True)
        (trial.folder / "trial.log").write_text("")
        trial.cores, trial.status = tuple(cores), "running"
        return subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                                 "while not os.path.exists(sys.argv[1]): time.sleep(0.02)", str(flag)])

    def say(message: str) -> None:
        lines.append(message)
        if message.startswith("still running:"):
            flag.touch()

    monkeypatch.setattr(tuning, "_start_trial", start)
    monkeypatch.setattr(tuning, "say", say)
    monkeypatch.setattr(tuning, "HEARTBEAT_S", 0.0)
    space = SearchSpace.parse(LAB, ["lr=0.01"])
    result = TuneResult(LAB, Objective("test_accuracy"), space, [Trial(1, {"lr": "0.01"})], "local",
                        folder=tmp_path)
    tuning._run_trials(LAB, result, {}, 1, 1, None, [[0]])
    assert lines[0].startswith("trial 1/1 started: lr=0.01")
    # one line per poll until the trial saw the first one and ended (HEARTBEAT_S is 0 here)
    assert lines[1:-2] and all(re.fullmatch(r"still running: trial 1/1 \(lr=0\.01\) \d+ s", line)
                               for line in lines[1:-2]), lines
    assert lines[-2].startswith("trial 1/1 FAILED")  # it left no result: the search says so, and goes on
    assert lines[-1].startswith("  its logs:")


def test_a_live_search_is_one_display_of_trials_done_running_and_the_best(capsys):
    """The issue: lab 3's two searches printed 84 `[tune]` lines in the notebook; now one display each."""
    from workshop.labs import get_lab
    from workshop.search import Objective
    from workshop.tuning import SearchProgress, Trial

    now = [100.0]
    objective = Objective.parse(get_lab("data_parallel"), None)
    progress = SearchProgress(6, objective, clock=lambda: now[0])  # tqdm, on stderr here
    first, second, third = (Trial(i, {"lr": lr}) for i, lr in ((1, "0.0125"), (2, "0.025"), (3, "0.05")))
    assert progress.postfix([(first, 95.0), (second, 99.0)], []) == "running: trial 1 (lr=0.0125) 5 s, trial 2 (lr=0.025) 1 s"
    first.status, first.metric = "ok", 0.91
    second.status, second.metric = "ok", 0.95
    third.status, third.failure = "failed", "rank 1 died"
    progress.update([], [first, second, third])
    assert "3/6 trials" in capsys.readouterr().err
    assert progress.postfix([], [first, second, third]) == f"no trial running; best {objective.metric} 0.9500; 1 failed"
    progress.close()
