"""What a lab is: one `Lab` spec object, plus its folder. The vocabulary every layer shares.

A lab is its top-level folder (`<N>_<name>/`, with `code/` as the SageMaker `source_dir`) and a
`lab.py` in that folder that defines `LAB = Lab(...)` (or `LABS = [...]` when one folder holds
several scripts, as lab 2 does). `workshop.labs` finds them. The spec names:

- the **launcher** (`workshop.launchers`): the one object that gives both runtimes their SDK
  `DistributedConfig` and the SageMaker job what else it needs (checks, channels, set-up jobs);
- the **data source** (`workshop.datasets`): how its channels are prepared locally, where they
  live in S3 and how they get there;
- local defaults (hosts, processes, small hyperparameters) and SageMaker defaults, one
  `SageMakerDefaults` per route (lab 4 has two: plain FSDP and the SMP image);
- the metrics its script prints, and optionally `sagemaker_check`, the lab's own offline check
  of a job plan (e.g. lab 4: no activation offloading on an instance without a GPU).

This module knows no particular lab, launcher or data source; the protocols below say what a
launcher and a data source provide. `CONTRIBUTING.md` walks through adding a lab.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import contextvars
import importlib.util
import io
import json
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Protocol

from workshop import REPO_ROOT
from workshop.errors import WorkshopError

# The key of every job of a script of your own (`workshop.script_mode`): its job names, S3 prefix and tags, which
# the workshop's role and cleanup cover as they cover each lab's (`workshop.labs.job_keys`). No lab may take it.
SCRIPT_KEY = "script"


class Launcher(Protocol):
    """How a lab's processes are started, the same way in both runtimes (see `workshop.launchers`)."""

    name: str

    def local_config(self, lab: Lab, procs_per_host: int | None) -> Any:
        """The SDK `DistributedConfig` the local cluster runs (checks the layout first). A launcher
        with `max_restarts_supported = True` also takes `max_restarts=K` (K > 0)."""

    def sagemaker_config(self, plan: Any) -> Any:
        """The SDK `DistributedConfig` of the SageMaker job for a `workshop.jobs.JobPlan`."""

    def check(self, plan: Any) -> Any:
        """Offline checks of a job plan; returns the plan (with notes added, if any)."""

    def prepare(self, plan: Any, bucket: str, boto: Any) -> tuple[Any, list[Any]]:
        """Once the bucket is known (`boto` None in a dry run: look nothing up): the plan with the
        launcher's input channels and internet needs, and the `workshop.jobs.PrepStep`s to run."""


class Channels(Protocol):
    """Prepared input channels: their folders, and the training set's size for the scripts' checks."""

    @property
    def dirs(self) -> dict[str, Path]: ...

    n_train: int


class DataSource(Protocol):
    """A lab's input data (see `workshop.datasets`)."""

    name: str
    channels: tuple[str, ...]  # the input channels' names, e.g. ("train", "test")
    default_dir: Path

    def prepare(self, directory: str | Path | None = None) -> Channels:
        """Write the channels into `directory` (default: `default_dir`); idempotent."""

    def prepared(self, directory: str | Path | None = None) -> Channels | None:
        """The channels already in `directory`, or None (nothing is written)."""

    def s3_prefix(self, user: str | None = None, key_prefix: str | None = None) -> str:
        """The S3 key prefix of the channels: one copy per user, under the SDK's key prefix."""

    def upload(self, channels: Channels, bucket: str, boto: Any, key_prefix: str | None = None) -> dict[str, str]:
        """Upload the channels once (unchanged files are skipped) under `s3_prefix(key_prefix=...)`;
        channel -> S3 URI."""


