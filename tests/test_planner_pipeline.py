"""Pipeline parallel: the planner's bubble and step (workshop.planner.pipeline_step), lab 4's checks of a pipeline run
(findings.check_pipeline), and one real run of 4_model_parallel/code/pipeline.py (slow) that must hold whatever the
machine's speed: the same loss for GPipe, 1F1B and one process, and the activations each schedule keeps.

Timing is not tested here: `make bench-pipeline` (benchmarks/bench_pipeline.py) prints the idle share against the
bubble and the planner's step against the measured one."""

from __future__ import annotations

import pytest

from workshop import planner
from workshop.errors import WorkshopError
from workshop.labs import get_lab
from workshop.spec import load_module

LAB = get_lab("model_parallel")
LOCAL = planner.local_instance(2, alpha_s=2e-4, bandwidth_Bps=1e9)
MLP = planner.Model("mlp", params=1e6, compute_s_per_sample=1e-4, activation_bytes_per_sample=10_000,
                    handoff_bytes_per_sample=2_000)


def test_the_bubble_is_the_fill_and_the_drain_over_the_step():
    assert planner.bubble(1, 8) == 0  # one stage never waits
    assert planner.bubble(2, 1) == 0.5  # one micro-batch: each of 2 stages waits while the other computes
    assert planner.bubble(2, 4) == pytest.approx(1 / 5)
    assert planner.bubble(4, 8) == pytest.approx(3 / 11)
    shares = [planner.bubble(2, m) for m in (1, 2, 4, 8, 64)]
    assert shares == sorted(shares, reverse=True) and shares[-1] > 0  # more micro-batches shrink it, never to 0
    with pytest.raises(WorkshopError, match="microbatches must be a whole number"):
        planner.bubble(2, 0)


def test_a_pipeline_step_is_m_plus_p_minus_1_slots_and_the_hand_offs_of_the_fill_and_the_drain():
    step = planner.pipeline_step(MLP, LOCAL, stages=2, microbatches=4, batch_size=1024, schedule=planner.GPIPE)
    slot = 1024 * 1e-4 / 2 / 4  # one micro-batch's forward and backward on one of 2 stages
    assert step.compute_s == pytest.approx(4 * slot) and step.bubble_s == pytest.approx(slot)
    assert step.handoff_s == pytest.approx(2 * (2e-4 + 256 * 2_000 / 1e9))  # one message each way, fill and drain
    assert step.total_s == pytest.approx(5 * slot + step.handoff_s)
    assert step.handoff_bytes == 1024 * 2_000
    free = planner.local_instance(2, alpha_s=0.0, bandwidth_Bps=1e30)  # hand-offs that cost nothing
    for m in (1, 2, 4, 8):
        assert planner.pipeline_step(MLP, free, 2, m, 1024, planner.GPIPE).idle_share == pytest.approx(
            planner.bubble(2, m))
    assert planner.pipeline_step(MLP, LOCAL, 1, 4, 1024).total_s == pytest.approx(1024 * 1e-4)  # no pipeline


def test_gpipe_keeps_the_whole_batchs_activations_and_1f1b_those_of_p_micro_batches():
    whole = 1024 * 10_000 / 2  # the batch's activations of one of 2 stages
    for m in (2, 4, 8):
        gpipe = planner.pipeline_step(MLP, LOCAL, 2, m, 1024, planner.GPIPE)
        one_f_one_b = planner.pipeline_step(MLP, LOCAL, 2, m, 1024, planner.ONE_F_ONE_B)
        assert gpipe.microbatches_held == m and gpipe.activation_bytes == pytest.approx(whole)
        assert one_f_one_b.microbatches_held == 2 and one_f_one_b.activation_bytes == pytest.approx(whole * 2 / m)
        assert one_f_one_b.total_s == pytest.approx(gpipe.total_s)  # the same bubble: only the memory differs


