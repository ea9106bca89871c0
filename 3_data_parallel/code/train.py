"""Lab 3: synchronous data-parallel training of a small CNN on MNIST with PyTorch DDP.

Every rank holds a full copy of the model and trains on its own shard of each epoch
(DistributedSampler). After each backward pass, DistributedDataParallel all-reduces the
gradients, so every rank applies the same averaged update and the copies stay identical.

Run it (from the lab folder):

    python code/train.py                              # one process, no launcher needed
    torchrun --nproc-per-node 2 code/train.py         # 2 ranks on this machine
    torchrun --nnodes 2 --node-rank R --master-addr A --master-port P \\
        --nproc-per-node 1 code/train.py              # one node of a 2-node job
    python -m workshop run data_parallel --hosts 2    # 2 simulated SageMaker hosts
    # On SageMaker, SDK v3's Torchrun() runs `torchrun --nnodes=... train.py --epochs ...`
    # on every host (see the lab's notebook).

Inputs follow the SageMaker training contract: hyperparameters as flags, data in the
`train` and `test` channels (SM_CHANNEL_TRAIN, SM_CHANNEL_TEST: `mnist.npz` with `images`
and `labels`), the model to SM_MODEL_DIR, checkpoints to SM_CHECKPOINT_DIR. Each has a
local default so the script runs with no SageMaker around it. Ranks come from the
launcher (RANK, WORLD_SIZE, LOCAL_RANK, ...); without one it is a world of one.

Fault tolerance (under `torchrun --max-restarts K`, which restarts every rank when one dies):
rank 0 writes `checkpoint.pt` in the checkpoint folder at the end of each epoch and, with
`--checkpoint-every N`, after every N-th global step too (global steps: optimizer steps counted from
1 across epochs). The file is replaced whole (written to `checkpoint.pt.tmp`, fsynced, renamed, the
folder fsynced), so a crash mid-write leaves the previous checkpoint. It holds the position (whole
epochs done, batches done of the next, the global step), the model, the optimizer and every rank's
RNG state, so a run resumed mid-epoch sees exactly the batches and dropout an uninterrupted one
would; rank 0 reports each one's cost as `METRICS rank=0 step=N checkpoint_s=S`. On resume rank 0 prints `resumed from <checkpoint> at step <N> (restart <k>)` and, after the
first step, `METRICS ... resumed_step=N lost_steps=L recover_s=S` (see `report_recovery`).
The SHA-256 of a checkpoint's content, saved inside it, is verified when a run resumes: a damaged
checkpoint stops the run before it trains, named (see `load_checkpoint`). A NaN or infinite loss stops
every rank before it is checkpointed (see `Divergence`). What a killed save left (`checkpoint.pt.tmp`)
is removed when the next run starts (see `clean_stale`).
`--fault kill-rank=R@step=N` (default: the environment variable WORKSHOP_FAULT) makes rank R SIGKILL
itself after global step N (and that step's checkpoint, if one is due), on the first attempt only
(see `parse_fault`, `inject_fault`).

The lines that make it distributed carry a `DDP:` comment.
Metric lines (`METRICS rank=0 epoch=1 ... test_accuracy=0.97`) are what SageMaker's
metric definitions and the workshop's local log parser read.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import itertools
import json
import math
import os
import platform
import re
import shutil
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

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
        help="samples per step on each rank (the global batch is this times the world size)",
    )
    g.add_argument(
        "--lr", type=float, default=0.02,
        help="SGD learning rate for one rank; multiplied by the world size when --scale-lr",
    )
    g.add_argument(
        "--scale-lr", type=str2bool, default=True,
        help="linear scaling rule: lr x world size, since the global batch grows with it",
    )
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--seed", type=int, default=1, help="seed for weights and shuffling")
    g.add_argument(
        "--backend", choices=("auto", "gloo", "nccl", "smddp"), default="auto",
        help="process-group backend; auto: smddp where SageMaker supports it and the image has it (only "
             "images past their end of patch do), nccl on other GPUs, gloo on CPU",
    )
    g.add_argument("--log-interval", type=int, default=20, help="steps between train-loss lines")
    g.add_argument(
        "--max-steps", type=int, default=0,
        help="stop each epoch after this many steps (0: the whole epoch); for quick runs",
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


def steps_per_epoch(args: argparse.Namespace, world_size: int, train_samples: int) -> int:
    """Optimizer steps in one epoch: each rank's DistributedSampler shard (ceil(samples / world size),
    padded) in whole batches (drop_last), at most --max-steps."""
    steps = -(-train_samples // world_size) // args.batch_size
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
    profile_steps = getattr(args, "profile_steps", 0)
    if profile_steps < 0:
        problems.append(f"--profile-steps must be 0 (off) or more, got {profile_steps}")
        fixes.append("set --profile-steps to 0 (no profiling) or a few steps, e.g. 5")
    elif profile_steps and train_samples is not None and world_size >= 1 \
            and PROFILE_WAIT + PROFILE_WARMUP + profile_steps > steps_per_epoch(args, world_size, train_samples):
        per_epoch = steps_per_epoch(args, world_size, train_samples)
        problems.append(f"--profile-steps {profile_steps} after {PROFILE_WAIT + PROFILE_WARMUP} warm-up steps does "
                        f"not fit in the first epoch's {per_epoch} steps")
        fixes.append(f"set --profile-steps to {max(1, per_epoch - PROFILE_WAIT - PROFILE_WARMUP)} or less, or "
                     "--batch-size lower, or run fewer processes" if per_epoch > PROFILE_WAIT + PROFILE_WARMUP
                     else "set --batch-size lower (or --max-steps higher), or run fewer processes")
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


# ----------------------------------------------------------------------------- profiling

# Shared copy: keep identical in every script that has it (tests/test_copies.py).
PROFILE_WAIT, PROFILE_WARMUP = 2, 2


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
class StepProfiler:
    """--profile-steps S: torch.profiler on this rank for S training steps, after PROFILE_WAIT steps
    unrecorded and PROFILE_WARMUP recorded but dropped (torch.profiler.schedule), written as one
    Chrome/Perfetto trace, `<output_dir>/profile/trace-rank<R>.json` (SM_OUTPUT_DATA_DIR: SageMaker
    uploads it with the job's output). Each step is one `ProfilerStep#N` span in the trace. Off
    (S = 0): every call does nothing. `seconds` and `samples`: the time and samples of the steps it
    was on (profiling slows them), which the epoch's throughput leaves out.

    The trace's `workshop` entry adds what torch.profiler does not record: the training thread's CPU
    seconds in each step (`time.thread_time`: on a CPU, not waiting or descheduled), the CPUs this
    process may use and the machine it ran on (the kernel's boot id: ranks on one machine share its
    CPUs), from which the report tells communication from time-sharing when ranks outnumber cores."""

    def __init__(self, steps: int, output_dir: str, rank: int):
        self.steps, self.rank, self.prof, self.taken = steps, rank, None, 0
        self.path = Path(output_dir) / "profile" / f"trace-rank{rank}.json"
        self.seconds, self.samples, self.epoch, self.t0 = 0.0, 0, None, 0.0
        self.cpu_s: dict[int, float] = {}  # ProfilerStep number -> the training thread's CPU seconds in it
        self.cpu0 = 0.0

    def start(self, epoch: int) -> None:
        if not self.steps or self.epoch is not None:
            return
        from torch.profiler import ProfilerActivity, profile, schedule

        self.path.parent.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=self.steps, repeat=1),
            record_shapes=True,  # the collectives' tensor sizes: the bytes each step moves
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(self.path)),
        )
        self.epoch, self.t0 = epoch, time.perf_counter()
        self.prof.start()
        self.cpu0 = time.thread_time()

    def step(self, samples: int) -> None:
        """After each training step (the optimizer's): the end of one ProfilerStep."""
        if self.prof is None:
            return
        now = time.thread_time()
        self.cpu_s[self.taken], self.cpu0 = now - self.cpu0, now
        self.samples += samples
        self.taken += 1
        if self.taken == PROFILE_WAIT + PROFILE_WARMUP + self.steps:  # the trace is written at this prof.step()
            try:
                machine = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            except OSError:
                machine = platform.node()
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
                list(range(os.cpu_count() or 1))
            self.prof.add_metadata_json("workshop", json.dumps(
                {"step_cpu_s": self.cpu_s, "cpus": cpus, "machine": machine}))
        self.prof.step()
        if self.taken >= PROFILE_WAIT + PROFILE_WARMUP + self.steps:  # the trace is written: stop
            self.stop()

    def stop(self) -> None:
        if self.prof is None:
            return
        self.prof.stop()
        self.prof, self.seconds = None, time.perf_counter() - self.t0
        if self.rank == 0:
            print(f"Profiled {max(0, self.taken - PROFILE_WAIT - PROFILE_WARMUP)} steps on every rank; "
                  f"traces in {self.path.parent}.", flush=True)


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


class SkipFirst(torch.utils.data.Sampler):
    """The wrapped sampler's indices but the first `skip`: a run resumed mid-epoch trains on the rest of
    the epoch's batches, the very ones an uninterrupted run would, without loading those it skips."""

    def __init__(self, sampler, skip: int = 0):
        self.sampler, self.skip = sampler, skip

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)


# ----------------------------------------------------------------------------- distributed


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


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- fault tolerance
# Under torchrun's elastic agent (`--max-restarts K`) a dead rank makes the agent restart every
# rank (TORCHELASTIC_RESTART_COUNT = 1, 2, ...), and the script resumes from its newest complete
# checkpoint. --fault (default: the environment variable WORKSHOP_FAULT) injects such a failure; the
# helpers below are the same in labs 3 and 4.


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
FAULT_ENV = "WORKSHOP_FAULT"


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
FAULT_RECORD_KEY = "workshop/fault"  # the fault record in torchrun's agent store (see inject_fault)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def parse_fault(text: str | None) -> tuple[int, int] | None:
    """The fault that `text` (--fault, by default WORKSHOP_FAULT) asks for, as (rank, step); None when blank.

    `kill-rank=R@step=N`: the process whose global RANK is R kills itself with SIGKILL right after
    it finishes global step N, on the first attempt only (see `inject_fault`). Global steps are the
    optimizer steps of the whole run, counted from 1 across epochs (a resumed run goes on counting).
    Anything else, step 0 included, raises ValueError ("... Fix: ...").
    """
    if text is None or not text.strip():
        return None
    match = re.fullmatch(r"kill-rank=(\d+)@step=(\d+)", text)
    if not match or int(match[2]) < 1:
        raise ValueError(
            f"the fault {text!r} (--fault, or {FAULT_ENV}) is not one this script can inject: the form is "
            "kill-rank=R@step=N, R a global rank and N a global training step counted from 1. Fix: pass --fault "
            f"(or set {FAULT_ENV}) as, e.g., kill-rank=1@step=30, or leave it out."
        )
    return int(match[1]), int(match[2])


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def fault_problems(text: str | None, world_size: int, last_step: int | None) -> tuple[list[str], list[str]]:
    """check_args' rules for the fault (--fault, or WORKSHOP_FAULT), as (problems, fixes): both empty when
    there is none or it is fine.

    `last_step` is the run's last global step (None when it cannot be known before the data is read).
    """
    try:
        fault = parse_fault(text)
    except ValueError as exc:
        problem, _, fix = str(exc).partition(" Fix: ")
        return [problem.rstrip(".")], [fix.rstrip(".")]
    if fault is None:
        return [], []
    (rank, step), problems, fixes = fault, [], []
    if rank >= world_size:
        problems.append(f"the fault {text} names rank {rank}, but a world of {world_size} has ranks 0 to {world_size - 1}")
        fixes.append(f"name a rank from 0 to {world_size - 1} in --fault (or {FAULT_ENV})")
    if last_step is not None and step > last_step:
        problems.append(f"the fault {text} names step {step}, past the run's last step, {last_step}")
        fixes.append(f"name a step from 1 to {last_step} in --fault (or {FAULT_ENV}), or train for more steps")
    return problems, fixes


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def restart_count() -> int:
    """How many times this host's torchrun agent has restarted its ranks because of a failure it saw (0 on
    the first attempt). A host whose ranks are restarted because a rank on another host died keeps its
    count (torch.distributed.elastic), so hosts can disagree: see elastic_store and agreed_attempt."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def agent_store(timeout: timedelta = timedelta(seconds=60)):
    """torchrun's agent store (a TCPStore on the rendezvous host that outlives every attempt), or None
    when this process runs without torchrun's agent store."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def elastic_store(timeout: timedelta) -> tuple[dict, int]:
    """(init_process_group's store arguments, this rank's attempt: 0 on the first), under torchrun.

    torchrun's elastic agent keeps one TCPStore for all attempts (TORCHELASTIC_USE_AGENT_STORE=True,
    torch 2.13), so the ranks of a restarted attempt would find the keys the failed attempt left in
    it and connect to a dead rank's address ("Gloo connectFullMesh failed ... Connection refused";
    NCCL's counterpart is pytorch/pytorch#167288). So each rank counts its own starts in that store
    (every attempt starts every rank once, on every host, whatever each host's restart_count says)
    and a restarted attempt's ranks meet under keys of their own. On the first attempt, and without
    the agent's store: torchrun's own arguments ({}).
    """
    store = agent_store(timeout)
    if store is None:
        return {}, restart_count()
    rank, world_size, _, _ = distributed_env()
    attempt = store.add(f"workshop/starts/rank-{rank}", 1) - 1
    if attempt == 0:
        return {}, 0
    return {"store": dist.PrefixStore(f"workshop/attempt-{attempt}", store), "rank": rank, "world_size": world_size}, attempt


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def agreed_attempt(attempt: int, device: torch.device, distributed: bool) -> int:
    """The attempt number every rank uses: the largest any rank counted (hosts' restart counts can differ)."""
    if not distributed:
        return attempt
    value = torch.tensor([attempt], dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def fsync_dir(folder: Path) -> None:
    """Make a rename or a new entry in `folder` durable: fsync the folder itself (POSIX; a no-op where
    folders cannot be opened, as on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def write_atomic(path: Path, write, durable: bool = True) -> None:
    """Write `path` so that a crash at any moment leaves either its old content or its new one:
    `write(file)` fills `<name>.tmp`, which is flushed, fsynced, then renamed over `path`
    (os.replace, atomic on POSIX), and the folder is fsynced so the rename survives a power cut.
    `durable=False` skips both fsyncs: still never torn, but only safe against a process dying,
    not a machine (for records rewritten often). A leftover `.tmp` is never read."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def inject_fault(fault: tuple[int, int] | None, rank: int, step: int, checkpoint_dir: str | Path, text: str,
                 attempt: int) -> None:
    """If `fault` (parse_fault's reading of `text`) names this rank and the global step it just finished, and
    `attempt` is the first (0: a restarted job must not fail again), die as a crashing host would: SIGKILL,
    no exception, no clean-up, no exit code of its own. Before that, one line on stdout and the
    record `fault.json` in the checkpoint folder (rank, step, wall-clock time), from which the resumed
    run counts the steps lost and the seconds it took to recover; under torchrun's agent the record also
    goes to the agent's store (FAULT_RECORD_KEY), which rank 0 reads whatever host it is on."""
    if fault != (rank, step) or attempt > 0:
        return
    record = {"rank": rank, "step": step, "time": time.time(), "attempt": 0, "fault": text}
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(checkpoint_dir) / "fault.json", lambda f: f.write(json.dumps(record).encode()))
    store = agent_store()  # rank 0 may be on another host, whose checkpoint folder is not this one
    if store is not None:
        store.set(FAULT_RECORD_KEY, json.dumps(record))
    source = f"{FAULT_ENV}={text}" if os.environ.get(FAULT_ENV) == text else f"--fault {text}"
    print(f"FAULT: killing rank {rank} at step {step} ({source})", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def write_progress(checkpoint_dir: str | Path, step: int, attempt: int) -> None:
    """Rank 0's last finished global step, as `progress.json` in the checkpoint folder: how a resumed run
    knows how far the failed attempt got. Rewritten every log interval, so not fsynced: it has to
    survive the process, not the machine."""
    record = {"step": step, "time": time.time(), "attempt": attempt}
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(checkpoint_dir) / "progress.json", lambda f: f.write(json.dumps(record).encode()), durable=False)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def read_recovery(checkpoint_dir: str | Path, resumed_step: int, attempt: int) -> dict:
    """What the attempt before `attempt` left behind, measured against the checkpoint this one resumes from.

    `last_step`: the failed attempt's last finished global step; `lost_steps`: last_step minus
    `resumed_step`, the steps to do again; `exact`: whether last_step is exact (from the fault record:
    no rank can finish a step past the one a peer died after, since every step needs every rank) or a
    lower bound (rank 0's progress record, written every log interval); `fault_time`: when the
    injected fault struck (time.time() of the dying rank), else None. The fault record is the checkpoint
    folder's `fault.json`, else (a rank on another host died) the one in torchrun's agent store.

    Which failure this attempt recovers from: on a restart (attempt k > 0), attempt k-1's records only;
    on a new job (attempt 0) resuming a checkpoint, the fault record of a run that died after that
    checkpoint was written (its step is past the checkpoint's: a job that failed and was started again,
    possibly at another world size), and no older one. The folder's fault record is consumed (deleted)
    once read, so no later run takes it for its own. What is unknown is None; `attempt` is passed on,
    for the report.
    """
    folder = Path(checkpoint_dir)
    records = {}
    for name in ("fault", "progress"):
        try:
            records[name] = json.loads((folder / f"{name}.json").read_text())
        except (OSError, ValueError):
            records[name] = None
    store = agent_store() if attempt > 0 and records["fault"] is None else None
    if store is not None and store.check([FAULT_RECORD_KEY]):  # written by a rank on another host
        records["fault"] = json.loads(store.get(FAULT_RECORD_KEY))
    with contextlib.suppress(FileNotFoundError):
        (folder / "fault.json").unlink()  # consumed: this attempt reports it, or it is an older run's
    fault, progress = records["fault"], records["progress"]
    if fault is not None and (fault.get("step", -1) <= resumed_step if attempt == 0
                              else fault.get("attempt") != attempt - 1):
        fault = None  # an earlier failure, not the one this attempt recovers from
    if progress is not None and attempt > 0 and progress.get("attempt") != attempt - 1:
        progress = None
    steps = [r["step"] for r in (fault, progress) if r is not None]
    last = max(steps) if steps else None
    return {
        "last_step": last,
        "lost_steps": None if last is None else max(0, last - resumed_step),
        "exact": fault is not None,
        "fault_time": fault["time"] if fault is not None else None,
        "attempt": attempt,
    }


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def announce_resume(checkpoint: str | Path | None, step: int, recovery: dict) -> None:
    """Rank 0's lines on resuming: the checkpoint, its step, the restart, and the steps lost."""
    if checkpoint is None:
        print(f"no checkpoint to resume from: restart {recovery['attempt']} starts again at step 0", flush=True)
    else:
        print(f"resumed from {checkpoint} at step {step} (restart {recovery['attempt']})", flush=True)
    if recovery["lost_steps"] is not None:
        source = "its fault record" if recovery["exact"] else "rank 0's progress record, so at least that many"
        failed = "the failed run" if recovery["attempt"] == 0 else "the failed attempt"
        print(f"{recovery['lost_steps']} step(s) to do again: {failed} had finished step "
              f"{recovery['last_step']} ({source})", flush=True)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def report_recovery(recovery: dict, resumed_step: int, step: int | None) -> None:
    """A resumed run's METRICS line, once its first step (`step`; None when none was left) is done:
    restart, resumed_step, lost_steps (exact) or lost_steps_at_least (from the progress record), and
    recover_s, the seconds from the injected fault to the end of that first step; finished=1 when no
    step was left (the checkpoint was the run's last)."""
    values = {"rank": 0, "step": resumed_step if step is None else step, "restart": recovery["attempt"],
              "resumed_step": resumed_step}
    if step is None:
        values["finished"] = 1
    if recovery["lost_steps"] is not None:
        values["lost_steps" if recovery["exact"] else "lost_steps_at_least"] = recovery["lost_steps"]
    if recovery["fault_time"] is not None and step is not None:
        values["recover_s"] = time.time() - recovery["fault_time"]
    metrics(**values)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
