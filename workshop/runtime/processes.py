"""How every process of one local run is found: each carries the run's marker in its environment.

The local cluster sets the marker on every host it starts; the drivers' signal handlers and the
tests use it to find (and sweep) whatever a run left, whichever process group it ended up in.

Also here: `DeferredInterrupt`, which keeps Ctrl-C from cutting a process start (or a run's
shutdown) in half; `sigterm_as_interrupt`, with which a command takes SIGTERM (`kill`, `timeout`, a
cancelled CI job) as it takes Ctrl-C, stopping what it started; and `PARENT_ENV`, with which a
started process checks that the process that started it is still there (see
`workshop.runtime.hostns.die_with_parent_from_start`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil

MARKER = "WORKSHOP_CLUSTER_ID"
# The pid of the process that started this one; the child compares it with its parent's once it
# has asked to die with its parent (a parent that died before that is otherwise missed).
PARENT_ENV = "WORKSHOP_PARENT_PID"


def processes_with_marker(cluster_id: str) -> list[psutil.Process]:
    """Every live process whose environment carries this cluster's marker."""
    try:
        import psutil  # here: a host's entry process needs it only to sweep for a local cluster that died
    except ImportError:
        if not sys.flags.no_site:
            raise
        import site  # a host's entry process, started without it (see hostns.entry_command)

        site.main()
        import psutil

    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARKER) == cluster_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C (see `sigterm_as_interrupt`): the same `except KeyboardInterrupt` stops
    what the process started; catching this first tells the two apart (exit status 143, not 130)."""


class Stopped(KeyboardInterrupt):
    """A local job stopped by Ctrl-C (a notebook's interrupt), every process of it ended: its message is
    the one line that says so ("stopped: N processes ended; logs in ..."). IPython shows an exception's
    `_render_traceback_()` in place of its traceback, so a notebook shows that line, not the ~45 lines
    of the workshop's own frames the interrupt went through; an `except KeyboardInterrupt` still stops on it."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def _terminated(signum: int, frame: Any) -> None:  # noqa: ARG001
    raise Terminated(f"stopped by {signal.Signals(signum).name}")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM raises `Terminated` (a KeyboardInterrupt) in the main thread; the
    handler that was there before is put back on leaving.

    Python's default for SIGTERM is to die on the spot, running no `finally`: a command killed
    with `kill`, `timeout` or a cancelled CI job would leave everything it started to fend for
    itself. With this, it stops them as Ctrl-C does (a local cluster its hosts, a search its
    trials) and starts nothing new; `DeferredInterrupt` holds it back during a start as it holds
    Ctrl-C. Only the main thread can install signal handlers: elsewhere this changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


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
    SIGTERM is held back the same way where `sigterm_as_interrupt` made it an interrupt too.
    Only the main thread can install signal handlers; elsewhere, and where SIGINT is ignored
    (a background job) or left to the OS, this changes nothing.
    """

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._pending: tuple[int, Any] | None = None

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous = signal.getsignal(signum)
                if callable(previous) and (signum == signal.SIGINT or previous is _terminated):
                    self._previous[signum] = previous
                    signal.signal(signum, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        if self._pending is None:  # the first one is delivered; another meanwhile asks the same
            self._pending = (signum, frame)

    def check(self) -> None:
        """Deliver an interrupt that came inside the block (raises, with Python's handler)."""
        if self._pending is not None:
            (signum, frame), self._pending = self._pending, None
            self._previous[signum](signum, frame)

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._previous:
            return
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        pending, self._pending = self._pending, None
        if pending is not None and exc_type is None:  # with an exception under way, that one goes on
            previous[pending[0]](*pending)


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
