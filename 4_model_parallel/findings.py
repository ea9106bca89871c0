"""Lab 4's findings and the checks behind them, from the notebook's runs, profiles and `workshop.planner` (and the
planner's answers as tables): nothing typed in. Each check raises AssertionError (with what it compared) when a claim
of the notebook does not hold.

    import findings   # the notebook's folder is on the path
    findings.check_grid(runs, world_sizes, tiny)
"""

# No `from __future__ import annotations`: Comm is a dataclass, and the tests load this file as a module that is not in
# sys.modules, where a dataclass cannot resolve string annotations.
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workshop import planner

Runs = Mapping[tuple[str, int], list[dict[str, Any]]]
# What each of PyTorch's shardings holds between steps, as the planner names it: shard_grad_op keeps the gathered
# weights from forward to backward, but between steps it holds the same shards as full sharding (ZeRO-3's layout).
PLANNER_STRATEGY = {"no_shard": planner.DDP, "optimizer": planner.ZERO1, "shard_grad_op": planner.FULL,
                    "full_shard": planner.FULL}
DEEPSPEED_FP32 = planner.Precision("fp32 AdamW with an fp32 master copy (4+4+12)", 4, 4, 12)


def plan_table(plan: planner.Plan):
    """The planner's plan (`planner.plan`) as a table: every strategy's memory per GPU, fit, step and cost."""
    from workshop.teaching import table

    cap = plan.instance.gpu_memory_gb * plan.usable_fraction
    rows = [{"strategy": r.label, "GB per GPU": r.memory.total / planner.GB, "fits": "yes" if r.fits else "no",
             "host GB per GPU": r.memory.host / planner.GB, "step s": r.step.total_s, "comm s": r.step.exposed_comm_s,
             "samples/s": r.samples_per_sec, "efficiency": r.efficiency, "USD per epoch": r.cost_per_epoch_usd}
            for r in plan.rows]
    return table(rows, formats={"GB per GPU": ",.1f", "host GB per GPU": ",.1f", "step s": ".3g", "comm s": ".3g",
                                "samples/s": ",.1f", "efficiency": ".2f", "USD per epoch": ",.2f"},
                 caption=f"{plan.model.name}, {plan.precision.name}: {plan.instance_count} x {plan.instance.name} "
                         f"({plan.world_size} GPUs, {cap:.0f} GB usable each), batch {plan.batch_size} per GPU")


def check_grid(runs: Runs, world_sizes: Sequence[int], tiny: planner.Model) -> None:
    """The grid's claims: each sharded rank holds its ideal share, the ranks of ZeRO-1 split the optimizer state
    exactly, every run reaches the same loss, and the planner's ZeRO formula predicts every row within 2%."""
    # Sharded state per rank is within 10% of the ideal share: full state / (ranks sharing it).
    for (technique, n), records in runs.items():
        for r in records:
            if r["shard_group"] > 1:
                share = r["state_bytes"] / (r["full_state_bytes"] / r["shard_group"])
                assert abs(share - 1) < 0.10, (technique, n, r["rank"], share)
            elif technique == "no_shard":
                assert r["state_bytes"] == r["full_state_bytes"], r  # DDP: every rank holds everything
            if technique == "full_shard":  # all N ranks share one copy: each holds exactly 1/N of the parameters
                assert r["shard_group"] == n and r["param_bytes"] * n == runs["no_shard", n][0]["param_bytes"], (n, r)
        if technique == "optimizer" and n > 1:  # ZeRO-1 splits whole parameters: near 1/N, not exact
            assert sum(r["optim_bytes"] for r in records) == runs["no_shard", 1][0]["optim_bytes"]
    # Sharding changes where the state lives, not the mathematics: every technique and world size trains on the
    # same global batches and reaches the same loss after the same steps.
    reference = runs["no_shard", 1][0]["final_train_loss"]
    for key, records in runs.items():
        assert abs(records[0]["final_train_loss"] - reference) < 1e-3, (key, records[0]["final_train_loss"], reference)
    for n in world_sizes[1:]:  # at the same world size, full sharding and none agree to 1e-4, held-out loss too
        full, none = runs["full_shard", n][0], runs["no_shard", n][0]
        for k in ("final_train_loss", "test_loss"):
            assert abs(full[k] - none[k]) < 1e-4, (n, k, full[k], none[k])
    # The planner's memory formula (16 bytes per parameter with fp32 AdamW) predicts each row within 2% from the
    # model's shape alone; hybrid sharding holds what full sharding over each group of 2 holds, whatever N is.
    for (technique, n), records in runs.items():
        if technique in PLANNER_STRATEGY:
            predicted = planner.memory_per_gpu(tiny, PLANNER_STRATEGY[technique], 1, n, planner.FP32_ADAM).model_states
            assert abs(records[0]["state_bytes"] / predicted - 1) < 0.02, (technique, n, records[0]["state_bytes"],
                                                                           predicted)
    n_max = max(world_sizes)
    if ("hybrid_shard", n_max) in runs:
        predicted = planner.memory_per_gpu(tiny, planner.FULL, 1, 2, planner.FP32_ADAM).model_states
        for r in runs["hybrid_shard", n_max]:
            assert r["shard_group"] == 2 and abs(r["state_bytes"] / predicted - 1) < 0.02, (r["state_bytes"], predicted)
    ranks = sum(len(records) for records in runs.values())
    print(f"{ranks} ranks: sharded ones within 10% of their ideal share, one loss ({reference:.4f}) everywhere,\n"
          "and the planner's ZeRO formula within 2% of every row")