def test_the_schedules_own_cost_lies_on_2_m_plus_p_minus_1_forwards_and_backwards_and_grows_with_m():
    o = 1e-3  # what one micro-batch's forward or backward costs a stage besides its compute and bytes
    for m in (1, 2, 4, 8):
        plain = planner.pipeline_step(MLP, LOCAL, 2, m, 1024, planner.GPIPE)
        costly = planner.pipeline_step(MLP, LOCAL, 2, m, 1024, planner.GPIPE, microbatch_overhead_s=o)
        assert costly.overhead_s == pytest.approx(2 * (m + 1) * o) and plain.overhead_s == 0
        assert costly.total_s == pytest.approx(plain.total_s + 2 * (m + 1) * o)
        assert costly.idle_share > plain.idle_share  # a stage is not computing while the schedule works
        assert costly.compute_s == plain.compute_s and costly.bubble_s == plain.bubble_s
    assert planner.pipeline_step(MLP, LOCAL, 1, 4, 1024, microbatch_overhead_s=o).overhead_s == 0  # no pipeline
    with pytest.raises(WorkshopError, match="microbatch_overhead_s must be 0 or more"):
        planner.pipeline_step(MLP, LOCAL, 2, 4, 1024, microbatch_overhead_s=-1e-3)


def test_the_schedules_own_cost_is_read_from_the_narrow_models_steps_less_the_hand_offs_latency():
    findings = load_module(LAB.path / "findings.py", "_lab4_findings_overheads")
    run = records()  # the narrow model's step: 2(m + 1) x 1 ms, plus the 2 hand-offs' 0.2 ms latency
    assert findings.pipeline_overheads(run) == pytest.approx({"gpipe": 1e-3, "1f1b": 1e-3})
    for r in run:
        if r["schedule"] == "1f1b":
            r["overhead_step_s"] += 2 * (r["microbatches"] + 1) * 1e-3  # 1F1B's own work twice GPipe's
    assert findings.pipeline_overheads(run) == pytest.approx({"gpipe": 1e-3, "1f1b": 2e-3})
    rows = {(r["schedule"], r["m"]): r["planner"] for r in findings.pipeline_rows(run)}
    assert rows["1f1b", 8].overhead_s == pytest.approx(2 * 9 * 2e-3) and rows["gpipe", 8].overhead_s == \
        pytest.approx(2 * 9 * 1e-3)
    for r in run:
        r["overhead_width"] = 0  # --overhead-width 0: not timed, nothing added
    assert findings.pipeline_overheads(run) == {"gpipe": 0.0, "1f1b": 0.0}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"microbatches": 1, "schedule": "1f1b"}, "1F1B needs at least one micro-batch per stage"),
    ({"schedule": "interleaved"}, "Unknown pipeline schedule"),
    ({"microbatches": 2048}, "some would be empty"),
    ({"stages": 0}, "stages must be a whole number"),
])
def test_a_pipeline_that_cannot_run_is_refused_with_the_fix(kwargs, message):
    args = {"stages": 2, "microbatches": 4, "batch_size": 1024, **kwargs}
    with pytest.raises(WorkshopError, match=message):
        planner.pipeline_step(MLP, LOCAL, **args)


def test_stages_beyond_one_instance_cross_the_network_and_beyond_its_devices_time_share():
    inside = planner.pipeline_step(MLP, "ml.p4d.24xlarge", 8, 16, 1024)
    across = planner.pipeline_step(MLP, "ml.p4d.24xlarge", 16, 16, 1024)
    p4d = planner.get_instance("ml.p4d.24xlarge")
    b = 1024 / 16 * 2_000
    assert inside.handoff_s == pytest.approx(2 * 7 * (p4d.intra_alpha_s + b / p4d.intra_Bps))
    assert across.handoff_s == pytest.approx(2 * 15 * (p4d.alpha_s + b / (p4d.network_Bps / p4d.gpus)))
    shared = planner.pipeline_step(MLP, LOCAL, 4, 4, 1024, procs_per_instance=4)  # 4 stages on 2 cores
    assert shared.compute_s == pytest.approx(2 * 1024 * 1e-4 / 4)


def test_a_transformer_hands_one_layers_output_per_sequence_to_the_next_stage():
    gpt = planner.transformer("t", layers=4, d_model=256, heads=8, seq_len=128, vocab=256)
    assert gpt.handoff_bytes_per_sample == 2 * 128 * 256  # s h values of 16 bits
    with pytest.raises(WorkshopError, match="handoff_bytes_per_sample is negative"):
        planner.Model("bad", params=1, handoff_bytes_per_sample=-1)


