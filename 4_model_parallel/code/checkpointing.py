"""Sharded checkpoints with torch.distributed.checkpoint (DCP), and resuming from them.

With `--checkpoint-every N` every rank writes its own shard of the model and the AdamW state every N
steps and after the last. A run resumes from the newest complete checkpoint in --checkpoint-dir whose
files match their checksums (a damaged one is reported and passed over for an older one), at any world
size (DCP reshards), with the data generator where it was, so it trains on the batches an uninterrupted
run would. A NaN or infinite loss stops every rank before it is checkpointed (see `Divergence`). The
default, --checkpoint-every 0, writes no checkpoint, so the measurements stay free of checkpoint I/O.
On several hosts, every rank must see the same checkpoint folder (a shared file system, as the local
cluster's is) for a restart within the job to find every shard.

<checkpoint-dir>/step-<N>/: one torch.distributed.checkpoint (DCP) folder per checkpoint, each rank's
shard in its own file plus DCP's `.metadata`, rank 0's `meta.pt` (step, RNG, model shape), and
`checksums.json` (each file's size and SHA-256). Written as step-<N>.partial/ and renamed by rank 0
once every rank's shard is in and summed; then `latest` (the folder's name) is replaced atomically.
A checkpoint is complete iff its folder has no `.partial` suffix and holds `.metadata` and `meta.pt`:
a crash at any moment leaves the previous one loadable. It is intact iff every file matches its
checksum: a damaged one (a bad disk, a bad copy: DCP and torch.load check no checksum of their own)
is reported and passed over for an older intact one. DCP reshards on load, so a checkpoint written
by N ranks loads on M.

A module beside train.py in the job's code/ folder. The definitions marked `Shared copy` are copies of
other labs' (tests/test_copies.py keeps them identical).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from contract import exit_with
from fault_tolerance import announce_resume, fsync_dir, read_recovery, write_atomic

KEEP_CHECKPOINTS = 2  # the newest intact ones; older ones are deleted after each save
CHECKSUMS = "checksums.json"


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
        dist.barrier()  # the folder is empty and there before any rank writes into it
    # each rank's local shards (FSDP2's DTensors) with their place in the full tensors
    model_state, optim_state = get_state_dict(model, optimizer)
    # every rank writes its own file, fsynced; rank 0 then writes `.metadata` (the index of all)
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
        dist.barrier()  # no rank goes on (or dies) before the checkpoint is complete
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
        dcp.load(state, checkpoint_id=path)  # each rank reads the slices of the files it needs
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def resume(args: argparse.Namespace, model, optimizer, gen: torch.Generator, rank: int, world_size: int,
           attempt: int) -> tuple[int, float, dict | None]:
    """Every rank calls it before the first step: rank 0 cleans what a killed run left, chooses the newest
    intact checkpoint in --checkpoint-dir and tells every rank, which loads its shards of it and the batch
    generator's place. Returns (the last step done, its loss, what the run recovers from: rank 0's
    read_recovery record after a restart or a resume, else None); (0, 0.0, None) for a fresh start."""
    start, last_loss, recovery, distributed = 0, 0.0, None, world_size > 1
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
        dist.broadcast_object_list(found, src=0)  # rank 0 decides which checkpoint every rank loads
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
        load_checkpoint(path, model, optimizer)  # each rank reads what its shards need (resharding)
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
    return start, last_loss, recovery


def position(args: argparse.Namespace, step: int, gen: torch.Generator, last_loss: float, world_size: int) -> dict:
    """A checkpoint's `meta.pt`: where the run is (its step, the batch generator, the RNG) and what wrote it."""
    return {"step": step, "generator": gen.get_state(), "torch_rng": torch.get_rng_state(),
            "last_loss": last_loss, "model": model_shape(args), "world_size": world_size,
            "sharding": args.sharding}

