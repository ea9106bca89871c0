"""Fault tolerance in the scripts of labs 3 and 4: the injected fault (WORKSHOP_FAULT), checkpoints
that never load torn, and training that resumes when torchrun's elastic agent restarts every rank.

Fast tests (no training process): parsing and refusals, atomic writes, partial checkpoints ignored,
the recovery report, and the fault itself in a bare `python -c` (it kills only that process).
Slow test: lab 4's sharded checkpoint, written by 2 ranks, loaded at 1 and 3. A killed rank resumed
from the last checkpoint, with the uninterrupted run's result, is checked on the local cluster: lab
3's in 3_data_parallel/fault_tolerance.ipynb (three checkpoint intervals, the weights bit for bit) and
tests/test_fault_tolerance.py (through the CLI, each host its own checkpoint folder, resumed
mid-epoch), lab 4's in tests/test_fault_tolerance.py (each host its own shards).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from workshop import metrics
from workshop.datasets.corpus import prepare_corpus
from workshop.errors import WorkshopError
from workshop.labs import get_lab

LAB3, LAB4 = get_lab("data_parallel"), get_lab("model_parallel")
BIN = Path(sys.executable).parent
FAULT = "WORKSHOP_FAULT"
# Lab 4's model at a size whose rows split over 1, 2 and 3 ranks (d-model, seq-len and batch all divide).
GPT = {"layers": 2, "d-model": 48, "heads": 4, "seq-len": 24, "batch-size": 12, "eval-sequences": 8}


@pytest.fixture(scope="module")
def lab3():
    return LAB3.load_script()


@pytest.fixture(scope="module")
def lab4():
    return LAB4.load_script()


@pytest.fixture(params=["lab3", "lab4"])
def script(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(autouse=True)
def _first_attempt(monkeypatch):
    """Every test starts as a first attempt with no fault, whatever the caller's environment."""
    monkeypatch.delenv(FAULT, raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


def flags(hps: dict) -> list[str]:
    return [x for k, v in hps.items() for x in (f"--{k}", str(v))]


# ----------------------------------------------------------------------------- WORKSHOP_FAULT: parsing


def test_parse_fault_reads_one_form(script):
    assert script.parse_fault("kill-rank=1@step=30") == (1, 30)
    assert script.parse_fault("kill-rank=0@step=1") == (0, 1)
    for unset in (None, "", "  "):
        assert script.parse_fault(unset) is None


@pytest.mark.parametrize("text", [
    "kill-rank=1", "kill-rank=1@step=0", "kill-rank=-1@step=3", "kill-rank=1@step=3 ", "KILL-RANK=1@step=3",
    "kill-rank=one@step=3", "kill-rank=1@step=3,kill-rank=0@step=4", "kill rank 1 at step 3", "step=3@kill-rank=1",
])
def test_parse_fault_refuses_anything_else_with_the_fix(script, text):
    with pytest.raises(ValueError, match=r"is not one this script can inject.* Fix: pass --fault \(or set WORKSHOP_FAULT\)"):
        script.parse_fault(text)


def lab3_args(lab3, **hps):
    return lab3.build_parser().parse_args(flags(hps))


def test_lab3_check_args_refuses_a_fault_it_cannot_inject(lab3, monkeypatch):
    args = lab3_args(lab3, epochs=1)  # 4,000 samples over 2 ranks: 2,000 each, 31 batches of 64
    lab3.check_args(args, 2, train_samples=4000, fault="kill-rank=1@step=31")  # the last step: fine
    with pytest.raises(ValueError, match=r"names rank 2, but a world of 2 has ranks 0 to 1\. Fix: name a rank from 0 to 1"):
        lab3.check_args(args, 2, train_samples=4000, fault="kill-rank=2@step=5")
    with pytest.raises(ValueError, match=r"names step 32, past the run's last step, 31\. Fix: name a step from 1 to 31"):
        lab3.check_args(args, 2, train_samples=4000, fault="kill-rank=1@step=32")
    # --max-steps caps each epoch; without the data's size it bounds the run.
    short = lab3_args(lab3, epochs=2, **{"max-steps": 4})
    with pytest.raises(ValueError, match="past the run's last step, 8"):
        lab3.check_args(short, 2, fault="kill-rank=0@step=9")
    lab3.check_args(lab3_args(lab3, epochs=2), 2, fault="kill-rank=0@step=100000")  # unknown size: unchecked
    # None checks --fault, whose default is the environment variable (read when the parser is built),
    # as on every rank and in the workshop before anything starts.
    with pytest.raises(ValueError, match=r"the fault 'kill-rank=1@step' \(--fault, or WORKSHOP_FAULT\) is not one.*\. Fix: "):
        lab3.check_args(lab3_args(lab3, epochs=1, fault="kill-rank=1@step"), 2, train_samples=4000)
    monkeypatch.setenv(FAULT, "kill-rank=1@step")
    with pytest.raises(ValueError, match="is not one this script can inject"):
        lab3.check_args(lab3_args(lab3, epochs=1), 2, train_samples=4000)
    with pytest.raises(WorkshopError, match="is not one this script can inject") as info:
        LAB3.validate_hyperparameters({"epochs": 1}, world_size=2, train_samples=4000)
    assert "kill-rank=1@step=30" in info.value.fix
    monkeypatch.delenv(FAULT)
    with pytest.raises(WorkshopError, match="names rank 3, but a world of 2 has ranks 0 to 1"):
        LAB3.validate_hyperparameters({"epochs": 1, "fault": "kill-rank=3@step=2"}, world_size=2, train_samples=4000)


def test_lab4_check_args_refuses_a_fault_it_cannot_inject(lab4):
    args = lab4.build_parser().parse_args(flags({**GPT, "steps": 10}))
    lab4.check_args(args, 2, fault="kill-rank=1@step=10")
    with pytest.raises(ValueError, match=r"names step 11, past the run's last step, 10\. Fix: "):
        lab4.check_args(args, 2, fault="kill-rank=1@step=11")
    with pytest.raises(ValueError, match="names rank 2, but a world of 2"):
        lab4.check_args(args, 2, fault="kill-rank=2@step=3")
    with pytest.raises(ValueError, match="is not one this script can inject"):
        lab4.check_args(args, 2, fault="kill-rank=1@step=0")
    with pytest.raises(WorkshopError, match="names step 11, past the run's last step, 10"):
        LAB4.validate_hyperparameters({**GPT, "steps": 10, "fault": "kill-rank=1@step=11"}, world_size=2)


def test_lab4_check_args_refuses_checkpoints_of_zero1_and_negative_intervals(lab4):
    zero1 = lab4.build_parser().parse_args(flags({**GPT, "sharding": "optimizer", "checkpoint-every": 5}))
    with pytest.raises(ValueError, match="ZeroRedundancyOptimizer's state.*Fix: checkpoint with --sharding full_shard"):
        lab4.check_args(zero1, 2)
    lab4.check_args(zero1, 1)  # one process: plain AdamW, nothing sharded
    negative = lab4.build_parser().parse_args(flags({**GPT, "checkpoint-every": -1}))
    with pytest.raises(ValueError, match="--checkpoint-every must be 0 or more"):
        lab4.check_args(negative, 2)


def test_lab3_checkpoint_every_must_not_be_negative(lab3):
    with pytest.raises(ValueError, match="--checkpoint-every must be 0 or more"):
        lab3.check_args(lab3_args(lab3, **{"checkpoint-every": -5}), 2, train_samples=4000)


# ----------------------------------------------------------------------------- the fault itself


def test_the_fault_kills_only_its_rank_at_its_step_and_only_on_the_first_attempt(tmp_path):
    """In a bare Python process (nothing trains): rank 1 dies by SIGKILL after step 3, no sooner,
    leaving its line and its record; a restarted attempt lets it live."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import train as s\n"
        "text = s.build_parser().parse_args([]).fault  # WORKSHOP_FAULT, the flag's default\n"
        "fault, d, attempt = s.parse_fault(text), sys.argv[2], s.restart_count()\n"
        "s.inject_fault(fault, 0, 3, d, text, attempt); s.inject_fault(fault, 1, 2, d, text, attempt)\n"
        "print('alive', flush=True)\n"
        "s.inject_fault(fault, 1, 3, d, text, attempt); print('survived', flush=True)\n"
    )
    for lab in (LAB3, LAB4):
        folder = tmp_path / lab.key
        env = {**os.environ, FAULT: "kill-rank=1@step=3"}
        before = time.time()
        proc = subprocess.run([sys.executable, "-c", code, str(lab.source_dir), str(folder)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert proc.stdout.splitlines() == ["alive", "FAULT: killing rank 1 at step 3 (WORKSHOP_FAULT=kill-rank=1@step=3)"]
        record = json.loads((folder / "fault.json").read_text())
        assert (record["rank"], record["step"], record["attempt"]) == (1, 3, 0)
        assert before <= record["time"] <= time.time()
        again = subprocess.run([sys.executable, "-c", code, str(lab.source_dir), str(tmp_path / "again")],
                               env={**env, "TORCHELASTIC_RESTART_COUNT": "1"}, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0 and again.stdout.split() == ["alive", "survived"], again.stderr


# ----------------------------------------------------------------------------- atomic writes


def test_write_atomic_fsyncs_the_file_then_renames_then_fsyncs_the_folder(script, tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst):
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "record.bin"
    script.write_atomic(target, lambda f: f.write(b"new"))
    assert events == ["fsync file", "replace", "fsync folder"]
    assert target.read_bytes() == b"new" and not (tmp_path / "record.bin.tmp").exists()
    events.clear()
    script.write_atomic(target, lambda f: f.write(b"often"), durable=False)  # progress records
    assert events == ["replace"] and target.read_bytes() == b"often"


def test_lab3_a_checkpoint_cut_off_mid_write_leaves_the_previous_one(lab3, tmp_path, monkeypatch):
    """A crash (or SIGKILL) inside torch.save: checkpoint.pt is still the previous checkpoint, whole."""
    torch.manual_seed(0)
    model = lab3.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    path = tmp_path / "checkpoint.pt"
    lab3.save_checkpoint(path, model, optimizer, {"epoch": 0, "batch": 5, "step": 5}, 64, rank=0, world_size=1)
    saved = model.fc2.weight.detach().clone()
    real_save = torch.save

    def dies_half_way(obj, f):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise OSError("the host died here")

    monkeypatch.setattr(torch, "save", dies_half_way)
    with torch.no_grad():
        model.fc2.weight.add_(1.0)
    with pytest.raises(OSError, match="the host died"):
        lab3.save_checkpoint(path, model, optimizer, {"epoch": 0, "batch": 10, "step": 10}, 64, rank=0, world_size=1)
    monkeypatch.undo()
    assert (tmp_path / "checkpoint.pt.tmp").stat().st_size > 0  # the torn write, under its temporary name
    state = lab3.load_checkpoint(path)
    assert state["step"] == 5 and state["batch"] == 5
    assert torch.equal(state["model"]["fc2.weight"], saved)
    assert len(state["rng"]) == 1 and state["world_size"] == 1 and state["batch_size"] == 64
    assert lab3.load_checkpoint(tmp_path / "nothing.pt") is None


def tiny_gpt(lab4, seed: int = 0):
    torch.manual_seed(seed)
    model = lab4.GPT(1, 16, 2, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, lab4.VOCAB, (2, 8))
    model(x).float().mean().backward()
    optimizer.step()
    return model, optimizer


def test_lab4_partial_and_incomplete_checkpoints_are_never_loaded(lab4, tmp_path):
    """In this process, one rank (DCP without a process group): a `.partial` folder, a folder
    without its meta.pt, a `latest` naming a folder that is gone, a torn `latest.tmp`: each is
    passed over for the newest complete checkpoint, which loads exactly."""
    model, optimizer = tiny_gpt(lab4)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    meta = {"step": 2}
    path = lab4.save_checkpoint(tmp_path, 2, model, optimizer, meta, rank=0, distributed=False)
    assert path == tmp_path / "step-2" and (tmp_path / "latest").read_text() == "step-2"
    assert {p.name for p in path.iterdir()} >= {".metadata", "meta.pt"}
    # A save of step 4 cut off before its rename: even with every file in, it is not a checkpoint.
    shutil.copytree(path, tmp_path / "step-4.partial")
    # A step-6 folder without meta.pt (not something the script writes, but not loadable either).
    (tmp_path / "step-6").mkdir()
    (tmp_path / "step-6" / ".metadata").write_bytes(b"torn")
    (tmp_path / "latest.tmp").write_text("step-4.par")
    assert lab4.find_checkpoint(tmp_path) == path
    (tmp_path / "latest").write_text("step-9")  # names a checkpoint that is gone: the newest complete one
    assert lab4.find_checkpoint(tmp_path) == path
    (tmp_path / "latest").unlink()
    assert lab4.find_checkpoint(tmp_path) == path
    assert lab4.find_checkpoint(tmp_path / "empty") is None

    fresh, fresh_optimizer = tiny_gpt(lab4, seed=1)
    lab4.load_checkpoint(path, fresh, fresh_optimizer)
    assert all(torch.equal(saved[k], v) for k, v in fresh.state_dict().items())
    assert fresh_optimizer.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]


def test_lab4_keeps_the_two_newest_checkpoints_and_clears_crashed_saves(lab4, tmp_path):
    model, optimizer = tiny_gpt(lab4)
    (tmp_path / "step-3.partial").mkdir(parents=True)  # a crashed attempt's leftover
    for step in (2, 4, 6):
        lab4.save_checkpoint(tmp_path, step, model, optimizer, {"step": step}, rank=0, distributed=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-4", "step-6"]
    assert lab4.find_checkpoint(tmp_path) == tmp_path / "step-6"


def test_lab4_a_rank_reads_the_files_its_load_plan_names_and_a_host_lacking_one_gets_it_from_a_host_that_has_it(
        lab4, tmp_path):
    """Each host's checkpoint folder is its own: after a restart inside the job, a host holds its own ranks'
    shards and the index, and a rank whose load reads another host's file gets it from that host. The
    decision (`plan_load`) is the same on every rank, from every rank's report."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    checkpointing = SimpleNamespace(**lab4.resume.__globals__)  # checkpointing.py, the module beside train.py
    model, optimizer = tiny_gpt(lab4)
    path = lab4.save_checkpoint(tmp_path, 2, model, optimizer, {"step": 2}, rank=0, distributed=False)

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    assert checkpointing.files_to_read(path, state, 0) == {".metadata", "meta.pt", "__0_0.distcp"}
    assert checkpointing.files_to_read(path, state, 1) == {".metadata", "__0_0.distcp"}
    assert checkpointing.files_to_read(tmp_path / "step-9", state, 1) == ("incomplete", "it is not on its host (a save cut short there)")
    assert set(checkpointing.host_files(path)) == {".metadata", "meta.pt", "__0_0.distcp"}
    assert set(checkpointing.host_files(path).values()) == {None}

    index = {".metadata": None, "meta.pt": None}
    # (host, what it holds (its first rank only), what the rank reads): 2 hosts x 2 ranks
    reports = [(0, {**index, "__0_0.distcp": None, "__1_0.distcp": None}, {".metadata", "meta.pt", "__0_0.distcp"}),
               (0, None, {".metadata", "__1_0.distcp", "__3_0.distcp"}),
               (1, {**index, "__2_0.distcp": None, "__3_0.distcp": None}, {".metadata", "__2_0.distcp"}),
               (1, None, {".metadata", "__3_0.distcp", "__0_0.distcp"})]
    assert checkpointing.plan_load(path, reports) == (None, [("__0_0.distcp", 0, 2), ("__3_0.distcp", 2, 0)])
    damaged = "__3_0.distcp does not match its SHA-256 in checksums.json (its bytes changed after it was written)"
    reports[2][1]["__3_0.distcp"] = damaged
    assert checkpointing.plan_load(path, reports) == (("damaged", damaged), [])
    del reports[2][1]["__3_0.distcp"]
    assert checkpointing.plan_load(path, reports) == (("incomplete", "__3_0.distcp is missing: no host holds it"), [])
    reports[3] = (1, None, ("incomplete", "it is not on algo-2 (a save cut short there)"))
    assert checkpointing.plan_load(path, reports) == (("incomplete", "it is not on algo-2 (a save cut short there)"), [])


# ----------------------------------------------------------------------------- the recovery report


def test_recovery_is_measured_from_the_failed_attempts_records(script, tmp_path, capsys):
    struck = time.time() - 2.0
    (tmp_path / "fault.json").write_text(json.dumps({"rank": 1, "step": 18, "time": struck, "attempt": 0}))
    script.write_progress(tmp_path, 16, 0)  # rank 0's last log interval before the fault
    recovery = script.read_recovery(tmp_path, 15, 1)
    assert recovery == {"last_step": 18, "lost_steps": 3, "exact": True, "fault_time": struck, "attempt": 1}
    script.announce_resume(tmp_path / "checkpoint.pt", 15, recovery)
    script.report_recovery(recovery, 15, 16)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"resumed from {tmp_path / 'checkpoint.pt'} at step 15 (restart 1)"
    assert "the failed attempt had finished step 18 (its fault record)" in lines[1]
    record = metrics.parse_lines(lines)[0]
    assert {k: record[k] for k in ("rank", "step", "restart", "resumed_step", "lost_steps")} == {
        "rank": 0, "step": 16, "restart": 1, "resumed_step": 15, "lost_steps": 3}
    assert 2.0 <= record["recover_s"] < 60
    # Read once, the fault record is consumed: a new job (attempt 0) over the same folder has only the
    # progress record, which bounds the loss from below.
    assert not (tmp_path / "fault.json").exists()
    recovery = script.read_recovery(tmp_path, 15, 0)
    assert recovery == {"last_step": 16, "lost_steps": 1, "exact": False, "fault_time": None, "attempt": 0}
    script.report_recovery(recovery, 15, 16)
    record = metrics.parse_lines(capsys.readouterr().out.splitlines())[0]
    assert record["lost_steps_at_least"] == 1 and "lost_steps" not in record and "recover_s" not in record
    # A second restart: records of attempt 0 say nothing about attempt 1.
    fault = {"rank": 1, "step": 18, "time": struck, "attempt": 0}
    (tmp_path / "fault.json").write_text(json.dumps(fault))
    assert script.read_recovery(tmp_path, 15, 2) == {"last_step": None, "lost_steps": None, "exact": False,
                                                    "fault_time": None, "attempt": 2}


def test_a_new_job_resuming_a_dead_jobs_checkpoint_knows_what_that_job_lost(script, tmp_path, capsys):
    """A job died (no restart budget) after step 18, its last checkpoint at 15; a new job (attempt 0,
    perhaps on fewer hosts) resumes from it: the dead job's fault record is exact about what was lost.
    A fault older than the checkpoint resumed (the job recovered from it and checkpointed since) is not."""
    struck = time.time() - 30.0
    (tmp_path / "fault.json").write_text(json.dumps({"rank": 1, "step": 18, "time": struck, "attempt": 0}))
    recovery = script.read_recovery(tmp_path, 15, 0)
    assert recovery == {"last_step": 18, "lost_steps": 3, "exact": True, "fault_time": struck, "attempt": 0}
    script.announce_resume(tmp_path / "step-15", 15, recovery)
    assert "3 step(s) to do again: the failed run had finished step 18 (its fault record)" in capsys.readouterr().out
    (tmp_path / "fault.json").write_text(json.dumps({"rank": 1, "step": 18, "time": struck, "attempt": 0}))
    assert script.read_recovery(tmp_path, 24, 0)["exact"] is False


def test_a_fault_on_another_host_reaches_rank_0_through_the_agents_store(script, tmp_path, monkeypatch):
    """Hosts have checkpoint folders of their own (SageMaker's do): the dying rank's fault.json is not in
    rank 0's folder, so the record also goes to torchrun's agent store, and rank 0 reads it from there."""
    import torch.distributed as dist

    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # stands in for the agent's
    for key, value in {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(agent.port)}.items():
        monkeypatch.setenv(key, value)
    dying, survivor = tmp_path / "algo-2", tmp_path / "algo-1"
    killed = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(sig))  # os.kill, wherever inject_fault lives
    script.inject_fault((1, 18), 1, 18, dying, "kill-rank=1@step=18", 0)
    assert killed == [signal.SIGKILL] and (dying / "fault.json").is_file() and not survivor.exists()
    script.write_progress(survivor, 16, 0)
    recovery = script.read_recovery(survivor, 15, 1)
    assert (recovery["last_step"], recovery["lost_steps"], recovery["exact"]) == (18, 3, True)
    assert recovery["fault_time"] == json.loads(agent.get("workshop/fault"))["time"]
    # Without the agent's store the folder is all there is: a lower bound from the progress record.
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    assert script.read_recovery(survivor, 15, 1)["lost_steps"] == 1


