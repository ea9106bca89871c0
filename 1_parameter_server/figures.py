"""Lab 1's plots and tables, read from the run's metric lines: the notebook calls each in one line.

    figures.worker_steps(records)          # steps per worker over time, against a synchronous job
    figures.variables(model_dir)           # the model's variables: name -> shape, and their table
    figures.ps_load(placement, shapes)     # the bytes each parameter server holds
    figures.step_bytes_measured(records)   # the loopback bytes per step the coordinator counted
    figures.staleness(records, alone)      # each worker's histogram of staleness, and one worker's alone
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from workshop.teaching import show, table


def worker_steps(records: list[dict]) -> dict:
    """Each worker's steps over the run (measured on the workers), and the dashed line a synchronous job
    would have followed with the same two machines: every step at the slowest worker's pace. Returns the
    numbers the plot shows: per worker its total steps and step time, the steps done asynchronously and
    the steps a synchronous job would have done in the same time."""
    timeline: dict[int, tuple[list, list]] = {}
    for r in records:
        if "worker_steps" in r:
            timeline.setdefault(r["worker"], ([], []))
            timeline[r["worker"]][0].append(r["t"])
            timeline[r["worker"]][1].append(r["worker_steps"])
    step_time = {r["worker"]: r["worker_step_time_s"] for r in records if "worker_step_time_s" in r}
    totals = {r["worker"]: r["worker_total_steps"] for r in records if "worker_total_steps" in r}
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for worker, (t, n) in sorted(timeline.items()):
        ax.plot(t, n, label=f"worker rank {worker} (async): {n[-1]} steps, {step_time[worker] * 1000:.0f} ms/step")
    t_end = max(max(t) for t, _ in timeline.values())
    slowest = max(step_time.values())
    ts = np.linspace(0, t_end, 50)
    ax.plot(ts, ts / slowest, "k--", label=f"each worker, synchronous: paced by the slowest ({slowest * 1000:.0f} ms/step)")
    ax.set_xlabel("seconds since training started")
    ax.set_ylabel("steps completed")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    plt.show()
    async_total = sum(n[-1] for _, n in timeline.values())
    sync_total = len(timeline) * t_end / slowest
    print(f"in {t_end:.1f} s: {async_total} steps asynchronously; a synchronous job would have done about {sync_total:.0f}")
    return {"totals": totals, "step_time": step_time, "seconds": t_end, "async_steps": async_total,
            "sync_steps": sync_total}


def placement_of(records: list[dict]) -> dict[str, list[str]]:
    """{variable: [the device of each of its shards]}, from the coordinator's placement lines."""
    placement: dict[str, list[str]] = {}
    for r in records:
        if "device" in r:
            placement.setdefault(r["variable"], []).append(r["device"])
    return placement


def task_of(device: str) -> int:
    """'/job:ps/replica:0/task:2/device:CPU:0' -> 2."""
    match = re.search(r"/task:(\d+)", device)
    return int(match.group(1)) if match else -1


