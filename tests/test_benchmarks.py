"""The benchmark commands run end to end, small: what they write and the bytes they count.

The real runs (`make bench`, minutes) are not timed here; these check that each command works on
a fresh machine and that its byte accounting still matches the formulas it reports against.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workshop import REPO_ROOT

BENCH = REPO_ROOT / "benchmarks"
SCRIPTS = ["bench_data_parallel.py", "bench_allreduce.py", "bench_strategies.py", "planner_validation.py",
           "bench_runtime.py", "bench_cli.py", "bench_your_script.py", "bench_notebooks.py", "bench_grad_accum.py",
           "bench_pipeline.py", "bench_tensor_parallel.py", "bench_staleness.py", "bench_lab1_startup.py"]


def run(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_documents_its_options(script: str) -> None:
    proc = run(script, "--help", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--out" in proc.stdout


def test_planner_validation_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "planner_validation.md"
    proc = run("planner_validation.py", "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "published 32 samples/s" in text and "| 8 | 120 |" in text
    assert text.count("| 2 |") >= 1 and "smddp" in text


def test_the_published_smp_throughput_lies_inside_the_planners_spread() -> None:
    sys.path.insert(0, str(BENCH))
    import planner_validation as pv

    grid = pv.smp_grid()
    predicted = [r["sps"] for r in grid]
    assert min(predicted) < pv.SMP_PUBLISHED < max(predicted), predicted
    assert all(r["fits"] for r in grid)  # 175B fits 40 GB GPUs only because it is sharded 960 ways
    assert 0.25 < pv.implied_mfu() < 0.40  # 32 samples/s is about 31% of the A100s' peak
    rows = pv.smddp_bounds()
    assert [r["nodes"] for r in rows] == [2, 4, 8]
    for r in rows:
        assert 0 < r["efficiency"] <= 1 and r["ceiling"] == pytest.approx(1 / r["efficiency"] - 1)
        assert 0 < r["implied_gbps"] <= 100


def test_side_by_side_expects_fsdps_bytes_from_the_planner() -> None:
    """FSDP2 on gloo: 2 all-gathers ((N-1)/N K each) + a reduce-scatter that is a whole all-reduce
    (2(N-1)/N K) per step, summed over the CNN's 4 units: 4(N-1)/N K, what the loopback counters saw."""
    sys.path.insert(0, str(BENCH))
    import bench_strategies as bs

    k = 4 * 421_642
    for n in (2, 4):
        assert bs.expected_bytes(bs.FSDP, n, k) == pytest.approx(4 * (n - 1) / n * k)
        assert bs.expected_bytes(bs.DDP, n, k) == pytest.approx(2 * (n - 1) / n * k)
    assert bs.expected_bytes(bs.FSDP, 1, k) == 0
    assert bs.FSDP_UNITS == 4  # cnn_worker.py --mode fsdp: conv1, conv2, fc1, fc2 (the root keeps none)
    worker = (BENCH / "workers" / "cnn_worker.py").read_text()
    assert "for layer in (model.conv1, model.conv2, model.fc1, model.fc2):" in worker


def test_the_side_by_side_table_says_why_horovod_beyond_the_cores_is_not_modelled() -> None:
    """Horovod's planner cell is marked, with the reason under the table, where its processes outnumber the cores
    (its negotiation cycle, which the planner leaves out); with as many cores as processes, nothing is marked."""
    sys.path.insert(0, str(BENCH))
    import bench_strategies as bs

    def row(strategy, procs, step_s, predicted_s):
        run = bs.Run(strategy, procs, 1000.0, step_s, 100, 10.0, None, None, "", "")
        return bs.Row(strategy, procs, run, 1.0, step_s / 2, step_s / 2, 0.0, predicted_s=predicted_s)

    rows = [row(bs.HVD, 2, 0.034, 0.027), row(bs.HVD, 4, 0.130, 0.065), row(bs.DDP, 4, 0.063, 0.065)]
    marked = bs.markdown(rows, cores=2)
    lines = marked.splitlines()
    assert lines[3].endswith("65.0 (-50%) † |") and lines[4].endswith("65.0 (+3%) |")  # Horovod at 4; DDP at 4
    assert lines[2].endswith("27.0 (-21%) |")  # Horovod at 2 processes on 2 cores: held to the planner
    assert "† Horovod with more processes than cores" in marked and "HOROVOD_CYCLE_TIME" in marked
    assert "†" not in bs.markdown(rows, cores=4)


@pytest.mark.slow
def test_fsdp_unit_microbenchmark_measures_a_positive_cost_per_unit() -> None:
    sys.path.insert(0, str(BENCH))
    import bench_strategies as bs

    one, two = bs.fsdp_unit_cost(1, units=2, steps=4), bs.fsdp_unit_cost(2, units=2, steps=4)
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert 0 < one["unit_s"] < 1 and 0 < two["unit_s"] < 5
    assert two["fsdp_step_s"] > two["plain_step_s"]


