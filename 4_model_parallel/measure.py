"""Lab 4's measurement grid: per-rank memory and step time for each sharding, at world sizes 1, 2, 4 (PyTorch's
shardings, and DeepSpeed's ZeRO stages at N > 1: `--sharding zero1|zero2|zero3|zero3_offload`, whose "ideal" is ZeRO's
theory with DeepSpeed's fp32 master copy), and the tables the notebook shows of them.

    python 4_model_parallel/measure.py                 # the memory table
    from measure import MEASURE_MODEL, measure, grid   # what the notebook calls (its folder is on the path)
    from measure import pipeline                       # code/pipeline.py's GPipe and 1F1B on 2 stages
    from measure import inside_the_step                # the peak inside the step, and bf16 (8 layers, N = 2)

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
TECHNIQUES = ("no_shard", "optimizer", "shard_grad_op", "full_shard")  # PyTorch's, at every world size N > 1
KB = 1e3
# code/pipeline.py's model: 2 stages of Linear + Tanh layers, sized so that one micro-batch's forward and backward
# (tens of ms at m = 8) dwarf what a hand-off and the schedule's own work cost per micro-batch (well under 1 ms).
PIPELINE_MODEL = {"d-model": 512, "layers-per-stage": 4, "batch-size": 1024}
PIPELINE_MICROBATCHES = (1, 2, 4, 8)


def grid(world_sizes: Sequence[int]) -> list[tuple[str, int, dict[str, Any]]]:
    """The notebook's runs, as (technique, world size, extra flags): the single-process baseline at N=1 (every
    technique is the same there), each technique at every N > 1, hybrid sharding at the largest N (2 shards x N/2
    replicas), and checkpointing, then checkpointing with (simulated) offloading, with full sharding at N=2."""
    n_max = max(world_sizes)
    n_ckpt = 2 if 2 in world_sizes else n_max
    runs = [(technique, n, {}) for n in world_sizes for technique in (TECHNIQUES if n > 1 else ("no_shard",))]
    if n_max >= 4:
        runs.append(("hybrid_shard", n_max, {"hybrid-shard-degree": 2}))
    runs.append(("full_shard+ckpt", n_ckpt, {"activation-checkpointing": "true"}))
    runs.append(("full_shard+ckpt+offload", n_ckpt, {"activation-checkpointing": "true",
                                                      "activation-offloading": "simulate"}))
    return runs


# Inside the step: shard_grad_op and full_shard differ there, by whole blocks of gathered parameters, so a model deep
# enough to show it; and full_shard again in bf16 (FSDP2's MixedPrecisionPolicy: it computes in bf16, keeps fp32).
PEAK_LAYERS = 8
PEAK_RUNS = (("shard_grad_op", "fp32"), ("full_shard", "fp32"), ("full_shard", "bf16"))


def inside_the_step(n: int = 2, *, layers: int = PEAK_LAYERS, steps: int = 3) -> dict[str, list[dict[str, Any]]]:
    """PEAK_RUNS at world size `n` on a `layers`-deep model: each rank's records (with `step_peak_bytes`, the most it
    held at once inside its measured step), keyed "shard_grad_op", "full_shard" and "full_shard bf16"."""
    return {sharding + ("" if precision == "fp32" else f" {precision}"):
            measure(sharding, n, steps=steps, hyperparameters={"layers": layers, "mixed-precision": precision})
            for sharding, precision in PEAK_RUNS}


def with_one_rank(runs: dict[tuple[str, int], list[dict[str, Any]]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """`runs` with the N=1 baseline filed under every technique too: one rank has nothing to shard."""
    if ("no_shard", 1) in runs:
        runs = {**{(t, 1): runs["no_shard", 1] for t in TECHNIQUES}, **runs}
    return runs


def memory_table(runs: Mapping[tuple[str, int], list[dict[str, Any]]]):
    """Rank 0 of every run, by world size: what it holds (KB), against the ideal share (the full state over the
    ranks sharing it), the activations it saved for backward, its step time and final loss."""
    from workshop.teaching import table

    rows = [{"technique": t, "N": n, "params": r["param_bytes"] / KB, "grads": r["grad_bytes"] / KB,
             "optim": r["optim_bytes"] / KB, "state": r["state_bytes"] / KB, "ideal": r["ideal_state_bytes"] / KB,
             "state / ideal": r["state_bytes"] / r["ideal_state_bytes"], "saved act": r["saved_act_bytes"] / KB,
             "peak in step": r.get("step_peak_bytes", float("nan")) / KB,
             "step ms": r["step_time_s"] * 1e3, "loss": r["final_train_loss"]}
            for (t, n), [r, *_] in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    kb = {c: ",.1f" for c in ("params", "grads", "optim", "state", "ideal", "saved act", "peak in step", "step ms")}
    return table(rows, formats={**kb, "state / ideal": ".3f", "loss": ".4f"},
                 caption="rank 0 of each run, KB (1 KB = 1000 bytes); ideal = full state / ranks sharing it; "
                         "peak in step: the most it held at once inside the step")


def deepspeed_table(runs: Mapping[tuple[str, int], list[dict[str, Any]]], ds_runs: Mapping[str, list[dict[str, Any]]],
                    n: int, theory: Mapping[str, float]):
    """PyTorch's rows at world size `n` beside DeepSpeed's (every rank), stage by stage: what each rank holds (KB),
    the theory (`theory[sharding]`: bytes), what an offloaded optimizer keeps in host memory, and the share of
    DeepSpeed's whole state that the rank holds on its device."""
    from workshop.teaching import table

    stages = (("DDP: nothing sharded", "no_shard", None), ("ZeRO-1: optimizer state", "optimizer", "zero1"),
              ("ZeRO-2: + gradients", "shard_grad_op", "zero2"), ("ZeRO-3: + parameters", "full_shard", "zero3"),
              ("ZeRO-3 + optimizer offload", None, "zero3_offload"))
    whole = next(iter(ds_runs.values()))[0]["full_state_bytes"] if ds_runs else None
    rows = []
    for label, pytorch, deepspeed in stages:
        found = [(pytorch, f"PyTorch {pytorch}", runs[pytorch, n][0])] if (pytorch, n) in runs else []
        found += [(deepspeed, f"DeepSpeed {deepspeed}/{r['rank']}", r) for r in ds_runs.get(deepspeed, [])]
        for sharding, name, r in found:
            host = r.get("offloaded_state_bytes", 0)
            on_device = (r["state_bytes"] - host) / whole if sharding.startswith("zero") else ""
            rows.append({"stage": label, "run": name, "params": r["param_bytes"] / KB, "grads": r["grad_bytes"] / KB,
                         "optim": r["optim_bytes"] / KB, "state": r["state_bytes"] / KB,
                         "theory": theory[sharding] / KB, "state / theory": r["state_bytes"] / theory[sharding],
                         "host": host / KB, "device / DS whole": on_device,
                         "step ms": r["step_time_s"] * 1e3, "loss": r["final_train_loss"]})
            label = ""
    kb = {c: ",.1f" for c in ("params", "grads", "optim", "state", "theory", "host", "step ms")}
    return table(rows, formats={**kb, "state / theory": ".3f", "device / DS whole": ".0%", "loss": ".5f"},
                 caption=f"per rank at N={n}, KB; DS whole: DeepSpeed's whole state (4 + 4 + 12 bytes per parameter)")


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


def pipeline(microbatches: Sequence[int] = PIPELINE_MICROBATCHES, *, steps: int = 3, stages: int = 2,
             model: Mapping[str, Any] | None = None, timeout: float = 600) -> list[dict[str, Any]]:
    """One run of `code/pipeline.py` on `stages` local processes (torchrun, gloo, one thread each): GPipe and 1F1B
    at each m of `microbatches`; returns every record (one per schedule, m and stage, with its timeline)."""
    import json
    import subprocess
    import tempfile

    flags = {**PIPELINE_MODEL, **(model or {})}
    with tempfile.TemporaryDirectory(prefix="pipeline-") as tmp:
        out = os.path.join(tmp, "pipeline.json")
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(stages),
                str(get_lab("model_parallel").source_dir / "pipeline.py"), "--out", out, "--steps", str(steps),
                "--microbatches", *map(str, microbatches),
                *[x for key, value in flags.items() for x in (f"--{key}", str(value))]]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"code/pipeline.py failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                               f"{proc.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


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
