"""Pipeline parallel, measured: GPipe and 1F1B on 2 stages, their bubble and the activations each stage keeps.

    torchrun --standalone --nproc-per-node 2 code/pipeline.py [--microbatches 1 2 4 8] [--out pipeline.json]

A stack of Linear + Tanh layers is cut into one stage per rank (`torch.distributed.pipelining`'s
`PipelineStage`) and trained one step at a time by two schedules, for each number of micro-batches m
(the global batch split into m pieces): GPipe (`ScheduleGPipe`: every micro-batch's forward, then every
backward) and 1F1B (`Schedule1F1B`: after p forwards, one backward for each forward; it needs m >= p).
Per stage and step it measures

- the idle share: the part of the step not spent in this stage's own forward or backward (each timed by
  a pair of autograd markers around the stage's layers), against the bubble (p-1)/(m+p-1) of p stages;
- the activations it keeps for backward, at their peak: micro-batches whose forward has run and whose
  backward has not, and the bytes autograd saved for them (saved_tensors_hooks; parameters excluded).
  GPipe keeps all m micro-batches' at once, 1F1B at most p;
- the loss and every gradient, against the same model run whole in one process on the same batch;
- the share of the step it was ready to run but waited for a core (other processes had them): on a busy machine
  a stage that waits for a core holds up the other, whose idle share then exceeds the bubble.

It also measures the link between the two ranks (a ping-pong of one byte and of one micro-batch's
hand-off), the one-process compute time, and each schedule's own cost: the same schedule at the same m on a
model of the same depth too narrow to compute (`--overhead-width`), whose step is the schedule's sends,
receives and bookkeeping. The planner's pipeline model (workshop.planner) predicts the step time from these.
Prints `METRICS` lines; `--out` (rank 0) writes every record as JSON.
Exits non-zero when a schedule's loss or gradients differ from the single process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from contract import metrics
from stage_meter import Measured, StageMeter, ping_pong, rel_diff

REL_TOLERANCE = 1e-4  # relative: the micro-batches' gradients are summed in another order than one batch's


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--d-model", type=int, default=1024, help="width of every layer")
    p.add_argument("--layers-per-stage", type=int, default=2, help="Linear + Tanh layers on each stage")
    p.add_argument("--batch-size", type=int, default=512, help="samples per step (split into the micro-batches)")
    p.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8], help="values of m to run")
    p.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"], choices=["gpipe", "1f1b"],
                   help="pipeline schedules to run")
    p.add_argument("--steps", type=int, default=5, help="timed steps per schedule and m (after one warm-up step)")
    p.add_argument("--overhead-width", type=int, default=2,
                   help="width of the model too narrow to compute on which each schedule's own cost is timed "
                        "(0: not timed)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and data")
    p.add_argument("--out", default="", help="rank 0 writes every rank's records here as JSON")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world < 2:
        raise SystemExit("Run it on 2 ranks or more: torchrun --standalone --nproc-per-node 2 code/pipeline.py")
    bad = [m for m in args.microbatches if m < 1 or args.batch_size % m]
    if bad:
        raise SystemExit(f"--batch-size {args.batch_size} must split into each --microbatches value: not {bad}")
    torch.set_num_threads(1)  # one core per stage: ranks do not fight over the cores
    dist.init_process_group("gloo")  # PP: one process per stage
    device = torch.device("cpu")
    torch.manual_seed(args.seed)
    per = args.layers_per_stage
    full, layers, x, target = build(args.d_model, per, args.batch_size, rank, world)
    reference, compute_s = one_process(full, layers, x, target)
    link = ping_pong(rank, args.batch_size * args.d_model * 4)
    if args.overhead_width:  # the same depth, too narrow to compute: what the schedule itself costs
        narrow = build(args.overhead_width, per, args.batch_size, rank, world)
        narrow_reference, _ = one_process(*narrow)
    records = []
    for schedule_name in args.schedules:
        for m in args.microbatches:
            if schedule_name == "1f1b" and m < world:
                if rank == 0:
                    print(f"1F1B at m={m}: left out (1F1B needs at least one micro-batch per stage, m >= p = {world})")
                continue
            record = run_schedule(schedule_name, m, layers, x, target, rank, world, device, args.steps, reference)
            if args.overhead_width:
                _, narrow_layers, narrow_x, narrow_target = narrow
                record["overhead_step_s"] = run_schedule(schedule_name, m, narrow_layers, narrow_x, narrow_target,
                                                         rank, world, device, args.steps, narrow_reference)["step_s"]
            record.update(rank=rank, world_size=world, one_process_compute_s=compute_s, **link,
                          d_model=args.d_model, batch_size=args.batch_size, layers_per_stage=per,
                          overhead_width=args.overhead_width)
            timeline = record.pop("timeline")
            metrics(**record)
            records.append({**record, "timeline": timeline})
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(records, gathered, dst=0)
    worst = torch.tensor(max((r["max_rel_diff"] for r in records), default=0.0))
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the worst difference on any rank
    ok = worst.item() <= REL_TOLERANCE
    if rank == 0:
        if args.out:
            with open(args.out, "w") as f:
                json.dump([r for rank_records in gathered for r in rank_records], f)
        print(f"METRICS rank=0 max_rel_diff={worst.item():.3g} tolerance={REL_TOLERANCE} match={int(ok)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def run_schedule(name, m, layers, x, target, rank, world, device, steps, reference) -> dict:
    """One schedule at m micro-batches: a warm-up step, then `steps` timed steps; this stage's record."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    meter = StageMeter()
    stage = PipelineStage(Measured(layers, meter), stage_index=rank, num_stages=world, device=device)
    kind = ScheduleGPipe if name == "gpipe" else Schedule1F1B
    # PP: the schedule splits the batch into m micro-batches and runs them through the stages in its order;
    # each micro-batch's loss is its own mean, and the gradients are divided by m (scale_grads)
    schedule = kind(stage, n_microbatches=m, loss_fn=nn.functional.mse_loss, scale_grads=True)
    step_s, busy_s, idle, queued, losses = [], [], [], [], []
    for step in range(steps + 1):
        layers.zero_grad(set_to_none=True)
        mine: list[torch.Tensor] = []
        dist.barrier()  # every stage starts the step together
        meter.start()
        if rank == 0:
            schedule.step(x)  # the first stage feeds the inputs
        elif rank == world - 1:
            schedule.step(target=target, losses=mine, return_outputs=False)  # the last computes the loss
        else:
            schedule.step()
        took = time.perf_counter() - meter.t0
        if step:  # the first step also infers shapes and connects the stages: not timed
            step_s.append(took)
            busy_s.append(meter.busy())
            idle.append(1 - meter.busy() / took)
            queued.append(meter.queued() / took)
            losses.append(torch.stack(mine).mean().item() if mine else float("nan"))
    ref_loss, ref_grads = reference
    diffs = [rel_diff(p.grad, g) for p, g in zip(layers.parameters(), ref_grads, strict=True)]
    if rank == world - 1:
        diffs.append(abs(losses[-1] - ref_loss) / abs(ref_loss))
    return dict(schedule=name, microbatches=m, step_s=statistics.median(step_s), busy_s=statistics.median(busy_s),
                idle_share=statistics.median(idle), queued_share=statistics.median(queued),
                bubble=(world - 1) / (m + world - 1),
                peak_microbatches=meter.peak_alive, peak_saved_bytes=meter.peak_bytes,
                loss=losses[-1] if rank == world - 1 else float("nan"), ref_loss=ref_loss,
                max_rel_diff=max(diffs), timeline=meter.intervals)


def build(width: int, per: int, batch: int, rank: int, world: int):
    """A stack of world x per Linear(width) + Tanh layers, this rank's stage of it, and a batch with its target."""
    full = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(world * per)])
    x, target = torch.randn(batch, width), torch.randn(batch, width)
    return full, full[rank * per:(rank + 1) * per], x, target  # PP: this rank keeps its own layers only


def one_process(full: nn.Module, layers: nn.Module, x, target):
    """The whole model on the whole batch, as one process runs it: the loss, this stage's gradients, and the
    forward + backward time (median of 3; both ranks run it at once, as their stages will)."""
    times = []
    for _ in range(3):
        full.zero_grad(set_to_none=True)
        begin = time.perf_counter()
        loss = nn.functional.mse_loss(full(x), target)
        loss.backward()
        times.append(time.perf_counter() - begin)
    grads = [p.grad.clone() for p in layers.parameters()]
    full.zero_grad(set_to_none=True)
    return (loss.item(), grads), statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
