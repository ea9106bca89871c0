"""What this machine can give a local run, checked before anything starts: ports, cores, memory,
folders it can write, disk space, and the runtime it can run (container or process).

Each check refuses with a `WorkshopError` that carries its fix, so a run that cannot work here is
told so in one line before any data is prepared or any process starts, not halfway through. And
what the kernel did to a run for memory (`oom_kills`, `memory_limit`, `MemoryKills`): the failure
report names a process the out-of-memory killer took as a memory kill.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from workshop.errors import WorkshopError
from workshop.runtime import hostns
from workshop.runtime.folders import free_bytes, megabytes, size_of

RUNTIMES = ("auto", "container", "process")

# What a local run may ask of this machine (see `check_machine_fits`).
CORES_WARN_RATIO = 4  # training processes per core above which the run is said to be slow
CORES_REFUSE_RATIO = 16  # ... above which it is refused, unless allowed
HOST_MEMORY_MB = 350  # one host's launchers: sm_train.sh, the driver, torchrun (about 320 MB measured)
RANK_MEMORY_MB = 500  # one training process of the labs (about 300 MB measured for PyTorch; TensorFlow more)
OVERSUBSCRIBE_ENV = "WORKSHOP_ALLOW_OVERSUBSCRIPTION"  # "1": allow_oversubscription=True where not passed

LOG_ROOM_PER_HOST = 512 * 1024  # room for a host's logs, an estimate: a lab's 2-step run writes about 20 KB per host


class OversubscriptionWarning(UserWarning):
    """A local cluster asks for more processes than this machine has cores for: it will be slow."""


# ----------------------------------------------------------------------------- ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
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
    """Whether something on this machine holds `port` on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


# ----------------------------------------------------------------------------- folders and disk space


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


# ----------------------------------------------------------------------------- cores and memory


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup's CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def available_memory_mb() -> int:
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
    world, cores = hosts * procs_per_host, usable_cores()
    need_mb = hosts * HOST_MEMORY_MB + world * RANK_MEMORY_MB
    have_mb = available_memory_mb()
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


# ----------------------------------------------------------------------------- memory kills

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 2**62  # cgroup v1 says "no limit" with a number near 2**63
MEMORY_FIX = ("use fewer hosts or processes per host, a smaller model or batch, or a machine (or notebook "
              "instance) with more memory.")


def _memory_cgroup() -> tuple[Path, int] | None:
    """This process's memory cgroup folder and its version (2, or 1), where it can be read (Linux)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = CGROUP_ROOT / "memory" / path.lstrip("/")
            return (folder, 1) if folder.is_dir() else None
    for line in lines:
        if line.startswith("0::") and (CGROUP_ROOT / "cgroup.controllers").is_file():
            folder = CGROUP_ROOT / line[3:].lstrip("/")
            return (folder, 2) if (folder / "memory.events").is_file() else None
    return None


def _counter(path: Path, name: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has ended in this process's memory cgroup (where
    the local cluster's hosts and ranks run, and a cgroup's own limit is met), else on this machine; None
    where neither can be read. Compare two readings: the count grows with each kill."""
    group = _memory_cgroup()
    if group is not None:
        folder, version = group
        count = _counter(folder / ("memory.events" if version == 2 else "memory.oom_control"), "oom_kill")
        if count is not None:
            return count
    return _counter(Path("/proc/vmstat"), "oom_kill")


def memory_limit() -> tuple[int, str]:
    """The memory this process's processes may use, in bytes, and whose limit it is: "this run's memory
    cgroup" (the lowest limit of its cgroup and those above it) or "this machine" (its memory)."""
    machine = psutil.virtual_memory().total
    group = _memory_cgroup()
    limits = []
    if group is not None:
        folder, version = group
        if version == 1:
            limits.append(_counter(folder / "memory.stat", "hierarchical_memory_limit") or UNLIMITED)
        else:
            while folder != CGROUP_ROOT and CGROUP_ROOT in folder.parents:
                with contextlib.suppress(OSError, ValueError):
                    text = (folder / "memory.max").read_text().strip()
                    limits.append(UNLIMITED if text == "max" else int(text))
                folder = folder.parent
    limit = min(limits, default=UNLIMITED)
    return (limit, "this run's memory cgroup") if limit < machine else (machine, "this machine")


@dataclass
class MemoryKills:
    """What the kernel's out-of-memory killer did to a run: `count` processes ended (None: it cannot be
    counted here) under `limit` bytes, the limit of `where` (`memory_limit`)."""

    count: int | None
    limit: int
    where: str

    @classmethod
    def since(cls, before: int | None) -> MemoryKills:
        """The kills since `oom_kills()` read `before`."""
        now = oom_kills()
        return cls(None if before is None or now is None else max(0, now - before), *memory_limit())

    def cause(self) -> str:
        """The line that says so, with the fix (for a process killed by SIGKILL)."""
        if self.count is None:
            return "(SIGKILL from outside the job often means the machine ran out of memory.)"
        if not self.count:
            return ("(SIGKILL from outside the job: not the kernel's out-of-memory killer, which ended no process "
                    "of this run.)")
        return (f"(The kernel's out-of-memory killer ended {self.count} process(es) of this run: the memory limit "
                f"of {self.where} is {self.limit / 2**30:.1f} GiB.) Fix: {MEMORY_FIX}")


# ----------------------------------------------------------------------------- the runtime


def choose_runtime(requested: str = "auto") -> tuple[str, str]:
    """The runtime a cluster asking for `requested` gets here ("container" or "process"), and why."""
    if requested == "process":
        return "process", "asked for"
    ok, why = hostns.available()
    if requested == "container" and not ok:
        raise WorkshopError(f"The container runtime cannot run here: {why}.", "use runtime='process' (or 'auto').")
    return ("container", why) if ok else ("process", why)
