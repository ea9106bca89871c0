"""The package's shape (CONTRIBUTING.md): layers that import one way, no cycles, no lab named.

Every import counts, including those inside functions and under `if TYPE_CHECKING:`: a cycle
closed by a deferred import is still a cycle a reader has to hold in their head.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from workshop import REPO_ROOT

PACKAGE = REPO_ROOT / "workshop"
# The drivers ship inside SageMaker jobs on their own (stdlib only): not part of the package graph.
SHIPPED = PACKAGE / "drivers"
# Lower layers never import higher ones (CONTRIBUTING.md, "The layers").
LAYERS: dict[str, int] = {
    "workshop": 0, "workshop.errors": 0, "workshop.metrics": 0, "workshop.teaching": 0,
    "workshop.spec": 1, "workshop.search": 1, "workshop.runtime": 1, "workshop.cloud": 1, "workshop.trace_report": 1,
    "workshop.horovod_build": 1,
    "workshop.jobs": 2, "workshop.planner": 2,
    "workshop.launchers": 3, "workshop.datasets": 3,
    "workshop.labs": 4,
    "workshop.runner": 5, "workshop.tuning": 5, "workshop.account": 5, "workshop.notebook": 5, "workshop.__main__": 5,
    "workshop.profiling": 5, "workshop.event": 5, "workshop.script_mode": 5,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if SHIPPED not in p.parents}


def layer(module: str) -> int:
    best = max((m for m in LAYERS if module == m or module.startswith(m + ".")), key=len, default=None)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS here and to CONTRIBUTING.md's table")
    return LAYERS[best]


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int, str | None]]:
    """(imported module, line, imported name or None) for every import of a workshop module."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, None) for a in node.names if a.name.split(".")[0] == "workshop"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "workshop":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub, node.lineno, None) if sub in known else (target, node.lineno, alias.name))
    return [(m, line, n) for m, line, n in found if m != name]


def graph() -> tuple[dict[str, set[str]], list[str], list[str]]:
    known = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    private, upward = [], []
    for name, path in known.items():
        for target, line, imported in imports(name, path, known):
            if target not in known:
                raise AssertionError(f"{path}:{line} imports {target}, which does not exist")
            edges[name].add(target)
            if imported and imported.startswith("_"):
                private.append(f"{path.relative_to(REPO_ROOT)}:{line} imports the private name {imported} from {target}")
            if layer(target) > layer(name):
                upward.append(f"{path.relative_to(REPO_ROOT)}:{line}: {name} (layer {layer(name)}) imports "
                              f"{target} (layer {layer(target)})")
    return edges, private, upward


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycle():
    edges, _, _ = graph()
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_layers_import_downwards_only():
    _, _, upward = graph()
    assert upward == []


def test_no_private_name_is_imported_across_modules():
    _, private, _ = graph()
    assert private == []


def test_every_module_is_in_a_layer():
    for name in modules():
        layer(name)


def lab_branches(source: str, names: set[str]) -> list[str]:
    """Every comparison in `source` with a lab's key or folder, or with an attribute `.key`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(i, ast.Constant) and i.value in names for i in items) or (
                    isinstance(side, ast.Attribute) and side.attr == "key"):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
                break
    return found


def test_the_package_names_no_lab():
    """The CLI, runner, SageMaker path and launchers read what they need from a lab's spec: no
    module outside the registry branches on a lab's key or folder."""
    from workshop.labs import LABS

    names = {lab.key for lab in LABS.values()} | {lab.folder_name for lab in LABS.values()}
    found = [f"{path.relative_to(REPO_ROOT)}:{line}" for name, path in modules().items()
             if name != "workshop.labs"  # the registry looks labs up by key
             for line in lab_branches(path.read_text(), names)]
    assert found == []


def test_the_lab_name_check_sees_a_branch():
    source = ('if lab.key == "model_parallel":\n    pass\nif x in ("4_model_parallel", "y"):\n    pass\n'
              'if args.route != "fsdp":\n    pass\n')
    assert lab_branches(source, {"model_parallel", "4_model_parallel"}) == [
        "1: lab.key == 'model_parallel'", "3: x in ('4_model_parallel', 'y')"]


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_each_layer_entry_exists(name):
    assert name in modules() or any(m.startswith(name + ".") for m in modules()), name


def test_the_layout_page_names_every_module():
    """docs/layout.md's module table: each module by its dotted name, or as `.name` on its package's row."""
    rows = [line for line in (REPO_ROOT / "docs" / "layout.md").read_text().splitlines() if line.startswith("| ")]
    missing = []
    for name in modules():
        package, _, last = name.rpartition(".")
        named = any(f"`{name}`" in row or f"`{name} " in row or f"`{name}." in row
                    or (f"`{package}" in row and f"`.{last}`" in row)
                    or (f"`{package}` (" in row and f"`{last}`" in row) for row in rows)
        if not named and name != "workshop" and not name.endswith("__main__"):
            missing.append(name)
    assert missing == []


# The command line answers --help, `labs` and bad input without the heavy packages: the SageMaker SDK
# alone took 4-12 s to import, so a typo cost that much before it was refused.
HEAVY = ("sagemaker", "boto3", "botocore", "torch", "tensorflow")


@pytest.mark.parametrize("argv", [None, ["--help"], ["labs"], ["run", "nosuchlab"], ["run", "data_parallel", "--hosts", "0"],
                                  ["run", "data_parallel", "--dry-run"], ["profile", "parameter_server"],
                                  ["tune", "data_parallel", "--param", "lr=abc"], ["tune", "data_parallel", "--param", "lrr=1"],
                                  ["run", "data_parallel", "--hp", "lr=abc"], ["run", "model_parallel", "--hp", "heads=5"]])
