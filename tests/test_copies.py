"""Deliberate copies stay identical, and every lab's metric lines reach SageMaker and the plots.

Each lab's `code/` folder is uploaded alone (its SageMaker `source_dir`), and each driver in
`workshop/drivers/` runs alone in the training container, so a few helpers are copied on purpose
instead of imported. `SHARED` lists them: a copy that drifts fails here, naming the file and the
definition; each copy carries the `# Shared copy:` comment that points a reader at this test.
A lab's copy is looked for in every module of its `code/` folder (its entry script, or a sibling
module the script imports, e.g. the fault-tolerance helpers), so moving a helper between the
modules of one folder needs no change here; a folder with no copy, or two that differ, fails.
(huggingface/accelerate checks its example scripts the same way: tests/test_examples.py.)

Nothing here starts a training process: the scripts are parsed with `ast`, or loaded as modules
without running their `main`.
"""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

import pytest

from workshop import REPO_ROOT, metrics
from workshop.labs import LABS

MARKER = "# Shared copy: keep identical in every script that has it (tests/test_copies.py)."

# A lab's training scripts as SHARED names them: each holds its copies in one of the modules of its
# `code/` folder. Lab 2 has two scripts; where both need a helper, each keeps its own copy unless
# they share a sibling module (then the folder holds one copy, and both entries name it).
L1 = "1_parameter_server/code/train.py"
HVD_PT = "2_horovod/code/train_pytorch.py"
HVD_TF = "2_horovod/code/train_tensorflow.py"
L3 = "3_data_parallel/code/train.py"
L4 = "4_model_parallel/code/train.py"
HVD_DRIVER = "workshop/drivers/horovod/hvd_driver.py"
HVD_BUILD = "workshop/drivers/horovod/hvd_build.py"
PS_DRIVER = "workshop/drivers/parameter_server/ps_driver.py"

# Top-level definition (function, class or assigned name) -> the files that hold a copy of it.
SHARED: dict[str, tuple[str, ...]] = {
    # The labs' training scripts.
    "metrics": (L1, HVD_PT, HVD_TF, L3, L4),  # the metric line (workshop/metrics.py parses it)
    "str2bool": (HVD_PT, HVD_TF, L3, L4),  # SageMaker passes booleans as text
    "MNIST_MEAN": (L1, HVD_PT, HVD_TF, L3),  # the same normalisation for every MNIST lab
    "Net": (HVD_PT, L3),  # labs 2 and 3 train the same CNN, so they compare line for line
    "load_channel": (HVD_PT, L3),
    "weights_digest": (HVD_PT, L3),
    "save_atomic": (HVD_PT, L3),
    "nonfinite_problems": (L1, HVD_PT, HVD_TF, L3, L4),  # --lr nan and inf refused before anything starts
    "exit_with": (L1, HVD_PT, HVD_TF, L3, L4),  # a rank's last line says why it stopped
    "restore_error": (L1, HVD_TF),  # a TensorFlow checkpoint that cannot be restored, in one line
    "distributed_env": (L3, L4),  # torchrun's variables, a world of one without them
    "set_gloo_interface": (L3, L4),
    # Fault tolerance under torchrun --max-restarts: fault injection, atomic writes, the recovery report.
    "FAULT_ENV": (L3, L4),
    "FAULT_RECORD_KEY": (L3, L4),
    "parse_fault": (L3, L4),
    "fault_problems": (L3, L4),
    "restart_count": (L3, L4),
    "agent_store": (L3, L4),
    "elastic_store": (L3, L4),
    "agreed_attempt": (L3, L4),
    "fsync_dir": (L3, L4),
    "write_atomic": (L3, L4),
    "inject_fault": (L3, L4),
    "write_progress": (L3, L4),
    "read_recovery": (L3, L4),
    "announce_resume": (L3, L4),
    "report_recovery": (L3, L4),
    # Checkpoints to trust: verified on load, leftovers of killed saves cleaned, no checkpoint of a diverged run.
    "CHECKSUM_KEY": (HVD_PT, L3),
    "state_digest": (HVD_PT, L3),
    "load_checkpoint": (HVD_PT, L3),
    "STALE_NAMES": (HVD_PT, L3, L4),
    "clean_stale": (HVD_PT, L3, L4),
    "Divergence": (HVD_PT, L3, L4),
    "diverged": (L1, HVD_TF),  # the TensorFlow scripts' test of a loss, as Divergence's
    # --profile-steps: torch.profiler traces per rank (workshop.profiling).
    "PROFILE_WAIT": (HVD_PT, L3, L4),
    "StepProfiler": (HVD_PT, L3, L4),
    # The drivers (stdlib only, each runs alone on a training host).
    "DEFAULT_FAILURE_FILE": (HVD_DRIVER, PS_DRIVER),
    "is_loopback": (HVD_DRIVER, PS_DRIVER),
    "hyperparameters_to_cli_args": (HVD_DRIVER, PS_DRIVER),
    "write_failure_file": (HVD_DRIVER, PS_DRIVER),
    "HOROVOD_VERSION": (HVD_BUILD, HVD_DRIVER),
}

