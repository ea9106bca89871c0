"""What asynchronous SGD's stale gradients cost: lab 1 with 1, 2 and 4 workers of equal speed, side by side.

    python benchmarks/bench_staleness.py [--workers 1 2 4] [--steps 300] [--repeats 1] [--out-dir images/]
    make bench-staleness

Each run is lab 1's script (`1_parameter_server/code/train.py`) on the local cluster (`workshop.runner.run_local`)
with W + 1 simulated hosts: a parameter server on each, the coordinator on the first, W workers on the others, no
worker slowed, and the same number of steps (= updates), batch (64 per update), learning rate and momentum at every
W. Each step reports its gradient's staleness: the updates other workers pushed between its read of the variables
and its push (train.py's `train_step` counts them on a parameter server). Per W the table shows:

- the histogram of staleness over every gradient, its mean against W - 1 (the most it can be: each update lands
  inside at most one step of each other worker) and its maximum;
- the steps per second of the whole job (the median over its intervals after the first, which includes tracing
  the step) and its ratio to 1 worker: what asynchrony buys on this machine, where 2 cores run W workers, W + 1
  parameter servers and the coordinator;
- the test loss and accuracy after the same number of updates, and their difference to 1 worker: what staleness
  costs. One worker is the honest baseline: the same script, model, initial weights, batch per update, learning
  rate, momentum and number of updates, with staleness 0 (no worker can overtake it). Lab 3's synchronous DDP run
  would change the framework, the model and the batch per update (N x 64) at once.

Repeats are interleaved (1, 2, 4, 1, 2, 4, ...); with more than one the table shows medians and min-max ranges.
The batches' order is not seeded (each worker shuffles its own stream), so a difference in loss smaller than the
spread between repeats of one W is noise. Output: the table on stdout, `bench_staleness.{md,csv}` and
`bench_staleness.png` (each W's histogram, and its test loss over the updates) in --out-dir. About 1.5 minutes
per run on 2 idle cores, most of it the TensorFlow processes starting.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, load_average, write_results  # noqa: E402

from workshop import REPO_ROOT, metrics  # noqa: E402
from workshop.labs import get_lab  # noqa: E402
from workshop.runner import run_local  # noqa: E402

LAB = get_lab("parameter_server")
sys.path.insert(0, str(LAB.path))
import figures  # noqa: E402  (lab 1's: reads the coordinator's staleness lines)


def one_run(workers: int, steps: int, interval: int, scratch: Path) -> dict:
    """Lab 1 with `workers` workers: its staleness, speed and final test loss and accuracy."""
    result = run_local(LAB, hosts=workers + 1, hyperparameters={"steps": steps, "log-interval": interval},
                       workdir=Path(tempfile.mkdtemp(prefix=f"w{workers}-", dir=scratch)), echo=False)
    if not result.ok:
        raise RuntimeError(f"lab 1 with {workers} worker(s) failed: {result.failure}")
    seen = figures.staleness_of(result.records)
    histogram: dict[int, int] = {}
    for counts in seen["histogram"].values():
        for s, n in counts.items():
            histogram[s] = histogram.get(s, 0) + n
    rates = [r["steps_per_sec"] for r in result.records if "steps_per_sec" in r and r.get("rank") == 0]
    curve = [(r["step"], r["test_loss"]) for r in result.records if "test_loss" in r and "step" in r]
    return {"workers": workers, "histogram": dict(sorted(histogram.items())), "mean": seen["overall"],
            "max": seen["max"], "pushes": seen["pushes"], "steps_per_sec": statistics.median(rates[1:] or rates),
            "loss": metrics.last(result.records, "final_test_loss"),
            "accuracy": metrics.last(result.records, "final_test_accuracy"), "curve": curve}


def span(values: list[float], fmt: str) -> str:
    """The median, and the min-max range where there are several."""
    middle = format(statistics.median(values), fmt)
    return middle if len(values) == 1 else f"{middle} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def summarize(runs: list[dict], workers: list[int]) -> tuple[str, list[dict]]:
    """The markdown table and the CSV rows: one per W, medians over its repeats, ratios to the smallest W."""
    by_w = {w: [r for r in runs if r["workers"] == w] for w in workers}
    base = by_w[min(workers)]
    base_rate = statistics.median(r["steps_per_sec"] for r in base)
    base_loss = statistics.median(r["loss"] for r in base)
    base_acc = statistics.median(r["accuracy"] for r in base)
    head = ("| workers | gradients at staleness 0 / 1 / 2 / 3 / 4+ | mean staleness | at most W-1 | max | steps/s | vs 1 "
            "| test loss | vs 1 | test accuracy | vs 1 |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines, rows = [head], []
    for w in workers:
        rs = by_w[w]
        share = {}
        for r in rs:
            for s, n in r["histogram"].items():
                share[min(s, 4)] = share.get(min(s, 4), 0) + n / r["pushes"] / len(rs)
        bins = " / ".join(f"{share.get(s, 0):.0%}" for s in range(5))
        rate = statistics.median(r["steps_per_sec"] for r in rs)
        loss = statistics.median(r["loss"] for r in rs)
        acc = statistics.median(r["accuracy"] for r in rs)
        lines.append(f"| {w} | {bins} | {span([r['mean'] for r in rs], '.2f')} | {w - 1} | {max(r['max'] for r in rs)} "
                     f"| {span([r['steps_per_sec'] for r in rs], '.1f')} | {rate / base_rate:.2f}x "
                     f"| {span([r['loss'] for r in rs], '.3f')} | {loss - base_loss:+.3f} "
                     f"| {span([r['accuracy'] for r in rs], '.3f')} | {acc - base_acc:+.3f} |")
        rows.append({"workers": w, "repeats": len(rs), "staleness_mean": statistics.median(r["mean"] for r in rs),
                     "bound": w - 1, "staleness_max": max(r["max"] for r in rs),
                     **{f"share_{s}{'+' if s == 4 else ''}": round(share.get(s, 0), 4) for s in range(5)},
                     "steps_per_sec": round(rate, 2), "speedup": round(rate / base_rate, 3),
                     "test_loss": loss, "test_loss_diff": round(loss - base_loss, 5),
                     "test_accuracy": acc, "test_accuracy_diff": round(acc - base_acc, 4)})
    return "\n".join(lines), rows


def plot(runs: list[dict], workers: list[int], path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    top = max(max(r["histogram"]) for r in runs)
    width = 0.8 / len(workers)
    for i, w in enumerate(workers):
        rs = [r for r in runs if r["workers"] == w]
        shares = [statistics.mean(r["histogram"].get(s, 0) / r["pushes"] for r in rs) for s in range(top + 1)]
        mean = statistics.median(r["mean"] for r in rs)
        left.bar([s + (i - (len(workers) - 1) / 2) * width for s in range(top + 1)], shares, width,
                 label=f"{w} worker{'s' if w > 1 else ''}: mean {mean:.2f} (at most {w - 1})")
        for j, r in enumerate(rs):
            steps, losses = zip(*r["curve"], strict=True)
            right.plot(steps, losses, color=f"C{i}", alpha=1.0 if j == 0 else 0.4,
                       label=f"{w} worker{'s' if w > 1 else ''}" if j == 0 else None)
    left.set_xlabel("staleness: updates pushed by others between a step's read and its push")
    left.set_ylabel("share of the gradients")
    left.set_xticks(range(top + 1))
    left.legend(fontsize=8)
    left.grid(alpha=0.3, axis="y")
    right.set_xlabel("updates (steps)")
    right.set_ylabel("test loss")
    right.set_yscale("log")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="numbers of workers (1 is the baseline)")
    p.add_argument("--steps", type=int, default=300, help="steps (= updates) per run, the same at every W")
    p.add_argument("--log-interval", type=int, default=50, help="steps between the coordinator's evaluations")
    p.add_argument("--repeats", type=int, default=1, help="runs per number of workers, interleaved")
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "images", help="where outputs go")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.steps < 1 or min(args.workers) < 1:
        sys.exit("--repeats, --steps and every --workers value must be 1 or more")
    import matplotlib

    matplotlib.use("Agg")  # the figure goes to a file
    workers = sorted(set(args.workers))
    started = time.perf_counter()
    machine = describe_machine()
    load_before = load_average()
    print(f"Lab 1's staleness at {workers} worker(s), {args.steps} steps each, {args.repeats} repeat(s).", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-staleness-") as scratch:
        for i in range(args.repeats):
            for w in workers:
                t0 = time.perf_counter()
                run = one_run(w, args.steps, args.log_interval, Path(scratch))
                runs.append(run)
                print(f"  repeat {i + 1}, {w} worker(s): mean staleness {run['mean']:.2f}, histogram {run['histogram']}, "
                      f"{run['steps_per_sec']:.1f} steps/s, test loss {run['loss']:.4f}, accuracy {run['accuracy']:.3f} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    load_after = load_average()
    table, rows = summarize(runs, workers)
    note = (f"\nMachine: {machine['summary']}. Load average (1/5/15 min) {load_before} before, {load_after} after. "
            f"Lab 1's CNN, {args.steps} steps of batch 64 (learning rate and momentum: lab 1's defaults) at each number "
            f"of workers, {args.repeats} repeat(s); ratios and differences are to {min(workers)} worker(s), medians "
            f"where repeated. Staleness: the updates other workers pushed between a step's read and its push.")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_results(args.out_dir, "bench_staleness", table, note, rows)
    plot(runs, workers, args.out_dir / "bench_staleness.png",
         f"Lab 1, asynchronous SGD: staleness and test loss at {', '.join(map(str, workers))} workers "
         f"({machine['date']}, load {load_before})")
    print(f"\nWrote bench_staleness.md, .csv and .png to {args.out_dir} in {time.perf_counter() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
