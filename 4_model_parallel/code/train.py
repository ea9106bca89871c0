"""Lab 4: sharded data parallelism, checkpointing and offloading on a small GPT, measured exactly.

A byte-level GPT (its size set by --layers, --d-model, --heads, --seq-len) learns to predict the
next character of real English text: the reference topics of CPython's own documentation, which
ship inside the standard library as `pydoc_data.topics` (what `help("with")` prints). The host
side writes them as the `train` and `test` channels (`corpus.txt`; see workshop/datasets/corpus.py);
this script reads them from SM_CHANNEL_TRAIN / SM_CHANNEL_TEST like every lab.

One flag per technique (see `--help`):
  --sharding no_shard        plain data parallel (DDP): every rank holds all of the state
  --sharding optimizer       ZeRO-1: DDP + ZeroRedundancyOptimizer, optimizer state split over ranks
  --sharding shard_grad_op   ZeRO-2-like: FSDP2 with reshard_after_forward=False (gradients and
                             optimizer state sharded; parameters stay gathered from forward to backward)
  --sharding full_shard      ZeRO-3: FSDP2, parameters re-sharded after each block's forward too
  --sharding hybrid_shard    FSDP2 on a 2-D mesh: shard within groups of --hybrid-shard-degree
                             ranks, replicate across groups (SMP's hybrid_shard_degree)
  --activation-checkpointing keep only each block's input; recompute the block in backward
  --activation-offloading    cpu: move saved activations to host memory (needs a GPU);
                             simulate: the same hooks, copying into a separate host buffer
  --mixed-precision          bf16 where the device supports it (auto: CUDA with bf16), else fp32

Every rank measures what it holds: bytes of parameters, gradients and optimizer state (from the
local shards of FSDP2's DTensors), bytes of activations saved for backward (counted by a
`torch.autograd.graph.saved_tensors_hooks` pair, one count per storage), time per step, and on a
GPU `torch.cuda.max_memory_allocated`. It prints them as `METRICS` lines.

Run it (from the lab folder; prepare the channels once with `python -m workshop.datasets.corpus data/corpus`):

    python code/train.py --train data/corpus/train --test data/corpus/test
    torchrun --nproc-per-node 2 code/train.py --sharding full_shard ...
    python -m workshop run model_parallel               # 2 simulated SageMaker hosts
    # On SageMaker: ModelTrainer(distributed=Torchrun()) on the PyTorch image (see the notebook).

Given `SMP(...)` settings (--mp_parameters, also in SM_DISTRIBUTED_CONFIG; the opt-in SMP route), it
maps them onto its own flags (hybrid sharding degree; checkpointing + offloading) and, on the
SageMaker model-parallel image (`torch.sagemaker` importable), also calls `tsm.init()` with them.
The sharding itself is always PyTorch's FSDP2: SMP's own implementation hooks PyTorch's FSDP1
`FullyShardedDataParallel`, which this script does not use, so SMP's code paths are not exercised.
gloo on CPU, nccl on GPUs. The lines that make it distributed carry a `DIST:` comment.

Fault tolerance (under `torchrun --max-restarts K`, which restarts every rank when one dies): with
`--checkpoint-every N` every rank writes its own shard of the model and the AdamW state with
torch.distributed.checkpoint every N steps and after the last, into `step-<N>.partial/`, which rank 0
renames to `step-<N>/` once all are in, then points `latest` at it (see "sharded checkpoints"
below). A run resumes from the newest complete checkpoint in --checkpoint-dir whose files match their
checksums (a damaged one is reported and passed over for an older one), at any world size (DCP reshards), with the data generator where it was, so it trains on the batches an uninterrupted run
would; it prints `resumed from <checkpoint> at step <N> (restart <k>)` and, after its first step,
`METRICS ... resumed_step=N lost_steps=L recover_s=S`. `--fault kill-rank=R@step=N` (default: the
environment variable WORKSHOP_FAULT) makes rank R SIGKILL itself after step N (and that step's
checkpoint, if one is due), on the first attempt only. A NaN or infinite loss stops every rank before it is
checkpointed (see `Divergence`). The default, --checkpoint-every 0, writes no checkpoint, so the measurements stay free of
checkpoint I/O. On several hosts, every rank must see the same checkpoint folder (a shared file
system, as the local cluster's is) for a restart within the job to find every shard.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import math
import os
import platform
import re
import shutil
import signal
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

VOCAB = 256  # bytes: no tokenizer to download, every character of the corpus is representable
SHARDINGS = ("no_shard", "optimizer", "shard_grad_op", "full_shard", "hybrid_shard")
FSDP_SHARDINGS = ("shard_grad_op", "full_shard", "hybrid_shard")
CORPUS_FILE = "corpus.txt"
SMP_KEYS = ("hybrid_shard_degree", "sm_activation_offloading", "activation_loading_horizon",
            "fsdp_cache_flush_warnings", "allow_empty_shards", "tensor_parallel_degree",
            "context_parallel_degree", "expert_parallel_degree", "random_seed")


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def str2bool(text: str) -> bool:
    """SageMaker passes every hyperparameter as text, so booleans arrive as 'true'/'false'."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def json_dict(text: str) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


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
        description="Sharded data-parallel training of a small byte-level GPT, with exact memory accounting.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    m = p.add_argument_group("model")
    m.add_argument("--layers", type=int, default=4, help="transformer blocks")
    m.add_argument("--d-model", type=int, default=128, help="width of the residual stream")
    m.add_argument("--heads", type=int, default=4, help="attention heads (must divide --d-model)")
    m.add_argument("--seq-len", type=int, default=64, help="characters of context per sequence")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=300, help="optimizer steps")
    g.add_argument(
        "--batch-size", type=int, default=16,
        help="sequences per step in all (the GLOBAL batch): split over the data-parallel ranks, so "
             "every world size and technique trains on exactly the same data",
    )
    g.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    g.add_argument("--seed", type=int, default=1, help="seed for the weights and the batches")
    g.add_argument("--log-interval", type=int, default=25, help="steps between train-loss lines")
    g.add_argument("--eval-sequences", type=int, default=32, help="test sequences scored at the end")
    g.add_argument(
        "--threads", type=int, default=0,
        help="CPU threads per rank (0: this host's CPUs divided by its ranks)",
    )
    g.add_argument(
        "--backend", choices=("auto", "gloo", "nccl"), default="auto",
        help="process-group backend; auto: nccl on GPUs, gloo on CPU",
    )
    g.add_argument(
        "--checkpoint-every", type=int, default=0,
        help="write a sharded checkpoint (torch.distributed.checkpoint: each rank its own shard) every this "
             "many steps and after the last one, and resume from the newest one (0: none; the measurements "
             "stay free of checkpoint I/O)",
    )
    g.add_argument(
        "--profile-steps", type=int, default=0,
        help=f"torch.profiler on every rank for this many steps, after {PROFILE_WAIT} + {PROFILE_WARMUP} steps of "
             "warm-up; one Chrome/Perfetto trace per rank in --output-dir/profile/ (0: off)",
    )
    g.add_argument(
        "--fault", default=env(FAULT_ENV, ""), metavar="kill-rank=R@step=N",
        help="fault injection: global rank R kills itself (SIGKILL) right after global step N, on the first "
             "attempt only, to show a torchrun --max-restarts recovery (default: $WORKSHOP_FAULT; empty: none)",
    )
    s = p.add_argument_group("memory techniques")
    s.add_argument(
        "--sharding", choices=SHARDINGS, default="full_shard",
        help="no_shard: DDP; optimizer: ZeRO-1 (ZeroRedundancyOptimizer); shard_grad_op: FSDP2, "
             "params kept gathered between forward and backward; full_shard: FSDP2, params re-sharded "
             "after forward; hybrid_shard: FSDP2 within groups of --hybrid-shard-degree, replicated across",
    )
    s.add_argument(
        "--hybrid-shard-degree", type=int, default=0,
        help="ranks per sharding group for hybrid_shard (0: the processes of one host)",
    )
    s.add_argument("--activation-checkpointing", type=str2bool, default=False,
                   help="checkpoint each block: save only its input, recompute it in backward")
    s.add_argument(
        "--activation-offloading", choices=("off", "cpu", "simulate"), default="off",
        help="cpu: saved activations go to host memory until backward (needs a GPU: on a CPU they "
             "already are in host memory); simulate: the same hooks copy them into a separate host buffer",
    )
    s.add_argument("--mixed-precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto: bf16 on CUDA GPUs that support it, fp32 elsewhere")
    s.add_argument(
        "--mp_parameters", type=json_dict, default=None,
        help="SageMaker model parallelism (SMP v2) settings as JSON; the SDK's Torchrun(smp=SMP(...)) "
             "passes them (hybrid_shard_degree, sm_activation_offloading, activation_loading_horizon)",
    )
    d = p.add_argument_group("SageMaker contract (defaults from SM_* variables)")
    d.add_argument("--train", default=env("SM_CHANNEL_TRAIN", "data/corpus/train"), help="train channel")
    d.add_argument("--test", default=env("SM_CHANNEL_TEST", "data/corpus/test"), help="test channel")
    d.add_argument("--model-dir", default=env("SM_MODEL_DIR", "artifacts/model"), help="where rank 0 writes the model")
    d.add_argument(
        "--checkpoint-dir", default=env("SM_CHECKPOINT_DIR", "artifacts/checkpoints"),
        help="step-<N>/ checkpoints and the `latest` pointer (--checkpoint-every); resume from the newest complete one",
    )
    d.add_argument(
        "--output-dir", default=env("SM_OUTPUT_DATA_DIR", "artifacts/output"),
        help="other output (the --profile-steps traces); SageMaker uploads it with the job's output.tar.gz",
    )
    return p


