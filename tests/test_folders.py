"""The folders a user hands the workshop, under abuse: data it did not write, folders two jobs want at
once, a disk that fills up (issue 25, findings 5-7), and the smaller refusals of finding 8.

- Data the workshop did not write (an `mnist.npz` or `corpus.txt` without the workshop's dataset.json) is
  used as it is, checked, or refused with the fix; it is never replaced.
- One folder, one job: run and search folders are made under names no other job has, and a folder a job
  is using (a checkpoint folder, a search's) is refused to a second one, naming it; a killed job leaves
  no lock behind.
- A full disk is one line naming the folder, with nothing half-written left. These tests mount small
  tmpfs file systems (root only: CI runs as root) and skip, saying why, where mounting is not allowed.

Tests that start training are marked slow (the guard in tests/conftest.py); the rest refuse before
anything starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from workshop import REPO_ROOT
from workshop.__main__ import main
from workshop.cloud.cost import estimate_cost
from workshop.datasets import corpus
from workshop.datasets import mnist as data
from workshop.errors import WorkshopError
from workshop.runtime import folders
from workshop.runtime.folders import LOCK_NAME, FolderLock, new_folder
from workshop.runtime.local_cluster import LocalCluster

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _users_mnist(root: Path, n_train: int = 2000, n_test: int = 500, channels=("train", "test")) -> None:
    """MNIST-shaped channels a user wrote: the files only, no dataset.json."""
    rng = np.random.default_rng(0)
    for channel, n in (("train", n_train), ("test", n_test)):
        if channel in channels:
            (root / channel).mkdir(parents=True)
            np.savez_compressed(root / channel / "mnist.npz", images=rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
                                labels=rng.integers(0, 10, n).astype(np.int64))


# --------------------------------------------------------------------------- finding 5: the user's own data


def test_the_users_mnist_channels_are_used_as_they_are_never_replaced(tmp_path, capsys):
    """The issue's case: 2,000 and 500 digits with no dataset.json were replaced by the 5,000-digit subset."""
    root = tmp_path / "mine"
    _users_mnist(root)
    before = _snapshot(root)
    for prepare in (data.MNIST.prepare, data.prepare_mnist):  # what run_local and tune call; the Python API
        channels = prepare(root)
        assert (channels.n_train, channels.n_test, channels.source) == (2000, 500, "unknown")
        out = capsys.readouterr().out
        assert f"MNIST: using the channels in {root} as they are: 2,000 train / 500 test digits, checked" in out, out
    assert data.MNIST.prepared(root).n_train == 2000  # the SageMaker path sees the same
    assert _snapshot(root) == before  # not a byte changed, nothing added


def test_some_of_the_users_channels_or_a_source_asked_by_name_are_refused_and_left_alone(tmp_path):
    root = tmp_path / "mine"
    _users_mnist(root, channels=("train",))
    before = _snapshot(root)
    for prepare in (data.MNIST.prepare, data.MNIST.prepared):
        with pytest.raises(WorkshopError) as info:
            prepare(root)
        assert f"{root / 'train' / 'mnist.npz'} is not the workshop's" in info.value.message
        assert f"{root / 'test' / 'mnist.npz'} is missing" in info.value.message
        assert "add the missing channel" in info.value.fix and "--data-dir another folder" in info.value.fix
    assert _snapshot(root) == before and not (root / "test").exists()
    _users_mnist(tmp_path / "both")  # both there, but the workshop's own asked for by name
    with pytest.raises(WorkshopError, match="source='subset' asks for the workshop's own") as info:
        data.prepare_mnist(tmp_path / "both", source="subset")
    assert "source='auto'" in info.value.fix


def test_the_users_corpus_is_used_as_it_is_never_replaced(tmp_path, capsys):
    root = tmp_path / "corpus"
    for channel, text in (("train", b"my own text, " * 500), ("test", b"held out, " * 100)):
        (root / channel).mkdir(parents=True)
        (root / channel / corpus.CORPUS_FILE).write_bytes(text)
    before = _snapshot(root)
    channels = corpus.CORPUS.prepare(root)
    assert (channels.n_train, channels.n_test) == (6500, 1000)
    assert f"corpus: using the text in {root} as it is" in capsys.readouterr().out
    assert _snapshot(root) == before
    (root / "test" / corpus.CORPUS_FILE).unlink()  # only some of it: refused, the rest left alone
    with pytest.raises(WorkshopError, match="is not the workshop's corpus") as info:
        corpus.CORPUS.prepare(root)
    assert "--data-dir another folder" in info.value.fix
    assert _snapshot(root) == {k: v for k, v in before.items() if not k.startswith("test")}


