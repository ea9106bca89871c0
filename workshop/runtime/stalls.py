"""The stall watch: a job whose ranks all went quiet, said as it happens, with who stopped answering.

A job whose ranks (and launchers) all write no line for `stall_s` seconds is said to stall, again
every `stall_s` while it lasts, with each rank's last line and how long ago it was, and which rank
stopped answering where the processes show it (one stopped by SIGSTOP or a debugger, one busy on a
CPU while its peers wait idle); said again when a line comes. When the job then fails (a collective
timed out) or runs out of time, what the watch saw names the rank the others waited for
(`StallWatch.waited_for`, which `workshop.runtime.failures` puts before the failed rank's own line).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from workshop.runtime.results import HostResult
from workshop.runtime.streams import Transcript, bare, who

# What launchers tell a training process its rank by (torchrun, Horovod, mpirun and MPICH).
_RANK_VARS = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
STALL_SHOWN = 12  # at most this many ranks' last lines in a stall's note
# During a stall, a rank that used at least BUSY_SHARE of a CPU (on a shared machine a spinning
# process may get only a fraction of one), and IDLE_RATIO times that or more than every other rank
# (waiting in a collective costs next to nothing), is the one the others wait for.
BUSY_SHARE = 0.1
IDLE_RATIO = 10


@dataclass
class Silence:
    """Who was answering when a job went quiet (or failed), from its processes themselves."""

    quiet_s: float  # since the job's last line
    ages: dict[tuple[str, str], float] = field(default_factory=dict)  # (host, rank) -> seconds since its last line
    stopped: dict[tuple[str, str], str] = field(default_factory=dict)  # (host, rank) -> its stopped process
    busy: dict[tuple[str, str], float] = field(default_factory=dict)  # (host, rank) -> its share of a CPU

    def named(self) -> list[tuple[str, str]]:
        """The ranks that stopped answering: those stopped, else the one busy while the others waited."""
        return list(self.stopped) or list(self.busy)


@dataclass
class Stall:
    """One stall of a job: from its last line until a line came again."""

    since: float  # when the job's last line before it came
    said: float  # when it was last said
    silence: Silence | None = None  # what its last note found
    ended: float | None = None  # when a line came again


def _program(cmdline: list[str]) -> str:
    """What a process runs, in a word: its script (train.py), else its program (torchrun)."""
    script = next((Path(arg).name for arg in cmdline[1:] if arg.endswith(".py")), "")
    return script or (Path(cmdline[0]).name if cmdline else "?")


def _rank_of(env: dict[str, str], host: HostResult) -> str:
    """A training process's global rank, from what its launcher set; "" for any other process."""
    for var in _RANK_VARS:
        if env.get(var, "").isdigit():
            return env[var]
    try:  # lab 1: the chief and the workers, one per host, shown as the host's rank (see streams._RANK_TAG)
        task = json.loads(env.get("TF_CONFIG") or "{}").get("task", {})
    except ValueError:
        return ""
    return str(host.host_rank) if isinstance(task, dict) and task.get("type") in ("chief", "worker") else ""


def job_processes(hosts: list[HostResult], roots: Sequence[subprocess.Popen]) -> list[tuple[HostResult, str, psutil.Process]]:
    """(host, rank, process) for every live process of each host's tree (`roots`: each host's first
    process), from one look at the process table; rank "" for a process no launcher gave one
    (sm_train.sh, torchrun, a driver)."""
    table: dict[int, psutil.Process] = {}
    children: dict[int, list[psutil.Process]] = {}
    for proc in psutil.process_iter(["ppid"]):
        table[proc.pid] = proc
        children.setdefault(proc.info.get("ppid"), []).append(proc)
    found = []
    for host, root in zip(hosts, roots, strict=False):
        todo = [table[root.pid]] if root.pid in table else []
        while todo:
            proc = todo.pop()
            todo.extend(children.get(proc.pid, []))
            try:
                env = proc.environ()
            except (psutil.Error, OSError):
                continue
            found.append((host, _rank_of(env, host), proc))
    return found


