"""Lab 4's measurement grid: per-rank memory and step time for each sharding, at world sizes 1, 2, 4 (PyTorch's
shardings, and DeepSpeed's ZeRO stages at N > 1: `--sharding zero1|zero2|zero3|zero3_offload`, whose "ideal" is ZeRO's
theory with DeepSpeed's fp32 master copy).

    python 4_model_parallel/measure.py                 # the memory table
    from measure import MEASURE_MODEL, measure         # what the notebook calls (its folder is on the path)

Each measurement is one run of the lab's own script on one simulated host with `world_size`
processes (`workshop.runner.run_local`); the script prints each rank's accounting line.

Every rank runs one CPU thread (`--threads 1`) at every world size, so step times compare the same
resources per rank. Left to its default (`--threads 0`), the script gives each rank the host's CPUs
divided by its ranks: the single rank of N=1 gets every core, N >= 2 one thread each, and a
multi-threaded rank running a model this tiny waits for all its threads at every operator; on a busy
machine its steps were far slower (1,934 ms at N=1 against 23-147 ms at N >= 2 in one run), which
read as a speed-up from sharding. Pass `hyperparameters={"threads": 0}` for the script's default.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from workshop.labs import get_lab
from workshop.runner import run_local

MEASURE_MODEL = {"layers": 2, "d-model": 64, "heads": 4, "seq-len": 32, "batch-size": 8}
THREADS_PER_RANK = 1  # the same at every world size (see above)


def measure(
    sharding: str,
    world_size: int,
    *,
    steps: int = 3,
    hyperparameters: Mapping[str, Any] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> list[dict[str, Any]]:
    """One run of the lab's script on one simulated host with `world_size` processes; returns
    each rank's accounting record (the `METRICS ... state_bytes=...` line) plus rank 0's losses."""
    hps = {**MEASURE_MODEL, "steps": steps, "log-interval": steps, "eval-sequences": 8,
           "sharding": sharding, "threads": THREADS_PER_RANK, **(hyperparameters or {})}
    if sharding == "hybrid_shard" and "hybrid-shard-degree" not in hps:
        hps["hybrid-shard-degree"] = max(1, world_size // 2)
    result = run_local(get_lab("model_parallel"), hosts=1, procs_per_host=world_size, hyperparameters=hps,
                       workdir=workdir, data_dir=data_dir, echo=False)
    rows = [r for r in result.records if "state_bytes" in r]
    final = {k: result.metric(k) for k in ("final_train_loss", "test_loss", "test_accuracy")}
    return [{**r, **final} for r in sorted(rows, key=lambda r: r["rank"])]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python 4_model_parallel/measure.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="1,2,4")
    args = parser.parse_args(argv)
    print(f"{'sharding':<14} {'N':>2} {'rank':>4} {'state KB':>9} {'ideal KB':>9} {'saved act KB':>12} {'step ms':>8}")
    for n in (int(x) for x in args.world_sizes.split(",")):
        zero = ("zero1", "zero2", "zero3", "zero3_offload") if n > 1 else ()  # one rank: nothing for ZeRO to split
        for sharding in ("no_shard", "optimizer", "shard_grad_op", "full_shard", *zero):
            for r in measure(sharding, n)[:1]:
                print(f"{sharding:<14} {n:>2} {r['rank']:>4} {r['state_bytes'] / 1e3:>9.1f} "
                      f"{r['ideal_state_bytes'] / 1e3:>9.1f} {r['saved_act_bytes'] / 1e3:>12.1f} "
                      f"{r['step_time_s'] * 1e3:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
