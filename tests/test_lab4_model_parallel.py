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


# --------------------------------------------------------------------------- DeepSpeed ZeRO (issue 29)

ZERO_STAGES = ("zero1", "zero2", "zero3", "zero3_offload")


def test_sagemaker_deepspeed_route_installs_deepspeed_at_the_jobs_start(corpus, capsys):
    """The deepspeed route: the FSDP route's PyTorch 2.13 image and instances, plain Torchrun(), a ZeRO sharding, and
    DeepSpeed installed by the SDK's sm_train.sh from the code folder's requirements file; priced as the other routes."""
    request = run_on_sagemaker(LAB, route="deepspeed", hosts=2, data_dir=corpus.root, dry_run=True, region="us-east-1")
    out = capsys.readouterr().out
    assert request["AlgorithmSpecification"]["TrainingImage"] == (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch:2.13-cu133-amzn2023-sagemaker")
    assert request["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge" and request["ResourceConfig"]["InstanceCount"] == 2
    assert request["HyperParameters"]["sharding"] == "zero3"  # the route's own flag
    assert json.loads(request.sm_drivers["distributed.json"]) == {"process_count_per_node": None, "smp": None}
    assert "install_requirements.py requirements-deepspeed.txt" in request.sm_drivers["sm_train.sh"]
    assert "requirements-deepspeed.txt" in request.code_files and "deepspeed_zero.py" in request.code_files
    assert "cost: at most $1.41 = 2 x ml.g5.xlarge" in out
    assert "installs 4_model_parallel/code/requirements-deepspeed.txt (deepspeed==0.19.8) from PyPI" in out
    # Another stage, by the script's own flag; the default route's job installs nothing.
    other = run_on_sagemaker(LAB, route="deepspeed", hosts=2, hyperparameters={"sharding": "zero1"},
                             data_dir=corpus.root, dry_run=True, region="us-east-1")
    assert other["HyperParameters"]["sharding"] == "zero1"
    fsdp = run_on_sagemaker(LAB, hosts=2, data_dir=corpus.root, dry_run=True, region="us-east-1")
    assert "install_requirements.py" not in fsdp.sm_drivers["sm_train.sh"]


def test_the_pinned_deepspeed_is_the_environments():
    """The job installs the version this environment runs locally (requirements.txt lists the same pin)."""
    from workshop import REPO_ROOT
    from workshop.spec import missing_requirements

    job = (LAB.source_dir / "requirements-deepspeed.txt").read_text().split()
    assert "deepspeed==0.19.8" in job and "deepspeed==0.19.8" in (REPO_ROOT / "requirements.txt").read_text().split()
    assert missing_requirements(LAB.source_dir / "requirements-deepspeed.txt") == []


@pytest.mark.parametrize(
    ("kwargs", "message", "fix"),
    [
        ({"hyperparameters": {"sharding": "zero2"}}, "sharding=zero2 runs DeepSpeed, which the 'fsdp' route's image",
         "route='deepspeed'"),
        ({"route": "deepspeed", "hyperparameters": {"sharding": "full_shard"}}, "sharding=full_shard is PyTorch's own",
         "zero1, zero2, zero3 or zero3_offload"),
        ({"route": "deepspeed", "network": "endpoints"}, "needs the internet .*requirements-deepspeed.txt",
         "network='nat'"),
        ({"route": "deepspeed", "hyperparameters": {"checkpoint-every": 10}}, "a DeepSpeed engine keeps its own",
         "--checkpoint-every 0"),
    ],
)
def test_sagemaker_deepspeed_refusals(corpus, kwargs, message, fix):
    with pytest.raises(WorkshopError, match=message) as info:
        run_on_sagemaker(LAB, hosts=2, data_dir=corpus.root, dry_run=True, region="us-east-1", **kwargs)
    assert fix in info.value.fix


def test_your_own_image_must_bring_deepspeed(corpus, capsys):
    """With image_uri the job installs nothing (and needs no internet for it): the image must have DeepSpeed."""
    from workshop.jobs import check_internet, plan_job

    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:1"
    plan = plan_job(LAB, route="deepspeed", region="us-east-1", image_uri=image)
    assert check_internet(plan, "endpoints") is plan
    assert any("your image must have those packages" in note for note in plan.notes)
    request = run_on_sagemaker(LAB, route="deepspeed", hosts=2, data_dir=corpus.root, dry_run=True,
                               region="us-east-1", image_uri=image)
    assert "install_requirements.py" not in request.sm_drivers["sm_train.sh"]


def test_a_route_whose_requirements_file_is_missing_is_refused():
    import dataclasses

    from workshop.jobs import plan_job

    route = dataclasses.replace(LAB.sagemaker_route("deepspeed"), requirements="no-such-requirements.txt")
    with pytest.raises(WorkshopError, match="installs .*no-such-requirements.txt, which is not there"):
        plan_job(dataclasses.replace(LAB, routes=(route,)), route="deepspeed", region="us-east-1")


@pytest.fixture
def without_deepspeed(monkeypatch):
    """This environment as it is without DeepSpeed installed."""
    from importlib import metadata

    real = metadata.version

    def version(name):
        if name == "deepspeed":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)


@pytest.mark.parametrize("how", [{"route": "deepspeed"}, {"hyperparameters": {**TINY, "sharding": "zero1"}}])
def test_a_local_run_without_deepspeed_names_the_fix(corpus, tmp_path, without_deepspeed, how):
    with pytest.raises(WorkshopError, match=r"runs DeepSpeed's ZeRO, and this environment lacks deepspeed==0.19.8 "
                                            r"\(not installed\)") as info:
        run_local(LAB, hosts=2, workdir=tmp_path / "run", data_dir=corpus.root, echo=False, **how)
    assert "pip install -r 4_model_parallel/code/requirements-deepspeed.txt" in info.value.fix
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_the_cli_without_deepspeed_says_the_fix_not_a_traceback(without_deepspeed, tmp_path, capsys):
    from workshop.__main__ import main as cli_main

    code = cli_main(["run", "model_parallel", "--route", "deepspeed", "--hosts", "2", "--workdir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --sharding zero3 runs DeepSpeed's ZeRO"), err
    assert "Fix: pip install -r 4_model_parallel/code/requirements-deepspeed.txt" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_a_local_route_runs_with_its_flags(corpus, tmp_path):
    """Locally, --route deepspeed is the route's ZeRO sharding (the script's own check sees zero3, before anything
    starts); a route that differs only on SageMaker (smp: its image) is refused, as is a route for several labs."""
    from workshop.__main__ import main as cli_main

    assert LAB.route_hyperparameters("deepspeed") == {"sharding": "zero3"} and LAB.route_hyperparameters("fsdp") == {}
    with pytest.raises(WorkshopError, match="--checkpoint-every with --sharding zero3"):
        run_local(LAB, hosts=2, route="deepspeed", hyperparameters={"checkpoint-every": 5}, checkpoint_dir=tmp_path,
                  workdir=tmp_path / "run", data_dir=corpus.root, echo=False)
    with pytest.raises(WorkshopError, match="'smp' route differs from its default only on SageMaker"):
        run_local(LAB, route="smp", workdir=tmp_path / "run", data_dir=corpus.root, echo=False)
    assert cli_main(["run", "all", "--route", "deepspeed", "--workdir", str(tmp_path)]) == 2
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_the_run_command_reports_each_ranks_bytes_against_the_theory():
    from workshop.metrics import parse_lines, state_lines

    line = ("METRICS rank=1 sharding=zero2 param_bytes=539648 grad_bytes=331776 optim_bytes=809476 "
            "theory_param_bytes=539648 theory_grad_bytes=269824 theory_optim_bytes=809476 state_bytes=1680900 "
            "ideal_state_bytes=1618948 step_time_s=0.0466")
    assert state_lines(parse_lines([line, "METRICS rank=0 step=3 train_loss=5.1"])) == [
        "rank 1 (zero2): holds 1,680,900 bytes of state, 1.038 x the theory's 1,618,948 (parameters 539,648 "
        "(theory 539,648), gradients 331,776 (theory 269,824), optimizer 809,476 (theory 809,476)); 46.6 ms per step"]
    assert state_lines(parse_lines(["METRICS rank=0 final_train_loss=4.2"])) == []


def test_missing_requirements_reads_the_pins(tmp_path):
    from workshop.spec import missing_requirements

    path = tmp_path / "requirements.txt"
    path.write_text("# a comment\npytest==0.0.1\nno-such-distribution-here==1.0  # why\nnumpy>=1\n")
    import pytest as installed

    assert missing_requirements(path) == [f"pytest==0.0.1 ({installed.__version__} installed)",
                                          "no-such-distribution-here==1.0 (not installed)"]


@pytest.mark.slow
def test_the_deepspeed_route_trains_and_reports_each_ranks_bytes_against_the_theory(corpus, tmp_path):
    """`python -m workshop run model_parallel --route deepspeed --hosts 2`: ZeRO-3 on 2 simulated hosts, each rank's
    bytes as ZeRO's theory says (the notebook measures every stage beside FSDP's rows), and nothing compiled."""
    import os

    ext = tmp_path / "torch_extensions"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext)}
    proc = subprocess.run([sys.executable, "-m", "workshop", "run", "model_parallel", "--route", "deepspeed",
                           "--hosts", "2", "--hp", "steps=4", "--hp", "log-interval=2", "--workdir", str(tmp_path / "w"),
                           "--data-dir", str(corpus.root)], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("rank ")]
    assert [line.split(" (")[0] for line in lines] == ["rank 0", "rank 1"], proc.stdout[-3000:]
    for line in lines:
        assert "(zero3): holds 1,349,124 bytes of state, 1.000 x the theory's 1,349,124" in line, line
    assert not ext.exists()  # DeepSpeed compiled no op (it would have built them there)
    log = next((tmp_path / "w" / "runs").glob("*/logs/cluster.log")).read_text()
    assert "DeepSpeed ZeRO-3 over 2 ranks" in log and "Saved the model" in log


