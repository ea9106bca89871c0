"""Where a training step's time goes, read from `torch.profiler` Chrome/Perfetto traces (one per rank).

No lab knowledge: it reads traces written with `export_chrome_trace` by a script that calls
`prof.step()` once per training step (each step is then one `ProfilerStep#N` span on the training
thread), and splits every rank's steps into four parts that add up to the step exactly:

- **data**: the DataLoader's `__next__` (`enumerate(DataLoader)#..._next__`).
- **communication**: the collectives as the training thread runs them (`c10d::allreduce_` and the
  other `c10d::` ops, DDP's bucket copies `...reducer::...`, `gloo:`/`nccl:` annotations), plus the
  part of its waits for them that every rank had to wait (the straggler's wait: the transfer itself).
  On CPU with gloo the all-reduce runs on gloo's own threads, and the training thread's wait for it
  (DDP's `finalize_backward` waiting on the bucket's future) is recorded as no op at all: it is a gap
  on the training thread that ends where DDP resumes with the result (`aten::as_strided`, a view of
  the bucket, then `...reducer::copy_bucket_to_grad`). A gap followed within RESUME_US by such a
  collective op (not a launch) is therefore counted as a wait. (gloo's own `gloo:all_reduce` spans on
  its threads are not used: their ends run past the point where the training thread has the result.)
  Horovod (PyTorch) all-reduces on its own background thread, which torch.profiler does not record, and
  its backward hooks enqueue each gradient unrecorded; the training thread waits for the results in its
  DistributedOptimizer's step(), a subclass of the optimizer it wraps (same name), so the trace has an
  `Optimizer.step#SGD.step` span around another: before the inner one (the update itself) the wrapper
  waits (no op recorded) and puts each averaged gradient back (`aten::set_`, one per gradient, with its
  shape). Those ops are communication, the time between them a wait (split across ranks as below).
  (A trace is Horovod's when its `distributedInfo` backend starts with "horovod", as lab 2's are.)
- **idle**: waiting for the slowest rank: a rank's wait beyond the least any rank waited in that step.
  The rank that waited least is that step's straggler (everyone else waited for it). This needs no
  common clock across hosts: each rank's waits are durations on its own clock.
- **compute**: the rest (forward, backward, optimizer, and the Python between them).

Machine view (`ProfileReport.machines()`, `.lost_share()`): the labs' traces also say each step's CPU
time of the training thread, the CPUs the rank could use and its machine. Per machine, 1 - (CPU its
ranks' threads used) / (core time it had: min(ranks, cores) x step) is the throughput communication
cost, which is what the side-by-side benchmark measures. With no more ranks than cores it matches the
per-rank communication + idle; with more ranks than cores, a rank's wait is partly another rank's
compute on the same core, and only the machine view says what the waiting cost.

Bytes per step: the elements of each collective's input tensors (`Input Dims`, recorded when the
profiler has `record_shapes=True`; for Horovod the shapes of the gradients its step puts back), 4 bytes
each (fp32 gradients), times the ring algorithm's factor: 2(N-1)/N for an all-reduce (Horovod's too),
(N-1)/N for an all-gather or reduce-scatter (of the whole tensor: a reduce-scatter's input, not its
shard), 1 for a broadcast; on gloo a reduce-scatter is an all-reduce of its input, 2(N-1)/N.

    report = ProfileReport.from_files(["trace-rank0.json", "trace-rank1.json"])
    print(report.table()); report.plot("profile.png")
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workshop.errors import WorkshopError

STEP_PREFIX = "ProfilerStep#"
PARTS = ("compute", "communication", "data", "idle")
_COMM = re.compile(r"^c10d::|^gloo:|^nccl:|reducer::|record_param_comms|all_?reduce|all_?gather|reduce_?scatter"
                   r"|broadcast|barrier", re.IGNORECASE)
_DATA = re.compile(r"DataLoader.*__next__")
_RING = {"allreduce": lambda n: 2 * (n - 1) / n, "all_reduce": lambda n: 2 * (n - 1) / n,
         "allgather": lambda n: (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
BYTES_PER_ELEMENT = 4  # fp32
# A gap on the training thread is a wait for a collective when a collective op starts at most this many
# microseconds after it ends (DDP resumes with a view of the bucket, `aten::as_strided`, then copies it).
RESUME_US = 50.0
OPTIMIZER_STEP = "Optimizer.step#"  # torch.profiler's span of an optimizer's step(): `Optimizer.step#SGD.step`
HOROVOD_RESULT = "aten::set_"  # Horovod's DistributedOptimizer puts each averaged gradient back with it


def is_communication(name: str) -> bool:
    return bool(_COMM.search(name))


def is_resume(name: str) -> bool:
    """A collective op that the training thread runs once a collective is done (DDP's bucket copies, a
    `c10d::wait`), unlike a launch (`c10d::allreduce_`), which a wait does not end in."""
    return is_communication(name) and (not name.startswith("c10d::") or "wait" in name)


def is_data(name: str) -> bool:
    return bool(_DATA.search(name))


@dataclass(frozen=True)
class StepTimes:
    """One rank's step, in seconds: its parts before the cross-rank split of its wait."""

    step: int  # N of ProfilerStep#N
    total: float
    data: float
    comm_ops: float  # the training thread inside collective ops
    wait: float  # the training thread idle until a collective op resumed it
    elements: int  # collective input elements (0 without record_shapes)
    ring_bytes: float  # bytes each rank sends in this step's collectives (ring algorithm)

    @property
    def compute(self) -> float:
        return self.total - self.data - self.comm_ops - self.wait


