"""The lock (lock/, scripts/lock.py, `make lock`): every package the set-up installs, at one version, with hashes.

The top-level files (requirements.txt, requirements-no-deps.txt, requirements-dev.txt) pinned 28 packages and
left the other 151 the set-up installed, and 8 ranges of their own, to float: a release of any of them changed
what a room of attendees installed on the day, after CI passed (issue 43). Here the lock is fresh against them
(or the failure names `make lock`), allows what they ask, is complete and exact, and `make setup` installs it
with hashes required.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

from workshop import REPO_ROOT

_spec = importlib.util.spec_from_file_location("workshop_lock", REPO_ROOT / "scripts" / "lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)

LOCK = REPO_ROOT / lock.LOCK_DIR


def locked(*names: str) -> dict[str, str]:
    """normalized name -> version, over the given lock files."""
    return {pkg: version for name in names for pkg, (version, _) in lock.pins((LOCK / name).read_text()).items()}


def top_level(name: str) -> list[Requirement]:
    return [Requirement(line) for line in lock.requirement_lines((REPO_ROOT / name).read_text())
            if not line.startswith("-")]


def test_the_lock_is_fresh_against_the_top_level_files():
    """CI's check: a change to requirements*.txt without `make lock` fails here, naming the command."""
    problems = lock.stale()
    assert not problems, lock.stale_message(problems)


@pytest.mark.parametrize("top, files", [
    ("requirements.txt", ("torch.txt", "environment.txt")),
    ("requirements-no-deps.txt", ("environment.txt",)),
    ("requirements-dev.txt", ("torch.txt", "environment.txt", "dev.txt")),
])
def test_every_top_level_requirement_is_locked_at_a_version_it_allows(top, files):
    versions = locked(*files)
    wrong = []
    for req in top_level(top):
        version = versions.get(lock.normalize(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            wrong.append(f"{req} (locked: {version})")
    assert not wrong, f"{top} asks for what the lock does not have: {wrong}; run `make lock`"


def test_every_locked_package_is_exact_with_hashes_and_in_one_file():
    seen: dict[str, tuple[str, str]] = {}
    for name in lock.FILES:
        for pkg, (version, hashes) in lock.pins((LOCK / name).read_text()).items():
            assert version and hashes, f"{lock.LOCK_DIR}/{name}: {pkg} has no exact version or no hash"
            if name != "installer.txt":  # pip and setuptools, installed first: setuptools again, at the same version
                assert pkg not in seen or seen[pkg][0] == "installer.txt", f"{pkg} is in {seen[pkg][0]} and {name}"
            assert pkg not in seen or seen[pkg][1] == version, f"{pkg}: {seen[pkg]} against {name}'s {version}"
            seen[pkg] = (name, version)
    assert {"pip", "setuptools"} <= set(locked("installer.txt"))


def test_the_environment_is_cpu_only_and_without_what_it_leaves_out():
    """torch's CPU build (its file's hash; no CUDA libraries, gigabytes a notebook instance's volume has no room
    for), and nothing that requirements-no-deps.txt's packages would have brought (MLflow, scikit-learn, the
    full `tensorflow`: see the comments there)."""
    env = locked("torch.txt", "environment.txt")
    assert not [pkg for pkg in env if pkg.startswith(("nvidia-", "triton"))]
    assert not {"mlflow", "sagemaker-mlflow", "scikit-learn", "tensorflow"} & set(env)
    assert {"sagemaker-train", "tf-keras", "mlxtend", "tensorflow-cpu"} <= set(env)
    torch = (LOCK / "torch.txt").read_text()
    assert len(lock.pins(torch)["torch"][1]) == 1, "the CPU wheel for the target alone"


def test_a_changed_requirement_makes_the_lock_stale_and_a_comment_does_not(tmp_path):
    for name in lock.INPUTS:
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    shutil.copytree(LOCK, tmp_path / lock.LOCK_DIR)
    assert lock.stale(tmp_path) == []
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# a new comment\n" + requirements.read_text() + "\n\n")
    assert lock.stale(tmp_path) == [], "comments and blank lines change nothing pip installs"
    requirements.write_text(requirements.read_text().replace("numpy==", "numpy>=", 1))
    problems = lock.stale(tmp_path)
    assert problems == [f"lock/{name}" for name in lock.FILES]
    assert "run `make lock`" in lock.stale_message(problems)
    assert lock.main(["check"]) == 0  # the repository's own, as make setup runs it


def test_the_lock_says_where_it_does_not_apply(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    reason = lock.why_not_here()
    assert reason and "aarch64" in reason and lock.TARGET in reason


def make_n(target: str, *variables: str) -> str:
    """What `make` would run for `target` in a new .venv (`make -n`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    out = subprocess.run(["make", "-n", f"PYTHON={sys.executable}", *variables, target], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def installs(commands: str) -> list[str]:
    return [line for line in commands.splitlines() if "pip install" in line and "-e ." not in line]


@pytest.mark.skipif(lock.why_not_here() is not None, reason="the lock is for CPython 3.11 on Linux x86-64")
def test_make_setup_installs_the_lock_alone_with_hashes_required(tmp_path):
    """Every pip install of `make setup` and of the test tools' set-up reads a lock file, with --no-deps
    --require-hashes, never a top-level file. A notebook instance's lifecycle scripts, and so the organizer's
    template, which embeds them, set up with the same `make setup`."""
    commands = make_n(f"{tmp_path}/.dev-done", f"VENV={tmp_path}")
    read = [line.split(" -r ")[-1].split()[0] for line in installs(commands)]
    assert read == ["lock/installer.txt", "lock/torch.txt", "lock/environment.txt", "lock/dev.txt"], commands
    assert all("--no-deps" in line and "--require-hashes" in line for line in installs(commands)), commands
    assert "scripts/lock.py check" in commands
    on_create = (REPO_ROOT / "scripts" / "notebook-instance" / "on-create.sh").read_text()
    assert 'as_user make setup PYTHON="$py"' in on_create


def test_where_the_lock_does_not_apply_the_set_up_says_so_and_installs_the_top_level_files(tmp_path):
    commands = make_n(f"{tmp_path}/.dev-done", f"VENV={tmp_path}", "LOCK_HERE=no: this is a Mac")
    assert 'echo "Not locked: this is a Mac;' in commands
    read = [line.split(" -r ")[-1].split()[0] for line in installs(commands) if " -r " in line]
    assert read == ["requirements.txt", "requirements-no-deps.txt", "requirements-dev.txt"], commands
    assert "lock/" not in commands and "--require-hashes" not in commands
