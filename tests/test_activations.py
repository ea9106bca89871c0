"""Lab 4's activation memory against its formula (4_model_parallel/activations.py): forward passes of the lab's GPT
in this process, under the script's own SavedTensorMeter, as the notebook runs them (smaller)."""

from __future__ import annotations

import sys

import pytest

from workshop.labs import get_lab

sys.path.insert(0, str(get_lab("model_parallel").path))
import activations  # noqa: E402  (4_model_parallel/activations.py)


@pytest.fixture(scope="module")
def rows():
    return activations.sweep(batches=(2, 4), seq_lens=(16, 32))


def test_every_pass_keeps_what_the_formula_says(rows):
    line = activations.check(rows)  # within 2% each; batch x 2 and sequence x 2 as the formula grows them
    assert "12 forward passes, each within 2% of the formula" in line, line
    for r in rows:
        assert r["measured / formula"] == pytest.approx(1, abs=activations.TOLERANCE), r


def test_only_plain_attention_grows_faster_than_the_sequence(rows):
    assert activations.growth(rows, "fp32", "fused", "seq_len") == pytest.approx(2, rel=0.01)
    assert activations.growth(rows, "fp32", "plain", "seq_len") > 2.05  # the a b s^2 probabilities
    assert activations.growth(rows, "fp32", "plain", "batch") == pytest.approx(2, rel=0.01)


def test_the_check_catches_a_formula_off_by_the_attention_term(rows):
    # The fused formula applied to plain attention: off by the probabilities, and the check says which row.
    fused = {id(r): activations.formula(r["batch"], r["seq_len"], 64, 4, fused=True) for r in rows}
    wrong = [dict(r, formula_bytes=fused[id(r)], **{"measured / formula": r["kept_bytes"] / fused[id(r)]})
             if r["attention"] == "plain" else r for r in rows]
    with pytest.raises(AssertionError, match=r"fp32, plain attention, b=2, s=16: kept [\d,]+ bytes per block, "
                                             r"1\.\d+ of the formula's"):
        activations.check(wrong)


def test_the_planners_activation_model_is_the_formula_with_dropout_masks():
    """planner.transformer's 34 s h bytes per layer (16-bit, with dropout masks) against this model's 32 (no
    dropout), both doubled for fp32: 34/32 of the formula's main term."""
    ratio = activations.planner_per_block(8, 128) / activations.formula(8, 128, 64, 4)
    assert ratio == pytest.approx(34 / 32, rel=0.01)


def test_bf16s_formula_is_for_the_fused_kernel_only():
    with pytest.raises(ValueError, match="fused kernel"):
        activations.formula(4, 32, 64, 4, bf16=True, fused=False)


def test_kept_reads_one_row_and_names_a_missing_one():
    rows = [{"attention": "plain", "precision": "fp32", "batch": 4, "seq_len": 64, "kept_bytes": 10},
            {"attention": "plain", "precision": "fp32", "batch": 4, "seq_len": 128, "kept_bytes": 23}]
    assert activations.kept(rows, "plain", "fp32", 4, 128) == 23
    with pytest.raises(KeyError, match="no fused bf16 row at batch 4, sequence 64"):
        activations.kept(rows, "fused", "bf16", 4, 64)
