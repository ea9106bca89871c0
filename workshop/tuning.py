"""Job parallelism: a hyperparameter search as many independent jobs, locally or on SageMaker.

    python -m workshop tune data_parallel --param lr=0.01,0.05 --parallel 2 --hp epochs=1

    from workshop.tuning import tune
    result = tune("data_parallel", {"lr": [0.01, 0.05]}, parallel=2, hyperparameters={"epochs": 1})
    print(result.table()); result.plot()

Each trial is a whole training job with its own hyperparameters: nothing passes between trials,
so they scale with no communication at all (data parallelism all-reduces every step).

- **Locally** every trial is a full local-cluster job (its own simulated hosts, ports, sandbox
  and logs), run by its own `python -m workshop.tuning trial ...` process and pinned to its
  share of this machine's cores; at most `parallel` run at once. A failed trial is reported and
  the others go on; Ctrl-C (or SIGTERM, to `python -m workshop tune`) stops every trial and
  leaves nothing running, and a search killed outright (SIGKILL) takes its trials with it: each
  trial stops its cluster when its search is gone.
- **On SageMaker** the search is one tuning job (`workshop.jobs.tuning`): the service runs the
  trials, at most `parallel` at once, each a full distributed job with the lab's launcher.

Both give a `TuneResult`: the trials' table (the best marked), and a plot of the objective
against each searched hyperparameter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workshop import metrics
from workshop.cloud.cost import Confirm
from workshop.errors import WorkshopError
from workshop.jobs import DryRunRequest
from workshop.jobs.tuning import TuningOutcome
from workshop.labs import find_lab, get_lab
from workshop.runner import run_local, run_on_sagemaker
from workshop.runtime.folders import FolderLock, check_free_space, new_folder
from workshop.runtime.hostns import die_with_parent_from_start
from workshop.runtime.local_cluster import (
    DEFAULT_RUNS_DIR,
    check_machine_fits,
    check_writable_folder,
    run_folder_bytes,
)
from workshop.runtime.processes import (
    PARENT_ENV,
    DeferredInterrupt,
    Terminated,
    sigterm_as_interrupt,
)
from workshop.runtime.progress import LiveLine, bar, clock_text, in_notebook, live_display
from workshop.search import Objective, SearchSpace
from workshop.spec import Lab, given_as

POLL_S = 0.2
HEARTBEAT_S = 10.0  # a local search prints a line at least this often while trials run
STOP_GRACE_S = 30.0  # after Ctrl-C, how long a trial may take to stop its hosts before SIGTERM, then SIGKILL
RESULT_FILE = "result.json"
SEARCH_IN_USE_FIX = ("wait for that search to end (or stop it), or leave workdir unset (each search then gets a new folder "
                     "of its own; CLI: --workdir DIR puts them under DIR/runs) or pass another one.")


# The labs' scripts end a run whose training diverged on a line that starts so (their `Divergence`: a loss that
# is not finite, or a hundred times an untrained model's): the trial is "diverged", apart from the ok ones.
DIVERGED = "Training diverged:"


def say(message: str) -> None:
    print(f"[tune] {message}", flush=True)


@dataclass
class Trial:
    """One trial: its searched hyperparameters and how it ended."""

    index: int  # 1-based, in the order the search lists them
    hyperparameters: dict[str, str]  # the searched ones, as text
    status: str = "waiting"  # waiting, running, ok, diverged, failed, stopped
    metric: float | None = None  # the objective's final value
    wall_s: float | None = None
    failure: str | None = None
    folder: Path | None = None  # local: the trial's folder (its run, logs and model)
    job_name: str | None = None  # SageMaker: its training job
    cores: tuple[int, ...] = ()  # local: the cores it was pinned to
    final: dict[str, Any] = field(default_factory=dict)  # local: every metric's last value (rank 0)
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)  # local: its METRICS records

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.hyperparameters.items())


@dataclass
class TuneResult:
    """A finished (or stopped) search."""

    lab: Lab
    objective: Objective
    space: SearchSpace
    trials: list[Trial]
    mode: str
    folder: Path | None = None  # local: the search's folder; the plot goes there
    tuning_job: str | None = None  # SageMaker: the tuning job's name
    fixed: dict[str, Any] = field(default_factory=dict)  # the hyperparameters every trial shared
    layout: str = ""  # "2 host(s) x 1 process(es)"

    @property
    def best(self) -> Trial | None:
        done = [t for t in self.trials if t.status == "ok" and t.metric is not None]
        best = None
        for trial in done:
            if best is None or self.objective.better(trial.metric, best.metric):
                best = trial
        return best

    @property
    def failed(self) -> list[Trial]:
        return [t for t in self.trials if t.status != "ok"]

    def by(self, **hyperparameters: Any) -> Trial:
        """The trial with these searched values, e.g. `result.by(lr=0.05)`."""
        want = {k.replace("_", "-") if k.replace("_", "-") in self.space.names else k: str(v)
                for k, v in hyperparameters.items()}
        for trial in self.trials:
            if all(_same(trial.hyperparameters.get(k), v) for k, v in want.items()):
                return trial
        raise KeyError(f"no trial with {want}")

    def rows(self) -> list[list[str]]:
        best = self.best
        out = []
        for t in self.trials:
            out.append([
                f"{t.index}{' *' if t is best else ''}",
                *[t.hyperparameters.get(n, "") for n in self.space.names],
                "-" if t.metric is None else f"{t.metric:.4f}",
                "-" if t.wall_s is None else f"{t.wall_s:.1f} s",
                t.status if t.status == "ok" or not t.failure else f"{t.status}: {_short(_why(t))}",
            ])
        return out

    def table(self, markdown: bool = False) -> str:
        """The trials, one row each, the best marked `*`; `markdown` for a notebook's display."""
        headers = ["trial", *self.space.names, self.objective.metric, "wall time", "status"]
        rows = self.rows()
        if markdown:
            lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
        widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
        fmt = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
        return "\n".join([fmt(headers), fmt(["-" * w for w in widths]), *map(fmt, rows)])

    def summary(self) -> str:
        best = self.best
        where = f"tuning job {self.tuning_job}" if self.tuning_job else f"{self.folder}"
        head = (f"{len(self.trials)} trial(s) of {self.lab.key} ({self.layout}), {self.mode}: "
                f"{sum(t.status == 'ok' for t in self.trials)} ok, {len(self.failed)} not{_diverged(self.trials)}; {where}")
        if best is None:
            return head + "\nno trial finished with a value of " + self.objective.metric
        return (head + f"\nbest: trial {best.index} ({best.label()}): {self.objective.metric} = {best.metric:.4f} "
                f"({self.objective.direction.lower()}d)")

    def plot(self, path: str | Path | None = None):
        """The objective against each searched hyperparameter (one panel each), the best circled;
        saved as `tune.png` in the search's folder (or `path`). Returns the figure."""
        import matplotlib

        if "ipykernel" not in sys.modules:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter

        names = self.space.names
        fig, axes = plt.subplots(1, len(names), figsize=(max(6.4, 4.6 * len(names)), 4.0), squeeze=False)
        best = self.best
        for ax, name, param in zip(axes[0], names, self.space.params, strict=True):
            done = [t for t in self.trials if t.metric is not None]
            numeric = param.kind in ("int", "float")
            xs = [float(t.hyperparameters[name]) if numeric else t.hyperparameters[name] for t in done]
            ys = [t.metric for t in done]
            ax.scatter(xs, ys, s=40, color="tab:blue", zorder=3, label="trial")
            if best is not None:
                bx = float(best.hyperparameters[name]) if numeric else best.hyperparameters[name]
                ax.scatter([bx], [best.metric], s=180, facecolors="none", edgecolors="tab:red", linewidths=2,
                           zorder=4, label="best")
            if numeric and xs and min(xs) > 0 and max(xs) / min(xs) >= 10:
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(NullFormatter())  # no crowded 2x10^-2, 3x10^-2, ... labels
                values = sorted(set(xs))
                if len(values) <= 8:  # a grid: label its values as they were given
                    ax.set_xticks(values)
                    ax.set_xticklabels([f"{v:g}" for v in values], fontsize=8)
            failed = [t for t in self.trials if t.metric is None]
            ax.set_xlabel(name + (f"  ({len(failed)} trial(s) without a value)" if failed else ""))
            ax.set_ylabel(self.objective.metric)
            ax.grid(alpha=0.3)
            ax.legend(loc="best", fontsize=8)
        fig.suptitle(f"{self.lab.title}\n{self.objective.metric} per trial, {self.layout}", fontsize=11)
        fig.tight_layout()
        target = Path(path) if path else (self.folder / "tune.png" if self.folder else None)
        if target is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(target, dpi=110)
        return fig

    def save(self) -> None:
        if self.folder is None:
            return
        data = {
            "lab": self.lab.key, "mode": self.mode, "objective": asdict(self.objective), "layout": self.layout,
            "fixed": self.fixed, "space": self.space.describe(), "tuning_job": self.tuning_job,
            "best": self.best.index if self.best else None,
            "trials": [{**{k: v for k, v in asdict(t).items() if k != "records"},
                        "folder": str(t.folder) if t.folder else None} for t in self.trials],
        }
        _write_json(self.folder / "tune.json", data)