def test_the_command_line_imports_no_heavy_package_to_answer(argv):
    """Importing `workshop.__main__` (argv None), and each of these commands, in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import contextlib, io, sys\n"
            "import workshop.__main__ as cli\n"
            f"argv = {argv!r}\n"
            "if argv is not None:\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "        try:\n"
            "            cli.main(argv)\n"
            "        except SystemExit:\n"
            "            pass\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{argv}: imported {out.stdout.strip()}"


def test_the_sdk_imported_through_the_workshop_builds_no_iri_parser():
    """jsonschema, which the SDK imports, would import rfc3987_syntax (installed here with JupyterLab), whose
    import builds an Earley parser with lark: 4.7 s of the SDK's 6.8 s (workshop/__init__.py)."""
    import importlib.util
    import subprocess
    import sys

    assert importlib.util.find_spec("rfc3987_syntax") is not None, "rfc3987_syntax is not installed: nothing to check"
    code = ("import sys, workshop\n"
            "from sagemaker.train import ModelTrainer\n"
            "import jsonschema\n"
            "print(sorted(m for m in ('lark', 'rfc3987_syntax', 'sagemaker.core.config.config') if sys.modules.get(m)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['sagemaker.core.config.config']", out.stdout  # the SDK's config checks ran, no lark


def test_tensorflow_finds_no_scikit_learn_for_keras_to_import():
    """Keras 3 imports scikit-learn (its wrappers) whenever it is installed, in every TensorFlow process: each of lab
    1's parameter servers and workers, lab 2's TensorFlow ranks, each notebook kernel that imports TensorFlow paid
    0.5-0.7 s of CPU for it. Nothing here uses it: mlxtend, which requires it, is installed without its requirements
    (requirements-no-deps.txt), and `make setup` removes it from a .venv made before."""
    import importlib.util

    assert importlib.util.find_spec("sklearn") is None, (
        "scikit-learn is installed in this environment: run `make setup` (it removes it), or "
        "`pip uninstall scikit-learn`")

    def pins(name: str) -> list[str]:
        return [line for line in (REPO_ROOT / name).read_text().splitlines() if line.startswith("mlxtend")]

    assert pins("requirements-no-deps.txt") == ["mlxtend==0.25.0"] and pins("requirements.txt") == []


# ----------------------------------------------------------------------------- the labs' scripts

# A lab's entry script reads top-down as its lesson (issue 26): main(), the model and the lines that make it
# distributed; what serves other chapters (restarts, profiling, argument checks, the SageMaker contract's
# helpers) lives in modules beside it in `code/`. Lines as `wc -l` counts them; None: no budget.
SCRIPT_LINES = 250
SCRIPT_LINES_EXCEPT: dict[str, int | None] = {
    "3_data_parallel/code/train.py": 265,  # its loop shows gradient accumulation too (--grad-accum, no_sync)
    "1_parameter_server/code/train.py": 255,  # its step counts each gradient's staleness too
    "4_model_parallel/code/train.py": 350,  # FSDP, activation checkpointing and offloading, SMP v2: more to show
}


def lab_scripts() -> list[str]:
    """Every program in a lab's `code/` folder (`if __name__ == "__main__":`), not the modules it imports."""
    return sorted(p.relative_to(REPO_ROOT).as_posix() for p in REPO_ROOT.glob("[0-9]_*/code/*.py")
                  if '__name__ == "__main__"' in p.read_text())


def test_the_lab_scripts_are_found():
    scripts = lab_scripts()
    assert "3_data_parallel/code/train.py" in scripts and "2_horovod/code/train_tensorflow.py" in scripts
    assert not any(path.endswith(("contract.py", "arguments.py", "fault_tolerance.py")) for path in scripts)
    assert set(SCRIPT_LINES_EXCEPT) <= set(scripts), "a budget for a script that does not exist"


@pytest.mark.parametrize("path", lab_scripts())
def test_each_lab_script_is_within_its_line_budget(path):
    budget = SCRIPT_LINES_EXCEPT.get(path, SCRIPT_LINES)
    if budget is None:
        pytest.skip(f"{path} has no line budget")
    lines = (REPO_ROOT / path).read_text().count("\n")
    assert lines <= budget, (
        f"{path} is {lines} lines, over its budget of {budget}: move what is not its lesson (fault tolerance, "
        "profiling, argument checks, the contract's helpers) into a module beside it in code/, and import it "
        "from there at the top")


def _parser_shape(parser) -> list[tuple]:
    return [(tuple(a.option_strings), a.dest, getattr(a.type, "__name__", repr(a.type)), repr(a.default),
             repr(a.choices), a.nargs) for a in parser._actions]


@pytest.mark.parametrize("key", ["parameter_server", "horovod_pytorch", "horovod_tensorflow", "data_parallel", "model_parallel"])
def test_a_labs_parser_read_without_its_framework_is_the_scripts_own(key):
    """`Lab.script_parser` builds the parser from the script's standard-library definitions and those of
    the modules beside it (a refusal then answers without `import torch`): the same flags, types, defaults
    and choices as the imported script's, and nothing of the framework imported on the way."""
    import subprocess
    import sys

    from workshop.labs import LABS
    from workshop.spec import load_definitions

    lab = LABS[key]
    code = (f"import sys\nfrom workshop.spec import load_definitions\n"
            f"load_definitions({str(lab.entry_path)!r}).build_parser()\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr[-2000:])
    assert _parser_shape(load_definitions(lab.entry_path).build_parser()) == _parser_shape(lab.load_script().build_parser())
