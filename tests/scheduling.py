"""How `make test` spreads the suite over its workers (pytest-xdist, `-n 3 --dist loadgroup`), and the
record of what each test cost that it plans with.

The suite is CPU-bound on the 2 cores CI has, but unevenly so: some tests mostly compute (a notebook's
runs, a benchmark), others mostly wait (a host that starts minutes after the others, a rendezvous or
collective timeout, the fake SageMaker's polls, a stopped rank). Three workers on 2 cores keep both
cores busy only when one of them is waiting: three computing tests share 2 cores (and cost more CPU
for it: contention), and two waiting at once leave a core idle. In the order the tests are collected
in, the waiting ones come in clusters (whole files of them), so on CI a core stood idle for minutes.

`CostScheduling` plans with `tests/costs.json`, each slow test's wall and CPU seconds measured in one
whole run (`make test-costs` writes it again; a test it does not know counts as a short one that
computes). The longest units go first (a unit that starts last and runs long keeps its worker busy
while the others have nothing left); with more workers than cores, a worker that needs work takes the
longest unit that waits while the others compute on every core, and the longest that computes while
the workers beyond the cores' count all wait. A stale record can only make the plan worse, never a
test fail: every test still runs, each notebook's cells in order on one worker."""
from __future__ import annotations

import contextlib
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import pytest

COSTS_FILE = Path(__file__).with_name("costs.json")
# A test that took less than this (wall seconds) is not recorded: it counts as `UNKNOWN`.
RECORD_AT_LEAST_S = 2.0
UNKNOWN = (0.5, 0.5)  # wall, CPU seconds
# A unit waits, rather than computes, when it takes at least WAITING_MIN_S and its CPU is under
# WAITING_CPU_SHARE of its wall time (both as measured under the suite's own load).
WAITING_MIN_S = 10.0
WAITING_CPU_SHARE = 0.4


