"""Horovod for lab 2, built behind the other labs: the background build, its status, a room's wheelhouse.

    python -m workshop horovod                 # Horovod: ready | building, about 6 min left (log: ...) | failed ...
    python -m workshop horovod --wait          # waits for a running build, a line every 30 s; non-zero if it failed
    python -m workshop horovod start           # what `make setup` runs: installs a cached or shared wheel, or
                                               # starts the compile in the background, and returns
    python -m workshop horovod build           # what `make horovod` runs: start (a failed build again) and wait
    python -m workshop horovod publish DEST    # the organizer: put this environment's wheel in a folder or s3://...

Only lab 2 needs Horovod, and Horovod 0.28.1 is source only: compiling it for the pinned frameworks
takes 6-14 minutes on 2 cores. So the set-up does not wait for it. `make setup` installs the
workshop's environment, then (this module's `start`) takes Horovod from the first place that has it
for this environment: the venv itself, the wheel cache
(`${WORKSHOP_CACHE_DIR:-~/.cache/distributed-training-workshop}/wheels`), the room's wheelhouse
(`WORKSHOP_WHEELHOUSE`: a folder or an `s3://bucket/prefix` URI that an organizer filled with
`publish`); only when none has it does it start the compile (`scripts/build_horovod.sh`) in a
process of its own, in the background, and return. Labs 1, 3 and 4, JupyterLab and the tests that
need no Horovod start meanwhile; `run all` runs lab 2 last, once its wheel is ready.

A wheel is taken only when its `<wheel>.built-for` sidecar names exactly this environment's
Horovod version, Python tag, torch and TensorFlow versions and the build's patch revision
(`target()`, the same line `scripts/build_horovod.sh` writes).

The build leaves its state in the venv (`<venv>/horovod-build/`, or `WORKSHOP_HOROVOD_STATE_DIR`):
`status.json` (building since when, with its process id; done; failed, with the exit status), the
build's log, and a lock file that the building process holds while it runs, so that a second
build cannot start beside it. A status that says "building" whose process is gone (the machine was
stopped, the process killed) reads as interrupted, never as building forever. How long a build
took is kept per machine in the cache folder, and is the next build's estimate.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from workshop import REPO_ROOT
from workshop.errors import WorkshopError

HOROVOD_VERSION = "0.28.1"
# scripts/build_horovod.sh's PATCH_REV (a test keeps them equal, with workshop.launchers.horovod's BUILD_REV).
PATCH_REV = 3
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build_horovod.sh"
CACHE_ENV = "WORKSHOP_CACHE_DIR"
WHEELHOUSE_ENV = "WORKSHOP_WHEELHOUSE"
STATE_ENV = "WORKSHOP_HOROVOD_STATE_DIR"
# scripts/build_horovod.sh's exit status with HOROVOD_COMPILE=0 when only a compile would give Horovod.
NEEDS_COMPILE = 3
# Without a build on record on this machine: DESIGN.md's measurements are 6-14 min on 2 cores.
DEFAULT_BUILD_S = 600
DEFAULT_BUILD_SOURCE = "no build has finished on this machine yet; 6-14 min is usual on 2 cores"
PROGRESS_EVERY_S = 30
RETRY = "make horovod"
WAIT = "python -m workshop horovod --wait"
START = "python -m workshop horovod start"
SIDECAR = ".built-for"
_MODULE = "workshop.horovod_build"
_WORKER = "worker"  # `python -m workshop.horovod_build worker`: the background build's own process
WORKER_PREFIX = "[horovod] "  # the worker's own lines in the log


# --------------------------------------------------------------------------- where things are


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "distributed-training-workshop")


def wheel_dir() -> Path:
    return cache_dir() / "wheels"


def state_dir() -> Path:
    """The build's status, log and lock: in the venv the build installs into (this interpreter's)."""
    return Path(os.environ.get(STATE_ENV) or Path(sys.prefix) / "horovod-build")


def status_path() -> Path:
    return state_dir() / "status.json"


def log_path() -> Path:
    return state_dir() / "build.log"


def history_path() -> Path:
    return cache_dir() / "horovod-build-times.json"


def distribution(package: str) -> tuple[str, str]:
    """(distribution, version) of `package` as installed: `package` itself or its CPU-only distribution
    (requirements.txt installs `tensorflow-cpu`, which provides the same `tensorflow` module);
    (package, "none") when neither is installed."""
    for name in (package, f"{package}-cpu"):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return package, "none"


def target() -> str:
    """What a wheel must have been built for to serve this environment: the `.built-for` line (as
    scripts/build_horovod.sh writes it). TensorFlow's two distributions give the same module but not the
    same headers (the CPU one's leave CUDA out), so the line names which one."""
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    tf_dist, tf_version = distribution("tensorflow")
    return (f"horovod={HOROVOD_VERSION} python={tag} torch={distribution('torch')[1]} "
            f"{tf_dist}={tf_version} patches={PATCH_REV}")


# --------------------------------------------------------------------------- is it installed?

REBUILD = (f"`{RETRY}` (builds Horovod {HOROVOD_VERSION} with the workshop's patches; 6-14 min on 2 cores the "
           "first time, about a minute from the cached wheel)")
_EXTENSION_DIR = {"pytorch": ("torch", "torch", "mpi_lib_v2"), "tensorflow": ("tensorflow", "tensorflow", "mpi_lib")}


def installed_problem(framework: str) -> tuple[str, str] | None:
    """None if this environment's Horovod was built for `framework` as installed, else (what is
    wrong, its fix). Reads metadata only (no framework import): Horovod records the framework
    versions it was built against in `horovod/metadata.json`, and each extension is a shared library."""
    if framework not in _EXTENSION_DIR:
        raise WorkshopError(f"Unknown Horovod framework {framework!r}.", "use 'pytorch' or 'tensorflow'.")
    try:
        version = importlib.metadata.version("horovod")
    except importlib.metadata.PackageNotFoundError:
        return ("Horovod is not installed in this environment (it is not on PyPI as a wheel, and no framework "
                "wheel includes it), and no build of it has run here.",
                f"build it: {REBUILD}; or `{START}` builds it in the background while you do labs 1, 3 and 4.")
    spec = importlib.util.find_spec("horovod")
    root = Path(spec.origin).parent if spec and spec.origin else None
    subdir, package, library = _EXTENSION_DIR[framework]
    if root is None or not any((root / subdir).glob(f"{library}*.so")):
        return (f"Horovod {version} here was built without {framework} support (no horovod/{subdir}/{library}*.so).",
                f"rebuild it with {framework}: {REBUILD} (set HOROVOD_WITH_{framework.upper()}=1 if you build it "
                "yourself).")
    try:
        built_for = json.loads((root / "metadata.json").read_text()).get(framework)
        installed = distribution(package)[1]
    except (OSError, ValueError):
        return None
    if installed == "none":
        return None
    if built_for and built_for.split("+")[0] != installed.split("+")[0]:
        return (f"Horovod {version} was built against {package} {built_for}, but {package} {installed} is installed: "
                "its extension would fail to load or crash.", f"rebuild it: {REBUILD}.")
    return None


def installed() -> bool:
    return all(installed_problem(f) is None for f in _EXTENSION_DIR)


class HorovodNotReady(WorkshopError):
    """Horovod is not there (yet): the build's state and what to do. In a notebook it shows as its
    message and fix, without a stack of frames (IPython asks an exception for `_render_traceback_`)."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31mHorovod is not ready\x1b[0m: {self}"]


def check_installed(framework: str) -> None:
    """Fail with the fix unless this environment's Horovod was built for `framework` as installed;
    while its build runs (or after it failed, or was stopped) the error says that, and what to do."""
    problem = installed_problem(framework)
    if problem is None:
        return
    status = read_status()
    if status.state in ("building", "failed", "interrupted"):
        raise HorovodNotReady(status.message(), status.fix())
    raise HorovodNotReady(*problem)


# --------------------------------------------------------------------------- the build's status


def _now() -> float:
    return time.time()


def _clock(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch).strftime("%H:%M")


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes >= 1.5 else ("1 min" if minutes >= 0.5 else "under a minute")


def process_start_time(pid: int) -> float | None:
    """When process `pid` started (epoch seconds), or None if there is no such process. With the pid,
    it names one process: after a restart another process may have the pid, but not its start time."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # ended, not yet reaped by its parent
            return None
        return process.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


@dataclass
class Status:
    """The build's state: `ready` (Horovod is installed for this environment), `building`, `failed`,
    `interrupted` (its status says building but its process is gone), or `absent` (no build)."""

    state: str
    target: str = ""
    pid: int | None = None
    pid_started: float | None = None
    started: float | None = None
    finished: float | None = None
    estimate_s: float | None = None
    estimate_from: str = ""
    exit_status: int | None = None
    log: str = ""
    source: str = ""

    @property
    def elapsed_s(self) -> float:
        return max(_now() - (self.started or _now()), 0.0)

    @property
    def left_s(self) -> float | None:
        return None if self.estimate_s is None else self.estimate_s - self.elapsed_s

    def message(self) -> str:
        log = f"log: {self.log}" if self.log else "no log"
        if self.state == "ready":
            return f"Horovod {HOROVOD_VERSION}: ready" + (f" ({self.source})" if self.source else "")
        if self.state == "building":
            left = self.left_s
            when = f"since {_clock(self.started)}, {_minutes(self.elapsed_s)} in" if self.started else "just started"
            if left is None:
                eta = ""
            elif left >= 30:
                eta = f", about {_minutes(left)} left"
            elif left > 0:
                eta = ", under a minute left"
            else:
                eta = f", longer than the {_minutes(self.estimate_s)} estimated"
            return f"Horovod: building in the background ({when}{eta}; {log})"
        if self.state == "failed":
            when = f" at {_clock(self.finished)}" if self.finished else ""
            how = f", {self.source}" if self.source else ""
            return f"Horovod: the build failed{when} (exit status {self.exit_status}{how}; {log}){self._last_line()}"
        if self.state == "interrupted":
            when = f", started {_clock(self.started)}" if self.started else ""
            return (f"Horovod: the build (pid {self.pid}{when}) stopped before it finished: its process is gone "
                    f"(the machine or the process was stopped); {log}")
        return "Horovod: not installed, and no build is running"

    def fix(self) -> str:
        if self.state == "ready":
            return ""
        if self.state == "building":
            return (f"wait for it: `{WAIT}` (a line every {PROGRESS_EVERY_S} s), then run this again; labs 1, 3 "
                    "and 4 do not need it")
        if self.state == "failed":
            return (f"read the end of {self.log or 'the log'} (often a missing C++ compiler or CMake: "
                    f"`apt-get install g++ cmake`), then retry with `{RETRY}`")
        if self.state == "interrupted":
            return f"start it again: `{RETRY}` (waits for it) or `{START}` (in the background)"
        return f"build it: `{RETRY}` (waits for it), or `{START}` (in the background)"

    def line(self) -> str:
        """The message and what to do: for a running build how to follow it, else the fix."""
        if self.state == "building":
            return (f"{self.message()}\n  Labs 1, 3 and 4 do not need it. `python -m workshop horovod` says how far it "
                    f"is; `{WAIT}` waits for it.")
        fix = self.fix()
        return self.message() + (f"\n  Fix: {fix}" if fix else "")

    def _last_line(self) -> str:
        """The build's own last line (not the worker's closing `[horovod] ...` line)."""
        tail = log_tail(Path(self.log), 5).splitlines() if self.log else []
        build = [line.strip() for line in tail if line.strip() and not line.startswith(WORKER_PREFIX)]
        return f"; its last line: {build[-1]}" if build else ""

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def write_status(status: Status) -> None:
    path = status_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status.to_json(), indent=1) + "\n")
    os.replace(tmp, path)  # readers see the old status or the new one, never half of one


