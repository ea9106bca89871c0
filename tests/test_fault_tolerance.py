"""Fault tolerance, the launcher side: torchrun under its elastic agent with a restart budget
(`ElasticTorchrun`, `workshop/drivers/torchrun/elastic_driver.py`), in both runtimes.

The scripts' side (fault injection, atomic and sharded checkpoints, resuming) is in
tests/test_fault_tolerance_scripts.py.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from workshop import metrics
from workshop.__main__ import main
from workshop.errors import WorkshopError
from workshop.jobs import dry_run
from workshop.labs import get_lab
from workshop.launchers.torchrun import DRIVER_DIR, DRIVER_SCRIPT, ElasticTorchrun
from workshop.spec import load_module

LAB3, LAB4 = get_lab("data_parallel"), get_lab("model_parallel")


def driver():
    return load_module(DRIVER_DIR / DRIVER_SCRIPT, "elastic_driver_under_test")


def host_env(host: int, hosts: int = 2, **config) -> dict[str, str]:
    return {
        "SM_DISTRIBUTED_CONFIG": json.dumps({"process_count_per_node": 1, **config}),
        "SM_HPS": json.dumps({"epochs": 3, "lr": 0.02, "backend": "gloo"}),
        "SM_HOSTS": json.dumps([f"algo-{i + 1}" for i in range(hosts)]),
        "SM_HOST_COUNT": str(hosts), "SM_MASTER_ADDR": "algo-1", "SM_MASTER_PORT": "7777",
        "SM_CURRENT_HOST": f"algo-{host + 1}", "SM_CURRENT_HOST_RANK": str(host), "SM_ENTRY_SCRIPT": "train.py",
        "SM_NUM_GPUS": "0", "TRAINING_JOB_NAME": "alice-data-parallel-1",
    }


def test_without_a_budget_the_command_is_the_sdks_own(monkeypatch):
    import sagemaker.train

    sdk = Path(sagemaker.train.__file__).parent / "container_drivers" / "distributed_drivers"
    monkeypatch.syspath_prepend(str(sdk.parent))
    env = host_env(1, max_restarts=0)
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    theirs = load_module(sdk / "torchrun_driver.py", "sdk_torchrun_driver").create_commands()
    assert driver().torchrun_command(env) == theirs
    assert theirs[:6] == ["torchrun", "--nnodes=2", "--nproc_per_node=1", "--master_addr=algo-1",
                          "--master_port=7777", "--node_rank=1"]


def test_with_a_budget_torchrun_restarts_through_the_c10d_rendezvous():
    cmd = driver().torchrun_command(host_env(1, max_restarts=2))
    assert cmd[:8] == ["torchrun", "--nnodes=2", "--nproc_per_node=1", "--max-restarts=2", "--rdzv-backend=c10d",
                       "--rdzv-endpoint=algo-1:7777", "--rdzv-id=alice-data-parallel-1", "--local-addr=algo-2"]
    # Told which host runs the store (never guessed from the hostname), and how long to wait for the others.
    assert cmd[8] == "--rdzv-conf=is_host=0,join_timeout=600,read_timeout=600"
    assert cmd[9:] == ["train.py", "--epochs", "3", "--lr", "0.02", "--backend", "gloo"]
    assert "--node_rank=1" not in cmd  # the rendezvous ranks nodes by --local-addr: rank 0 stays on algo-1


def rdzv_conf(env: dict[str, str]) -> dict[str, str]:
    """The --rdzv-conf of this host's command, parsed as torchrun parses it."""
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    [conf] = [a.split("=", 1)[1] for a in driver().torchrun_command(env) if a.startswith("--rdzv-conf=")]
    return _parse_rendezvous_config(conf)


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_the_master_host_and_only_it_runs_the_rendezvous_store(hosts):
    for host in range(hosts):
        assert rdzv_conf(host_env(host, hosts, max_restarts=1))["is_host"] == ("1" if host == 0 else "0")
    # The local cluster's process runtime gives the master as an address: the first host runs the store,
    # and serves its workers' store there too (no algo-N name resolves in that runtime).
    process = {"SM_MASTER_ADDR": "127.0.0.1", "SM_MASTER_PORT": "29517"}
    assert [rdzv_conf({**host_env(h, hosts, max_restarts=1), **process})["is_host"] for h in range(hosts)] \
        == ["1"] + ["0"] * (hosts - 1)
    local_addrs = [next(a for a in driver().torchrun_command({**host_env(h, hosts, max_restarts=1), **process})
                        if a.startswith("--local-addr=")) for h in range(hosts)]
    assert local_addrs == ["--local-addr=127.0.0.1"] + [f"--local-addr=algo-{h + 1}" for h in range(1, hosts)]
    assert sorted(local_addrs) == local_addrs  # node ranks follow it: node 0 stays on the first host


