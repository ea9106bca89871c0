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


def fsdp_finding(c: Comm, profiles: Mapping[str, Any], big: planner.Model) -> str:
    """What the profiles found, in sentences: FSDP's collectives and bytes per step against the planner's and DDP's,
    each run's share of communication, and the planner's exposed communication for `big` on 2 x ml.p4d.24xlarge."""
    fsdp, ddp = profiles["FSDP"], profiles["DDP"]
    lines = [
        f"FSDP ran {c.gathers + c.scatters:g} collectives per step, the planner's {c.on_gloo.collectives} (3 per unit "
        f"x {c.units} units), against DDP's {c.found['DDP']['all-reduce'][0]:g} all-reduce(s).",
        f"Each rank sent per step: FSDP {c.sent / 1e6:.2f} MB (the planner: {c.on_gloo.bytes_per_rank / 1e6:.2f} MB; "
        f"on NCCL {c.on_nccl.bytes_per_rank / 1e6:.2f} MB), DDP {c.ddp_sent / 1e6:.2f} MB.",
        f"Communication: {fsdp.share('communication'):.0%} of FSDP's step (+ {fsdp.share('idle'):.0%} idle), "
        f"{ddp.share('communication'):.0%} of DDP's (+ {ddp.share('idle'):.0%}); FSDP blocks on each, on gloo.",
        f"The planner, {big.name} on 2 x ml.p4d.24xlarge: exposed communication, share of a step"]
    for strategy in (planner.FULL, planner.DDP):
        serial, hidden = (planner.step_time(big, "ml.p4d.24xlarge", strategy, 1, 2, overlap=o) for o in (0.0, 1.0))
        lines.append(f"  {planner.LABELS[strategy]}: {serial.exposed_comm_s / serial.total_s:.0%} if nothing overlaps "
                     f"(gloo), {hidden.exposed_comm_s / hidden.total_s:.0%} overlapped; "
                     f"{serial.bytes_per_gpu / 1e9:.1f} GB per GPU")
    return "\n".join(lines)


def collectives_table(c: Comm):
    """Each run's collectives per step on rank 0, as a table."""
    from workshop.teaching import table

    return table([{"run": name, "collective": kind, "calls per step": calls, "elements in all": size}
                  for name, kinds in c.found.items() for kind, (calls, size) in kinds.items()],
                 formats={"calls per step": "g", "elements in all": ",.0f"},
                 caption=f"collectives per profiled step on rank 0, at {c.n} ranks")


def check_profiles(profiles: Mapping[str, Any], c: Comm) -> None:
    """FSDP ran the planner's 3 collectives per unit, gathered the parameters twice and reduce-scattered them once (to
    1%: FSDP2 pads each shard to a multiple of N), and sent the planner's bytes (2%); the profiler's reports add up: on
    every rank compute + communication + data + idle is the step time (to 1e-6), every rank sent bytes, and each
    report's bytes per step are the ones counted from the trace (DDP's: 2(N-1)/N x K)."""
    from workshop.trace_report import PARTS

    assert c.gathers + c.scatters == c.on_gloo.collectives and c.gathers == 2 * c.scatters, c.found
    assert abs(c.gathered / (2 * c.params) - 1) < 0.01, (c.gathered, c.params)
    assert abs(c.scattered / c.params - 1) < 0.01, (c.scattered, c.params)
    assert abs(c.sent / c.on_gloo.bytes_per_rank - 1) < 0.02, (c.sent, c.on_gloo.bytes_per_rank)

    for name, report in profiles.items():
        ranks = [s.rank for s in report.summaries]
        assert report.world_size == c.n and ranks == list(range(c.n)), (name, report.summaries)
        for s in report.summaries:
            parts = sum(s.part(part) for part in PARTS)
            assert abs(parts - s.step_s) <= 1e-6 * s.step_s, (name, s)
            assert s.steps >= 1 and s.bytes_per_step > 0, (name, s)
    assert all(abs(s.bytes_per_step - c.ddp_sent) <= 1e-6 * c.ddp_sent for s in profiles["DDP"].summaries), c.ddp_sent
    assert all(abs(s.bytes_per_step - c.sent) <= 1e-6 * c.sent for s in profiles["FSDP"].summaries), c.sent


