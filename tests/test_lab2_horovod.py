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
from conftest import env_without_horovod

from workshop import metrics
from workshop.errors import WorkshopError
from workshop.labs import get_lab, get_labs
from workshop.launchers.horovod import Horovod, check_installed, load_driver
from workshop.runner import run_local

PT = get_lab("horovod_pytorch")
TF = get_lab("horovod_tensorflow")
BIN = Path(sys.executable).parent
HOROVODRUN = shutil.which("horovodrun") or str(BIN / "horovodrun")
QUICK = {"epochs": 1, "max-steps": 6, "log-interval": 2}


@pytest.mark.horovod
def test_check_build_lists_both_frameworks_and_gloo():
    # `horovodrun --check-build` itself (its entry point, run_commandline), with both frameworks
    # imported first: its checks fork one process each and import the framework there, which
    # costs a TensorFlow import per check (about 25 s of CPU in all); forked from here, they share it.
    warm = ("import sys; import tensorflow, torch; from horovod.runner.launch import run_commandline; "
            "sys.argv = ['horovodrun', '--check-build']; sys.exit(run_commandline())")
    out = subprocess.run([sys.executable, "-c", warm], capture_output=True, text=True, check=True, timeout=120).stdout
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


@pytest.mark.horovod
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


@pytest.mark.horovod
@pytest.mark.slow
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


@pytest.mark.horovod
@pytest.mark.slow
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


@pytest.mark.horovod
@pytest.mark.slow
def test_tensorflow_resumes_from_its_checkpoint(tmp_path, channels):
    store = tmp_path / "checkpoints"
    common = dict(hosts=2, procs_per_host=1, data_dir=channels["train"].parent, echo=False, checkpoint_dir=store)
    run_local(TF, workdir=tmp_path / "a", hyperparameters={**QUICK, "epochs": 1}, **common)
    second = run_local(TF, workdir=tmp_path / "b", hyperparameters={**QUICK, "epochs": 2}, **common)
    assert any("after epoch 1" in line and "Resumed from" in line for line in second.lines)
    assert [r["epoch"] for r in second.records if "test_accuracy" in r] == [2]
    assert len(set(second.per_rank("weights_sha256").values())) == 1


def _ours() -> list[psutil.Process]:
    """This test process's descendants: the local cluster's hosts, drivers and ranks (seen from
    here whichever runtime runs them; in the container runtime their cwd is /opt/ml/...)."""
    try:
        return psutil.Process().children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _rank_process(workdir: Path, host: str, timeout: float = 120) -> psutil.Process:
    deadline = time.monotonic() + timeout
    log = workdir / "logs" / "algo-1.log"
    while time.monotonic() < deadline:
        if log.is_file() and "train_loss=" in log.read_text(errors="replace"):
            for p in _ours():
                try:
                    if PT.entry_script in " ".join(p.cmdline()) and p.environ().get("SM_CURRENT_HOST") == host:
                        return p
                except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                    continue
        time.sleep(0.2)
    raise AssertionError(f"no training rank on {host}")