@dataclass
class RankTrace:
    """What one rank's trace says, step by step."""

    rank: int
    world_size: int
    backend: str
    steps: dict[int, StepTimes]
    path: Path | None = None
    # From the trace's `workshop` entry (the labs' StepProfiler), when it has one: the training thread's
    # CPU seconds per step, the cores the rank could use, and its machine (ranks that share one share cores).
    cpu_s: dict[int, float] = field(default_factory=dict)
    cpus: tuple[int, ...] = ()  # the CPUs the rank could use (its affinity)
    machine: str | None = None


@dataclass(frozen=True)
class RankSummary:
    """One rank's mean step (seconds) split into PARTS, which add up to `step_s`."""

    rank: int
    steps: int
    step_s: float
    compute_s: float
    communication_s: float
    data_s: float
    idle_s: float
    bytes_per_step: float
    straggler_steps: int  # steps in which this rank waited least (everyone waited for it)
    cpu_s: float | None = None  # the training thread's CPU seconds per step, when the trace says

    def part(self, name: str) -> float:
        return getattr(self, f"{name}_s")

    def share(self, name: str) -> float:
        return self.part(name) / self.step_s if self.step_s else 0.0


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(intervals: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """`intervals` less `cut` (both unions)."""
    out = []
    for a, b in intervals:
        pieces = [(a, b)]
        for c, d in cut:
            pieces = [p for x, y in pieces for p in ((x, min(y, c)), (max(x, d), y)) if p[1] > p[0]]
        out += pieces
    return out


def _spans(events: Iterable[Mapping[str, Any]], end: float) -> list[tuple[float, float]]:
    """The union of the events' spans, cut at `end` (the step's end)."""
    return _union((float(e["ts"]), min(end, float(e["ts"]) + float(e["dur"]))) for e in events)


def _elements(event: Mapping[str, Any]) -> int:
    """The elements of the whole tensor a collective works on. Its first input is that tensor (or
    tensor list) for an all-reduce, a broadcast and an all-gather (whose first input is the gathered
    output); a reduce-scatter's first input is this rank's output shard and its second the whole input,
    so for it the larger of the two counts."""
    dims = event.get("args", {}).get("Input Dims") or []

    def size(dim: Any) -> int:
        shapes = dim if dim and isinstance(dim[0], list) else [dim]
        return sum(math.prod(s) for s in shapes if s)

    if "reduce_scatter" in str(event.get("name", "")).lower():
        return max((size(d) for d in dims[:2]), default=0)
    return size(dims[0]) if dims else 0


def _ring_factor(name: str, world_size: int, backend: str = "") -> float:
    """The share of the whole tensor each rank sends in the ring algorithm. gloo has no reduce-scatter
    of its own: PyTorch's gloo backend all-reduces the whole input and keeps its shard, 2(N-1)/N."""
    low = name.lower()
    if "reduce_scatter" in low and backend.startswith("gloo") and world_size > 1:
        return 2 * (world_size - 1) / world_size
    for key, factor in _RING.items():
        if key in low:
            return factor(world_size) if world_size > 1 else 0.0
    return 0.0


def _horovod_waits(ops: list[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """Where Horovod's DistributedOptimizer.step() waits for the all-reduces: from the start of an
    optimizer step's span to the start of the inner one it wraps (the wrapped optimizer's step)."""
    steps = [e for e in ops if str(e["name"]).startswith(OPTIMIZER_STEP)]
    regions = []
    for outer in steps:
        a, b = float(outer["ts"]), float(outer["ts"]) + float(outer["dur"])
        inner = [float(e["ts"]) for e in steps if e is not outer and a <= float(e["ts"])
                 and float(e["ts"]) + float(e["dur"]) <= b]
        if inner:
            regions.append((a, min(inner)))
    return _union(regions)


def load_trace(path: str | Path) -> dict[str, Any]:
    """A Chrome trace file (a dict with `traceEvents`), or a WorkshopError saying what to do."""
    path = Path(path)
    if not path.is_file():
        raise WorkshopError(f"No profiler trace at {path}.",
                            "run the job with profiling on (`python -m workshop profile LAB`, or the script's "
                            "--profile-steps S), and give the folder its traces were written to.")
    try:
        trace = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WorkshopError(f"{path} is not a Chrome trace (JSON): {exc}.",
                            "give the trace-rank<R>.json files torch.profiler's export_chrome_trace wrote; a file "
                            "cut short (a job stopped while writing) cannot be read: profile again.") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise WorkshopError(f"{path} has no traceEvents: not a torch.profiler Chrome trace.",
                            "give the files written by torch.profiler's export_chrome_trace.")
    return trace


def analyze(trace: Mapping[str, Any], rank: int | None = None, path: Path | None = None) -> RankTrace:
    """Split each `ProfilerStep#N` of one rank's trace (see the module's docstring)."""
    info = trace.get("distributedInfo") or {}
    rank = int(info.get("rank", 0)) if rank is None else rank
    world_size = int(info.get("world_size", 1))
    horovod = str(info.get("backend", "")).startswith("horovod")  # as lab 2's script labels its traces
    where = f" ({path})" if path else ""
    spans = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    step_events = [e for e in spans if str(e.get("name", "")).startswith(STEP_PREFIX)]
    if not step_events:
        raise WorkshopError(f"The trace of rank {rank}{where} has no {STEP_PREFIX}N spans: no profiled step.",
                            "profile more steps (each ends with prof.step()); a run that stopped before its "
                            "profiled steps writes none.")
    main = (step_events[0].get("pid"), step_events[0].get("tid"))
    ops = sorted((e for e in spans if (e.get("pid"), e.get("tid")) == main
                  and not str(e.get("name", "")).startswith(STEP_PREFIX)), key=lambda e: float(e["ts"]))
    steps: dict[int, StepTimes] = {}
    for step_event in step_events:
        number = int(re.sub(r"\D", "", step_event["name"][len(STEP_PREFIX):]) or 0)
        t0 = float(step_event["ts"])
        t1 = t0 + float(step_event["dur"])
        inside = [e for e in ops if t0 <= float(e["ts"]) < t1]
        busy = _spans(inside, t1)
        data = _spans((e for e in inside if is_data(e["name"])), t1)
        comm_events = [e for e in inside if is_communication(e["name"])]
        comm = _minus(_spans(comm_events, t1), data)
        # Horovod: in its optimizer's wait, the ops (the averaged gradients put back) are communication,
        # the rest of it a wait; ops that enclose the wait (the wrapper's own span) do not count.
        hvd_waits = _horovod_waits(inside) if horovod else []
        hvd_ops = [e for e in inside if any(a <= float(e["ts"]) < b for a, b in hvd_waits)
                   and not str(e["name"]).startswith(OPTIMIZER_STEP)]
        hvd_spans = _spans(hvd_ops, t1)
        hvd_busy = [(x, min(y, b)) for a, b in hvd_waits for x, y in hvd_spans if a <= x < b]
        comm = _union(comm + _minus(_minus(hvd_busy, data), comm))
        hvd_wait = _length(_minus(hvd_waits, _union(hvd_busy + comm + data)))  # each instant in one part
        # what resumes the training thread after a wait: a collective op other than a launch (c10d::allreduce_)
        comm_starts = sorted(float(e["ts"]) for e in comm_events if is_resume(e["name"]))
        # Gaps on the training thread that end where a collective op starts: waits for a collective.
        gaps = _minus([(t0, t1)], busy)
        wait = 0.0
        for a, b in gaps:
            if any(b - 1.0 <= s <= b + RESUME_US for s in comm_starts):  # the trace's unit is microseconds
                wait += b - a
        elements = 0
        ring = 0.0
        moved = [(e, e["name"]) for e in comm_events if str(e["name"]).startswith("c10d::")]
        moved += [(e, "allreduce") for e in hvd_ops if e["name"] == HOROVOD_RESULT]  # one per gradient
        for e, collective in moved:
            n = _elements(e)
            elements += n
            ring += n * BYTES_PER_ELEMENT * _ring_factor(collective, world_size, str(info.get("backend", "")))
        us = 1e-6
        steps[number] = StepTimes(number, (t1 - t0) * us, _length(data) * us, _length(comm) * us,
                                  (wait + hvd_wait) * us, elements, ring)
    extra = trace.get("workshop") or {}
    cpu = {int(k): float(v) for k, v in (extra.get("step_cpu_s") or {}).items()}
    return RankTrace(rank, world_size, str(info.get("backend", "")), steps, path, cpu,
                     tuple(int(c) for c in extra.get("cpus") or ()), extra.get("machine"))


def collectives_per_step(trace: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """{collective: (calls, elements of the whole tensors)} per profiled step of one rank's trace (`load_trace`):
    each c10d op inside a `ProfilerStep#N`, named "all-gather", "reduce-scatter" or "all-reduce" (or its own
    name), and "... of a scalar (the logged loss)" when it moves one element. An all-gather's output and a
    reduce-scatter's input are the larger of an op's first two tensors: the whole tensor either way."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    steps = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if str(e.get("name", "")).startswith(STEP_PREFIX)]
    calls: dict[str, int] = {}
    elements: dict[str, int] = {}
    for e in events:
        name = str(e.get("name", ""))
        if not name.startswith("c10d::") or not any(t0 <= float(e["ts"]) < t1 for t0, t1 in steps):
            continue
        tensors = [d if d and isinstance(d[0], list) else [d] for d in (e.get("args", {}).get("Input Dims") or [])[:2]]
        size = max((sum(math.prod(shape) for shape in t) for t in tensors), default=0)
        op = name.replace("_", "")
        kind = ("all-gather" if "allgather" in op else "reduce-scatter" if "reducescatter" in op
                else "all-reduce" if "allreduce" in op else name)
        kind += " of a scalar (the logged loss)" if size <= 1 else ""
        calls[kind] = calls.get(kind, 0) + 1
        elements[kind] = elements.get(kind, 0) + size
    return {kind: (calls[kind] / len(steps), elements[kind] / len(steps)) for kind in calls}


@dataclass(frozen=True)
class MachineView:
    """One machine's ranks together: the CPU time their training threads used per step against the
    core time the machine had (its cores, or its ranks if fewer, times the step). What was not used is
    what communication cost this machine's throughput: time on the wire, waiting for other ranks, and,
    with more ranks than cores, only the part of a rank's wait that no other rank could fill. This is
    what a throughput benchmark calls communication (step time less that of the same processes
    computing with no communication); the per-rank parts count every second a rank waited. Other
    processes on the machine take core time too, which this view cannot tell from communication."""

    machine: str
    ranks: list[int]
    cores: int  # the CPUs its ranks could use, together
    step_s: float  # the ranks' mean step
    cpu_s: float  # the ranks' training threads' CPU seconds per step, summed

    @property
    def capacity_s(self) -> float:
        return min(len(self.ranks), self.cores) * self.step_s

    @property
    def lost_share(self) -> float:
        return max(0.0, 1.0 - self.cpu_s / self.capacity_s) if self.capacity_s else 0.0


@dataclass
class ProfileReport:
    """Every rank's steps split into PARTS; `.table()`, `.plot()`; built by `from_files`/`from_traces`."""

    ranks: dict[int, RankTrace]
    summaries: list[RankSummary] = field(default_factory=list)
    png: Path | None = None
    title: str = "where the step time goes"
    run: Any = None  # the run the traces came from (workshop.profiling sets it), if any

    @classmethod
    def from_files(cls, paths: Iterable[str | Path], title: str | None = None) -> ProfileReport:
        paths = [Path(p) for p in paths]
        if not paths:
            raise WorkshopError("No profiler traces were given.",
                                "profile the job first (`python -m workshop profile LAB`), then pass its "
                                "trace-rank<R>.json files.")
        return cls.from_traces({p: load_trace(p) for p in paths}, title=title)

    @classmethod
    def from_traces(cls, traces: Mapping[Any, Mapping[str, Any]], title: str | None = None) -> ProfileReport:
        ranks: dict[int, RankTrace] = {}
        for key, trace in traces.items():
            path = key if isinstance(key, Path) else None
            rt = analyze(trace, path=path)
            if rt.rank in ranks:
                raise WorkshopError(f"Two traces say they are rank {rt.rank}.",
                                    "give one trace per rank, from one run.")
            ranks[rt.rank] = rt
        world = {rt.world_size for rt in ranks.values()}
        missing = sorted(set(range(max(world))) - set(ranks)) if world else []
        if missing:
            raise WorkshopError(f"The traces are of a world of {max(world)} ranks, but rank(s) "
                                f"{', '.join(map(str, missing))} have none.",
                                "give every rank's trace-rank<R>.json (each host writes its own ranks' traces; "
                                "locally in each host's output/data/profile, on SageMaker in output.tar.gz).")
        report = cls(ranks, title=title or cls.title)
        report.summaries = report._summarize()
        return report

    def _summarize(self) -> list[RankSummary]:
        common = sorted(set.intersection(*(set(rt.steps) for rt in self.ranks.values())))
        if not common:
            raise WorkshopError("The ranks' traces share no profiled step number.",
                                "give traces from one run (every rank profiles the same steps).")
        totals = {r: dict.fromkeys(("step", "compute", "communication", "data", "idle", "bytes"), 0.0)
                  for r in self.ranks}
        straggler = dict.fromkeys(self.ranks, 0)
        for n in common:
            waits = {r: rt.steps[n].wait for r, rt in self.ranks.items()}
            least = min(waits.values())
            slowest = min(waits, key=lambda r: (waits[r], r))
            straggler[slowest] += 1
            for r, rt in self.ranks.items():
                s = rt.steps[n]
                t = totals[r]
                t["step"] += s.total
                t["data"] += s.data
                t["communication"] += s.comm_ops + least
                t["idle"] += s.wait - least
                t["compute"] += s.compute
                t["bytes"] += s.ring_bytes
        k = len(common)
        cpu = {r: (sum(rt.cpu_s[n] for n in common) / k if all(n in rt.cpu_s for n in common) else None)
               for r, rt in self.ranks.items()}
        return [RankSummary(r, k, t["step"] / k, t["compute"] / k, t["communication"] / k, t["data"] / k,
                            t["idle"] / k, t["bytes"] / k, straggler[r], cpu[r]) for r, t in sorted(totals.items())]

    def machines(self) -> list[MachineView]:
        """The machine view (`MachineView`) per machine, when every trace says its CPU time, cores and
        machine (the labs' traces do); [] otherwise."""
        if any(rt.machine is None or not rt.cpus for rt in self.ranks.values()) \
                or any(s.cpu_s is None for s in self.summaries):
            return []
        by_rank = {s.rank: s for s in self.summaries}
        groups: dict[str, list[int]] = {}
        for r, rt in sorted(self.ranks.items()):
            groups.setdefault(str(rt.machine), []).append(r)
        return [MachineView(m, ranks, len(set().union(*(self.ranks[r].cpus for r in ranks))),
                            sum(by_rank[r].step_s for r in ranks) / len(ranks),
                            sum(by_rank[r].cpu_s for r in ranks))
                for m, ranks in groups.items()]

    def lost_share(self) -> float | None:
        """Over every machine: the share of the core time the ranks had that their training threads
        did not use (`MachineView`), i.e. the throughput communication cost; None without CPU times."""
        views = self.machines()
        if not views:
            return None
        capacity = sum(v.capacity_s for v in views)
        return max(0.0, 1.0 - sum(v.cpu_s for v in views) / capacity) if capacity else None

    @property
    def world_size(self) -> int:
        return max(rt.world_size for rt in self.ranks.values())

    @property
    def straggler(self) -> int:
        """The rank everyone waited for most often."""
        return max(self.summaries, key=lambda s: (s.straggler_steps, -s.rank)).rank

    def share(self, part: str) -> float:
        """`part`'s share of the step, over every rank's profiled steps."""
        return sum(s.part(part) for s in self.summaries) / sum(s.step_s for s in self.summaries)

    def table(self, markdown: bool = False) -> str:
        """The per-rank table with its heading line and notes; `markdown=True` puts blank lines around
        the table and between the notes, so that Markdown (a notebook's `display(Markdown(...))`)
        renders it as a table."""
        head = ["rank", "step ms", "compute", "communication", "data", "idle", "MB sent/step", "straggler in"]
        rows = []
        for s in self.summaries:
            rows.append([str(s.rank), f"{s.step_s * 1e3:.1f}",
                         *(f"{s.part(p) * 1e3:.1f} ({s.share(p):.0%})" for p in PARTS),
                         f"{s.bytes_per_step / 1e6:.2f}", f"{s.straggler_steps}/{s.steps}"])
        rows.append(["all", f"{sum(s.step_s for s in self.summaries) / len(self.summaries) * 1e3:.1f}",
                     *(f"{self.share(p):.0%}" for p in PARTS), "", ""])
        widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
        line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
        backend = next(iter(self.ranks.values())).backend
        heading = (f"{self.title}: {len(self.ranks)} ranks ({backend or 'unknown backend'}), "
                   f"{self.summaries[0].steps} profiled steps, mean per step (ms, share of the step)")
        table = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]
        notes = [f"straggler: rank {self.straggler} (the rank that waited least in most steps: everyone "
                 "waited for it); communication = collective ops + the wait every rank had; idle = the "
                 "wait beyond it; MB sent = the ring algorithm's bytes for the collectives' fp32 tensors."]
        views = self.machines()
        for i, v in enumerate(views):
            what = "this machine" if len(views) == 1 else f"machine {i + 1}"
            notes.append(
                f"machine view, {what} ({len(v.ranks)} rank(s) on {v.cores} core(s)): the training threads used "
                f"{v.cpu_s * 1e3:.1f} ms of CPU per step out of {v.capacity_s * 1e3:.1f} ms of core time "
                f"({min(len(v.ranks), v.cores)} x {v.step_s * 1e3:.1f} ms): {v.lost_share:.0%} of it went to "
                "communication, i.e. the throughput it cost (and to any other process on the machine)"
                + (" (with more ranks than cores, a rank's wait is partly another rank's compute, so this is "
                   "below the per-rank communication + idle)" if len(v.ranks) > v.cores else "") + ".")
        if markdown:
            return "\n".join([heading, "", *table, "", "\n\n".join(notes)])
        return "\n".join([heading, *table, *notes])

    def __str__(self) -> str:
        return self.table()

    def plot(self, path: str | Path | None = None):
        """A stacked bar per rank (PARTS, ms per step); saved as `path` (or the report's `png`). Returns the figure."""
        out = Path(path) if path else self.png
        fig = plot_reports({"": self}, f"{self.title} (* straggler)", out)
        if out is not None:
            self.png = out
        return fig


PART_COLORS = {"compute": "tab:blue", "communication": "tab:orange", "data": "tab:green", "idle": "lightgrey"}


def plot_reports(reports: Mapping[str, ProfileReport], title: str, path: str | Path | None = None):
    """Stacked bars (PARTS, ms per step) for every rank of every report, on one scale: `reports` maps a
    label (the x labels' first line, e.g. "2 ranks"; "" for none) to a report; the straggler of each is
    starred. One report's legend gives each part's share. Saved as `path` if given; returns the figure."""
    import matplotlib

    if "ipykernel" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{label}\n" * bool(label) + f"rank {s.rank}" + (" *" if s.rank == report.straggler else ""), s)
            for label, report in reports.items() for s in report.summaries]
    only = next(iter(reports.values())) if len(reports) == 1 else None
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(bars) + 3), 4.0))
    bottom = [0.0] * len(bars)
    for p in PARTS:
        values = [s.part(p) * 1e3 for _, s in bars]
        ax.bar([x for x, _ in bars], values, bottom=bottom, color=PART_COLORS[p],
               label=f"{p} ({only.share(p):.0%})" if only else p,
               hatch="//" if p == "idle" else None, edgecolor="grey" if p == "idle" else None)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("ms per step (mean over profiled steps)")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig
