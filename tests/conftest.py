"""Shared fixtures: the MNIST subset once per session, no data downloads, AWS isolated (moto, no
credentials), the guard that keeps training out of the fast tier, and the guard that fails a session
(notebooks included) that changed a tracked file (`pytest_sessionfinish` below).

Test tiers: a test that starts a training process is marked `@pytest.mark.slow`; nothing else is.
`make test-fast` runs `pytest tests -m "not slow"` (no training, no notebooks); `make test` runs
everything, notebooks included. The guard below fails a test that is not marked slow and starts
training anyway, so the tiers cannot drift apart.

Horovod: `make setup` compiles it in the background (workshop/horovod_build.py). Tests that need it
are marked `@pytest.mark.horovod` (lab 2's notebook is, here); they run last, and the first of them
waits for the build, so that the compile overlaps the rest of the suite. A failed build fails each
of them with the build log's end. `--no-horovod-wait` (`make test-fast`) skips them instead while
Horovod is not ready.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workshop import REPO_ROOT, teaching

FIXTURES = Path(__file__).parent / "fixtures"
PROBE_CODE = FIXTURES / "probe"
REGION = "us-east-1"
# Lab 3's training image, the image of the requests the tests build by hand.
LAB3_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch:2.13-cpu-amzn2023-sagemaker"


# The suite runs more workers than cores (Makefile: TEST_WORKERS): a PyTorch rank's OpenMP threads that spin while
# they wait burn the CPU another worker's job needs. Two 1-host lab 3 runs side by side, 2026-11-28: 30.0 CPU-seconds
# with waiting threads asleep against 41.5 spinning, 554 samples/s against 196. No result changes, only scheduling.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# --------------------------------------------------------------------------- requests


def tuning_request(**changes: Any) -> dict[str, Any]:
    """A valid CreateHyperParameterTuningJob request (Grid over lr), with `changes` applied
    ("Config.Key" and "Definition.Key" reach into the config and the definition; None removes)."""
    request: dict[str, Any] = {
        "HyperParameterTuningJobName": "alice-tune-1",
        "HyperParameterTuningJobConfig": {
            "Strategy": "Grid",
            "HyperParameterTuningJobObjective": {"Type": "Maximize", "MetricName": "test_accuracy"},
            "ResourceLimits": {"MaxParallelTrainingJobs": 1},
            "ParameterRanges": {"CategoricalParameterRanges": [{"Name": "lr", "Values": ["0.01", "0.05"]}]},
        },
        "TrainingJobDefinition": {
            "StaticHyperParameters": {"epochs": "1", "sagemaker_program": "train.py",
                                      "sagemaker_submit_directory": "s3://bucket/sourcedir.tar.gz"},
            "AlgorithmSpecification": {"TrainingImage": LAB3_IMAGE, "TrainingInputMode": "File",
                                       "MetricDefinitions": [{"Name": "test_accuracy", "Regex": "test_accuracy=(\\S+)"}]},
            "RoleArn": "arn:aws:iam::123456789012:role/FakeSageMakerTrainingRole",
            "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
            "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
            "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        },
    }
    for key, value in changes.items():
        where, _, field_name = key.rpartition(".")
        target = {"": request, "Config": request["HyperParameterTuningJobConfig"],
                  "Definition": request["TrainingJobDefinition"],
                  "Limits": request["HyperParameterTuningJobConfig"]["ResourceLimits"]}[where]
        if value is None:
            target.pop(field_name, None)
        else:
            target[field_name] = value
    return request


# --------------------------------------------------------------------------- data


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory) -> Path:
    """The 5,000-digit subset as train/test channels (tests never download)."""
    from workshop.datasets.mnist import prepare_mnist

    root = tmp_path_factory.mktemp("mnist")
    prepare_mnist(root, source="subset")
    return root


@pytest.fixture(scope="session")
def channels(mnist_dir) -> dict[str, Path]:
    return {"train": mnist_dir / "train", "test": mnist_dir / "test"}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """Prepared-looking MNIST channels for SageMaker paths that upload but train nothing (tiny arrays)."""
    import numpy as np

    root = tmp_path / "mnist"
    for channel in ("train", "test"):
        (root / channel).mkdir(parents=True)
        np.savez(root / channel / "mnist.npz", images=np.zeros((4, 28, 28), np.uint8), labels=np.arange(4))
    return root


@pytest.fixture(autouse=True)
def _offline_mnist(monkeypatch):
    monkeypatch.setenv("WORKSHOP_MNIST_SOURCE", os.environ.get("WORKSHOP_MNIST_SOURCE", "subset"))


@pytest.fixture(autouse=True)
def _cost_confirmed_only_where_a_test_says_so(monkeypatch):
    """A launch's cost is confirmed by the test itself (confirm_cost=True, --yes), never by a
    WORKSHOP_CONFIRM_COST the person running the tests exported: refusals stay tested."""
    from workshop.cloud.cost import CONFIRM_COST_ENV

    monkeypatch.delenv(CONFIRM_COST_ENV, raising=False)


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`kernel(**env)` starts a Jupyter kernel of this interpreter in the checkout, as a notebook's (interrupt
    mode: signal, as JupyterLab's stop button sends), ready, with `env` added to its environment; returns its
    manager and a started client. Both are shut down after the test."""
    from jupyter_client import KernelManager

    spec = tmp_path / "jupyter" / "kernels" / "workshop-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "workshop (test)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    started = []

    def start(**env: str) -> tuple[Any, Any]:
        km = KernelManager(kernel_name="workshop-test")
        km.start_kernel(cwd=str(REPO_ROOT), env={**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(REPO_ROOT), **env})
        kc = km.client()
        kc.start_channels()
        started.append((km, kc))
        kc.wait_for_ready(timeout=120)
        return km, kc

    yield start
    for km, kc in started:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def repo_path(*parts: str) -> Path:
    return REPO_ROOT.joinpath(*parts)