@pytest.mark.horovod
@pytest.mark.slow
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
    # The report names the killed rank, from the driver's record, not rank 0's lost-peer error.
    assert result.failure.splitlines()[0] == "Rank 1 on algo-2 was killed by SIGKILL (signal 9).", result.failure
    assert (result.hosts[1].sandbox.failure_file).is_file()
    leftovers = []
    for p in _ours():
        try:
            if "SM_CURRENT_HOST" in p.environ() and p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                leftovers.append((p.pid, p.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
    assert not leftovers


def test_missing_framework_support_names_the_rebuild(monkeypatch, tmp_path):
    import importlib.machinery
    import importlib.metadata
    import importlib.util

    fake = tmp_path / "horovod"
    (fake / "torch").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    real_find_spec = importlib.util.find_spec
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.28.1" if name == "horovod" else real_version(name))

    def find_spec(name, *args):
        if name == "horovod":
            return importlib.machinery.ModuleSpec("horovod", None, origin=str(fake / "__init__.py"))
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(WorkshopError, match="without pytorch support") as err:
        check_installed("pytorch")
    assert "make horovod" in str(err.value)


@pytest.mark.horovod
def test_bad_input_fails_before_anything_starts(tmp_path, channels):
    with pytest.raises(WorkshopError, match="fewer than one --batch-size"):
        run_local(PT, hosts=2, procs_per_host=2, hyperparameters={"batch-size": 1500},
                  workdir=tmp_path / "run", data_dir=channels["train"].parent, echo=False)
    with pytest.raises(WorkshopError, match="--lr"):
        run_local(TF, hyperparameters={"lr": "fast"}, workdir=tmp_path / "run2",
                  data_dir=channels["train"].parent, echo=False)
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").rglob("*.log"))


def test_sagemaker_request_installs_horovod_from_the_wheel_channel(no_aws):
    """The job's hosts install the wheel built once for the image from channel `horovod`,
    keyed by image and Horovod version under the user's own prefix; no per-host build."""
    from workshop.jobs import dry_run
    from workshop.launchers.horovod import wheel_channel_uri

    request = dry_run(PT, hyperparameters={"epochs": 2}, instance_count=2, procs_per_host=1, show=False)
    config = json.loads(request.sm_drivers["distributed.json"])
    assert config["framework"] == "pytorch" and config["install"] == "wheel"
    assert config["process_count_per_node"] == 1
    assert "hvd_driver.py" in request.sm_drivers["sm_train.sh"]
    image = request["AlgorithmSpecification"]["TrainingImage"]
    channel = request.channel("horovod")
    assert channel == wheel_channel_uri("sagemaker-us-east-1-123456789012", image)
    assert channel.startswith("s3://sagemaker-us-east-1-123456789012/distributed-training-workshop/alice-example/horovod/0.28.1-r3/")
    assert request.channel("train") and request.channel("test")  # the data channels stay
    assert request["ResourceConfig"]["InstanceCount"] == 2
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == 3600

    mine = "123456789012.dkr.ecr.us-east-1.amazonaws.com/workshop-horovod:0.28.1-tf"
    request = dry_run(TF, hyperparameters={}, image_uri=mine, show=False)
    config = json.loads(request.sm_drivers["distributed.json"])
    assert config["framework"] == "tensorflow" and config["install"] == "none"  # the image has Horovod
    assert request["AlgorithmSpecification"]["TrainingImage"] == mine
    assert request.channel("horovod") is None
    with pytest.raises(ValueError, match="install='build' is gone"):
        Horovod(install="build")


def test_wheel_keys_follow_image_and_horovod_version():
    from workshop.launchers import horovod

    cpu = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.9-cpu-py312"
    assert horovod.image_key(cpu) == "pytorch-training/2.9-cpu-py312"
    assert horovod.image_key(cpu.replace("us-east-1", "eu-west-1")) == horovod.image_key(cpu)  # same image
    keys = {horovod.image_key(u) for u in (
        cpu, cpu.replace("cpu", "gpu"), cpu.replace("py312", "py311"), cpu.replace("2.9", "2.13"),
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/tensorflow-training:2.21-cpu-py312",
    )}
    assert len(keys) == 5
    digest = "1" * 64
    assert horovod.image_key(f"123.dkr.ecr.us-east-1.amazonaws.com/a/b@sha256:{digest}") == f"a-b/latest-sha256-{digest[:16]}"
    assert horovod.wheel_prefix(cpu, user="bob") == (
        f"distributed-training-workshop/bob/horovod/{horovod.HOROVOD_VERSION}-r{horovod.BUILD_REV}/pytorch-training/2.9-cpu-py312"
    )
    # Under the user's own prefix, which the workshop role's policy already covers.
    from workshop import account

    assert horovod.wheel_prefix(cpu, user="bob", key_prefix="").startswith(account.s3_prefixes("bob", "")[0])
    # ... also after the SDK's default key prefix, where the SDK config sets one.
    assert horovod.wheel_prefix(cpu, user="bob", key_prefix="team").startswith(account.s3_prefixes("bob", "team")[0])
    assert horovod.wheel_prefix(cpu, user="bob", key_prefix="team").startswith("team/distributed-training-workshop/bob/")


def test_build_revision_and_version_agree_everywhere():
    import re

    from workshop import horovod_build
    from workshop.launchers import horovod

    driver = load_driver()
    build_py = (horovod.DRIVER_DIR / "hvd_build.py").read_text()
    revs = {re.search(r"^PATCH_REV=(\d+)", path.read_text(), re.MULTILINE).group(1)
            for path in (horovod.DRIVER_DIR / "build_horovod.sh", Path("scripts/build_horovod.sh").resolve())}
    assert revs == {str(horovod.BUILD_REV)} == {str(horovod_build.PATCH_REV)}
    assert driver.HOROVOD_VERSION == horovod.HOROVOD_VERSION == horovod_build.HOROVOD_VERSION
    assert f'HOROVOD_VERSION = "{horovod.HOROVOD_VERSION}"' in build_py
    assert f'HVD_VERSION={horovod.HOROVOD_VERSION}' in (horovod.DRIVER_DIR / "build_horovod.sh").read_text()


def test_gpu_instances_are_refused_for_the_cpu_only_wheel(no_aws):
    from workshop.jobs import plan_job
    from workshop.launchers.horovod import GPU_FIX

    with pytest.raises(WorkshopError, match="CPU-only") as err:
        plan_job(PT, hyperparameters={}, region="us-east-1", instance_type="ml.g5.xlarge", procs_per_host=1)
    assert GPU_FIX in str(err.value) and "ml.c5" in str(err.value)
    mine = "123456789012.dkr.ecr.us-east-1.amazonaws.com/workshop-horovod:0.28.1-gpu"
    plan = plan_job(PT, hyperparameters={}, region="us-east-1", instance_type="ml.g5.xlarge", procs_per_host=1,
                    image_uri=mine)
    assert any("NCCL" in note for note in plan.notes)


@pytest.mark.horovod
def test_driver_refuses_gpu_hosts_with_a_horovod_built_without_nccl():
    """This environment's Horovod is CPU-only: on a host with GPUs the driver must not start ranks."""
    driver = load_driver()
    assert driver.probe_horovod("pytorch", sys.executable) == (None, False)
    with pytest.raises(RuntimeError, match="built without NCCL") as err:
        driver.ensure_horovod("pytorch", "none", sys.executable, None, num_gpus=4)
    assert "ml.c5" in str(err.value) and "image_uri" in str(err.value)
    driver.ensure_horovod("pytorch", "none", sys.executable, None, num_gpus=0)  # CPU hosts: fine
    with pytest.raises(RuntimeError, match="no `horovod` input channel"):
        driver.ensure_horovod("nosuchframework", "wheel", sys.executable, None, num_gpus=0)


def test_sagemaker_refuses_more_ranks_than_gpus(no_aws):
    from workshop.jobs import plan_job

    with pytest.raises(WorkshopError, match="1 GPU"):
        plan_job(PT, hyperparameters={}, region="us-east-1", instance_type="ml.g5.xlarge", procs_per_host=4)
    with pytest.raises(WorkshopError, match="container image URI"):
        plan_job(PT, hyperparameters={}, region="us-east-1", image_uri="not an image")
    assert isinstance(Horovod(framework="tensorflow").model_dump(), dict)


# --------------------------------------------------------------------------- hosts that start apart

ALLREDUCE_SCRIPT = """\
import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="skew")
print(f"allreduce rank={hvd.rank()} size={hvd.size()} cross_size={hvd.cross_size()} sum={total.item():g}", flush=True)
"""
# Starts the real driver after a per-host delay: a host whose set-up (instance start, image pull,
# installing Horovod) finishes later than algo-1's, as SageMaker's hosts do.
DELAYED_DRIVER = """\
import json, os, runpy, sys, time
time.sleep(json.loads(os.environ["WORKSHOP_TEST_START_DELAYS"]).get(os.environ["SM_CURRENT_HOST"], 0))
sys.argv = [{driver!r}]
runpy.run_path({driver!r}, run_name="__main__")
"""


class _DelayedHorovod:
    """What LocalCluster reads from a DistributedConfig, with the driver started late on some hosts."""

    def __init__(self, config: Horovod, folder: Path):
        from workshop.launchers.horovod import DRIVER_DIR, DRIVER_SCRIPT

        folder.mkdir(parents=True, exist_ok=True)
        (folder / "delayed_driver.py").write_text(DELAYED_DRIVER.format(driver=str(DRIVER_DIR / DRIVER_SCRIPT)))
        self.config, self.driver_dir, self.driver_script = config, str(folder), "delayed_driver.py"

    def model_dump(self) -> dict:
        return self.config.model_dump()


def _run_skewed(tmp_path: Path, delays: dict[str, float], **config):
    from workshop.runtime.local_cluster import LocalCluster

    code = tmp_path / "code"
    code.mkdir()
    (code / "allreduce.py").write_text(ALLREDUCE_SCRIPT)
    cluster = LocalCluster(
        code, "allreduce.py", hosts=len(delays), procs_per_host=1, echo=False, workdir=tmp_path / "run",
        distributed=_DelayedHorovod(Horovod(framework="pytorch", **config), tmp_path / "drivers"),
        extra_env={"WORKSHOP_TEST_START_DELAYS": json.dumps(delays)},
    )
    return cluster.run({}, {}, timeout_s=300, check=False)


@pytest.mark.horovod
@pytest.mark.slow
def test_rendezvous_waits_for_a_host_that_starts_after_the_gloo_timeout(tmp_path):
    """algo-2's driver starts 20 s after algo-1's, 4x the Gloo timeout: the job still runs,
    because no host starts its ranks (and the Gloo clock) before every host reported ready."""
    result = _run_skewed(tmp_path, {"algo-1": 0, "algo-2": 20}, gloo_timeout_s=5)
    text = "\n".join(result.lines)
    assert result.ok, (result.failure or "") + text[-3000:]
    sums = [line for line in result.lines if "allreduce rank=" in line]
    assert len(sums) == 2 and all("size=2 cross_size=2 sum=3" in line for line in sums), sums
    assert "every host is ready" in text


@pytest.mark.horovod
@pytest.mark.slow
def test_rendezvous_names_the_hosts_that_never_reported_ready(tmp_path):
    # The wait is long enough for algo-1 and algo-2 to set up on a busy machine (importing torch and
    # Horovod can take seconds), far shorter than algo-3's delay.
    result = _run_skewed(tmp_path, {"algo-1": 0, "algo-2": 0, "algo-3": 600}, gloo_timeout_s=5, rendezvous_wait_s=45)
    assert not result.ok
    # algo-1 and algo-2 both give up; whichever does first stops the job, and says why.
    failures = [h.sandbox.failure_file.read_text() for h in result.hosts if h.sandbox.failure_file.is_file()]
    assert failures, result.failure
    for failure in failures:
        assert "host algo-3 did not report ready" in failure and "(not ready: algo-3; ready: algo-1, algo-2)" in failure, failure


# --------------------------------------------------------------------------- the wheel store and PyPI

BUCKET = "sagemaker-us-east-1-123456789012"


@pytest.fixture
def moto_s3(moto_session):
    """conftest's moto_session (after no_aws: no credentials of the caller) with the SDK's bucket."""
    moto_session.client("s3").create_bucket(Bucket=BUCKET)
    return moto_session


def _build_output(folder: Path, wheels=("horovod-0.28.1-cp312-cp312-linux_x86_64.whl", "cloudpickle-3.1.2-py3-none-any.whl")) -> Path:
    """What hvd_build.py leaves in SM_MODEL_DIR (tiny stand-ins for the wheels)."""
    (folder / "wheels").mkdir(parents=True)
    for name in wheels:
        (folder / "wheels" / name).write_bytes(b"wheel")
    (folder / "horovod-build.json").write_text(json.dumps({"horovod_version": "0.28.1", "source": "compiled in 300 s",
                                                          "wheels": list(wheels), "nccl_built": False}))
    return folder


def test_the_first_job_plans_a_build_and_the_next_finds_the_wheel(moto_s3, tmp_path):
    from workshop.jobs import check_internet, plan_job, prepare_launcher
    from workshop.launchers import horovod

    plan = plan_job(PT, hyperparameters={}, region="us-east-1")
    uri = horovod.wheel_channel_uri(BUCKET, plan.image_uri)
    first, steps = prepare_launcher(plan, BUCKET, moto_s3)
    assert dict(first.extra_inputs) == {"horovod": uri}
    assert len(steps) == 1 and "one-host build job" in steps[0].what
    assert first.internet_needs and "PyPI" in first.internet_needs[0][0]

    horovod.publish_wheels(moto_s3, BUCKET, plan.image_uri, _build_output(tmp_path / "out"), "alice-horovod-pytorch-1")
    manifest = horovod.find_wheel(moto_s3, BUCKET, plan.image_uri)
    assert manifest["build_job"] == "alice-horovod-pytorch-1" and manifest["channel"] == uri
    listed = moto_s3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=uri.split(BUCKET + "/")[1] + "/")["Contents"]
    assert sorted(o["Key"].rsplit("/", 1)[1] for o in listed) == sorted(manifest["wheels"])
    second, steps = prepare_launcher(plan, BUCKET, moto_s3)
    assert steps == [] and second.internet_needs == () and dict(second.extra_inputs) == {"horovod": uri}
    assert check_internet(second, "endpoints") is second  # installing from the channel needs no PyPI

    # Another image (the TensorFlow lab's) has no wheel yet; nor has this one for another user.
    tf_plan = plan_job(TF, hyperparameters={}, region="us-east-1")
    assert len(prepare_launcher(tf_plan, BUCKET, moto_s3)[1]) == 1
    assert horovod.find_wheel(moto_s3, BUCKET, plan.image_uri, user="bob") is None
    # An upload that lost a wheel is not a wheel: build again.
    moto_s3.client("s3").delete_object(Bucket=BUCKET, Key=listed[0]["Key"])
    assert len(prepare_launcher(plan, BUCKET, moto_s3)[1]) == 1


def test_a_build_without_a_route_to_pypi_is_refused_with_the_fix(moto_s3):
    from workshop.jobs import check_internet, plan_job, prepare_launcher

    plan, _ = prepare_launcher(plan_job(PT, hyperparameters={}, region="us-east-1"), BUCKET, moto_s3)
    with pytest.raises(WorkshopError, match="no route") as err:
        check_internet(plan, "endpoints")
    message = str(err.value)
    assert "network='nat'" in message and "network=False" in message and "image_uri" in message
    assert check_internet(plan, "nat") is plan and check_internet(plan, None) is plan
    # Subnets of the caller's own: the route cannot be known; the plan says so.
    mine = plan_job(PT, hyperparameters={}, region="us-east-1", subnets=["subnet-1"], security_group_ids=["sg-1"])
    noted = check_internet(prepare_launcher(mine, BUCKET, moto_s3)[0], None)
    assert any("cannot be checked" in note and "NAT" in note for note in noted.notes)


def test_the_cli_refuses_a_horovod_build_in_the_endpoints_network_before_creating_anything(capsys):
    sys.path.insert(0, str(Path(__file__).parent))
    import fake_sagemaker

    from workshop.__main__ import main

    with fake_sagemaker.FakeSageMaker() as fake:
        import boto3

        boto = boto3.Session(region_name=fake.region)
        vpcs_before = boto.client("ec2").describe_vpcs()["Vpcs"]
        code = main(["run", "horovod_pytorch", "--mode", "sagemaker", "--network", "endpoints"])
        err = capsys.readouterr().err
        assert code == 2 and "no route" in err and "network='nat'" in err, err
        assert boto.client("ec2").describe_vpcs()["Vpcs"] == vpcs_before  # no network created
        assert not fake.jobs  # no build job, no training job
        buckets = [b["Name"] for b in boto.client("s3").list_buckets()["Buckets"]]
        assert not any(boto.client("s3").list_objects_v2(Bucket=b).get("KeyCount") for b in buckets)


def test_requirements_txt_needs_pypi_too(no_aws, monkeypatch, tmp_path):
    """sm_train.sh pip-installs a code folder's requirements.txt: refused where there is no route."""
    from workshop.jobs import dry_run
    from workshop.labs import Lab

    code = tmp_path / "code"
    shutil.copytree(TF.source_dir, code)
    (code / "requirements.txt").write_text("tqdm\n")
    monkeypatch.setattr(Lab, "source_dir", property(lambda self: code))
    mine = "123456789012.dkr.ecr.us-east-1.amazonaws.com/workshop-horovod:0.28.1-tf"  # no Horovod build either
    with pytest.raises(WorkshopError, match="requirements.txt") as err:
        dry_run(TF, hyperparameters={}, image_uri=mine, network=True, show=False)
    assert "network='nat'" in str(err.value)
    assert dry_run(TF, hyperparameters={}, image_uri=mine, network="nat", show=False)["VpcConfig"]


def _cached_wheel() -> Path:
    import os

    cache = Path(os.environ.get("WORKSHOP_CACHE_DIR") or Path.home() / ".cache" / "distributed-training-workshop") / "wheels"
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    wheels = sorted(cache.glob(f"horovod-0.28.1-{tag}-*.whl"))
    if not wheels:
        pytest.skip(f"no cached Horovod wheel in {cache} (`make setup` leaves one)")
    return wheels[0]


@pytest.mark.horovod
def test_the_driver_installs_horovod_from_the_channel_without_an_index(tmp_path, monkeypatch):
    wheel = _cached_wheel()
    python = env_without_horovod(tmp_path)
    channel = tmp_path / "channel"
    channel.mkdir()
    driver = load_driver()
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # an index would fail: none is used
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    problem, _ = driver.probe_horovod("pytorch", str(python))
    assert problem and "horovod" in problem  # this "image" lacks Horovod
    with pytest.raises(RuntimeError, match="no horovod-0.28.1 wheel"):
        driver.ensure_horovod("pytorch", "wheel", str(python), str(channel), num_gpus=0)
    shutil.copy(wheel, channel)
    driver.ensure_horovod("pytorch", "wheel", str(python), str(channel), num_gpus=0)
    where = subprocess.run([python, "-c", "import horovod.torch, horovod; print(horovod.__file__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(tmp_path / "venv")), where  # installed into the "image", from the channel
    assert driver.probe_horovod("pytorch", str(python)) == (None, False)


@pytest.mark.horovod
@pytest.mark.slow
def test_on_the_fake_sagemaker_the_wheel_is_built_once_then_installed_from_its_channel(tmp_path, channels, capsys):
    """The whole flow against the fake SageMaker: the first job of an image runs a one-host build
    job (the real hvd_build.py and build_horovod.sh; here in this environment, where the set-up's
    cached wheel stands in for the compile), stores the wheel in S3, and the training job gets it
    as channel `horovod`; the next job of the image finds it and plans no build."""
    sys.path.insert(0, str(Path(__file__).parent))
    import fake_sagemaker

    from workshop.launchers import horovod
    from workshop.runner import run_on_sagemaker

    _cached_wheel()
    args = dict(hosts=2, procs_per_host=1, hyperparameters=QUICK, data_dir=channels["train"].parent,
                confirm_cost=True)
    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake") as fake:
        first = run_on_sagemaker(PT, **args)
        out = capsys.readouterr().out
        assert first.ok, first.failure_reason
        assert [job.hosts for job in fake.jobs] == [1, 2], fake.summary()  # the build job, then training
        assert "[hvd_build]" in out and "source: cached wheel" in out  # CI does not compile (see the notebook)
        import boto3

        boto = boto3.Session(region_name=fake.region)
        bucket = f"sagemaker-{fake.region}-123456789012"
        described = boto.client("sagemaker").describe_training_job(TrainingJobName=first.job_name)
        image = described["AlgorithmSpecification"]["TrainingImage"]
        manifest = horovod.find_wheel(boto, bucket, image)
        assert manifest and manifest["build_job"] == fake.jobs[0].name
        channels_of_job = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in described["InputDataConfig"]}
        assert channels_of_job["horovod"] == horovod.wheel_channel_uri(bucket, image) == manifest["channel"]
        assert "not installing from the horovod channel" in out  # Horovod imports here already
        assert "every host is ready" in out

        # The next job of this image plans no build: it finds what the build job stored.
        from workshop.jobs import check_internet, plan_job, prepare_launcher

        plan = plan_job(PT, hyperparameters=QUICK, region=fake.region, instance_count=2)
        assert plan.image_uri == image
        plan, steps = prepare_launcher(plan, bucket, boto)
        assert steps == [] and dict(plan.extra_inputs)["horovod"] == manifest["channel"]
        assert check_internet(plan, "endpoints") is plan  # and may run without a route to PyPI
