"""The torchrun launcher (labs 3 and 4): SDK v3's own `Torchrun` driver, in both runtimes.

With a restart budget (`max_restarts` > 0) it is the workshop's `ElasticTorchrun` instead:
torchrun under its elastic agent (`--max-restarts`, c10d rendezvous), which restarts every rank
when one dies, so the script resumes from its checkpoint (`workshop/drivers/torchrun/`).

With `smp=True` (lab 4), a job whose hyperparameters carry SMP v2 settings (`mp_parameters`,
what SDK v3's `SMP(...)` dumps) gets `Torchrun(smp=SMP(...))`: the SDK writes the settings into
`distributed.json` and the SMP image's `torch.sagemaker` reads them. Without settings it is
plain `Torchrun()`. See `4_model_parallel/lab.py` for the routes that use it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from workshop.errors import WorkshopError
from workshop.jobs import JobPlan
from workshop.launchers import drivers
from workshop.launchers.base import LauncherBase
from workshop.spec import Lab

SMP_IMAGE_MARKER = "smdistributed-modelparallel"  # in the SMP images' repository name
DRIVER_DIR, DRIVER_SCRIPT = drivers.ELASTIC_TORCHRUN_DIR, drivers.ELASTIC_TORCHRUN_SCRIPT


def __getattr__(name: str) -> Any:
    """`ElasticTorchrun` on first use: it subclasses the SDK's `DistributedConfig`, and the SDK takes seconds
    to import (`workshop.launchers.configs`)."""
    if name == "ElasticTorchrun":
        from workshop.launchers.configs import ElasticTorchrun

        return ElasticTorchrun
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def smp_settings(hyperparameters: Mapping[str, Any]) -> dict[str, Any]:
    """The SMP v2 settings a job's hyperparameters carry (`mp_parameters`, a dict or its JSON)."""
    value = hyperparameters.get("mp_parameters")
    if isinstance(value, str):
        value = json.loads(value)
    return dict(value or {})


class TorchrunLauncher(LauncherBase):
    """`torchrun` on every host (SDK v3's `torchrun_driver.py`); None processes per node: one per GPU."""

    name = "torchrun"

    def __init__(self, *, smp: bool = False):
        self.smp = smp

    max_restarts_supported = True

    def local_config(self, lab: Lab, procs_per_host: int | None, *, max_restarts: int = 0) -> Any:
        from sagemaker.train.distributed import Torchrun

        from workshop.launchers.configs import ElasticTorchrun

        if max_restarts:
            return ElasticTorchrun(process_count_per_node=procs_per_host, max_restarts=max_restarts)
        return Torchrun(process_count_per_node=procs_per_host)

    def sagemaker_config(self, plan: JobPlan) -> Any:
        from sagemaker.train.distributed import SMP, Torchrun

        from workshop.launchers.configs import ElasticTorchrun

        settings = smp_settings(plan.hyperparameters) if self.smp else {}
        if settings and SMP_IMAGE_MARKER not in plan.image_uri:
            raise WorkshopError(
                f"SMP settings need the SageMaker model-parallel image; this job's image is {plan.image_uri}.",
                "use the lab's SMP route (route='smp', CLI: --route smp).",
            )
        if plan.max_restarts:
            if settings:
                raise WorkshopError(
                    "A restart budget (max_restarts) is not available with SMP settings: the SMP image reads "
                    "them from SDK v3's own Torchrun driver, which has no restarts.",
                    "drop max_restarts (CLI: --max-restarts), or use the lab's default route.",
                )
            return ElasticTorchrun(process_count_per_node=plan.procs_per_host, max_restarts=plan.max_restarts)
        return Torchrun(process_count_per_node=plan.procs_per_host, smp=SMP(**settings) if settings else None)

    def __repr__(self) -> str:
        return f"TorchrunLauncher(smp={self.smp})"
