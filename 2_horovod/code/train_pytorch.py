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

Inputs follow the SageMaker training contract: hyperparameters as flags, data in the `train`
and `test` channels (`mnist.npz`), the model to SM_MODEL_DIR, checkpoints to
SM_CHECKPOINT_DIR. Ranks come from Horovod (`hvd.rank()`, `hvd.size()`, `hvd.local_rank()`),
which reads them from the HOROVOD_* variables its launcher sets; without a launcher it is a
world of one.

The lines that make it distributed carry a `Horovod:` comment.
Metric lines (`METRICS rank=0 epoch=1 ... test_accuracy=0.97`) are what SageMaker's metric
definitions and the workshop's local log parser read.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

# Shared copy: keep identical in every script that has it (tests/test_copies.py).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
REBUILD_FIX = (
    "Fix: build Horovod with PyTorch support: `make horovod` in the workshop (or "
    "HOROVOD_WITH_PYTORCH=1 when building it yourself); on SageMaker run the job with "
    "workshop.runner.run_on_sagemaker (it installs the wheel built once for the image) "
    "or the image from 2_horovod/docker/Dockerfile."
)


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
        description="Horovod (PyTorch) data-parallel training of a CNN on MNIST; SageMaker contract.",
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
    d.add_argument(
        "--output-dir", default=env("SM_OUTPUT_DATA_DIR", "artifacts/output"),
        help="other output (the --profile-steps traces); SageMaker uploads it with the job's output.tar.gz",
    )
    return p