# ----------------------------------------------------------------------------- pipeline parallel (code/pipeline.py)

Records = Sequence[Mapping[str, Any]]


def pipeline_planner(records: Records) -> tuple[planner.Model, planner.InstanceType]:
    """code/pipeline.py's model and this machine as the planner sees them, from the run's own measurements: the whole
    model's forward and backward in one process (its compute per sample) and the ping-pong between the stages (the
    link's latency and bandwidth). Nothing is fitted to the pipeline's steps."""
    import statistics

    r = records[0]
    d, per, batch, p = r["d_model"], r["layers_per_stage"], r["batch_size"], r["world_size"]
    compute = statistics.median(x["one_process_compute_s"] for x in records)
    model = planner.Model(
        "code/pipeline.py's Linear + Tanh stack", params=p * per * (d * d + d), compute_s_per_sample=compute / batch,
        # per sample, each stage keeps its input and each layer's Tanh output (the next Linear's input): fp32
        activation_bytes_per_sample=p * (per + 1) * d * 4, handoff_bytes_per_sample=d * 4)
    machine = planner.local_instance(p, statistics.median(x["p2p_alpha_s"] for x in records),
                                     statistics.median(x["p2p_bandwidth_Bps"] for x in records),
                                     name=f"this machine, {p} stages of one core each")
    return model, machine


def pipeline_overheads(records: Records) -> dict[str, float]:
    """Each schedule's own cost per micro-batch forward or backward on a stage, from the same run: its step on
    the model too narrow to compute (code/pipeline.py's `overhead_step_s`, at every m), less the hand-offs'
    latency, over the 2(m + p - 1) forwards and backwards on the step's critical path; pooled over every m and
    stage (a ratio of sums). 0 where the run did not time it (`--overhead-width 0`)."""
    import statistics

    alpha = statistics.median(r["p2p_alpha_s"] for r in records)
    out = {}
    for schedule in {r["schedule"] for r in records}:
        mine = [r for r in records if r["schedule"] == schedule and r["overhead_width"]]
        if not mine:
            out[schedule] = 0.0
            continue
        spent = sum(max(0.0, r["overhead_step_s"] - 2 * (r["world_size"] - 1) * alpha) for r in mine)
        out[schedule] = spent / sum(2 * (r["microbatches"] + r["world_size"] - 1) for r in mine)
    return out


def pipeline_rows(records: Records) -> list[dict[str, Any]]:
    """One row per schedule and m: each stage's idle share, its share waiting for a core, step and activations (medians
    over the repeated runs' records), beside the bubble (p-1)/(m+p-1) and the planner's step and activations."""
    import statistics

    model, machine = pipeline_planner(records)
    overheads = pipeline_overheads(records)
    rows = []
    for schedule, m in sorted({(r["schedule"], r["microbatches"]) for r in records},
                              key=lambda k: (planner.SCHEDULES.index(k[0]), k[1])):
        mine = [r for r in records if (r["schedule"], r["microbatches"]) == (schedule, m)]
        stages = sorted({r["rank"] for r in mine})
        of = {s: [r for r in mine if r["rank"] == s] for s in stages}
        p, batch = mine[0]["world_size"], mine[0]["batch_size"]
        predicted = planner.pipeline_step(model, machine, p, m, batch, schedule,
                                          microbatch_overhead_s=overheads[schedule])
        steps = [statistics.median(r["step_s"] for r in of[s]) for s in stages]
        rows.append({
            "schedule": schedule, "m": m, "stages": p,
            "idle": [statistics.median(r["idle_share"] for r in of[s]) for s in stages],
            "queued": [statistics.median(r["queued_share"] for r in of[s]) for s in stages],
            "bubble": planner.bubble(p, m),
            "held": [max(r["peak_microbatches"] for r in of[s]) for s in stages],
            "saved_bytes": [max(r["peak_saved_bytes"] for r in of[s]) for s in stages],
            "step_s": statistics.median(steps), "step_range_s": (min(r["step_s"] for r in mine),
                                                                max(r["step_s"] for r in mine)),
            "planner": predicted, "runs": len(of[stages[0]]),
        })
    return rows