class StallWatch:
    """Watches one run's lines for a stall (see the module docstring).

    `procs` is the run's list of each host's first process, filled as the hosts start; `say(lines,
    quiet_s)` says a note: a stall's (`quiet_s` how long the job has been quiet) or its end's (None).
    `stall_s` None or 0: no stall is ever said, but `note_failure` still sees who was answering.
    """

    def __init__(self, stall_s: float | None, transcript: Transcript, hosts: list[HostResult],
                 procs: Sequence[subprocess.Popen], say: Callable[[list[str], float | None], None]):
        self.stall_s = stall_s
        self.transcript = transcript
        self.hosts = hosts
        self.procs = procs
        self.say = say
        self.stall: Stall | None = None  # the last stall (under way while its `ended` is None)
        self.failed_stalled = False  # the job failed (or ran out of time) during a stall, or just after one
        self._cpu_sample: tuple[float, dict[tuple[str, str], float]] | None = None  # during a silence
        self.at_failure: Silence | None = None  # who was answering when the job failed or ran out of time

    def watch(self) -> None:
        """Say when no line has come from any rank or launcher for `stall_s`, again every `stall_s`
        while none comes, and once one does. Called at each turn of the run's loop.

        Who stopped answering is read from the processes (`silence`): one stopped (state T:
        SIGSTOP, a debugger) cannot answer; one that keeps a CPU busy while every other rank sits
        idle is the one they wait for. The CPU is sampled once the silence is half `stall_s`
        long, and compared at each note."""
        if not self.stall_s:
            return
        now = time.monotonic()
        last_line_any = self.transcript.last_line_any
        if self.stall is not None and self.stall.ended is None and last_line_any > self.stall.since:
            self._over()
        quiet = now - last_line_any
        if quiet < self.stall_s / 2:
            return
        if self._cpu_sample is None or self._cpu_sample[0] < last_line_any:
            self.silence()  # the first CPU sample of this silence
        if self.stall is not None and self.stall.ended is None and now - self.stall.said < self.stall_s:
            return  # said not long ago
        if quiet >= self.stall_s:
            if self.stall is None or self.stall.ended is not None:
                self.stall = Stall(since=last_line_any, said=now)
            silence = self.stall.silence = self.silence()
            self.stall.said = now
            lines = self.lines(silence, f"No rank has written a line for {silence.quiet_s:.0f} s.")
            lines[0] += f" (Said again every {self.stall_s:g} s while it lasts; --stall-after sets when.)"
            self.say([f"[stall] {line}" for line in lines], silence.quiet_s)

    def _over(self) -> None:
        since, at = self.stall.since, self.transcript.last_line_at
        first = min((key for key, t in at.items() if t > since), key=at.get)
        gap = at[first] - since
        self.stall.ended = time.monotonic()
        line = bare(self.transcript.tails[first][-1][1])[:200]
        self.say([f"[stall] Ended after {gap:.0f} s without a line: {who(*first)} wrote: {line}"], None)

    def note_failure(self) -> None:
        """When the job failed or ran out of time: who was answering (`at_failure`), and whether it
        was during a stall or just after one ended (the failing rank's own traceback ends it)."""
        self.at_failure = self.silence()
        stall = self.stall
        # The failing rank's own traceback ends a stall a moment before its host is seen to end.
        self.failed_stalled = stall is not None and (stall.ended is None or time.monotonic() - stall.ended < 10.0)
        if self.failed_stalled and not self.at_failure.named() and stall.silence is not None:
            self.at_failure.busy = stall.silence.busy  # what the stall's last note saw: the CPU, sampled then

    def at_time_limit(self) -> list[str]:
        """When the job ran past its time limit: who stopped answering and each rank's last line, if it
        was during a stall or the processes show who; else nothing."""
        self.note_failure()
        if self.failed_stalled or self.at_failure.named():
            return self.lines(self.at_failure, f"No rank had written a line for {self.at_failure.quiet_s:.0f} s.")
        return []

    def lines(self, silence: Silence, head: str) -> list[str]:
        """`head`, who stopped answering (if the processes show it), then each rank's last line and
        how long before it came (a host's launcher's, for a host none of whose ranks wrote yet)."""
        named = self.named(silence)
        lines = [head + (f" {named[0].upper()}{named[1:]}." if named else "")]
        rows = []
        for host in self.hosts:
            ranks = sorted((r for h, r in self.transcript.last_line_at if h == host.name and r), key=int)
            keys = [(host.name, r) for r in ranks] or [(host.name, "")]
            for key in keys:
                if key not in silence.ages:
                    rows.append(f"  [{host.name}] no line yet")
                    continue
                rows.append(f"  {silence.ages[key]:.0f} s ago: {self.transcript.tails[key][-1][1][:200]}")
        if len(rows) > STALL_SHOWN:
            rows = rows[:STALL_SHOWN] + [f"  ... and {len(rows) - STALL_SHOWN} more (every line is in logs/cluster.log)"]
        return lines + ["Each rank's last line:"] + rows

    def named(self, silence: Silence, besides: tuple[str, str] | None = None) -> str:
        """Who stopped answering, in words ("rank 1 on algo-2 stopped answering: ..."), "" if none shows."""
        said = []
        for key, process in silence.stopped.items():
            if key != besides:
                said.append(f"{who(*key)} stopped answering: its {process}")
        if not said:
            for key, share in silence.busy.items():
                if key != besides:
                    said.append(f"{who(*key)} stopped answering: it kept {share:.0%} of a CPU busy while every "
                                "other rank sat idle, waiting")
        return "; ".join(said)

    def silence(self) -> Silence:
        """Who is answering now: which of the run's processes are stopped, and (against the CPU
        sample taken earlier in this silence) which rank kept a CPU busy while the others idled.
        Takes the next CPU sample."""
        now = time.monotonic()
        last_line_any = self.transcript.last_line_any
        silence = Silence(quiet_s=now - last_line_any,
                          ages={key: now - t for key, t in self.transcript.last_line_at.items()})
        cpu: dict[tuple[str, str], float] = {}
        for host, rank, proc in job_processes(self.hosts, self.procs):
            try:
                with proc.oneshot():
                    status, times, cmdline = proc.status(), proc.cpu_times(), proc.cmdline()
            except (psutil.Error, OSError):
                continue
            if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                state = "T" if status == psutil.STATUS_STOPPED else "t"
                silence.stopped.setdefault(
                    (host.name, rank), f"process {proc.pid} ({_program(cmdline)}) is stopped (state {state}: "
                    "SIGSTOP, or a debugger), so it cannot answer its peers")
            if rank:
                cpu[(host.name, rank)] = cpu.get((host.name, rank), 0.0) + times.user + times.system
        if self._cpu_sample is not None and self._cpu_sample[0] >= last_line_any and len(cpu) > 1:
            taken, before = self._cpu_sample
            shares = {key: (used - before.get(key, used)) / max(now - taken, 1e-6) for key, used in cpu.items()}
            top = max(shares, key=shares.get)
            if shares[top] >= BUSY_SHARE and all(IDLE_RATIO * share <= shares[top] for key, share in shares.items()
                                                 if key != top):
                silence.busy = {top: shares[top]}
        self._cpu_sample = (now, cpu)
        return silence

    def waited_for(self, host: str, rank: str, timed_out: bool, procs_per_host: int) -> list[str]:
        """The line before a failed rank's own (`rank` on `host`) where it failed waiting for a peer (its
        error says it `timed_out`, or the job had stalled): which rank stopped answering, and how that
        shows; [] if none does."""
        silence = self.at_failure
        if silence is None or not (timed_out or self.failed_stalled):
            return []
        named = self.named(silence, besides=(host, rank))
        if not named and rank.isdigit() and timed_out and len(self.hosts) * procs_per_host == 2:
            other = str(1 - int(rank))
            other_host = self.hosts[int(other) // procs_per_host].name
            named = (f"{who(other_host, other)} stopped answering: it is the only other rank, so the collective "
                     "that timed out waited on it")
            key = (other_host, other)
        else:
            key = next((k for k in [*silence.stopped, *silence.busy] if k != (host, rank)), None)
        if not named:
            return []
        last = (f"its last line came {silence.ages[key]:.0f} s before the failure" if key in silence.ages
                else "it had written no line")
        return [f"{named[0].upper()}{named[1:]}; {last}. The rank below waited for it:"]
