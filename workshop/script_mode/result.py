"""What a local run of your script leaves, laid out as a SageMaker job's results (`ScriptResult`): every host's
`/opt/ml/model` and `/opt/ml/output/data` aggregated into one `model.tar.gz` and one `output.tar.gz`
(`workshop.runtime.artifacts`), the names two hosts wrote, each host's folders and log, the lines and metrics."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workshop.runtime.artifacts import Archive, aggregate
from workshop.runtime.local_cluster import ClusterResult

_TAG = re.compile(r"^\[(?P<host>[^/\]]+)/(?P<rank>\d+)\] ")  # the local cluster's [host/rank] prefix


@dataclass
class HostFolders:
    """One simulated host's folders, as its container saw them (`/opt/ml/...`), and its log."""

    name: str
    model_dir: Path
    output_data_dir: Path
    checkpoint_dir: Path
    log_path: Path


@dataclass
class ScriptResult:
    """A local run of your script, laid out as a SageMaker job's results: one archive of every host's model
    folder and one of their output data folders, per-host folders, the logs, the lines and metrics."""

    job_name: str
    ok: bool
    wall_time_s: float
    run_dir: Path
    log_path: Path  # every line of every rank and launcher, tagged [host/rank]
    hosts: list[HostFolders]
    model_archive: Path | None  # None when the run failed (SageMaker then keeps what the hosts wrote too; not here)
    output_archive: Path | None
    model: Archive | None = field(default=None, repr=False)
    output: Archive | None = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)  # what was said before it started: what is not simulated
    failure: str | None = None
    cluster: ClusterResult | None = field(default=None, repr=False)

    @property
    def logs_dir(self) -> Path:
        return self.log_path.parent

    @property
    def lines(self) -> list[str]:
        return self.cluster.lines if self.cluster else []

    @property
    def records(self) -> list[dict[str, Any]]:
        """The `METRICS rank=R key=value ...` lines the ranks printed, parsed (`workshop.metrics`)."""
        return self.cluster.records if self.cluster else []

    def metric(self, name: str, rank: int | None = 0) -> Any:
        return self.cluster.metric(name, rank) if self.cluster else None

    @property
    def clashes(self) -> list[str]:
        """The name-clash lines of both archives: names more than one host wrote."""
        return [*(self.model.clash_lines() if self.model else []), *(self.output.clash_lines() if self.output else [])]

    def rank_lines(self, rank: int) -> list[str]:
        """What global rank `rank` printed, without its [host/rank] tag."""
        out = []
        for line in self.lines:
            m = _TAG.match(line)
            if m and int(m["rank"]) == rank:
                out.append(line[m.end():])
        return out

    def summary(self) -> list[str]:
        if not self.ok:
            return [f"job {self.job_name} FAILED after {self.wall_time_s:.1f} s; logs in {self.logs_dir}"]
        lines = [f"job {self.job_name} succeeded in {self.wall_time_s:.1f} s on {len(self.hosts)} host(s); "
                 f"logs in {self.logs_dir}"]
        for archive in (self.model, self.output):
            if archive is not None:
                lines.append(archive.summary())
        return lines + self.clashes

    def __str__(self) -> str:
        return "\n".join(self.summary())


def collect(cluster: ClusterResult, notes: list[str], *, echo: bool = True) -> ScriptResult:
    """The result of a local run: on success, the hosts' model and output data folders aggregated into
    `<run>/output/model.tar.gz` and `output.tar.gz` as SageMaker aggregates them, with what that says printed."""
    hosts = [HostFolders(h.name, h.model_dir, h.output_data_dir, h.checkpoint_dir, h.log_path) for h in cluster.hosts]
    result = ScriptResult(job_name=cluster.job_name, ok=cluster.ok, wall_time_s=cluster.wall_time_s,
                          run_dir=cluster.workdir, log_path=cluster.log_path, hosts=hosts, model_archive=None,
                          output_archive=None, notes=notes, failure=cluster.failure, cluster=cluster)
    if cluster.ok:
        out = cluster.workdir / "output"
        result.model = aggregate({h.name: h.model_dir for h in hosts}, out / "model.tar.gz")
        result.output = aggregate({h.name: h.output_data_dir for h in hosts}, out / "output.tar.gz", what="output",
                                  folder="/opt/ml/output/data")
        result.model_archive, result.output_archive = result.model.path, result.output.path
        if echo:
            for line in result.summary()[1:]:
                print(line, flush=True)
    return result
