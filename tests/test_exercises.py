"""The notebooks' exercises (workshop/teaching.py): every check teaches and never gets in the way.

For each exercise of each lab (`<lab>/exercises.py`), its check is run as a notebook's check cell runs it:
- with the placeholder `...` left in: it says what is missing, does not raise, and hands back the solution's
  answer (the notebook goes on);
- with a plausible wrong answer (a number off by a factor of 2, or the exercise's own wrong function): it
  says what is wrong with the hint, does not raise, and hands back the solution's answer;
- with the solution file's answer: it passes, and hands back that answer;
- under WORKSHOP_EXERCISES=solutions (CI's notebook runs): a wrong answer raises ExerciseNotSolved.

And the convention in every notebook: each exercise cell names its solution file, holds the placeholder,
and is followed by its check cell; each solution file belongs to an exercise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from workshop import REPO_ROOT, teaching
from workshop.spec import load_module

LAB_EXERCISES = sorted(REPO_ROOT.glob("[0-9]_*/exercises.py"))
NOTEBOOKS = sorted(REPO_ROOT.glob("[0-9]_*/*.ipynb"))


def load_exercises(path: Path) -> list[teaching.Exercise]:
    return teaching.exercises_of(load_module(path, f"_exercises_{path.parent.name}", with_siblings=True))


EXERCISES = [(path.parent.name, exercise) for path in LAB_EXERCISES for exercise in load_exercises(path)]


def exercise_params():
    return [pytest.param(exercise, id=f"{folder}:{exercise.key}", marks=[pytest.mark.slow] if exercise.slow else [])
            for folder, exercise in EXERCISES]


@pytest.fixture(autouse=True)
def _lenient(monkeypatch):
    """As an attendee's notebook runs: a check that fails says so and goes on (conftest sets the strict mode)."""
    monkeypatch.delenv(teaching.STRICT_ENV, raising=False)


@pytest.mark.parametrize("exercise", exercise_params())
def test_the_placeholder_is_told_what_to_write_and_the_notebook_goes_on(exercise, capsys):
    context = exercise.example_context()
    answer = exercise.check(..., **context)
    out = capsys.readouterr().out
    assert "Not done yet: " + exercise.task in out
    assert f"solutions/{exercise.key}.py" in out and "Traceback" not in out
    verdict, _ = exercise.verdict(answer, context)  # the answer handed back is the solution's
    assert verdict.passed, verdict


@pytest.mark.parametrize("exercise", exercise_params())
def test_a_wrong_answer_gets_the_hint_and_the_notebook_goes_on(exercise, capsys):
    context = exercise.example_context()
    wrong = exercise.wrong_answer(context)
    answer = exercise.check(wrong, **context)
    out = capsys.readouterr().out
    assert "Not yet: " in out and "Hint: " + exercise.hint in out, out
    assert "Traceback" not in out
    assert answer is not wrong and exercise.verdict(answer, context)[0].passed


@pytest.mark.parametrize("exercise", exercise_params())
def test_the_solution_passes(exercise, capsys):
    context = exercise.example_context()
    solution = exercise.reference(context)
    assert exercise.check(solution, **context) is solution
    assert "Right: " in capsys.readouterr().out


@pytest.mark.parametrize("exercise", [p for p in exercise_params() if not p.marks])
def test_under_the_solutions_run_a_wrong_answer_fails_the_notebook(exercise, monkeypatch, capsys):
    monkeypatch.setenv(teaching.STRICT_ENV, "solutions")
    context = exercise.example_context()
    with pytest.raises(teaching.ExerciseNotSolved, match=re.escape(exercise.key)):
        exercise.check(exercise.wrong_answer(context), **context)


def test_a_learners_function_that_raises_is_a_finding_not_a_crash(capsys):
    _, exercise = next((f, e) for f, e in EXERCISES if e.key == "ring_bytes")

    def ring_bytes(N, K):
        return K / (N - 1)  # ZeroDivisionError at N = 1

    exercise.check(ring_bytes, **exercise.example_context())
    out = capsys.readouterr().out
    assert "your answer raised ZeroDivisionError" in out and "Traceback" not in out