def smp_settings(args: argparse.Namespace) -> dict:
    """The SMP(...) settings: --mp_parameters, else SM_DISTRIBUTED_CONFIG's "smp" (SDK v3)."""
    if args.mp_parameters:
        return dict(args.mp_parameters)
    with contextlib.suppress(ValueError, TypeError):
        return dict(json.loads(os.environ.get("SM_DISTRIBUTED_CONFIG", "{}")).get("smp") or {})
    return {}


def apply_smp(args: argparse.Namespace, smp: dict) -> list[str]:
    """Map the SMP settings onto this script's flags (same work with or without the library)."""
    notes = []
    degree = smp.get("hybrid_shard_degree")
    if degree:
        args.sharding, args.hybrid_shard_degree = "hybrid_shard", int(degree)
        notes.append(f"SMP hybrid_shard_degree={degree}: hybrid sharding over groups of {degree} ranks")
    if smp.get("sm_activation_offloading"):
        args.activation_checkpointing = True  # SMP offloads the inputs of checkpointed blocks
        args.activation_offloading = "cpu"
        notes.append("SMP sm_activation_offloading: checkpointed blocks, their inputs offloaded to host memory")
    return notes


def shard_group_size(args: argparse.Namespace, world_size: int, procs_per_host: int = 1) -> int:
    """How many ranks split each parameter (1: nothing sharded)."""
    if args.sharding in ("shard_grad_op", "full_shard"):
        return world_size
    if args.sharding == "hybrid_shard":
        return args.hybrid_shard_degree or max(1, min(procs_per_host, world_size))
    return 1


