"""A training script of your own, unchanged (`workshop.script_mode`, docs/your-script.md): `python -m workshop
run-script` and `workshop.train_locally(trainer)` on the local cluster, the same ModelTrainer's request and its
run on the fake SageMaker, the aggregated model archive and its name clashes, and every bad input a user meets,
each refused before anything starts with its fix.

The five tutorial scripts of tests/fixtures/unmodified/ run through these same paths in
tests/test_unmodified_scripts.py (once each). The SDK v3 patterns below are written from the SDK's documentation
(its "distributed local training" example's shape): a script that reads the hard-coded /opt/ml/input/data, copies
files by paths relative to its own folder, logs to stdout; and a SourceCode(command=...) instead of an entry_script.
"""

from __future__ import annotations

import json
import re
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

import workshop
from workshop import script_mode
from workshop.__main__ import main
from workshop.datasets.local import GivenChannels
from workshop.errors import WorkshopError
from workshop.runtime.artifacts import aggregate

IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch:2.13-cpu-amzn2023-sagemaker"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def run_folders(workdir: Path) -> list[Path]:
    return sorted((workdir / "runs").glob("script-*")) if (workdir / "runs").is_dir() else []


def cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(["run-script", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


# --------------------------------------------------------------------------- the archives


def test_a_name_two_hosts_wrote_is_reported_in_one_line_and_different_names_are_both_archived(tmp_path):
    for host, names in (("algo-1", ("model.pth", "code/train.py", "rank0.txt")),
                        ("algo-2", ("model.pth", "code/train.py", "rank1.txt"))):
        for name in names:
            write(tmp_path / host / name, f"{host} {name}\n")
    archive = aggregate({h: tmp_path / h for h in ("algo-2", "algo-1")}, tmp_path / "out" / "model.tar.gz")
    with tarfile.open(archive.path) as tar:
        names = sorted(m.name for m in tar.getmembers())
        kept = tar.extractfile("model.pth").read().decode()
    assert names == ["code/train.py", "model.pth", "rank0.txt", "rank1.txt"]
    assert kept == "algo-1 model.pth\n"  # the first host's, in SageMaker's host order
    lines = archive.clash_lines()
    assert len(lines) == 1, lines  # one line for the names the same hosts wrote
    assert "code/train.py, model.pth written by algo-1 and algo-2" in lines[0]
    assert "does not promise which" in lines[0] and "Fix:" in lines[0]
    assert archive.members["rank1.txt"] == "algo-2"


def test_an_empty_model_folder_is_said(tmp_path):
    (tmp_path / "algo-1").mkdir()
    archive = aggregate({"algo-1": tmp_path / "algo-1"}, tmp_path / "model.tar.gz")
    assert archive.empty and archive.clash_lines() == []
    assert "empty: no host wrote anything into /opt/ml/model" in archive.summary()
    with tarfile.open(archive.path) as tar:  # SageMaker uploads an empty archive too
        assert tar.getmembers() == []


# --------------------------------------------------------------------------- channels


def test_channels_are_checked_when_given(tmp_path):
    with pytest.raises(WorkshopError, match=r"Channel 'train': .*nowhere does not exist"):
        GivenChannels({"train": tmp_path / "nowhere"})
    with pytest.raises(WorkshopError, match="SDK v3 sends your code and its drivers"):
        GivenChannels({"code": tmp_path})
    with pytest.raises(WorkshopError, match="Invalid channel name"):
        GivenChannels({"my channel": tmp_path})
    with pytest.raises(WorkshopError, match="neither a local path nor an S3 URI"):
        GivenChannels({"train": "https://example.com/data"})


def test_a_file_channel_is_a_folder_holding_that_file_as_the_sdk_uploads_it(tmp_path):
    params = write(tmp_path / "params.json", "{}")
    folder = write(tmp_path / "data" / "x.npy", "x").parent
    channels = GivenChannels({"config": f"file://{params}", "train": folder}).prepared(tmp_path / "cache")
    assert channels.local["train"] == folder.resolve()
    assert [p.name for p in channels.local["config"].iterdir()] == ["params.json"]
    assert (channels.local["config"] / "params.json").read_text() == "{}"


def test_an_s3_channel_is_downloaded_with_your_credentials(moto_session, tmp_path, capsys):
    s3 = moto_session.client("s3")
    s3.create_bucket(Bucket="my-data")
    s3.put_object(Bucket="my-data", Key="mnist/train/a.npz", Body=b"a")
    s3.put_object(Bucket="my-data", Key="mnist/train/sub/b.npz", Body=b"bb")
    s3.put_object(Bucket="my-data", Key="mnist/trainer.txt", Body=b"not this")
    source = GivenChannels({"train": "s3://my-data/mnist/train"})
    assert source.prepared(tmp_path).s3 == {"train": "s3://my-data/mnist/train"}  # SageMaker mode: as it is
    folder = source.prepare(tmp_path).local["train"]
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == ["a.npz", "sub/b.npz"]
    assert "2 downloaded with your AWS credentials" in capsys.readouterr().out
    source.prepare(tmp_path)
    assert "0 downloaded with your AWS credentials, 2 already there" in capsys.readouterr().out


def test_an_s3_channel_without_credentials_is_refused_with_the_fix(no_aws, tmp_path):
    with pytest.raises(WorkshopError) as error:
        GivenChannels({"train": "s3://my-data/train"}).prepare(tmp_path)
    assert "no AWS credentials were found" in error.value.message
    assert "aws s3 sync s3://my-data/train data/train" in error.value.fix


# --------------------------------------------------------------------------- bad input, before anything starts


def test_an_entry_that_does_not_exist_is_refused_naming_what_is_there(tmp_path, capsys):
    write(tmp_path / "code" / "train.py", "print(1)\n")
    code, out = cli(capsys, str(tmp_path / "code" / "trian.py"), "--workdir", str(tmp_path / "w"))
    assert code == 2
    assert "No entry script 'trian.py'" in out and "its Python files: train.py" in out
    assert run_folders(tmp_path / "w") == []


def test_a_syntax_error_is_shown_once_from_here_not_from_every_rank(tmp_path, capsys):
    write(tmp_path / "code" / "train.py", "import helpers\nprint('ok')\n")
    write(tmp_path / "code" / "helpers.py", "def f(:\n    pass\n")
    code, out = cli(capsys, str(tmp_path / "code" / "train.py"), "--launcher", "torchrun", "--workdir", str(tmp_path / "w"))
    assert code == 2
    assert out.count("does not compile") == 1
    assert "helpers.py does not compile (line 1" in out and "def f(:" in out and "py_compile" in out
    assert run_folders(tmp_path / "w") == []


def test_an_import_this_environment_lacks_is_named_with_the_command_that_installs_it(tmp_path, capsys):
    write(tmp_path / "code" / "train.py", """
        import json
        import no_such_package_here
        try:
            import optional_thing_nobody_has  # optional: not asked for
        except ImportError:
            pass
    """)
    code, out = cli(capsys, str(tmp_path / "code" / "train.py"), "--workdir", str(tmp_path / "w"))
    assert code == 2
    assert "no_such_package_here (train.py, line 2)" in out and "optional_thing" not in out
    assert "-m pip install no_such_package_here" in out
    assert run_folders(tmp_path / "w") == []


def test_requirements_this_environment_lacks_are_named_never_installed(tmp_path, capsys):
    write(tmp_path / "code" / "train.py", "print('ok')\n")
    write(tmp_path / "code" / "requirements.txt", """
        # what the job needs
        numpy>=1.0
        no-such-package-xyz==1.2.3
        torch>=99
        pywin32==306; sys_platform == 'win32'
    """)
    code, out = cli(capsys, str(tmp_path / "code" / "train.py"), "--workdir", str(tmp_path / "w"))
    assert code == 2
    assert "requirements.txt names packages this environment lacks: no-such-package-xyz==1.2.3 (not installed), torch>=99 (" in out
    assert "numpy" not in out.split("Fix:")[0] and "pywin32" not in out
    assert "-m pip install no-such-package-xyz==1.2.3 'torch>=99'" in out
    assert run_folders(tmp_path / "w") == []
    from importlib import metadata

    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("no-such-package-xyz")


@pytest.mark.parametrize("hp, said", [
    ("note=it's here", "contains a single quote"),
    ("my key=1", "cannot be part of an environment variable name"),
])
def test_hyperparameters_the_container_cannot_receive_are_refused(tmp_path, capsys, hp, said):
    write(tmp_path / "code" / "train.py", "print('ok')\n")
    code, out = cli(capsys, str(tmp_path / "code" / "train.py"), "--hp", hp, "--workdir", str(tmp_path / "w"))
    assert code == 2 and said in out
    assert run_folders(tmp_path / "w") == []


def test_a_cluster_this_machine_cannot_hold_is_refused(tmp_path, capsys):
    write(tmp_path / "code" / "train.py", "print('ok')\n")
    code, out = cli(capsys, str(tmp_path / "code" / "train.py"), "--launcher", "torchrun", "--hosts", "400",
                    "--workdir", str(tmp_path / "w"))
    assert code == 2 and "This machine cannot carry 400 host(s)" in out and "use fewer hosts" in out
    assert run_folders(tmp_path / "w") == []


def test_a_channel_that_does_not_exist_and_other_misuses_are_refused(tmp_path, capsys):
    entry = str(write(tmp_path / "code" / "train.py", "print('ok')\n"))
    for argv, said in (
        (["--channel", f"train={tmp_path / 'nowhere'}"], "does not exist"),
        (["--channel", "train"], "is not NAME=VALUE"),
        (["--procs-per-host", "2"], "once per host"),
        (["--launcher", "parameter-server", "--hosts", "1"], "at least 2 hosts"),
        (["--image", IMAGE], "appl"),
        (["--fault", "kill-rank=1@step=3"], "your script has no such flag"),
    ):
        code, out = cli(capsys, entry, *argv, "--workdir", str(tmp_path / "w"))
        assert code == 2 and said in out, (argv, out)
    assert run_folders(tmp_path / "w") == []


# --------------------------------------------------------------------------- a ModelTrainer


def trainer(session: Any = None, **changes: Any) -> Any:
    """A ModelTrainer as the SDK's v3 distributed local training example writes it (Docker mode), or with `changes`."""
    from sagemaker.train.configs import Compute, SourceCode
    from sagemaker.train.distributed import Torchrun
    from sagemaker.train.model_trainer import Mode, ModelTrainer

    fields = dict(training_image=IMAGE, source_code=SourceCode(source_dir=str(EXAMPLE), entry_script="train.py"),
                  distributed=Torchrun(process_count_per_node=1), compute=Compute(instance_type="local_cpu", instance_count=2),
                  base_job_name="local_mode_multi_container", training_mode=Mode.LOCAL_CONTAINER)
    fields.update(changes)
    return ModelTrainer(sagemaker_session=session, **fields)


EXAMPLE = Path(__file__).parent / "fixtures" / "your_script" / "sdk_example"


def example_data(root: Path) -> Path:
    """The example's train channel: 64 samples of 4 features, as .npy files."""
    import numpy as np

    folder = root / "data" / "train"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    np.save(folder / "x_train.npy", rng.normal(size=(64, 4)).astype(np.float32))
    np.save(folder / "y_train.npy", rng.normal(size=64).astype(np.float32))
    return folder


def test_workshop_train_locally_is_the_front_door():
    assert workshop.train_locally is script_mode.train_locally


def test_a_docker_mode_trainer_is_read_with_what_sagemaker_would_refuse_said(moto_session):
    job = script_mode.trainer_job(trainer())
    assert (job.hosts, job.procs_per_host) == (2, 1)
    assert job.spec.launcher.name == "torchrun" and job.spec.entry_script == "train.py"
    assert any("image " + IMAGE + " is not pulled" in note for note in job.notes)
    warning = "\n".join(job.warnings)  # the SDK sends nothing in Docker mode; SageMaker would refuse these
    assert "TrainingJobName = 'local_mode_multi_container-" in warning and "InstanceType = 'local_cpu'" in warning


def test_a_sagemaker_mode_trainer_sagemaker_would_refuse_is_refused_here(moto_session, monkeypatch):
    from sagemaker.train.configs import Compute
    from sagemaker.train.model_trainer import Mode

    from workshop.cloud import aws

    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")  # moto has no iam:SimulatePrincipalPolicy
    with pytest.raises(WorkshopError, match="TrainingJobName = 'my_job-"):
        script_mode.trainer_job(trainer(aws.sagemaker_session(moto_session), training_mode=Mode.SAGEMAKER_TRAINING_JOB,
                                        role="arn:aws:iam::123456789012:role/r", base_job_name="my_job",
                                        compute=Compute(instance_type="ml.m5.xlarge", instance_count=2)))


def test_what_cannot_be_simulated_is_said_and_a_gpu_type_gets_one_process_per_gpu(moto_session):
    from sagemaker.train.configs import Compute
    from sagemaker.train.distributed import SMP, Torchrun

    job = script_mode.trainer_job(trainer(compute=Compute(instance_type="ml.g5.12xlarge", instance_count=2),
                                          distributed=Torchrun(smp=SMP(hybrid_shard_degree=2))))
    notes = "; ".join(job.notes)
    assert job.procs_per_host == 4  # one per GPU, as SageMaker's Torchrun driver starts them
    assert "ml.g5.12xlarge's 4 GPU(s): each host runs on this machine's CPUs" in notes
    assert "torch.cuda.is_available() is False" in notes and "SMP (Torchrun(smp=...))" in notes
    assert "mp_parameters" in job.hyperparameters


@pytest.mark.parametrize("change, said", [
    ("mpi", "SDK v3's MPI() is not simulated"),
    ("s3_source", "train_locally runs a folder on this machine"),
    ("quote", "contains a single quote"),
])
def test_a_trainer_that_cannot_run_here_is_refused_with_the_fix(moto_session, change, said):
    from sagemaker.train.configs import SourceCode
    from sagemaker.train.distributed import MPI

    changes = {"mpi": {"distributed": MPI(process_count_per_node=1)},
               "s3_source": {"source_code": SourceCode(source_dir="s3://bucket/code.tar.gz", entry_script="train.py")},
               "quote": {"hyperparameters": {"note": "it's"}}}[change]
    with pytest.raises(WorkshopError, match=said.replace("(", r"\(").replace(")", r"\)")):
        script_mode.trainer_job(trainer(**changes))


def test_the_dry_run_of_a_trainer_says_what_sagemaker_would_refuse_and_shows_what_it_would_take(moto_session, capsys,
                                                                                               tmp_path):
    from sagemaker.train.configs import Compute, InputData

    from workshop.jobs.dry_run import dry_run_trainer

    data = example_data(tmp_path)
    docker_mode = trainer(input_data_config=[InputData(channel_name="train", data_source=str(data))])
    with pytest.raises(WorkshopError, match="InstanceType"):
        dry_run_trainer(docker_mode, show=False)
    ready = trainer(compute=Compute(instance_type="ml.m5.xlarge", instance_count=2), base_job_name="sdk-example",
                    input_data_config=[InputData(channel_name="train", data_source=str(data))],
                    hyperparameters={"epochs": 1, "note": "naïve \"quoted\" text"})
    request = dry_run_trainer(ready)
    assert request["ResourceConfig"]["InstanceCount"] == 2
    assert request["HyperParameters"] == {"epochs": "1", "note": 'naïve "quoted" text'}
    assert request.channel("train").startswith("s3://")  # the SDK uploaded the local folder
    assert "train.py" in request.code_files and "model_def.py" in request.code_files
    assert json.loads(request.sm_drivers["distributed.json"])["process_count_per_node"] == 1
    assert "checked against every constraint" in capsys.readouterr().out


def test_run_script_in_sagemaker_mode_dry_runs_the_modeltrainer_you_would_write(no_aws, tmp_path, capsys):
    code = write(tmp_path / "code" / "train.py", "import torch\nprint('ok')\n").parent
    write(code / "requirements.txt", "numpy\n")
    data = write(tmp_path / "data" / "train" / "x.csv", "1,2\n").parent
    status, out = cli(capsys, str(code / "train.py"), "--launcher", "torchrun", "--hosts", "2", "--mode", "sagemaker",
                      "--dry-run", "--channel", f"train={data}", "--channel", "test=s3://my-data/test",
                      "--env", "MY_SETTING=on", "--hp", "epochs=2", "--hp", "note=a b")
    assert status == 0, out
    request = json.loads(out[out.index("{"):out.index("\n}\n") + 2])
    assert request["ResourceConfig"] == {"InstanceType": "ml.m5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30}
    assert request["HyperParameters"] == {"epochs": "2", "note": "a b"}
    assert request["Environment"]["MY_SETTING"] == "on"
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]}
    assert channels["test"] == "s3://my-data/test"  # an S3 channel as it is
    assert channels["train"].endswith("/distributed-training-workshop/alice-example/script-data/train")
    assert request["TrainingJobName"].startswith("alice-example-script-")
    assert "pytorch:2.13-cpu-amzn2023" in request["AlgorithmSpecification"]["TrainingImage"]
    assert "requirements.txt" in out and "checked against every constraint" in out
    assert "your script train.py: 2 x ml.m5.xlarge" in out and "lab script" not in out  # the summary's first line


def test_the_workshop_role_covers_your_scripts_jobs(no_aws):
    from workshop import account

    assert any(prefix.endswith("-script/") for prefix in account.s3_prefixes())


# --------------------------------------------------------------------------- runs (slow)


@pytest.mark.slow
def test_one_modeltrainer_runs_locally_then_dry_runs_then_runs_on_the_fake_sagemaker(tmp_path, capsys):
    """The SDK's own distributed example's shape (hard-coded /opt/ml/input/data, files copied by paths relative to
    the code folder, logging to stdout, Torchrun(1) on 2 instances): the same object trains on the local cluster
    (both hosts write model.pth: reported), its request passes botocore's whole model, and the fake SageMaker runs it
    with the same archive."""
    import io

    import boto3
    import fake_sagemaker
    from sagemaker.train.configs import Compute, InputData, StoppingCondition
    from sagemaker.train.model_trainer import Mode

    from workshop.cloud import aws
    from workshop.jobs.dry_run import dry_run_trainer

    data = example_data(tmp_path)
    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=1.0) as fake:
        boto = boto3.Session(region_name=fake.region)
        job = trainer(aws.sagemaker_session(boto), training_mode=Mode.SAGEMAKER_TRAINING_JOB, role=fake.role_arn,
                      base_job_name="sdk-example", compute=Compute(instance_type="ml.m5.xlarge", instance_count=2),
                      input_data_config=[InputData(channel_name="train", data_source=str(data))],
                      stopping_condition=StoppingCondition(max_runtime_in_seconds=600))
        local = workshop.train_locally(job, runs_dir=tmp_path / "runs")
        out = capsys.readouterr().out
        assert local.ok and "not simulated here: image " + IMAGE + " is not pulled" in out
        assert sorted(local.model.members) == ["code/model_def.py", "code/train.py", "model.pth"]
        clash = [line for line in out.splitlines() if line.startswith("name clash in model.tar.gz")]
        assert clash == [line for line in local.clashes if "model.tar.gz" in line] and len(clash) == 1
        assert "code/model_def.py, code/train.py, model.pth written by algo-1 and algo-2" in clash[0]
        for rank in (0, 1):
            assert "x train: (64, 4), y train: (64,)" in local.rank_lines(rank), rank  # logging to stdout

        request = dry_run_trainer(job, show=False)  # the same object's request, against the whole model
        assert request["ResourceConfig"]["InstanceType"] == "ml.m5.xlarge" and request.channel("train")

        job.train(wait=False, logs=False)
        name = job._latest_training_job.training_job_name
        fake.wait(name)
        described = boto.client("sagemaker").describe_training_job(TrainingJobName=name)
        assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
        bucket, key = described["ModelArtifacts"]["S3ModelArtifacts"][len("s3://"):].split("/", 1)
        body = boto.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
            assert sorted(m.name for m in tar.getmembers() if m.isfile()) == sorted(local.model.members)


