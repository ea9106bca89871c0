"""Measure the bytes one Horovod all-reduce really puts on the wire, against 2(N-1)K.

    python -m workshop.launchers.horovod_probe --ranks 4 --mib 64       # starts horovodrun itself
    from workshop.launchers.horovod_probe import measure_allreduce       # what lab 2's notebook calls

Ring all-reduce of K bytes over N ranks runs in two phases of N-1 steps: scatter-reduce (each
rank sends one K/N chunk per step, adding what it receives) and all-gather (each rank passes
the finished chunks on). Each rank sends 2(N-1)K/N bytes, all ranks 2(N-1)K together. Horovod's
Gloo controller calls `gloo::allreduce`, whose default algorithm is that ring.

The ranks run on this machine under `horovodrun --gloo -np N -H localhost:N`, so every byte
between them crosses the loopback interface, whose kernel counters (`workshop.runtime.netcounters`)
count it. Rank 0 reads the counters between barriers around each all-reduce; the same window
without the all-reduce (barriers only) measures the background (Horovod's own coordination
messages, anything else on loopback) and is reported next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from workshop.errors import WorkshopError
from workshop.runtime.netcounters import UNAVAILABLE, available, read_loopback

RESULT_PREFIX = "PROBE_RESULT "


@dataclass
class Traffic:
    ranks: int
    bytes_per_rank_tensor: int  # K
    measured_bytes: int  # median over repeats, loopback bytes during one all-reduce
    background_bytes: int  # median over repeats, the same window with barriers only
    packets: int
    seconds: float
    repeats: int

    @property
    def predicted_bytes(self) -> int:
        return 2 * (self.ranks - 1) * self.bytes_per_rank_tensor

    @property
    def ratio(self) -> float:
        return self.measured_bytes / self.predicted_bytes

    @property
    def per_rank_bytes(self) -> float:
        return self.measured_bytes / self.ranks

    @property
    def bytes_per_packet(self) -> float:
        return self.measured_bytes / max(self.packets, 1)


def _worker(nbytes: int, repeats: int) -> None:
    """Runs in every rank (under horovodrun)."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    n = nbytes // 4
    tensor = torch.full((n,), float(rank + 1))
    expect = float(size * (size + 1) // 2)
    hvd.allreduce(tensor, op=hvd.Sum, name="warmup")  # connections and buffers set up first
    rows = []
    for i in range(repeats):
        for kind in ("allreduce", "background"):
            hvd.barrier()
            before = read_loopback() if rank == 0 else None
            t0 = time.perf_counter()
            if kind == "allreduce":
                out = hvd.allreduce(tensor, op=hvd.Sum, name=f"probe{i}")
                seconds = time.perf_counter() - t0
            hvd.barrier()
            if rank == 0:
                delta = read_loopback() - before
                rows.append({"kind": kind, "bytes": delta.tx_bytes, "packets": delta.tx_packets, "seconds": seconds})
        if rank == 0 and not (out[0].item() == expect and out[-1].item() == expect):
            raise SystemExit(f"wrong all-reduce result {out[0].item()} != {expect}")
    if rank == 0:
        ar = [r for r in rows if r["kind"] == "allreduce"]
        bg = [r for r in rows if r["kind"] == "background"]
        result = {
            "ranks": size,
            "bytes_per_rank_tensor": n * 4,
            "measured_bytes": int(statistics.median(r["bytes"] for r in ar)),
            "background_bytes": int(statistics.median(r["bytes"] for r in bg)),
            "packets": int(statistics.median(r["packets"] for r in ar)),
            "seconds": statistics.median(r["seconds"] for r in ar),
            "repeats": repeats,
        }
        print(RESULT_PREFIX + json.dumps(result), flush=True)
    hvd.shutdown()


def measure_allreduce(ranks: int, nbytes: int = 64 << 20, repeats: int = 3, timeout_s: float = 300) -> Traffic | None:
    """Run the probe on `ranks` local ranks; None (with the reason printed) without counters."""
    if ranks < 2:
        raise WorkshopError(f"An all-reduce needs at least 2 ranks, got {ranks}.", "pass ranks=2 or more.")
    if nbytes < 4 * ranks:
        raise WorkshopError(f"{nbytes} bytes is too small to split over {ranks} ranks.", "use at least a few KiB.")
    if not available():
        print(f"skipped: {UNAVAILABLE}")
        return None
    horovodrun = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(horovodrun):
        raise WorkshopError("horovodrun is not installed here.", "run `make horovod`.")
    from workshop.launchers.horovod import check_installed

    check_installed("pytorch")
    cmd = [
        horovodrun, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}",
        sys.executable, "-m", "workshop.launchers.horovod_probe", "--worker", "--bytes", str(nbytes), "--repeats", str(repeats),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    for line in proc.stdout.splitlines():
        _, _, payload = line.partition(RESULT_PREFIX)
        if payload:
            return Traffic(**json.loads(payload))
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
    raise WorkshopError(f"The all-reduce probe failed (exit status {proc.returncode}):\n{tail}")


def describe(t: Traffic) -> str:
    return (
        f"N={t.ranks}, K={t.bytes_per_rank_tensor / 2**20:.0f} MiB: measured {t.measured_bytes / 2**20:.2f} MiB on "
        f"loopback vs 2(N-1)K = {t.predicted_bytes / 2**20:.2f} MiB (ratio {t.ratio:.4f}); per rank "
        f"{t.per_rank_bytes / 2**20:.2f} MiB vs 2(N-1)K/N = {t.predicted_bytes / t.ranks / 2**20:.2f} MiB; "
        f"{t.packets} packets ({t.bytes_per_packet / 1024:.1f} KiB each); background {t.background_bytes / 1024:.1f} KiB; "
        f"{t.seconds * 1000:.0f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workshop.launchers.horovod_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--mib", type=int, default=64, help="K, the all-reduced tensor's size in MiB")
    p.add_argument("--bytes", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    nbytes = args.bytes or args.mib << 20
    if args.worker:
        _worker(nbytes, args.repeats)
        return 0
    try:
        for n in args.ranks:
            t = measure_allreduce(n, nbytes, args.repeats)
            print(describe(t) if t else "skipped", flush=True)
            if t:
                print(json.dumps({**asdict(t), "predicted_bytes": t.predicted_bytes, "ratio": round(t.ratio, 5)}))
    except WorkshopError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