@dataclass(frozen=True)
class SageMakerDefaults:
    """How a lab runs on SageMaker (one route of it) unless the caller says otherwise."""

    framework: str  # image family for sagemaker.core.image_uris.retrieve
    framework_version: str
    py_version: str
    instance_type: str
    instance_count: int
    procs_per_host: int | None = None  # None: one per GPU (the launcher's own default)
    max_run_s: int = 3600
    volume_size_gb: int = 30
    container_version: str | None = None  # only the SMP images need it (e.g. "cu124")
    # The only instance types the route can use (empty: any SageMaker training type): plan_job
    # refuses others, and preflight suggests nothing else when the quota is short.
    instance_types: tuple[str, ...] = ()
    route: str = "default"  # the name `route=` / `--route` selects it by
    description: str = ""
    # The fix to show when this route's image is past its end of patch (None: the generic one).
    unsupported_image_fix: str | None = None
    # The script flags this route sets, under the caller's own, in both runtimes (lab 4's deepspeed route: a ZeRO
    # sharding); a local run given the route gets them too (`Lab.route_hyperparameters`).
    hyperparameters: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # A requirements file in the lab's code/ folder that the route's job installs from PyPI when it starts
    # (`SourceCode(requirements=...)`: a framework its image lacks, e.g. DeepSpeed): the job needs the internet.
    requirements: str | None = None


@dataclass(frozen=True)
class NotebookJobs:
    """Training jobs one of the lab's notebooks starts in sagemaker mode, for planning a room of
    attendees (`python -m workshop event preflight`: quotas and the cost bound): `jobs` jobs of
    `instance_count` instances of the route's type, each stopped after `max_run_s`, at most
    `parallel` at once (a search's trials; otherwise one after another). A lab that lists none
    starts its default route's one job."""

    notebook: str  # the notebook's file name, in the lab's folder
    instance_count: int
    max_run_s: int
    jobs: int = 1
    parallel: int = 1
    spot: bool = False  # managed spot training: quotas of its own, billed at most on-demand
    route: str | None = None  # None: the lab's default route


