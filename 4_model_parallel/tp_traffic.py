"""Tensor parallel's traffic, measured: `code/tensor_parallel.py` under torchrun on 2 ranks, in a private network
namespace whose loopback counters hold its bytes and nothing else's, against the formula, and its step time
against the planner's (`workshop.planner.tensor_parallel_step`).

    from tp_traffic import run, check            # model_parallel.ipynb puts this folder on sys.path
    records = run(batch_sizes=(4, 8))            # one METRICS record per block (MLP, attention) and batch size
    check(records)                               # 2 all-reduces of b x s x h per block and step, in bytes too

The formula. A block split column-wise then row-wise makes each rank a partial sum of the block's output: one
all-reduce of b x s x h numbers joins them in the forward, and one of the same size joins the gradient of the
block's input in the backward. An all-reduce of K bytes over N ranks (a ring, gloo's) sends 2(N-1)/N x K from
each rank: 2(N-1) x K over the job. So a block's step sends 2 x 2(N-1) x b x s x h x 4 bytes (fp32), whatever
its weights; the Linear layers' weights never move. model_parallel.ipynb, tests/test_tp_traffic.py and
benchmarks/bench_tensor_parallel.py run it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "code" / "tensor_parallel.py"
WORLD = 2
BYTES_PER_NUMBER = 4  # fp32 activations
# Measured bytes against the formula: the loopback also carries TCP/IP's headers and gloo's framing (0.2% at
# 1 MB per all-reduce on this workshop's 2-core VM, 2026-11-28); the checks allow this much either way.
BYTES_TOLERANCE = 0.05
# The model the notebook measures: small enough for seconds per run on 2 cores, each all-reduce large enough
# (hundreds of kB) that the headers are a small share of its bytes.
TP_MODEL = {"d-model": 256, "heads": 8, "seq-len": 128}
_NETNS_SH = 'ip link set lo up 2>/dev/null; exec "$@"'


def formula_bytes(batch_size: int, seq_len: int, d_model: int, world: int = WORLD) -> int:
    """The bytes one block's forward-backward step sends over the whole job: two all-reduces of b x s x h."""
    return 2 * 2 * (world - 1) * batch_size * seq_len * d_model * BYTES_PER_NUMBER


def private_network() -> tuple[bool, str]:
    """Whether a run can have a network namespace of its own here (`unshare -rn`), and if not, why."""
    from workshop.launchers.horovod_probe import private_network as check

    return check()


def run(batch_sizes: Iterable[int] = (4, 8), *, steps: int = 10, blocks: str = "mlp,attention", model: dict | None = None,
        private: bool | None = None, timeout_s: float = 300) -> list[dict[str, Any]]:
    """code/tensor_parallel.py on 2 ranks (torchrun, one thread each): one record per block and batch size (the
    bytes grow with b, s and h, not with the weights).
    In a private network namespace where the system allows one (`private`: None, there if it can; True
    insists); without one, the bytes are the shared loopback's and the record says `private: False`."""
    from workshop import metrics
    from workshop.runtime.contract import base_process_env

    model = {**TP_MODEL, **(model or {})}
    argv = [str(SCRIPT), "--blocks", blocks, "--batch-sizes", ",".join(map(str, batch_sizes)), "--steps", str(steps),
            *(f"--{k}={v}" for k, v in model.items())]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}", *argv]
    from workshop.launchers.horovod_probe import in_private_network, wanted_private_network

    isolated = wanted_private_network(private)
    if isolated:
        cmd = in_private_network(["sh", "-c", _NETNS_SH, "sh", *cmd])
    env = {**base_process_env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=HERE, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout_s)
    lines = (proc.stdout + proc.stderr).splitlines()
    if proc.returncode != 0:
        tail = "\n".join(lines[-30:])
        raise RuntimeError(f"code/tensor_parallel.py failed, exit status {proc.returncode}:\n{tail}")
    records = [r for r in metrics.parse_lines(lines) if "block" in r]
    for r in records:
        r.update(private=isolated, wall_s=time.perf_counter() - t0,
                 formula_bytes=formula_bytes(r["batch_size"], r["seq_len"], r["d_model"], r["world_size"]))
    return records


