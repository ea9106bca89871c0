"""Checkpoints to trust, and resuming from them (lab 3).

Rank 0 writes `checkpoint.pt` in the checkpoint folder at the end of each epoch and, with
`--checkpoint-every N`, after every N-th global step too (global steps: optimizer steps counted from 1
across epochs). The file is replaced whole (written to `checkpoint.pt.tmp`, fsynced, renamed, the folder
fsynced), so a crash mid-write leaves the previous checkpoint. It holds the position (whole epochs done,
batches done of the next, the global step), the model, the optimizer and every rank's RNG state, so a run
resumed mid-epoch sees exactly the batches and dropout an uninterrupted one would; rank 0 reports each
one's cost as `METRICS rank=0 step=N checkpoint_s=S`. The SHA-256 of a checkpoint's content, saved inside
it, is verified when a run resumes: a damaged checkpoint stops the run before it trains, named (see
`load_checkpoint`). A NaN or infinite loss stops every rank before it is checkpointed (see `Divergence`).
What a killed save left (`checkpoint.pt.tmp`) is removed when the next run starts (see `clean_stale`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import os
import re
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from contract import exit_with, metrics
from fault_tolerance import announce_resume, read_recovery, write_atomic


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


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
        dist.all_gather_object(rngs, rng)  # every rank's RNG state, for rank 0 to save
    if rank == 0:
        state = {**position, "model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict(), "rng": rngs,
                 "world_size": world_size, "batch_size": batch_size}
        state[CHECKSUM_KEY] = state_digest(state)  # what load_checkpoint verifies
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda f: torch.save(state, f))
    if world_size > 1:
        dist.barrier()  # no rank goes on (or dies) before the checkpoint is complete
    return time.perf_counter() - t0


def checkpoint(path: Path, model, optimizer, position: dict, batch_size: int, rank: int, world_size: int) -> None:
    """save_checkpoint, then rank 0's METRICS line of what it cost (`checkpoint_s`)."""
    took = save_checkpoint(path, model, optimizer, position, batch_size, rank, world_size)
    if rank == 0:
        metrics(rank=0, step=position["step"], checkpoint_s=took)


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

    Diverged: a loss that is not finite, or (given `classes`) a loss more than TIMES (100) times an untrained
    model's, the cross-entropy of a uniform guess over `classes`, ln(classes) (2.3 for ten digits): weights
    that blew up, whatever they do next (lab 3 at --lr 100: 6.4e+20 at step 5, then 300-490 to the end, at
    chance, never NaN). A healthy start stays well below it (lab 3 at --lr 0.4: 22 at most).

    Every rank calls `note(loss, step)` after each step: it records the first global step whose loss on
    this rank diverged, on the device, without waiting for it. Every rank calls `check(step)` at the
    same points (a log line, before a checkpoint, at an epoch's end): one all-reduce tells every rank
    each rank's first bad step, and if there is one, every rank stops (exit_with) with the same message:
    the step, the rank, the loss, and `fix`. `weights=` the model about to be saved: its parameters
    (this rank's shards) must be finite too, since a huge step can overflow them while the loss that
    led to it was still finite. `sum_over_ranks(tensor)` returns the tensor summed over every rank (an
    all-reduce: torch.distributed's, or Horovod's)."""

    TIMES = 100

    def __init__(self, device: torch.device, rank: int, world_size: int, sum_over_ranks, fix: str,
                 classes: int | None = None):
        self.rank, self.world_size, self.sum_over_ranks, self.fix = rank, world_size, sum_over_ranks, fix
        self.classes = classes
        self.untrained = math.log(classes) if classes else None  # an untrained model's loss
        self.first = torch.zeros((), dtype=torch.float64, device=device)  # first bad step (0: none)
        self.value = torch.zeros((), dtype=torch.float64, device=device)  # its loss (nan, inf, -inf or too high)

    def note(self, loss: torch.Tensor, step: int) -> None:
        loss = loss.detach().to(torch.float64)
        bad = ~torch.isfinite(loss)
        if self.untrained is not None:
            bad = bad | (loss > self.TIMES * self.untrained)
        new = (self.first == 0) & bad
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
            what = f"the loss was {value:g} at global step {int(first)} on rank {rank}"
            if math.isfinite(value):
                what += (f", {value / self.untrained:.3g} times an untrained model's ({self.untrained:.2g}, a uniform "
                         f"guess over {self.classes} classes)")
            others = [f"rank {r} at step {int(f)}" for f, r, _, w in bad if not w and r != rank]
            if others:
                what += f" (and on {', '.join(others)})"
        exit_with(f"Training diverged: {what}. The run stops here, before it checkpoints the broken weights: "
                         f"the checkpoints already written stay as they were. Fix: {self.fix}.")


class SkipFirst(torch.utils.data.Sampler):
    """The wrapped sampler's indices but the first `skip`: a run resumed mid-epoch trains on the rest of
    the epoch's batches, the very ones an uninterrupted run would, without loading those it skips."""

    def __init__(self, sampler, skip: int = 0):
        self.sampler, self.skip = sampler, skip

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)


def set_rng_state(rng: dict) -> None:
    torch.set_rng_state(rng["cpu"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def unwrap(model: nn.Module) -> nn.Module:
    """The model itself: DDP keeps the model it wraps as `.module`; a world of one has no wrapper."""
    return model.module if isinstance(model, DDP) else model


def resume(checkpoint_dir: Path, model: nn.Module, optimizer, rank: int, world_size: int, attempt: int,
           epochs: int, batch_size: int, per_epoch: int, grad_accum: int = 1) -> tuple[int, int, int, dict | None, dict | None]:
    """Every rank, before training: where this run starts. Rank 0 removes what a killed save left
    (clean_stale) and loads `checkpoint.pt` if there is one (verified: a damaged one stops every rank, named);
    every rank loads the model and optimizer from it and prints (rank 0) where it resumes.

    Returns (the first epoch, the batches of it already done, the global step, the RNG state still to
    restore at that batch (None: restored already, or none), the recovery to report (rank 0, after a restart)
    or None). The position: `epoch` whole epochs done, then `batch` batches of the next (0 at an epoch's end):
    micro-batches of `batch_size`, `grad_accum` (--grad-accum) to an optimizer step, of which the epoch has
    `per_epoch`. A run resumes at an optimizer step's boundary: where the checkpoint's world, batch or
    --grad-accum differ from this run's, at the last whole step of this run's shape before the same share
    of the epoch (its few micro-batches past it are trained on again)."""
    ckpt_dir = Path(checkpoint_dir)
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
    if world_size > 1:
        dist.broadcast_object_list(state, src=0)  # rank 0's checkpoint reaches every rank, whichever hosts have the file
    if isinstance(state[0], str):
        exit_with(state[0])
    start_epoch, skip, step, rng, recovery = 1, 0, 0, None, None
    if state[0] is not None:
        ckpt = state[0]
        unwrap(model).load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch, skip = ckpt["epoch"] + 1, ckpt.get("batch", 0)
        step = ckpt.get("step", ckpt["epoch"] * per_epoch + skip // grad_accum)
        resharded = skip and (ckpt.get("world_size"), ckpt.get("batch_size")) != (world_size, batch_size)
        if resharded:  # the same share of the epoch's samples, in batches of this world's shape
            skip = skip * ckpt["world_size"] * ckpt["batch_size"] // (world_size * batch_size)
        skip -= skip % grad_accum  # whole optimizer steps of this run's --grad-accum
        rngs = ckpt.get("rng") or [None]
        rng = rngs[rank] if len(rngs) == world_size else rngs[0]
        if rank == 0:
            recovery = read_recovery(ckpt_dir, step, attempt)
            announce_resume(ckpt_path, step, recovery)
            if start_epoch > epochs:
                print(f"Nothing left to train: the run had already finished. {ckpt_path} holds epoch {ckpt['epoch']} "
                      f"(step {step}) and this run trains --epochs {epochs}; its model is evaluated and saved "
                      "as it is.", flush=True)
            elif skip:
                done = f"batch {skip} of {per_epoch}" if grad_accum == 1 else \
                    f"micro-batch {skip} of {per_epoch * grad_accum} (optimizer step {skip // grad_accum} of {per_epoch})"
                print(f"Resumed from {ckpt_path} in epoch {start_epoch}, after its {done}"
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
    return start_epoch, skip, step, rng, recovery
