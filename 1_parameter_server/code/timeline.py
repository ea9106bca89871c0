"""The coordinator's reports of which worker ran which step, and when (how asynchrony shares the work), and of
how stale each step's gradient was (what asynchrony costs); and each server's report of its own start."""

from __future__ import annotations

import os
import platform
import time

import numpy as np

from contract import metrics


def report_timeline(events: list[tuple[float, int, int]], t0: float, bin_s: float) -> None:
    """Per worker: steps completed by the end of each time bin, and its mean step time.

    `events`: (time, worker rank, staleness) per step. Measured on the workers: each step returns the
    worker's rank and the time it finished
    (`tf.timestamp()` there). Hosts' clocks agree to milliseconds (NTP on SageMaker; one clock
    locally), far finer than the bins.
    """
    if not events:
        return
    start = min(t0, min(t for t, _, _ in events))
    end = max(t for t, _, _ in events) - start
    for worker in sorted({w for _, w, _ in events}):
        times = sorted(t - start for t, w, _ in events if w == worker)
        edges = np.arange(bin_s, end + bin_s, bin_s)
        counts = np.searchsorted(times, edges, side="right")
        for t, c in zip(edges, counts, strict=True):
            metrics(rank=0, worker=worker, t=float(round(t, 3)), worker_steps=int(c))
        busy = (times[-1] - times[0]) / max(len(times) - 1, 1)
        metrics(rank=0, worker=worker, worker_total_steps=len(times), worker_step_time_s=float(busy))


def count_push(tf, updates, after):
    """At a step's push (once `after`, its gradients, exist): count one more update on the parameter server
    that holds `updates`, and return the count before it. One operation there, an atomic fetch-and-add
    (ResourceCountUpTo), so two workers pushing at once get different counts. Less the count the step read
    with the variables, it is the step's staleness: the updates other workers pushed in between."""
    with tf.control_dependencies(after), tf.device(updates.device):
        return tf.raw_ops.ResourceCountUpTo(resource=updates.handle, limit=2**62, T=tf.int64)


def staleness_histogram(events: list[tuple[float, int, int]]) -> dict[int, dict[int, int]]:
    """{worker: {staleness: how many of its steps had it}} from (time, worker, staleness) per step."""
    histogram: dict[int, dict[int, int]] = {}
    for _, worker, staleness in events:
        counts = histogram.setdefault(worker, {})
        counts[staleness] = counts.get(staleness, 0) + 1
    return {w: dict(sorted(c.items())) for w, c in sorted(histogram.items())}


def report_staleness(events: list[tuple[float, int, int]]) -> None:
    """Per worker, the histogram of its gradients' staleness (one line per value seen: `staleness=S pushes=N`)
    and its mean; then the mean and maximum over every gradient pushed.

    A step's staleness is the number of updates other workers pushed between the moment it read the
    variables and the moment it pushed its gradient (train.py's `train_step`, with `count_push`): 0 means
    no other update landed in between, so its gradient was computed on the variables it updates.
    """
    if not events:
        return
    for worker, counts in staleness_histogram(events).items():
        for staleness, n in counts.items():
            metrics(rank=0, worker=worker, staleness=staleness, pushes=n)
        total = sum(counts.values())
        metrics(rank=0, worker=worker, worker_pushes=total,
                worker_staleness_mean=float(sum(s * n for s, n in counts.items()) / total))
    values = [s for _, _, s in events]
    metrics(rank=0, pushes_total=len(values), staleness_mean=float(np.mean(values)), staleness_max=max(values))


def serving_line(task_type: str, task_id: int, target: str, import_s: float, started: float) -> str:
    """What a server prints once it serves: where, and how long its start took (TensorFlow's import, most of it)."""
    host = os.environ.get("SM_CURRENT_HOST", platform.node())
    return (f"{task_type} {task_id} serving at {target} (host {host}; TensorFlow imported in {import_s:.1f} s, "
            f"serving {time.perf_counter() - started:.1f} s after the start)")
