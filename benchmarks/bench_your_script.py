"""What running your own script on the local cluster costs, against its framework's own launcher.

    python benchmarks/bench_your_script.py [--scripts NAME ...] [--repeats 3] [--warm-ups 1] [--out-dir images/]

Each of the five tutorial-style scripts of tests/fixtures/unmodified/ (written for their frameworks, not for
this workshop) runs on 2 hosts x 1 process with the hyperparameters the tests give them, two ways:

- **bare**: what a person types without SageMaker or the workshop: two `torchrun --nnodes 2 --node-rank H`
  agents on 127.0.0.1 (the DDP tutorial, the script-mode example, the latter with the `SM_*` folders it
  reads set by hand); `horovodrun --gloo -np 2 -H localhost:2` (the two Horovod examples); TensorFlow's four
  processes by hand, each with its own TF_CONFIG (two parameter servers, the coordinator and one worker, as
  the workshop's driver lays them out; timed until the coordinator exits, then the servers are stopped);
- **local cluster**: `workshop.train_locally` on the ModelTrainer a user writes for it (Docker mode, as the
  SDK's own local example; the SDK's Torchrun, the workshop's Horovod and ParameterServer), timed from the
  call to its return: the sandboxes, the SDK's `sm_train.sh` and driver on every simulated host, the run, the
  sweep, and the aggregation of the model and output folders into `model.tar.gz` and `output.tar.gz`.

Repeats are interleaved (bare, local cluster, bare, ...) so that the machine's load falls on both alike; the
table shows each way's median wall time (min-max), the difference and the ratio. Output: the table on stdout
and `bench_your_script.{md,csv}` in `--out-dir`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
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

UNMODIFIED = ROOT / "tests" / "fixtures" / "unmodified"
BIN = Path(sys.executable).parent
HOSTS = 2
KERAS_2 = {"TF_USE_LEGACY_KERAS": "1"}
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch:2.13-cpu-amzn2023-sagemaker"
# name -> (folder, entry, launcher, hyperparameters, environment): the tests' settings (test_unmodified_scripts.py)
SCRIPTS = {
    "tf_parameter_server": ("tf_parameter_server", "train.py", "parameter_server", {"epochs": 4}, KERAS_2),
    "horovod_tf2_synthetic": ("horovod_tf2_synthetic", "tensorflow2_synthetic_benchmark.py", "horovod_tensorflow",
                              {"model": "MobileNet", "batch-size": 4, "num-warmup-batches": 1,
                               "num-batches-per-iter": 1, "num-iters": 2}, KERAS_2),
    "horovod_pytorch_mnist": ("horovod_pytorch_mnist", "pytorch_mnist.py", "horovod_pytorch",
                              {"epochs": 1, "log-interval": 10}, {}),
    "ddp_multinode": ("ddp_multinode", "multinode.py", "torchrun", {"total_epochs": 2, "save_every": 2}, {}),
    "script_mode": ("script_mode", "train.py", "torchrun", {"epochs": 3, "batch-size": 32, "learning-rate": 0.1}, {}),
}
BARE = {"parameter_server": "TF processes by hand", "horovod_tensorflow": "horovodrun --gloo",
        "horovod_pytorch": "horovodrun --gloo", "torchrun": "torchrun x 2"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def argv_of(hps: dict) -> list[str]:
    return [a for k, v in hps.items() for a in (f"--{k}", v if isinstance(v, str) else json.dumps(v))]


def script_mode_data(root: Path) -> dict[str, Path]:
    """The script-mode example's channels: the .npz files its test writes."""
    import numpy as np

    rng = np.random.default_rng(0)
    channels = {}
    for name, size in (("train", 3000), ("test", 500)):
        x = rng.normal(size=(size, 10)).astype(np.float32)
        channels[name] = root / "data" / name
        channels[name].mkdir(parents=True, exist_ok=True)
        np.savez(channels[name] / f"{name}.npz", x=x, y=(x[:, 0] + x[:, 1] > 0).astype(np.int64))
    return channels


def check(codes: list[int | None], what: str) -> None:
    if any(codes):
        raise SystemExit(f"{what} failed: exit codes {codes}")


