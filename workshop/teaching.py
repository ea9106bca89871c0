"""Learning by doing in the notebooks: exercises the learner writes, predictions before measurements,
takeaways built from the run's own numbers, and tables that render as tables.

The exercise convention, the same in every notebook (`docs/exercises.md` shows it to a facilitator):

    ### Exercise 2.1: ...                      markdown: the task, and what it practises
    per_worker_bytes = ...  # ✏️ ...            a code cell tagged `exercise` (the learner edits it): a
                                               placeholder `...` (a number, or a function's body) and a
                                               one-line instruction
    per_worker_bytes = exercises.RING_BYTES.check(per_worker_bytes)
                                               right after it, a code cell tagged `check`

The check prints a pass, or what is wrong and a hint that teaches (what the answer depends on); it never
raises. It returns the learner's answer when it is right and the solution's otherwise, so a notebook run
with `...` left in (an attendee who skips an exercise) goes on with the right value.

Each solution lives in one place: `<lab folder>/solutions/<key>.py`, exactly what the exercise cell holds
once solved. The check runs it (in a copy of the notebook's variables) for the reference answer, and its
output ends with it folded ("Show the solution"); `%load solutions/<key>.py` in the exercise cell puts it
there. CI runs every notebook with the solution files in the exercise cells (`tests/conftest.py`) and
`WORKSHOP_EXERCISES=solutions`, under which a check that does not pass raises: a solution that stops being
right fails CI.

A prediction is lighter: a cell tagged `prediction` where the learner writes a number before a headline
measurement (`guess = ...`), and the measurement's cell shows it beside the formula's and the measured
value (`predicted(...)`); nothing grades it.
"""

from __future__ import annotations

import ast
import html
import inspect
import linecache
import math
import os
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STRICT_ENV = "WORKSHOP_EXERCISES"  # "solutions": every check must pass (CI, with the solutions in place)
EXERCISE_TAG, CHECK_TAG, PREDICTION_TAG = "exercise", "check", "prediction"
SOLUTIONS_FOLDER = "solutions"


class ExerciseNotSolved(AssertionError):
    """A check that did not pass, under `WORKSHOP_EXERCISES=solutions` (where every check must)."""


# --------------------------------------------------------------------------- showing things in a notebook


class Shown:
    """Something shown in a notebook as HTML, and as plain text anywhere else (a terminal, nbval's record)."""

    def __init__(self, text: str, markup: str):
        self.text, self.markup = text, markup

    def _repr_html_(self) -> str:
        return self.markup

    def __repr__(self) -> str:
        return self.text