@pytest.fixture(scope="session", autouse=True)
def _speedups() -> Iterator[None]:
    """Speed only: jsonschema checks each schema once, botocore loaders share the models they parse
    (tests/speedups.py: neither changes a result)."""
    import speedups

    with pytest.MonkeyPatch.context() as mp:
        for target, name, value in speedups.patches():
            mp.setattr(target, name, value)
        yield


# --------------------------------------------------------------------------- AWS, isolated


def isolate_aws(mp: pytest.MonkeyPatch, tmp: Path, user: str) -> None:
    """No credentials, no AWS or SDK config of the person running the tests, not on SageMaker."""
    from workshop.cloud import aws

    for key in list(os.environ):
        if key.startswith(("AWS_", "SAGEMAKER_")):
            mp.delenv(key)
    empty = tmp / "aws-empty"
    empty.write_text("")
    sdk_config = tmp / "sagemaker-config.yaml"
    sdk_config.write_text("SchemaVersion: '1.0'\n")
    mp.setenv("AWS_CONFIG_FILE", str(empty))
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata probe either
    mp.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(sdk_config))
    mp.setenv("SAGEMAKER_ADMIN_CONFIG_OVERRIDE", str(sdk_config))
    mp.delenv(aws.ROLE_ENV, raising=False)
    mp.setenv(aws.USER_ENV, user)
    mp.setattr(aws, "NOTEBOOK_METADATA_FILE", str(tmp / "no-such-metadata.json"))


@contextlib.contextmanager
def strict_moto(mp: pytest.MonkeyPatch, tmp: Path, user: str, region: str = REGION) -> Iterator[Any]:
    """moto with throwaway credentials, and the AWS APIs it lacks (IAM's policy simulator,
    StopTrainingJob) from fake_aws_apis; yields a boto3 session. Nothing of the caller's AWS."""
    import boto3
    import fake_aws_apis
    from moto import mock_aws

    isolate_aws(mp, tmp, user)
    mp.setenv("AWS_ACCESS_KEY_ID", "testing")
    mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    mp.setenv("AWS_DEFAULT_REGION", region)
    fake_aws_apis.install()
    try:
        with mock_aws():
            yield boto3.Session(region_name=region)
    finally:
        fake_aws_apis.uninstall()


