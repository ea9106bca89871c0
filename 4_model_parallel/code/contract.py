"""The SageMaker contract and the small helpers every rank uses: what the launcher and the platform set,
the corpus channels, the METRICS lines, and how a rank stops with a message.

A module beside train.py in the job's code/ folder (SageMaker uploads the folder as the source_dir).
The definitions marked `Shared copy` are copies of other labs' (tests/test_copies.py keeps them identical).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
from pathlib import Path

import torch

VOCAB = 256  # bytes: no tokenizer to download, every character of the corpus is representable
CORPUS_FILE = "corpus.txt"


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
def metrics(**values) -> None:
    """One `METRICS key=value ...` line, rank first: what SageMaker's metric definitions and the
    workshop's log parser (workshop/metrics.py) read."""
    parts = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"METRICS {parts}", flush=True)


def load_corpus(channel_dir: str, name: str) -> torch.Tensor:
    path = Path(channel_dir) / CORPUS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"The {name!r} channel has no {CORPUS_FILE} at {path}. Fix: prepare the text with "
            f"`python -m workshop.datasets.corpus DIR` and pass --{name} DIR/{name} (locally), or "
            f"give the job a {name!r} input channel (SageMaker; the notebook uploads it)."
        )
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long()


def fsdp_api():
    """FSDP2's fully_shard: torch.distributed.fsdp (2.6+), or its 2.5 home (the SMP v2 image)."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def threads_per_rank(args: argparse.Namespace, local_world_size: int) -> int:
    """--threads, else the host's CPUs (SM_NUM_CPUS), or fewer if this process may use fewer (a simulated
    host pinned to its share of a laptop's cores), divided by its ranks: one pool each, so ranks do not fight."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpus = min(int(os.environ.get("SM_NUM_CPUS", usable)), usable)
    return args.threads or max(1, cpus // local_world_size)


def describe_run(args: argparse.Namespace, world_size: int, backend: str, device: torch.device, how: str, shard: int,
                 n_params: int, dtype: torch.dtype, smp: dict, smp_library: bool, n_train: int, n_test: int) -> dict:
    """The run's configuration, as rank 0 prints it and saves it beside the model (config.json)."""
    micro = args.batch_size // world_size
    replicas = world_size // shard
    return {
        "args": {k: v for k, v in vars(args).items()}, "world_size": world_size, "backend": backend,
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "device": str(device), "technique": how, "shard_group_size": shard, "data_parallel_replicas": replicas,
        "sequences_per_rank": micro, "parameters": n_params, "dtype": str(dtype).replace("torch.", ""),
        "smp": smp, "smp_library": smp_library, "torch": torch.__version__, "python": platform.python_version(),
        "host": os.environ.get("SM_CURRENT_HOST", platform.node()),
        "corpus": f"pydoc_data.topics (CPython {platform.python_version()} docs): {n_train} train / {n_test} test characters",
    }


def print_setup(config: dict, smp_notes: list[str], dtype: torch.dtype) -> None:
    """Rank 0's lines before training: what the SMP settings changed, the technique, and the configuration."""
    for note in smp_notes:
        print(note, flush=True)
    if config["smp"] and not config["smp_library"]:
        print("torch.sagemaker is not installed here (not the SMP image): plain PyTorch applies the same "
              "SMP settings.", flush=True)
    print(f"{config['parameters']:,} parameters; {config['technique']}; backend {config['backend']}; {dtype}; global "
          f"batch {config['args']['batch_size']} = {config['sequences_per_rank']} sequence(s) x {config['world_size']} "
          "rank(s)", flush=True)
    print("Configuration: " + json.dumps(config, sort_keys=True, default=str), flush=True)
