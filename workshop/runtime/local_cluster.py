"""A SageMaker training cluster simulated on this machine: N hosts, the real drivers, loopback.

    from sagemaker.train.distributed import Torchrun
    from workshop.runtime.local_cluster import LocalCluster

    cluster = LocalCluster("3_data_parallel/code", "train.py", hosts=2, procs_per_host=1,
                           distributed=Torchrun(process_count_per_node=1))
    result = cluster.run(hyperparameters={"epochs": 3},
                         channels={"train": "data/mnist/train", "test": "data/mnist/test"})
    result.metric("final_test_accuracy")

Each simulated host gets a sandbox laid out like `/opt/ml` (see `workshop.runtime.contract`), with the
job's `code` and `sm_drivers` channels as SDK v3 uploads them, and runs what a SageMaker host
runs for the same `distributed=` config, all hosts concurrently. Two runtimes:

- **container** (Linux with unprivileged namespaces, `workshop.runtime.hostns`): each host sees its
  sandbox at `/opt/ml` (its config and data channels read-only), its peers resolve as
  `algo-1..algo-N` (at 127.0.0.1..N), its hostname is an instance's (`ip-10-0-1-N.ec2.internal`,
  not `algo-N`: SageMaker does not promise it), and it runs the SDK's own generated `sm_train.sh`
  unchanged: the SDK's `environment.py` writes `/opt/ml/input/sm_training.env`, the script `cd`s
  into the code and runs the driver (SDK's `torchrun_driver.py` for `Torchrun`, the workshop's own
  drivers for its `DistributedConfig`s, the basic script driver without one), which builds
  `torchrun --master_addr=algo-1 --master_port=7777 ...` as on SageMaker. The hosts share a
  private network with nothing but loopback, and a job with a route to the internet
  (`internet=True`) reaches it through an HTTPS proxy; hosts may start seconds apart
  (`start_skew_s`), as instances do.
- **process** (elsewhere, said so when chosen): the same driver started by
  `workshop.runtime.run_driver` with the `SM_*` variables pointing into the sandbox (`workshop.runtime.contract`
  builds what `environment.py` would) and the master on 127.0.0.1 at a free port.

So a local run exercises the real script, the real launcher command line and the real
collectives (gloo); only the machines are simulated.

Reliability lives here too:
- Logs stream live, whole lines only, each prefixed `[host/rank]` (or `[host]` for the
  launcher's own lines), and are kept in `<run>/logs/`.
- If any host's processes fail, every other host is stopped (SIGTERM to its process group,
  SIGKILL after `stop_grace_s`), and the error names the rank that failed first and how
  ("Rank 1 on algo-2 was killed by SIGKILL (signal 9)."), from its launcher's record of its
  exit (torchrun's, the Horovod or parameter-server driver's), with its own last lines or
  traceback; its peers' lost-connection errors follow as consequences.
- A job whose ranks all go silent for `stall_s` seconds (default 120; CLI `--stall-after`) is said
  to stall, again every `stall_s` while it lasts, with each rank's last line and how long ago it
  was, and which rank stopped answering where the processes show it (one stopped by SIGSTOP or a
  debugger, one busy on a CPU while its peers wait idle); said again when a line comes. A
  collective that times out (or a time limit reached during a stall) is reported as what it is:
  the rank that stopped answering first, then the rank that waited for it and timed out.
- No process outlives the run: not on success, failure, timeout, Ctrl-C or a notebook
  interrupt, including a Ctrl-C while the hosts are still being started. Every process started
  carries a marker variable; sweeps kill anything that still carries it (torchrun starts its
  workers in sessions of their own, so process groups alone would not reach them), and on
  Linux each host launcher dies with its parent.
- A cluster far bigger than this machine's cores or memory is refused before anything starts,
  one bigger than its cores is warned about (`check_machine_fits`).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from workshop import REPO_ROOT, metrics
from workshop.errors import WorkshopError
from workshop.runtime import hostns
from workshop.runtime.checkpoint_sync import CheckpointSync
from workshop.runtime.contract import (
    RESERVED_CHANNELS,
    SAGEMAKER_MASTER_PORT,
    HostSandbox,
    base_process_env,
    container_command,
    container_process_env,
    host_names,
    thread_pool_env,
    write_sm_drivers,
)
from workshop.runtime.folders import (
    DISK_FULL_FIX,
    FolderLock,
    check_free_space,
    disk_full_message,
    free_bytes,
    is_disk_full,
    megabytes,
    new_folder,
    remove_half_written,
    size_of,
)
from workshop.runtime.processes import (
    MARKER,
    PARENT_ENV,
    DeferredInterrupt,
    Stopped,
    Terminated,
    processes_with_marker,
)
from workshop.runtime.progress import STALL_S, JobProgress, progress_total

DEFAULT_RUNS_DIR = REPO_ROOT / "runs"
RUNTIMES = ("auto", "container", "process")

# Per-rank tags that launchers put in front of their workers' output:
#   torchrun --tee (PET_TEE):       "[default0]:text"      local rank
#   mpirun --tag-output:            "[1,3]<stdout>:text"   global rank
#   horovodrun (gloo):              "[3]<stdout>:text"     global rank
# A launcher that forwards partial lines repeats the tag mid-line ("a, [default0]:b"), so
# tags are found anywhere in a line and each rank's text is rebuilt into whole lines.
#   workshop ps_driver (lab 1):     "[chief0]:text", "[worker1]:text"   one training process
#                                   per host, shown as the host's rank; its parameter servers'
#                                   lines ("[ps2] text") stay the host's own lines
_RANK_TAG = re.compile(
    r"\[default(?P<local>\d+)\]:|\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:|\[(?P<hvd>\d+)\]<std(?:out|err)>:"
    r"|\[(?:chief|worker)(?P<tf>\d+)\]: ?"
)
_TRACEBACK_START = "Traceback (most recent call last):"
_CHAINED = re.compile(r"During handling of the above exception|direct cause of the following exception")
# sm_train.sh's line just before it runs the driver (sagemaker/train/templates.py).
_DRIVER_START = re.compile(r"^Running .+ [Dd]river$")
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
# The line that says what ended a rank: an exception's (the last line of a traceback) or argparse's.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)\b|\S+: error: )")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")  # PyTorch's own prefix on a rank's stderr lines
# What a rank's error says when a collective, a rendezvous or a store waited too long for a peer
# (gloo: "Timed out waiting 600000ms for recv operation", NCCL's watchdog, c10d's store, TensorFlow's
# DEADLINE_EXCEEDED): the rank that says it waited; the one it waited for said nothing.
_TIMED_OUT = re.compile(r"timed out|timeout|deadline.?exceeded|watchdog", re.IGNORECASE)
# What launchers tell a training process its rank by (torchrun, Horovod, mpirun and MPICH).
_RANK_VARS = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
STALL_SHOWN = 12  # at most this many ranks' last lines in a stall's note
# During a stall, a rank that used at least BUSY_SHARE of a CPU (on a shared machine a spinning
# process may get only a fraction of one), and IDLE_RATIO times that or more than every other rank
# (waiting in a collective costs next to nothing), is the one the others wait for.
BUSY_SHARE = 0.1
IDLE_RATIO = 10
# After the first host fails, the others get this long to end on their own (and their launchers to
# record why) before they are stopped: a launcher stopped mid-way records nothing, and the rank
# that failed first may be on a host whose launcher noticed a moment later than a peer's.
SETTLE_S = 1.0

# What a local run may ask of this machine (see `check_machine_fits`).
CORES_WARN_RATIO = 4  # training processes per core above which the run is said to be slow
CORES_REFUSE_RATIO = 16  # ... above which it is refused, unless allowed
HOST_MEMORY_MB = 350  # one host's launchers: sm_train.sh, the driver, torchrun (about 320 MB measured)
RANK_MEMORY_MB = 500  # one training process of the labs (about 300 MB measured for PyTorch; TensorFlow more)
OVERSUBSCRIBE_ENV = "WORKSHOP_ALLOW_OVERSUBSCRIPTION"  # "1": allow_oversubscription=True where not passed


class OversubscriptionWarning(UserWarning):
    """A local cluster asks for more processes than this machine has cores for: it will be slow."""


class TrainingFailed(WorkshopError):
    """A local job failed. `.result` has the logs, paths and what was parsed so far."""

    def __init__(self, message: str, result: ClusterResult):
        super().__init__(message)
        self.result = result


@dataclass
class HostResult:
    name: str
    host_rank: int
    sandbox: HostSandbox
    log_path: Path
    returncode: int | None = None
    driver_started_s: float | None = None  # container runtime: when sm_train.sh ran the driver
    # The run's `checkpoint_dir`, when it was given: the checkpoint S3 URI's stand-in, which this host's
    # own checkpoint folder is synced with (`workshop.runtime.checkpoint_sync`).
    checkpoint_store: Path | None = None

    @property
    def model_dir(self) -> Path:
        return self.sandbox.model_dir

    @property
    def output_data_dir(self) -> Path:
        return self.sandbox.output_data_dir

    @property
    def checkpoint_dir(self) -> Path:
        """This host's own checkpoint folder (its /opt/ml/checkpoints): what its ranks wrote, and what it
        downloaded from the run's `checkpoint_dir` at the start, if it had one."""
        return self.sandbox.checkpoint_dir