STALE_NAMES = re.compile(r"(checkpoint\.pt|progress\.json|fault\.json|latest)\.tmp|step-\d+\.partial")


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def clean_stale(checkpoint_dir: str | Path) -> list[str]:
    """Rank 0, as a run starts, before anything reads or writes the checkpoint folder: remove what a run
    killed mid-write left there, and print what went. Only the names these scripts write while a file
    or folder is unfinished (STALE_NAMES: write_atomic's `<name>.tmp`, a sharded checkpoint's
    `step-<N>.partial/`), never anything else. Such leftovers are never read, but they hold space, and
    on a disk they filled the next save fails for them. No other process writes here by then: the
    ranks of an earlier attempt are gone before torchrun starts the next, and the workshop locks a
    checkpoint folder for the job that uses it."""
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.iterdir()):
        if not STALE_NAMES.fullmatch(path.name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name + "/")
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            removed.append(path.name)
    if removed:
        print(f"Removed what an earlier run left unfinished in {folder}: {', '.join(removed)}.", flush=True)
    return removed


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
class Divergence:
    """Stops a run whose training diverged, before it writes a checkpoint of it.

    Every rank calls `note(loss, step)` after each step: it records the first global step whose loss on
    this rank was not finite, on the device, without waiting for it. Every rank calls `check(step)` at the
    same points (a log line, before a checkpoint, at an epoch's end): one all-reduce tells every rank
    each rank's first bad step, and if there is one, every rank stops (exit_with) with the same message:
    the step, the rank, the loss, and `fix`. `weights=` the model about to be saved: its parameters
    (this rank's shards) must be finite too, since a huge step can overflow them while the loss that
    led to it was still finite. `sum_over_ranks(tensor)` returns the tensor summed over every rank (an
    all-reduce: torch.distributed's, or Horovod's)."""

    def __init__(self, device: torch.device, rank: int, world_size: int, sum_over_ranks, fix: str):
        self.rank, self.world_size, self.sum_over_ranks, self.fix = rank, world_size, sum_over_ranks, fix
        self.first = torch.zeros((), dtype=torch.float64, device=device)  # first bad step (0: none)
        self.value = torch.zeros((), dtype=torch.float64, device=device)  # its loss (nan, inf or -inf)

    def note(self, loss: torch.Tensor, step: int) -> None:
        loss = loss.detach().to(torch.float64)
        new = (self.first == 0) & ~torch.isfinite(loss)
        self.first = torch.where(new, float(step), self.first)
        self.value = torch.where(new, loss, self.value)

    def check(self, step: int, weights: nn.Module | None = None) -> None:
        report = torch.zeros(self.world_size, 3, dtype=torch.float64, device=self.first.device)
        report[self.rank, 0], report[self.rank, 1] = self.first, self.value
        if weights is not None:
            local = [p.to_local() if hasattr(p, "to_local") else p for p in weights.parameters()]
            finite = torch.stack([torch.isfinite(p.detach()).all() for p in local]).all()
            report[self.rank, 2] = torch.where(finite, 0.0, float(step))
        if self.world_size > 1:
            report = self.sum_over_ranks(report)  # every rank's first bad step (each row is one rank's; the rest add 0)
        rows = report.cpu().tolist()
        bad = sorted((first, rank, value, 0.0) for rank, (first, value, _) in enumerate(rows) if first)
        bad += sorted((weights_at, rank, 0.0, weights_at) for rank, (_, _, weights_at) in enumerate(rows) if weights_at)
        if not bad:
            return
        first, rank, value, weights_at = min(bad)
        if weights_at:
            what = (f"rank {rank}'s weights were not finite after global step {int(weights_at)}, while its loss "
                    "still was")
        else:
            what = f"the loss was {value} at global step {int(first)} on rank {rank}"
            others = [f"rank {r} at step {int(f)}" for f, r, _, w in bad if not w and r != rank]
            if others:
                what += f" (and on {', '.join(others)})"
        exit_with(f"Training diverged: {what}. The run stops here, before it checkpoints the broken weights: "
                         f"the checkpoints already written stay as they were. Fix: {self.fix}.")


