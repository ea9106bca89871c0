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

from typing import TYPE_CHECKING, Any

from workshop.errors import WorkshopError
from workshop.jobs import JobPlan
from workshop.launchers import drivers
from workshop.launchers.base import LauncherBase
from workshop.spec import Lab

if TYPE_CHECKING:
    from workshop.launchers.configs import ParameterServer

DRIVER_DIR, DRIVER_SCRIPT = drivers.PARAMETER_SERVER_DIR, drivers.PARAMETER_SERVER_SCRIPT


def __getattr__(name: str) -> Any:
    """`ParameterServer` on first use: it subclasses the SDK's `DistributedConfig`, and the SDK takes seconds
    to import (`workshop.launchers.configs`)."""
    if name == "ParameterServer":
        from workshop.launchers.configs import ParameterServer

        return ParameterServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The driver as a module (its `tf_configs`, `cluster_spec` and `ports`), for tests and notebooks;
# every port a job of `hosts` hosts uses from `base_port` (the driver's scheme).
load_driver = drivers.load_parameter_server_driver
job_ports = drivers.parameter_server_job_ports


class ParameterServerLauncher(LauncherBase):
    """One parameter server per host, the coordinator on algo-1, workers elsewhere, in both runtimes."""

    name = "parameter_server"
    min_hosts = 2  # a coordinator and at least one worker

    def local_config(self, lab: Lab, procs_per_host: int | None) -> ParameterServer:
        from workshop.launchers.configs import ParameterServer

        if procs_per_host not in (None, 1):
            raise WorkshopError(
                f"Lab {lab.key!r} runs one training process per host (plus a parameter server), "
                f"not {procs_per_host}.",
                "use --procs-per-host 1 (the default) and more hosts for more workers.",
            )
        return ParameterServer()

    def sagemaker_config(self, plan: JobPlan) -> ParameterServer:
        from workshop.launchers.configs import ParameterServer

        if plan.instance_count < 2:
            raise WorkshopError(
                f"A parameter-server job needs at least 2 instances, got {plan.instance_count}.",
                "pass hosts=2 or more (one coordinator, at least one worker).",
            )
        return ParameterServer()
