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


def plot_pipeline(records: Sequence[Mapping[str, Any]], path: str | Path | None = None, title: str = ""):
    """code/pipeline.py's run in three panels: each stage's forwards and backwards in one step of GPipe and of 1F1B
    (at the largest m both ran; the gaps are the bubble), each stage's idle share against (p-1)/(m+p-1), and the
    activations the first stage kept at once (findings.py, beside this file, makes the rows). Saved to `path` (its folder made) when given; returns the figure."""
    import matplotlib.pyplot as plt
    from findings import pipeline_rows

    from workshop import planner

    rows = pipeline_rows(records)
    fig, (ax_t, ax_i, ax_a) = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [5, 3, 3]})
    both = max(m for m in {r["microbatches"] for r in records}
               if {planner.GPIPE, planner.ONE_F_ONE_B} <= {r["schedule"] for r in records if r["microbatches"] == m})
    lanes, ticks, y = [], [], 0
    for schedule in planner.SCHEDULES:
        mine = sorted((r for r in records if (r["schedule"], r["microbatches"]) == (schedule, both)),
                      key=lambda r: r["rank"])
        for r in {x["rank"]: x for x in mine}.values():  # one round's timeline per stage
            count = {"forward": 0, "backward": 0}  # both schedules run the micro-batches in order, each way
            for kind, begin, end in r["timeline"]:
                color = "tab:blue" if kind == "forward" else "tab:orange"
                ax_t.barh(y, (end - begin) * 1e3, left=begin * 1e3, height=0.7, color=color, edgecolor="white")
                ax_t.text((begin + end) / 2 * 1e3, y, str(count[kind]), ha="center", va="center", fontsize=7,
                          color="white")
                count[kind] += 1
            lanes.append(f"{'GPipe' if schedule == planner.GPIPE else '1F1B'}, stage {r['rank']}")
            ticks.append(y)
            y += 1
        y += 0.5
    ax_t.set_yticks(ticks, lanes)
    ax_t.invert_yaxis()
    ax_t.set_xlabel("ms into the step")
    ax_t.set_title(f"one step at m = {both}: forwards (blue) and backwards (orange), by micro-batch; white: waiting",
                   fontsize=9)
    ms = sorted({r["m"] for r in rows})
    p = rows[0]["stages"]
    fine = [1 + i / 10 for i in range(10 * (max(ms) - 1) + 1)]
    ax_i.plot(fine, [(p - 1) / (m + p - 1) for m in fine], "k-", alpha=0.6, label="(p-1)/(m+p-1)")
    for schedule, marker in ((planner.GPIPE, "o"), (planner.ONE_F_ONE_B, "s")):
        mine = [r for r in rows if r["schedule"] == schedule]
        for stage in range(p):
            ax_i.plot([r["m"] for r in mine], [r["idle"][stage] for r in mine], marker, fillstyle="full" if stage == 0
                      else "none", color="tab:blue" if schedule == planner.GPIPE else "tab:red",
                      label=f"{'GPipe' if schedule == planner.GPIPE else '1F1B'}, stage {stage}")
    ax_i.set_xscale("log", base=2)
    ax_i.set_xticks(ms, [str(m) for m in ms])
    ax_i.set_xlabel("micro-batches m")
    ax_i.set_ylabel("idle share of the step")
    ax_i.set_title("idle share against the bubble", fontsize=9)
    ax_i.legend(fontsize=7)
    ax_i.grid(alpha=0.3)
    for schedule, color in ((planner.GPIPE, "tab:blue"), (planner.ONE_F_ONE_B, "tab:red")):
        mine = [r for r in rows if r["schedule"] == schedule]
        label = "GPipe" if schedule == planner.GPIPE else "1F1B"
        ax_a.plot([r["m"] for r in mine], [r["saved_bytes"][0] / 1e6 for r in mine], "o-", color=color,
                  label=f"{label}, measured")
        ax_a.plot([r["m"] for r in mine], [r["planner"].activation_bytes / 1e6 for r in mine], "x:", color=color,
                  markersize=9, label=f"{label}, planner")
    ax_a.set_xscale("log", base=2)
    ax_a.set_xticks(ms, [str(m) for m in ms])
    ax_a.set_ylim(bottom=0)
    ax_a.set_xlabel("micro-batches m")
    ax_a.set_ylabel("MB kept for backward at once")
    ax_a.set_title("activations the first stage keeps", fontsize=9)
    ax_a.legend(fontsize=7)
    ax_a.grid(alpha=0.3)
    fig.suptitle(title or f"Pipeline parallel on {p} stages: GPipe and 1F1B, measured", fontsize=10)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig

