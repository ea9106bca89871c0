"""Gradient accumulation and DDP's bucket size, measured on lab 3's own script in one run.

    python benchmarks/bench_grad_accum.py [--repeats 3] [--seeds 5] [--out-dir images/]
    make bench-grad-accum

Every run is `3_data_parallel/code/train.py` under torchrun (2 ranks, 1 thread each; 1 rank: a plain process)
on the MNIST channels, in a private network namespace where the system allows one (`unshare -rn`: its
loopback counters hold that run's bytes and nothing else), through `3_data_parallel/accumulation.py`, the
module the lab's notebook and tests/test_grad_accum.py measure with. Measured:

1. Accumulation, 2 ranks at K = 1, 2, 4 (`--grad-accum K`), each at two lengths (MICRO_LONG and MICRO_SHORT
   micro-batches per rank per epoch, 2 epochs): the loopback bytes per optimizer step are the difference of
   the two runs over the difference of their steps (start-up, the test and the save cancel), against the
   ring's 2(N-1) x the gradient bytes per step over all ranks; per micro-batch, that over K. The speed of the
   long run: samples/s over its second epoch, as the script reports it, and the ratio to K = 1.
2. Buckets, 2 ranks at K = 1, `--bucket-cap-mb` swept: the all-reduce calls of each optimizer step read from
   rank 0's profiler trace (`--profile-steps 3`: DDP's buckets, one call each), against DDP's rule
   (accumulation.bucket_count: each gradient whole into the open bucket, closed at its cap; torch's own
   assignment agrees, tests/test_grad_accum.py) and against ceil(gradient bytes / cap); and the step time.
3. Losses, 1 rank at K = 2 against 2 ranks at K = 1 (the same global batch, 128, and learning rate) over
   --seeds seeds: the mean |difference| of their train losses, step by step (accumulation.loss_gap), next to
   1 rank at K = 2 with the loss not divided by K (the same as twice the learning rate for SGD with
   momentum): the gaps accumulation.LOSS_TOLERANCE sits between.

The repeats of parts 1 and 2 are interleaved, so a drift in the machine's load hits every configuration; only
ratios within one run mean anything. Output: tables on stdout, `bench_grad_accum.md`, `.csv` and `.png` in
--out-dir. About 8 minutes on 2 cores with the defaults.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, load_average  # noqa: E402

from workshop import REPO_ROOT  # noqa: E402
from workshop.labs import get_lab  # noqa: E402

LAB = get_lab("data_parallel")
sys.path.insert(0, str(LAB.path))
import accumulation as acc  # noqa: E402  (3_data_parallel/accumulation.py)

KS = (1, 2, 4)
MICRO_LONG, MICRO_SHORT = 28, 12  # micro-batches per rank per epoch: whole steps at every K (4 x 7, 4 x 3)
CAPS = (0.0, 0.05, 0.5, 1.0, 2.0, 25.0)  # MiB; 0: DDP's default (25 MiB, a first bucket of 1 MiB)
PROFILE_STEPS = 3
LOSS_STEPS = acc.STEPS  # the notebook's comparison: its optimizer steps of 128


def _median(values: list[float]) -> float:
    return statistics.median(values)


def measure_accumulation(channels, scratch: Path, repeats: int, private: bool | None) -> list[dict]:
    runs: dict[tuple[int, int], list[acc.Run]] = {}
    for r in range(repeats):
        for k in KS:
            for micro in (MICRO_LONG, MICRO_SHORT):
                run = acc.run(2, k, micro // k, channels=channels, folder=scratch / f"k{k}-{micro}-{r}", epochs=2,
                              log_interval=1000, profile_steps=PROFILE_STEPS if micro == MICRO_LONG else 0,
                              private=private)
                runs.setdefault((k, micro), []).append(run)
                print(f"  K={k} {micro // k:2d} steps/epoch (repeat {r + 1}): {run.loopback_bytes / 1e6:7.2f} MB on "
                      f"loopback, {run.samples_per_sec:6.0f} samples/s, {run.wall_s:4.1f} s", flush=True)
    grad_bytes = sum(acc.gradient_sizes(LAB.load_script().Net()))
    rows = []
    for k in KS:
        long, short = runs[(k, MICRO_LONG)], runs[(k, MICRO_SHORT)]
        steps = long[0].steps - short[0].steps
        per_step = _median([a.loopback_bytes - b.loopback_bytes for a, b in zip(long, short, strict=True)]) / steps
        sps = _median([a.samples_per_sec for a in long])
        rows.append({"K": k, "global batch": long[0].global_batch, "optimizer steps (long, short)":
                     f"{long[0].steps}, {short[0].steps}", "all-reduces per step (trace)": long[0].calls_per_step,
                     "MB per step": per_step / 1e6, "formula MB per step": 2 * (2 - 1) * grad_bytes / 1e6,
                     "MB per micro-batch": per_step / k / 1e6, "share of K=1 per micro-batch": None,
                     "samples/s": sps, "range": f"{min(a.samples_per_sec for a in long):,.0f}-"
                                                f"{max(a.samples_per_sec for a in long):,.0f}",
                     "speed vs K=1": None, "private": long[0].private})
    for row in rows:
        row["share of K=1 per micro-batch"] = row["MB per micro-batch"] / rows[0]["MB per micro-batch"]
        row["speed vs K=1"] = row["samples/s"] / rows[0]["samples/s"]
    return rows


def measure_buckets(channels, scratch: Path, repeats: int, private: bool | None) -> list[dict]:
    sizes = acc.gradient_sizes(LAB.load_script().Net())
    runs: dict[float, list[acc.Run]] = {}
    for r in range(repeats):
        for cap in CAPS:
            run = acc.run(2, 1, MICRO_LONG, channels=channels, folder=scratch / f"cap{cap}-{r}", epochs=2,
                          log_interval=1000, bucket_cap_mb=cap, profile_steps=PROFILE_STEPS, private=private)
            runs.setdefault(cap, []).append(run)
            print(f"  --bucket-cap-mb {cap:g} (repeat {r + 1}): {run.calls_per_step:g} all-reduces per step, "
                  f"{run.samples_per_sec:6.0f} samples/s", flush=True)
    rows = []
    for cap in CAPS:
        mine = runs[cap]
        sps = _median([x.samples_per_sec for x in mine])
        rows.append({"bucket cap MiB": "default (25, first 1)" if not cap else f"{cap:g}",
                     "all-reduces per step (trace)": _median([x.calls_per_step for x in mine]),
                     "DDP's rule": acc.bucket_count(sizes, cap), "ceil(bytes / cap)": acc.naive_bucket_count(sum(sizes), cap),
                     "step ms": 1e3 * mine[0].global_batch / sps,
                     "range ms": f"{1e3 * mine[0].global_batch / max(x.samples_per_sec for x in mine):.1f}-"
                                 f"{1e3 * mine[0].global_batch / min(x.samples_per_sec for x in mine):.1f}",
                     "step vs default": None, "cap": cap})
    for row in rows:
        row["step vs default"] = row["step ms"] / rows[0]["step ms"]
    return rows


def measure_losses(channels, scratch: Path, seeds: int, private: bool | None) -> list[dict]:
    rows = []
    for seed in range(1, seeds + 1):
        two = acc.run(2, 1, LOSS_STEPS, channels=channels, folder=scratch / f"loss-2-{seed}", seed=seed, private=private)
        one = acc.run(1, 2, LOSS_STEPS, channels=channels, folder=scratch / f"loss-1-{seed}", seed=seed, private=private)
        # The loss not divided by K: K times the gradient, which SGD with momentum turns into K times the step.
        wrong = acc.run(1, 2, LOSS_STEPS, channels=channels, folder=scratch / f"loss-w-{seed}", seed=seed, lr=0.04,
                        private=private)
        rows.append({"seed": seed, "gap: 1 rank K=2": acc.loss_gap(one, two), "gap: loss not / K": acc.loss_gap(wrong, two),
                     "test loss: 2 ranks K=1": two.test_loss, "1 rank K=2": one.test_loss, "not / K": wrong.test_loss})
        print(f"  seed {seed}: train losses {rows[-1]['gap: 1 rank K=2']:.3f} apart per step (1 rank at K=2), "
              f"{rows[-1]['gap: loss not / K']:.3f} (not / K); test loss {two.test_loss:.3f}, {one.test_loss:.3f}, "
              f"{wrong.test_loss:.3f}", flush=True)
    return rows


def _load(text: str) -> float:
    """The 1-minute load average of machine.load_average()'s text ('n/a': 0)."""
    try:
        return float(text.split("/")[0])
    except ValueError:
        return 0.0


