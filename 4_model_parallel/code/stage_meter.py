"""What one pipeline stage does in a step, measured: when each of its forwards and backwards ran, and what autograd
keeps for its backward (code/pipeline.py); and the link between two stages (a ping-pong).

A module beside pipeline.py in the job's code/ folder.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn


class StageMeter:
    """One stage's step: when each forward and backward ran, and what autograd keeps for backward."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self.t0, self.intervals, self.alive, self.peak_alive = time.perf_counter(), [], 0, 0
        self.queued0 = run_queue_s()
        self.generation = getattr(self, "generation", 0) + 1  # what an earlier step saved no longer counts
        self.refs: dict[tuple[int, int], int] = {}
        self.live_bytes = self.peak_bytes = 0

    def busy(self) -> float:
        return sum(end - begin for _, begin, end in self.intervals)

    def queued(self) -> float:
        """Seconds since start() this stage was ready to run and waited for a core (other processes had them)."""
        return run_queue_s() - self.queued0

    def pack(self, t: torch.Tensor):
        base = t._base if t._base is not None else t  # a Linear saves weight.t(), a view of a parameter
        if isinstance(base, nn.Parameter):
            return t  # a parameter: state, not an activation
        key = (t.data_ptr(), t.numel())  # once per tensor (Tanh's output is the next Linear's input)
        if not self.refs.get(key):
            self.live_bytes += t.numel() * t.element_size()
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.refs[key] = self.refs.get(key, 0) + 1
        return Saved(self, key, t)

    def release(self, key: tuple[int, int], nbytes: int, generation: int) -> None:
        if generation != self.generation:
            return
        self.refs[key] -= 1
        if not self.refs[key]:
            del self.refs[key]
            self.live_bytes -= nbytes

    def forward_ran(self, begin: float) -> None:
        self.intervals.append(("forward", begin - self.t0, time.perf_counter() - self.t0))
        self.alive += 1
        self.peak_alive = max(self.peak_alive, self.alive)

    def backward_began(self) -> None:
        self.began = time.perf_counter()

    def backward_ended(self) -> None:
        self.intervals.append(("backward", self.began - self.t0, time.perf_counter() - self.t0))
        self.alive -= 1


class Saved:
    """A tensor autograd keeps for backward; when autograd lets go of it (after its backward), its bytes stop counting."""

    def __init__(self, meter: StageMeter, key: tuple[int, int], tensor: torch.Tensor):
        self.meter, self.key, self.tensor, self.generation = meter, key, tensor, meter.generation
        self.nbytes = tensor.numel() * tensor.element_size()

    def __del__(self):
        self.meter.release(self.key, self.nbytes, self.generation)


class Measured(nn.Module):
    """A stage's layers, with its forward timed, its backward marked at both ends and its saved tensors counted."""

    def __init__(self, layers: nn.Module, meter: StageMeter):
        super().__init__()
        self.layers, self.meter = layers, meter
        self.marker = torch.zeros((), requires_grad=True)  # so that the first stage's backward reaches its start

    def forward(self, x):
        if x.device.type == "meta":  # the pipeline infers shapes once, on meta tensors: nothing to measure
            return self.layers(x)
        begin = time.perf_counter()
        x = _BackwardEnds.apply(x, self.marker, self.meter)
        with torch.autograd.graph.saved_tensors_hooks(self.meter.pack, unpack):
            y = self.layers(x)
        y = _BackwardBegins.apply(y, self.meter)
        self.meter.forward_ran(begin)
        return y


def unpack(saved):
    return saved.tensor if isinstance(saved, Saved) else saved


class _BackwardBegins(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, meter):
        ctx.meter = meter
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        ctx.meter.backward_began()  # the gradient reached the stage's output: its backward begins
        return grad, None


class _BackwardEnds(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, marker, meter):
        ctx.meter = meter
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.meter.backward_ended()  # the gradient left the stage's first layer: its backward is done
        return grad, None, None


def run_queue_s() -> float:
    """Seconds this thread has waited so far for a core while ready to run (Linux's /proc schedstat; 0 elsewhere).
    On CPU, autograd runs the backward in the calling thread: the stage's forwards and backwards are all here."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def ping_pong(rank: int, nbytes: int, repeats: int = 20) -> dict:
    """The link between stage 0 and stage 1: half a round trip of 4 bytes (latency) and of `nbytes`."""
    out = {}
    for label, size in (("small", 4), ("large", nbytes)):
        buf = torch.zeros(size // 4)
        times = []
        for _ in range(repeats):
            dist.barrier()
            begin = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            times.append((time.perf_counter() - begin) / 2)
        out[label] = statistics.median(times)
    sent = torch.tensor([out["small"], out["large"]])
    dist.broadcast(sent, 0)  # rank 0's timing, on every rank
    alpha, large = sent.tolist()
    return {"p2p_alpha_s": alpha, "p2p_bandwidth_Bps": nbytes / max(large - alpha, 1e-9), "p2p_large_bytes": nbytes}


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
