"""The planner against figures AWS has published, with every assumption printed.

    python benchmarks/planner_validation.py [--out images/planner_validation.md]

Two published figures, neither with its full configuration:

1. SageMaker model parallelism library, GPT-3-sized model (AWS Machine Learning Blog,
   "Train 175+ billion parameter NLP models with model parallel additions and Hugging Face on
   Amazon SageMaker", 2022-03-01,
   https://aws.amazon.com/blogs/machine-learning/train-175-billion-parameter-nlp-models-with-model-parallel-additions-and-hugging-face-on-amazon-sagemaker/):
   "a throughput of 32 samples per second on 120 ml.p4d.24xlarge instances and 175 billion
   parameters". The post does not give the sequence length, batch, or parallel degrees, so the
   planner is run over a small grid of the usual choices (GPT-3's own: 2,048 tokens, a global
   batch of 1,536 sequences, Brown et al. 2020; tensor parallelism inside the instance, as SMP's
   best-practice page recommends) and the script reports the spread, not one number.
2. SageMaker distributed data parallel library (developer guide, "Introduction to SageMaker's
   distributed data parallel library", https://docs.aws.amazon.com/sagemaker/latest/dg/data-parallel-intro.html,
   older version of the page): on 2, 4 and 8 ml.p3dn.24xlarge, BERT "41%, 52%, and 13% faster
   than PyTorch-DDP". Only speedups relative to DDP are published, so the check is a bound: a
   faster all-reduce can at most remove DDP's communication time, so the speedup over DDP is at
   most 1 / (DDP's scaling efficiency) - 1. The planner's DDP efficiency gives that ceiling.

Pure Python (the planner imports no framework); runs in a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from workshop import planner  # noqa: E402

SMP_PUBLISHED = 32.0  # samples/s
SMP_INSTANCES = 120
SMDDP_SPEEDUP = {2: 0.41, 4: 0.52, 8: 0.13}  # BERT, vs PyTorch DDP, p3dn.24xlarge nodes


def smp_grid() -> list[dict]:
    """Predicted samples/s for the 175B run over the configurations the post leaves open."""
    rows = []
    gpt3 = planner.transformer("GPT-3 175B", layers=96, d_model=12288, heads=96, seq_len=2048, vocab=50257,
                               activation_checkpointing=True)
    gpus = SMP_INSTANCES * 8
    for tp in (1, 8):
        dp = gpus // tp
        batch = max(1, round(1536 / dp))  # sequences per data-parallel rank (GPT-3's global batch)
        for mfu in (0.3, 0.4):
            for overlap in (0.0, 1.0):
                p = planner.plan(gpt3, "ml.p4d.24xlarge", batch_size=batch, instance_count=SMP_INSTANCES,
                                 tensor_parallel=tp, mfu=mfu, overlap=overlap, strategies=(planner.FULL,))
                row = p.row(planner.FULL)
                rows.append(dict(tp=tp, dp=dp, batch=batch, mfu=mfu, overlap=overlap, sps=row.samples_per_sec,
                                 gb=row.memory.total / 1e9, fits=row.fits, comm=row.step.exposed_comm_s,
                                 step=row.step.total_s, compute=row.step.compute_s))
    return rows


def implied_mfu() -> float:
    """The fraction of the A100s' bf16 peak the published throughput implies (checkpointed FLOPs)."""
    gpt3 = planner.transformer("GPT-3 175B", 96, 12288, 96, 2048, 50257, activation_checkpointing=True)
    inst = planner.get_instance("ml.p4d.24xlarge")
    return SMP_PUBLISHED * gpt3.flops_per_sample / (SMP_INSTANCES * inst.gpus * inst.peak_tflops * 1e12)


def _ddp_efficiency(model: planner.Model, inst: planner.InstanceType, nodes: int, batch: int, mfu: float) -> float:
    p = planner.plan(model, inst, batch_size=batch, instance_count=nodes, mfu=mfu, overlap=0.0,
                     strategies=(planner.DDP,))
    return p.row(planner.DDP).efficiency