@pytest.fixture
def aws_user() -> str:
    """The workshop user (`WORKSHOP_USER`) the AWS fixtures set; a module overrides it by
    defining a fixture of the same name."""
    return "Alice Example"


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, aws_user: str) -> None:
    """`isolate_aws` for one test: no credentials from anywhere, empty AWS and SDK config."""
    isolate_aws(monkeypatch, tmp_path, aws_user)


@pytest.fixture
def moto_session(no_aws: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Plain moto (`mock_aws`) with throwaway credentials and region us-east-1, after `no_aws`;
    yields a boto3 session. (moto alone: IAM's simulator and StopTrainingJob are missing.)"""
    import boto3
    from moto import mock_aws

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        yield boto3.Session(region_name=REGION)


@pytest.fixture
def strict_moto_session(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, aws_user: str) -> Iterator[Any]:
    """`strict_moto` for one test (moto plus fake_aws_apis; the SDK's role validation stays on)."""
    with strict_moto(monkeypatch, tmp_path, aws_user, REGION) as session:
        yield session


def service_quota(name: str, value: float, code: str) -> dict[str, Any]:
    """One entry of Service Quotas' ListServiceQuotas for SageMaker."""
    return {"ServiceCode": "sagemaker", "ServiceName": "Amazon SageMaker", "QuotaCode": code,
            "QuotaName": name, "Value": value, "Unit": "None", "Adjustable": True, "GlobalQuota": False}


def quota_client(quotas: list[dict[str, Any]], region: str = REGION) -> Any:
    """A Service Quotas client answering ListServiceQuotas once with `quotas`, from botocore's
    Stubber (moto 5.2.5 does not implement it; the Stubber checks the shape against the model)."""
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("service-quotas", region_name=region, aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_response("list_service_quotas", {"Quotas": quotas}, {"ServiceCode": "sagemaker"})
    stub.activate()
    return client


# --------------------------------------------------------------------------- test tiers: the guard

SLOW_FIX = "mark it @pytest.mark.slow"
# Launchers, by program name: each starts training ranks.
_LAUNCHERS = {"torchrun", "horovodrun", "mpirun", "mpiexec", "orterun"}
# `python -m MODULE [first argument]`: (module, first argument or None for any).
_TRAINING_MODULES = {
    ("workshop", "run"): "python -m workshop run (a lab on the local cluster)",
    ("workshop", "tune"): "python -m workshop tune (trials on the local cluster)",
    ("workshop.tuning", "trial"): "a trial of a search (a lab on the local cluster)",
    ("workshop.runtime.run_driver", None): "a local-cluster host (process runtime)",
    ("workshop.runtime.hostns", "host"): "a local-cluster host (container runtime)",
    ("torch.distributed.run", None): "torchrun",
    ("torch.distributed.launch", None): "torch.distributed.launch",
    ("horovod.runner.launch", None): "horovodrun",
    ("workshop.launchers.horovod_probe", None): "lab 2's all-reduce probe (horovodrun)",
    ("ipykernel_launcher", None): "a Jupyter kernel (a notebook)",
    ("ipykernel", None): "a Jupyter kernel (a notebook)",
}
# Benchmarks that start no training: bench_cli.py times the command line's answers to --help,
# `labs` and refused input, each of which starts nothing (tests/test_architecture.py checks they
# import no framework).
NO_TRAINING_BENCHMARKS = {"bench_cli.py"}
# Asking a program about itself is not training.
_INFO_FLAGS = {"--help", "-h", "--version", "--check-build"}
# `python -c CODE` that starts the local cluster or the fake SageMaker in the child.
_TRAINING_CODE = re.compile(r"\b(LocalCluster|run_local|run_on_sagemaker|fake_sagemaker)\b")
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?$")


class TrainingInFastTest(RuntimeError):
    """Raised where a test not marked slow starts a training process."""


def training_launch(args: Any, shell: bool = False) -> str | None:
    """What training process the command `args` (as subprocess.Popen takes it) starts, or None."""
    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
        return _shell_launch(text) if shell else _argv_launch([text])
    return _argv_launch([os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args])


def _shell_launch(text: str) -> str | None:
    """Each command of a shell line (split at `;`, `&&`, `|`, ...)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        tokens = text.split()
    command: list[str] = []
    for token in [*tokens, ";"]:
        if token and set(token) <= set("();&|<>"):
            found = _argv_launch(command)
            if found:
                return found
            command = []
        else:
            command.append(token)
    return None


def _argv_launch(argv: list[str]) -> str | None:
    while argv and (argv[0] in ("exec", "env", "nohup") or re.match(r"^\w+=", argv[0])):
        argv = argv[1:]  # `FOO=1 python ...`, `exec python ...`
    if not argv:
        return None
    program, rest = Path(argv[0]).name, argv[1:]
    if _INFO_FLAGS & set(rest):
        return None
    if program in _LAUNCHERS:
        return program
    if program in ("bash", "sh") and "-c" in rest[:-1]:
        return _shell_launch(rest[rest.index("-c") + 1])
    if any(a.endswith("sm_train.sh") for a in argv):
        return "sm_train.sh (a SageMaker host)"
    if not (_PYTHON.match(program) or argv[0] == sys.executable):
        return None
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] not in ("-m", "-c", "-"):
        i += 2 if rest[i] in ("-W", "-X", "--check-hash-based-pycs") else 1  # interpreter options
    if i >= len(rest):
        return None
    if rest[i] == "-c":
        code = rest[i + 1] if i + 1 < len(rest) else ""
        return "python -c with the local cluster or the fake SageMaker" if _TRAINING_CODE.search(code) else None
    if rest[i] == "-m":
        module, first = (rest[i + 1:i + 2] or [""])[0], (rest[i + 2:i + 3] or [None])[0]
        if (module, first) == ("workshop.launchers.horovod_probe", "--in-private-network"):
            return _argv_launch(rest[i + 3:])  # a command run in a private network namespace: that command
        return _TRAINING_MODULES.get((module, first)) or _TRAINING_MODULES.get((module, None))
    script = Path(rest[i])
    if script.name in NO_TRAINING_BENCHMARKS:
        return None
    if re.match(r"(train.*|bench_.*)\.py$", script.name):
        return f"python {script.name}"
    if script.parent.name == "workers" and script.parent.parent.name == "benchmarks":
        return f"a benchmark worker ({script.name})"
    if script.name == "measure.py" and re.match(r"\d_", script.parent.name):
        return f"a lab's measurement grid ({script.parent.name}/measure.py)"
    if script.parent.name == "code" and re.match(r"\d_", script.parent.parent.name):
        return f"a lab script ({script.parent.parent.name}/code/{script.name})"
    return None


@contextlib.contextmanager
def _training_guard(item: pytest.Item) -> Iterator[None]:
    """Around each phase (set-up, call, tear-down) of a test NOT marked slow: starting a training
    process fails the test, with the fix ("mark it @pytest.mark.slow").

    What counts as starting training (checked in this process, where the test runs):

    - the local cluster starting its hosts: `workshop.runtime.supervisor.Supervisor._start`, which
      every `LocalCluster.run` reaches once its checks passed, so `run_local`, the fake
      SageMaker's jobs and lab 4's `measure` too (a run refused by its checks starts nothing and
      stays fast);
    - any `subprocess.Popen` (so `subprocess.run`, `check_output`, psutil.Popen and asyncio's
      subprocesses too) whose command `training_launch` recognises: torchrun, horovodrun,
      mpirun/mpiexec; python running a `train*.py`, a `bench_*.py`, a benchmark worker or a lab's
      `code/` script; `python -m workshop run`, `4_model_parallel/measure.py`, the
      local cluster's host commands (`-m workshop.runtime.run_driver`,
      `-m workshop.runtime.hostns host`), `-m torch.distributed.run`, a Jupyter kernel
      (`-m ipykernel_launcher`: notebooks); `sm_train.sh`; `python -c` code that names
      LocalCluster, run_local, run_on_sagemaker or fake_sagemaker;
    - not: a command that only asks about itself (`--help`, `-h`, `--version`, `--check-build`),
      other subprocesses (`python -m workshop.datasets`, `python -c` probes, bash, compilers),
      nor processes started without subprocess.Popen (multiprocessing, os.fork/os.spawn*).

    Raising alone could be swallowed (`pytest.raises(Exception)`, a job runner that turns errors
    into a failed job), so each attempt is also recorded and the phase fails afterwards anyway.
    A hook wrapper, not an autouse fixture: module- and session-scoped fixtures that train are
    set up before any function-scoped fixture, and are caught here too.
    """
    if item.get_closest_marker("slow"):
        yield
        return
    from workshop.runtime import supervisor

    violations: list[str] = []  # this phase's

    def refuse(what: str) -> None:
        message = (f"{item.nodeid} is not marked slow but starts a training process ({what}): "
                   f"{SLOW_FIX} (see the guard in tests/conftest.py)")
        violations.append(message)
        raise TrainingInFastTest(message)

    real_init = subprocess.Popen.__init__

    def guarded_init(self: subprocess.Popen, args: Any, *a: Any, **kw: Any) -> None:
        what = training_launch(args, shell=bool(kw.get("shell")))
        if what:
            refuse(what)
        real_init(self, args, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "__init__", guarded_init)
        run_class = getattr(supervisor, "Supervisor", None)
        if hasattr(run_class, "_start"):  # if renamed, the Popen check still sees the hosts' commands
            mp.setattr(run_class, "_start", lambda self, *a, **k: refuse("a LocalCluster run starting its hosts"))
        try:
            yield
        except TrainingInFastTest:
            raise
        except BaseException:
            if violations:  # the refusal was swallowed, and something else failed
                pytest.fail("\n".join(violations), pytrace=False)
            raise
    if violations:  # the refusal was swallowed
        pytest.fail("\n".join(violations), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    if item.get_closest_marker("horovod"):
        horovod_ready(item.config)
    with _training_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    with _training_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Any:
    with _training_guard(item):
        return (yield)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Notebooks (nbval's items, `*.ipynb`) run the labs: they are slow; lab 2's needs Horovod. The
    tests that need Horovod come last (in their order), so that its background build overlaps the rest.
    On several workers the single ones still do, but lab 2's notebook is one of the first units (the
    scheduler below): a build still under way keeps that worker waiting while the others go on.
    In each group (without Horovod, with it) the slow tests come before the fast ones: the workers
    take tests in this order, and many small tests at the end even out when each worker finishes (a
    minute-long test taken last keeps one worker busy while the others have nothing left)."""
    for item in items:
        if str(item.path).endswith(".ipynb"):
            item.add_marker(pytest.mark.slow)
            with_solution(item)
            if item.path.parent.name == HOROVOD_LAB_FOLDER:
                item.add_marker(pytest.mark.horovod)
    items[:] = sorted(items, key=lambda item: (item.get_closest_marker("horovod") is not None,
                                               item.get_closest_marker("slow") is None))


def with_solution(item: pytest.Item) -> None:
    """An nbval cell tagged `exercise` runs its solution file instead of its placeholder (workshop/teaching.py):
    the notebooks run with the solutions in place, and each check must pass (WORKSHOP_EXERCISES=solutions,
    which the kernels inherit: `pytest_configure`), so a solution that stops being right fails here."""
    cell = getattr(item, "cell", None)
    if cell is not None:
        solution = teaching.solved_source(item.path, cell)
        if solution is not None:
            cell.source = solution


_SAGEMAKER_MODE_RUN = re.compile(r"^tests/test_notebooks_sagemaker_mode\.py::[^\[]+\[([^/\]]+)/([^/\]]+)\]$")


def notebook_group(nodeid: str) -> str | None:
    """The work unit a test belongs to under pytest-xdist (`make test`: `-n 3 --dist loadgroup`),
    from its node id (all the controller sees of it): a notebook's nbval cells (which must run in
    order in one kernel) together with the same notebook's sagemaker-mode run, since both modes
    share the notebook's folders (the fault-tolerance notebook clears runs/fault-tolerance at its
    start, which the other mode is using). None for every other test: those are spread one by one.

    By node id, not by `xdist_group` marks: pytest-xdist 3.8 groups by appending the mark's name to
    `item._nodeid`, which pytest 9 no longer reads (its node id is `item._id`), so marked cells were
    spread over both workers, each in a fresh kernel."""
    path, _, _ = nodeid.partition("::")
    if path.endswith(".ipynb"):
        notebook = Path(path)
        return f"notebook-{notebook.parent.name}-{notebook.stem}"
    found = _SAGEMAKER_MODE_RUN.match(nodeid)
    return f"notebook-{found[1]}-{found[2]}" if found else None


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; only where xdist is loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` for this suite: `notebook_group`'s units, each on one worker, planned with
    what each test cost in a whole run (tests/scheduling.py: the longest first, and a test that mostly
    waits beside two that compute). While Horovod's background build runs, xdist's order instead
    (most tests first, so the notebooks start at once and the single tests fill in around them; the
    tests that need Horovod last, as collected): a test that needs it waits for the build."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from workshop import horovod_build

    def split_scope(nodeid: str) -> str:
        return notebook_group(nodeid) or nodeid

    if horovod_build.read_status().state == "ready":
        from scheduling import make_scheduler

        return make_scheduler(config, log, split_scope)
    from xdist.scheduler import LoadScopeScheduling

    class NotebookScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return split_scope(nodeid)

    return NotebookScheduling(config, log)


# --------------------------------------------------------------------------- Horovod: its background build

HOROVOD_LAB_FOLDER = "2_horovod"
NO_HOROVOD_WAIT = "--no-horovod-wait"
RECORD_COSTS = "--record-costs"
_HOROVOD_VERDICT = pytest.StashKey[tuple[str, str] | None]()


def pytest_configure(config: pytest.Config) -> None:
    """`--record-costs FILE`: tests/scheduling.py's recorder, in the run's own process and each worker."""
    # Every notebook kernel and check this session starts runs with the solutions in place (`with_solution`).
    os.environ[teaching.STRICT_ENV] = "solutions"
    path = config.getoption(RECORD_COSTS)
    if path:
        from scheduling import CostRecorder

        worker = getattr(config, "workerinput", {}).get("workerid")
        config.pluginmanager.register(CostRecorder(Path(path).resolve(), worker), "cost-recorder")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(NO_HOROVOD_WAIT, action="store_true",
                     help="skip the tests that need Horovod (marked horovod) while it is not ready, instead of "
                          "waiting for its background build (make test-fast)")
    parser.addoption(RECORD_COSTS, metavar="FILE", default=None,
                     help="write each slow test's wall and CPU seconds to FILE (make test-costs: tests/costs.json, "
                          "which `make test` plans its workers' order with)")


def env_without_horovod(root: Path) -> Path:
    """A throwaway venv under `root` that sees this environment's packages (torch, pip, Horovod's
    dependencies) except Horovod: an image, or a fresh set-up, that lacks only Horovod. Returns its
    python. (It does not see the editable `workshop`: put the checkout on PYTHONPATH where needed.)"""
    import importlib.util
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    own = Path(subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip())
    farm = root / "packages"
    farm.mkdir()
    packages = Path(importlib.util.find_spec("torch").origin).parent.parent  # this environment's (or the one it sees)
    for entry in packages.iterdir():
        if not entry.name.lower().startswith("horovod"):
            (farm / entry.name).symlink_to(entry)
    (own / "workshop-env.pth").write_text(f"{farm}\n")
    return python


def horovod_ready(config: pytest.Config) -> None:
    """Before a test marked horovod: once per session, wait for the set-up's background build of
    Horovod (a line every 30 s in the terminal), then skip (with --no-horovod-wait) or fail every
    such test if Horovod is not ready, with the build's status and the end of its log."""
    from workshop import horovod_build

    if _HOROVOD_VERDICT not in config.stash:
        status = horovod_build.read_status()
        if status.state == "building" and not config.getoption(NO_HOROVOD_WAIT):
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            capture = config.pluginmanager.get_plugin("capturemanager")

            def echo(line: str) -> None:
                with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                    if reporter is not None:
                        reporter.write_line(f"[tests that need Horovod wait] {line}")

            status = horovod_build.wait(echo)
        verdict = None
        if status.state != "ready":
            tail = horovod_build.log_tail(Path(status.log), 30) if status.log else ""
            detail = status.line() + (f"\n--- the end of {status.log} ---\n{tail}" if tail.strip() else "")
            verdict = ("skip" if config.getoption(NO_HOROVOD_WAIT) else "fail", detail)
        config.stash[_HOROVOD_VERDICT] = verdict
    verdict = config.stash[_HOROVOD_VERDICT]
    if verdict is not None:
        kind, detail = verdict
        if kind == "skip":
            pytest.skip(f"needs Horovod, which is not ready ({NO_HOROVOD_WAIT}): {detail.splitlines()[0]}")
        pytest.fail(f"needs Horovod, which is not ready:\n{detail}", pytrace=False)


# --------------------------------------------------------------------------- tracked files: the guard

TRACKED_FIX = ("write generated files under runs/ (gitignored) or a test's tmp_path, never over a tracked "
               "file; then `git diff` the files named and `git checkout -- FILE` what the run rewrote")
ALLOW_TRACKED_CHANGES_ENV = "WORKSHOP_ALLOW_TRACKED_CHANGES"
_TRACKED_BEFORE = pytest.StashKey[dict[str, str | None]]()
_TRACKED_CHANGED = pytest.StashKey[list[str]]()


def tracked_files(root: Path) -> list[str] | None:
    """The files git tracks under `root` (`git ls-files -z`, paths relative to root), or None
    when `root` is not in a git checkout (or git is missing)."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return sorted(os.fsdecode(p) for p in proc.stdout.split(b"\0") if p)


def file_hashes(root: Path, paths: list[str]) -> dict[str, str | None]:
    """Each path's content hash as it is on disk now (uncommitted edits included): a link's target,
    a folder (a submodule) as such, None for a file that is not there."""
    import hashlib

    hashes: dict[str, str | None] = {}
    for rel in paths:
        path = root / rel
        try:
            if path.is_symlink():
                hashes[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                hashes[rel] = "folder"
            else:
                hashes[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            hashes[rel] = None
    return hashes


def changed_tracked_files(before: dict[str, str | None], after: dict[str, str | None]) -> list[str]:
    """The paths whose content differs between two `file_hashes` snapshots (changed, deleted or
    created), sorted."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Records every tracked file's content, as it is on disk, for the guard below."""
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: its controller guards
        return
    paths = tracked_files(REPO_ROOT)
    if paths is not None:  # not a git checkout: no guard
        session.config.stash[_TRACKED_BEFORE] = file_hashes(REPO_ROOT, paths)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The guard: a test session (unit tests and nbval's notebook items alike, which run in it) that
    changed the content of a tracked file fails, naming the files and the fix. Running a lab, a
    notebook or a test must never rewrite the repository (lab 4's notebook once rewrote
    images/model_parallel_memory.png); generated files go under runs/ or tmp_path.

    Content is compared with what was on disk when the session started, so edits made before the
    session (committed or not) do not count, and neither do commits or `git add` during it. An edit
    a developer saves to a tracked file *while* the session runs cannot be told apart from one a
    test made, and fails the session too: run the tests again, or set
    WORKSHOP_ALLOW_TRACKED_CHANGES=1 to report the files without failing. Outside a git checkout
    (a source archive) there is nothing to compare and no guard."""
    before = session.config.stash.get(_TRACKED_BEFORE, None)
    if before is None:
        return
    changed = changed_tracked_files(before, file_hashes(REPO_ROOT, list(before)))
    session.config.stash[_TRACKED_CHANGED] = changed
    if changed and not os.environ.get(ALLOW_TRACKED_CHANGES_ENV):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def tracked_files_report(changed: list[str], failing: bool = True) -> str:
    """What the guard prints for the tracked files a session changed."""
    verdict = ("the session fails" if failing else
               f"not failing the session: {ALLOW_TRACKED_CHANGES_ENV} is set")
    return (f"{len(changed)} tracked file(s) changed during this test session ({verdict}):\n"
            + "".join(f"  {p}\n" for p in changed)
            + f"fix: {TRACKED_FIX}. (A file you edited yourself while the tests ran counts too: "
              f"run them again.)")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    changed = config.stash.get(_TRACKED_CHANGED, None)
    if changed:
        terminalreporter.section("tracked files changed", sep="=", red=True, bold=True)
        failing = not os.environ.get(ALLOW_TRACKED_CHANGES_ENV)
        for line in tracked_files_report(changed, failing).splitlines():
            terminalreporter.write_line(line, red=failing, yellow=not failing)
