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
  sandbox at `/opt/ml`, its hostname is `algo-N`, its peers resolve as `algo-1..algo-N` (at
  127.0.0.1..N), and it runs the SDK's own generated `sm_train.sh` unchanged: the SDK's
  `environment.py` writes `/opt/ml/input/sm_training.env`, the script `cd`s into the code and
  runs the driver (SDK's `torchrun_driver.py` for `Torchrun`, the workshop's own drivers for
  its `DistributedConfig`s, the basic script driver without one), which builds
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
  SIGKILL after `stop_grace_s`), and the failing rank's traceback is what the error shows.
- No process outlives the run: not on success, failure, timeout, Ctrl-C or a notebook
  interrupt. Every process started carries a marker variable; a final sweep kills anything
  that still carries it (torchrun starts its workers in sessions of their own, so process
  groups alone would not reach them), and on Linux each host launcher dies with its parent.
"""

from __future__ import annotations

import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from workshop import REPO_ROOT, metrics
from workshop.errors import WorkshopError
from workshop.runtime import hostns
from workshop.runtime.contract import (
    RESERVED_CHANNELS,
    SAGEMAKER_MASTER_PORT,
    HostSandbox,
    base_process_env,
    container_command,
    container_process_env,
    host_names,
    write_sm_drivers,
)
from workshop.runtime.processes import MARKER, processes_with_marker

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
# sm_train.sh's line just before it runs the driver (sagemaker/train/templates.py).
_DRIVER_START = re.compile(r"^Running .+ [Dd]river$")
# Errors a rank raises because a peer went away first (gloo, NCCL, c10d store, MPI).
_PEER_LOST = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|remote worker crashing|DistNetworkError|"
    r"DistStoreError|NCCL communicator was aborted|ProcessGroupNCCL.*(?:abort|timeout)|"
    r"Socket Timeout|Connection refused",
    re.IGNORECASE,
)


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

    @property
    def model_dir(self) -> Path:
        return self.sandbox.model_dir

    @property
    def output_data_dir(self) -> Path:
        return self.sandbox.output_data_dir

    @property
    def checkpoint_dir(self) -> Path:
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


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the process that started it dies."""
    hostns.die_with_parent(signal.SIGTERM)


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
        runtime: str = "auto",
        internet: bool = False,
        start_skew_s: float | Sequence[float] = 0.0,
        sm_drivers_dir: str | Path | None = None,
        container_command: Sequence[str] | None = None,
        instance_type: str | None = None,
    ):
        """`runtime`: "container" (needs Linux namespaces), "process", or "auto" (container
        where possible, else process, said so). Container runtime only: `internet` gives the
        hosts this machine's network (a job with a route out) instead of a private one with
        nothing but loopback; `start_skew_s` delays each host's start (a number: host h starts
        h x skew / (hosts - 1) seconds after algo-1, so the last host is `skew` late; or one
        delay per host); `sm_drivers_dir` is the job's `sm_drivers` channel as uploaded
        (default: built here by the installed SDK, as `ModelTrainer` builds it);
        `container_command` the image entrypoint and arguments (default: the SDK's, which
        runs `sm_train.sh`); `instance_type` what the hosts say they are (default "local").
        """
        if not isinstance(hosts, int) or hosts < 1:
            raise WorkshopError(f"hosts must be a whole number of at least 1, got {hosts!r}.", "use --hosts 1 or more.")
        if not isinstance(procs_per_host, int) or procs_per_host < 1:
            raise WorkshopError(
                f"procs_per_host must be a whole number of at least 1, got {procs_per_host!r}.",
                "use --procs-per-host 1 or more.",
            )
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
        self.echo = echo
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

    def resolve_runtime(self) -> tuple[str, str]:
        """("container" or "process", why), as `run` will use it."""
        return choose_runtime(self.runtime)

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

        `checkpoint_dir` stands in for the job's checkpoint S3 URI: its files are copied into
        every host's checkpoint folder before the start and the hosts' files back into it at
        the end, as SageMaker's CheckpointConfig does, so a second run resumes.
        """
        hyperparameters = dict(hyperparameters or {})
        chans = self._check_channels(channels or {})
        runtime, why = self.resolve_runtime()
        container = runtime == "container"
        driver, distributed = self._driver()
        if container:
            port = SAGEMAKER_MASTER_PORT
        else:
            port = self.master_port or self._pick_port()
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        job_name = f"{self.name}-{stamp}-{uuid.uuid4().hex[:4]}"
        workdir = (self.workdir or DEFAULT_RUNS_DIR / job_name).resolve()
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
            sandbox.create(
                current_host=host, hosts=names, channels=chans, hyperparameters=hyperparameters,
                source_dir=self.source_dir, instance_type=instance_type,
                sm_drivers=drivers_dir,
            )
            if checkpoint_dir and Path(checkpoint_dir).is_dir():
                shutil.copytree(checkpoint_dir, sandbox.checkpoint_dir, dirs_exist_ok=True)
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
            env.update(self.extra_env)
            envs.append(env)
            hosts.append(HostResult(host, host_rank, sandbox, workdir / "logs" / f"{host}.log"))
            if container:
                mine = [cpus[(host_rank * share + i) % len(cpus)] for i in range(share)]
                spec = hostns.HostSpec(
                    hostname=host, sandbox=str(sandbox.root), hosts_file=str(hosts_file),
                    command=self.container_command or container_command(), holder_pid=0,
                    stash=str(ns_dir / f"opt-{host}"), start_delay_s=self.start_delays[host_rank], cpus=mine,
                )
                specs.append((ns_dir / f"{host}.json", spec))
                commands.append([sys.executable, "-m", "workshop.runtime.hostns", "host", str(ns_dir / f"{host}.json")])
            else:
                commands.append([sys.executable, "-m", "workshop.runtime.run_driver", str(driver)])

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
        )
        holder = None
        try:
            if container:
                holder = hostns.NamespaceHolder(proxy=self.internet)
                for path, spec in specs:  # the holder's pid is known only now
                    spec.holder_pid = holder.pid
                    spec.write(path)
            runner = _Run(self, hosts, envs, commands, workdir, cluster_id, timeout_s, container)
            returncode, failure, lines = runner.run()
        finally:
            if holder is not None:
                holder.close()
            if checkpoint_dir:
                Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
                for host in reversed(hosts):  # algo-1 (rank 0's host) copied last wins
                    if host.checkpoint_dir.is_dir():
                        shutil.copytree(host.checkpoint_dir, checkpoint_dir, dirs_exist_ok=True)
        result = ClusterResult(
            job_name=job_name, returncode=returncode, hosts=hosts, records=metrics.parse_lines(lines),
            wall_time_s=runner.wall_time_s, workdir=workdir, log_path=workdir / "logs" / "cluster.log",
            failure=failure, world_size=self.world_size, lines=lines, runtime=runtime,
        )
        status = "succeeded" if result.ok else f"FAILED (exit status {returncode})"
        self._say(f"Local job {job_name} {status} in {result.wall_time_s:.1f} s. Logs: {result.log_path}")
        return result.check() if check else result

    def _say(self, text: str) -> None:
        if self.echo:
            print(text, flush=True)


class _Run:
    """One execution: start the hosts, stream their lines, stop everything, report."""

    def __init__(self, cluster: LocalCluster, hosts, envs, commands, workdir, cluster_id, timeout_s, container):
        self.c = cluster
        self.hosts: list[HostResult] = hosts
        self.envs = envs
        self.commands = commands
        self.workdir = workdir
        self.cluster_id = cluster_id
        self.timeout_s = timeout_s
        self.lines: queue.Queue = queue.Queue()
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

    def _start(self) -> None:
        for host, env, cmd in zip(self.hosts, self.envs, self.commands, strict=True):
            proc = subprocess.Popen(
                cmd,
                cwd=host.sandbox.code_dir,  # sm_train.sh: cd /opt/ml/input/data/code
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so it can be stopped as one
                preexec_fn=_die_with_parent,
            )
            self.procs.append(proc)
            reader = threading.Thread(target=self._read, args=(host, proc), daemon=True)
            reader.start()
            self.readers.append(reader)

    def _read(self, host: HostResult, proc: subprocess.Popen) -> None:
        """Split a host's output into whole lines per rank, each tagged `[host/rank]`."""
        partial: dict[str, str] = {}  # rank -> text of a line not yet ended
        # Line-buffered: `tail -f runs/<job>/logs/algo-1.log` (or a test waiting for a line) sees
        # each line as it comes, not a buffer's worth later.
        with open(host.log_path, "w", encoding="utf-8", buffering=1) as log:
            for raw in iter(proc.stdout.readline, b""):
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                log.write(text + "\n")
                segments = self._segments(host, text)
                for rank, piece in segments[:-1]:
                    partial[rank] = partial.get(rank, "") + piece
                rank, piece = segments[-1]
                line = partial.pop(rank, "") + piece
                tag = f"[{host.name}/{rank}]" if rank else f"[{host.name}]"
                self.lines.put((host.name, rank, f"{tag} {line}"))
        for rank, piece in partial.items():  # output that never got its newline
            self.lines.put((host.name, rank, f"[{host.name}/{rank}] {piece}" if rank else f"[{host.name}] {piece}"))
        proc.stdout.close()

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
            self.tails.setdefault((host, rank), deque(maxlen=400)).append((len(self.all_lines), line))
            self.all_lines.append(line)
            self._combined.write(line + "\n")
            if not rank and host not in self.driver_started and _DRIVER_START.match(line.split("] ", 1)[-1]):
                self.driver_started[host] = time.monotonic() - self.t0
            if self.c.echo and self._show(host, rank, line):
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
                while True:
                    self._drain(0.1)
                    codes = [p.poll() for p in self.procs]
                    failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
                    if failed:
                        failed_host, returncode = failed[0], codes[failed[0]]
                        break
                    if all(code == 0 for code in codes):
                        break
                    if self.timeout_s and time.monotonic() - t0 > self.timeout_s:
                        returncode = 124
                        failure = f"The job ran past its time limit of {self.timeout_s:g} s and was stopped."
                        break
            finally:
                # Also on KeyboardInterrupt (Ctrl-C, a notebook's interrupt): nothing outlives the run.
                self._stop_all()
                for reader in self.readers:
                    reader.join(timeout=5)
                self._drain()
                for host, proc in zip(self.hosts, self.procs, strict=False):
                    host.returncode = proc.returncode
                    host.driver_started_s = self.driver_started.get(host.name)
                self.wall_time_s = time.monotonic() - t0
        if failed_host is not None:
            failure = self._describe_failure(failed_host, returncode)
        return returncode, failure, self.all_lines

    def _describe_failure(self, i: int, code: int) -> str:
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
            message += "\n(SIGKILL from outside the job often means the machine ran out of memory.)"
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
        then sweep for anything still carrying this cluster's marker."""
        live = [p for p in self.procs if p.poll() is None]
        descendants: list[psutil.Process] = []
        for proc in live:
            try:
                descendants += psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
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
        for child in descendants + processes_with_marker(self.cluster_id):
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
