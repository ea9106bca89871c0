"""Every lab folder's README shows its lab's main figure, and that figure is one a make target draws from a real
run (`make figures`: scripts/lab_figures.py; lab 3's, `make bench`), never a picture put there by hand.

The notebooks are committed without outputs, so a reader browsing the repository saw no plot of any lab. A README
figure that nothing regenerates goes stale unseen: lab 4's first memory figure, images/model_parallel_memory.png,
was written once by a notebook run and no target wrote it again.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from workshop import REPO_ROOT
from workshop.labs import LABS
from workshop.spec import load_module

lab_figures = load_module(REPO_ROOT / "scripts" / "lab_figures.py", "_lab_figures")
FOLDERS = sorted({lab.folder for lab in LABS.values()})
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def png_text(path: Path) -> dict[str, str]:
    """A PNG's tEXt chunks (keyword -> text)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    out, at = {}, 8
    while at < len(data):
        (length,), kind = struct.unpack(">I", data[at:at + 4]), data[at + 4:at + 8]
        if kind == b"tEXt":
            key, _, value = data[at + 8:at + 8 + length].partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        at += 12 + length
    return out


def test_every_lab_folder_has_a_figure_and_every_figure_a_target() -> None:
    assert sorted(lab_figures.OUTPUTS) == FOLDERS
    for folder, (image, command) in lab_figures.OUTPUTS.items():
        assert image.startswith("images/") and image.endswith(".png"), image
        if command == "make figures":
            assert folder in lab_figures.DRAWN_HERE, f"{folder}: scripts/lab_figures.py draws no figure for it"
        else:  # make bench: one of its benchmarks names the file it writes
            assert command == "make bench", command
            bench = (REPO_ROOT / "Makefile").read_text().split("\nbench:", 1)[1].split("\n\n", 1)[0]
            scripts = re.findall(r"(benchmarks/\w+\.py)", bench)
            assert any(Path(image).name in (REPO_ROOT / s).read_text() for s in scripts), (image, scripts)
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"\nfigures:.*\n(?:\t.*\n)*\t.*scripts/lab_figures\.py", makefile), "make figures runs the script"


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_lab_readme_shows_the_figure_its_target_draws(folder: str) -> None:
    readme = REPO_ROOT / folder / "README.md"
    assert readme.is_file(), f"{folder} has no README.md"
    text = " ".join(readme.read_text(encoding="utf-8").split())  # a sentence may wrap
    image, command = lab_figures.OUTPUTS[folder]
    shown = [(readme.parent / target).resolve() for target in IMAGE.findall(text)]
    assert (REPO_ROOT / image).resolve() in shown, f"{folder}/README.md does not show ![...](../{image})"
    assert (REPO_ROOT / image).is_file(), f"{image} does not exist: run `{command}`"
    assert f"drawn by `{command}`" in text, f"{folder}/README.md does not say the figure is drawn by `{command}`"
    if command == "make figures":  # the PNG says it came from the script, and from what run
        source = png_text(REPO_ROOT / image).get(lab_figures.SOURCE_KEY, "")
        assert source.startswith("scripts/lab_figures.py: drawn by make figures from a real local run"), (image, source)


def test_png_text_reads_what_matplotlib_writes(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    fig.savefig(tmp_path / "a.png", metadata={lab_figures.SOURCE_KEY: "scripts/lab_figures.py: x"})
    plt.close(fig)
    assert png_text(tmp_path / "a.png")[lab_figures.SOURCE_KEY] == "scripts/lab_figures.py: x"
    fig = plt.figure(figsize=(1, 1))
    fig.savefig(tmp_path / "b.png")
    plt.close(fig)
    assert lab_figures.SOURCE_KEY not in png_text(tmp_path / "b.png")