@dataclass
class ClusterResult:
    """What a local run produced, in the shape a SageMaker job's results have."""

    job_name: str
    returncode: int
    hosts: list[HostResult]
    records: list[dict[str, Any]]
    wall_time_s: float
    workdir: Path
    log_path: Path
    failure: str | None = None
    world_size: int = 1
    lines: list[str] = field(default_factory=list, repr=False)
    runtime: str = "process"  # "container" (sm_train.sh, /opt/ml, algo-N) or "process"

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def model_dir(self) -> Path:
        """Rank 0's host's model folder: what SageMaker uploads as model.tar.gz."""
        return self.hosts[0].model_dir

    def metric(self, name: str, rank: int | None = 0) -> Any:
        """The last value of a metric printed by `rank` (any rank if None)."""
        return metrics.last(self.records, name, rank)

    def per_rank(self, name: str) -> dict[int, Any]:
        """The last value of `name` from every rank that printed it."""
        out: dict[int, Any] = {}
        for record in self.records:
            if name in record:
                out[record.get("rank", 0)] = record[name]
        return out

    def check(self) -> ClusterResult:
        if not self.ok:
            raise TrainingFailed(self.failure or f"exit status {self.returncode}", self)
        return self


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

    @property
    def who(self) -> str:
        if not self.rank:
            return f"the parameter server on {self.host}"
        return f"rank {self.rank} on {self.host}" + (f" ({self.role})" if self.role else "")

    @property
    def how(self) -> str:
        if self.code is None:
            return "failed"
        if self.code < 0:
            return f"was killed by {_signal_name(-self.code)} (signal {-self.code})"
        return f"exited with status {self.code}"


@dataclass
class _Silence:
    """Who was answering when a job went quiet (or failed), from its processes themselves."""

    quiet_s: float  # since the job's last line
    ages: dict[tuple[str, str], float] = field(default_factory=dict)  # (host, rank) -> seconds since its last line
    stopped: dict[tuple[str, str], str] = field(default_factory=dict)  # (host, rank) -> its stopped process
    busy: dict[tuple[str, str], float] = field(default_factory=dict)  # (host, rank) -> its share of a CPU

    def named(self) -> list[tuple[str, str]]:
        """The ranks that stopped answering: those stopped, else the one busy while the others waited."""
        return list(self.stopped) or list(self.busy)


@dataclass
class _Stall:
    since: float  # when the job's last line before it came
    said: float  # when it was last said
    silence: _Silence | None = None  # what its last note found
    ended: float | None = None  # when a line came again


def _who(host: str, rank: str) -> str:
    return f"rank {rank} on {host}" if rank else f"the launcher on {host}"


def _program(cmdline: list[str]) -> str:
    """What a process runs, in a word: its script (train.py), else its program (torchrun)."""
    script = next((Path(arg).name for arg in cmdline[1:] if arg.endswith(".py")), "")
    return script or (Path(cmdline[0]).name if cmdline else "?")


def _rank_of(env: dict[str, str], host: HostResult) -> str:
    """A training process's global rank, from what its launcher set; "" for any other process."""
    for var in _RANK_VARS:
        if env.get(var, "").isdigit():
            return env[var]
    try:  # lab 1: the chief and the workers, one per host, shown as the host's rank (see _RANK_TAG)
        task = json.loads(env.get("TF_CONFIG") or "{}").get("task", {})
    except ValueError:
        return ""
    return str(host.host_rank) if isinstance(task, dict) and task.get("type") in ("chief", "worker") else ""


def _sigkill_cause(lines: list[str]) -> str:
    """What a SIGKILL most likely was: the fault the labs' scripts inject on purpose (`--fault`), when
    the killed rank announced it, else the kernel's out-of-memory killer."""
    injected = [line for line in lines if _FAULT_LINE.search(line)]
    if injected:
        return f"(The injected fault: {_FAULT_LINE.search(injected[-1]).group(0)}; --max-restarts K lets the job heal.)"
    return "(SIGKILL from outside the job often means the machine ran out of memory.)"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _status(code: int) -> str:
    return f"exit status {code}" if code >= 0 else f"killed by {_signal_name(-code)}"


