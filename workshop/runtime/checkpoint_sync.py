"""The checkpoint S3 URI, simulated: every host has a checkpoint folder of its own, synced with one store.

On SageMaker each host's checkpoint folder (`/opt/ml/checkpoints`, `CheckpointConfig.LocalPath`) is on
its own disk; no file system is shared between hosts. SageMaker syncs it with the checkpoint S3 URI
(Developer Guide, "Checkpoints in Amazon SageMaker AI"):

- when the job starts, every host's folder gets the files under the URI (the download); files added to
  S3 after that never reach a host;
- while the job runs, what a host writes or changes in its folder is uploaded, and what it deletes there
  is deleted in S3;
- every host syncs with the same URI: a key two hosts write holds whichever upload came last (S3 keeps
  the last PUT), and a key one host deletes is gone for all.

So a new job (a spot restart, a job resumed later) starts from the union of what every host uploaded,
while a rank restarted *inside* the job (torchrun --max-restarts) finds on its host only what that host
wrote or downloaded: never another host's files.

`CheckpointSync(store, {host: folder})` does the same on this machine, the folder `store` (a local run's
`checkpoint_dir`) standing in for the S3 URI: `download()` before the hosts start (each folder made
empty first, as a new instance's disk is), `start()` a thread that looks at every host's folder every
`interval_s` and uploads what changed there since it last looked (oldest change first, so the last
writer's copy is the one that stays) and deletes what went, and `stop()`, once the hosts are gone, one
last look. Only what a host changed is uploaded: a file it downloaded and never touched is never sent
back, so a host holding an old copy cannot overwrite a newer checkpoint another host wrote (a sync that
uploaded every host's whole folder at the end would). Empty folders are not synced (S3 holds keys, not
folders). A copy reaches the store whole (written to a temporary name beside it, then renamed), but a
file a host is still writing may be copied half-written, as a continuous sync would copy it; it is
copied again once it changes, and the last look copies what the hosts left. What the store's disk cannot
take stops the job: `failure` says so in one line (`workshop.runtime.local_cluster` reports it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import threading
import uuid
from pathlib import Path

from workshop.runtime.folders import LOCK_NAME, disk_full_message, is_disk_full, megabytes

SYNC_TMP = ".workshop-sync.tmp"  # a copy on its way into the store (left only if this process was killed)
INTERVAL_S = 0.5  # how often the hosts' folders are looked at while the job runs


def _skipped(name: str) -> bool:
    """The store's own files, never synced: its lock (`workshop.runtime.folders`) and copies on their way in."""
    return name == LOCK_NAME or name.endswith(SYNC_TMP)


def listing(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under `folder` (not links, not the store's own files): relative path -> (inode, size,
    mtime in ns), what tells a file written or replaced since the last look."""
    found: dict[str, tuple[int, int, int]] = {}
    for root, _, names in os.walk(folder):  # a folder removed while it is walked is skipped
        for name in names:
            if _skipped(name):
                continue
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:  # gone since it was listed
                continue
            if stat.S_ISREG(st.st_mode):
                found[os.path.relpath(path, folder)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return found


def _copy(source: Path, target: Path) -> None:
    """`source` to `target`, whole or not at all: copied to a temporary name beside it, then renamed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}{SYNC_TMP}")
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class CheckpointSync:
    """Each host's checkpoint folder, synced with `store` as SageMaker syncs it with S3 (module docstring)."""

    def __init__(self, store: Path, folders: dict[str, Path], interval_s: float = INTERVAL_S):
        self.store = Path(store)
        self.folders = {host: Path(folder) for host, folder in folders.items()}
        self.interval_s = interval_s
        self.seen: dict[str, dict[str, tuple[int, int, int]]] = {}  # host -> its folder at the last look
        self.failure: str | None = None  # one line: the store's disk was full (the job is stopped for it)
        self.uploaded = 0  # files copied into the store, and removed from it, by this job's hosts
        self.deleted = 0
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def download(self) -> int:
        """Every file in the store into every host's folder, made empty first; returns the files per host.
        Copies a killed sync left in the store (never whole) go first."""
        for root, _, names in os.walk(self.store):
            for name in names:
                if name.endswith(SYNC_TMP):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(root, name))
        files = listing(self.store)
        for host, folder in self.folders.items():
            if folder.is_symlink():
                folder.unlink()
            elif folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            for relative in sorted(files):
                target = folder / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.store / relative, target)
            self.seen[host] = listing(folder)
        return len(files)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="checkpoint-sync", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sync()

    def stop(self) -> None:
        """Stop the thread, then one last look at every folder (the hosts are gone by then)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sync()

    def sync(self) -> None:
        """One look at every host's folder: what went is deleted in the store, then what is new or changed
        is copied there, oldest change first (so where hosts wrote the same file, the last writer's stays)."""
        changed: list[tuple[int, str, str]] = []  # (mtime, host, relative path)
        now: dict[str, dict[str, tuple[int, int, int]]] = {}
        for host, folder in self.folders.items():
            before, now[host] = self.seen.get(host, {}), listing(folder)
            for relative in sorted(before.keys() - now[host].keys()):
                self._delete(relative)
            changed += [(state[2], host, relative) for relative, state in now[host].items()
                        if before.get(relative) != state]
        for _, host, relative in sorted(changed):
            if not self._upload(host, relative):
                # not copied (gone meanwhile, or the store is full): the next look decides again
                old = self.seen.get(host, {}).get(relative)
                if old is None:
                    now[host].pop(relative, None)
                else:
                    now[host][relative] = old
        self.seen.update(now)

    def _upload(self, host: str, relative: str) -> bool:
        if self.failure is not None:
            return False  # the store is full: the job is being stopped
        source = self.folders[host] / relative
        try:
            _copy(source, self.store / relative)
        except FileNotFoundError:  # replaced or removed since it was listed: the next look sees what is there
            return False
        except OSError as exc:
            if is_disk_full(exc):
                size = source.stat().st_size if source.exists() else 0
                self.failure = disk_full_message(
                    self.store, f"copying {host}'s {relative} ({megabytes(size)}) into the checkpoint folder")
            else:
                self._warn(relative, f"cannot copy {host}'s {relative} into the checkpoint folder {self.store} "
                                     f"({exc.strerror or exc})")
            return False
        self.uploaded += 1
        return True

    def _delete(self, relative: str) -> None:
        path = self.store / relative
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            self._warn(relative, f"cannot remove {relative} from the checkpoint folder {self.store} ({exc.strerror or exc})")
            return
        self.deleted += 1
        parent = path.parent  # S3 has no folders: one that held only deleted files goes too
        while parent != self.store and self.store in parent.parents:
            try:
                parent.rmdir()
            except OSError:  # not empty (or gone)
                break
            parent = parent.parent

    def _warn(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(f"warning: {text}; the job goes on without it.", file=sys.stderr, flush=True)
