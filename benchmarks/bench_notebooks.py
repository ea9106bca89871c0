"""How long each notebook takes to run top to bottom, as an attendee's Run All does: the time line at the top
of every notebook and the agendas of the facilitator's guide (docs/facilitator.md) come from here.

    python benchmarks/bench_notebooks.py [--notebooks NB ...] [--solutions] [--memory 4G --cpus 2]
                                          [--out images/notebook_times.json] [--write-docs]

Each notebook runs in a fresh kernel of this environment (nbclient, the kernel JupyterLab would start), in its
own folder, with the exercises' placeholders left in (what an attendee who skips them runs; `--solutions`: with
the solution files in place, as CI runs them). Nothing tracked is rewritten by the run: the notebook is read,
executed in memory and dropped. With `--memory`/`--cpus` (as root, on Linux with cgroup v2) this process, and so
the kernel and every job it starts, runs inside a cgroup with that much memory and CPU: `--memory 4G --cpus 2` is
an ml.t3.medium's size, the default notebook instance an organizer hands each attendee (the same limits
`scripts/simulate_notebook_instance.sh` uses). The machine's load is printed beside each time: the numbers are
as good as the machine was quiet.

It records each notebook's wall time and each of its sections' (its `## ` headings) into `--out`, and with
`--write-docs` writes what is built from that record: the time line in each notebook's first cell and the
agenda block in docs/facilitator.md (`render_time_line`, `render_agendas`; tests/test_notebook_times.py checks
that both match the record, so a notebook added or a record changed without `make bench-notebooks` fails CI).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from machine import describe_machine, load_average  # noqa: E402

RECORD = ROOT / "images" / "notebook_times.json"
FACILITATOR = ROOT / "docs" / "facilitator.md"
# The notebooks in the order the README suggests; the capstone last.
NOTEBOOKS = [
    "3_data_parallel/data_parallel.ipynb",
    "1_parameter_server/parameter_server.ipynb",
    "2_horovod/horovod.ipynb",
    "4_model_parallel/model_parallel.ipynb",
    "3_data_parallel/job_parallelism.ipynb",
    "3_data_parallel/fault_tolerance.ipynb",
    "3_data_parallel/your_script.ipynb",
]
TIME_LINE = re.compile(r"^\*\*Time:\*\*.*$", re.MULTILINE)
AGENDA_START = "<!-- agendas: written by `make bench-notebooks` from images/notebook_times.json -->"
AGENDA_END = "<!-- end of agendas -->"
# Planning allowances, not measurements: what an attendee spends beyond the run itself, reading and writing
# each exercise (and the facilitator's introduction of a lab). Said as allowances wherever they are used.
MINUTES_PER_EXERCISE = 5
MINUTES_TO_INTRODUCE = 5


# ----------------------------------------------------------------------------- running


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not match:
        raise SystemExit(f"--memory {text!r}: give a size such as 4G or 4096M")
    return int(float(match[1]) * 1024 ** " KMG".index(match[2].upper() or " "))


@contextlib.contextmanager
def limits(memory: str | None, cpus: float | None) -> Iterator[str | None]:
    """This process inside a cgroup with `memory` and `cpus` (v2 where its memory controller is, else v1's
    memory and cpu hierarchies), for as long as the block lasts (its children inherit it); yields the limits in
    words, or None when none were asked for."""
    if memory is None and cpus is None:
        yield None
        return
    root = Path("/sys/fs/cgroup")
    unified = next((d for d in (root, root / "unified") if (d / "cgroup.controllers").is_file()
                    and "memory" in (d / "cgroup.controllers").read_text().split()), None)
    if os.geteuid() != 0 or (unified is None and not (root / "memory").is_dir()):
        raise SystemExit("--memory/--cpus need root and a cgroup memory controller: run as root, or leave them "
                         "out to time the notebooks on the whole machine")
    name = f"workshop-bench-notebooks-{os.getpid()}"
    own = {line.split(":", 2)[1]: line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().split()}
    if unified is not None:  # (folder, the file to write, the value, the folder to return to) per limit
        for controller in ("memory", "cpu"):
            with contextlib.suppress(OSError):
                (unified / "cgroup.subtree_control").write_text(f"+{controller}")
        groups = {"memory": unified / name, "cpu": unified / name}
        back = {unified / name: unified / own.get("", "/").lstrip("/")}
        files = {"memory": "memory.max", "cpu": "cpu.max"}
        cpu_value = f"{int((cpus or 1) * 100000)} 100000"
    else:
        groups = {c: root / c / name for c in ("memory", "cpu")}
        back = {root / c / name: root / c / own.get(c, "/").lstrip("/") for c in ("memory", "cpu")}
        files = {"memory": "memory.limit_in_bytes", "cpu": "cpu.cfs_quota_us"}
        cpu_value = str(int((cpus or 1) * 100000))
    words = []
    for folder in set(groups.values()):
        folder.mkdir()
    try:
        if memory is not None:
            (groups["memory"] / files["memory"]).write_text(str(parse_bytes(memory)))
            words.append(f"{parse_bytes(memory) / 2**30:g} GiB")
        if cpus is not None:
            (groups["cpu"] / files["cpu"]).write_text(cpu_value)
            words.insert(0, f"{cpus:g} CPUs")
        for folder in set(groups.values()):
            (folder / "cgroup.procs").write_text(str(os.getpid()))
        yield ", ".join(words)
    finally:
        for folder, parent in back.items():
            with contextlib.suppress(OSError):
                (parent / "cgroup.procs").write_text(str(os.getpid()))
            with contextlib.suppress(OSError):
                for pid in (folder / "cgroup.procs").read_text().split():  # whatever a notebook left behind
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), 9)
            for _ in range(50):
                with contextlib.suppress(OSError):
                    folder.rmdir()
                    break
                time.sleep(0.1)


def sections(nb) -> list[tuple[str, list[int]]]:
    """The notebook's `## ` sections (the part before the first one is "Set-up"), each with its code cells."""
    out: list[tuple[str, list[int]]] = [("Set-up", [])]
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            heading = re.search(r"^## (.+)$", cell.source, re.MULTILINE)
            if heading:
                out.append((heading[1].strip(), []))
        elif cell.cell_type == "code":
            out[-1][1].append(index)
    return [(title, cells) for title, cells in out if cells]