def planner_step(record: dict[str, Any]):
    """The planner's step for one record (`workshop.planner.tensor_parallel_step`), from what the same run measured
    apart from the split block: the whole block's forward and backward on every rank at once (its compute per
    sample), all-reduces of 4 bytes and of the block's output alone (the link's latency and bandwidth, in the
    ring formula's terms), and a split block too small to compute (what splitting costs besides compute and
    bytes: `block_overhead_s`). Nothing is fitted to the split block's steps."""
    from workshop import planner

    n, b = record["world_size"], record["batch_size"]
    payload = b * record["seq_len"] * record["d_model"] * BYTES_PER_NUMBER
    latency = record["allreduce_4b_ms"] / 1e3
    alpha = latency / (2 * (n - 1))
    bandwidth = 2 * (n - 1) / n * payload / max(record["allreduce_ms"] / 1e3 - latency, 1e-9)
    model = planner.Model(f"code/tensor_parallel.py's {record['block']}", params=record["params"],
                          compute_s_per_sample=record["whole_ms"] / 1e3 / b,
                          handoff_bytes_per_sample=record["seq_len"] * record["d_model"] * BYTES_PER_NUMBER)
    machine = planner.local_instance(n, alpha, bandwidth, name=f"this machine, {n} ranks of one core each")
    return planner.tensor_parallel_step(model, machine, n, b, blocks=1, block_overhead_s=block_overhead_s(record))


def block_overhead_s(record: dict[str, Any]) -> float:
    """What the split block costs per step besides its compute and bytes, from the run's tiny block (too small to
    compute or send anything): its split step less its whole step and its two all-reduces' latency."""
    return max(0.0, (record["tiny_split_ms"] - record["tiny_whole_ms"] - 2 * record["allreduce_4b_ms"]) / 1e3)


def rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The notebook's and the benchmark's table: per block and batch, the collectives, the bytes against the
    formula, and the step against the planner's."""
    out = []
    for r in records:
        predicted = planner_step(r).total_s
        out.append({
            "block": r["block"], "b x s x h": f"{r['batch_size']} x {r['seq_len']} x {r['d_model']}",
            "all-reduces per step": r["all_reduces"],
            "MB per step": round(r["bytes_per_step"] / 1e6, 3), "formula MB": round(r["formula_bytes"] / 1e6, 3),
            "measured / formula": round(r["bytes_per_step"] / r["formula_bytes"], 3),
            "step ms": round(r["step_ms"], 1), "planner ms": round(predicted * 1e3, 1),
            "planner / measured": round(predicted * 1e3 / r["step_ms"], 2),
        })
    return out


def check(records: list[dict[str, Any]]) -> str:
    """What holds on any machine: each block's split output and gradients are the whole block's, its step makes
    two all-reduces (PyTorch's count), and, in a private network, its bytes are the formula's within
    BYTES_TOLERANCE. Raises AssertionError naming what did not hold; returns a line saying what did."""
    assert records, "no block was measured"
    for r in records:
        what = f"{r['block']} at batch {r['batch_size']}"
        assert r["max_diff"] <= 1e-4, f"{what}: the split block differs from the whole by {r['max_diff']:.2e}"
        assert (r["all_reduces"], r["other_collectives"]) == (2, 0), \
            (f"{what}: {r['all_reduces']} all-reduces and {r['other_collectives']} other collectives per step, not "
             "2 all-reduces (one forward, one backward)")
        if r["private"]:
            share = r["bytes_per_step"] / r["formula_bytes"]
            assert abs(share - 1) <= BYTES_TOLERANCE, \
                f"{what}: {r['bytes_per_step']:,.0f} bytes per step, {share:.3f} of the formula's {r['formula_bytes']:,}"
    shares = [r["bytes_per_step"] / r["formula_bytes"] for r in records if r["private"]]
    return (f"{len(records)} block runs: 2 all-reduces per step each, outputs and gradients the whole block's"
            + (f"; bytes {min(shares):.3f}-{max(shares):.3f} of the formula" if shares else
               "; bytes not checked (no private network here)"))