def last_recorded() -> Status | None:
    """The status as the build (or `start`) last wrote it, not checked against processes; None without one."""
    try:
        data = json.loads(status_path().read_text())
        return Status(**{k: v for k, v in data.items() if k in Status.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None


def alive(status: Status) -> bool:
    """Whether the process a `building` status names is still that build (same pid, same start)."""
    if status.pid is None:
        return False
    started = process_start_time(status.pid)
    return started is not None and (status.pid_started is None or abs(started - status.pid_started) < 1.0)


def read_status() -> Status:
    """The build's state for this environment, checked against the processes that run."""
    recorded = last_recorded()
    here = target()
    if recorded is not None and recorded.state == "building":
        if alive(recorded):
            return recorded
        recorded = Status(**{**asdict(recorded), "state": "interrupted"})
    if installed():
        source = recorded.source if recorded is not None and recorded.state == "done" else ""
        return Status("ready", target=here, source=source, log=recorded.log if recorded else "")
    if recorded is None or recorded.target != here or recorded.state == "done":
        return Status("absent", target=here)  # no build for this environment (a done build was uninstalled)
    return recorded


# --------------------------------------------------------------------------- the lock


@contextlib.contextmanager
def build_lock() -> Iterator[int | None]:
    """The lock a build holds while it runs: yields its file descriptor, or None when another
    process holds it (a build is running, or being started). Released when its holder exits,
    however it exits."""
    path = state_dir() / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- estimates


def estimate() -> tuple[float, str]:
    """How long a compile takes here: the last one on this machine (the cache folder's record), else
    the stated default."""
    try:
        builds = json.loads(history_path().read_text())["builds"]
        last = builds[-1]
        return float(last["seconds"]), f"the last build on this machine took {_minutes(last['seconds'])}"
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return float(DEFAULT_BUILD_S), DEFAULT_BUILD_SOURCE


def record_duration(seconds: float) -> None:
    path = history_path()
    try:
        builds = json.loads(path.read_text())["builds"]
    except (OSError, ValueError, KeyError, TypeError):
        builds = []
    builds = [*builds, {"seconds": round(seconds), "finished": _now(), "cpus": os.cpu_count()}][-10:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"builds": builds}, indent=1) + "\n")


