"""The local runtime under abuse: a killed notebook, a read-only checkout, bad input, foreign scripts.

- A run given `checkpoint_dir` writes its checkpoints there from the first one on (the hosts'
  /opt/ml/checkpoints *is* that folder), so SIGKILL of the process that started it loses at
  most the checkpoint being written, leaves no process behind, and the next run resumes.
- Every refusal reaches the command line as one `error:` line and a `Fix:` line, exit status 2,
  never a traceback: a read-only checkout (before anything starts), a data folder that is a
  file, and the labs' own rules.
- The parameter-server launcher runs script-mode scripts unchanged: it passes only the
  hyperparameters and tells each process its role in TF_CONFIG.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from workshop import REPO_ROOT
from workshop.__main__ import main
from workshop.labs import get_lab
from workshop.launchers.parameter_server import ParameterServer
from workshop.runtime import hostns
from workshop.runtime.local_cluster import MARKER, LocalCluster, processes_with_marker

DDP = get_lab("data_parallel")


def cli(argv: list[str], capsys) -> tuple[int, str]:
    """Run the command line in this process: (exit status, stdout + stderr)."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    out = capsys.readouterr()
    return code, out.out + out.err


def assert_refused_with_fix(code: int, output: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("  Fix: ") and len(last) > len("  Fix: ") + 10, output


# ----------------------------------------------------------------------------- checkpoints survive SIGKILL

PARENT = textwrap.dedent(
    """
    import sys
    from workshop.labs import get_lab
    from workshop.runtime.local_cluster import LocalCluster

    runtime, data, workdir, store = sys.argv[1:]
    lab = get_lab("data_parallel")
    cluster = LocalCluster(lab.source_dir, lab.entry_script, hosts=2, distributed=lab.distributed_config(1),
                           workdir=workdir, runtime=runtime, echo=False)
    # Many one-step epochs: rank 0 checkpoints after each, for as long as it is left running.
    cluster.run({"epochs": 10000, "max-steps": 1, "log-interval": 1, "threads": 1},
                {"train": data + "/train", "test": data + "/test"}, checkpoint_dir=store)
    """
)


def _runtimes() -> list:
    container = pytest.param(
        "container",
        marks=pytest.mark.skipif(not hostns.available()[0], reason="no unprivileged namespaces here"),
    )
    return [container, "process"]


def _alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (a zombie waiting for its reaper is not running)."""
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("runtime", _runtimes())
def test_sigkill_of_the_parent_keeps_the_checkpoints_and_leaves_no_process(tmp_path, mnist_dir, runtime):
    import torch

    store = tmp_path / "checkpoints"  # the user's folder; it does not exist before the run
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, runtime, str(mnist_dir), str(tmp_path / "run"), str(store)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while not (store / "checkpoint.pt").is_file():
            assert parent.poll() is None, f"the run ended (status {parent.returncode}) before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint in the checkpoint folder after 240 s"
            time.sleep(0.2)
        time.sleep(1.0)  # a checkpoint or two more: the kill lands while the job runs on
        started = psutil.Process(parent.pid).children(recursive=True)
        markers = set()
        for proc in started:
            try:
                markers.add(proc.environ().get(MARKER))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        markers.discard(None)
        assert len(markers) == 1, markers  # the hosts carry the run's marker
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()

    (cluster_id,) = markers
    deadline = time.monotonic() + 60  # run_driver's own sweep waits 10 s for the launchers first
    while (processes_with_marker(cluster_id) or _alive({p.pid for p in started})) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_with_marker(cluster_id), "processes of the killed run are still alive"
    assert not _alive({p.pid for p in started}), "processes the killed parent started are still alive"

    state = torch.load(store / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert state["epoch"] >= 1 and state["model"] and state["optimizer"]

    # The next run resumes from the folder, in this runtime too.
    resumed = LocalCluster(DDP.source_dir, DDP.entry_script, hosts=2, distributed=DDP.distributed_config(1),
                           workdir=tmp_path / "again", runtime=runtime, echo=False).run(
        {"epochs": state["epoch"] + 1, "max-steps": 1, "log-interval": 1, "threads": 1},
        {"train": mnist_dir / "train", "test": mnist_dir / "test"}, checkpoint_dir=store,
    )
    assert any("Resumed from" in line and f"after epoch {state['epoch']}" in line for line in resumed.lines)
    assert [r["epoch"] for r in resumed.records if "test_accuracy" in r] == [state["epoch"] + 1]
    assert torch.load(store / "checkpoint.pt", weights_only=False)["epoch"] == state["epoch"] + 1
    # Each host wrote into a folder of its own, synced with the store (as SageMaker syncs S3).
    assert resumed.hosts[0].checkpoint_store == store.resolve()
    assert resumed.hosts[0].checkpoint_dir == resumed.hosts[0].sandbox.checkpoint_dir != store.resolve()


# ----------------------------------------------------------------------------- a read-only checkout


def _read_only_checkout(command: str) -> subprocess.CompletedProcess:
    """`command` (sh) in a mount namespace where the checkout is read-only: even as root, where
    permission bits stop nothing, a read-only bind mount refuses every write."""
    script = f"mount --bind {REPO_ROOT} {REPO_ROOT} && mount -o remount,ro,bind {REPO_ROOT} && {command}"
    return subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


@pytest.fixture(scope="module")
def read_only_mounts() -> None:
    if not shutil.which("unshare"):
        pytest.skip("no `unshare` here to make a read-only view of the checkout")
    probe = _read_only_checkout(f"! touch {REPO_ROOT}/runs/.probe 2>/dev/null")
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only view of the checkout here (unshare/mount: {probe.stderr.strip()[-300:]})")


def test_a_read_only_checkout_is_refused_before_anything_starts_with_the_fix(read_only_mounts, tmp_path):
    python = f"{sys.executable} -m workshop run parameter_server"  # its script loads without TensorFlow: quick
    refused = _read_only_checkout(python)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    assert "Read-only file system" in refused.stderr and f"{REPO_ROOT}/runs" in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("  Fix: run it with --workdir DIR")
    assert "Local cluster:" not in refused.stdout  # refused before the cluster started anything

    # With --workdir the same checkout gets past that check; a bad flag then stops it at the next.
    (tmp_path / "w").mkdir()
    passed = _read_only_checkout(f"{python} --workdir {tmp_path / 'w'} --hosts 1")
    assert passed.returncode == 2, passed.stdout + passed.stderr
    assert "needs at least 2 hosts" in passed.stderr and "Read-only" not in passed.stderr
    assert not (tmp_path / "w" / "runs").exists()


def test_a_workdir_that_cannot_be_made_is_refused_with_the_fix(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, output = cli(["run", "data_parallel", "--workdir", str(blocker / "work")], capsys)
    assert_refused_with_fix(code, output)
    assert f"{blocker} is a file, not a folder" in output and "--workdir DIR" in output


# ----------------------------------------------------------------------------- bad input: each refusal ends with its fix


@pytest.mark.parametrize(
    ("argv", "rule", "fix"),
    [
        (["data_parallel", "--hosts", "abc"], "'abc' is not a number of hosts", "write it like --hosts 2"),
        (["data_parallel", "--hp", "lr=-1"], "--lr must be positive, got -1", "set --lr to a positive number"),
        (["data_parallel", "--hp", "batch-size=0"], "--batch-size must be at least 1", "--hp batch-size=VALUE"),
        (["data_parallel", "--hp", "batch-size=5000"], "fewer than one --batch-size of 5000",
         "set --batch-size to 2000 or less"),
        (["model_parallel", "--hp", "heads=3"], "--heads 3 does not divide --d-model 64",
         "set --heads to a divisor of 64"),
        (["parameter_server", "--hosts", "1"], "needs at least 2 hosts", "run it on 2 or more hosts"),
    ],
    ids=["hosts-abc", "lr-negative", "batch-size-0", "batch-size-too-large", "heads-3", "ps-one-host"],
)
def test_bad_input_is_refused_with_a_fix(tmp_path, mnist_dir, capsys, argv, rule, fix):
    data = [] if argv[0] == "model_parallel" else ["--data-dir", str(mnist_dir)]
    code, output = cli(["run", *argv, *data, "--workdir", str(tmp_path)], capsys)
    assert_refused_with_fix(code, output)
    assert rule in output and fix in output.strip().splitlines()[-1], output
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.parametrize("lab", ["data_parallel", "model_parallel"])
def test_a_data_dir_that_is_a_file_is_refused_with_a_fix(tmp_path, capsys, lab):
    not_a_folder = tmp_path / "mnist.npz"
    not_a_folder.write_bytes(b"not a folder")
    code, output = cli(["run", lab, "--data-dir", str(not_a_folder), "--workdir", str(tmp_path)], capsys)
    assert_refused_with_fix(code, output)
    assert f"{not_a_folder} is a file, not a folder" in output and "pass --data-dir a folder" in output


# ----------------------------------------------------------------------------- foreign parameter-server scripts

SCRIPT_MODE = '''
"""Script mode: argparse with only its own hyperparameters (strict: anything else is an error)."""
import argparse
import json
import os

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--learning-rate", type=float, default=0.1)
args = parser.parse_args()
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type in ("ps", "worker"):
    tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                         protocol=resolver.rpc_layer or "grpc", start=True).join()
STEPS = args.steps
'''

COORDINATOR = '''
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    total = tf.Variable(0.0)


@tf.function
def step():
    total.assign_add(1.0)
    return total.read_value()


for _ in range(STEPS):
    coordinator.schedule(step)
coordinator.join()
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
print(f"METRICS rank=0 steps_done={float(total.numpy())} workers={len(cluster['worker'])} "
      f"ps={len(cluster['ps'])} task={resolver.task_type}", flush=True)
'''


@pytest.mark.slow
def test_a_foreign_script_runs_unchanged_under_the_parameter_server_launcher(tmp_path):
    """Script mode: a script that parses its flags strictly gets only its hyperparameters, on every task.
    (A script that reads only TF_CONFIG and ignores its flags, TensorFlow's own convention, is TensorFlow's
    parameter-server tutorial in tests/test_unmodified_scripts.py.)"""
    script, steps = SCRIPT_MODE, 4
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(script + COORDINATOR)
    cluster = LocalCluster(code, "train.py", hosts=3, distributed=ParameterServer(), workdir=tmp_path / "run", echo=False)
    result = cluster.run({"steps": steps}, {}, check=False, timeout_s=300)
    assert result.ok, result.failure
    assert [h.returncode for h in result.hosts] == [0, 0, 0]
    assert result.metric("steps_done") == steps
    assert (result.metric("workers"), result.metric("ps"), result.metric("task")) == (2, 3, "chief")
    started = [line for line in result.lines if "[ps_driver] started" in line]
    assert len(started) == 6 and all(line.endswith(f"train.py --steps {steps}") for line in started), started
