"""Draw lab 1's topology into images/parameter_server_topology.png (run from the repo root)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "images" / "parameter_server_topology.png"


def box(ax, x, y, w, h, text, color):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="black", lw=1))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9)


def arrow(ax, a, b, style="-|>", color="black", ls="-", rad=0.0):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, color=color, ls=ls, lw=1.2,
                                 connectionstyle=f"arc3,rad={rad}"))


def main() -> None:
    fig, ax = plt.subplots(figsize=(9, 4.6))
    for i, host in enumerate(["algo-1", "algo-2", "algo-3"]):
        x = 0.3 + i * 3.1
        ax.add_patch(FancyBboxPatch((x, 0.2), 2.8, 3.6, boxstyle="round,pad=0.03", fc="#f4f4f4", ec="grey", ls="--"))
        ax.text(x + 1.4, 3.6, f"{host} (host rank {i})", ha="center", fontsize=10, weight="bold")
        box(ax, x + 0.2, 0.5, 2.4, 0.9, f"parameter server ps {i}\nshard {i} of the variables", "#cfe2ff")
        if i == 0:
            box(ax, x + 0.2, 2.1, 2.4, 1.0, "coordinator (chief)\nClusterCoordinator:\nschedules steps, no SGD", "#ffe5b4")
        else:
            box(ax, x + 0.2, 2.1, 2.4, 1.0, f"worker {i - 1} (rank {i})\nruns a step when free:\nread vars, grad, update", "#d4f7d4")
    # coordinator -> workers (schedule)
    arrow(ax, (2.9, 2.8), (3.6, 2.8), color="#c26b00")
    arrow(ax, (1.4, 3.1), (7.9, 3.1), color="#c26b00", rad=-0.12)  # over worker 0, not through it
    ax.text(3.25, 2.95, "schedule", fontsize=8, color="#c26b00", ha="center")
    # workers <-> every ps (pull variables, push updates)
    for w in (1, 2):
        wx = 0.3 + w * 3.1 + 1.4
        for p in range(3):
            px = 0.3 + p * 3.1 + 1.4 + (w - 1.5) * 0.4
            arrow(ax, (wx + (p - 1) * 0.3, 2.1), (px, 1.4), style="<|-|>", color="#2b6cb0", ls="-")
    ax.text(4.65, 1.72, "read variables / apply gradients (asynchronous)", fontsize=8, color="#2b6cb0", ha="center",
            bbox={"fc": "white", "ec": "none", "pad": 1})
    ax.set_xlim(0, 9.6)
    ax.set_ylim(0, 4.1)
    ax.axis("off")
    ax.set_title("Lab 1: one parameter server per host, the coordinator on algo-1, workers on the others", fontsize=10)
    fig.tight_layout()
    OUT.parent.mkdir(exist_ok=True)
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
