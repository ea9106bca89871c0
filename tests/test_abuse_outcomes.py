"""Honest outcomes where a hostile but realistic user pushes: a trial whose training diverged to a
finite loss, a checkout whose path has a space and a non-ASCII letter, a process of the job killed by
the kernel's out-of-memory killer (whichever process it was), and a damaged checkpoint passed over.

Each says what happened in the words a user needs: diverged (not ok), a run that works (or a refusal
with its fix), a memory kill (with its host, the limit and the fix), and the checkpoint passed over
(on the terminal, not only in the log; its fix naming the user's folder, not the simulated host's).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workshop import REPO_ROOT
from workshop.__main__ import main
from workshop.labs import get_lab

PY = sys.executable
LAB3 = get_lab("data_parallel")


# ----------------------------------------------------------------------------- a finite divergence


@pytest.mark.parametrize("key", ["horovod_pytorch", "data_parallel", "model_parallel"])
def test_a_loss_far_above_an_untrained_models_stops_the_run_as_diverged(key, capsys):
    """lr=100 on lab 3: a loss of 6.4e+20 at step 5, then 300-490, never NaN. An untrained classifier's loss is
    the cross-entropy of a uniform guess, ln(classes): 2.3 for ten digits. A loss a hundred times that is a
    model whose weights blew up, whatever it does next; the run stops before it checkpoints them."""
    script = get_lab(key).load_script()
    guard = script.Divergence(torch.device("cpu"), 0, 1, lambda t: t, "a lower --lr", classes=10)
    for step, loss in ((1, 2.3), (2, 30.0), (3, 229.0)):  # a spike, even a large one, is not divergence
        guard.note(torch.tensor(loss), step)
    guard.check(3)
    guard.note(torch.tensor(6.4e20), 4)
    guard.note(torch.tensor(math.nan), 5)
    with pytest.raises(SystemExit) as info:
        guard.check(5)
    assert info.value.code == 1
    assert capsys.readouterr().out == (
        "Training diverged: the loss was 6.4e+20 at global step 4 on rank 0, 2.78e+20 times an untrained model's "
        "(2.3, a uniform guess over 10 classes). The run stops here, before it checkpoints the broken weights: "
        "the checkpoints already written stay as they were. Fix: a lower --lr.\n")


def test_lab1_stops_on_a_finite_divergence_as_the_pytorch_labs_do(tmp_path, capsys):
    """Lab 1's coordinator sees each step's loss: 6.4e+20 is weights that blew up, whatever comes next."""
    from types import SimpleNamespace

    script = get_lab("parameter_server").load_script()
    fake_tf = SimpleNamespace(io=SimpleNamespace(gfile=SimpleNamespace(glob=lambda pattern: [])))
    args = SimpleNamespace(checkpoint_dir=str(tmp_path), lr=100.0)
    script.stop_if_diverged(fake_tf, args, [(2.3, 1), (229.0, 2)], 2.0, 10, 2)  # a spike is not divergence
    with pytest.raises(SystemExit) as info:
        script.stop_if_diverged(fake_tf, args, [(2.1, 1), (6.4e20, 2), (310.0, 1)], 300.0, 20, 3)
    assert info.value.code == 1
    out = capsys.readouterr().out
    assert out.startswith("Training diverged: the loss was 6.4e+20 at step 19 (counted in the order the steps were "
                          "scheduled), on worker 2, 2.78e+20 times an untrained model's (2.3).")
    with pytest.raises(SystemExit):  # the test loss alone, finite but at a blown-up model's
        script.stop_if_diverged(fake_tf, args, [(2.1, 1)], 372.4, 30, 1)
    assert "the test loss was 372.4 after step 30, 162 times an untrained model's" in capsys.readouterr().out


def test_a_sagemaker_trial_that_failed_on_a_divergence_is_diverged_not_failed(monkeypatch, capsys):
    """The service reports a trial whose script stopped on `Training diverged:` as Failed, with that line in
    its FailureReason: the table shows it apart from a trial that failed for another reason."""
    from workshop import tuning
    from workshop.jobs.tuning import TrialSummary, TuningOutcome

    lab = get_lab("data_parallel")
    trials = [TrialSummary("dp-tune-001-abc", {"lr": "0.02"}, "Completed", 0.95, 30.0),
              TrialSummary("dp-tune-002-abd", {"lr": "100"}, "Failed", None, 20.0,
                           "AlgorithmError: Training diverged: the loss was 6.4e+20 at global step 5 on rank 0"),
              TrialSummary("dp-tune-003-abe", {"lr": "0.2"}, "Failed", None, 5.0, "AlgorithmError: out of memory")]
    monkeypatch.setattr(tuning, "run_on_sagemaker", lambda *a, **k: TuningOutcome("dp-tune", "Completed", trials, None))
    space = tuning.SearchSpace.parse(lab, ["lr=0.02,100,0.2"], trials=None, seed=0, fixed={})
    result = tuning._tune_on_sagemaker(lab, space, tuning.Objective.parse(lab, None), 3, {}, 1, 1, None, False, {})
    assert [t.status for t in result.trials] == ["ok", "diverged", "failed"]
    assert "1 ok, 2 not (1 diverged)" in capsys.readouterr().out


def test_lab2_tensorflow_calls_a_finite_loss_far_above_an_untrained_models_diverged():
    script = get_lab("horovod_tensorflow").load_script()
    assert [script.diverged(x) for x in (2.3, 229.0, 231.0, 6.4e20, math.inf, math.nan)] == [
        False, False, True, True, True, True]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_trial_that_diverged_to_a_finite_loss_is_reported_diverged_not_ok(tmp_path, mnist_dir, capsys):
    """`python -m workshop tune data_parallel --param lr=0.02,100`: before, the lr=100 trial ended at chance
    (test_loss 372) and was reported "ok", "2 ok, 0 not"."""
    code = main(["tune", "data_parallel", "--param", "lr=0.02,100", "--hosts", "1", "--parallel", "1", "--no-plot",
                 "--hp", "epochs=1", "--hp", "max-steps=4", "--hp", "log-interval=2", "--data-dir", str(mnist_dir),
                 "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1, out[-3000:]
    [search] = (tmp_path / "runs").glob("tune-*")
    fine, diverged = json.loads((search / "tune.json").read_text())["trials"]
    assert fine["status"] == "ok", fine
    assert diverged["status"] == "diverged", diverged
    assert "Training diverged: the loss was" in diverged["failure"] and "times an untrained model's" in diverged["failure"]
    assert "trial 2/2 DIVERGED" in out and "1 ok, 1 not (1 diverged)" in out, out[-3000:]
    row = next(line for line in out.splitlines() if line.startswith("2 ") and "100" in line)
    assert "diverged: " in row, row


# ----------------------------------------------------------------------------- a checkout path with a space


def _checkout_at(home: Path) -> Path:
    """The checkout as a user's clone at `home` has it, as far as a run reads it: the package, lab 3's
    spec and code, and the environment (a link to this one's: `make setup` there would build the same)."""
    home.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO_ROOT / "workshop", home / "workshop", ignore=ignore)
    lab = home / "3_data_parallel"
    lab.mkdir()
    shutil.copy2(REPO_ROOT / "3_data_parallel" / "lab.py", lab / "lab.py")
    shutil.copytree(REPO_ROOT / "3_data_parallel" / "code", lab / "code", ignore=ignore)
    (home / ".venv").symlink_to(Path(sys.prefix))
    return home / ".venv" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_checkout_whose_path_has_a_space_and_a_non_ascii_letter_runs_a_lab(tmp_path, mnist_dir):
    """`git clone ... "~/My Projects/my wörkshop"`, then `python -m workshop run data_parallel` there: the
    interpreter's path has a space, which SageMaker's `sm_train.sh` runs unquoted (`$SM_PYTHON_CMD`)."""
    home = tmp_path / "My Projects" / "my wörkshop"
    python = _checkout_at(home)
    out = subprocess.run(
        [str(python), "-m", "workshop", "run", "data_parallel", "--hosts", "2", "--hp", "epochs=1",
         "--hp", "max-steps=2", "--hp", "log-interval=1", "--data-dir", str(mnist_dir), "--verbose"],
        cwd=home, capture_output=True, text=True, timeout=900,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-6000:]
    runs = [p for p in (home / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1 and runs[0].name.startswith("data-parallel-"), runs  # the clone's own runs/ folder
    assert "METRICS rank=0" in said and "test_accuracy=" in said
    assert (runs[0] / "algo-1" / "model").is_dir() and any((runs[0] / "algo-1" / "model").iterdir())


# ----------------------------------------------------------------------------- a memory kill, whichever process


def _report(tmp_path: Path, lines: dict[str, list[str]], code: int, count: int | None = 1,
            first_process: str = "") -> str:
    """The failure report of a 2-host run whose hosts' own lines were `lines` (host -> its lines, in order) and
    whose algo-1 failed first with `code`, `count` processes having been killed by the kernel for memory."""
    from workshop.runtime.contract import HostSandbox
    from workshop.runtime.failures import describe_failure
    from workshop.runtime.machine import MemoryKills
    from workshop.runtime.results import HostResult
    from workshop.runtime.stalls import StallWatch
    from workshop.runtime.streams import Transcript

    hosts = [HostResult(f"algo-{h + 1}", h, HostSandbox(tmp_path / f"algo-{h + 1}"), tmp_path / f"algo-{h + 1}.log")
             for h in range(2)]
    transcript = Transcript()
    for host, said in lines.items():
        for line in said:
            transcript.add(host, "", f"[{host}] {line}")
    transcript.stop_line = len(transcript.lines)
    watch = StallWatch(None, transcript, hosts, [], lambda lines, quiet: None)
    memory = MemoryKills(count, 1536 << 20, "this run's memory cgroup")
    return describe_failure(transcript, hosts, 1, 0, code, {"algo-1": code}, watch, memory, first_process)


SM_TRAIN = ["Running Torchrun Driver", "++ /home/me/.venv/bin/python3 /opt/ml/input/data/sm_drivers/"
            "distributed_drivers/torchrun_driver.py", "Executing command: torchrun --nnodes=2 --nproc_per_node=1 "
            "--master_addr=algo-1 --master_port=7777 --node_rank=0 train.py"]
MEMORY_CAUSE = ("(The kernel's out-of-memory killer ended 1 process(es) of this run: the memory limit of this run's "
                "memory cgroup is 1.5 GiB.) Fix: use fewer hosts or processes per host, a smaller model or batch, or "
                "a machine (or notebook instance) with more memory.")


@pytest.mark.parametrize(("said", "code", "first"), [
    # torchrun's agent: the SDK's driver reports its command's end, and exits with it (-9: 247)
    ([*SM_TRAIN, "Command failed with exit code -9. Traceback: Traceback (most recent call last):",
      "subprocess.CalledProcessError: Command '['torchrun', ...]' died with <Signals.SIGKILL: 9>.",
      "++ handle_error", "An error occurred with exit code 247"], 247,
     "Torchrun's agent on algo-1 was killed by the kernel's out-of-memory killer (SIGKILL, signal 9)."),
    # the driver: sm_train.sh's status for it is bash's, 128 + 9
    ([*SM_TRAIN, "+++ handle_error", "+++ EXIT_STATUS=137", "An error occurred with exit code 137"], 137,
     "The driver (torchrun_driver.py) on algo-1 was killed by the kernel's out-of-memory killer (SIGKILL, signal 9)."),
    # the basic script driver's only command is the script
    (["Running Basic Script Driver", "Executing command: /home/me/.venv/bin/python3 train.py --epochs 1",
      "Command failed with exit code -9. Traceback: ...", "An error occurred with exit code 247"], 247,
     "The training script (train.py) on algo-1 was killed by the kernel's out-of-memory killer (SIGKILL, signal 9)."),
    # a parameter server (lab 1): its driver reports it
    (["[ps_driver] ERROR: the parameter server exited with status -9; stopping the host"], 1,
     "The parameter server on algo-1 was killed by the kernel's out-of-memory killer (SIGKILL, signal 9)."),
])
def test_a_process_killed_for_memory_is_named_from_its_starters_record(tmp_path, said, code, first):
    report = _report(tmp_path, {"algo-1": said}, code).splitlines()
    assert report[0] == first, report
    assert report[1] == MEMORY_CAUSE, report
    assert f"Host algo-1 failed ({'exit status ' + str(code)})" in report[2], report


def test_a_sigkill_the_kernel_did_not_send_for_memory_is_not_called_one(tmp_path):
    said = [*SM_TRAIN, "Command failed with exit code -9. Traceback: ...", "An error occurred with exit code 247"]
    report = _report(tmp_path, {"algo-1": said}, 247, count=0).splitlines()
    assert report[:2] == ["Torchrun's agent on algo-1 was killed by SIGKILL (signal 9).",
                          "(SIGKILL from outside the job: not the kernel's out-of-memory killer, which ended no "
                          "process of this run.)"], report
    report = _report(tmp_path, {"algo-1": said}, 247, count=None).splitlines()
    assert report[1] == "(SIGKILL from outside the job often means the machine ran out of memory.)", report


def test_the_process_runtimes_driver_killed_for_memory_is_named(tmp_path):
    """The process runtime runs no sm_train.sh: a host's first process is the driver, whose status is -9."""
    report = _report(tmp_path, {"algo-1": ["Executing command: torchrun --nnodes=2 train.py"]}, -9,
                     first_process="the driver (torchrun_driver.py)").splitlines()
    assert report[:2] == ["The driver (torchrun_driver.py) on algo-1 was killed by the kernel's out-of-memory killer "
                          "(SIGKILL, signal 9).", "Host algo-1 failed (killed by SIGKILL); the other hosts were stopped."]
    assert report[-1] == MEMORY_CAUSE, report

# Rank 0 makes one process of its host the kernel's choice (oom_score_adj 1000: a process may raise its own
# and its parent's), then fills the memory cgroup the job runs in until the kernel's OOM killer ends that
# process; once it is gone, the rank stops taking memory and waits to be stopped.
OOM_PROBE = """\
import os, sys, time

def parent(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])

def gone(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True

rank = int(os.environ.get("RANK", "0"))
if rank == 0:
    me = os.getpid()
    agent = parent(me)  # torchrun's agent, which started this rank
    victim = {"rank": me, "agent": agent, "driver": parent(agent)}[os.environ["OOM_VICTIM"]]
    with open(f"/proc/{victim}/oom_score_adj", "w") as f:
        f.write("1000")
    print(f"probe: filling the memory until the kernel takes process {victim}", flush=True)
    held = []
    while not gone(victim):
        held.append(b"x" * (16 << 20))
    print(f"probe: process {victim} is gone", flush=True)
time.sleep(600)
"""


def _memory_cgroup(name: str, limit: int) -> Path | None:
    """A memory cgroup of `limit` bytes, no swap (v2, else v1), or None where none can be made (not root)."""
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").is_file() and "memory" in (v2 / "cgroup.controllers").read_text().split():
        group, files = v2 / name, {"memory.max": limit, "memory.swap.max": 0}
    else:
        group, files = Path("/sys/fs/cgroup/memory") / name, {"memory.limit_in_bytes": limit}
    try:
        group.mkdir()
    except OSError:
        return None
    for file, value in files.items():
        try:
            (group / file).write_text(str(value))
        except OSError:
            if file == "memory.swap.max":
                continue
            group.rmdir()
            return None
    if (group / "memory.memsw.limit_in_bytes").exists():  # v1 with swap accounting: no swap either
        (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
    return group


@pytest.fixture
def memory_cgroup(request):
    import uuid

    group = _memory_cgroup(f"workshop-test-oom-{uuid.uuid4().hex[:8]}", 1536 << 20)
    if group is None:
        pytest.skip("needs a memory cgroup of its own (root, with cgroup v1 or v2's memory controller)")
    yield group
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # empty once the job's last process is reaped
        try:
            group.rmdir()
            break
        except OSError:
            time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("victim", "named"), [
    ("rank", "Rank 0 on algo-1 was killed by the kernel's out-of-memory killer"),
    ("agent", "Torchrun's agent on algo-1 was killed by the kernel's out-of-memory killer"),
    ("driver", "The driver (torchrun_driver.py) on algo-1 was killed by the kernel's out-of-memory killer"),
])
def test_a_memory_kill_is_named_whichever_process_the_kernel_took(tmp_path, memory_cgroup, victim, named):
    """`model_parallel --hosts 2` in a memory cgroup: the kernel took a rank (named with the hint), torchrun's
    agent ("Host algo-1 failed (exit status 247)") or the driver ("exit status 137"), no word of memory."""
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "train.py").write_text(OOM_PROBE)
    run = ("import sys\n"
           "from sagemaker.train.distributed import Torchrun\n"
           "from workshop.runtime.local_cluster import LocalCluster\n"
           "cluster = LocalCluster(sys.argv[1], 'train.py', hosts=2, distributed=Torchrun(process_count_per_node=1),\n"
           "                       workdir=sys.argv[2], echo=False, extra_env={'OOM_VICTIM': sys.argv[3]})\n"
           "print(cluster.run(check=False).failure)\n")
    joined = f"echo $$ > {memory_cgroup / 'cgroup.procs'} && exec \"$@\""
    out = subprocess.run(["sh", "-c", joined, "sh", PY, "-c", run, str(code_dir), str(tmp_path / "run"), victim],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=800)
    failure = out.stdout
    assert out.returncode == 0, out.stderr[-3000:]
    assert failure.startswith(named), failure
    assert "the memory limit of this run's memory cgroup is 1.5 GiB" in failure, failure
    assert ("Fix: use fewer hosts or processes per host, a smaller model or batch, or a machine (or notebook "
            "instance) with more memory." in failure), failure


# ----------------------------------------------------------------------------- a damaged checkpoint passed over

# Lab 4's model, small: its rows split over 2 ranks.
GPT = {"layers": 2, "d-model": 48, "heads": 4, "seq-len": 24, "batch-size": 12, "eval-sequences": 8, "threads": 1}


def _hps(hps: dict) -> list[str]:
    return [arg for key, value in hps.items() for arg in ("--hp", f"{key}={value}")]


def _random_bytes(path: Path, offset: int, n: int = 4096) -> None:
    """n random bytes over the file's own, at `offset`: a damaged disk or a bad copy."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(os.urandom(n))


def test_the_hosts_checkpoint_folders_are_named_as_their_user_knows_them(tmp_path):
    """/opt/ml/checkpoints exists only inside a simulated host: a report names the run's checkpoint_dir (each host's
    folder syncs with it), else that host's folder in the run folder; the process runtime's paths likewise."""
    from workshop.runtime.contract import HostSandbox
    from workshop.runtime.hosts import user_paths
    from workshop.runtime.results import HostResult

    store = tmp_path / "my checkpoints"
    hosts = [HostResult(f"algo-{h + 1}", h, HostSandbox(tmp_path / "run" / f"algo-{h + 1}"), tmp_path / "x.log")
             for h in range(2)]
    text = ("Rank 1 on algo-2 exited with status 1: The checkpoint /opt/ml/checkpoints/checkpoint.pt is damaged. "
            "Fix: move it out of /opt/ml/checkpoints\n[algo-2/1] ValueError: /opt/ml/checkpoints/checkpoint.pt")
    assert user_paths(text, hosts, hosts[1]) == text.replace("/opt/ml/checkpoints", str(hosts[1].checkpoint_dir))
    for host in hosts:
        host.checkpoint_store = store
    assert user_paths(text, hosts, hosts[1]) == text.replace("/opt/ml/checkpoints", str(store))
    process = f"Fix: move it out of {hosts[0].checkpoint_dir}"
    assert user_paths(process, hosts) == f"Fix: move it out of {store}"


def test_python_on_a_path_with_a_space_is_reached_by_one_without(tmp_path, monkeypatch):
    """sm_train.sh runs `$SM_PYTHON_CMD` unquoted: the hosts find Python through a link whose path has no space,
    gone after the run; a temporary folder with a space itself is refused, with the fix."""
    import tempfile

    from workshop.errors import WorkshopError
    from workshop.runtime.hosts import plain_python_dir

    env = tmp_path / "My Projects" / "my wörkshop" / ".venv"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python3").write_text("")
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    with plain_python_dir(env / "bin") as found:
        assert " " not in str(found) and found.name == "bin"
        assert (found / "python3").is_file() and (found.parent / "pyvenv.cfg").is_file()  # the venv, found as one
        made = found.parent.parent
    assert not made.exists()
    with plain_python_dir(Path(sys.executable).parent) as found:
        assert found == Path(sys.executable).parent  # no space: used as it is
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "my temp"))
    with pytest.raises(WorkshopError, match="whose path has a space") as info, plain_python_dir(env / "bin"):
        pass
    assert "TMPDIR" in info.value.fix


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_damaged_checkpoint_passed_over_is_said_on_the_terminal_naming_the_users_folder(tmp_path, capsys):
    """Lab 4 with --checkpoint-dir, 4 KiB overwritten in a shard of its newest checkpoint, run again: before, only
    logs/cluster.log said the shard did not match its SHA-256; the terminal said `resumed ... at step 3`."""
    from workshop.datasets.corpus import prepare_corpus

    prepare_corpus(tmp_path / "corpus")
    store = tmp_path / "my checkpoints"
    common = ["run", "model_parallel", "--hosts", "2", "--data-dir", str(tmp_path / "corpus"), "--workdir",
              str(tmp_path), "--checkpoint-dir", str(store), *_hps({**GPT, "log-interval": 1, "checkpoint-every": 3})]
    assert main([*common, "--hp", "steps=6"]) == 0, capsys.readouterr()
    shard = sorted((store / "step-6").glob("*.distcp"))[1]  # rank 1's
    _random_bytes(shard, shard.stat().st_size // 2)
    capsys.readouterr()
    assert main([*common, "--hp", "steps=8"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "NOTE: " in line]
    assert said == [f"[algo-1/0] NOTE: The checkpoint {store / 'step-6'} is damaged: {shard.name} does not match its "
                    f"SHA-256 in checksums.json (its bytes changed after it was written). Training resumes from the older "
                    f"checkpoint {store / 'step-3'} instead, the newest intact one."], out[-3000:]
    assert "/opt/ml" not in "\n".join(said)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_damaged_checkpoints_fix_names_the_users_folder_not_the_hosts(tmp_path, mnist_dir, capsys):
    """Lab 3 keeps one checkpoint: a damaged one stops the run, and its fix said `move it out of
    /opt/ml/checkpoints`, a folder that exists only inside the simulated host."""
    store = tmp_path / "my checkpoints"
    common = ["run", "data_parallel", "--hosts", "1", "--data-dir", str(mnist_dir), "--workdir", str(tmp_path),
              "--checkpoint-dir", str(store), *_hps({"max-steps": 3, "log-interval": 1, "threads": 1})]
    assert main([*common, "--hp", "epochs=1"]) == 0, capsys.readouterr()
    _random_bytes(store / "checkpoint.pt", (store / "checkpoint.pt").stat().st_size // 3)
    capsys.readouterr()
    assert main([*common, "--hp", "epochs=2"]) != 0
    said = capsys.readouterr()
    error = next(line for line in said.err.splitlines() if line.startswith("error: "))
    assert error.startswith(f"error: Rank 0 on algo-1 exited with status 1: The checkpoint "
                            f"{store / 'checkpoint.pt'} is damaged: "), said.err[-3000:]
    assert f"Fix: move it out of {store} (or delete it) to train from the start" in error, error
    assert "/opt/ml/checkpoints" not in said.err, said.err[-3000:]