SCRIPTS = sorted(p.relative_to(REPO_ROOT).as_posix() for p in REPO_ROOT.glob("[0-9]_*/code/*.py"))
ENTRY_SCRIPTS = sorted({lab.entry_path.relative_to(REPO_ROOT).as_posix() for lab in LABS.values()})
DRIVERS = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "workshop" / "drivers").rglob("*.py"))

# The SageMaker training contract: each flag's SM_* variable, and its local default where every
# script agrees (a channel's default is data/<data set>/<channel>).
CONTRACT = {
    "--train": ("SM_CHANNEL_TRAIN", None),
    "--test": ("SM_CHANNEL_TEST", None),
    "--model-dir": ("SM_MODEL_DIR", "artifacts/model"),
    "--checkpoint-dir": ("SM_CHECKPOINT_DIR", "artifacts/checkpoints"),
    "--output-dir": ("SM_OUTPUT_DATA_DIR", "artifacts/output"),
}


def definitions(path: str, root: Path = REPO_ROOT) -> dict[str, tuple[ast.stmt, str]]:
    """Top-level name -> (its node, ast.unparse of it), for functions, classes and assignments.

    `a, b = 1, 2` is listed under both names. Comments do not count; docstrings do.
    """
    source = (root / path).read_text()
    out: dict[str, tuple[ast.stmt, str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        else:
            continue
        for name in names:
            out[name] = (node, ast.unparse(node))
    return out


def line_above(path: str, node: ast.stmt) -> str:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    lines = (REPO_ROOT / path).read_text().splitlines()
    return lines[first - 2].strip() if first >= 2 else ""


def is_script(path: str, root: Path = REPO_ROOT) -> bool:
    """A file that runs as a program (`if __name__ == "__main__":`), not a module a script imports."""
    return '__name__ == "__main__"' in (root / path).read_text()


def holders(name: str, places: tuple[str, ...], root: Path = REPO_ROOT) -> dict[str, tuple[ast.stmt, str] | None]:
    """File -> its top-level `name`, for every place SHARED lists: a driver is its own file; a lab's
    script stands for itself and the modules beside it in its `code/` folder that are not scripts
    (None: neither has `name`)."""
    found: dict[str, tuple[ast.stmt, str] | None] = {}
    for place in places:
        if not place.split("/")[0][:1].isdigit():
            found[place] = definitions(place, root).get(name)
            continue
        folder = (root / place).parent
        beside = [p.relative_to(root).as_posix() for p in sorted(folder.glob("*.py"))]
        modules = [place] + [m for m in beside if m != place and not is_script(m, root)]
        in_folder = {m: d for m in modules if (d := definitions(m, root).get(name)) is not None}
        if not in_folder:
            found[place] = None
        found.update(in_folder)
    return found


def is_declared(path: str, name: str) -> bool:
    """SHARED lists `name` as copied in `path` (directly, or `path` is a module beside a lab's script)."""
    places = SHARED.get(name, ())
    return path in places or (not is_script(path) and any(
        place.split("/")[0][:1].isdigit() and Path(place).parent == Path(path).parent for place in places))


def differences(name: str, files: tuple[str, ...], root: Path = REPO_ROOT) -> list[str]:
    """One message per file whose copy of `name` is missing or differs from the first file's."""
    found = holders(name, files, root)
    problems = [f"{path}: no top-level {name!r} in its folder's modules (SHARED says it holds a copy)"
                for path, d in found.items() if d is None]
    reference = next(((path, d[1]) for path, d in found.items() if d is not None), None)
    if reference is None:
        return problems
    ref_path, ref_text = reference
    for path, d in found.items():
        if d is None or path == ref_path or d[1] == ref_text:
            continue
        diff = "\n".join(difflib.unified_diff(ref_text.splitlines(), d[1].splitlines(), ref_path, path, lineterm=""))
        problems.append(f"{path}: {name!r} differs from the copy in {ref_path}; make them identical:\n{diff}")
    return problems


@pytest.mark.parametrize("name", sorted(SHARED))
def test_shared_copies_are_identical(name):
    problems = differences(name, SHARED[name])
    assert not problems, "\n\n".join(problems)


@pytest.mark.parametrize("name", sorted(SHARED))
def test_every_shared_copy_says_so(name):
    """A reader about to edit one copy sees that it has others, and where they are checked."""
    for path, found in holders(name, SHARED[name]).items():
        assert found is not None, f"{path}: no top-level {name!r} in its folder's modules"
        node, _ = found
        assert line_above(path, node) == MARKER, f"{path}:{node.lineno}: put `{MARKER}` above {name!r}"


def test_no_undeclared_copies():
    """An identical definition in two scripts (or two drivers) is a copy: list it in SHARED, so
    it stays identical; a comment marks as shared only what SHARED lists."""
    for group in (SCRIPTS, DRIVERS):
        texts: dict[str, dict[str, str]] = {}
        for path in group:
            defs = definitions(path)
            # Nodes SHARED covers here (`MNIST_MEAN, MNIST_STD = ...` is one node, listed once).
            declared = {id(node) for name, (node, _) in defs.items() if is_declared(path, name)}
            for name, (node, text) in defs.items():
                if id(node) in declared:
                    continue
                texts.setdefault(name, {})[path] = text
                assert line_above(path, node) != MARKER, f"{path}: {name!r} is marked shared but not in SHARED"
        for name, by_path in texts.items():
            if name in ("main", "HERE", "__all__"):
                continue  # the entry point; `HERE = Path(__file__)...` is an idiom, not a helper
            identical = [p for p in by_path if list(by_path.values()).count(by_path[p]) > 1]
            missing = sorted(p for p in identical if not is_declared(p, name))
            assert not missing, f"{name!r} is copied identically in {missing}: add it to SHARED in tests/test_copies.py"


def test_the_copies_check_fails_on_a_drift(tmp_path):
    """The check itself: one changed character in one copy is reported with its file and name,
    wherever in its lab's folder the copy lives."""
    import shutil

    for path in (L1, HVD_PT, L3):
        shutil.copytree((REPO_ROOT / path).parent, (tmp_path / path).parent, ignore=shutil.ignore_patterns("__pycache__"))
    drifted = next(path for path in holders("weights_digest", (L3,)))
    (tmp_path / drifted).write_text(
        (tmp_path / drifted).read_text().replace("return h.hexdigest()[:16]", "return h.hexdigest()[:12]", 1))
    problems = differences("weights_digest", (HVD_PT, L3), root=tmp_path)
    assert len(problems) == 1 and problems[0].startswith(f"{drifted}: 'weights_digest' differs"), problems
    assert "-    return h.hexdigest()[:16]" in problems[0] and "+    return h.hexdigest()[:12]" in problems[0]
    assert differences("save_atomic", (HVD_PT, L3), root=tmp_path) == []
    assert differences("save_atomic", (HVD_PT, L1), root=tmp_path) == [
        f"{L1}: no top-level 'save_atomic' in its folder's modules (SHARED says it holds a copy)"
    ]


# ----------------------------------------------------------------------------- the SageMaker contract


def contract_flags(path: str) -> dict[str, tuple[str, str]]:
    """`--flag` -> (SM_* variable, local default) for each `add_argument("--flag", default=env("SM_...", "..."))`
    in the script or a module beside it that is not a script (its parser may live in, e.g., `arguments.py`)."""
    out = {}
    beside = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / path).parent.glob("*.py"))
    modules = [path] + [m for m in beside if m != path and not is_script(m)]
    for node in (n for m in modules for n in ast.walk(ast.parse((REPO_ROOT / m).read_text()))):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args):
            continue
        default = next((k.value for k in node.keywords if k.arg == "default"), None)
        if (
            isinstance(default, ast.Call) and getattr(default.func, "id", None) == "env"
            and len(default.args) == 2 and all(isinstance(a, ast.Constant) for a in default.args)
        ):
            out[node.args[0].value] = (default.args[0].value, default.args[1].value)
    return out