def test_each_attempt_meets_under_keys_of_its_own_in_torchruns_store(script, monkeypatch):
    """torchrun's agent keeps one store for every attempt: the keys a failed attempt left there must not
    be read by the next (its ranks would connect to dead ones). No store of the agent's: torchrun's own."""
    from datetime import timedelta

    import torch.distributed as dist

    assert script.elastic_store(timedelta(seconds=5)) == ({}, 0)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert script.elastic_store(timedelta(seconds=5)) == ({}, 3)
    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # stands in for the agent's
    for key, value in {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(agent.port), "RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # a healthy host's count, unchanged by a restart
    assert script.elastic_store(timedelta(seconds=5)) == ({}, 0)  # the first start of rank 1: torchrun's keys
    args, attempt = script.elastic_store(timedelta(seconds=5))
    assert attempt == 1 and (args["rank"], args["world_size"]) == (1, 2)
    args["store"].set("rank_1", "new address")
    assert agent.get("workshop/attempt-1/rank_1") == b"new address"
    assert script.agreed_attempt(1, torch.device("cpu"), distributed=False) == 1


# ----------------------------------------------------------------------------- a sharded checkpoint at another world size (slow)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in (FAULT, "GLOO_SOCKET_IFNAME") and not k.startswith("TORCHELASTIC_")}
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def records(proc: subprocess.CompletedProcess) -> list[dict]:
    return metrics.parse_lines(proc.stdout.splitlines())


def the(recs: list[dict], key: str):
    found = [r for r in recs if key in r and r.get("rank") == 0]
    assert len(found) == 1, (key, found)
    return found[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return prepare_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.slow
def test_lab4_a_sharded_checkpoint_resumes_at_any_world_size(tmp_path, corpus):
    """FSDP2 over 2 ranks, 14 steps, a DCP checkpoint every 6 (and after the last). Its step-12
    checkpoint (written by 2 ranks) resumes at 1 rank and at 3: DCP reshards it, and the last 2 steps
    give the same loss as the 2-rank run (to float rounding: the sums are split differently). (A killed
    rank resumed from the sharded checkpoint with the uninterrupted run's loss, each host its own
    checkpoint folder: tests/test_fault_tolerance.py::test_lab4_on_two_hosts_heals_in_place_from_shards_no_host_shares;
    2 ranks to 1 on the local cluster: 3_data_parallel/fault_tolerance.ipynb.)"""
    def train(name: str, procs: int) -> subprocess.CompletedProcess:
        hps = {**GPT, "steps": 14, "log-interval": 2, "checkpoint-every": 6, "threads": 1,
               "train": corpus.train_dir, "test": corpus.test_dir, "model-dir": tmp_path / name / "model",
               "checkpoint-dir": tmp_path / name / "ckpt"}
        launcher = ([sys.executable] if procs == 1 else
                    [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(procs)])
        proc = run([*launcher, str(LAB4.entry_path), *flags(hps)], tmp_path / name)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc

    plain = train("plain", 2)
    assert sorted(p.name for p in (tmp_path / "plain" / "ckpt").glob("step-*")) == ["step-12", "step-14"]
    reference = the(records(plain), "final_train_loss")
    for procs in (1, 3):
        ckpt = tmp_path / f"world{procs}" / "ckpt"
        shutil.copytree(tmp_path / "plain" / "ckpt", ckpt)
        shutil.rmtree(ckpt / "step-14")  # `latest` names a checkpoint that is gone: the newest complete one loads
        proc = train(f"world{procs}", procs)
        assert f"resumed from {ckpt / 'step-12'} at step 12 (restart 0)" in proc.stdout
        assert f"written by 2 rank(s); torch.distributed.checkpoint resharded it over {procs}" in proc.stdout
        final = the(records(proc), "final_train_loss")
        assert final["final_train_loss"] == pytest.approx(reference["final_train_loss"], rel=1e-4)
        assert final["test_loss"] == pytest.approx(reference["test_loss"], rel=1e-4)
        print(f"\nlab 4 at {procs} rank(s) from the 2-rank checkpoint: final train loss {final['final_train_loss']} "
              f"vs {reference['final_train_loss']}")
