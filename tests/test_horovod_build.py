"""Lab 2's Horovod, built behind the other labs: the background build's status, its lock, the room's
wheelhouse, `run all`'s order, and what lab 2 says while Horovod is not there (workshop/horovod_build.py).

Nothing here compiles Horovod or touches this environment's: the build's state and the wheel cache
live in a test's tmp_path (WORKSHOP_HOROVOD_STATE_DIR, WORKSHOP_CACHE_DIR), "not installed" is
this process's metadata look-up answering so, and the build is a stand-in script that runs
through the real background machinery (its own process, the lock, the status, the log).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import env_without_horovod

from workshop import REPO_ROOT, horovod_build
from workshop.__main__ import main
from workshop.horovod_build import HorovodNotReady, Status

# The stand-in for scripts/build_horovod.sh: HOROVOD_COMPILE=0 (make setup's fast path) finds no
# wheel, or with FAKE_CACHED_EXIT set installs a cached one and exits with it; the compile takes
# FAKE_BUILD_S seconds and exits FAKE_BUILD_EXIT, "installing" Horovod (the file FAKE_INSTALLED)
# when it succeeds. Every run is counted in FAKE_BUILD_RUNS.
FAKE_BUILD = """#!/usr/bin/env bash
echo "compile=${HOROVOD_COMPILE:-1}" >>"$FAKE_BUILD_RUNS"
if [ "${HOROVOD_COMPILE:-1}" = 0 ] && [ -n "${FAKE_CACHED_EXIT:-}" ]; then
    echo "[build_horovod] installing cached wheel (fake)"; [ "$FAKE_CACHED_EXIT" = 0 ] && touch "$FAKE_INSTALLED"
    exit "$FAKE_CACHED_EXIT"
