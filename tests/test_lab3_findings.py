"""What lab 3's notebooks read from their runs (3_data_parallel/findings.py), on records shaped as the lab's
script prints them: no training runs here.

The spot check of fault_tolerance.ipynb holds on a real account whether or not SageMaker reclaimed the job
(most spot jobs are never interrupted; the notebook's sagemaker-mode run has the fake interrupt it once), and
fails where a claim is false: a job that resumed with nothing to resume from, or one that started over
although it had checkpointed.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from workshop import REPO_ROOT

LAB = REPO_ROOT / "3_data_parallel"


def _load(name: str):
    """The lab folder's module `name`, as the notebooks import it (registered: its dataclasses need that)."""
    spec = importlib.util.spec_from_file_location(f"_lab3_{name}", LAB / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


findings = _load("findings")

COMPLETED = ["Starting", "Downloading", "Training", "Uploading", "Completed"]
INTERRUPTED = ["Starting", "Downloading", "Training", "Interrupted", "Starting", "Downloading", "Training",
               "Uploading", "Completed"]


def records(*attempts: tuple[int, int, int | None], every: int = 10, interval: int = 5) -> list[dict]:
    """Rank 0's METRICS records as lab 3's script prints them over one or more attempts, each
    (first step, last step, resumed from: a step or None): a train-loss line every `interval` steps,
    a checkpoint line every `every`, and after a resume the recovery line once its first step is done
    (after that step's train-loss line)."""
    out = []
    for first, last, resumed in attempts:
        for step in range(first, last + 1):
            if step % interval == 0 or step == first:
                out.append({"rank": 0, "step": step, "train_loss": 1.0 / step, "time": float(step)})
            if every and step % every == 0:
                out.append({"rank": 0, "step": step, "checkpoint_s": 0.01})
            if resumed is not None and step == first:
                out.append({"rank": 0, "step": step, "restart": 0, "resumed_step": resumed})
    return out


def outcome(statuses, recs, billable=300, training=400):
    return findings.SpotOutcome(completed=statuses[-1] == "Completed", statuses=statuses,
                                events=findings.spot_events(recs), billable_s=billable, training_s=training,
                                accuracy=0.95)


def test_a_spot_job_that_was_never_interrupted_passes_the_check():
    spot = outcome(COMPLETED, records((1, 62, None)), billable=400, training=400)
    assert spot.interruptions == 0
    said = findings.check_spot(spot)
    assert "not interrupted" in said
    text = "\n".join(spot.lines())
    assert "not interrupted" in text and "status transitions: Starting -> Downloading" in text


def test_a_spot_job_interrupted_once_passes_when_it_resumed_from_its_checkpoint():
    spot = outcome(INTERRUPTED, records((1, 27, None), (21, 62, 20)))
    assert spot.interruptions == 1 and spot.resumed_steps == [20]
    assert "interrupted 1 time(s) and resumed at step(s) 20" in findings.check_spot(spot)
    assert "Interrupted -> Starting" in "\n".join(spot.lines())


@pytest.mark.parametrize("first", [(1, 7, None), (1, 0, None)], ids=["a few steps", "no step logged"])
def test_a_spot_job_reclaimed_before_its_first_checkpoint_may_start_over(first):
    """The second case is the fake's, on a busy machine: no checkpoint 60 s into the attempt, so it was reclaimed
    before it logged a step, and the next attempt's checkpoints are all the job has."""
    spot = outcome(INTERRUPTED, records(first, (1, 62, None)))
    assert "before its first checkpoint" in findings.check_spot(spot)


@pytest.mark.parametrize("statuses, recs, problem", [
    (INTERRUPTED, records((1, 27, None), (1, 62, None)), r"checkpoints at steps \[10, 20\], yet it started over"),
    (INTERRUPTED, records((1, 27, None), (26, 62, 25)), "resumed at step 25, but the job wrote no checkpoint"),
    (COMPLETED, records((1, 30, None), (21, 62, 20)), "never interrupted, yet it resumed"),
    (INTERRUPTED[:-1] + ["Failed"], records((1, 27, None), (21, 62, 20)), "did not complete"),
])
def test_the_spot_check_fails_where_a_claim_is_false(statuses, recs, problem):
    with pytest.raises(AssertionError, match=problem):
        findings.check_spot(outcome(statuses, recs))


def test_a_start_over_is_seen_in_the_checkpoints_steps_too():
    """Train-loss lines rarer than checkpoints: the checkpoints' own steps going back show the new attempt."""
    assert findings.checkpointed_before_start_over(
        [("checkpoint", 10), ("checkpoint", 20), ("checkpoint", 10), ("step", 50)]) == [10, 20]
    assert findings.checkpointed_before_start_over([("step", 10), ("checkpoint", 10), ("step", 11)]) == []


def test_billed_above_the_training_time_fails_the_spot_check():
    with pytest.raises(AssertionError, match="billed 500 s for 400 s"):
        findings.check_spot(outcome(COMPLETED, records((1, 62, None)), billable=500, training=400))


def test_the_steps_lost_solution_is_the_newest_checkpoint_counted_back():
    """The exercise's solution against the checkpoint schedule walked step by step (every C, and at each
    epoch's end), over every fault of two epochs."""
    space: dict = {}
    exec((LAB / "solutions" / "steps_lost.py").read_text(), space)  # noqa: S102 - the lab's own solution file
    for E in (31, 20):
        for C in (4, 8, 16, 40):
            for S in range(1, 2 * E):
                newest = max((s for s in range(1, S + 1) if s % C == 0 or s % E == 0), default=0)
                assert space["steps_lost"](S, C, E) == S - newest, (S, C, E)


def test_the_curves_ends_are_read_from_the_run():
    lrs = (0.0125, 0.025, 0.05, 0.1, 0.2, 0.4)
    acc = {1: [0.80, 0.85, 0.90, 0.93, 0.911, 0.100], 2: [0.70, 0.80, 0.88, 0.92, 0.938, 0.915]}
    rows, best = findings.factor_rows(acc, lrs, (1, 2))
    assert [r["lr factor"] for r in rows] == [1, 2, 4] and best == 2
    said = " ".join(findings.curve_ends(acc, lrs, (1, 2)))
    assert "reached 0.700 against 0.800 at world size 1: below" in said
    assert "World size 1 diverged" in said and "at lr 0.4" in said and "World size 2 trained at every rate" in said
    assert "At lr 0.4 the larger batch still trained" in said
    flat = {1: [0.9] * 6, 2: [0.95] * 6}
    said = " ".join(findings.curve_ends(flat, lrs, (1, 2)))
    assert "not below here" in said and "diverged" not in said