def test_the_join_timeout_bounds_the_wait_for_the_store_too():
    conf = rdzv_conf(host_env(1, max_restarts=1, join_timeout_s=900))
    assert conf["join_timeout"] == conf["read_timeout"] == "900"


def test_the_driver_waits_for_every_hosts_name_and_names_the_one_that_never_resolves():
    import socket

    now = [0.0]
    lookups: list[str] = []

    def resolve(name, port):
        lookups.append(name)
        if name == "algo-3" or (name == "algo-2" and now[0] < 5):  # algo-2 resolves after 5 s, algo-3 never
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.1.2", 0))]

    def sleep(seconds):
        now[0] += seconds

    wait = driver().unresolved_host
    assert wait(["algo-1", "algo-2"], 60, resolve=resolve, clock=lambda: now[0], sleep=sleep) is None
    assert 5 <= now[0] < 7 and lookups.count("algo-2") >= 5  # it waited for algo-2, retrying
    now[0] = 0.0
    assert wait(["algo-1", "algo-2", "algo-3"], 30, resolve=resolve, clock=lambda: now[0], sleep=sleep) == "algo-3"
    assert 30 <= now[0] < 32  # bounded


def test_a_host_that_never_resolves_fails_the_job_naming_it_before_torchrun_starts(monkeypatch, tmp_path, capsys):
    mod = driver()
    waited: list[tuple[list[str], float]] = []
    monkeypatch.setattr(mod, "unresolved_host", lambda hosts, timeout: waited.append((hosts, timeout)) or "algo-2")
    monkeypatch.setattr(mod.subprocess, "Popen", lambda *a, **k: pytest.fail("torchrun started"))
    failure = tmp_path / "failure"
    monkeypatch.setattr(os, "environ", {**os.environ, **host_env(0, max_restarts=1), "SM_OUTPUT_FAILURE": str(failure)})
    assert mod.main() == 1
    assert waited == [(["algo-1", "algo-2"], 600)]
    message = "host algo-2 does not resolve after 600 s, so this host cannot reach it (hosts algo-1, algo-2; this is algo-1)"
    assert message in capsys.readouterr().err and failure.read_text() == message


def test_the_drivers_efa_lists_are_the_sdks():
    import sagemaker.train.container_drivers.common.utils as sdk_utils

    code = (DRIVER_DIR / DRIVER_SCRIPT).read_text()
    copy = load_module(DRIVER_DIR / DRIVER_SCRIPT, "elastic_driver_copy")
    assert "from common.utils import SM_EFA_NCCL_INSTANCES" in code  # in the job: the SDK's own lists
    assert set(copy.EFA_NCCL_INSTANCES) == set(sdk_utils.SM_EFA_NCCL_INSTANCES)
    assert set(copy.EFA_RDMA_INSTANCES) == set(sdk_utils.SM_EFA_RDMA_INSTANCES)


def test_the_local_config_and_the_sagemaker_job_carry_the_budget(no_aws):
    assert LAB3.distributed_config(1, max_restarts=1) == ElasticTorchrun(process_count_per_node=1, max_restarts=1)
    assert type(LAB3.distributed_config(1)).__name__ == "Torchrun"  # no budget: the SDK's Torchrun, unchanged
    request = dry_run(LAB3, show=False, max_restarts=1, instance_count=2)
    assert json.loads(request.sm_drivers["distributed.json"]) == {
        "process_count_per_node": None, "max_restarts": 1, "join_timeout_s": None}
    assert f"distributed_drivers/{DRIVER_SCRIPT}" in request.sm_drivers["sm_train.sh"]


