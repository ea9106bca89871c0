"""Lab 1's start-up, phase by phase: where the time before its first step goes, from source and from bytecode.

    python benchmarks/bench_lab1_startup.py [--repeats 2] [--steps 20] [--out-dir images/]
    make bench-lab1-startup

Each run is `python -m workshop run parameter_server --verbose` (3 simulated hosts: a parameter server on each, the
coordinator on the first, a worker on the others: six TensorFlow processes) with `--hp log-interval=1`, so that rank
0's first step is a line of its own. Every line the command prints is stamped as it arrives, and the phases are read
from the lines the workshop's runtime, the driver and the script print anyway:

- the command's own start (Python, the workshop's and the SDK's imports, the data check, the job's folders) until the
  first host's `sm_train.sh` starts;
- the hosts' set-up (`sm_train.sh`, the SDK's `environment.py`) until the last driver has started its processes;
- TensorFlow's import in each process, as the script measures it itself (`TensorFlow imported in X s`), first and last
  of the five servers, and the last server serving;
- the coordinator connecting to every server and placing the variables (its `Coordinator:` line);
- the first step (rank 0's `step=1` line) and the whole run.

Two arms, interleaved: **from source**, as on a machine that sets PYTHONDONTWRITEBYTECODE (CI images and some hosted
notebooks do) with no bytecode anywhere, so every process compiles TensorFlow's modules again; and **from bytecode**,
the environment's cache (`.venv/pycache`), which `make workshop` and every job the workshop starts now use there
(workshop.runtime.contract.bytecode_cache). About a minute and a half per pair of runs on 2 idle cores.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, load_average, write_results  # noqa: E402

sys.path.insert(0, str(HERE.parent))
from workshop import REPO_ROOT  # noqa: E402

MARKS = {  # phase name -> the line that ends it
    "setup_start": re.compile(r"^\[algo-\d\] Starting training script"),
    "process_started": re.compile(r"^\[algo-\d\] \[ps_driver\] started \w+ \d"),
    "serving": re.compile(r"(?:ps|worker) \d+ serving at .*TensorFlow imported in ([\d.]+) s"),
    "coordinator": re.compile(r"^\[algo-1/0\] Coordinator: "),
    "first_step": re.compile(r"^\[algo-1/0\] METRICS rank=0 step=1 "),
}
PHASES = (  # column, what it is
    ("command", "the command until the first host's set-up"),
    ("hosts' set-up", "until the last process started"),
    ("import, first", "how long TensorFlow's import took inside the first server ready (from that process's start)"),
    ("import, last", "... and inside the last"),
    ("servers up", "the last of the five servers serving"),
    ("coordinator", "connected, variables placed"),
    ("first step", "rank 0's first step done"),
    ("whole run", "until the command ended"),
)


def one_run(arm: str, steps: int, workdir: Path) -> dict[str, float]:
    """One `workshop run parameter_server`; the seconds from its start to each mark."""
    env = {**os.environ}
    if arm == "source":  # nothing compiled anywhere, nothing written: what such a machine did before the cache
        empty = tempfile.mkdtemp(prefix="no-bytecode-")
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=empty)
    else:
        env.update(PYTHONDONTWRITEBYTECODE="", PYTHONPYCACHEPREFIX=str(REPO_ROOT / ".venv" / "pycache"))
    cmd = [sys.executable, "-m", "workshop", "run", "parameter_server", "--verbose", "--workdir", str(workdir),
           "--hp", f"steps={steps}", "--hp", "log-interval=1"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT, env=env)
    seen: dict[str, list[float]] = {name: [] for name in MARKS}
    imports: list[float] = []
    tail: list[str] = []
    for line in proc.stdout:
        t = time.monotonic() - t0
        tail = (tail + [line])[-40:]
        for name, pattern in MARKS.items():
            found = pattern.search(line)
            if found:
                seen[name].append(t)
                if name == "serving":
                    imports.append(float(found.group(1)))
    proc.wait()
    end = time.monotonic() - t0
    missing = [name for name, times in seen.items() if not times]
    if proc.returncode != 0 or missing:
        raise SystemExit(f"lab 1 ({arm}) exited {proc.returncode}; no line for {missing}:\n{''.join(tail)}")
    return {"command": min(seen["setup_start"]), "hosts' set-up": max(seen["process_started"]),
            "import, first": min(imports), "import, last": max(imports), "servers up": max(seen["serving"]),
            "coordinator": seen["coordinator"][0], "first step": seen["first_step"][0], "whole run": end}


def cell(row: dict, column: str) -> str:
    """A phase's median, with its range when there was more than one run."""
    spread = "" if row["runs"] < 2 else f" ({row[column + ' min']:.1f}-{row[column + ' max']:.1f})"
    return f"{row[column]:.1f}{spread}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each arm, interleaved")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "images")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    machine, load_before = describe_machine(), load_average()
    runs: dict[str, list[dict[str, float]]] = {"source": [], "bytecode": []}
    with tempfile.TemporaryDirectory(prefix="lab1-startup-") as tmp:
        for i in range(args.repeats):
            for arm in runs:
                t = one_run(arm, args.steps, Path(tmp) / f"{arm}-{i}")
                runs[arm].append(t)
                print(f"{arm:8} run {i + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in t.items()), flush=True)
    rows, cells = [], []
    for arm, results in runs.items():
        row = {"arm": arm, "runs": len(results)}
        for column, _ in PHASES:
            values = [r[column] for r in results]
            row[column] = statistics.median(values)
            row[f"{column} min"], row[f"{column} max"] = min(values), max(values)
        rows.append(row)
        cells.append(f"| {arm} | " + " | ".join(cell(row, c) for c, _ in PHASES) + " |")
    table = ("| TensorFlow from | " + " | ".join(c for c, _ in PHASES) + " |\n|---|" + "---:|" * len(PHASES) + "\n"
             + "\n".join(cells))
    source, cached = rows
    note = (f"\nSeconds from the command's start, except the two import columns (median of {args.repeats}, range in "
            f"brackets), lab 1 on the local "
            f"cluster, {args.steps} steps. Columns: " + "; ".join(f"{c}: {what}" for c, what in PHASES) + ". "
            f"From bytecode the first step came {source['first step'] / cached['first step']:.1f}x sooner "
            f"({source['first step'] - cached['first step']:.0f} s less); six processes importing TensorFlow on "
            f"{os.cpu_count()} cores is most of what is left. Machine: {machine['summary']}; load average "
            f"{load_before} before, {load_average()} after.")
    write_results(args.out_dir, "bench_lab1_startup", table, note, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
