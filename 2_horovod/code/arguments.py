"""Lab 2's flags (hyperparameters and the SageMaker contract) and the checks run before anything starts.

Both scripts take the same flags (train_pytorch.py adds --profile-steps); `check_args` is also what the
workshop runs before it starts a process or a job (workshop/spec.py). Neither framework is imported here.
"""

from __future__ import annotations

import argparse
import os

from contract import PROFILE_WAIT, PROFILE_WARMUP, nonfinite_problems, str2bool


def parser_for(framework: str) -> argparse.ArgumentParser:
    """The flags of train_<framework>.py ("pytorch" or "tensorflow"): the same hyperparameters and
    SageMaker contract; the PyTorch script adds --profile-steps and --output-dir (where its traces go)."""
    pytorch = framework == "pytorch"
    env = os.environ.get
    p = argparse.ArgumentParser(
        description=f"Horovod ({'PyTorch' if pytorch else 'TensorFlow'}) data-parallel training of a CNN on MNIST; "
                    "SageMaker contract.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("hyperparameters")
    g.add_argument("--epochs", type=int, default=5, help="passes over the training set")
    g.add_argument(
        "--batch-size", type=int, default=64,
        help="samples per step on each rank (the global batch is this times the number of ranks)",
    )
    g.add_argument(
        "--lr", type=float, default=0.02,
        help="SGD learning rate for one rank; multiplied by the number of ranks when --scale-lr",
    )
    g.add_argument(
        "--scale-lr", type=str2bool, default=True,
        help="linear scaling rule: lr x ranks, since the global batch grows with them",
    )
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--seed", type=int, default=1, help="seed for weights and shuffling")
    g.add_argument(
        "--fp16-allreduce", type=str2bool, default=False,
        help="compress gradients to float16 for the all-reduce (half the bytes on the wire)",
    )
    g.add_argument("--log-interval", type=int, default=20, help="steps between train-loss lines")
    g.add_argument(
        "--max-steps", type=int, default=0,
        help="stop each epoch after this many steps (0: the whole epoch); for quick runs",
    )
    g.add_argument(
        "--threads", type=int, default=0,
        help="CPU threads per rank (0: this host's CPUs divided by its ranks)",
    )
    if pytorch:
        g.add_argument(
            "--profile-steps", type=int, default=0,
            help="torch.profiler on every rank for this many training steps of the first epoch, after "
                 f"{PROFILE_WAIT} + {PROFILE_WARMUP} steps of warm-up; one Chrome/Perfetto trace per rank, and "
                 "Horovod's own timeline of those steps (rank 0 writes it), in --output-dir/profile/ (0: off)",
        )
    d = p.add_argument_group("SageMaker contract (defaults from SM_* variables)")
    d.add_argument("--train", default=env("SM_CHANNEL_TRAIN", "data/mnist/train"), help="train channel")
    d.add_argument("--test", default=env("SM_CHANNEL_TEST", "data/mnist/test"), help="test channel")
    d.add_argument("--model-dir", default=env("SM_MODEL_DIR", "artifacts/model"), help="where rank 0 writes the model")
    d.add_argument(
        "--checkpoint-dir", default=env("SM_CHECKPOINT_DIR", "artifacts/checkpoints"),
        help="rank 0 checkpoints each epoch here; every rank resumes from it when it holds one",
    )
    if pytorch:
        d.add_argument(
            "--output-dir", default=env("SM_OUTPUT_DATA_DIR", "artifacts/output"),
            help="other output (the --profile-steps traces); SageMaker uploads it with the job's output.tar.gz",
        )
    return p


def check_args(args: argparse.Namespace, world_size: int = 1, train_samples: int | None = None) -> None:
    """Checks the workshop also runs before it starts any process or job (raises ValueError).

    The message names each broken rule, then after "Fix:" what to do about each, so the
    workshop (and a reader of the job's log) can tell the user what to change. The same rules for both
    scripts, plus --profile-steps for train_pytorch.py (the only one with it, so its flags tell them apart).
    """
    parser = parser_for("pytorch" if "profile_steps" in vars(args) else "tensorflow")
    profile_steps = getattr(args, "profile_steps", 0)
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
    if args.max_steps < 0 or args.threads < 0:
        problems.append("--max-steps and --threads must be 0 or more")
        fixes.append("set --max-steps and --threads to 0 (their defaults: whole epochs, an automatic thread count) or more")
    if profile_steps < 0:
        problems.append(f"--profile-steps must be 0 (off) or more, got {profile_steps}")
        fixes.append("set --profile-steps to 0 (no profiling) or a few steps, e.g. 5")
    elif profile_steps and train_samples is not None and world_size >= 1:
        # the first epoch's steps: each rank's DistributedSampler shard (padded) in whole batches, at most --max-steps
        per_epoch = -(-train_samples // world_size) // args.batch_size
        per_epoch = min(per_epoch, args.max_steps) if args.max_steps else per_epoch
        if PROFILE_WAIT + PROFILE_WARMUP + profile_steps > per_epoch:
            problems.append(f"--profile-steps {profile_steps} after {PROFILE_WAIT + PROFILE_WARMUP} warm-up steps "
                            f"does not fit in the first epoch's {per_epoch} steps")
            fixes.append(f"set --profile-steps to {max(1, per_epoch - PROFILE_WAIT - PROFILE_WARMUP)} or less, or "
                         "--batch-size lower, or run fewer processes" if per_epoch > PROFILE_WAIT + PROFILE_WARMUP
                         else "set --batch-size lower (or --max-steps higher), or run fewer processes")
    if world_size < 1:
        problems.append(f"the number of ranks must be at least 1, got {world_size}")
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


def lower_lr_fix(args: argparse.Namespace, world_size: int, lr: float) -> str:
    """What to do when training diverged: a lower learning rate, on a fresh checkpoint folder."""
    scaled = f" (x {world_size} ranks = {lr:g}, --scale-lr)" if args.scale_lr and world_size > 1 else ""
    return (f"a lower --lr than {args.lr:g}{scaled}, e.g. {parser_for('pytorch').get_default('lr')} (its default), "
            "with an empty --checkpoint-dir (a run that resumes takes its learning rate from the checkpoint)")
