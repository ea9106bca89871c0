"""The workshop's own SDK v3 `DistributedConfig`s: the parameter server, Horovod, torchrun with restarts.

They subclass the SageMaker SDK's `DistributedConfig`, and importing the SDK takes seconds, so
they live here, imported only when a job's config is built: the launcher modules that name them
(`workshop.launchers.parameter_server`, `.horovod`, `.torchrun`) hand them out on first use
(`from workshop.launchers.horovod import Horovod` still works), and `python -m workshop --help`,
`labs` and every refusal of bad input answer without the SDK.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator
from sagemaker.train.distributed import DistributedConfig

from workshop.launchers import drivers

__all__ = ["ElasticTorchrun", "Horovod", "ParameterServer"]


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
        return drivers.parameter_server_job_ports(base_port, hosts)

    @property
    def driver_dir(self) -> str:
        return str(drivers.PARAMETER_SERVER_DIR)

    @property
    def driver_script(self) -> str:
        return drivers.PARAMETER_SERVER_SCRIPT


class Horovod(DistributedConfig):
    """Horovod ranks on every host, Gloo controller, Horovod's rendezvous on algo-1.

    framework: "pytorch" or "tensorflow": which of Horovod's extensions the script needs.
    install: "none" (the image has Horovod) or "wheel" (install it from the job's `horovod`
        input channel, the wheel built once for the image; no index, no PyPI).
    process_count_per_node: ranks per host; None: one per GPU, one on CPU instances.
    gloo_timeout_s: how long a rank waits for a peer before failing (a dead peer ends the job);
        it starts only once every host is ready.
    rendezvous_wait_s: how long each host waits, from its driver's start, for every other host to
        report ready (instances start and finish their set-up minutes apart).
    """

    framework: Literal["pytorch", "tensorflow"] = "pytorch"
    install: Literal["none", "wheel"] = "none"
    process_count_per_node: int | None = None
    gloo_timeout_s: int = 60
    rendezvous_wait_s: int = 1800
    grace_s: int = 60

    @field_validator("install", mode="before")
    @classmethod
    def _no_build_per_host(cls, value: Any) -> Any:
        if value == "build":
            raise ValueError(
                "install='build' is gone: it built Horovod on every host of every job (minutes each, "
                "hosts finishing apart, PyPI needed). Use install='wheel' with the `horovod` channel "
                "(run_on_sagemaker builds the wheel once per image and adds it), or an image with "
                "Horovod and install='none'"
            )
        return value

    @property
    def driver_dir(self) -> str:
        return str(drivers.HOROVOD_DIR)

    @property
    def driver_script(self) -> str:
        return drivers.HOROVOD_SCRIPT


class ElasticTorchrun(DistributedConfig):
    """`torchrun` with a restart budget: `max_restarts` restarts of every rank after a failure.

    `process_count_per_node`: None is one per GPU, as SDK v3's `Torchrun`. `join_timeout_s`: how
    long the rendezvous waits for every host (torchrun's default, 600 s, when None).
    """

    process_count_per_node: int | None = None
    max_restarts: int = 1
    join_timeout_s: int | None = None

    @property
    def driver_dir(self) -> str:
        return str(drivers.ELASTIC_TORCHRUN_DIR)

    @property
    def driver_script(self) -> str:
        return drivers.ELASTIC_TORCHRUN_SCRIPT