@pytest.mark.parametrize(("args", "error"), [
    (["run", "parameter_server", "--max-restarts", "1"], "cannot restart its processes after a failure"),
    (["run", "horovod_pytorch", "--max-restarts", "1"], "cannot restart its processes after a failure"),
    (["run", "data_parallel", "--max-restarts", "-1"], "max_restarts must be a whole number, 0 or more"),
    (["run", "data_parallel", "--max-restarts", "-1", "--mode", "sagemaker", "--dry-run"], "0 or more"),
    (["run", "model_parallel", "--max-restarts", "1", "--mode", "sagemaker", "--dry-run", "--route", "smp",
      "--allow-unsupported-image", "--hp", 'mp_parameters={"hybrid_shard_degree": 2}'], "not available with SMP settings"),
])
def test_a_budget_the_launcher_cannot_honour_is_refused_before_anything_starts(args, error, no_aws, capsys, monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("something started"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert error in err and "Fix:" in err, err


def test_a_negative_budget_is_refused_by_the_lab_spec():
    with pytest.raises(WorkshopError, match="0 or more"):
        LAB4.distributed_config(1, max_restarts=-2)


# --------------------------------------------------------------------------- spot


def test_a_spot_job_asks_for_spot_with_a_wait_bound_and_a_checkpoint_location(no_aws, capsys):
    assert main(["run", "data_parallel", "--mode", "sagemaker", "--dry-run", "--spot"]) == 0
    out = capsys.readouterr().out
    request = json.loads(out[out.index("\n{") + 1 : out.index("\n}\n") + 2])
    assert request["EnableManagedSpotTraining"] is True
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}
    assert request["CheckpointConfig"]["S3Uri"].endswith("/checkpoints")  # resumed from S3 after an interruption
    assert "cost on spot: at most the same $2.82" in out and "about $0.84 at a 70% discount" in out
    assert "up to 90%" in out and "BillableTimeInSeconds" in out
    assert "spot: managed spot training, up to 7200 s in all" in out


def test_an_on_demand_job_is_unchanged(no_aws):
    request = dry_run(LAB3, show=False)
    assert "EnableManagedSpotTraining" not in request
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600}


def test_a_finished_spot_job_reports_billable_against_training_seconds():
    from workshop.jobs.submit import JobResult

    def result(**times):
        return JobResult("j", "Completed", {}, None, "url", "us-east-1", **times)

    assert result(spot=True, training_time_s=500, billable_time_s=100).spot_line() == (
        "managed spot: billable 100 s of 500 s training: a saving of 80% (1 - billable / training, AWS's formula "
        "for managed spot training)")
    assert result(training_time_s=500, billable_time_s=500).spot_line() is None  # on demand: nothing to say
    assert result(spot=True).spot_line() is None  # still running: no times yet


@pytest.mark.parametrize(("args", "error"), [
    (["--mode", "sagemaker", "--dry-run", "--spot", "--max-wait", "600"], "must be at least max_run_s (3600 s)"),
    (["--mode", "sagemaker", "--dry-run", "--max-wait", "7200"], "max_wait_s applies to spot jobs only"),
    (["--spot"], "--spot and --max-wait apply to --mode sagemaker"),
])
def test_bad_spot_settings_are_refused_before_anything_starts(args, error, no_aws, capsys, monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("something started"))
    assert main(["run", "data_parallel", *args]) == 2
    err = capsys.readouterr().err
    assert error in err and "Fix:" in err, err


def test_spot_for_a_script_that_writes_no_checkpoint_is_refused(no_aws):
    """Lab 4 checkpoints only with --checkpoint-every N (its default 0 keeps the measurements clean): on spot,
    an interruption would start it over, so spot without checkpoints is refused, with the flag to set."""
    with pytest.raises(WorkshopError, match="with checkpoint-every 0 writes no checkpoint") as refused:
        dry_run(LAB4, show=False, spot=True)
    assert "--hp checkpoint-every=50" in refused.value.fix
    request = dry_run(LAB4, show=False, spot=True, hyperparameters={"checkpoint-every": 50})
    assert request["EnableManagedSpotTraining"] is True and request["CheckpointConfig"]["S3Uri"].startswith("s3://")
    assert dry_run(LAB3, show=False, spot=True)["EnableManagedSpotTraining"] is True  # lab 3 checkpoints every epoch


def test_a_search_on_spot_is_refused(no_aws):
    from workshop.search import SearchSpace

    with pytest.raises(WorkshopError, match="Spot trials are not supported"):
        dry_run(LAB3, show=False, spot=True, space=SearchSpace.parse(LAB3, ["lr=0.01,0.02"]))


def test_spot_jobs_are_checked_against_the_spot_quota():
    from conftest import quota_client, service_quota

    from workshop.cloud.preflight import check_quota

    quotas = [service_quota("ml.g5.xlarge for training job usage", 8, "L-OD"),
              service_quota("ml.g5.xlarge for spot training job usage", 0, "L-SPOT")]
    assert "for training: 8" in check_quota(quota_client(quotas), "ml.g5.xlarge", 2, "us-east-1")
    with pytest.raises(WorkshopError, match="quota for ml.g5.xlarge spot training instances in us-east-1 is zero") as info:
        check_quota(quota_client(quotas), "ml.g5.xlarge", 2, "us-east-1", spot=True)
    assert "--quota-code L-SPOT" in info.value.fix


