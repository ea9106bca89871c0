"""What is checked about a script of your own before anything starts: that it and the modules beside it that it
imports compile (a syntax error said once, here, not once per rank), that what it imports and what its requirements
file names are installed in this environment (named, with the command that installs them: nothing is installed for
you), and which framework it uses (for Horovod's extension and the SageMaker image)."""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import sys
from pathlib import Path

from workshop.errors import WorkshopError


def parse_script(path: Path) -> ast.Module:
    """The script's syntax tree; a syntax error is one WorkshopError naming the line (`syntax_error`)."""
    try:
        return ast.parse(path.read_text(encoding="utf-8"), str(path))
    except SyntaxError as exc:
        raise syntax_error(path, exc) from None


def syntax_error(path: Path, exc: SyntaxError) -> WorkshopError:
    where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
    shown = f"\n    {exc.text.rstrip()}" if exc.text else ""
    return WorkshopError(f"{path.name} does not compile ({where}: {exc.msg}):{shown}\n  in {path}",
                         f"correct it; `{Path(sys.executable).name} -m py_compile {shlex.quote(str(path))}` checks it "
                         "without running anything.")


def _imported_files(source_dir: Path, entry: Path) -> list[Path]:
    """The entry and the modules of `source_dir` it imports (at any depth), each once, the entry first."""
    order, todo = [], [entry]
    while todo:
        path = todo.pop(0)
        if path in order or not path.is_file():
            continue
        order.append(path)
        for name, _ in top_level_imports(parse_script(path)):
            local = source_dir / f"{name}.py"
            if local.is_file():
                todo.append(local)
    return order


def top_level_imports(tree: ast.Module) -> list[tuple[str, int]]:
    """(top-level package, line) of each import at a module's top level: not those under `try` (optional
    dependencies) or `if`, which the script expects may fail; relative imports are its own package's."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.module.split(".")[0], node.lineno))
    return found


def check_compiles(source_dir: Path, entry_script: str) -> None:
    """The entry (a .py file) and the modules beside it that it imports compile; else one error, here."""
    entry = source_dir / entry_script
    if entry.suffix != ".py":
        return
    for path in _imported_files(source_dir, entry):
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise syntax_error(path, exc) from None


def check_imports(source_dir: Path, entry_script: str, *, skip: tuple[str, ...] = ()) -> None:
    """What the entry (and its modules in `source_dir`) import at their top level is installed here."""
    entry = source_dir / entry_script
    if entry.suffix != ".py":
        return
    missing = []
    for path in _imported_files(source_dir, entry):
        for name, line in top_level_imports(parse_script(path)):
            if name in sys.stdlib_module_names or name in skip or name == "__future__":
                continue
            if (source_dir / f"{name}.py").is_file() or (source_dir / name).is_dir():
                continue
            if importlib.util.find_spec(name) is None:
                missing.append(f"{name} ({path.name}, line {line})")
    if missing:
        names = [m.split(" ")[0] for m in missing]
        raise WorkshopError(
            f"{entry_script} imports what this environment does not have: {', '.join(missing)}. Every simulated "
            "host runs this environment's Python and packages.",
            f"install it yourself, then run again: `{shlex.join([sys.executable, '-m', 'pip', 'install', *names])}` "
            "(a package's name on PyPI can differ from its import name); for the SageMaker job, list it in "
            "requirements.txt (SourceCode(requirements='requirements.txt')) or use an image that has it.",
        )


def check_requirements(path: Path) -> list[str]:
    """Refuse a requirements file that names packages this environment lacks (named, with the command that
    installs them: the workshop installs nothing into its own environment); returns the lines it could not
    check (options, URLs, other files), for a note."""
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    missing, wanted, unchecked = [], [], []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            unchecked.append(line)  # -r other.txt, -e ., --index-url ..., a URL
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{line} (not installed)")
            wanted.append(line)
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            missing.append(f"{line} ({installed} installed)")
            wanted.append(line)
    if missing:
        raise WorkshopError(
            f"{path.name} names packages this environment lacks: {', '.join(missing)}. On SageMaker the job "
            "installs them from PyPI when it starts; here every simulated host runs this environment, and the "
            "workshop installs nothing into it for you.",
            f"install them yourself, then run again: `{shlex.join([sys.executable, '-m', 'pip', 'install', *wanted])}` "
            f"(or `{shlex.join([sys.executable, '-m', 'pip', 'install', '-r', str(path)])}`).",
        )
    return unchecked


def read_framework(path: Path) -> str:
    """"pytorch" or "tensorflow", from what the script imports (default "pytorch")."""
    names = {name for name, _ in top_level_imports(parse_script(path))} if path.suffix == ".py" else set()
    text = path.read_text(encoding="utf-8", errors="replace")
    if names & {"tensorflow", "keras", "tf_keras"} or re.search(r"horovod\.(tensorflow|keras)", text):
        return "tensorflow"
    return "pytorch"


