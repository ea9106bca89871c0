"""How long does a notebook leave its reader without a sign of life? Its longest silent stretches.

Executes each notebook (in `local` mode, as it is: a copy in memory, the file is not rewritten) with
nbclient on this interpreter, notes when each cell starts and ends and when each thing a reader would
see arrives: printed text, a display (a table, a figure), an error, and every update of a widget (a
progress bar redrawn: tqdm's widget changes its text as the job moves or its clock ticks). The silent
stretch of a cell is the longest gap between its start, those arrivals and its end; the notebook's is
its longest cell's.

    .venv/bin/python scripts/silent_stretches.py 3_data_parallel/data_parallel.ipynb [...] [--top 3]

It prints, per notebook, the longest silent stretch, the cell (its index and first line) and what
came just before it, and one table at the end. The machine's load while it ran is printed too: on a
shared machine a silence is longer than on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# What a reader sees: iopub messages that put something in the cell's output area, or change a widget
# shown there (comm_msg: a progress bar's new text). Status, execute_input and the like show nothing.
VISIBLE = {"stream", "display_data", "update_display_data", "execute_result", "error", "comm_open", "comm_msg"}


@dataclass
class CellTiming:
    """One executed cell: when it started and ended, and when each visible output arrived (seconds)."""

    index: int
    first_line: str
    start: float
    end: float
    arrivals: list[tuple[float, str]] = field(default_factory=list)  # (time, what: "stream: text ...")


@dataclass(frozen=True)
class Stretch:
    """A silent stretch: `seconds` without anything new, in cell `index`, after `after`."""

    seconds: float
    index: int
    first_line: str
    after: str


def longest_gap(cell: CellTiming) -> Stretch:
    """The longest stretch inside `cell` with nothing new shown: between its start, each arrival (in
    time order; arrivals outside the cell's run are clipped to it) and its end."""
    times = sorted((min(max(t, cell.start), cell.end), what) for t, what in cell.arrivals)
    marks = [(cell.start, "the cell's start"), *times, (cell.end, "the cell's end")]
    best = Stretch(0.0, cell.index, cell.first_line, "the cell's start")
    for (t0, what), (t1, _) in zip(marks, marks[1:], strict=False):
        if t1 - t0 > best.seconds:
            best = Stretch(t1 - t0, cell.index, cell.first_line, what)
    return best


def longest_stretches(cells: list[CellTiming], top: int = 1) -> list[Stretch]:
    """The `top` longest silent stretches of a notebook, one per cell, longest first."""
    return sorted((longest_gap(c) for c in cells), key=lambda s: -s.seconds)[:top]


def _describe(msg: dict) -> str:
    kind, content = msg["header"]["msg_type"], msg.get("content", {})
    if kind == "stream":
        text = content.get("text", "").strip().splitlines()
        return f"printed: {text[-1][:90] if text else ''!r}"
    if kind in ("display_data", "update_display_data", "execute_result"):
        data = content.get("data", {})
        return f"{kind}: {', '.join(sorted(data))[:60]}"
    if kind == "comm_msg":
        state = content.get("data", {}).get("state", {})
        text = state.get("value") if isinstance(state.get("value"), str) else None
        return f"widget update: {text[:90]!r}" if text else "widget update"
    return kind


def run_notebook(path: Path, timeout_s: float) -> list[CellTiming]:
    """Execute `path` and time its code cells' outputs."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    cells: dict[int, CellTiming] = {}

    class Timed(NotebookClient):
        def process_message(self, msg, cell, cell_index):  # every iopub message of the running cell
            if msg["header"]["msg_type"] in VISIBLE and cell_index in cells:
                cells[cell_index].arrivals.append((time.monotonic(), _describe(msg)))
            return super().process_message(msg, cell, cell_index)

    def started(cell, cell_index, **_):
        source = cell.source.strip().splitlines()
        cells[cell_index] = CellTiming(cell_index, source[0][:70] if source else "", time.monotonic(), 0.0)

    def ended(cell, cell_index, **_):
        cells[cell_index].end = time.monotonic()

    with tempfile.TemporaryDirectory() as root:
        spec = Path(root) / "kernels" / "silent-stretches"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "silent stretches", "language": "python"}))
        os.environ["JUPYTER_PATH"] = root
        os.environ.setdefault("MPLBACKEND", "Agg")
        client = Timed(nb, kernel_name="silent-stretches", timeout=timeout_s, allow_errors=False,
                       on_cell_execute=started, on_cell_executed=ended,
                       resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    return [c for _, c in sorted(cells.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=3, help="stretches listed per notebook (default 3)")
    parser.add_argument("--timeout", type=float, default=1800, help="per cell, seconds (default 1800)")
    args = parser.parse_args(argv)
    rows = []
    for path in args.notebooks:
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        cells = run_notebook(path.resolve(), args.timeout)
        wall = time.monotonic() - t0
        load = max(load, os.getloadavg()[0])
        stretches = longest_stretches(cells, args.top)
        print(f"{path}: {wall:.0f} s in all; load average {load:.1f} on {os.cpu_count()} cores", flush=True)
        for s in stretches:
            print(f"  {s.seconds:6.1f} s silent in cell {s.index} ({s.first_line!r}), after {s.after}", flush=True)
        rows.append((path, stretches[0], wall, load))
    print("\n| notebook | longest silent stretch | cell | after | run time | load average |")
    print("|---|---:|---|---|---:|---:|")
    for path, s, wall, load in rows:
        print(f"| {path} | {s.seconds:.1f} s | {s.index}: `{s.first_line}` | {s.after} | {wall:.0f} s | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
