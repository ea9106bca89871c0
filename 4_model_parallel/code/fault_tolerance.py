"""Fault tolerance under torchrun's elastic agent (`--max-restarts K`): the same helpers as lab 3's.

A dead rank makes the agent restart every rank (TORCHELASTIC_RESTART_COUNT = 1, 2, ...), and the
script resumes from its newest complete checkpoint (checkpointing.py). `--fault kill-rank=R@step=N`
(default: the environment variable WORKSHOP_FAULT) makes rank R SIGKILL itself after step N (and that
step's checkpoint, if one is due), on the first attempt only. The resumed run prints
`resumed from <checkpoint> at step <N> (restart <k>)` and, after its first step,
`METRICS ... resumed_step=N lost_steps=L recover_s=S`.

A module beside train.py in the job's code/ folder. The definitions marked `Shared copy` are copies of
lab 3's (tests/test_copies.py keeps them identical); `Restarts`, the training loop's side of them, is this lab's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from contract import distributed_env, metrics

# Shared copy: keep identical in every script that has it (tests/test_copies.py).
FAULT_ENV = "WORKSHOP_FAULT"


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
FAULT_RECORD_KEY = "workshop/fault"  # the fault record in torchrun's agent store (see inject_fault)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def parse_fault(text: str | None) -> tuple[int, int] | None:
    """The fault that `text` (--fault, by default WORKSHOP_FAULT) asks for, as (rank, step); None when blank.

    `kill-rank=R@step=N`: the process whose global RANK is R kills itself with SIGKILL right after
    it finishes global step N, on the first attempt only (see `inject_fault`). Global steps are the
    optimizer steps of the whole run, counted from 1 across epochs (a resumed run goes on counting).
    Anything else, step 0 included, raises ValueError ("... Fix: ...").
    """
    if text is None or not text.strip():
        return None
    match = re.fullmatch(r"kill-rank=(\d+)@step=(\d+)", text)
    if not match or int(match[2]) < 1:
        raise ValueError(
            f"the fault {text!r} (--fault, or {FAULT_ENV}) is not one this script can inject: the form is "
            "kill-rank=R@step=N, R a global rank and N a global training step counted from 1. Fix: pass --fault "
            f"(or set {FAULT_ENV}) as, e.g., kill-rank=1@step=30, or leave it out."
        )
    return int(match[1]), int(match[2])


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def fault_problems(text: str | None, world_size: int, last_step: int | None) -> tuple[list[str], list[str]]:
    """check_args' rules for the fault (--fault, or WORKSHOP_FAULT), as (problems, fixes): both empty when
    there is none or it is fine.

    `last_step` is the run's last global step (None when it cannot be known before the data is read).
    """
    try:
        fault = parse_fault(text)
    except ValueError as exc:
        problem, _, fix = str(exc).partition(" Fix: ")
        return [problem.rstrip(".")], [fix.rstrip(".")]
    if fault is None:
        return [], []
    (rank, step), problems, fixes = fault, [], []
    if rank >= world_size:
        problems.append(f"the fault {text} names rank {rank}, but a world of {world_size} has ranks 0 to {world_size - 1}")
        fixes.append(f"name a rank from 0 to {world_size - 1} in --fault (or {FAULT_ENV})")
    if last_step is not None and step > last_step:
        problems.append(f"the fault {text} names step {step}, past the run's last step, {last_step}")
        fixes.append(f"name a step from 1 to {last_step} in --fault (or {FAULT_ENV}), or train for more steps")
    return problems, fixes


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def restart_count() -> int:
    """How many times this host's torchrun agent has restarted its ranks because of a failure it saw (0 on
    the first attempt). A host whose ranks are restarted because a rank on another host died keeps its
    count (torch.distributed.elastic), so hosts can disagree: see elastic_store and agreed_attempt."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def agent_store(timeout: timedelta = timedelta(seconds=60)):
    """torchrun's agent store (a TCPStore on the rendezvous host that outlives every attempt), or None
    when this process runs without torchrun's agent store."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def elastic_store(timeout: timedelta) -> tuple[dict, int]:
    """(init_process_group's store arguments, this rank's attempt: 0 on the first), under torchrun.

    torchrun's elastic agent keeps one TCPStore for all attempts (TORCHELASTIC_USE_AGENT_STORE=True,
    torch 2.13), so the ranks of a restarted attempt would find the keys the failed attempt left in
    it and connect to a dead rank's address ("Gloo connectFullMesh failed ... Connection refused";
    NCCL's counterpart is pytorch/pytorch#167288). So each rank counts its own starts in that store
    (every attempt starts every rank once, on every host, whatever each host's restart_count says)
    and a restarted attempt's ranks meet under keys of their own. On the first attempt, and without
    the agent's store: torchrun's own arguments ({}).
    """
    store = agent_store(timeout)
    if store is None:
        return {}, restart_count()
    rank, world_size, _, _ = distributed_env()
    attempt = store.add(f"workshop/starts/rank-{rank}", 1) - 1
    if attempt == 0:
        return {}, 0
    return {"store": dist.PrefixStore(f"workshop/attempt-{attempt}", store), "rank": rank, "world_size": world_size}, attempt


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def agreed_attempt(attempt: int, device: torch.device, distributed: bool) -> int:
    """The attempt number every rank uses: the largest any rank counted (hosts' restart counts can differ)."""
    if not distributed:
        return attempt
    value = torch.tensor([attempt], dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def fsync_dir(folder: Path) -> None:
    """Make a rename or a new entry in `folder` durable: fsync the folder itself (POSIX; a no-op where
    folders cannot be opened, as on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def write_atomic(path: Path, write, durable: bool = True) -> None:
    """Write `path` so that a crash at any moment leaves either its old content or its new one:
    `write(file)` fills `<name>.tmp`, which is flushed, fsynced, then renamed over `path`
    (os.replace, atomic on POSIX), and the folder is fsynced so the rename survives a power cut.
    `durable=False` skips both fsyncs: still never torn, but only safe against a process dying,
    not a machine (for records rewritten often). A leftover `.tmp` is never read."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def inject_fault(fault: tuple[int, int] | None, rank: int, step: int, checkpoint_dir: str | Path, text: str,
                 attempt: int) -> None:
    """If `fault` (parse_fault's reading of `text`) names this rank and the global step it just finished, and
    `attempt` is the first (0: a restarted job must not fail again), die as a crashing host would: SIGKILL,
    no exception, no clean-up, no exit code of its own. Before that, one line on stdout and the
    record `fault.json` in the checkpoint folder (rank, step, wall-clock time), from which the resumed
    run counts the steps lost and the seconds it took to recover; under torchrun's agent the record also
    goes to the agent's store (FAULT_RECORD_KEY), which rank 0 reads whatever host it is on."""
    if fault != (rank, step) or attempt > 0:
        return
    record = {"rank": rank, "step": step, "time": time.time(), "attempt": 0, "fault": text}
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(checkpoint_dir) / "fault.json", lambda f: f.write(json.dumps(record).encode()))
    store = agent_store()  # rank 0 may be on another host, whose checkpoint folder is not this one
    if store is not None:
        store.set(FAULT_RECORD_KEY, json.dumps(record))
    source = f"{FAULT_ENV}={text}" if os.environ.get(FAULT_ENV) == text else f"--fault {text}"
    print(f"FAULT: killing rank {rank} at step {step} ({source})", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def write_progress(checkpoint_dir: str | Path, step: int, attempt: int) -> None:
    """Rank 0's last finished global step, as `progress.json` in the checkpoint folder: how a resumed run
    knows how far the failed attempt got. Rewritten every log interval, so not fsynced: it has to
    survive the process, not the machine."""
    record = {"step": step, "time": time.time(), "attempt": attempt}
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(checkpoint_dir) / "progress.json", lambda f: f.write(json.dumps(record).encode()), durable=False)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def read_recovery(checkpoint_dir: str | Path, resumed_step: int, attempt: int) -> dict:
    """What the attempt before `attempt` left behind, measured against the checkpoint this one resumes from.

    `last_step`: the failed attempt's last finished global step; `lost_steps`: last_step minus
    `resumed_step`, the steps to do again; `exact`: whether last_step is exact (from the fault record:
    no rank can finish a step past the one a peer died after, since every step needs every rank) or a
    lower bound (rank 0's progress record, written every log interval); `fault_time`: when the
    injected fault struck (time.time() of the dying rank), else None. The fault record is the checkpoint
    folder's `fault.json`, else (a rank on another host died) the one in torchrun's agent store.

    Which failure this attempt recovers from: on a restart (attempt k > 0), attempt k-1's records only;
    on a new job (attempt 0) resuming a checkpoint, the fault record of a run that died after that
    checkpoint was written (its step is past the checkpoint's: a job that failed and was started again,
    possibly at another world size), and no older one. The folder's fault record is consumed (deleted)
    once read, so no later run takes it for its own. What is unknown is None; `attempt` is passed on,
    for the report.
    """
    folder = Path(checkpoint_dir)
    records = {}
    for name in ("fault", "progress"):
        try:
            records[name] = json.loads((folder / f"{name}.json").read_text())
        except (OSError, ValueError):
            records[name] = None
    store = agent_store() if attempt > 0 and records["fault"] is None else None
    if store is not None and store.check([FAULT_RECORD_KEY]):  # written by a rank on another host
        records["fault"] = json.loads(store.get(FAULT_RECORD_KEY))
    with contextlib.suppress(FileNotFoundError):
        (folder / "fault.json").unlink()  # consumed: this attempt reports it, or it is an older run's
    fault, progress = records["fault"], records["progress"]
    if fault is not None and (fault.get("step", -1) <= resumed_step if attempt == 0
                              else fault.get("attempt") != attempt - 1):
        fault = None  # an earlier failure, not the one this attempt recovers from
    if progress is not None and attempt > 0 and progress.get("attempt") != attempt - 1:
        progress = None
    steps = [r["step"] for r in (fault, progress) if r is not None]
    last = max(steps) if steps else None
    return {
        "last_step": last,
        "lost_steps": None if last is None else max(0, last - resumed_step),
        "exact": fault is not None,
        "fault_time": fault["time"] if fault is not None else None,
        "attempt": attempt,
    }


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def announce_resume(checkpoint: str | Path | None, step: int, recovery: dict) -> None:
    """Rank 0's lines on resuming: the checkpoint, its step, the restart, and the steps lost."""
    if checkpoint is None:
        print(f"no checkpoint to resume from: restart {recovery['attempt']} starts again at step 0", flush=True)
    else:
        print(f"resumed from {checkpoint} at step {step} (restart {recovery['attempt']})", flush=True)
    if recovery["lost_steps"] is not None:
        source = "its fault record" if recovery["exact"] else "rank 0's progress record, so at least that many"
        failed = "the failed run" if recovery["attempt"] == 0 else "the failed attempt"
        print(f"{recovery['lost_steps']} step(s) to do again: {failed} had finished step "
              f"{recovery['last_step']} ({source})", flush=True)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def report_recovery(recovery: dict, resumed_step: int, step: int | None) -> None:
    """A resumed run's METRICS line, once its first step (`step`; None when none was left) is done:
    restart, resumed_step, lost_steps (exact) or lost_steps_at_least (from the progress record), and
    recover_s, the seconds from the injected fault to the end of that first step; finished=1 when no
    step was left (the checkpoint was the run's last)."""
    values = {"rank": 0, "step": resumed_step if step is None else step, "restart": recovery["attempt"],
              "resumed_step": resumed_step}
    if step is None:
        values["finished"] = 1
    if recovery["lost_steps"] is not None:
        values["lost_steps" if recovery["exact"] else "lost_steps_at_least"] = recovery["lost_steps"]
    if recovery["fault_time"] is not None and step is not None:
        values["recover_s"] = time.time() - recovery["fault_time"]
    metrics(**values)


class Restarts:
    """The training loop's side of a run under torchrun --max-restarts, on every rank: rank 0's progress
    record at each train-loss line (only where it can be used: with checkpoints or a fault), the --fault to
    inject after a step, and (rank 0, once the first step since a restart is done) the recovery's METRICS
    line. `recovery`: read_recovery's, or None (no restart); `resumed_step`: the step the run resumed at."""

    def __init__(self, args, rank: int, attempt: int, recovery: dict | None, resumed_step: int):
        self.fault, self.text = parse_fault(args.fault), args.fault  # check_args has checked it
        self.rank, self.checkpoint_dir, self.attempt = rank, Path(args.checkpoint_dir), attempt
        self.track = args.checkpoint_every > 0 or self.fault is not None
        self.recovery, self.resumed_step = recovery, resumed_step

    def logged(self, step: int) -> None:
        """At each train-loss line: how far the run got, for a restart to count the steps lost."""
        if self.rank == 0 and self.track:
            write_progress(self.checkpoint_dir, step, self.attempt)

    def stepped(self, step: int) -> None:
        """After each step (and its checkpoint): --fault dies here; the first step since a restart reports it."""
        inject_fault(self.fault, self.rank, step, self.checkpoint_dir, self.text, self.attempt)
        if self.recovery is not None:  # the first step since the restart
            report_recovery(self.recovery, self.resumed_step, step)
            self.recovery = None

    def trained(self) -> None:
        """After the last step: a run resumed with no step left to do reports its recovery now."""
        if self.recovery is not None:
            report_recovery(self.recovery, self.resumed_step, None)

    def finished(self) -> None:
        """Once the model is saved: no step of this run is to be done again."""
        if self.rank == 0:
            with contextlib.suppress(FileNotFoundError):
                (self.checkpoint_dir / "progress.json").unlink()