def _same(a: str | None, b: str) -> bool:
    if a is None:
        return False
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def _why(trial: Trial) -> str:
    """Why a trial is not ok, in its words: a diverged one's from the script's own line on."""
    failure = trial.failure or ""
    if trial.status == "diverged" and DIVERGED in failure:
        return failure.split(DIVERGED, 1)[1].strip()
    return failure


def _diverged(trials: list[Trial]) -> str:
    n = sum(t.status == "diverged" for t in trials)
    return f" ({n} diverged)" if n else ""


def _short(text: str, width: int = 90) -> str:
    line = next((x for x in text.strip().splitlines() if x.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def _write_json(path: Path, data: Any) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    os.replace(partial, path)


def _usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def core_shares(cpus: list[int], parallel: int) -> list[tuple[int, ...]]:
    """The cores each of `parallel` slots gets: an even split of `cpus`, or, with more slots than
    cores, one core each, shared round-robin."""
    if parallel >= len(cpus):
        return [(cpus[i % len(cpus)],) for i in range(parallel)]
    size, extra = divmod(len(cpus), parallel)
    shares, start = [], 0
    for i in range(parallel):
        n = size + (1 if i < extra else 0)
        shares.append(tuple(cpus[start : start + n]))
        start += n
    return shares


def tune(
    lab: Lab | str,
    params: list[str] | dict[str, Any],
    *,
    trials: int | None = None,
    parallel: int | None = None,
    mode: str = "local",
    hyperparameters: dict[str, Any] | None = None,
    hosts: int | None = None,
    procs_per_host: int | None = None,
    objective: str | None = None,
    seed: int = 0,
    data_dir: str | Path | None = None,
    workdir: str | Path | None = None,
    runs_dir: str | Path | None = None,
    dry_run: bool = False,
    plot: bool = True,
    confirm_cost: bool | Confirm = False,
    **sagemaker_fields: Any,
) -> TuneResult | DryRunRequest:
    """Search `params` (`["lr=0.01,0.05"]` or `{"lr": [0.01, 0.05]}`; see `workshop.search`) with
    `trials` random draws or the whole grid, at most `parallel` trials at once, each a job of
    `hosts` x `procs_per_host` with `hyperparameters` fixed; rank trials by `objective` (default:
    the lab's accuracy; `"test_loss:min"`).

    `mode="local"`: trials on the local cluster, in `workdir` (default: a new folder under
    `runs_dir`, itself default the checkout's runs/); `parallel` defaults to this machine's cores.
    `mode="sagemaker"`: one tuning job (`dry_run`: its request only); `sagemaker_fields` are
    `workshop.runner.run_on_sagemaker`'s (instance_type, role, region, network, create_role, ...);
    `parallel` defaults to 2; the tuning job starts only once its cost bound (every trial's, printed
    first) is confirmed: `confirm_cost=True` or `WORKSHOP_CONFIRM_COST=1` (see `run_on_sagemaker`).
    A local search costs nothing and needs no confirmation. Every check (names, types, the grid,
    the parallelism, the cluster's size) runs before any trial starts.
    """
    if isinstance(lab, str):
        lab = get_lab(lab)
    if mode not in ("local", "sagemaker"):
        raise WorkshopError(f"mode must be 'local' or 'sagemaker', got {mode!r}.", "pass mode='local' (CLI: --mode local).")
    fixed = dict(hyperparameters or {})
    space = SearchSpace.parse(lab, params, trials=trials, seed=seed, fixed=fixed)
    goal = Objective.parse(lab, objective)
    if parallel is not None and parallel < 1:
        raise WorkshopError(f"--parallel must be at least 1, got {parallel}.",
                            "pass --parallel 2 (trials running at once), or leave it out for the default.")
    # The script's checks of a searched value name the flag it was searched with, not --hp.
    with given_as({name: f"--param {name}=VALUES" for name in space.names}):
        if mode == "sagemaker":
            return _tune_on_sagemaker(lab, space, goal, parallel, fixed, hosts, procs_per_host, data_dir, dry_run,
                                      {**sagemaker_fields, "confirm_cost": confirm_cost})
        if dry_run:
            raise WorkshopError("--dry-run applies to --mode sagemaker.", "drop --dry-run, or add --mode sagemaker.")
        if sagemaker_fields:
            raise WorkshopError(f"{', '.join(sorted(sagemaker_fields))} apply to mode='sagemaker' only.",
                                "drop them, or pass mode='sagemaker'.")
        return _tune_locally(lab, space, goal, parallel, fixed, hosts, procs_per_host, data_dir, workdir, runs_dir,
                             plot)


def _tune_on_sagemaker(lab, space, goal, parallel, fixed, hosts, procs_per_host, data_dir, dry_run, fields):
    defaults = lab.sagemaker_route(fields.get("route"))
    hosts = hosts or defaults.instance_count
    outcome = run_on_sagemaker(
        lab, hosts=hosts, procs_per_host=procs_per_host or defaults.procs_per_host, hyperparameters=fixed,
        data_dir=data_dir, dry_run=dry_run, space=space, objective=goal, parallel=parallel, **fields,
    )
    if dry_run:
        return outcome
    assert isinstance(outcome, TuningOutcome)
    trials = []
    for summary in outcome.trials:
        number = re.search(r"-(\d{3})-[0-9a-f]+$", summary.name)
        trials.append(Trial(
            index=int(number.group(1)) if number else len(trials) + 1,
            hyperparameters={n: summary.hyperparameters.get(n, "") for n in space.names},
            status={"Completed": "ok", "Stopped": "stopped"}.get(
                summary.status, "diverged" if DIVERGED in (summary.failure or "") else "failed"),
            metric=summary.objective, wall_s=summary.wall_s, failure=summary.failure, job_name=summary.name,
        ))
    trials.sort(key=lambda t: t.index)
    result = TuneResult(lab=lab, objective=goal, space=space, trials=trials, mode="sagemaker",
                        tuning_job=outcome.name, fixed=fixed, layout=f"{hosts} instance(s)")
    _show_table(result)
    print(result.summary(), flush=True)
    return result


def _show_table(result: TuneResult) -> None:
    """The trials' table, once: rendered in a notebook, printed elsewhere."""
    if in_notebook():
        from IPython.display import Markdown, display

        display(Markdown(f"**{result.lab.key}, {result.layout}**\n\n" + result.table(markdown=True)))
    else:
        print(result.table(), flush=True)


def _tune_locally(lab, space, goal, parallel, fixed, hosts, procs_per_host, data_dir, workdir, runs_dir, plot) -> TuneResult:
    hosts = lab.local_hosts if hosts is None else hosts
    procs = lab.local_procs_per_host if procs_per_host is None else procs_per_host
    if hosts < 1 or procs < 1:
        raise WorkshopError(f"A trial needs at least 1 host and 1 process per host, got {hosts} x {procs}.",
                            "pass hosts=1 or more (CLI: --hosts 1).")
    lab.distributed_config(procs)  # the launcher's own checks of the layout
    world = hosts * procs
    combos = space.trials()
    base = {**lab.local_hyperparameters, **fixed}
    for combo in combos:  # names and types, before the data is even looked at
        lab.validate_hyperparameters({**base, **combo}, world_size=world)
    cpus = _usable_cpus()
    parallel = min(parallel or max(1, len(cpus) // world) or 1, len(combos))
    try:
        check_machine_fits(hosts * parallel, procs)  # every trial running at once, on this machine
    except WorkshopError as exc:
        raise WorkshopError(f"{parallel} trial(s) at once: {exc.message}",
                            "run fewer at once (--parallel 1), or smaller trials (--hosts 1).") from None
    parent = Path(workdir) if workdir else Path(runs_dir or DEFAULT_RUNS_DIR)
    fix = "pass workdir= (CLI: --workdir DIR), a folder you can write."
    check_writable_folder(parent, "the search's folder", fix)
    check_free_space(parent, len(combos) * run_folder_bytes(lab.source_dir, hosts, lab.distributed_config(procs)),
                     f"the search's folder ({len(combos)} trial(s), each a run folder with its hosts' copies of the code "
                     "and their logs)", "free space on that disk, or pass workdir= (CLI: --workdir DIR) on a disk with room.")
    with contextlib.ExitStack() as held:
        # One search per folder: one given by name is this search's while it runs (another is refused, named),
        # and a new one is made under a name no other search has, even one started in the same second.
        if workdir:
            held.enter_context(FolderLock(workdir, "the search's folder", SEARCH_IN_USE_FIX))
        channels = lab.data.prepare(data_dir)  # once, before any trial: the trials only read it
        for combo in combos:
            lab.validate_hyperparameters({**base, **combo}, world_size=world, train_samples=channels.n_train)
        if workdir:
            folder = Path(workdir).resolve()
        else:
            folder = new_folder(parent, f"tune-{lab.key.replace('_', '-')}-{time.strftime('%Y%m%d-%H%M%S')}")
            held.enter_context(FolderLock(folder, "the search's folder", SEARCH_IN_USE_FIX))
        return _search(lab, space, goal, parallel, fixed, hosts, procs, data_dir, plot, folder, base, combos, cpus)


def _search(lab, space, goal, parallel, fixed, hosts, procs, data_dir, plot, folder, base, combos, cpus) -> TuneResult:
    shares = core_shares(cpus, parallel)
    result = TuneResult(lab=lab, objective=goal, space=space, mode="local", folder=folder.resolve(), fixed=fixed,
                        trials=[Trial(i + 1, combo) for i, combo in enumerate(combos)],
                        layout=f"{hosts} host(s) x {procs} process(es)")
    say(f"{lab.label}: {space.describe()}")
    for note in space.notes:
        say(note)
    each = (f"{len(shares[0])} core(s) each" if parallel <= len(cpus)
            else f"1 core each, {parallel} trials sharing {len(cpus)} core(s)")
    say(f"{len(combos)} trial(s), at most {parallel} at once on {len(cpus)} core(s): {each}; each trial "
        f"{result.layout} with {json.dumps(base)} fixed; objective: {goal.direction.lower()} {goal.metric}")
    say(f"trial folders, logs and the plot: {result.folder}")
    _run_trials(lab, result, base, hosts, procs, data_dir, shares)
    result.save()
    _show_table(result)
    print(result.summary(), flush=True)
    if plot and any(t.metric is not None for t in result.trials):
        import matplotlib.pyplot as plt

        plt.close(result.plot())  # saved, not shown: in a notebook, `result.plot()` shows it
        say(f"plot: {result.folder / 'tune.png'} (in Python: result.plot())")
    return result


class SearchProgress:
    """A local search's one live display (a notebook's output redrawn in place, a terminal's line redrawn:
    `workshop.runtime.progress.LiveLine`), instead of a line as each trial starts and ends and one every
    10 s (84 lines for lab 3's two searches):

        search ▕███████████▋        ▏ 7/12 trials 01:40 (~01:11 left) running: trial 8 (lr=0.1) 21 s, trial 9 (lr=0.2) 3 s; best test_accuracy 0.9610

    Redrawn every second, so its clock moves while trials train. A failed trial still gets its lines."""

    def __init__(self, total: int, objective: Objective, clock=time.monotonic):
        self.total, self.objective, self.clock = total, objective, clock
        self.t0 = clock()
        self._line = LiveLine()
        self._line.draw(self.text([], []))

    def postfix(self, running: list[tuple[Trial, float]], done: list[Trial]) -> str:
        now = self.clock()
        parts = ["running: " + ", ".join(f"trial {t.index} ({t.label()}) {now - t0:.0f} s" for t, t0 in running)
                 if running else "no trial running"]
        values = [t.metric for t in done if t.metric is not None]
        if values:
            best = max(values) if self.objective.maximize else min(values)
            parts.append(f"best {self.objective.metric} {best:.4f}")
        failed = sum(t.status != "ok" for t in done)
        if failed:
            parts.append(f"{failed} failed")
        return "; ".join(parts)

    def text(self, running: list[tuple[Trial, float]], done: list[Trial]) -> str:
        elapsed = self.clock() - self.t0
        left = f" (~{clock_text(elapsed * (self.total - len(done)) / len(done))} left)" if 0 < len(done) < self.total else ""
        return (f"search {bar(len(done), self.total)} {len(done)}/{self.total} trials {clock_text(elapsed)}{left} "
                f"{self.postfix(running, done)}")

    def update(self, running: list[tuple[Trial, float]], done: list[Trial]) -> None:
        self._line.draw(self.text(running, done))

    def write(self, line: str) -> None:
        self._line.write(line)

    def close(self) -> None:
        self._line.close()


def _run_trials(lab, result: TuneResult, base, hosts, procs, data_dir, shares) -> None:
    waiting = deque(result.trials)
    running: dict[int, tuple[Trial, subprocess.Popen, float]] = {}  # slot -> trial
    free = list(range(len(shares)))
    total = len(result.trials)
    said = time.monotonic()  # when the last line was printed: a line at least every HEARTBEAT_S
    display = SearchProgress(total, result.objective) if live_display() else None
    done: list[Trial] = []

    def note(line: str, always: bool = False) -> None:  # with a display, only what it cannot show
        if display is None:
            say(line)
        elif always:
            display.write(f"[tune] {line}")

    try:
        while waiting or running:
            while waiting and free:
                slot, trial = free.pop(0), waiting.popleft()
                with DeferredInterrupt():  # a Ctrl-C (or SIGTERM) during the start comes once it is recorded
                    running[slot] = (trial, _start_trial(lab, trial, base, hosts, procs, data_dir, shares[slot],
                                                         result.folder), time.monotonic())
                note(f"trial {trial.index}/{total} started: {trial.label()} (cores {','.join(map(str, trial.cores))})")
                said = time.monotonic()
            time.sleep(POLL_S)
            if display is not None and time.monotonic() - said >= 1.0:
                display.update([(t, t0) for t, _, t0 in running.values()], done)
                said = time.monotonic()
            if display is None and running and time.monotonic() - said >= HEARTBEAT_S:
                now = time.monotonic()
                say("still running: " + ", ".join(f"trial {t.index}/{total} ({t.label()}) {now - t0:.0f} s"
                                                  for t, _, t0 in running.values()))
                said = now
            for slot, (trial, proc, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[slot]
                free.append(slot)
                _collect(trial, proc.returncode, time.monotonic() - t0, result.objective)
                result.save()
                done.append(trial)
                said = time.monotonic()
                left = f"{len(running)} running, {len(waiting)} waiting"
                if trial.status == "ok":
                    value = "no value" if trial.metric is None else f"{result.objective.metric}={trial.metric:.4f}"
                    note(f"trial {trial.index}/{total} ok in {trial.wall_s:.1f} s: {value} ({left})")
                else:
                    note(f"trial {trial.index}/{total} {'DIVERGED' if trial.status == 'diverged' else 'FAILED'} after "
                         f"{trial.wall_s:.1f} s ({left}): {trial.failure}",
                         always=True)
                    note(f"  its logs: {trial.folder}", always=True)
                if display is not None:
                    display.update([(t, t0) for t, _, t0 in running.values()], done)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (workshop.runtime.processes.Terminated)
        why = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
        if display is not None:
            display.close()
            display = None
        say(f"{why}: stopping {len(running)} running trial(s)")
        _stop(running, why)
        for trial in waiting:
            trial.status = "stopped"
        result.save()
        print(result.table(), flush=True)
        raise
    finally:
        if display is not None:
            display.close()


def _start_trial(lab, trial: Trial, base, hosts, procs, data_dir, cores, folder: Path) -> subprocess.Popen:
    trial.folder = folder / f"trial-{trial.index:03d}"
    trial.folder.mkdir(parents=True, exist_ok=True)
    trial.cores, trial.status = tuple(cores), "running"
    spec = {
        "lab": lab.key, "lab_folder": str(lab.path), "hosts": hosts, "procs_per_host": procs,
        "hyperparameters": {**base, **trial.hyperparameters}, "data_dir": str(data_dir) if data_dir else None,
        "cores": list(cores),
    }
    _write_json(trial.folder / "trial.json", spec)
    log = open(trial.folder / "trial.log", "w", encoding="utf-8")  # noqa: SIM115 - the child writes it
    try:
        # Its own session: Ctrl-C reaches this process only, which then stops each trial in turn.
        # The trial asks to die with this process itself (PARENT_ENV: see `_main`), so a search
        # killed outright takes its trials with it.
        return subprocess.Popen([sys.executable, "-m", "workshop.tuning", "trial", str(trial.folder)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=os.getcwd(),
                                env={**os.environ, PARENT_ENV: str(os.getpid())})
    finally:
        log.close()


def _collect(trial: Trial, returncode: int, wall_s: float, objective: Objective) -> None:
    path = trial.folder / RESULT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tail = (trial.folder / "trial.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
        trial.status, trial.wall_s = "failed", round(wall_s, 1)
        trial.failure = f"the trial's process ended with status {returncode} and no result: " + " / ".join(tail)
        return
    trial.wall_s = round(wall_s, 1)  # the whole trial, its process's start included: what parallelism saves
    trial.final = data.get("final") or {}
    trial.records = data.get("records") or []
    trial.metric = trial.final.get(objective.metric)
    if data.get("returncode") == 0 and trial.metric is not None and not math.isfinite(trial.metric):
        # A run that ended "well" on a NaN (or infinite) objective diverged: it is not ok, with why;
        # a NaN would otherwise compare as neither better nor worse, and could be reported best.
        trial.status = "diverged"
        trial.failure = (f"{objective.metric} is {trial.metric}: the training diverged (a NaN or infinite "
                         "loss); try a lower learning rate")
    elif data.get("returncode") == 0:
        trial.status = "ok"
    else:
        trial.failure = data.get("failure") or f"exit status {data.get('returncode')}"
        trial.status = ("stopped" if data.get("returncode") == 130 else "diverged" if DIVERGED in trial.failure
                        else "failed")


def _stop(running: dict[int, tuple[Trial, subprocess.Popen, float]], why: str = "Ctrl-C") -> None:
    """Ctrl-C for each trial (its local cluster stops its hosts), then SIGTERM, then SIGKILL."""
    procs = [(trial, proc) for trial, proc, _ in running.values()]
    for sig, grace in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        alive = [(t, p) for t, p in procs if p.poll() is None]
        if not alive:
            break
        for _, proc in alive:
            with contextlib.suppress(ProcessLookupError):
                if sig == signal.SIGKILL:
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for _, p in alive):
            time.sleep(POLL_S)
    for trial, proc in procs:
        trial.status = "stopped"
        trial.failure = f"stopped by {why} (exit status {proc.returncode})"


# ---------------------------------------------------------------------- one trial, in its own process


def run_trial(folder: Path) -> int:
    """Run the trial described by `folder/trial.json` on the local cluster; write `result.json`."""
    spec = json.loads((folder / "trial.json").read_text(encoding="utf-8"))
    if spec.get("cores") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, spec["cores"])  # its hosts and ranks inherit it
    lab = find_lab(spec["lab"], spec["lab_folder"])
    out: dict[str, Any] = {"returncode": 1}
    t0 = time.monotonic()
    try:
        run = run_local(lab, hosts=spec["hosts"], procs_per_host=spec["procs_per_host"],
                        hyperparameters=spec["hyperparameters"], data_dir=spec["data_dir"], workdir=folder / "run",
                        echo=False, check=False)
        records = run.records
        out = {
            "returncode": run.returncode, "failure": run.failure, "wall_s": round(run.wall_time_s, 1),
            "final": {m: metrics.last(records, m) for m in lab.metrics if metrics.last(records, m) is not None},
            "records": [r for r in records if r.get("rank", 0) == 0], "log": str(run.log_path),
        }
    except WorkshopError as exc:
        out = {"returncode": 2, "failure": str(exc)}
    except KeyboardInterrupt as exc:  # the search's Ctrl-C (or SIGTERM), or its end (see `_main`)
        out = {"returncode": 130, "failure": f"stopped ({'SIGTERM' if isinstance(exc, Terminated) else 'Ctrl-C'})"}
    out.setdefault("wall_s", round(time.monotonic() - t0, 1))
    _write_json(folder / RESULT_FILE, out)
    return 0 if out["returncode"] == 0 else 1


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workshop.tuning",
                                     description="Run one trial of a search (`python -m workshop tune` starts these).")
    parser.add_argument("command", choices=("trial",))
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    # The search stops a trial with SIGINT (then SIGTERM): both stop its cluster, whatever this
    # process inherited (a search started in the background hands its trials SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with sigterm_as_interrupt():
        # A search that dies (SIGKILL, a crash) sends SIGTERM: the trial stops its cluster too.
        die_with_parent_from_start(signal.SIGTERM)
        return run_trial(args.folder)


if __name__ == "__main__":
    sys.exit(_main())
