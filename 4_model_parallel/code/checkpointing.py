"""Sharded checkpoints with torch.distributed.checkpoint (DCP), and resuming from them.

With `--checkpoint-every N` every rank writes its own shard of the model and the AdamW state every N
steps and after the last. A run resumes from the newest complete checkpoint in --checkpoint-dir whose
files match their checksums (a damaged one is reported and passed over for an older one), at any world
size (DCP reshards), with the data generator where it was, so it trains on the batches an uninterrupted
run would. A NaN or infinite loss stops every rank before it is checkpointed (see `Divergence`). The
default, --checkpoint-every 0, writes no checkpoint, so the measurements stay free of checkpoint I/O.

No file system is shared between hosts (on SageMaker each host's /opt/ml/checkpoints is its own disk,
synced with the checkpoint S3 URI; the local cluster's hosts likewise): each host's folder gets the shards
its own ranks write, plus a copy of the small files every rank needs to load (`.metadata`, `meta.pt`,
`checksums.json`: INDEX_FILES, which rank 0 sends to every host). So S3, where every host uploads its
folder, holds the whole checkpoint, and a new job (a spot restart, a job resumed later) downloads it
whole; a rank restarted inside the job (torchrun --max-restarts keeps each rank on its host) finds its own
shards and the index on its own host. Before loading, every rank checks the files its part of the load
reads (DCP's load plan names them) on its own host, and the checkpoint resumed from is the newest that
every rank can load (see `resume`). Where hosts do share the folder (one host, or a shared file system
such as FSx for Lustre), the same steps write each file once.

<checkpoint-dir>/step-<N>/: one torch.distributed.checkpoint (DCP) folder per checkpoint, each rank's
shard in its own file plus DCP's `.metadata`, rank 0's `meta.pt` (step, RNG, model shape), and
`checksums.json` (each file's size and SHA-256). Written as step-<N>.partial/ and renamed by each host
once every rank's shard is in and summed and the index is on every host; then `latest` (the folder's
name) is replaced atomically.
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
import math
import os
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from contract import distributed_env, exit_with
from fault_tolerance import announce_resume, fsync_dir, read_recovery, write_atomic

KEEP_CHECKPOINTS = 2  # the newest intact ones; older ones are deleted after each save
CHECKSUMS = "checksums.json"
# What every host keeps a copy of, beside the shards its own ranks write: DCP's index (which slice of
# which tensor is in which file: every rank reads it to load), rank 0's meta.pt, and the checksums.
INDEX_FILES = (".metadata", "meta.pt", CHECKSUMS)


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


def model_shape(args: argparse.Namespace) -> dict:
    return {"layers": args.layers, "d_model": args.d_model, "heads": args.heads, "seq_len": args.seq_len}


def is_complete(folder: Path) -> bool:
    return (not folder.name.endswith(".partial") and (folder / ".metadata").is_file()
            and (folder / "meta.pt").is_file())


def find_checkpoint(checkpoint_dir: str | Path, damaged: list[tuple[Path, str]] | None = None) -> Path | None:
    """The checkpoint to resume from: the one `latest` names if it is complete and intact, else the
    intact step-<N> folder with the largest N; None if there is none. Partial folders are never chosen;
    each complete one found damaged on the way is added to `damaged` as (folder, why)."""
    for path in candidates(checkpoint_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            if not (path / CHECKSUMS).is_file():
                print(f"The checkpoint {path} has no {CHECKSUMS} (an older version of this script wrote it): it "
                      "is used unverified.", flush=True)
            return path
        if damaged is not None:
            damaged.append((path, problem))
    return None


def candidates(checkpoint_dir: str | Path) -> list[Path]:
    """The complete checkpoints in `checkpoint_dir`, in the order they are tried: the one `latest` names
    first, then by step, newest first."""
    folder = Path(checkpoint_dir)
    try:
        name = (folder / "latest").read_text().strip()
    except OSError:
        name = ""
    found = [(int(m[1]), p) for p in folder.glob("step-*") if (m := re.fullmatch(r"step-(\d+)", p.name))]
    ordered = [p for _, p in sorted(found, reverse=True) if is_complete(p)]
    if re.fullmatch(r"step-\d+", name) and folder / name in ordered:
        ordered.remove(folder / name)
        ordered.insert(0, folder / name)
    return ordered


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_sums(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, str]]:
    """Each file in `folder` (but `skip`, and CHECKSUMS): name -> (size, SHA-256), read back from the disk."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name not in (CHECKSUMS, *skip))
    return {p.name: (p.stat().st_size, file_sha256(p)) for p in files}


