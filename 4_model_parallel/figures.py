"""Lab 4's figure: memory per rank by technique and world size (stacked parameters, gradients, optimizer state), and
step time against world size, from the notebook's grid of runs (`measure.py`).

    from figures import plot_memory   # the notebook's folder is on the path
    plot_memory(runs, world_sizes, REPO_ROOT / "runs" / "figures" / "model_parallel_memory.png")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ORDER = ("no_shard", "optimizer", "shard_grad_op", "full_shard", "hybrid_shard")
PARTS = (("param_bytes", "tab:blue"), ("grad_bytes", "tab:orange"), ("optim_bytes", "tab:green"))


def plot_memory(runs: Mapping[tuple[str, int], list[dict[str, Any]]], world_sizes: Sequence[int],
                path: str | Path | None = None):
    """Draw the figure (rank 0 of each run), save it to `path` (its folder made) when given, and return it."""
    import matplotlib.pyplot as plt

    order = [t for t in ORDER if any(k[0] == t for k in runs)]
    fig, (ax, ax_t) = plt.subplots(1, 2, figsize=(12, 5.0), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / len(world_sizes)
    for j, n in enumerate(world_sizes):
        xs = [i + j * width for i, t in enumerate(order) if (t, n) in runs]
        recs = [runs[t, n][0] for t in order if (t, n) in runs]
        bottom = [0.0] * len(recs)
        for part, color in PARTS:
            vals = [r[part] / 1e6 for r in recs]
            ax.bar(xs, vals, width * 0.95, bottom=bottom, color=color, alpha=0.35 + 0.65 * (j + 1) / len(world_sizes),
                   label=f"{part.split('_')[0]} (N={n})" if j == len(world_sizes) - 1 or n == world_sizes[0] else None)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        for x, r in zip(xs, recs, strict=True):  # upright labels over narrow bars would run into each other
            ax.text(x, r["state_bytes"] / 1e6, f" N={n}", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_ylim(top=1.2 * max(recs[0]["state_bytes"] for recs in runs.values()) / 1e6)  # room above the labels
    ax.set_xticks([i + width * (len(world_sizes) - 1) / 2 for i in range(len(order))], order)
    ax.set_ylabel("state per rank (MB)")
    ax.set_title("parameters + gradients + optimizer state, per rank")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)  # under the plot
    ax.grid(axis="y", alpha=0.3)
    for t in order:
        pts = sorted((n, runs[t, n][0]["step_time_s"] * 1e3) for n in world_sizes if (t, n) in runs)
        ax_t.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t)
    ax_t.set_xlabel("world size N")
    ax_t.set_ylabel("time per step (ms, shared CPU: noisy)")
    ax_t.set_xticks(list(world_sizes))
    ax_t.set_title("step time, one thread per rank at every N")
    ax_t.grid(alpha=0.3)
    ax_t.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    fig.suptitle("Lab 4: memory per rank by technique and world size (measured)")
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig
