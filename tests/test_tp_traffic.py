"""Lab 4's tensor parallel traffic (4_model_parallel/tp_traffic.py, code/tensor_parallel.py).

The fast tests check the formula and that the check catches a wrong layout and wrong bytes; the slow one runs the
script on 2 ranks in a private network namespace, as the notebook does: each block (the MLP, the attention) makes
2 all-reduces per step, its bytes are the formula's, and its outputs and gradients are the whole block's.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys

import pytest
import torch.distributed as dist

from workshop import REPO_ROOT, planner
from workshop.errors import WorkshopError
from workshop.labs import get_lab
from workshop.spec import load_module

LAB = get_lab("model_parallel")
sys.path.insert(0, str(LAB.path))
import tp_traffic  # noqa: E402  (4_model_parallel/tp_traffic.py)


def record(**changes):
    r = {"block": "mlp", "world_size": 2, "batch_size": 8, "seq_len": 128, "d_model": 256, "max_diff": 1e-7,
         "all_reduces": 2, "other_collectives": 0, "private": True, "step_ms": 50.0, "whole_ms": 80.0,
         "allreduce_ms": 2.0, "tiny_split_ms": 9.0, "tiny_whole_ms": 1.0}
    r["formula_bytes"] = tp_traffic.formula_bytes(r["batch_size"], r["seq_len"], r["d_model"])
    r["bytes_per_step"] = r["formula_bytes"] * 1.002
    return {**r, **changes}


def test_the_formula_is_two_all_reduces_of_the_activation():
    # b x s x h = 8 x 128 x 256 fp32 numbers: 1 MiB; two all-reduces (forward, backward), each 2(N-1) x that.
    assert tp_traffic.formula_bytes(8, 128, 256) == 2 * 2 * 1 * 1024 * 1024
    assert tp_traffic.formula_bytes(8, 128, 256, world=4) == 2 * 2 * 3 * 1024 * 1024
    assert tp_traffic.formula_bytes(16, 128, 256) == 2 * tp_traffic.formula_bytes(8, 128, 256)  # linear in b


def test_the_check_catches_a_layout_that_reduces_more_and_bytes_off_the_formula():
    assert "bytes 1.002-1.002 of the formula" in tp_traffic.check([record(), record(block="attention")])
    # q, k and v each reducing the input's gradient: what the attention block does without PrepareModuleInput
    with pytest.raises(AssertionError, match="attention at batch 8: 4 all-reduces and 0 other collectives"):
        tp_traffic.check([record(block="attention", all_reduces=4)])
    with pytest.raises(AssertionError, match="1.200 of the formula"):
        tp_traffic.check([record(bytes_per_step=record()["formula_bytes"] * 1.2)])
    with pytest.raises(AssertionError, match="differs from the whole"):
        tp_traffic.check([record(max_diff=0.1)])
    # On the machine's shared loopback the bytes are not checked, and the line says so.
    assert "not checked" in tp_traffic.check([record(private=False, bytes_per_step=1.0)])


def test_bad_arguments_are_refused_before_any_process_group(monkeypatch, capsys):
    script = load_module(tp_traffic.SCRIPT, "tensor_parallel_script")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    for argv, message in ((["--blocks", "mlp,conv"], "--blocks: conv; choose from mlp, attention"),
                          (["--batch-sizes", "4,x"], "--batch-sizes ('4,x') must be whole numbers"),
                          (["--heads", "3"], "--heads (3) must split evenly over 2 ranks")):
        with pytest.raises(SystemExit, match=re.escape(message)):
            script.main(argv)
    assert not dist.is_initialized()


@pytest.mark.slow
def test_each_block_makes_two_all_reduces_of_the_formulas_bytes(tmp_path):
    """`make bench-tensor-parallel`, smallest: one run of code/tensor_parallel.py on 2 ranks in a private network
    namespace (tp_traffic.run, as the notebook calls it), its check (2 all-reduces per block and step, the whole
    block's outputs and gradients, bytes within 5% of the formula), then the benchmark's table, CSV and plot."""
    isolated, why = tp_traffic.private_network()
    if not isolated:
        pytest.skip(f"bytes are measured in a private network namespace, and here {why}")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_tensor_parallel.py"), "--repeats", "1",
                           "--steps", "2", "--batch-sizes", "2", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 block runs: 2 all-reduces per step each, outputs and gradients the whole block's" in proc.stdout
    rows = {r["block"]: r for r in csv.DictReader((tmp_path / "bench_tensor_parallel.csv").open())}
    assert set(rows) == {"mlp", "attention"}
    for r in rows.values():
        assert float(r["formula_MB"]) == pytest.approx(2 * 2 * 2 * 128 * 256 * 4 / 1e6)
        assert abs(float(r["bytes_vs_formula"]) - 1) <= tp_traffic.BYTES_TOLERANCE, r
        assert float(r["step_ms"]) > 0 and float(r["planner_ms"]) > 0
    assert (tmp_path / "bench_tensor_parallel.png").stat().st_size > 0
    assert "| mlp | 2 x 128 x 256 | 2 |" in (tmp_path / "bench_tensor_parallel.md").read_text()


def test_the_planners_step_is_the_whole_block_over_n_two_measured_all_reduces_and_the_blocks_overhead():
    """planner_step takes the link's latency and bandwidth from the run's two lone all-reduces (4 bytes and the
    block's output): the planner's ring formula gives back the measured all-reduce of that size, so its step is
    whole / N + 2 x that + the tiny split block's extra; at twice the batch, the compute and the payload double,
    the latency does not."""
    r = record(params=525_568, allreduce_4b_ms=0.2)
    step = tp_traffic.planner_step(r)
    assert step.compute_s == pytest.approx(r["whole_ms"] / 2 / 1e3)
    assert step.comm_s == pytest.approx(2 * r["allreduce_ms"] / 1e3)
    assert step.overhead_s == pytest.approx((9.0 - 1.0 - 2 * 0.2) / 1e3)  # the tiny split block's extra, less its latency
    assert step.allreduces == 2 and step.allreduce_bytes == 8 * 128 * 256 * 4
    # The planner itself, on the same link at twice the batch: twice the compute and payload, the same latency.
    model = planner.Model("block", params=525_568, compute_s_per_sample=0.01, handoff_bytes_per_sample=128 * 256 * 4)
    link = planner.local_instance(2, alpha_s=50e-6, bandwidth_Bps=1e9)
    one, two = (planner.tensor_parallel_step(model, link, 2, b) for b in (8, 16))
    assert two.compute_s == pytest.approx(2 * one.compute_s) == pytest.approx(0.08)
    assert one.comm_s == pytest.approx(2 * (8 * 128 * 256 * 4 / 1e9 + 2 * 50e-6))  # 2(n-1)/n K/B + 2(n-1) alpha
    assert two.comm_s - 2 * one.comm_s == pytest.approx(-2 * 2 * 50e-6)
    assert planner.tensor_parallel_step(model, link, 1, 8).comm_s == 0  # one rank: nothing to join
    with pytest.raises(WorkshopError, match="would cross the network"):
        planner.tensor_parallel_step(model, link, 4, 8)


def test_a_measurement_that_insists_on_a_private_network_is_refused_where_there_is_none(monkeypatch):
    from workshop.launchers import horovod_probe

    monkeypatch.setattr(horovod_probe, "private_network", lambda: (False, "this system refuses one"))
    assert horovod_probe.wanted_private_network(None) is False  # the shared loopback, as the record says
    assert horovod_probe.wanted_private_network(False) is False
    with pytest.raises(WorkshopError, match="No private network namespace here: this system refuses one"):
        horovod_probe.wanted_private_network(True)  # tp_traffic.run(private=True), accumulation.run(private=True)