@dataclass(frozen=True)
class Lab:
    key: str  # short name used on the command line
    folder: str  # top-level folder, e.g. "3_data_parallel" (absolute: a folder elsewhere)
    title: str
    strategy: str
    launcher: Launcher
    data: DataSource
    entry_script: str = "train.py"
    local_hosts: int = 2
    local_procs_per_host: int = 1
    # Hyperparameters for the local default run (small and fast; the script's own
    # defaults are the SageMaker-sized ones).
    local_hyperparameters: dict[str, Any] = field(default_factory=dict)
    # The metric the summary table reports, as printed by the script (see workshop.metrics).
    accuracy_metric: str = "test_accuracy"
    # Metrics the script prints (rank 0's lines); SageMaker charts these.
    metrics: tuple[str, ...] = ("train_loss", "test_loss", "test_accuracy", "samples_per_sec")
    sagemaker: SageMakerDefaults | None = None  # the default route
    routes: tuple[SageMakerDefaults, ...] = ()  # other routes, chosen by name
    # The lab's own offline check of a `workshop.jobs.JobPlan` (returns it), after the launcher's.
    sagemaker_check: Callable[[Any], Any] | None = None
    # The lab's own check of a local run's parsed hyperparameters, on this machine, before anything starts (raises
    # WorkshopError; lab 4: DeepSpeed installed for its ZeRO shardings). `workshop.runner.run_local` calls it.
    local_check: Callable[[Any], None] | None = None
    # The script flag whose value 0 means it writes no checkpoint (lab 4: checkpoint-every); a spot job
    # with it at 0 is refused, since an interruption would start it over. None: it always checkpoints.
    checkpoint_flag: str | None = None
    # The script flag that turns on torch.profiler for N steps (one Chrome trace per rank under
    # SM_OUTPUT_DATA_DIR/profile; `workshop.profiling`), and the hyperparameters a profiling run
    # changes (e.g. one epoch, no mid-epoch checkpoints). None: the script cannot be profiled.
    profile_flag: str | None = None
    profile_hyperparameters: dict[str, Any] = field(default_factory=dict)
    # What the lab's notebooks start on SageMaker, when more than the default route's one job.
    notebook_jobs: tuple[NotebookJobs, ...] = ()
    aliases: tuple[str, ...] = ()
    # Names that select this lab together with its siblings in the same folder (lab 2 has a
    # PyTorch and a TensorFlow script): `python -m workshop run 2_horovod` runs both.
    group_aliases: tuple[str, ...] = ()
    # Variables every process of its jobs gets, in both runtimes (`ModelTrainer(environment=...)` on
    # SageMaker, the local cluster's hosts too); the labs set none, a script of your own may (`workshop.script_mode`).
    environment: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def label(self) -> str:
        """The folder, and the script when it is not the usual `train.py` (lab 2 has two)."""
        return self.folder_name if self.entry_script == "train.py" else f"{self.folder_name} ({Path(self.entry_script).stem})"

    @property
    def job_label(self) -> str:
        """What a job's summary calls what it runs (`lab data_parallel: 2 x ml.m5.xlarge ...`)."""
        return f"lab {self.key}"

    @property
    def folder_name(self) -> str:
        return Path(self.folder).name

    @property
    def path(self) -> Path:
        return REPO_ROOT / self.folder

    @property
    def source_dir(self) -> Path:
        """The lab's `code/` folder: its SageMaker `source_dir`, uploaded as is."""
        return self.path / "code"

    @property
    def entry_path(self) -> Path:
        return self.source_dir / self.entry_script

    @property
    def code_folder(self) -> str:
        """The code folder as messages name it: relative to the checkout when it is inside it (`3_data_parallel/code`)."""
        try:
            return self.source_dir.relative_to(REPO_ROOT).as_posix()
        except ValueError:
            return str(self.source_dir)

    def sagemaker_route(self, route: str | None = None) -> SageMakerDefaults:
        """The SageMaker defaults of `route` (None: the default route)."""
        if self.sagemaker is None:
            raise WorkshopError(f"Lab {self.key!r} has no SageMaker settings.", "run it with mode = 'local'.")
        if route is None or route == self.sagemaker.route:
            return self.sagemaker
        for defaults in self.routes:
            if defaults.route == route:
                return defaults
        names = ", ".join(d.route for d in (self.sagemaker, *self.routes))
        raise WorkshopError(f"Lab {self.key!r} has no SageMaker route {route!r}; its routes: {names}.",
                            f"pass route={self.sagemaker.route!r} (the default; CLI: drop --route) or another of those.")

    def route_hyperparameters(self, route: str | None = None) -> dict[str, Any]:
        """The script flags a local run given `route` starts from (under the caller's own): the route's own. A route
        that sets none differs from the default only on SageMaker (its image, its launcher's settings), so a local
        run of it would be the default run: refused, with the fix. None, or the default route: none."""
        if route is None:
            return {}
        defaults = self.sagemaker_route(route)  # an unknown route is refused here, with the lab's routes
        if defaults.hyperparameters or defaults is self.sagemaker:
            return dict(defaults.hyperparameters)
        raise WorkshopError(
            f"Lab {self.key!r}'s {route!r} route differs from its default only on SageMaker"
            + (f" ({defaults.description})" if defaults.description else "") + ": locally it would be the default run.",
            "drop route= (CLI: --route) for the local run, or run the route on SageMaker (CLI: --mode sagemaker).",
        )

    def distributed_config(self, procs_per_host: int | None = None, max_restarts: int = 0) -> Any:
        """The SDK v3 `distributed=` config the local cluster runs for this lab (its launcher's);
        `max_restarts`: restarts of every rank after a failure, where the launcher supports it."""
        if not check_max_restarts(self, max_restarts):
            return self.launcher.local_config(self, procs_per_host)
        return self.launcher.local_config(self, procs_per_host, max_restarts=max_restarts)

    def load_script(self) -> ModuleType:
        """Import the entry script as a module (without running its `main`), with the modules
        beside it in `code/` importable the way they are when it runs as a program."""
        return load_module(self.entry_path, f"_workshop_lab_{self.key}", with_siblings=True)

    def script_parser(self) -> Any:
        """The entry script's own argument parser (its `build_parser()`), read without importing its
        framework where it can be (`load_definitions`): a refusal of a bad value then answers in a
        fraction of a second, not after seconds of `import torch`. A parser that needs more than the
        script's standard-library definitions is built from the script itself, imported."""
        return self._parser_and_source()[0]

    def _parser_and_source(self) -> tuple[Any, Any]:
        """`script_parser()`, and what it was read from: the script's definitions, or the imported script."""
        source: Any = load_definitions(self.entry_path)
        try:
            return source.build_parser(), source
        except (NameError, AttributeError):  # it uses something only the full import defines
            source = self.load_script()
            return source.build_parser(), source

    def validate_hyperparameters(
        self, hyperparameters: Mapping[str, Any], world_size: int = 1, train_samples: int | None = None
    ) -> Any:
        """Parse the hyperparameters with the script's own argument parser.

        The script is the one source of truth for its flags and their types, so a typo
        or a non-numeric value fails here, before any process starts or anything is
        spent, with argparse's message. Scripts may also define `check_args(args,
        world_size)` for checks that depend on the cluster's size.
        """
        # The script's parser and checks, read without its framework where they need none (`script_parser`):
        # a refusal then costs no `import torch`, and a notebook's run starts without seconds of silence.
        parser, script = self._parser_and_source()
        parser.prog = self.entry_script
        argv = hyperparameters_to_argv(hyperparameters)
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                args = parser.parse_args(argv)
        except SystemExit as exc:
            message = stderr.getvalue().strip().splitlines()
            detail = message[-1] if message else f"exit status {exc.code}"
            raise WorkshopError(
                f"Invalid hyperparameters for lab {self.key!r} ({shlex.join(argv)}): {detail}",
                f"see `python {self.code_folder}/{self.entry_script} --help` for every flag and its type.",
            ) from None
        check = getattr(script, "check_args", None)
        if check is not None:
            try:
                try:
                    check(args, world_size, train_samples=train_samples)
                except NameError:  # the check reaches for the framework: run the imported script's own
                    self.load_script().check_args(args, world_size, train_samples=train_samples)
            except ValueError as exc:
                rules, fix = split_fix(str(exc), vars(args))
                raise WorkshopError(
                    f"Invalid hyperparameters for lab {self.key!r}: {rules}",
                    fix or f"change the value it names; `python {self.code_folder}/{self.entry_script} --help` "
                    "lists every flag with its default.",
                ) from None
        return args


