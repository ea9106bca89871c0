"""A hyperparameter search: what is searched, over which values, and the trials that follow.

Job parallelism's unit is the trial: one full training job with one set of hyperparameters.
`python -m workshop tune` (`workshop.tuning`) runs the trials locally or as one SageMaker tuning
job; this module is what both share, with no runtime in it:

    space = SearchSpace.parse(lab, ["lr=0.01,0.02,0.04", "batch-size=32,64"])   # a grid: 6 trials
    space = SearchSpace.parse(lab, ["lr=0.001:0.1:log"], trials=8, seed=0)      # 8 random draws
    space.trials()  # [{"lr": "0.01", "batch-size": "32"}, ...]: values as text, as SageMaker passes them

`NAME=V1,V2,...` lists values (a grid); `NAME=LOW:HIGH` is a range (`:log` for a log scale),
drawn at random, so it needs a number of trials. Names are the lab script's own flags and are
checked against its parser (`Lab.validate_hyperparameters`), with the values' types, before
anything starts. The objective is a metric the script prints (`workshop.metrics`), maximized
unless it is a loss or a time.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workshop.errors import WorkshopError
from workshop.spec import Lab

# Flags in this argument group are the job's paths (channels, model and checkpoint folders):
# every lab script names its group so, and none of them is a hyperparameter to search.
CONTRACT_GROUP = "SageMaker contract"


@dataclass(frozen=True)
class Param:
    """One searched hyperparameter: a list of values, or a range (`low`..`high`)."""

    name: str  # the script's flag without its dashes, e.g. "lr", "batch-size"
    kind: str  # "int", "float" or "text" (the flag's type in the script's parser)
    values: tuple[str, ...] = ()  # a list: the values, as text
    low: float | None = None  # a range: its ends, and whether it is drawn on a log scale
    high: float | None = None
    log: bool = False

    @property
    def is_range(self) -> bool:
        return self.low is not None

    def describe(self) -> str:
        if self.is_range:
            return f"{self.name} in [{_text(self.low, self.kind)}, {_text(self.high, self.kind)}]" + (" (log scale)" if self.log else "")
        return f"{self.name} in {{{', '.join(self.values)}}}"

    def draw(self, rng: random.Random) -> str:
        """One value at random: uniform over a list, over a range, or over a range's logarithm."""
        if not self.is_range:
            return rng.choice(self.values)
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        if self.kind == "int":
            return str(min(int(self.high), max(int(self.low), round(value))))
        return _text(value, self.kind)


def _text(value: float | None, kind: str) -> str:
    if kind == "int":
        return str(int(value))
    return f"{value:.4g}"


@dataclass(frozen=True)
class Objective:
    """The metric a search ranks trials by, as the lab's script prints it."""

    metric: str
    maximize: bool = True

    @property
    def direction(self) -> str:
        return "Maximize" if self.maximize else "Minimize"

    def better(self, a: float, b: float) -> bool:
        return a > b if self.maximize else a < b

    @classmethod
    def parse(cls, lab: Lab, text: str | None) -> Objective:
        """`None` (the lab's accuracy metric), `NAME`, or `NAME:max` / `NAME:min`.

        Without a direction, losses, perplexity and times are minimized, anything else maximized."""
        name, _, direction = (text or lab.accuracy_metric).partition(":")
        if name not in lab.metrics:
            raise WorkshopError(
                f"Lab {lab.key!r} prints no metric {name!r} to rank trials by.",
                f"pick one of its metrics: {', '.join(lab.metrics)} (default: {lab.accuracy_metric}).",
            )
        if direction not in ("", "max", "min"):
            raise WorkshopError(f"Objective {text!r}: the direction after ':' must be 'max' or 'min'.",
                                f"e.g. {name}:max.")
        if not direction:
            direction = "min" if any(w in name for w in ("loss", "perplexity")) or name.endswith("_s") else "max"
        return cls(metric=name, maximize=direction == "max")


