"""Lab 3's CNN on MNIST, trained three more ways for benchmarks/bench_strategies.py.

    python benchmarks/workers/cnn_worker.py --mode compute --shard-of 4 ...   # no communication
    torchrun --nproc-per-node 2 benchmarks/workers/cnn_worker.py --mode fsdp ...
    horovodrun --gloo -np 2 python benchmarks/workers/cnn_worker.py --mode horovod ...

The model (`Net`), the data loading (`load_channel`) and the flags are lab 3's own
(3_data_parallel/code/train.py, imported from there), and so is the loop: SGD with momentum,
the linear learning-rate scaling rule, a DistributedSampler shard per rank, `--batch-size` per
rank. Each mode prints lab 3's `Configuration:` and `METRICS rank=0 epoch=... epoch_time_s=...
samples_per_sec=...` lines, so the benchmark reads every strategy the same way.

- `compute`: one process, no process group, trains `1/--shard-of` of each epoch (the steps one
  rank of a `--shard-of`-process job takes). Run N of these at once and their step time is
  the compute time of N ranks sharing this machine, with no communication at all.
- `fsdp`: sharded data parallel, FSDP2 (`torch.distributed.fsdp.fully_shard`) on each layer
  and the root: weights, gradients and momentum are split across ranks; forward and backward
  all-gather the weights, backward reduce-scatters the gradients.
- `horovod`: Horovod's ring all-reduce (`hvd.DistributedOptimizer`) over gloo.
  (Lab 2's `2_horovod/code/train_pytorch.py` replaces this mode when it exists.)
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from workshop import REPO_ROOT
from workshop.spec import load_module

LAB3 = REPO_ROOT / "3_data_parallel" / "code" / "train.py"


def load_lab3():
    return load_module(LAB3, "lab3_train", with_siblings=True)  # with the helper modules beside it in code/


def main(argv=None) -> int:
    lab3 = load_lab3()
    parser = lab3.build_parser()
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument("--mode", choices=("compute", "fsdp", "horovod"), required=True,
                        help="how to train (see the module docstring)")
    parser.add_argument("--shard-of", type=int, default=1,
                        help="compute mode: train the share of one rank of this many")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or 1)
    torch.manual_seed(args.seed)
    train_set = lab3.load_channel(args.train, "train")

    hvd = None
    if args.mode == "horovod":
        import horovod.torch as hvd  # Horovod: its own rank functions, set by horovodrun

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
    elif args.mode == "fsdp":
        import torch.distributed as dist

        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    else:
        rank, world = 0, 1
    shards = world if args.mode != "compute" else args.shard_of
    shard_rank = rank if args.mode != "compute" else 0
    lab3.check_args(args, shards, train_samples=len(train_set))

    model = lab3.Net()
    if args.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in (model.conv1, model.conv2, model.fc1, model.fc2):
            fully_shard(layer)  # FSDP: each layer's weights become shards, gathered when used
        fully_shard(model)
    lr = args.lr * shards if args.scale_lr else args.lr
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    if hvd is not None:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # Horovod: same start weights
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    sampler = DistributedSampler(train_set, num_replicas=shards, rank=shard_rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    if rank == 0:
        config = {"mode": args.mode, "world_size": world, "shard_of": shards,
                  "threads_per_rank": torch.get_num_threads(), "args": vars(args)}
        print("Configuration: " + json.dumps(config, sort_keys=True), flush=True)
    step = 0
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        t0, seen = time.perf_counter(), 0
        for i, (x, y) in enumerate(loader, 1):
            if hvd is not None:
                optimizer.zero_grad()  # Horovod 0.28's DistributedOptimizer has no set_to_none
            else:
                optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            seen += len(y)
            if args.max_steps and i >= args.max_steps:
                break
        epoch_time = time.perf_counter() - t0
        if rank == 0:
            # Same fields as lab 3; samples/s counts every rank's samples (world x rank 0's).
            print(f"METRICS rank=0 epoch={epoch} step={step} train_loss={loss.item():.6g} "
                  f"epoch_time_s={epoch_time:.6g} steps={i} "
                  f"samples_per_sec={seen * world / epoch_time:.6g}", flush=True)
    if args.mode == "fsdp":
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    elif hvd is not None:
        hvd.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
