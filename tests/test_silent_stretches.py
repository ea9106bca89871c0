"""The tool that measures a notebook's longest silent stretch (`scripts/silent_stretches.py`): its gap logic."""

from __future__ import annotations

import importlib.util
import sys

from workshop import REPO_ROOT

_spec = importlib.util.spec_from_file_location("silent_stretches", REPO_ROOT / "scripts" / "silent_stretches.py")
tool = sys.modules["silent_stretches"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(tool)


def test_the_longest_gap_is_between_the_start_the_outputs_and_the_end():
    cell = tool.CellTiming(4, "run_local(...)", start=10.0, end=60.0,
                           arrivals=[(25.0, "printed: 'b'"), (12.0, "printed: 'a'"), (30.0, "widget update")])
    gap = tool.longest_gap(cell)  # 30 -> 60: the last update, then nothing until the end
    assert (gap.seconds, gap.index, gap.after) == (30.0, 4, "widget update")
    cell.arrivals += [(40.0, "printed: 'c'"), (50.0, "printed: 'd'"), (59.0, "printed: 'done'")]
    gap = tool.longest_gap(cell)  # now 12 -> 25
    assert (gap.seconds, gap.after) == (13.0, "printed: 'a'")


def test_a_silent_cell_is_silent_from_start_to_end_and_late_messages_are_clipped():
    assert tool.longest_gap(tool.CellTiming(0, "x", 5.0, 9.5)).seconds == 4.5
    gap = tool.longest_gap(tool.CellTiming(0, "x", 5.0, 9.0, arrivals=[(12.0, "late"), (1.0, "early")]))
    assert gap.seconds == 4.0 and gap.after == "early"  # both clipped into the cell's run


def test_the_notebooks_stretches_longest_first_one_per_cell():
    cells = [tool.CellTiming(1, "a", 0, 3), tool.CellTiming(2, "b", 3, 20, [(4, "p")]), tool.CellTiming(3, "c", 20, 25)]
    assert [(s.index, s.seconds) for s in tool.longest_stretches(cells, top=2)] == [(2, 16), (3, 5)]