def test_a_stub_a_number_and_a_half_filled_dict_are_told_apart():
    def stub(N, K):
        """Only a docstring and `...`: not written yet."""
        ...

    def written(N, K):
        return N * K

    assert teaching.missing(...) and teaching.missing(stub) and teaching.missing({"a": 1, "b": ...})
    assert not teaching.missing(0) and not teaching.missing(written) and not teaching.missing({"a": 1})


def test_a_table_renders_as_html_and_aligns_as_text():
    shown = teaching.table([{"N": 2, "bytes": 1.5e6, "name": "ring <all>"}, {"N": 16, "bytes": 3.0e6, "name": "ps"}],
                           formats={"bytes": ",.0f"}, caption="per worker")
    assert "<td style=\"text-align:right\">1,500,000</td>" in shown.markup and "ring &lt;all&gt;" in shown.markup
    lines = shown.text.splitlines()
    assert lines[0] == "per worker" and lines[1].split() == ["N", "bytes", "name"]
    assert lines[3].index("1,500,000") + len("1,500,000") == lines[4].index("3,000,000") + len("3,000,000")


# --------------------------------------------------------------------------- the convention in the notebooks


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.stem}" for p in NOTEBOOKS])
def test_each_exercise_cell_holds_its_placeholder_and_is_followed_by_its_check(path):
    keys = {e.key: e for folder, e in EXERCISES if folder == path.parent.name}
    cells = code_cells(path)
    for i, cell in enumerate(cells):
        if teaching.EXERCISE_TAG not in teaching.cell_tags(cell):
            assert teaching.CHECK_TAG not in teaching.cell_tags(cell) or i and teaching.EXERCISE_TAG in teaching.cell_tags(
                cells[i - 1]), f"{path.name} code cell {i}: a check cell with no exercise cell before it"
            continue
        key = cell["metadata"].get("exercise")
        source = "".join(cell["source"])
        assert key in keys, f"{path.name} code cell {i}: exercise {key!r} is not defined in {path.parent.name}/exercises.py"
        assert "..." in source and "✏️" in source, f"{path.name} code cell {i}: commit the placeholder and its instruction"
        assert (path.parent / "solutions" / f"{key}.py").is_file()
        nxt = cells[i + 1] if i + 1 < len(cells) else {"metadata": {}, "source": ""}
        assert teaching.CHECK_TAG in teaching.cell_tags(nxt), f"{path.name} code cell {i + 1}: tag it `check`"
        assert ".check(" in "".join(nxt["source"]), f"{path.name} code cell {i + 1}: the check cell calls the check"


def test_every_solution_file_belongs_to_an_exercise_a_notebook_has():
    used = {(p.parent.name, c["metadata"]["exercise"]) for p in NOTEBOOKS for c in code_cells(p)
            if teaching.EXERCISE_TAG in teaching.cell_tags(c)}
    files = {(p.parent.parent.name, p.stem) for p in REPO_ROOT.glob("[0-9]_*/solutions/*.py")}
    assert files == used, f"solution files without a notebook exercise: {sorted(files - used)}; " \
                          f"exercises without a solution file: {sorted(used - files)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.stem}" for p in NOTEBOOKS])
def test_every_notebook_has_at_least_two_exercises_and_ends_with_its_takeaways(path):
    cells = code_cells(path)
    exercises = [c for c in cells if teaching.EXERCISE_TAG in teaching.cell_tags(c)]
    assert len(exercises) >= 2, f"{path.name} has {len(exercises)} exercise(s): each notebook has at least two"
    sources = ["".join(c["source"]) for c in cells]
    last = max(i for i, s in enumerate(sources) if "takeaways(" in s) if any("takeaways(" in s for s in sources) else None
    assert last is not None, f"{path.name}: end with `takeaways(...)` built from this run's numbers"
    assert all("takeaways(" not in s for s in sources[last + 1:]) and last >= len(sources) - 3, \
        f"{path.name}: the takeaways come last, before the clean-up"
