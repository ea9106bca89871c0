"""The test tiers' guard (tests/conftest.py): a test not marked slow cannot start training.

These tests start nothing: each launch below is refused before a process exists.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest
import pytest
from conftest import PROBE_CODE, TrainingInFastTest, training_launch

from workshop import REPO_ROOT

PY = sys.executable
BIN = Path(PY).parent


def _item(slow: bool = False) -> SimpleNamespace:
    """What the guard reads of a test item."""
    return SimpleNamespace(nodeid="tests/test_example.py::test_example",
                           get_closest_marker=lambda name: object() if slow and name == "slow" else None)


@pytest.mark.parametrize(("command", "shell"), [
    ([str(BIN / "torchrun"), "--nproc-per-node", "2", "train.py"], False),
    (["horovodrun", "--gloo", "-np", "2", PY, "train_pytorch.py"], False),
    (["mpirun", "-np", "2", "python", "x.py"], False),
    ([PY, "3_data_parallel/code/train.py", "--epochs", "1"], False),
    ([PY, "-u", "tests/fixtures/probe/train.py"], False),
    ([PY, "4_model_parallel/code/tensor_parallel.py"], False),
    ([PY, "benchmarks/bench_allreduce.py", "--ranks", "2"], False),
    ([PY, "benchmarks/workers/cnn_worker.py"], False),
    ([PY, "-m", "workshop", "run", "3_data_parallel"], False),
    ([PY, "4_model_parallel/measure.py"], False),
    ([PY, "-m", "workshop.runtime.run_driver", "/tmp/driver.py"], False),
    ([PY, "-m", "workshop.runtime.hostns", "host", "/tmp/algo-1.json"], False),
    ([PY, "-m", "torch.distributed.run", "--standalone", "x.py"], False),
    ([PY, "-m", "ipykernel_launcher", "-f", "kernel.json"], False),
    ([PY, "-c", "from workshop.runtime.local_cluster import LocalCluster; LocalCluster('.').run()"], False),
    (["bash", "/opt/ml/input/data/sm_drivers/sm_train.sh"], False),
    ("torchrun --standalone train.py", True),
    (["bash", "-c", "cd code && python train.py"], False),
    ([PY, "-m", "workshop.launchers.horovod_probe", "--ranks", "2"], False),
    ([PY, "-m", "workshop.launchers.horovod_probe", "--in-private-network", "horovodrun", "-np", "2", "x"], False),
])
def test_training_launches_are_recognised(command, shell: bool) -> None:
    assert training_launch(command, shell=shell)


@pytest.mark.parametrize("command", [
    [PY, "3_data_parallel/code/train.py", "--help"],
    ["horovodrun", "--check-build"],
    [PY, "benchmarks/bench_runtime.py", "--help"],
    [PY, "benchmarks/planner_validation.py", "--out", "x.md"],
    [PY, "-m", "workshop", "labs"],
    [PY, "-m", "workshop.datasets", "mnist", "data"],
    [PY, "-m", "workshop.runtime.hostns", "probe"],
    [PY, "-m", "workshop.runtime.hostns", "hold"],
    [PY, "-m", "compileall", "-q", "1_parameter_server/code"],
    [PY, "-c", "import time; time.sleep(1)"],
    [PY, "-m", "workshop.launchers.horovod_probe", "--in-private-network", PY, "-c", "print('ok')"],
    ["bash", "-c", "set -e; source env; printf %s x"],
    ["git", "status"],
    "python3 -m pip install wheel.whl",
])
def test_other_commands_are_not_training(command) -> None:
    assert training_launch(command) is None


def test_a_launch_in_a_test_not_marked_slow_fails_it_with_the_fix() -> None:
    with pytest.raises(TrainingInFastTest, match=r"test_example is not marked slow .*torchrun.*mark it @pytest\.mark\.slow"):
        with conftest._training_guard(_item()):
            subprocess.run([str(BIN / "torchrun"), "--standalone", "train.py"], check=False)


def test_a_swallowed_refusal_still_fails_the_test() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"mark it @pytest\.mark\.slow"):
        with conftest._training_guard(_item()):
            with contextlib.suppress(Exception):
                subprocess.Popen([PY, "-m", "workshop", "run", "3_data_parallel"])


def test_a_local_cluster_run_is_stopped_before_its_hosts_start(tmp_path: Path, channels) -> None:
    from workshop.runtime.local_cluster import LocalCluster

    cluster = LocalCluster(PROBE_CODE, "train.py", runtime="process", workdir=tmp_path / "run", echo=False)
    with pytest.raises(TrainingInFastTest, match="LocalCluster|local-cluster host"):
        with conftest._training_guard(_item()):
            cluster.run({}, channels)


def test_slow_tests_and_other_commands_pass_the_guard() -> None:
    with conftest._training_guard(_item(slow=True)):
        assert training_launch([str(BIN / "torchrun"), "x.py"])  # a slow test may; nothing started here
    with conftest._training_guard(_item()):
        proc = subprocess.run([PY, "-c", "print('ok')"], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "ok"


class _Item(SimpleNamespace):
    """What pytest_collection_modifyitems reads of a collected item."""

    def add_marker(self, mark) -> None:
        self.marks.append(mark)

    def get_closest_marker(self, name: str):
        return next((m for m in self.marks if m.name == name), None)


def test_notebooks_are_marked_slow_at_collection_and_horovod_runs_last_slow_tests_first() -> None:
    items = [_Item(path=Path(name), marks=list(marks)) for name, marks in (
        ("1_parameter_server/lab.ipynb", []), ("2_horovod/horovod.ipynb", []), ("tests/test_hvd.py", [pytest.mark.horovod.mark]),
        ("tests/test_x.py", []), ("tests/test_y.py", [pytest.mark.slow.mark]))]
    conftest.pytest_collection_modifyitems(None, items)
    marks = {str(item.path): [m.name for m in item.marks] for item in items}
    assert marks == {"1_parameter_server/lab.ipynb": ["slow"],
                     "2_horovod/horovod.ipynb": ["slow", "horovod"],
                     "tests/test_hvd.py": ["horovod"], "tests/test_x.py": [], "tests/test_y.py": ["slow"]}
    # What needs Horovod runs last (its background build overlaps the rest); in each group the slow tests
    # come first, each kind in its order.
    assert [str(item.path) for item in items] == [
        "1_parameter_server/lab.ipynb", "tests/test_y.py", "tests/test_x.py", "2_horovod/horovod.ipynb",
        "tests/test_hvd.py"]


def test_a_notebooks_cells_and_its_sagemaker_mode_run_are_one_work_unit() -> None:
    """Under pytest-xdist (`make test`: -n 2 --dist loadgroup) nbval's cells of one notebook must run
    in order in one kernel, and the notebook's sagemaker-mode run shares its folders: one unit for all
    of them, another for each other notebook, and none for the other tests (spread one by one). The
    sagemaker-mode runs' node ids are the ones pytest collects here."""
    ids = subprocess.run([PY, "-m", "pytest", "tests/test_notebooks_sagemaker_mode.py", "--collect-only", "-q",
                          "-p", "no:cacheprovider"], cwd=conftest.REPO_ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    runs = [i for i in ids if i.startswith("tests/test_notebooks_sagemaker_mode.py::") and "[" in i]
    assert {conftest.notebook_group(i) for i in runs} == {
        f"notebook-{p.parent.name}-{p.stem}" for p in conftest.REPO_ROOT.glob("[0-9]_*/*.ipynb")}
    ft = "3_data_parallel/fault_tolerance.ipynb"
    assert [conftest.notebook_group(i) for i in (f"{ft}::Cell 0", f"{ft}::Cell 12",
                                                  "3_data_parallel/data_parallel.ipynb::Cell 3")] == [
        "notebook-3_data_parallel-fault_tolerance"] * 2 + ["notebook-3_data_parallel-data_parallel"]
    assert conftest.notebook_group(next(i for i in runs if "fault_tolerance" in i)) \
        == "notebook-3_data_parallel-fault_tolerance"
    for other in ("tests/test_fault_tolerance.py::test_x", "tests/test_fault_tolerance.py::test_x[2]",
                  "tests/test_notebooks_sagemaker_mode.py::test_kernel"):
        assert conftest.notebook_group(other) is None


def test_two_workers_run_a_notebooks_cells_in_order_in_one_kernel(tmp_path: Path) -> None:
    """A real 2-worker run: each cell of the probe notebook reads the variable the one before it set,
    so a cell run in the other worker's kernel fails (as every cell after the first did with xdist's
    own `xdist_group` grouping under pytest 9). Other tests run beside it, on either worker."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(f"x{i} = {i}\nimport time; time.sleep(0.5)"
                                                + (f"\nassert x{i - 1} == {i - 1}" if i else "")) for i in range(6)]
    probe = tmp_path / "probe.ipynb"
    nbformat.write(notebook, probe)
    proc = subprocess.run([PY, "-m", "pytest", str(probe), "tests/test_tiers.py::test_training_launches_are_recognised",
                           "--nbval-lax", "--nbval-current-env", "-n", "2", "--dist", "loadgroup", "-v",
                           "-p", "no:cacheprovider", "--timeout=300",
                           # node ids from / (the probe is outside the checkout), with the checkout's settings
                           "--rootdir=/", "-c", "pyproject.toml"],
                          cwd=conftest.REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    cells = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED \S*probe\S*::Cell", proc.stdout)
    assert len(cells) == 6 and len(set(cells)) == 1, proc.stdout[-3000:]


def make_plan(target: str, env: dict[str, str] | None = None) -> str:
    """What `make -n target` would run, each recipe line whole (its backslash continuations joined)."""
    return subprocess.run(["make", "-n", "--no-print-directory", target], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, check=True, env=env).stdout.replace("\\\n", " ")


@pytest.mark.parametrize("target", ["test", "test-fast", "bench"])
def test_make_runs_the_tests_with_bytecode_written_once_away_from_the_sources(target: str, tmp_path: Path) -> None:
    """`make test`, `make test-fast` and `make bench` run with bytecode written into .venv/pycache (Makefile:
    BYTECODE_ENV) even where the machine sets PYTHONDONTWRITEBYTECODE: every process they start then imports
    TensorFlow, the SDK, ... from bytecode, and no lab's code/ folder (a job's source_dir) gains a __pycache__."""
    import os
    import shlex

    plan = make_plan(target)
    runs = [ln for ln in plan.splitlines() if (" -m pytest " if target.startswith("test") else " benchmarks/") in ln]
    # each command line's leading NAME=value words: the environment it runs with
    envs = [dict(w.split("=", 1) for w in itertools.takewhile(lambda w: "=" in w, shlex.split(ln))) for ln in runs]
    assert runs and all(e == envs[0] for e in envs), runs
    env = envs[0]
    assert env.get("PYTHONDONTWRITEBYTECODE") == "" and env.get("PYTHONPYCACHEPREFIX") == str(REPO_ROOT / ".venv" / "pycache"), runs[0]
    (tmp_path / "lesson.py").write_text("x = 1\n")
    subprocess.run([PY, "-c", "import lesson"], cwd=tmp_path, check=True, timeout=60,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **env})
    assert not (tmp_path / "__pycache__").exists()
    prefixed = Path(env["PYTHONPYCACHEPREFIX"] + str(tmp_path))
    assert [p.name for p in prefixed.iterdir()] == [f"lesson.{sys.implementation.cache_tag}.pyc"]


def test_jobs_get_a_bytecode_cache_where_the_machine_writes_none(monkeypatch) -> None:
    """The local cluster's processes (base_process_env: every job's hosts and ranks) write bytecode into the
    environment's cache where the machine sets PYTHONDONTWRITEBYTECODE: lab 1's six TensorFlow processes compiled
    TensorFlow from source at every start (33-68 s to import it on 2 cores, 11-21 s from bytecode). Where bytecode is
    written already, or a cache is set, nothing changes."""
    from workshop.runtime.contract import base_process_env

    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = base_process_env()
    in_venv = sys.prefix != sys.base_prefix
    if in_venv:
        assert env["PYTHONDONTWRITEBYTECODE"] == "" and env["PYTHONPYCACHEPREFIX"] == str(Path(sys.prefix) / "pycache")
    else:  # no environment of the workshop's own to write into: left as the machine has it
        assert env["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in env
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "/elsewhere")
    assert base_process_env()["PYTHONPYCACHEPREFIX"] == "/elsewhere"
    assert base_process_env()["PYTHONDONTWRITEBYTECODE"] == "1"
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "")
    assert "PYTHONPYCACHEPREFIX" not in base_process_env()


@pytest.mark.parametrize("target", ["workshop", "lab"])
@pytest.mark.parametrize("machine_writes_bytecode", [True, False])
def test_an_attendees_runs_write_bytecode_once_where_the_machine_writes_it(target: str, machine_writes_bytecode: bool) -> None:
    """`make workshop` and `make lab` move bytecode into .venv/pycache only where the machine sets
    PYTHONDONTWRITEBYTECODE (it would be compiled at every start otherwise). Where Python writes it beside the
    sources (a notebook instance, most laptops), the set-up and the kernel already did so: a second copy in
    .venv/pycache cost a simulated 5 GiB notebook volume 113 MiB and left it 1,515 MiB free, under the
    1,536 MiB scripts/simulate_notebook_instance.sh requires (1,628 without it, 2026-11-28)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "MAKEFLAGS")}
    if not machine_writes_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    plan = make_plan(target, env)
    runs = [ln for ln in plan.splitlines() if "-m workshop run all" in ln or "/jupyter lab" in ln]
    assert runs, plan[-2000:]
    prefixed = [("PYTHONPYCACHEPREFIX=" in ln) for ln in runs]
    assert prefixed == [not machine_writes_bytecode] * len(runs), runs