def load_costs(path: Path = COSTS_FILE) -> dict[str, tuple[float, float]]:
    """{node id: (wall s, CPU s)} from a costs file; empty where there is none or it is unreadable."""
    try:
        tests = json.loads(path.read_text())["tests"]
        return {nodeid: (float(wall), float(cpu)) for nodeid, (wall, cpu) in tests.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def unit_cost(nodeids: Any, costs: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """A work unit's (wall, CPU) seconds: the sum of its tests'."""
    wall = cpu = 0.0
    for nodeid in nodeids:
        w, c = costs.get(nodeid, UNKNOWN)
        wall += w
        cpu += c
    return wall, cpu


def waits(cost: tuple[float, float]) -> bool:
    """Whether a unit of this (wall, CPU) mostly waits."""
    wall, cpu = cost
    return wall >= WAITING_MIN_S and cpu < WAITING_CPU_SHARE * wall


def make_scheduler(config: Any, log: Any, split_scope: Any, cores: int | None = None,
                   costs: dict[str, tuple[float, float]] | None = None) -> Any:
    """The xdist scheduler described above. `split_scope(nodeid)` names the unit a test belongs to (its
    own node id for a test alone)."""
    from xdist.scheduler import LoadScopeScheduling

    cost_of = load_costs() if costs is None else costs
    core_count = cores or len(os.sched_getaffinity(0))

    class CostScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return split_scope(nodeid)

        def _elsewhere(self, node: Any) -> tuple[int, int]:
            """How many other workers are on a unit that computes now, and how many on one that
            waits (the first unit each has not finished)."""
            computing = waiting = 0
            for other, work in self.assigned_work.items():
                if other is node:
                    continue
                current = next((scope for scope, tests in work.items() if not all(tests.values())), None)
                if current is not None:
                    if waits(self._costs[current]):
                        waiting += 1
                    else:
                        computing += 1
            return computing, waiting

        def _assign_work_unit(self, node: Any) -> None:
            # The longest unit left (the queue's order, built in `schedule`), except: with more workers
            # than cores, a worker takes the longest unit that waits while the others compute on every
            # core, and the longest that computes while the workers beyond the cores' count all wait.
            spare = len(self.nodes) - core_count
            want = None
            if spare > 0:
                computing, waiting = self._elsewhere(node)
                if computing >= core_count:
                    want = True
                elif waiting >= spare:
                    want = False
            if want is not None:
                pick = next((scope for scope in self.workqueue if waits(self._costs[scope]) == want), None)
                if pick is not None:
                    self.workqueue.move_to_end(pick, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            # Give a worker its next unit when it has one test left (xdist's default: two), so that the
            # choice above sees what the other workers are running now, not what they will in two tests.
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

        def schedule(self) -> None:
            """The base class's, with the work queue longest first (wall seconds; ties in the order
            collected)."""
            assert self.collection_is_completed
            if self.collection is not None or not self._check_nodes_have_same_collection():
                super().schedule()  # a rescheduling, or the base's report of differing collections
                return
            self.collection = list(next(iter(self.registered_collections.values())))
            if not self.collection:
                return
            units: dict[str, dict[str, bool]] = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            self._costs = {scope: unit_cost(tests, cost_of) for scope, tests in units.items()}
            for scope in sorted(units, key=lambda scope: -self._costs[scope][0]):  # sorted() is stable
                self.workqueue[scope] = units[scope]
            for _ in range(len(self.nodes) - len(self.workqueue)):  # more workers than units
                unused, _assigned = self.assigned_work.popitem()
                unused.shutdown()
            for node in self.nodes:
                self._assign_work_unit(node)
            for node in self.nodes:  # a worker starts its first test once it holds a second one
                self._reschedule(node)
            if not self.workqueue:
                for node in self.nodes:
                    node.shutdown()

    return CostScheduling(config, log)


# --------------------------------------------------------------------------- recording what tests cost


def format_costs(tests: dict[str, list[float]]) -> str:
    """The costs file: JSON, one test a line (so that a new record's diff reads test by test)."""
    lines = [f"  {json.dumps(nodeid)}: [{wall:.1f}, {cpu:.1f}]" for nodeid, (wall, cpu) in sorted(tests.items())]
    about = ("each slow test's wall and CPU seconds in one whole run (make test-costs): what "
             "tests/scheduling.py plans the workers' order with")
    return (f'{{"about": {json.dumps(about)},\n "cores": {len(os.sched_getaffinity(0))},\n "tests": {{\n'
            + ",\n".join(lines) + "\n }\n}\n")


CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting, where the machine has it


class CgroupClock:
    """The CPU seconds of every process started from this one (its threads included) since it
    joined its own cgroup v1 `cpuacct` group: also processes that outlived their parent (a test
    that SIGKILLs a command leaves its ranks to be reaped by init, and no rusage counts them).
    `CgroupClock.open(name)` returns None where there is no such group to make (not root, no v1)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def open(cls, name: str) -> CgroupClock | None:
        folder = CPUACCT / "workshop-test-costs" / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.parent.iterdir():  # groups an earlier run left (its last processes ended after it)
                if stale.is_dir() and stale != folder:
                    with contextlib.suppress(OSError):  # a group still in use is busy: it stays
                        stale.rmdir()
            (folder / "cgroup.procs").write_text(str(os.getpid()))
            clock = cls(folder)
            clock.seconds()
        except OSError:
            return None
        return clock

    def seconds(self) -> float:
        return int((self.folder / "cpuacct.usage").read_text()) / 1e9

    def close(self) -> None:
        """Back to the machine's group; the group goes once no process is left in it."""
        try:
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            self.folder.rmdir()
            self.folder.parent.rmdir()  # the last one out
        except OSError:
            pass


def _cpu_seconds() -> float:
    """Without a CgroupClock: this process's CPU seconds and its descendants', those reaped and
    those still running (not those that outlived their parent)."""
    import psutil

    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


class CostRecorder:
    """`pytest --record-costs FILE` (`make test-costs`): each test's wall and CPU seconds (its
    processes' included) and when it ended, in each worker's own file (in FILE.parts/, kept to read the
    plan back), then, in the process that started the run, FILE: the tests that took at least
    RECORD_AT_LEAST_S, as `load_costs` reads them."""

    def __init__(self, path: Path, worker: str | None, cgroup: bool = True) -> None:
        self.path = path
        self.parts = path.with_name(path.name + ".parts")
        self.worker = worker
        self.clock = CgroupClock.open(f"{os.getpid()}-{worker or 'main'}") if cgroup else None
        self.cpu_seconds = self.clock.seconds if self.clock is not None else _cpu_seconds

    def pytest_sessionstart(self, session: Any) -> None:
        if self.worker is None:  # the run's own process: a fresh record
            import shutil

            shutil.rmtree(self.parts, ignore_errors=True)
            self.parts.mkdir(parents=True)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
        wall, cpu = time.monotonic(), self.cpu_seconds()
        yield
        wall, cpu = time.monotonic() - wall, self.cpu_seconds() - cpu
        self.parts.mkdir(parents=True, exist_ok=True)
        with open(self.parts / f"{self.worker or 'main'}.tsv", "a") as part:
            part.write(f"{item.nodeid}\t{wall:.1f}\t{cpu:.1f}\t{time.time():.1f}\n")  # the end: when, to read the plan back

    def pytest_unconfigure(self, config: Any) -> None:
        if self.clock is not None:
            self.clock.close()

    def pytest_sessionfinish(self, session: Any) -> None:
        if self.worker is not None:
            return
        tests: dict[str, list[float]] = {}
        for part in sorted(self.parts.glob("*.tsv")):
            for line in part.read_text().splitlines():
                nodeid, wall, cpu, _end = line.rsplit("\t", 3)
                if float(wall) >= RECORD_AT_LEAST_S:
                    tests[nodeid] = [float(wall), float(cpu)]
        self.path.write_text(format_costs(tests))
