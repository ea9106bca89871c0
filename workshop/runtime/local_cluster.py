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

This module is the cluster's face: `LocalCluster`, and the names its users import from here. The
parts behind it, each a module of `workshop.runtime`:

- `results`: what a run produced (`ClusterResult`, `HostResult`) and `TrainingFailed`;
- `machine`: what this machine can give a run, checked before anything starts (ports, cores,
  memory, writable folders, disk space, the runtime);
- `hosts`: laying out the hosts (each one's sandbox, environment and command);
- `supervisor`: starting them, reading their lines, stopping everything;
- `streams`: a host's output as whole lines per rank, and the run's record of them;
- `stalls`: the stall watch (who stopped answering);
- `failures`: the failure report (which rank failed first and how, then what followed).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from workshop import REPO_ROOT, metrics
from workshop.errors import WorkshopError
from workshop.runtime import hostns
from workshop.runtime.checkpoint_sync import CheckpointSync
from workshop.runtime.contract import RESERVED_CHANNELS, SAGEMAKER_MASTER_PORT, HostSandbox
from workshop.runtime.folders import (
    DISK_FULL_FIX,
    FolderLock,
    check_free_space,
    disk_full_message,
    is_disk_full,
    new_folder,
    size_of,
)
from workshop.runtime.hosts import lay_out_hosts, plain_python_dir
from workshop.runtime.machine import (
    CORES_REFUSE_RATIO,
    CORES_WARN_RATIO,
    HOST_MEMORY_MB,
    OVERSUBSCRIBE_ENV,
    RANK_MEMORY_MB,
    RUNTIMES,
    OversubscriptionWarning,
    check_checkpoint_space,
    check_cluster_size,
    check_machine_fits,
    check_writable_folder,
    choose_runtime,
    free_port,
    port_in_use,
    run_folder_bytes,
)
from workshop.runtime.processes import (
    MARKER,
    DeferredInterrupt,
    Stopped,
    Terminated,
    processes_with_marker,
)
from workshop.runtime.progress import STALL_S, JobProgress, progress_total
from workshop.runtime.results import ClusterResult, HostResult, TrainingFailed
from workshop.runtime.supervisor import Supervisor

# The names a user of the local cluster imports from here (each defined in the module named above).
__all__ = [
    "CHECKPOINT_IN_USE_FIX", "CORES_REFUSE_RATIO", "CORES_WARN_RATIO", "DEFAULT_RUNS_DIR", "HOST_MEMORY_MB",
    "MARKER", "OVERSUBSCRIBE_ENV", "RANK_MEMORY_MB", "RUNTIMES", "WORKDIR_IN_USE_FIX",
    "ClusterResult", "HostResult", "LocalCluster", "OversubscriptionWarning", "TrainingFailed",
    "check_checkpoint_space", "check_cluster_size", "check_machine_fits", "check_writable_folder",
    "choose_runtime", "port_in_use", "processes_with_marker", "run_folder_bytes",
]

DEFAULT_RUNS_DIR = REPO_ROOT / "runs"
CHECKPOINT_IN_USE_FIX = ("wait for that job to end (or stop it), or give this run another folder: --checkpoint-dir DIR "
                         "(checkpoint_dir= in Python). A job that was killed holds nothing: its lock went with it.")
WORKDIR_IN_USE_FIX = ("wait for that job to end (or stop it), or leave workdir unset (each run then gets a new folder "
                      "of its own) or pass another one.")


class LocalCluster:
    """N simulated SageMaker hosts on this machine, running one training job: `run` it (the module
    docstring shows how, and what each host runs)."""

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
        process shows it (see `workshop.runtime.stalls`); said again every `stall_s` while it lasts, and
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
            port = free_port()
            if not any(port_in_use(p) for p in self._job_ports(port)):
                return port
        raise WorkshopError("Found no free block of ports on 127.0.0.1 for this job.", "free some ports, or pass master_port.")

    @property
    def world_size(self) -> int:
        return self.hosts * self.procs_per_host

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
            # The container runtime's hosts run sm_train.sh, which runs the Python on PATH unquoted.
            python_dir = (held.enter_context(plain_python_dir()) if self.resolve_runtime()[0] == "container"
                          else None)
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
                result = self._run(hyperparameters, chans, store, workdir, job_name, timeout_s, python_dir)
            except (OSError, shutil.Error) as exc:  # setting up the run folder: no host has started (see Supervisor)
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
             job_name: str, timeout_s: float | None, python_dir: Path | None = None) -> ClusterResult:
        """`run` in its folder, with its folders locked: lay out the hosts (`workshop.runtime.hosts`),
        supervise them (`workshop.runtime.supervisor`), and gather the result."""
        if store is not None:
            store.mkdir(parents=True, exist_ok=True)
        runtime, why = self.resolve_runtime()
        container = runtime == "container"
        if container:
            port = SAGEMAKER_MASTER_PORT
        else:
            port = self.master_port or self._pick_port()
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        layout = lay_out_hosts(
            workdir, hosts=self.hosts, job_name=job_name, container=container, source_dir=self.source_dir,
            entry_script=self.entry_script, distributed=self.distributed, channels=chans,
            hyperparameters=hyperparameters, checkpoint_store=store, port=port, num_cpus=self.num_cpus,
            instance_type=self.instance_type, internet=self.internet, start_delays=self.start_delays,
            extra_env=self.extra_env, sm_drivers_dir=self.sm_drivers_dir, entrypoint=self.container_command,
            prepare_host=self.prepare_host, python_dir=python_dir,
        )
        hosts, names = layout.hosts, [h.name for h in layout.hosts]

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
                f"container runtime: sm_train.sh -> {layout.driver.name} on hosts {names[0]}..{names[-1]} "
                f"({hostns.host_address(names[0])}..{hostns.host_address(names[-1])}), master {names[0]}:{port}, "
                + ("a private network with a way out (internet through an HTTPS proxy)" if self.internet
                   else "a private network (no internet)")
                + (f", hosts start up to {skew:g} s apart" if skew else "")
            )
        else:
            where = (f"process runtime ({why}): {layout.driver.name} with the master on 127.0.0.1:{port}, "
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
                layout.write_specs(holder.pid)  # the holder's pid is known only now
            display = None
            if self.echo and not self.verbose:
                unit, total = progress_total(hyperparameters)
                display = JobProgress(self.name, unit, total, self.hosts,
                                      max_restarts=int(getattr(self.distributed, "max_restarts", 0) or 0))
            runner = Supervisor(layout, workdir, procs_per_host=self.procs_per_host, container=container,
                                timeout_s=timeout_s, echo=self.echo, stall_s=self.stall_s,
                                stop_grace_s=self.stop_grace_s, display=display, sync=sync)
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