def check_args(args: argparse.Namespace, world_size: int = 1, train_samples: int | None = None,
               procs_per_host: int = 1, fault: str | None = None) -> None:
    """Checks the workshop also runs before it starts any process or job (raises ValueError).

    `train_samples` is the number of characters in the train channel. The message names each
    broken rule, then after "Fix:" what to do about each. `fault` is the fault to check (None:
    --fault, whose default is the environment variable WORKSHOP_FAULT).
    """
    parser = build_parser()
    default = parser.get_default
    problems, fixes = nonfinite_problems(args, parser)
    if problems:  # NaN passes every comparison below (nan <= 0 is False): refused first, on its own
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")
    for name in ("layers", "d_model", "heads", "seq_len", "steps", "batch_size", "log_interval", "eval_sequences"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            problems.append(f"{flag} must be at least 1, got {getattr(args, name)}")
            fixes.append(f"set {flag} to a whole number of at least 1, e.g. {default(name)} (its default)")
    if args.lr <= 0:
        problems.append(f"--lr must be positive, got {args.lr}")
        fixes.append(f"set --lr to a positive number, e.g. {default('lr')} (its default)")
    if args.threads < 0 or args.hybrid_shard_degree < 0 or args.checkpoint_every < 0:
        problems.append("--threads, --hybrid-shard-degree and --checkpoint-every must be 0 or more")
        fixes.append("set --threads, --hybrid-shard-degree and --checkpoint-every to 0 (their defaults) or more")
    profile_steps = getattr(args, "profile_steps", 0)
    if profile_steps < 0:
        problems.append(f"--profile-steps must be 0 (off) or more, got {profile_steps}")
        fixes.append("set --profile-steps to 0 (no profiling) or a few steps, e.g. 5")
    elif profile_steps and PROFILE_WAIT + PROFILE_WARMUP + profile_steps >= args.steps:
        problems.append(f"--profile-steps {profile_steps} after {PROFILE_WAIT + PROFILE_WARMUP} warm-up steps leaves "
                        f"no unprofiled step of --steps {args.steps} to time")
        fixes.append(f"set --steps to {PROFILE_WAIT + PROFILE_WARMUP + profile_steps + 2} or more, or --profile-steps lower")
    if problems:
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")
    smp = smp_settings(args)
    unknown = sorted(set(smp) - set(SMP_KEYS))
    if unknown:
        problems.append(f"--mp_parameters has unknown SMP settings {unknown} (known: {', '.join(SMP_KEYS)})")
        fixes.append(f"drop {', '.join(unknown)} from --mp_parameters")
    for key in ("tensor_parallel_degree", "context_parallel_degree", "expert_parallel_degree"):
        if smp.get(key, 1) not in (None, 0, 1):
            problems.append(f"SMP {key}={smp[key]} is not used by this lab's model")
            fixes.append(f"set {key} to 1 or leave it out")
    degree = smp.get("hybrid_shard_degree") or (args.hybrid_shard_degree if args.sharding == "hybrid_shard" else 0)
    if degree and world_size % degree:
        problems.append(
            f"a sharding degree of {degree} does not divide the world size {world_size}: hybrid sharding "
            f"needs whole groups of {degree} ranks"
        )
        fixes.append(f"choose a degree among {[d for d in range(1, world_size + 1) if world_size % d == 0]}")
    if args.d_model % args.heads:
        problems.append(f"--heads {args.heads} does not divide --d-model {args.d_model}")
        divisors = [h for h in range(1, min(args.d_model, 64) + 1) if args.d_model % h == 0]
        fixes.append(f"set --heads to a divisor of {args.d_model}, one of {divisors}, or --d-model to a "
                     f"multiple of {args.heads}, e.g. {args.heads * max(1, round(args.d_model / args.heads))}")
    if args.batch_size % world_size:
        problems.append(f"--batch-size {args.batch_size} (the global batch) does not split evenly over {world_size} ranks")
        fixes.append(f"set --batch-size to a multiple of {world_size}, e.g. {world_size * max(1, args.batch_size // world_size)}")
    shard = degree or shard_group_size(args, world_size, procs_per_host)
    if shard > 1 and not problems:
        rows = min(args.d_model, args.seq_len, VOCAB)  # FSDP splits every parameter along its first dimension
        if rows < shard or args.d_model % shard or args.seq_len % shard:
            problems.append(
                f"the model is too small to shard over {shard} ranks: FSDP splits each parameter along "
                f"its first dimension (--d-model {args.d_model}, --seq-len {args.seq_len} rows), which must "
                f"be a multiple of {shard} so that every rank holds an equal, non-empty share"
            )
            fixes.append(f"a larger --d-model and --seq-len (multiples of {shard}), or fewer ranks")
    if train_samples is not None and train_samples < args.seq_len + 2:
        problems.append(f"the train channel has {train_samples} characters, fewer than one sequence")
        fixes.append(f"set --seq-len to {max(1, train_samples - 2)} or less, or train on a larger corpus")
    if args.checkpoint_every and args.sharding == "optimizer" and world_size > 1:
        problems.append("--checkpoint-every with --sharding optimizer: ZeroRedundancyOptimizer's state is not one "
                        "torch.distributed.checkpoint can save without gathering it on one rank first")
        fixes.append("checkpoint with --sharding full_shard, shard_grad_op, hybrid_shard or no_shard, or set "
                     "--checkpoint-every 0")
    more, fault_fixes = fault_problems(getattr(args, "fault", None) if fault is None else fault, world_size, args.steps)
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

_REGION = ["outside"]  # where the forward pass is, for the activation accounting ("block" or "outside")


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP, each with a residual."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, seq_len: int):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.checkpointing = False

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            _REGION[0] = "block"
            if self.checkpointing:
                # keep only the block's input; its inside is recomputed during backward
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
            _REGION[0] = "outside"
        return self.head(self.ln_f(x))


def load_corpus(channel_dir: str, name: str) -> torch.Tensor:
    path = Path(channel_dir) / CORPUS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"The {name!r} channel has no {CORPUS_FILE} at {path}. Fix: prepare the text with "
            f"`python -m workshop.datasets.corpus DIR` and pass --{name} DIR/{name} (locally), or "
            f"give the job a {name!r} input channel (SageMaker; the notebook uploads it)."
        )
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long()


