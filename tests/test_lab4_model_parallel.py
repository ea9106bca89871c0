"""Lab 4: sharded state at world size 4, SMP settings, bad input, the SageMaker request.

The notebook (4_model_parallel/model_parallel.ipynb, run by nbval) checks the sharded state per rank
at N = 1, 2, 4, activation checkpointing and offloading, equal losses, and tensor/pipeline parallelism."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workshop import metrics
from workshop.datasets.corpus import prepare_corpus
from workshop.errors import WorkshopError
from workshop.labs import get_lab
from workshop.runner import run_local, run_on_sagemaker

LAB = get_lab("model_parallel")
sys.path.insert(0, str(LAB.path))  # the lab's measurement grid, as its notebook imports it
from measure import measure  # noqa: E402

SCRIPT = LAB.entry_path
BIN = Path(sys.executable).parent
TINY = {"layers": 2, "d-model": 64, "heads": 4, "seq-len": 32, "batch-size": 8, "eval-sequences": 8}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return prepare_corpus(tmp_path_factory.mktemp("corpus"))


def run_script(cmd: list[str], tmp_path: Path, corpus, hps: dict) -> subprocess.CompletedProcess:
    args = [x for k, v in {**TINY, **hps}.items() for x in (f"--{k}", str(v))]
    args += ["--train", str(corpus.train_dir), "--test", str(corpus.test_dir), "--model-dir", str(tmp_path / "model")]
    return subprocess.run(cmd + [str(SCRIPT)] + args, capture_output=True, text=True, timeout=300, cwd=tmp_path)


def accounting(stdout: str) -> dict:
    return next(r for r in metrics.parse_lines(stdout.splitlines()) if "state_bytes" in r)


@pytest.mark.slow
def test_world_size_four_full_and_hybrid(corpus, tmp_path):
    full = measure("full_shard", 4, steps=2, data_dir=corpus.root, workdir=tmp_path / "full")
    assert len(full) == 4
    for row in full:
        assert abs(row["state_bytes"] / (row["full_state_bytes"] / 4) - 1) < 0.10, row
    hybrid = measure("hybrid_shard", 4, steps=2, data_dir=corpus.root, workdir=tmp_path / "hybrid",
                     hyperparameters={"hybrid-shard-degree": 2})
    for row in hybrid:  # 2 replicas x 2 shards: each rank holds half
        assert row["shard_group"] == 2
        assert abs(row["state_bytes"] / (row["full_state_bytes"] / 2) - 1) < 0.10, row


@pytest.mark.slow
def test_offloading_to_cpu_without_a_gpu_explains(corpus, tmp_path):
    """The simulated offloading's numbers are checked in the notebook (model_parallel.ipynb); here the
    GPU-only mode refuses, and names the way out, on a machine without one."""
    proc = run_script([sys.executable], tmp_path, corpus, {"steps": 2, "activation-offloading": "cpu"})
    assert proc.returncode != 0
    assert "needs a GPU" in proc.stderr and "already" in proc.stderr and "simulate" in proc.stderr


@pytest.mark.slow
def test_smp_settings_without_the_library_run_with_plain_pytorch(corpus, tmp_path):
    smp = json.dumps({"hybrid_shard_degree": 1, "sm_activation_offloading": True})
    proc = run_script([sys.executable], tmp_path, corpus, {"steps": 2, "mp_parameters": smp})
    assert proc.returncode == 0, proc.stderr
    assert "plain PyTorch applies the same SMP settings" in proc.stdout
    assert "simulate mode" in proc.stdout
    assert accounting(proc.stdout)["checkpointing"] == 1


@pytest.mark.slow
def test_missing_channel_names_the_fix(corpus, tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--train", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert "has no corpus.txt" in proc.stderr and "python -m workshop.datasets.corpus" in proc.stderr


@pytest.mark.parametrize(
    ("hps", "procs", "message"),
    [
        ({"sharding": "hybrid_shard", "hybrid-shard-degree": 3}, 2, "sharding degree of 3 does not divide the world size 2"),
        ({"mp_parameters": {"hybrid_shard_degree": 4}}, 2, "sharding degree of 4 does not divide"),
        ({"d-model": 6, "heads": 1, "seq-len": 8, "batch-size": 4}, 4, "too small to shard over 4 ranks"),
        ({"batch-size": 3}, 2, "does not split evenly over 2 ranks"),
        ({"sharding": "zero9"}, 2, "invalid choice: 'zero9'"),
        ({"mp_parameters": {"tensor_parallel_degree": 2}}, 2, "tensor_parallel_degree=2 is not used"),
    ],
)
def test_bad_input_fails_before_any_process_starts(corpus, tmp_path, hps, procs, message):
    with pytest.raises(WorkshopError, match=message):
        run_local(LAB, hosts=1, procs_per_host=procs, hyperparameters={**TINY, **hps},
                  workdir=tmp_path / "run", data_dir=corpus.root, echo=False)
    assert not (tmp_path / "run").exists()


def test_sagemaker_smp_request(corpus):
    from sagemaker.train.distributed import SMP

    smp = SMP(hybrid_shard_degree=8, sm_activation_offloading=True, activation_loading_horizon=2)
    request = run_on_sagemaker(LAB, route="smp", hosts=2, max_run_s=1200,
                               hyperparameters={"steps": 10, "mp_parameters": smp.model_dump(exclude_none=True)},
                               data_dir=corpus.root, dry_run=True, region="us-east-1", allow_unsupported_image=True)
    image = request["AlgorithmSpecification"]["TrainingImage"]
    assert image == "658645717510.dkr.ecr.us-east-1.amazonaws.com/smdistributed-modelparallel:2.5.1-gpu-py311-cu124"
    assert request["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == 1200
    distributed = json.loads(request.sm_drivers["distributed.json"])
    assert {k: v for k, v in distributed["smp"].items() if v is not None} == {"hybrid_shard_degree": 8, "sm_activation_offloading": True,
                                  "activation_loading_horizon": 2}
    assert json.loads(request["HyperParameters"]["mp_parameters"])["hybrid_shard_degree"] == 8
    assert request.channel("train").endswith("/train")


def test_sagemaker_plain_fsdp_request(corpus):
    request = run_on_sagemaker(LAB, route="fsdp", hosts=2, hyperparameters={"sharding": "full_shard"},
                               data_dir=corpus.root, dry_run=True, region="us-east-1")
    # The PyTorch the project pins (torch 2.13), so what CI runs locally is what the job runs.
    assert request["AlgorithmSpecification"]["TrainingImage"] == (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch:2.13-cu133-amzn2023-sagemaker")
    assert request["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge"
    assert request["ResourceConfig"]["InstanceCount"] == 2
    assert json.loads(request.sm_drivers["distributed.json"])["smp"] is None
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == 1800


def test_the_smp_route_is_opt_in(corpus):
    """Its image (PyTorch 2.5.1) is past end of patch: refused unless asked for by name."""
    with pytest.raises(WorkshopError, match="end of patch on 2025-10-29") as info:
        run_on_sagemaker(LAB, route="smp", hosts=2, data_dir=corpus.root, dry_run=True, region="us-east-1")
    assert "route='fsdp'" in info.value.fix and "allow_unsupported_image=True" in info.value.fix


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"route": "fsdp", "hyperparameters": {"mp_parameters": {"hybrid_shard_degree": 2}}},
         "does not have the SageMaker model-parallel library"),
        ({"route": "smp", "instance_type": "ml.g5.12xlarge", "allow_unsupported_image": True},
         "'smp' route runs on SageMaker only on ml.p4d.24xlarge, ml.p4de.24xlarge, ml.p5.48xlarge"),
        ({"route": "fsdp", "instance_type": "ml.c5.2xlarge", "hyperparameters": {"activation-offloading": "cpu"}},
         "has no GPU"),
        ({"route": "smp", "hyperparameters": {"mp_parameters": {"hybrid_shard_degree": 3}}, "allow_unsupported_image": True},
         "does not divide the world size 16"),
    ],
)
def test_sagemaker_bad_input(corpus, kwargs, message):
    with pytest.raises(WorkshopError, match=message):
        run_on_sagemaker(LAB, hosts=2, data_dir=corpus.root, dry_run=True, region="us-east-1", **kwargs)


def test_cli_dry_run_default_is_plain_fsdp_and_costs_a_few_dollars(no_aws, tmp_path, capsys):
    """Issue 11, defect 4: the default SageMaker run of a few-million-parameter model costs at
    most a few dollars (it was 2 x ml.p4d.24xlarge, up to $37.69)."""
    from workshop.__main__ import main as cli_main

    code = cli_main(["run", "4_model_parallel", "--mode", "sagemaker", "--dry-run",
                     "--data-dir", str(tmp_path / "corpus")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "cost: at most $1.41 = 2 x ml.g5.xlarge x $1.408/h x 0.5 h" in out
    assert "pytorch:2.13-cu133-amzn2023-sagemaker" in out
    assert "/data/pydoc-corpus/train" in out and "/data/mnist/" not in out  # the text corpus, not MNIST


def test_cli_smp_route_needs_the_explicit_opt_in(no_aws, tmp_path, capsys):
    from workshop.__main__ import main as cli_main

    base = ["run", "4_model_parallel", "--mode", "sagemaker", "--dry-run", "--route", "smp",
            "--data-dir", str(tmp_path / "corpus")]
    assert cli_main(base) == 2
    assert "--allow-unsupported-image" in capsys.readouterr().err
    assert cli_main([*base, "--allow-unsupported-image"]) == 0
    out = capsys.readouterr().out
    assert "smdistributed-modelparallel:2.5.1-gpu-py311-cu124" in out and "WARNING" in out


def test_gloo_binds_to_sagemakers_network_interface():
    """Issue 11, defect 6: the same helper as lab 3's, whose behaviour test_lab3 checks (each
    code/ folder ships its own copy), called once, as a marked distributed line."""
    import inspect

    script = LAB.load_script()
    calls = [line for line in SCRIPT.read_text().splitlines() if "set_gloo_interface(backend)" in line]
    assert len(calls) == 1 and "# DIST:" in calls[0]
    lab3 = get_lab("data_parallel").load_script()
    assert inspect.getsource(script.set_gloo_interface) == inspect.getsource(lab3.set_gloo_interface)


@pytest.mark.slow
def test_two_hosts_on_gloo_use_the_hosts_interface(corpus, tmp_path):
    result = run_local(LAB, hosts=2, procs_per_host=1, hyperparameters={**TINY, "steps": 2},
                       workdir=tmp_path / "run", data_dir=corpus.root, echo=False)
    config = json.loads((result.model_dir / "config.json").read_text())
    assert config["backend"] == "gloo"
    assert config["gloo_socket_ifname"] == json.loads(
        (result.hosts[0].sandbox.config_dir / "resourceconfig.json").read_text())["network_interface_name"]
