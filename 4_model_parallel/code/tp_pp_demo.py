"""Tensor and pipeline parallelism, small, on 2 ranks, checked against one process.

    torchrun --nproc-per-node 2 code/tp_pp_demo.py

Tensor parallel (`torch.distributed.tensor.parallel`): an MLP block whose first Linear is split by
output columns (ColwiseParallel) and whose second is split by input rows (RowwiseParallel), the
Megatron-LM layout: each rank computes half of the hidden units, and one all-reduce sums the two
partial outputs. Pipeline parallel (`torch.distributed.pipelining`): a 4-layer model cut into two
stages, one per rank, fed 4 micro-batches by the GPipe schedule (all forwards, then all backwards).

Both are compared with the same model run whole in one process on the same data: outputs (or
the loss) and every gradient must agree within a tolerance. Prints `METRICS` lines and exits
non-zero on a mismatch. gloo on CPU, nccl on GPUs.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

TOLERANCE = 1e-5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--d-model", type=int, default=32, help="width of the demo layers")
    p.add_argument("--batch-size", type=int, default=8, help="samples (split into micro-batches for the pipeline)")
    p.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and data")
    return p


class MLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item()


def tensor_parallel(args, rank, world, device) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(args.seed)
    reference = MLP(args.d_model).to(device)
    x = torch.randn(args.batch_size, args.d_model, device=device)
    reference(x).sum().backward()

    torch.manual_seed(args.seed)
    model = MLP(args.d_model).to(device)
    mesh = init_device_mesh(device.type, (world,))
    # TP: `up` split by output columns, `down` by input rows; one all-reduce joins the halves
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    out = model(x)
    out.sum().backward()
    worst = max_diff(out, reference(x))
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad  # TP: gather the shards
        local = p.to_local() if hasattr(p, "to_local") else p
        worst = max(worst, max_diff(grad, q.grad))
        if rank == 0:
            print(f"TP {name:<12} full {tuple(q.shape)!s:<10} this rank holds {tuple(local.shape)}", flush=True)
    return worst


def pipeline_parallel(args, rank, world, device) -> float:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    d, n_micro = args.d_model, args.microbatches

    def make():
        torch.manual_seed(args.seed)
        return nn.Sequential(*[nn.Sequential(nn.Linear(d, d), nn.Tanh()) for _ in range(2 * world)]).to(device)

    torch.manual_seed(args.seed + 1)
    x = torch.randn(args.batch_size, d, device=device)
    target = torch.randn(args.batch_size, d, device=device)

    # GPipe sums the micro-batches' gradients. Newer PyTorch divides them by the number of
    # micro-batches itself (scale_grads=True); older versions (2.5) need the loss scaled instead.
    scales = "scale_grads" in inspect.signature(ScheduleGPipe.__init__).parameters

    def loss_fn(output, tgt):
        loss = nn.functional.mse_loss(output, tgt)
        return loss if scales else loss / n_micro

    reference = make()
    ref_loss = nn.functional.mse_loss(reference(x), target)
    ref_loss.backward()

    full = make()
    per_stage = len(full) // world
    stage_module = full[rank * per_stage : (rank + 1) * per_stage]  # PP: this rank's layers only
    stage = PipelineStage(stage_module, stage_index=rank, num_stages=world, device=device)
    extra = {"scale_grads": True} if scales else {}
    schedule = ScheduleGPipe(stage, n_microbatches=n_micro, loss_fn=loss_fn, **extra)  # PP: GPipe over micro-batches
    losses: list[torch.Tensor] = []
    if rank == 0:
        schedule.step(x)  # the first stage feeds the inputs, split into micro-batches
    elif rank == world - 1:
        schedule.step(target=target, losses=losses)  # the last stage computes the loss
    else:
        schedule.step()
    worst = 0.0
    if rank == world - 1:
        loss = torch.stack(losses).mean() if scales else torch.stack(losses).sum()
        worst = max_diff(loss, ref_loss)
        print(f"PP loss over {n_micro} micro-batches {loss.item():.6f}, one process {ref_loss.item():.6f}", flush=True)
    ref_stage = reference[rank * per_stage : (rank + 1) * per_stage]
    for p, q in zip(stage_module.parameters(), ref_stage.parameters(), strict=True):
        worst = max(worst, max_diff(p.grad, q.grad))
    return worst


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch_size % args.microbatches:
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of --microbatches {args.microbatches}")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world < 2:
        raise SystemExit("Run it on 2 ranks or more: torchrun --nproc-per-node 2 code/tp_pp_demo.py")
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo")
    tp = tensor_parallel(args, rank, world, device)
    pp = pipeline_parallel(args, rank, world, device)
    worst = torch.tensor([tp, pp], device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the worst difference on any rank
    ok = bool((worst <= TOLERANCE).all())
    if rank == 0:
        print(f"METRICS rank=0 tp_max_abs_diff={worst[0].item():.3g} pp_max_abs_diff={worst[1].item():.3g} "
              f"tolerance={TOLERANCE} match={int(ok)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
