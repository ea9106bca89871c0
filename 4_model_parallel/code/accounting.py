"""What each rank holds, measured exactly: bytes of parameters, gradients and optimizer state (from the local
shards of FSDP2's DTensors), bytes of activations saved for backward (counted by a
`torch.autograd.graph.saved_tensors_hooks` pair, one count per storage), and the most it held at once inside
the step (StepPeak: the allocator's own record), printed as a `METRICS` line.

A module beside train.py in the job's code/ folder.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn

from contract import metrics

REGION = ["outside"]  # where the forward pass is, for the activation accounting ("block" or "outside"; GPT sets it)

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
            self.bytes[REGION[0]] += storage.nbytes()
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


class StepPeak:
    """The most memory this rank held at once during one step: what it held when the step began (its parameters and
    optimizer state; the gradients were just released) plus the most the step allocated on top of it.

    On a GPU, the caching allocator's own counter (torch.cuda.max_memory_allocated). On a CPU, which keeps no such
    counter, the CPU allocator's allocations and frees as torch.profiler records them (`profile_memory=True`): the
    running sum's highest point. Two limits of the CPU count, both on the side of too much: it sees frees on the
    training thread only (a collective's buffer that gloo's thread lets go of last stays counted until the step
    ends), and memory allocated before the step and freed inside it is not subtracted (so the script releases the
    previous step's outputs and gradients before it starts). One step only: the profiler slows it. `on=False`:
    measures nothing (a step another profiler records, or DeepSpeed's engine, whose buffers outlive the step).
    """

    def __init__(self, device: torch.device | None, on: bool = True):
        self.device, self.on, self.prof, self.held, self.start_bytes, self.bytes = device, on, None, 0, 0, 0

    def start(self, model, optimizer) -> StepPeak:
        if self.device is not None:  # a GPU: the allocator counts (state_measures reads its peak too, on or off)
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)
        if not self.on:
            return self
        self.held = held_bytes(model) + optimizer_state_bytes(optimizer)
        if self.device is None:
            from torch.profiler import ProfilerActivity, profile

            os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # read at the profiler's first use: no start/stop notes
            self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self.prof.start()
        return self

    def stop(self, t0: float) -> float:
        """Ends the count; returns the seconds since `t0` (perf_counter), the step's time, taken before the profiler's
        own work."""
        seconds = time.perf_counter() - t0
        if self.device is not None and self.on:
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self.start_bytes
        if self.prof is None:
            return seconds
        self.prof.stop()
        now = 0
        for event in self.prof.profiler.kineto_results.events():  # in the order the allocator reported them
            if event.name() == "[memory]":
                now += event.nbytes()  # an allocation's size, or minus a free's
                self.bytes = max(self.bytes, now)
        self.prof = None
        return seconds

    def measures(self) -> dict:
        return dict(step_start_bytes=self.held, step_peak_bytes=self.held + self.bytes) if self.on else {}


def held_bytes(model, grads: bool = False) -> int:
    """Bytes of the parameters this rank holds now, or (`grads`) of their gradients."""
    if grads:
        return sum(local_bytes(p.grad) for p in model.parameters())
    inner = model.module if hasattr(model, "module") else model
    # DeepSpeed ZeRO-3 keeps each parameter's shard in `ds_tensor`; the parameter itself is empty unless gathered
    return sum(local_bytes(p) + local_bytes(getattr(p, "ds_tensor", None)) for p in inner.parameters())


def state_measures(model, optimizer, meter: SavedTensorMeter, after_forward: int, grads: int,
                   device: torch.device | None, peak: StepPeak) -> dict:
    """The measured step's bytes, by kind; `device`: the GPU whose peak allocation to add (None: a CPU); `peak`: the
    most the rank held at once inside the step (when it was measured). A DeepSpeed engine's optimizer counts its own state
    (deepspeed_zero.py: its gradients never stay in `.grad`)."""
    zero = getattr(optimizer, "zero_measures", None)
    measured = zero() if zero else dict(
        param_bytes=sum(local_bytes(p) for p in model.parameters()),
        grad_bytes=grads, optim_bytes=optimizer_state_bytes(optimizer))
    measured.update(
        params_after_forward_bytes=after_forward,
        saved_act_bytes=meter.total, saved_act_block_bytes=meter.bytes["block"],
        saved_act_outside_bytes=meter.bytes["outside"], offloaded_bytes=meter.offloaded_bytes,
        **peak.measures(),
    )
    if device is not None:
        measured["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
    return measured


def report_memory(args: argparse.Namespace, measured: dict, step_times: list[float], rank: int, world_size: int,
                  shard: int, n_params: int, n_tensors: int) -> None:
    """This rank's METRICS line: what it holds, against the full state and the ideal share of it (full / shard)."""
    per_param = 4 + 4 + 8  # fp32 parameter + fp32 gradient + AdamW's exp_avg and exp_avg_sq
    full_state = n_params * per_param + n_tensors * 4  # + AdamW's fp32 `step` per tensor
    if measured:  # not when a resumed run had no step left to measure
        state = measured["param_bytes"] + measured["grad_bytes"] + measured["optim_bytes"]
        timed = step_times[1:] or step_times
        metrics(
            rank=rank, world_size=world_size, sharding=args.sharding, shard_group=shard,
            checkpointing=int(args.activation_checkpointing), offloading=args.activation_offloading,
            # DeepSpeed's rows bring their own full state and theory (deepspeed_zero.py: K = 12 bytes of optimizer state)
            **{"full_state_bytes": full_state, "ideal_state_bytes": full_state // shard, **measured}, state_bytes=state,
            block_input_bytes=args.layers * (args.batch_size // world_size) * args.seq_len * args.d_model * 4,
            step_time_s=sum(timed) / len(timed),
        )
