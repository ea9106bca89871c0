"""The docs point at things that exist: every relative link and every repository path named in the
markdown files and the notebooks' markdown, and none names one machine's own folders.

A renamed or deleted file used to live on in the README and a notebook (`workshop/cloud.py`, gone
since the package became `workshop/cloud/`), and CONTRIBUTING.md cited a file by a path that exists
on one machine only.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from workshop import REPO_ROOT

SKIP_DIRS = {".venv", "runs", "data", ".git", ".pytest_cache", ".ruff_cache", "node_modules", ".ipynb_checkpoints"}
# [text](target) and ![alt](target); the target up to a space or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A path inside a code span that starts at one of the repository's own top-level folders.
TOP = r"(?:workshop|tests|benchmarks|scripts|images|docs|\.ci|[0-9]_[a-z_]+)"
REPO_PATH = re.compile(rf"`({TOP}/[A-Za-z0-9_./-]*)`")
# Folders that exist on one machine only (a developer's checkout, a CI runner's home), not on a reader's.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|Users|home/(?!ec2-user\b)[a-z_][\w-]*)/")


def markdown_sources() -> list[tuple[str, Path, str]]:
    """(label, the file's folder, markdown text) for every .md file and every notebook markdown cell."""
    out = []
    for path in sorted(REPO_ROOT.rglob("*.md")):
        if SKIP_DIRS.intersection(path.relative_to(REPO_ROOT).parts):
            continue
        out.append((str(path.relative_to(REPO_ROOT)), path.parent, path.read_text(encoding="utf-8")))
    for path in sorted(REPO_ROOT.glob("[0-9]_*/*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type == "markdown":
                out.append((f"{path.relative_to(REPO_ROOT)} cell {i}", path.parent, cell.source))
    return out


SOURCES = markdown_sources()


def _outside_fences(text: str) -> str:
    keep, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            keep.append(line)
    return "\n".join(keep)


def broken_links(folder: Path, text: str) -> list[str]:
    bad = []
    for target in LINK.findall(_outside_fences(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor in the same page
        path = target.split("#", 1)[0]
        if path and not (folder / path).exists():
            bad.append(target)
    return bad


def missing_paths(text: str) -> list[str]:
    return [p for p in REPO_PATH.findall(text) if not (REPO_ROOT / p.rstrip("/")).exists()]


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    (tmp_path / "here.md").write_text("x")
    assert broken_links(tmp_path, "[a](here.md) [b](gone.md#x) [c](https://aws.amazon.com) [d](#top)") == ["gone.md#x"]
    assert broken_links(tmp_path, "```\n[b](gone.md)\n```") == []
    assert missing_paths("see `workshop/cloud.py` and `workshop/cloud/aws.py`, `runs/<job>/`") == ["workshop/cloud.py"]
    assert MACHINE_PATH.search("(`/work/shared/REFERENCE.md` in the notes)")
    assert MACHINE_PATH.search("cd /root/x") and MACHINE_PATH.search("/home/alice/SageMaker/")
    assert not MACHINE_PATH.search("/home/ec2-user/SageMaker and /opt/ml/model and src/work/x")


@pytest.mark.parametrize(("label", "folder", "text"), SOURCES, ids=[s[0] for s in SOURCES])
def test_links_and_repository_paths_exist_and_name_no_machines_folders(label: str, folder: Path, text: str) -> None:
    assert broken_links(folder, text) == [], f"{label}: links to what does not exist"
    assert missing_paths(text) == [], f"{label}: names repository paths that do not exist"
    machine = [line.strip() for line in text.splitlines() if MACHINE_PATH.search(line)]
    assert machine == [], f"{label}: names one machine's own folders"