def bare(name: str, scratch: Path, channels: dict[str, Path]) -> float:
    folder, entry, launcher, hps, extra = SCRIPTS[name]
    code = scratch / "code"  # a copy: the DDP tutorial writes its snapshot where it runs
    shutil.rmtree(code, ignore_errors=True)
    shutil.copytree(UNMODIFIED / folder, code)
    env = {**os.environ, **extra, "OMP_NUM_THREADS": "1"}
    quiet = {"cwd": code, "stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
    t0 = time.monotonic()
    if launcher == "torchrun":
        if name == "script_mode":  # the SM_* folders its argument parser reads
            for var in ("SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR"):
                env[var] = str(scratch / var.lower())
                Path(env[var]).mkdir(parents=True, exist_ok=True)
            env.update({"SM_CHANNEL_TRAIN": str(channels["train"]), "SM_CHANNEL_TEST": str(channels["test"])})
        port = free_port()
        agents = [subprocess.Popen([str(BIN / "torchrun"), f"--nnodes={HOSTS}", "--nproc-per-node=1", f"--node-rank={h}",
                                    "--master-addr=127.0.0.1", f"--master-port={port}", entry, *argv_of(hps)],
                                   env=env, **quiet) for h in range(HOSTS)]
        codes = [a.wait() for a in agents]
        if name == "ddp_multinode":  # its known teardown abort at exit (tests/test_unmodified_scripts.py: EXIT_ABORT)
            codes = [c if c not in (-6, 134) else 0 for c in codes]
        check(codes, f"bare torchrun ({name})")
    elif launcher.startswith("horovod"):
        proc = subprocess.run([str(BIN / "horovodrun"), "--gloo", "-np", str(HOSTS), "-H", f"localhost:{HOSTS}",
                               sys.executable, entry, *argv_of(hps)], env=env, **quiet, check=False)
        check([proc.returncode], f"horovodrun ({name})")
    else:  # TensorFlow's processes by hand: TF_CONFIG as the workshop's driver builds it for 2 hosts
        ports = [free_port() for _ in range(4)]
        cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"],
                   "ps": [f"127.0.0.1:{ports[2]}", f"127.0.0.1:{ports[3]}"]}
        roles = [("ps", 0), ("ps", 1), ("worker", 0), ("chief", 0)]
        procs = [subprocess.Popen([sys.executable, entry, *argv_of(hps)], **quiet,
                                  env={**env, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": t, "index": i}})})
                 for t, i in roles]
        code = procs[-1].wait()
        elapsed = time.monotonic() - t0
        for p in procs[:-1]:  # the servers join forever: stopped once the coordinator is done
            p.kill()
            p.wait()
        check([code], f"TensorFlow's processes ({name})")
        return elapsed
    return time.monotonic() - t0


def local_cluster(name: str, scratch: Path, channels: dict[str, Path]) -> tuple[float, float]:
    """(the train_locally call's wall time, the job's own wall time as the cluster measured it)."""
    from sagemaker.core.training.configs import Compute, InputData, SourceCode
    from sagemaker.train.distributed import Torchrun
    from sagemaker.train.model_trainer import Mode, ModelTrainer

    from workshop.launchers.horovod import Horovod
    from workshop.launchers.parameter_server import ParameterServer
    from workshop.script_mode import train_locally

    folder, entry, launcher, hps, extra = SCRIPTS[name]
    distributed = {"parameter_server": ParameterServer(), "torchrun": Torchrun(process_count_per_node=1),
                   "horovod_tensorflow": Horovod(framework="tensorflow", process_count_per_node=1),
                   "horovod_pytorch": Horovod(framework="pytorch", process_count_per_node=1)}[launcher]
    inputs = [InputData(channel_name=c, data_source=str(p)) for c, p in channels.items()] if name == "script_mode" else []
    trainer = ModelTrainer(training_image=IMAGE, training_mode=Mode.LOCAL_CONTAINER, base_job_name="bench",
                           source_code=SourceCode(source_dir=str(UNMODIFIED / folder), entry_script=entry),
                           distributed=distributed, compute=Compute(instance_type="ml.m5.xlarge", instance_count=HOSTS),
                           hyperparameters=hps, environment={**extra, "OMP_NUM_THREADS": "1"}, input_data_config=inputs)
    t0 = time.monotonic()
    result = train_locally(trainer, workdir=scratch / "run", echo=False, check=False)
    elapsed = time.monotonic() - t0
    aborted = name == "ddp_multinode" and "terminate called without an active exception" in (result.failure or "")
    if not (result.ok or aborted):
        raise SystemExit(f"the local cluster ({name}) failed: {result.failure}")
    return elapsed, result.wall_time_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scripts", nargs="+", choices=tuple(SCRIPTS), default=list(SCRIPTS), metavar="NAME",
                        help=f"which scripts (default: all five: {', '.join(SCRIPTS)})")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of each way")
    parser.add_argument("--warm-ups", type=int, default=1, help="untimed runs of each way first (imports, page cache)")
    parser.add_argument("--out-dir", default=str(ROOT / "images"), help="where the .md and .csv go")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warm_ups < 0:
        parser.error("--repeats must be at least 1 and --warm-ups at least 0")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")  # a Docker-mode ModelTrainer is built offline
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-your-script-"))
    times: dict[tuple[str, str], list[float]] = {}
    print(f"load average before: {load_average()}", flush=True)
    try:
        channels = script_mode_data(scratch)
        for name in args.scripts:
            for w in range(args.warm_ups):
                bare(name, scratch / f"warm-bare-{w}", channels)
                local_cluster(name, scratch / f"warm-local-{name}-{w}", channels)
            for r in range(args.repeats):
                t = bare(name, scratch / f"bare-{name}-{r}", channels)
                times.setdefault((name, "bare"), []).append(t)
                t, job = local_cluster(name, scratch / f"local-{name}-{r}", channels)
                times.setdefault((name, "local"), []).append(t)
                times.setdefault((name, "job"), []).append(job)
                print(f"{name} run {r + 1}: bare {times[(name, 'bare')][-1]:.1f} s, local cluster {t:.1f} s "
                      f"(the job itself {job:.1f} s)", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = []
    for name in args.scripts:
        b, loc, job = (times[(name, w)] for w in ("bare", "local", "job"))
        rows.append({"script": name, "bare_launcher": BARE[SCRIPTS[name][2]], "bare_median_s": round(statistics.median(b), 1),
                     "bare_min_s": round(min(b), 1), "bare_max_s": round(max(b), 1),
                     "local_median_s": round(statistics.median(loc), 1), "local_min_s": round(min(loc), 1),
                     "local_max_s": round(max(loc), 1), "job_median_s": round(statistics.median(job), 1),
                     "vs_bare_s": round(statistics.median(loc) - statistics.median(b), 1),
                     "ratio": round(statistics.median(loc) / statistics.median(b), 2)})
    lines = ["| script (2 hosts x 1 process) | bare launcher | bare, median (min-max) | local cluster, median (min-max) "
             "| of which the job | more than bare | ratio |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['script']} | {r['bare_launcher']} | {r['bare_median_s']:.1f} s ({r['bare_min_s']:.1f}-"
                     f"{r['bare_max_s']:.1f}) | {r['local_median_s']:.1f} s ({r['local_min_s']:.1f}-{r['local_max_s']:.1f}) "
                     f"| {r['job_median_s']:.1f} s | {r['vs_bare_s']:+.1f} s | {r['ratio']:.2f} |")
    note = (f"\n{args.repeats} interleaved repeat(s) per row after {args.warm_ups} untimed warm-up(s) of each, on "
            f"{os.cpu_count()} cores; load average after: {load_average()}. Local cluster: `workshop.train_locally` "
            "from the call to its return (sandboxes, sm_train.sh and the SDK's or the workshop's driver on every host, "
            "the run, the sweep, the archives); 'of which the job': the hosts' own run, as the cluster measured it.")
    table = "\n".join(lines)
    write_results(out_dir, "bench_your_script", table, note, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