def records(d=64, per=2, batch=64, microbatches=(1, 2, 4, 8)):
    """What code/pipeline.py reports for 2 stages, as the schedules really behave (stage 0 of 1F1B keeps p)."""
    out = []
    for schedule in ("gpipe", "1f1b"):
        for m in microbatches:
            if schedule == "1f1b" and m < 2:
                continue
            for rank in (0, 1):
                held = m if schedule == "gpipe" else 2 - rank
                out.append({"schedule": schedule, "microbatches": m, "rank": rank, "world_size": 2, "d_model": d,
                            "layers_per_stage": per, "batch_size": batch, "step_s": 0.1, "idle_share": 0.3,
                            "queued_share": 0.0,
                            "peak_microbatches": held, "peak_saved_bytes": held * batch // m * (per + 1) * d * 4,
                            "loss": 0.98 if rank == 1 else float("nan"), "max_rel_diff": 1e-7,
                            "one_process_compute_s": 0.01, "p2p_alpha_s": 2e-4, "p2p_bandwidth_Bps": 1e9,
                            "overhead_width": 2, "overhead_step_s": 2 * (m + 1) * 1e-3 + 2 * 2e-4,
                            "timeline": []})
    return out


def test_the_notebooks_pipeline_checks_pass_on_a_run_and_fail_where_a_schedule_goes_wrong():
    findings = load_module(LAB.path / "findings.py", "_lab4_findings_pipeline")
    findings.check_pipeline(records())
    rows = findings.pipeline_rows(records())
    assert [(r["schedule"], r["m"]) for r in rows] == [("gpipe", 1), ("gpipe", 2), ("gpipe", 4), ("gpipe", 8),
                                                       ("1f1b", 2), ("1f1b", 4), ("1f1b", 8)]
    assert rows[3]["held"] == [8, 8] and rows[-1]["held"] == [2, 1] and rows[0]["bubble"] == 0.5
    for where, change in [
        (("gpipe", 4, 1), {"peak_microbatches": 2}),  # GPipe let go of a micro-batch before the backwards
        (("1f1b", 8, 0), {"peak_saved_bytes": 4 * 64 // 8 * 3 * 64 * 4}),  # 1F1B's first stage kept 4, not p
        (("1f1b", 4, 1), {"loss": 0.99}),  # 1F1B's loss is not GPipe's
        (("gpipe", 2, 0), {"max_rel_diff": 1e-2}),  # a gradient that is not one process's
    ]:
        broken = records()
        for r in broken:
            if (r["schedule"], r["microbatches"], r["rank"]) == where:
                r.update(change)
        with pytest.raises(AssertionError):
            findings.check_pipeline(broken)


@pytest.mark.slow
def test_gpipe_and_1f1b_give_one_processs_loss_and_keep_m_and_p_micro_batches():
    """One run of code/pipeline.py on 2 processes, small (a few seconds of compute): every schedule's loss and
    gradients are one process's, GPipe keeps all m micro-batches' activations, 1F1B at most p; 1F1B at m = 1 is
    left out. The same checks as the notebook's (findings.check_pipeline)."""
    measure = load_module(LAB.path / "measure.py", "_lab4_measure_pipeline")
    findings = load_module(LAB.path / "findings.py", "_lab4_findings_pipeline_run")
    run = measure.pipeline((1, 2, 4, 8), steps=1, model={"d-model": 64, "layers-per-stage": 2, "batch-size": 64},
                           timeout=300)
    assert sorted({(r["schedule"], r["microbatches"]) for r in run}) == [
        ("1f1b", 2), ("1f1b", 4), ("1f1b", 8), ("gpipe", 1), ("gpipe", 2), ("gpipe", 4), ("gpipe", 8)]
    findings.check_pipeline(run)
    last = {(r["schedule"], r["microbatches"]): r for r in run if r["rank"] == 1}
    assert {r["ref_loss"] for r in last.values()} == {last["gpipe", 1]["ref_loss"]}
    for (schedule, m), r in last.items():
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5), (schedule, m)
    for r in run:
        assert r["peak_microbatches"] == (r["microbatches"] if r["schedule"] == "gpipe" else 2 - r["rank"]), r
        assert r["overhead_width"] == 2 and 0 < r["overhead_step_s"] < r["step_s"] * 10, r  # the narrow model timed
        assert 0 <= r["idle_share"] < 1 and 0 <= r["queued_share"] < 1 and len(r["timeline"]) == 2 * r["microbatches"]
