"""What a local run produced, in the shape a SageMaker job's results have: per host (`HostResult`),
per job (`ClusterResult`), and the error a failed job raises (`TrainingFailed`).

`workshop.runtime.local_cluster.LocalCluster.run` returns a `ClusterResult`; these names are
importable from `workshop.runtime.local_cluster` too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workshop import metrics
from workshop.errors import WorkshopError
from workshop.runtime.contract import HostSandbox


class TrainingFailed(WorkshopError):
    """A local job failed. `.result` has the logs, paths and what was parsed so far."""

    def __init__(self, message: str, result: ClusterResult):
        super().__init__(message)
        self.result = result


@dataclass
class HostResult:
    """One simulated host of a run: its name (`algo-N`), its sandbox (its `/opt/ml`), its log, and how
    its processes ended (`returncode`, set once the run is over)."""

    name: str
    host_rank: int
    sandbox: HostSandbox
    log_path: Path
    returncode: int | None = None
    driver_started_s: float | None = None  # container runtime: when sm_train.sh ran the driver
    # The run's `checkpoint_dir`, when it was given: the checkpoint S3 URI's stand-in, which this host's
    # own checkpoint folder is synced with (`workshop.runtime.checkpoint_sync`).
    checkpoint_store: Path | None = None

    @property
    def model_dir(self) -> Path:
        """This host's model folder (its /opt/ml/model, SM_MODEL_DIR)."""
        return self.sandbox.model_dir

    @property
    def output_data_dir(self) -> Path:
        """This host's output data folder (its /opt/ml/output/data, SM_OUTPUT_DATA_DIR)."""
        return self.sandbox.output_data_dir

    @property
    def checkpoint_dir(self) -> Path:
        """This host's own checkpoint folder (its /opt/ml/checkpoints): what its ranks wrote, and what it
        downloaded from the run's `checkpoint_dir` at the start, if it had one."""
        return self.sandbox.checkpoint_dir


@dataclass
class ClusterResult:
    """What a local run produced, in the shape a SageMaker job's results have.

    `ok` (exit status 0), `failure` (the report of what failed first and how, None on success),
    `hosts` (each host's folders and log), `records` (every `METRICS` line, parsed: `metric()`,
    `per_rank()`), `lines` (every line of every rank, tagged `[host/rank]`), `log_path` (all of them
    in one file) and `workdir` (the run folder). `check()` raises `TrainingFailed` unless it is ok.
    """

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
        """This result if the job succeeded; else `TrainingFailed` with its failure report."""
        if not self.ok:
            raise TrainingFailed(self.failure or f"exit status {self.returncode}", self)
        return self