def batch(data: torch.Tensor, n: int, seq_len: int, generator: torch.Generator):
    starts = torch.randint(0, len(data) - seq_len - 1, (n,), generator=generator)
    x = torch.stack([data[s : s + seq_len] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + seq_len + 1] for s in starts.tolist()])
    return x, y


# ----------------------------------------------------------------------------- accounting


def local_bytes(t: torch.Tensor | None) -> int:
    """Bytes this rank holds for `t`: the local shard of a DTensor, else the whole tensor."""
    if t is None:
        return 0
    if hasattr(t, "to_local"):  # DTensor (FSDP2): only this rank's shard is stored here
        t = t.to_local()
    return t.numel() * t.element_size()


def optimizer_state_bytes(optimizer) -> int:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard in .optim
    return sum(local_bytes(v) for state in inner.state.values() for v in state.values() if torch.is_tensor(v))


class SavedTensorMeter:
    """saved_tensors_hooks that count (and optionally offload) what autograd keeps for backward.

    Counts each storage once (views of one tensor share it), skips parameters (they are state,
    counted above, not activations), and splits the bytes by region: inside the blocks or outside.
    `offload`: "cpu" moves each saved tensor to pinned host memory and back in backward
    (what torch.autograd.graph.save_on_cpu does); "simulate" copies it into a separate host
    buffer the same way, so the mechanism and its cost are visible on a CPU-only machine.
    """

    def __init__(self, offload: str = "off"):
        self.offload = offload
        self.seen: set[int] = set()
        self.bytes = {"block": 0, "outside": 0}
        self.offloaded_bytes = 0

    def pack(self, t: torch.Tensor):
        base = t._base if t._base is not None else t  # linear layers save weight.t(), a view
        if isinstance(base, nn.Parameter) or (base.is_leaf and base.requires_grad):
            return t  # a parameter (or a view of one): state, not an activation
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in self.seen:
            self.seen.add(key)
            self.bytes[_REGION[0]] += storage.nbytes()
        if self.offload == "off" or t.numel() == 0:
            return t
        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=t.is_cuda)
        host.copy_(t, non_blocking=t.is_cuda)
        self.offloaded_bytes += t.numel() * t.element_size()
        return (t.device, host)

    @staticmethod
    def unpack(packed):
        if isinstance(packed, tuple):
            device, host = packed
            return host.to(device, non_blocking=True) if device.type != "cpu" else host.clone()
        return packed

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    @property
    def total(self) -> int:
        return self.bytes["block"] + self.bytes["outside"]


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


def fsdp_api():
    """FSDP2's fully_shard: torch.distributed.fsdp (2.6+), or its 2.5 home (the SMP v2 image)."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def init_smp(smp: dict, rank: int) -> bool:
    """tsm.init(config) on the SageMaker model-parallel image; False where the library is absent."""
    try:
        import torch.sagemaker as tsm  # only on the SMP v2 image
    except ImportError:
        return False
    tsm.init(smp)  # DIST: SMP v2 reads the same settings the SDK's SMP(...) config carries
    if rank == 0:
        print(f"torch.sagemaker (SMP v2) initialised with {json.dumps(smp, sort_keys=True)}", flush=True)
    return True


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def metrics(**values) -> None:
    """One `METRICS key=value ...` line, rank first: what SageMaker's metric definitions and the
    workshop's log parser (workshop/metrics.py) read."""
    parts = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"METRICS {parts}", flush=True)


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


def wrap_model(model, args, world_size, local_world_size, device, dtype, cuda):
    """Apply the chosen sharding; returns (model, shard_group_size, description)."""
    if world_size == 1:
        return model, 1, "single process (one rank: nothing to shard or replicate)"
    if args.sharding in FSDP_SHARDINGS:
        from torch.distributed.device_mesh import init_device_mesh

        fully_shard, MixedPrecisionPolicy = fsdp_api()
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if args.sharding == "hybrid_shard":
            degree = shard_group_size(args, world_size, local_world_size)
            # DIST: 2-D mesh: shard within groups of `degree` ranks, replicate across the groups
            mesh = init_device_mesh(device.type, (world_size // degree, degree), mesh_dim_names=("replicate", "shard"))
            how = f"hybrid: {world_size // degree} replica group(s) x {degree} shards"
        else:
            degree = world_size
            mesh = init_device_mesh(device.type, (world_size,))  # DIST: every rank holds 1/N of each parameter
            how = f"{degree} shards"
        # DIST: full_shard frees each block's gathered parameters after its forward (ZeRO-3);
        # shard_grad_op keeps them until backward (ZeRO-2: less communication, more memory).
        reshard = args.sharding != "shard_grad_op"
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)  # DIST: one all-gather unit per block
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)  # DIST: embeddings, final norm, head
        return model, degree, f"FSDP2 fully_shard ({how}, reshard_after_forward={reshard})"
    from torch.nn.parallel import DistributedDataParallel as DDP

    # DIST: full replica per rank; gradients all-reduced in backward. gradient_as_bucket_view:
    # the gradients live in DDP's buckets, so they are counted once, as they are stored.
    model = DDP(model, device_ids=[device.index] if cuda else None, gradient_as_bucket_view=True)
    zero = " + ZeroRedundancyOptimizer (ZeRO-1)" if args.sharding == "optimizer" else ""
    return model, 1, "DDP (full replica per rank)" + zero


