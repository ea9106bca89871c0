"""The PyTorch script's checkpoints: written whole, verified on load, never of a diverged run.

Rank 0 writes `checkpoint.pt` after each epoch and reads it back when a run starts (train_pytorch.py
broadcasts it to the other ranks). The `# Shared copy:` definitions are in labs 3 and 4 too.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import shutil
from pathlib import Path

import torch
import torch.nn as nn

from contract import exit_with


def read_checkpoint(rank: int, path: Path) -> dict | str | None:
    """On rank 0: the checkpoint at `path`, verified, after removing what a killed run left half-written
    there (before anything reads or writes the folder); None if there is none; the reason (text) if it is
    damaged, which stops every rank before training. On the other ranks: None (rank 0's is broadcast)."""
    if rank != 0:
        return None
    clean_stale(path.parent)
    try:
        return load_checkpoint(path)
    except ValueError as exc:
        return str(exc)


def resume(state: dict | str | None, model: nn.Module, optimizer, path: Path, epochs: int, rank: int) -> int:
    """The first epoch to train: 1 without a checkpoint, else the one after the checkpoint's, with its
    weights and optimizer state loaded (`state`: rank 0's read_checkpoint, broadcast; text stops the run)."""
    if isinstance(state, str):
        exit_with(state)
    if state is None:
        return 1
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start_epoch = state["epoch"] + 1
    if rank == 0 and start_epoch > epochs:
        print(f"Nothing left to train: the run had already finished. {path} holds epoch {state['epoch']} and "
              f"this run trains --epochs {epochs}; its model is evaluated and saved as it is.", flush=True)
    elif rank == 0:
        print(f"Resumed from {path} after epoch {state['epoch']}.", flush=True)
    return start_epoch


def save_checkpoint(path: Path, epoch: int, model: nn.Module, optimizer) -> None:
    """Rank 0, after each epoch: the model and optimizer with their SHA-256 (what load_checkpoint verifies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    checkpoint[CHECKSUM_KEY] = state_digest(checkpoint)
    save_atomic(checkpoint, path)


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