# ----------------------------------------------------------------------------- the command (slow)


@pytest.mark.slow
def test_the_cli_kills_a_rank_on_another_host_and_the_run_recovers_exactly(tmp_path, mnist_dir, capsys):
    """`run data_parallel --hosts 2 --fault kill-rank=1@step=30 --max-restarts 1` on the local cluster, where
    each host has its own checkpoint folder (as SageMaker's hosts do), synced with --checkpoint-dir (the S3
    URI's stand-in): rank 1 dies on algo-2 after step 30, torchrun restarts both ranks, rank 0 resumes from
    its step-20 checkpoint on algo-1 (the only host that has it), mid-epoch (the sampler skips the batches
    done, every rank's RNG state restored), and sends it to rank 1, and knows exactly what was lost (the
    fault record was written on the other host) and when it struck. The run ends with the uninterrupted
    run's weights, bit for bit.

    The two runs also show the command line's two faces: the faulted one with --verbose streams every
    host's lines, the uninterrupted one without it shows a progress line, not a wall of logs (which it
    keeps in logs/cluster.log)."""
    def run(name: str, *extra: str) -> str:
        code = main(["run", "data_parallel", "--hosts", "2", "--data-dir", str(mnist_dir),
                     "--workdir", str(tmp_path / name), *extra])
        captured = capsys.readouterr()
        assert code == 0, (captured.out + captured.err)[-4000:]
        return captured.out + captured.err

    store = tmp_path / "store"
    out = run("faulted", "--verbose", "--fault", "kill-rank=1@step=30", "--max-restarts", "1", "--checkpoint-dir", str(store))
    faulted = metrics.parse_lines(out.splitlines())
    assert "[algo-1/0] METRICS rank=0 " in out and "[progress]" not in out  # --verbose: the hosts' own lines
    assert "FAULT: killing rank 1 at step 30 (--fault kill-rank=1@step=30)" in out
    assert "resumed from /opt/ml/checkpoints/checkpoint.pt at step 20 (restart 1)" in out
    assert "Resumed from /opt/ml/checkpoints/checkpoint.pt in epoch 1, after its batch 20 of 31." in out
    assert "10 step(s) to do again: the failed attempt had finished step 30 (its fault record)" in out
    [recovered] = [r for r in faulted if "resumed_step" in r]
    assert (recovered["resumed_step"], recovered["lost_steps"]) == (20, 10)
    assert 0 < recovered["recover_s"] < 120
    assert re.search(r"recovered 1 time\(s\): resumed at step 20, 10 step\(s\) redone, \d+\.\d s from the failure", out)
    # each epoch evaluated once: the first attempt died before its first epoch ended
    assert [r["step"] for r in faulted if "test_accuracy" in r and r.get("rank") == 0] == [31, 62, 93]
    [folder] = (tmp_path / "faulted" / "runs").iterdir()
    algo1, algo2 = (folder / host / "checkpoints" for host in ("algo-1", "algo-2"))
    assert (algo1 / "checkpoint.pt").is_file() and not (algo2 / "checkpoint.pt").exists()  # rank 0's, on algo-1
    assert (algo2 / "fault.json").is_file() and not (algo1 / "fault.json").exists()  # the dying rank's, on algo-2
    assert (store / "checkpoint.pt").read_bytes() == (algo1 / "checkpoint.pt").read_bytes()

    # Without --verbose: a few lines, the progress one with rank 0's latest numbers, no METRICS line. Off a
    # terminal the progress line also comes once a minute (a heartbeat), so a slow machine prints more of them:
    # the last one is the job's end.
    lines = run("plain").splitlines()
    assert len([line for line in lines if not line.startswith("[progress] ")]) <= 5, lines
    progress = [line for line in lines if line.startswith("[progress] ")][-1]
    assert progress.startswith("[progress] data-parallel: 3/3 epoch(s)"), progress
    assert re.search(r"step 93, loss [\d.]+, test acc 0\.[89]\d\d, [\d,]+ samples/s$", progress), progress
    assert any("succeeded in" in line and "logs/cluster.log" in line for line in lines)
    assert not any("METRICS" in line for line in lines)
    log = next((tmp_path / "plain" / "runs").glob("*/logs/cluster.log")).read_text()
    assert "METRICS rank=0 epoch=3 step=93 test_loss=" in log  # the full logs are kept
    plain = metrics.parse_lines(log.splitlines())

    def final(records: list[dict], key: str):
        [value] = [r[key] for r in records if key in r and r.get("rank") == 0]
        return value

    assert final(faulted, "weights_sha256") == final(plain, "weights_sha256")
    assert final(faulted, "final_test_accuracy") == final(plain, "final_test_accuracy") >= 0.9