def build_optimizer(model, args, world_size):
    if args.sharding == "optimizer" and world_size > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        # DIST: ZeRO-1: each rank keeps AdamW state for its share of the parameters only and
        # broadcasts its updated parameters after the step
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=args.lr)
    return torch.optim.AdamW(model.parameters(), lr=args.lr)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    rank, world_size, local_rank, local_world_size = distributed_env()
    smp = smp_settings(args)
    smp_notes = apply_smp(args, smp) if smp else []
    cuda = torch.cuda.is_available()
    if smp.get("sm_activation_offloading") and not cuda:
        # SMP settings are meant for GPU instances; here (a simulated host) there is no device
        # memory to offload from, so the same hooks run in "simulate" mode and say so.
        args.activation_offloading = "simulate"
        smp_notes.append("no GPU on this host: activation offloading runs in simulate mode")
    if args.activation_offloading == "cpu" and not cuda:
        raise SystemExit(
            "--activation-offloading cpu needs a GPU: offloading moves activations from device memory to "
            "host memory, and on a CPU-only machine they are in host memory already, so nothing would be "
            "freed. Fix: --activation-offloading simulate (the same hooks, copying into a separate host "
            "buffer, to measure what would move and what it costs), or run on a GPU instance."
        )

    # The host's CPUs (SM_NUM_CPUS), or fewer if this process may use fewer (a simulated host pinned
    # to its share of a laptop's cores): one thread pool per rank, sized so ranks do not fight.
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpus = min(int(os.environ.get("SM_NUM_CPUS", usable)), usable)
    torch.set_num_threads(args.threads or max(1, cpus // local_world_size))

    # Read the data before joining the process group: a missing channel fails every rank at once.
    train = load_corpus(args.train, "train")
    test = load_corpus(args.test, "test")
    check_args(args, world_size, train_samples=len(train), procs_per_host=local_world_size)

    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")  # LOCAL_RANK, never the global rank
    if cuda:
        torch.cuda.set_device(device)
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    distributed = world_size > 1
    attempt = restart_count()  # 0, or how many times torchrun --max-restarts has restarted the ranks
    if distributed:
        set_gloo_interface(backend)  # DIST: gloo talks over the interface SageMaker names, not a guess
        # DIST: a restarted attempt's ranks meet under keys of their own in torchrun's store
        store_args, attempt = elastic_store(timedelta(minutes=10))
        # DIST: join the process group; torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT say how
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=10), **store_args)
        attempt = agreed_attempt(attempt, device, distributed)  # DIST: one attempt number on every rank
    smp_library = init_smp(smp, rank) if smp else False
    use_bf16 = args.mixed_precision == "bf16" or (
        args.mixed_precision == "auto" and cuda and torch.cuda.is_bf16_supported()
    )
    dtype = torch.bfloat16 if use_bf16 else torch.float32

    torch.manual_seed(args.seed)  # the same initial weights on every rank (and every technique)
    model = GPT(args.layers, args.d_model, args.heads, args.seq_len).to(device)
    model.checkpointing = args.activation_checkpointing
    n_params = sum(p.numel() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    model, shard, how = wrap_model(model, args, world_size, local_world_size, device, dtype, cuda)
    optimizer = build_optimizer(model, args, world_size)
    # DDP and ZeRO-1 run the model in autocast for bf16; FSDP2 casts via its MixedPrecisionPolicy.
    fsdp = how.startswith("FSDP2")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 and not fsdp else contextlib.nullcontext()

    micro = args.batch_size // world_size
    replicas = world_size // shard
    config = {
        "args": {k: v for k, v in vars(args).items()}, "world_size": world_size, "backend": backend,
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "device": str(device), "technique": how, "shard_group_size": shard, "data_parallel_replicas": replicas,
        "sequences_per_rank": micro, "parameters": n_params, "dtype": str(dtype).replace("torch.", ""),
        "smp": smp, "smp_library": smp_library, "torch": torch.__version__, "python": platform.python_version(),
        "host": os.environ.get("SM_CURRENT_HOST", platform.node()),
        "corpus": f"pydoc_data.topics (CPython {platform.python_version()} docs): {len(train)} train / {len(test)} test characters",
    }
    if rank == 0:
        for note in smp_notes:
            print(note, flush=True)
        if smp and not smp_library:
            print("torch.sagemaker is not installed here (not the SMP image): plain PyTorch applies the same "
                  "SMP settings.", flush=True)
        print(f"{n_params:,} parameters; {how}; backend {backend}; {dtype}; global batch {args.batch_size} = "
              f"{micro} sequence(s) x {world_size} rank(s)", flush=True)
        print("Configuration: " + json.dumps(config, sort_keys=True, default=str), flush=True)

    gen = torch.Generator().manual_seed(args.seed)  # the same batches on every rank; each takes its slice
    step_times, last_loss = [], 0.0
    measured = {}
    start, recovery, fault = 0, None, parse_fault(args.fault)  # check_args has checked it
    ckpt_dir = Path(args.checkpoint_dir)
    found = [None]  # rank 0's choice of checkpoint, as (its name, its meta.pt), or (text) why none can be used
    if rank == 0:
        clean_stale(ckpt_dir)  # what a killed run left half-written: before anything reads or writes here
        damaged = []
        path = find_checkpoint(ckpt_dir, damaged)
        for folder, why in damaged:
            print(f"The checkpoint {folder} is damaged: {why}. Training does not resume from it.", flush=True)
        if damaged and path is not None:
            print(f"Resuming from the older checkpoint {path} instead, the newest intact one.", flush=True)
        if attempt == 0 and path is None:  # a fresh start: a fault record left by an earlier run is not this run's
            with contextlib.suppress(FileNotFoundError):
                (ckpt_dir / "fault.json").unlink()
        if path is not None:
            found = [(path.name, torch.load(path / "meta.pt", map_location="cpu", weights_only=True))]
        elif damaged:  # resuming was asked for (there are checkpoints), and none can be trusted
            names = "; ".join(f"{folder.name}: {why}" for folder, why in damaged)
            found = [f"No intact checkpoint to resume from in {ckpt_dir} ({names}). Fix: move the damaged "
                     "checkpoint(s) out of it (or delete them) to train from the start, or pass another "
                     "--checkpoint-dir (on SageMaker: another checkpoint S3 location)."]
    if distributed:
        dist.broadcast_object_list(found, src=0)  # DIST: rank 0 decides which checkpoint every rank loads
    if isinstance(found[0], str):
        exit_with(found[0])
    if found[0] is not None:
        name, meta = found[0]
        path = ckpt_dir / name  # each rank's own path to it (SM_CHECKPOINT_DIR may differ between hosts)
        if meta["model"] != model_shape(args):
            raise SystemExit(
                f"The checkpoint {path} holds a model of shape {meta['model']}; this run builds {model_shape(args)}. "
                "Fix: pass the model flags it was written with, or another --checkpoint-dir (or empty this one)."
            )
        if args.sharding == "optimizer" and distributed:
            raise SystemExit(
                f"The checkpoint {path} cannot be loaded into ZeroRedundancyOptimizer (--sharding optimizer), whose "
                "state torch.distributed.checkpoint does not reshard. Fix: resume with --sharding full_shard, "
                "shard_grad_op, hybrid_shard or no_shard, or pass another --checkpoint-dir."
            )
        load_checkpoint(path, model, optimizer)  # DIST: each rank reads what its shards need (resharding)
        gen.set_state(meta["generator"])  # the batches an uninterrupted run would draw next
        torch.set_rng_state(meta["torch_rng"])
        start, last_loss = meta["step"], meta["last_loss"]
        if rank == 0:
            recovery = read_recovery(ckpt_dir, start, attempt)
            announce_resume(path, start, recovery)
            if start >= args.steps:
                print(f"Nothing left to train: the run had already finished. {path} holds step {start} and this "
                      f"run trains --steps {args.steps}; its model is evaluated and saved as it is.", flush=True)
            if meta["world_size"] != world_size:
                print(f"The checkpoint was written by {meta['world_size']} rank(s); torch.distributed.checkpoint "
                      f"resharded it over {world_size}.", flush=True)
    elif attempt > 0 and rank == 0:
        recovery = read_recovery(ckpt_dir, 0, attempt)
        announce_resume(None, 0, recovery)
    track = args.checkpoint_every > 0 or fault is not None  # progress records only where they can be used
    # DIST: a sum over the ranks, for every rank's first non-finite loss (see Divergence)
    diverged = Divergence(device, rank, world_size, lambda t: dist.all_reduce(t) or t, (
        f"a lower --lr than {args.lr:g}, e.g. {build_parser().get_default('lr')} (its default), with an empty "
        "--checkpoint-dir (a run that resumes takes its learning rate from the checkpoint)"))
    profiler = StepProfiler(args.profile_steps, args.output_dir, rank)  # --profile-steps (0: off)
    profiler.start(1)
    for step in range(start + 1, args.steps + 1):
        profiled = profiler.prof is not None  # the step_time_s metric leaves profiled (slower) steps out
        x, y = batch(train, args.batch_size, args.seq_len, gen)
        x, y = x[rank * micro : (rank + 1) * micro].to(device), y[rank * micro : (rank + 1) * micro].to(device)  # DIST: this rank's slice
        measure = step == min(start + 2, args.steps)  # the first step warms up the allocator and caches
        if measure and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        meter = SavedTensorMeter(args.activation_offloading)
        with meter.hooks(), autocast:
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))
        if measure:
            inner = model.module if hasattr(model, "module") else model
            after_forward = sum(local_bytes(p) for p in inner.parameters())
        loss.backward()  # DIST: DDP all-reduces / FSDP reduce-scatters the gradients here
        if measure:
            grads = sum(local_bytes(p.grad) for p in model.parameters())
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        if not profiled:
            step_times.append(time.perf_counter() - t0)
        loss_value = loss.detach()
        diverged.note(loss_value, step)
        if distributed:
            dist.all_reduce(loss_value)  # DIST: the mean loss over the global batch
            loss_value /= world_size
        last_loss = loss_value.item()
        profiler.step(len(x))  # --profile-steps: one ProfilerStep ends here
        if measure:
            measured = dict(
                param_bytes=sum(local_bytes(p) for p in model.parameters()),
                grad_bytes=grads, optim_bytes=optimizer_state_bytes(optimizer),
                params_after_forward_bytes=after_forward,
                saved_act_bytes=meter.total, saved_act_block_bytes=meter.bytes["block"],
                saved_act_outside_bytes=meter.bytes["outside"], offloaded_bytes=meter.offloaded_bytes,
            )
            if cuda:
                measured["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
        if step % args.log_interval == 0 or step == args.steps:
            if rank == 0:
                metrics(rank=0, step=step, train_loss=last_loss)
                if track:
                    write_progress(ckpt_dir, step, attempt)
        if not math.isfinite(last_loss):  # the mean over every rank: each sees it, and stops (with which rank)
            diverged.check(step)
        if args.checkpoint_every and (step % args.checkpoint_every == 0 or step == args.steps):
            diverged.check(step, weights=model)  # never a checkpoint of diverged weights
            position = {"step": step, "generator": gen.get_state(), "torch_rng": torch.get_rng_state(),
                        "last_loss": last_loss, "model": model_shape(args), "world_size": world_size,
                        "sharding": args.sharding}
            save_checkpoint(ckpt_dir, step, model, optimizer, position, rank, distributed)
        inject_fault(fault, rank, step, ckpt_dir, args.fault, attempt)  # --fault: die here, after this step (and its checkpoint)
        if recovery is not None:  # the first step since the restart
            report_recovery(recovery, start, step)
            recovery = None
    profiler.stop()
    if recovery is not None:  # resumed with no step left to do
        report_recovery(recovery, start, None)
    if start < args.steps:
        diverged.check(args.steps, weights=model)  # not a diverged model saved as the result either

    test_loss, test_acc = evaluate(model, test, args, device, autocast)
    per_param = 4 + 4 + 8  # fp32 parameter + fp32 gradient + AdamW's exp_avg and exp_avg_sq
    full_state = n_params * per_param + n_tensors * 4  # + AdamW's fp32 `step` per tensor
    if measured:  # not when a resumed run had no step left to measure
        state = measured["param_bytes"] + measured["grad_bytes"] + measured["optim_bytes"]
        timed = step_times[1:] or step_times
        metrics(
            rank=rank, world_size=world_size, sharding=args.sharding, shard_group=shard,
            checkpointing=int(args.activation_checkpointing), offloading=args.activation_offloading,
            **measured, state_bytes=state, full_state_bytes=full_state, ideal_state_bytes=full_state // shard,
            block_input_bytes=args.layers * micro * args.seq_len * args.d_model * 4,
            step_time_s=sum(timed) / len(timed),
        )
    if rank == 0:
        perplexity = math.exp(test_loss) if test_loss < 700 else math.inf  # exp overflows a float past ~709.8
        metrics(rank=0, final_train_loss=last_loss, test_loss=test_loss, test_accuracy=test_acc, perplexity=perplexity)
        print(f"final next-character test accuracy: {test_acc:.4f} (loss {test_loss:.4f}, perplexity "
              f"{perplexity:.2f})", flush=True)
    save_model(model, args, config, rank)
    if rank == 0:
        with contextlib.suppress(FileNotFoundError):  # finished: no step of this run is to be done again
            (ckpt_dir / "progress.json").unlink()
    if distributed:
        # DIST: leave in step, so no rank tears the group down while a peer still needs it
        dist.barrier()
        # DIST: the wrapped model and a sharded optimizer hold the process group too; release
        # them first, so gloo is torn down here and not during interpreter exit (where its
        # threads can abort the process: "terminate called without an active exception").
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()
    return 0


def evaluate(model, test, args, device, autocast):
    """Loss and next-character accuracy on fixed test windows, the same on every rank.

    Every rank scores all of them: with FSDP each forward needs every rank's shards anyway.
    """
    gen = torch.Generator().manual_seed(1234)
    x, y = batch(test, args.eval_sequences, args.seq_len, gen)
    with torch.no_grad(), autocast:
        logits = model(x.to(device)).float()
    y = y.to(device)
    loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1)).item()
    return loss, (logits.argmax(-1) == y).float().mean().item()


