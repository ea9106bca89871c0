"""Rules that keep the workshop usable: stripped notebooks, scripts that explain themselves,
code that runs on the training images' Python, one metric format, a CLI that says what is wrong."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workshop import REPO_ROOT, metrics
from workshop.__main__ import main as cli_main
from workshop.__main__ import parse_hp
from workshop.errors import WorkshopError
from workshop.labs import LABS

NOTEBOOKS = sorted(p for p in REPO_ROOT.glob("[0-9]_*/*.ipynb"))
CODE_DIRS = sorted(p for p in REPO_ROOT.glob("[0-9]_*/code") if p.is_dir())


def test_every_lab_folder_has_a_notebook_and_code():
    for lab in LABS.values():
        assert lab.entry_path.is_file(), lab
        assert list(lab.path.glob("*.ipynb")), f"{lab.folder} has no notebook"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_committed_without_outputs(notebook):
    nb = json.loads(notebook.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{notebook.name}: cells {dirty} carry outputs; strip them (jupyter nbconvert --clear-output --inplace)"
    params = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, "exactly one parameters cell"
    assert re.search(r'^mode = "local"', "".join(params[0]["source"]), re.M), "the default mode is local"


@pytest.mark.parametrize("lab", LABS.values(), ids=lambda lab: lab.key)
def test_every_script_documents_its_flags(lab):
    proc = subprocess.run([sys.executable, str(lab.entry_path), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for flag in re.findall(r"add_argument\(\s*\"(--[a-z-]+)\"", lab.entry_path.read_text()):
        assert flag in proc.stdout, f"{flag} missing from --help"


def python312() -> str | None:
    """A working Python 3.12 (a pyenv shim answers even when the version is not active)."""
    candidates = [shutil.which("python3.12"), "/usr/bin/python3.12", "/usr/local/bin/python3.12"]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.startswith("Python 3.12"):
            return exe
    return None


PY312 = python312()


@pytest.mark.skipif(PY312 is None, reason="no Python 3.12 on this machine")
@pytest.mark.parametrize("code_dir", CODE_DIRS, ids=lambda p: p.parent.name)
def test_code_compiles_on_python_312(code_dir, tmp_path):
    """Today's SageMaker training images run Python 3.12: the code/ folders must parse there."""
    proc = subprocess.run(
        [PY312, "-m", "compileall", "-q", str(code_dir)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_code_folders_are_self_contained():
    """A lab's code/ is uploaded alone: it must not import the workshop package."""
    for code_dir in CODE_DIRS:
        for script in code_dir.rglob("*.py"):
            assert not re.search(r"^\s*(from|import)\s+workshop\b", script.read_text(), re.M), script


def test_metric_lines_round_trip_through_the_sagemaker_regexes():
    line = metrics.format_line(rank=0, epoch=2, step=62, test_accuracy=0.9712, train_loss=1.5e-3)
    assert line.startswith("METRICS rank=0 epoch=2 step=62")
    for name, value in (("test_accuracy", 0.9712), ("train_loss", 1.5e-3), ("step", 62)):
        match = re.search(metrics.metric_regex(name), line)
        assert match and float(match.group(1)) == pytest.approx(value)
    assert re.search(metrics.metric_regex("train_loss"), "METRICS rank=1 step=3 train_loss=0.5") is None
    record = metrics.parse_line("[algo-2/3] METRICS rank=3 step=7 train_loss=0.25 weights_sha256=ab12")
    assert record == {"rank": 3, "step": 7, "train_loss": 0.25, "weights_sha256": "ab12", "host": "algo-2"}
    assert metrics.parse_line("[algo-1] Executing command: torchrun") is None


def test_cli_errors_name_the_fix(capsys):
    assert cli_main(["run", "no-such-lab"]) == 2
    assert "Unknown lab 'no-such-lab'" in capsys.readouterr().err
    assert cli_main(["run", "data_parallel", "--dry-run"]) == 2
    assert "--dry-run applies to --mode sagemaker" in capsys.readouterr().err
    with pytest.raises(WorkshopError, match="is not KEY=VALUE"):
        parse_hp(["epochs"])
    assert parse_hp(["epochs=3", "lr=0.1", "backend=gloo", "scale-lr=true"]) == {
        "epochs": 3, "lr": 0.1, "backend": "gloo", "scale-lr": True,
    }


def test_cli_lists_labs():
    proc = subprocess.run([sys.executable, "-m", "workshop", "labs"], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert proc.returncode == 0 and "3_data_parallel" in proc.stdout


def test_glued_metric_lines_yield_every_record():
    """Ranks sharing one stdout can glue lines together; each record keeps its own rank."""
    glued = "METRICS rank=0 epoch=3 test_accuracy=0.95METRICS rank=1 weights_sha256=ab"
    assert metrics.parse_lines([glued]) == [
        {"rank": 0, "epoch": 3, "test_accuracy": 0.95},
        {"rank": 1, "weights_sha256": "ab"},
    ]