def show(shown: Shown) -> None:
    """Display in a notebook (HTML), print elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is in every environment the workshop sets up
        print(shown.text)
        return
    if get_ipython() is None:
        print(shown.text)
    else:
        display(shown)


def _esc(value: Any) -> str:
    return html.escape(str(value))


def table(rows: Sequence[Mapping[str, Any]] | Sequence[Sequence[Any]], columns: Sequence[str] | None = None, *,
          caption: str = "", formats: Mapping[str, str] | None = None, right: Iterable[str] | None = None) -> Shown:
    """Rows as a table: HTML in a notebook (it never wraps mid-number as a wide monospace line does), aligned
    text elsewhere. `rows` are dicts (columns default to the first row's keys) or sequences (name `columns`);
    `formats` maps a column to a format spec (`{"loss": ".4f"}`); numbers are right-aligned, as are the
    columns named in `right`."""
    if rows and isinstance(rows[0], Mapping):
        columns = list(columns or rows[0].keys())
        cells = [[row.get(c, "") for c in columns] for row in rows]  # type: ignore[union-attr]
    else:
        columns = list(columns or [])
        cells = [list(row) for row in rows]
    formats = dict(formats or {})

    def text(column: str, value: Any) -> str:
        if value is None or value == "":
            return ""
        spec = formats.get(column)
        if spec:
            try:
                return format(value, spec)
            except (TypeError, ValueError):
                return str(value)
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    shown = [[text(c, v) for c, v in zip(columns, row, strict=True)] for row in cells]
    numeric = {c for j, c in enumerate(columns)
               if all(isinstance(row[j], (int, float)) or row[j] in ("", None) for row in cells)} | set(right or ())
    widths = [max([len(c)] + [len(row[j]) for row in shown]) for j, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if c in numeric else v.ljust(w)
                         for c, v, w in zip(columns, values, widths, strict=True)).rstrip()

    plain = ([caption] if caption else []) + [line(columns), line(["-" * w for w in widths])] + [line(r) for r in shown]
    style = 'style="text-align:right"'
    head = "".join(f"<th {style if c in numeric else ''}>{_esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td {style if c in numeric else ''}>{_esc(v)}</td>"
                                    for c, v in zip(columns, row, strict=True)) + "</tr>" for row in shown)
    cap = f"<caption style='caption-side:top;text-align:left'>{_esc(caption)}</caption>" if caption else ""
    return Shown("\n".join(plain), f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def takeaways(*points: str, title: str = "What to keep from this run") -> None:
    """Show the lab's closing points, each built from this run's numbers by the caller (an f-string), as a
    list. Markdown-style `code` in a point is kept as code."""
    items = "".join(f"<li>{_inline_code(_esc(p))}</li>" for p in points)
    shown = Shown("\n".join([title + ":"] + [f"  {i}. {p}" for i, p in enumerate(points, 1)]),
                  f"<div><b>{_esc(title)}</b><ol>{items}</ol></div>")
    show(shown)


def _inline_code(escaped: str) -> str:
    parts = escaped.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


# --------------------------------------------------------------------------- predictions


def missing(value: Any) -> bool:
    """True while `value` is (or still holds) the placeholder `...`: Ellipsis, a function whose body is only
    `...` (and a docstring), or a list, tuple or dict with `...` in it."""
    if value is Ellipsis:
        return True
    if isinstance(value, Mapping):
        return any(missing(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(missing(v) for v in value)
    if callable(value) and inspect.isfunction(value):
        return _stub(value)
    return False


def _stub(function: Callable) -> bool:
    try:
        source = textwrap.dedent(inspect.getsource(function))
        node = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return False
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    return all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
               and (s.value.value is Ellipsis or isinstance(s.value.value, str)) for s in node.body)


def predicted(guess: Any, *, measured: float, what: str, formula: float | None = None, unit: str = "",
              scale: float = 1.0, digits: int = 3) -> None:
    """Show the learner's guess (written before the measurement, in a cell tagged `prediction`) beside
    the formula's value and the measured one. Values are divided by `scale` for display (1e6 for MB)."""

    def fmt(value: float | None) -> str:
        return "" if value is None else f"{value / scale:.{digits}g}{(' ' + unit) if unit else ''}"

    if missing(guess):
        yours, ratio = "(none written)", ""
    else:
        yours = fmt(float(guess))
        ratio = f"{measured / float(guess):.2f}x" if float(guess) else ""
    row = {"": what, "your guess": yours, "formula": fmt(formula), "measured": fmt(measured),
           "measured / guess": ratio}
    if formula is None:
        del row["formula"]
    shown = table([row], caption="Predicted, then measured")
    show(shown)
    if missing(guess):
        print("No guess was written: next time, write one before the measurement runs; a guess the "
              "measurement corrects is what sticks.")


# --------------------------------------------------------------------------- exercises


@dataclass(frozen=True)
class Verdict:
    """What a check found: `passed`, or `missing` (the placeholder is still there), or wrong (`problem`)."""

    passed: bool
    missing: bool
    problem: str = ""  # what is wrong (one or two lines), when not passed and not missing


Judge = Callable[[Any, Any, Mapping[str, Any]], "str | None"]


def close_to(rel_tol: float = 0.02, unit: str = "", scale: float = 1.0) -> Judge:
    """A judge of a number: right within `rel_tol` of the reference; else says by what factor it is off."""

    def judge(answer: Any, reference: Any, context: Mapping[str, Any]) -> str | None:
        try:
            value = float(answer)
        except (TypeError, ValueError):
            return f"the answer should be a number, got {type(answer).__name__} {answer!r}"
        ref = float(reference)
        if math.isclose(value, ref, rel_tol=rel_tol, abs_tol=1e-12):
            return None
        shown = f"{value / scale:.4g}{(' ' + unit) if unit else ''}"
        if value and ref and (value > 0) == (ref > 0):
            factor = value / ref
            off = f"{factor:.2f}x" if factor >= 1 else f"1/{1 / factor:.2f} of"
            return f"yours is {shown}, {off} the right value"
        return f"yours is {shown}, not the right value"

    return judge


def same_results(cases: Callable[[Mapping[str, Any]], Iterable[tuple[Any, ...]]], rel_tol: float = 0.02,
                 describe: Callable[[tuple[Any, ...]], str] | None = None) -> Judge:
    """A judge of a function: called with each case's arguments (from the notebook's variables), it must
    return what the solution's function returns, within `rel_tol`; else names the first case it missed."""

    def judge(answer: Any, reference: Any, context: Mapping[str, Any]) -> str | None:
        if not callable(answer):
            return f"the answer should be a function, got {type(answer).__name__}"
        for args in cases(context):
            got, want = answer(*args), reference(*args)
            if got is None:
                return f"{_call(answer, args, describe)} returned None: the function should return a number"
            if not math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=1e-9):
                ratio = f" ({float(got) / float(want):.2f}x the right value)" if float(want) else ""
                return f"{_call(answer, args, describe)} returned {float(got):.6g}, the right value is {float(want):.6g}{ratio}"
        return None

    return judge


