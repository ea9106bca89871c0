"""The parameter-server launcher (lab 1): a `DistributedConfig` for TF2 parameter-server jobs, and the launcher.

    from workshop.launchers.parameter_server import ParameterServer
    ModelTrainer(..., distributed=ParameterServer())        # SageMaker
    LocalCluster(..., distributed=ParameterServer())        # the local cluster, same driver

SageMaker SDK v3 has no parameter-server option, so the workshop owns the driver
(`workshop/drivers/parameter_server/ps_driver.py`, stdlib only). `ModelTrainer` copies
`driver_dir` into the job's `sm_drivers` channel, where it lands in
`/opt/ml/input/data/sm_drivers/distributed_drivers/`; `sm_train.sh` then runs
`python .../distributed_drivers/ps_driver.py` on every host, and the driver reads this config
back from `SM_DISTRIBUTED_CONFIG` (the JSON of `model_dump()`, also uploaded as
`distributed.json`). The local cluster runs the same driver on each simulated host.
See the driver's docstring for the topology, the port scheme and how the job ends.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from sagemaker.train.distributed import DistributedConfig

from workshop.errors import WorkshopError
from workshop.jobs import JobPlan
from workshop.launchers.base import LauncherBase
from workshop.spec import Lab, load_module

DRIVER_DIR = Path(__file__).resolve().parent.parent / "drivers" / "parameter_server"
DRIVER_SCRIPT = "ps_driver.py"


class ParameterServer(DistributedConfig):
    """One parameter server per host; the coordinator on algo-1; workers on the other hosts.

    `process_count_per_node` is 1: one training process per host (the coordinator or a
    worker); each host also runs a parameter server, which computes nothing.
    `coordinator_wait_s`: how long the other hosts wait for the coordinator to come up.
    """

    process_count_per_node: int = 1
    coordinator_wait_s: int = 600

    def job_ports(self, base_port: int, hosts: int) -> list[int]:
        """The ports the job uses from `base_port` (SM_MASTER_PORT); the local cluster checks them."""
        return job_ports(base_port, hosts)

    @property
    def driver_dir(self) -> str:
        return str(DRIVER_DIR)

    @property
    def driver_script(self) -> str:
        return DRIVER_SCRIPT


def load_driver() -> ModuleType:
    """The driver as a module (its `tf_configs`, `cluster_spec` and `ports`), for tests and notebooks."""
    return load_module(DRIVER_DIR / DRIVER_SCRIPT, "ps_driver")


def job_ports(base_port: int, hosts: int) -> list[int]:
    """Every port a job of `hosts` hosts uses from `base_port` (the driver's scheme)."""
    return sorted(p for ports in load_driver().ports(base_port, hosts).values() for p in ports)


class ParameterServerLauncher(LauncherBase):
    """One parameter server per host, the coordinator on algo-1, workers elsewhere, in both runtimes."""

    name = "parameter_server"

    def local_config(self, lab: Lab, procs_per_host: int | None) -> ParameterServer:
        if procs_per_host not in (None, 1):
            raise WorkshopError(
                f"Lab {lab.key!r} runs one training process per host (plus a parameter server), "
                f"not {procs_per_host}.",
                "use --procs-per-host 1 (the default) and more hosts for more workers.",
            )
        return ParameterServer()

    def sagemaker_config(self, plan: JobPlan) -> ParameterServer:
        if plan.instance_count < 2:
            raise WorkshopError(
                f"A parameter-server job needs at least 2 instances, got {plan.instance_count}.",
                "pass hosts=2 or more (one coordinator, at least one worker).",
            )
        return ParameterServer()
