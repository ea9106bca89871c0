"""All-reduce microbenchmark in the style of nccl-tests, for gloo on N local ranks.

    python benchmarks/bench_allreduce.py [--ranks 2 4] [--max-mib 256] [--out-dir images/]
    make bench-allreduce

For every message size K from 4 KiB to 256 MiB (powers of 4) and every world size N, each
rank all-reduces (sum) a float32 tensor of K bytes with `torch.distributed` (gloo, over
loopback TCP, 1 thread per rank). Per size: a warm-up call, then timed calls; a call's time is
the slowest rank's (a collective is done when its last rank is), and the size's time is the
median over the timed calls. Reported as nccl-tests does
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):

    algorithm bandwidth  algbw = K / t
    bus bandwidth        busbw = algbw * 2(N-1)/N

busbw is the rate each rank's link actually carries in a ring all-reduce (each rank sends and
receives 2(N-1)/N * K bytes), so it is comparable across N and with the hardware's own
bandwidth. Here the "hardware" is this machine's memory: the ranks exchange bytes through the
kernel's loopback TCP, i.e. memory copies. So the same run measures, single-threaded, the
memory-copy bandwidth of a large buffer (`dst.copy_(src)`, 256 MiB; a copy reads and writes
each byte, the rate reported is bytes copied per second): the physical ceiling here.

Bytes on the wire: for sizes of 1 MiB and more, the loopback interface's byte counters
(`workshop.runtime.netcounters`, /proc/net/dev) are read around the timed calls, and the bytes per
all-reduce (all ranks together) are compared with the ring's 2(N-1)K. The counters are
system-wide, so other jobs' loopback traffic adds to them; large sizes keep that small.

Alpha-beta fit: per N, a least-squares fit of t(K) = a + b*K (weighted by 1/t, i.e. relative
error), read as the ring model t = 2(N-1)*alpha + 2(N-1)/N * K / B: alpha = a / (2(N-1)) is
the per-message latency and B = 2(N-1)/N / b the link bandwidth. These go to
`bench_allreduce_fit.json`, which `workshop.planner` reads to predict step times on this
machine (see benchmarks/bench_strategies.py).

Output: a table on stdout; `bench_allreduce.csv`, `bench_allreduce.md`,
`bench_allreduce_fit.json` and `bench_allreduce.png` in --out-dir. About 1-2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import statistics
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine, load_average  # noqa: E402

from workshop import REPO_ROOT  # noqa: E402
from workshop.runtime import netcounters  # noqa: E402

KIB, MIB = 1024, 1024 * 1024
COUNTED_FROM = 1 * MIB  # sizes from which loopback bytes are counted


def sizes(max_mib: int) -> list[int]:
    out, k = [], 4 * KIB
    while k <= max_mib * MIB:
        out.append(k)
        k *= 4
    return out


def timed_iters(size: int) -> int:
    """More calls for small messages (cheap, noisy), fewer for large ones."""
    if size <= 256 * KIB:
        return 30
    if size <= 4 * MIB:
        return 10
    if size <= 64 * MIB:
        return 5
    return 3


def _worker(rank: int, world: int, port: int, size_list: list[int], queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(minutes=5),
    )
    results = []
    for size in size_list:
        x = torch.ones(size // 4, dtype=torch.float32)
        dist.all_reduce(x)  # warm-up: connections, buffers, first-touch pages
        iters = timed_iters(size)
        times = []
        dist.barrier()
        before = netcounters.read_loopback() if rank == 0 else None
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t0)
        after = netcounters.read_loopback() if rank == 0 else None
        # The slowest rank's time of each call (not itself timed).
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            wire = None
            if before is not None and after is not None and size >= COUNTED_FROM:
                # The barriers inside the window are a few hundred bytes each: negligible here.
                wire = (after - before).tx_bytes / iters
            results.append({"size": size, "times": t.tolist(), "wire_bytes": wire})
        del x
    if rank == 0:
        queue.put(results)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(target, world: int, args: tuple, what: str):
    """`world` spawned processes `target(rank, world, port, *args, queue)` meeting on a free port;
    returns what rank 0 put on the queue, or exits naming `what` if a rank failed."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        sys.exit(f"{what} rank failed (exit codes {bad}); see its traceback above.")
    return queue.get()


def run_world(world: int, size_list: list[int]) -> list[dict]:
    return spawn_ranks(_worker, world, (size_list,), "An all-reduce")