@pytest.mark.slow
def test_a_command_instead_of_an_entry_script_and_each_hosts_own_files(moto_session, tmp_path):
    """SourceCode(command=..., args=...): the SDK's sm_train.sh runs the command itself; each host writes files
    of its own name, and the archives hold them all, with no clash."""
    from sagemaker.train.configs import Compute, SourceCode

    code = write(tmp_path / "code" / "run.py", """
        import json, os, sys
        host = os.environ["SM_CURRENT_HOST"]
        print(f"{host}: arguments {sys.argv[1:]}", flush=True)
        with open(os.path.join(os.environ["SM_MODEL_DIR"], f"weights-{host}.json"), "w") as f:
            json.dump(sys.argv[1:], f)
        with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"trace-{host}.txt"), "w") as f:
            f.write(host)
    """).parent
    job = trainer(source_code=SourceCode(source_dir=str(code), command="python run.py --steps 2",
                                         args=["--label", "two words"]),
                  distributed=None, compute=Compute(instance_type="local_cpu", instance_count=2))
    result = workshop.train_locally(job, runs_dir=tmp_path / "runs", echo=False)
    assert result.ok and result.clashes == []
    assert sorted(result.model.members.items()) == [("weights-algo-1.json", "algo-1"), ("weights-algo-2.json", "algo-2")]
    assert sorted(result.output.members) == ["trace-algo-1.txt", "trace-algo-2.txt"]
    with tarfile.open(result.model_archive) as tar:
        argv = json.loads(tar.extractfile("weights-algo-2.json").read())
    assert argv == ["--steps", "2", "--label", "two words"]