@pytest.mark.slow
def test_the_deepspeed_route_on_the_fake_sagemaker_installs_deepspeed_then_trains(corpus, tmp_path):
    """The job as SageMaker runs it: the SDK's sm_train.sh pip-installs requirements-deepspeed.txt on every host (here
    already satisfied: this environment has the pin), then Torchrun() starts the ZeRO-2 ranks, which report their bytes."""
    sys.path.insert(0, str(Path(__file__).parent))
    import boto3
    import fake_sagemaker

    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=1.0) as fake:
        job = run_on_sagemaker(LAB, route="deepspeed", hosts=2, data_dir=corpus.root, confirm_cost=True,
                               hyperparameters={**TINY, "steps": 4, "log-interval": 2, "sharding": "zero2"})
        assert job.ok, job.failure_reason
        client = boto3.Session(region_name=fake.region).client("logs")
        streams = client.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs",
                                              logStreamNamePrefix=job.job_name + "/")["logStreams"]
        assert len(streams) == 2
        for stream in streams:
            host_lines = [e["message"] for e in client.get_log_events(
                logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream["logStreamName"],
                startFromHead=True)["events"]]
            installed = host_lines.index("Installing requirements")
            assert any("deepspeed==0.19.8" in line for line in host_lines[installed:]), host_lines[:80]
            assert installed < host_lines.index("Running Torchrun Driver")
        records = job.records()
    rows = sorted((r for r in records if "state_bytes" in r), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1] and all(r["zero_stage"] == 2 for r in rows)
    for r in rows:  # within a few percent (ZeRO-2's gradient buffer covers whole parameters: see deepspeed_zero.py)
        assert abs(r["state_bytes"] / r["ideal_state_bytes"] - 1) < 0.05, r


