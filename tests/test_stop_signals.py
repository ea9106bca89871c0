"""Every process a command starts dies with it: `run` and `tune` stopped by SIGTERM or SIGKILL.

`kill`, `timeout` and a cancelled CI job send SIGTERM; an out-of-memory killer or `kill -9` sends
SIGKILL, which no process can answer. The issue: `tune` killed either way left every running trial
training (each trial is a process in a session of its own), for about a minute, into a folder
nobody would read. Now SIGTERM stops a command as Ctrl-C does (its trials, its hosts; nothing new
starts), and a trial whose search is gone stops its own cluster (it asked the kernel for SIGTERM
when its parent dies).

Each test runs the command in a child that sets its signal dispositions itself (pytest may run
in the background, with signals ignored or blocked), finds every process of the run by a
variable only they carry, and waits for the evidence (the ranks' METRICS lines) before it signals.
"""

from __future__ import annotations

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

from workshop import REPO_ROOT

# The command line as a shell runs it: SIGINT and SIGTERM at their defaults, whatever pytest had.
CLI = ("import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_DFL); "
       "signal.signal(signal.SIGINT, signal.default_int_handler); "
       "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM]); "
       "from workshop.__main__ import main; sys.exit(main(sys.argv[1:]))")


def _carrying(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("SIGNAL_TEST_TOKEN") == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def _training(tmp_path: Path, command: str) -> bool:
    """Whether every job of the command has ranks training (METRICS lines in each host's log: the last
    host of `run`'s 2, the one host of each of `tune`'s 2 trials)."""
    pattern, jobs = ("runs/tune-*/trial-*/run/logs/algo-1.log", 2) if command == "tune" else ("runs/*/logs/algo-2.log", 1)
    logs = [p for p in tmp_path.glob(pattern) if "METRICS" in p.read_text(errors="replace")]
    return len(logs) >= jobs


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("command", ["tune", "run"])
def test_a_command_stopped_by_a_signal_leaves_no_process(tmp_path, mnist_dir, command, sig):
    token = uuid.uuid4().hex
    # `run` on 2 hosts; `tune` runs 2 trials at once, each a job of 1 host (a trial stops its cluster as `run`
    # stops one of many hosts: what tune adds is its trials, each a process tree of its own).
    argv = (["tune", "data_parallel", "--param", "lr=0.01,0.02,0.04", "--parallel", "2", "--hosts", "1"]
            if command == "tune" else ["run", "data_parallel", "--hosts", "2"])
    out_path = tmp_path / "out.txt"
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", CLI, *argv, "--hp", "epochs=20", "--workdir", str(tmp_path), "--data-dir", str(mnist_dir)],
            cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "SIGNAL_TEST_TOKEN": token})
    try:
        deadline = time.monotonic() + 300
        while not _training(tmp_path, command) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None and _training(tmp_path, command), out_path.read_text()[-3000:]
        started = len(_carrying(token))
        proc.send_signal(sig)
        code = proc.wait(timeout=180)
        output = out_path.read_text()
        if sig == signal.SIGTERM:  # stopped as Ctrl-C stops it, and said so
            assert code == 128 + signal.SIGTERM, f"exit {code}:\n{output[-3000:]}"
            assert "Stopped by SIGTERM; every process the workshop started has been stopped." in output, output[-3000:]
            if command == "tune":
                assert "SIGTERM: stopping 2 running trial(s)" in output, output[-3000:]
                assert re.search(r"^3\s+0\.04\s+-\s+-\s+stopped$", output, re.MULTILINE), output  # never started
                assert not list(tmp_path.glob("runs/tune-*/trial-003")), "a trial started after SIGTERM"
        else:
            assert code == -signal.SIGKILL
        deadline = time.monotonic() + 90
        while (left := _carrying(token)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, (f"{len(left)} of the {started} processes of the {command} outlived it by 90 s: "
                          f"{[p.cmdline()[:4] for p in left[:6]]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in _carrying(token):
            p.kill()


def test_sigterm_becomes_an_interrupt_held_back_like_ctrl_c_then_the_old_handler_is_back():
    """`sigterm_as_interrupt` turns SIGTERM into `Terminated` (a KeyboardInterrupt), which
    `DeferredInterrupt` holds back during a step as it holds Ctrl-C; leaving it puts back the
    handler that was there (here one set explicitly, not whatever pytest was started with)."""
    from workshop.runtime.processes import DeferredInterrupt, Terminated, sigterm_as_interrupt

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    steps = []
    try:
        with sigterm_as_interrupt():
            with pytest.raises(Terminated), DeferredInterrupt():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)  # the handler ran during the sleep, and only noted it
                steps.append("step done")
            assert steps == ["step done"]
            with pytest.raises(KeyboardInterrupt):  # what every `except KeyboardInterrupt` already stops on
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