def save_model(model, args, config, rank):
    """Rank 0 writes the full weights (gathered from the shards) and the configuration."""
    state = {}
    inner = model.module if hasattr(model, "module") else model
    for name, tensor in inner.state_dict().items():
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()  # DIST: all-gather this parameter's shards (every rank takes part)
        if rank == 0:
            state[name] = tensor.detach().cpu()
    if rank == 0:
        model_dir = Path(args.model_dir)
        model_dir.mkdir(parents=True, exist_ok=True)
        torch.save(state, model_dir / "model.pt")
        (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
        print(f"Saved the model and its configuration to {model_dir}.", flush=True)


# ----------------------------------------------------------------------------- sharded checkpoints
# <checkpoint-dir>/step-<N>/: one torch.distributed.checkpoint (DCP) folder per checkpoint, each rank's
# shard in its own file plus DCP's `.metadata`, rank 0's `meta.pt` (step, RNG, model shape), and
# `checksums.json` (each file's size and SHA-256). Written as step-<N>.partial/ and renamed by rank 0
# once every rank's shard is in and summed; then `latest` (the folder's name) is replaced atomically.
# A checkpoint is complete iff its folder has no `.partial` suffix and holds `.metadata` and `meta.pt`:
# a crash at any moment leaves the previous one loadable. It is intact iff every file matches its
# checksum: a damaged one (a bad disk, a bad copy: DCP and torch.load check no checksum of their own)
# is reported and passed over for an older intact one. DCP reshards on load, so a checkpoint written
# by N ranks loads on M.
KEEP_CHECKPOINTS = 2  # the newest intact ones; older ones are deleted after each save
CHECKSUMS = "checksums.json"


def model_shape(args: argparse.Namespace) -> dict:
    return {"layers": args.layers, "d_model": args.d_model, "heads": args.heads, "seq_len": args.seq_len}


def is_complete(folder: Path) -> bool:
    return (not folder.name.endswith(".partial") and (folder / ".metadata").is_file()
            and (folder / "meta.pt").is_file())


def find_checkpoint(checkpoint_dir: str | Path, damaged: list[tuple[Path, str]] | None = None) -> Path | None:
    """The checkpoint to resume from: the one `latest` names if it is complete and intact, else the
    intact step-<N> folder with the largest N; None if there is none. Partial folders are never chosen;
    each complete one found damaged on the way is added to `damaged` as (folder, why)."""
    folder = Path(checkpoint_dir)
    try:
        name = (folder / "latest").read_text().strip()
    except OSError:
        name = ""
    found = [(int(m[1]), p) for p in folder.glob("step-*") if (m := re.fullmatch(r"step-(\d+)", p.name))]
    candidates = [p for _, p in sorted(found, reverse=True) if is_complete(p)]
    if re.fullmatch(r"step-\d+", name) and folder / name in candidates:
        candidates.remove(folder / name)
        candidates.insert(0, folder / name)
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            if not (path / CHECKSUMS).is_file():
                print(f"The checkpoint {path} has no {CHECKSUMS} (an older version of this script wrote it): it "
                      "is used unverified.", flush=True)
            return path
        if damaged is not None:
            damaged.append((path, problem))
    return None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(folder: Path) -> None:
    """Rank 0, once every file of the checkpoint is in `folder`: each one's size and SHA-256, read back
    from the disk, into CHECKSUMS (itself written atomically: a checkpoint has all its sums or none)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != CHECKSUMS)
    record = {"bytes": {p.name: p.stat().st_size for p in files}, "sha256": {p.name: file_sha256(p) for p in files}}
    write_atomic(folder / CHECKSUMS, lambda f: f.write(json.dumps(record, indent=1, sort_keys=True).encode()))


def checkpoint_problem(folder: Path) -> str | None:
    """Why the complete checkpoint `folder` cannot be trusted (a file missing, cut short, or changed since
    it was written), or None when every file matches its checksum. A checkpoint from before checksums
    (no CHECKSUMS file) cannot be checked: None (find_checkpoint says it is used unverified)."""
    try:
        record = json.loads((folder / CHECKSUMS).read_text())
        sizes, sums = record["bytes"], record["sha256"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its {CHECKSUMS} cannot be read ({exc})"
    for name in sorted(sums):
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != sizes.get(name):
            return f"{name} has {size:,} bytes, not the {sizes.get(name):,} written (cut short or overwritten)"
        if file_sha256(path) != sums[name]:
            return f"{name} does not match its SHA-256 in {CHECKSUMS} (its bytes changed after it was written)"
    return None


def save_checkpoint(checkpoint_dir: str | Path, step: int, model, optimizer, meta: dict, rank: int,
                    distributed: bool) -> Path:
    """Every rank calls it; each writes its own shard of the model and optimizer (DCP)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(checkpoint_dir)
    final, partial = folder / f"step-{step}", folder / f"step-{step}.partial"
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)  # what a crashed attempt left of the same step
        partial.mkdir(parents=True)
    if distributed:
        dist.barrier()  # DIST: the folder is empty and there before any rank writes into it
    # DIST: each rank's local shards (FSDP2's DTensors) with their place in the full tensors
    model_state, optim_state = get_state_dict(model, optimizer)
    # DIST: every rank writes its own file, fsynced; rank 0 then writes `.metadata` (the index of all)
    with single_process_quiet():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=partial)
    if rank == 0:
        # Every rank's file must be here: on hosts without a shared folder, each would hold only its own.
        named = {info.relative_path for info in dcp.FileSystemReader(partial).read_metadata().storage_data.values()}
        missing = sorted(named - {p.name for p in partial.iterdir()})
        if missing:
            raise RuntimeError(
                f"The checkpoint {partial} lacks {', '.join(missing)}, which other ranks wrote into the checkpoint "
                "folder of their own host: the hosts do not share one. Fix: give every host the same folder "
                "(a shared file system: FSx for Lustre or EFS on SageMaker; the local cluster's --checkpoint-dir), "
                "or set --checkpoint-every 0."
            )
        write_atomic(partial / "meta.pt", lambda f: torch.save(meta, f))
        write_checksums(partial)  # the last file in: it vouches for every other
        fsync_dir(partial)
        if final.exists():  # a complete checkpoint of the same step, from before a resume: replaced
            shutil.rmtree(final)
        os.rename(partial, final)  # the checkpoint is complete from this instant
        fsync_dir(folder)
        write_atomic(folder / "latest", lambda f: f.write(final.name.encode()))
        # Keep the KEEP_CHECKPOINTS newest intact checkpoints (this one, summed as it was written, and the
        # newest that verify before it): a damaged one does not count, so the last good one is never
        # deleted for it. Anything older than the kept ones goes; a damaged one newer than them stays (a
        # later save of its step replaces it), for the user to see.
        steps = sorted((int(p.name[5:]), p) for p in folder.glob("step-*") if re.fullmatch(r"step-\d+", p.name))
        kept = 0
        for _, old in reversed(steps):
            if kept >= KEEP_CHECKPOINTS:
                shutil.rmtree(old, ignore_errors=True)
            elif old == final or (is_complete(old) and checkpoint_problem(old) is None):
                kept += 1
        for old in folder.glob("step-*.partial"):  # no other save is under way: leftovers of crashes
            shutil.rmtree(old, ignore_errors=True)
    if distributed:
        dist.barrier()  # DIST: no rank goes on (or dies) before the checkpoint is complete
    return final


@contextlib.contextmanager
def single_process_quiet():
    """DCP warns that it assumes a single process when there is no process group: here, that is the case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def load_checkpoint(path: Path, model, optimizer) -> None:
    """Every rank calls it: DCP reads the parts of every saved shard that this rank's shards cover,
    whatever the world size that wrote them (resharding on load)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)  # this world's layout, to be filled
    state = {"model": model_state, "optim": optim_state}
    with single_process_quiet():
        dcp.load(state, checkpoint_id=path)  # DIST: each rank reads the slices of the files it needs
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


if __name__ == "__main__":
    sys.exit(main())
