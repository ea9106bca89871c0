"""Notebooks a person can follow: each names the workshop's kernel (the one `make lab` registers), its
markdown renders as written (no money amount turned into LaTeX), its code cells compile, its headings
are not repeated; and `make lab` starts as root too, saying why."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import nbformat
import pytest

from workshop import REPO_ROOT, teaching

NOTEBOOKS = sorted(REPO_ROOT.glob("[0-9]_*/*.ipynb"))
KERNELSPEC = {"name": "distributed-training-workshop", "display_name": "Python (distributed training workshop)",
              "language": "python"}
MAKEFILE = REPO_ROOT / "Makefile"

# A `$` that starts an amount of money ($0.41, $37.69/h, $1,000): Jupyter's MathJax pairs it with the next
# `$` and typesets what lies between as LaTeX, both dollars lost. A backslash does not help in JupyterLab:
# `\$` still pairs (jupyterlab/jupyterlab#8645, #9033; seen in JupyterLab 4 in Chromium: "\$0.03-\$0.05 at
# \$0.408/h" rendered as "0.03-0.05 at 0.408/h" in math). Write USD 0.41, or put the amount in a code span.
# (Math such as `$2K$` or `$2\,(N-1)\,K/N$` is left alone: a letter or a TeX command follows the number.)
MONEY = re.compile(r"\$(?=\d[\d,]*+(?:\.\d++)?+(?![A-Za-z\\$^_{]))")
CODE_SPAN = re.compile(r"(`+).+?\1")


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _ids(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _makefile_variable(name: str) -> str:
    match = re.search(rf"^{name}\s*:=\s*(.+?)\s*$", MAKEFILE.read_text(), re.M)
    assert match, f"the Makefile defines no {name}"
    return match.group(1)


def _prose_lines(markdown: str):
    """Each markdown line outside fenced code blocks, with inline code spans removed."""
    fenced = False
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            yield number, CODE_SPAN.sub("", line)


def money_dollars(markdown: str) -> list[str]:
    """The lines of `markdown` with a `$` that Jupyter would read as a math delimiter: a `$` before an
    amount, escaped or not, or an odd number of unescaped `$` (one left over pairs with a `$` further on)."""
    bad = []
    for number, line in _prose_lines(markdown):
        unescaped = len(re.findall(r"(?<!\\)\$", line))
        if MONEY.search(line) or unescaped % 2:
            bad.append(f"line {number}: {line.strip()}")
    return bad


def test_money_dollars_are_told_apart_from_math() -> None:
    assert money_dollars("about $0.03-$0.05 at $0.408/h") == ["line 1: about $0.03-$0.05 at $0.408/h"]
    assert money_dollars("**at most $1.41** (2 x $1.408/h x 0.5 h)")
    assert money_dollars("up to $37.69 per half hour")  # one `$` pairs with one on a later line
    assert money_dollars("costs $5.") and money_dollars("$1,000 a month, $2 a day")
    assert money_dollars(r"about \$0.03-\$0.05 at \$0.408/h, at most **\$1.41**")  # JupyterLab pairs these too
    assert money_dollars("about USD 0.03-0.05 at USD 0.408/h, at most **USD 1.41**") == []
    assert money_dollars(r"each rank sends $2\,(N-1)\,K/N$ bytes: that approaches $2K$ and $N \cdot K$") == []
    assert money_dollars("the driver prints `cost: at most $1.41` and `$HOME`") == []
    assert money_dollars("```bash\necho $0.41 $HOME\n```") == []


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_notebook_names_the_workshop_kernel(notebook: Path) -> None:
    spec = dict(_read(notebook).metadata.get("kernelspec", {}))
    assert spec == KERNELSPEC, (
        f"{notebook.relative_to(REPO_ROOT)} names the kernel {spec}, not the workshop's: set its metadata.kernelspec "
        f"to {KERNELSPEC} (`make lab` registers that kernel)")


def test_make_lab_registers_the_kernel_the_notebooks_name() -> None:
    assert _makefile_variable("KERNEL_NAME") == KERNELSPEC["name"]
    assert _makefile_variable("KERNEL_DISPLAY_NAME") == KERNELSPEC["display_name"]
    recipe = MAKEFILE.read_text().split("\nlab: setup\n", 1)[1].split("\n\n", 1)[0]
    assert 'ipykernel install --user --name $(KERNEL_NAME) --display-name "$(KERNEL_DISPLAY_NAME)"' in recipe


def _make_lab(tmp_path: Path, uid: int, sagemaker: bool = False) -> str:
    """What `make lab` does, its commands run with a stand-in `python` and `jupyter` that print their
    arguments and an `id` that answers `uid`."""
    bin_dir, id_dir = tmp_path / "bin", tmp_path / "id"
    for folder in (bin_dir, id_dir):
        folder.mkdir(exist_ok=True)
    for tool in ("python", "jupyter"):
        (bin_dir / tool).write_text('#!/bin/sh\necho "RAN $(basename "$0") $*"\n')
    (id_dir / "id").write_text(f'#!/bin/sh\nif [ "$1" = -u ]; then echo {uid}; else echo user{uid}; fi\n')
    for path in [*bin_dir.iterdir(), id_dir / "id"]:
        path.chmod(0o755)
    metadata = tmp_path / "resource-metadata.json"
    if sagemaker:
        metadata.write_text('{"ResourceName": "my-notebook"}')
    commands = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", "setup", "lab", f"BIN={bin_dir}",
         f"SAGEMAKER_NOTEBOOK_METADATA={metadata}"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=60).stdout
    assert "pip install" not in commands and "build_horovod" not in commands, commands  # only the lab recipe
    env = {**os.environ, "PATH": f"{id_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-e"], input=commands, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_lab_as_root_passes_allow_root_and_says_why(tmp_path: Path) -> None:
    if subprocess.run(["make", "--version"], capture_output=True).returncode != 0:
        pytest.skip("no make")
    out = _make_lab(tmp_path, uid=0)
    assert "RAN python -m ipykernel install --user --name distributed-training-workshop" in out
    assert "Registered the Jupyter kernel distributed-training-workshop" in out
    assert "RAN jupyter lab --allow-root" in out
    why = [line for line in out.splitlines() if "--allow-root" in line and not line.startswith("RAN")]
    assert len(why) == 1 and "root" in why[0] and "refuses" in why[0], out
    assert "SageMaker" not in out

    out = _make_lab(tmp_path, uid=1000)
    assert "RAN jupyter lab\n" in out and "--allow-root" not in out, out
    assert "Registered the Jupyter kernel distributed-training-workshop" in out


def test_make_lab_on_a_sagemaker_notebook_instance_says_where_the_kernel_shows(tmp_path: Path) -> None:
    if subprocess.run(["make", "--version"], capture_output=True).returncode != 0:
        pytest.skip("no make")
    out = _make_lab(tmp_path, uid=1000, sagemaker=True)
    assert "RAN python -m ipykernel install --user --name distributed-training-workshop" in out
    assert "SageMaker notebook instance" in out and KERNELSPEC["display_name"] in out, out
    out = _make_lab(tmp_path, uid=0, sagemaker=True)
    assert "as root" in out and "ec2-user" in out, out


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_markdown_has_no_money_read_as_math(notebook: Path) -> None:
    bad = [f"cell {i} {line}" for i, cell in enumerate(_read(notebook).cells) if cell.cell_type == "markdown"
           for line in money_dollars(cell.source)]
    assert not bad, (f"{notebook.relative_to(REPO_ROOT)}: Jupyter renders these `$` as LaTeX math (both dollars "
                     "lost, with or without a backslash); write money as USD 0.41, or in a code span:\n" + "\n".join(bad))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_code_cells_compile_and_headings_are_not_repeated(notebook: Path) -> None:
    nb = _read(notebook)
    nbformat.validate(nb)
    headings: dict[str, int] = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            source = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line
                               for line in cell.source.splitlines())  # IPython magics
            compile(source, f"{notebook.name} cell {i}", "exec")
        elif cell.cell_type == "markdown":
            for _, line in _prose_lines(cell.source):
                if re.match(r"#{1,6} ", line):
                    title = line.lstrip("#").strip().lower()
                    assert title not in headings, (
                        f"{notebook.name}: cells {headings[title]} and {i} both have the heading {line.strip()!r}: "
                        "merge them or rename one")
                    headings[title] = i


def test_lab1_labels_its_coordinator_not_rank_0() -> None:
    """Lab 1's loss and accuracy lines come from the coordinator (rank 0, algo-1), which computes no
    gradients: the legend says so instead of "rank 0"."""
    import matplotlib.pyplot as plt

    from workshop import metrics

    records = [{"rank": 0, "step": s, "train_loss": 1.0 / s} for s in (1, 2)] + [{"rank": 1, "step": 1, "train_loss": 2.0}]
    fig = metrics.plot_per_rank(records, [("step", "train_loss")], labels={0: "coordinator (algo-1)"})
    try:
        assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["coordinator (algo-1)", "rank 1"]
    finally:
        plt.close(fig)
    notebook = next(p for p in NOTEBOOKS if p.parent.name == "1_parameter_server")
    plots = [c.source for c in _read(notebook).cells if c.cell_type == "code" and "plot_per_rank" in c.source]
    assert plots and all('labels={0: "coordinator' in source for source in plots), plots


def test_a_plot_with_few_steps_has_a_tick_under_each_point() -> None:
    """The issue: lab 4's loss plot ticked every 6 steps while its points fell every 10."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workshop import metrics

    records = [{"rank": r, "step": s, "train_loss": 5.0 / s} for r in (0, 1) for s in range(10, 61, 10)]
    fig = metrics.plot_per_rank(records, [("step", "train_loss")])
    try:
        assert list(fig.axes[0].get_xticks()) == [10, 20, 30, 40, 50, 60]
    finally:
        plt.close(fig)
    many = [{"rank": 0, "step": s, "train_loss": 1.0} for s in range(1, 94)]  # a line per step: the locator's ticks
    fig = metrics.plot_per_rank(many, [("step", "train_loss")])
    try:
        assert len(fig.axes[0].get_xticks()) < 15
    finally:
        plt.close(fig)


