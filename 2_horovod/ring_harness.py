"""Run a ring all-reduce written in the notebook on N processes over gloo, and count what it sends.

Exercise 1 of `horovod.ipynb` has the learner write `ring_all_reduce(tensor, rank, world_size)` from
`dist.send`/`dist.recv` (and their non-blocking `isend`/`irecv`), as PyTorch's distributed tutorial
(`dist_tuto`, "Our Own Ring-Allreduce") does; its check (`exercises.RING_ALL_REDUCE`) calls `run` here:

- the function travels as its source (`inspect.getsource`: a notebook cell's, or the solution file's,
  which `teaching.Exercise.reference` registers with `linecache`), with `torch` and `dist` as its globals;
- one process (in a private network namespace where Linux allows one, as lab 2's Horovod probe runs:
  `workshop.launchers.horovod_probe`) imports PyTorch once and forks N ranks for each N, which join a
  gloo process group over loopback (`GLOO_SOCKET_IFNAME=lo`, a file store: no TCP store on the wire);
- every rank all-reduces its own random tensor of K bytes with the learner's function and with
  `dist.all_reduce`, and the two results are compared;
- the bytes are counted two ways: each rank adds up the tensors it passes to `dist.send`/`dist.isend`
  (exact, everywhere), and rank 0 reads the loopback interface's kernel counters between barriers around
  the call (`/proc/net/dev`: the bytes on the wire, TCP/IP headers and gloo's framing included), less the
  same window with the barriers only. The loopback count is the measurement where it is private (nothing
  else on it); elsewhere the tensors passed to send are, and `Run.counted_by` says which.

    python 2_horovod/ring_harness.py          # runs the solution file on N = 2, 3 and 4, prints the runs
"""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANKS = (2, 3, 4)
NUMEL = 12 * 2**15  # float32 elements: K = 1.5 MiB, split evenly over 2, 3 and 4 ranks
TIMEOUT_S = 20.0  # per N: a ring that deadlocks (every rank in a blocking send) is stopped after this
RESULT = "RING_RESULT "
# Collectives the learner's function may not call (it is to be built from point-to-point messages).
FORBIDDEN = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
             "reduce_scatter_tensor", "broadcast", "all_to_all", "all_to_all_single", "gather", "scatter")
_cache: dict[tuple, list[Run]] = {}


@dataclass
class Run:
    """One N: whether every rank's result matched `dist.all_reduce`'s, and the bytes the call sent."""

    ranks: int
    tensor_bytes: int  # K
    correct: bool = False
    max_error: float = 0.0  # the largest difference from dist.all_reduce's result, over all ranks
    sent_by_rank: list[int] = field(default_factory=list)  # bytes of the tensors each rank passed to send
    messages_by_rank: list[int] = field(default_factory=list)
    wire_bytes: int | None = None  # loopback bytes in the call's window, less the barriers-only window
    private_loopback: bool = False
    seconds: float = 0.0
    problem: str = ""  # the call raised, hung, or called a collective

    @property
    def formula_bytes(self) -> float:
        """2(N-1)K/N: what each rank sends in a ring all-reduce."""
        return 2 * (self.ranks - 1) * self.tensor_bytes / self.ranks

    @property
    def counted_by(self) -> str:
        return "loopback" if self.wire_bytes is not None and self.private_loopback else "send"

    @property
    def per_rank_bytes(self) -> float:
        """What each rank sent: on the private loopback (all ranks' bytes / N), else the tensors passed to send."""
        if self.counted_by == "loopback":
            return self.wire_bytes / self.ranks
        return max(self.sent_by_rank) if self.sent_by_rank else 0.0


def source_of(function) -> str:
    """The function's source, as the processes will run it (OSError where Python cannot find it)."""
    return textwrap.dedent(inspect.getsource(function))


def run(function, ranks: tuple[int, ...] = RANKS, numel: int = NUMEL, timeout_s: float = TIMEOUT_S) -> list[Run]:
    """The function run on gloo at each N of `ranks` (results are kept per source: a second call with the
    same function, as the measurement cell after the check makes, starts nothing)."""
    source = source_of(function)
    key = (source, function.__name__, tuple(ranks), numel)
    if key not in _cache:
        _cache[key] = _launch({"source": source, "name": function.__name__, "ranks": list(ranks), "numel": numel,
                               "timeout_s": timeout_s})
    return _cache[key]


def _launch(spec: dict) -> list[Run]:
    from workshop.launchers.horovod_probe import in_private_network, private_network

    private, _why = private_network()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve"]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    limit = 60 + len(spec["ranks"]) * (spec["timeout_s"] + 5)
    proc = subprocess.run(in_private_network(cmd) if private else cmd, input=json.dumps({**spec, "private": private}),
                          capture_output=True, text=True, env=env, timeout=limit)
    runs = [Run(**json.loads(line[len(RESULT):])) for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if len(runs) != len(spec["ranks"]):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"the ring harness stopped (exit status {proc.returncode}):\n{tail}")
    return runs


# --------------------------------------------------------------------------- in the process that forks the ranks


def _loopback_bytes() -> int | None:
    try:
        for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[8])
    except OSError:
        pass
    return None


