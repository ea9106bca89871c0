"""Lab 2: Horovod data-parallel training of a small CNN on MNIST, PyTorch flavour.

Horovod runs one process per rank. Every rank holds a full copy of the model, trains on its
own shard of each epoch, and after each backward pass Horovod all-reduces (averages) the
gradients with ring all-reduce, so every rank applies the same update and the copies stay
identical. The model and data are lab 3's, so the two labs can be compared line for line.

Run it (from the lab folder):

    python code/train_pytorch.py                                   # one process, no launcher
    horovodrun --gloo -np 2 -H localhost:2 python code/train_pytorch.py
    python -m workshop run horovod_pytorch --hosts 2               # 2 simulated SageMaker hosts
    # On SageMaker the workshop's Horovod() driver starts the ranks on every host (see the
    # lab's notebook and workshop/drivers/horovod/hvd_driver.py).

Inputs follow the SageMaker training contract: hyperparameters as flags (arguments.py), data in the
`train` and `test` channels (`mnist.npz`), the model to SM_MODEL_DIR, checkpoints to
SM_CHECKPOINT_DIR (checkpointing.py). Ranks come from Horovod (`hvd.rank()`, `hvd.size()`,
`hvd.local_rank()`), which reads them from the HOROVOD_* variables its launcher sets; without a
launcher it is a world of one. --profile-steps (step_profiler.py) traces a few steps.

The lines that make it distributed carry a `Horovod:` comment.
Metric lines (`METRICS rank=0 epoch=1 ... test_accuracy=0.97`) are what SageMaker's metric
definitions and the workshop's local log parser read.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from arguments import check_args, lower_lr_fix, parser_for
from checkpointing import Divergence, read_checkpoint, resume, save_checkpoint
from contract import MNIST_MEAN, MNIST_STD, describe_run, metrics, threads_per_rank
from step_profiler import HorovodProfile, StepProfiler, allow_timeline

build_parser = partial(parser_for, "pytorch")  # the flags (the workshop reads them too)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # Read the data before Horovod starts, so a missing channel fails every rank at once with
    # its own message rather than leaving peers waiting in a collective.
    train_set = load_channel(args.train, "train")
    test_set = load_channel(args.test, "test")

    hvd = import_horovod()
    allow_timeline(args.profile_steps)  # --profile-steps: Horovod's timeline, if asked for, before hvd.init()
    hvd.init()  # Horovod: join the job; rank, size and local rank come from the launcher's HOROVOD_* variables
    rank, size, local_rank, local_size = hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()
    check_args(args, size, train_samples=len(train_set))
    threads = threads_per_rank(args.threads, local_size)  # this host's CPUs, shared by its ranks
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed + rank)  # different on purpose: the broadcast below must make them equal

    cuda = torch.cuda.is_available() and hvd.nccl_built()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")  # Horovod: one GPU per local rank
    if cuda:
        torch.cuda.set_device(device)
    lr = args.lr * size if args.scale_lr else args.lr  # Horovod: the global batch is size x --batch-size
    config = describe_run(hvd, args, lr, "pytorch", str(device), threads, len(train_set), len(test_set),
                          torch=torch.__version__)

    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    ckpt_path = Path(args.checkpoint_dir) / "checkpoint.pt"
    state = read_checkpoint(rank, ckpt_path)  # rank 0's checkpoint, verified (or why it cannot be used)
    state = hvd.broadcast_object(state, root_rank=0, name="checkpoint")  # Horovod: rank 0's checkpoint, on every host
    start_epoch = resume(state, model, optimizer, ckpt_path, args.epochs, rank)

    # Horovod: start every rank from rank 0's weights and optimizer state (seeds differ above).
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    # Horovod: wrap the optimizer; step() first averages each gradient over the ranks with ring
    # all-reduce (started per tensor during backward, so communication overlaps computation).
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
        op=hvd.Average,
    )

    # Horovod: each rank draws a disjoint 1/size shard of every (reshuffled) epoch.
    sampler = DistributedSampler(train_set, num_replicas=size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    step = (start_epoch - 1) * len(loader)
    profiler = StepProfiler(args.profile_steps, args.output_dir, rank)  # --profile-steps (0: off)
    horovod_profile = HorovodProfile(hvd, profiler)  # Horovod's timeline of the profiled steps
    # every rank's first diverged loss (NaN, or 100x a guess's), summed over the ranks: one rank's stops them all
    diverged = Divergence(device, rank, size, lambda t: hvd.allreduce(t, op=hvd.Sum, name="divergence"),
                          lower_lr_fix(args, size, lr), classes=10)
    test_loss = test_acc = float("nan")
    for epoch in range(start_epoch, args.epochs + 1):
        sampler.set_epoch(epoch)  # Horovod: a new shuffle each epoch, the same on every rank
        model.train()
        t0 = time.perf_counter()
        seen = 0
        profiler.start(epoch)
        for i, (x, y) in enumerate(loader, 1):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()  # (Horovod 0.28.1's wrapper takes no set_to_none)
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # Horovod: each gradient's all-reduce starts as soon as it is ready
            optimizer.step()  # Horovod: waits for the averaged gradients, then updates
            profiler.step(len(y))  # --profile-steps: one ProfilerStep ends here
            horovod_profile.follow()
            step += 1
            seen += len(y)
            diverged.note(loss, step)
            if i % args.log_interval == 0:
                metrics(rank=rank, epoch=epoch, step=step, train_loss=loss.item())
                diverged.check(step)  # every rank, at the same step (a collective)
            if args.max_steps and i >= args.max_steps:
                break
        epoch_time = time.perf_counter() - t0
        profiler.stop()  # an epoch shorter than the profiled window: its trace holds what it had
        horovod_profile.follow()
        if profiler.epoch == epoch and seen > profiler.samples:  # the profiled (slower) steps are left out
            epoch_time, seen = epoch_time - profiler.seconds, seen - profiler.samples
        diverged.check(step, weights=model)  # before the epoch's test and checkpoint
        test_loss, test_acc = evaluate(hvd, model, test_set, device)
        if rank == 0:  # Horovod: only rank 0 writes, so ranks never race on the same files
            metrics(
                rank=0, epoch=epoch, step=step, test_loss=test_loss, test_accuracy=test_acc,
                epoch_time_s=epoch_time, samples_per_sec=seen * size / epoch_time,
            )
            save_checkpoint(ckpt_path, epoch, model, optimizer)

    if start_epoch > args.epochs:  # resumed a finished run: report the model as it is
        test_loss, test_acc = evaluate(hvd, model, test_set, device)
        if rank == 0:  # the test of the epoch the checkpoint ended, as that epoch's own line
            metrics(rank=0, epoch=start_epoch - 1, step=step, test_loss=test_loss, test_accuracy=test_acc)

    digest = weights_digest(model)
    metrics(rank=rank, weights_sha256=digest)
    digests = hvd.allgather_object(digest, name="digests")  # Horovod: every rank's copy of the weights, compared
    identical = len(set(digests)) == 1
    if rank == 0:
        metrics(rank=0, final_test_accuracy=test_acc, final_test_loss=test_loss, weights_identical=int(identical))
        model_dir = Path(args.model_dir)
        model_dir.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), model_dir / "model.pt")
        (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        print(f"Saved the model and its configuration to {model_dir}.", flush=True)
    hvd.join()  # Horovod: leave in step, so no rank exits while a peer still talks to it
    hvd.shutdown()
    return 0


def evaluate(hvd, model, dataset, device, batch_size=1000):
    """Exact test loss and accuracy over the whole test set: each rank scores every
    size()-th sample, then the sums are all-reduced, so the numbers match one process."""
    model.eval()
    indices = list(range(hvd.rank(), len(dataset), hvd.size()))
    loader = DataLoader(torch.utils.data.Subset(dataset, indices), batch_size=batch_size)
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            out = model(x)
            totals[0] += F.cross_entropy(out, y, reduction="sum").item()
            totals[1] += (out.argmax(1) == y).sum().item()
            totals[2] += len(y)
    totals = hvd.allreduce(totals, op=hvd.Sum, name="eval_totals")  # Horovod: global sums from every rank's share
    model.train()
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


# ----------------------------------------------------------------------------- model, data


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


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def load_channel(channel_dir: str, name: str) -> TensorDataset:
    path = Path(channel_dir) / "mnist.npz"
    if not path.is_file():
        raise FileNotFoundError(
            f"The {name!r} channel has no {path.name} at {path}. Fix: prepare the data with "
            f"`python -m workshop.datasets mnist DIR` and pass --{name} DIR/{name} (locally), or give the "
            f"job a {name!r} input channel (SageMaker)."
        )
    with np.load(path) as data:
        images, labels = data["images"], data["labels"]
    x = (torch.from_numpy(images).float().div_(255.0).sub_(MNIST_MEAN).div_(MNIST_STD)).unsqueeze(1)
    return TensorDataset(x, torch.from_numpy(labels).long())


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def weights_digest(model: nn.Module) -> str:
    """A short hash of every parameter's bytes: equal on every rank iff the weights are."""
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


REBUILD_FIX = (
    "Fix: build Horovod with PyTorch support: `make horovod` in the workshop (or "
    "HOROVOD_WITH_PYTORCH=1 when building it yourself); on SageMaker run the job with "
    "workshop.runner.run_on_sagemaker (it installs the wheel built once for the image) "
    "or the image from 2_horovod/docker/Dockerfile."
)


def import_horovod():
    """`horovod.torch`, or a clear error saying how to get a build that has it."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise SystemExit(f"Horovod's PyTorch support is not importable here ({exc}). {REBUILD_FIX}") from exc
    return hvd


if __name__ == "__main__":
    sys.exit(main())