def test_lab4_memory_figure_labels_neither_touch_nor_reach_the_frame(tmp_path) -> None:
    """The issue: the "N=1/N=2/N=4" labels over lab 4's bars sat on the top frame and nearly touched.
    The notebook's figure (4_model_parallel/figures.py) is drawn here from measurements of the shape its grid makes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workshop.spec import load_module

    notebook = next(p for p in NOTEBOOKS if p.parent.name == "4_model_parallel")
    assert any("figures.plot_memory(" in c.source and "model_parallel_memory.png" in c.source
               for c in _read(notebook).cells if c.cell_type == "code"), "the notebook draws its figure in one call"
    figures = load_module(notebook.parent / "figures.py", "_lab4_figures")
    full = 400_000
    runs = {}
    for technique, share in (("no_shard", 0), ("optimizer", 0.5), ("shard_grad_op", 1), ("full_shard", 1), ("hybrid_shard", 1)):
        for n in (1, 2, 4):
            if technique == "hybrid_shard" and n != 4:
                continue
            state = full if n == 1 or not share else full / (2 if technique == "hybrid_shard" else n)
            runs[technique, n] = [{"param_bytes": state / 4, "grad_bytes": state / 4, "optim_bytes": state / 2,
                                   "state_bytes": state, "step_time_s": 0.01 * n}]
    path = tmp_path / "runs" / "figures" / "model_parallel_memory.png"
    fig = figures.plot_memory(runs, (1, 2, 4), path)
    assert path.is_file()
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        renderer = fig.canvas.get_renderer()
        boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text().strip().startswith("N=")]
        frame = ax.get_window_extent(renderer)
        assert len(boxes) == len(runs)
        height = boxes[0].height if boxes[0].height < boxes[0].width else boxes[0].width  # the text's line height
        assert all(frame.y1 - b.y1 >= height for b in boxes), "a label sits on the top frame"
        gaps = [max(b.x0 - a.x1, a.x0 - b.x1) for i, a in enumerate(boxes) for b in boxes[i + 1:]
                if a.y0 < b.y1 and b.y0 < a.y1]  # side by side
        assert min(gaps, default=height) >= height / 2, "two labels nearly touch"
    finally:
        plt.close("all")


# Cells that do the same local work in both modes (tests/test_notebooks_sagemaker_mode.py: LOCAL_WORK_TAG):
# nbval runs them in local mode, and the sagemaker-mode run leaves them out. So a tagged cell must not
# depend on the mode, nor start or clean up anything in AWS.
MODE_DEPENDENT = re.compile(r"\bmode\b|run_on_sagemaker|\bcleanup\(|\bsagemaker\b")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_local_work_cells_are_the_same_in_both_modes(notebook: Path) -> None:
    from test_notebooks_sagemaker_mode import LOCAL_WORK_TAG, _prepare, is_local_work

    nb = _read(notebook)
    tagged = [i for i, cell in enumerate(nb.cells) if is_local_work(cell)]
    for i in tagged:
        cell = nb.cells[i]
        assert cell.cell_type == "code" and "parameters" not in cell.metadata.get("tags", []), (notebook.name, i)
        found = MODE_DEPENDENT.search(cell.source)
        assert not found, (f"{notebook.name} cell {i} is tagged {LOCAL_WORK_TAG!r} (left out of the sagemaker-mode "
                           f"run) but reads {found[0]!r}: untag it, or move the mode-dependent part to a cell of its own")
    # The sagemaker-mode run's notebook: every other cell, in order, around the injected ones.
    prepared = _prepare(_read(notebook), f"{notebook.parent.name}/{notebook.stem}")
    kept = [cell.source for cell in prepared.cells
            if not any(tag.startswith("injected-") for tag in cell.metadata.get("tags", []))]
    # (each exercise cell with its solution in place, as nbval's run has it: workshop/teaching.py)
    assert kept == [teaching.solved_source(notebook, cell) or cell.source for i, cell in enumerate(nb.cells) if i not in tagged]


SHELL_LINE = re.compile(r"^\s*!(?!=)")  # IPython's `!command` (not `!=`, which a line never starts with anyway)


def test_ipythons_shell_escape_never_fails_a_cell_by_itself() -> None:
    """Why the test below exists: `!command` that exits non-zero leaves the cell successful (IPython only sets
    `_exit_code`), so nbval would pass a notebook whose command failed."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        result = shell.run_cell("!exit 3")
        assert result.success and shell.user_ns["_exit_code"] == 3
        failed = shell.run_cell("!exit 3\nassert _exit_code == 0, 'the command failed'")
        assert not failed.success  # the check the notebooks carry is what turns a failed command into a failed cell
    finally:
        InteractiveShell.clear_instance()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_a_shell_command_in_a_notebook_fails_its_cell_when_it_fails(notebook: Path) -> None:
    """A cell that runs `!command` checks `_exit_code` after it, in the same cell: a failed command fails the cell
    (for nbval in CI, and for the attendee, who sees the check's message under the command's own lines)."""
    bad = []
    for i, cell in enumerate(_read(notebook).cells):
        if cell.cell_type != "code":
            continue
        lines = cell.source.splitlines()
        for n, line in enumerate(lines):
            if SHELL_LINE.match(line) and not any("_exit_code" in later for later in lines[n + 1:]):
                bad.append(f"cell {i}: {line.strip()[:100]}")
    assert not bad, (f"{notebook.name}: a shell command whose failure nobody would see (IPython's `!` never fails "
                     "a cell); add `assert _exit_code == 0, ...` after it:\n" + "\n".join(bad))