def _bare(line: str) -> str:
    """A line without the cluster's `[host/rank]` tag and PyTorch's `[rankN]:` prefix."""
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    return _RANK_PREFIX.sub("", line)


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
    texts = [text for text in (_bare(line).strip() for line in lines[-60:]) if text]
    error = next((text for text in reversed(texts) if _ERROR_LINE.match(text)), texts[-1] if texts else "")
    return error if len(error) <= limit else error[: limit - 3] + "..."


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _free_port() -> int:
    """A free port below the kernel's ephemeral range.

    A port from bind(0) is ephemeral: once released, the kernel may hand it to any other
    socket (gloo's own connections open dozens) before torchrun binds it. Ports below the
    range are only ever taken on purpose, so the one picked here stays free.
    """
    low, _ = _ephemeral_range()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, max(20001, min(low, 32768)))
        if not port_in_use(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # crowded machine: any port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def check_writable_folder(path: str | Path, what: str, fix: str) -> Path:
    """`path`, resolved, if it is (or can be made) a folder this process can write in; else a
    WorkshopError with `fix`.

    Nothing is created: the nearest folder that exists is tried with a temporary file (which
    also catches a read-only file system as root, which permission bits would not), so a bad
    location is refused before any data is prepared or any process starts, not halfway through.
    """
    path = Path(path).expanduser().resolve()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise WorkshopError(f"Cannot use {path} as {what}: {probe} is a file, not a folder.", fix)
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise WorkshopError(f"Cannot write {what} {path}: {probe} is not writable ({exc.strerror or exc}).", fix) from None
    return path


CHECKPOINT_IN_USE_FIX = ("wait for that job to end (or stop it), or give this run another folder: --checkpoint-dir DIR "
                         "(checkpoint_dir= in Python). A job that was killed holds nothing: its lock went with it.")
WORKDIR_IN_USE_FIX = ("wait for that job to end (or stop it), or leave workdir unset (each run then gets a new folder "
                      "of its own) or pass another one.")
LOG_ROOM_PER_HOST = 512 * 1024  # room for a host's logs, an estimate: a lab's 2-step run writes about 20 KB per host
# sm_train.sh's and the ranks' words for a full disk (an OSError's, and torch's, which wraps it)
_DISK_FULL = re.compile(r"No space left on device|\[Errno 28\]|Disk quota exceeded|\[Errno 122\]")


def run_folder_bytes(source_dir: Path, hosts: int, distributed: Any = None, container: bool = True) -> int:
    """What a run folder needs before any rank writes (see `LocalCluster.space_needed`)."""
    code = size_of(source_dir)
    drivers = 0
    if container:
        from sagemaker.train.constants import SM_DRIVERS_LOCAL_PATH

        drivers = size_of(Path(SM_DRIVERS_LOCAL_PATH))
        if distributed is not None and getattr(distributed, "driver_dir", None):
            drivers += size_of(Path(distributed.driver_dir))
    return drivers + hosts * (code + drivers + LOG_ROOM_PER_HOST)


def check_checkpoint_space(store: Path) -> None:
    """Refuse a checkpoint folder whose disk cannot take one more checkpoint as big as the biggest one
    it holds (a save writes the new one whole beside the old before either goes). Half-written `.tmp`
    files and `.partial` folders count as free: the next save replaces them. A folder with no
    checkpoint yet passes: its checkpoints' size is not known before the first."""
    if not store.is_dir():
        return
    sizes, stale = [0], 0
    for entry in store.iterdir():
        if entry.name.startswith("."):
            continue
        if entry.name.endswith((".tmp", ".partial")):
            stale += size_of(entry)
        else:
            sizes.append(size_of(entry))
    need = max(sizes)
    if free_bytes(store) + stale < need:
        raise WorkshopError(
            f"Not enough disk space for the next checkpoint in {store}: {megabytes(free_bytes(store) + stale)} free "
            f"(half-written files included), and a checkpoint there takes {megabytes(need)} (the biggest it holds).",
            "free space on that disk, or pass --checkpoint-dir a folder on a disk with room (copy the checkpoint "
            "there to resume from it).",
        )


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


def _usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup's CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def _available_memory_mb() -> int:
    """Memory a run can have without swapping or the OOM killer: the system's, capped by a cgroup's."""
    available = psutil.virtual_memory().available
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            available = min(available, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(0, available // 2**20)


def check_cluster_size(hosts: int, procs_per_host: int) -> None:
    """Refuse a cluster of no hosts, or hosts of no processes (before anything else about a run is checked)."""
    if not isinstance(hosts, int) or hosts < 1:
        raise WorkshopError(f"hosts must be a whole number of at least 1, got {hosts!r}.", "use --hosts 1 or more.")
    if not isinstance(procs_per_host, int) or procs_per_host < 1:
        raise WorkshopError(
            f"procs_per_host must be a whole number of at least 1, got {procs_per_host!r}.",
            "use --procs-per-host 1 or more.",
        )


def check_machine_fits(hosts: int, procs_per_host: int, allow_oversubscription: bool = False) -> None:
    """Refuse (WorkshopError) or warn (OversubscriptionWarning) about a cluster this machine cannot carry.

    Every simulated host runs its launchers (sm_train.sh, the driver, torchrun: about
    HOST_MEMORY_MB) and `procs_per_host` training processes (about RANK_MEMORY_MB each, the labs'
    PyTorch ranks measured at 300 MB), all on this machine's cores. So:

    - more than CORES_WARN_RATIO (4) training processes per core: a warning. Each gets a quarter
      of a core or less; starting alone (importing PyTorch costs a few CPU-seconds per process)
      takes minutes, and timeouts that real instances never meet (Horovod's Gloo timeout, a
      rendezvous) can fail the job.
    - more than CORES_REFUSE_RATIO (16) per core, or more memory than is available: refused.
      Such a run spends minutes just starting, looks hung, and past the memory the kernel's OOM
      killer sends SIGKILL to ranks, which reads as the job's own failure.
    `allow_oversubscription` (or OVERSUBSCRIBE_ENV=1, for the command line) turns the refusal
    into the warning: for scripts far lighter than training (a test's probe), or to see it happen.
    """
    world, cores = hosts * procs_per_host, _usable_cores()
    need_mb = hosts * HOST_MEMORY_MB + world * RANK_MEMORY_MB
    have_mb = _available_memory_mb()
    shape = f"{hosts} host(s) x {procs_per_host} process(es) = {world} training processes"
    per_core = f"{world / cores:.1f} per core on {cores} core(s)"
    memory = (f"about {need_mb / 1024:.1f} GiB of memory ({HOST_MEMORY_MB} MB per host, {RANK_MEMORY_MB} MB per "
              f"process) with {have_mb / 1024:.1f} GiB available")
    too_many, too_big = world > CORES_REFUSE_RATIO * cores, need_mb > have_mb
    if (too_many or too_big) and not allow_oversubscription:
        reasons = ([f"{per_core}, more than {CORES_REFUSE_RATIO} per core"] if too_many else []) + ([memory] if too_big else [])
        fits = max(1, min(CORES_REFUSE_RATIO * cores // procs_per_host,
                          have_mb // (HOST_MEMORY_MB + procs_per_host * RANK_MEMORY_MB)))
        raise WorkshopError(
            f"This machine cannot carry {shape}: " + "; ".join(reasons) + ". Starting them would take "
            "minutes, look hung, and could end with the kernel killing ranks for memory.",
            f"use fewer hosts (at most {fits} of {procs_per_host} process(es) here), or, for a script much "
            f"lighter than training, pass allow_oversubscription=True (on the command line: {OVERSUBSCRIBE_ENV}=1).",
        )
    if world > CORES_WARN_RATIO * cores or too_big:
        warnings.warn(
            f"{shape}: {per_core}" + (f", {memory}" if too_big else "") + ". More than "
            f"{CORES_WARN_RATIO} per core is slow to start and to train, and timeouts that real instances never "
            "meet may fail the run.",
            OversubscriptionWarning,
            stacklevel=3,
        )


def choose_runtime(requested: str = "auto") -> tuple[str, str]:
    """The runtime a cluster asking for `requested` gets here ("container" or "process"), and why."""
    if requested == "process":
        return "process", "asked for"
    ok, why = hostns.available()
    if requested == "container" and not ok:
        raise WorkshopError(f"The container runtime cannot run here: {why}.", "use runtime='process' (or 'auto').")
    return ("container", why) if ok else ("process", why)


class LocalCluster:
    """N simulated SageMaker hosts on this machine. See the module docstring."""

    def __init__(
        self,
        source_dir: str | Path,
        entry_script: str = "train.py",
        *,
        hosts: int = 2,
        procs_per_host: int = 1,
        distributed: Any = None,
        name: str = "local-job",
        workdir: str | Path | None = None,
        num_cpus: int | None = None,
        master_port: int | None = None,
        stop_grace_s: float = 3.0,
        extra_env: dict[str, str] | None = None,
        echo: bool = True,
        verbose: bool = True,
        runtime: str = "auto",
        internet: bool = False,
        start_skew_s: float | Sequence[float] = 0.0,
        sm_drivers_dir: str | Path | None = None,
        container_command: Sequence[str] | None = None,
        instance_type: str | None = None,
        runs_dir: str | Path | None = None,
        allow_oversubscription: bool | None = None,
        stall_s: float | None = STALL_S,
        prepare_host: Callable[[HostSandbox], None] | None = None,
    ):
        """`workdir` is the run's own folder; without it each run gets a new folder under
        `runs_dir` (default: the checkout's `runs/`). Either must be writable: that is checked
        here, before anything starts, so a read-only checkout is told where to point instead.

        `runtime`: "container" (needs Linux namespaces), "process", or "auto" (container
        where possible, else process, said so). Container runtime only: `internet` gives the
        hosts this machine's network (a job with a route out) instead of a private one with
        nothing but loopback; `start_skew_s` delays each host's start (a number: host h starts
        h x skew / (hosts - 1) seconds after algo-1, so the last host is `skew` late; or one
        delay per host); `sm_drivers_dir` is the job's `sm_drivers` channel as uploaded
        (default: built here by the installed SDK, as `ModelTrainer` builds it);
        `container_command` the image entrypoint and arguments (default: the SDK's, which
        runs `sm_train.sh`); `instance_type` what the hosts say they are (default "local"), which
        also sizes the thread pools that wait (`contract.thread_pool_env`). The container runtime
        mounts what the service lays out in `/opt/ml/input` read-only, but for what the SDK's own
        scripts write (`hostns.mount_input_read_only`); `prepare_host`, if given,
        is called with each host's sandbox once it is laid out and before the host starts, to lay it
        out otherwise (the fake SageMaker's framework-image path does).

        A cluster far bigger than this machine is refused, and one bigger than its cores is
        warned about (`check_machine_fits` has the thresholds); `allow_oversubscription=True`
        (default: the WORKSHOP_ALLOW_OVERSUBSCRIPTION variable) turns the refusal into the warning.

        `echo`: print what the job does; with `verbose`, every line of every rank as it comes (tagged
        `[host/rank]`), else one live progress display per job (`workshop.runtime.progress`) and the
        logs' path. The logs are in the run folder either way, and a failure is reported either way.

        `stall_s`: when no rank (nor launcher) has written a line for this many seconds, the job is
        said to stall, with each rank's last line and the rank that stopped answering where its
        process shows it (see `_Run._watch_stall`); said again every `stall_s` while it lasts, and
        when it ends. In the display (or the streamed lines) with `echo`, and in `logs/cluster.log`
        always. None or 0: never said.
        """
        check_cluster_size(hosts, procs_per_host)
        if allow_oversubscription is None:
            allow_oversubscription = os.environ.get(OVERSUBSCRIBE_ENV, "") not in ("", "0")
        if stall_s is not None and (isinstance(stall_s, bool) or not isinstance(stall_s, (int, float))
                                    or not stall_s >= 0):  # NaN too
            raise WorkshopError(f"stall_s must be a number of seconds, 0 or more, got {stall_s!r}.",
                                "pass e.g. stall_s=120 (CLI: --stall-after 120), or 0 to never say a job stalls.")
        self.stall_s = float(stall_s) if stall_s else None
        check_machine_fits(hosts, procs_per_host, allow_oversubscription)
        self.source_dir = Path(source_dir).resolve()
        self.entry_script = entry_script
        if not (self.source_dir / entry_script).is_file():
            raise WorkshopError(
                f"No entry script {entry_script!r} in {self.source_dir}.",
                "point source_dir at a lab's code/ folder.",
            )
        self.hosts = hosts
        self.procs_per_host = procs_per_host
        self.distributed = distributed
        self.name = re.sub(r"[^A-Za-z0-9-]+", "-", name).strip("-") or "local-job"
        self.workdir = Path(workdir) if workdir else None
        self.runs_dir = Path(runs_dir) if runs_dir else DEFAULT_RUNS_DIR
        check_writable_folder(
            self.workdir or self.runs_dir, "the run folder",
            "run it with --workdir DIR, a folder you can write (its runs go to DIR/runs); in Python "
            "pass workdir= (this run's folder) or runs_dir= (where runs go).",
        )
        cpus = os.cpu_count() or 1
        # Each simulated host gets its share of this machine, so that scripts sizing their
        # thread pools from SM_NUM_CPUS do not oversubscribe the cores.
        self.num_cpus = num_cpus or max(1, cpus // hosts)
        taken = [p for p in self._job_ports(master_port) if port_in_use(p)] if master_port is not None else []
        if taken:
            raise WorkshopError(
                f"Port {', '.join(map(str, taken))} on 127.0.0.1 is already in use"
                + (f" (this job needs {master_port} and the ports its launcher derives from it)." if len(self._job_ports(master_port)) > 1 else "."),
                "leave master_port unset (a free port is picked) or stop what holds it "
                f"(`ss -ltnp 'sport = :{taken[0]}'` shows it).",
            )
        self.master_port = master_port
        self.stop_grace_s = stop_grace_s
        self.extra_env = dict(extra_env or {})
        self.prepare_host = prepare_host
        self.echo = echo
        self.verbose = verbose
        if runtime not in RUNTIMES:
            raise WorkshopError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}.",
                                "leave it at 'auto' (the container runtime where Linux allows it).")
        self.runtime = runtime
        self.internet = bool(internet)
        if isinstance(start_skew_s, (int, float)):
            if start_skew_s < 0:
                raise WorkshopError(f"start_skew_s must be 0 or more, got {start_skew_s!r}.", "pass e.g. start_skew_s=5.")
            self.start_delays = [start_skew_s * h / (hosts - 1) if hosts > 1 else 0.0 for h in range(hosts)]
        else:
            delays = [float(d) for d in start_skew_s]
            if len(delays) != hosts or any(d < 0 for d in delays):
                raise WorkshopError(f"start_skew_s as a list needs one delay of 0 or more per host ({hosts}), got {delays}.",
                                    "pass one number, or one delay per host.")
            self.start_delays = delays
        self.sm_drivers_dir = Path(sm_drivers_dir).resolve() if sm_drivers_dir else None
        self.container_command = list(container_command) if container_command else None  # None: the SDK's
        self.instance_type = instance_type

    def _job_ports(self, master_port: int) -> list[int]:
        """The master port, and for launchers that derive more ports from it (lab 1's
        parameter-server driver: `job_ports(base, hosts)`), those too."""
        job_ports = getattr(self.distributed, "job_ports", None)
        return list(job_ports(master_port, self.hosts)) if callable(job_ports) else [master_port]

    def _pick_port(self) -> int:
        for _ in range(50):
            port = _free_port()
            if not any(port_in_use(p) for p in self._job_ports(port)):
                return port
        raise WorkshopError("Found no free block of ports on 127.0.0.1 for this job.", "free some ports, or pass master_port.")

    @property
    def world_size(self) -> int:
        return self.hosts * self.procs_per_host

    def _driver(self) -> tuple[Path, dict[str, Any] | None]:
        """The driver script SageMaker would run for this `distributed` config."""
        if self.distributed is None:
            from sagemaker.train.distributed import Torchrun

            drivers = Path(Torchrun().driver_dir)
            return drivers / "basic_script_driver.py", None
        return Path(self.distributed.driver_dir) / self.distributed.driver_script, self.distributed.model_dump()

    def _check_channels(self, channels: dict[str, str | Path]) -> dict[str, Path]:
        checked = {}
        for name, path in channels.items():
            if name in RESERVED_CHANNELS:
                raise WorkshopError(
                    f"Channel name {name!r} is reserved by SageMaker SDK v3 (it carries the code and drivers).",
                    "rename the channel.",
                )
            if not re.fullmatch(r"[A-Za-z0-9\.\-_]+", name):
                raise WorkshopError(f"Invalid channel name {name!r}.", "use letters, digits, '.', '-', '_'.")
            p = Path(path)
            if not p.is_dir():
                raise WorkshopError(
                    f"The {name!r} data channel points to {p}, which is not a folder.",
                    "prepare the data first: `python -m workshop.datasets mnist data/mnist` "
                    "(or workshop.datasets.mnist.prepare_mnist in Python).",
                )
            checked[name] = p.resolve()
        return checked

    @staticmethod
    def checkpoint_store(checkpoint_dir: str | Path | None) -> Path | None:
        """`checkpoint_dir` resolved, once checked writable (nothing is made): `run` checks it, and
        callers that prepare data first can check it before that (see `workshop.runner`)."""
        if not checkpoint_dir:
            return None
        return check_writable_folder(
            checkpoint_dir, "the checkpoint folder",
            "pass --checkpoint-dir (checkpoint_dir= in Python) a folder you can write.",
        )

    @classmethod
    def checkpoint_lock(cls, checkpoint_dir: str | Path | None) -> contextlib.AbstractContextManager:
        """`with cluster.checkpoint_lock(checkpoint_dir):` `checkpoint_dir` is checked (`checkpoint_store`) and
        this job's until the block ends; another job using it is refused, named (nothing to lock without one).
        For callers with work to do before `run` (preparing the data), so that the refusal comes first."""
        store = cls.checkpoint_store(checkpoint_dir)
        if store is None:
            return contextlib.nullcontext()
        return FolderLock(store, "the checkpoint folder", CHECKPOINT_IN_USE_FIX)

    def resolve_runtime(self) -> tuple[str, str]:
        """("container" or "process", why), as `run` will use it."""
        return choose_runtime(self.runtime)

    def space_needed(self) -> int:
        """Bytes the run folder needs before any rank writes: each host's copy of the code (and, in the
        container runtime, of the SDK's drivers, plus the job's own copy) and room for its logs."""
        return run_folder_bytes(self.source_dir, self.hosts, self.distributed,
                                container=self.resolve_runtime()[0] == "container")

    def run(
        self,
        hyperparameters: dict[str, Any] | None = None,
        channels: dict[str, str | Path] | None = None,
        *,
        checkpoint_dir: str | Path | None = None,
        timeout_s: float | None = None,
        check: bool = True,
    ) -> ClusterResult:
        """Run the job on every simulated host; return (or, with check, raise on) the result.

        Each host has a checkpoint folder of its own in its sandbox (`/opt/ml/checkpoints`,
        SM_CHECKPOINT_DIR), as on SageMaker, where no file system is shared between hosts.
        `checkpoint_dir` stands in for the job's checkpoint S3 URI, and is synced with the hosts'
        folders as SageMaker syncs S3 (`workshop.runtime.checkpoint_sync`): each host starts with its
        files; what a host writes or deletes reaches it within a second while the job runs, and what
        is left when the hosts are gone after that; no host ever sees another host's files. So a run
        that is killed any way at all (its notebook's kernel with it, by SIGKILL) loses at most its
        last second, and a second run with the same folder resumes from it, from every host's files
        together. A rank restarted inside the run (torchrun --max-restarts) finds on its host only what
        that host wrote or downloaded: lab 3's rank 0 loads its checkpoint and sends it to the others;
        lab 4's ranks each keep their own shards and a copy of the checkpoint's index. Without
        `checkpoint_dir` nothing is synced and the hosts' folders stay in the run folder.

        One folder, one job (`workshop.runtime.folders`): the run folder is made here under a name no
        other run has; a `workdir` or `checkpoint_dir` another job is using is refused, naming it. A disk
        without the room the run folder's copies (or the next checkpoint) need is refused before
        anything is written, and a disk that fills up during the run stops it with one line naming the
        folder, after removing what was left half-written.
        """
        hyperparameters = dict(hyperparameters or {})
        chans = self._check_channels(channels or {})
        store = self.checkpoint_store(checkpoint_dir)
        space_fix = ("free space on that disk, or run with --workdir DIR on a disk with room (in Python, "
                     "workdir= or runs_dir=).")
        with contextlib.ExitStack() as held:
            if store is not None:
                held.enter_context(FolderLock(store, "the checkpoint folder", CHECKPOINT_IN_USE_FIX))
                check_checkpoint_space(store)
            if self.workdir is not None:
                held.enter_context(FolderLock(self.workdir, "the run folder", WORKDIR_IN_USE_FIX))
            parent = self.workdir if self.workdir is not None else self.runs_dir
            copies = self.hosts * size_of(store) if store is not None else 0  # each host downloads the store
            check_free_space(parent, self.space_needed() + copies,
                             f"the run folder (the code and drivers each of {self.hosts} host(s) gets, "
                             + ("its copy of the checkpoint folder, " if copies else "") + "and its logs)",
                             space_fix)
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            if self.workdir is None:  # made now, under a name no other run can take
                workdir = new_folder(self.runs_dir, f"{self.name}-{stamp}")
                job_name = workdir.name
            else:
                workdir, job_name = self.workdir.resolve(), f"{self.name}-{stamp}-{uuid.uuid4().hex[:4]}"
            try:
                result = self._run(hyperparameters, chans, store, workdir, job_name, timeout_s)
            except (OSError, shutil.Error) as exc:  # setting up the run folder: no host has started (see _Run)
                if not is_disk_full(exc):
                    raise
                if self.workdir is None:  # nothing half-made is left to hold the space
                    shutil.rmtree(workdir, ignore_errors=True)
                raise WorkshopError(
                    disk_full_message(workdir, "setting up the run folder (the hosts' copies of the code)",
                                      self.space_needed())
                    + (" The run folder was removed." if self.workdir is None else ""),
                    space_fix,
                ) from None
        return result.check() if check else result

    def _run(self, hyperparameters: dict[str, Any], chans: dict[str, Path], store: Path | None, workdir: Path,
             job_name: str, timeout_s: float | None) -> ClusterResult:
        """`run` in its folder, with its folders locked."""
        if store is not None:
            store.mkdir(parents=True, exist_ok=True)
        runtime, why = self.resolve_runtime()
        container = runtime == "container"
        driver, distributed = self._driver()
        if container:
            port = SAGEMAKER_MASTER_PORT
        else:
            port = self.master_port or self._pick_port()
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        cluster_id = uuid.uuid4().hex
        names = host_names(self.hosts)
        instance_type = self.instance_type or "local"

        drivers_dir = None
        if container:
            drivers_dir = self.sm_drivers_dir
            if drivers_dir is None:  # as ModelTrainer builds the sm_drivers channel
                drivers_dir = write_sm_drivers(workdir / "sm_drivers", self.source_dir, self.entry_script, self.distributed)
            ns_dir = workdir / "hostns"
            ns_dir.mkdir(parents=True, exist_ok=True)
            hosts_file = ns_dir / "hosts"
            hosts_file.write_text(hostns.hosts_file_text(names))
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
            share = max(1, len(cpus) // self.hosts)

        hosts: list[HostResult] = []
        envs: list[dict[str, str]] = []
        commands: list[list[str]] = []
        specs: list[tuple[Path, hostns.HostSpec]] = []  # container runtime: written once the holder runs
        for host_rank, host in enumerate(names):
            sandbox = HostSandbox(workdir / host)
            if sandbox.checkpoint_dir.is_symlink():  # a run folder of an older version, used again: made afresh
                sandbox.checkpoint_dir.unlink()
            sandbox.create(
                current_host=host, hosts=names, channels=chans, hyperparameters=hyperparameters,
                source_dir=self.source_dir, instance_type=instance_type,
                sm_drivers=drivers_dir,
            )
            if self.prepare_host is not None:
                self.prepare_host(sandbox)
            if container:
                env = container_process_env(job_name)
            else:
                env = base_process_env()
                env.update(
                    sandbox.environment(
                        current_host=host, hosts=names, channels=list(chans), hyperparameters=hyperparameters,
                        entry_script=self.entry_script, distributed=distributed, driver_dir=driver.parent,
                        master_port=port, num_cpus=self.num_cpus, job_name=job_name,
                    )
                )
            env.update(
                {
                    MARKER: cluster_id,
                    "PYTHONUNBUFFERED": "1",
                    # torchrun reads its flags from PET_* too: --tee 3 tags each worker line
                    # with its local rank, without changing the command line the driver builds.
                    "PET_TEE": "3",
                    # The drivers call `torchrun`/`mpirun` from PATH and `python` as sys.executable.
                    "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
                }
            )
            if not container:
                # With one host the SDK's driver passes no --master_port and torchrun would take
                # its default 29500, shared by every local job on this machine's network.
                env.update({"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)})
            elif self.internet:
                env.update(hostns.proxy_env(names))
            # Thread pools sized as on the host's instance, not its share of this machine's cores
            # (the caller's own setting, and the job's extra_env below, win).
            for key, value in thread_pool_env(instance_type, share if container else _usable_cores()).items():
                env.setdefault(key, value)
            env.update(self.extra_env)
            envs.append(env)
            hosts.append(HostResult(host, host_rank, sandbox, workdir / "logs" / f"{host}.log", checkpoint_store=store))
            if container:
                mine = [cpus[(host_rank * share + i) % len(cpus)] for i in range(share)]
                spec = hostns.HostSpec(
                    name=host, hostname=hostns.instance_hostname(host), sandbox=str(sandbox.root), hosts_file=str(hosts_file),
                    command=self.container_command or container_command(), holder_pid=0,
                    stash=str(ns_dir / f"opt-{host}"), start_delay_s=self.start_delays[host_rank], cpus=mine,
                    pythonpath=env.get("PYTHONPATH"),  # /opt/ml/checkpoints: the sandbox's own, synced below
                )
                specs.append((ns_dir / f"{host}.json", spec))
                envs[-1] = hostns.with_package(env)  # the entry starts without `site`; the spec puts it back
                commands.append(hostns.entry_command("host", str(ns_dir / f"{host}.json")))
            else:
                commands.append([sys.executable, "-m", "workshop.runtime.run_driver", str(driver)])

        # Each host's checkpoint folder starts with the store's files, as an instance's starts with the
        # checkpoint S3 URI's, and is synced with it while the job runs (`workshop.runtime.checkpoint_sync`).
        sync = None
        if store is not None:
            sync = CheckpointSync(store, {h.name: h.sandbox.checkpoint_dir for h in hosts})
            sync.download()

        launcher = self.distributed.__class__.__name__ if self.distributed is not None else "no launcher"
        if container:
            skew = max(self.start_delays)
            where = (
                f"container runtime: sm_train.sh -> {driver.name} on hosts {names[0]}..{names[-1]} "
                f"({hostns.host_address(names[0])}..{hostns.host_address(names[-1])}), master {names[0]}:{port}, "
                + ("a private network with a way out (internet through an HTTPS proxy)" if self.internet
                   else "a private network (no internet)")
                + (f", hosts start up to {skew:g} s apart" if skew else "")
            )
        else:
            where = (f"process runtime ({why}): {driver.name} with the master on 127.0.0.1:{port}, "
                     "this machine's network, no sm_train.sh")
        self._say(
            f"Local cluster: {self.hosts} host(s) x {self.procs_per_host} process(es) = world size "
            f"{self.world_size}; {launcher}; {where}; run folder {workdir}"
            + (f"; each host's checkpoint folder synced with {store}" if store is not None else "")
        )
        holder = None
        try:
            if container:
                holder = hostns.NamespaceHolder(proxy=self.internet)
                for path, spec in specs:  # the holder's pid is known only now
                    spec.holder_pid = holder.pid
                    spec.write(path)
            display = None
            if self.echo and not self.verbose:
                unit, total = progress_total(hyperparameters)
                display = JobProgress(self.name, unit, total, self.hosts,
                                      max_restarts=int(getattr(self.distributed, "max_restarts", 0) or 0))
            runner = _Run(self, hosts, envs, commands, workdir, cluster_id, timeout_s, container, display, sync)
            if sync is not None:
                sync.start()
            try:
                returncode, failure, lines = runner.run()
            except Terminated:  # SIGTERM: the command line says so itself
                raise
            except KeyboardInterrupt:  # Ctrl-C, a notebook's interrupt: every process is stopped by now
                if display is not None:
                    display.close(stopped=True)
                raise Stopped(f"stopped: {runner.stopped_processes} processes ended; "
                              f"logs in {workdir / 'logs'}") from None
            finally:
                if display is not None:
                    display.close()
        finally:
            if holder is not None:
                holder.close()
            if sync is not None:
                with DeferredInterrupt():  # the hosts are gone: what they left goes to the store
                    sync.stop()
        if sync is not None and sync.failure is not None and returncode == 0:  # in its last look
            returncode, failure = 1, f"{sync.failure}\n  Fix: {DISK_FULL_FIX}"
        result = ClusterResult(
            job_name=job_name, returncode=returncode, hosts=hosts, records=metrics.parse_lines(lines),
            wall_time_s=runner.wall_time_s, workdir=workdir, log_path=workdir / "logs" / "cluster.log",
            failure=failure, world_size=self.world_size, lines=lines, runtime=runtime,
        )
        status = "succeeded" if result.ok else f"FAILED (exit status {returncode})"
        self._say(f"Local job {job_name} {status} in {result.wall_time_s:.1f} s. Logs: {result.log_path}")
        return result

    def _say(self, text: str) -> None:
        if self.echo:
            print(text, flush=True)


class _Run:
    """One execution: start the hosts, stream their lines, stop everything, report."""

    def __init__(self, cluster: LocalCluster, hosts, envs, commands, workdir, cluster_id, timeout_s, container,
                 display: JobProgress | None = None, sync: CheckpointSync | None = None):
        self.c = cluster
        self.sync = sync  # the hosts' checkpoint folders, synced with the run's checkpoint_dir (if it has one)
        self.display = display  # the progress display that stands in for the lines, if any
        self.hosts: list[HostResult] = hosts
        self.envs = envs
        self.commands = commands
        self.workdir = workdir
        self.cluster_id = cluster_id
        self.timeout_s = timeout_s
        self.lines: queue.Queue = queue.Queue()
        self.output_ended: set[str] = set()  # hosts whose output has ended: they are exiting
        self.procs: list[subprocess.Popen] = []
        self.readers: list[threading.Thread] = []
        # The last lines of every (host, rank) stream, for the failure report.
        self.tails: dict[tuple[str, str], deque] = {}
        self.all_lines: list[str] = []
        self.wall_time_s = 0.0
        self.container = container  # sm_train.sh's set-up comes first in each host's output
        self.driver_started: dict[str, float] = {}  # host -> seconds after the start when its driver ran
        self._setup_noted: set[str] = set()  # hosts whose first set-up line was echoed
        self.t0 = 0.0  # set when run() starts the hosts
        # When the stop began: lines before it (and hosts that had ended by then) are the job's own
        # doing; what follows is the stop's.
        self.stop_line: int | None = None
        self.ended_before_stop: set[int] = set()
        # The stall watch (`_watch_stall`): when each stream, and the job, last wrote a line.
        self.last_line_at: dict[tuple[str, str], float] = {}
        self.last_line_any = 0.0
        self.stall: _Stall | None = None  # the last stall (under way while its `ended` is None)
        self.failed_stalled = False  # the job failed (or ran out of time) during a stall, or just after one
        self._cpu_sample: tuple[float, dict[tuple[str, str], float]] | None = None  # during a silence
        self.at_failure: _Silence | None = None  # who was answering when the job failed or ran out of time
        self.disk_full: str | None = None  # the line that says a log could not be written for a full disk
        self.log_errors: set[Path] = set()  # logs given up for another error (said once each)
        self.started_at = time.time()  # what the run wrote is newer than this
        self.stopped_processes = 0  # how many of the job's processes the stop ended (`_stop_all`)

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
                segments = self._segments(host, text)
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

    def _disk_full_failure(self, failure: str | None) -> str | None:
        """A failure that a full disk caused, as one line naming the folder (and what the write that failed
        needed), once what the run left half-written is removed; else `failure` as it was. A rank's own
        word for it comes first; else a log that could not be written (which may have stopped the job
        while a rank was still writing its checkpoint)."""
        said = next((line for line in self.all_lines if _DISK_FULL.search(line)), None)
        if said is None and self.disk_full is None:
            return failure
        stores = [h.checkpoint_store for h in self.hosts[:1] if h.checkpoint_store is not None]
        folders = stores + [f for h in self.hosts for f in (h.sandbox.checkpoint_dir, h.model_dir, h.output_data_dir)]
        sizes = {}
        for folder in folders:  # sized before they go: the write that failed needed more than that
            for path in folder.iterdir() if folder.is_dir() else ():
                with contextlib.suppress(OSError):
                    if path.name.endswith((".tmp", ".partial")) and path.lstat().st_mtime >= self.started_at - 1:
                        sizes[path] = size_of(path)
        gone = remove_half_written(folders, self.started_at)
        written = f"{', '.join(p.name for p in gone)} ({megabytes(sum(sizes.get(p, 0) for p in gone))})"
        if said is None:
            line = self.disk_full + (f" What the run left half-written went: {written}." if gone else "")
            return f"{line}\n  Fix: {DISK_FULL_FIX}"
        who = said.split("] ", 1)[0].lstrip("[")
        host, _, rank = who.partition("/")
        who = f"Rank {rank} on {host}" if rank else f"Host {host}"
        where = gone[0].parent.resolve() if gone else (stores[0] if stores else self.workdir)
        what = "the checkpoint folder" if stores and where == stores[0] else f"in the run folder {self.workdir}"
        line = (f"{who} ran out of disk space (No space left on device) writing to {where} ({what}): "
                f"{megabytes(free_bytes(where))} free there now")
        if gone:
            line += (f", and the write that failed needed more than {megabytes(sum(sizes.get(p, 0) for p in gone))} "
                     f"(what it had written of {', '.join(p.name for p in gone)}, now removed)")
        return f"{line}.\n  Fix: {DISK_FULL_FIX}"

    def _segments(self, host: HostResult, text: str) -> list[tuple[str, str]]:
        """`"a[default0]:b[default1]:c"` -> `[("", "a"), ("0", "b"), ("1", "c")]` (global ranks)."""
        out: list[tuple[str, str]] = []
        rank, pos = "", 0
        for m in _RANK_TAG.finditer(text):
            if m.start() > pos or out or rank:
                out.append((rank, text[pos : m.start()]))
            if m["local"] is not None:
                rank = str(host.host_rank * self.c.procs_per_host + int(m["local"]))
            elif m["tf"] is not None:
                rank = str(host.host_rank)
            else:
                rank = m["mpi"] if m["mpi"] is not None else m["hvd"]
            pos = m.end()
        out.append((rank, text[pos:]))
        return [(r, t) for r, t in out[:-1] if t] + [out[-1]]

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
            self.tails.setdefault((host, rank), deque(maxlen=400)).append((len(self.all_lines), line))
            self.all_lines.append(line)
            self.last_line_at[(host, rank)] = self.last_line_any = time.monotonic()
            self._combined = self._write_log(self._combined, self.workdir / "logs" / "cluster.log", line)
            if not rank and host not in self.driver_started and _DRIVER_START.match(line.split("] ", 1)[-1]):
                self.driver_started[host] = time.monotonic() - self.t0
            if self.display is not None:
                self.display.feed(rank, line)
            elif self.c.echo and self._show(host, rank, line):
                print(line, flush=True)

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

    def run(self) -> tuple[int, str | None, list[str]]:
        t0 = self.t0 = time.monotonic()
        returncode, failure, failed_host = 0, None, None
        with open(self.workdir / "logs" / "cluster.log", "w", encoding="utf-8", buffering=1) as combined:
            self._combined = combined
            try:
                self._start()
                self.last_line_any = time.monotonic()  # the silence is counted from the start
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
                        self._note_failure()
                        failed_host, returncode = failed[0], codes[failed[0]]
                        settle = time.monotonic() + SETTLE_S  # the others' launchers record their ends
                        while time.monotonic() < settle and any(p.poll() is None for p in self.procs):
                            self._drain(0.05)
                        break
                    if all(code == 0 for code in codes):
                        break
                    if self.timeout_s and time.monotonic() - t0 > self.timeout_s:
                        returncode = 124
                        failure = f"The job ran past its time limit of {self.timeout_s:g} s and was stopped."
                        self._note_failure()
                        if self.failed_stalled or self.at_failure.named():
                            failure += "\n" + "\n".join(self._silence_lines(
                                self.at_failure, f"No rank had written a line for {self.at_failure.quiet_s:.0f} s."))
                        break
                    if self.disk_full is not None:  # a log could not be written: the ranks' writes fail next
                        returncode = 1
                        break
                    if self.sync is not None and self.sync.failure is not None:  # the checkpoint folder is full
                        self.disk_full = f"{self.sync.failure} The job was stopped."
                        returncode = 1
                        break
                    self._watch_stall()
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
            failure = self._describe_failure(failed_host, returncode)
        if returncode not in (0, 124):
            failure = self._disk_full_failure(failure)
        return returncode, failure, self.all_lines

    def _describe_failure(self, i: int, code: int) -> str:
        """The failure report: which rank failed first and how, then what followed from it.

        From the launchers' own records of how their ranks ended (`_rank_ends`), not from
        whichever traceback printed first: a rank killed by a signal prints none, while the
        peers it leaves behind print lost-connection tracebacks, and torchrun answers a rank's
        argparse error with a ChildFailedError traceback of its own. The first line names the
        rank, its host and how it ended ("Rank 1 on algo-2 was killed by SIGKILL (signal 9)."),
        its own last lines or traceback follow, and the peers' failures come after as what they
        are, consequences ("Then: rank 0 on algo-1 lost its peer ...").
        """
        ends = self._rank_ends()
        if not any(e.code is not None for e in ends):  # no launcher recorded a rank (basic script driver)
            return self._describe_host_failure(i, code)
        before_stop = [e for e in ends if self.stop_line is None or e.seen < self.stop_line] or ends
        # A launcher's record first (it also knows a signal); a rank that lost its peer last.
        root, *rest = sorted(before_stop, key=lambda e: (e.consequence, e.code is None, e.seen))
        error = _last_error(root.lines) if root.code is None or root.code >= 0 else ""
        first = f"{root.who[0].upper()}{root.who[1:]} {'lost its peer and ' if root.consequence else ''}{root.how}"
        message = self._waited_for(root, error) + [first + (f": {error}" if error else ".")]
        if root.code == -signal.SIGKILL:
            message.append(_sigkill_cause(root.lines))
        j = next(k for k, h in enumerate(self.hosts) if h.name == root.host)
        if j in self.ended_before_stop and self.procs[j].returncode:
            message.append(f"Host {root.host} failed ({_status(self.procs[j].returncode)}); the other hosts were stopped.")
        else:
            message.append(f"Host {self.hosts[i].name} failed first ({_status(code)}); the other hosts were stopped.")
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
            message.append(f"Then: {end.who} {how}" + (f": {said}" if said else "."))
        if len(rest) > 8:
            message.append(f"Then: {len(rest) - 8} more rank(s) failed; see the logs.")
        return "\n".join(message)

    # ------------------------------------------------------------------ the stall watch

    def _watch_stall(self) -> None:
        """Say when no line has come from any rank or launcher for `stall_s`, again every `stall_s`
        while none comes, and once one does.

        Who stopped answering is read from the processes (`_silence`): one stopped (state T:
        SIGSTOP, a debugger) cannot answer; one that keeps a CPU busy while every other rank sits
        idle is the one they wait for. The CPU is sampled once the silence is half `stall_s`
        long, and compared at each note."""
        if not self.c.stall_s:
            return
        now = time.monotonic()
        if self.stall is not None and self.stall.ended is None and self.last_line_any > self.stall.since:
            self._stall_over()
        quiet = now - self.last_line_any
        if quiet < self.c.stall_s / 2:
            return
        if self._cpu_sample is None or self._cpu_sample[0] < self.last_line_any:
            self._silence()  # the first CPU sample of this silence
        if self.stall is not None and self.stall.ended is None and now - self.stall.said < self.c.stall_s:
            return  # said not long ago
        if quiet >= self.c.stall_s:
            if self.stall is None or self.stall.ended is not None:
                self.stall = _Stall(since=self.last_line_any, said=now)
            silence = self.stall.silence = self._silence()
            self.stall.said = now
            lines = self._silence_lines(silence, f"No rank has written a line for {silence.quiet_s:.0f} s.")
            lines[0] += f" (Said again every {self.c.stall_s:g} s while it lasts; --stall-after sets when.)"
            self._say_stall([f"[stall] {line}" for line in lines], silence.quiet_s)

    def _stall_over(self) -> None:
        since = self.stall.since
        first = min((key for key, t in self.last_line_at.items() if t > since), key=self.last_line_at.get)
        gap = self.last_line_at[first] - since
        self.stall.ended = time.monotonic()
        line = _bare(self.tails[first][-1][1])[:200]
        self._say_stall([f"[stall] Ended after {gap:.0f} s without a line: {_who(*first)} wrote: {line}"], None)

    def _say_stall(self, lines: list[str], quiet_s: float | None) -> None:
        for line in lines:
            self._combined = self._write_log(self._combined, self.workdir / "logs" / "cluster.log", line)
        if self.display is not None:
            if quiet_s is None:
                self.display.recovered(lines)
            else:
                self.display.stalled(quiet_s, lines)
        elif self.c.echo:
            print("\n".join(lines), flush=True)

    def _note_failure(self) -> None:
        """When the job failed or ran out of time: who was answering (`at_failure`), and whether it
        was during a stall or just after one ended (the failing rank's own traceback ends it)."""
        self.at_failure = self._silence()
        stall = self.stall
        # The failing rank's own traceback ends a stall a moment before its host is seen to end.
        self.failed_stalled = stall is not None and (stall.ended is None or time.monotonic() - stall.ended < 10.0)
        if self.failed_stalled and not self.at_failure.named() and stall.silence is not None:
            self.at_failure.busy = stall.silence.busy  # what the stall's last note saw: the CPU, sampled then

    def _silence_lines(self, silence: _Silence, head: str) -> list[str]:
        """`head`, who stopped answering (if the processes show it), then each rank's last line and
        how long before it came (a host's launcher's, for a host none of whose ranks wrote yet)."""
        named = self._named(silence)
        lines = [head + (f" {named[0].upper()}{named[1:]}." if named else "")]
        rows = []
        for host in self.hosts:
            ranks = sorted((r for h, r in self.last_line_at if h == host.name and r), key=int)
            keys = [(host.name, r) for r in ranks] or [(host.name, "")]
            for key in keys:
                if key not in silence.ages:
                    rows.append(f"  [{host.name}] no line yet")
                    continue
                rows.append(f"  {silence.ages[key]:.0f} s ago: {self.tails[key][-1][1][:200]}")
        if len(rows) > STALL_SHOWN:
            rows = rows[:STALL_SHOWN] + [f"  ... and {len(rows) - STALL_SHOWN} more (every line is in logs/cluster.log)"]
        return lines + ["Each rank's last line:"] + rows

    def _named(self, silence: _Silence, besides: tuple[str, str] | None = None) -> str:
        """Who stopped answering, in words ("rank 1 on algo-2 stopped answering: ..."), "" if none shows."""
        said = []
        for key, process in silence.stopped.items():
            if key != besides:
                said.append(f"{_who(*key)} stopped answering: its {process}")
        if not said:
            for key, share in silence.busy.items():
                if key != besides:
                    said.append(f"{_who(*key)} stopped answering: it kept {share:.0%} of a CPU busy while every "
                                "other rank sat idle, waiting")
        return "; ".join(said)

    def _silence(self) -> _Silence:
        """Who is answering now: which of the run's processes are stopped, and (against the CPU
        sample taken earlier in this silence) which rank kept a CPU busy while the others idled.
        Takes the next CPU sample."""
        now = time.monotonic()
        silence = _Silence(quiet_s=now - self.last_line_any,
                           ages={key: now - t for key, t in self.last_line_at.items()})
        cpu: dict[tuple[str, str], float] = {}
        for host, rank, proc in self._processes():
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
        if self._cpu_sample is not None and self._cpu_sample[0] >= self.last_line_any and len(cpu) > 1:
            taken, before = self._cpu_sample
            shares = {key: (used - before.get(key, used)) / max(now - taken, 1e-6) for key, used in cpu.items()}
            top = max(shares, key=shares.get)
            if shares[top] >= BUSY_SHARE and all(IDLE_RATIO * share <= shares[top] for key, share in shares.items()
                                                 if key != top):
                silence.busy = {top: shares[top]}
        self._cpu_sample = (now, cpu)
        return silence

    def _processes(self) -> list[tuple[HostResult, str, psutil.Process]]:
        """(host, rank, process) for every live process of each host's tree, from one look at the
        process table; rank "" for a process no launcher gave one (sm_train.sh, torchrun, a driver)."""
        table: dict[int, psutil.Process] = {}
        children: dict[int, list[psutil.Process]] = {}
        for proc in psutil.process_iter(["ppid"]):
            table[proc.pid] = proc
            children.setdefault(proc.info.get("ppid"), []).append(proc)
        found = []
        for host, root in zip(self.hosts, self.procs, strict=False):
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

    def _waited_for(self, root: RankEnd, error: str) -> list[str]:
        """The line before the failed rank's own where it failed waiting for a peer (its collective
        timed out, or the job had stalled): which rank stopped answering, and how that shows."""
        silence = self.at_failure
        if silence is None or not (_TIMED_OUT.search(error) or self.failed_stalled):
            return []
        named = self._named(silence, besides=(root.host, root.rank))
        if not named and root.rank.isdigit() and _TIMED_OUT.search(error) and self.c.world_size == 2:
            rank = str(1 - int(root.rank))
            host = self.hosts[int(rank) // self.c.procs_per_host].name
            named = f"{_who(host, rank)} stopped answering: it is the only other rank, so the collective that timed out waited on it"
            key = (host, rank)
        else:
            key = next((k for k in [*silence.stopped, *silence.busy] if k != (root.host, root.rank)), None)
        if not named:
            return []
        last = (f"its last line came {silence.ages[key]:.0f} s before the failure" if key in silence.ages
                else "it had written no line")
        return [f"{named[0].upper()}{named[1:]}; {last}. The rank below waited for it:"]

    def _rank_ends(self) -> list[RankEnd]:
        """How every failed rank ended, as its launcher recorded it (see `_TORCHRUN_AGENT` and
        the patterns after it), each with its own last lines; one record per rank, the first."""
        ends: dict[tuple[str, str], RankEnd] = {}
        for host in self.hosts:
            in_root, root_rank = False, None  # inside torchrun's "Root Cause" block, its rank
            for n, line in self.tails.get((host.name, ""), ()):
                text = line.split("] ", 1)[-1]
                found = None
                if m := _TORCHRUN_AGENT.search(text):
                    local = int(m["local"])
                    found = (str(host.host_rank * self.c.procs_per_host + local), int(m["code"]), "torchrun", "")
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
                    own = self._own_lines(host, rank)
                    stopped = self.stop_line is not None and n >= self.stop_line
                    ends[(host.name, rank)] = RankEnd(
                        host.name, rank, code, n, launcher, role, own,
                        consequence=stopped or any(_PEER_LOST.search(t) for t in _final_block(own)),
                    )
        # Ranks whose launcher had not recorded their exit when the stop came, but whose traceback
        # was out by then (a launcher that polls its ranks every second, one stopped mid-way).
        for (host_name, rank), tail in self.tails.items():
            if not rank or (host_name, rank) in ends:
                continue
            printed = [(n, line) for n, line in tail if self.stop_line is None or n < self.stop_line]
            block = _final_block([line for _, line in printed])
            if block and _TRACEBACK_START in block[0]:
                seen = printed[len(printed) - len(block)][0]
                ends[(host_name, rank)] = RankEnd(host_name, rank, None, seen, "", "", [line for _, line in printed],
                                                  consequence=any(_PEER_LOST.search(t) for t in block))
        return list(ends.values())

    def _own_lines(self, host: HostResult, rank: str) -> list[str]:
        """A rank's own lines (a parameter server's: its tagged lines in its host's output)."""
        if rank:
            return [line for _, line in self.tails.get((host.name, rank), ())]
        tag = f"[ps{host.host_rank}] "
        return [line.replace(tag, "", 1) for _, line in self.tails.get((host.name, ""), ())
                if line.split("] ", 1)[-1].startswith(tag)]

    def _describe_host_failure(self, i: int, code: int) -> str:
        """The report without launcher records: the failed host, and the first traceback."""
        host = self.hosts[i]
        how = f"exit status {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
        message = f"Host {host.name} failed ({how}); the other hosts were stopped."
        found = self._root_traceback()
        if found:
            where, lines = found
            message += f"\nFirst failure: {where}. Its traceback:\n" + "\n".join(lines)
        else:
            tail = [line for _, line in self.tails.get((host.name, ""), [])][-20:]
            message += "\nLast lines from that host:\n" + "\n".join(tail)
        if code < 0 and -code == signal.SIGKILL:
            message += "\n" + _sigkill_cause(self.all_lines)
        return message

    def _root_traceback(self) -> tuple[str, list[str]] | None:
        """Where the job failed first, and that rank's traceback.

        When one rank dies, its peers fail too (a collective whose partner vanished) and the
        launchers print summaries; those are consequences. So: a rank's traceback before a
        launcher's, a traceback that is not a lost-peer error before one that is, and among
        equals the one printed first.
        """
        found = []
        for (host, rank), tail in self.tails.items():
            lines = list(tail)
            for k, (n, line) in enumerate(lines):
                if _TRACEBACK_START in line:
                    text = [t for _, t in lines[k : k + 60]]
                    consequence = any(_PEER_LOST.search(t) for t in text)
                    where = f"rank {rank} on {host}" if rank else f"the launcher on {host}"
                    found.append((rank == "", consequence, n, where, text))
                    break
        if not found:
            return None
        *_, where, text = min(found)
        return where, text

    def _stop_all(self) -> None:
        """SIGTERM every host's process group, SIGKILL what is left after the grace period,
        then sweep for anything still carrying this cluster's marker until nothing does.

        Bounded whatever the hosts do: one pass over the process table for their descendants (not
        one per host: 64 hosts mid-start), one grace period for all, sweeps until none is found
        (a process may fork between a sweep's look and its kill), one last wait for all."""
        self._drain()
        self.stop_line = len(self.all_lines)
        self.ended_before_stop = {i for i, p in enumerate(self.procs) if p.poll() is not None}
        live = [p for p in self.procs if p.poll() is None]
        descendants = _descendants({p.pid for p in live}) if live else []
        for proc in live:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + self.c.stop_grace_s
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
