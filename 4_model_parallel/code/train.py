"""Lab 4: sharded data parallelism, checkpointing and offloading on a small GPT, measured exactly.

A byte-level GPT (its size set by --layers, --d-model, --heads, --seq-len) learns to predict the next
character of CPython's own reference documentation (`pydoc_data.topics`, what `help("with")` prints),
which the host writes as the `train` and `test` channels (workshop/datasets/corpus.py).

One flag per technique (see `--help`):
  --sharding no_shard        plain data parallel (DDP): every rank holds all of the state
  --sharding optimizer       ZeRO-1: DDP + ZeroRedundancyOptimizer, optimizer state split over ranks
  --sharding shard_grad_op   ZeRO-2-like: FSDP2 with reshard_after_forward=False (gradients and
                             optimizer state sharded; parameters stay gathered from forward to backward)
  --sharding full_shard      ZeRO-3: FSDP2, parameters re-sharded after each block's forward too
  --sharding hybrid_shard    FSDP2 on a 2-D mesh: shard within groups of --hybrid-shard-degree
                             ranks, replicate across groups (SMP's hybrid_shard_degree)
  --sharding zero1 .. zero3  DeepSpeed's ZeRO stages (deepspeed_zero.py), same model and AdamW; zero3_offload
  --activation-checkpointing keep only each block's input; recompute the block in backward
  --activation-offloading    cpu: move saved activations to host memory (needs a GPU);
                             simulate: the same hooks, copying into a separate host buffer
  --mixed-precision          bf16 where the device supports it (auto: CUDA with bf16), else fp32

Every rank measures what it holds, and its peak inside a step (accounting.py), in `METRICS` lines. gloo on CPU,
nccl on GPUs. The lines that make it distributed carry a `DIST:` comment. The modules beside this script (its code/
folder ships with the job) serve other chapters: the flags and SMP settings, the SageMaker contract, sharded
checkpoints, torchrun --max-restarts, --profile-steps, DeepSpeed's engine.

Run it (from the lab folder; prepare the channels once with `python -m workshop.datasets.corpus data/corpus`):
    python code/train.py --train data/corpus/train --test data/corpus/test
    torchrun --nproc-per-node 2 code/train.py --sharding full_shard ...
    python -m workshop run model_parallel               # 2 simulated SageMaker hosts
    # On SageMaker: ModelTrainer(distributed=Torchrun()) on the PyTorch image (see the notebook).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# The modules beside this script (its code/ folder ships with the job); what the workshop reads from it too.
from accounting import REGION, SavedTensorMeter, StepPeak, held_bytes, report_memory, state_measures
from arguments import apply_smp_settings, build_parser, check_args, divergence_fix, shard_group_size
from checkpointing import (  # noqa: F401
    Divergence,
    checkpoint_problem,
    clean_stale,
    find_checkpoint,
    load_checkpoint,
    position,
    resume,
    save_checkpoint,
)
from contract import (
    VOCAB,
    describe_run,
    distributed_env,
    fsdp_api,
    load_corpus,
    metrics,
    print_setup,
    set_gloo_interface,
    threads_per_rank,
)
from deepspeed_zero import EngineOptimizer, deepspeed_engine, module_state_dict, uses_deepspeed
from fault_tolerance import (  # noqa: F401
    Restarts,
    agreed_attempt,
    announce_resume,
    elastic_store,
    inject_fault,
    parse_fault,
    read_recovery,
    report_recovery,
    restart_count,
    write_atomic,
    write_progress,
)
from step_profiler import StepProfiler

FSDP_SHARDINGS = ("shard_grad_op", "full_shard", "hybrid_shard")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    rank, world_size, local_rank, local_world_size = distributed_env()
    cuda = torch.cuda.is_available()
    smp, smp_notes = apply_smp_settings(args, cuda)  # SMP(...) settings become this script's flags
    torch.set_num_threads(threads_per_rank(args, local_world_size))

    # Read the data before joining the process group: a missing channel fails every rank at once.
    train, test = load_corpus(args.train, "train"), load_corpus(args.test, "test")
    check_args(args, world_size, train_samples=len(train), procs_per_host=local_world_size)

    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")  # LOCAL_RANK, never the global rank
    if cuda:
        torch.cuda.set_device(device)
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    distributed = world_size > 1
    attempt = restart_count()  # 0, or how many times torchrun --max-restarts has restarted the ranks
    if distributed:
        set_gloo_interface(backend)  # DIST: gloo talks over the interface SageMaker names, not a guess
        store_args, attempt = elastic_store(timedelta(minutes=10))  # a restarted attempt's own keys in torchrun's store
        # DIST: join the process group; torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT say how
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=10), **store_args)
        attempt = agreed_attempt(attempt, device, distributed)  # one attempt number on every rank
    smp_library = init_smp(smp, rank) if smp else False
    use_bf16 = args.mixed_precision == "bf16" or (args.mixed_precision == "auto" and cuda and torch.cuda.is_bf16_supported())
    dtype = torch.bfloat16 if use_bf16 else torch.float32

    torch.manual_seed(args.seed)  # the same initial weights on every rank (and every technique)
    model = GPT(args.layers, args.d_model, args.heads, args.seq_len).to(device)
    model.checkpointing = args.activation_checkpointing
    n_params, n_tensors = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    model, shard, how = wrap_model(model, args, world_size, local_world_size, device, dtype, cuda)
    optimizer = build_optimizer(model, args, world_size)
    # DDP and ZeRO-1 run the model in autocast for bf16; FSDP2 casts via its MixedPrecisionPolicy.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 and not how.startswith(("FSDP2", "DeepSpeed")) else contextlib.nullcontext()

    micro = args.batch_size // world_size
    config = describe_run(args, world_size, backend, device, how, shard, n_params, dtype, smp, smp_library, len(train), len(test))
    if rank == 0:
        print_setup(config, smp_notes, dtype)

    gen = torch.Generator().manual_seed(args.seed)  # the same batches on every rank; each takes its slice
    step_times, measured, measured_time = [], {}, 0.0
    start, last_loss, recovery = resume(args, model, optimizer, gen, rank, world_size, attempt)  # --checkpoint-every
    restarts = Restarts(args, rank, attempt, recovery, start)  # --fault, and the recovery's report
    # NaN, inf or 100x a uniform guess's losses stop every rank: a sum over the ranks of each one's first (Divergence)
    diverged = Divergence(device, rank, world_size, lambda t: dist.all_reduce(t) or t, divergence_fix(args), classes=VOCAB)
    profiler = StepProfiler(args.profile_steps, args.output_dir, rank)  # --profile-steps (0: off)
    profiler.start(1)
    for step in range(start + 1, args.steps + 1):
        profiled = profiler.prof is not None  # the step_time_s metric leaves profiled (slower) steps out
        x, y = batch(train, args.batch_size, args.seq_len, gen)
        x, y = x[rank * micro : (rank + 1) * micro].to(device), y[rank * micro : (rank + 1) * micro].to(device)  # DIST: this rank's slice
        measure = step == min(start + 2, args.steps)  # the first step warms up the allocator and caches
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if measure:  # the memory inside this step: what it holds now, and the most it allocates on top (accounting.py)
            logits = loss = None  # the previous step's outputs: released before the count starts, as its gradients are
            peak = StepPeak(device if cuda else None, on=not (profiled or uses_deepspeed(args))).start(model, optimizer)
        meter = SavedTensorMeter(args.activation_offloading)
        with meter.hooks(), autocast:
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))
        if measure:
            after_forward = held_bytes(model)  # FSDP2: resharded after the forward, or not
        loss.backward()  # DIST: DDP all-reduces / FSDP reduce-scatters the gradients here
        if measure:
            grads = held_bytes(model, grads=True)
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        if measure:
            measured_time = peak.stop(t0)  # timed only if no other step is (the count slows it)
        elif not profiled:
            step_times.append(time.perf_counter() - t0)
        loss_value = loss.detach()
        diverged.note(loss_value, step)
        if distributed:
            dist.all_reduce(loss_value)  # DIST: the mean loss over the global batch
            loss_value /= world_size
        last_loss = loss_value.item()
        profiler.step(len(x))  # --profile-steps: one ProfilerStep ends here
        if measure:
            measured = state_measures(model, optimizer, meter, after_forward, grads, device if cuda else None, peak)
        if step % args.log_interval == 0 or step == args.steps:
            if rank == 0:
                metrics(rank=0, step=step, train_loss=last_loss)
            restarts.logged(step)
        if not math.isfinite(last_loss):  # the mean over every rank: each sees it, and stops (with which rank)
            diverged.check(step)
        if args.checkpoint_every and (step % args.checkpoint_every == 0 or step == args.steps):
            diverged.check(step, weights=model)  # never a checkpoint of diverged weights
            save_checkpoint(args.checkpoint_dir, step, model, optimizer, position(args, step, gen, last_loss, world_size),
                            rank, distributed)  # every rank writes its own shard (checkpointing.py)
        restarts.stepped(step)  # --fault: die here, after this step (and its checkpoint)
    profiler.stop()
    restarts.trained()
    if start < args.steps:
        diverged.check(args.steps, weights=model)  # not a diverged model saved as the result either

    test_loss, test_acc = evaluate(model, test, args, device, autocast)
    report_memory(args, measured, step_times or [measured_time], rank, world_size, shard, n_params, n_tensors)
    if rank == 0:
        perplexity = math.exp(test_loss) if test_loss < 700 else math.inf  # exp overflows a float past ~709.8
        metrics(rank=0, final_train_loss=last_loss, test_loss=test_loss, test_accuracy=test_acc, perplexity=perplexity)
        print(f"final next-character test accuracy: {test_acc:.4f} (loss {test_loss:.4f}, perplexity {perplexity:.2f})", flush=True)
    save_model(model, args, config, rank)
    restarts.finished()
    if distributed:
        # DIST: leave in step, so no rank tears the group down while a peer still needs it
        dist.barrier()
        # DIST: the wrapped model and a sharded optimizer hold the process group too; release them first, so gloo is torn
        # down here and not during interpreter exit (its threads can abort it: "terminate called without an active exception").
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()
    return 0


def wrap_model(model, args, world_size, local_world_size, device, dtype, cuda):
    """Apply the chosen sharding; returns (model, shard_group_size, description)."""
    if world_size == 1:
        return model, 1, "single process (one rank: nothing to shard or replicate)"
    if uses_deepspeed(args):
        return deepspeed_engine(model, args, world_size, dtype)  # DIST: DeepSpeed's ZeRO engine (deepspeed_zero.py)
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
        # DIST: full_shard frees a block's gathered weights after its forward (ZeRO-3), shard_grad_op after backward
        reshard = args.sharding != "shard_grad_op"
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)  # DIST: one all-gather unit per block
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)  # DIST: embeddings, final norm, head
        return model, degree, f"FSDP2 fully_shard ({how}, reshard_after_forward={reshard})"
    from torch.nn.parallel import DistributedDataParallel as DDP

    # DIST: full replica per rank; gradients all-reduced in backward, in DDP's buckets (gradient_as_bucket_view: counted once)
    model = DDP(model, device_ids=[device.index] if cuda else None, gradient_as_bucket_view=True)
    zero = " + ZeroRedundancyOptimizer (ZeRO-1)" if args.sharding == "optimizer" else ""
    return model, 1, "DDP (full replica per rank)" + zero


def build_optimizer(model, args, world_size):
    if uses_deepspeed(args) and world_size > 1:
        return EngineOptimizer(model)  # the engine's ZeRO optimizer: torch's AdamW, the same learning rate
    if args.sharding == "optimizer" and world_size > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        # DIST: ZeRO-1: each rank keeps AdamW state for its share of the parameters only, broadcasts its updated ones after the step
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=args.lr)
    return torch.optim.AdamW(model.parameters(), lr=args.lr)


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
            REGION[0] = "block"
            if self.checkpointing:
                # keep only the block's input; its inside is recomputed during backward
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
            REGION[0] = "outside"
        return self.head(self.ln_f(x))


def batch(data: torch.Tensor, n: int, seq_len: int, generator: torch.Generator):
    starts = torch.randint(0, len(data) - seq_len - 1, (n,), generator=generator)
    x = torch.stack([data[s : s + seq_len] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + seq_len + 1] for s in starts.tolist()])
    return x, y


def evaluate(model, test, args, device, autocast):
    """Loss and next-character accuracy on fixed test windows, the same on every rank: every rank scores all of them
    (with FSDP or ZeRO-3 each forward needs every rank's shards anyway)."""
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
    for name, tensor in module_state_dict(model).items():  # a ZeRO-3 engine's gathered whole (every rank takes part)
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


if __name__ == "__main__":
    sys.exit(main())
