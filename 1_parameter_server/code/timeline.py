"""The coordinator's report of which worker ran which step, and when: how asynchrony shares the work."""

from __future__ import annotations

import numpy as np

from contract import metrics


def report_timeline(events: list[tuple[float, int]], t0: float, bin_s: float) -> None:
    """Per worker: steps completed by the end of each time bin, and its mean step time.

    Measured on the workers: each step returns the worker's rank and the time it finished
    (`tf.timestamp()` there). Hosts' clocks agree to milliseconds (NTP on SageMaker; one clock
    locally), far finer than the bins.
    """
    if not events:
        return
    start = min(t0, min(t for t, _ in events))
    end = max(t for t, _ in events) - start
    for worker in sorted({w for _, w in events}):
        times = sorted(t - start for t, w in events if w == worker)
        edges = np.arange(bin_s, end + bin_s, bin_s)
        counts = np.searchsorted(times, edges, side="right")
        for t, c in zip(edges, counts, strict=True):
            metrics(rank=0, worker=worker, t=float(round(t, 3)), worker_steps=int(c))
        busy = (times[-1] - times[0]) / max(len(times) - 1, 1)
        metrics(rank=0, worker=worker, worker_total_steps=len(times), worker_step_time_s=float(busy))