@pytest.mark.slow
def test_hyperparameters_arrive_as_sm_train_sh_delivers_them_and_what_the_script_leaves_is_stopped(tmp_path, capsys):
    """Quotes, spaces, unicode and a $ reach the script exactly as SDK v3's sm_train.sh delivers them (its
    environment.py and driver, run unchanged: a value that is itself JSON is decoded, as there); a script that
    writes no model succeeds, and the run says the model folder is empty; a process it leaves running is stopped."""
    import psutil
    from sagemaker.train.container_drivers.common.utils import (
        hyperparameters_to_cli_args,
        safe_deserialize,
    )

    code = write(tmp_path / "code" / "train.py", """
        import json, os, subprocess, sys, uuid
        marker = f"workshop-left-running-{uuid.uuid4().hex}"
        # Its output elsewhere: one holding the script's stdout would keep the SDK's driver reading it, on
        # SageMaker as here, until it exits
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", marker], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "seen.json"), "w") as f:
            json.dump({"argv": sys.argv[1:], "marker": marker}, f)
    """).parent
    hps = ['note=café "au lait" costs $HOME', 'title="Grand Café"', "epochs=3", "ratio=0.5", "flag=true", "name=ünïcödé ✓"]
    status, out = cli(capsys, str(code / "train.py"), *[a for hp in hps for a in ("--hp", hp)],
                      "--workdir", str(tmp_path / "w"))
    assert status == 0, out
    assert "model.tar.gz: empty: no host wrote anything into /opt/ml/model" in out
    from workshop.__main__ import parse_hp

    sent = {k: v if isinstance(v, str) else json.dumps(v) for k, v in parse_hp(hps).items()}  # the request's strings
    expected = hyperparameters_to_cli_args({k: safe_deserialize(v) for k, v in sent.items()})
    (run,) = run_folders(tmp_path / "w")
    with tarfile.open(run / "output" / "output.tar.gz") as tar:
        seen = json.loads(tar.extractfile("seen.json").read())
    assert seen["argv"] == expected
    assert seen["argv"][:2] == ["--note", 'café "au lait" costs $HOME'] and "Grand Café" in seen["argv"]
    left = [p for p in psutil.process_iter(["cmdline"]) if seen["marker"] in (p.info["cmdline"] or [])]
    assert left == []


