"""Each host's checkpoint folder is its own, synced with the checkpoint store as SageMaker syncs it with S3.

On SageMaker no file system is shared between hosts: each host's `/opt/ml/checkpoints` gets the checkpoint
S3 URI's files when the job starts, and SageMaker uploads what the host writes and deletes in S3 what it
deletes, while the job runs. The local cluster's `--checkpoint-dir` (the URI's stand-in) used to *be* every
host's folder, which is kinder than the service: a host saw the files the others wrote.

Fast tests: `workshop.runtime.checkpoint_sync` on folders (no process). Slow: a probe script on two simulated
hosts with a checkpoint store.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import time
from pathlib import Path

import pytest

from workshop.runtime.checkpoint_sync import SYNC_TMP, CheckpointSync, listing
from workshop.runtime.folders import LOCK_NAME
from workshop.runtime.local_cluster import LocalCluster


def files(folder: Path) -> dict[str, str]:
    return {rel: (folder / rel).read_text() for rel in listing(folder)}


def touch(path: Path, text: str, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


@pytest.fixture
def hosts(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    store = tmp_path / "store"
    touch(store / "checkpoint.pt", "v1")
    touch(store / "step-2" / "__0_0.distcp", "shard 0")
    (store / "empty-folder").mkdir()
    touch(store / LOCK_NAME, "the job's lock")
    touch(store / f".checkpoint.pt.1234abcd{SYNC_TMP}", "a copy a killed sync left")
    return store, {"algo-1": tmp_path / "algo-1" / "checkpoints", "algo-2": tmp_path / "algo-2" / "checkpoints"}


def test_every_host_starts_with_the_stores_files_in_a_folder_of_its_own(hosts):
    store, folders = hosts
    touch(folders["algo-2"] / "from-an-earlier-run.txt", "an old instance's disk")
    sync = CheckpointSync(store, folders)
    assert sync.download() == 2
    for folder in folders.values():
        assert files(folder) == {"checkpoint.pt": "v1", "step-2/__0_0.distcp": "shard 0"}
        assert not (folder / "empty-folder").exists() and not (folder / LOCK_NAME).exists()
    assert not list(store.glob(f"*{SYNC_TMP}"))  # never whole: gone
    assert (store / LOCK_NAME).read_text() == "the job's lock"


def test_what_a_host_writes_or_deletes_reaches_the_store_and_never_another_host(hosts):
    store, folders = hosts
    sync = CheckpointSync(store, folders)
    sync.download()
    touch(folders["algo-1"] / "checkpoint.pt", "v2")  # rank 0's new checkpoint, on algo-1
    touch(folders["algo-2"] / "fault.json", "rank 1 died")
    (folders["algo-1"] / "step-2" / "__0_0.distcp").unlink()  # the rotation, on algo-1
    sync.sync()
    assert files(store) == {"checkpoint.pt": "v2", "fault.json": "rank 1 died"}
    assert not (store / "step-2").exists()  # S3 has no folders: the emptied one goes
    assert (store / "empty-folder").is_dir()  # not this job's to remove
    assert files(folders["algo-2"]) == {"checkpoint.pt": "v1", "step-2/__0_0.distcp": "shard 0", "fault.json": "rank 1 died"}
    assert files(folders["algo-1"]) == {"checkpoint.pt": "v2"}
    assert (sync.uploaded, sync.deleted) == (2, 1)


def test_a_copy_a_host_downloaded_and_never_changed_is_never_uploaded_again(hosts):
    """The hazard of uploading every host's whole folder at the end: algo-2's old checkpoint.pt, downloaded at
    the start, would overwrite the newer one rank 0 wrote on algo-1 (S3 keeps the last upload)."""
    store, folders = hosts
    sync = CheckpointSync(store, folders)
    sync.download()
    touch(folders["algo-1"] / "checkpoint.pt", "v2")
    sync.sync()
    sync.stop()  # the last look, once the hosts are gone
    assert (store / "checkpoint.pt").read_text() == "v2"
    assert sync.uploaded == 1


def test_the_last_writer_wins_where_hosts_write_the_same_file(hosts):
    store, folders = hosts
    sync = CheckpointSync(store, folders)
    sync.download()
    now = time.time()
    touch(folders["algo-2"] / "latest", "step-4", mtime=now - 5)  # algo-2 wrote first ...
    touch(folders["algo-1"] / "latest", "step-6", mtime=now - 1)  # ... algo-1 last: seen in the same look
    sync.sync()
    assert (store / "latest").read_text() == "step-6"
    touch(folders["algo-2"] / "latest", "step-8")  # a later write, a later look: algo-2's now
    sync.sync()
    assert (store / "latest").read_text() == "step-8"
    # One host deletes a file another host wrote: gone for all (a DELETE of the key).
    (folders["algo-1"] / "latest").unlink()
    sync.sync()
    assert not (store / "latest").exists()


def test_the_thread_syncs_while_the_job_runs_and_stop_takes_the_rest(hosts):
    store, folders = hosts
    sync = CheckpointSync(store, folders, interval_s=0.05)
    sync.download()
    sync.start()
    try:
        touch(folders["algo-1"] / "progress.json", "step 3")
        deadline = time.monotonic() + 60
        while not (store / "progress.json").exists():
            assert time.monotonic() < deadline, "the sync never copied progress.json"
            time.sleep(0.05)
    finally:
        sync.stop()
    touch(folders["algo-2"] / "after.txt", "written after the stop")
    assert not (store / "after.txt").exists()  # stopped: nothing more is synced
    assert (store / "progress.json").read_text() == "step 3"


def test_a_store_without_room_is_one_line_and_leaves_no_half_copy(hosts, monkeypatch):
    import errno
    import shutil as shutil_module

    store, folders = hosts
    sync = CheckpointSync(store, folders)
    sync.download()
    touch(folders["algo-1"] / "checkpoint.pt", "v2" * 1000)

    def full(source, target):
        Path(target).write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil_module, "copyfile", full)
    sync.sync()
    assert sync.failure.startswith(f"The disk holding {store} is full: copying algo-1's checkpoint.pt (0.0 MB) "
                                   "into the checkpoint folder failed (No space left on device)"), sync.failure
    assert (store / "checkpoint.pt").read_text() == "v1" and not list(store.glob(f".*{SYNC_TMP}"))
    monkeypatch.undo()
    sync.sync()  # a full store is the job's end: nothing more is copied
    assert (store / "checkpoint.pt").read_text() == "v1"


# ----------------------------------------------------------------------------- on the local cluster (slow)

PROBE = textwrap.dedent("""\
    import json, os, pathlib
    folder = pathlib.Path(os.environ["SM_CHECKPOINT_DIR"])
    host = os.environ["SM_CURRENT_HOST"]
    print("AT START " + host + " " + json.dumps(sorted(p.relative_to(folder).as_posix()
                                                      for p in folder.rglob("*") if p.is_file())), flush=True)
    (folder / ("own-" + host + ".txt")).write_text(host)
    if host == "algo-1":
        (folder / "checkpoint.pt").write_text("v2")  # rank 0's newer checkpoint
        (folder / "old.txt").unlink()  # the rotation: deleted in the store too