# --------------------------------------------------------------------------- start, build, wait


def _script_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "VENV": sys.prefix, "HOROVOD_SKIP_VERIFY": "1", **extra}


def _fast_path(echo: Callable[[str], None]) -> int:
    """scripts/build_horovod.sh without the compile: installed, the cache, the wheelhouse. Its exit
    status: 0 (Horovod is installed), NEEDS_COMPILE, or another failure. Its lines go to `echo` and
    to the log."""
    log = log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", str(BUILD_SCRIPT)], env=_script_env(HOROVOD_COMPILE="0"), cwd=REPO_ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            echo(line.rstrip("\n"))
        return proc.wait()


def start(echo: Callable[[str], None] = print, retry: bool = False) -> Status:
    """Horovod for this environment without waiting for a compile: nothing to do when it is
    installed or being built; a cached or shared wheel is installed now; else the compile starts
    in the background. After a failed build, only `retry=True` (`make horovod`) starts it again."""
    with build_lock() as fd:
        status = read_status()
        if fd is None or status.state in ("ready", "building") or (status.state == "failed" and not retry):
            echo(status.line())  # fd None: another process holds the lock, starting or running a build
            return status
        began = _now()
        code = _fast_path(echo)
        if code != NEEDS_COMPILE:
            done = code == 0
            write_status(Status("done" if done else "failed", target=target(), started=began, finished=_now(),
                                 exit_status=None if done else code, log=str(log_path()),
                                 source="an installed, cached or shared wheel; nothing compiled" if done else ""))
            status = read_status()
            echo(status.line())
            return status
        seconds, why = estimate()
        with open(log_path(), "a") as out:
            # A session of its own: Ctrl-C in the terminal that ran `make` (or JupyterLab's) does not stop it.
            worker = subprocess.Popen(
                [sys.executable, "-m", _MODULE, _WORKER, "--lock-fd", str(fd), "--estimate-s", str(seconds),
                 "--estimate-from", why, "--script", str(BUILD_SCRIPT)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
                env=_script_env(), pass_fds=(fd,), start_new_session=True)
        # The worker holds the lock too now (the inherited descriptor); it writes its status first thing.
        deadline = _now() + 60
        while _now() < deadline and worker.poll() is None:
            recorded = last_recorded()
            if recorded is not None and recorded.pid == worker.pid:
                break
            time.sleep(0.1)
    status = read_status()
    echo(status.line())
    return status


def worker(lock_fd: int, estimate_s: float, estimate_from: str, script: Path = BUILD_SCRIPT) -> int:
    """The background build (its own process, holding the lock through `lock_fd`): the status says
    building, then done or failed. Its output is the log. Stopped by a signal, it stops the whole
    build (its process group: bash, pip, the compilers) and says so in the status; killed outright
    (or the machine stopped), its status reads as interrupted (`read_status`)."""
    import signal

    pid = os.getpid()
    began = _now()
    building = Status("building", target=target(), pid=pid, pid_started=process_start_time(pid), started=began,
                      estimate_s=estimate_s, estimate_from=estimate_from, log=str(log_path()))
    write_status(building)

    def stopped(signum: int, _frame: object) -> None:
        write_status(Status("failed", target=building.target, started=began, finished=_now(), exit_status=128 + signum,
                             log=building.log, source=f"stopped by signal {signal.Signals(signum).name}"))
        print(f"{WORKER_PREFIX}stopped by {signal.Signals(signum).name}; retry with `{RETRY}`", flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(os.getpgrp(), signal.SIGTERM)  # bash, pip and the compilers: this session's group
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stopped)
    print(f"{WORKER_PREFIX}building in the background since {_clock(began)} (pid {pid}; estimate "
          f"{_minutes(estimate_s)}: {estimate_from})", flush=True)
    code = subprocess.run(["bash", str(script)], env=_script_env(), cwd=REPO_ROOT, stdin=subprocess.DEVNULL).returncode
    finished = _now()
    if code == 0:
        record_duration(finished - began)
        write_status(Status("done", target=building.target, started=began, finished=finished, log=building.log,
                             source=f"compiled here in {_minutes(finished - began)}"))
        print(f"{WORKER_PREFIX}done in {finished - began:.0f} s", flush=True)
    else:
        write_status(Status("failed", target=building.target, started=began, finished=finished, exit_status=code,
                             log=building.log))
        print(f"{WORKER_PREFIX}FAILED with exit status {code}; retry with `{RETRY}`", flush=True)
    os.close(lock_fd)
    return code


def wait(echo: Callable[[str], None] = print, every_s: float = PROGRESS_EVERY_S, poll_s: float = 2.0,
         timeout_s: float | None = None, shown_at: float | None = None) -> Status:
    """Wait while a build runs, with a status line at once (unless one was shown at `shown_at`) and
    then every `every_s` seconds; returns the status it ended in (or the running one after `timeout_s`)."""
    began = _now()
    shown = shown_at
    while True:
        status = read_status()
        if status.state != "building":
            return status
        if shown is None or _now() - shown >= every_s:
            echo(status.message())
            shown = _now()
        if timeout_s is not None and _now() - began >= timeout_s:
            return status
        time.sleep(min(poll_s, every_s))


def wait_until_ready(echo: Callable[[str], None] = print) -> Status:
    """For lab 2 (`run all`, the notebook): wait for a running build, showing its progress; then
    Horovod is ready, or this raises `HorovodNotReady` with the build's state and what to do."""
    status = read_status()
    if status.state == "building":
        echo(f"{status.message()}. Waiting for it, with a line every {PROGRESS_EVERY_S} s (labs 1, 3 and 4 do not "
             "need it; interrupting stops only this wait, not the build).")
        status = wait(echo, shown_at=_now())
    if status.state != "ready":
        raise HorovodNotReady(status.message(), status.fix())
    echo(status.message())
    return status


def build(echo: Callable[[str], None] = print) -> Status:
    """`make horovod`: start a build (again after a failure) and wait for it; on failure, the log's end."""
    status = start(echo, retry=True)
    status = wait(echo) if status.state == "building" else status
    if status.state == "ready":
        echo(status.message())
    elif status.log:
        echo(f"--- the last lines of {status.log} ---\n{log_tail(Path(status.log)).rstrip()}\n---\n{status.line()}")
    return status


def check_build(horovodrun: str | None = None, echo: Callable[[str], None] = print,
                every_s: float = 10.0) -> dict[str, bool]:
    """`horovodrun --check-build`: what this Horovod was built with ({"PyTorch": True, "Gloo": True, ...}).

    It imports PyTorch and TensorFlow to see what Horovod can load, and prints nothing until it is done
    (20 s to 2 minutes on 2 cores, with the machine's load): so a line every `every_s` seconds says it is
    still checking; then its own list. A failure raises with the end of what it wrote to stderr."""
    horovodrun = horovodrun or shutil.which("horovodrun") or str(Path(sys.executable).parent / "horovodrun")
    echo("running `horovodrun --check-build`: it imports PyTorch and TensorFlow to see what Horovod can load "
         f"(20 s to 2 minutes on 2 cores); a line every {every_s:g} s until its list follows ...")
    started = _now()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        check = subprocess.Popen([horovodrun, "--check-build"], stdout=out, stderr=err, text=True)
        try:
            while check.poll() is None:
                try:
                    check.wait(timeout=every_s)
                except subprocess.TimeoutExpired:
                    echo(f"  still checking: {_now() - started:.0f} s (importing PyTorch and TensorFlow)")
        finally:  # an interrupt leaves nothing running
            if check.poll() is None:
                check.kill()
                check.wait()
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
    if check.returncode != 0:
        raise RuntimeError(f"horovodrun --check-build failed (exit status {check.returncode}):\n{errors[-3000:]}")
    echo(text.rstrip() + f"\n(took {_now() - started:.0f} s)")
    return {line.split("]", 1)[1].strip(): "[X]" in line for line in text.splitlines() if "] " in line}


# --------------------------------------------------------------------------- a room's wheelhouse


def _parse(built_for: str) -> dict[str, str]:
    return dict(part.partition("=")[::2] for part in built_for.split())


def mismatch(built_for: str, wanted: str) -> str | None:
    """None if a wheel built for `built_for` serves `wanted`, else what differs, in words."""
    have, want = _parse(built_for), _parse(wanted)
    differ = [f"{key} {have.get(key, 'unknown')} (this environment: {want[key]})" for key in want
              if have.get(key) != want[key]]
    return ("built for " + ", ".join(differ)) if differ else None


def _is_s3(location: str) -> bool:
    return location.startswith("s3://")


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    if not bucket:
        raise WorkshopError(f"{uri!r} names no bucket.", "write it like s3://my-bucket/horovod-wheels.")
    return bucket, prefix.strip("/")


def _s3() -> object:
    import boto3

    return boto3.session.Session().client("s3")


def _listing(location: str) -> dict[str, str]:
    """Wheel file name -> its `.built-for` line (or '' without one), for every Horovod wheel there."""
    pattern = f"horovod-{HOROVOD_VERSION}-"
    if not _is_s3(location):
        folder = Path(location).expanduser()
        if not folder.is_dir():
            raise WorkshopError(f"The wheelhouse {location} is not a folder.", f"set {WHEELHOUSE_ENV} to a folder or "
                                "an s3://bucket/prefix URI that `python -m workshop horovod publish` filled.")
        return {w.name: (Path(f"{w}{SIDECAR}").read_text().strip() if Path(f"{w}{SIDECAR}").is_file() else "")
                for w in sorted(folder.glob(f"{pattern}*.whl"))}
    bucket, prefix = _split_s3(location)
    s3 = _s3()
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""):
        keys += [o["Key"] for o in page.get("Contents", [])]
    names = {k.rsplit("/", 1)[-1]: k for k in keys}
    out = {}
    for name in sorted(names):
        if name.startswith(pattern) and name.endswith(".whl"):
            sidecar = names.get(f"{name}{SIDECAR}")
            out[name] = (s3.get_object(Bucket=bucket, Key=sidecar)["Body"].read().decode().strip() if sidecar else "")
    return out