def _overlaps(a: str, b: str) -> bool:
    """Whether two 'low-high' ranges overlap."""
    (a0, a1), (b0, b1) = ([float(x.replace(",", "")) for x in r.split("-")] for r in (a, b))
    return a0 <= b1 and b0 <= a1


def markdown(rows: list[dict], formats: dict[str, str], skip: tuple[str, ...] = ()) -> str:
    cols = [c for c in rows[0] if c not in skip]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = []
        for c in cols:
            v = row[c]
            cells.append("" if v is None else format(v, formats[c]) if c in formats and not isinstance(v, str) else str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(accum: list[dict], buckets: list[dict], losses: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.6))
    ks = [r["K"] for r in accum]
    ax1.plot(ks, [r["MB per step"] for r in accum], "o-", label="measured, per optimizer step")
    ax1.plot(ks, [r["MB per micro-batch"] for r in accum], "s-", label="measured, per micro-batch")
    ax1.plot(ks, [r["formula MB per step"] / k for r, k in zip(accum, ks, strict=True)], "k:",
             label="2(N-1) x gradient bytes / K")
    ax1.set(xlabel="micro-batches per step, K (2 ranks)", ylabel="MB over loopback", xticks=ks, ylim=(0, None),
            title="Bytes: one all-reduce per optimizer step")
    ax1b = ax1.twinx()
    ax1b.plot(ks, [r["speed vs K=1"] for r in accum], "^--", color="grey", label="samples/s vs K = 1")
    ax1b.set_ylabel("samples/s vs K = 1", color="grey")
    ax1.legend(fontsize=7, loc="center right")
    ax1.grid(alpha=0.3)
    labels = [r["bucket cap MiB"].replace("default (25, first 1)", "default") for r in buckets]
    xs = range(len(buckets))
    ax2.bar([x - 0.27 for x in xs], [r["all-reduces per step (trace)"] for r in buckets], width=0.27,
            label="measured (profiler trace)")
    ax2.bar(list(xs), [r["DDP's rule"] for r in buckets], width=0.27, label="DDP's rule (whole gradients)")
    ax2.bar([x + 0.27 for x in xs], [r["ceil(bytes / cap)"] for r in buckets], width=0.27,
            label="ceil(gradient bytes / cap)")
    ax2.set_yscale("log")
    ax2.set_xticks(list(xs), labels)
    ax2.set(xlabel="--bucket-cap-mb (MiB)", ylabel="all-reduce calls per step", title="DDP's buckets (2 ranks, K = 1)")
    ax2b = ax2.twinx()
    ax2b.plot(list(xs), [r["step ms"] for r in buckets], "ko-", label="step time (right axis)")
    ax2b.set_ylabel("ms per optimizer step")
    ax2b.set_ylim(0, 2.2 * max(r["step ms"] for r in buckets))  # the line in the lower half, clear of the legend
    handles = ax2.get_legend_handles_labels()
    ax2.legend(handles[0] + ax2b.get_legend_handles_labels()[0], handles[1] + ["step time (right axis)"], fontsize=7,
               loc="upper right")
    seeds = [r["seed"] for r in losses]
    ax3.plot(seeds, [r["gap: 1 rank K=2"] for r in losses], "o", label="1 rank, K = 2")
    ax3.plot(seeds, [r["gap: loss not / K"] for r in losses], "x", color="red", label="1 rank, K = 2, loss not / K")
    ax3.axhline(acc.LOSS_TOLERANCE, color="grey", ls=":", label="the checks' tolerance")
    ax3.set_ylim(0, None)
    ax3.set(xlabel="seed", ylabel="mean |train loss difference| per step", xticks=seeds,
            title=f"Against 2 ranks at K = 1 ({LOSS_STEPS} steps of 128)")
    ax3.legend(fontsize=7)
    ax3.grid(alpha=0.3)
    fig.suptitle(textwrap.fill(title, 200), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs of each configuration (parts 1 and 2)")
    p.add_argument("--seeds", type=int, default=5, help="seeds of the loss comparison (part 3)")
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT / "data" / "mnist", help="MNIST channels")
    p.add_argument("--no-netns", action="store_true",
                   help="do not isolate runs in network namespaces (the machine's shared loopback counters)")
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "images", help="where outputs go")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.seeds < 1:
        sys.exit("--repeats and --seeds must be at least 1")
    started = time.perf_counter()
    machine = describe_machine()
    load_before = load_average()
    channels = LAB.data.prepare(args.data_dir)
    grad_bytes = sum(acc.gradient_sizes(LAB.load_script().Net()))
    private = False if args.no_netns else None
    isolated, why = acc.private_network() if not args.no_netns else (False, "--no-netns")
    print(f"Gradient accumulation and DDP's buckets on {machine['summary']}; load average {load_before}.")
    print(f"Lab 3's CNN: {grad_bytes:,} bytes of fp32 gradients; {channels.n_train:,} training digits "
          f"({channels.source}); micro-batch 64 per rank, 1 thread per rank. Loopback bytes: "
          + ("each run in its own network namespace." if isolated else f"the shared counters ({why})."), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-grad-accum-") as scratch:
        print("1. Accumulation, 2 ranks:", flush=True)
        accum = measure_accumulation(channels, Path(scratch), args.repeats, private)
        print("2. Buckets, 2 ranks, K = 1:", flush=True)
        buckets = measure_buckets(channels, Path(scratch), args.repeats, private)
        print("3. Losses, the same global batch and learning rate:", flush=True)
        losses = measure_losses(channels, Path(scratch), args.seeds, private)
    load_after = load_average()
    header = (f"Machine: {machine['summary']}. Load average (1/5/15 min) {load_before} before, {load_after} after.")
    t1 = markdown(accum, {"MB per step": ".3f", "formula MB per step": ".3f", "MB per micro-batch": ".3f",
                          "share of K=1 per micro-batch": ".3f", "samples/s": ",.0f", "speed vs K=1": ".2f",
                          "all-reduces per step (trace)": "g"}, skip=("private",))
    t2 = markdown(buckets, {"all-reduces per step (trace)": "g", "step ms": ".1f", "step vs default": ".2f"},
                  skip=("cap",))
    t3 = markdown(losses, {k: ".3f" for k in losses[0] if k != "seed"})
    gaps = [r["gap: 1 rank K=2"] for r in losses]
    wrong = [r["gap: loss not / K"] for r in losses]
    k2 = next(r for r in accum if r["K"] == 2)
    fc1 = max(acc.gradient_sizes(LAB.load_script().Net()))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = max(_load(load_before), _load(load_after)) > cores / 2
    faster = [f"K = {r['K']}: {r['speed vs K=1']:.2f}x" for r in accum[1:]]
    overlap = all(_overlaps(r["range"], accum[0]["range"]) for r in accum[1:])
    steps_ms = [r["step vs default"] for r in buckets[1:]]
    agrees = [r["bucket cap MiB"] for r in buckets if r["all-reduces per step (trace)"] == r["ceil(bytes / cap)"]]
    notes = [
        f"Per micro-batch, K = 2 moved {k2['share of K=1 per micro-batch']:.3f} of K = 1's bytes (the notebook's check: "
        f"0.50 +- {acc.SHARE_TOLERANCE}); per optimizer step {k2['MB per step'] / accum[0]['MB per step']:.3f} of them. "
        f"At K = 1 the measured bytes per step are {accum[0]['MB per step'] / accum[0]['formula MB per step']:.3f} x the "
        f"formula's, 2(N-1) x {grad_bytes / 1e6:.3f} MB over both ranks (the rest: TCP/IP headers, gloo's framing).",
        "Samples/s against K = 1, the same micro-batch of 64 per rank and fewer all-reduces per sample: "
        + ", ".join(faster) + (" (the ranges of the repeats overlap K = 1's: no difference this run can tell from its "
                               "noise)" if overlap else "") + ".",
        f"Buckets: the calls per step read from the trace follow DDP's rule at every cap; ceil(bytes / cap) at "
        f"{', '.join(agrees) or 'no cap'} only. A gradient is never split: fc1's weight is {fc1 / 2**20:.2f} MiB, "
        f"{fc1 / grad_bytes:.0%} of all, so below it the count stays at 2-3, and the default's first bucket of 1 MiB "
        "closes after it (2 all-reduces, the first started before backward ends). Step time against the default: "
        f"{min(steps_ms):.2f}-{max(steps_ms):.2f}x.",
        f"Losses: 1 rank at K = 2 against 2 ranks at K = 1, {args.seeds} seeds: their train losses were "
        f"{min(gaps):.3f}-{max(gaps):.3f} apart per step on average; with the loss not divided by K, "
        f"{min(wrong):.3f}-{max(wrong):.3f}. The checks' tolerance (accumulation.LOSS_TOLERANCE) is {acc.LOSS_TOLERANCE}"
        + (": between the two." if max(gaps) < acc.LOSS_TOLERANCE < min(wrong) else
           ": NOT between the two on this machine; revisit it."),
    ]
    if busy:
        notes.append(f"The machine was busy (load average {load_before} before, {load_after} after, on {cores} cores): "
                     "the bytes, calls and losses hold whatever the load, but the speed columns are mostly its noise; "
                     "run the benchmark again on a quiet machine for them.")
    text = "\n\n".join([header, "Accumulation (2 ranks):", t1, "Buckets (2 ranks, K = 1):", t2,
                        f"Losses ({LOSS_STEPS} optimizer steps of 128, lr 0.04; gap: the mean |difference| of the "
                        "train losses, step by step, against 2 ranks at K = 1):", t3,
                        "\n".join(f"- {n}" for n in notes)])
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "bench_grad_accum.md").write_text(text + "\n")
    with (args.out_dir / "bench_grad_accum.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["part", "key", "value"])
        for part, rows in (("accumulation", accum), ("buckets", buckets), ("losses", losses)):
            for row in rows:
                for key, value in row.items():
                    w.writerow([part, key, value])
    plot(accum, buckets, losses, args.out_dir / "bench_grad_accum.png", header)
    print()
    print(text)
    print(f"\nWrote bench_grad_accum.md, .csv and .png to {args.out_dir}. Total {time.perf_counter() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
