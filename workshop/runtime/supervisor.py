"""Supervising one run's hosts: start them, read their lines, stop everything, report.

`Supervisor.run` starts each host's first process (as `workshop.runtime.hosts` laid it out),
reads every host's output into whole lines per rank, each tagged `[host/rank]`
(`workshop.runtime.streams`), which stream live (or feed the progress display) and are kept in
`<run>/logs/`, watches for a stall (`workshop.runtime.stalls`), and ends when every host has
succeeded, one has failed, the time limit is reached or a disk fills up. Then nothing outlives
it: every host's process group gets SIGTERM, then SIGKILL after the grace period, and sweeps kill
anything that still carries the run's marker (torchrun starts its workers in sessions of their
own, so process groups alone would not reach them). A failure is then reported as
`workshop.runtime.failures` describes it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from workshop.runtime.checkpoint_sync import CheckpointSync
from workshop.runtime.failures import describe_failure, disk_full_failure
from workshop.runtime.folders import disk_full_message, is_disk_full
from workshop.runtime.hosts import HostLayout, user_paths
from workshop.runtime.machine import MemoryKills, oom_kills
from workshop.runtime.processes import PARENT_ENV, DeferredInterrupt, processes_with_marker
from workshop.runtime.progress import JobProgress
from workshop.runtime.results import HostResult
from workshop.runtime.stalls import StallWatch
from workshop.runtime.streams import DRIVER_START, Transcript, is_note, split_ranks

# After the first host fails, the others get this long to end on their own (and their launchers to
# record why) before they are stopped: a launcher stopped mid-way records nothing, and the rank
# that failed first may be on a host whose launcher noticed a moment later than a peer's.
SETTLE_S = 1.0


def _descendants(roots: set[int]) -> list[psutil.Process]:
    """Every live descendant of the processes `roots`, from one look at the process table."""
    children: dict[int, list[psutil.Process]] = {}
    for proc in psutil.process_iter(["ppid"]):
        children.setdefault(proc.info.get("ppid"), []).append(proc)
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


class Supervisor:
    """One execution of a laid-out run: start the hosts, stream their lines, stop everything, report.

    `echo`: print every line as it comes (all but sm_train.sh's set-up) where no `display` (the
    progress display) stands in for them; `stall_s`: see `workshop.runtime.stalls`; `stop_grace_s`:
    how long the hosts get between SIGTERM and SIGKILL; `sync`: the hosts' checkpoint folders,
    synced with the run's checkpoint_dir (if it has one), whose full disk stops the run.
    """

    def __init__(self, layout: HostLayout, workdir: Path, *, procs_per_host: int, container: bool,
                 timeout_s: float | None, echo: bool, stall_s: float | None, stop_grace_s: float,
                 display: JobProgress | None = None, sync: CheckpointSync | None = None):
        self.sync = sync
        self.display = display
        self.hosts: list[HostResult] = layout.hosts
        self.envs = layout.envs
        self.commands = layout.commands
        self.cluster_id = layout.marker
        # What each host's first process is, for a failure report that names it (the process runtime's is the driver)
        self.first_process = "" if container else f"the driver ({layout.driver.name})"
        self.workdir = workdir
        self.procs_per_host = procs_per_host
        self.timeout_s = timeout_s
        self.echo = echo
        self.stop_grace_s = stop_grace_s
        self.lines: queue.Queue = queue.Queue()
        self.output_ended: set[str] = set()  # hosts whose output has ended: they are exiting
        self.procs: list[subprocess.Popen] = []
        self.readers: list[threading.Thread] = []
        self.transcript = Transcript()  # every line, each stream's last ones (for the failure report), when
        self.watch = StallWatch(stall_s, self.transcript, self.hosts, self.procs, self._say_stall)
        self.wall_time_s = 0.0
        self.container = container  # sm_train.sh's set-up comes first in each host's output
        self.driver_started: dict[str, float] = {}  # host -> seconds after the start when its driver ran
        self._setup_noted: set[str] = set()  # hosts whose first set-up line was echoed
        self.t0 = 0.0  # set when run() starts the hosts
        # The exit status of each host that had ended when the stop began (by name): the job's own doing.
        self.ended_before_stop: dict[str, int] = {}
        self.disk_full: str | None = None  # the line that says a log could not be written for a full disk
        self.log_errors: set[Path] = set()  # logs given up for another error (said once each)
        self.started_at = time.time()  # what the run wrote is newer than this
        self.stopped_processes = 0  # how many of the job's processes the stop ended (`_stop_all`)
        self.oom_kills_before: int | None = None  # the kernel's out-of-memory kills when the hosts started
        self.memory: MemoryKills | None = None  # what the kernel's out-of-memory killer did, read when a host failed

    @property
    def all_lines(self) -> list[str]:
        return self.transcript.lines

    def _start(self) -> None:
        """Start every host; a Ctrl-C meanwhile stops the start between two hosts.

        Each host's first process (`hostns host`, `run_driver`) asks to die with us itself
        (`hostns.die_with_parent_from_start`), so Popen needs no `preexec_fn`: Python code run
        between fork and exec forces a full fork of this (threaded) process and can deadlock on a
        lock a reader thread held, leaving this thread waiting for an exec that never comes.
        Without it, Popen returns once the child has exec'd. A Ctrl-C during a Popen is held back
        until the process is recorded (DeferredInterrupt), so every started host is stopped.
        """
        with DeferredInterrupt() as interrupt:
            for host, env, cmd in zip(self.hosts, self.envs, self.commands, strict=True):
                # sm_train.sh: cd /opt/ml/input/data/code (the container runtime's host runs its command
                # in /opt/ml, and a host laid out without a code channel, by `prepare_host`, has none)
                code = host.sandbox.code_dir
                proc = subprocess.Popen(
                    cmd,
                    cwd=code if code.is_dir() else host.sandbox.root,
                    env={**env, PARENT_ENV: str(os.getpid())},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, so it can be stopped as one
                )
                self.procs.append(proc)
                reader = threading.Thread(target=self._read, args=(host, proc), daemon=True)
                reader.start()
                self.readers.append(reader)
                interrupt.check()

    def _read(self, host: HostResult, proc: subprocess.Popen) -> None:
        """Split a host's output into whole lines per rank, each tagged `[host/rank]`."""
        partial: dict[str, str] = {}  # rank -> text of a line not yet ended
        # Line-buffered: `tail -f runs/<job>/logs/algo-1.log` (or a test waiting for a line) sees
        # each line as it comes, not a buffer's worth later.
        # A log that cannot be written (a full disk) is given up, not the host's output: the lines go on
        # to the display, the failure report and the host's pipe is kept drained (a host blocked on a
        # full pipe would hang).
        log = self._open_log(host.log_path)
        try:
            for raw in iter(proc.stdout.readline, b""):
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                log = self._write_log(log, host.log_path, text)
                segments = split_ranks(text, host.host_rank, self.procs_per_host)
                for rank, piece in segments[:-1]:
                    partial[rank] = partial.get(rank, "") + piece
                rank, piece = segments[-1]
                line = partial.pop(rank, "") + piece
                tag = f"[{host.name}/{rank}]" if rank else f"[{host.name}]"
                self.lines.put((host.name, rank, f"{tag} {line}"))
        finally:
            if log is not None:
                with contextlib.suppress(OSError):
                    log.close()
        for rank, piece in partial.items():  # output that never got its newline
            self.lines.put((host.name, rank, f"[{host.name}/{rank}] {piece}" if rank else f"[{host.name}] {piece}"))
        proc.stdout.close()
        # The host's output ended: it is exiting. Wakes the run's loop now, not at its next poll.
        self.lines.put((host.name, None, None))

    def _open_log(self, path: Path) -> Any:
        try:
            return open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed by the caller
        except OSError as exc:
            self._log_failed(path, exc)
            return None

    def _write_log(self, log: Any, path: Path, text: str) -> Any:
        """Write one line to `log`; the log (None once it failed) to write the next one to."""
        if log is None:
            return None
        try:
            log.write(text + "\n")
            return log
        except OSError as exc:
            self._log_failed(path, exc)
            with contextlib.suppress(OSError):
                log.close()
            return None

    def _log_failed(self, path: Path, exc: OSError) -> None:
        """A log could not be written: a full disk stops the job (its ranks' own writes are next); any
        other error is said once, and the run goes on without that log."""
        if is_disk_full(exc):
            if self.disk_full is None:
                self.disk_full = disk_full_message(self.workdir, f"writing the log {path.name}") + " The job was stopped."
        elif path not in self.log_errors:
            self.log_errors.add(path)
            print(f"warning: cannot write the log {path} ({exc.strerror or exc}); the run goes on without it.",
                  file=sys.stderr, flush=True)

    def _drain(self, timeout: float = 0.0) -> None:
        """Take the lines that came, waiting up to `timeout` for more; returns early once a host's
        output has ended (the host is exiting, and the run's loop looks at it at once)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining > 0:
                    host, rank, line = self.lines.get(timeout=remaining)
                else:
                    host, rank, line = self.lines.get_nowait()
            except queue.Empty:
                return
            if line is None:  # a host's output ended (see _read)
                self.output_ended.add(host)
                deadline = 0.0
                continue
            self.transcript.add(host, rank, line)
            self._combined = self._write_log(self._combined, self.workdir / "logs" / "cluster.log", line)
            if not rank and host not in self.driver_started and DRIVER_START.match(line.split("] ", 1)[-1]):
                self.driver_started[host] = time.monotonic() - self.t0
            if self.display is not None:
                self.display.feed(rank, line)
                if is_note(line):  # what its script marked for its user: beside the display, not only in the log
                    self.display.notice([user_paths(line, self.hosts)])
            elif self.echo and self._show(host, rank, line):
                print(user_paths(line, self.hosts) if is_note(line) else line, flush=True)

    def _show(self, host: str, rank: str, line: str) -> bool:
        """Echo everything but `sm_train.sh`'s set-up (its shell trace, the configs it prints and
        the SDK's dump of every environment variable: a hundred lines per host, kept in the logs),
        which ends where the driver starts; the driver-start line itself is shown."""
        if not self.container or rank or host in self.driver_started:  # _drain noted the driver's start
            return True
        if host not in self._setup_noted and line.split("] ", 1)[-1].startswith(("Starting training script", "[hostns]")):
            self._setup_noted.add(host)
            return True
        return False

    def _say_stall(self, lines: list[str], quiet_s: float | None) -> None:
        """A note of the stall watch: in `logs/cluster.log` always, and in the display or the lines."""
        for line in lines:
            self._combined = self._write_log(self._combined, self.workdir / "logs" / "cluster.log", line)
        if self.display is not None:
            if quiet_s is None:
                self.display.recovered(lines)
            else:
                self.display.stalled(quiet_s, lines)
        elif self.echo:
            print("\n".join(lines), flush=True)

    def run(self) -> tuple[int, str | None, list[str]]:
        """Start the hosts, supervise them until they end (or one fails, or the time runs out), stop
        everything; the run's exit status, its failure report (None if none) and every line."""
        t0 = self.t0 = time.monotonic()
        returncode, failure, failed_host = 0, None, None
        with open(self.workdir / "logs" / "cluster.log", "w", encoding="utf-8", buffering=1) as combined:
            self._combined = combined
            try:
                self.oom_kills_before = oom_kills()
                self._start()
                self.transcript.last_line_any = time.monotonic()  # the silence is counted from the start
                waited: set[str] = set()
                while True:
                    self._drain(0.1)
                    for host, proc in zip(self.hosts, self.procs, strict=False):
                        # Its output ended as it exited: see its status now, not a poll (0.1 s) later.
                        if host.name in self.output_ended and host.name not in waited:
                            waited.add(host.name)
                            with contextlib.suppress(subprocess.TimeoutExpired):
                                proc.wait(timeout=0.1)
                    codes = [p.poll() for p in self.procs]
                    if self.display is not None:
                        self.display.set_hosts_up(sum(code is None for code in codes))
                        self.display.tick()  # its clock moves while no rank writes (a start, a long step)
                    failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
                    if failed:
                        # Before anything is stopped: a rank that stopped answering is still there to see.
                        self.watch.note_failure()
                        failed_host, returncode = failed[0], codes[failed[0]]
                        settle = time.monotonic() + SETTLE_S  # the others' launchers record their ends
                        while time.monotonic() < settle and any(p.poll() is None for p in self.procs):
                            self._drain(0.05)
                        self.memory = MemoryKills.since(self.oom_kills_before)  # before the stop's own SIGKILLs
                        break
                    if all(code == 0 for code in codes):
                        break
                    if self.timeout_s and time.monotonic() - t0 > self.timeout_s:
                        returncode = 124
                        failure = f"The job ran past its time limit of {self.timeout_s:g} s and was stopped."
                        said = self.watch.at_time_limit()
                        if said:
                            failure += "\n" + "\n".join(said)
                        break
                    if self.disk_full is not None:  # a log could not be written: the ranks' writes fail next
                        returncode = 1
                        break
                    if self.sync is not None and self.sync.failure is not None:  # the checkpoint folder is full
                        self.disk_full = f"{self.sync.failure} The job was stopped."
                        returncode = 1
                        break
                    self.watch.watch()
            finally:
                # Also on KeyboardInterrupt (Ctrl-C, a notebook's interrupt): nothing outlives the run.
                # A second Ctrl-C while stopping waits until everything is stopped (seconds).
                with DeferredInterrupt():
                    self._stop_all()
                    deadline = time.monotonic() + 5
                    for reader in self.readers:
                        reader.join(timeout=max(0.0, deadline - time.monotonic()))
                    self._drain()
                    for host, proc in zip(self.hosts, self.procs, strict=False):
                        host.returncode = proc.returncode
                        host.driver_started_s = self.driver_started.get(host.name)
                    self.wall_time_s = time.monotonic() - t0
        if failed_host is not None:
            failure = describe_failure(self.transcript, self.hosts, self.procs_per_host, failed_host, returncode,
                                       self.ended_before_stop, self.watch, self.memory, self.first_process)
            # Its fix names the user's folders, not the simulated hosts' (/opt/ml/checkpoints)
            failure = user_paths(failure, self.hosts, self.hosts[failed_host])
        if returncode not in (0, 124):
            failure = disk_full_failure(failure, self.all_lines, self.disk_full, self.hosts, self.workdir,
                                        self.started_at)
        return returncode, failure, self.all_lines

    def _stop_all(self) -> None:
        """SIGTERM every host's process group, SIGKILL what is left after the grace period,
        then sweep for anything still carrying this cluster's marker until nothing does.

        Bounded whatever the hosts do: one pass over the process table for their descendants (not
        one per host: 64 hosts mid-start), one grace period for all, sweeps until none is found
        (a process may fork between a sweep's look and its kill), one last wait for all."""
        self._drain()
        self.transcript.stop_line = len(self.all_lines)
        self.ended_before_stop = {self.hosts[i].name: p.returncode for i, p in enumerate(self.procs)
                                  if p.poll() is not None}
        live = [p for p in self.procs if p.poll() is None]
        descendants = _descendants({p.pid for p in live}) if live else []
        for proc in live:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + self.stop_grace_s
        while any(p.poll() is None for p in live) and time.monotonic() < deadline:
            self._drain(0.05)
        for proc in live:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        found = descendants + processes_with_marker(self.cluster_id)
        self.stopped_processes = len({p.pid for p in live} | {p.pid for p in found})
        for _ in range(20):
            if not found:  # nothing left (a job that ended on its own, typically): no second look needed
                break
            for child in found:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            found = processes_with_marker(self.cluster_id)
            if not found:
                break
            time.sleep(0.1)
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
