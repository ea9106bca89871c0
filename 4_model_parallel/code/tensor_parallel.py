"""Tensor parallel's traffic and time, measured: one transformer layer's MLP and attention block, each split
column-wise then row-wise over the ranks (the Megatron-LM layout, `torch.distributed.tensor.parallel`).

    torchrun --nproc-per-node 2 code/tensor_parallel.py                  # both blocks, 2 ranks
    unshare -rn sh -c 'ip link set lo up; torchrun --standalone --nproc-per-node 2 code/tensor_parallel.py'

The first Linear of each block is split by output columns (`ColwiseParallel`: each rank computes its share of the
hidden units, or heads), the last by input rows (`RowwiseParallel`: a partial output), so one all-reduce of the
output (b x s x h numbers) joins them in the forward, one of the same size the input's gradient in the backward.
No weight gradient is reduced: each rank owns its shard of the weights.

Each rank runs --steps forward-backward steps per block; PyTorch's `CommDebugMode` counts the collectives, and
rank 0 reads the bytes sent from the loopback counters (`/proc/net/dev`: this job's alone in a network namespace
of its own, as the second line and the workshop's `tp_traffic.run()` run it). In the same run it times the block
whole on every rank at once, one rank's share alone, all-reduces of the output and of 4 bytes, and a split block
too small to compute: what a planner's step is made of. Outputs and gradients are checked against the whole
block. Prints one `METRICS` line per block (rank 0); exits non-zero on a mismatch. gloo on CPU, nccl on GPUs.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

TOLERANCE = 1e-4


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--blocks", default="mlp,attention", help="which blocks to measure, comma-separated")
    p.add_argument("--d-model", type=int, default=256, help="h: the layer's width")
    p.add_argument("--heads", type=int, default=8, help="attention heads (split over the ranks)")
    p.add_argument("--seq-len", type=int, default=128, help="s: tokens per sequence")
    p.add_argument("--batch-sizes", default="8", help="b: sequences per step, comma-separated (each measured)")
    p.add_argument("--steps", type=int, default=10, help="forward-backward steps measured per block")
    p.add_argument("--warmup", type=int, default=2, help="steps run first and not measured")
    p.add_argument("--seed", type=int, default=0, help="seed for the weights and the input")
    return p


class MLP(nn.Module):
    """h -> 4h -> h; `up` split by columns, `down` by rows."""

    def __init__(self, d: int, heads: int = 0):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Attention(nn.Module):
    """Multi-head self-attention; q, k and v split by columns (whole heads per rank), `out` by rows."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.head_dim = d // heads
        self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape

        def split(t):  # this rank's heads: its columns of q, k and v are whole heads
            return t.view(b, s, t.shape[-1] // self.head_dim, self.head_dim).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


BLOCKS = {"mlp": (MLP, {"up": "col", "down": "row"}),
          "attention": (Attention, {"q": "col", "k": "col", "v": "col", "out": "row"})}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item()


def loopback_sent() -> int:
    """Bytes sent on the loopback interface so far (its transmit counter, /proc/net/dev)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def timed(fn, steps: int, warmup: int) -> tuple[float, int]:
    """fn() run `warmup` times, then `steps` times between two barriers: the median seconds of one (each
    timed between barriers, so every rank's is the slowest's) and the loopback bytes of all of them."""
    for _ in range(warmup):
        fn()
    dist.barrier()
    sent0, times = loopback_sent(), []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), loopback_sent() - sent0


def split_block(name: str, h: int, heads: int, world: int, device: torch.device, seed: int):
    """The block whole, and the same weights split over the ranks (`parallelize_module`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    cls, layout = BLOCKS[name]
    torch.manual_seed(seed)
    whole = cls(h, heads).to(device)
    torch.manual_seed(seed)
    model = cls(h, heads).to(device)
    # TP: the first Linear(s) split by output columns, the last by input rows
    plan = {layer: ColwiseParallel() if how == "col" else RowwiseParallel() for layer, how in layout.items()}
    mesh = init_device_mesh(device.type, (world,))
    # TP: the block's input enters once as a replicated DTensor, so the gradients of q, k and v add up as
    # partial sums and one all-reduce makes the input's gradient (three, one per Linear, without it)
    parallelize_module(model, mesh, PrepareModuleInput(input_layouts=(Replicate(),),
                                                       desired_input_layouts=(Replicate(),)))
    parallelize_module(model, mesh, plan)
    return whole, model


def stepper(x: torch.Tensor):
    """One forward and backward of a block on x (a layer's input: its gradient flows back too)."""

    def step(m):
        x.grad = None
        m.zero_grad(set_to_none=True)
        out = m(x)
        out.pow(2).mean().backward()
        return out
    return step


def measure_block(name: str, b: int, args, rank: int, world: int, device: torch.device) -> dict:
    from torch.distributed.tensor.debug import CommDebugMode

    cls, layout = BLOCKS[name]
    s, h = args.seq_len, args.d_model
    whole, model = split_block(name, h, args.heads, world, device, args.seed)
    torch.manual_seed(args.seed + 1)
    x = torch.randn(b, s, h, device=device, requires_grad=True)
    step = stepper(x)

    # Correct: the split block's output and every gradient are the whole block's.
    out = step(model)
    grad_x = x.grad.clone()
    ref = step(whole)
    worst = max(max_diff(out, ref), max_diff(grad_x, x.grad))
    for p, q in zip(model.parameters(), whole.parameters(), strict=True):
        worst = max(worst, max_diff(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad, q.grad))
    # The collectives of one step, as PyTorch counts them (forward and backward).
    with CommDebugMode() as comm:
        step(model)
    counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items() if n}
    all_reduces = counts.pop("all_reduce", 0)
    # Time and bytes: the split block; the whole block on every rank at once (a planner's compute: each rank's
    # is 1/N of it); one all-reduce of the block's output (b x s x h) alone.
    step_s, sent = timed(lambda: step(model), args.steps, args.warmup)
    whole_s, _ = timed(lambda: step(whole), args.steps, args.warmup)  # every rank at once, as the split runs
    # Each rank's share alone: a plain block of one shard's shapes (1/N of the hidden units or heads), on
    # every rank at once: the compute of the split step without its collectives or DTensor's bookkeeping.
    torch.manual_seed(args.seed)
    shard = cls(h, args.heads // world).to(device)
    for layer, how in layout.items():
        full = getattr(shard, layer)
        n_in, n_out = (full.in_features, full.out_features // world) if how == "col" else \
            (full.in_features // world, full.out_features)
        setattr(shard, layer, nn.Linear(n_in, n_out).to(device))
    shard_s, _ = timed(lambda: step(shard), args.steps, args.warmup)
    activation = torch.ones(b, s, h, device=device)
    allreduce_s, allreduce_sent = timed(lambda: dist.all_reduce(activation), args.steps, args.warmup)
    one = torch.ones(1, device=device)
    latency_s, _ = timed(lambda: dist.all_reduce(one), args.steps, args.warmup)  # 4 bytes: the link's latency
    # What a split block costs besides its compute and its bytes (DTensor's bookkeeping, the collectives'
    # wake-ups): the same block, split, at a width too small to compute or send anything, against its whole.
    tiny_whole, tiny_split = split_block(name, 2 * world, world, world, device, args.seed)
    tiny = stepper(torch.randn(1, 2, 2 * world, device=device, requires_grad=True))
    tiny_split_s, _ = timed(lambda: tiny(tiny_split), args.steps, args.warmup)
    tiny_whole_s, _ = timed(lambda: tiny(tiny_whole), args.steps, args.warmup)
    _, barrier_sent = timed(lambda: None, args.steps, 0)  # the barriers' own bytes, to take off
    return {
        "block": name, "world_size": world, "batch_size": b, "seq_len": s, "d_model": h, "heads": args.heads,
        "steps": args.steps, "max_diff": worst, "all_reduces": all_reduces,
        "other_collectives": sum(counts.values()),  # none expected: gathers or scatters would be a wrong layout
        "bytes_per_step": (sent - barrier_sent) / args.steps,
        "allreduce_bytes": (allreduce_sent - barrier_sent) / args.steps,
        "step_ms": step_s * 1e3, "whole_ms": whole_s * 1e3, "shard_ms": shard_s * 1e3, "allreduce_ms": allreduce_s * 1e3,
        "allreduce_4b_ms": latency_s * 1e3, "tiny_split_ms": tiny_split_s * 1e3, "tiny_whole_ms": tiny_whole_s * 1e3,
        "params": sum(p.numel() for p in whole.parameters()),
    }


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()]
    unknown = sorted(set(blocks) - set(BLOCKS))
    if unknown or not blocks:
        sys.exit(f"--blocks: {', '.join(unknown) or 'none given'}; choose from {', '.join(BLOCKS)}")
    parts = args.batch_sizes.split(",")
    batch_sizes = [int(b) for b in parts if b.strip().isdigit()]
    if len(batch_sizes) != len(parts) or min(batch_sizes) < 1 or args.steps < 1 or args.warmup < 0:
        sys.exit(f"--batch-sizes ({args.batch_sizes!r}) must be whole numbers of 1 or more, --steps 1 or more and "
                 "--warmup 0 or more")
    if "WORLD_SIZE" not in os.environ:
        sys.exit("start it with torchrun, e.g. `torchrun --nproc-per-node 2 code/tensor_parallel.py`")
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if args.heads % world or args.d_model % args.heads or (4 * args.d_model) % world:
        sys.exit(f"--heads ({args.heads}) must split evenly over {world} ranks and divide --d-model ({args.d_model})")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    failed = False
    try:
        for name, b in ((name, b) for b in batch_sizes for name in blocks):
            result = measure_block(name, b, args, rank, world, device)
            failed |= not math.isfinite(result["max_diff"]) or result["max_diff"] > TOLERANCE
            if rank == 0:
                print("METRICS " + " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                            for k, v in {"rank": 0, **result}.items()), flush=True)
                print(f"TP {name}, batch {b}: {result['all_reduces']} all-reduces per step (and {result['other_collectives']} other "
                      f"collectives), {result['bytes_per_step']:,.0f} bytes "
                      f"sent per step on the loopback; the split block's largest difference from the whole "
                      f"{result['max_diff']:.1e} (at most {TOLERANCE:g})", flush=True)
    finally:
        dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