@pytest.mark.parametrize("path", ENTRY_SCRIPTS)
def test_contract_flags_read_the_same_sagemaker_variables(path):
    """Every flag with an SM_* default reads the variable SageMaker sets for it, with the same
    local fallback in every script (channels: data/<data set>/<channel>)."""
    flags = contract_flags(path)
    assert {"--train", "--test", "--model-dir"} <= set(flags), f"{path}: contract flags {sorted(flags)}"
    for flag, (variable, default) in flags.items():
        assert flag in CONTRACT, f"{path}: {flag} reads {variable}; add it to CONTRACT in tests/test_copies.py"
        expected_variable, expected_default = CONTRACT[flag]
        assert variable == expected_variable, f"{path}: {flag} reads {variable}, not {expected_variable}"
        if expected_default is None:
            assert re.fullmatch(rf"data/\w+/{flag[2:]}", default), f"{path}: {flag} defaults to {default!r}"
        else:
            assert default == expected_default, f"{path}: {flag} defaults to {default!r}, not {expected_default!r}"


# ----------------------------------------------------------------------------- metric lines


def sample_values(names) -> dict[str, float]:
    """Distinct values that survive the scripts' `:.6g` formatting exactly, one in exponent form."""
    values = {}
    for i, name in enumerate(names):
        values[name] = 1.5e-05 if i == 1 else round(0.125 + 7.25 * i, 4)
    return values


