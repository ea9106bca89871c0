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
messages) and is reported next to it.

Those counters belong to a network namespace, and the machine's own loopback is shared with
everything else running on it: a notebook's other cells, a benchmark, a database. So the probe runs
`horovodrun` and its ranks in a **private network namespace** (what `unshare -rn` makes: a user
namespace, in which we may, and a network namespace holding only a loopback interface, brought up),
made with the same system calls as the local cluster's container runtime (`workshop.runtime.hostns`);
`benchmarks/bench_strategies.py` measures its runs the same way. Its loopback counters then hold the
probe's bytes and nothing else's. Where Linux refuses unprivileged namespaces, the probe measures on
the shared loopback and prints why (`Traffic.private_loopback` says which).

Every packet on loopback also carries headers the counters include: a 20-byte IPv4 header and a
32-byte TCP header with timestamps, 52 bytes (`HEADER_BYTES`), on data segments (up to 64 KiB each on
loopback) and on ACKs alike. (The 14-byte link header is not counted: the loopback driver counts a
packet after taking it off. Measured: 64 MiB through one TCP connection in a private namespace is
counted as 64 MiB plus exactly 52 bytes per packet, when nothing is retransmitted.) `explain` sets the
measured excess over 2(N-1)K against those headers and the background, from the numbers themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass
from functools import lru_cache

from workshop.errors import WorkshopError
from workshop.runtime import hostns
from workshop.runtime.netcounters import UNAVAILABLE, available, read_loopback

MODULE = "workshop.launchers.horovod_probe"
RESULT_PREFIX = "PROBE_RESULT "
# `python -m workshop.launchers.horovod_probe --in-private-network CMD ARGS...`: CMD in a network
# namespace of its own (`unshare -rn`), its loopback up; exit status PRIVATE_NETWORK_REFUSED if the
# system does not allow it.
PRIVATE_NETWORK_FLAG = "--in-private-network"
PRIVATE_NETWORK_REFUSED = 97
# Bytes of headers per packet on loopback, as /proc/net/dev counts them: IPv4 (20) and TCP with
# timestamps (32); not the link header (14), which the loopback driver removes before counting.
HEADER_BYTES = 20 + 32
# Beyond the headers, what the excess may come to and still leave "the data was 2(N-1)K" true.
NEGLIGIBLE = 0.001
# How far the measured bytes may be from 2(N-1)K for lab 2's check to hold (the notebook asserts it).
TOLERANCE = 0.05
# What `private_network()` runs in the namespace: the loopback carries a TCP connection.
_LOOPBACK_CHECK = (
    "import socket; s = socket.create_server(('127.0.0.1', 0)); "
    "c = socket.create_connection(s.getsockname(), timeout=10); c.sendall(b'x'); "
    "assert s.accept()[0].recv(1) == b'x'; print('ok')"
)


@dataclass
class Traffic:
    ranks: int
    bytes_per_rank_tensor: int  # K
    measured_bytes: int  # median over repeats, loopback bytes during one all-reduce
    background_bytes: int  # median over repeats, the same window with barriers only
    packets: int
    seconds: float
    repeats: int
    private_loopback: bool = False  # measured in a network namespace of its own (nothing else counted)

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


def enter_private_network() -> None:
    """This process (single-threaded) into new user and network namespaces: `unshare -rn`, then
    `ip link set lo up`, done with the calls the local cluster's container runtime makes."""
    uid, gid = os.getuid(), os.getgid()
    hostns.unshare(hostns.CLONE_NEWUSER | hostns.CLONE_NEWNET)
    hostns.map_root(uid, gid)
    hostns.loopback_up()


def in_private_network(cmd: list[str]) -> list[str]:
    """`cmd`, to be run in a private network namespace (see PRIVATE_NETWORK_FLAG)."""
    return [sys.executable, "-m", MODULE, PRIVATE_NETWORK_FLAG, *cmd]