def missing_requirements(path: Path) -> list[str]:
    """The pins (`name==version` lines) of the requirements file `path` that this environment does not satisfy, each
    as `name==version (not installed)` or `name==version (X installed)`; [] when all are met. Other lines (comments,
    ranges) are not checked."""
    from importlib import metadata

    missing = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        name, sep, pinned = line.split("#")[0].strip().partition("==")
        if not sep or not name:
            continue
        try:
            installed = metadata.version(name.split("[")[0])
        except metadata.PackageNotFoundError:
            missing.append(f"{name}=={pinned} (not installed)")
            continue
        if installed != pinned:
            missing.append(f"{name}=={pinned} ({installed} installed)")
    return missing


def check_max_restarts(lab: Lab, max_restarts: int) -> int:
    """A restart budget the lab's launcher can honour (returned), or a WorkshopError with the fix."""
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise WorkshopError(f"max_restarts must be a whole number, 0 or more, got {max_restarts!r}.",
                            "pass --max-restarts 1 (one restart of every rank after a failure), or 0 (none).")
    if max_restarts and not getattr(lab.launcher, "max_restarts_supported", False):
        raise WorkshopError(
            f"Lab {lab.key!r} ({lab.launcher.name} launcher) cannot restart its processes after a failure.",
            "drop --max-restarts: the torchrun labs (data_parallel, model_parallel) support it.",
        )
    return max_restarts


# How the hyperparameters being checked were given on the command line, where not as `--hp KEY=VALUE`:
# set by the commands that take them otherwise (`given_as`), read by `split_fix`. A context variable,
# not a parameter, because the checks run deep under each command (the local run, the job plan, the
# tuning plan) and only the command knows which of its flags a value came from.
_GIVEN_AS: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar("workshop_given_as", default=())


@contextlib.contextmanager
def given_as(spellings: Mapping[str, str]) -> Iterator[None]:
    """Within the block, a fix that names one of these hyperparameters says how it is written with the flag
    the user used (`{"lr": "--param lr=A,B,..."}`, `{"profile-steps": "--steps N"}`), not `--hp KEY=VALUE`."""
    token = _GIVEN_AS.set((*_GIVEN_AS.get(), *spellings.items()))
    try:
        yield
    finally:
        _GIVEN_AS.reset(token)


def split_fix(text: str, hyperparameters: Mapping[str, Any]) -> tuple[str, str | None]:
    """A script's check message -> (the broken rules, the fix or None).

    The scripts' `check_args` convention: the rules, then " Fix: " and what to do about each,
    in the script's own flags (it also runs alone, on SageMaker). The fix then says once how the
    first flag it names is written on the workshop's command line: `--hp KEY=VALUE`, or the flag
    that gave it (`given_as`). `hyperparameters`: the script's parsed arguments, which tell its
    flags from anything else the fix names.
    """
    rules, sep, fix = text.rpartition(" Fix: ")
    if not sep:
        return text, None
    flags = [f for f in re.findall(r"--([a-z][a-z0-9_-]*)", fix) if f.replace("-", "_") in hyperparameters]
    if flags:
        spelled = dict(_GIVEN_AS.get()).get(flags[0], f"--hp {flags[0]}=VALUE")
        fix = f"{fix.rstrip('.')}. On the command line: {spelled}."
    return rules.rstrip(". "), fix


