"""The guard in tests/conftest.py that fails a test session which changed a tracked file."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import conftest
import pytest
from conftest import changed_tracked_files, file_hashes, tracked_files


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "images").mkdir(parents=True)
    (root / "images" / "plot.png").write_bytes(b"committed plot")
    (root / "notes.md").write_text("committed\n")
    (root / "gone.txt").write_text("will be deleted\n")
    (root / ".gitignore").write_text("runs/\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "first")
    return root


def _snapshot(root: Path) -> dict[str, str | None]:
    paths = tracked_files(root)
    assert paths is not None
    return file_hashes(root, paths)


def test_only_tracked_files_changed_during_the_session_are_reported(repo: Path) -> None:
    (repo / "notes.md").write_text("edited before the session, not committed\n")
    before = _snapshot(repo)
    assert sorted(before) == [".gitignore", "gone.txt", "images/plot.png", "notes.md"]

    (repo / "images" / "plot.png").write_bytes(b"a notebook rewrote it")  # the bug the guard catches
    (repo / "gone.txt").unlink()
    (repo / "runs").mkdir()
    (repo / "runs" / "plot.png").write_bytes(b"where generated files go")  # ignored: fine
    (repo / "scratch.txt").write_text("untracked: fine\n")
    (repo / ".gitignore").write_text("runs/\n")  # rewritten with the same content: fine
    _git(repo, "add", "scratch.txt")  # tracked during the session: compared by the paths recorded at start

    after = file_hashes(repo, list(before))
    assert changed_tracked_files(before, after) == ["gone.txt", "images/plot.png"]
    assert changed_tracked_files(before, before) == []


def test_no_guard_outside_a_git_checkout(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    assert tracked_files(tmp_path) is None


def test_the_session_hooks_fail_the_session_and_name_the_files(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "REPO_ROOT", repo)
    monkeypatch.delenv(conftest.ALLOW_TRACKED_CHANGES_ENV, raising=False)
    session = SimpleNamespace(config=SimpleNamespace(stash=pytest.Stash()), exitstatus=pytest.ExitCode.OK)
    conftest.pytest_sessionstart(session)
    conftest.pytest_sessionfinish(session, pytest.ExitCode.OK)
    assert session.exitstatus == pytest.ExitCode.OK  # nothing changed

    conftest.pytest_sessionstart(session)
    (repo / "images" / "plot.png").write_bytes(b"rewritten")
    conftest.pytest_sessionfinish(session, pytest.ExitCode.OK)
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED

    lines: list[str] = []
    reporter = SimpleNamespace(section=lambda *a, **k: lines.append(a[0]),
                               write_line=lambda line, **k: lines.append(line))
    conftest.pytest_terminal_summary(reporter, pytest.ExitCode.OK, session.config)
    text = "\n".join(lines)
    assert "images/plot.png" in text and "runs/" in text and "fails" in text, text

    monkeypatch.setenv(conftest.ALLOW_TRACKED_CHANGES_ENV, "1")  # reported, not failing
    session.exitstatus = pytest.ExitCode.OK
    conftest.pytest_sessionstart(session)
    (repo / "notes.md").write_text("a developer's edit\n")
    conftest.pytest_sessionfinish(session, pytest.ExitCode.OK)
    assert session.exitstatus == pytest.ExitCode.OK
    assert session.config.stash[conftest._TRACKED_CHANGED] == ["notes.md"]


def test_the_guard_covers_this_repository() -> None:
    paths = tracked_files(conftest.REPO_ROOT)
    if paths is None:
        pytest.skip("not a git checkout")
    assert "tests/conftest.py" in paths and any(p.endswith(".ipynb") for p in paths)