# ----------------------------------------------------------------------------- training


def save_checkpoint(path: Path, model, optimizer, position: dict, batch_size: int, rank: int, world_size: int) -> float:
    """Every rank calls it: rank 0 writes `path` (checkpoint.pt) atomically and durably (write_atomic).
    Returns the seconds it took, gathering the RNG states and the closing barrier included: what a
    checkpoint costs every rank (the METRICS line `checkpoint_s`).

    `position`: {"epoch": whole epochs done, "batch": batches done of the next one, "step": global
    step}. With the model and optimizer go every rank's RNG state (dropout), so a resumed run draws
    what an uninterrupted one would; the sampler needs none (its shuffle is a function of the seed
    and the epoch). One file replaced whole: a crash leaves the previous checkpoint or this one. Its
    content's SHA-256 (state_digest) is saved inside it, for load_checkpoint to verify.
    """
    t0 = time.perf_counter()
    rng = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}
    rngs = [rng]
    if world_size > 1:
        rngs = [None] * world_size
        dist.all_gather_object(rngs, rng)  # DDP: every rank's RNG state, for rank 0 to save
    if rank == 0:
        state = {**position, "model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict(), "rng": rngs,
                 "world_size": world_size, "batch_size": batch_size}
        state[CHECKSUM_KEY] = state_digest(state)  # what load_checkpoint verifies
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda f: torch.save(state, f))
    if world_size > 1:
        dist.barrier()  # DDP: no rank goes on (or dies) before the checkpoint is complete
    return time.perf_counter() - t0


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint at `path`, verified; None if there is none. It is complete by construction (written
    as `checkpoint.pt.tmp`, then renamed): a crash mid-write leaves the `.tmp`, which is never read, and the
    previous checkpoint. What can still go wrong is the file itself, later (a damaged disk, a bad copy): a file
    torch.load cannot read, or whose content no longer matches the SHA-256 saved in it, raises
    ValueError naming it, with the fix. This script keeps one checkpoint, so there is no older one to
    fall back on: resuming from a damaged one would train on (or from) garbage."""
    if not path.is_file():
        return None
    fix = (f"Fix: move it out of {path.parent} (or delete it) to train from the start, or pass another "
           "--checkpoint-dir (on SageMaker: another checkpoint S3 location).")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # whatever a damaged archive or pickle raises: it is unreadable
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        reason = reason.split(". ")[0].rstrip(".")  # PyTorch's first sentence says what; the rest, guesses why
        raise ValueError(f"The checkpoint {path} is damaged: torch.load cannot read it ({reason}). {fix}") from exc
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"The checkpoint {path} is not one this script wrote (no model in it). {fix}")
    saved = state.pop(CHECKSUM_KEY, None)
    if saved is None:
        print(f"The checkpoint {path} has no checksum (an older version of this script wrote it): "
              "it is used unverified.", flush=True)
    elif state_digest(state) != saved:
        raise ValueError(f"The checkpoint {path} is damaged: its content no longer matches the SHA-256 saved in it. "
                         f"{fix}")
    return state


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
CHECKSUM_KEY = "sha256"  # the checkpoint's own digest, saved inside it (state_digest of the rest)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def state_digest(state) -> str:
    """SHA-256 of a checkpoint's content: every tensor's dtype, shape and bytes, every other value's repr,
    dicts in key order. Saved inside the checkpoint and computed again on load, it tells a file whose
    bytes changed after it was written: torch.load checks no checksum of its own, and reads a tensor
    whose bytes were overwritten as if nothing happened (random bytes in a checkpoint gave NaN weights)."""
    digest = hashlib.sha256()

    def feed(value) -> None:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"tensor {tensor.dtype} {tuple(tensor.shape)};".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            digest.update(f"dict {len(value)};".encode())
            for key in sorted(value, key=repr):
                digest.update(f"{key!r}:".encode())
                feed(value[key])
        elif isinstance(value, list | tuple):
            digest.update(f"{type(value).__name__} {len(value)};".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"{value!r};".encode())

    feed(state)
    return digest.hexdigest()


def set_rng_state(rng: dict) -> None:
    torch.set_rng_state(rng["cpu"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def evaluate(model, dataset, rank, world_size, device, batch_size=1000):
    """Exact test loss and accuracy over the whole test set.

    Each rank scores every world_size-th sample (no padding, unlike DistributedSampler's
    default), then the sums are all-reduced, so the numbers match a single-process run.
    """
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


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    rank, world_size, local_rank, local_world_size = distributed_env()

    # The host's CPUs (SM_NUM_CPUS), or fewer if this process may use fewer (a simulated host pinned
    # to its share of a laptop's cores): one thread pool per rank, sized so ranks do not fight.
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpus = min(int(os.environ.get("SM_NUM_CPUS", usable)), usable)
    threads = args.threads or max(1, cpus // local_world_size)
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)

    # Read the data before joining the process group, so a missing channel fails every
    # rank at once with its own message rather than leaving peers waiting in a collective.
    train_set = load_channel(args.train, "train")
    test_set = load_channel(args.test, "test")
    check_args(args, world_size, train_samples=len(train_set))

    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")  # the launcher's LOCAL_RANK, never the global rank
    if cuda:
        torch.cuda.set_device(device)
    backend, why = choose_backend(args.backend, cuda)
    distributed = world_size > 1
    attempt = restart_count()  # 0, or how many times torchrun --max-restarts has restarted the ranks
    if distributed:
        set_gloo_interface(backend)  # DDP: gloo talks over the interface SageMaker names, not a guess
        # DDP: a restarted attempt's ranks meet under keys of their own in torchrun's store
        store_args, attempt = elastic_store(timedelta(minutes=10))
        # DDP: join the process group; torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT say how.
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=10), **store_args)
        attempt = agreed_attempt(attempt, device, distributed)  # DDP: one attempt number on every rank

    lr = args.lr * world_size if args.scale_lr else args.lr
    config = {
        "args": vars(args),
        "world_size": world_size,
        "backend": backend,
        "backend_reason": why,
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "device": str(device),
        "threads_per_rank": threads,
        "global_batch_size": args.batch_size * world_size,
        "effective_lr": lr,
        "train_samples": len(train_set),
        "test_samples": len(test_set),
        "host": os.environ.get("SM_CURRENT_HOST", platform.node()),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if rank == 0:
        print(f"Backend {why}.", flush=True)
        print(
            f"World size {world_size}: global batch {args.batch_size} x {world_size} = "
            f"{args.batch_size * world_size}; learning rate "
            + (f"{args.lr} x {world_size} = {lr:g} (linear scaling rule)" if args.scale_lr else f"{lr:g} (not scaled)"),
            flush=True,
        )
        print("Configuration: " + json.dumps(config, sort_keys=True), flush=True)

    model = Net().to(device)
    if distributed:
        # DDP: wrap the model; construction broadcasts rank 0's weights to every rank, and
        # backward() all-reduces (averages) the gradients, bucket by bucket, overlapped with compute.
        model = DDP(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)

    # DDP: each rank draws a disjoint 1/world_size shard of every (reshuffled) epoch.
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    # A resumed epoch starts mid-way: the sampler's first (batches done x batch size) indices are skipped.
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=SkipFirst(sampler), drop_last=True)

    per_epoch = steps_per_epoch(args, world_size, len(train_set))
    fault = parse_fault(args.fault)  # check_args has checked it
    ckpt_dir = Path(args.checkpoint_dir)
    ckpt_path = ckpt_dir / "checkpoint.pt"
    state = [None]  # rank 0's checkpoint, or (text) why it cannot be resumed from
    if rank == 0:
        clean_stale(ckpt_dir)  # what a killed run left half-written: before anything reads or writes here
        try:
            state = [load_checkpoint(ckpt_path)]
        except ValueError as exc:  # damaged: every rank stops with this message, before training
            state = [str(exc)]
        if attempt == 0 and state[0] is None:  # a fresh start: a fault record left by an earlier run is not this run's
            with contextlib.suppress(FileNotFoundError):
                (ckpt_dir / "fault.json").unlink()
    if distributed:
        # DDP: rank 0's checkpoint reaches every rank, whichever hosts have the file.
        dist.broadcast_object_list(state, src=0)
    if isinstance(state[0], str):
        exit_with(state[0])
    start_epoch, skip, step, rng, recovery = 1, 0, 0, None, None
    if state[0] is not None:
        ckpt = state[0]
        unwrap(model).load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        # The position: `epoch` whole epochs done, then `batch` batches of the next (0 at an epoch's end).
        start_epoch, skip = ckpt["epoch"] + 1, ckpt.get("batch", 0)
        step = ckpt.get("step", ckpt["epoch"] * per_epoch + skip)
        resharded = skip and (ckpt.get("world_size"), ckpt.get("batch_size")) != (world_size, args.batch_size)
        if resharded:  # the same share of the epoch's samples, in batches of this world's shape
            skip = skip * ckpt["world_size"] * ckpt["batch_size"] // (world_size * args.batch_size)
        rngs = ckpt.get("rng") or [None]
        rng = rngs[rank] if len(rngs) == world_size else rngs[0]
        if rank == 0:
            recovery = read_recovery(ckpt_dir, step, attempt)
            announce_resume(ckpt_path, step, recovery)
            if start_epoch > args.epochs:
                print(f"Nothing left to train: the run had already finished. {ckpt_path} holds epoch {ckpt['epoch']} "
                      f"(step {step}) and this run trains --epochs {args.epochs}; its model is evaluated and saved "
                      "as it is.", flush=True)
            elif skip:
                print(f"Resumed from {ckpt_path} in epoch {start_epoch}, after its batch {skip} of {per_epoch}"
                      + (f" (rescaled from a world of {ckpt['world_size']} x {ckpt['batch_size']}: the rest of "
                         "the epoch is split differently)" if resharded else "") + ".", flush=True)
            else:
                print(f"Resumed from {ckpt_path} after epoch {ckpt['epoch']}.", flush=True)
    elif attempt > 0 and rank == 0:
        recovery = read_recovery(ckpt_dir, 0, attempt)
        announce_resume(None, 0, recovery)
    if rng is not None and not skip:
        set_rng_state(rng)  # at an epoch's end: before the next epoch's loader draws its seed, as it did then
        rng = None
    resumed_step = step

    profiler = StepProfiler(args.profile_steps, args.output_dir, rank)  # --profile-steps (0: off)
    scaled = f" (x {world_size} ranks = {lr:g}, --scale-lr)" if args.scale_lr and world_size > 1 else ""
    # DDP: a sum over the ranks, for every rank's first non-finite loss (see Divergence)
    diverged = Divergence(device, rank, world_size, lambda t: dist.all_reduce(t) or t, (
        f"a lower --lr than {args.lr:g}{scaled}, e.g. {build_parser().get_default('lr')} (its default), with an empty "
        "--checkpoint-dir (a run that resumes takes its learning rate from the checkpoint)"))
    test_loss = test_acc = float("nan")
    for epoch in range(start_epoch, args.epochs + 1):
        sampler.set_epoch(epoch)  # DDP: a new shuffle each epoch, the same on every rank
        first = skip + 1 if epoch == start_epoch else 1  # the epoch's first batch still to train on
        loader.sampler.skip = (first - 1) * args.batch_size
        model.train()
        t0 = time.perf_counter()
        seen = 0
        batches = iter(loader)  # draws a seed from the global RNG (unused without workers), every epoch
        if rng is not None:
            set_rng_state(rng)  # mid-epoch: after that draw, where the checkpoint took the state
            rng = None
        profiler.start(epoch)
        for i, (x, y) in zip(range(first, per_epoch + 1), batches, strict=False):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # DDP: gradients are all-reduced here
            optimizer.step()
            profiler.step(len(y))  # --profile-steps: one ProfilerStep ends here
            step += 1
            seen += len(y)
            diverged.note(loss, step)
            if i % args.log_interval == 0:
                # time: wall clock (Unix seconds), to place the steps of every attempt on one time axis
                metrics(rank=rank, epoch=epoch, step=step, train_loss=loss.item(), time=f"{time.time():.3f}")
                diverged.check(step)  # DDP: every rank, at the same step: a NaN loss stops them all
                if rank == 0:
                    write_progress(ckpt_dir, step, attempt)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                diverged.check(step, weights=model)  # never a checkpoint of diverged weights
                took = save_checkpoint(ckpt_path, model, optimizer, {"epoch": epoch - 1, "batch": i, "step": step},
                                       args.batch_size, rank, world_size)
                if rank == 0:
                    metrics(rank=0, step=step, checkpoint_s=took)
            inject_fault(fault, rank, step, ckpt_dir, args.fault, attempt)  # --fault: die here, after this step (and its checkpoint)
            if recovery is not None:  # the first step since the restart
                report_recovery(recovery, resumed_step, step)
                recovery = None
        epoch_time = time.perf_counter() - t0
        profiler.stop()  # an epoch shorter than the profiled window: its trace holds what it had
        if profiler.epoch == epoch and seen > profiler.samples:  # the profiled (slower) steps are left out
            epoch_time, seen = epoch_time - profiler.seconds, seen - profiler.samples
        diverged.check(step, weights=model)  # before the epoch's test and checkpoint
        test_loss, test_acc = evaluate(model, test_set, rank, world_size, device)
        if rank == 0:
            metrics(
                rank=0, epoch=epoch, step=step, test_loss=test_loss, test_accuracy=test_acc,
                epoch_time_s=epoch_time, samples_per_sec=seen * world_size / epoch_time,
            )
        took = save_checkpoint(ckpt_path, model, optimizer, {"epoch": epoch, "batch": 0, "step": step},
                               args.batch_size, rank, world_size)
        if rank == 0:
            metrics(rank=0, step=step, checkpoint_s=took)
    if recovery is not None:  # resumed with no step left to do
        report_recovery(recovery, resumed_step, None)

    if start_epoch > args.epochs:  # resumed a finished run: report the model as it is
        test_loss, test_acc = evaluate(model, test_set, rank, world_size, device)
        if rank == 0:  # the test of the epoch the checkpoint ended, as that epoch's own line
            metrics(rank=0, epoch=start_epoch - 1, step=step, test_loss=test_loss, test_accuracy=test_acc)

    digest = weights_digest(unwrap(model))
    metrics(rank=rank, weights_sha256=digest)
    if distributed:
        digests = [None] * world_size
        dist.all_gather_object(digests, digest)  # DDP: compare every rank's copy of the weights
        identical = len(set(digests)) == 1
    else:
        identical = True
    if rank == 0:
        metrics(rank=0, final_test_accuracy=test_acc, final_test_loss=test_loss, weights_identical=int(identical))
        model_dir = Path(args.model_dir)
        model_dir.mkdir(parents=True, exist_ok=True)
        save_atomic(unwrap(model).state_dict(), model_dir / "model.pt")  # never a torn model.pt
        (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        print(f"Saved the model and its configuration to {model_dir}.", flush=True)
        with contextlib.suppress(FileNotFoundError):  # finished: no step of this run is to be done again
            (ckpt_dir / "progress.json").unlink()

    if distributed:
        # DDP: leave in step. A gloo group destroyed while a peer is already gone aborts
        # that rank at exit (SIGABRT), which a launcher reports as a failed job.
        dist.barrier()
        # DDP: the wrapper holds the process group too; release it first, so the group is
        # torn down here and not during interpreter exit, where gloo's threads can abort the
        # process ("terminate called without an active exception", about 1 run in 25).
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()
    return 0


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DDP) else model


if __name__ == "__main__":
    sys.exit(main())