def variables(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """The model's variables as the run saved them (model.npz, in the order the model created them), shown
    as a table of shapes and bytes; returns {name: shape}."""
    with np.load(Path(model_dir) / "model.npz") as saved:
        shapes = {name: tuple(saved[name].shape) for name in saved.files}
    show(table([{"variable": n, "shape": str(s), "bytes (float32)": 4 * math.prod(s)} for n, s in shapes.items()],
               formats={"bytes (float32)": ",d"}, caption="The model's variables, in the order the model creates them"))
    return shapes


def ps_load(placement: dict[str, list], shapes: dict[str, tuple[int, ...]]) -> None:
    """The bytes each parameter server holds (shards split along the first axis, as TensorFlow splits them),
    from a placement of ps tasks or devices: each step, a worker reads them and sends a gradient of them."""
    held: dict[int, list] = {}
    for name, tasks in placement.items():
        shape = shapes[name]
        rows = np.array_split(np.arange(shape[0]), len(tasks))
        for task, part in zip(tasks, rows, strict=True):
            task = task if isinstance(task, int) else task_of(task)
            held.setdefault(task, [0, 0])
            held[task][0] += 4 * len(part) * math.prod(shape[1:])
            held[task][1] += 1
    total = sum(b for b, _ in held.values())
    show(table([{"ps task": t, "variables (shards)": n, "bytes held": b, "share": f"{b / total:.0%}"}
                for t, (b, n) in sorted(held.items())], formats={"bytes held": ",d"},
               caption="What each parameter server holds, and so serves to every step"))


def step_bytes_measured(records: list[dict]) -> float | None:
    """The loopback bytes per step the coordinator counted around each run of steps (code/cluster.py's
    Window; a local cluster only), the median over the runs after the first (which also ships the step's
    function to the workers); None where nothing was counted (a SageMaker job)."""
    counted, previous = [], 0
    for r in records:
        if "loopback_bytes" in r and "step" in r:
            counted.append(r["loopback_bytes"] / (r["step"] - previous))
            previous = r["step"]
        elif "step" in r and "train_loss" in r:
            previous = r["step"]
    steady = counted[1:] or counted
    return statistics.median(steady) if steady else None


def step_bytes_table(step_bytes, K: int, workers: int, measured: float | None) -> None:
    """The bytes per step by the learner's function, at this run's workers and at more, beside the measured."""
    rows = [{"workers": n, "step_bytes (in K)": step_bytes(K, n) / K,
             "measured (in K)": (measured / K) if (n == workers and measured) else ""} for n in (1, 2, 4, 16, 64)]
    show(table(rows, formats={"step_bytes (in K)": ".2f", "measured (in K)": ".3f"},
               caption=f"What one worker moves per step, K = {K:,} bytes of variables"))


def staleness_of(records: list[dict]) -> dict:
    """The coordinator's staleness lines (code/timeline.py's report_staleness) as numbers: {"histogram":
    {worker: {staleness: gradients}}, "mean": {worker: mean}, "overall": mean over every gradient, "max",
    "pushes": gradients in all}; empty where the run reported none."""
    histogram: dict[int, dict[int, int]] = {}
    for r in records:
        if "staleness" in r and "pushes" in r:
            histogram.setdefault(r["worker"], {})[r["staleness"]] = r["pushes"]
    if not histogram:
        return {}
    summary = next(r for r in reversed(records) if "staleness_mean" in r)
    return {"histogram": histogram,
            "mean": {r["worker"]: r["worker_staleness_mean"] for r in records if "worker_staleness_mean" in r},
            "overall": summary["staleness_mean"], "max": summary["staleness_max"], "pushes": summary["pushes_total"]}


def staleness(records: list[dict], alone: list[dict] | None = None, slowed: int | None = None) -> dict:
    """Bars: the share of each worker's gradients pushed with each staleness (updates other workers pushed
    between its read and its push), and those of the one-worker run `alone` where given; `slowed` names the
    slowed worker's rank in the legend. Returns the job's numbers (staleness_of) with "alone" (the same, of
    the one-worker run) where given."""
    job = staleness_of(records)
    series = [(f"worker rank {w}{' (slowed)' if w == slowed else ''}: mean {job['mean'][w]:.2f}", counts)
              for w, counts in sorted(job["histogram"].items())]
    one = staleness_of(alone) if alone else {}
    if one:
        series.append((f"one worker alone: mean {one['overall']:.2f}", one["histogram"][min(one["histogram"])]))
    top = max(s for _, counts in series for s in counts)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.8 / len(series)
    for i, (label, counts) in enumerate(series):
        total = sum(counts.values())
        xs = np.arange(top + 1)
        ax.bar(xs + (i - (len(series) - 1) / 2) * width, [counts.get(int(x), 0) / total for x in xs], width, label=label)
    ax.set_xlabel("staleness: updates pushed by others between a step's read and its push")
    ax.set_ylabel("share of the worker's steps")
    ax.set_xticks(range(top + 1))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    ax.set_title(f"{job['pushes']} gradients, mean staleness {job['overall']:.2f}", fontsize=10)
    plt.show()
    return {**job, "alone": one} if alone is not None else job