# ----------------------------------------------------------------------------- each host its own checkpoint folder (slow)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from workshop.datasets.corpus import prepare_corpus

    return prepare_corpus(tmp_path_factory.mktemp("corpus"))


def _final(result, key: str):
    [value] = [r[key] for r in result.records if key in r and r.get("rank") == 0]
    return value


@pytest.mark.slow
def test_lab4_on_two_hosts_heals_in_place_from_shards_no_host_shares(tmp_path, corpus):
    """Lab 4 on 2 hosts, a sharded (DCP) checkpoint every 10 steps, rank 1 killed after step 25, --max-restarts 1,
    with each host's checkpoint folder its own, as on SageMaker (the store, --checkpoint-dir, is the S3 URI's
    stand-in). Before: the first save failed ("lacks __1_0.distcp": rank 1 wrote its shard on algo-2), and
    had it not, the restarted ranks would have found neither the index nor the other host's shard. Now each
    host keeps its own ranks' shards and a copy of the index, the restarted ranks resume from step 20 on
    their own hosts, a file one rank reads from the other host's shard comes over the process group, and
    the run ends with the uninterrupted run's loss; the store holds the whole checkpoint."""
    from workshop.runner import run_local

    hps = {"steps": 30, "checkpoint-every": 10, "log-interval": 5, "threads": 1}
    common = dict(hosts=2, data_dir=corpus.root, echo=False, check=False)
    store = tmp_path / "store"
    faulted = run_local(LAB4, max_restarts=1, checkpoint_dir=store, workdir=tmp_path / "faulted",
                        hyperparameters={**hps, "fault": "kill-rank=1@step=25"}, **common)
    assert faulted.ok, faulted.failure
    text = "\n".join(faulted.lines)
    assert "FAULT: killing rank 1 at step 25 (--fault kill-rank=1@step=25)" in text
    assert "resumed from /opt/ml/checkpoints/step-20 at step 20 (restart 1)" in text
    assert "5 step(s) to do again: the failed attempt had finished step 25 (its fault record)" in text
    # Each rank reads its own shard, and the values every rank holds (the optimizer's step counts, its
    # settings) from the one file DCP saved them in: that file came over from the host that wrote it.
    assert re.search(r"Fetched step-20/__\d_0\.distcp \([\d,]+ bytes\) from rank \d's host", text), text[-3000:]
    [recovered] = [r for r in faulted.records if "resumed_step" in r]
    assert (recovered["resumed_step"], recovered["lost_steps"]) == (20, 5)
    # Each host holds its own ranks' shards and a copy of the index; the store, every host's files together.
    index = [".metadata", "checksums.json", "meta.pt"]
    for host, shard in zip(faulted.hosts, ("__0_0.distcp", "__1_0.distcp"), strict=True):
        assert sorted(p.name for p in (host.checkpoint_dir / "step-30").iterdir()) == sorted([*index, shard]), host.name
        assert (host.checkpoint_dir / "latest").read_text() == "step-30"
    assert sorted(p.name for p in (store / "step-30").iterdir()) == sorted([*index, "__0_0.distcp", "__1_0.distcp"])
    assert sorted(p.name for p in store.glob("step-*")) == ["step-20", "step-30"]  # the rotation reached the store
    assert (store / "latest").read_text() == "step-30"

    plain = run_local(LAB4, workdir=tmp_path / "plain", hyperparameters=hps, **common)
    assert plain.ok, plain.failure
    assert _final(faulted, "final_train_loss") == _final(plain, "final_train_loss")
    assert _final(faulted, "test_accuracy") == _final(plain, "test_accuracy")


# ----------------------------------------------------------------------------- the rendezvous host (slow)


