"""Where the time goes: run a lab's own script under torch.profiler and report each rank's step.

    python -m workshop profile data_parallel --hosts 2 [--procs-per-host P] [--steps S]
    python -m workshop profile data_parallel --hosts 2 --mode sagemaker [--yes]   # a SageMaker job

    from workshop.profiling import profile
    report = profile("data_parallel", hosts=2, steps=5)   # a notebook cell: the same run
    print(report.table()); report.plot()

The lab's script profiles itself (its `profile_flag`, e.g. `--profile-steps S`: S steps after a
warm-up, one Chrome/Perfetto trace per rank in the job's output data folder, which SageMaker uploads
with the job's output); `workshop.trace_report` reads the traces back and splits every rank's step
into compute, communication, data loading and idle (waiting for the slowest rank). The traces, the
table (`profile.md`) and the plot (`profile.png`) end up in the run's folder under runs/. Open a
trace in https://ui.perfetto.dev or chrome://tracing to see the steps themselves.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from workshop.errors import WorkshopError
from workshop.labs import get_lab
from workshop.runner import run_local, run_on_sagemaker
from workshop.runtime.local_cluster import DEFAULT_RUNS_DIR, ClusterResult
from workshop.runtime.progress import STALL_S, in_notebook
from workshop.spec import Lab, given_as
from workshop.trace_report import ProfileReport

TRACE_GLOB = "trace-rank*.json"
TIMELINE = "horovod-timeline.json"  # lab 2's PyTorch script: Horovod's own timeline, rank 0's


def check_profilable(lab: Lab, steps: Any) -> None:
    """Refuse, before anything starts, a lab whose script cannot profile itself or a step count below 1."""
    if lab.profile_flag is None:
        framework = lab.sagemaker.framework if lab.sagemaker else ""
        if "tensorflow" in framework:
            raise WorkshopError(
                f"Lab {lab.key!r} is a TensorFlow lab: the profiler report covers the PyTorch labs' torch.profiler "
                "traces only; TensorFlow's profiler is not covered (not built yet).",
                "profile a PyTorch lab (`python -m workshop profile data_parallel`), or profile this one yourself "
                "with tf.profiler.experimental.start/stop in its script and open the result in TensorBoard.")
        raise WorkshopError(
            f"Lab {lab.key!r}'s script has no profiling flag (its spec sets no profile_flag), so it cannot be profiled.",
            "profile a lab whose script supports it (`python -m workshop profile data_parallel`), or add a "
            "--profile-steps flag to its script as lab 3's has and set profile_flag in its lab.py.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise WorkshopError(f"steps must be a whole number of at least 1, got {steps!r}.",
                            "profile a few steps, e.g. --steps 5 (steps=5 in Python).")


def find_traces(folders: list[Path]) -> list[Path]:
    """The trace-rank<R>.json files under `folders` (each host's output data folder), or a WorkshopError."""
    traces = sorted({p for folder in folders for p in Path(folder).rglob(TRACE_GLOB)})
    if not traces:
        where = ", ".join(str(f) for f in folders) or "(no folder)"
        raise WorkshopError(f"No profiler traces ({TRACE_GLOB}) under {where}.",
                            "profile the lab (`python -m workshop profile LAB`), and give the folder the job's "
                            "output data went to (locally each host's output/data; on SageMaker the extracted "
                            "output.tar.gz).")
    return traces


def report_from(folders: list[str | Path] | str | Path, out_dir: str | Path | None = None,
                title: str | None = None) -> ProfileReport:
    """The report of the traces under `folders`; with `out_dir`, the traces are gathered into
    `out_dir/traces/` and the table (`profile.md`) and plot (`profile.png`) are written there."""
    folders = [Path(folders)] if isinstance(folders, (str, Path)) else [Path(f) for f in folders]
    traces = find_traces(folders)
    report = ProfileReport.from_files(traces, title=title)
    if out_dir is not None:
        out = Path(out_dir)
        (out / "traces").mkdir(parents=True, exist_ok=True)
        for rt in report.ranks.values():
            if rt.path is not None and rt.path.parent != out / "traces":
                shutil.copy2(rt.path, out / "traces" / rt.path.name)
        for timeline in sorted({p for folder in folders for p in folder.rglob(TIMELINE)}):  # Horovod's (lab 2)
            if timeline.parent != out / "traces":
                shutil.copy2(timeline, out / "traces" / timeline.name)
        (out / "profile.md").write_text(report.table() + "\n")
        report.plot(out / "profile.png")
    return report


def profile(
    lab: Lab | str,
    *,
    hosts: int | None = None,
    procs_per_host: int | None = None,
    steps: int = 5,
    hyperparameters: dict[str, Any] | None = None,
    mode: str = "local",
    data_dir: str | Path | None = None,
    runs_dir: str | Path | None = None,
    echo: bool = True,
    verbose: bool = False,
    stall_s: float | None = STALL_S,
    confirm_cost: Any = False,
    title: str | None = None,
    **sagemaker_fields: Any,
) -> ProfileReport:
    """Run `lab` with its script's profiler on every rank for `steps` steps (after its warm-up), then
    build, print and plot the report. Returns a `workshop.trace_report.ProfileReport` (`.table()`,
    `.plot()`, `.share("communication")`, `.png`, `.run`: the local run's `ClusterResult`, or the
    SageMaker job's `JobResult`).

    Hyperparameters: the lab's local defaults, then its `profile_hyperparameters` (e.g. one epoch),
    then `hyperparameters`. Every check (the lab can be profiled, steps, the script's own checks of the
    hyperparameters, e.g. that the profiled steps fit in an epoch) happens before any process starts.

    `mode="sagemaker"` runs the same as a SageMaker training job (`workshop.runner.run_on_sagemaker`,
    with `confirm_cost` and any of its other fields, e.g. `instance_type`); each rank's trace lands in
    its host's /opt/ml/output/data, SageMaker uploads every host's in one output.tar.gz, and the
    report is built from that archive, downloaded into `runs_dir/<job>/output/`.

    `title`: the report's heading (default: the lab and the layout), e.g. to tell apart two runs of one
    layout. With `echo`, the table is printed, or in a notebook displayed once, rendered as a table.
    """
    if isinstance(lab, str):
        lab = get_lab(lab)
    check_profilable(lab, steps)
    if mode not in ("local", "sagemaker"):
        raise WorkshopError(f"Unknown mode {mode!r}.", "profile with mode='local' or mode='sagemaker'.")
    if mode == "local" and sagemaker_fields:
        raise WorkshopError(f"{', '.join(sorted(sagemaker_fields))} appl(y/ies) to mode='sagemaker' only.",
                            "drop them, or profile with mode='sagemaker'.")
    hps = {**lab.profile_hyperparameters, **(hyperparameters or {}), lab.profile_flag: steps}
    with given_as({lab.profile_flag: "--steps N"}):  # the script's checks name its flag; the user wrote --steps
        if mode == "sagemaker":
            return _profile_on_sagemaker(lab, hosts=hosts, procs_per_host=procs_per_host, hps=hps, data_dir=data_dir,
                                         runs_dir=runs_dir, echo=echo, confirm_cost=confirm_cost, title=title,
                                         **sagemaker_fields)
        result: ClusterResult = run_local(lab, hosts=hosts, procs_per_host=procs_per_host, hyperparameters=hps,
                                          data_dir=data_dir, runs_dir=runs_dir, echo=echo, verbose=verbose,
                                          stall_s=stall_s)
    layout = f"{len(result.hosts)} host(s), {result.world_size} rank(s)"
    report = report_from([h.output_data_dir for h in result.hosts], out_dir=result.workdir / "profile",
                         title=title or f"{lab.label}, {layout}")
    report.run = result
    _say(report, result.workdir / "profile", echo)
    return report


def _profile_on_sagemaker(lab: Lab, *, hosts: int | None, procs_per_host: int | None, hps: dict[str, Any],
                          data_dir: str | Path | None, runs_dir: str | Path | None, echo: bool,
                          confirm_cost: Any, title: str | None = None, **fields: Any) -> ProfileReport:
    # hosts / procs_per_host None: the lab's route's defaults (plan_job resolves them)
    job = run_on_sagemaker(lab, hosts=hosts, procs_per_host=procs_per_host, hyperparameters=hps,
                           data_dir=data_dir, confirm_cost=confirm_cost, **fields)
    if not job.ok:
        raise WorkshopError(f"The profiled job {job.job_name} ended {job.status}: {job.failure_reason or '(no reason)'}",
                            f"read its logs ({job.console_url}); fix what they say and profile again.")
    folder = Path(runs_dir) if runs_dir else DEFAULT_RUNS_DIR
    output = job.download_output(folder / job.job_name / "output")
    report = report_from(output, out_dir=folder / job.job_name / "profile", title=title or f"{lab.label}, SageMaker job {job.job_name}")
    report.run = job
    _say(report, folder / job.job_name / "profile", echo)
    return report


def _say(report: ProfileReport, out: Path, echo: bool) -> None:
    if not echo:
        return
    if in_notebook():  # rendered once, as a table: not printed as text and then rendered again by the cell
        from IPython.display import Markdown, display

        display(Markdown(report.table(markdown=True)))
    else:
        print(report.table(), flush=True)
    print(f"Traces (open in https://ui.perfetto.dev): {out / 'traces'}; plot: {report.png}", flush=True)
