"""Scripts brought in unchanged: the local cluster runs scripts written the way their frameworks'
own tutorials and examples write them, not for this workshop, on 2 simulated hosts on this
machine's cores, through the two ways a user brings a script of their own (`workshop.script_mode`):
`workshop.train_locally` on the SDK v3 ModelTrainer they would write (the parameter-server
tutorial, the DDP tutorial, the script-mode example), and `python -m workshop run-script` (the two
Horovod examples). Each script runs once; the launchers are the workshop's ParameterServer and
Horovod drivers and the SDK's Torchrun driver.

Each lives in its own folder (its source_dir) under tests/fixtures/unmodified/, with a header
saying where it comes from and what was changed (synthetic data instead of a download, CPU
instead of CUDA); fewer steps come from each script's own flags, passed as hyperparameters.

And the reason some of them once hung: every simulated host sizes TensorFlow's inter-op pool as
its instance would (`contract.thread_pool_env`), not from its share of this machine's cores.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from conftest import FIXTURES, LAB3_IMAGE, PROBE_CODE
from sagemaker.train.distributed import Torchrun

from workshop.__main__ import main
from workshop.launchers.parameter_server import ParameterServer
from workshop.runtime.contract import LOCAL_INSTANCE_VCPUS, instance_vcpus, thread_pool_env
from workshop.runtime.local_cluster import LocalCluster
from workshop.script_mode import ScriptResult, train_locally

UNMODIFIED = FIXTURES / "unmodified"
HOSTS = 2
# The TensorFlow scripts are Keras 2 code; a job says so as ModelTrainer(environment=...) would.
KERAS_2 = {"TF_USE_LEGACY_KERAS": "1"}
# Generous: a job that hangs is stopped here, and the test fails with the hosts' last lines.
TIMEOUT_S = 600


# How PyTorch 2.13's gloo can end a rank at interpreter exit, after all its work is done: a thread
# still joinable in the C++ teardown. Seen with 3 torchrun nodes in about 1 run in 6 of the DDP
# tutorial and 1 in 8 of a plain all_reduce script, with bare torchrun as on the local cluster.
EXIT_ABORT = "terminate called without an active exception"


def train(tmp_path, folder: str, entry: str, distributed, hyperparameters: dict, channels=None, env=None,
          exit_abort_ok: bool = False) -> ScriptResult:
    """`train_locally` on the ModelTrainer a user writes for the script (Docker mode, as the SDK's own local
    example: no AWS call), HOSTS instances; it must succeed (with `exit_abort_ok`, a rank may also have been
    aborted by PyTorch's teardown at its exit: the caller checks the work was done)."""
    from sagemaker.train.configs import Compute, InputData, SourceCode, StoppingCondition
    from sagemaker.train.model_trainer import Mode, ModelTrainer

    trainer = ModelTrainer(
        training_image=LAB3_IMAGE, training_mode=Mode.LOCAL_CONTAINER, base_job_name="unmodified",
        source_code=SourceCode(source_dir=str(UNMODIFIED / folder), entry_script=entry), distributed=distributed,
        compute=Compute(instance_type="ml.m5.xlarge", instance_count=HOSTS), hyperparameters=hyperparameters,
        environment=env or {}, stopping_condition=StoppingCondition(max_runtime_in_seconds=TIMEOUT_S),
        input_data_config=[InputData(channel_name=name, data_source=str(path)) for name, path in (channels or {}).items()],
    )
    result = train_locally(trainer, workdir=tmp_path / "run", echo=False, check=False)
    aborted_at_exit = (exit_abort_ok and not result.ok and "was killed by SIGABRT" in result.failure.splitlines()[0]
                       and EXIT_ABORT in result.failure)
    assert result.ok or aborted_at_exit, f"{result.failure}\nlast lines:\n" + "\n".join(result.lines[-40:])
    return result


def run_script(tmp_path, capsys, folder: str, entry: str, *argv: str) -> list[str]:
    """`python -m workshop run-script` (in this process) on HOSTS hosts; it must succeed. Its lines, from the log."""
    workdir = tmp_path / "work"
    code = main(["run-script", str(UNMODIFIED / folder / entry), "--hosts", str(HOSTS), "--workdir", str(workdir), *argv])
    out = capsys.readouterr()
    (run,) = (workdir / "runs").glob("script-*")
    lines = (run / "logs" / "cluster.log").read_text().splitlines()
    assert code == 0, out.out + out.err + "\nlast lines:\n" + "\n".join(lines[-40:])
    return lines


def said(lines: list[str] | ScriptResult, rank: int, pattern: str) -> list[re.Match]:
    """What `rank` printed that matches `pattern` (its lines, without their `[host/rank]` tag)."""
    lines = lines.lines if isinstance(lines, ScriptResult) else lines
    tag = f"/{rank}] "
    return [m for line in lines if tag in line and (m := re.search(pattern, line.split(tag, 1)[1]))]


# --------------------------------------------------------------------------- the scripts


@pytest.mark.slow
def test_tensorflow_parameter_server_tutorial_learns_its_role_from_tf_config(moto_session, tmp_path):
    """TensorFlow's own parameter-server tutorial (custom training loop): its tasks wait on each
    other's tensors, which with one inter-op thread per task hung at the first step. It reads its role
    from TF_CONFIG alone, and never its command line: the flags a job's hyperparameters become do not
    trouble it (a script that parses them strictly: tests/test_runtime_robustness.py)."""
    result = train(tmp_path, "tf_parameter_server", "train.py", ParameterServer(), {"epochs": 4}, env=KERAS_2)
    epochs = said(result, 0, r"Finished epoch (\d+), accuracy is ([\d.]+)\.")
    assert [int(m[1]) for m in epochs] == [0, 1, 2, 3]
    assert said(result, 0, r"Final loss is [\d.]+")
    # The embedding's two shards live on the two parameter servers, as the tutorial checks.
    devices = {m[0] for m in said(result, 0, r"^/job:ps/replica:0/task:\d/device:CPU:0$")}
    assert len(devices) == 2, devices
    started = [line for line in result.lines if re.search(r"\[ps_driver\] started (ps|worker|chief) \d", line)]
    assert len(started) == 2 * HOSTS  # a parameter server on every host, the coordinator and a worker
    assert all(line.endswith("train.py --epochs 4") for line in started), started  # each given the flags


@pytest.mark.slow
def test_horovod_tensorflow2_synthetic_benchmark(tmp_path, capsys):
    lines = run_script(tmp_path, capsys, "horovod_tf2_synthetic", "tensorflow2_synthetic_benchmark.py",
                       "--launcher", "horovod", "--env", "TF_USE_LEGACY_KERAS=1", "--hp", "model=MobileNet",
                       "--hp", "batch-size=4", "--hp", "num-warmup-batches=1", "--hp", "num-batches-per-iter=1",
                       "--hp", "num-iters=2")
    assert said(lines, 0, rf"Number of \w+s: {HOSTS}$")
    assert len(said(lines, 0, r"^Iter #\d: [\d.]+ img/sec")) == 2
    assert said(lines, 0, rf"^Total img/sec on {HOSTS} \w+\(s\): [\d.]+")


@pytest.mark.slow
def test_horovod_pytorch_mnist(tmp_path, capsys):
    lines = run_script(tmp_path, capsys, "horovod_pytorch_mnist", "pytorch_mnist.py", "--launcher", "horovod",
                       "--hp", "epochs=1", "--hp", "log-interval=10")
    for rank in range(HOSTS):  # each rank trains on its half of the 6,000 samples
        assert said(lines, rank, r"^Train Epoch: 1 \[\d+/3000 "), rank
    assert said(lines, 0, r"^Test set: Average loss: [\d.]+, Accuracy: [\d.]+%")


@pytest.mark.slow
def test_ddp_tutorial_multinode(moto_session, tmp_path):
    # The tutorial as written can lose a rank to PyTorch's teardown at exit (EXIT_ABORT), after the
    # training this test checks. A snapshot after the first epoch only: the ranks end together.
    result = train(tmp_path, "ddp_multinode", "multinode.py", Torchrun(process_count_per_node=1),
                   {"total_epochs": 2, "save_every": 2}, exit_abort_ok=True)
    for rank in range(HOSTS):  # DistributedSampler: 2048 samples in 2 shards of 1024, batches of 32
        assert len(said(result, rank, rf"^\[GPU{rank}\] Epoch [01] \| Batchsize: 32 \| Steps: 32$")) == 2, rank
    assert [m[0] for m in said(result, 0, r"^Epoch \d \| Training snapshot saved at snapshot.pt$")] == [
        "Epoch 0 | Training snapshot saved at snapshot.pt"]
    assert (result.cluster.hosts[0].sandbox.code_dir / "snapshot.pt").is_file()  # rank 0 saves, in its working folder


@pytest.mark.slow
def test_script_mode_argparse_flags(moto_session, tmp_path):
    """Hyperparameters arrive as the flags SageMaker's documentation parses, the channels and
    the model folder as its SM_* defaults; rank 0 saves the model, and model.tar.gz holds it, from algo-1."""
    rng = np.random.default_rng(0)
    channels = {}
    for name, size in (("train", 3000), ("test", 500)):
        x = rng.normal(size=(size, 10)).astype(np.float32)
        channels[name] = tmp_path / "data" / name
        channels[name].mkdir(parents=True)
        np.savez(channels[name] / f"{name}.npz", x=x, y=(x[:, 0] + x[:, 1] > 0).astype(np.int64))
    result = train(tmp_path, "script_mode", "train.py", Torchrun(process_count_per_node=1),
                   {"epochs": 3, "batch-size": 32, "learning-rate": 0.1}, channels=channels, exit_abort_ok=True)
    for rank in range(HOSTS):
        assert said(result, rank, rf"^rank {rank} of {HOSTS}: epochs=3 batch_size=32 learning_rate=0.1 "
                                  r"train=/opt/ml/input/data/train$"), rank
    assert float(said(result, 0, r"^test accuracy ([\d.]+)$")[0][1]) >= 0.9
    assert (result.hosts[0].model_dir / "model.pth").is_file()
    if result.ok:  # archives are made for a job that succeeded
        assert result.model.members == {"model.pth": "algo-1"} and result.clashes == []


# --------------------------------------------------------------------------- the hosts' thread pools


@pytest.mark.parametrize("instance_type, vcpus", [
    ("ml.g5.xlarge", 4), ("ml.c5.2xlarge", 8), ("ml.m5.large", 2), ("ml.p4d.24xlarge", 96),
    ("ml.p5.48xlarge", 192), ("ml.trn1.32xlarge", 128), ("c5.9xlarge", 36), ("ml.t3.medium", 2),
    ("local", None), (None, None), ("ml.g5", None), ("ml.c5.metal", None),
])
def test_instance_vcpus_from_the_size_in_its_name(instance_type, vcpus):
    assert instance_vcpus(instance_type) == vcpus


def test_tensorflows_inter_op_pool_follows_the_instance_not_the_hosts_share():
    assert thread_pool_env("ml.c5.2xlarge", 1) == {"TF_NUM_INTEROP_THREADS": "8"}
    assert thread_pool_env("local", 1) == {"TF_NUM_INTEROP_THREADS": str(LOCAL_INSTANCE_VCPUS)}
    assert thread_pool_env("local", 32) == {"TF_NUM_INTEROP_THREADS": "32"}  # a host bigger than "local"'s 4


@pytest.mark.slow
@pytest.mark.parametrize("runtime, instance_type, extra_env, expected", [
    ("container", None, {}, str(LOCAL_INSTANCE_VCPUS)),
    ("process", "ml.c5.2xlarge", {}, "8"),
    ("container", "ml.c5.2xlarge", {"TF_NUM_INTEROP_THREADS": "3"}, "3"),  # the job's own setting wins
], ids=["container-local", "process-c5.2xlarge", "container-job-setting"])
def test_every_rank_sees_its_instances_inter_op_threads(tmp_path, channels, runtime, instance_type, extra_env, expected):
    cluster = LocalCluster(PROBE_CODE, "train.py", hosts=HOSTS, distributed=Torchrun(process_count_per_node=1),
                           workdir=tmp_path / "run", echo=False, runtime=runtime, instance_type=instance_type,
                           extra_env=extra_env)
    result = cluster.run({}, channels)
    seen = [json.loads(f.read_text()) for h in result.hosts for f in h.output_data_dir.glob("env-rank*.json")]
    assert len(seen) == HOSTS
    assert {env["TF_NUM_INTEROP_THREADS"] for env in seen} == {expected}
    if runtime == "container":  # still pinned to their share of the cores: the pools that compute follow it
        assert {len(env["cpus"]) for env in seen} == {max(1, len(os.sched_getaffinity(0)) // HOSTS)}
