"""DeepSpeed ZeRO beside FSDP: the same model, data, AdamW and per-rank accounting (`--sharding zero1|zero2|zero3|
zero3_offload`). DeepSpeed wraps the model in an engine whose ZeRO optimizer shards, per stage, over the N ranks:

  zero1          the optimizer state (the fp32 master weights and AdamW's two moments): 1/N per rank
  zero2          + the gradients: each rank keeps its partition's, reduced bucket by bucket during backward
  zero3          + the parameters: each rank stores 1/N; a module's are gathered while it computes
  zero3_offload  zero3 with the optimizer state and its fp32 gradients in host memory (ZeRO-Offload,
                 `offload_optimizer: cpu`): on a GPU they leave device memory; AdamW steps on the CPU

Nothing is compiled. DeepSpeed builds C++ ops on first use, minutes each on 2 cores; this module asks for none:
its shared-memory all-reduce (`deepspeed_shm_comm`, built at `initialize` on the CPU accelerator, used only by
inference's `inference_all_reduce`) is marked unavailable, which DeepSpeed's own table of buildable ops allows
(`deepspeed.ops.__compatible_ops__`, read by `deepspeed/comm/torch.py: build_shm_op`), and the optimizer is
torch's AdamW (`"torch_adam": true`), not DeepSpeedCPUAdam or FusedAdam (each a compile). So the offload row's
optimizer step is torch's, 5-7x slower than DeepSpeedCPUAdam on a large model (DeepSpeed's ZeRO-Offload tutorial).

What each rank holds is read from DeepSpeed 0.19.8's ZeRO optimizers (stage_1_and_2.py, stage3.py), each
storage once, after the measured step's optimizer update:
- parameters: the module's weights (ZeRO-1/2: all of them, in one flat buffer), or at ZeRO-3 the shard of each
  (`param.ds_tensor`) plus whatever is gathered at that moment;
- gradients: the most held at once during backward (after each gradient hook and at backward's end), not
  counting the reduction buckets (`reduce_bucket_size`, reported apart as `bucket_bytes`, as FSDP's transient
  gather and reduce-scatter buffers go uncounted too), plus the fp32 gradients an offloaded optimizer keeps;
- optimizer state: the fp32 master partition (`single_partition_of_fp32_groups`, `fp32_partitioned_groups_flat`)
  and AdamW's `exp_avg`, `exp_avg_sq` and `step`.
Theory, for Psi parameters of `b` bytes (4 in fp32, 2 in bf16) and the ZeRO paper's K = 12 bytes of optimizer
state per parameter (fp32 master + 2 moments; DeepSpeed keeps the master copy in fp32 training too):
  zero1  b Psi + b Psi + 12 Psi / N       zero3          (b + b + 12) Psi / N
  zero2  b Psi + (b + 12) Psi / N         zero3_offload  (b + b + 4 + 12) Psi / N, the 4 + 12 on the host
(plus 4 bytes of AdamW's `step` per parameter group). ZeRO-2's gradient buffer covers whole parameters, so a
rank whose partition starts inside one holds that parameter's whole gradient: on a tiny model, a visible excess.

A module beside train.py in the job's code/ folder. It imports deepspeed only when a ZeRO sharding runs: the
other routes' images do not have it (the deepspeed route's job installs `requirements-deepspeed.txt`).
"""

from __future__ import annotations

import json
import warnings

import torch
import torch.nn as nn

from arguments import ZERO_SHARDINGS
from contract import exit_with

REQUIREMENTS = "requirements-deepspeed.txt"  # beside this module: what the deepspeed route's job installs


def uses_deepspeed(args) -> bool:
    """Whether `--sharding` is one of DeepSpeed's ZeRO stages."""
    return args.sharding in ZERO_SHARDINGS


def zero_stage(sharding: str) -> tuple[int, bool]:
    """(ZeRO stage, optimizer offloaded to the host) of a `--sharding` value."""
    return int(sharding[4]), sharding.endswith("_offload")


