"""What every launcher inherits: no extra checks, nothing to prepare (see `workshop.spec.Launcher`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workshop.jobs import JobPlan, LauncherNotSupported, PrepStep
from workshop.spec import Lab


@dataclass(frozen=True)
class SetupJob:
    """A one-time job `prepare` runs before a user's first job when its result is not in their S3
    prefix yet (e.g. lab 2's Horovod build), for planning a room's cost (`workshop.event`)."""

    identity: str  # the same identity, the same job: it runs once per user (e.g. one build per image)
    what: str
    instance_type: str
    instance_count: int
    max_run_s: int


class LauncherBase:
    """A launcher that runs on both runtimes and needs nothing beyond its `DistributedConfig`.

    Subclasses give `name`, `local_config` and `sagemaker_config`, and override `check` (offline
    checks of a job plan) and `prepare` (input channels, internet needs, set-up jobs) when they
    need them. `on_sagemaker = False` marks a launcher that runs on the local cluster only.
    """

    name = "launcher"
    on_sagemaker = True
    # Whether `local_config(..., max_restarts=K)` and a plan's `max_restarts` work: restarting every
    # rank after a failure (`workshop.spec.check_max_restarts` refuses it otherwise).
    max_restarts_supported = False
    # The fewest hosts a job of it can have (the parameter server: a coordinator and a worker).
    min_hosts = 1

    def local_config(self, lab: Lab, procs_per_host: int | None) -> Any:
        raise NotImplementedError

    def sagemaker_config(self, plan: JobPlan) -> Any:
        raise LauncherNotSupported(f"The {self.name} launcher cannot start SageMaker jobs.",
                                   "run the lab with mode = 'local'.")

    def check(self, plan: JobPlan) -> JobPlan:
        return plan

    def local_setup_pending(self) -> str | None:
        """What this launcher's local runs need that the set-up is still preparing in the background,
        as a status line (lab 2: its Horovod build), or None: `run all` runs such labs last."""
        return None

    def wait_for_local_setup(self, echo: Callable[[str], None] = print) -> None:
        """Wait for that set-up, showing its progress through `echo`; raise a WorkshopError (what
        went wrong, what to do) when it did not succeed."""
        return None

    def prepare(self, plan: JobPlan, bucket: str, boto: Any) -> tuple[JobPlan, list[PrepStep]]:
        return plan, []

    def setup_jobs(self, plan: JobPlan) -> list[SetupJob]:
        """The one-time jobs `prepare` would run first for a user who has none of their results yet."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
