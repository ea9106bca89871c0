"""The folders a local job writes: one job per folder, and a full disk said in one line.

- **One folder, one job.** `new_folder` makes a run's or a search's folder with a name no other
  job has, atomically (the `mkdir` that makes it fails if another job made it first), so two
  commands started in the same second never share one. `FolderLock` keeps a folder a job was
  *given* (a checkpoint folder, a run folder passed as `workdir=`, a search's) to that job while it
  runs: a second job asking for it is refused with the holder's pid, command and start time. The
  lock is `flock` on a file in the folder, held by the local command (not by the hosts or the
  scripts, which never see the checkpoint folder itself: each host's own is synced with it,
  `workshop.runtime.checkpoint_sync`, which leaves the lock's file out): the kernel drops it when the
  holder exits, however it ends, SIGKILL included, so a killed job never leaves a folder locked.
- **A full disk.** `check_free_space` refuses before anything is written when the space a step
  needs is known (a run folder's copies of the code, a checkpoint's size, the data); `is_disk_full`
  and `disk_full_message` turn an ENOSPC met later into one line naming the folder, its free space
  and what was needed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import threading
import time
import uuid
from pathlib import Path

import psutil

from workshop.errors import WorkshopError

LOCK_NAME = ".workshop.lock"  # in the folder it guards; removed when the holder lets go
MB = 1024 * 1024

# folder -> [fd, depth, thread]: this process's locks. The same thread may take a lock it holds
# again (`run_local` locks the checkpoint folder before it prepares the data, then `LocalCluster.run`
# locks it for the run): flock would refuse a second open file of the same process.
_HELD: dict[str, list] = {}
_HELD_GUARD = threading.Lock()


def new_folder(parent: str | Path, stem: str) -> Path:
    """A new, empty folder `parent/<stem>-<4 hex digits>`, made here: the final `mkdir` fails when
    the name is taken, so two jobs started in the same second (or by the same clock) get two folders."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    for _ in range(1000):
        folder = parent / f"{stem}-{uuid.uuid4().hex[:4]}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder.resolve()
    raise WorkshopError(f"Found no free folder name {stem}-XXXX in {parent}.", f"clear out {parent}.")


def _holder(fd: int) -> str:
    """Who holds the lock whose file is open as `fd`, in words, from what the holder wrote into it."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 65536).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another job (it is still writing who it is)"
    command = info.get("command") or "?"
    return f"pid {info['pid']} ({command}), since {info.get('since', '?')}"


class FolderLock:
    """`with FolderLock(folder, "the checkpoint folder", fix):` the folder is this job's until the block
    ends (or `release()`); a WorkshopError naming the holder if another job has it. The folder is made
    if missing. See the module docstring."""

    def __init__(self, folder: str | Path, what: str, fix: str, wait_s: float = 0.0):
        """`wait_s`: how long to wait for another job to let go before refusing (0: refuse at once; for a
        short step every job does, such as preparing the data, waiting is what the second job wants)."""
        self.folder = Path(folder).expanduser().resolve()
        self.what = what
        self.fix = fix
        self.wait_s = wait_s
        self.held = False

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    def acquire(self) -> FolderLock:
        import fcntl

        key = str(self.folder)
        with _HELD_GUARD:
            held = _HELD.get(key)
            if held is not None and held[2] == threading.get_ident():
                held[1] += 1
                self.held = True
                return self
        self.folder.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.wait_s
        for _ in range(100_000):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                if held is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                if held is not None:  # this process, another thread: the same words, our own pid
                    holder = f"pid {os.getpid()} (this process, another thread)"
                raise WorkshopError(
                    f"{self.what[:1].upper()}{self.what[1:]} {self.folder} is in use by another job: {holder}. "
                    "Two jobs writing one folder would overwrite each other's files.",
                    self.fix,
                ) from None
            except BaseException:
                os.close(fd)
                raise
            # The holder before us may have removed the file between our open and our lock: then
            # we hold a lock on a file no one else will open. Try again on the one at the path.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            try:
                command = shlex.join(psutil.Process().cmdline())
            except (psutil.Error, OSError):
                command = "?"
            info = {"pid": os.getpid(), "command": command[:300], "since": time.strftime("%Y-%m-%d %H:%M:%S")}
            with contextlib.suppress(OSError):  # a full disk: the lock holds, only its words are missing
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(info).encode(), 0)
            with _HELD_GUARD:
                _HELD[key] = [fd, 1, threading.get_ident()]
            self.held = True
            return self
        raise WorkshopError(f"Could not lock {self.what} {self.folder}: its lock file keeps changing.", self.fix)

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        key = str(self.folder)
        with _HELD_GUARD:
            held = _HELD.get(key)
            if held is None:
                return
            held[1] -= 1
            if held[1] > 0:
                return
            del _HELD[key]
        # Removed while still locked, so a job waiting on the old file sees it go (see acquire).
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(held[0])

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# --------------------------------------------------------------------------- disk space


def _existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (where it would be made)."""
    path = Path(path).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | Path) -> int:
    """Free bytes on the file system that holds (or would hold) `path`, for this user."""
    return shutil.disk_usage(_existing(Path(path))).free


def size_of(path: str | Path, skip: tuple[str, ...] = ("__pycache__",)) -> int:
    """Bytes in the files under `path` (a file's own size), not following links; names in `skip` skipped."""
    path = Path(path)
    if path.is_symlink():
        return 0
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            with contextlib.suppress(OSError):
                full = os.path.join(root, name)
                if not os.path.islink(full):
                    total += os.stat(full).st_size
    return total


def megabytes(n: int) -> str:
    return f"{n / MB:,.1f} MB"


def check_free_space(folder: str | Path, need: int, what: str, fix: str) -> None:
    """Refuse (WorkshopError) when the disk of `folder` has less than `need` bytes free; `what` says
    what the space is for ("the run folder", with what it holds)."""
    free = free_bytes(folder)
    if free < need:
        raise WorkshopError(
            f"Not enough disk space for {what}: {folder} has {megabytes(free)} free, and it needs at least "
            f"{megabytes(need)}.",
            fix,
        )


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` (or one it came from) is the file system's "no space left" (or over quota)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(exc, shutil.Error) and any(
                "No space left" in str(part) or "quota exceeded" in str(part).lower() for part in exc.args):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def disk_full_message(folder: str | Path, doing: str, need: int | None = None) -> str:
    """One line: "The disk holding FOLDER is full: DOING failed (No space left on device); 0.0 MB free
    there[, it needs at least N MB]." """
    free = free_bytes(folder)
    needs = f", and it needs at least {megabytes(need)}" if need else ""
    return f"The disk holding {folder} is full: {doing} failed (No space left on device); {megabytes(free)} free there{needs}."


DISK_FULL_FIX = ("free space on that disk (a failed run's folder under runs/ can go), or point the job at a disk "
                 "with room: --workdir DIR (its runs and data), --checkpoint-dir DIR, --data-dir DIR.")


def remove_half_written(folders: list[Path], since: float) -> list[Path]:
    """Remove what a job that ran out of space left half-written in `folders` (none: not there): the
    labs' temporary names, `*.tmp` files and `*.partial` folders, changed at or after `since` (a
    time.time()): never read, and each holds space the next run needs. Returns what went."""
    gone = []
    for folder in folders:
        if folder is None or not folder.is_dir():
            continue
        for path in list(folder.iterdir()):
            if not path.name.endswith((".tmp", ".partial")):
                continue
            try:
                if path.lstat().st_mtime < since - 1:
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except OSError:
                continue
            gone.append(path)
    return gone
