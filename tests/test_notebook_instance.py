"""The SageMaker notebook instance's lifecycle scripts (scripts/notebook-instance/), run against a
simulated instance: a temporary folder as the ML storage volume holding a copy of this checkout, the
current user as the notebook user, another temporary folder as the home folder a restart resets, and
a `make` on PATH whose `setup` installs nothing (every other target is the real Makefile's: `make
kernel` registers a real kernel with this environment's ipykernel).

scripts/simulate_notebook_instance.sh runs the same scripts for real (a 5 GiB volume, the set-up and
every lab inside a 4 GiB cgroup, a stop/start); this file checks their behaviour in seconds."""

from __future__ import annotations

import base64
import contextlib
import getpass
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workshop import REPO_ROOT

SCRIPTS = REPO_ROOT / "scripts" / "notebook-instance"
KERNEL = "distributed-training-workshop"
REAL_MAKE = shutil.which("make")
# The fake `make`: `setup` (not `-q setup`) logs, waits for $FAKE_GATE when set, makes .venv/bin/python
# (this environment's interpreter) and the set-up's stamp, and exits $FAKE_SETUP_RC; the rest is make,
# with `setup` as a prerequisite left alone (`-o setup`): its recipe would install Horovod into this
# environment, or start its compile in the background, from the simulated home's empty cache.
FAKE_MAKE = f"""#!/bin/bash
echo "make $*" >>"$FAKE_MAKE_LOG"
case " $* " in
  *" -q "*) ;;
  *" setup "*)
    echo "fake set-up: started"
    if [ -n "${{FAKE_GATE:-}}" ]; then
      for _ in $(seq 600); do [ -e "$FAKE_GATE" ] && break; sleep 0.1; done
    fi
    mkdir -p .venv/bin
    printf '#!/bin/sh\\nexec {sys.executable} "$@"\\n' >.venv/bin/python
    chmod +x .venv/bin/python
    touch .venv/.setup-done
    echo "fake set-up: finished"
    exit "${{FAKE_SETUP_RC:-0}}" ;;
esac
exec {REAL_MAKE} -o setup "$@"
"""
# The platform's package manager and conda, as far as the scripts use them: each logs its arguments
# and puts a python3.11 (this environment's interpreter) where the real one would.
FAKE_DNF = f"""#!/bin/bash
echo "dnf $*" >>"$FAKE_MAKE_LOG"
printf '#!/bin/sh\\nexec {sys.executable} "$@"\\n' >"$(dirname "$0")/python3.11"
chmod +x "$(dirname "$0")/python3.11"
"""
FAKE_CONDA = f"""#!/bin/bash
echo "conda $*" >>"$FAKE_MAKE_LOG"
prefix=""; while [ $# -gt 0 ]; do [ "$1" = -p ] && prefix="$2"; shift; done
mkdir -p "$prefix/bin"
printf '#!/bin/sh\\nexec {sys.executable} "$@"\\n' >"$prefix/bin/python3.11"
chmod +x "$prefix/bin/python3.11"
"""


