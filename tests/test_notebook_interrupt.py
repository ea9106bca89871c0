"""Interrupting a notebook's training cell: one line says what stopped, and nothing is left running.

The issue: Jupyter's interrupt (SIGINT to the kernel) during `run_local` printed a ~45-line
`KeyboardInterrupt` traceback through the workshop's internals, no line saying the job had stopped,
and left the progress display as it was. The test does what JupyterLab does: it runs the cell in a real
kernel of this interpreter, waits until the ranks train, sends the kernel its interrupt, and reads
what the cell shows.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import psutil
import pytest


def _carrying(token: str, besides: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if (proc.pid != besides and proc.environ().get("INTERRUPT_TEST_TOKEN") == token
                    and proc.status() != psutil.STATUS_ZOMBIE):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_interrupting_a_training_cell_prints_one_line_and_leaves_no_process(tmp_path, mnist_dir, kernel):
    token = uuid.uuid4().hex
    km, kc = kernel(INTERRUPT_TEST_TOKEN=token)
    kernel_pid = km.provisioner.pid
    try:
        runs = tmp_path / "runs"
        msg_id = kc.execute(
            "from workshop.labs import get_lab\nfrom workshop.runner import run_local\n"
            f"run_local(get_lab('data_parallel'), hosts=2, hyperparameters={{'epochs': 20}}, "
            f"data_dir={str(mnist_dir)!r}, runs_dir={str(runs)!r})\n")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # the evidence: rank 1 trains
            if any("METRICS" in p.read_text(errors="replace") for p in runs.glob("*/logs/algo-2.log")):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the job did not start training in 300 s")
        started = len(_carrying(token, kernel_pid))
        km.interrupt_kernel()  # what JupyterLab's stop button does
        errors, streams = [], []
        while True:
            msg = kc.get_iopub_msg(timeout=180)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "error":
                errors.append(content)
            elif kind == "stream":
                streams.append(content["text"])
            elif kind == "status" and content["execution_state"] == "idle":
                break
        [error] = errors
        assert len(error["traceback"]) == 1, "\n".join(error["traceback"])  # the line, not the frames
        [line] = error["traceback"]
        match = re.fullmatch(r"stopped: (\d+) processes ended; logs in (.+)", line)
        assert match and int(match.group(1)) >= 4, line  # per host: its driver, torchrun's agent, its rank
        assert Path(match.group(2)).is_dir() and Path(match.group(2)).parent.parent == runs, line
        assert "Traceback" not in "".join(streams), "".join(streams)
        deadline = time.monotonic() + 60
        while (left := _carrying(token, kernel_pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"{len(left)} of {started} processes outlived the interrupt: {[p.cmdline()[:4] for p in left]}"
    finally:
        for proc in _carrying(token, kernel_pid):
            proc.kill()
