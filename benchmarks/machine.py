"""What machine a benchmark ran on, and how busy it was: printed with every result."""

from __future__ import annotations

import contextlib
import csv
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


def write_results(out_dir: Path, name: str, table: str, note: str, rows: list[dict]) -> None:
    """Print a benchmark's markdown table and its note, and write them to `<name>.md` and the rows to `<name>.csv`
    in `out_dir`."""
    print("\n" + table + note, flush=True)
    (out_dir / f"{name}.md").write_text(table + "\n" + note + "\n")
    with open(out_dir / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def save_figure(fig, path: Path, title: str) -> None:
    """A benchmark's figure under its title (the machine, the date, the load), written to `path` and closed."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
