"""Draw ring all-reduce, step by step, from a simulation of the algorithm (images/ring_allreduce.png).

    python 2_horovod/draw_ring.py [--ranks 4] [--out images/ring_allreduce.png]

Each panel is the state after one step: a row per rank, a column per chunk (K/N bytes each),
the number in a cell how many ranks' gradients that rank's copy of the chunk already sums.
Scatter-reduce: at step s rank r sends chunk (r - s) mod N to rank r+1, which adds it to its
own. After N-1 steps each rank owns one complete chunk (N). All-gather: the complete chunks go
round the ring, replacing, for N-1 more steps. Every step, every rank sends one chunk: 2(N-1)
chunks of K/N bytes per rank in all. The simulation asserts the end state, so the picture is
the algorithm, not a drawing of it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def simulate(n: int) -> list[tuple[str, np.ndarray]]:
    """States of ring all-reduce on n ranks: (title, counts[rank, chunk])."""
    counts = np.ones((n, n), dtype=int)  # every rank starts with its own contribution to each chunk
    states = [("start: each rank has its own gradients", counts.copy())]
    for s in range(n - 1):  # scatter-reduce
        sent = {r: ((r - s) % n, counts[r, (r - s) % n]) for r in range(n)}
        for r, (chunk, value) in sent.items():
            counts[(r + 1) % n, chunk] += value
        states.append((f"scatter-reduce step {s + 1}", counts.copy()))
    for r in range(n):
        assert counts[r, (r + 1) % n] == n, counts  # rank r owns chunk r+1, fully summed
    for s in range(n - 1):  # all-gather
        sent = {r: ((r + 1 - s) % n, counts[r, (r + 1 - s) % n]) for r in range(n)}
        for r, (chunk, value) in sent.items():
            counts[(r + 1) % n, chunk] = value
        states.append((f"all-gather step {s + 1}", counts.copy()))
    assert (counts == n).all(), counts
    return states


def draw(n: int, out: Path) -> Path:
    states = simulate(n)
    cols = n
    rows = int(np.ceil(len(states) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.5 * rows + 0.6))
    for ax in axes.flat[len(states):]:
        ax.axis("off")
    for ax, (title, counts) in zip(axes.flat, states, strict=False):
        ax.imshow(counts, cmap="Blues", vmin=0, vmax=n + 1)
        for r in range(n):
            for c in range(n):
                ax.text(c, r, str(counts[r, c]), ha="center", va="center",
                        color="white" if counts[r, c] == n else "black", fontsize=9)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)], fontsize=7)
    fig.suptitle(
        f"Ring all-reduce on {n} ranks: numbers = how many ranks' gradients each chunk copy sums\n"
        f"every step each rank sends one chunk (K/{n}) to the next: 2(N-1) = {2 * (n - 1)} steps, "
        f"2(N-1)K/N per rank",
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--out", type=Path, default=ROOT / "images" / "ring_allreduce.png")
    a = p.parse_args()
    print(draw(a.ranks, a.out))
