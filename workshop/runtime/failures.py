"""The failure report: which rank failed first and how, then what followed from it.

When one rank dies, its peers fail too (a collective whose partner vanished) and the launchers
print summaries of their own; whichever traceback printed first is often a consequence. So the
report reads the launchers' own records of how each rank ended (`rank_ends`: torchrun's agent and
its "Root Cause" summary, the workshop's Horovod and parameter-server drivers) and names the rank
that failed first ("Rank 1 on algo-2 was killed by SIGKILL (signal 9)."), with its own last lines
or traceback; its peers' lost-connection errors follow as consequences ("Then: ..."). A launcher
killed by a signal is named too, from the record of the process that started it: torchrun's agent
from the SDK's driver's ("Command failed with exit code -9"), the driver from sm_train.sh's ("An
error occurred with exit code 137"). A process killed by SIGKILL while the kernel's out-of-memory
killer ended processes of the run is named as a memory kill, with the limit and the fix
(`workshop.runtime.machine.MemoryKills`). A rank that failed waiting for a peer is preceded by the
peer it waited for (`workshop.runtime.stalls`); a full disk is said in one line naming the folder
(`disk_full_failure`).
"""

from __future__ import annotations

import contextlib
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path

from workshop.runtime.folders import (
    DISK_FULL_FIX,
    free_bytes,
    megabytes,
    remove_half_written,
    size_of,
)
from workshop.runtime.machine import MemoryKills
from workshop.runtime.results import HostResult
from workshop.runtime.stalls import StallWatch
from workshop.runtime.streams import Transcript, bare, who

_TRACEBACK_START = "Traceback (most recent call last):"
_CHAINED = re.compile(r"During handling of the above exception|direct cause of the following exception")
# Errors a rank raises because a peer went away first (gloo, NCCL, c10d store, MPI).
_PEER_LOST = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|remote worker crashing|DistNetworkError|"
    r"DistStoreError|NCCL communicator was aborted|ProcessGroupNCCL.*(?:abort|timeout)|"
    r"Socket Timeout|Connection refused|Horovod has been shut down",
    re.IGNORECASE,
)
# How launchers record a rank's end, in their own lines (the host's, untagged). These records,
# not whichever traceback printed first, say which rank failed first and how:
#   torchrun's agent, as it sees a rank end:  "failed (exitcode: -9) local_rank: 0 (pid: 211) of binary: ..."
#   torchrun's ChildFailedError summary:      "Root Cause (first observed failure):" then
#                                             "rank      : 1 (local_rank: 0)", "exitcode  : -9 (pid: 211)  (SIGKILL)"
#   the workshop's Horovod driver:            "[hvd_driver] ERROR: rank 1 exited with status -9; ..."
#   the workshop's parameter-server driver:   "[ps_driver] the coordinator exited with status -9; ..." and
#                                             "[ps_driver] ERROR: the parameter server exited with status 1 ..."
_TORCHRUN_AGENT = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: \d+\)")
_TORCHRUN_ROOT = "Root Cause (first observed failure):"
# The labs' scripts announce an injected fault (--fault, WORKSHOP_FAULT) before they SIGKILL themselves.
_FAULT_LINE = re.compile(r"FAULT: killing rank \d+ at step \d+ \([^)]*\)")
_TORCHRUN_RANK = re.compile(r"^\s*rank\s*: (?P<rank>\d+) \(local_rank: \d+\)")
_TORCHRUN_EXIT = re.compile(r"^\s*exitcode\s*: (?P<code>-?\d+)")
_HVD_RANK = re.compile(r"\[hvd_driver\] ERROR: rank (?P<rank>\d+) exited with status (?P<code>-?\d+)")
_PS_END = re.compile(r"\[ps_driver\] (?:ERROR: )?the (?P<role>coordinator|parameter server) exited with status (?P<code>-?\d+)")
# One level up, how the processes that start the ranks ended, in the records of the processes that started them:
#   the SDK's drivers, of the command they run (torchrun, mpirun, or the script itself):
#                                             "Executing command: torchrun --nnodes=2 ..." ... "Command failed with exit code -9. ..."
#   sm_train.sh, of the driver it runs (its `set -x` trace names it; bash's status for a signal is 128 + it):
#                                             "++ /usr/bin/python3 /opt/ml/.../torchrun_driver.py" ... "An error occurred with exit code 137"
_DRIVER_COMMAND = re.compile(r"^Executing command: (?P<command>.+)$")
_COMMAND_FAILED = re.compile(r"^Command failed with exit code (?P<code>-?\d+)")
_SHELL_RAN = re.compile(r"^\++ .*?(?P<script>[^/\s]+\.py)\b")
_SHELL_ERROR = re.compile(r"^An error occurred with exit code (?P<code>\d+)$")
# The line that says what ended a rank: an exception's (the last line of a traceback) or argparse's.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)\b|\S+: error: )")
# What a rank's error says when a collective, a rendezvous or a store waited too long for a peer
# (gloo: "Timed out waiting 600000ms for recv operation", NCCL's watchdog, c10d's store, TensorFlow's
# DEADLINE_EXCEEDED): the rank that says it waited; the one it waited for said nothing.
_TIMED_OUT = re.compile(r"timed out|timeout|deadline.?exceeded|watchdog", re.IGNORECASE)
# sm_train.sh's and the ranks' words for a full disk (an OSError's, and torch's, which wraps it)
_DISK_FULL = re.compile(r"No space left on device|\[Errno 28\]|Disk quota exceeded|\[Errno 122\]")


