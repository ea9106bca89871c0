"""Bytes that crossed the loopback interface, from the kernel's own counters.

Every simulated host of the local cluster talks to the others over loopback, so the
kernel's counters for `lo` say how many bytes a collective really moved: the measurement the
Horovod lab compares with ring all-reduce's 2(N-1)K, and the benchmarks report per step.

Linux only (`/proc/net/dev`); elsewhere `read_loopback()` returns None and callers skip the
measurement with a message. The counters are system-wide: anything else talking over
loopback at the same time adds to them, so measure large transfers, take a baseline, and
repeat (`measure` does the bookkeeping).

On loopback a packet is both sent and received by the same interface, so for `lo`
`tx_bytes == rx_bytes`, and either one is the total the processes sent. Counted bytes
include the IP and TCP headers of each segment (52-64 bytes per segment of up to 64 KiB on
loopback, under 0.1%) and whatever framing the collective library adds.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC_NET_DEV = Path("/proc/net/dev")
LOOPBACK = "lo"
UNAVAILABLE = (
    "no per-interface byte counters on this system (Linux's /proc/net/dev is missing), "
    "so bytes on the wire cannot be measured here"
)


@dataclass(frozen=True)
class Counters:
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.rx_bytes - other.rx_bytes,
            self.tx_bytes - other.tx_bytes,
            self.rx_packets - other.rx_packets,
            self.tx_packets - other.tx_packets,
        )


def read_interface(name: str = LOOPBACK, path: Path = PROC_NET_DEV) -> Counters | None:
    """The interface's counters now, or None where the system does not expose them."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines()[2:]:
        iface, _, rest = line.partition(":")
        if iface.strip() != name:
            continue
        fields = rest.split()
        # receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes packets ...
        return Counters(int(fields[0]), int(fields[8]), int(fields[1]), int(fields[9]))
    return None


def read_loopback() -> Counters | None:
    return read_interface(LOOPBACK)


def available() -> bool:
    return read_loopback() is not None


@dataclass
class Measurement:
    """Filled in when the `with measure():` block ends (None fields where unavailable)."""

    bytes: int | None = None  # bytes sent over loopback during the block (tx == rx on lo)
    packets: int | None = None


@contextlib.contextmanager
def measure(name: str = LOOPBACK) -> Iterator[Measurement]:
    """`with measure() as m: ...` then `m.bytes`: loopback bytes sent during the block."""
    result = Measurement()
    before = read_interface(name)
    try:
        yield result
    finally:
        after = read_interface(name)
        if before is not None and after is not None:
            delta = after - before
            result.bytes = delta.tx_bytes
            result.packets = delta.tx_packets