def find_in_wheelhouse(location: str, wanted: str | None = None) -> tuple[str | None, list[str]]:
    """The name of a wheel at `location` built for `wanted` (default: this environment), or None;
    and, for every wheel there not taken, why."""
    wanted = wanted or target()
    reasons = []
    for name, built_for in _listing(location).items():
        if not built_for:
            reasons.append(f"{name}: no {name}{SIDECAR} saying what it was built for")
            continue
        why = mismatch(built_for, wanted)
        if why is None:
            return name, reasons
        reasons.append(f"{name}: {why}")
    return None, reasons


def fetch_from_wheelhouse(into: Path, location: str | None = None, wanted: str | None = None,
                          echo: Callable[[str], None] = print) -> Path | None:
    """Copy the wheel built for this environment (and its sidecar) from the wheelhouse into `into`
    (the wheel cache); None, saying why, when there is none or it cannot be read."""
    location = location or os.environ.get(WHEELHOUSE_ENV, "")
    wanted = wanted or target()
    if not location:
        return None
    try:
        name, reasons = find_in_wheelhouse(location, wanted)
        for reason in reasons:
            echo(f"wheelhouse {location}: not using {reason}")
        if name is None:
            echo(f"wheelhouse {location}: no Horovod wheel built for {wanted}")
            return None
        into.mkdir(parents=True, exist_ok=True)
        dest = into / name
        if _is_s3(location):
            bucket, prefix = _split_s3(location)
            key = f"{prefix}/{name}" if prefix else name
            _s3().download_file(bucket, key, str(dest))
        else:
            shutil.copyfile(Path(location).expanduser() / name, dest)
        Path(f"{dest}{SIDECAR}").write_text(wanted + "\n")
        echo(f"wheelhouse {location}: took {name}, built for {wanted}")
        return dest
    except WorkshopError as exc:
        echo(f"wheelhouse {location}: not used: {exc}")
    except Exception as exc:  # noqa: BLE001 - S3's and the network's errors: say them, and build instead
        echo(f"wheelhouse {location}: could not be read ({type(exc).__name__}: {exc}); building instead")
    return None