def write_checksums(folder: Path, elsewhere: dict[str, tuple[int, str]] | None = None) -> None:
    """Rank 0, once every file of the checkpoint is written: each one's size and SHA-256 into CHECKSUMS
    (itself written atomically: a checkpoint has all its sums or none). The files in `folder` are read
    back from the disk; `elsewhere` has the sums of those on other hosts, summed there (`file_sums`)."""
    sums = {**(elsewhere or {}), **file_sums(folder)}
    record = {"bytes": {name: size for name, (size, _) in sorted(sums.items())},
              "sha256": {name: sha for name, (_, sha) in sorted(sums.items())}}
    write_atomic(folder / CHECKSUMS, lambda f: f.write(json.dumps(record, indent=1, sort_keys=True).encode()))


def checkpoint_problem(folder: Path, names=None) -> str | None:
    """Why the complete checkpoint `folder` cannot be trusted (a file missing, cut short, or changed since
    it was written), or None when every file matches its checksum; with `names`, only those files are
    checked (what one rank reads, what one host holds). A checkpoint from before checksums (no CHECKSUMS
    file) cannot be checked: None (find_checkpoint says it is used unverified)."""
    try:
        record = json.loads((folder / CHECKSUMS).read_text())
        sizes, sums = record["bytes"], record["sha256"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its {CHECKSUMS} cannot be read ({exc})"
    for name in sorted(sums if names is None else set(names) & set(sums)):
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


def host_place(rank: int) -> tuple[int, int, bool]:
    """(this rank's host, the number of hosts, whether it is its host's first rank), from what torchrun set
    (ranks fill hosts in order: LOCAL_WORLD_SIZE per host); a world of one is one host."""
    _, world_size, local_rank, local_world_size = distributed_env()
    return rank // local_world_size, max(1, world_size // local_world_size), local_rank == 0


def save_checkpoint(checkpoint_dir: str | Path, step: int, model, optimizer, meta: dict, rank: int,
                    distributed: bool) -> Path:
    """Every rank calls it; each writes its own shard of the model and optimizer (DCP) into its host's
    checkpoint folder. Then every host holds its own ranks' shards and a copy of INDEX_FILES (see the
    module docstring): each host's first rank sums the shards on its host, rank 0 writes meta.pt and the
    checksums of every file and sends the index to every host, and each host, one after another, renames
    its step-<N>.partial/ and writes `latest`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(checkpoint_dir)
    final, partial = folder / f"step-{step}", folder / f"step-{step}.partial"
    host, hosts, first = host_place(rank)
    if first:  # each host its own folder (on a shared one, every first rank makes the same empty folder)
        shutil.rmtree(partial, ignore_errors=True)  # what a crashed attempt left of the same step
        partial.mkdir(parents=True, exist_ok=True)
    if distributed:
        dist.barrier()  # the folder is empty and there before any rank writes into it
    # each rank's local shards (FSDP2's DTensors) with their place in the full tensors
    model_state, optim_state = get_state_dict(model, optimizer)
    # every rank writes its own file, fsynced, on its host; rank 0 then writes `.metadata` (the index of all)
    with single_process_quiet():
        written = dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=partial)
    # Each host's first rank sums the shards its host holds, for rank 0's checksums of the whole checkpoint.
    mine = file_sums(partial, skip=INDEX_FILES) if first else {}
    sums = [mine]
    if distributed:
        sums = [None] * dist.get_world_size()
        dist.all_gather_object(sums, mine)
    index = [None]
    if rank == 0:
        shards = {name: value for part in sums for name, value in (part or {}).items()}
        missing = sorted({info.relative_path for info in written.storage_data.values()} - shards.keys())
        if missing:  # on no host: a rank's write failed without an error
            raise RuntimeError(f"The checkpoint {partial} lacks {', '.join(missing)}: no host's checkpoint folder "
                               "holds it, although torch.distributed.checkpoint saved it without an error.")
        write_atomic(partial / "meta.pt", lambda f: torch.save(meta, f))
        write_checksums(partial, shards)  # the last file in: it vouches for every other
        index = [{name: (partial / name).read_bytes() for name in INDEX_FILES}]
    if distributed:
        dist.broadcast_object_list(index, src=0)  # a few KB: DCP's index, rank 0's meta.pt, the checksums
    if first and rank != 0:
        for name, data in index[0].items():
            if not (partial / name).exists():  # a folder of this host's own (a shared one has rank 0's already)
                write_atomic(partial / name, lambda f, data=data: f.write(data))
    # One host after another (where hosts share the folder, the first one's rename does it for all):
    # no rank goes on (or dies) before the checkpoint is complete on every host.
    for turn in range(hosts):
        if turn == host and first:
            finish_save(folder, partial, final)
        if distributed:
            dist.barrier()
    return final


def finish_save(folder: Path, partial: Path, final: Path) -> None:
    """On each host, once its step-<N>.partial/ holds its shards and the index: the rename that makes the
    checkpoint complete, `latest`, and the rotation (KEEP_CHECKPOINTS)."""
    if partial.is_dir():
        fsync_dir(partial)
        if final.exists():  # a complete checkpoint of the same step, from before a resume: replaced
            shutil.rmtree(final)
        os.rename(partial, final)  # the checkpoint is complete on this host from this instant
        fsync_dir(folder)
    try:
        latest = (folder / "latest").read_text()
    except OSError:
        latest = ""
    if latest != final.name:
        write_atomic(folder / "latest", lambda f: f.write(final.name.encode()))
    # Keep the KEEP_CHECKPOINTS newest intact checkpoints (this one, summed as it was written, and the
    # newest that verify before it): a damaged one does not count, so the last good one is never
    # deleted for it. Anything older than the kept ones goes; a damaged one newer than them stays (a
    # later save of its step replaces it), for the user to see. Each host judges the files it holds
    # (another host's shards are not here to check); every host keeps the same ones unless a file of its
    # own is damaged.
    steps = sorted((int(p.name[5:]), p) for p in folder.glob("step-*") if re.fullmatch(r"step-\d+", p.name))
    kept = 0
    for _, old in reversed(steps):
        if kept >= KEEP_CHECKPOINTS:
            shutil.rmtree(old, ignore_errors=True)
        elif old == final or (is_complete(old) and checkpoint_problem(old, held(old)) is None):
            kept += 1
    for old in folder.glob("step-*.partial"):  # no other save is under way: leftovers of crashes
        shutil.rmtree(old, ignore_errors=True)


def held(folder: Path) -> list[str]:
    """The files of checkpoint `folder` that are on this host (its own ranks' shards, the index)."""
    return [p.name for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []


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


def files_to_read(path: Path, state: dict | None, rank: int) -> set[str] | tuple[str, str]:
    """The files of checkpoint `path` this rank reads to load `state` (its own shards' layout): what DCP's
    load plan names (a rank reads its own shards' slices, and each replicated value, such as the optimizer's
    step counts, from the one rank's file it was saved in), the index, and rank 0's meta.pt; every file
    where no plan can be made (no `state`, a checkpoint of another model). Where the index cannot be read
    on this host: ("incomplete" or "damaged", why)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader

    if not (path / ".metadata").is_file():
        host = os.environ.get("SM_CURRENT_HOST") or "its host"
        return "incomplete", f"it is not on {host} (a save cut short there)"
    try:
        metadata = FileSystemReader(path).read_metadata()
    except Exception as exc:  # whatever a damaged pickle raises (with no checksums to say so first)
        return "damaged", f".metadata cannot be read ({type(exc).__name__}: {exc})"
    files = {info.relative_path for info in metadata.storage_data.values()}
    with contextlib.suppress(Exception):  # another model's checkpoint: every file (resume says why, from meta.pt)
        planner = DefaultLoadPlanner()
        planner.set_up_planner(state, metadata, is_coordinator=False)
        files = {metadata.storage_data[item.storage_index].relative_path for item in planner.create_local_plan().items}
    return files | {".metadata"} | ({"meta.pt"} if rank == 0 else set())


def host_files(path: Path) -> dict[str, str | None]:
    """The files of checkpoint `path` on this host, each with why it cannot be trusted (None: it matches its
    checksum, or it has none to be checked by)."""
    if not path.is_dir():
        return {}
    return {name: checkpoint_problem(path, [name]) for name in held(path) if name != CHECKSUMS}


def plan_load(path: Path, reports: list) -> tuple[tuple[str, str] | None, list[tuple[str, int, int]]]:
    """From every rank's report on checkpoint `path` (its host, what its host holds (its host's first rank
    only), the files it reads: `files_to_read`): (None, the copies to make) when every rank can load it,
    every file it reads being intact on its own host or on another (which sends it: (file, from rank, to
    rank)); else ((kind, why), []): "damaged" (no intact copy of a file) or "incomplete" (no host holds it).
    Every rank computes the same answer."""
    firsts = {host: rank for rank, (host, files, _) in enumerate(reports) if files is not None}
    holdings = {host: reports[rank][1] for host, rank in firsts.items()}
    problems, copies = [], set()
    for host, _, needs in reports:
        if isinstance(needs, tuple):
            problems.append(("", *needs))
            continue
        for name in sorted(needs):
            if holdings[host].get(name, "absent") is None:
                continue  # intact here
            donor = next((h for h in sorted(holdings) if holdings[h].get(name, "absent") is None), None)
            if donor is not None:
                copies.add((name, firsts[donor], firsts[host]))
                continue
            found = [holdings[h][name] for h in sorted(holdings) if name in holdings[h]]
            if found:
                problems.append((name, "damaged", found[0]))
            else:
                problems.append((name, "incomplete", f"{name} is missing: no host holds it"))
    if problems:  # a damaged file first (a checkpoint with one is reported as damaged), then by name
        _, kind, why = min(problems, key=lambda p: (p[1] != "damaged", p[0]))
        return (kind, why), []
    return None, sorted(copies)


def fetch(path: Path, copies: list[tuple[str, int, int]], rank: int, device: torch.device) -> None:
    """Make the copies `plan_load` asked for: each file from a rank on a host that holds it to the first rank
    of a host that needs it, over the process group (64 MiB at a time), written atomically and checked
    against its checksum. Every rank calls it; each takes part only in its own copies."""
    chunk = 64 << 20
    for name, source, target in copies:
        if rank == source:
            size = (path / name).stat().st_size
            dist.send(torch.tensor([size], dtype=torch.int64, device=device), dst=target)
            with open(path / name, "rb") as f:
                while data := f.read(chunk):
                    dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device), dst=target)
        elif rank == target:
            size = torch.zeros(1, dtype=torch.int64, device=device)
            dist.recv(size, src=source)
            total = int(size.item())

            def receive(f, left=total, source=source):
                while left:
                    buffer = torch.empty(min(chunk, left), dtype=torch.uint8, device=device)
                    dist.recv(buffer, src=source)
                    f.write(buffer.cpu().numpy().tobytes())
                    left -= buffer.numel()

            write_atomic(path / name, receive)
            problem = checkpoint_problem(path, [name])
            if problem is not None:
                raise RuntimeError(f"The copy of {path / name} from rank {source} does not check: {problem}.")
            print(f"Fetched {path.name}/{name} ({total:,} bytes) from rank {source}'s host: this rank's load reads "
                  "it and its host did not hold it (each host's checkpoint folder is its own).", flush=True)


def resume(args: argparse.Namespace, model, optimizer, gen: torch.Generator, rank: int, world_size: int,
           attempt: int) -> tuple[int, float, dict | None]:
    """Every rank calls it before the first step: the first rank of each host cleans what a killed run left
    in its host's folder; then, for each of rank 0's checkpoints in turn (`candidates`: newest first), every
    rank says which files its load reads (`files_to_read`) and each host which files it holds intact, until
    one can be loaded by every rank, each file it reads being on its own host or sent by one that holds it
    (`plan_load`, `fetch`: after a restart inside the job, a host holds only what it wrote or downloaded);
    each rank then loads its shards of it and the batch generator's place. Returns (the last step done, its
    loss, what the run recovers from: rank 0's read_recovery record after a restart or a resume, else None);
    (0, 0.0, None) for a fresh start."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    start, last_loss, recovery, distributed = 0, 0.0, None, world_size > 1
    ckpt_dir = Path(args.checkpoint_dir)
    host, _, first = host_place(rank)
    if first:
        clean_stale(ckpt_dir)  # what a killed run left half-written on this host: before anything reads or writes here
    names = [[p.name for p in candidates(ckpt_dir)] if rank == 0 else None]
    if distributed:
        dist.broadcast_object_list(names, src=0)
    chosen, damaged = None, []
    if names[0]:
        try:  # this world's layout: what each rank reads
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optim": optim_state}
        except Exception:  # ZeroRedundancyOptimizer: refused below, with the fix, once a checkpoint is chosen
            state = None
        device = next(iter(model.parameters())).device
        for name in names[0]:
            path = ckpt_dir / name
            mine = (host, host_files(path) if first else None, files_to_read(path, state, rank))
            reports = [mine]
            if distributed:
                reports = [None] * world_size
                dist.all_gather_object(reports, mine)
            problem, copies = plan_load(path, reports)
            if problem is None:
                fetch(path, copies, rank, device)
                chosen = name
                break
            damaged.append((path, *problem))
    if distributed and chosen is not None:
        dist.barrier()  # every copy is in before any rank reads
    found = [None]  # rank 0's choice of checkpoint, as (its name, its meta.pt), or (text) why none can be used
    if rank == 0:
        # Each one passed over, in one line marked NOTE (the workshop shows it beside its progress display, not
        # only in the log); with none intact to resume from the run stops below, naming them all.
        instead = (f"Training resumes from the older checkpoint {ckpt_dir / chosen} instead, the newest intact one"
                   if chosen is not None else "Training starts from the beginning")
        if chosen is not None or all(kind == "incomplete" for _, kind, _ in damaged):
            for folder, kind, why in damaged:
                print(f"NOTE: The checkpoint {folder} is {kind}: {why}. {instead}.", flush=True)
        if attempt == 0 and chosen is None:  # a fresh start: a fault record left by an earlier run is not this run's
            with contextlib.suppress(FileNotFoundError):
                (ckpt_dir / "fault.json").unlink()
        if chosen is not None:
            path = ckpt_dir / chosen
            if not (path / CHECKSUMS).is_file():
                print(f"The checkpoint {path} has no {CHECKSUMS} (an older version of this script wrote it): it "
                      "is used unverified.", flush=True)
            found = [(chosen, torch.load(path / "meta.pt", map_location="cpu", weights_only=True))]
        elif any(kind == "damaged" for _, kind, _ in damaged):  # resuming was asked for, and none can be trusted
            # (only incomplete ones, saves cut short on some host as a .partial folder is on one, start afresh)
            listed = "; ".join(f"{folder.name}: {why}" for folder, _, why in damaged)
            found = [f"No intact checkpoint to resume from in {ckpt_dir} ({listed}). Fix: move the damaged "
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

