"""Lab 3's plots, one function per figure, so that the notebooks' cells show the lesson and not matplotlib:

    from figures import plot_recovery                  # the notebooks put this folder on sys.path

data_parallel.ipynb: `plot_efficiency` (the planner's scaling efficiency), `plot_accumulation` (the train losses of
1 rank at --grad-accum 2 and of 2 ranks, step by step). job_parallelism.ipynb:
`plot_lr_curves` (accuracy against the learning rate, per world size). fault_tolerance.ipynb:
`plot_recovery` (the loss and the clock of a run that lost a rank, against one that did not). Each returns
its figure; the notebook shows it (`plt.show()`). The numbers they draw are read by findings.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

# --------------------------------------------------------------------------- data_parallel.ipynb


def plot_efficiency(gpus: Sequence[int], efficiency: Mapping[str, Sequence[float]],
                    title: str = "DDP, predicted by workshop.planner"):
    """The planner's scaling efficiency against the GPU count, one line per model."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, effs in efficiency.items():
        ax.plot(gpus, effs, "o-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(gpus), [str(n) for n in gpus])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="GPUs (8 per ml.p4d.24xlarge)", ylabel="predicted scaling efficiency", ylim=(0, 1.05), title=title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def plot_accumulation(comparison: Any, title: str = "The same global batch, split over ranks or micro-batches"):
    """The train loss of each optimizer step over its whole global batch, for 2 ranks at K = 1 and for 1 rank at
    K = 2 (an accumulation.Comparison): one tick per step."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for run, style in ((comparison.reference, "o-"), (comparison.one_rank, "s--")):
        losses = run.losses()
        ax.plot(list(losses), list(losses.values()), style, label=f"{run.label} (global batch {run.global_batch})")
    ax.set_xticks(list(losses))
    ax.set(xlabel="optimizer step", ylabel="train loss (global batch)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- job_parallelism.ipynb


def plot_lr_curves(lrs: Sequence[float], acc: Mapping[int, Sequence[float]], world_sizes: Sequence[int],
                   per_rank_batch: int = 64):
    """Test accuracy against the learning rate at each world size, and the larger world's curve with every
    rate divided by the world sizes' ratio (dashed): where the linear scaling rule holds, it lies on the
    smaller world's curve."""
    lo, hi = world_sizes
    fig, ax = plt.subplots(figsize=(7, 4))
    for n, style in zip(world_sizes, ("o-", "s-"), strict=True):
        ax.plot(lrs, acc[n], style, label=f"world size {n} (global batch {per_rank_batch * n})")
    ax.plot([lr / (hi // lo) for lr in lrs], acc[hi], "s--", alpha=0.6, label=f"world size {hi}, lr / {hi // lo}")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(list(lrs), [f"{lr:g}" for lr in lrs])
    ax.set(xlabel="learning rate (no automatic scaling)", ylabel="test accuracy after one epoch",
           title="Does the best learning rate grow with the world size?")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- fault_tolerance.ipynb


def attempts(result: Any) -> list[list[dict[str, Any]]]:
    """Rank 0's per-step records (train loss and wall clock), split where the step count goes back (a restart)."""
    rows = [r for r in result.records if r.get("rank") == 0 and "train_loss" in r and "time" in r]
    out: list[list[dict[str, Any]]] = [[]]
    for r in rows:
        if out[-1] and r["step"] <= out[-1][-1]["step"]:
            out.append([])
        out[-1].append(r)
    return out


def plot_recovery(reference: Any, faulted: Any, fault_step: int, resumed_step: int):
    """Left: rank 0's training loss at every step, the faulted run's attempts over the reference run, the
    steps done twice shaded. Right: the step reached against the wall clock, the restart's time without a
    step dotted. Returns the figure and how many of the steps done twice gave the very same loss."""
    ref, parts = attempts(reference), attempts(faulted)
    assert len(ref) == 1 and len(parts) == 2, (len(ref), len(parts))
    t0_ref, t0 = ref[0][0]["time"], parts[0][0]["time"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot([r["step"] for r in ref[0]], [r["train_loss"] for r in ref[0]], color="0.75", lw=4, label="no failure")
    right.plot([r["time"] - t0_ref for r in ref[0]], [r["step"] for r in ref[0]], color="0.75", lw=4, zorder=0,
               label="no failure")
    for n, (rows, style) in enumerate(zip(parts, ("-", "--"), strict=True), start=1):
        left.plot([r["step"] for r in rows], [r["train_loss"] for r in rows], style, label=f"attempt {n}")
        right.plot([r["time"] - t0 for r in rows], [r["step"] for r in rows], style, label=f"attempt {n}")
    dead, back = parts[0][-1], parts[1][0]  # the last step before the death, the first one after the restart
    right.plot([dead["time"] - t0, back["time"] - t0], [dead["step"], back["step"]], ":", color="tab:red",
               label=f"restart: {back['time'] - dead['time']:.1f} s without a step")
    left.axvspan(resumed_step, fault_step, color="tab:red", alpha=0.15, label="steps done twice")
    left.axvline(fault_step, color="tab:red", lw=1)
    left.set(xlabel="global step", ylabel="training loss (rank 0)", yscale="log", title="The loss: steps redone")
    right.set(xlabel="seconds since the first step", ylabel="global step reached", title="The clock: time lost")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    first = {r["step"]: r["train_loss"] for r in parts[0]}
    same = sum(1 for r in parts[1] if r["step"] <= fault_step and first.get(r["step"]) == r["train_loss"])
    return fig, same