def cached_wheel(wanted: str | None = None) -> Path | None:
    """The wheel in the cache built for this environment (`wanted`), if any."""
    wanted = wanted or target()
    tag = _parse(wanted).get("python", "")
    for wheel in sorted(wheel_dir().glob(f"horovod-{HOROVOD_VERSION}-{tag}-*.whl")):
        sidecar = Path(f"{wheel}{SIDECAR}")
        if sidecar.is_file() and sidecar.read_text().strip() == wanted:
            return wheel
    return None


def publish(dest: str, echo: Callable[[str], None] = print) -> str:
    """Put this environment's wheel (from the cache) and its sidecar in the room's wheelhouse `dest`
    (a folder or s3://bucket/prefix); returns where the wheel went."""
    wanted = target()
    wheel = cached_wheel(wanted)
    if wheel is None:
        raise WorkshopError(f"No Horovod wheel built for this environment ({wanted}) in {wheel_dir()}.",
                            f"build it first: `{RETRY}` (it leaves the wheel there), then publish again.")
    if _is_s3(dest):
        bucket, prefix = _split_s3(dest)
        s3 = _s3()
        key = f"{prefix}/{wheel.name}" if prefix else wheel.name
        s3.upload_file(str(wheel), bucket, key)
        s3.put_object(Bucket=bucket, Key=f"{key}{SIDECAR}", Body=(wanted + "\n").encode())  # last: a complete wheel
        where = f"s3://{bucket}/{key}"
    else:
        folder = Path(dest).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel, folder / f".{wheel.name}.part")
        os.replace(folder / f".{wheel.name}.part", folder / wheel.name)
        (folder / f"{wheel.name}{SIDECAR}").write_text(wanted + "\n")
        where = str(folder / wheel.name)
    echo(f"published {where} (built for {wanted}); attendees set {WHEELHOUSE_ENV}={dest} before `make setup`, and "
         "an environment with the same Python, torch and TensorFlow installs it instead of compiling")
    return where


