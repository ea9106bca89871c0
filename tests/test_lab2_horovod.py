"""Lab 2: the Horovod build, the driver's rank plan, both scripts on the local cluster, failures."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import isolate_aws

from workshop import metrics
from workshop.errors import WorkshopError
from workshop.horovod import Horovod, check_installed, load_driver
from workshop.labs import get_lab, get_labs
from workshop.runner import run_local

PT = get_lab("horovod_pytorch")
TF = get_lab("horovod_tensorflow")
BIN = Path(sys.executable).parent
HOROVODRUN = shutil.which("horovodrun") or str(BIN / "horovodrun")
QUICK = {"epochs": 1, "max-steps": 6, "log-interval": 2}


def test_check_build_lists_both_frameworks_and_gloo():
    out = subprocess.run([HOROVODRUN, "--check-build"], capture_output=True, text=True, check=True, timeout=120).stdout
    ticked = {line.split("]", 1)[1].strip(): "[X]" in line for line in out.splitlines() if "] " in line}
    assert ticked["PyTorch"] and ticked["TensorFlow"] and ticked["Gloo"], out
    assert not ticked["MPI"]  # built without MPI: the workshop's launcher needs none
    check_installed("pytorch")
    check_installed("tensorflow")


def test_folder_name_selects_both_scripts():
    assert [lab.key for lab in get_labs("2_horovod")] == ["horovod_pytorch", "horovod_tensorflow"]
    assert get_labs("2") == get_labs("horovod")
    with pytest.raises(WorkshopError, match="names 2 labs"):
        get_lab("2_horovod")
    assert PT.label == "2_horovod (train_pytorch)"


def test_rank_plan_and_variables_are_the_ones_horovodrun_uses():
    """The driver's plan is Horovod's own host assignment; each rank's variables equal what
    `horovodrun --gloo` builds (gloo_run.create_run_env_vars + create_slot_env_vars)."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

    driver = load_driver()
    plan = driver.rank_plan(["algo-1", "algo-2", "algo-3"], 2)
    assert [(s["hostname"], s["rank"], s["local_rank"], s["cross_rank"]) for s in plan] == [
        ("algo-1", 0, 0, 0), ("algo-1", 1, 1, 0), ("algo-2", 2, 0, 1), ("algo-2", 3, 1, 1),
        ("algo-3", 4, 0, 2), ("algo-3", 5, 1, 2),
    ]
    assert {s["size"] for s in plan} == {6} and {s["local_size"] for s in plan} == {2}
    assert {s["cross_size"] for s in plan} == {3}
    slots = get_host_assignments(parse_hosts("algo-1:2,algo-2:2,algo-3:2"), 6)
    for mine, theirs in zip(plan, slots, strict=True):
        env = driver.rank_env(mine, "algo-1", 7777, "eth0", 60)
        expected = {**create_run_env_vars("algo-1", {"eth0"}, 7777), **create_slot_env_vars(theirs)}
        assert {k: str(v) for k, v in expected.items()}.items() <= env.items()


def test_process_count_defaults_to_one_per_gpu():
    driver = load_driver()
    assert driver.procs_per_host({"process_count_per_node": 3}, {"SM_NUM_GPUS": "8"}) == 3
    assert driver.procs_per_host({"process_count_per_node": None}, {"SM_NUM_GPUS": "4"}) == 4
    assert driver.procs_per_host({}, {"SM_NUM_GPUS": "0"}) == 1


def _flags(hps: dict) -> list[str]:
    return [x for k, v in hps.items() for x in (f"--{k}", str(v))]


