"""Lab 2's SageMaker contract and the small helpers both of its scripts use, with neither framework.

train_pytorch.py and train_tensorflow.py both import this module, and the TensorFlow script imports
TensorFlow only inside its main() (the workshop reads its flags without it), so nothing here imports
torch or tensorflow. The `# Shared copy:` definitions are also in other labs' code/ folders.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys

# Shared copy: keep identical in every script that has it (tests/test_copies.py).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
PROFILE_WAIT, PROFILE_WARMUP = 2, 2


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def str2bool(text: str) -> bool:
    """SageMaker passes every hyperparameter as text, so booleans arrive as 'true'/'false'."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def nonfinite_problems(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """check_args' first rule, as (problems, fixes), both empty when it holds: every float flag has a finite
    value. argparse's float() reads 'nan', 'inf' and '1e999' (inf) without complaint, and they pass the rules
    that follow (nan <= 0 is False, and so is nan > 0); a run with --lr nan trains on NaN from its first step."""
    problems, fixes = [], []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if action.type is float and isinstance(value, float) and not math.isfinite(value):
            flag = max(action.option_strings, key=len)
            problems.append(f"{flag} must be a finite number, got {value}")
            fixes.append(f"set {flag} to a finite number, e.g. {action.default} (its default)")
    return problems, fixes


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def exit_with(message: str) -> None:
    """End this process with `message` as its last line, and exit status 1. On stdout, after the METRICS
    lines printed before it: a launcher relays a rank's stdout and stderr apart, so a message on stderr
    (SystemExit's) can arrive before them, and the workshop reports a rank's last line as why it ended."""
    print(message, flush=True)
    raise SystemExit(1)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def metrics(**values) -> None:
    """One `METRICS key=value ...` line, rank first: what SageMaker's metric definitions and the
    workshop's log parser (workshop/metrics.py) read."""
    parts = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"METRICS {parts}", flush=True)


def threads_per_rank(threads: int, local_size: int) -> int:
    """--threads, or (0) the host's CPUs (SM_NUM_CPUS), or fewer if this process may use fewer (a simulated
    host pinned to its share of a laptop's cores), divided by its ranks: one thread pool per rank, sized so
    ranks do not fight."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpus = min(int(os.environ.get("SM_NUM_CPUS", usable)), usable)
    return threads or max(1, cpus // local_size)


def describe_run(hvd, args: argparse.Namespace, lr: float, framework: str, device: str, threads: int,
                 train_samples: int, test_samples: int, **versions: str) -> dict:
    """The run's configuration (saved beside the model as config.json); rank 0 prints it, after a line
    with the ranks, the global batch and the learning rate. `versions`: the framework's packages."""
    size = hvd.size()
    config = {
        "args": vars(args),
        "framework": framework,
        "ranks": size,
        "local_ranks": hvd.local_size(),
        "hosts": hvd.cross_size(),
        "controller": "gloo" if hvd.gloo_enabled() else "mpi",
        "device": device,
        "threads_per_rank": threads,
        "global_batch_size": args.batch_size * size,
        "effective_lr": lr,
        "train_samples": train_samples,
        "test_samples": test_samples,
        "host": os.environ.get("SM_CURRENT_HOST", platform.node()),
        **versions,
        "horovod": sys.modules["horovod"].__version__,
        "python": platform.python_version(),
    }
    if hvd.rank() == 0:
        print(
            f"Horovod {config['horovod']} ({config['controller']} controller): {size} ranks on "
            f"{hvd.cross_size()} host(s); global batch {args.batch_size} x {size} = {args.batch_size * size}; "
            "learning rate "
            + (f"{args.lr} x {size} = {lr:g} (linear scaling rule)" if args.scale_lr else f"{lr:g} (not scaled)"),
            flush=True,
        )
        print("Configuration: " + json.dumps(config, sort_keys=True), flush=True)
    return config