def smddp_bounds(batch: int = 16, mfu: float = 0.4) -> list[dict]:
    """Per node count: the planner's DDP efficiency at the catalogue's 100 Gbit/s, the ceiling it
    puts on any all-reduce speedup, and the highest network bandwidth DDP can have had for the
    published speedup to be possible at all (bisection on the instance's bandwidth)."""
    bert = planner.transformer("BERT-large", layers=24, d_model=1024, heads=16, seq_len=512, vocab=30522)
    inst = planner.get_instance("ml.p3dn.24xlarge")
    rows = []
    for nodes, published in SMDDP_SPEEDUP.items():
        eff = _ddp_efficiency(bert, inst, nodes, batch, mfu)
        target = 1 / (1 + published)  # DDP's efficiency can be at most this
        lo, hi = 0.01, inst.network_gbps
        if eff <= target:
            implied = inst.network_gbps
        else:
            for _ in range(60):
                mid = math.sqrt(lo * hi)
                slower = dataclasses.replace(inst, network_gbps=mid)
                lo, hi = (mid, hi) if _ddp_efficiency(bert, slower, nodes, batch, mfu) <= target else (lo, mid)
            implied = lo
        rows.append(dict(nodes=nodes, efficiency=eff, ceiling=1 / eff - 1, published=published, implied_gbps=implied))
    return rows


def report() -> str:
    lines = ["## The planner against published figures", ""]
    grid = smp_grid()
    lo, hi = min(r["sps"] for r in grid), max(r["sps"] for r in grid)
    lines += [
        f"**SMP, 175B parameters on {SMP_INSTANCES} x ml.p4d.24xlarge**: published {SMP_PUBLISHED:.0f} samples/s. "
        f"The throughput implies {implied_mfu():.0%} of the A100s' bf16 peak (counting the recomputed forward "
        "of activation checkpointing). The planner, full sharding with checkpointing, 2,048-token sequences, "
        "GPT-3's global batch of 1,536:",
        "",
        "| tensor parallel | data parallel | sequences per rank | mfu | overlap | GB per GPU (fits 40 GB?) "
        "| exposed comm s | step s | predicted samples/s | error |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in grid:
        lines.append(
            f"| {r['tp']} | {r['dp']} | {r['batch']} | {r['mfu']:.1f} | {r['overlap']:.0f} "
            f"| {r['gb']:.1f} ({'yes' if r['fits'] else 'no'}) | {r['comm']:.2f} | {r['step']:.2f} "
            f"| {r['sps']:.1f} | {(r['sps'] - SMP_PUBLISHED) / SMP_PUBLISHED:+.0%} |"
        )
    lines += [
        "",
        f"Range {lo:.1f}-{hi:.1f} samples/s around the published {SMP_PUBLISHED:.0f}. The planner leaves out tensor "
        "and pipeline parallelism's own communication and any pipeline bubble, so where it is above the "
        "published figure that is the direction expected.",
        "",
    ]
    bounds = smddp_bounds()
    lines += [
        "**smddp vs PyTorch DDP, BERT on ml.p3dn.24xlarge** (only relative speedups are published; assumed "
        "here: BERT-large, 512 tokens, 16 sequences per GPU, mfu 0.4, no overlap):",
        "",
        "| nodes | planner's DDP efficiency at 100 Gbit/s | ceiling on any all-reduce speedup | published smddp "
        "speedup | possible? | highest bandwidth DDP can have reached, Gbit/s |",
        "|---:|---:|---:|---:|:-:|---:|",
    ]
    for r in bounds:
        ok = r["published"] <= r["ceiling"] + 1e-9
        lines.append(f"| {r['nodes']} | {r['efficiency']:.2f} | {r['ceiling']:+.0%} | {r['published']:+.0%} "
                     f"| {'yes' if ok else 'no'} | {r['implied_gbps']:.1f} |")
    lines += [
        "",
        "The ceiling is what removing DDP's exposed communication entirely would give, with the all-reduce "
        "running at the instance's full 100 Gbit/s. The published 41% and 52% exceed it: they are possible "
        "only if PyTorch 1.6's DDP on those p3dn clusters reached a fraction of the link, at most the "
        "bandwidth in the last column. So the planner's figures for a real library are an upper bound on "
        "its efficiency; measure the bus bandwidth your job reaches (nccl-tests, or "
        "benchmarks/bench_allreduce.py's method) and give it to the planner as the instance's bandwidth. The "
        "13% at 8 nodes, below the 52% at 4, is not something a bandwidth model produces; the page gives no reason.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="also write the report (markdown) here")
    args = p.parse_args(argv)
    text = report()
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"Wrote {args.out}.")
    return 0 if math.isfinite(implied_mfu()) else 1


if __name__ == "__main__":
    sys.exit(main())
