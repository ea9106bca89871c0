"""Each lab's main figure, from a real local run, into images/ (`make figures`): what a reader who runs
nothing sees in the lab folders' READMEs. The notebooks are committed without outputs, so without these
a reader browsing the repository sees no plot of any lab.

    .venv/bin/python scripts/lab_figures.py              # labs 1, 2 and 4 (lab 3's figure is make bench's)
    .venv/bin/python scripts/lab_figures.py --labs 1 4   # some of them

Each lab runs as its notebook runs it (the notebook's default parameters, `workshop.runner.run_local`),
and its figure is drawn by the lab's own `figures.py`, the function the notebook calls: nothing is
drawn here but a footnote saying where the run came from (date, machine). Lab 3's main figure, the
scaling plot, is `images/bench_data_parallel.png`, written by `make bench` from its own real runs
(benchmarks/bench_data_parallel.py): it is not run again here.

`OUTPUTS` names every lab folder's figure; tests/test_lab_figures.py holds each lab README to it, so a
README figure that no target writes fails.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Lab folder -> (its main figure, relative to the repository root; the command that writes it).
OUTPUTS: dict[str, tuple[str, str]] = {
    "1_parameter_server": ("images/lab1_worker_steps.png", "make figures"),
    "2_horovod": ("images/lab2_curves.png", "make figures"),
    "3_data_parallel": ("images/bench_data_parallel.png", "make bench"),
    "4_model_parallel": ("images/lab4_memory.png", "make figures"),
}
# The PNG text chunk that says which script drew a figure, from what run.
SOURCE_KEY = "Source"
# The notebooks' defaults (each notebook's parameters cell).
LAB1 = {"hosts": 3, "steps": 300, "slow_factor": 3}
LAB2 = {"hosts": 2, "procs_per_host": 1, "epochs": 3}
LAB4_WORLD_SIZES = (1, 2, 4)  # the grid the notebook measures (its smallest: the notebook has one)
LAB4_STEPS = 3


def lab_module(folder: str, name: str) -> Any:
    """`import name` from a lab folder, as its notebook does (the folder first on sys.path); each lab
    folder has its own `figures`, so one imported from another lab is dropped first."""
    path = str(ROOT / folder)
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@contextlib.contextmanager
def shown_figures() -> Iterator[list]:
    """The figures a notebook helper shows (`plt.show()`), kept instead of shown."""
    import matplotlib.pyplot as plt

    shown: list = []
    real = plt.show
    plt.show = lambda *args, **kwargs: shown.append(plt.gcf())
    try:
        yield shown
    finally:
        plt.show = real


def where_from(run: str) -> str:
    """The footnote: the run, its date and the machine."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from machine import describe_machine
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    facts = describe_machine()
    return f"drawn by make figures from a real local run ({run}): {facts['date']}, {facts['cpu']}, {facts['cores']}"


def save(fig: Any, out: Path, run: str) -> None:
    """The figure with its footnote, which the PNG also carries as text (`SOURCE_KEY`: the tests read it)."""
    note = where_from(run)
    fig.text(0.995, -0.01, note, ha="right", va="top", fontsize=7, color="0.4")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight", metadata={SOURCE_KEY: f"scripts/lab_figures.py: {note}"})
    print(f"wrote {out}", flush=True)


def lab1(out: Path) -> None:
    """Each worker's steps over time, the last worker slowed: asynchrony lets the others run ahead."""
    from workshop.labs import get_lab
    from workshop.runner import run_local

    hosts, steps, slow = LAB1["hosts"], LAB1["steps"], LAB1["slow_factor"]
    hps = {"steps": steps, "log-interval": 50, "slow-worker": hosts - 1, "slow-factor": slow}
    result = run_local(get_lab("parameter_server"), hosts=hosts, hyperparameters=hps)
    figures = lab_module("1_parameter_server", "figures")
    with shown_figures() as shown:
        figures.worker_steps(result.records)
    save(shown[-1], out, f"{hosts} simulated hosts, {steps} steps, worker {hosts - 1} slowed {slow}x")


def lab2(out: Path) -> None:
    """Rank 0's loss and test accuracy, Horovod with PyTorch and with TensorFlow on the same axes."""
    from workshop.labs import get_labs
    from workshop.runner import run_local

    labs = {lab.key.split("_")[1]: lab for lab in get_labs("2_horovod")}
    records = {}
    for name, lab in labs.items():
        result = run_local(lab, hosts=LAB2["hosts"], procs_per_host=LAB2["procs_per_host"],
                           hyperparameters={"epochs": LAB2["epochs"]})
        records[name] = result.records
    figures = lab_module("2_horovod", "figures")
    with shown_figures() as shown:
        figures.curves(records)
    save(shown[-1], out, f"{LAB2['hosts']} simulated hosts x {LAB2['procs_per_host']} rank, {LAB2['epochs']} epochs each")


def lab4(out: Path) -> None:
    """Memory per rank by sharding and world size, and step time: the notebook's grid, less the
    checkpointing runs the figure does not draw."""
    measure = lab_module("4_model_parallel", "measure")
    figures = lab_module("4_model_parallel", "figures")
    planned = [(t, n, flags) for t, n, flags in measure.grid(LAB4_WORLD_SIZES) if t in figures.ORDER]
    runs = {}
    for i, (technique, n, flags) in enumerate(planned, 1):
        started = time.perf_counter()
        runs[technique, n] = measure.measure(technique, n, steps=LAB4_STEPS, hyperparameters=flags)
        print(f"[{i}/{len(planned)}] {technique} at N={n}: {time.perf_counter() - started:.0f} s", flush=True)
    runs = measure.with_one_rank(runs)
    fig = figures.plot_memory(runs, LAB4_WORLD_SIZES)
    save(fig, out, f"{len(planned)} runs of {LAB4_STEPS} steps, one host, N = {', '.join(map(str, LAB4_WORLD_SIZES))}")


DRAWN_HERE: dict[str, Callable[[Path], None]] = {"1_parameter_server": lab1, "2_horovod": lab2, "4_model_parallel": lab4}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/lab_figures.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--labs", nargs="+", type=int, default=[int(f[0]) for f in DRAWN_HERE],
                        help="lab numbers (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT, help="where images/ is written (default: the checkout)")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    for folder, draw in DRAWN_HERE.items():
        if int(folder[0]) in args.labs:
            started = time.perf_counter()
            print(f"== {folder}", flush=True)
            draw(args.out / OUTPUTS[folder][0])
            print(f"== {folder}: {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