def pipeline_table(records: Records, bubble=planner.bubble):
    """The run as a table: per schedule and m, each stage's idle share beside `bubble(p, m)` (yours, in the
    notebook) and its share waiting for a core, the micro-batches and bytes each stage kept for backward, and the step against the planner's."""
    from workshop.teaching import table

    def per_stage(values, spec):
        return " / ".join(format(v, spec) for v in values)

    shown = []
    for r in pipeline_rows(records):
        shown.append({"schedule": "GPipe" if r["schedule"] == planner.GPIPE else "1F1B", "m": r["m"],
                      "idle share, per stage": per_stage(r["idle"], ".2f"), "bubble(p, m)": bubble(r["stages"], r["m"]),
                      "waited for a core": per_stage(r["queued"], ".2f"),
                      "micro-batches kept": per_stage(r["held"], "d"),
                      "MB kept": per_stage([b / 1e6 for b in r["saved_bytes"]], ".1f"),
                      "step ms": r["step_s"] * 1e3, "planner ms": r["planner"].total_s * 1e3})
    return table(shown, formats={"bubble(p, m)": ".2f", "step ms": ".0f", "planner ms": ".0f"},
                 right=("idle share, per stage", "waited for a core", "micro-batches kept", "MB kept"),
                 caption="each stage's share of the step not in its own forward or backward, the share it was ready "
                         "but other processes had the cores, and what it kept for backward at once (stage 0 / stage 1)")


def check_pipeline(records: Records, tolerance: float = 1e-4) -> None:
    """What code/pipeline.py's run must show whatever the machine's speed: every schedule's loss and gradients are one
    process's (to `tolerance`, relative), GPipe's and 1F1B's losses agree at every m, GPipe keeps all m micro-batches'
    activations on every stage (the whole batch's bytes), and 1F1B at most p on any stage, p on the first (when m >= p),
    exactly the bytes the planner's pipeline model says."""
    model, _ = pipeline_planner(records)
    for r in records:
        where = (r["schedule"], r["microbatches"], r["rank"])
        assert r["max_rel_diff"] <= tolerance, (where, r["max_rel_diff"])
        p, m, batch = r["world_size"], r["microbatches"], r["batch_size"]
        if r["schedule"] == planner.GPIPE:
            assert r["peak_microbatches"] == m, (where, r["peak_microbatches"])
        else:
            assert r["peak_microbatches"] <= p, (where, r["peak_microbatches"])
        if r["rank"] == 0:
            expected = planner.pipeline_step(model, planner.local_instance(p, 1e-4, 1e9), p, m, batch, r["schedule"])
            assert r["peak_microbatches"] == expected.microbatches_held, (where, r["peak_microbatches"])
            assert r["peak_saved_bytes"] == expected.activation_bytes, (where, r["peak_saved_bytes"],
                                                                       expected.activation_bytes)
    last = {(r["schedule"], r["microbatches"]): r["loss"] for r in records if r["rank"] == r["world_size"] - 1}
    for (schedule, m), loss in last.items():
        if schedule == planner.ONE_F_ONE_B:
            gpipe = last.get((planner.GPIPE, m), loss)
            assert abs(loss - gpipe) <= 1e-6 * abs(gpipe), (m, loss, gpipe)


# bf16 against fp32 after the same few steps: bf16 rounds every product to 8 bits of mantissa, and the tiny GPT's loss
# (about 5 nats) moved 0.001-0.002 between them on this machine (train and held-out): 0.01 leaves room, and would not
# hide a model that trained differently (its loss falls about 0.1 per step here).
BF16_LOSS_TOLERANCE = 0.01