@pytest.mark.slow
def test_a_script_that_hangs_gets_the_stall_report(moto_session, tmp_path):
    from sagemaker.train.configs import Compute, SourceCode

    from workshop.runtime.local_cluster import TrainingFailed

    code = write(tmp_path / "code" / "train.py", "import time\nprint('loading', flush=True)\ntime.sleep(600)\n").parent
    job = trainer(source_code=SourceCode(source_dir=str(code), entry_script="train.py"), distributed=None,
                  compute=Compute(instance_type="local_cpu", instance_count=1))
    with pytest.raises(TrainingFailed) as failed:
        workshop.train_locally(job, runs_dir=tmp_path / "runs", echo=False, stall_s=2, timeout_s=8)
    message = str(failed.value)
    assert "time limit of 8 s" in message and "loading" in message, message


@pytest.mark.slow
def test_an_import_error_at_run_time_is_shown_once(moto_session, tmp_path):
    """Every rank fails the same way; the report shows the traceback once, from the rank that failed first."""
    from sagemaker.train.configs import SourceCode

    code = write(tmp_path / "code" / "train.py", "import json\nfrom json import no_such_name\n").parent
    job = trainer(source_code=SourceCode(source_dir=str(code), entry_script="train.py"))
    result = workshop.train_locally(job, runs_dir=tmp_path / "runs", echo=False, check=False)
    assert not result.ok and result.model_archive is None
    assert re.match(r"Rank [01] on algo-[12] exited with status 1: ImportError", result.failure), result.failure
    assert result.failure.count("Traceback (most recent call last)") == 1, result.failure
    assert re.search(r"^Then: rank [01] on algo-[12] exited with status 1: the same error$", result.failure, re.M)