def script_flags(lab: Lab) -> dict[str, argparse.Action]:
    """The lab script's hyperparameter flags (without dashes) -> their argparse actions; the
    contract's paths (its "SageMaker contract" group) are left out."""
    parser = lab.script_parser()
    contract = {
        id(action)
        for group in parser._action_groups  # argparse keeps each group's actions only here
        if (group.title or "").startswith(CONTRACT_GROUP)
        for action in group._group_actions
    }
    flags = {}
    for action in parser._actions:
        if id(action) in contract or isinstance(action, argparse._HelpAction):
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                flags[option[2:]] = action
    return flags


def _kind(action: argparse.Action) -> str:
    if action.choices is not None:
        return "text"
    if action.type is int:
        return "int"
    if action.type is float:
        return "float"
    return "text"


def _check_value(lab: Lab, name: str, action: argparse.Action, value: str) -> None:
    """The value as the script would read it: its type and choices, or a clear error."""
    try:
        parsed = action.type(value) if action.type else value
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        kind = getattr(action.type, "__name__", "value")
        raise WorkshopError(
            f"--param {name}: {value!r} is not a valid {kind} for {lab.entry_script} --{name} ({exc}).",
            f"give {name} values of its type, e.g. --param {name}={action.default}.",
        ) from None
    if action.choices is not None and parsed not in action.choices:
        raise WorkshopError(
            f"--param {name}: {value!r} is not one of {lab.entry_script}'s choices for --{name}.",
            f"use values among {', '.join(map(str, action.choices))}.",
        )


def parse_param(lab: Lab, text: str, flags: Mapping[str, argparse.Action] | None = None) -> Param:
    """`NAME=V1,V2` or `NAME=LOW:HIGH[:log]` -> a `Param`, its name and values checked against
    the lab script's own parser (no process is started)."""
    flags = script_flags(lab) if flags is None else flags
    name, sep, spec = text.partition("=")
    name = name.strip().removeprefix("--")
    if not sep or not name:
        raise WorkshopError(f"--param {text!r} is not NAME=VALUES.",
                            "write --param lr=0.01,0.02 (a list) or --param lr=0.001:0.1:log (a range).")
    if name not in flags:
        close = difflib.get_close_matches(name, list(flags), n=3)
        raise WorkshopError(
            f"{lab.entry_script} has no hyperparameter --{name} to search.",
            (f"did you mean {' or '.join(close)}? " if close else "")
            + f"its hyperparameters: {', '.join(sorted(flags))} "
            f"(`python {lab.code_folder}/{lab.entry_script} --help`).",
        )
    action = flags[name]
    kind = _kind(action)
    spec = spec.strip()
    if ":" in spec and "," not in spec:
        parts = spec.split(":")
        log = len(parts) == 3 and parts[2] == "log"
        if len(parts) not in (2, 3) or (len(parts) == 3 and not log) or kind == "text":
            raise WorkshopError(
                f"--param {text!r}: a range is LOW:HIGH or LOW:HIGH:log, and only for a number"
                + ("" if kind != "text" else f" (--{name} is not one)") + ".",
                f"list the values instead: --param {name}=A,B,C.",
            )
        for part in parts[:2]:
            _check_value(lab, name, action, part)
        low, high = float(parts[0]), float(parts[1])
        if not (math.isfinite(low) and math.isfinite(high)):  # float() reads 'nan' and 'inf'
            raise WorkshopError(f"--param {text!r}: a range's ends must be finite numbers.",
                                f"e.g. --param {name}=0.001:0.1:log.")
        if not low < high or (log and low <= 0):
            raise WorkshopError(
                f"--param {text!r}: the range needs LOW < HIGH" + (" and LOW > 0 on a log scale" if log else "") + ".",
                f"e.g. --param {name}=0.001:0.1:log.",
            )
        return Param(name=name, kind=kind, low=low, high=high, log=log)
    values = tuple(v.strip() for v in spec.split(",") if v.strip())
    if not values:
        raise WorkshopError(f"--param {text!r} lists no values: the search would be empty.",
                            f"give at least one value, e.g. --param {name}={action.default}.")
    for value in values:
        _check_value(lab, name, action, value)
    if len(set(values)) != len(values):
        raise WorkshopError(f"--param {text!r} lists a value twice.", "list each value once.")
    return Param(name=name, kind=kind, values=values)


