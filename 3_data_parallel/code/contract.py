"""Lab 3's side of the SageMaker training contract, and the small helpers every rank uses.

Hyperparameters arrive as text (`str2bool`), the data in the `train` and `test` channels
(`load_channel`), the ranks from the launcher (`distributed_env`), the network interface from
SageMaker (`set_gloo_interface`); the metric lines (`metrics`) are what SageMaker's metric definitions
and the workshop's log parser read. Most are copies of other labs' (tests/test_copies.py checks them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

# smddp, SageMaker's data-parallel library, runs only on these instance types (the SDK's own
# list: sagemaker/core/fw_utils.py SM_DATAPARALLEL_SUPPORTED_INSTANCE_TYPES, and
# https://docs.aws.amazon.com/sagemaker/latest/dg/distributed-data-parallel-support.html),
# and ships only in SageMaker's PyTorch training images that bundle it.
SMDDP_INSTANCE_TYPES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge")


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


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
def distributed_env() -> tuple[int, int, int, int]:
    """(rank, world_size, local_rank, local_world_size) as the launcher set them.

    torchrun sets these; a plain `python train.py` sets none and is a world of one.
    """
    env = os.environ
    return (
        int(env.get("RANK", 0)),
        int(env.get("WORLD_SIZE", 1)),
        int(env.get("LOCAL_RANK", 0)),
        int(env.get("LOCAL_WORLD_SIZE", 1)),
    )


def choose_backend(requested: str, cuda: bool) -> tuple[str, str]:
    """The process-group backend and a sentence saying why it was chosen."""
    instance = os.environ.get("SM_CURRENT_INSTANCE_TYPE", "")
    smddp_here = instance in SMDDP_INSTANCE_TYPES
    if requested in ("auto", "smddp") and cuda and smddp_here:
        try:
            import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  (registers "smddp")

            return "smddp", f"smddp: SageMaker's data-parallel library is installed and {instance} supports it"
        except ImportError as exc:
            if requested == "smddp":
                raise RuntimeError(
                    "--backend smddp, but the smdistributed.dataparallel library is not installed (only the "
                    "SageMaker PyTorch 2.5 and model-parallel images have it, both past their end of patch). "
                    "Fix: --backend auto (NCCL on GPUs), or run one of those images knowingly."
                ) from exc
    if requested == "smddp":
        where = instance or "this machine (not a SageMaker instance)"
        raise RuntimeError(
            f"--backend smddp is supported only on GPU instances {', '.join(SMDDP_INSTANCE_TYPES)}; "
            f"this is {where}{'' if cuda else ' with no GPU'}. Fix: --backend auto (nccl on GPUs, gloo on CPU)."
        )
    if requested == "nccl" and not cuda:
        raise RuntimeError("--backend nccl needs CUDA GPUs and none is visible. Fix: --backend auto or gloo.")
    if requested in ("nccl", "gloo"):
        return requested, f"{requested}: asked for with --backend"
    if cuda:
        reason = f"{instance} is not a smddp instance type" if instance else "not on a smddp instance type"
        return "nccl", f"nccl: GPUs are visible and {reason}"
    return "gloo", "gloo: no GPU is visible, and gloo is PyTorch's CPU backend"


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def set_gloo_interface(backend: str) -> str | None:
    """Point gloo at the network interface SageMaker names (SM_NETWORK_INTERFACE_NAME, e.g. eth0).

    Without GLOO_SOCKET_IFNAME, gloo picks the address its hostname resolves to, which on a
    multi-host CPU job can be one the peers cannot reach. NCCL's counterpart, NCCL_SOCKET_IFNAME,
    is set by SDK v3's torchrun driver; gloo's is not. A value already set is left alone.
    Returns the interface it set, or None.
    """
    interface = os.environ.get("SM_NETWORK_INTERFACE_NAME", "").strip()
    if backend != "gloo" or not interface or os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    os.environ["GLOO_SOCKET_IFNAME"] = interface
    return interface


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def weights_digest(model: nn.Module) -> str:
    """A short hash of every parameter's bytes: equal on every rank iff the weights are."""
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def metrics(**values) -> None:
    """One `METRICS key=value ...` line, rank first: what SageMaker's metric definitions and the
    workshop's log parser (workshop/metrics.py) read."""
    parts = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"METRICS {parts}", flush=True)


def cpu_threads(requested: int, local_world_size: int) -> int:
    """Size this rank's thread pool and return its size: --threads, or (0) the host's CPUs (SM_NUM_CPUS), or
    fewer if this process may use fewer (a simulated host pinned to its share of a laptop's cores), divided
    among the host's ranks, one pool per rank, sized so ranks do not fight."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpus = min(int(os.environ.get("SM_NUM_CPUS", usable)), usable)
    threads = requested or max(1, cpus // local_world_size)
    torch.set_num_threads(threads)
    return threads


def describe_run(args: argparse.Namespace, rank: int, world_size: int, backend: str, why: str, device: torch.device,
                 threads: int, lr: float, train_samples: int, test_samples: int) -> dict:
    """The run's configuration, saved beside the model (config.json). Rank 0 prints it, after the backend
    and why it was chosen, and the global batch and learning rate the world size (and --grad-accum) make."""
    accum = getattr(args, "grad_accum", 1)
    global_batch = args.batch_size * accum * world_size
    config = {
        "args": vars(args),
        "world_size": world_size,
        "backend": backend,
        "backend_reason": why,
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "device": str(device),
        "threads_per_rank": threads,
        "global_batch_size": global_batch,
        "effective_lr": lr,
        "train_samples": train_samples,
        "test_samples": test_samples,
        "host": os.environ.get("SM_CURRENT_HOST", platform.node()),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if rank == 0:
        print(f"Backend {why}.", flush=True)
        split = f"{args.batch_size} x {accum} micro-batches x {world_size} rank{'s' * (world_size > 1)}" if accum > 1 else \
            f"{args.batch_size} x {world_size}"
        factor = f"{world_size} x {accum}" if accum > 1 else f"{world_size}"
        print(
            f"World size {world_size}: global batch {split} = {global_batch}; learning rate "
            + (f"{args.lr} x {factor} = {lr:g} (linear scaling rule)" if args.scale_lr else f"{lr:g} (not scaled)"),
            flush=True,
        )
        print("Configuration: " + json.dumps(config, sort_keys=True), flush=True)
    return config
