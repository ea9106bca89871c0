"""What machine a benchmark ran on, and how busy it was: printed with every result."""

from __future__ import annotations

import contextlib
import os
import platform
from datetime import UTC, datetime
from pathlib import Path


def load_average() -> str:
    """The 1/5/15-minute load averages, e.g. '0.52/1.10/1.40' ('n/a' where unavailable)."""
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def describe_machine() -> dict[str, str]:
    """CPU model, cores, versions, date: enough to say where a number came from."""
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1])
        mem = f", {kib / 1024**2:.0f} GiB RAM"
    facts = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": f"{os.cpu_count()} cores ({usable} usable)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    facts["summary"] = (
        f"{facts['cpu']}, {facts['cores']}{mem}; torch {facts['torch']}; Python {facts['python']}; "
        f"{facts['platform']}; {facts['date']}"
    )
    return facts