def zero_config(args, world_size: int, dtype: torch.dtype, bucket: int) -> dict:
    """The DeepSpeed configuration (its JSON, as a dict): what `deepspeed.initialize` reads, and the notebook shows."""
    stage, offload = zero_stage(args.sharding)
    zero = {
        "stage": stage,
        # DeepSpeed's defaults (5e8 elements, 2 GB in fp32) are for billion-parameter models; one bucket here holds the
        # largest parameter's gradient, so no gradient bypasses the buckets
        "reduce_bucket_size": bucket, "allgather_bucket_size": bucket,
        # ZeRO-3 keeps parameters under 100,000 elements whole on every rank by default (all of this small GPT's):
        # 0 shards every one of them, as FSDP does
        "stage3_param_persistence_threshold": 0,
    }
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_batch_size": args.batch_size,  # the global batch, as FSDP's runs: DeepSpeed checks micro x N
        "train_micro_batch_size_per_gpu": args.batch_size // world_size,
        "gradient_accumulation_steps": 1,
        # torch's AdamW with the script's learning rate (the FSDP runs' optimizer): no C++ op to compile
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "torch_adam": True}},
        "gradient_clipping": 0.0,  # DeepSpeed clips the gradients' norm to 1.0 unless told; the FSDP runs do not clip
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == torch.bfloat16},
        "steps_per_print": 1_000_000,  # the script prints its own METRICS lines
    }


