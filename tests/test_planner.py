"""The planner's formulas against hand-computed numbers, its monotonicity, and its rules."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from workshop import planner
from workshop.cloud.prices import INSTANCE_PRICES
from workshop.errors import WorkshopError
from workshop.planner import DDP, FULL, MIXED_ADAM, PS, ZERO1, ZERO2, Model

GB = 1e9
ONE_B = Model("1B", params=1e9, activation_bytes_per_sample=1e8, flops_per_sample=6e9 * 1024)


# --------------------------------------------------------------------------- memory


def test_zero_accounting_matches_hand_computed_bytes():
    # ZeRO paper, 1B params, mixed-precision Adam (2 + 2 + 12 bytes/param), 8 ranks, batch 4.
    acts = 4 * 1e8
    cases = {
        DDP: 16e9,
        ZERO1: 2e9 + 2e9 + 12e9 / 8,  # 5.5 GB
        ZERO2: 2e9 + 14e9 / 8,  # 3.75 GB
        FULL: 16e9 / 8,  # 2 GB
    }
    for strategy, states in cases.items():
        mem = planner.memory_per_gpu(ONE_B, strategy, batch_size=4, data_parallel=8)
        assert mem.model_states == pytest.approx(states), strategy
        assert mem.total == pytest.approx(states + acts + mem.gathered), strategy
        assert mem.host == 0
        assert (mem.gathered > 0) == (strategy == FULL)


def test_full_sharding_also_holds_the_gathered_units_so_it_pays_to_shard_per_layer():
    # FSDP2 gathers the computing unit and prefetches the next (2 units of 2-byte weights) and holds
    # one unit's unsharded 2-byte gradients: a model wrapped whole (1 unit) gathers all of itself.
    whole = planner.memory_per_gpu(ONE_B, FULL, 4, 8)
    assert whole.gathered == pytest.approx(2e9 + 2e9)
    layered = planner.memory_per_gpu(replace(ONE_B, fsdp_units=25), FULL, 4, 8)
    assert layered.gathered == pytest.approx(1e9 / 25 * (2 * 2 + 2))
    assert layered.model_states == whole.model_states  # the shards themselves do not change
    offloaded = planner.memory_per_gpu(replace(ONE_B, fsdp_units=25), FULL, 4, 8, offload=True)
    assert offloaded.model_states == 0 and offloaded.gathered == layered.gathered  # computed on the GPU


def test_precision_presets_hold_the_stated_bytes_per_parameter():
    assert MIXED_ADAM.total == 16
    assert planner.FP32_ADAM.total == 16
    assert planner.FP32_SGD_MOMENTUM.total == 12
    mem = planner.memory_per_gpu(ONE_B, DDP, 1, 1, precision=planner.FP32_SGD_MOMENTUM)
    assert mem.model_states == pytest.approx(12e9)


def test_offload_moves_optimizer_state_and_for_full_sharding_everything_to_the_host():
    z2 = planner.memory_per_gpu(ONE_B, ZERO2, 1, 8, offload=True)
    assert z2.optimizer == 0
    assert z2.host == pytest.approx(12e9 / 8)
    assert z2.params == pytest.approx(2e9)
    full = planner.memory_per_gpu(ONE_B, FULL, 1, 8, offload=True)
    assert full.model_states == 0
    assert full.host == pytest.approx(16e9 / 8)


def test_sharded_memory_falls_with_more_ranks_and_ddp_does_not():
    layered = replace(ONE_B, fsdp_units=25)  # full sharding applied per layer, as it is in practice
    for strategy in (ZERO1, ZERO2, FULL):
        totals = [planner.memory_per_gpu(layered, strategy, 2, d).total for d in (1, 2, 4, 8, 64)]
        assert all(a > b for a, b in zip(totals, totals[1:], strict=False)), strategy
    ddp = {planner.memory_per_gpu(ONE_B, DDP, 2, d).total for d in (1, 2, 64)}
    assert len(ddp) == 1
    # ...and the lighter the sharding, the more memory, at any rank count > 1.
    for d in (2, 8):
        m = [planner.memory_per_gpu(layered, s, 2, d).total for s in (DDP, ZERO1, ZERO2, FULL)]
        assert m == sorted(m, reverse=True)


def test_tensor_parallel_divides_the_weights_each_rank_holds():
    a = planner.memory_per_gpu(ONE_B, DDP, 1, 1)
    b = planner.memory_per_gpu(ONE_B, DDP, 1, 1, tensor_parallel=8)
    assert b.model_states == pytest.approx(a.model_states / 8)
    one = planner.step_time(ONE_B, "ml.p4d.24xlarge", DDP, 4)
    tp8 = planner.step_time(ONE_B, "ml.p4d.24xlarge", DDP, 4, tensor_parallel=8)
    assert tp8.compute_s == pytest.approx(one.compute_s / 8)


# --------------------------------------------------------------------------- communication


def test_ring_allreduce_is_the_alpha_beta_formula():
    t = planner.ring_allreduce_s(1e9, 4, bandwidth_Bps=1e9, alpha_s=1e-3)
    assert t == pytest.approx(2 * 3 / 4 * 1.0 + 2 * 3 * 1e-3)
    assert planner.ring_allreduce_s(1e9, 1, 1e9, 1e-3) == 0
    # bandwidth term grows towards 2K/B with n and never passes it
    ts = [planner.ring_allreduce_s(1e9, n, 1e9, 0.0) for n in (2, 4, 8, 1024)]
    assert ts == sorted(ts) and ts[-1] < 2.0


def test_hierarchical_beats_a_flat_ring_across_instances():
    inst = planner.get_instance("ml.p4d.24xlarge")
    k = 2e9
    flat = planner.allreduce_s(k, inst, 8, 4, algorithm="ring")
    hier = planner.allreduce_s(k, inst, 8, 4, algorithm="hierarchical")
    assert hier < flat
    # by hand: flat ring, every GPU at 400 Gbps / 8 = 6.25 GB/s, 32 ranks
    assert flat == pytest.approx(2 * 31 / 32 * k / 6.25e9 + 62 * inst.alpha_s)
    # inside one instance both are the same ring over NVLink
    assert planner.allreduce_s(k, inst, 8, 1, "ring") == planner.allreduce_s(k, inst, 8, 1, "hierarchical")


def test_parameter_server_bottleneck_moves_to_the_servers_with_many_workers():
    k, b = 1e8, 1e9
    few = planner.parameter_server_s(k, workers=1, servers=2, worker_Bps=b, server_Bps=b, alpha_s=0)
    assert few == pytest.approx(2 * k / b)  # the worker's own link
    many = planner.parameter_server_s(k, workers=16, servers=2, worker_Bps=b, server_Bps=b, alpha_s=0)
    assert many == pytest.approx(2 * 16 * k / (2 * b))  # the servers' links
    with pytest.raises(WorkshopError):
        planner.parameter_server_s(k, 0, 1, b, b, 0)


def test_full_sharding_moves_one_and_a_half_times_the_ddp_volume():
    s_ddp = planner.step_time(ONE_B, "ml.p4d.24xlarge", DDP, 4, instance_count=2)
    s_full = planner.step_time(ONE_B, "ml.p4d.24xlarge", FULL, 4, instance_count=2)
    assert s_full.comm_s == pytest.approx(1.5 * s_ddp.comm_s)
    assert s_full.bytes_per_gpu == pytest.approx(1.5 * s_ddp.bytes_per_gpu)
    assert s_ddp.bytes_per_gpu == pytest.approx(2 * 15 / 16 * 2e9)  # 16 ranks, 2 bytes/grad


def test_fsdp_moves_three_parameter_volumes_per_rank_on_nccl_and_four_on_gloo():
    # NCCL, full_shard: per unit an all-gather in forward, another in backward, a reduce-scatter,
    # each (n-1)/n of the unit's bytes per rank: 3 (n-1)/n x 2 GB for 1B params in bf16, 16 ranks.
    m = Model("1B", params=1e9, flops_per_sample=6e9, fsdp_units=8)
    nccl = planner.fsdp_comm(m, "ml.p4d.24xlarge", 16, 8, 2)
    assert (nccl.units, nccl.allgathers, nccl.collectives) == (8, 2, 24)
    assert nccl.allgather_bytes == pytest.approx(15 / 16 * 2e9 / 8)
    assert nccl.reduce_scatter_bytes == pytest.approx(15 / 16 * 2e9 / 8)
    assert nccl.bytes_per_rank == pytest.approx(3 * 2e9 * 15 / 16)
    step = planner.step_time(m, "ml.p4d.24xlarge", FULL, 4, instance_count=2)
    assert step.bytes_per_gpu == pytest.approx(3 * 2e9 * 15 / 16)
    # gloo (lab 3's CNN, fp32): the reduce-scatter is a whole all-reduce, 2(n-1)/n: 4 (n-1)/n K in all.
    cnn = Model("cnn", params=421_642, compute_s_per_sample=1e-3, fsdp_units=4)
    local = planner.local_instance(devices=2, alpha_s=1e-4, bandwidth_Bps=1e9)
    assert local.backend == "gloo"
    k = 4 * 421_642
    gloo = planner.fsdp_comm(cnn, local, 4, 4, 1, planner.FP32_SGD_MOMENTUM)
    assert gloo.reduce_scatter_bytes == pytest.approx(2 * 3 / 4 * k / 4)
    assert gloo.bytes_per_rank == pytest.approx(4 * 3 / 4 * k)
    s = planner.step_time(cnn, local, FULL, 64, 1, procs_per_instance=4, precision=planner.FP32_SGD_MOMENTUM)
    assert s.bytes_per_gpu == pytest.approx(4 * 3 / 4 * k)
    # the all-gathers move the weights' dtype, the reduce-scatter the gradients' (lab 4: bf16 / fp32)
    mixed = planner.fsdp_comm(m, "ml.p4d.24xlarge", 16, 8, 2, comm_dtype_bytes=4)
    assert mixed.bytes_per_rank == pytest.approx(15 / 16 * (2 * 2e9 + 4e9))


def test_gloos_reduce_scatter_costs_a_whole_allreduce_and_nccls_half():
    local = planner.local_instance(devices=4, alpha_s=1e-4, bandwidth_Bps=1e9)
    ar = planner.allreduce_s(8e6, local, 4, 1)
    assert ar == pytest.approx(2 * 3 / 4 * 8e6 / 1e9 + 2 * 3 * 1e-4)
    assert planner.reduce_scatter_s(8e6, local, 4, 1) == pytest.approx(ar)  # clone + all-reduce
    assert planner.reduce_scatter_s(8e6, local, 4, 1, backend="nccl") == pytest.approx(ar / 2)
    assert planner.allgather_s(8e6, local, 4, 1) == pytest.approx(ar / 2)  # a ring: (n-1)/n K, (n-1) alpha
    p4d = planner.get_instance("ml.p4d.24xlarge")
    assert p4d.backend == "nccl"
    hier = planner.allreduce_s(8e6, p4d, 8, 4)
    assert planner.reduce_scatter_s(8e6, p4d, 8, 4) == pytest.approx(hier / 2)
    assert planner.allgather_s(8e6, p4d, 8, 4) == pytest.approx(hier / 2)


def test_fsdp_pays_the_latency_of_three_collectives_per_unit():
    # Latency only (bandwidth ~infinite): U units x (2 all-gathers + 1 reduce-scatter) x (n-1) alpha on
    # NCCL, U x (2 (n-1) + 2 (n-1)) alpha on gloo; a whole-model view would count U = 1.
    alpha, n = 1e-3, 4
    fast = planner.local_instance(devices=n, alpha_s=alpha, bandwidth_Bps=1e30)
    nccl = replace(fast, backend="nccl")
    for units in (1, 4, 16):
        m = Model("m", params=1e6, compute_s_per_sample=1e-3, fsdp_units=units)
        on_nccl = planner.step_time(m, nccl, FULL, 1, 1, procs_per_instance=n)
        on_gloo = planner.step_time(m, fast, FULL, 1, 1, procs_per_instance=n)
        assert on_nccl.comm_s == pytest.approx(units * 3 * (n - 1) * alpha)
        assert on_gloo.comm_s == pytest.approx(units * 4 * (n - 1) * alpha)
    ddp = planner.step_time(Model("m", params=1e6, compute_s_per_sample=1e-3), nccl, DDP, 1, 1, procs_per_instance=n)
    assert ddp.comm_s == pytest.approx(2 * (n - 1) * alpha)


def test_fsdp_prefetch_hides_all_but_the_first_gathers_and_the_last_reduce_scatter_and_gloo_hides_nothing():
    m = Model("m", params=1e8, compute_s_per_sample=1.0, fsdp_units=10)  # compute-bound: 10 s per step
    p4d = planner.get_instance("ml.p4d.24xlarge")
    c = planner.fsdp_comm(m, p4d, 8, 8, 1)
    a, r = c.allgather_s, c.reduce_scatter_s
    assert 0 < a < 1 and 0 < r < 1
    none = planner.step_time(m, p4d, FULL, 10, overlap=0.0)
    full = planner.step_time(m, p4d, FULL, 10, overlap=1.0)
    assert none.exposed_comm_s == pytest.approx(none.comm_s) == pytest.approx(10 * (2 * a + r))
    assert full.exposed_comm_s == pytest.approx(2 * a + r)  # forward's first, backward's first, last RS
    half = planner.step_time(m, p4d, FULL, 10, overlap=0.5)
    assert half.exposed_comm_s == pytest.approx((none.exposed_comm_s + full.exposed_comm_s) / 2)
    # one unit: nothing to prefetch, nothing hidden
    one = planner.step_time(replace(m, fsdp_units=1), p4d, FULL, 10, overlap=1.0)
    assert one.exposed_comm_s == pytest.approx(one.comm_s)
    # communication-bound: the pipeline hides the compute instead, all but one unit's
    slow = replace(p4d, intra_node_GBps=1e-3)
    cb = planner.step_time(m, slow, FULL, 10, overlap=1.0)
    cs = planner.fsdp_comm(m, slow, 8, 8, 1)
    f, b = 10 / 3 / 10, 20 / 3 / 10
    assert cb.exposed_comm_s == pytest.approx(cs.serial_s + f + b - 10)
    # gloo on CPU: FSDP2 blocks on every collective, whatever overlap says
    local = planner.local_instance(devices=8, alpha_s=1e-4, bandwidth_Bps=1e9)
    blocked = planner.step_time(m, local, FULL, 10, 1, procs_per_instance=8, overlap=1.0)
    assert blocked.exposed_comm_s == pytest.approx(blocked.comm_s)


def test_a_measured_fsdp_unit_cost_replaces_the_latency_terms_and_applies_to_one_process():
    cnn = Model("cnn", params=421_642, compute_s_per_sample=1e-3, fsdp_units=4)
    fp32 = planner.FP32_SGD_MOMENTUM
    one = planner.local_instance(devices=2, alpha_s=0.0, bandwidth_Bps=1e9, fsdp_unit_s=4e-4)
    alone = planner.step_time(cnn, one, FULL, 64, 1, procs_per_instance=1, precision=fp32)
    assert alone.total_s == pytest.approx(0.064 + 4 * 4e-4)  # hooks, no collective at world size 1
    assert planner.step_time(cnn, one, DDP, 64, 1, procs_per_instance=1, precision=fp32).total_s == pytest.approx(0.064)
    two = planner.local_instance(devices=2, alpha_s=5e-4, bandwidth_Bps=1e9, fsdp_unit_s=3e-3)
    s = planner.step_time(cnn, two, FULL, 64, 1, procs_per_instance=2, precision=fp32)
    unit_bytes = 4 * 421_642 / 4
    bandwidth = 2 * (1 / 2 * unit_bytes / 1e9) + 2 * 1 / 2 * unit_bytes / 1e9  # 2 AG + gloo's RS, no alpha
    assert s.comm_s == pytest.approx(4 * (3e-3 + bandwidth))
    assert s.total_s == pytest.approx(0.064 + s.comm_s)
    with pytest.raises(WorkshopError):
        planner.local_instance(2, 1e-4, 1e9, fsdp_unit_s=-1.0)


# --------------------------------------------------------------------------- step, plan


def test_compute_from_flops_and_mfu():
    s = planner.step_time(ONE_B, "ml.p4d.24xlarge", DDP, batch_size=4, instance_count=1,
                          procs_per_instance=1, mfu=0.5)
    assert s.comm_s == 0
    assert s.compute_s == pytest.approx(4 * 6e9 * 1024 / (312e12 * 0.5))


def test_overlap_hides_communication_and_oversubscription_time_shares():
    m = planner.with_compute(ONE_B, 0.01)
    none = planner.step_time(m, "ml.p4d.24xlarge", DDP, 8, 2, overlap=0.0)
    full = planner.step_time(m, "ml.p4d.24xlarge", DDP, 8, 2, overlap=1.0)
    assert full.total_s < none.total_s
    assert none.total_s == pytest.approx(none.compute_s + none.comm_s)
    local = planner.local_instance(devices=2, alpha_s=1e-4, bandwidth_Bps=1e9)
    two = planner.step_time(m, local, DDP, 8, 1, procs_per_instance=2)
    four = planner.step_time(m, local, DDP, 8, 1, procs_per_instance=4)
    assert two.compute_s == pytest.approx(0.08)
    assert four.compute_s == pytest.approx(0.16)  # 4 processes on 2 cores


def test_plan_efficiency_is_at_most_one_and_falls_with_instances():
    m = planner.with_compute(ONE_B, 0.005)
    effs = [planner.plan(m, "ml.p4d.24xlarge", 4, n).row(DDP).efficiency for n in (1, 2, 4, 16)]
    assert all(0 < e <= 1 for e in effs)
    assert effs == sorted(effs, reverse=True)


def test_cost_per_epoch_uses_the_infra_price_table():
    p = planner.plan(ONE_B, "ml.p4d.24xlarge", 4, 2, dataset_samples=100_000)
    row = p.row(DDP)
    price = INSTANCE_PRICES["ml.p4d.24xlarge"].usd_per_hour
    assert row.cost_per_epoch_usd == pytest.approx(100_000 / row.samples_per_sec / 3600 * 2 * price)
    assert "| DDP (replicated) |" in p.table()
    assert p.instance.usd_per_hour == price


def test_parameter_server_rows_need_two_instances():
    assert all(r.strategy != PS for r in planner.plan(ONE_B, "ml.p4d.24xlarge", 4, 1).rows)
    assert any(r.strategy == PS for r in planner.plan(ONE_B, "ml.p4d.24xlarge", 4, 2).rows)


# --------------------------------------------------------------------------- recommend


def test_small_model_gets_ddp_and_fills_one_instance_first():
    small = Model("cnn", params=4.2e5, activation_bytes_per_sample=1e6, compute_s_per_sample=1e-4)
    rec = planner.recommend(small, "ml.g5.12xlarge", batch_size=64, gpus=4)
    assert (rec.strategy, rec.offload, rec.instance_count, rec.procs_per_instance) == (DDP, False, 1, 4)
    rec = planner.recommend(small, "ml.g5.12xlarge", batch_size=64, gpus=3)
    assert (rec.instance_count, rec.procs_per_instance) == (1, 3)
    rec = planner.recommend(small, "ml.g5.12xlarge", batch_size=64, gpus=6)
    assert (rec.instance_count, rec.procs_per_instance) == (2, 4)  # full instances, not 2 x 3
    assert "fits" not in rec.reason or "no sharding" in rec.reason


def test_model_too_big_for_one_gpu_gets_the_lightest_sharding_that_fits():
    # 7B, mixed-precision Adam: DDP 112 GB; on 8 x 40 GB (36 usable) with 1 GB activations:
    # ZeRO-1 4*7 + 12*7/8 = 38.5 (+1) no; ZeRO-2 2*7 + 14*7/8 = 26.25 (+1) yes.
    m = Model("7B", params=7e9, activation_bytes_per_sample=1e9, compute_s_per_sample=0.1)
    rec = planner.recommend(m, "ml.p4d.24xlarge", batch_size=1)
    assert rec.strategy == ZERO2 and not rec.offload
    assert rec.plan.row(ZERO1).memory.total == pytest.approx(39.5e9)
    assert rec.plan.row(ZERO2).memory.total == pytest.approx(27.25e9)
    # on 80 GB GPUs (72 usable) ZeRO-1 already fits: 39.5 GB
    assert planner.recommend(m, "ml.p4de.24xlarge", batch_size=1).strategy == ZERO1


def test_offload_only_when_no_sharding_fits_and_a_clear_error_when_nothing_does():
    # 13B on one g5.xlarge (24 GB, 21.6 usable): full sharding over 1 GPU = 208 GB; offloaded: 0 of
    # state, plus the units gathered to compute (40 layers: 13e9 / 40 x (2 x 2 + 2) = 1.95 GB).
    m = Model("13B", params=13e9, activation_bytes_per_sample=2e9, compute_s_per_sample=1.0, fsdp_units=40)
    rec = planner.recommend(m, "ml.g5.xlarge", batch_size=1)
    assert rec.offload and rec.strategy in (ZERO1, ZERO2, FULL)
    assert rec.strategy == FULL  # ZeRO-1/2 + offload still keep 4 bytes/param of fp16 state
    huge_acts = Model("acts", params=1e6, activation_bytes_per_sample=50e9, compute_s_per_sample=1.0)
    with pytest.raises(WorkshopError) as err:
        planner.recommend(huge_acts, "ml.g5.xlarge", batch_size=1)
    assert "Fix:" in str(err.value) and "batch_size" in str(err.value)


# --------------------------------------------------------------------------- errors, catalogue


@pytest.mark.parametrize(
    "call",
    [
        lambda: planner.get_instance("ml.nope.xlarge"),
        lambda: planner.plan(ONE_B, "ml.p4d.24xlarge", batch_size=0),
        lambda: planner.plan(ONE_B, "ml.p4d.24xlarge", 4, instance_count=0),
        lambda: planner.plan(ONE_B, "ml.p4d.24xlarge", 4, instance_count=-2),
        lambda: planner.memory_per_gpu(ONE_B, "zero9", 1, 1),
        lambda: planner.step_time(ONE_B, "ml.g5.xlarge", DDP, 1),  # no peak FLOP/s for A10G
        lambda: planner.step_time(ONE_B, "ml.p4d.24xlarge", DDP, 1, mfu=1.5),
        lambda: planner.step_time(ONE_B, "ml.p4d.24xlarge", DDP, 1, overlap=2),
        lambda: planner.step_time(ONE_B, "ml.p4d.24xlarge", DDP, 1, tensor_parallel=3),
        lambda: planner.recommend(ONE_B, "ml.p4d.24xlarge", 1, instance_count=1, gpus=8),
        lambda: Model("bad", params=0),
        lambda: Model("bad", params=1, compute_s_per_sample=-1),
        lambda: Model("bad", params=1, fsdp_units=0),
        lambda: planner.local_instance(2, 1e-4, 1e9, backend="mpi"),
    ],
)
def test_mistakes_raise_workshop_errors_that_name_a_fix(call):
    with pytest.raises(WorkshopError) as err:
        call()
    assert err.value.fix


def test_catalogue_entries_cite_sources_and_reuse_the_infra_prices():
    for name, inst in planner.CATALOGUE.items():
        assert inst.name == name and inst.gpus >= 1 and inst.gpu_memory_gb > 0 and inst.network_gbps > 0
        assert "https://" in inst.source and inst.date
        if name in INSTANCE_PRICES:
            assert inst.usd_per_hour == INSTANCE_PRICES[name].usd_per_hour
        else:
            assert inst.usd_per_hour is None
    assert planner.get_instance("p4d.24xlarge").name == "ml.p4d.24xlarge"
    assert math.isinf(planner.local_instance(2, 1e-4, 1e9).gpu_memory_gb)


# --------------------------------------------------------------------------- transformer models


def test_transformer_parameters_match_the_published_model_sizes():
    gpt2 = planner.transformer("GPT-2 small", layers=12, d_model=768, heads=12, seq_len=1024, vocab=50257)
    gpt3 = planner.transformer("GPT-3", layers=96, d_model=12288, heads=96, seq_len=2048, vocab=50257)
    assert gpt2.params == pytest.approx(124.4e6, rel=0.005)  # "124M" (GPT-2 small, tied output layer)
    assert gpt3.params == pytest.approx(175e9, rel=0.01)  # "175B" (Brown et al. 2020, table 2.1)


def test_transformer_flops_are_about_six_n_per_token_and_checkpointing_adds_a_forward():
    gpt3 = planner.transformer("GPT-3", layers=96, d_model=12288, heads=96, seq_len=2048, vocab=50257)
    ckpt = planner.transformer("GPT-3", layers=96, d_model=12288, heads=96, seq_len=2048, vocab=50257,
                               activation_checkpointing=True)
    six_n = 6 * gpt3.params * 2048
    assert six_n < gpt3.flops_per_sample < 1.05 * six_n  # attention adds s/(6h) = 2.8% here
    assert ckpt.flops_per_sample / gpt3.flops_per_sample == pytest.approx(4 / 3, rel=0.01)


def test_transformer_activations_follow_korthikanti_and_shrink_with_checkpointing():
    # Korthikanti et al. 2022, eq. 1: s*b*h*(34 + 5*a*s/h) bytes per layer; GPT-3: 114 s h per layer.
    gpt3 = planner.transformer("GPT-3", layers=96, d_model=12288, heads=96, seq_len=2048, vocab=50257)
    assert gpt3.activation_bytes_per_sample == 2048 * 12288 * (34 + 80) * 96
    flash = planner.transformer("GPT-3", 96, 12288, 96, 2048, 50257, stores_attention_scores=False)
    assert flash.activation_bytes_per_sample == 2048 * 12288 * 34 * 96
    ckpt = planner.transformer("GPT-3", 96, 12288, 96, 2048, 50257, activation_checkpointing=True)
    assert ckpt.activation_bytes_per_sample == 2 * 2048 * 12288 * 96


def test_transformer_counts_lab4s_model_exactly():
    # Lab 4's byte-level GPT (2 layers, d=64, 4 heads, seq 32, 256 byte values, untied output
    # layer): 134,912 parameters, the param_bytes / 4 its runs print summed over the shards.
    lab4 = planner.transformer("lab 4", layers=2, d_model=64, heads=4, seq_len=32, vocab=256, tied_embeddings=False)
    assert lab4.params == 134_912
    assert lab4.fsdp_units == 3  # fully_shard on each of the 2 blocks, then on the root (embeddings, head)


def test_transformer_rejects_heads_that_do_not_divide_the_width():
    with pytest.raises(WorkshopError, match="not divisible"):
        planner.transformer("bad", layers=2, d_model=64, heads=5, seq_len=32, vocab=256)


# --------------------------------------------------------------------------- sources and published figures


def test_catalogue_gpu_counts_and_memory_agree_with_the_sagemaker_sdks_own_table():
    # The SDK ships a table of GPUs per training instance (sagemaker/core/instance_types_gpu_info);
    # the catalogue's vendor figures ("40 GB" per A100) must say the same.
    from sagemaker.core import instance_types_gpu_info

    table = instance_types_gpu_info.retrieve("us-east-1")
    checked = []
    for name, inst in planner.CATALOGUE.items():
        info = table.get(name)
        if info is None:
            continue
        assert inst.gpus == info["Count"], name
        assert inst.gpu_memory_gb == pytest.approx(info["TotalGpuMemoryInMiB"] / info["Count"] / 1024), name
        checked.append(name)
    assert len(checked) >= 7, checked  # all but ml.g5.xlarge, which the SDK's table lacks