# --------------------------------------------------------------------------- the command line


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="python -m workshop horovod",
                                               description=__doc__.split("\n\n")[0])
    parser.add_argument("action", nargs="?", default="status", metavar="{status,start,build,publish}",
                        choices=("status", "start", "build", "publish", "fetch", _WORKER),
                        help="status (default), start (in the background), build (start and wait), publish DEST")
    parser.add_argument("dest", nargs="?", help="publish: a folder or s3://bucket/prefix")
    parser.add_argument("--wait", action="store_true", help="status: wait while a build runs (a line every 30 s)")
    parser.add_argument("--into", help=argparse.SUPPRESS)
    parser.add_argument("--built-for", help=argparse.SUPPRESS)
    parser.add_argument("--lock-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--estimate-s", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--estimate-from", default="", help=argparse.SUPPRESS)
    parser.add_argument("--script", default=str(BUILD_SCRIPT), help=argparse.SUPPRESS)
    return parser


def run(args: argparse.Namespace) -> int:
    """The exit status: 0 when the action did what it says (status: Horovod is ready or building;
    --wait and build: ready), 1 otherwise; 130 when a wait was interrupted (the build goes on)."""
    try:
        return _run(args)
    except KeyboardInterrupt:
        print(f"Stopped waiting; the build goes on in the background (`{WAIT}`).", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    def echo(line: str) -> None:
        print(line, flush=True)

    if args.action == _WORKER:
        return worker(args.lock_fd, args.estimate_s, args.estimate_from, Path(args.script))
    if args.action == "fetch":  # scripts/build_horovod.sh: the wheelhouse, into the cache
        wanted = args.built_for or target()
        return 0 if fetch_from_wheelhouse(Path(args.into or wheel_dir()), wanted=wanted, echo=echo) else 1
    if args.action == "publish":
        if not args.dest:
            raise WorkshopError("publish needs a destination.", "python -m workshop horovod publish DEST "
                                "(a folder, or s3://bucket/prefix).")
        publish(args.dest, echo)
        return 0
    if args.action == "start":
        start(echo)
        return 0  # the set-up goes on whatever lab 2's build does; the status says it
    if args.action == "build":
        return 0 if build(echo).state == "ready" else 1
    status = read_status()
    if args.wait and status.state == "building":
        status = wait(echo)
    echo(status.line())
    if args.wait:
        return 0 if status.state == "ready" else 1
    return 0 if status.state in ("ready", "building") else 1


def main(argv: list[str] | None = None) -> int:
    try:
        return run(build_parser().parse_args(argv))
    except WorkshopError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