@pytest.mark.slow
def test_run_script_submits_its_job_to_the_fake_sagemaker_once_the_cost_is_confirmed(no_aws, tmp_path, capsys):
    """`--mode sagemaker`: the same preflight and cost confirmation as `run` (refused without a yes, nothing
    created), then the ModelTrainer you would write by hand: your channel uploaded once, your environment and
    hyperparameters in the request, the job run by the fake SageMaker."""
    import io

    import boto3
    import fake_sagemaker

    code = write(tmp_path / "code" / "train.py", """
        import os, sys
        files = sorted(os.listdir(os.environ["SM_CHANNEL_TRAIN"]))
        with open(os.path.join(os.environ["SM_MODEL_DIR"], "seen.txt"), "w") as f:
            f.write(" | ".join([" ".join(sys.argv[1:]), " ".join(files), os.environ["MY_SETTING"]]))
    """).parent
    data = write(tmp_path / "data" / "train" / "x.csv", "1,2\n").parent
    argv = [str(code / "train.py"), "--mode", "sagemaker", "--hosts", "1", "--channel", f"train={data}",
            "--env", "MY_SETTING=on", "--hp", "note=a b", "--region", "us-east-1"]
    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=0.0) as fake:
        status, out = cli(capsys, *argv)  # not a terminal and no --yes: refused once the bound is printed
        assert status == 2 and "Not started: this job can cost at most $" in out and fake.jobs == []
        status, out = cli(capsys, *argv, "--yes")
        assert status == 0, out[-3000:]
        (job,) = fake.jobs
        assert job.status == "Completed", job.failure_reason
        assert "script-data/train (1 file(s) uploaded" in out
        bucket, key = job.model_artifact[len("s3://"):].split("/", 1)
        body = boto3.Session(region_name=fake.region).client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
            assert tar.extractfile("seen.txt").read().decode() == "--note a b | x.csv | on"


