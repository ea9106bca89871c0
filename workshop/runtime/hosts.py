"""Laying out the simulated hosts of one run: each one's sandbox, environment and command.

`lay_out_hosts` makes each host's sandbox (its `/opt/ml`, `workshop.runtime.contract`), the
environment its first process starts with, and that command: in the container runtime the
`hostns host` entry that runs the SDK's `sm_train.sh` in the host's namespaces (with its spec, the
driver SageMaker would run, its share of the cores), in the process runtime
`workshop.runtime.run_driver` with the `SM_*` variables pointing into the sandbox. Nothing is
started here: `workshop.runtime.supervisor` starts what this lays out.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workshop.errors import WorkshopError
from workshop.runtime import hostns
from workshop.runtime.contract import (
    HostSandbox,
    base_process_env,
    container_command,
    container_process_env,
    host_names,
    thread_pool_env,
    write_sm_drivers,
)
from workshop.runtime.machine import usable_cores
from workshop.runtime.processes import MARKER
from workshop.runtime.results import HostResult

# A host's checkpoint folder, as its processes see it in the container runtime.
CONTAINER_CHECKPOINTS = f"{hostns.CONTAINER_ROOT}/checkpoints"
_HOST_TAG = re.compile(r"^\[(?P<host>[^\]/\s]+)(?:/\d+)?\] ")


def user_paths(text: str, hosts: list[HostResult], default: HostResult | None = None) -> str:
    """`text` with the hosts' checkpoint folders named as their user knows them: the run's `checkpoint_dir` (each
    host's folder starts as its copy, and syncs with it), else the host's folder in the run folder. A line
    tagged `[algo-N...]` speaks of that host's (`/opt/ml/checkpoints` is each one's own); others of `default`'s
    (the first host's if None). So a fix that says "move it out of /opt/ml/checkpoints", a folder that exists
    only inside the simulated host, names the folder to move it out of."""
    by_name = {host.name: host for host in hosts}
    default = default or (hosts[0] if hosts else None)
    lines = []
    for line in text.split("\n"):
        tagged = _HOST_TAG.match(line)
        host = by_name.get(tagged["host"], default) if tagged else default
        if host is not None:
            line = line.replace(CONTAINER_CHECKPOINTS, str(host.checkpoint_store or host.checkpoint_dir))
        for other in hosts:  # the process runtime's hosts see their folders where they are
            if other.checkpoint_store is not None:
                line = line.replace(str(other.checkpoint_dir), str(other.checkpoint_store))
        lines.append(line)
    return "\n".join(lines)


def driver_for(distributed: Any) -> tuple[Path, dict[str, Any] | None]:
    """The driver script SageMaker would run for this `distributed` config, and the config as the
    driver reads it (None without one: the SDK's basic script driver)."""
    if distributed is None:
        from sagemaker.train.distributed import Torchrun

        drivers = Path(Torchrun().driver_dir)
        return drivers / "basic_script_driver.py", None
    return Path(distributed.driver_dir) / distributed.driver_script, distributed.model_dump()


# What the shell splits an unquoted word on, or expands in it: SageMaker's `sm_train.sh` runs the Python it
# finds on PATH as `$SM_PYTHON_CMD ...`, unquoted.
_SHELL_SPLITS = re.compile(r"[\s*?\[]")


@contextlib.contextmanager
def plain_python_dir(bin_dir: Path | None = None) -> Iterator[Path]:
    """The folder of this environment's Python (`bin_dir`, default: sys.executable's) as the hosts' PATH has it
    first, by a path the shell takes as one word, for as long as the block lasts.

    SageMaker's `sm_train.sh` finds Python on PATH and runs it unquoted (`$SM_PYTHON_CMD`): in a SageMaker
    container its path has no space (/opt/conda/bin), but a checkout in "~/My Projects/" has its `.venv` there,
    and the path splits into two words. Such a folder is reached through a link (to the environment, whose
    `pyvenv.cfg` Python finds beside its `bin/`) in a temporary folder of this run's, removed at the end. A
    temporary folder whose own path has a space is refused, with the fix, before anything is written."""
    bin_dir = Path(sys.executable).parent if bin_dir is None else bin_dir
    if not _SHELL_SPLITS.search(str(bin_dir)):
        yield bin_dir
        return
    base = Path(tempfile.gettempdir())
    if _SHELL_SPLITS.search(str(base)):
        raise WorkshopError(
            f"This environment's Python is in {bin_dir}, whose path has a space (or *, ? or [), which SageMaker's "
            f"sm_train.sh cannot run; and the temporary folder {base}, where the workshop would link to it, has one too.",
            "set TMPDIR to a folder whose path has none (export TMPDIR=/tmp), or make the environment in one.")
    made = Path(tempfile.mkdtemp(prefix="workshop-python-"))
    try:
        (made / "env").symlink_to(bin_dir.parent, target_is_directory=True)
        yield made / "env" / bin_dir.name
    finally:
        shutil.rmtree(made, ignore_errors=True)


@dataclass
class HostLayout:
    """The hosts of one run, laid out and ready to start: one entry per host in each list."""

    hosts: list[HostResult]
    envs: list[dict[str, str]]  # the environment each host's first process starts with
    commands: list[list[str]]  # ... and its command
    marker: str  # the value of MARKER that every process of the run carries (`workshop.runtime.processes`)
    driver: Path  # the driver script each host runs
    # The container runtime's host specs, each with the file it is read from: written once the
    # namespace holder runs (`write_specs`), whose pid they carry.
    specs: list[tuple[Path, hostns.HostSpec]]

    def write_specs(self, holder_pid: int) -> None:
        for path, spec in self.specs:
            spec.holder_pid = holder_pid
            spec.write(path)


def lay_out_hosts(
    workdir: Path,
    *,
    hosts: int,
    job_name: str,
    container: bool,
    source_dir: Path,
    entry_script: str,
    distributed: Any,
    channels: dict[str, Path],
    hyperparameters: dict[str, Any],
    checkpoint_store: Path | None,
    port: int,
    num_cpus: int,
    instance_type: str | None,
    internet: bool,
    start_delays: Sequence[float],
    extra_env: dict[str, str],
    sm_drivers_dir: Path | None,
    entrypoint: Sequence[str] | None,
    prepare_host: Callable[[HostSandbox], None] | None,
    python_dir: Path | None = None,
) -> HostLayout:
    """Lay out `hosts` simulated hosts in the run folder `workdir` (its `logs/` made already), as
    `workshop.runtime.local_cluster.LocalCluster` describes them (its arguments of the same names;
    `entrypoint` is its `container_command`): one sandbox each, under `workdir/algo-N`, with the
    job's channels, hyperparameters and code; in the container runtime, the job's `sm_drivers`
    channel (built here as `ModelTrainer` builds it, unless given), its hosts file and each host's
    spec under `workdir/hostns`. `python_dir`: the folder of this environment's Python, first on the hosts'
    PATH (default: sys.executable's; the container runtime's is `plain_python_dir`'s)."""
    driver, config = driver_for(distributed)
    names = host_names(hosts)
    instance_type = instance_type or "local"
    marker = uuid.uuid4().hex
    python_dir = python_dir or Path(sys.executable).parent

    drivers_dir = None
    if container:
        drivers_dir = sm_drivers_dir
        if drivers_dir is None:  # as ModelTrainer builds the sm_drivers channel
            drivers_dir = write_sm_drivers(workdir / "sm_drivers", source_dir, entry_script, distributed)
        ns_dir = workdir / "hostns"
        ns_dir.mkdir(parents=True, exist_ok=True)
        hosts_file = ns_dir / "hosts"
        hosts_file.write_text(hostns.hosts_file_text(names))
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        share = max(1, len(cpus) // hosts)

    layout = HostLayout(hosts=[], envs=[], commands=[], marker=marker, driver=driver, specs=[])
    for host_rank, host in enumerate(names):
        sandbox = HostSandbox(workdir / host)
        if sandbox.checkpoint_dir.is_symlink():  # a run folder of an older version, used again: made afresh
            sandbox.checkpoint_dir.unlink()
        sandbox.create(
            current_host=host, hosts=names, channels=channels, hyperparameters=hyperparameters,
            source_dir=source_dir, instance_type=instance_type,
            sm_drivers=drivers_dir,
        )
        if prepare_host is not None:
            prepare_host(sandbox)
        if container:
            env = container_process_env(job_name)
        else:
            env = base_process_env()
            env.update(
                sandbox.environment(
                    current_host=host, hosts=names, channels=list(channels), hyperparameters=hyperparameters,
                    entry_script=entry_script, distributed=config, driver_dir=driver.parent,
                    master_port=port, num_cpus=num_cpus, job_name=job_name,
                )
            )
        env.update(
            {
                MARKER: marker,
                "PYTHONUNBUFFERED": "1",
                # torchrun reads its flags from PET_* too: --tee 3 tags each worker line
                # with its local rank, without changing the command line the driver builds.
                "PET_TEE": "3",
                # The drivers call `torchrun`/`mpirun` from PATH and `python` as sys.executable; sm_train.sh
                # calls `python3` from PATH.
                "PATH": os.pathsep.join([str(python_dir), env.get("PATH", "")]),
            }
        )
        if not container:
            # With one host the SDK's driver passes no --master_port and torchrun would take
            # its default 29500, shared by every local job on this machine's network.
            env.update({"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)})
        elif internet:
            env.update(hostns.proxy_env(names))
        # Thread pools sized as on the host's instance, not its share of this machine's cores
        # (the caller's own setting, and the job's extra_env below, win).
        for key, value in thread_pool_env(instance_type, share if container else usable_cores()).items():
            env.setdefault(key, value)
        env.update(extra_env)
        layout.envs.append(env)
        layout.hosts.append(HostResult(host, host_rank, sandbox, workdir / "logs" / f"{host}.log",
                                       checkpoint_store=checkpoint_store))
        if container:
            mine = [cpus[(host_rank * share + i) % len(cpus)] for i in range(share)]
            spec = hostns.HostSpec(
                name=host, hostname=hostns.instance_hostname(host), sandbox=str(sandbox.root), hosts_file=str(hosts_file),
                command=list(entrypoint) if entrypoint else container_command(), holder_pid=0,
                stash=str(ns_dir / f"opt-{host}"), start_delay_s=start_delays[host_rank], cpus=mine,
                pythonpath=env.get("PYTHONPATH"),  # /opt/ml/checkpoints: the sandbox's own, synced by the run
            )
            layout.specs.append((ns_dir / f"{host}.json", spec))
            layout.envs[-1] = hostns.with_package(env)  # the entry starts without `site`; the spec puts it back
            layout.commands.append(hostns.entry_command("host", str(ns_dir / f"{host}.json")))
        else:
            layout.commands.append([sys.executable, "-m", "workshop.runtime.run_driver", str(driver)])
    return layout