def run_notebook(path: Path, solutions: bool) -> dict:
    """Run one notebook top to bottom in a fresh kernel; its wall time, each section's, and its errors."""
    import nbformat
    from nbclient import NotebookClient

    from workshop import teaching

    nb = nbformat.read(path, as_version=4)
    exercises = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and "exercise" in teaching.cell_tags(cell):
            exercises += 1
            if solutions:
                cell.source = teaching.solved_source(path, cell) or cell.source
    seconds: dict[int, float] = {}

    class Timed(NotebookClient):
        async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return await super().async_execute_cell(cell, cell_index, *args, **kwargs)
            finally:
                seconds[cell_index] = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as kernels:
        spec = Path(kernels) / "kernels" / "workshop-bench"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "workshop (bench)", "language": "python"}))
        env = {"JUPYTER_PATH": kernels, teaching.STRICT_ENV: "solutions" if solutions else ""}
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        t0, error = time.perf_counter(), None
        try:
            Timed(nb, kernel_name="workshop-bench", timeout=1800, allow_errors=False,
                  resources={"metadata": {"path": str(path.parent)}}).execute()
        except Exception as exc:  # noqa: BLE001 - a failing notebook is reported and the others still run
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        wall = time.perf_counter() - t0
    return {
        "seconds": round(wall, 1),
        "exercises": exercises,
        "sections": [{"title": title, "seconds": round(sum(seconds.get(i, 0.0) for i in cells), 1)}
                     for title, cells in sections(nb)],
        "error": error,
    }


# ----------------------------------------------------------------------------- what is built from the record