def check_deepspeed(ds_runs: Mapping[str, list[dict[str, Any]]], runs: Runs, n: int, tiny: planner.Model,
                    sizes: Sequence[int]) -> None:
    """DeepSpeed's rows against ZeRO's theory (K = 12): every rank's state within 5%; its parameters and optimizer
    state, and the gradients of every stage but ZeRO-2, within 1% (DeepSpeed pads its partitions to an aligned
    size); ZeRO-2's excess is exactly the parameter its partition boundary cuts (`sizes`: the parameters' element
    counts in the module's order); the losses are PyTorch's; offloading leaves only the parameter shard."""
    for stage, records in ds_runs.items():
        for r in records:
            assert abs(r["state_bytes"] / r["ideal_state_bytes"] - 1) < 0.05, (stage, r)
            for kind in ("param", "optim") + (("grad",) if stage != "zero2" else ()):
                assert abs(r[f"{kind}_bytes"] / r[f"theory_{kind}_bytes"] - 1) < 0.01, (stage, kind, r)
    # ZeRO-2 keeps each rank's gradients in a buffer of whole parameters: the parameter that the ranks' partition
    # boundary cuts is held whole on both sides, so the ranks' excess over the theory adds up to exactly its size.
    if "zero2" in ds_runs:
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        per_rank = -(-sum(sizes) // (2 * n)) * 2  # DeepSpeed's partition: the flat buffer padded, split N ways
        cut = [size for start, size in zip(starts, sizes, strict=True) for k in range(1, n)
               if start < k * per_rank < start + size]
        excess = sum(r["grad_bytes"] - r["theory_grad_bytes"] for r in ds_runs["zero2"])
        assert excess == 4 * sum(cut), (excess, cut)
        print(f"zero2: the ranks' gradients exceed the theory by {excess:,} bytes in all:\nthe parameter(s) of "
              f"{cut} elements that the partition boundary cuts, x 4 bytes")
    # The stages move state, not the mathematics: every DeepSpeed row's loss is PyTorch's (same batches, same AdamW,
    # DeepSpeed's default gradient clipping to 1.0 turned off) to 1e-4.
    if ("full_shard", n) in runs:
        for stage, records in ds_runs.items():
            assert abs(records[0]["final_train_loss"] - runs["full_shard", n][0]["final_train_loss"]) < 1e-4, stage
    for r in ds_runs.get("zero3_offload", []):  # the optimizer state and its fp32 gradients go to the host
        assert r["state_bytes"] - r["offloaded_state_bytes"] == r["param_bytes"] and r["offloaded_state_bytes"] > 0, r
    # The planner's ZeRO formula with DeepSpeed's K = 12 predicts every stage's fullest rank within 5%.
    for stage, strategy in (("zero1", planner.ZERO1), ("zero2", planner.ZERO2), ("zero3", planner.FULL)):
        if stage in ds_runs:
            predicted = planner.memory_per_gpu(tiny, strategy, 1, n, DEEPSPEED_FP32).model_states
            measured = max(r["state_bytes"] for r in ds_runs[stage])
            assert abs(measured / predicted - 1) < 0.05, (stage, measured, predicted)
    print(f"DeepSpeed: {sum(len(r) for r in ds_runs.values())} ranks within 5% of ZeRO's theory (parameters and "
          "optimizer state within 1%),\nthe planner's too, and every loss is PyTorch's")


@dataclass
class Comm:
    """What FSDP and DDP sent per step at `n` ranks, counted from rank 0's trace, beside the planner's FSDP model."""

    n: int
    found: dict[str, dict[str, tuple[float, float]]]  # {run: {collective: (calls, elements)}} per profiled step
    params: float  # DDP all-reduces every gradient once: the model's parameter count
    gathers: float
    gathered: float
    scatters: float
    scattered: float
    sent: float  # bytes each FSDP rank sent per step (fp32; gloo's reduce-scatter is an all-reduce)
    ddp_sent: float  # DDP's: 2(N-1)/N x 4 bytes x parameters
    on_gloo: planner.FsdpComm
    on_nccl: planner.FsdpComm
    units: int


def fsdp_against_ddp(profiles: Mapping[str, Any], lab: Any) -> Comm:
    """Count each collective per profiled step in rank 0's trace of each run ("FSDP", "DDP"), with the size of the whole
    tensor it moves, and the planner's FSDP model of the same model on gloo and on NCCL."""
    from workshop.spec import hyperparameters_to_argv
    from workshop.trace_report import collectives_per_step, load_trace

    found = {name: collectives_per_step(load_trace(report.ranks[0].path)) for name, report in profiles.items()}
    n = profiles["FSDP"].world_size
    params = found["DDP"]["all-reduce"][1]
    gathers, gathered = found["FSDP"]["all-gather"]
    scatters, scattered = found["FSDP"]["reduce-scatter"]
    script = lab.load_script()
    args = script.build_parser().parse_args(hyperparameters_to_argv(lab.local_hyperparameters))
    profiled = planner.transformer("lab 4, profiled", layers=args.layers, d_model=args.d_model, heads=args.heads,
                                   seq_len=args.seq_len, vocab=script.VOCAB, tied_embeddings=False)
    gloo_host = planner.local_instance(devices=2, alpha_s=1e-4, bandwidth_Bps=1e9)  # bytes do not depend on speeds
    return Comm(n, found, params, gathers, gathered, scatters, scattered,
                sent=(n - 1) / n * 4 * gathered + 2 * (n - 1) / n * 4 * scattered,
                ddp_sent=2 * (n - 1) / n * 4 * params,
                on_gloo=planner.fsdp_comm(profiled, gloo_host, n, 1, n, planner.FP32_ADAM),
                on_nccl=planner.fsdp_comm(profiled, "ml.p4d.24xlarge", n, 1, n, planner.FP32_ADAM),
                units=profiled.fsdp_units)


def collectives_table(c: Comm):
    """Each run's collectives per step on rank 0, as a table."""
    from workshop.teaching import table

    return table([{"run": name, "collective": kind, "calls per step": calls, "elements in all": size}
                  for name, kinds in c.found.items() for kind, (calls, size) in kinds.items()],
                 formats={"calls per step": "g", "elements in all": ",.0f"},
                 caption=f"collectives per profiled step on rank 0, at {c.n} ranks")


def check_profiles(profiles: Mapping[str, Any], c: Comm) -> None:
    """The profiler's reports add up: on every rank compute + communication + data + idle is the step time (to
    1e-6), every rank sent bytes, and each report's bytes per step are the ones counted from the trace (DDP's:
    2(N-1)/N x K)."""
    from workshop.trace_report import PARTS

    for name, report in profiles.items():
        ranks = [s.rank for s in report.summaries]
        assert report.world_size == c.n and ranks == list(range(c.n)), (name, report.summaries)
        for s in report.summaries:
            parts = sum(s.part(part) for part in PARTS)
            assert abs(parts - s.step_s) <= 1e-6 * s.step_s, (name, s)
            assert s.steps >= 1 and s.bytes_per_step > 0, (name, s)
    assert all(abs(s.bytes_per_step - c.ddp_sent) <= 1e-6 * c.ddp_sent for s in profiles["DDP"].summaries), c.ddp_sent
    assert all(abs(s.bytes_per_step - c.sent) <= 1e-6 * c.sent for s in profiles["FSDP"].summaries), c.sent