@dataclass
class RankEnd:
    """How one rank (or a parameter server, which is no rank) ended, as its launcher recorded it."""

    host: str
    rank: str  # the global rank; "" for a parameter server
    code: int | None  # exit status, or minus the signal that killed it; None: none recorded, a traceback
    seen: int  # where the record is among the run's lines: the order in which launchers saw the ends
    launcher: str  # who recorded it: "torchrun", "the Horovod driver", ...; "": no launcher did
    role: str = ""  # "the coordinator" (lab 1)
    lines: list[str] = field(default_factory=list, repr=False)  # its own last lines, tagged
    consequence: bool = False  # it lost a peer (its error says so), or the stop ended it
    process: str = ""  # a process that is no rank, in words: "torchrun's agent"; "": the parameter server

    @property
    def who(self) -> str:
        if not self.rank:
            return f"{self.process or 'the parameter server'} on {self.host}"
        return f"rank {self.rank} on {self.host}" + (f" ({self.role})" if self.role else "")

    @property
    def how(self) -> str:
        if self.code is None:
            return "failed"
        if self.code < 0:
            return f"was killed by {_signal_name(-self.code)} (signal {-self.code})"
        return f"exited with status {self.code}"


def _sigkill_cause(lines: list[str], memory: MemoryKills | None) -> str:
    """What a SIGKILL was: the fault the labs' scripts inject on purpose (`--fault`), when the killed rank
    announced it, else what the kernel's out-of-memory killer did to the run (`memory`: None, not known)."""
    injected = [line for line in lines if _FAULT_LINE.search(line)]
    if injected:
        return f"(The injected fault: {_FAULT_LINE.search(injected[-1]).group(0)}; --max-restarts K lets the job heal.)"
    return (memory or MemoryKills(None, 0, "")).cause()


def _memory_kill(code: int | None, lines: list[str], memory: MemoryKills | None) -> bool:
    """A process ended by SIGKILL (`code`) while the kernel's out-of-memory killer ended processes of the run,
    and not by the fault a lab's script injected."""
    return (code == -signal.SIGKILL and memory is not None and bool(memory.count)
            and not any(_FAULT_LINE.search(line) for line in lines))


def _launched(command: str | None) -> str:
    """The process a driver's command starts, in words."""
    words = (command or "").split()
    program = Path(words[0]).name if words else ""
    if program == "torchrun":
        return "torchrun's agent"
    if program.startswith("python"):
        script = next((Path(w).name for w in words[1:] if w.endswith(".py")), "")
        return f"the training script ({script})" if script else "the training script"
    return program or "the driver's command"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _status(code: int) -> str:
    return f"exit status {code}" if code >= 0 else f"killed by {_signal_name(-code)}"


def _final_block(lines: list[str]) -> list[str]:
    """What a rank printed as it ended: its last traceback (with the ones chained before it), else
    its last lines."""
    recent = lines[-120:]
    starts = [k for k, line in enumerate(recent) if _TRACEBACK_START in line]
    if not starts:
        return recent[-30:]
    begin = starts[-1]
    for start in reversed(starts[:-1]):  # "During handling of the above exception, ..." just before
        if not any(_CHAINED.search(line) for line in recent[max(start, begin - 3):begin]):
            break
        begin = start
    return recent[begin:]


