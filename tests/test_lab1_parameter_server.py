"""Lab 1: TF_CONFIG from the host list, the launcher, 3 simulated hosts, a lost worker, a lost coordinator, and
the staleness of each gradient pushed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from workshop import metrics
from workshop.errors import WorkshopError
from workshop.labs import get_lab
from workshop.launchers.parameter_server import ParameterServer, job_ports, load_driver
from workshop.runner import run_local
from workshop.runtime.local_cluster import MARKER, LocalCluster, processes_with_marker
from workshop.spec import load_module

LAB = get_lab("parameter_server")
DRIVER = load_driver()
HOSTS = ["algo-1", "algo-2", "algo-3"]


# ----------------------------------------------------------------------------- topology (fast)


def test_tf_config_on_sagemaker_hosts():
    configs = DRIVER.tf_configs(HOSTS, "algo-2", "algo-1", 7777)
    cluster = {
        "chief": ["algo-1:7777"],
        "ps": ["algo-1:7778", "algo-2:7779", "algo-3:7780"],
        "worker": ["algo-2:7781", "algo-3:7782"],
    }
    assert configs == {
        "ps": {"cluster": cluster, "task": {"type": "ps", "index": 1}, "environment": "cloud"},
        "worker": {"cluster": cluster, "task": {"type": "worker", "index": 0}, "environment": "cloud"},
    }
    chief = DRIVER.tf_configs(HOSTS, "algo-1", "algo-1", 7777)
    assert chief["chief"]["task"] == {"type": "chief", "index": 0} and chief["ps"]["task"]["index"] == 0


def test_tf_config_locally_uses_loopback_and_distinct_ports():
    cluster = DRIVER.cluster_spec(HOSTS, "127.0.0.1", 20000)
    addresses = [a for task in cluster.values() for a in task]
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert len(set(addresses)) == 6 == len(addresses)
    assert job_ports(20000, 3) == list(range(20000, 20006))
    # SageMaker sorts host names as strings: algo-10 comes before algo-2, and so does its rank.
    many = [f"algo-{i}" for i in range(1, 12)]
    assert DRIVER.cluster_spec(many, "algo-1", 7777)["ps"][1] == "algo-10:7779"


@pytest.mark.parametrize(
    ("hosts", "current", "message"),
    [(["algo-1"], "algo-1", "at least 2 hosts"), (HOSTS, "algo-9", "not in the host list")],
)
def test_tf_config_bad_host_lists(hosts, current, message):
    with pytest.raises(ValueError, match=message):
        DRIVER.tf_configs(hosts, current, "algo-1", 7777)


def test_driver_is_self_contained():
    """It runs inside the training container: standard library only."""
    source = (DRIVER.__file__ and open(DRIVER.__file__).read()) or ""
    imports = {line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "ipaddress", "json", "os", "signal", "socket", "subprocess", "sys", "threading", "time"}


def test_sagemaker_request(tmp_path):
    from workshop import jobs as sj

    assert LAB.launcher.name == "parameter_server"
    request = sj.dry_run(LAB, hyperparameters={"steps": 100}, show=False)
    assert request["AlgorithmSpecification"]["TrainingImage"].endswith("tensorflow-training:2.21-cpu-py312")
    assert request["ResourceConfig"]["InstanceType"] == "ml.c5.2xlarge"
    assert request["ResourceConfig"]["InstanceCount"] == 3
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == 3600
    assert json.loads(request.sm_drivers["distributed.json"]) == ParameterServer().model_dump()
    assert "distributed_drivers/ps_driver.py" in request.sm_drivers["sm_train.sh"]
    with pytest.raises(WorkshopError, match="at least 2 hosts"):
        sj.dry_run(LAB, hyperparameters={}, instance_count=1, show=False)


# ----------------------------------------------------------------------------- staleness (fast)


def test_staleness_is_reported_as_a_histogram_per_worker_and_read_back(capsys):
    """The coordinator's report (code/timeline.py) of each step's staleness, and the notebook's reading of it
    (figures.py): a line per worker and value seen, each worker's mean, the mean and maximum over all."""
    timeline = load_module(LAB.source_dir / "timeline.py", "lab1_timeline", with_siblings=True)
    figures = load_module(LAB.path / "figures.py", "lab1_figures")
    events = [(0.1, 1, 0), (0.2, 2, 3), (0.3, 1, 1), (0.4, 1, 0), (0.5, 2, 2)]  # (time, worker, staleness) per step
    assert timeline.staleness_histogram(events) == {1: {0: 2, 1: 1}, 2: {2: 1, 3: 1}}
    timeline.report_staleness(events)
    seen = figures.staleness_of(metrics.parse_lines(capsys.readouterr().out.splitlines()))
    assert seen["histogram"] == {1: {0: 2, 1: 1}, 2: {2: 1, 3: 1}}
    assert seen["mean"] == {1: pytest.approx(1 / 3, abs=1e-5), 2: 2.5}
    assert (seen["overall"], seen["max"], seen["pushes"]) == (pytest.approx(6 / 5), 3, 5)
    timeline.report_staleness([])  # a resumed run that trained nothing reports nothing
    assert capsys.readouterr().out == "" and figures.staleness_of([]) == {}


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("hps", "hosts", "procs", "message"),
    [
        ({}, 1, 1, "needs at least 2 hosts"),
        ({"steps": "many"}, 3, 1, "argument --steps: invalid int value: 'many'"),
        ({"lr": "fast"}, 3, 1, "argument --lr: invalid float value"),
        ({"slow-worker": 5}, 3, 1, "--slow-worker must be the host rank of a worker"),
        ({}, 3, 2, "one training process per host"),
    ],
)
def test_bad_input_fails_before_any_process_starts(tmp_path, channels, hps, hosts, procs, message):
    with pytest.raises(WorkshopError, match=message):
        run_local(LAB, hosts=hosts, procs_per_host=procs, hyperparameters=hps, workdir=tmp_path / "run",
                  data_dir=channels["train"].parent, echo=False)
    assert not (tmp_path / "run").exists()


