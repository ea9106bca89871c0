"""No launcher: SDK v3's basic script driver, a job without `distributed=`.

    ModelTrainer(..., source_code=SourceCode(source_dir="code", entry_script="train.py"))   # no distributed=

SageMaker runs the entry script once on every host (`basic_script_driver.py`: `python train.py
--key value ...`), with no rank, world size or master address of a launcher's: each host's process
is on its own, and a script that wants the others finds them in `SM_HOSTS` and `SM_CURRENT_HOST`.
The local cluster runs the same driver on each simulated host. `python -m workshop run-script
DIR/ENTRY --launcher none` (the default) uses it.
"""

from __future__ import annotations

from typing import Any

from workshop.errors import WorkshopError
from workshop.jobs import JobPlan
from workshop.launchers.base import LauncherBase
from workshop.spec import Lab


def _one_process(procs_per_host: int | None) -> None:
    if procs_per_host not in (None, 1):
        raise WorkshopError(
            f"Without a launcher SageMaker runs the entry script once per host, so {procs_per_host} processes per "
            "host cannot be had this way.",
            "pass --procs-per-host 1 (or leave it out), or a launcher that starts several: --launcher torchrun "
            "(distributed=Torchrun(process_count_per_node=N) in Python).",
        )


class NoLauncher(LauncherBase):
    """The entry once per host (SDK v3's basic script driver), in both runtimes."""

    name = "none"

    def local_config(self, lab: Lab, procs_per_host: int | None) -> Any:
        _one_process(procs_per_host)
        return None

    def sagemaker_config(self, plan: JobPlan) -> Any:
        _one_process(plan.procs_per_host)
        return None

    def __repr__(self) -> str:
        return "NoLauncher()"
