"""Lab 3's gradient accumulation (`--grad-accum K`) and DDP's buckets (`--bucket-cap-mb`).

The fast tests check the flags before anything starts and the bucket rule against torch's own; the slow one
runs lab 3's script three times in private network namespaces (3_data_parallel/accumulation.py, as the
notebook does): per micro-batch, K = 2 moves half of K = 1's bytes, an optimizer step makes as many
all-reduce calls at either K (read from the profiler's trace) as DDP's buckets, and 1 rank at K = 2 trains as
2 ranks at K = 1 do at the same global batch and learning rate.
"""

from __future__ import annotations

import sys

import pytest
import torch.distributed as dist

from workshop.errors import WorkshopError
from workshop.labs import get_lab
from workshop.runner import run_local

LAB = get_lab("data_parallel")
sys.path.insert(0, str(LAB.path))
import accumulation  # noqa: E402  (3_data_parallel/accumulation.py)


def parse(*argv: str):
    return LAB.load_script().build_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    ("hps", "message"),
    [
        ({"grad-accum": 0}, r"--grad-accum must be at least 1, got 0\s+Fix: set --grad-accum to 1"),
        # 4,000 digits over 2 ranks: 2,000 each, 31 micro-batches of 64; 40 do not fit in an epoch
        ({"grad-accum": 40}, r"--grad-accum 40 needs 40 micro-batches of 64 for one optimizer step, and each of "
                             r"the 2 ranks gets 31 per epoch\s+Fix: set --grad-accum to 31 or less"),
        ({"grad-accum": 4, "profile-steps": 5}, r"does not fit in the first epoch's 7 steps\s+Fix: set --profile-steps "
                                                r"to 3 or less, or --batch-size lower, or --grad-accum lower"),
        ({"bucket-cap-mb": -1}, r"--bucket-cap-mb must be 0 \(DDP's default\) or more"),
        ({"bucket-cap-mb": "inf"}, r"--bucket-cap-mb"),
    ],
)
def test_bad_accumulation_fails_before_any_process_starts(tmp_path, channels, hps, message):
    with pytest.raises(WorkshopError, match=message):
        run_local(LAB, hosts=2, hyperparameters=hps, workdir=tmp_path / "run", data_dir=channels["train"].parent,
                  echo=False)
    assert not (tmp_path / "run").exists()


def test_an_epoch_counts_optimizer_steps():
    script = LAB.load_script()
    assert script.steps_per_epoch(parse(), 2, 4000) == 31  # 2,000 digits a rank, in batches of 64
    assert script.steps_per_epoch(parse("--grad-accum", "2"), 2, 4000) == 15  # 31 micro-batches: 15 steps of 2
    assert script.steps_per_epoch(parse("--grad-accum", "2"), 1, 4000) == 31  # one rank: 62 micro-batches
    assert script.steps_per_epoch(parse("--grad-accum", "2", "--max-steps", "4"), 1, 4000) == 4
    script.check_args(parse("--grad-accum", "31"), 2, train_samples=4000)  # the most that fits: accepted


def test_the_global_batch_and_the_learning_rate_grow_with_k(capsys):
    script = LAB.load_script()
    args = parse("--grad-accum", "2")
    config = script.describe_run(args, 0, 2, "gloo", "gloo: CPU", "cpu", 1, 0.02 * 2 * 2, 4000, 1000)
    assert config["global_batch_size"] == 256 and config["effective_lr"] == pytest.approx(0.08)
    assert "global batch 64 x 2 micro-batches x 2 ranks = 256; learning rate 0.02 x 2 x 2 = 0.08" in capsys.readouterr().out
    # At K = 1, the line reads as it always has.
    script.describe_run(parse(), 0, 2, "gloo", "gloo: CPU", "cpu", 1, 0.04, 4000, 1000)
    assert "global batch 64 x 2 = 128; learning rate 0.02 x 2 = 0.04" in capsys.readouterr().out
    assert "x 2 ranks x 2 micro-batches = 0.08" in script.divergence_fix(args, 2)


def test_the_bucket_rule_is_torchs():
    """accumulation.bucket_count, the rule the notebook and the benchmark predict with, makes the buckets
    torch's own assignment makes, for lab 3's CNN at every cap the benchmark sweeps and more."""
    net = LAB.load_script().Net()
    params = list(reversed(list(net.parameters())))
    sizes = accumulation.gradient_sizes(net)
    mib = 1024 * 1024
    for cap in (0, 0.01, 0.05, 0.1, 0.5, 1, 1.5, 1.6, 2, 25):
        limits = [mib, 25 * mib] if not cap else [int(cap * mib)]
        buckets, _ = dist._compute_bucket_assignment_by_size(params, limits, [False] * len(params),
                                                            list(range(len(params))))
        assert accumulation.bucket_count(sizes, cap) == len(buckets), cap
    # fc1's weight is 95% of the gradient: below it, ceil(bytes / cap) overcounts; a gradient is never split.
    assert accumulation.naive_bucket_count(sum(sizes), 0.5) == 4 and accumulation.bucket_count(sizes, 0.5) == 2


@pytest.mark.slow
def test_accumulation_moves_one_all_reduce_per_step_and_trains_as_more_ranks_do(tmp_path, mnist_dir):
    isolated, why = accumulation.private_network()
    if not isolated:
        pytest.skip(f"bytes are measured in a private network namespace, and here {why}")
    result = accumulation.compare(steps=12, data_dir=mnist_dir, workdir=tmp_path, private=True, echo=False)
    print(result.check())  # the notebook's check: 0.50 +- 0.05 of the bytes per micro-batch, losses within tolerance
    assert 0.95 <= result.share_per_step <= 1.05, result.share_per_step
    # The trace: DDP's buckets, one all-reduce each, per optimizer step at either K, the whole gradient each step.
    sizes = accumulation.gradient_sizes(LAB.load_script().Net())
    for run in (result.reference, result.accumulated):
        assert run.calls_per_step == accumulation.bucket_count(sizes, 0) == 2, run
        assert run.elements_per_step == sum(sizes) // 4, run
    assert result.one_rank.global_batch == result.reference.global_batch == 128