def check_args(args: argparse.Namespace, world_size: int = 1, train_samples: int | None = None) -> None:
    """Checks the workshop also runs before it starts any process or job (raises ValueError).

    The message names each broken rule, then after "Fix:" what to do about each, so the
    workshop (and a reader of the job's log) can tell the user what to change. (The same rules as
    train_tensorflow.py's, plus --profile-steps, which only this script has.)
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
    if args.max_steps < 0 or args.threads < 0:
        problems.append("--max-steps and --threads must be 0 or more")
        fixes.append("set --max-steps and --threads to 0 (their defaults: whole epochs, an automatic thread count) or more")
    if args.profile_steps < 0:
        problems.append(f"--profile-steps must be 0 (off) or more, got {args.profile_steps}")
        fixes.append("set --profile-steps to 0 (no profiling) or a few steps, e.g. 5")
    elif args.profile_steps and train_samples is not None and world_size >= 1:
        # the first epoch's steps: each rank's DistributedSampler shard (padded) in whole batches, at most --max-steps
        per_epoch = -(-train_samples // world_size) // args.batch_size
        per_epoch = min(per_epoch, args.max_steps) if args.max_steps else per_epoch
        if PROFILE_WAIT + PROFILE_WARMUP + args.profile_steps > per_epoch:
            problems.append(f"--profile-steps {args.profile_steps} after {PROFILE_WAIT + PROFILE_WARMUP} warm-up steps "
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


class HorovodProfile:
    """--profile-steps S, Horovod's part: while StepProfiler records its S steps, Horovod's own timeline
    of them, `<output_dir>/profile/horovod-timeline.json` (rank 0 writes it; open it in
    https://ui.perfetto.dev), and this rank and the world's size in the torch trace (as
    torch.distributed's runs have them), which the report needs. Horovod all-reduces on its own
    background thread, which torch.profiler does not record; the timeline shows each gradient's
    NEGOTIATE_ALLREDUCE and ALLREDUCE there. (hvd.start_timeline needs HOROVOD_TIMELINE=DYNAMIC
    before hvd.init(): main sets it when profiling.)"""

    def __init__(self, hvd, profiler: StepProfiler):
        self.hvd, self.profiler, self.on = hvd, profiler, False
        self.path = profiler.path.with_name("horovod-timeline.json")

    def follow(self) -> None:
        """After each profiler.step() (and its stop()): start with its recorded steps, stop with it."""
        recording = self.profiler.prof is not None and self.profiler.taken >= PROFILE_WAIT + PROFILE_WARMUP
        if recording and not self.on:
            hvd = self.hvd
            controller = "gloo" if hvd.gloo_enabled() else "mpi"
            self.profiler.prof.add_metadata_json("distributedInfo", json.dumps(
                {"backend": f"horovod/{controller}", "rank": hvd.rank(), "world_size": hvd.size()}))
            hvd.start_timeline(str(self.path))  # Horovod: every rank calls it; rank 0 writes the file
            self.on = True
        elif self.on and self.profiler.prof is None:
            self.hvd.stop_timeline()
            self.on = False


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


def import_horovod():
    """`horovod.torch`, or a clear error saying how to get a build that has it."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise SystemExit(f"Horovod's PyTorch support is not importable here ({exc}). {REBUILD_FIX}") from exc
    return hvd


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


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # Read the data before Horovod starts, so a missing channel fails every rank at once with
    # its own message rather than leaving peers waiting in a collective.
    train_set = load_channel(args.train, "train")
    test_set = load_channel(args.test, "test")

    hvd = import_horovod()
    if args.profile_steps:  # Horovod: hvd.start_timeline works later only when this is set before hvd.init()
        os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
    hvd.init()  # Horovod: join the job; rank, size and local rank come from the launcher's HOROVOD_* variables
    rank, size, local_rank, local_size = hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()
    check_args(args, size, train_samples=len(train_set))

    # The host's CPUs (SM_NUM_CPUS), or fewer if this process may use fewer (a simulated host pinned
    # to its share of a laptop's cores): one thread pool per rank, sized so ranks do not fight.
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpus = min(int(os.environ.get("SM_NUM_CPUS", usable)), usable)
    threads = args.threads or max(1, cpus // local_size)
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed + rank)  # different on purpose: the broadcast below must make them equal

    cuda = torch.cuda.is_available() and hvd.nccl_built()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")  # Horovod: one GPU per local rank
    if cuda:
        torch.cuda.set_device(device)
    lr = args.lr * size if args.scale_lr else args.lr  # Horovod: the global batch is size x --batch-size
    config = {
        "args": vars(args),
        "framework": "pytorch",
        "ranks": size,
        "local_ranks": local_size,
        "hosts": hvd.cross_size(),
        "controller": "gloo" if hvd.gloo_enabled() else "mpi",
        "device": str(device),
        "threads_per_rank": threads,
        "global_batch_size": args.batch_size * size,
        "effective_lr": lr,
        "train_samples": len(train_set),
        "test_samples": len(test_set),
        "host": os.environ.get("SM_CURRENT_HOST", platform.node()),
        "torch": torch.__version__,
        "horovod": __import__("horovod").__version__,
        "python": platform.python_version(),
    }
    if rank == 0:
        print(
            f"Horovod {config['horovod']} ({config['controller']} controller): {size} ranks on "
            f"{hvd.cross_size()} host(s); global batch {args.batch_size} x {size} = {args.batch_size * size}; "
            "learning rate "
            + (f"{args.lr} x {size} = {lr:g} (linear scaling rule)" if args.scale_lr else f"{lr:g} (not scaled)"),
            flush=True,
        )
        print("Configuration: " + json.dumps(config, sort_keys=True), flush=True)

    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)

    start_epoch = 1
    ckpt_path = Path(args.checkpoint_dir) / "checkpoint.pt"
    state = None  # rank 0's checkpoint, or (text) why it cannot be resumed from
    if rank == 0:
        clean_stale(args.checkpoint_dir)  # what a killed run left half-written: before anything reads or writes there
        try:
            state = load_checkpoint(ckpt_path)
        except ValueError as exc:  # damaged: every rank stops with this message, before training
            state = str(exc)
    state = hvd.broadcast_object(state, root_rank=0, name="checkpoint")  # Horovod: rank 0's checkpoint, on every host
    if isinstance(state, str):
        exit_with(state)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
        if rank == 0 and start_epoch > args.epochs:
            print(f"Nothing left to train: the run had already finished. {ckpt_path} holds epoch {state['epoch']} and "
                  f"this run trains --epochs {args.epochs}; its model is evaluated and saved as it is.", flush=True)
        elif rank == 0:
            print(f"Resumed from {ckpt_path} after epoch {state['epoch']}.", flush=True)

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
    scaled = f" (x {size} ranks = {lr:g}, --scale-lr)" if args.scale_lr and size > 1 else ""
    # Horovod: a sum over the ranks, for every rank's first non-finite loss (see Divergence)
    diverged = Divergence(device, rank, size, lambda t: hvd.allreduce(t, op=hvd.Sum, name="divergence"), (
        f"a lower --lr than {args.lr:g}{scaled}, e.g. {build_parser().get_default('lr')} (its default), with an empty "
        "--checkpoint-dir (a run that resumes takes its learning rate from the checkpoint)"))
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
                diverged.check(step)  # Horovod: every rank, at the same step: a NaN loss stops them all
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
            Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            checkpoint = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
            checkpoint[CHECKSUM_KEY] = state_digest(checkpoint)  # what load_checkpoint verifies
            save_atomic(checkpoint, ckpt_path)

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


if __name__ == "__main__":
    sys.exit(main())
