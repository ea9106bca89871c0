"""The local runtime under abuse: a rank killed from outside, a typo'd hyperparameter, Ctrl-C while
many hosts start, and a cluster bigger than this machine.

The failure report must name the rank that failed first and how, from its launcher's record (not
the lost-peer traceback its peers print first); Ctrl-C must stop everything at any point of a start;
and a cluster this machine cannot carry is refused before anything starts. No test here depends
on timing luck or on the signal dispositions pytest was started with: each waits for evidence
(files the ranks write, the run's log folder) with generous deadlines, and the process that gets
the Ctrl-C installs Python's own SIGINT handler itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings
from pathlib import Path

import psutil
import pytest
from sagemaker.train.distributed import Torchrun

from workshop import REPO_ROOT
from workshop.errors import WorkshopError
from workshop.runtime import machine
from workshop.runtime.local_cluster import (
    MARKER,
    OVERSUBSCRIBE_ENV,
    LocalCluster,
    OversubscriptionWarning,
    TrainingFailed,
)
from workshop.runtime.processes import PARENT_ENV, DeferredInterrupt

# A DDP-shaped probe: every rank joins a gloo group, says where it is, then all-reduces until
# stopped, so a rank that vanishes leaves its peers with a lost-connection error, as in a lab.
# ABUSE_STRICT_RANK's --lr must be a number: given `--lr x`, only that rank fails, as argparse does.
PROBE = textwrap.dedent(
    """
    import argparse, json, os, time
    from pathlib import Path

    rank = int(os.environ["RANK"])
    parser = argparse.ArgumentParser(prog="train.py")
    strict = os.environ.get("ABUSE_STRICT_RANK") == str(rank)
    parser.add_argument("--lr", type=float if strict else str, default="0.1")
    parser.parse_args()

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pid-rank{rank}.json").write_text(json.dumps({"pid": os.getpid(), "rank": rank}))
    t = torch.ones(1)
    for step in range(1_000_000):
        dist.all_reduce(t)
        if step % 100 == 0:
            print(f"step {step} on rank {rank}", flush=True)
        time.sleep(0.02)
    """
)

# The Ctrl-C test's host script: nothing to do but wait to be stopped.
SLEEPER = "import time\ntime.sleep(600)\n"

# Runs a LocalCluster in a child process that takes Ctrl-C as a terminal's foreground job does,
# whatever it inherited (pytest may run as a background job, with SIGINT ignored or blocked).
INTERRUPTED_CHILD = textwrap.dedent(
    """
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    from workshop.runtime.local_cluster import LocalCluster

    code, hosts, workdir, token = sys.argv[1:5]
    cluster = LocalCluster(code, "train.py", hosts=int(hosts), workdir=workdir, echo=False,
                           extra_env={"ABUSE_TOKEN": token}, allow_oversubscription=True)
    try:
        cluster.run({}, {})
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    """
)


def _code_dir(tmp_path: Path, script: str) -> Path:
    code = tmp_path / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text(script)
    return code


def _carrying(token: str) -> list[psutil.Process]:
    """Live processes of a run started with extra_env ABUSE_TOKEN=token (every host's process and
    all it started carry it, next to the run's marker)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("ABUSE_TOKEN") == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def _wait_gone(token: str, deadline_s: float = 60) -> list[psutil.Process]:
    deadline = time.monotonic() + deadline_s
    while (left := _carrying(token)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _torchrun_cluster(tmp_path: Path, token: str, **env: str) -> LocalCluster:
    return LocalCluster(
        _code_dir(tmp_path, PROBE), "train.py", hosts=2, procs_per_host=1,
        distributed=Torchrun(process_count_per_node=1), workdir=tmp_path / "run", echo=False,
        extra_env={"ABUSE_TOKEN": token, **env},
    )


def _rank_process(token: str, rank: int) -> psutil.Process | None:
    """The training process of `rank`: it carries the run's marker and torchrun's RANK."""
    for proc in _carrying(token):
        try:
            env, cmd = proc.environ(), proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if MARKER in env and env.get("RANK") == str(rank) and any(a.endswith("train.py") for a in cmd):
            return proc
    return None


# --------------------------------------------------------------------------- the right rank is blamed


@pytest.mark.slow
def test_a_rank_killed_from_outside_is_named_not_the_peer_that_lost_it(tmp_path):
    token = uuid.uuid4().hex
    cluster = _torchrun_cluster(tmp_path, token)
    killed: dict[str, int] = {}

    def kill_rank_1() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            started = list((tmp_path / "run").glob("algo-*/output/data/pid-rank*.json"))
            if len(started) == 2:  # both ranks are in the gloo group, all-reducing
                proc = _rank_process(token, 1)
                if proc is not None:
                    killed["pid"] = proc.pid
                    killed["file_pid"] = json.loads((tmp_path / "run/algo-2/output/data/pid-rank1.json").read_text())["pid"]
                    time.sleep(1)  # a few all-reduces more
                    proc.send_signal(signal.SIGKILL)
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    with pytest.raises(TrainingFailed) as info:
        cluster.run({}, {}, timeout_s=400)
    killer.join(timeout=10)
    message = str(info.value)
    assert killed and killed["pid"] == killed["file_pid"], f"rank 1 was never found to kill:\n{message}"
    lines = message.splitlines()
    assert lines[0] == "Rank 1 on algo-2 was killed by SIGKILL (signal 9).", message
    assert lines[2] == "Host algo-2 failed (exit status 1); the other hosts were stopped.", message
    # Rank 0's lost-connection error, if it printed one before it was stopped, is a consequence.
    lost = [line for line in info.value.result.lines if line.startswith("[algo-1/0]") and "closed by peer" in line]
    if lost:
        assert any(line.startswith("Then: rank 0 on algo-1 lost its peer (exit status 1)") for line in lines), message
    assert "ChildFailedError" not in message
    assert not _wait_gone(token), "processes of the run outlived it"


@pytest.mark.slow
def test_an_argparse_error_shows_the_ranks_own_message(tmp_path):
    token = uuid.uuid4().hex
    cluster = _torchrun_cluster(tmp_path, token, ABUSE_STRICT_RANK="1")
    with pytest.raises(TrainingFailed) as info:
        cluster.run({"lr": "x"}, {}, timeout_s=400)
    message = str(info.value)
    lines = message.splitlines()
    assert lines[0] == "Rank 1 on algo-2 exited with status 2: train.py: error: argument --lr: invalid float value: 'x'", message
    assert "Host algo-2 failed (exit status 2)" in message or "Host algo-2 failed (exit status 1)" in message, message
    assert any(line.startswith("[algo-2/1] usage: train.py") for line in lines), message  # its own lines follow
    assert "ChildFailedError" not in message and "Traceback" not in message, message
    assert not _wait_gone(token), "processes of the run outlived it"


# --------------------------------------------------------------------------- Ctrl-C while hosts start


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [32])
def test_ctrl_c_while_many_hosts_start_leaves_nothing_running(tmp_path, hosts):
    """SIGINT as soon as the first host has started (the reader of its output has opened its
    log), so it meets the start, or the first seconds of the run: either way the run ends with
    KeyboardInterrupt (exit 130) and nothing of it is left."""
    token = uuid.uuid4().hex
    code = _code_dir(tmp_path, SLEEPER)
    out = (tmp_path / "child.out").open("w")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_CHILD, str(code), str(hosts), str(tmp_path / "run"), token],
        stdout=out, stderr=subprocess.STDOUT, env=env,
    )
    try:
        deadline = time.monotonic() + 300  # 32 sandboxes to write first, on a busy machine
        while not (tmp_path / "run/logs/algo-1.log").exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert child.poll() is None, (tmp_path / "child.out").read_text()
        assert (tmp_path / "run/logs/algo-1.log").exists(), "the first host never started"
        child.send_signal(signal.SIGINT)
        started = len(list((tmp_path / "run/logs").glob("algo-*.log")))
        try:
            code_ = child.wait(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail(f"Ctrl-C was not answered within 180 s ({started} of {hosts} hosts had started)")
        text = (tmp_path / "child.out").read_text()
        assert code_ == 130 and "interrupted" in text, f"exit {code_}:\n{text[-3000:]}"
        left = _wait_gone(token, 30)
        assert not left, f"{len(left)} processes outlived the run: {[p.cmdline()[:4] for p in left[:5]]}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for proc in _carrying(token):
            proc.kill()
        out.close()


def test_a_ctrl_c_during_a_deferred_step_arrives_right_after_it():
    """What keeps a host's Popen from being cut in half: the interrupt waits for check() or the
    end of the block, and is then raised by the handler that was there before."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    steps = []
    try:
        with pytest.raises(KeyboardInterrupt), DeferredInterrupt() as interrupt:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler ran during the sleep, and only noted the interrupt
            steps.append("step done")
            interrupt.check()
            steps.append("next step")
        assert steps == ["step done"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt), DeferredInterrupt():  # not checked: raised on leaving
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            steps.append("last step done")
        assert steps[-1] == "last step done"
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignored (a background job): left alone
        with DeferredInterrupt():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


@pytest.mark.parametrize(("parent", "alive"), [("self", True), ("1", False)])
def test_a_host_whose_starter_is_already_gone_leaves_at_once(parent, alive):
    """A host's first process asks to die with its parent itself; a parent that died before it
    asked (the pid it passed is no longer the parent's) makes it leave before starting anything."""
    code = ("import signal; from workshop.runtime.hostns import die_with_parent_from_start; "
            "die_with_parent_from_start(signal.SIGTERM); print('started')")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), PARENT_ENV: str(os.getpid()) if parent == "self" else parent}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, "started" in done.stdout) == ((0, True) if alive else (128 + signal.SIGTERM, False)), done