@dataclass(frozen=True)
class SearchSpace:
    """The searched parameters, and how trials are chosen: every combination of the lists (a
    grid), or `n_trials` draws (`seed`) when a range is searched or fewer trials than the grid
    are asked for."""

    params: tuple[Param, ...]
    n_trials: int | None = None  # None: the whole grid
    seed: int = 0
    notes: tuple[str, ...] = field(default=())

    @classmethod
    def parse(cls, lab: Lab, params: Sequence[str] | Mapping[str, Any], *, trials: int | None = None,
              seed: int = 0, fixed: Mapping[str, Any] | None = None) -> SearchSpace:
        """`params`: `["lr=0.01,0.02", ...]`, or `{"lr": [0.01, 0.02], "batch-size": "32:128"}`.
        `fixed`: the hyperparameters every trial shares (none of them may be searched too)."""
        if isinstance(params, Mapping):
            params = [f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in params.items()]
        if not params:
            raise WorkshopError("Nothing to search: no --param given.", "add e.g. --param lr=0.01,0.02,0.04.")
        if trials is not None and trials < 1:
            raise WorkshopError(f"--trials must be at least 1, got {trials}.", "pass --trials 4, or leave it out for the whole grid.")
        flags = script_flags(lab)
        parsed = [parse_param(lab, p, flags) for p in params]
        names = [p.name for p in parsed]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise WorkshopError(f"--param {', '.join(twice)} given more than once.", "give each searched name once, with all its values.")
        both = sorted(set(names) & {str(k) for k in (fixed or {})})
        if both:
            raise WorkshopError(
                f"{', '.join(both)} is searched (--param) and fixed (--hp) at once.",
                f"drop --hp {both[0]}=..., or drop it from --param.",
            )
        notes = []
        grid = math.prod(len(p.values) for p in parsed if not p.is_range)
        if any(p.is_range for p in parsed):
            if trials is None:
                ranged = next(p.name for p in parsed if p.is_range)
                raise WorkshopError(f"{ranged} is a range, so its values are drawn at random: say how many trials.",
                                    "add --trials N (e.g. --trials 8), or list the values: --param NAME=A,B,C.")
        elif trials is not None and trials >= grid:
            if trials > grid:
                notes.append(f"the grid has {grid} combination(s); running each once, not {trials} trials")
            trials = None
        return cls(params=tuple(parsed), n_trials=trials, seed=seed, notes=tuple(notes))

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    @property
    def is_grid(self) -> bool:
        return self.n_trials is None

    def trials(self) -> list[dict[str, str]]:
        """Each trial's searched hyperparameters (text values), in a fixed order."""
        if self.is_grid:
            return [dict(zip(self.names, combo, strict=True)) for combo in itertools.product(*(p.values for p in self.params))]
        rng = random.Random(self.seed)
        if not any(p.is_range for p in self.params):  # fewer trials than the grid: distinct combinations
            combos = list(itertools.product(*(p.values for p in self.params)))
            return [dict(zip(self.names, c, strict=True)) for c in rng.sample(combos, self.n_trials)]
        return [{p.name: p.draw(rng) for p in self.params} for _ in range(self.n_trials)]

    def describe(self) -> str:
        how = "grid" if self.is_grid else f"{self.n_trials} random draws (seed {self.seed})"
        return f"{len(self.trials())} trial(s), {how}: " + "; ".join(p.describe() for p in self.params)