def test_a_trainer_for_local_mode_is_built_with_no_aws_account_and_cannot_be_submitted(no_aws, monkeypatch):
    """`sagemaker_settings("local")`: a region, a placeholder account's bucket and role, no AWS call as the SDK builds
    the trainer; `submit_trainer` refuses that trainer with the fix (build it again in sagemaker mode)."""
    from sagemaker.train.configs import Compute, SourceCode
    from sagemaker.train.model_trainer import ModelTrainer

    from workshop.jobs.dry_run import PLACEHOLDER_ROLE_ARN

    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")  # restored after the test (the function sets it)
    built = ModelTrainer(**script_mode.sagemaker_settings("local"), training_image=IMAGE,
                         source_code=SourceCode(source_dir=str(EXAMPLE), entry_script="train.py"),
                         compute=Compute(instance_type="ml.m5.xlarge", instance_count=2))
    assert built.role == PLACEHOLDER_ROLE_ARN and built.base_job_name.endswith("-script")
    assert script_mode.trainer_job(built).hosts == 2
    with pytest.raises(WorkshopError, match="placeholder role of local mode"):
        script_mode.submit_trainer(built)
    with pytest.raises(WorkshopError, match="mode must be 'local' or 'sagemaker'"):
        script_mode.sagemaker_settings("docker")
