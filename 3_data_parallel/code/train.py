"""Lab 3: synchronous data-parallel training of a small CNN on MNIST with PyTorch DDP.

Every rank holds a full copy of the model and trains on its own shard of each epoch
(DistributedSampler). After each backward pass, DistributedDataParallel all-reduces the
gradients, so every rank applies the same averaged update and the copies stay identical.
With `--grad-accum K` an optimizer step adds up the gradients of K micro-batches and all-reduces
once, after the last (`no_sync()` for the others): the global batch is --batch-size x K x the world
size, for the bytes of one. The lines that make it distributed carry a `DDP:` comment: the process
group (`ddp_setup`), the wrap (`DDP(...)`), the sampler, the skipped all-reduces, and the collectives
that evaluate, compare and finish. Run it from the lab folder:

    python code/train.py                              # one process, no launcher needed
    torchrun --nproc-per-node 2 code/train.py         # 2 ranks on this machine
    python code/train.py --grad-accum 2               # 1 rank, the global batch of 2 ranks (and their lr)
    python -m workshop run data_parallel --hosts 2    # 2 simulated SageMaker hosts
    # On SageMaker, SDK v3's Torchrun() runs `torchrun --nnodes=... train.py --epochs ...` on every host.

The SageMaker contract (flags, channels, SM_* folders, METRICS lines) is in contract.py and arguments.py;
checkpoints, restarts (`torchrun --max-restarts`) and `--profile-steps` are in the modules so named.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

# The modules beside this script (its code/ folder ships with the job); what the workshop reads from it too.
from arguments import build_parser, check_args, divergence_fix, steps_per_epoch
from checkpointing import (  # noqa: F401
    Divergence,
    SkipFirst,
    checkpoint,
    clean_stale,
    load_checkpoint,
    resume,
    save_atomic,
    save_checkpoint,
    set_rng_state,
    unwrap,
)
from contract import (  # noqa: F401
    choose_backend,
    cpu_threads,
    describe_run,
    distributed_env,
    load_channel,
    metrics,
    set_gloo_interface,
    weights_digest,
)
from fault_tolerance import (  # noqa: F401
    Restarts,
    agreed_attempt,
    announce_resume,
    elastic_store,
    inject_fault,
    parse_fault,
    read_recovery,
    report_recovery,
    restart_count,
    write_atomic,
    write_progress,
)
from step_profiler import StepProfiler


def ddp_setup(backend: str, device: torch.device, world_size: int) -> int:
    """Join the process group; torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT say how. Returns this
    attempt's number, the same on every rank: 0, or how many times torchrun --max-restarts restarted the ranks."""
    attempt = restart_count()
    if world_size > 1:
        set_gloo_interface(backend)  # gloo talks over the interface SageMaker names, not a guess
        store_args, attempt = elastic_store(timedelta(minutes=10))  # a restarted attempt's ranks meet under keys of their own
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=10), **store_args)  # DDP: join the group
        attempt = agreed_attempt(attempt, device, True)  # one attempt number on every rank
    return attempt


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    rank, world_size, local_rank, local_world_size = distributed_env()
    threads = cpu_threads(args.threads, local_world_size)  # one thread pool per rank, sized so ranks do not fight
    torch.manual_seed(args.seed)

    # Read the data before joining the process group, so a missing channel fails every
    # rank at once with its own message rather than leaving peers waiting in a collective.
    train_set = load_channel(args.train, "train")
    test_set = load_channel(args.test, "test")
    check_args(args, world_size, train_samples=len(train_set))

    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")  # DDP: one GPU per process, by LOCAL_RANK
    if cuda:
        torch.cuda.set_device(device)
    backend, why = choose_backend(args.backend, cuda)
    distributed = world_size > 1
    attempt = ddp_setup(backend, device, world_size)  # 0, or how many times torchrun --max-restarts restarted us

    K = args.grad_accum  # micro-batches per optimizer step
    # DDP: the global batch grows with the world size (and K), so the learning rate does too (--scale-lr)
    lr = args.lr * world_size * K if args.scale_lr else args.lr
    config = describe_run(args, rank, world_size, backend, why, device, threads, lr, len(train_set), len(test_set))

    model = Net().to(device)
    if distributed:
        # DDP: wrap the model; construction broadcasts rank 0's weights to every rank, and
        # backward() all-reduces (averages) the gradients, bucket by bucket, overlapped with compute.
        model = DDP(model, device_ids=[local_rank] if cuda else None, bucket_cap_mb=args.bucket_cap_mb or None)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)

    # DDP: each rank draws a disjoint 1/world_size shard of every (reshuffled) epoch.
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    # A resumed epoch starts mid-way: the sampler's first (batches done x batch size) indices are skipped.
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=SkipFirst(sampler), drop_last=True)

    per_epoch = steps_per_epoch(args, world_size, len(train_set))
    ckpt_dir = Path(args.checkpoint_dir)
    ckpt_path = ckpt_dir / "checkpoint.pt"
    start_epoch, skip, step, rng, recovery = resume(ckpt_dir, model, optimizer, rank, world_size, attempt,
                                                    args.epochs, args.batch_size, per_epoch, K)
    restarts = Restarts(args.fault, rank, ckpt_dir, attempt, recovery, step)  # --fault, and the recovery's report
    profiler = StepProfiler(args.profile_steps, args.output_dir, rank)  # --profile-steps (0: off)
    diverged = Divergence(device, rank, world_size, lambda t: dist.all_reduce(t) or t, divergence_fix(args, world_size), classes=10)
    test_loss = test_acc = float("nan")
    for epoch in range(start_epoch, args.epochs + 1):
        sampler.set_epoch(epoch)  # DDP: a new shuffle each epoch, the same on every rank
        first = skip // K + 1 if epoch == start_epoch else 1  # the epoch's first optimizer step still to take
        loader.sampler.skip = (first - 1) * K * args.batch_size
        model.train()
        t0, seen = time.perf_counter(), 0
        batches = iter(loader)  # draws a seed from the global RNG (unused without workers), every epoch
        if rng is not None:
            set_rng_state(rng)  # resumed mid-epoch: after that draw, where the checkpoint took the state
            rng = None
        profiler.start(epoch)
        for i in range(first, per_epoch + 1):  # optimizer steps, each of K micro-batches
            optimizer.zero_grad(set_to_none=True)
            loss, samples = torch.zeros((), device=device), 0  # this rank's mean loss over the step's micro-batches
            for m, (x, y) in enumerate(itertools.islice(batches, K)):
                x, y = x.to(device), y.to(device)
                # DDP: no all-reduce for the first K-1 micro-batches: their gradients add up in .grad, on this rank
                with model.no_sync() if distributed and m < K - 1 else contextlib.nullcontext():
                    micro = F.cross_entropy(model(x), y) / K  # / K: the sum of K micro-batches' is their mean
                    micro.backward()  # DDP: gradients are all-reduced here (the step's last micro-batch)
                loss, samples = loss + micro.detach(), samples + len(y)
            optimizer.step()
            profiler.step(samples)  # --profile-steps: one ProfilerStep ends here
            step += 1
            seen += samples
            diverged.note(loss, step)
            if i % args.log_interval == 0:
                # time: wall clock (Unix seconds), to place the steps of every attempt on one time axis
                metrics(rank=rank, epoch=epoch, step=step, train_loss=loss.item(), time=f"{time.time():.3f}")
                diverged.check(step)  # every rank, at the same step: a NaN loss stops them all
                restarts.logged(step)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                diverged.check(step, weights=model)  # never a checkpoint of diverged weights
                checkpoint(ckpt_path, model, optimizer, {"epoch": epoch - 1, "batch": i * K, "step": step}, args.batch_size,
                           rank, world_size)  # batch: micro-batches done
            restarts.stepped(step)  # --fault: die here, after this step (and its checkpoint)
        epoch_time = time.perf_counter() - t0
        profiler.stop()  # an epoch shorter than the profiled window: its trace holds what it had
        if profiler.epoch == epoch and seen > profiler.samples:  # the profiled (slower) steps are left out
            epoch_time, seen = epoch_time - profiler.seconds, seen - profiler.samples
        diverged.check(step, weights=model)  # before the epoch's test and checkpoint
        test_loss, test_acc = evaluate(model, test_set, rank, world_size, device)
        if rank == 0:
            metrics(rank=0, epoch=epoch, step=step, test_loss=test_loss, test_accuracy=test_acc,
                    epoch_time_s=epoch_time, samples_per_sec=seen * world_size / epoch_time,
                    global_batch=args.batch_size * K * world_size)
        checkpoint(ckpt_path, model, optimizer, {"epoch": epoch, "batch": 0, "step": step}, args.batch_size, rank,
                   world_size)
    restarts.trained()

    if start_epoch > args.epochs:  # resumed a finished run: report the model as it is
        test_loss, test_acc = evaluate(model, test_set, rank, world_size, device)
        if rank == 0:  # the test of the epoch the checkpoint ended, as that epoch's own line
            metrics(rank=0, epoch=start_epoch - 1, step=step, test_loss=test_loss, test_accuracy=test_acc)

    digest = weights_digest(unwrap(model))
    metrics(rank=rank, weights_sha256=digest)
    digests = [digest] * world_size
    if distributed:
        dist.all_gather_object(digests, digest)  # DDP: compare every rank's copy of the weights
    identical = len(set(digests)) == 1
    if rank == 0:  # DDP: the copies are identical, so one rank saves the model
        metrics(rank=0, final_test_accuracy=test_acc, final_test_loss=test_loss, weights_identical=int(identical))
        model_dir = Path(args.model_dir)
        model_dir.mkdir(parents=True, exist_ok=True)
        save_atomic(unwrap(model).state_dict(), model_dir / "model.pt")  # never a torn model.pt
        (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        print(f"Saved the model and its configuration to {model_dir}.", flush=True)
    restarts.finished()

    if distributed:
        # DDP: leave in step. A gloo group destroyed while a peer is already gone aborts
        # that rank at exit (SIGABRT), which a launcher reports as a failed job.
        dist.barrier()
        # The wrapper holds the group too: released first, the group is torn down here, not at exit, where
        # gloo's threads can abort the process ("terminate called without an active exception", 1 run in 25).
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()  # DDP: leave the process group
    return 0


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
class Net(nn.Module):
    """Two conv blocks and two dense layers: ~0.42M parameters, >97% on full MNIST (labs 2 and 3)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)
        self.dropout = nn.Dropout(0.25)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout(F.relu(self.fc1(torch.flatten(x, 1))))
        return self.fc2(x)


def evaluate(model, dataset, rank, world_size, device, batch_size=1000):
    """Exact test loss and accuracy over the whole test set: each rank scores every world_size-th sample
    (no padding, unlike DistributedSampler's default), then the sums are all-reduced, so the numbers match
    a single-process run."""
    model.eval()
    indices = list(range(rank, len(dataset), world_size))
    loader = DataLoader(torch.utils.data.Subset(dataset, indices), batch_size=batch_size)
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            out = model(x)
            totals[0] += F.cross_entropy(out, y, reduction="sum").item()
            totals[1] += (out.argmax(1) == y).sum().item()
            totals[2] += len(y)
    if world_size > 1:
        dist.all_reduce(totals)  # DDP: sum the per-rank counts into global ones
    model.train()
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


if __name__ == "__main__":
    sys.exit(main())