class Instance:
    """A simulated notebook instance: `volume` (the ML storage volume, with the checkout), `home`
    (the notebook user's home folder, on the root volume), `bin` (the fakes, first on PATH)."""

    def __init__(self, root: Path) -> None:
        self.volume = root / "SageMaker"
        self.home = root / "home"
        self.bin = root / "bin"
        self.checkout = self.volume / "distributed-training-workshop"
        self.make_log = root / "make.log"
        self.horovod_state = root / "horovod-state"  # where a Horovod build's status would go: none may start
        self.gate = root / "gate"
        for path in (self.volume, self.home, self.bin):
            path.mkdir(parents=True)
        shutil.copytree(REPO_ROOT, self.checkout, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "runs", "data", "__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info",
            ".ipynb_checkpoints"))
        self.fake("make", FAKE_MAKE)
        self.make_log.touch()
        self.env = {
            **os.environ,
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(self.home),
            "WORKSHOP_NB_HOME": str(self.volume),
            "WORKSHOP_NB_USER": getpass.getuser(),
            "WORKSHOP_PYTHON": sys.executable,
            "WORKSHOP_CONDA": str(self.bin / "no-conda"),
            "FAKE_MAKE_LOG": str(self.make_log),
            "WORKSHOP_HOROVOD_STATE_DIR": str(self.horovod_state),
        }
        for name in ("WORKSHOP_REPO_DIR", "WORKSHOP_WHEELHOUSE", "JUPYTER_DATA_DIR", "JUPYTER_PATH"):
            self.env.pop(name, None)

    def fake(self, name: str, text: str) -> Path:
        path = self.bin / name
        path.write_text(text)
        path.chmod(0o755)
        return path

    def run(self, script: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
        start = time.monotonic()
        done = subprocess.run(["bash", str(SCRIPTS / script)], env={**self.env, **env}, capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
        return done, time.monotonic() - start

    @property
    def status(self) -> str:
        path = self.volume / "workshop-setup.status"
        return path.read_text() if path.exists() else ""

    @property
    def log(self) -> str:
        return (self.volume / "workshop-setup.log").read_text()

    @property
    def kernel_json(self) -> Path:
        return self.home / ".local" / "share" / "jupyter" / "kernels" / KERNEL / "kernel.json"

    def wait_for_the_set_up(self, timeout: float = 120) -> str:
        """The final status, once the set-up has released its lock (its process is gone)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.status.startswith(("done", "failed")) and self.lock_is_free():
                return self.status
            time.sleep(0.2)
        raise AssertionError(f"the set-up did not end in {timeout} s; status {self.status!r}\n{self.log}")

    def stop_any_horovod_build(self) -> None:
        """A build a failing test started (its own session: the compilers with it) is stopped."""
        import signal

        status = self.horovod_state / "status.json"
        pid = json.loads(status.read_text()).get("pid") if status.exists() else None
        if pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def lock_is_free(self) -> bool:
        lock = self.volume / ".workshop" / "setup.lock"
        return subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode == 0


@pytest.fixture
def instance(tmp_path: Path):
    nb = Instance(tmp_path)
    yield nb
    nb.gate.touch()  # a set-up a failed test left waiting ends now
    nb.wait_for_the_set_up()
    nb.stop_any_horovod_build()


def _no_horovod_build_started(nb: Instance) -> None:
    """`python -m workshop.horovod_build start` (setup's recipe) takes its lock in the state folder first,
    whether or not Horovod is installed here: the folder must not exist."""
    found = sorted(p.name for p in nb.horovod_state.iterdir()) if nb.horovod_state.exists() else None
    assert found is None, f"the simulated set-up ran setup's Horovod step in this environment (left {found})"


def test_on_create_returns_at_once_and_sets_up_in_the_background(instance: Instance) -> None:
    done, seconds = instance.run("on-create.sh", FAKE_GATE=str(instance.gate))
    assert done.returncode == 0, done.stderr
    # It returned while the set-up is still waiting at the gate: the set-up runs in the background.
    assert instance.status.startswith("running:"), instance.status
    assert not instance.kernel_json.exists()
    assert "workshop-setup.status" in done.stdout and "workshop-setup.log" in done.stdout, done.stdout
    assert seconds < 30, f"on-create.sh took {seconds:.0f} s (SageMaker stops a lifecycle script at 5 minutes)"
    instance.gate.touch()
    status = instance.wait_for_the_set_up()
    assert status.startswith("done:") and '"Python (distributed training workshop)"' in status, status
    # The set-up ran in the checkout, with the Python given, then registered the kernel.
    assert "fake set-up: started" in instance.log and "fake set-up: finished" in instance.log
    calls = instance.make_log.read_text().splitlines()
    assert f"make setup PYTHON={sys.executable}" in calls, calls
    assert calls.index(f"make setup PYTHON={sys.executable}") < calls.index(f"make kernel PYTHON={sys.executable}")
    spec = json.loads(instance.kernel_json.read_text())
    assert spec["display_name"] == "Python (distributed training workshop)", spec
    # `make kernel` ran against the fake set-up: nothing compiled or installed into this environment.
    _no_horovod_build_started(instance)


def test_on_start_registers_the_kernel_again_after_a_restart(instance: Instance) -> None:
    assert instance.run("on-create.sh")[0].returncode == 0
    assert instance.wait_for_the_set_up().startswith("done:")
    shutil.rmtree(instance.home / ".local")  # a stop/start resets everything outside the volume
    done, seconds = instance.run("on-start.sh")
    assert done.returncode == 0, done.stderr
    assert seconds < 60, f"on-start.sh took {seconds:.0f} s"
    assert json.loads(instance.kernel_json.read_text())["display_name"] == "Python (distributed training workshop)"
    assert instance.status.startswith("done:") and "registered again" in instance.status, instance.status
    # The set-up was complete: on-start.sh did not run it again.
    assert instance.make_log.read_text().count(f"make setup PYTHON={sys.executable}") == 1


def test_on_start_resumes_a_set_up_a_stop_interrupted(instance: Instance) -> None:
    # A checkout whose set-up never completed (no stamp), and no set-up running.
    done, _ = instance.run("on-start.sh")
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stdout, done.stdout
    status = instance.wait_for_the_set_up()
    assert status.startswith("done:"), status
    assert instance.kernel_json.exists()


def test_on_start_leaves_a_running_set_up_alone(instance: Instance) -> None:
    # At creation SageMaker runs on-start.sh right after on-create.sh, whose set-up is still running.
    assert instance.run("on-create.sh", FAKE_GATE=str(instance.gate))[0].returncode == 0
    deadline = time.monotonic() + 30
    while instance.lock_is_free() and time.monotonic() < deadline:  # the set-up has taken its lock
        time.sleep(0.1)
    done, _ = instance.run("on-start.sh", FAKE_GATE=str(instance.gate))
    assert done.returncode == 0, done.stderr
    assert "still running" in done.stdout, done.stdout
    instance.gate.touch()
    assert instance.wait_for_the_set_up().startswith("done:")
    assert instance.make_log.read_text().count(f"make setup PYTHON={sys.executable}") == 1


@pytest.mark.parametrize("script", ["on-create.sh", "on-start.sh"])
def test_no_checkout_fails_clearly(tmp_path: Path, script: str) -> None:
    nb = Instance(tmp_path)
    shutil.rmtree(nb.checkout)
    done, seconds = nb.run(script)
    assert done.returncode == 1
    assert f"no workshop checkout under {nb.volume}" in done.stderr and "fix:" in done.stderr, done.stderr
    assert nb.status.startswith("failed: no checkout"), nb.status
    assert seconds < 30 and nb.make_log.read_text() == ""
    # A WORKSHOP_REPO_DIR that is not a checkout is named as such.
    done, _ = nb.run(script, WORKSHOP_REPO_DIR=str(tmp_path))
    assert done.returncode == 1 and f"WORKSHOP_REPO_DIR={tmp_path} holds no workshop checkout" in done.stderr


def test_a_failed_set_up_says_so_and_where_to_look(instance: Instance) -> None:
    assert instance.run("on-create.sh", FAKE_SETUP_RC="2")[0].returncode == 0
    status = instance.wait_for_the_set_up()
    assert status.startswith("failed: make setup failed") and "workshop-setup.log" in status, status
    assert not instance.kernel_json.exists()


def test_python_311_from_dnf_and_again_after_a_restart(instance: Instance) -> None:
    """On AL2023 (dnf): python3.11 from the platform's package, installed again at every start (the
    root volume, where it lives, is reset by a stop/start)."""
    instance.fake("dnf", FAKE_DNF)
    assert instance.run("on-create.sh", WORKSHOP_PYTHON="")[0].returncode == 0
    assert instance.wait_for_the_set_up().startswith("done:"), instance.log
    python = instance.bin / "python3.11"
    assert (instance.volume / ".workshop" / "python").read_text().split() == [str(python), "dnf"]
    calls = instance.make_log.read_text().splitlines()
    assert any(c.startswith("dnf install -y -q python3.11 python3.11-devel") for c in calls), calls
    assert f"make setup PYTHON={python}" in calls, calls
    python.unlink()  # the restart
    shutil.rmtree(instance.home / ".local")
    done, _ = instance.run("on-start.sh", WORKSHOP_PYTHON="")
    assert done.returncode == 0, done.stderr
    assert python.exists() and instance.kernel_json.exists()
    assert instance.make_log.read_text().count("dnf install") == 2


def test_python_311_in_a_conda_environment_on_the_volume_without_dnf(instance: Instance) -> None:
    """Without dnf (notebook-al2-v3): AWS's other way, a conda environment on the volume."""
    conda = instance.fake("conda", FAKE_CONDA)
    assert instance.run("on-create.sh", WORKSHOP_PYTHON="", WORKSHOP_CONDA=str(conda))[0].returncode == 0
    assert instance.wait_for_the_set_up().startswith("done:"), instance.log
    env_python = instance.volume / ".workshop" / "python311" / "bin" / "python3.11"
    calls = instance.make_log.read_text().splitlines()
    assert f"conda create -y -q -p {env_python.parent.parent} -c conda-forge --override-channels python=3.11" in calls, calls
    assert f"make setup PYTHON={env_python}" in calls, calls


@pytest.mark.parametrize("script", ["on-create.sh", "on-start.sh"])
def test_each_script_fits_a_lifecycle_configuration(script: str) -> None:
    # CloudFormation's NotebookInstanceLifecycleConfig takes each script base64-encoded, at most
    # 16,384 characters; the organizer's template adds a few lines of settings before it.
    encoded = base64.b64encode((SCRIPTS / script).read_bytes())
    assert len(encoded) <= 16384 - 1024, len(encoded)


def test_the_simulations_memory_sampler_reads_gigabytes_as_integers() -> None:
    """scripts/simulate_notebook_instance.sh compares samples with `[ -gt ]`; awk's `print` writes a
    sum over 2^31 as 2.51812e+09 in mawk (Debian's awk), and those samples were skipped, so a phase's
    peak memory read at most 2 GiB. Each of its mem_anon() programs must print an integer."""
    import re

    awk = shutil.which("awk")
    if awk is None:
        pytest.skip("no awk on this machine")
    text = (REPO_ROOT / "scripts/simulate_notebook_instance.sh").read_text()
    programs = re.findall(r"mem_anon\(\) \{ awk '([^']+)'", text)
    assert len(programs) == 2, programs  # cgroup v2 and v1
    stat = "anon 3000000000\nshmem 5\ntotal_rss 3000000000\ntotal_shmem 5\ninactive_file 7\n"
    for program in programs:
        out = subprocess.run([awk, program], input=stat, capture_output=True, text=True, check=True).stdout
        assert out.strip() == "3000000005", (program, out)


def test_both_lifecycle_scripts_find_the_checkout_the_same_way() -> None:
    """on-create.sh and on-start.sh each carry find_checkout() (a lifecycle configuration's script
    stands alone: it runs before anything on the volume is known to be the checkout), so the copies
    must not drift apart."""
    import re

    bodies = [re.search(r"^find_checkout\(\) \{\n.*?^\}\n", (SCRIPTS / name).read_text(), re.S | re.M)
              for name in ("on-create.sh", "on-start.sh")]
    assert all(bodies), "find_checkout() is missing from a lifecycle script"
    assert bodies[0][0] == bodies[1][0]
