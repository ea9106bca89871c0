"""What the local cluster's runtimes cost per job, against bare `torchrun`.

    python benchmarks/bench_runtime.py [--repeats 5] [--warm-ups 1] [--out-dir images/]

The same tiny job (benchmarks/workers/hello_dist.py: join a gloo process group, all-reduce one
number, leave; the time is launching, rendezvous and shutdown, not training) is started three
ways, for 1 host x 2 processes and for 2 hosts x 1 process:

- **bare torchrun**: `torchrun --nnodes H --nproc-per-node P ... hello_dist.py`, one per host,
  on 127.0.0.1 (what a person types; no sandbox, no SageMaker contract);
- **process runtime**: `LocalCluster(runtime="process")`: sandboxes, the SDK's torchrun driver
  under `workshop.runtime.run_driver`, the master on 127.0.0.1;
- **container runtime**: `LocalCluster(runtime="container")`: the same plus Linux namespaces per
  host (`/opt/ml`, peers `algo-N`, a private network), the SDK's generated `sm_train.sh`
  with its `environment.py`, and `torchrun --master_addr=algo-1 --master_port=7777` as on SageMaker.

Repeats are interleaved (bare, process, container, bare, ...) so that the machine's load falls
on all three alike; the table shows the median wall time of each (with min-max) and the median
difference to bare torchrun. The target: the container runtime costs under 1 s more per job
than bare torchrun.

Part of that difference is not the local cluster's: the SDK's `torchrun_driver.py`, which every
SageMaker job runs too, imports torch to read its version before it launches anything (more
than a second here). So each repeat also times `python -c "import torch"` alone, and the last
columns are the difference less that import: what the simulation itself (sandboxes, namespaces,
`sm_train.sh` and `environment.py`, log streaming, the final sweep) adds, and the container
runtime against the process runtime: what being strict costs. The container runtime pins each
simulated host to its share of the cores (2 hosts on 2 cores: one each), so a host's start-up
(the driver's import, torchrun's, the rank's) runs on one core, as bare torchrun's does not.
Output: the table on stdout and `bench_runtime.{md,csv}` in `--out-dir`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import load_average, write_results  # noqa: E402
from sagemaker.train.distributed import Torchrun  # noqa: E402

from workshop.runtime.local_cluster import LocalCluster  # noqa: E402
from workshop.runtime.machine import free_port  # noqa: E402

WORKER_DIR = Path(__file__).resolve().parent / "workers"
WORKER = "hello_dist.py"
SHAPES = ((1, 2), (2, 1))
WAYS = ("bare torchrun", "process runtime", "container runtime")


def bare(hosts: int, procs: int) -> float:
    port = free_port()
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    launched = [
        subprocess.Popen(
            [torchrun, f"--nnodes={hosts}", f"--nproc-per-node={procs}", f"--node-rank={h}",
             "--master-addr=127.0.0.1", f"--master-port={port}", WORKER],
            cwd=WORKER_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        for h in range(hosts)
    ]
    codes = [p.wait() for p in launched]
    elapsed = time.monotonic() - t0
    if any(codes):
        raise SystemExit(f"bare torchrun failed: exit codes {codes}")
    return elapsed


def import_torch() -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return time.monotonic() - t0


def cluster(hosts: int, procs: int, runtime: str, workdir: Path) -> float:
    c = LocalCluster(WORKER_DIR, WORKER, hosts=hosts, procs_per_host=procs,
                     distributed=Torchrun(process_count_per_node=procs), workdir=workdir, echo=False,
                     runtime=runtime, extra_env={"OMP_NUM_THREADS": "1"})
    t0 = time.monotonic()
    result = c.run({}, {}, check=True)
    elapsed = time.monotonic() - t0
    assert result.runtime == runtime.split()[0] and result.metric("allreduce_sum") is not None
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats of each way")
    parser.add_argument("--warm-ups", type=int, default=1,
                        help="untimed runs of each way before the timed ones (imports, page cache); 0: none (a check "
                             "that every way works, whose timings mean little)")
    parser.add_argument("--out-dir", default=str(ROOT / "images"), help="where the .md and .csv go")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warm_ups < 0:
        parser.error("--repeats must be at least 1 and --warm-ups at least 0")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    times: dict[tuple[int, int, str], list[float]] = {}
    print(f"load average before: {load_average()}", flush=True)
    try:
        for hosts, procs in SHAPES:
            for w in range(args.warm_ups):  # untimed warm-ups of each (imports, page cache)
                for way in WAYS:
                    (bare(hosts, procs) if way == "bare torchrun"
                     else cluster(hosts, procs, way.split()[0], scratch / f"warm-{way[0]}-{hosts}-{w}"))
            for r in range(args.repeats):
                times.setdefault((hosts, procs, "import torch"), []).append(import_torch())
                for way in WAYS:
                    if way == "bare torchrun":
                        t = bare(hosts, procs)
                    else:
                        t = cluster(hosts, procs, way.split()[0], scratch / f"{way[0]}-{hosts}x{procs}-{r}")
                    times.setdefault((hosts, procs, way), []).append(t)
                    print(f"{hosts} x {procs} {way:<17} run {r + 1}: {t:.2f} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    rows = []
    for hosts, procs in SHAPES:
        base = statistics.median(times[(hosts, procs, "bare torchrun")])
        torch_import = statistics.median(times[(hosts, procs, "import torch")])
        process = statistics.median(times[(hosts, procs, "process runtime")])
        for way in WAYS:
            ts = times[(hosts, procs, way)]
            med = statistics.median(ts)
            sdk = 0.0 if way == "bare torchrun" else torch_import
            rows.append({"layout": f"{hosts} x {procs}", "launcher": way, "median_s": round(med, 2),
                         "min_s": round(min(ts), 2), "max_s": round(max(ts), 2),
                         "vs_bare_s": round(med - base, 2), "ratio": round(med / base, 2),
                         "sdk_driver_import_torch_s": round(sdk, 2), "simulation_s": round(med - base - sdk, 2),
                         "vs_process_s": round(med - process, 2) if way == "container runtime" else None})
    header = ("| hosts x procs | launcher | wall time, median (min-max) | more than bare torchrun | ratio "
              "| of which the SDK driver's `import torch` | the simulation's own cost | strictness: more than the process runtime |")
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        strict = "-" if row["vs_process_s"] is None else f"{row['vs_process_s']:+.2f} s"
        lines.append(f"| {row['layout']} | {row['launcher']} | {row['median_s']:.2f} s ({row['min_s']:.2f}-{row['max_s']:.2f}) "
                     f"| {row['vs_bare_s']:+.2f} s | {row['ratio']:.2f} | {row['sdk_driver_import_torch_s']:.2f} s "
                     f"| {row['simulation_s']:+.2f} s | {strict} |")
    table = "\n".join(lines)
    note = (f"\n{args.repeats} interleaved repeats per row after {args.warm_ups} untimed warm-up(s) of each, on "
            f"{os.cpu_count()} cores; load average after: "
            f"{load_average()}. The job: join a gloo group, all-reduce one number, leave. `import torch` alone "
            "took the median time shown (measured in the same repeats): the SDK's torchrun driver pays it before "
            "launching, on SageMaker too. "
            + ("Python bytecode: not written (PYTHONDONTWRITEBYTECODE is set), so every process of every job compiled "
               "its modules from source, and the simulation's cost counts that (`make bench` writes it into "
               ".venv/pycache)." if os.environ.get("PYTHONDONTWRITEBYTECODE") else
               "Python bytecode: written and reused, as Python does by default."))
    write_results(out_dir, "bench_runtime", table, note, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
