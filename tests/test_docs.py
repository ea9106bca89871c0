"""The docs point at things that exist: every relative link (and the heading it names after `#`) and
every repository path named in the markdown files and the notebooks' markdown, and none names one
machine's own folders. The README stays a page that starts a workshop and links every page of `docs/`,
and each page of `docs/` links back to it.

A renamed or deleted file used to live on in the README and a notebook (`workshop/cloud.py`, gone
since the package became `workshop/cloud/`), and CONTRIBUTING.md cited a file by a path that exists
on one machine only. A link may name a heading (`page.md#a-heading`), which a rename breaks silently.
The README had grown into a 654-line reference manual; its deep dives moved to `docs/`.
"""

from __future__ import annotations

import functools
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
README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
# "at most about 150 lines" (issue 26): what a newcomer reads before starting; the deep dives are in docs/.
README_MAX_LINES = 160


def markdown_sources() -> list[tuple[str, Path, str]]:
    """(label, the file, markdown text) for every .md file and every notebook markdown cell."""
    out = []
    for path in sorted(REPO_ROOT.rglob("*.md")):
        if SKIP_DIRS.intersection(path.relative_to(REPO_ROOT).parts):
            continue
        out.append((str(path.relative_to(REPO_ROOT)), path, path.read_text(encoding="utf-8")))
    for path in sorted(REPO_ROOT.glob("[0-9]_*/*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type == "markdown":
                out.append((f"{path.relative_to(REPO_ROOT)} cell {i}", path, cell.source))
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


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered (a link's text, no code or emphasis marks),
    lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _headings(markdown: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", _outside_fences(markdown), re.M)]


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors a page's headings get: GitHub's (a repeated heading gets -1, -2, ...), and for a
    notebook also JupyterLab's (the heading's text, each space a hyphen)."""
    if page.suffix == ".ipynb":
        cells = nbformat.read(page, as_version=4).cells
        headings = [h for c in cells if c.cell_type == "markdown" for h in _headings(c.source)]
    else:
        headings = _headings(page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for heading in headings:
        base = slug(heading)
        out.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
        if page.suffix == ".ipynb":
            out.add(heading.strip().replace(" ", "-"))
    return frozenset(out)


def broken_links(page: Path, text: str) -> list[str]:
    """The links in `text` (found in `page`) to a file that does not exist, or to a heading that the
    page or file they name (markdown or a notebook) does not have."""
    bad = []
    for target in LINK.findall(_outside_fences(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # a URL (https:, mailto:)
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        if not linked.exists():
            bad.append(target)
        elif anchor and linked.suffix in (".md", ".ipynb") and anchor not in anchors(linked):
            bad.append(target)
    return bad


def missing_paths(text: str) -> list[str]:
    return [p for p in REPO_PATH.findall(text) if not (REPO_ROOT / p.rstrip("/")).exists()]


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    (tmp_path / "here.md").write_text("# Top\n\n## On a laptop, or a `GPU` machine\n\n## Top\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("## Here too\n")
    links = "[a](here.md) [b](gone.md#x) [c](https://aws.amazon.com) [d](#here-too) [e](#top)"
    assert broken_links(page, links) == ["gone.md#x", "#top"]
    assert broken_links(page, "```\n[b](gone.md)\n```") == []
    assert broken_links(page, "[a](here.md#top) [b](here.md#top-1) [c](here.md#on-a-laptop-or-a-gpu-machine)") == []
    assert broken_links(page, "[a](here.md#top-2) [b](here.md#not-a-heading) [c](here.md#on-a-laptop)") == [
        "here.md#top-2", "here.md#not-a-heading", "here.md#on-a-laptop"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("## Planning a cluster")])
    nbformat.write(notebook, tmp_path / "lab.ipynb")
    assert broken_links(page, "[a](lab.ipynb#planning-a-cluster) [b](lab.ipynb#Planning-a-cluster)") == []
    assert broken_links(page, "[a](lab.ipynb#planning)") == ["lab.ipynb#planning"]
    assert missing_paths("see `workshop/cloud.py` and `workshop/cloud/aws.py`, `runs/<job>/`") == ["workshop/cloud.py"]
    assert MACHINE_PATH.search("(`/work/shared/REFERENCE.md` in the notes)")
    assert MACHINE_PATH.search("cd /root/x") and MACHINE_PATH.search("/home/alice/SageMaker/")
    assert not MACHINE_PATH.search("/home/ec2-user/SageMaker and /opt/ml/model and src/work/x")


@pytest.mark.parametrize(("label", "page", "text"), SOURCES, ids=[s[0] for s in SOURCES])
def test_links_and_repository_paths_exist_and_name_no_machines_folders(label: str, page: Path, text: str) -> None:
    assert broken_links(page, text) == [], f"{label}: links to what does not exist"
    assert missing_paths(text) == [], f"{label}: names repository paths that do not exist"
    machine = [line.strip() for line in text.splitlines() if MACHINE_PATH.search(line)]
    assert machine == [], f"{label}: names one machine's own folders"


def test_the_readme_starts_a_workshop_in_at_most_160_lines() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the deep dive to a page of docs/"


def _linked_files(page: Path, text: str) -> set[Path]:
    """The files that links in `text`, found in `page`, point to (anchors and URLs left out)."""
    targets = (t.partition("#")[0] for t in LINK.findall(_outside_fences(text)))
    return {(page.parent / t).resolve() for t in targets if t and not re.match(r"[a-z][a-z0-9+.-]*:", t)}


def test_the_readme_links_every_page_of_docs() -> None:
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ holds the README's deep dives"
    linked = _linked_files(README, README.read_text(encoding="utf-8"))
    unlinked = [p.name for p in pages if p.resolve() not in linked]
    assert unlinked == [], "pages of docs/ that README.md does not link (a newcomer would never find them)"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_each_docs_page_says_what_it_is_for_and_links_back_to_the_readme(page: Path) -> None:
    """The first paragraph after the title: one line, with a link to the README."""
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), f"{page.name}: opens with its title"
    at = next(i for i, line in enumerate(lines) if i and line.strip())
    first = lines[at]
    assert README.resolve() in _linked_files(page, first), f"{page.name}: {first!r} does not link ../README.md"
    assert at + 1 == len(lines) or not lines[at + 1].strip(), f"{page.name}: says what it is for in one line"


def test_what_a_reader_copies_imports_the_sdks_current_modules() -> None:
    """SDK v3 moved the training configs to `sagemaker.core.training.configs`; `sagemaker.train.configs` is a shim
    that warns ("This shim will be removed in a future version") in the reader's notebook or script. The docs'
    and the notebooks' examples, what a person copies, use the module the SDK keeps (the tests go on using the
    shim too: a script a user already has may)."""
    pages = [*DOCS.glob("*.md"), REPO_ROOT / "README.md", *REPO_ROOT.glob("[0-9]_*/*.ipynb"), *REPO_ROOT.glob("[0-9]_*/*.md")]
    stale = [p.relative_to(REPO_ROOT).as_posix() for p in pages if "sagemaker.train.configs" in p.read_text(encoding="utf-8")]
    assert not stale, f"import the configs from sagemaker.core.training.configs in: {stale}"