def _traceback(lines: list[str]) -> list[str]:
    """A rank's final traceback, at most 60 lines (its start and its end); [] if it printed none."""
    block = _final_block(lines)
    if not block or _TRACEBACK_START not in block[0]:
        return []
    return block if len(block) <= 60 else [*block[:15], "    ...", *block[-45:]]


def _last_error(lines: list[str], limit: int = 300) -> str:
    """What ended a rank, in one line: the exception or argparse error it printed last, else its last line."""
    texts = [text for text in (bare(line).strip() for line in lines[-60:]) if text]
    error = next((text for text in reversed(texts) if _ERROR_LINE.match(text)), texts[-1] if texts else "")
    return error if len(error) <= limit else error[: limit - 3] + "..."


def describe_failure(transcript: Transcript, hosts: list[HostResult], procs_per_host: int, failed: int, code: int,
                     ended_before_stop: dict[str, int], watch: StallWatch, memory: MemoryKills | None = None,
                     first_process: str = "") -> str:
    """The failure report of a run whose host `hosts[failed]` was seen to fail first (with `code`):
    which rank failed first and how, then what followed from it. `ended_before_stop`: the exit
    status of each host that had ended when the stop began, by name; `watch`: the run's stall watch,
    which knows who stopped answering; `memory`: what the kernel's out-of-memory killer did to the run
    (None: not known); `first_process`: what each host's first process is, in words (the process
    runtime's is the driver).

    From the launchers' own records of how their ranks ended (`rank_ends`), not from
    whichever traceback printed first: a rank killed by a signal prints none, while the
    peers it leaves behind print lost-connection tracebacks, and torchrun answers a rank's
    argparse error with a ChildFailedError traceback of its own. The first line names the
    rank, its host and how it ended ("Rank 1 on algo-2 was killed by SIGKILL (signal 9)."),
    its own last lines or traceback follow, and the peers' failures come after as what they
    are, consequences ("Then: rank 0 on algo-1 lost its peer ...").
    """
    ends = rank_ends(transcript, hosts, procs_per_host)
    if not any(e.code is not None for e in ends):  # no launcher recorded a rank (basic script driver)
        return _describe_host_failure(transcript, hosts[failed], code, memory, first_process)
    stop_line = transcript.stop_line
    before_stop = [e for e in ends if stop_line is None or e.seen < stop_line] or ends
    # A launcher's record first (it also knows a signal); a rank that lost its peer last.
    root, *rest = sorted(before_stop, key=lambda e: (e.consequence, e.code is None, e.seen))
    error = _last_error(root.lines) if root.code is None or root.code >= 0 else ""
    how = ("was killed by the kernel's out-of-memory killer (SIGKILL, signal 9)"
           if _memory_kill(root.code, root.lines, memory) else root.how)
    first = f"{root.who[0].upper()}{root.who[1:]} {'lost its peer and ' if root.consequence else ''}{how}"
    waited = watch.waited_for(root.host, root.rank, bool(_TIMED_OUT.search(error)), procs_per_host)
    message = waited + [first + (f": {error}" if error else ".")]
    if root.code == -signal.SIGKILL:
        message.append(_sigkill_cause(root.lines, memory))
    if ended_before_stop.get(root.host):
        message.append(f"Host {root.host} failed ({_status(ended_before_stop[root.host])}); the other hosts were stopped.")
    else:
        message.append(f"Host {hosts[failed].name} failed first ({_status(code)}); the other hosts were stopped.")
    if root.consequence:
        message.append("No launcher recorded an earlier failure; the hosts' logs show what came before.")
    source = f"{root.launcher} recorded how it ended" if root.launcher else "its launcher recorded no exit before the stop"
    traceback = _traceback(root.lines)
    if (root.code is None or root.code >= 0) and traceback:
        message.append(f"Its traceback ({source}):")
        message += traceback
    elif root.lines:
        message.append(f"Its last lines ({source}):")
        message += root.lines[-(10 if root.code is not None and root.code < 0 else 20):]
    for end in rest[:8]:
        said = _last_error(end.lines) if end.code is None or end.code >= 0 else ""
        how = ("lost its peer" + (f" ({_status(end.code)})" if end.code is not None else "")) if end.consequence else end.how
        if said and said == error:  # every rank met the same error (a script's import or syntax): said once, above
            said = "the same error"
        message.append(f"Then: {end.who} {how}" + (f": {said}" if said else "."))
    if len(rest) > 8:
        message.append(f"Then: {len(rest) - 8} more rank(s) failed; see the logs.")
    return "\n".join(message)