fi
if [ "${HOROVOD_COMPILE:-1}" = 0 ]; then echo "[build_horovod] no wheel here: a compile is needed"; exit 3; fi
echo "[build_horovod] compiling (fake)"
sleep "$FAKE_BUILD_S"
[ "$FAKE_BUILD_EXIT" = 0 ] && touch "$FAKE_INSTALLED"
echo "[build_horovod] the last line of the fake build"
exit "$FAKE_BUILD_EXIT"
"""


class Fake:
    """This test's Horovod world: where its state is, and what its stand-in build did."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch):
        self.tmp = tmp
        self.mp = monkeypatch
        self.runs = tmp / "runs.txt"
        self.installed = tmp / "installed"
        self.script = tmp / "build.sh"
        self.script.write_text(FAKE_BUILD)
        self.workers: list[int] = []

    def build_takes(self, seconds: float, exit_status: int = 0) -> None:
        self.mp.setenv("FAKE_BUILD_S", str(seconds))
        self.mp.setenv("FAKE_BUILD_EXIT", str(exit_status))

    def compiles(self) -> int:
        return self.runs.read_text().count("compile=1") if self.runs.exists() else 0

    def building(self, pid: int, elapsed_s: float = 120, estimate_s: float = 600) -> Status:
        status = Status("building", target=horovod_build.target(), pid=pid,
                        pid_started=horovod_build.process_start_time(pid), started=time.time() - elapsed_s,
                        estimate_s=estimate_s, log=str(horovod_build.log_path()))
        horovod_build.write_status(status)
        return status


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """No Horovod here (as this process sees it), the build's state and the wheel cache in tmp_path,
    no wheelhouse, and the stand-in build script."""
    monkeypatch.setenv(horovod_build.STATE_ENV, str(tmp_path / "state"))
    monkeypatch.setenv(horovod_build.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(horovod_build.WHEELHOUSE_ENV, raising=False)
    real_version = importlib.metadata.version

    def version(name: str) -> str:
        if name == "horovod":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    world = Fake(tmp_path, monkeypatch)
    monkeypatch.setattr(horovod_build, "installed", lambda: world.installed.exists())
    monkeypatch.setattr(horovod_build, "BUILD_SCRIPT", world.script)
    monkeypatch.setenv("FAKE_BUILD_RUNS", str(world.runs))
    monkeypatch.setenv("FAKE_INSTALLED", str(world.installed))
    world.build_takes(2)
    yield world
    recorded = horovod_build.last_recorded()
    for pid in {*world.workers, *([recorded.pid] if recorded and recorded.pid else [])}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # a worker leads its own process group: it and its build


@pytest.fixture
def sleeper():
    """A live process that is not a build (for statuses that name a process)."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


def lines() -> tuple[list[str], Any]:
    out: list[str] = []
    return out, out.append


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


# --------------------------------------------------------------------------- the status


def test_nothing_built_says_how_to_start(fake):
    status = horovod_build.read_status()
    assert status.state == "absent"
    assert "make horovod" in status.fix() and "python -m workshop horovod start" in status.fix()
    fake.installed.touch()
    assert horovod_build.read_status().state == "ready"


def test_a_building_status_counts_down_and_reads_interrupted_once_its_process_is_gone(fake, sleeper):
    fake.building(sleeper.pid, elapsed_s=120, estimate_s=600)
    status = horovod_build.read_status()
    assert status.state == "building"
    assert "about 8 min left" in status.message() and str(horovod_build.log_path()) in status.message()
    assert "python -m workshop horovod --wait" in status.fix()
    fake.building(sleeper.pid, elapsed_s=590, estimate_s=600)
    assert ", under a minute left;" in horovod_build.read_status().message()
    fake.building(sleeper.pid, elapsed_s=900, estimate_s=600)
    assert "longer than the 10 min estimated" in horovod_build.read_status().message()

    # The same pid, but another process (the machine restarted, the pid was reused): not the build.
    stale = fake.building(sleeper.pid)
    horovod_build.write_status(Status(**{**stale.to_json(), "pid_started": stale.pid_started - 1000}))
    assert horovod_build.read_status().state == "interrupted"

    fake.building(sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    status = horovod_build.read_status()
    assert status.state == "interrupted"  # not "building" forever
    assert f"pid {sleeper.pid}" in status.message() and "stopped before it finished" in status.message()
    assert "make horovod" in status.fix()


def test_a_failed_build_names_its_log_and_last_line(fake):
    log = horovod_build.log_path()
    log.parent.mkdir(parents=True)
    log.write_text("[build_horovod] building\nerror: command 'g++' failed: No such file or directory\n")
    horovod_build.write_status(Status("failed", target=horovod_build.target(), finished=time.time(), exit_status=1,
                                      log=str(log)))
    status = horovod_build.read_status()
    assert status.state == "failed"
    assert str(log) in status.message() and "exit status 1" in status.message()
    assert "g++' failed" in status.message()  # its last line
    assert "make horovod" in status.fix() and str(log) in status.fix()
    # A failure recorded for other versions (requirements changed since) is no build for these.
    horovod_build.write_status(Status("failed", target="horovod=0.28.1 python=cp311 torch=2.12.0 tensorflow=2.20.0 "
                                      "patches=3", exit_status=1, log=str(log)))
    assert horovod_build.read_status().state == "absent"


def test_the_command_line_says_the_status_and_its_exit_status_follows_it(fake, sleeper, capsys):
    assert horovod_build.main([]) == 1
    assert "not installed" in capsys.readouterr().out
    fake.building(sleeper.pid)
    assert main(["horovod"]) == 0  # python -m workshop horovod
    assert "building in the background" in capsys.readouterr().out


def test_the_target_is_the_line_the_build_script_writes():
    """The sidecar both sides compare: scripts/build_horovod.sh's and this module's agree."""
    printed = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build_horovod.sh")], capture_output=True, text=True,
                             env={**os.environ, "VENV": sys.prefix, "HOROVOD_PRINT_TARGET": "1"}, check=True)
    assert printed.stdout.strip() == horovod_build.target()


# --------------------------------------------------------------------------- the lock and the background build


def test_the_lock_admits_one_holder(fake):
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held')")
    lock = horovod_build.state_dir() / "lock"
    with horovod_build.build_lock() as fd:
        assert fd is not None
        with horovod_build.build_lock() as second:
            assert second is None  # even in the same process
        held = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True).stdout
        assert held.strip() == "held"
    free = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True).stdout
    assert free.strip() == "free"


def test_start_builds_once_in_the_background_and_the_next_estimate_is_this_build(fake):
    out, echo = lines()
    fake.build_takes(3)
    status = horovod_build.start(echo)
    fake.workers.append(status.pid)
    assert status.state == "building" and status.pid != os.getpid()
    assert "no build has finished on this machine yet" in status.estimate_from
    assert any("building in the background" in line for line in out)
    # A second start while it runs: no second build.
    again = horovod_build.start(echo)
    assert again.state == "building" and again.pid == status.pid
    progress, show = lines()
    final = horovod_build.wait(show, every_s=0.5, poll_s=0.1)
    assert final.state == "ready", final.line()
    assert fake.compiles() == 1
    assert any("building in the background" in line for line in progress)
    recorded = horovod_build.last_recorded()
    assert recorded.state == "done" and "compiled here" in recorded.source
    seconds, why = horovod_build.estimate()
    assert 2 <= seconds < 60 and "the last build on this machine took" in why
    log = horovod_build.log_path().read_text()
    assert "a compile is needed" in log and "compiling (fake)" in log and "[horovod] done" in log


def test_a_cached_wheel_is_installed_at_once_and_nothing_builds_in_the_background(fake, monkeypatch):
    monkeypatch.setenv("FAKE_CACHED_EXIT", "0")
    out, echo = lines()
    status = horovod_build.start(echo)
    assert status.state == "ready" and fake.compiles() == 0
    assert out == ["[build_horovod] installing cached wheel (fake)",
                   "Horovod 0.28.1: ready (an installed, cached or shared wheel; nothing compiled)"]
    assert horovod_build.last_recorded().source == "an installed, cached or shared wheel; nothing compiled"
    # A cached wheel that installs but does not import: failed, with the log (make setup goes on).
    fake.installed.unlink()
    monkeypatch.setenv("FAKE_CACHED_EXIT", "1")
    status = horovod_build.start(echo)
    assert status.state == "failed" and fake.compiles() == 0 and horovod_build.main(["start"]) == 0
    assert str(horovod_build.log_path()) in status.message() and "make horovod" in status.fix()


def test_a_failed_build_is_retried_only_by_make_horovod(fake, capsys):
    fake.build_takes(0.5, exit_status=1)
    out, echo = lines()
    status = horovod_build.wait(echo, poll_s=0.1) if horovod_build.start(echo).state == "building" else None
    assert status is not None and status.state == "failed", status
    assert "the last line of the fake build" in status.message()
    assert horovod_build.start(echo).state == "failed"  # make setup: says so, builds nothing
    assert fake.compiles() == 1
    assert horovod_build.main(["--wait"]) == 1
    assert horovod_build.main(["build"]) == 1  # make horovod: builds again, waits, shows the log's end
    assert fake.compiles() == 2
    shown = capsys.readouterr().out
    assert f"the last lines of {horovod_build.log_path()}" in shown and "compiling (fake)" in shown


def test_a_build_killed_midway_reads_interrupted_and_starts_again(fake):
    fake.build_takes(120)
    out, echo = lines()
    first = horovod_build.start(echo)
    fake.workers.append(first.pid)
    assert first.state == "building"
    wait_for(lambda: fake.compiles() == 1)
    os.killpg(first.pid, signal.SIGKILL)  # the machine stopped: the worker and its build, no goodbye
    wait_for(lambda: horovod_build.process_start_time(first.pid) is None)
    assert horovod_build.read_status().state == "interrupted"
    second = horovod_build.start(echo)  # make setup again: the lock is free, so it builds again
    fake.workers.append(second.pid)
    assert second.state == "building" and second.pid != first.pid
    # Stopped politely (SIGTERM), the worker stops its build and says so.
    os.kill(second.pid, signal.SIGTERM)
    wait_for(lambda: horovod_build.read_status().state == "failed")
    status = horovod_build.read_status()
    assert "stopped by signal SIGTERM" in status.message()


# --------------------------------------------------------------------------- the room's wheelhouse


def cache_a_wheel(built_for: str, name: str | None = None) -> Path:
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    wheel = horovod_build.wheel_dir() / (name or f"horovod-0.28.1-{tag}-{tag}-linux_x86_64.whl")
    wheel.parent.mkdir(parents=True, exist_ok=True)
    wheel.write_bytes(b"a wheel")
    Path(f"{wheel}.built-for").write_text(built_for + "\n")
    return wheel


def older_torch(target: str) -> str:
    return " ".join("torch=2.12.0" if part.startswith("torch=") else part for part in target.split())


def test_a_folder_wheelhouse_serves_a_matching_wheel_and_says_why_not_another(fake, tmp_path):
    with pytest.raises(Exception, match="No Horovod wheel built for this environment"):
        horovod_build.publish(str(tmp_path / "room"))
    wheel = cache_a_wheel(horovod_build.target())
    out, echo = lines()
    horovod_build.publish(str(tmp_path / "room"), echo)
    assert "WORKSHOP_WHEELHOUSE=" in out[0]
    wheel.unlink()
    fetched = horovod_build.fetch_from_wheelhouse(horovod_build.wheel_dir(), str(tmp_path / "room"), echo=echo)
    assert fetched == wheel and wheel.read_bytes() == b"a wheel"
    assert horovod_build.cached_wheel() == wheel

    # A wheel built for another torch: named, with what differs, and not taken.
    other = tmp_path / "other-room"
    other.mkdir()
    (other / wheel.name).write_bytes(b"old")
    (other / f"{wheel.name}.built-for").write_text(older_torch(horovod_build.target()))
    (other / "horovod-0.28.1-cp39-cp39-linux_x86_64.whl").write_bytes(b"no sidecar")
    name, reasons = horovod_build.find_in_wheelhouse(str(other))
    assert name is None
    torch_version = importlib.metadata.version("torch")
    assert any(f"torch 2.12.0 (this environment: {torch_version})" in r for r in reasons), reasons
    assert any("cp39" in r and "no " in r and ".built-for" in r for r in reasons), reasons
    out, echo = lines()
    assert horovod_build.fetch_from_wheelhouse(tmp_path / "into", str(other), echo=echo) is None
    assert any("not using" in line and "torch 2.12.0" in line for line in out), out
    assert not (tmp_path / "into").exists()


def test_an_s3_wheelhouse_serves_a_matching_wheel_and_says_why_not_another(fake, moto_session, tmp_path):
    s3 = moto_session.client("s3")
    s3.create_bucket(Bucket="workshop-room")
    wheel = cache_a_wheel(horovod_build.target())
    out, echo = lines()
    where = horovod_build.publish("s3://workshop-room/horovod", echo)
    assert where == f"s3://workshop-room/horovod/{wheel.name}"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="workshop-room")["Contents"])
    assert keys == [f"horovod/{wheel.name}", f"horovod/{wheel.name}.built-for"]
    wheel.unlink()
    Path(f"{wheel}.built-for").unlink()
    fetched = horovod_build.fetch_from_wheelhouse(horovod_build.wheel_dir(), "s3://workshop-room/horovod", echo=echo)
    assert fetched == wheel and wheel.read_bytes() == b"a wheel"
    assert horovod_build.cached_wheel() == wheel

    s3.put_object(Bucket="workshop-room", Key=f"horovod/{wheel.name}.built-for",
                  Body=older_torch(horovod_build.target()).encode())
    out, echo = lines()
    assert horovod_build.fetch_from_wheelhouse(tmp_path / "into", "s3://workshop-room/horovod", echo=echo) is None
    assert any("not using" in line and "torch 2.12.0" in line for line in out), out
    out, echo = lines()
    assert horovod_build.fetch_from_wheelhouse(tmp_path / "into", "s3://no-such-room/horovod", echo=echo) is None
    assert any("could not be read" in line and "building instead" in line for line in out), out


def test_the_build_script_looks_in_the_wheelhouse_before_compiling(fake, tmp_path):
    """scripts/build_horovod.sh in an environment without Horovod, an empty cache and a wheelhouse
    whose only wheel was built for another torch: it says so and stops where it would compile."""
    python = env_without_horovod(tmp_path / "env")
    room = tmp_path / "room"
    room.mkdir()
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    (room / f"horovod-0.28.1-{tag}-{tag}-linux_x86_64.whl").write_bytes(b"old")
    (room / f"horovod-0.28.1-{tag}-{tag}-linux_x86_64.whl.built-for").write_text(older_torch(horovod_build.target()))
    env = {**os.environ, "VENV": str(python.parent.parent), "HOROVOD_COMPILE": "0", "HOROVOD_SKIP_VERIFY": "1",
           "WORKSHOP_WHEELHOUSE": str(room), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build_horovod.sh")], capture_output=True, text=True,
                          env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == horovod_build.NEEDS_COMPILE, out
    assert f"looking in the wheelhouse {room}" in out and "torch 2.12.0" in out and "it must be compiled" in out, out
    assert not list(horovod_build.wheel_dir().glob("*.whl"))


@pytest.mark.horovod
def test_a_wheel_from_the_wheelhouse_is_installed_without_compiling(tmp_path, monkeypatch):
    """The real wheel (the set-up's build cached it), published to a folder, installed by
    scripts/build_horovod.sh through an empty cache into an environment that lacks Horovod;
    HOROVOD_COMPILE=0 proves that nothing compiled."""
    python = env_without_horovod(tmp_path / "env")
    venv = python.parent.parent
    wanted = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build_horovod.sh")], capture_output=True, text=True,
                            env={**os.environ, "VENV": str(venv), "HOROVOD_PRINT_TARGET": "1"}, check=True).stdout.strip()
    real = horovod_build.cached_wheel(wanted)  # in the real cache, before this test points it elsewhere
    if real is None:
        pytest.skip(f"no Horovod wheel for {wanted} in {horovod_build.wheel_dir()} (the set-up's build leaves one)")
    room = tmp_path / "room"
    room.mkdir()
    (room / real.name).symlink_to(real)
    (room / f"{real.name}.built-for").write_text(wanted + "\n")
    monkeypatch.setenv(horovod_build.CACHE_ENV, str(tmp_path / "cache"))
    env = {**os.environ, "VENV": str(venv), "HOROVOD_COMPILE": "0", "HOROVOD_SKIP_VERIFY": "1",
           "WORKSHOP_WHEELHOUSE": str(room), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build_horovod.sh")], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"took {real.name}" in proc.stdout and "installing cached wheel" in proc.stdout, proc.stdout
    assert (tmp_path / "cache" / "wheels" / real.name).is_file()  # kept in the cache for the next venv
    where = subprocess.run([python, "-c", "import horovod; print(horovod.__file__)"], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert where.startswith(str(venv)), where


# --------------------------------------------------------------------------- lab 2 while Horovod is not there


@pytest.mark.parametrize("state", ["absent", "building", "failed"])
def test_running_lab_2_without_horovod_says_what_is_happening_and_what_to_do(state, fake, sleeper, capsys,
                                                                            monkeypatch):
    if state == "building":
        fake.building(sleeper.pid, elapsed_s=60, estimate_s=600)
    elif state == "failed":
        log = horovod_build.log_path()
        log.parent.mkdir(parents=True)
        log.write_text("CMake Error: CMAKE_CXX_COMPILER not set\n")
        horovod_build.write_status(Status("failed", target=horovod_build.target(), exit_status=1, log=str(log)))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("something started"))
    assert main(["run", "horovod_pytorch"]) == 2
    captured = capsys.readouterr()
    err = captured.out + captured.err
    assert "Traceback" not in err
    expected = {
        "absent": ["not installed", "make horovod", "python -m workshop horovod start"],
        "building": ["building in the background", "about 9 min left", "python -m workshop horovod --wait"],
        "failed": ["the build failed", str(horovod_build.log_path()), "CMAKE_CXX_COMPILER", "make horovod"],
    }[state]
    assert all(text in err for text in expected), err


def test_in_a_notebook_horovod_not_ready_is_its_message_not_a_stack_of_frames(fake, capsys):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.hist_file = ":memory:"  # nothing written to the user's IPython history
    shell = InteractiveShell.instance(config=config)
    try:
        result = shell.run_cell("from workshop.launchers.horovod import check_installed\ncheck_installed('pytorch')")
    finally:
        InteractiveShell.clear_instance()
    assert isinstance(result.error_in_exec, HorovodNotReady)  # the cell fails: Run All stops there
    shown = capsys.readouterr()
    text = shown.out + shown.err
    assert "Horovod is not ready" in text and "make horovod" in text
    assert "Traceback" not in text and "File " not in text and "check_installed(" not in text


# --------------------------------------------------------------------------- run all


def _fake_run_one(order: list[str]):
    class Result:
        wall_time_s = 1.0

        def metric(self, name: str) -> float:
            return 0.9

    def run_one(lab, args, hps):
        order.append(lab.key)
        return Result()

    return run_one


def test_run_all_runs_lab_2_last_once_its_build_is_done_with_every_row(fake, monkeypatch, capsys):
    import workshop.__main__ as cli

    order: list[str] = []
    monkeypatch.setattr(cli, "run_one", _fake_run_one(order))
    fake.build_takes(4)
    started = horovod_build.start(print)
    fake.workers.append(started.pid)
    assert started.state == "building"
    assert main(["run", "all"]) == 0
    assert order == ["parameter_server", "data_parallel", "model_parallel", "horovod_pytorch", "horovod_tensorflow"]
    out = capsys.readouterr().out
    assert ("running 1_parameter_server, 3_data_parallel, 4_model_parallel first, then 2_horovod (train_pytorch), "
            "2_horovod (train_tensorflow) once it is ready") in out
    assert "Waiting for it" in out and "Horovod 0.28.1: ready" in out
    table = out[out.index("Summary (local mode)"):]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "status" not in line]
    assert [row.split("|")[1].strip().split(" ")[0] for row in rows] == [
        "1_parameter_server", "2_horovod", "2_horovod", "3_data_parallel", "4_model_parallel"]
    assert all(row.rstrip(" |").endswith("ok") for row in rows), rows


def test_run_all_with_a_failed_build_ends_with_failed_rows_that_name_the_log(fake, monkeypatch, capsys):
    import workshop.__main__ as cli

    order: list[str] = []
    monkeypatch.setattr(cli, "run_one", _fake_run_one(order))
    fake.build_takes(2, exit_status=1)
    fake.workers.append(horovod_build.start(print).pid)
    assert main(["run", "all"]) == 1
    assert order == ["parameter_server", "data_parallel", "model_parallel"]
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert captured.err.count(str(horovod_build.log_path())) >= 2 and "make horovod" in captured.err
    table = captured.out[captured.out.index("Summary (local mode)"):]
    rows = [line for line in table.splitlines() if line.startswith("| 2_horovod")]
    assert len(rows) == 2 and all("FAILED" in row for row in rows)
    assert len([line for line in table.splitlines() if line.startswith("| ") and "status" not in line]) == 5


def test_run_all_keeps_the_labs_order_when_horovod_is_ready(fake, monkeypatch, capsys):
    import workshop.__main__ as cli

    order: list[str] = []
    monkeypatch.setattr(cli, "run_one", _fake_run_one(order))
    fake.installed.touch()
    assert main(["run", "all"]) == 0
    assert order == ["parameter_server", "horovod_pytorch", "horovod_tensorflow", "data_parallel", "model_parallel"]


# --------------------------------------------------------------------------- the tests themselves


def test_the_tests_that_need_horovod_run_last_and_skip_while_it_builds(tmp_path, sleeper):
    """conftest's order and wait, in a pytest of its own: in an environment without Horovod whose
    build is "running" (a live process), `--no-horovod-wait` (make test-fast) skips the Horovod
    tests at once; without it they wait for the build, and fail with its log once it is gone."""
    python = env_without_horovod(tmp_path / "env")
    state = tmp_path / "state"
    state.mkdir()
    (state / "build.log").write_text("[build_horovod] building horovod 0.28.1\nsomething went wrong here\n")
    (state / "status.json").write_text(json.dumps({
        "state": "building", "target": horovod_build.target(), "pid": sleeper.pid, "started": time.time(), "estimate_s": 600,
        "pid_started": horovod_build.process_start_time(sleeper.pid), "log": str(state / "build.log")}))
    selection = ["tests/test_lab2_horovod.py::test_rank_plan_and_variables_are_the_ones_horovodrun_uses",
                 "tests/test_lab2_horovod.py::test_folder_name_selects_both_scripts"]
    env = {**os.environ, horovod_build.STATE_ENV: str(state), "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    base = [str(python), "-m", "pytest", *selection, "-p", "no:cacheprovider", "-rs", "--timeout=300"]

    fast = subprocess.run([*base, "-v", "--no-horovod-wait"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert fast.returncode == 0 and "1 passed, 1 skipped" in fast.stdout, fast.stdout + fast.stderr
    ran = [line.split("::")[1].split(" ")[0] for line in fast.stdout.splitlines() if line.startswith("tests/")]
    assert ran == ["test_folder_name_selects_both_scripts",  # named second, run first: it needs no Horovod
                   "test_rank_plan_and_variables_are_the_ones_horovodrun_uses"], fast.stdout
    assert "needs Horovod, which is not ready" in fast.stdout and "building in the background" in fast.stdout

    full = subprocess.Popen([*base, "-q"], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    seen = ""
    for line in full.stdout:  # until it says it waits for the "build"
        seen += line
        if "[tests that need Horovod wait] Horovod: building in the background" in line:
            break
    assert full.poll() is None, seen
    sleeper.kill()  # the build's process goes away without finishing
    out = seen + full.communicate(timeout=300)[0]
    assert full.returncode == 1 and "1 passed, 1 error" in out, out  # it fails in its set-up: the wait
    assert "stopped before it finished" in out and "something went wrong here" in out, out


def test_make_setup_starts_the_build_after_the_base_set_up_and_nothing_waits_for_it(tmp_path):
    """The Makefile's order: the base set-up (venv, requirements, the package), then `start`, which
    returns; no target but `make horovod` compiles or waits; `make test-fast` never waits."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("no make")
    venv = tmp_path / "venv"

    def commands(*targets: str) -> list[str]:
        out = subprocess.run(["make", "--no-print-directory", "-n", "-B", *targets, f"VENV={venv}"], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=True, timeout=60).stdout
        return [line for line in out.splitlines() if line.strip() and not line.lstrip().startswith("#")]

    setup = commands("setup")
    assert setup[-1] == f"{venv}/bin/python -m workshop.horovod_build start"
    assert any("pip install --quiet --no-deps --no-build-isolation -e ." in line for line in setup[:-1])
    for target in ("setup", "workshop", "test", "test-fast", "lab"):
        assert not any("build_horovod" in line or "horovod_build build" in line for line in commands(target)), target
    assert any("--no-horovod-wait" in line for line in commands("test-fast"))
    assert not any("--no-horovod-wait" in line for line in commands("test"))
    assert commands("bench-strategies")[-2:] == [f"{venv}/bin/python -m workshop.horovod_build --wait",
                                                 f"PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX={venv}/pycache "
                                                 f"{venv}/bin/python benchmarks/bench_strategies.py --profile"]
    horovod = commands("horovod")
    assert horovod[-2:] == [f"{venv}/bin/python -m workshop.horovod_build build",
                            f"VENV={venv} HOROVOD_VERIFY=1 bash scripts/build_horovod.sh"]


def test_check_build_says_it_is_still_checking_until_its_list_comes(tmp_path):
    """The issue: lab 2's `horovodrun --check-build` cell sat 111 s on one "running..." line."""
    from workshop.horovod_build import check_build

    fake = tmp_path / "horovodrun"  # as the real one: nothing on stdout until it is done
    fake.write_text("#!/bin/sh\nsleep 2.6\necho 'Available Frameworks:'\necho '    [ ] TensorFlow'\n"
                    "echo '    [X] PyTorch'\necho 'Available Controllers:'\necho '    [X] Gloo'\n")
    fake.chmod(0o755)
    said = []
    built = check_build(str(fake), echo=said.append, every_s=1.0)
    assert built == {"TensorFlow": False, "PyTorch": True, "Gloo": True}
    assert said[0].startswith("running `horovodrun --check-build`")
    ticks = [line for line in said if line.startswith("  still checking: ")]
    assert 2 <= len(ticks) <= 3, said
    assert "[X] PyTorch" in said[-1] and said[-1].endswith(" s)")
    fake.write_text("#!/bin/sh\necho 'no torch' >&2\nexit 1\n")
    with pytest.raises(RuntimeError, match="exit status 1"):
        check_build(str(fake), echo=said.append, every_s=1.0)