@pytest.mark.slow
def test_an_elastic_job_on_hosts_not_named_algo_n_finds_its_rendezvous_host(no_aws, tmp_path):
    """On SageMaker a host's hostname is not promised to be `algo-N` (ModelTrainer's `/bin/bash` entry
    point skips the images' renaming script), and the fake's hosts, like the local cluster's, have an
    instance's hostname. torchrun's c10d rendezvous, left to guess which host runs its store from the
    hostname, guesses no host: the job must say it (is_host), and does."""
    import boto3
    import fake_sagemaker
    from conftest import PROBE_CODE
    from sagemaker.core.training.configs import Compute, SourceCode, StoppingCondition
    from sagemaker.train.model_trainer import ModelTrainer

    from workshop.cloud import aws
    from workshop.runtime import hostns

    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=2.0) as fake:
        boto = boto3.Session(region_name=fake.region)
        trainer = ModelTrainer(
            sagemaker_session=aws.sagemaker_session(boto), role=fake.role_arn, base_job_name="alice-elastic",
            training_image="763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.9-cpu-py312",
            source_code=SourceCode(source_dir=str(PROBE_CODE), entry_script="train.py"),
            distributed=ElasticTorchrun(process_count_per_node=1, max_restarts=1),
            compute=Compute(instance_type="ml.m5.xlarge", instance_count=2),
            stopping_condition=StoppingCondition(max_runtime_in_seconds=600), hyperparameters={"epochs": 1},
        )
        trainer.train(wait=False, logs=False)
        name, client = trainer._latest_training_job.training_job_name, boto.client("sagemaker")
        deadline = time.monotonic() + 900  # the job runs inside CreateTrainingJob, or after it
        while (described := client.describe_training_job(TrainingJobName=name))["TrainingJobStatus"] \
                == "InProgress" and time.monotonic() < deadline:
            time.sleep(2)
        run = fake.jobs[-1]
    assert run.runtime == "container"
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    seen = {}
    for found in Path(run.workdir).rglob("env-rank*.json"):
        env = json.loads(found.read_text())
        seen[int(env["RANK"])] = env
    assert sorted(seen) == [0, 1]
    for rank, env in seen.items():
        host = f"algo-{rank + 1}"  # global rank 0 on algo-1 (node ranks follow --local-addr)
        assert env["SM_CURRENT_HOST"] == host and env["hostname"] == hostns.instance_hostname(host) != host
        assert env["algo-1"] == "127.0.0.1" and env["algo-2"] == "127.0.0.2"


@pytest.mark.slow
def test_an_elastic_job_runs_in_the_process_runtime_too(tmp_path):
    """Where Linux namespaces are unavailable the hosts are plain processes: no algo-N name resolves
    and the master is 127.0.0.1. The first host runs the rendezvous' store and its workers' store."""
    from conftest import PROBE_CODE

    from workshop.runtime.local_cluster import LocalCluster

    cluster = LocalCluster(PROBE_CODE, "train.py", hosts=2, procs_per_host=1,
                           distributed=ElasticTorchrun(process_count_per_node=1, max_restarts=1),
                           workdir=tmp_path / "run", echo=False, runtime="process")
    result = cluster.run({}, check=False)
    assert result.ok and result.runtime == "process", "\n".join(result.lines[-40:])
    seen = {json.loads(f.read_text())["RANK"]: host.name for host in result.hosts
            for f in host.output_data_dir.glob("env-rank*.json")}
    assert seen == {"0": "algo-1", "1": "algo-2"}


@pytest.mark.slow
def test_a_host_that_starts_minutes_before_the_master_still_joins(tmp_path):
    """Instances finish their set-up at different times. Here algo-1, which runs the rendezvous' store,
    starts 200 s after algo-2: algo-2's agent must keep trying to reach the store for as long as the
    rendezvous waits for a host (its join timeout), not for torchrun's 60 s read timeout (tried twice,
    with a pause between: about 145 s)."""
    from conftest import PROBE_CODE

    from workshop.runtime.local_cluster import LocalCluster

    cluster = LocalCluster(PROBE_CODE, "train.py", hosts=2, procs_per_host=1,
                           distributed=ElasticTorchrun(process_count_per_node=1, max_restarts=1),
                           start_skew_s=[200, 0], workdir=tmp_path / "run", echo=False, runtime="container")
    result = cluster.run({}, check=False)
    assert result.ok, "\n".join(result.lines[-40:])
    algo1, algo2 = result.hosts
    assert algo1.driver_started_s - algo2.driver_started_s >= 195
    assert sorted(json.loads(f.read_text())["RANK"] for h in result.hosts for f in h.output_data_dir.glob("env-rank*.json")) \
        == ["0", "1"]