def test_the_notebooks_grid_and_a_check_that_fails_where_a_rank_holds_more_than_its_share():
    """measure.grid lists the notebook's runs; findings.check_grid (the notebook's checks of them) passes on the
    ZeRO accounting and raises when one rank holds 20% more than its share."""
    from workshop import planner
    from workshop.spec import load_module

    measure = load_module(LAB.path / "measure.py", "_lab4_measure")
    findings = load_module(LAB.path / "findings.py", "_lab4_findings")
    planned = measure.grid((1, 2, 4))
    assert [(t, n) for t, n, _ in planned][:5] == [("no_shard", 1), ("no_shard", 2), ("optimizer", 2),
                                                   ("shard_grad_op", 2), ("full_shard", 2)]
    assert planned[-3:] == [("hybrid_shard", 4, {"hybrid-shard-degree": 2}),
                            ("full_shard+ckpt", 2, {"activation-checkpointing": "true"}),
                            ("full_shard+ckpt+offload", 2, {"activation-checkpointing": "true",
                                                            "activation-offloading": "simulate"})]
    tiny = planner.transformer("tiny", layers=2, d_model=64, heads=4, seq_len=32, vocab=256, tied_embeddings=False)
    p = int(tiny.params)

    def ranks(technique, n):
        shard = n if technique in ("shard_grad_op", "full_shard") else 1
        optim = 8 * p // (1 if technique == "no_shard" else n)
        return [{"rank": r, "shard_group": shard, "full_state_bytes": 16 * p, "param_bytes": 4 * p // shard,
                 "grad_bytes": 4 * p // shard, "optim_bytes": optim, "state_bytes": 8 * p // shard + optim,
                 "final_train_loss": 2.5, "test_loss": 2.6} for r in range(n)]

    runs = {(t, n): ranks(t, n) for n in (1, 2) for t in measure.TECHNIQUES if n > 1 or t == "no_shard"}
    findings.check_grid(runs, (1, 2), tiny)
    runs["full_shard", 2][1]["state_bytes"] *= 1.2
    with pytest.raises(AssertionError):
        findings.check_grid(runs, (1, 2), tiny)


