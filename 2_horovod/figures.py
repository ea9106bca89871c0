"""Lab 2's plots and tables: the notebook calls each in one line.

    figures.build_line(checked)                   # what `horovodrun --check-build` listed, in one line
    figures.ring_table(runs)                      # exercise 1: your ring's bytes against 2(N-1)K/N
    figures.wire_table(wire_bytes, traffic)       # exercise 2: yours, the formula and the counters
    figures.traffic_plot(traffic, traffic_mib)    # the Horovod probe's bytes against 2(N-1)K
    figures.curves(records)                       # both frameworks' loss and accuracy on the same axes
    figures.summary(records, model_dirs)          # each run summed up, as a table
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from workshop import metrics
from workshop.teaching import show, table


def build_line(checked: dict[str, bool]) -> None:
    """`horovodrun --check-build`'s list (frameworks, controllers, tensor operations: 16 lines) in one line."""
    have = [name for name, built in checked.items() if built]
    lacks = [name for name, built in checked.items() if not built]
    print(f"Horovod is built with {', '.join(have)}" + (f"; not with {', '.join(lacks)}" if lacks else ""))


def ring_table(runs) -> None:
    """Exercise 1's runs (ring_harness.Run): what each rank sent, against 2(N-1)K/N."""
    rows = []
    for r in runs:
        wire = r.wire_bytes / r.ranks / r.tensor_bytes if r.wire_bytes is not None else None
        rows.append({"N": r.ranks, "sums right": "yes" if r.correct else "no",
                     "passed to send, per rank (K)": max(r.sent_by_rank, default=0) / r.tensor_bytes,
                     "on the wire, per rank (K)": wire if wire is not None else "",
                     "2(N-1)K/N (K)": r.formula_bytes / r.tensor_bytes,
                     "messages per rank": max(r.messages_by_rank, default=0)})
    where = ("the wire: a private loopback, headers and framing included, less a window of barriers alone"
             if runs and runs[0].counted_by == "loopback" else "the tensors passed to send (no private loopback here)")
    show(table(rows, formats={"passed to send, per rank (K)": ".3f", "on the wire, per rank (K)": ".3f",
                              "2(N-1)K/N (K)": ".3f"},
               caption=f"Your ring all-reduce on gloo, K = {runs[0].tensor_bytes / 2**20:.1f} MiB; "
                       f"the check went by {where}"))


def wire_table(wire_bytes, traffic) -> None:
    """Exercise 2: `wire_bytes(N, K)` beside 2(N-1)K and what the loopback counters read, per N."""
    rows = []
    for t in traffic:
        yours = wire_bytes(t.ranks, t.bytes_per_rank_tensor)
        rows.append({"N": t.ranks, "yours (MiB)": yours / 2**20, "2(N-1)K (MiB)": t.predicted_bytes / 2**20,
                     "measured (MiB)": t.measured_bytes / 2**20, "measured / yours": t.measured_bytes / yours,
                     "per rank (K)": t.per_rank_bytes / t.bytes_per_rank_tensor})
    show(table(rows, formats={"yours (MiB)": ",.2f", "2(N-1)K (MiB)": ",.2f", "measured (MiB)": ",.2f",
                              "measured / yours": ".4f", "per rank (K)": ".3f"},
               caption="One Horovod all-reduce: the bytes loopback's counters read"))


def traffic_plot(traffic, traffic_mib: int) -> None:
    """The probe's measured bytes beside 2(N-1)K, per N, each bar labelled with the ratio."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    xs = [t.ranks for t in traffic]
    ax.bar([x - 0.15 for x in xs], [t.predicted_bytes / 2**20 for t in traffic], width=0.3, label="2(N-1)K, predicted")
    ax.bar([x + 0.15 for x in xs], [t.measured_bytes / 2**20 for t in traffic], width=0.3,
           label="measured on " + ("a private loopback" if all(t.private_loopback for t in traffic) else "loopback"))
    for t in traffic:
        ax.text(t.ranks + 0.15, t.measured_bytes / 2**20, f"x{t.ratio:.4f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs)
    ax.set_xlabel("ranks N")
    ax.set_ylabel("MiB per all-reduce")
    ax.set_title(f"One all-reduce of K = {traffic_mib} MiB")
    ax.legend(loc="upper left")
    plt.show()


def curves(records: dict[str, list[dict]]) -> None:
    """Rank 0's training loss by step and test accuracy by epoch, one line per framework."""
    panels = [("step", "train_loss"), ("epoch", "test_accuracy")]
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 3.6))
    for ax, (x, y) in zip(axes, panels, strict=True):
        for name, recs in records.items():
            xs, ys = metrics.series(recs, y, x).get(0, ([], []))
            ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, label=f"{name} (rank 0)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Lab 2: Horovod, PyTorch and TensorFlow on the same axes")
    fig.tight_layout()
    plt.show()


def summary(records: dict[str, list[dict]], model_dirs: dict) -> dict[str, dict]:
    """Each framework's run: final accuracy, speed, each rank's weights digest, the model files; shown as a
    table, and returned for the checks."""
    out = {}
    for name, recs in records.items():
        digests = {r["rank"]: r["weights_sha256"] for r in recs if "weights_sha256" in r}
        out[name] = {"final_test_accuracy": metrics.last(recs, "final_test_accuracy"), "digests": digests,
                     "samples_per_sec": metrics.last(recs, "samples_per_sec"),
                     "model_files": sorted(p.name for p in model_dirs[name].iterdir())}
    rows = []
    for name, s in out.items():
        hashes = set(s["digests"].values())
        rows.append({"framework": name, "final test accuracy": s["final_test_accuracy"],
                     "samples/s (last epoch)": s["samples_per_sec"], "ranks": len(s["digests"]),
                     "one set of weights": f"yes: {next(iter(hashes))[:16]}..." if len(hashes) == 1
                     else f"no: {len(hashes)} different",
                     "model files": ", ".join(s["model_files"])})
    show(table(rows, formats={"final test accuracy": ".4f", "samples/s (last epoch)": ",.0f"}))
    return out