def wanted_private_network(private: bool | None) -> bool:
    """Whether a measurement runs in a private network namespace: `private` None, where this system allows one;
    True insists (a WorkshopError names why not, before anything starts); False never."""
    if private is False:
        return False
    isolated, why = private_network()
    if private and not isolated:
        from workshop.errors import WorkshopError

        raise WorkshopError(f"No private network namespace here: {why}.",
                            "pass private=None to measure on the shared loopback instead (it says so).")
    return isolated


@lru_cache(maxsize=1)
def private_network() -> tuple[bool, str]:
    """Whether a command can run in a network namespace of its own here, and if not, why."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces are a Linux feature and this is {sys.platform}"
    try:
        probe = subprocess.run(in_private_network([sys.executable, "-c", _LOOPBACK_CHECK]),
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"the namespace check did not run ({exc})"
    if probe.returncode == 0 and probe.stdout.strip() == "ok":
        return True, "a private network namespace (unshare -rn): only this probe's traffic on its loopback"
    reason = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
    return False, f"this system refuses an unprivileged network namespace ({reason})"


def measure_allreduce(
    ranks: int, nbytes: int = 64 << 20, repeats: int = 3, timeout_s: float = 300, private: bool | None = None,
) -> Traffic | None:
    """Run the probe on `ranks` local ranks; None (with the reason printed) without counters.

    `private`: None (default) measures in a private network namespace where the system allows one,
    and otherwise on the shared loopback, printing why; True insists on the namespace; False never
    uses one."""
    if ranks < 2:
        raise WorkshopError(f"An all-reduce needs at least 2 ranks, got {ranks}.", "pass ranks=2 or more.")
    if nbytes < 4 * ranks:
        raise WorkshopError(f"{nbytes} bytes is too small to split over {ranks} ranks.", "use at least a few KiB.")
    if not available():
        print(f"skipped: {UNAVAILABLE}")
        return None
    from workshop.launchers.horovod import check_installed

    check_installed("pytorch")  # first: without Horovod, says whether its build runs, failed, or never ran
    horovodrun = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(horovodrun):
        raise WorkshopError("horovodrun is not installed here.", "run `make horovod`.")
    isolated, why = private_network() if private is not False else (False, "private=False was asked for")
    if private and not isolated:
        raise WorkshopError(f"No private network namespace here: {why}.",
                            "pass private=None to measure on the shared loopback instead (it says so).")
    if not isolated:
        print(f"N={ranks}: measuring on this machine's shared loopback, not in a private network namespace: "
              f"{why}. Anything else using loopback during the all-reduce is counted too "
              "(the background figure shows how much came in a window without it).", flush=True)
    cmd = [
        horovodrun, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}",
        sys.executable, "-m", MODULE, "--worker", "--bytes", str(nbytes), "--repeats", str(repeats),
    ]
    proc = subprocess.run(in_private_network(cmd) if isolated else cmd, capture_output=True, text=True,
                          timeout=timeout_s)
    for line in proc.stdout.splitlines():
        _, _, payload = line.partition(RESULT_PREFIX)
        if payload:
            return Traffic(**json.loads(payload), private_loopback=isolated)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
    raise WorkshopError(f"The all-reduce probe failed (exit status {proc.returncode}):\n{tail}")


def describe(t: Traffic) -> str:
    return (
        f"N={t.ranks}, K={t.bytes_per_rank_tensor / 2**20:.0f} MiB: measured {t.measured_bytes / 2**20:.2f} MiB on "
        f"{'a private' if t.private_loopback else 'the shared'} loopback vs 2(N-1)K = {t.predicted_bytes / 2**20:.2f} MiB (ratio {t.ratio:.4f}); per rank "
        f"{t.per_rank_bytes / 2**20:.2f} MiB vs 2(N-1)K/N = {t.predicted_bytes / t.ranks / 2**20:.2f} MiB; "
        f"{t.packets} packets ({t.bytes_per_packet / 1024:.1f} KiB each); background {t.background_bytes / 1024:.1f} KiB; "
        f"{t.seconds * 1000:.0f} ms"
    )


def explain(t: Traffic, width: int | None = None) -> str:
    """The measured excess over 2(N-1)K set against what the counters add to the data (every
    packet's headers) and against the background window, in words chosen by those numbers; each of
    its two paragraphs wrapped to `width` characters where given (a notebook's)."""
    excess = t.measured_bytes - t.predicted_bytes
    packets = max(t.packets, 1)
    headers = t.packets * HEADER_BYTES
    rest = excess - headers
    share = rest / t.predicted_bytes
    numbers = (
        f"N={t.ranks}: measured - 2(N-1)K = {excess:+,} bytes ({excess / t.predicted_bytes:+.3%}) over "
        f"{t.packets:,} packets: {excess / packets:,.1f} bytes per packet, against {HEADER_BYTES} bytes of "
        f"IPv4 and TCP headers per packet ({t.packets:,} x {HEADER_BYTES} = {headers:,} bytes); beyond the headers "
        f"{rest:+,} bytes ({share:+.4%} of 2(N-1)K); background window (barriers, no all-reduce): "
        f"{t.background_bytes:,} bytes."
    )
    if rest < -headers // 10:
        verdict = (f"The headers alone come to {-rest:,} bytes more than the excess: the data on the wire was "
                   f"{-share:.3%} less than 2(N-1)K, or its packets carried fewer than {HEADER_BYTES} bytes of headers.")
    elif rest <= max(t.background_bytes, 0):
        verdict = ("The headers account for the excess, give or take less than the background window's "
                   "coordination messages: the data itself was 2(N-1)K, as the formula says.")
    elif share <= NEGLIGIBLE:
        others = ("Horovod's and Gloo's own messages around the data (negotiating the tensor, framing each send), "
                  "or segments TCP sent twice on a busy machine" if t.private_loopback else
                  "Horovod's and Gloo's own messages, or other traffic on this machine's shared loopback")
        verdict = (f"The headers explain {headers / excess:.0%} of the excess. The other {rest:,} bytes "
                   f"({rest / packets:.1f} per packet) are more than the background window's {t.background_bytes:,}: "
                   f"{others}. So the data itself was 2(N-1)K to within {share:.3%}, as the formula says.")
    else:
        where = ("other traffic on this machine's shared loopback during the window (a private network namespace "
                 "was not available" if not t.private_loopback else
                 "segments TCP sent again (a loaded machine drops loopback packets), or messages of Horovod's and "
                 "Gloo's own beyond what the background window saw")
        # Within the check's tolerance this is a finding, not a failed measurement: no "measure again" then.
        after = (f"; still within the {TOLERANCE:.0%} of 2(N-1)K the lab's check allows" if abs(t.ratio - 1) < TOLERANCE
                 else ("; measure again when the machine is quiet" if not t.private_loopback else "; measure again"))
        where += ")" if not t.private_loopback else ""
        verdict = (f"The headers explain only {max(headers, 0) / excess:.0%} of the excess: {rest:,} bytes "
                   f"({share:.3%} of 2(N-1)K) are neither headers nor data of this all-reduce, so they are {where}{after}.")
    if width:
        return "\n".join(textwrap.fill(part, width, subsequent_indent="  ", initial_indent=indent)
                         for part, indent in ((numbers, ""), (verdict, "  ")))
    return f"{numbers}\n  {verdict}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [PRIVATE_NETWORK_FLAG]:
        if len(argv) < 2:
            print(f"usage: python -m {MODULE} {PRIVATE_NETWORK_FLAG} COMMAND [ARGS...]", file=sys.stderr)
            return 2
        try:
            enter_private_network()
        except OSError as exc:
            print(f"no private network namespace: {exc}", file=sys.stderr)
            return PRIVATE_NETWORK_REFUSED
        os.execvp(argv[1], argv[1:])
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