@pytest.mark.parametrize("lab", [PT, TF], ids=["pytorch", "tensorflow"])
def test_script_runs_under_horovodrun(lab, tmp_path, channels):
    args = _flags({**QUICK, "train": channels["train"], "test": channels["test"],
                   "model-dir": tmp_path / "model", "checkpoint-dir": tmp_path / "ckpt"})
    proc = subprocess.run(
        [HOROVODRUN, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, str(lab.entry_path), *args],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["ranks"] == 2 and config["controller"] == "gloo"
    assert config["effective_lr"] == pytest.approx(2 * config["args"]["lr"])  # scaled by the number of ranks
    digests = {m["rank"]: m["weights_sha256"] for m in metrics.parse_lines(
        [line.split(":", 1)[1] for line in proc.stdout.splitlines() if "weights_sha256" in line])}
    assert len(digests) == 2 and len(set(digests.values())) == 1, digests


def test_pytorch_on_two_hosts_of_two_ranks(tmp_path, channels):
    """4 ranks on 2 simulated hosts: Horovod sees 2 hosts (cross size), rank 0 alone writes."""
    result = run_local(PT, hosts=2, procs_per_host=2, workdir=tmp_path / "run",
                       data_dir=channels["train"].parent, echo=False,
                       hyperparameters={"epochs": 3, "batch-size": 32, "log-interval": 10})
    assert result.metric("final_test_accuracy") >= 0.90
    digests = result.per_rank("weights_sha256")
    assert sorted(digests) == [0, 1, 2, 3] and len(set(digests.values())) == 1, digests
    assert any("4 ranks on 2 host(s)" in line for line in result.lines)
    assert (result.model_dir / "model.pt").is_file()
    assert not (result.hosts[1].sandbox.model_dir / "model.pt").exists()  # only rank 0 writes


def test_tensorflow_resumes_from_its_checkpoint(tmp_path, channels):
    store = tmp_path / "checkpoints"
    common = dict(hosts=2, procs_per_host=1, data_dir=channels["train"].parent, echo=False, checkpoint_dir=store)
    run_local(TF, workdir=tmp_path / "a", hyperparameters={**QUICK, "epochs": 1}, **common)
    second = run_local(TF, workdir=tmp_path / "b", hyperparameters={**QUICK, "epochs": 2}, **common)
    assert any("after epoch 1" in line and "Resumed from" in line for line in second.lines)
    assert [r["epoch"] for r in second.records if "test_accuracy" in r] == [2]
    assert len(set(second.per_rank("weights_sha256").values())) == 1


def _rank_process(workdir: Path, host: str, timeout: float = 120) -> psutil.Process:
    deadline = time.monotonic() + timeout
    log = workdir / "logs" / "algo-1.log"
    while time.monotonic() < deadline:
        if log.is_file() and "train_loss=" in log.read_text(errors="replace"):
            for p in psutil.process_iter(["pid"]):
                try:
                    if PT.entry_script in " ".join(p.cmdline()) and p.cwd().startswith(str(workdir / host)):
                        return p
                except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                    continue
        time.sleep(0.2)
    raise AssertionError(f"no training rank on {host}")


def test_a_rank_that_dies_fails_the_job_fast_and_leaves_nothing(tmp_path, channels):
    out: dict = {}
    workdir = tmp_path / "run"

    def target():
        out["result"] = run_local(PT, workdir=workdir, data_dir=channels["train"].parent, echo=False,
                                  hyperparameters={"epochs": 50, "log-interval": 2}, check=False)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        _rank_process(workdir, "algo-2").send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
    finally:
        thread.join(timeout=600)
    result = out["result"]
    assert not result.ok
    assert time.monotonic() - killed_at < 60  # not 50 epochs, not max_run
    assert "rank 1 exited with status -9" in "\n".join(result.lines)
    assert (result.hosts[1].sandbox.failure_file).is_file()
    leftovers = []
    for p in psutil.process_iter(["pid"]):
        try:
            if str(workdir) in p.cwd():
                leftovers.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
    assert not leftovers


def test_missing_framework_support_names_the_rebuild(monkeypatch, tmp_path):
    import importlib.machinery
    import importlib.util

    fake = tmp_path / "horovod"
    (fake / "torch").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "horovod":
            return importlib.machinery.ModuleSpec("horovod", None, origin=str(fake / "__init__.py"))
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(WorkshopError, match="without pytorch support") as err:
        check_installed("pytorch")
    assert "make horovod" in str(err.value)


def test_bad_input_fails_before_anything_starts(tmp_path, channels):
    with pytest.raises(WorkshopError, match="fewer than one --batch-size"):
        run_local(PT, hosts=2, procs_per_host=2, hyperparameters={"batch-size": 1500},
                  workdir=tmp_path / "run", data_dir=channels["train"].parent, echo=False)
    with pytest.raises(WorkshopError, match="--lr"):
        run_local(TF, hyperparameters={"lr": "fast"}, workdir=tmp_path / "run2",
                  data_dir=channels["train"].parent, echo=False)
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").rglob("*.log"))


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    isolate_aws(monkeypatch, tmp_path, "Alice Example")


def test_sagemaker_request_builds_horovod_at_job_start(no_aws):
    from workshop.sagemaker_jobs import dry_run

    request = dry_run(PT, hyperparameters={"epochs": 2}, instance_count=2, procs_per_host=2, show=False)
    config = json.loads(request.sm_drivers["distributed.json"])
    assert config["framework"] == "pytorch" and config["install"] == "build"
    assert config["process_count_per_node"] == 2
    assert "hvd_driver.py" in request.sm_drivers["sm_train.sh"]
    assert "pytorch-training:2.9-cpu-py312" in request["AlgorithmSpecification"]["TrainingImage"]
    assert request["ResourceConfig"]["InstanceCount"] == 2
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == 3600

    mine = "123456789012.dkr.ecr.us-east-1.amazonaws.com/workshop-horovod:0.28.1-tf"
    request = dry_run(TF, hyperparameters={}, image_uri=mine, show=False)
    config = json.loads(request.sm_drivers["distributed.json"])
    assert config["framework"] == "tensorflow" and config["install"] == "none"  # the image has Horovod
    assert request["AlgorithmSpecification"]["TrainingImage"] == mine


def test_sagemaker_refuses_more_ranks_than_gpus(no_aws):
    from workshop.sagemaker_jobs import plan_job

    with pytest.raises(WorkshopError, match="1 GPU"):
        plan_job(PT, hyperparameters={}, region="us-east-1", instance_type="ml.g5.xlarge", procs_per_host=4)
    with pytest.raises(WorkshopError, match="container image URI"):
        plan_job(PT, hyperparameters={}, region="us-east-1", image_uri="not an image")
    assert isinstance(Horovod(framework="tensorflow").model_dump(), dict)
