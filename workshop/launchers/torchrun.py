"""The torchrun launcher (labs 3 and 4): SDK v3's own `Torchrun` driver, in both runtimes.

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
from workshop.launchers.base import LauncherBase
from workshop.spec import Lab

SMP_IMAGE_MARKER = "smdistributed-modelparallel"  # in the SMP images' repository name


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

    def local_config(self, lab: Lab, procs_per_host: int | None) -> Any:
        from sagemaker.train.distributed import Torchrun

        return Torchrun(process_count_per_node=procs_per_host)

    def sagemaker_config(self, plan: JobPlan) -> Any:
        from sagemaker.train.distributed import SMP, Torchrun

        settings = smp_settings(plan.hyperparameters) if self.smp else {}
        if settings and SMP_IMAGE_MARKER not in plan.image_uri:
            raise WorkshopError(
                f"SMP settings need the SageMaker model-parallel image; this job's image is {plan.image_uri}.",
                "use the lab's SMP route (route='smp', CLI: --route smp).",
            )
        return Torchrun(process_count_per_node=plan.procs_per_host, smp=SMP(**settings) if settings else None)

    def __repr__(self) -> str:
        return f"TorchrunLauncher(smp={self.smp})"