def test_ports_in_use_are_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        held = s.getsockname()[1]
        # (another process on the machine may hold one of the other ports the job derives: then both are named)
        with pytest.raises(WorkshopError, match=rf"Ports? (\d+, )*{held}(, \d+)* on 127\.0\.0\.1 is already in use"):
            LocalCluster(LAB.source_dir, hosts=3, distributed=ParameterServer(), master_port=held - 2, echo=False)


# ----------------------------------------------------------------------------- real runs


def run(tmp_path, channels, name, **kw):
    return run_local(LAB, workdir=tmp_path / name, data_dir=channels["train"].parent, echo=False, **kw)


def processes_with_marker_in(result) -> list:
    ids = set()
    for p in psutil.process_iter(["pid"]):
        try:
            if str(result.workdir) in p.cwd():
                ids.add(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
    return sorted(ids)


def _find(cluster_workdir, role: str, host: str, timeout: float = 120):
    """The process of `host` whose TF_CONFIG task is `role`, once the coordinator has reported its
    first steps (the driver passes no role flag: a host's two processes differ only in TF_CONFIG)."""
    deadline = time.monotonic() + timeout
    log = cluster_workdir / "logs" / "algo-1.log"
    while time.monotonic() < deadline:
        if log.is_file() and "METRICS rank=0 step=" in log.read_text(errors="replace"):
            for p in psutil.process_iter(["pid"]):
                try:
                    env = p.environ()
                    task = json.loads(env.get("TF_CONFIG") or "{}").get("task", {})
                    # The host a process runs on: SM_CURRENT_HOST (its cwd is the container's
                    # /opt/ml/input/data/code on every host of the container runtime).
                    if (task.get("type") == role
                            and env.get("SM_CURRENT_HOST") == host
                            and str(cluster_workdir) in env.get("SM_MODEL_DIR", "") + str(_sandbox_of(p))):
                        return p
                except (psutil.NoSuchProcess, psutil.AccessDenied, OSError, ValueError, AttributeError):
                    continue
        time.sleep(0.2)
    raise AssertionError(f"no {role} process on {host} in training")


def _sandbox_of(p) -> str:
    """The host folder a process's /opt/ml is (container runtime), from its mount table."""
    try:
        for line in Path(f"/proc/{p.pid}/mountinfo").read_text().splitlines():
            fields = line.split()
            if fields[4] == "/opt/ml":
                return fields[3]
    except OSError:
        pass
    return ""


def _run_and_kill(tmp_path, channels, role, host, hps):
    out: dict = {}
    workdir = tmp_path / "run"

    def target():
        out["result"] = run_local(LAB, workdir=workdir, data_dir=channels["train"].parent, echo=False,
                                  hyperparameters=hps, check=False)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        victim = _find(workdir, role, host)
        victim.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
    finally:
        thread.join(timeout=600)
    return out["result"], time.monotonic() - killed_at


@pytest.mark.slow
def test_a_worker_killed_mid_training_does_not_stop_the_job(tmp_path, channels):
    """3 hosts, worker algo-2 SIGKILLed once training runs: the other worker does the rest, and the job
    ends as an uninterrupted one does (its accuracy, variable placement and sharding are checked
    without a fault by 1_parameter_server/parameter_server.ipynb): the checkpoint on the coordinator's
    host, and a saved model that loads without the training code and scores the same."""
    result, _ = _run_and_kill(tmp_path, channels, "worker", "algo-2", {"steps": 400, "log-interval": 25})
    assert result.ok, result.failure
    assert result.metric("final_test_accuracy") >= 0.90
    assert result.metric("steps") == 400
    totals = {r["worker"]: r["worker_total_steps"] for r in result.records if "worker_total_steps" in r}
    assert totals[2] > totals.get(1, 0)  # the survivor did most of the work
    assert sum(totals.values()) == 400 and result.metric("workers_used") == len(totals)  # no step counted twice
    assert any("the worker exited with status -9" in line for line in result.lines)
    assert not processes_with_marker_in(result)
    # The variables live on the parameter-server tasks, the large kernel split across all three.
    devices = {(r["variable"], r["shard"]): r["device"] for r in result.records if "device" in r}
    assert devices and all(d.startswith("/job:ps/") for d in devices.values())
    assert len({d for (name, _), d in devices.items() if name == "dense1/kernel"}) == 3
    # Each host has its own /opt/ml/checkpoints, as on SageMaker: the whole checkpoint (every
    # parameter server's shard) is written through the coordinator, on algo-1.
    algo1, *others = [h.checkpoint_dir for h in result.hosts]
    assert len(list(algo1.glob("ckpt-400.data-*-of-*"))) == 4 and (algo1 / "ckpt-400.index").is_file()
    assert not any(any(d.iterdir()) for d in others)
    # The model loads back, without the training code, and scores the same.
    check = (
        "import sys, numpy as np, tensorflow as tf\n"
        "m = tf.saved_model.load(sys.argv[1]); d = np.load(sys.argv[2])\n"
        "logits = m.signatures['serving_default'](images=tf.constant(d['images']))['logits']\n"
        "print(float(np.mean(np.argmax(logits, 1) == d['labels'])))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", check, str(result.model_dir / "saved_model"), str(channels["test"] / "mnist.npz")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.strip().splitlines()[-1]) == pytest.approx(result.metric("final_test_accuracy"), abs=1e-3)


@pytest.mark.slow
def test_losing_the_coordinator_fails_the_job_fast(tmp_path, channels):
    result, after_kill_s = _run_and_kill(tmp_path, channels, "chief", "algo-1", {"steps": 2000, "log-interval": 25})
    assert not result.ok
    assert "Host algo-1 failed" in result.failure
    assert result.failure.splitlines()[0] == "Rank 0 on algo-1 (the coordinator) was killed by SIGKILL (signal 9).", result.failure
    assert after_kill_s < 30  # not the 2,000 steps, not max_run
    assert not processes_with_marker_in(result)
    assert (result.hosts[0].sandbox.failure_file).is_file()


@pytest.mark.slow
def test_checkpoints_every_interval_from_one_traced_function(tmp_path, channels):
    """A checkpoint at each of 8 intervals: TensorFlow warns of tf.function retracing from the 5th
    eager save of variables on several tasks; the script's save function is traced once. Only the
    newest two checkpoints stay."""
    result = run(tmp_path, channels, "run", hosts=2, hyperparameters={"steps": 80, "log-interval": 10})
    assert result.ok, result.failure
    assert [r["step"] for r in result.records if "test_accuracy" in r] == list(range(10, 81, 10))
    logs = sorted((result.workdir / "logs").glob("*.log"))
    assert {p.name for p in logs} >= {"algo-1.log", "algo-2.log", "cluster.log"}
    # TensorFlow's words: "5 out of the last 5 calls to <function ...> triggered tf.function retracing."
    retracing = [line for p in logs for line in p.read_text(errors="replace").splitlines()
                 if "tf.function retracing" in line]
    assert not retracing, retracing[:2]
    kept = sorted(p.name for p in result.hosts[0].checkpoint_dir.glob("ckpt-*.index"))
    assert kept == ["ckpt-70.index", "ckpt-80.index"]
    # One worker: no other update can land between a step's read and its push, so every gradient has staleness 0
    # (the check that the count is right; the test below runs two workers).
    assert {(r["worker"], r["staleness"]): r["pushes"] for r in result.records if "staleness" in r} == {(1, 0): 80}
    assert result.metric("staleness_max") == 0 and result.metric("pushes_total") == 80


@pytest.mark.slow
def test_two_workers_push_stale_gradients_and_each_is_counted_once(tmp_path, channels):
    """Two workers of equal speed: while one computes, the other pushes, so gradients are stale by about one
    update; the histogram holds every step once, each worker's under its rank (one worker: the test above)."""
    result = run(tmp_path, channels, "run", hosts=3, hyperparameters={"steps": 60, "log-interval": 30})
    assert result.ok, result.failure
    histogram = {(r["worker"], r["staleness"]): r["pushes"] for r in result.records if "staleness" in r}
    totals = {r["worker"]: r["worker_total_steps"] for r in result.records if "worker_total_steps" in r}
    assert sorted(totals) == [1, 2] and sum(histogram.values()) == 60 == result.metric("pushes_total")
    assert {w: sum(n for (v, _), n in histogram.items() if v == w) for w in totals} == totals
    assert result.metric("staleness_max") >= 1 and any(s > 0 for _, s in histogram)
    assert result.metric("staleness_mean") == pytest.approx(sum(s * n for (_, s), n in histogram.items()) / 60, abs=1e-4)


def test_marker_is_not_left_behind():
    assert MARKER and not [p for p in processes_with_marker("no-such-cluster")]
    assert os.environ.get("TF_CONFIG") is None
