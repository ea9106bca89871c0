"""The order `make test` runs the suite in (tests/scheduling.py), driven through pytest-xdist's own
scheduler interface by a simulation of its workers: each runs the tests it is sent, in order, and
reports each one done."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import notebook_group
from scheduling import CostRecorder, load_costs, make_scheduler, unit_cost, waits


class FakeWorker:
    """What the scheduler sees of a pytest-xdist worker: the indices it is sent, and a shutdown."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[int] = []
        self.done = 0
        self.shutting_down = False
        self.gateway = SimpleNamespace(id=name)

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True

    def __repr__(self) -> str:
        return self.name


def split_scope(nodeid: str) -> str:
    return notebook_group(nodeid) or nodeid


def start(collection: list[str], costs: dict[str, tuple[float, float]], workers: int = 3, cores: int = 2):
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None)
    scheduler = make_scheduler(config, None, split_scope, cores=cores, costs=costs)
    nodes = [FakeWorker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return scheduler, nodes


def finish_next(scheduler, node: FakeWorker, collection: list[str]) -> str:
    """The worker finishes the test it is running (a worker runs one once it holds the next, or
    once it is told to shut down)."""
    index = node.sent[node.done]
    node.done += 1
    scheduler.mark_test_complete(node, index)
    return collection[index]


def running(node: FakeWorker, collection: list[str]) -> str | None:
    return collection[node.sent[node.done]] if node.done < len(node.sent) else None


def run_all(scheduler, nodes: list[FakeWorker], collection: list[str]) -> dict[str, list[str]]:
    """Finish every worker's tests, round by round; returns what each worker ran, in order."""
    ran: dict[str, list[str]] = {node.name: [] for node in nodes}
    while scheduler.workqueue or any(node.done < len(node.sent) for node in nodes):
        progressed = False
        for node in nodes:
            if node.done < len(node.sent):
                ran[node.name].append(finish_next(scheduler, node, collection))
                progressed = True
        assert progressed, "the scheduler left tests unsent"
    return ran


COLLECTION = [
    "tests/test_a.py::test_quick",
    "tests/test_a.py::test_computes_long",
    "tests/test_b.py::test_waits_for_a_late_host",
    "tests/test_b.py::test_waits_for_a_timeout",
    "tests/test_b.py::test_computes",
    "3_data_parallel/data_parallel.ipynb::Cell 0",
    "3_data_parallel/data_parallel.ipynb::Cell 1",
    "tests/test_notebooks_sagemaker_mode.py::test_notebook_runs_in_sagemaker_mode[3_data_parallel/data_parallel]",
    "tests/test_c.py::test_unknown",
]
COSTS = {
    "tests/test_a.py::test_computes_long": (120.0, 115.0),
    "tests/test_b.py::test_waits_for_a_late_host": (250.0, 4.0),
    "tests/test_b.py::test_waits_for_a_timeout": (40.0, 3.0),
    "tests/test_b.py::test_computes": (60.0, 55.0),
    "3_data_parallel/data_parallel.ipynb::Cell 0": (1.0, 1.0),
    "3_data_parallel/data_parallel.ipynb::Cell 1": (200.0, 190.0),
    "tests/test_notebooks_sagemaker_mode.py::test_notebook_runs_in_sagemaker_mode[3_data_parallel/data_parallel]":
        (60.0, 40.0),
}


def test_a_unit_waits_when_its_cpu_is_a_small_share_of_its_wall_time():
    assert waits((250.0, 4.0))
    assert not waits((120.0, 115.0))
    assert not waits((5.0, 0.1))  # too short to plan around
    assert unit_cost(["3_data_parallel/data_parallel.ipynb::Cell 0", "tests/test_c.py::test_unknown"], COSTS) \
        == (1.5, 1.5)  # a test the record does not know counts as a short one


def test_two_workers_compute_the_longest_units_while_the_third_takes_the_waiting_tests():
    scheduler, nodes = start(COLLECTION, COSTS)
    now = [running(node, COLLECTION) for node in nodes]
    # the longest units first: the notebook with its sagemaker-mode run (261 s), the late host (250 s,
    # which waits); then, with one worker waiting already, the longest that computes: two cores busy
    assert now == ["3_data_parallel/data_parallel.ipynb::Cell 0", "tests/test_b.py::test_waits_for_a_late_host",
                   "tests/test_a.py::test_computes_long"]
    ran = run_all(scheduler, nodes, COLLECTION)
    assert sorted(sum(ran.values(), [])) == sorted(COLLECTION)  # every test once
    # a notebook's cells and its sagemaker-mode run, in order, on one worker
    assert ran["gw0"][:3] == COLLECTION[5:8]
    # the other waiting test follows the first on the same worker, before anything that computes
    assert ran["gw1"][:2] == ["tests/test_b.py::test_waits_for_a_late_host", "tests/test_b.py::test_waits_for_a_timeout"]
    # and the worker beside it computes
    assert ran["gw2"][:2] == ["tests/test_a.py::test_computes_long", "tests/test_b.py::test_computes"]


def test_with_as_many_cores_as_workers_every_worker_takes_the_longest_unit_left():
    scheduler, nodes = start(COLLECTION, COSTS, workers=3, cores=4)
    assert [running(node, COLLECTION) for node in nodes] == [
        "3_data_parallel/data_parallel.ipynb::Cell 0", "tests/test_b.py::test_waits_for_a_late_host",
        "tests/test_a.py::test_computes_long"]


def test_without_a_record_the_units_go_in_the_order_collected():
    scheduler, nodes = start(COLLECTION, {}, workers=2, cores=2)
    ran = run_all(scheduler, nodes, COLLECTION)
    assert sorted(sum(ran.values(), [])) == sorted(COLLECTION)
    # the notebook (three tests, each counted as a short one) is the longest unit; the rest in order
    assert ran["gw0"][0] == "3_data_parallel/data_parallel.ipynb::Cell 0"
    assert ran["gw1"][0] == "tests/test_a.py::test_quick"


def test_the_recorder_keeps_the_slow_tests_for_the_scheduler_to_read(tmp_path):
    target = tmp_path / "costs.json"
    main = CostRecorder(target, None, cgroup=False)
    main.pytest_sessionstart(None)
    for worker, nodeid in (("gw0", "tests/test_a.py::test_quick"), ("gw1", "tests/test_b.py::test_computes")):
        recorder = CostRecorder(target, worker, cgroup=False)
        item = SimpleNamespace(nodeid=nodeid)
        hook = recorder.pytest_runtest_protocol(item, None)
        next(hook)
        if nodeid.endswith("computes"):  # 2.1 s of CPU in a process the test starts: the record counts it
            burn = "import time\nend = time.process_time() + 2.1\nwhile time.process_time() < end: pass"
            subprocess.run([sys.executable, "-c", burn], check=True)
        try:
            next(hook)
        except StopIteration:
            pass
    main.pytest_sessionfinish(None)
    recorded = load_costs(target)
    assert list(recorded) == ["tests/test_b.py::test_computes"]  # the quick one is under RECORD_AT_LEAST_S
    wall, cpu = recorded["tests/test_b.py::test_computes"]
    assert cpu >= 2.1 and wall >= cpu
    assert json.loads(target.read_text())["cores"] >= 1
    assert len((tmp_path / "costs.json.parts" / "gw0.tsv").read_text().split("\t")) == 4  # with when it ended


ORPHAN_CHECK = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from scheduling import CgroupClock, _cpu_seconds
stale = None
try:  # a group an earlier run left behind, empty
    stale = CgroupClock.open("stale-%d" % os.getpid()).folder
    (stale.parent.parent / "cgroup.procs").write_text(str(os.getpid()))
except (AttributeError, OSError):
    pass
clock = CgroupClock.open("selftest-%d" % os.getpid())
if clock is None:
    print("no-cgroup")
    sys.exit(0)
assert stale is not None and not stale.exists(), "an empty group of an earlier run was left"
done = sys.argv[2]
burn = "import time\\nend = time.process_time() + 1.0\\nwhile time.process_time() < end: pass\\nopen(%r, 'w').close()" % done
before = clock.seconds(), _cpu_seconds()
# a shell that starts a process in the background and exits: the process outlives its parent
subprocess.run(["sh", "-c", '"$0" -c "$1" &', sys.executable, burn], check=True)
while not os.path.exists(done):
    time.sleep(0.05)
time.sleep(0.2)
print(clock.seconds() - before[0], _cpu_seconds() - before[1])
clock.close()
"""


def test_the_cgroup_clock_counts_a_process_that_outlived_its_parent(tmp_path):
    """Why the recorder measures in a cgroup where it can: a test that kills a command leaves its
    processes to init, and rusage never counts them."""
    out = subprocess.run([sys.executable, "-c", ORPHAN_CHECK, str(Path(__file__).parent), str(tmp_path / "done")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "no-cgroup":
        pytest.skip("no cgroup v1 cpuacct group can be made here (not root, or no v1): the recorder falls back to rusage")
    in_cgroup, by_rusage = map(float, out.stdout.split())
    assert in_cgroup >= 1.0, out.stdout
    assert by_rusage < 0.5, out.stdout


def test_the_suites_record_names_tests_that_exist():
    """A test renamed or removed leaves its line in tests/costs.json planning nothing: `make test-costs`
    writes it again. Most of the record must still name tests of the suite."""
    recorded = load_costs()
    assert len(recorded) > 50
    root = Path(__file__).parent.parent
    files = {nodeid.split("::")[0] for nodeid in recorded}
    missing = sorted(f for f in files if not (root / f).exists())
    assert not missing, f"tests/costs.json names files that are gone ({missing}): run `make test-costs`"