@pytest.mark.slow
def test_allreduce_microbenchmark_counts_the_ring_volume(tmp_path: Path) -> None:
    proc = run("bench_allreduce.py", "--ranks", "2", "--max-mib", "1", "--out-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("bench_allreduce.csv", "bench_allreduce.md", "bench_allreduce.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = list(csv.DictReader((tmp_path / "bench_allreduce.csv").open()))
    assert {int(r["size_bytes"]) for r in rows} >= {4096, 1 << 20}, rows[0].keys()


@pytest.mark.slow
def test_side_by_side_benchmark_smoke_run(tmp_path: Path) -> None:
    """DDP only, 1 and 2 processes, one repeat: the whole pipeline, and its byte count; with
    --profile, lab 3's profiler report next to it."""
    proc = run("bench_strategies.py", "--strategies", "ddp", "--procs", "1", "2", "--epochs", "2",
               "--repeats", "1", "--profile", "--out-dir", str(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Planner vs measured, DDP N=2" in proc.stdout
    rows = {int(r["processes"]): r for r in csv.DictReader((tmp_path / "bench_strategies.csv").open())}
    assert set(rows) == {1, 2}
    assert float(rows[2]["samples_per_sec"]) > 0 and float(rows[2]["planner_step_s"]) > 0
    measured, expected = float(rows[2]["loopback_bytes_per_rank_step"]), float(rows[2]["expected_bytes_per_rank_step"])
    # Ring all-reduce: 2(N-1)/N x 1.69 MB per rank-step; start-up, evaluation and headers add a little.
    assert expected * 0.98 < measured < expected * 1.10, (measured, expected)
    assert (tmp_path / "bench_strategies.png").stat().st_size > 0
    assert "| DDP (lab 3) | 2 |" in (tmp_path / "bench_strategies.md").read_text()
    # the profiler's shares sit next to the benchmark's (whether they agree is the benchmark's to print)
    [row] = [line for line in (tmp_path / "profile_vs_bench.md").read_text().splitlines() if line.startswith("| 2 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert all(re.match(r"-?\d+%", c) for c in cells[1:4]) and cells[5] in ("yes", "no"), row


@pytest.mark.slow
def test_the_parameter_servers_bytes_are_counted(tmp_path: Path) -> None:
    """The parameter server's simulated hosts must talk over the benchmark's own loopback: on the
    container runtime each host had a network namespace of its own and the table said 0 bytes."""
    proc = run("bench_strategies.py", "--strategies", "parameter_server", "--procs", "1", "--repeats", "1",
               "--ps-steps-per-worker", "10", "--out-dir", str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [row] = list(csv.DictReader((tmp_path / "bench_strategies.csv").open()))
    measured, expected = float(row["loopback_bytes_per_rank_step"]), float(row["expected_bytes_per_rank_step"])
    # 2K per worker step (pull the weights, push the gradient), plus gRPC framing, start-up and evaluation,
    # which weigh more in a run this short (30 steps)
    assert expected < measured < expected * 1.6, (measured, expected)


@pytest.mark.slow
def test_runtime_benchmark_times_every_launcher(tmp_path: Path) -> None:
    """One repeat of each way (bare torchrun, the process and the container runtime), without the
    warm-ups that only steady the timings: every job really all-reduced (the benchmark checks), and
    the table has a row per way and layout."""
    proc = run("bench_runtime.py", "--repeats", "1", "--warm-ups", "0", "--out-dir", str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = (tmp_path / "bench_runtime.md").read_text()
    for way in ("bare torchrun", "process runtime", "container runtime"):
        assert table.count(f"| {way} |") == 2, table
    rows = list(csv.DictReader((tmp_path / "bench_runtime.csv").open()))
    assert len(rows) == 6 and all(float(r["median_s"]) > 0 for r in rows)


def test_cli_benchmark_times_each_command_against_the_bare_interpreter(tmp_path: Path) -> None:
    """Its table has every command and the interpreter's own start; not its timings (noise here)."""
    proc = run("bench_cli.py", "--repeats", "1", "--sdk-repeats", "1", "--out-dir", str(tmp_path), timeout=300)
    table = (tmp_path / "bench_cli.md").read_text()
    assert proc.returncode in (0, 1), proc.stderr
    for command in ("python -c pass", "--help", "labs", "run nosuchlab"):
        assert f"| `{command}` |" in table
    assert re.search(r"\| `--help` \| \d+\.\d\d s \| \d+\.\d\d s \| [+-]\d+\.\d\d s \| (yes|NO) \|", table), table
    for way in ("the SDK alone", "the SDK through the workshop"):
        assert re.search(rf"\| {way} \| \d+\.\d\d s \| \d+\.\d\d s \| \d+\.\d\d x \|", table), table