def test_the_step_peak_is_the_allocators_highest_point_above_the_state():
    """accounting.StepPeak on a CPU: what the rank held when the step began (its parameters and optimizer state) plus
    the most the step allocated at once, to the byte; off, it measures nothing."""
    import time

    import torch

    from workshop.spec import load_module

    StepPeak = load_module(LAB.source_dir / "accounting.py", "_lab4_accounting", with_siblings=True).StepPeak

    model = torch.nn.Linear(100, 10)  # 1,010 parameters: 4,040 bytes
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 100)).sum().backward()
    optimizer.step()  # AdamW's state now: two moments per parameter and a step count per tensor
    optimizer.zero_grad(set_to_none=True)
    held = 4040 + 2 * 4040 + 2 * 4
    peak = StepPeak(None).start(model, optimizer)
    a = torch.empty(1_000_000)  # 4 MB
    b = torch.empty(2_000_000)  # 12 MB at once
    del a
    c = torch.empty(500_000)  # 10 MB
    del b, c
    assert 0 < peak.stop(time.perf_counter() - 60) < 600  # the seconds since the step began
    assert peak.measures() == {"step_start_bytes": held, "step_peak_bytes": held + 12_000_000}
    assert StepPeak(None, on=False).start(model, optimizer).measures() == {}


def test_the_peak_check_holds_shard_grad_op_to_the_blocks_full_shard_does_not_keep():
    """findings.check_peak: shard_grad_op's peak above full_shard's by layers - 2 blocks, within one; bf16's state
    unchanged, its activations about half and its losses fp32's; each claim raises when the numbers break it."""
    from workshop.spec import load_module

    findings = load_module(LAB.path / "findings.py", "_lab4_findings")
    block = findings.block_param_bytes(64)
    assert block == 4 * (12 * 64 * 64 + 13 * 64)

    def runs(gap_blocks=6.0, bf16_acts=0.52, bf16_loss=4.675, bf16_state=1000):
        base = {"state_bytes": 1000, "saved_act_bytes": 4_000_000, "final_train_loss": 4.674, "test_loss": 4.568}
        full = [{**base, "rank": r, "step_peak_bytes": 8_000_000} for r in range(2)]
        sgo = [{**f, "step_peak_bytes": f["step_peak_bytes"] + int(gap_blocks * block)} for f in full]
        bf16 = [{**f, "state_bytes": bf16_state, "saved_act_bytes": int(bf16_acts * 4_000_000),
                 "final_train_loss": bf16_loss, "step_peak_bytes": 5_000_000} for f in full]
        return {"shard_grad_op": sgo, "full_shard": full, "full_shard bf16": bf16}

    found = findings.check_peak(runs(), 8, 64)  # 6 blocks: within 5 to 7.5
    assert found["gap_blocks"] == pytest.approx(6.0, abs=1e-5) and found["bf16_acts"] == pytest.approx(0.52)
    for broken in ({"gap_blocks": 0.0}, {"gap_blocks": 8.0}, {"bf16_acts": 1.0}, {"bf16_loss": 4.8},
                   {"bf16_state": 500}):
        with pytest.raises(AssertionError):
            findings.check_peak(runs(**broken), 8, 64)
