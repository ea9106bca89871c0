"""The notebooks' "lines that make it distributed": every tag shows the code it explains.

A script marks its distributed lines with a tag comment (`# DDP: ...`), at the end of a code line
or on a comment line above the code. `workshop.notebook.distributed_lines` prints each tag with the
whole statement it belongs to; these tests hold it to that on every lab's script, so a tag that
would print a comment alone (the bug of printing only the tagged lines) fails here.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap

import pytest

from workshop import REPO_ROOT
from workshop.labs import LABS, get_lab
from workshop.notebook import distributed_lines, find_tagged

ENTRY_SCRIPTS = sorted({lab.entry_path for lab in LABS.values()})
# Each lab's main notebook, named after its folder (3_data_parallel/data_parallel.ipynb); a folder
# may hold more (3_data_parallel/job_parallelism.ipynb), which build on the main one.
NOTEBOOKS = sorted(p for p in REPO_ROOT.glob("[0-9]_*/*.ipynb") if p.stem == p.parent.name.split("_", 1)[1])


def declared_tag(path) -> str:
    """The tag a script's docstring names: "... carry a `DDP:` comment"."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    match = re.search(r"carry a `(\w+):` comment", doc.replace("\n", " "))
    assert match, f"{path}: the docstring should say which tag marks the distributed lines"
    return match.group(1)


def shown(path, tag) -> str:
    """The helper's output without the line numbers, to search for code."""
    return "\n".join(line[6:] for line in distributed_lines(path, tag).splitlines()[1:])


def test_lab3_shows_the_process_group_the_wrapper_and_the_sampler():
    lab = get_lab("data_parallel")
    out = shown(lab.entry_path, "DDP")
    assert "dist.init_process_group(" in out
    assert "DDP(" in out or "DistributedDataParallel(" in out
    assert "DistributedSampler(" in out
    # Numbered as in the file.
    number = next(i for i, line in enumerate(lab.entry_path.read_text().splitlines(), 1) if "init_process_group(" in line)
    assert re.search(rf"^\s*{number}  dist\.init_process_group\(", distributed_lines(lab.entry_path, "DDP"), re.M)


def test_lab2_shows_what_horovod_wraps_and_broadcasts():
    pytorch = shown(get_lab("horovod_pytorch").entry_path, "Horovod")
    tensorflow = shown(get_lab("horovod_tensorflow").entry_path, "Horovod")
    assert "hvd.DistributedOptimizer(" in pytorch and "hvd.broadcast_parameters(" in pytorch
    # The wrapper's call spans several lines: all of them, up to its closing parenthesis.
    assert re.search(r"hvd\.DistributedOptimizer\(\n(.*\n)*?.*op=hvd\.Average,\n\)", pytorch), pytorch
    assert "hvd.DistributedGradientTape(" in tensorflow and "hvd.broadcast_variables(" in tensorflow


@pytest.mark.parametrize("path", ENTRY_SCRIPTS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_every_tag_shows_code(path):
    """No tag prints a comment alone: each one shows at least one line of code, and its own line."""
    tag = declared_tag(path)
    source = path.read_text()
    lines = source.splitlines()
    tagged = find_tagged(source, tag)
    assert len(tagged) >= 5, f"{path}: only {len(tagged)} `# {tag}:` tags"
    assert len(tagged) == sum(f"# {tag}:" in line for line in lines)  # none missed (no tag inside a string here)
    out = distributed_lines(path, tag)
    for t in tagged:
        code = [n for n in t.code_lines if lines[n - 1].strip() and not lines[n - 1].strip().startswith("#")]
        assert code, f"{path}:{t.tag_line}: the tag shows no code: {lines[t.tag_line - 1].strip()}"
        ast.parse(textwrap.dedent("\n".join(lines[n - 1] for n in t.code_lines)))  # a whole statement
        for n in t.lines:
            assert re.search(rf"^\s*{n}  ", out, re.M), f"{path}:{n} is not in the output"


def test_statement_rules_on_a_small_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''\
        """Docs: the lines carry a `X:` comment, and "# X: in a string" is no tag."""
        import os

        def main():
            # X: a comment on its own line, continued
            # on the next one,
            value = dict(   # not a tag
                a=1,
                b=2,
            )
            server = start(  # X: a tag inside a statement that spans lines
                value,
            )
            with scope():  # X: a compound statement's header
                make()
            # X: the one below
            for i in range(3):
                step(i)
            return os.getpid()
            # X: a comment that ends a block explains no statement below it

        def other():
            pass
        '''))
    tagged = {t.tag_line: t for t in find_tagged(script.read_text(), "X")}
    assert sorted(tagged) == [5, 11, 14, 16, 20]
    assert tagged[5].comment_lines == (5, 6) and tagged[5].code_lines == (7, 8, 9, 10)
    assert tagged[11].comment_lines == () and tagged[11].code_lines == (11, 12, 13)
    assert tagged[14].code_lines == (14, 15)
    assert tagged[16].code_lines == (17, 18)
    assert tagged[20].comment_lines == (20,) and tagged[20].code_lines == ()  # (test_every_tag_shows_code fails on it)
    out = distributed_lines(script, "# X:")  # "X", "X:" and "# X:" all name the tag
    assert out.splitlines()[0] == "train.py: 5 `# X:` comments, each with the statement it explains"
    # Consecutive lines print as one block, dedented together; a blank line between blocks.
    assert "   5  # X: a comment on its own line, continued\n   6  # on the next one,\n   7  value = dict(   # not a tag" in out
    assert "  18      step(i)" in out and "os.getpid" not in out and "def other" not in out


def test_every_lab_folder_has_its_main_notebook():
    assert sorted(p.parent for p in NOTEBOOKS) == sorted({lab.path for lab in LABS.values()})


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebook_calls_the_one_helper(notebook):
    nb = json.loads(notebook.read_text())
    cells = ["".join(c["source"]) for c in nb["cells"]]
    section = next(i for i, text in enumerate(cells) if "lines that make it distributed" in text)
    code = cells[section + 1]
    assert "from workshop.notebook import distributed_lines" in "\n".join(cells), "the notebook imports the helper"
    assert "distributed_lines(lab.entry_path" in code
    tags = {declared_tag(lab.entry_path) for lab in LABS.values() if lab.path == notebook.parent}
    assert re.findall(r'distributed_lines\(lab\.entry_path, "(\w+)"\)', code) == sorted(tags)