def _rank(rank: int, spec: dict, store: str, queue) -> None:
    """One rank: join the group, run the learner's function and dist.all_reduce, report to the parent."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    n = spec["world_size"]
    report = {"rank": rank, "error": ""}
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n,
                                timeout=timedelta(seconds=spec["timeout_s"]))
        generator = torch.Generator().manual_seed(1000 + rank)
        original = torch.randn(spec["numel"], generator=generator)
        expected = original.clone()
        dist.all_reduce(expected)
        namespace = {"torch": torch, "dist": dist, "math": math, "__name__": "__ring__"}
        exec(compile(spec["source"], "<your function>", "exec"), namespace)  # noqa: S102 - the learner's own code
        function = namespace[spec["name"]]

        sent = [0, 0]  # bytes, messages

        def counting(send):
            def wrapped(tensor, *args, **kwargs):
                sent[0] += tensor.numel() * tensor.element_size()
                sent[1] += 1
                return send(tensor, *args, **kwargs)
            return wrapped

        def refused(name):
            def collective(*args, **kwargs):
                raise RuntimeError(f"dist.{name} is a collective: build the all-reduce from dist.send and dist.recv "
                                   "(or dist.isend and dist.irecv)")
            return collective

        dist.barrier()
        before = _loopback_bytes() if rank == 0 else None  # the background window: the barriers alone
        dist.barrier()
        middle = _loopback_bytes() if rank == 0 else None
        saved = {name: getattr(dist, name) for name in ("send", "isend", *FORBIDDEN) if hasattr(dist, name)}
        dist.send, dist.isend = counting(saved["send"]), counting(saved["isend"])
        for name in FORBIDDEN:
            if name in saved:
                setattr(dist, name, refused(name))
        work = original.clone()
        t0 = time.perf_counter()
        try:
            returned = function(work, rank, n)
        finally:
            for name, value in saved.items():
                setattr(dist, name, value)
        seconds = time.perf_counter() - t0
        dist.barrier()
        after = _loopback_bytes() if rank == 0 else None
        result = returned if isinstance(returned, torch.Tensor) else work
        if result.shape != expected.shape:
            report["error"] = f"it returned a tensor of shape {tuple(result.shape)}, not {tuple(expected.shape)}"
        else:
            report["max_error"] = float((result - expected).abs().max())
            report["correct"] = bool(torch.allclose(result, expected, rtol=1e-4, atol=1e-4))
        report.update(sent=sent[0], messages=sent[1], seconds=seconds)
        if rank == 0 and None not in (before, middle, after):
            report["wire"] = (after - middle) - (middle - before)
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the learner's code failed: reported, not raised
        report["error"] = f"{type(exc).__name__}: {exc}".strip()
    queue.put(report)


def _one(spec: dict, n: int, private: bool) -> Run:
    import multiprocessing as mp
    import queue as queues

    run_ = Run(ranks=n, tensor_bytes=spec["numel"] * 4, private_loopback=private)
    ctx = mp.get_context("fork")  # PyTorch is imported once, here: each rank starts in milliseconds
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as scratch:
        procs = [ctx.Process(target=_rank, args=(r, {**spec, "world_size": n}, f"{scratch}/store", results), daemon=True)
                 for r in range(n)]
        for p in procs:
            p.start()
        started = time.monotonic()
        reports, deadline, hung = {}, started + spec["timeout_s"] + 5, False
        while len(reports) < n:
            try:
                report = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queues.Empty:
                hung = True
                break
            reports[report["rank"]] = report
            if report["error"]:  # gloo's timeout, or a peer that gave up on it, reads as hanging
                hung = time.monotonic() - started >= 0.8 * spec["timeout_s"]
                break
        for p in procs:
            p.join(timeout=0.5 if len(reports) < n else 5)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [f"rank {r['rank']}: {_first_line(r['error'])}" for r in reports.values() if r["error"]]
    if hung:
        run_.problem = (f"did not finish in {spec['timeout_s']:.0f} s: the ranks waited for each other. A blocking "
                        "dist.send returns once its receiver takes the data, so if every rank sends first, all wait")
    elif errors:
        run_.problem = "raised, on " + errors[0]
    else:
        ordered = [reports[r] for r in range(n)]
        run_.correct = all(r["correct"] for r in ordered)
        run_.max_error = max(r["max_error"] for r in ordered)
        run_.sent_by_rank = [r["sent"] for r in ordered]
        run_.messages_by_rank = [r["messages"] for r in ordered]
        run_.seconds = max(r["seconds"] for r in ordered)
        run_.wire_bytes = ordered[0].get("wire")
    return run_


def _first_line(error: str) -> str:
    """An exception's first line, without the path of the C++ file that raised it (gloo's `[/path/pair.cc:553] `)."""
    line = error.strip().splitlines()[0] if error.strip() else error
    if "] " in line and line.split("] ", 1)[0].count("[/"):
        kind, _, rest = line.partition(": ")
        line = f"{kind}: {rest.split('] ', 1)[1]}" if "] " in rest else line
    return line if len(line) <= 200 else line[:197] + "..."


def _serve() -> None:
    spec = json.loads(sys.stdin.read())
    import torch  # noqa: F401 - once, before the ranks fork

    for n in spec["ranks"]:
        print(RESULT + json.dumps(asdict(_one(spec, n, spec["private"]))), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        sys.path.insert(0, str(HERE))
        import exercises

        solution = exercises.RING_ALL_REDUCE.reference({})
        for r in run(solution):
            print(r)
