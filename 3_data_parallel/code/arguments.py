"""Lab 3's flags (hyperparameters, and the SageMaker contract's folders) and the checks the workshop also
runs before it starts any process or job (`check_args`)."""

from __future__ import annotations

import argparse
import os

from contract import nonfinite_problems, str2bool
from fault_tolerance import FAULT_ENV, fault_problems
from step_profiler import PROFILE_WAIT, PROFILE_WARMUP


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        description="Data-parallel (DDP) training of a CNN on MNIST; SageMaker contract.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("hyperparameters")
    g.add_argument("--epochs", type=int, default=5, help="passes over the training set")
    g.add_argument(
        "--batch-size", type=int, default=64,
        help="samples per micro-batch on each rank (the global batch is this x --grad-accum x the world size)",
    )
    g.add_argument(
        "--grad-accum", type=int, default=1, metavar="K",
        help="gradient accumulation: each optimizer step adds up the gradients of K micro-batches of --batch-size "
             "(DDP's no_sync() for the first K-1: one all-reduce per step, not per micro-batch)",
    )
    g.add_argument(
        "--lr", type=float, default=0.02,
        help="SGD learning rate for one rank; multiplied by the world size x --grad-accum when --scale-lr",
    )
    g.add_argument(
        "--scale-lr", type=str2bool, default=True,
        help="linear scaling rule: lr x world size x --grad-accum, since the global batch grows with both",
    )
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--seed", type=int, default=1, help="seed for weights and shuffling")
    g.add_argument(
        "--backend", choices=("auto", "gloo", "nccl", "smddp"), default="auto",
        help="process-group backend; auto: smddp where SageMaker supports it and the image has it (only "
             "images past their end of patch do), nccl on other GPUs, gloo on CPU",
    )
    g.add_argument("--log-interval", type=int, default=20, help="optimizer steps between train-loss lines")
    g.add_argument(
        "--max-steps", type=int, default=0,
        help="stop each epoch after this many optimizer steps (0: the whole epoch); for quick runs",
    )
    g.add_argument(
        "--bucket-cap-mb", type=float, default=0.0,
        help="DDP's gradient bucket size in MiB: one all-reduce per bucket, started as soon as its gradients are "
             "ready (0: DDP's default, 25 MiB, and 1 MiB for the first bucket)",
    )
    g.add_argument(
        "--threads", type=int, default=0,
        help="CPU threads per rank (0: this host's CPUs divided by its ranks, so ranks do not fight for cores)",
    )
    g.add_argument(
        "--checkpoint-every", type=int, default=0,
        help="also checkpoint every this many global steps, mid-epoch included, so a restart loses fewer "
             "(0: only at the end of each epoch, as always)",
    )
    g.add_argument(
        "--fault", default=env(FAULT_ENV, ""), metavar="kill-rank=R@step=N",
        help="fault injection: global rank R kills itself (SIGKILL) right after global step N, on the first "
             "attempt only, to show a torchrun --max-restarts recovery (default: $WORKSHOP_FAULT; empty: none)",
    )
    g.add_argument(
        "--profile-steps", type=int, default=0,
        help="torch.profiler on every rank for this many training steps of the first epoch, after "
             f"{PROFILE_WAIT} + {PROFILE_WARMUP} steps of warm-up; one Chrome/Perfetto trace per rank in "
             "--output-dir/profile/ (0: off)",
    )
    d = p.add_argument_group("SageMaker contract (defaults from SM_* variables)")
    d.add_argument("--train", default=env("SM_CHANNEL_TRAIN", "data/mnist/train"), help="train channel")
    d.add_argument("--test", default=env("SM_CHANNEL_TEST", "data/mnist/test"), help="test channel")
    d.add_argument("--model-dir", default=env("SM_MODEL_DIR", "artifacts/model"), help="where rank 0 writes the model")
    d.add_argument(
        "--checkpoint-dir", default=env("SM_CHECKPOINT_DIR", "artifacts/checkpoints"),
        help="checkpoint.pt here, each epoch (and every --checkpoint-every steps); resume from it when it holds one",
    )
    d.add_argument(
        "--output-dir", default=env("SM_OUTPUT_DATA_DIR", "artifacts/output"),
        help="other output (the --profile-steps traces); SageMaker uploads it with the job's output.tar.gz",
    )
    return p


