"""Gradient accumulation and DDP's buckets, measured: lab 3's own script (`code/train.py --grad-accum K`)
under torchrun, each run in a private network namespace whose loopback counters hold its bytes and nothing
else's, its METRICS lines (the losses) and its profiler trace (the all-reduce calls of each optimizer step).

    from accumulation import compare            # data_parallel.ipynb puts this folder on sys.path
    result = compare()                           # 2 ranks at K = 1 and 2, and 1 rank at K = 2, STEPS steps each
    print(result.share_per_micro_batch)          # bytes per micro-batch at K = 2, a share of K = 1's

What it claims, and checks (`check`): at K = 2 an optimizer step moves the bytes of K = 1 (one all-reduce
of the whole gradient, after the last micro-batch), so each micro-batch moves half of them; and 1 rank at
K = 2 trains as 2 ranks at K = 1 do, at the same global batch (64 x 2 x 1 = 64 x 1 x 2) and learning rate
(--scale-lr multiplies by the world size x K), to within LOSS_TOLERANCE. data_parallel.ipynb,
tests/test_grad_accum.py and benchmarks/bench_grad_accum.py run it.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "code" / "train.py"
# Optimizer steps of each run: the first epoch of the 4,000-digit subset, where the loss falls fastest, so a
# wrong learning rate shows most (2 ranks at K = 2 have 15 steps in it).
STEPS = 12
# The bytes per micro-batch at K = 2 against K = 1's: 1/2, and the band the checks allow around it.
SHARE_TOLERANCE = 0.05
# 1 rank at K = 2 against 2 ranks at K = 1, the same global batch (128) and learning rate (0.04): their train
# losses, step by step, differ by at most this much on average (`loss_gap`, in nats). Not 0: the two runs see
# the same samples each epoch, but grouped into other global batches (a rank's DistributedSampler shard is
# every 2nd sample of the shuffle; one rank's is all of it, in order), and they draw other dropout masks.
# Measured (benchmarks/bench_grad_accum.py, STEPS steps, seeds 1-5, a 2-core VM, 2026-11-28): 0.015-0.030;
# with the loss not divided by K (the same as twice the learning rate for SGD with momentum) 0.18-0.53. The
# tolerance sits between them, with room on both sides for another machine's arithmetic.
LOSS_TOLERANCE = 0.08
# Where a run's records carry the loopback counters of its namespace.
_NETNS_SH = 'ip link set lo up 2>/dev/null; "$@"; rc=$?; grep "lo:" /proc/net/dev > "$NETNS_OUT"; exit $rc'


@dataclass
class Run:
    """One run of lab 3's script: its shape, what it printed, the bytes its namespace's loopback carried and
    the all-reduce calls its profiler trace recorded per optimizer step."""

    ranks: int
    grad_accum: int
    batch_size: int
    lr: float  # as given (--lr); the script multiplies it by ranks x K (--scale-lr)
    records: list[dict[str, Any]]
    loopback_bytes: int | None  # everything the run sent over loopback (start-up, steps, test, save)
    private: bool  # measured in a network namespace of its own (else: the machine's shared loopback)
    wall_s: float
    calls_per_step: float | None = None  # all-reduce calls per optimizer step, from rank 0's trace
    elements_per_step: float | None = None  # the elements they all-reduced per optimizer step
    bucket_cap_mb: float = 0.0
    folder: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.ranks} rank{'s' if self.ranks > 1 else ''}, K = {self.grad_accum}"

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.grad_accum * self.ranks

    @property
    def effective_lr(self) -> float:
        return self.lr * self.ranks * self.grad_accum

    @property
    def steps(self) -> int:
        """Optimizer steps taken (rank 0's last step)."""
        return int(max(r["step"] for r in self.records if "step" in r))

    @property
    def micro_batches(self) -> int:
        """Micro-batches each rank trained on."""
        return self.steps * self.grad_accum

    @property
    def bytes_per_step(self) -> float | None:
        return None if self.loopback_bytes is None else self.loopback_bytes / self.steps

    @property
    def bytes_per_micro_batch(self) -> float | None:
        return None if self.loopback_bytes is None else self.loopback_bytes / self.micro_batches

    def losses(self) -> dict[int, float]:
        """The train loss of each logged optimizer step over the whole global batch: the mean of every rank's
        (each its mean over its K micro-batches; all micro-batches hold --batch-size samples)."""
        by_step: dict[int, list[float]] = {}
        for r in self.records:
            if "train_loss" in r:
                by_step.setdefault(int(r["step"]), []).append(float(r["train_loss"]))
        return {s: sum(v) / len(v) for s, v in sorted(by_step.items()) if len(v) == self.ranks}

    def late_train_loss(self) -> float:
        """The mean train loss over the last half of the logged steps."""
        values = list(self.losses().values())
        return statistics.fmean(values[len(values) // 2:])

    @property
    def test_loss(self) -> float:
        return float(next(r["final_test_loss"] for r in reversed(self.records) if "final_test_loss" in r))

    @property
    def test_accuracy(self) -> float:
        return float(next(r["final_test_accuracy"] for r in reversed(self.records) if "final_test_accuracy" in r))

    @property
    def samples_per_sec(self) -> float:
        return float(next(r["samples_per_sec"] for r in reversed(self.records) if "samples_per_sec" in r))


def loss_gap(a: Run, b: Run) -> float:
    """How far two runs' train losses are apart: the mean |difference| over the optimizer steps both logged
    (each step's loss over its whole global batch)."""
    la, lb = a.losses(), b.losses()
    both = sorted(set(la) & set(lb))
    if not both:
        raise AssertionError(f"{a.label} and {b.label} logged no step in common")
    return statistics.fmean(abs(la[s] - lb[s]) for s in both)


def private_network() -> tuple[bool, str]:
    """Whether a run can have a network namespace of its own here (`unshare -rn`), and if not, why."""
    from workshop.launchers.horovod_probe import private_network as check

    return check()


def _parse(lines: list[str]) -> list[dict[str, Any]]:
    from workshop import metrics

    return metrics.parse_lines(lines)


def run(ranks: int, grad_accum: int, steps: int, *, channels: Any, folder: Path, batch_size: int = 64,
        lr: float = 0.02, seed: int = 1, epochs: int = 1, bucket_cap_mb: float = 0.0, profile_steps: int = 0,
        log_interval: int = 1, private: bool | None = None, timeout_s: float = 300) -> Run:
    """Lab 3's script on `ranks` local ranks (torchrun; one plain process for 1) for `steps` optimizer steps an
    epoch (--max-steps), `grad_accum` micro-batches each, one thread per rank. In a private network namespace
    where the system allows one (`private`: None, there if it can; True insists), whose loopback counters
    then hold this run's bytes alone. With `profile_steps`, rank 0's trace gives the all-reduce calls and
    elements of each profiled optimizer step."""
    from workshop.runtime.contract import base_process_env

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    argv = [str(SCRIPT), "--epochs", str(epochs), "--max-steps", str(steps), "--grad-accum", str(grad_accum),
            "--batch-size", str(batch_size), "--lr", str(lr), "--seed", str(seed), "--threads", "1",
            "--log-interval", str(log_interval), "--bucket-cap-mb", str(bucket_cap_mb),
            "--profile-steps", str(profile_steps), "--train", str(channels.train_dir), "--test", str(channels.test_dir),
            "--model-dir", str(folder / "model"), "--checkpoint-dir", str(folder / "checkpoints"),
            "--output-dir", str(folder / "output")]
    if ranks == 1:
        cmd = [sys.executable, *argv]
    else:  # --standalone: a rendezvous on a free local port (in the namespace, no other job's ports)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *argv]
    from workshop.launchers.horovod_probe import in_private_network, wanted_private_network

    isolated = wanted_private_network(private)
    env = {**base_process_env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    counters = folder / "loopback.txt"
    if isolated:
        env["NETNS_OUT"] = str(counters)
        cmd = in_private_network(["sh", "-c", _NETNS_SH, "sh", *cmd])
    from workshop.runtime import netcounters

    before = None if isolated else netcounters.read_loopback()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=HERE, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout_s)
    wall = time.perf_counter() - t0
    lines = (proc.stdout + proc.stderr).splitlines()
    (folder / "output.log").write_text("\n".join(lines) + "\n")
    if proc.returncode != 0:
        tail = "\n".join(lines[-30:])
        raise RuntimeError(f"lab 3's script ({ranks} ranks, K = {grad_accum}) failed, exit status {proc.returncode}:"
                           f"\n{tail}")
    if isolated:
        sent: int | None = int(counters.read_text().split(":", 1)[1].split()[8])  # transmit bytes (= received, on lo)
    else:
        after = netcounters.read_loopback()
        sent = None if before is None or after is None else (after - before).tx_bytes
    result = Run(ranks, grad_accum, batch_size, lr, _parse(lines), sent, isolated, wall, bucket_cap_mb=bucket_cap_mb,
                 folder=folder)
    if profile_steps:
        result.calls_per_step, result.elements_per_step = all_reduce_calls(folder / "output" / "profile" /
                                                                           "trace-rank0.json")
    return result


def all_reduce_calls(trace_path: Path) -> tuple[float, float]:
    """(all-reduce calls, elements) per profiled optimizer step of one rank's trace: DDP's gradient buckets,
    the all-reduces of a flat (1-D) tensor inside each `ProfilerStep#N`; the script's NaN check all-reduces a
    (ranks x 3) table at its log lines, which is not a bucket."""
    from workshop.trace_report import STEP_PREFIX, load_trace

    events = [e for e in load_trace(trace_path)["traceEvents"] if e.get("ph") == "X" and "dur" in e and "ts" in e]
    steps = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if str(e.get("name", "")).startswith(STEP_PREFIX)]
    calls = elements = 0
    for e in events:
        dims = (e.get("args", {}).get("Input Dims") or [[]])[0]
        if e.get("name") == "c10d::allreduce_" and len(dims) == 1 and len(dims[0]) == 1 \
                and any(t0 <= float(e["ts"]) < t1 for t0, t1 in steps):
            calls, elements = calls + 1, elements + dims[0][0]
    return calls / len(steps), elements / len(steps)


# --------------------------------------------------------------------------- DDP's buckets


def gradient_sizes(model: Any) -> list[int]:
    """Each parameter's gradient bytes, in the order backward produces them (the reverse of the model's
    parameters, for a network of layers run in order): the order DDP fills its buckets in after the first step."""
    return [p.numel() * p.element_size() for p in reversed(list(model.parameters()))]


def bucket_count(sizes: list[int], cap_mb: float) -> int:
    """The buckets DDP makes of gradients of `sizes` bytes (in backward's order) at --bucket-cap-mb `cap_mb`
    (0: DDP's default, 25 MiB with a first bucket of 1 MiB): each gradient goes whole into the open bucket,
    which closes once it holds its cap or more (torch's `_compute_bucket_assignment_by_size`). One all-reduce
    per bucket per step: ceil(gradient bytes / cap) when every gradient is small against the cap, fewer when
    one is not (a gradient is never split)."""
    mib = 1024 * 1024
    cap, first = (25 * mib, 1 * mib) if not cap_mb else (int(cap_mb * mib),) * 2
    count, filled, limit = 0, 0, first
    for size in sizes:
        filled += size
        if filled >= limit:
            count, filled, limit = count + 1, 0, cap
    return count + (filled > 0)


def naive_bucket_count(total_bytes: int, cap_mb: float) -> int:
    """ceil(gradient bytes / bucket bytes): the count if gradients could be split anywhere."""
    cap = (cap_mb or 25) * 1024 * 1024
    return math.ceil(total_bytes / cap)


# --------------------------------------------------------------------------- the notebook's comparison


@dataclass
class Comparison:
    """Three runs of `steps` optimizer steps: 2 ranks at K = 1 (`reference`), 2 ranks at K = 2 (`accumulated`,
    for the bytes), 1 rank at K = 2 (`one_rank`, for the losses: the reference's global batch and rate)."""

    reference: Run
    accumulated: Run
    one_rank: Run

    @property
    def runs(self) -> list[Run]:
        return [self.reference, self.accumulated, self.one_rank]

    @property
    def share_per_step(self) -> float:
        return self.accumulated.bytes_per_step / self.reference.bytes_per_step

    @property
    def share_per_micro_batch(self) -> float:
        return self.accumulated.bytes_per_micro_batch / self.reference.bytes_per_micro_batch

    @property
    def loss_gap(self) -> float:
        """The train losses of 1 rank at K = 2 and 2 ranks at K = 1, step by step: their mean |difference|."""
        return loss_gap(self.one_rank, self.reference)

    def rows(self) -> list[dict[str, Any]]:
        """One row per run, for `workshop.teaching.table`: the bytes of the 2-rank runs, the losses of the two
        compared (the middle run, at twice the global batch, is there for its bytes)."""
        compared = (id(self.reference), id(self.one_rank))
        return [{
            "run": r.label, "global batch": r.global_batch, "lr": r.effective_lr, "optimizer steps": r.steps,
            "micro-batches per rank": r.micro_batches,
            "all-reduces per step (trace)": r.calls_per_step if r.ranks > 1 else None,
            "MB per step": r.bytes_per_step / 1e6 if r.ranks > 1 and r.bytes_per_step is not None else None,
            "MB per micro-batch": r.bytes_per_micro_batch / 1e6 if r.ranks > 1 and r.bytes_per_micro_batch is not None
            else None,
            "last train loss": list(r.losses().values())[-1] if id(r) in compared else None,
            "test loss": r.test_loss if id(r) in compared else None,
        } for r in self.runs]

    def check(self) -> str:
        """Raise AssertionError with what went wrong, or return what held, in words."""
        problems = []
        for r in self.runs:
            if r.loopback_bytes is None:
                problems.append(f"{r.label}: no loopback counters here, so its bytes were not measured")
        if problems:
            raise AssertionError("; ".join(problems))
        share = self.share_per_micro_batch
        if abs(share - 0.5) > SHARE_TOLERANCE:
            problems.append(f"each micro-batch at K = 2 moved {share:.3f} of K = 1's bytes, not 0.50 +- "
                            f"{SHARE_TOLERANCE}: is the first micro-batch's backward inside model.no_sync()?")
        ref, acc = self.reference, self.accumulated
        if acc.calls_per_step is not None and ref.calls_per_step is not None and acc.calls_per_step != ref.calls_per_step:
            problems.append(f"the trace shows {acc.calls_per_step:g} all-reduces per optimizer step at K = 2 and "
                            f"{ref.calls_per_step:g} at K = 1: they should be the same (one per bucket, per step)")
        if self.one_rank.global_batch != ref.global_batch or self.one_rank.effective_lr != ref.effective_lr:
            problems.append("the 1-rank run's global batch or learning rate differ from the 2-rank run's")
        if self.loss_gap > LOSS_TOLERANCE:
            problems.append(f"the train losses of 1 rank at K = 2 and 2 ranks at K = 1 are {self.loss_gap:.3f} apart "
                            f"per step on average, more than {LOSS_TOLERANCE}: is each micro-batch's loss divided by K?")
        if problems:
            raise AssertionError("; ".join(problems))
        calls = "" if acc.calls_per_step is None else f", with {acc.calls_per_step:g} all-reduces per step at either K"
        return (f"per micro-batch, K = 2 moved {share:.3f} of K = 1's bytes (0.50 +- {SHARE_TOLERANCE}){calls}; "
                f"1 rank at K = 2 and 2 ranks at K = 1: train losses {self.loss_gap:.3f} apart per step on average "
                f"(tolerance {LOSS_TOLERANCE}), test loss {self.one_rank.test_loss:.3f} and {self.reference.test_loss:.3f}")


def compare(steps: int = STEPS, *, data_dir: str | Path | None = None, workdir: str | Path | None = None,
            profile_steps: int = 3, private: bool | None = None, echo: bool = True) -> Comparison:
    """The three runs of `Comparison`, one after the other (each takes 5-10 s on 2 cores, most of it starting
    its processes), rank 0 profiled for `profile_steps` optimizer steps in the 2-rank runs."""
    from workshop.labs import get_lab
    from workshop.runtime.local_cluster import DEFAULT_RUNS_DIR

    channels = get_lab("data_parallel").data.prepare(data_dir)
    if workdir is None:  # beside the lab's other runs (runs/), each run's log, trace and model kept
        DEFAULT_RUNS_DIR.mkdir(parents=True, exist_ok=True)
        workdir = tempfile.mkdtemp(prefix=f"grad-accum-{time.strftime('%Y%m%d-%H%M%S')}-", dir=DEFAULT_RUNS_DIR)
    root = Path(workdir)
    shapes = {"reference": (2, 1), "accumulated": (2, 2), "one_rank": (1, 2)}
    runs = {}
    for name, (ranks, k) in shapes.items():
        runs[name] = run(ranks, k, steps, channels=channels, folder=root / name, private=private,
                         profile_steps=profile_steps if ranks > 1 else 0)
        if echo:
            r = runs[name]
            where = "a private" if r.private else "the shared"
            mb = "no all-reduce" if r.ranks == 1 else "not measured" if r.bytes_per_step is None else \
                f"{r.bytes_per_step / 1e6:.2f} MB per step on {where} loopback"
            print(f"{r.label}: {r.steps} optimizer steps of {r.global_batch} samples, {mb}, {r.wall_s:.1f} s", flush=True)
    return Comparison(**runs)


if __name__ == "__main__":  # a quick look from a terminal: python 3_data_parallel/accumulation.py
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(compare().check())