def import_deepspeed():
    """deepspeed, imported, with its shared-memory all-reduce op marked unavailable (see above); or this rank ends
    with the fix when it is not installed."""
    try:
        import deepspeed
    except ImportError as exc:
        exit_with(f"--sharding zero1/zero2/zero3/zero3_offload needs DeepSpeed, which is not installed here ({exc}). "
                  f"Fix: pip install -r code/{REQUIREMENTS} (the deepspeed route's SageMaker job installs it at its "
                  "start), or use an FSDP sharding (--sharding full_shard).")
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no compile at initialize (the module's doc)
    # DeepSpeed calls these torch.distributed functions under their old names at every step: one warning per call site
    warnings.filterwarnings("ignore", r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is "
                            "deprecated", FutureWarning)
    return deepspeed


def deepspeed_engine(model: nn.Module, args, world_size: int, dtype: torch.dtype):
    """`deepspeed.initialize` on the model (the process group is the script's own): (engine, shard group, how)."""
    deepspeed = import_deepspeed()
    bucket = max(p.numel() for p in model.parameters())
    config = zero_config(args, world_size, dtype, bucket)
    # DIST: the engine partitions the state over every rank of the process group (ZeRO's stage decides which)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    if engine.global_rank == 0:
        print("DeepSpeed configuration: " + json.dumps(config, sort_keys=True), flush=True)
    stage, offload = zero_stage(args.sharding)
    how = f"DeepSpeed ZeRO-{stage}" + (" + optimizer offload to the host" if offload else "") + f" over {world_size} ranks"
    return engine, world_size, how


class EngineOptimizer:
    """The training loop's optimizer for a DeepSpeed engine: its step (the ZeRO update, at the accumulation
    boundary) and its gradients' zeroing; `loss.backward()` runs DeepSpeed's gradient hooks itself (DeepSpeed 0.19.8's
    ZeRO engines take a PyTorch-style backward). `zero_measures()`: this rank's accounting (the module's doc)."""

    def __init__(self, engine):
        self.engine, self.zero = engine, engine.optimizer
        self.stage, self.offload = engine.zero_optimization_stage(), bool(engine.zero_cpu_offload())
        self.params = list(engine.module.parameters())
        self.peak_grads = self.peak_bucket = self.taken = 0
        for p in self.params:  # after DeepSpeed's own hook on each parameter: what it kept of that gradient
            p.register_post_accumulate_grad_hook(lambda _: self._sample() if self.taken < 2 else None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad()
        self.peak_grads = self.peak_bucket = 0  # a new step's backward

    def step(self) -> None:
        if self.taken < 2:  # the script measures its second step (the first warms up): the other steps go unsampled
            self._sample()  # backward's end: the gradients DeepSpeed keeps for the update
        self.engine.step()
        self.taken += 1

    def _buckets(self) -> list[torch.Tensor]:
        buffers = []
        for bucket in getattr(self.zero, "ipg_buckets", {}).values():  # ZeRO-1/2: a list of buffers; ZeRO-3: one
            buffers += bucket.buffer if isinstance(bucket.buffer, list) else [bucket.buffer]
        return buffers

    def _fp32_groups(self) -> list[torch.Tensor]:
        return list(getattr(self.zero, "single_partition_of_fp32_groups", None) or
                    getattr(self.zero, "fp32_partitioned_groups_flat", None) or [])

    def _grads(self) -> list[torch.Tensor]:
        z = self.zero
        grads = [p.grad for p in self.params] + [getattr(p, "grad_accum", None) for p in self.params]
        grads += [getattr(z, "grads_in_partition", None), getattr(z, "grad_partitions_flat_buffer", None)]
        for value in (getattr(z, "averaged_gradients", None) or {}).values():
            grads += value if isinstance(value, list) else [value]
        return grads + [g.grad for g in self._fp32_groups()]  # an offloaded optimizer's fp32 gradients

    def _sample(self) -> None:
        buckets = storages(self._buckets())
        self.peak_bucket = max(self.peak_bucket, sum(buckets.values()))
        grads = storages(self._grads(), skip=buckets)
        self.peak_grads = max(self.peak_grads, sum(grads.values()))

    def zero_measures(self) -> dict:
        """This rank's bytes, by kind, and ZeRO's theory for them (the module's doc)."""
        params = storages([p.data for p in self.params] + [getattr(p, "ds_tensor", None) for p in self.params])
        state = [v for s in self.zero.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        optim = storages(self._fp32_groups() + state, skip=params)
        n, ranks = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in self.params), self.engine.world_size
        b, steps = self.params[0].element_size(), 4 * len(self.zero.optimizer.param_groups)
        theory = {"param": b * n / (ranks if self.stage == 3 else 1), "grad": b * n / (ranks if self.stage >= 2 else 1)
                  + (4 * n / ranks if self.offload else 0), "optim": 12 * n / ranks + steps}
        host = sum(optim.values()) + (self.peak_grads if self.offload else 0)
        return dict(
            param_bytes=sum(params.values()), grad_bytes=self.peak_grads, optim_bytes=sum(optim.values()),
            bucket_bytes=self.peak_bucket, offloaded_state_bytes=host if self.offload else 0, zero_stage=self.stage,
            **{f"theory_{k}_bytes": round(v) for k, v in theory.items()},
            full_state_bytes=(b + b + 12) * n + steps, ideal_state_bytes=round(sum(theory.values())),
        )


def storages(tensors, skip=()) -> dict[int, int]:
    """{storage address: its bytes} of the non-empty tensors (each storage once: views share one), less `skip`'s."""
    found = {}
    for t in tensors:
        if torch.is_tensor(t) and t.numel():
            storage = t.untyped_storage()
            if storage.data_ptr() not in skip:
                found[storage.data_ptr()] = storage.nbytes()
    return found


def module_state_dict(model) -> dict:
    """The model's state_dict (a wrapper's or engine's inner module's). A ZeRO-3 engine's parameters are gathered
    whole first, on every rank (each takes part); FSDP2's stay sharded DTensors, for the caller to gather."""
    inner = model.module if hasattr(model, "module") else model
    if getattr(model, "zero_optimization_stage", lambda: 0)() != 3:
        return inner.state_dict()
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(inner.parameters())):  # DIST: all-gather every shard
        return {name: tensor.detach().clone() for name, tensor in inner.state_dict().items()}