# --------------------------------------------------------------------------- bigger than this machine


@pytest.fixture
def small_machine(monkeypatch):
    """This machine as 2 cores and 16 GiB available, whatever it really has."""
    monkeypatch.setattr(machine, "usable_cores", lambda: 2)
    monkeypatch.setattr(machine, "available_memory_mb", lambda: 16 * 1024)
    monkeypatch.delenv(OVERSUBSCRIBE_ENV, raising=False)


def _probe_cluster(tmp_path: Path, hosts: int, procs: int = 1, **kw) -> LocalCluster:
    return LocalCluster(_code_dir(tmp_path, SLEEPER), "train.py", hosts=hosts, procs_per_host=procs,
                        workdir=tmp_path / "run", echo=False, **kw)


def test_a_cluster_this_machine_carries_says_nothing(tmp_path, small_machine):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _probe_cluster(tmp_path, hosts=4, procs=2)  # 8 processes on 2 cores: the tests' biggest


def test_more_processes_than_cores_can_carry_is_warned_about(tmp_path, small_machine):
    with pytest.warns(OversubscriptionWarning, match=r"12 host\(s\) x 1 process\(es\) = 12 training processes: 6\.0 per core on 2 core"):
        _probe_cluster(tmp_path, hosts=12)


def test_far_more_processes_than_cores_is_refused_with_the_fix(tmp_path, small_machine, monkeypatch):
    with pytest.raises(WorkshopError) as info:
        _probe_cluster(tmp_path, hosts=64)
    error = info.value
    assert "64 host(s) x 1 process(es) = 64 training processes" in error.message
    assert "32.0 per core on 2 core(s), more than 16 per core" in error.message
    assert "at most 19 of 1 process(es)" in error.fix  # 19 x 850 MB fit in 16 GiB, below 32 for the cores
    assert "allow_oversubscription=True" in error.fix and f"{OVERSUBSCRIBE_ENV}=1" in error.fix
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
    # Allowed explicitly, by the parameter or (for the command line) the variable: a warning only.
    with pytest.warns(OversubscriptionWarning):
        _probe_cluster(tmp_path / "a", hosts=64, allow_oversubscription=True)
    monkeypatch.setenv(OVERSUBSCRIBE_ENV, "1")
    with pytest.warns(OversubscriptionWarning):
        _probe_cluster(tmp_path / "b", hosts=64)


def test_more_memory_than_available_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "usable_cores", lambda: 64)
    monkeypatch.setattr(machine, "available_memory_mb", lambda: 4 * 1024)
    monkeypatch.delenv(OVERSUBSCRIBE_ENV, raising=False)
    with pytest.raises(WorkshopError, match=r"about 5\.3 GiB of memory .* with 4\.0 GiB available") as info:
        _probe_cluster(tmp_path, hosts=4, procs=2)
    assert "at most 3 of 2 process(es)" in info.value.fix


def test_the_command_line_refuses_before_preparing_anything(tmp_path, small_machine, capsys):
    from workshop.__main__ import main

    code = main(["run", "data_parallel", "--hosts", "64", "--data-dir", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: This machine cannot carry 64 host(s) x 1 process(es)"), err
    assert f"{OVERSUBSCRIBE_ENV}=1" in err
    assert not (tmp_path / "data").exists()
