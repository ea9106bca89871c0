"""The script's flags (`--help`), the checks the workshop also runs before it starts anything, and the SMP settings.

Given `SMP(...)` settings (--mp_parameters, also in SM_DISTRIBUTED_CONFIG; the opt-in SMP route), the
script maps them onto its own flags (hybrid sharding degree; checkpointing + offloading) and, on the
SageMaker model-parallel image (`torch.sagemaker` importable), also calls `tsm.init()` with them.
The sharding itself is always PyTorch's FSDP2: SMP's own implementation hooks PyTorch's FSDP1
`FullyShardedDataParallel`, which this script does not use, so SMP's code paths are not exercised.

A module beside train.py in the job's code/ folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

from contract import VOCAB, nonfinite_problems, str2bool
from fault_tolerance import FAULT_ENV, fault_problems
from step_profiler import PROFILE_WAIT, PROFILE_WARMUP

# DeepSpeed's ZeRO stages (deepspeed_zero.py), beside PyTorch's own shardings: the same model, data and AdamW.
ZERO_SHARDINGS = ("zero1", "zero2", "zero3", "zero3_offload")
SHARDINGS = ("no_shard", "optimizer", "shard_grad_op", "full_shard", "hybrid_shard", *ZERO_SHARDINGS)
SMP_KEYS = ("hybrid_shard_degree", "sm_activation_offloading", "activation_loading_horizon",
            "fsdp_cache_flush_warnings", "allow_empty_shards", "tensor_parallel_degree",
            "context_parallel_degree", "expert_parallel_degree", "random_seed")


def json_dict(text: str) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


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
             "after forward; hybrid_shard: FSDP2 within groups of --hybrid-shard-degree, replicated across; "
             "zero1, zero2, zero3, zero3_offload: DeepSpeed's ZeRO stages (the last with the optimizer state "
             "offloaded to the host; needs deepspeed: code/requirements-deepspeed.txt)",
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


def apply_smp_settings(args: argparse.Namespace, cuda: bool) -> tuple[dict, list[str]]:
    """The SMP settings (smp_settings) mapped onto the flags, and the lines that say so; refuses
    --activation-offloading cpu without a GPU (SystemExit, with the fix)."""
    smp = smp_settings(args)
    smp_notes = apply_smp(args, smp) if smp else []
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
    return smp, smp_notes


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
    if args.checkpoint_every and args.sharding in ZERO_SHARDINGS:
        problems.append(f"--checkpoint-every with --sharding {args.sharding}: the script's sharded checkpoints "
                        "(torch.distributed.checkpoint) hold PyTorch's state; a DeepSpeed engine keeps its own")
        fixes.append("checkpoint with --sharding full_shard (FSDP2: the same sharding as zero3), or set --checkpoint-every 0")
    more, fault_fixes = fault_problems(getattr(args, "fault", None) if fault is None else fault, world_size, args.steps)
    problems += more
    fixes += fault_fixes
    if problems:
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")


def divergence_fix(args: argparse.Namespace) -> str:
    """What to do when the training diverged (the `fix` of checkpointing.Divergence)."""
    return (f"a lower --lr than {args.lr:g}, e.g. {build_parser().get_default('lr')} (its default), with an empty "
            "--checkpoint-dir (a run that resumes takes its learning rate from the checkpoint)")