def minutes(seconds: float) -> int:
    """Whole minutes, rounded up: an agenda plans with what a run may take, not less."""
    return max(1, -(-int(seconds) // 60))


def render_time_line(record: dict, notebook: str) -> str:
    """The `**Time:**` line of a notebook's first cell, from the record."""
    entry = record["notebooks"].get(notebook)
    if entry is None or entry.get("error"):
        raise KeyError(f"{notebook} has no successful run in {RECORD.relative_to(ROOT)}: run `make bench-notebooks`")
    where = record["limits"] or record["machine"]["cores"]
    return (f"**Time:** about {minutes(entry['seconds'])} minutes for Run All (measured on {where}, "
            f"{record['what_ran']}, {record['machine']['date'][:10]}: `make bench-notebooks`), plus about "
            f"{MINUTES_PER_EXERCISE} minutes for each of its {entry['exercises']} exercises.")


# Which notebooks (and which of their sections to skip) each agenda holds; the minutes come from the record.
AGENDAS = {
    "2 hours": [
        ("3_data_parallel/data_parallel.ipynb", "all of it: the lab every other one builds on"),
        ("1_parameter_server/parameter_server.ipynb", "all of it"),
        ("4_model_parallel/model_parallel.ipynb", "all of it; labs 2 and 3's other two notebooks as homework"),
        ("3_data_parallel/your_script.ipynb", "all of it: what attendees take home"),
    ],
    "3 hours": [
        ("3_data_parallel/data_parallel.ipynb", "all of it"),
        ("1_parameter_server/parameter_server.ipynb", "all of it"),
        ("2_horovod/horovod.ipynb", "all of it, once Horovod's build is done (`python -m workshop horovod`)"),
        ("4_model_parallel/model_parallel.ipynb", "all of it"),
        ("3_data_parallel/fault_tolerance.ipynb", "all of it; job parallelism's search as homework"),
        ("3_data_parallel/your_script.ipynb", "all of it"),
    ],
}


def render_agendas(record: dict) -> str:
    """The agenda block of docs/facilitator.md: each slot's notebooks with their measured Run All minutes and
    the planned minutes (run, plus the allowances for the exercises and an introduction)."""
    where = record["limits"] or record["machine"]["cores"]
    lines = [AGENDA_START, "",
             f"Run All minutes measured on {where} ({record['what_ran']}, {record['machine']['date'][:10]}, "
             f"load {record['load']}); the planned minutes add {MINUTES_TO_INTRODUCE} to introduce each lab and "
             f"{MINUTES_PER_EXERCISE} per exercise (allowances, not measurements). A notebook's jobs run while "
             "you explain its next section, so the run and the talk overlap.", ""]
    for slot, plan in AGENDAS.items():
        total = 0
        lines += [f"### {slot}", "", "| notebook | what to run | Run All (measured) | planned |", "|---|---|---|---|"]
        for notebook, what in plan:
            entry = record["notebooks"].get(notebook)
            if entry is None or entry.get("error"):
                raise KeyError(f"{notebook} has no successful run in the record: run `make bench-notebooks`")
            planned = minutes(entry["seconds"]) + MINUTES_TO_INTRODUCE + MINUTES_PER_EXERCISE * entry["exercises"]
            total += planned
            lines.append(f"| [{notebook}](../{notebook}) | {what} | {minutes(entry['seconds'])} min | {planned} min |")
        lines += ["", f"Planned: {total} minutes of the {slot}; the rest is the welcome, breaks and questions.", ""]
    lines.append(AGENDA_END)
    return "\n".join(lines)


def write_docs(record: dict) -> list[Path]:
    """Write the time lines and the agenda block from the record; the files changed."""
    import nbformat

    changed = []
    for notebook in record["notebooks"]:
        path = ROOT / notebook
        if not path.exists():
            continue
        nb = nbformat.read(path, as_version=4)
        first, line = nb.cells[0], render_time_line(record, notebook)
        if TIME_LINE.search(first.source):
            source = TIME_LINE.sub(lambda _, line=line: line, first.source)
        else:  # under the title
            title, _, rest = first.source.partition("\n")
            source = f"{title}\n\n{line}\n{rest}"
        if source != first.source:
            first.source = source
            nbformat.write(nb, path)
            changed.append(path)
    text = FACILITATOR.read_text(encoding="utf-8")
    block = re.compile(re.escape(AGENDA_START) + ".*?" + re.escape(AGENDA_END), re.DOTALL)
    if not block.search(text):
        raise SystemExit(f"{FACILITATOR.relative_to(ROOT)} has no agenda block ({AGENDA_START} ... {AGENDA_END})")
    new = block.sub(lambda _: render_agendas(record), text)
    if new != text:
        FACILITATOR.write_text(new, encoding="utf-8")
        changed.append(FACILITATOR)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", nargs="+", default=None, help="paths relative to the checkout (default: all)")
    parser.add_argument("--solutions", action="store_true", help="with the exercises' solutions in place")
    parser.add_argument("--memory", default=None, help="a memory limit for the run, e.g. 4G (root, cgroup v2)")
    parser.add_argument("--cpus", type=float, default=None, help="a CPU limit for the run, e.g. 2")
    parser.add_argument("--out", type=Path, default=RECORD, help="the record to write (default: %(default)s)")
    parser.add_argument("--write-docs", action="store_true",
                        help="write the notebooks' time lines and the facilitator's agendas from the record")
    parser.add_argument("--docs-only", action="store_true", help="only write the docs from the existing record")
    args = parser.parse_args(argv)
    if args.docs_only:
        for path in write_docs(json.loads(args.out.read_text())):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    notebooks = args.notebooks or [nb for nb in NOTEBOOKS if (ROOT / nb).exists()]
    record = json.loads(args.out.read_text()) if args.out.exists() and args.notebooks else {"notebooks": {}}
    failed = False
    with limits(args.memory, args.cpus) as where:
        record.update(machine=describe_machine(), limits=where,
                      what_ran="the solutions in place" if args.solutions else "the exercises left as placeholders")
        print(f"{'notebook':45s} {'minutes':>8s} {'seconds':>8s}  load (1/5/15 min)  [{where or 'whole machine'}]")
        for notebook in notebooks:
            entry = run_notebook(ROOT / notebook, args.solutions)
            record["notebooks"][notebook] = entry
            failed |= bool(entry["error"])
            print(f"{notebook:45s} {entry['seconds'] / 60:8.1f} {entry['seconds']:8.1f}  {load_average()}"
                  + (f"  FAILED: {entry['error']}" if entry["error"] else ""), flush=True)
            for section in entry["sections"]:
                print(f"    {section['title'][:60]:60s} {section['seconds']:8.1f} s")
    record["load"] = load_average()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    if args.write_docs and not failed:
        for path in write_docs(record):
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
