"""Run ps_train.py (lab 1 with lab 3's CNN) on the local cluster; print its log lines.

    python benchmarks/workers/ps_cluster.py --hosts 3 --steps 120 --log-interval 40 \\
        --batch-size 64 --data-dir data/mnist --workdir /tmp/ps-run

A separate process so that benchmarks/bench_strategies.py can run the whole simulated
cluster inside its own network namespace (exact loopback byte counts), like its other runs;
on the process runtime, so that every host's traffic crosses that namespace's loopback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workshop.datasets.mnist import prepare_mnist
from workshop.labs import get_lab
from workshop.runtime.local_cluster import LocalCluster


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, required=True, help="simulated hosts (workers + 1)")
    p.add_argument("--steps", type=int, required=True, help="training steps in all")
    p.add_argument("--log-interval", type=int, required=True, help="steps per METRICS line")
    p.add_argument("--batch-size", type=int, default=64, help="samples per step")
    p.add_argument("--data-dir", type=Path, required=True, help="MNIST channels (prepare_mnist)")
    p.add_argument("--workdir", type=Path, required=True, help="the cluster's sandboxes go here")
    args = p.parse_args(argv)
    channels = prepare_mnist(args.data_dir)
    cluster = LocalCluster(
        Path(__file__).resolve().parent, "ps_train.py", hosts=args.hosts, procs_per_host=1,
        distributed=get_lab("parameter_server").distributed_config(1), name="bench-ps",
        workdir=args.workdir, echo=False,
        # The process runtime: its hosts talk over this network namespace's loopback, whose counters
        # the benchmark reads (the container runtime gives each host a namespace of its own, whose
        # traffic those counters never see: the table said 0 bytes).
        runtime="process",
    )
    hps = {"steps": args.steps, "log-interval": args.log_interval, "batch-size": args.batch_size, "threads": 1}
    result = cluster.run(hps, channels.dirs, check=False)
    print("\n".join(result.lines), flush=True)
    if not result.ok:
        print(f"parameter-server job failed; log: {result.log_path}", flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
