"""Lab 1's flags (hyperparameters and the SageMaker contract) and the checks run before anything starts.

`check_args` is also what the workshop runs before it starts a process or a job (workshop/spec.py).
"""

from __future__ import annotations

import argparse
import os

from contract import nonfinite_problems


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        description="Parameter-server training (TF2 ParameterServerStrategy) of a CNN on MNIST; SageMaker contract.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("hyperparameters")
    g.add_argument("--steps", type=int, default=2000, help="training steps in all, shared by the workers as they come free")
    g.add_argument("--batch-size", type=int, default=64, help="samples per step (each step runs on one worker)")
    g.add_argument("--lr", type=float, default=0.02, help="SGD learning rate")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (its slots live next to their variables)")
    g.add_argument("--seed", type=int, default=1, help="seed for the initial weights")
    g.add_argument(
        "--log-interval", type=int, default=100,
        help="steps between the coordinator's evaluations and checkpoints (it waits for the scheduled steps there)",
    )
    g.add_argument(
        "--min-shard-bytes", type=int, default=64 * 1024,
        help="variables larger than this are sharded across the parameter servers",
    )
    g.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op threads per process (so the processes sharing a host do not fight for cores)")
    g.add_argument(
        "--slow-worker", type=int, default=0,
        help="demo: the host rank of a worker the launcher throttles (0: none); read by the launcher",
    )
    g.add_argument("--slow-factor", type=float, default=1.0, help="demo: how much slower that worker runs")
    g.add_argument(
        "--timeline-bin-s", type=float, default=0.5,
        help="width of the time bins of the per-worker step counts the coordinator reports",
    )
    d = p.add_argument_group("SageMaker contract (defaults from SM_* variables)")
    d.add_argument("--train", default=env("SM_CHANNEL_TRAIN", "data/mnist/train"), help="train channel")
    d.add_argument("--test", default=env("SM_CHANNEL_TEST", "data/mnist/test"), help="test channel")
    d.add_argument("--model-dir", default=env("SM_MODEL_DIR", "artifacts/model"), help="where the coordinator writes the model")
    d.add_argument(
        "--checkpoint-dir", default=env("SM_CHECKPOINT_DIR", "artifacts/checkpoints"),
        help="checkpoint every --log-interval steps here (the newest two are kept); resume from the newest",
    )
    d.add_argument(
        "--output-dir", default=env("SM_OUTPUT_DATA_DIR", "artifacts/output"),
        help="a worker's working directory (it writes its rank there for its input pipeline)",
    )
    return p


def check_args(args: argparse.Namespace, world_size: int = 2, train_samples: int | None = None) -> None:
    """Checks the workshop also runs before any process or job starts (raises ValueError).

    `world_size` is the number of hosts: each runs a parameter server and one training
    process (the coordinator on the first host, a worker on the others). The message names
    each broken rule, then after "Fix:" what to do about each.
    """
    parser = build_parser()
    default = parser.get_default
    problems, fixes = nonfinite_problems(args, parser)
    if problems:  # NaN passes every comparison below (nan <= 0 is False): refused first, on its own
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")
    if world_size < 2:
        problems.append(
            f"a parameter-server job needs at least 2 hosts (one coordinator, at least one worker), got {world_size}"
        )
        fixes.append("run it on 2 or more hosts, e.g. 3: one coordinator and two workers (the workshop's "
                     "command line: --hosts 3)")
    for name in ("steps", "batch_size", "log_interval", "threads", "min_shard_bytes"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            problems.append(f"{flag} must be at least 1, got {getattr(args, name)}")
            fixes.append(f"set {flag} to a whole number of at least 1, e.g. {default(name)} (its default)")
    if args.lr <= 0:
        problems.append(f"--lr must be positive, got {args.lr}")
        fixes.append(f"set --lr to a positive number, e.g. {default('lr')} (its default)")
    if not 0 <= args.momentum < 1:
        problems.append(f"--momentum must be in [0, 1), got {args.momentum}")
        fixes.append(f"set --momentum to 0 or more and below 1, e.g. {default('momentum')} (its default)")
    if args.slow_factor < 1 or args.timeline_bin_s <= 0:
        problems.append("--slow-factor must be at least 1 and --timeline-bin-s positive")
        fixes.append(f"leave --slow-factor at {default('slow_factor')} (no slowdown) or raise it, and "
                     f"--timeline-bin-s at {default('timeline_bin_s')}")
    if args.slow_worker and not 1 <= args.slow_worker < max(world_size, 2):
        problems.append(f"--slow-worker must be the host rank of a worker, 1..{world_size - 1}, got {args.slow_worker}")
        fixes.append(f"set --slow-worker to a worker's host rank, 1..{world_size - 1}, or 0 (no slow worker)")
    if train_samples is not None and train_samples < args.batch_size:
        problems.append(f"--batch-size {args.batch_size} is larger than the {train_samples} training samples")
        fixes.append(f"set --batch-size to {train_samples} or less, e.g. {min(default('batch_size'), train_samples)}")
    if problems:
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")