def rank_ends(transcript: Transcript, hosts: list[HostResult], procs_per_host: int) -> list[RankEnd]:
    """How every failed rank ended, as its launcher recorded it (see `_TORCHRUN_AGENT` and
    the patterns after it), each with its own last lines; one record per rank, the first."""
    stop_line = transcript.stop_line
    ends: dict[tuple[str, str], RankEnd] = {}
    for host in hosts:
        in_root, root_rank = False, None  # inside torchrun's "Root Cause" block, its rank
        command, ran, driver_said = None, None, False  # the SDK driver's command; what sm_train.sh ran last
        own_lines = list(transcript.tails.get((host.name, ""), ()))
        for k, (n, line) in enumerate(own_lines):
            text = line.split("] ", 1)[-1]
            found = None
            launcher_end = None  # (exit status or minus a signal, who recorded it, the process), before the stop
            if m := _DRIVER_COMMAND.match(text):
                command = m["command"]
            elif m := _COMMAND_FAILED.match(text):
                driver_said = True
                if int(m["code"]) < 0:  # a signal ended the driver's command: the launcher itself, not a rank
                    launcher_end = (int(m["code"]), "the SDK's driver", _launched(command))
            elif (m := _SHELL_ERROR.match(text)) and 128 < int(m["code"]) <= 128 + 64 and not driver_said:
                # a signal ended what sm_train.sh ran (and not a command of the driver's that the driver reported)
                launcher_end = (128 - int(m["code"]), "sm_train.sh", f"the driver ({ran})" if ran else "the driver")
            elif m := _SHELL_RAN.match(text):
                ran = m["script"]
            if launcher_end and (stop_line is None or n < stop_line):
                code, launcher, process = launcher_end
                ends.setdefault((host.name, process), RankEnd(host.name, "", code, n, launcher, "",
                                                              [t for _, t in own_lines[: k + 1]], process=process))
            if m := _TORCHRUN_AGENT.search(text):
                local = int(m["local"])
                found = (str(host.host_rank * procs_per_host + local), int(m["code"]), "torchrun", "")
            elif _TORCHRUN_ROOT in text:
                in_root, root_rank = True, None
            elif in_root and (m := _TORCHRUN_RANK.match(text)):
                root_rank = m["rank"]
            elif in_root and root_rank is not None and (m := _TORCHRUN_EXIT.match(text)):
                found, in_root = (root_rank, int(m["code"]), "torchrun", ""), False
            elif m := _HVD_RANK.search(text):
                found = (m["rank"], int(m["code"]), "the Horovod driver", "")
            elif m := _PS_END.search(text):
                coordinator = m["role"] == "coordinator"
                found = (str(host.host_rank) if coordinator else "", int(m["code"]),
                         "the parameter-server driver", "the coordinator" if coordinator else "")
            if found and found[1] != 0 and (host.name, found[0]) not in ends:
                rank, code, launcher, role = found
                own = _own_lines(transcript, host, rank)
                stopped = stop_line is not None and n >= stop_line
                ends[(host.name, rank)] = RankEnd(
                    host.name, rank, code, n, launcher, role, own,
                    consequence=stopped or any(_PEER_LOST.search(t) for t in _final_block(own)),
                )
    # Ranks whose launcher had not recorded their exit when the stop came, but whose traceback
    # was out by then (a launcher that polls its ranks every second, one stopped mid-way).
    for (host_name, rank), tail in transcript.tails.items():
        if not rank or (host_name, rank) in ends:
            continue
        printed = [(n, line) for n, line in tail if stop_line is None or n < stop_line]
        block = _final_block([line for _, line in printed])
        if block and _TRACEBACK_START in block[0]:
            seen = printed[len(printed) - len(block)][0]
            ends[(host_name, rank)] = RankEnd(host_name, rank, None, seen, "", "", [line for _, line in printed],
                                              consequence=any(_PEER_LOST.search(t) for t in block))
    return list(ends.values())


def _own_lines(transcript: Transcript, host: HostResult, rank: str) -> list[str]:
    """A rank's own lines (a parameter server's: its tagged lines in its host's output)."""
    if rank:
        return [line for _, line in transcript.tails.get((host.name, rank), ())]
    tag = f"[ps{host.host_rank}] "
    return [line.replace(tag, "", 1) for _, line in transcript.tails.get((host.name, ""), ())
            if line.split("] ", 1)[-1].startswith(tag)]