def copy_bandwidth(nbytes: int = 256 * MIB, repeats: int = 5) -> float:
    """Single-threaded memory-copy rate of this machine, bytes copied per second (median)."""
    torch.set_num_threads(1)
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def fit_alpha_beta(world: int, rows: list[dict]) -> dict:
    """Ring model t = 2(N-1) alpha + 2(N-1)/N K/B, least squares weighted by 1/t."""
    k = np.array([r["size"] for r in rows], dtype=float)
    t = np.array([r["time_s"] for r in rows], dtype=float)
    slope, intercept = np.polyfit(k, t, 1, w=1 / t)
    intercept = max(float(intercept), 0.0)
    alpha = intercept / (2 * (world - 1))
    bandwidth = 2 * (world - 1) / world / float(slope)
    predicted = intercept + slope * k
    return {
        "world_size": world, "alpha_s": alpha, "bandwidth_Bps": bandwidth,
        "max_rel_error": float(np.max(np.abs(predicted - t) / t)),
    }


def fmt_size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def markdown(rows: list[dict], copy_bps: float) -> str:
    head = (
        "| ranks | size | time (median) | algbw GB/s | busbw GB/s | busbw / memcpy | "
        "loopback bytes per all-reduce | vs ring 2(N-1)K |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    body = []
    for r in rows:
        t = r["time_s"]
        tt = f"{t * 1e6:.0f} us" if t < 1e-2 else f"{t * 1e3:.1f} ms"
        wire = "-" if r["wire_bytes"] is None else f"{r['wire_bytes'] / MIB:.1f} MiB"
        ratio = "-" if r["wire_bytes"] is None else f"{r['wire_bytes'] / r['ring_bytes']:.2f}"
        body.append(
            f"| {r['ranks']} | {fmt_size(r['size'])} | {tt} | {r['algbw'] / 1e9:.3f} "
            f"| {r['busbw'] / 1e9:.3f} | {r['busbw'] / copy_bps:.2f} | {wire} | {ratio} |"
        )
    return "\n".join([head, *body])


def plot(rows: list[dict], copy_bps: float, fits: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for world in sorted({r["ranks"] for r in rows}):
        mine = [r for r in rows if r["ranks"] == world]
        ks = [r["size"] for r in mine]
        ax.plot(ks, [r["busbw"] / 1e9 for r in mine], "o-", label=f"busbw, N={world}")
        ax.plot(ks, [r["algbw"] / 1e9 for r in mine], "x--", alpha=0.6, label=f"algbw, N={world}")
        fit = next(f for f in fits if f["world_size"] == world)
        model = [
            2 * (world - 1) * fit["alpha_s"] + 2 * (world - 1) / world * k / fit["bandwidth_Bps"]
            for k in ks
        ]
        ax2.plot(ks, [r["time_s"] * 1e3 for r in mine], "o", label=f"measured, N={world}")
        ax2.plot(ks, [m * 1e3 for m in model], "-", alpha=0.7,
                 label=f"alpha-beta fit N={world}: alpha={fit['alpha_s'] * 1e6:.0f} us, "
                       f"B={fit['bandwidth_Bps'] / 1e9:.2f} GB/s")
    ax.axhline(copy_bps / 1e9, color="black", linestyle=":", label="memcpy, 1 thread")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("message size (bytes)")
        a.grid(alpha=0.3)
    ax.set_yscale("log")  # the memcpy line is 10x the bandwidths: on a linear scale they lie flat
    ax.set_ylabel("GB/s (log scale)")
    ax.set_title("gloo all-reduce bandwidth\n(nccl-tests definitions)")
    ax.legend(fontsize=7)
    ax2.set_yscale("log")
    ax2.set_ylabel("time per all-reduce, ms")
    ax2.set_title("time per all-reduce\nvs the ring alpha-beta model")
    ax2.legend(fontsize=7)
    # The machine line is long: wrapped to the figure's width, with room kept for it above the panels.
    fig.suptitle(textwrap.fill(title, 150), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes to measure")
    p.add_argument("--max-mib", type=int, default=256, help="largest message, MiB (4 KiB up, x4)")
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "images", help="where outputs go")
    args = p.parse_args(argv)
    if any(n < 2 for n in args.ranks) or args.max_mib < 1:
        sys.exit("--ranks must be 2 or more each, and --max-mib at least 1")
    started = time.perf_counter()
    machine = describe_machine()
    load_before = load_average()
    size_list = sizes(args.max_mib)
    print(f"All-reduce microbenchmark (gloo, loopback, 1 thread per rank): sizes "
          f"{fmt_size(size_list[0])}..{fmt_size(size_list[-1])}, ranks {args.ranks}.", flush=True)
    copy_bps = copy_bandwidth()
    print(f"  memory copy, 1 thread, 256 MiB: {copy_bps / 1e9:.2f} GB/s", flush=True)
    rows, fits = [], []
    for world in args.ranks:
        t0 = time.perf_counter()
        raw = run_world(world, size_list)
        mine = []
        for r in raw:
            t = statistics.median(r["times"])
            algbw = r["size"] / t
            mine.append({
                "ranks": world, "size": r["size"], "time_s": t, "algbw": algbw,
                "busbw": algbw * 2 * (world - 1) / world, "iters": len(r["times"]),
                "wire_bytes": r["wire_bytes"], "ring_bytes": 2 * (world - 1) * r["size"],
            })
        fits.append(fit_alpha_beta(world, mine))
        rows += mine
        big = mine[-1]
        print(f"  N={world}: {len(mine)} sizes in {time.perf_counter() - t0:.0f} s; "
              f"{fmt_size(big['size'])}: busbw {big['busbw'] / 1e9:.2f} GB/s", flush=True)
    copy_after = copy_bandwidth()
    load_after = load_average()

    args.out_dir.mkdir(parents=True, exist_ok=True)
    with (args.out_dir / "bench_allreduce.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ranks", "size_bytes", "time_s_median", "iters", "algbw_GBps", "busbw_GBps",
                    "memcpy_GBps", "loopback_bytes_per_allreduce", "ring_bytes_2(N-1)K",
                    "loadavg_before", "loadavg_after", "date", "cpu"])
        for r in rows:
            w.writerow([r["ranks"], r["size"], f"{r['time_s']:.6g}", r["iters"],
                        f"{r['algbw'] / 1e9:.4f}", f"{r['busbw'] / 1e9:.4f}", f"{copy_bps / 1e9:.3f}",
                        "" if r["wire_bytes"] is None else f"{r['wire_bytes']:.0f}", r["ring_bytes"],
                        load_before, load_after, machine["date"], machine["cpu"]])
    table = markdown(rows, copy_bps)
    header = (f"Machine: {machine['summary']}. Load average (1/5/15 min) {load_before} before, "
              f"{load_after} after. Memory copy (1 thread, 256 MiB): {copy_bps / 1e9:.2f} GB/s "
              f"before, {copy_after / 1e9:.2f} GB/s after.")
    fit_lines = [
        f"- N={f['world_size']}: alpha = {f['alpha_s'] * 1e6:.0f} us per message, "
        f"B = {f['bandwidth_Bps'] / 1e9:.2f} GB/s ({f['bandwidth_Bps'] / copy_bps:.2f} x memcpy); "
        f"the fit is within {f['max_rel_error'] * 100:.0f}% of every size"
        for f in fits
    ]
    (args.out_dir / "bench_allreduce.md").write_text(
        header + "\n\n" + table + "\n\nRing alpha-beta fit, t = 2(N-1) alpha + 2(N-1)/N K/B:\n\n"
        + "\n".join(fit_lines) + "\n"
    )
    (args.out_dir / "bench_allreduce_fit.json").write_text(json.dumps({
        "machine": machine, "memcpy_Bps": copy_bps, "fits": fits,
        "loadavg_before": load_before, "loadavg_after": load_after,
    }, indent=2) + "\n")
    plot(rows, copy_bps, fits, args.out_dir / "bench_allreduce.png", header[:220])
    print()
    print(header)
    print()
    print(table)
    print()
    print("busbw = algbw x 2(N-1)/N (nccl-tests). 'vs ring' = loopback bytes counted per "
          "all-reduce / 2(N-1)K, the bytes a ring all-reduce sends in all.")
    print("Ring alpha-beta fit, t = 2(N-1) alpha + 2(N-1)/N K/B:")
    print("\n".join(fit_lines))
    print(f"\nWrote bench_allreduce.csv, .md, .png and bench_allreduce_fit.json to {args.out_dir} "
          f"in {time.perf_counter() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