@pytest.mark.slow
def test_a_run_on_the_users_data_trains_on_it(tmp_path):
    root = tmp_path / "mine"
    _users_mnist(root)
    before = _snapshot(root)
    done = subprocess.run([sys.executable, "-m", "workshop", "run", "data_parallel", "--data-dir", str(root),
                           "--workdir", str(tmp_path / "work"), "--hp", "epochs=1", "--hp", "max-steps=2"],
                          capture_output=True, text=True, timeout=900, env=ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "as they are: 2,000 train / 500 test digits" in done.stdout
    assert _snapshot(root) == before


# --------------------------------------------------------------------------- finding 6: one folder, one job


def test_a_new_folder_is_made_not_only_named(tmp_path, monkeypatch):
    """Two jobs that draw the same name (the same second, the same random suffix) get two folders."""
    drawn = iter([uuid.UUID("aaaa" + "0" * 28), uuid.UUID("aaaa" + "0" * 28), uuid.UUID("bbbb" + "0" * 28)])
    monkeypatch.setattr(folders.uuid, "uuid4", lambda: next(drawn))
    first, second = new_folder(tmp_path, "job"), new_folder(tmp_path, "job")
    assert (first.name, second.name) == ("job-aaaa", "job-bbbb")


HOLDER = textwrap.dedent(
    """
    import sys, time
    from workshop.runtime.folders import FolderLock
    lock = FolderLock(sys.argv[1], "the checkpoint folder", "fix").acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def test_a_folder_in_use_is_refused_naming_its_holder_and_a_killed_holder_leaves_no_lock(tmp_path):
    folder = tmp_path / "checkpoints"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkshopError) as info:
            FolderLock(folder, "the checkpoint folder", "give it another folder.").acquire()
        message = info.value.message
        assert message.startswith(f"The checkpoint folder {folder.resolve()} is in use by another job: pid {holder.pid} (")
        assert "-c" in message and ", since 20" in message and info.value.fix == "give it another folder."
    finally:
        holder.kill()  # SIGKILL: no clean-up of its own
        holder.wait()
    with FolderLock(folder, "the checkpoint folder", "fix"):  # the kernel dropped its lock
        assert (folder / LOCK_NAME).is_file()
    assert not (folder / LOCK_NAME).exists()  # released: nothing left in the user's folder


@pytest.mark.slow
def test_two_searches_started_in_the_same_second_get_a_folder_each(tmp_path, mnist_dir, monkeypatch):
    """The issue: `tune-<lab>-<YYYYmmdd-HHMMSS>/` was shared, and tune.json kept one search."""
    from workshop import tuning

    monkeypatch.setattr(tuning.time, "strftime", lambda *_: "20261124-120000")  # the same second, every time
    results = [tuning.tune("data_parallel", {"lr": [lr]}, hosts=1, hyperparameters={"epochs": 1, "max-steps": 1},
                           data_dir=mnist_dir, runs_dir=tmp_path / "runs", plot=False) for lr in ("0.01", "0.02")]
    assert results[0].folder != results[1].folder
    for result, lr in zip(results, ("0.01", "0.02"), strict=True):
        assert result.folder.name.startswith("tune-data-parallel-20261124-120000-")
        saved = json.loads((result.folder / "tune.json").read_text())
        assert [t["hyperparameters"] for t in saved["trials"]] == [{"lr": lr}]
        assert saved["trials"][0]["status"] == "ok", saved


def _holder_written(lock: Path) -> bool:
    """Whether the lock file names its holder yet (FolderLock writes it right after it locks)."""
    try:
        return "pid" in json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        return False


@pytest.mark.slow
def test_a_checkpoint_folder_in_use_is_refused_to_a_second_run_and_freed_when_the_first_is_killed(
        tmp_path, mnist_dir, capsys):
    """The issue: two runs with one --checkpoint-dir raced (FileNotFoundError on checkpoint.pt.tmp, or one
    resumed the other's checkpoint)."""
    ckpt = tmp_path / "ckpt"
    first = subprocess.Popen(
        [sys.executable, "-m", "workshop", "run", "data_parallel", "--checkpoint-dir", str(ckpt), "--data-dir",
         str(mnist_dir), "--workdir", str(tmp_path / "first"), "--hp", "epochs=20"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=ENV)
    try:
        deadline = time.monotonic() + 300
        while not _holder_written(ckpt / LOCK_NAME) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the lock, then its holder's pid, command and start time written into it
        assert _holder_written(ckpt / LOCK_NAME), "the first run never took its checkpoint folder"
        code = main(["run", "data_parallel", "--checkpoint-dir", str(ckpt), "--data-dir", str(mnist_dir),
                     "--workdir", str(tmp_path / "second")])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith(f"error: The checkpoint folder {ckpt.resolve()} is in use by another job: pid {first.pid} ("), err
        assert "-m workshop run data_parallel --checkpoint-dir" in err and ", since 20" in err
        assert "--checkpoint-dir DIR" in err  # the fix
        assert not (tmp_path / "second" / "runs").exists()  # nothing of the second run started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)  # as `kill -9` would: no clean-up, no release
        first.wait()
    with FolderLock(ckpt, "the checkpoint folder", "fix"):  # not stuck
        pass


# --------------------------------------------------------------------------- finding 7: a full disk


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """`tmpfs("3m")`: a new folder with a tmpfs of that size mounted on it (unmounted after the test)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"this machine does not allow mounting a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path, leave: int) -> None:
    """Fill `disk` until `leave` bytes are free."""
    free = folders.free_bytes(disk)
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave))


def test_data_on_a_disk_without_room_is_one_line_and_nothing_is_written(tmpfs):
    disk = tmpfs("256k")  # the subset's channels take about 420 KB
    with pytest.raises(WorkshopError) as info:
        data.prepare_mnist(disk / "mnist", source="subset")
    assert info.value.message.startswith(f"Not enough disk space for the MNIST channels (subset): {disk / 'mnist'} has ")
    assert "--data-dir" in info.value.fix
    assert not [p for p in disk.rglob("*") if p.is_file()]  # no npz, no temporary file, no marker
    with pytest.raises(WorkshopError, match="Not enough disk space for the corpus channel train"):
        corpus.prepare_corpus(disk / "corpus")  # 0.46 MB of text
    assert not [p for p in disk.rglob("*") if p.is_file()]


def _probe(tmp_path: Path, script: str) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(script)
    return code


def test_a_run_folder_on_a_disk_without_room_is_refused_before_anything_is_written(tmp_path, tmpfs, monkeypatch):
    """The issue's second run on the full 3 MB disk: a raw 5 KB shutil.Error."""
    disk = tmpfs("3m")
    _fill(disk, 0)
    runs = disk / "runs"
    cluster = LocalCluster(_probe(tmp_path, "print('hello')\n"), "train.py", hosts=2, runs_dir=runs, echo=False)
    with pytest.raises(WorkshopError) as info:
        cluster.run({}, {})
    assert info.value.message.startswith("Not enough disk space for the run folder (the code and drivers each of 2 "
                                         f"host(s) gets, and its logs): {runs} has 0.0 MB free, and it needs at least ")
    assert "--workdir DIR" in info.value.fix
    assert not runs.exists() or not any(runs.iterdir())
    # Past the estimate (a disk that fills up while the sandboxes are written): one line, and no
    # half-made run folder left to hold the space.
    monkeypatch.setattr(LocalCluster, "space_needed", lambda self: 0)
    with pytest.raises(WorkshopError) as info:
        cluster.run({}, {})
    message = info.value.message
    assert message.startswith(f"The disk holding {runs}/") and "is full: setting up the run folder" in message, message
    assert message.endswith("The run folder was removed.") and "\n" not in message
    assert not any(runs.iterdir())


LOUD = "import sys\nfor i in range(100_000):\n    print(f'line {i} ' + 'x' * 200, flush=True)\n"


@pytest.mark.slow
def test_logs_that_fill_the_disk_stop_the_run_with_one_line(tmp_path, tmpfs):
    """The issue: the CLI's log readers died with uncaught exceptions, and a rank's traceback was cut at its
    first line (the reader that stopped no longer drained the host's output)."""
    disk = tmpfs("4m")  # room for the sandboxes, not for 20 MB of logs
    code = _probe(tmp_path, LOUD)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            from workshop.runtime.local_cluster import LocalCluster
            cluster = LocalCluster({str(code)!r}, "train.py", hosts=1, runs_dir={str(disk / 'runs')!r}, echo=False)
            result = cluster.run({{}}, {{}}, timeout_s=300, check=False)
            print("FAILURE:", result.failure)
        """)], capture_output=True, text=True, timeout=600, env=ENV)
    out = done.stdout + done.stderr
    assert "Exception in thread" not in out and "Traceback" not in out, out[-3000:]
    failure = out[out.index("FAILURE: "):]
    assert failure.startswith(f"FAILURE: The disk holding {disk / 'runs'}/"), failure
    assert "is full: writing the log " in failure and "The job was stopped." in failure
    assert "ran past its time limit" not in failure  # it did not hang on a host blocked writing its output


@pytest.mark.slow
def test_a_checkpoint_that_fills_the_disk_is_one_line_and_leaves_nothing_half_written(tmp_path, tmpfs, mnist_dir):
    """The issue: `[enforce fail at inline_container.cc:672] . unexpected pos` with "no space" buried in a
    rank's traceback, and the half-written checkpoint.pt.tmp left behind. Each host writes its checkpoints
    into a folder of its own (in the run folder), synced with --checkpoint-dir as SageMaker syncs S3: the
    copy into the full checkpoint folder is what fails, and stops the job."""
    disk = tmpfs("1m")  # lab 3's checkpoint takes about 3 MB
    done = subprocess.run(
        [sys.executable, "-m", "workshop", "run", "data_parallel", "--data-dir", str(mnist_dir), "--workdir",
         str(tmp_path / "work"), "--checkpoint-dir", str(disk / "ckpt"), "--hp", "epochs=1", "--hp", "max-steps=25"],
        capture_output=True, text=True, timeout=900, env=ENV)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = done.stderr.strip().splitlines()
    assert errors[0].startswith(f"error: The disk holding {disk / 'ckpt'} is full: copying algo-1's checkpoint.pt"), \
        done.stderr
    assert "into the checkpoint folder failed (No space left on device)" in errors[0]
    assert "The job was stopped." in errors[0]
    assert errors[1].startswith("  Fix: free space on that disk") and len(errors) == 2, done.stderr
    assert "inline_container" not in done.stderr and "Traceback" not in done.stderr
    assert not list((disk / "ckpt").glob("*.tmp")) and not list((disk / "ckpt").glob("*.partial"))
    assert not (disk / "ckpt" / LOCK_NAME).exists()


# --------------------------------------------------------------------------- finding 8: smaller refusals


def test_a_fault_for_a_lab_that_cannot_inject_one_is_refused_before_anything_starts(tmp_path, capsys):
    for argv in (["run", "horovod_pytorch"], ["run", "all"], ["run", "2"]):
        code = main([*argv, "--fault", "kill-rank=1@step=3", "--data-dir", str(tmp_path / "data")])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "unrecognized arguments" not in err
        assert "faults are for data_parallel (3_data_parallel) and model_parallel (4_model_parallel)" in err, err
        assert "Fix: drop --fault" in err
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(("argv", "typed"), [
    (["tune", "data_parallel", "--param", "lr=0,0.1"], "--param lr=VALUES"),
    (["tune", "data_parallel", "--param", "batch-size=64,5000"], "--param batch-size=VALUES"),
    (["tune", "data_parallel", "--param", "batch-size=64,5000", "--mode", "sagemaker", "--dry-run"],
     "--param batch-size=VALUES"),
    (["run", "data_parallel", "--fault", "kill-rank=5@step=3"], "--fault kill-rank=R@step=S"),
    (["run", "data_parallel", "--fault", "kill-rank=1@step=3000"], "--fault kill-rank=R@step=S"),
    (["run", "data_parallel", "--fault", "bogus"], "--fault kill-rank=R@step=S"),
    (["profile", "data_parallel", "--steps", "500"], "--steps N"),
], ids=["tune-lr", "tune-batch", "tune-sagemaker", "fault-rank", "fault-step", "fault-form", "profile-steps"])
def test_a_fix_names_the_flag_the_user_typed(argv, typed, mnist_dir, capsys, no_aws):
    code = main([*argv, "--data-dir", str(mnist_dir)])
    err = capsys.readouterr().err
    assert code == 2, err
    fix = next(line for line in err.splitlines() if line.startswith("  Fix: "))
    assert fix.endswith(f"On the command line: {typed}."), fix
    assert "--hp" not in fix


def test_a_tuning_dry_run_prices_every_trial_running_at_once(no_aws, capsys):
    """The issue: `--parallel 1000` priced one trial's minute."""
    code = main(["tune", "data_parallel", "--param", "lr=0.01,0.02,0.03,0.04", "--parallel", "1000", "--mode",
                 "sagemaker", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    assert "cost: at most $11.26 = 4 trials x 2 x ml.g5.xlarge x $1.408/h x 1 h" in out  # the whole search
    assert "cost: 4 trials at once are 8 x ml.g5.xlarge: $11.26 per hour while they run" in out
    assert "each minute costs $0.188 with 4 trials running (8 instances)" in out


def test_p5_has_a_price_and_a_missing_price_says_so_in_the_bound():
    bound = estimate_cost("ml.p5.48xlarge", 2, 1800).bound()
    assert bound == "at most $113.14 (2 x ml.p5.48xlarge x $113.140/h x 0.5 h)"
    lines = estimate_cost("ml.nosuch.xlarge", 2, 1800, trials=3).lines()
    assert lines[0] == ("cost: an amount the workshop cannot bound (no price on record for ml.nosuch.xlarge; 3 trials x "
                        "2 instance(s) for 0.5 h); see https://aws.amazon.com/sagemaker/pricing/")