def _call(function: Callable, args: tuple[Any, ...], describe: Callable | None) -> str:
    if describe:
        return describe(args)
    return f"{getattr(function, '__name__', 'your function')}({', '.join(map(repr, args))})"


@dataclass(frozen=True)
class Exercise:
    """One exercise: the name its cell defines, how an answer is judged against the solution file, and the
    hint a wrong answer gets. Defined in the lab's `exercises.py` (beside its notebooks)."""

    key: str  # the solution file's stem: <folder>/solutions/<key>.py
    folder: Path  # the lab's folder
    name: str  # the variable (or function) the exercise cell defines
    task: str  # what to write, one line (shown while `...` is still there)
    hint: str  # what the right answer depends on (shown with a wrong one)
    judge: Judge = field(default_factory=close_to)
    # The notebook variables the solution reads, for the tests (a dict, or a function making one).
    example: Mapping[str, Any] | Callable[[], Mapping[str, Any]] = field(default_factory=dict)
    # A plausible wrong answer for the tests, given the reference and the context (default: a number x 2).
    wrong: Callable[[Any, Mapping[str, Any]], Any] | None = None
    slow: bool = False  # its judge starts processes (the tests run it in the slow tier)

    @property
    def solution_path(self) -> Path:
        return Path(self.folder) / SOLUTIONS_FOLDER / f"{self.key}.py"

    def solution_source(self) -> str:
        return self.solution_path.read_text(encoding="utf-8")

    def example_context(self) -> dict[str, Any]:
        return dict(self.example() if callable(self.example) else self.example)

    def reference(self, context: Mapping[str, Any]) -> Any:
        """The solution's answer: the solution file run in a copy of `context` (the notebook's variables).
        Its source is registered with `linecache`, so `inspect.getsource` of a function it defines works."""
        filename = str(self.solution_path)
        source = self.solution_source()
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        namespace = dict(context)
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the lab's own solution file
        return namespace[self.name]

    def wrong_answer(self, context: Mapping[str, Any]) -> Any:
        reference = self.reference(context)
        return self.wrong(reference, context) if self.wrong else reference * 2

    def verdict(self, answer: Any, context: Mapping[str, Any]) -> tuple[Verdict, Any]:
        """(the verdict on `answer`, the solution's answer). Never raises for the learner's answer: an
        exception it raises is the problem reported."""
        reference = self.reference(context)
        if missing(answer):
            return Verdict(False, True), reference
        try:
            problem = self.judge(answer, reference, context)
        except Exception as exc:  # noqa: BLE001 - the learner's code failed: that is the finding, not a crash
            problem = f"your answer raised {type(exc).__name__}: {exc}".strip()
        return Verdict(problem is None, False, problem or ""), reference

    def check(self, answer: Any, **context: Any) -> Any:
        """The check cell's one call: judges `answer` (with the notebook's variables, plus `context`), shows
        the verdict, and returns the answer to go on with: the learner's when right, the solution's otherwise.
        Raises only under WORKSHOP_EXERCISES=solutions, where every check must pass."""
        variables = {**_notebook_variables(), **context}
        verdict, reference = self.verdict(answer, variables)
        show(self.report(verdict))
        if not verdict.passed and os.environ.get(STRICT_ENV) == "solutions":
            raise ExerciseNotSolved(f"exercise {self.key}: {verdict.problem or 'still `...`'} (its solution file, "
                                    f"{self.solution_path}, is in the cell: fix the solution or the check)")
        return answer if verdict.passed else reference

    def report(self, verdict: Verdict) -> Shown:
        """The check's output: a pass; or what is missing or wrong, the hint, and the solution folded."""
        where = f"{SOLUTIONS_FOLDER}/{self.key}.py"
        if verdict.passed:
            return Shown(f"✅ Right: {self.name} checks out.",
                         f"<div style='border-left:4px solid #2e7d32;padding:2px 8px'>"
                         f"✅ Right: <code>{_esc(self.name)}</code> checks out.</div>")
        if verdict.missing:
            colour, lines = "#9e9e9e", [f"✏️ Not done yet: {self.task}"]
        else:
            colour, lines = "#c62828", [f"❌ Not yet: {verdict.problem}.", f"Hint: {self.hint}"]
        lines.append("The notebook goes on with the solution's answer.")
        body = "<br>".join(_inline_code(_esc(line)) for line in lines)
        load = f"%load {where}"
        folded = (f"<details><summary>Show the solution (<code>{_esc(where)}</code>; <code>{_esc(load)}</code> "
                  f"in the exercise cell puts it there)</summary><pre>{_esc(self.solution_source())}</pre></details>")
        text = "\n".join(lines + [f"The solution: {where} (`{load}` in the exercise cell puts it there)."])
        return Shown(text, f"<div style='border-left:4px solid {colour};padding:2px 8px'>{body}{folded}</div>")


def _notebook_variables() -> dict[str, Any]:
    """The running notebook's variables (IPython's user namespace); {} outside a notebook."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return {}
    shell = get_ipython()
    return dict(shell.user_ns) if shell is not None else {}


def exercises_of(module: Any) -> list[Exercise]:
    """Every `Exercise` a lab's `exercises.py` module defines, in definition order."""
    return [value for value in vars(module).values() if isinstance(value, Exercise)]


def cell_tags(cell: Mapping[str, Any]) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def solved_source(notebook: str | Path, cell: Mapping[str, Any]) -> str | None:
    """For a notebook cell tagged `exercise`: its solution file's text (`solutions/<key>.py` beside the
    notebook, the key in the cell's metadata as `"exercise": "<key>"`), to run the notebook with the
    solutions in place; None for any other cell."""
    if EXERCISE_TAG not in cell_tags(cell):
        return None
    key = cell.get("metadata", {}).get("exercise")
    if not key:
        raise ValueError(f"{notebook}: an exercise cell without its key (cell metadata \"exercise\": \"<key>\")")
    return (Path(notebook).parent / SOLUTIONS_FOLDER / f"{key}.py").read_text(encoding="utf-8")