def _describe_host_failure(transcript: Transcript, host: HostResult, code: int, memory: MemoryKills | None = None,
                           first_process: str = "") -> str:
    """The report without launcher records: the failed host, and the first traceback. A host whose first
    process (`first_process`) the kernel's out-of-memory killer took says so first."""
    how = f"exit status {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
    message = f"Host {host.name} failed ({how}); the other hosts were stopped."
    if first_process and _memory_kill(code, transcript.lines, memory):
        message = (f"{first_process[0].upper()}{first_process[1:]} on {host.name} was killed by the kernel's "
                   f"out-of-memory killer (SIGKILL, signal 9).\n{message}")
    found = _root_traceback(transcript)
    if found:
        where, lines = found
        message += f"\nFirst failure: {where}. Its traceback:\n" + "\n".join(lines)
    else:
        tail = [line for _, line in transcript.tails.get((host.name, ""), [])][-20:]
        message += "\nLast lines from that host:\n" + "\n".join(tail)
    if code == -signal.SIGKILL or (code == 128 + signal.SIGKILL and memory is not None and memory.count):
        # the host's first process, or (bash's status for a signal) what it ran, with the kernel's kills
        message += "\n" + _sigkill_cause(transcript.lines, memory)
    return message


def _root_traceback(transcript: Transcript) -> tuple[str, list[str]] | None:
    """Where the job failed first, and that rank's traceback.

    When one rank dies, its peers fail too (a collective whose partner vanished) and the
    launchers print summaries; those are consequences. So: a rank's traceback before a
    launcher's, a traceback that is not a lost-peer error before one that is, and among
    equals the one printed first.
    """
    found = []
    for (host, rank), tail in transcript.tails.items():
        lines = list(tail)
        for k, (n, line) in enumerate(lines):
            if _TRACEBACK_START in line:
                text = [t for _, t in lines[k : k + 60]]
                consequence = any(_PEER_LOST.search(t) for t in text)
                found.append((rank == "", consequence, n, who(host, rank), text))
                break
    if not found:
        return None
    *_, where, text = min(found)
    return where, text


def disk_full_failure(failure: str | None, lines: list[str], log_full: str | None, hosts: list[HostResult],
                      workdir: Path, started_at: float) -> str | None:
    """A failure that a full disk caused, as one line naming the folder (and what the write that failed
    needed), once what the run left half-written (since `started_at`) is removed; else `failure` as it
    was. A rank's own word for it among the run's `lines` comes first; else `log_full`, the line that
    says a log could not be written (which may have stopped the job while a rank was still writing
    its checkpoint)."""
    said = next((line for line in lines if _DISK_FULL.search(line)), None)
    if said is None and log_full is None:
        return failure
    stores = [h.checkpoint_store for h in hosts[:1] if h.checkpoint_store is not None]
    folders = stores + [f for h in hosts for f in (h.sandbox.checkpoint_dir, h.model_dir, h.output_data_dir)]
    sizes = {}
    for folder in folders:  # sized before they go: the write that failed needed more than that
        for path in folder.iterdir() if folder.is_dir() else ():
            with contextlib.suppress(OSError):
                if path.name.endswith((".tmp", ".partial")) and path.lstat().st_mtime >= started_at - 1:
                    sizes[path] = size_of(path)
    gone = remove_half_written(folders, started_at)
    written = f"{', '.join(p.name for p in gone)} ({megabytes(sum(sizes.get(p, 0) for p in gone))})"
    if said is None:
        line = log_full + (f" What the run left half-written went: {written}." if gone else "")
        return f"{line}\n  Fix: {DISK_FULL_FIX}"
    tagged = said.split("] ", 1)[0].lstrip("[")
    host, _, rank = tagged.partition("/")
    whose = f"Rank {rank} on {host}" if rank else f"Host {host}"
    where = gone[0].parent.resolve() if gone else (stores[0] if stores else workdir)
    what = "the checkpoint folder" if stores and where == stores[0] else f"in the run folder {workdir}"
    line = (f"{whose} ran out of disk space (No space left on device) writing to {where} ({what}): "
            f"{megabytes(free_bytes(where))} free there now")
    if gone:
        line += (f", and the write that failed needed more than {megabytes(sum(sizes.get(p, 0) for p in gone))} "
                 f"(what it had written of {', '.join(p.name for p in gone)}, now removed)")
    return f"{line}.\n  Fix: {DISK_FULL_FIX}"