""")


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["container", "process"])
def test_each_simulated_host_has_its_own_checkpoint_folder_synced_with_the_store(tmp_path, runtime):
    """Before: the store *was* every host's folder (mounted, or linked), so each host saw what the others
    wrote, and a lab whose ranks need files another host wrote (lab 4's shards) worked here and failed on
    SageMaker."""
    if runtime == "container":
        from workshop.runtime import hostns

        if not hostns.available()[0]:
            pytest.skip("the container runtime cannot run here")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(PROBE)
    store = tmp_path / "store"
    touch(store / "checkpoint.pt", "v1")
    touch(store / "old.txt", "an older checkpoint")
    cluster = LocalCluster(code, "train.py", hosts=2, workdir=tmp_path / "run", runtime=runtime, echo=False)
    result = cluster.run({}, {}, checkpoint_dir=store, timeout_s=600)
    at_start = {m[1]: json.loads(m[2]) for line in result.lines if (m := re.search(r"AT START (\S+) (\[.*\])", line))}
    assert at_start == {"algo-1": ["checkpoint.pt", "old.txt"], "algo-2": ["checkpoint.pt", "old.txt"]}, result.lines
    # Each host's folder holds what it downloaded and what it wrote, nothing of the other's ...
    algo1, algo2 = (h.checkpoint_dir for h in result.hosts)
    assert algo1 == result.hosts[0].sandbox.checkpoint_dir and result.hosts[0].checkpoint_store == store.resolve()
    assert files(algo1) == {"checkpoint.pt": "v2", "own-algo-1.txt": "algo-1"}
    assert files(algo2) == {"checkpoint.pt": "v1", "old.txt": "an older checkpoint", "own-algo-2.txt": "algo-2"}
    # ... and the store, what every host wrote or deleted: algo-2's untouched old copy never went back.
    assert files(store) == {"checkpoint.pt": "v2", "own-algo-1.txt": "algo-1", "own-algo-2.txt": "algo-2"}