def load_module(path: Path, name: str, with_siblings: bool = False) -> ModuleType:
    """Execute the Python file `path` as a module called `name` (not added to `sys.modules`): a
    lab's script or spec, or a driver that ships on its own, read without being installed.

    `with_siblings`: the modules in `path`'s folder are importable by their plain names while it
    runs (a lab's script imports its `code/` folder's helpers so), and are then forgotten again:
    two labs may each have a `fault_tolerance.py`, and neither may shadow the other's.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if not with_siblings:
        spec.loader.exec_module(module)
        return module
    folder = str(Path(path).resolve().parent)
    siblings = {p.stem for p in Path(folder).glob("*.py")}
    saved = {n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] in siblings}
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
        for n in [n for n in sys.modules if n.split(".")[0] in siblings]:
            del sys.modules[n]
        sys.modules.update(saved)
    return module


# The top-level statements `load_definitions` runs: imports, definitions and plain assignments.
_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def load_definitions(path: Path) -> SimpleNamespace:
    """The Python file `path`'s top-level definitions, without what it imports from outside the
    standard library (a lab script's framework: seconds to import) and without running anything else.

    Each top-level import of a standard-library module, function, class and plain assignment is run on
    its own (with postponed annotations, so a signature that names `torch.Tensor` costs nothing); one
    that needs what was left out (a class `Net(nn.Module)`, `DEVICE = torch.device(...)`) is left out
    too. Functions that only use the rest (a script's `build_parser`) work; one that reaches for what
    was left out raises NameError when called, and the caller imports the file instead (`load_module`).
    """
    return _definitions(Path(path), {})


def _definitions(path: Path, loaded: dict[str, SimpleNamespace]) -> SimpleNamespace:
    """`load_definitions` of `path`; a module beside it (a lab's `arguments.py`, `contract.py`) that it
    imports is read the same way, once (`loaded`: stem -> its definitions)."""
    source = path.read_text(encoding="utf-8")
    names = SimpleNamespace(__name__=f"_workshop_definitions_{path.stem}", __file__=str(path))
    loaded[path.stem] = names
    namespace = vars(names)
    flags = __future__.annotations.compiler_flag
    beside = {p.stem: p for p in path.parent.glob("*.py")}
    for node in ast.parse(source, str(path)).body:
        if not isinstance(node, _DEFINITIONS):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if node.__class__ is ast.ImportFrom and node.level:  # relative: the script's own package
                continue
            if node.__class__ is ast.ImportFrom and node.module in beside:  # a module beside it: its definitions
                module = loaded.get(node.module) or _definitions(beside[node.module], loaded)
                for alias in node.names:
                    if hasattr(module, alias.name):
                        namespace[alias.asname or alias.name] = getattr(module, alias.name)
                continue
            if isinstance(node, ast.Import) and all(m in beside for m in modules):
                for alias in node.names:
                    namespace[alias.asname or alias.name] = loaded.get(alias.name) or _definitions(beside[alias.name], loaded)
                continue
            if not all(m.split(".")[0] in sys.stdlib_module_names for m in modules):
                continue
        code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec", flags=flags, dont_inherit=True)
        try:
            exec(code, namespace)  # noqa: S102 - the lab's own file, which the caller would import anyway
        except Exception:  # noqa: BLE001 - it needs what was left out: so is it
            continue
    return names


def hyperparameters_to_argv(hyperparameters: Mapping[str, Any]) -> list[str]:
    """`{"epochs": 3}` -> `["--epochs", "3"]`, the way SDK v3's drivers pass them.

    Strings pass as they are and everything else as JSON (SDK v3:
    `container_drivers/common/utils.py: hyperparameters_to_cli_args`).
    """
    argv: list[str] = []
    for key, value in hyperparameters.items():
        argv += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return argv
