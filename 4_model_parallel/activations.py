"""Activation memory, measured against its formula: what autograd keeps for the backward of one of lab 4's transformer
blocks (`code/train.py`'s GPT, counted by its own `SavedTensorMeter`), swept over the batch, the sequence length, the
attention kernel and the precision, in this process (a forward pass each: seconds, no training job).

    from activations import sweep, check, formula   # model_parallel.ipynb puts this folder on sys.path
    rows = sweep()                                   # fp32 and bf16, fused and plain attention, b and s doubled
    check(rows)                                      # every row within TOLERANCE of formula(...)

The formula, per block and per pass, for a model without dropout (lab 4's) and p bytes per number:

    kept = p (16 s b h  +  a b s^2 [plain attention only])  +  small terms (4 a b s + 16 b s bytes)

16 s b h: the inputs the block's operations keep for backward (each LayerNorm's input and output, the attention's
input, q, k, v, its output and the projection's input, the MLP's input, the GeLU's input and output: 4h each),
the Ultra-Scale Playbook's and Korthikanti et al.'s count (https://arxiv.org/abs/2205.05198, equation 1: 34 s b h
bytes at 16 bits, of which 2 s b h are dropout masks, 32 = 16 numbers of 2 bytes) without dropout. a b s^2: the
attention probabilities (a heads, s x s each), kept only when the attention is computed step by step (PyTorch's
`SDPBackend.MATH`); a fused kernel (FlashAttention, PyTorch's default `scaled_dot_product_attention` on this CPU)
recomputes them in backward and keeps one number per head and token instead (the 4 a b s). So activations grow
linearly with the batch, and with the sequence linearly when the kernel is fused, faster than linearly when not.

Mixed precision (`torch.autocast`, bf16, as `code/train.py --mixed-precision bf16` runs it, fused attention): the matrix products
keep bf16 inputs (2 bytes), the LayerNorms' inputs stay fp32 (autocast runs them in fp32): 14 numbers x 2 + 2 x 4 =
36 bytes per s b h instead of 64; and autocast keeps the bf16 copy of each weight it cast for the backward
(2 x 12 h^2 bytes per block). The state (fp32 weights, gradients, AdamW's two moments: 16 bytes per parameter) is
unchanged. model_parallel.ipynb and tests/test_activations.py run it.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Iterable
from typing import Any

TOLERANCE = 0.02  # measured against the formula: the formula's small terms are exact, so this is room for rounding
MODEL = {"d_model": 64, "heads": 4, "layers": 2}  # lab 4's measured GPT's width (measure.MEASURE_MODEL)
BATCHES = (4, 8)
SEQ_LENS = (32, 64, 128)


def formula(batch: int, seq_len: int, d_model: int, heads: int, *, bf16: bool = False, fused: bool = True) -> float:
    """The bytes one block keeps for backward (the module docstring's formula, with its small terms)."""
    b, s, h, a = batch, seq_len, d_model, heads
    if bf16:  # 14 numbers of 2 bytes, the LayerNorms' 2 inputs of 4, and the cast weights (12 h^2 numbers of 2)
        if not fused:
            raise ValueError("the formula's bf16 form is the fused kernel's (code/train.py's): autocast's plain "
                             "attention keeps fp32 probabilities and extra bf16 copies besides")
        return 36 * s * b * h + 2 * 12 * h * h + 16 * b * s + 4 * a * b * s  # + statistics and logsumexp (fp32)
    kept = 4 * (16 * s * b * h) + 16 * b * s  # the inputs kept, and the LayerNorms' statistics (mean, 1/std)
    return kept + (4 * a * b * s if fused else 4 * a * b * s * s)  # logsumexp, or the probabilities


def load_model_code():
    """Lab 4's script as a module (its GPT, and the SavedTensorMeter beside it), without running it."""
    from workshop.labs import get_lab

    return get_lab("model_parallel").load_script()


def kept_per_block(script, batch: int, seq_len: int, *, bf16: bool = False, fused: bool = True,
                   d_model: int = MODEL["d_model"], heads: int = MODEL["heads"], layers: int = MODEL["layers"]) -> float:
    """One forward pass of lab 4's GPT (`layers` blocks) under the script's own SavedTensorMeter: the bytes autograd
    keeps inside the blocks, per block."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = script.GPT(layers, d_model, heads, seq_len)
    tokens = torch.randint(0, script.VOCAB, (batch, seq_len))
    meter = script.SavedTensorMeter()
    precision = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    kernel = contextlib.nullcontext() if fused else sdpa_kernel([SDPBackend.MATH])
    with meter.hooks(), precision, kernel:
        model(tokens)
    return meter.bytes["block"] / layers


def sweep(batches: Iterable[int] = BATCHES, seq_lens: Iterable[int] = SEQ_LENS) -> list[dict[str, Any]]:
    """kept_per_block at every batch and sequence length, in fp32 with the fused and the plain attention, and in
    bf16 with the fused one (code/train.py's), beside the formula."""
    script = load_model_code()
    rows = []
    for bf16, fused in ((False, True), (False, False), (True, True)):
        for s in seq_lens:
            for b in batches:
                measured = kept_per_block(script, b, s, bf16=bf16, fused=fused)
                expected = formula(b, s, MODEL["d_model"], MODEL["heads"], bf16=bf16, fused=fused)
                rows.append({"precision": "bf16" if bf16 else "fp32", "attention": "fused" if fused else "plain",
                             "batch": b, "seq_len": s, "kept_bytes": measured, "formula_bytes": expected,
                             "measured / formula": measured / expected})
    return rows


def kept(rows: list[dict[str, Any]], attention: str, precision: str, batch: int, seq_len: int) -> int:
    """The bytes the sweep measured for one block at this attention ("fused" or "plain"), precision, batch and
    sequence length."""
    for r in rows:
        if (r["attention"], r["precision"], r["batch"], r["seq_len"]) == (attention, precision, batch, seq_len):
            return r["kept_bytes"]
    raise KeyError(f"the sweep has no {attention} {precision} row at batch {batch}, sequence {seq_len}")


def growth(rows: list[dict[str, Any]], precision: str, attention: str, what: str) -> float:
    """How many times the kept bytes grew when `what` ("batch" or "seq_len") doubled, the other at its smallest."""
    mine = [r for r in rows if (r["precision"], r["attention"]) == (precision, attention)]
    other = "seq_len" if what == "batch" else "batch"
    low = min(r[other] for r in mine)
    by = {r[what]: r["kept_bytes"] for r in mine if r[other] == low}
    x = sorted(by)
    ratios = [by[b] / by[a] for a, b in zip(x, x[1:], strict=False) if b == 2 * a]
    if not ratios:
        raise ValueError(f"no {what} doubles in the sweep: give sizes that double")
    return statistics.median(ratios)


def check(rows: list[dict[str, Any]]) -> str:
    """Every row within TOLERANCE of the formula; batch x 2 doubles the bytes; sequence x 2 doubles them with the
    fused kernel and more than doubles them with plain attention; bf16 keeps about half of fp32's. Raises
    AssertionError naming what did not hold; returns the line that says what did."""
    for r in rows:
        assert abs(r["measured / formula"] - 1) <= TOLERANCE, \
            (f"{r['precision']}, {r['attention']} attention, b={r['batch']}, s={r['seq_len']}: kept "
             f"{r['kept_bytes']:,.0f} bytes per block, {r['measured / formula']:.3f} of the formula's "
             f"{r['formula_bytes']:,.0f}")
    by_batch = growth(rows, "fp32", "fused", "batch")
    fused_s, plain_s = growth(rows, "fp32", "fused", "seq_len"), growth(rows, "fp32", "plain", "seq_len")
    assert math.isclose(by_batch, 2, rel_tol=0.01), f"batch x 2: the kept bytes grew {by_batch:.3f}x, not 2x"
    assert math.isclose(fused_s, 2, rel_tol=0.02), f"sequence x 2, fused attention: {fused_s:.3f}x, not 2x"
    assert plain_s > 2.05, f"sequence x 2, plain attention: {plain_s:.3f}x, not more than 2x (the s^2 term)"
    largest = max(rows, key=lambda r: (r["batch"] * r["seq_len"], r["precision"] == "fp32"))
    fp32 = next(r for r in rows if (r["precision"], r["attention"], r["batch"], r["seq_len"]) ==
                ("fp32", "fused", largest["batch"], largest["seq_len"]))
    bf16 = next(r for r in rows if (r["precision"], r["attention"], r["batch"], r["seq_len"]) ==
                ("bf16", "fused", largest["batch"], largest["seq_len"]))
    copies = 2 * 12 * MODEL["d_model"] ** 2  # the bf16 weights autocast cast and keeps: not activations
    half = (bf16["kept_bytes"] - copies) / fp32["kept_bytes"]
    assert 0.5 <= half <= 0.65, f"bf16 kept {half:.2f} of fp32's activation bytes, not about half"
    return (f"{len(rows)} forward passes, each within {TOLERANCE:.0%} of the formula: batch x 2 kept {by_batch:.2f}x, "
            f"sequence x 2 kept {fused_s:.2f}x (fused attention) and {plain_s:.2f}x (plain); bf16 kept {half:.2f} of "
            f"fp32's activations at b={largest['batch']}, s={largest['seq_len']} (and the bf16 copies of the weights)")


def planner_per_block(batch: int, seq_len: int, d_model: int = MODEL["d_model"], heads: int = MODEL["heads"],
                      fused: bool = True) -> float:
    """What the planner's transformer model (`workshop.planner.transformer`, the Playbook's 16-bit formula with
    dropout masks) says one block keeps for `batch` sequences, scaled to fp32 (x 2) for this model."""
    from workshop import planner

    m = planner.transformer("lab 4's GPT", layers=1, d_model=d_model, heads=heads, seq_len=seq_len, vocab=256,
                            stores_attention_scores=not fused)
    return 2 * batch * m.activation_bytes_per_sample