@pytest.mark.parametrize("lab", LABS.values(), ids=lambda lab: lab.key)
def test_each_scripts_metric_lines_round_trip(lab, capsys, monkeypatch):
    """The script's own `metrics` printer, its lines parsed by workshop.metrics and matched by the
    SageMaker metric definitions: every metric the lab declares arrives with its value."""
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # what the TF scripts set on import, undone after
    script = lab.load_script()  # imports it; its `main` does not run
    values = sample_values(lab.metrics)
    script.metrics(rank=0, epoch=2, step=120, **values)
    script.metrics(rank=1, epoch=2, step=120, **{name: 99.0 for name in lab.metrics})  # another rank's line
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("METRICS rank=0 epoch=2 step=120 "), lines

    records = metrics.parse_lines(lines)
    assert records[0] == {"rank": 0, "epoch": 2, "step": 120, **values}, records[0]
    assert metrics.last(records, lab.accuracy_metric) == values[lab.accuracy_metric]

    definitions_ = metrics.sagemaker_metric_definitions(lab.metrics)
    assert [d["Name"] for d in definitions_] == list(lab.metrics)
    for definition in definitions_:
        found = [float(m.group(1)) for line in lines if (m := re.search(definition["Regex"], line))]
        # Rank 0's value only: the definitions pin rank 0, so SageMaker charts one line per metric.
        assert found == [pytest.approx(values[definition["Name"]])], (definition, lines)


def test_a_scripts_sibling_modules_load_with_it_and_never_shadow_another_labs(tmp_path):
    """`Lab.load_script` imports a script whose helpers live beside it in `code/`: each lab gets its
    own `fault_tolerance.py` (say), even when two labs name theirs alike, and none stays behind."""
    import sys

    from workshop.spec import load_module

    scripts = []
    for lab, value in (("lab_a", 1), ("lab_b", 2)):
        folder = tmp_path / lab / "code"
        folder.mkdir(parents=True)
        (folder / "helpers.py").write_text(f"VALUE = {value}\n")
        (folder / "train.py").write_text("from helpers import VALUE\n\ndef value():\n    return VALUE\n")
        scripts.append(load_module(folder / "train.py", f"_test_{lab}", with_siblings=True))
    assert [s.value() for s in scripts] == [1, 2]
    assert "helpers" not in sys.modules and str(tmp_path / "lab_a" / "code") not in sys.path