def block_param_bytes(d_model: int) -> int:
    """One transformer block's whole (gathered) parameters in fp32: 12 h^2 + 13 h of them (planner.transformer's)."""
    return 4 * (12 * d_model * d_model + 13 * d_model)


def peak_rows(peak_runs: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every rank of inside_the_step's runs: what it held between steps, after the forward pass, at its peak inside
    the step, and what it saved for backward (KB), with its losses."""
    return [{"run": name, "rank": r["rank"], "state": r["state_bytes"] / 1e3,
             "params after forward": r["params_after_forward_bytes"] / 1e3, "saved act": r["saved_act_bytes"] / 1e3,
             "peak in step": r["step_peak_bytes"] / 1e3, "loss": r["final_train_loss"], "test loss": r["test_loss"]}
            for name, records in peak_runs.items() for r in records]


def check_peak(peak_runs: Mapping[str, list[dict[str, Any]]], layers: int, d_model: int) -> dict[str, float]:
    """What the peak inside the step must show whatever the machine's speed: between steps shard_grad_op, full_shard
    and full_shard in bf16 hold the same state; at its peak each shard_grad_op rank holds about layers - 1 blocks of
    whole parameters more than full_shard's (shard_grad_op keeps every block gathered; at its peak full_shard holds
    about one): measured 6.81 at 8 layers and 0.81 at 2 when nothing was overcounted (7 and 1 blocks, less 38,912
    bytes). On a CPU the count can only read a peak high (a collective's buffer freed by gloo's thread stays counted:
    accounting.StepPeak), and it did so for full_shard by up to one block and the root's parameters (5.81 and 6.11 at
    8 layers), so the check allows layers - 3 to layers - 0.5 blocks. bf16 keeps 0.45-0.60 of fp32's saved activations
    (the blocks' in bf16; the loss's logits stay fp32) and reaches fp32's losses within BF16_LOSS_TOLERANCE. Returns
    the numbers the notebook prints."""
    sgo, full, bf16 = (peak_runs[k] for k in ("shard_grad_op", "full_shard", "full_shard bf16"))
    block = block_param_bytes(d_model)
    gaps = []
    for a, b, c in zip(sgo, full, bf16, strict=True):
        assert a["state_bytes"] == b["state_bytes"] == c["state_bytes"], (a["state_bytes"], b["state_bytes"],
                                                                         c["state_bytes"])
        gap = a["step_peak_bytes"] - b["step_peak_bytes"]
        assert (layers - 3) * block <= gap <= (layers - 0.5) * block, (a["rank"], gap / block, layers)
        gaps.append(gap)
    acts = bf16[0]["saved_act_bytes"] / full[0]["saved_act_bytes"]
    assert 0.45 <= acts <= 0.60, acts
    loss_gap = max(abs(bf16[0][k] - full[0][k]) for k in ("final_train_loss", "test_loss"))
    assert loss_gap <= BF16_LOSS_TOLERANCE, (loss_gap, bf16[0]["final_train_loss"], full[0]["final_train_loss"])
    return {"gap_blocks": min(gaps) / block, "gap_blocks_max": max(gaps) / block, "bf16_acts": acts,
            "bf16_peak": bf16[0]["step_peak_bytes"] / full[0]["step_peak_bytes"], "bf16_loss_gap": loss_gap}


def peak_table(peak_runs: Mapping[str, list[dict[str, Any]]], layers: int):
    """`peak_rows` as a table, in KB."""
    from workshop.teaching import table

    return table(peak_rows(peak_runs), caption=f"{layers} layers, N = 2, KB: between steps (state), after the forward "
                 "pass, at the peak inside the step, and saved for backward",
                 formats={**{c: ",.1f" for c in ("state", "params after forward", "saved act", "peak in step")},
                          "loss": ".4f", "test loss": ".4f"})


def job_summary(name: str, records: Sequence[Mapping[str, Any]]) -> float:
    """Print what each rank of a training job reported holding (its state against the ideal, its saved activations,
    its peak inside the step and, on a GPU, max_memory_allocated) and its final test accuracy; return the accuracy."""
    from workshop import metrics

    for r in sorted((r for r in records if "state_bytes" in r), key=lambda r: r.get("rank", 0)):
        gpu = f", max_memory_allocated {r['max_memory_allocated'] / 1e6:.1f} MB" if "max_memory_allocated" in r else ""
        peak = f", peak in step {r['step_peak_bytes'] / 1e3:.1f} KB" if "step_peak_bytes" in r else ""
        print(f"{name} rank {r['rank']}: state {r['state_bytes'] / 1e3:.1f} KB (ideal {r['ideal_state_bytes'] / 1e3:.1f}), "
              f"saved activations {r['saved_act_bytes'] / 1e3:.1f} KB{peak}{gpu}")
    accuracy = metrics.last(records, "test_accuracy")
    print(f"{name}: final next-character test accuracy: {accuracy:.4f}, perplexity "
          f"{metrics.last(records, 'perplexity'):.2f}")
    return accuracy


def deepspeed_config(lab: Any, model: Mapping[str, Any], n: int) -> tuple[dict[str, Any], list[int]]:
    """The DeepSpeed configuration code/deepspeed_zero.py builds for ZeRO-3 on `n` ranks from the script's flags (the
    measured model's), and the sizes of that model's parameters (the script's GPT, built on the CPU)."""
    import torch

    from workshop.spec import hyperparameters_to_argv, load_module

    zero = load_module(lab.source_dir / "deepspeed_zero.py", "lab4_deepspeed_zero", with_siblings=True)
    script = lab.load_script()
    args = script.build_parser().parse_args(hyperparameters_to_argv({**model, "sharding": "zero3"}))
    sizes = [p.numel() for p in script.GPT(args.layers, args.d_model, args.heads, args.seq_len).parameters()]
    return zero.zero_config(args, n, torch.float32, max(sizes)), sizes


def levers(model: Mapping[str, Any], zero_bytes, checkpointed_bytes) -> dict[str, tuple[float, float]]:
    """How much the state (`zero_bytes` at stage 0 on one rank, of the planner's parameter count) and the checkpointed
    activations (`checkpointed_bytes` on one rank) grow when d_model, seq_len or batch size is 4x `model`'s:
    "<lever> x 4" -> (state's growth, activations' growth), by the learner's two functions."""
    def state_and_activations(s):
        params = planner.transformer("", layers=s["layers"], d_model=s["d-model"], heads=s["heads"],
                                     seq_len=s["seq-len"], vocab=256, tied_embeddings=False).params
        return zero_bytes(0, 1, params), checkpointed_bytes(s["layers"], s["batch-size"], s["seq-len"], s["d-model"], 1)

    base, growth = state_and_activations(model), {}
    for key in ("d-model", "seq-len", "batch-size"):
        state, acts = state_and_activations({**model, key: 4 * model[key]})
        growth[f"{key} x 4"] = (state / base[0], acts / base[1])
    return growth


def takeaways(ns: Mapping[str, Any]) -> list[str]:
    """The lab's closing points, each built from this run's numbers and the learner's functions, read from the
    notebook's namespace (`globals()`) by the names its cells give them; a section that did not run (sagemaker mode
    leaves the measurements out) adds no point."""
    zero_bytes, checkpointed_bytes, bubble, growth = (ns[k] for k in ("zero_bytes", "checkpointed_bytes", "bubble",
                                                                        "growth"))
    points = [
        "Each ZeRO stage shards one more kind of state. With fp32 AdamW, one of 8 GPUs holds "
        + ", ".join(f"{zero_bytes(s, 8, 7e9) / 1e9:.0f}" for s in range(4)) + " GB of a 7B model's state at stages "
        f"0-3; only stage 3 keeps shrinking as N grows (at 64 GPUs: {zero_bytes(3, 64, 7e9) / 1e9:.2f} GB).",
        f"Checkpointing keeps one input per block: {checkpointed_bytes(32, 16, 4096, 4096, 16) / 1e9:.1f} GB per GPU "
        f"for 16 sequences of 4,096 tokens of a 32-layer, d=4,096 model on 16 GPUs. Activations grow with batch x "
        f"sequence (4x sequence: {growth['seq-len x 4'][1]:.0f}x); the state with d_model squared (4x d_model: "
        f"{growth['d-model x 4'][0]:.0f}x the state here, {growth['d-model x 4'][1]:.0f}x the activations).",
    ]
    if "runs" in ns:  # the grid ran (in local mode it always does)
        runs, n_max, plain, ckpt = ns["runs"], ns["n_max"], ns["plain"], ns["ckpt"]
        points.append(f"Measured here: one of {n_max} ranks held {runs['full_shard', n_max][0]['state_bytes']:,} bytes "
                      f"with full_shard (your formula: {zero_bytes(3, n_max, ns['P']):,.0f}), one rank alone "
                      f"{runs['no_shard', 1][0]['state_bytes']:,}; checkpointing cut the bytes kept inside the blocks "
                      f"{plain['saved_act_block_bytes'] / ckpt['saved_act_block_bytes']:.1f}x.")
    if "comm" in ns:  # the profile ran
        comm = ns["comm"]
        points.append(f"Sharding pays in communication: FSDP sent {comm.sent / comm.ddp_sent:.1f}x DDP's bytes per "
                      f"step here (gloo; {comm.on_nccl.bytes_per_rank / comm.ddp_sent:.1f}x on NCCL) in "
                      f"{comm.gathers + comm.scatters:g} collectives, and communication took "
                      f"{ns['profiles']['FSDP'].share('communication'):.0%} of its step.")
    if "pipe_rows" in ns:  # the pipeline ran
        rows = ns["pipe_rows"]
        gpipe, one_f = rows["gpipe", 8], rows["1f1b", 8]
        points.append(f"A pipeline waits while it fills and drains: GPipe's 2 stages idled {sum(gpipe['idle']) / 2:.0%} "
                      f"of the step at m = 8 (bubble(2, 8) = {bubble(2, 8):.0%}), "
                      f"{sum(rows['gpipe', 1]['idle']) / 2:.0%} at m = 1. 1F1B's first stage kept {one_f['held'][0]} "
                      f"micro-batches' activations ({one_f['saved_bytes'][0] / 1e6:.1f} MB), GPipe's all "
                      f"{gpipe['held'][0]} ({gpipe['saved_bytes'][0] / 1e6:.1f} MB).")
    if "act_rows" in ns:  # the activation sweep ran
        by_seq = ns["activations"].growth(ns["act_rows"], "fp32", "plain", "seq_len")
        points.append(f"Activations follow 16 s b h numbers per block, as measured here within 2%: doubling the batch "
                      f"doubled them, doubling the sequence did too with a fused attention kernel and {by_seq:.2f}x "
                      f"with plain attention (a b s^2 probabilities); bf16 halves them, not the state.")
    if "tp_runs" in ns:  # tensor parallel ran
        points.append(f"Tensor parallel sends the activations, not the weights: 2 all-reduces of b x s x h per block "
                      f"and step ({ns['mlp8']['bytes_per_step'] / 1e6:.1f} MB for one MLP block at b = 8 here), on the "
                      f"critical path: it stays inside one machine.")
    if "inside" in ns:  # the peak inside the step ran
        inside = ns["inside"]
        points.append(f"Inside the step, shard_grad_op held {inside['gap_blocks']:.1f} blocks of gathered parameters "
                      f"more than full_shard at its peak ({ns['PEAK_LAYERS']} layers; full_shard holds about one at a "
                      f"time). bf16 kept {inside['bf16_acts']:.2f} of fp32's activations with the same 16 bytes of "
                      f"state per parameter.")
    return points
