"""How every process of one local run is found: each carries the run's marker in its environment.

The local cluster sets the marker on every host it starts; the drivers' signal handlers and the
tests use it to find (and sweep) whatever a run left, whichever process group it ended up in.

Also here: `DeferredInterrupt`, which keeps Ctrl-C from cutting a process start (or a run's
shutdown) in half, and `PARENT_ENV`, with which a started process checks that the process that
started it is still there (see `workshop.runtime.hostns.die_with_parent_from_start`).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import psutil

MARKER = "WORKSHOP_CLUSTER_ID"
# The pid of the process that started this one; the child compares it with its parent's once it
# has asked to die with its parent (a parent that died before that is otherwise missed).
PARENT_ENV = "WORKSHOP_PARENT_PID"


def processes_with_marker(cluster_id: str) -> list[psutil.Process]:
    """Every live process whose environment carries this cluster's marker."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARKER) == cluster_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


class DeferredInterrupt:
    """Holds Ctrl-C (SIGINT) back during steps that must not be cut in half, then delivers it.

        with DeferredInterrupt() as interrupt:
            for cmd in commands:
                procs.append(subprocess.Popen(cmd))  # never interrupted between fork and append
                interrupt.check()                    # a Ctrl-C that came meanwhile is raised here

    A KeyboardInterrupt raised inside `subprocess.Popen` once the child exists loses the Popen
    object, and the child runs on, known to nobody; one raised while a run is being stopped
    leaves the rest of it running. So inside the block SIGINT only notes that it came, and
    `check()`, or leaving the block without an exception, hands it to the handler that was there
    before (Python's default raises KeyboardInterrupt): an interrupt waits at most one step.
    Only the main thread can install signal handlers; elsewhere, and where SIGINT is ignored
    (a background job) or left to the OS, this changes nothing.
    """

    def __init__(self) -> None:
        self._previous: Any = None
        self._pending: tuple[int, Any] | None = None

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self._previous = previous
                signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self._pending = (signum, frame)

    def check(self) -> None:
        """Deliver an interrupt that came inside the block (raises, with Python's handler)."""
        if self._pending is not None and self._previous is not None:
            (signum, frame), self._pending = self._pending, None
            self._previous(signum, frame)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._previous is None:
            return
        previous, self._previous = self._previous, None
        signal.signal(signal.SIGINT, previous)
        pending, self._pending = self._pending, None
        if pending is not None and exc_type is None:  # with an exception under way, that one goes on
            previous(*pending)


# --------------------------------------------------------------------------- a host's SIGTERM

GRACE_S = 10.0
_PARENT = os.getppid()  # who started this process (the local cluster); if it is gone, nobody else sweeps


def sweep_run(grace_s: float = GRACE_S) -> None:
    """After the launcher's own shutdown has had `grace_s`, SIGKILL every process of this run."""
    import time

    cluster_id = os.environ.get(MARKER)
    if not cluster_id:
        return
    deadline = time.monotonic() + grace_s
    while (left := processes_with_marker(cluster_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in left:
        try:
            proc.kill()
        except Exception:  # noqa: BLE001 - gone already, or not ours to kill
            pass


def forward_sigterm(signum, frame):  # noqa: ARG001
    """SIGTERM handler of a host's entry process (run_driver, hostns host): pass SIGTERM to the
    process group, and if the local cluster died (PR_SET_PDEATHSIG), sweep the run for it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group signal below reaches us too
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)
        if os.getppid() != _PARENT:  # the local cluster died (PR_SET_PDEATHSIG): sweep for it
            sweep_run()
    finally:
        os._exit(128 + signum)
