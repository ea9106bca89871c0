"""Each notebook says how long it takes, and the facilitator's agendas add up: both are written by
`make bench-notebooks` (benchmarks/bench_notebooks.py) from its record, images/notebook_times.json, never by hand.

A notebook added without a run, a time line edited by hand, or an agenda that no longer fits its slot fails here.
"""

from __future__ import annotations

import json
import re
import sys

import nbformat
import pytest

from workshop import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import bench_notebooks  # noqa: E402

NOTEBOOKS = sorted(p.relative_to(REPO_ROOT).as_posix() for p in REPO_ROOT.glob("[0-9]_*/*.ipynb"))


@pytest.fixture(scope="module")
def record() -> dict:
    assert bench_notebooks.RECORD.exists(), "images/notebook_times.json is missing: run `make bench-notebooks`"
    return json.loads(bench_notebooks.RECORD.read_text())


def test_every_notebook_is_benchmarked(record):
    assert sorted(bench_notebooks.NOTEBOOKS) == NOTEBOOKS, "list a new notebook in bench_notebooks.NOTEBOOKS"
    for notebook in NOTEBOOKS:
        entry = record["notebooks"].get(notebook)
        assert entry is not None, f"{notebook} has no time in the record: run `make bench-notebooks`"
        assert entry["error"] is None, f"{notebook}'s recorded run failed: {entry['error']}"
        assert entry["exercises"] >= 2 and entry["seconds"] > 0


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_each_notebook_opens_with_its_measured_time(record, notebook):
    first = nbformat.read(REPO_ROOT / notebook, as_version=4).cells[0]
    lines = bench_notebooks.TIME_LINE.findall(first.source)
    assert lines == [bench_notebooks.render_time_line(record, notebook)], (
        f"{notebook}'s first cell must carry the time line `make bench-notebooks` writes (found {lines})")


def test_the_facilitators_agendas_are_the_record_s(record):
    text = (REPO_ROOT / "docs" / "facilitator.md").read_text(encoding="utf-8")
    assert bench_notebooks.render_agendas(record) in text, "docs/facilitator.md: run `make bench-notebooks`"


@pytest.mark.parametrize("slot", list(bench_notebooks.AGENDAS))
def test_each_agenda_fits_its_slot(record, slot):
    hours = int(re.match(r"(\d+) hours", slot)[1])
    block = bench_notebooks.render_agendas(record)
    section = block.split(f"### {slot}")[1].split("###")[0]
    planned = int(re.search(r"Planned: (\d+) minutes", section)[1])
    # The welcome, a break and questions need a quarter of the slot.
    assert planned <= hours * 60 * 0.75, f"the {slot} agenda plans {planned} minutes: move a notebook to homework"
    for notebook, _ in bench_notebooks.AGENDAS[slot]:
        assert (REPO_ROOT / notebook).exists(), notebook


def test_minutes_round_up_and_a_missing_run_names_the_command():
    assert [bench_notebooks.minutes(s) for s in (1, 59, 60, 61, 600)] == [1, 1, 1, 2, 10]
    with pytest.raises(KeyError, match="make bench-notebooks"):
        bench_notebooks.render_time_line({"notebooks": {}, "limits": None, "machine": {"cores": "2"}}, "x.ipynb")