def micro_batches_per_epoch(args: argparse.Namespace, world_size: int, train_samples: int) -> int:
    """Each rank's DistributedSampler shard (ceil(samples / world size), padded) in whole --batch-size
    batches (drop_last)."""
    return -(-train_samples // world_size) // args.batch_size


def steps_per_epoch(args: argparse.Namespace, world_size: int, train_samples: int) -> int:
    """Optimizer steps in one epoch: each rank's micro-batches in whole groups of --grad-accum (the
    micro-batches left over are not trained on, as drop_last leaves a partial batch), at most --max-steps."""
    steps = micro_batches_per_epoch(args, world_size, train_samples) // getattr(args, "grad_accum", 1)
    return min(steps, args.max_steps) if args.max_steps else steps


def check_args(args: argparse.Namespace, world_size: int = 1, train_samples: int | None = None,
               fault: str | None = None) -> None:
    """Checks the workshop also runs before it starts any process or job (raises ValueError).

    The message names each broken rule, then after "Fix:" what to do about each, so the
    workshop (and a reader of the job's log) can tell the user what to change. `fault` is the
    fault to check (None: --fault, whose default is the environment variable WORKSHOP_FAULT).
    """
    parser = build_parser()
    default = parser.get_default
    problems, fixes = nonfinite_problems(args, parser)
    if problems:  # NaN passes every comparison below (nan <= 0 is False): refused first, on its own
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")
    for name in ("epochs", "batch_size", "log_interval"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            problems.append(f"{flag} must be at least 1, got {getattr(args, name)}")
            fixes.append(f"set {flag} to a whole number of at least 1, e.g. {default(name)} (its default)")
    if args.lr <= 0:
        problems.append(f"--lr must be positive, got {args.lr}")
        fixes.append(f"set --lr to a positive number, e.g. {default('lr')} (its default)")
    if args.max_steps < 0 or args.threads < 0 or args.checkpoint_every < 0:
        problems.append("--max-steps, --threads and --checkpoint-every must be 0 or more")
        fixes.append("set --max-steps, --threads and --checkpoint-every to 0 (their defaults: whole epochs, an "
                     "automatic thread count, a checkpoint per epoch) or more")
    grad_accum = getattr(args, "grad_accum", 1)
    if grad_accum < 1:
        problems.append(f"--grad-accum must be at least 1, got {grad_accum}")
        fixes.append("set --grad-accum to 1 (no accumulation, its default) or more: the micro-batches each "
                     "optimizer step adds up")
    elif train_samples is not None and world_size >= 1 and args.batch_size >= 1 \
            and 0 < micro_batches_per_epoch(args, world_size, train_samples) < grad_accum:
        micro = micro_batches_per_epoch(args, world_size, train_samples)
        problems.append(f"--grad-accum {grad_accum} needs {grad_accum} micro-batches of {args.batch_size} for one "
                        "optimizer step, and " + (f"each of the {world_size} ranks gets" if world_size > 1 else
                                                  "the one rank gets") + f" {micro} per epoch")
        fixes.append(f"set --grad-accum to {micro} or less, or --batch-size lower, or run fewer processes")
    if getattr(args, "bucket_cap_mb", 0.0) < 0:
        problems.append(f"--bucket-cap-mb must be 0 (DDP's default) or more, got {args.bucket_cap_mb}")
        fixes.append("set --bucket-cap-mb to 0 (DDP's default, 25 MiB) or a size in MiB, e.g. 1")
    profile_steps = getattr(args, "profile_steps", 0)
    if profile_steps < 0:
        problems.append(f"--profile-steps must be 0 (off) or more, got {profile_steps}")
        fixes.append("set --profile-steps to 0 (no profiling) or a few steps, e.g. 5")
    elif profile_steps and train_samples is not None and world_size >= 1 and args.batch_size >= 1 and grad_accum >= 1 \
            and PROFILE_WAIT + PROFILE_WARMUP + profile_steps > steps_per_epoch(args, world_size, train_samples):
        per_epoch = steps_per_epoch(args, world_size, train_samples)
        problems.append(f"--profile-steps {profile_steps} after {PROFILE_WAIT + PROFILE_WARMUP} warm-up steps does "
                        f"not fit in the first epoch's {per_epoch} steps")
        fewer = "--batch-size lower" + (", or --grad-accum lower" if grad_accum > 1 else "")
        fixes.append(f"set --profile-steps to {max(1, per_epoch - PROFILE_WAIT - PROFILE_WARMUP)} or less, or "
                     f"{fewer}, or run fewer processes" if per_epoch > PROFILE_WAIT + PROFILE_WARMUP
                     else f"set {fewer} (or --max-steps higher), or run fewer processes")
    if world_size < 1:
        problems.append(f"the world size must be at least 1, got {world_size}")
        fixes.append("run at least one process")
    if train_samples is not None and train_samples // world_size < args.batch_size:
        per_rank = train_samples // world_size
        problems.append(
            f"each of the {world_size} ranks gets {per_rank} training samples, fewer "
            f"than one --batch-size of {args.batch_size} (the batch size is per rank)"
        )
        fixes.append(f"set --batch-size to {per_rank} or less, e.g. {min(default('batch_size'), per_rank)}, or run fewer processes"
                     if per_rank else "run fewer processes than there are training samples")
    if problems:
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")
    # The run's last global step: known from the data's size, else bounded by --max-steps.
    if train_samples is not None:
        last_step = args.epochs * steps_per_epoch(args, world_size, train_samples)
    else:
        last_step = args.epochs * args.max_steps if args.max_steps else None
    more, fault_fixes = fault_problems(getattr(args, "fault", None) if fault is None else fault, world_size, last_step)
    problems += more
    fixes += fault_fixes
    if problems:
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")


def divergence_fix(args: argparse.Namespace, world_size: int) -> str:
    """What to change when the training diverged (the fix Divergence's message names)."""
    factor = world_size * args.grad_accum  # the linear scaling rule's factor: the global batch's growth
    by = f"{world_size} ranks" + (f" x {args.grad_accum} micro-batches" if args.grad_accum > 1 else "")
    scaled = f" (x {by} = {args.lr * factor:g}, --scale-lr)" if args.scale_lr and factor > 1 else ""
    return (f"a lower --lr than {args.lr:g}{scaled}, e.g. {build_parser().get_default('lr')} (its default), with an empty "
            "--checkpoint-dir (a run that resumes takes its learning rate from the checkpoint)")
