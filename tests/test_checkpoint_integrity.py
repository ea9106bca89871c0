"""Checkpoints a user can trust, and runs that stop rather than train on NaN.

- A damaged checkpoint (random bytes inside it, or cut short) is reported by name before training resumes;
  lab 4 resumes from an older intact one instead, and says so. Lab 3 verifies the SHA-256 saved inside its
  `checkpoint.pt` (torch.load checks none); lab 4 verifies each file of a `step-<N>/` against its
  `checksums.json`.
- The rotation (lab 4 keeps two) never deletes the last intact checkpoint for a damaged one.
- A NaN or infinite loss stops every rank with the step, the rank and the fix, before a checkpoint of it.
- What a killed save left (`*.tmp`, `step-<N>.partial/`) is removed when the next run starts.
- Non-finite hyperparameters (`--hp lr=nan`) are refused before anything starts; a trial that ends on a NaN
  objective ranks as failed; resuming a finished run says there was nothing to do.

Fast tests work on the scripts' own functions in this process; slow ones run the scripts (a few steps).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workshop import metrics
from workshop.__main__ import main, recovery_line
from workshop.datasets.corpus import prepare_corpus
from workshop.errors import WorkshopError
from workshop.labs import LABS, get_lab

LAB3, LAB4 = get_lab("data_parallel"), get_lab("model_parallel")
BIN = Path(sys.executable).parent
# Lab 4's model, small: its rows split over 1 and 2 ranks.
GPT = {"layers": 2, "d-model": 48, "heads": 4, "seq-len": 24, "batch-size": 12, "eval-sequences": 8}


@pytest.fixture(scope="module")
def lab3():
    return LAB3.load_script()


@pytest.fixture(scope="module")
def lab4():
    return LAB4.load_script()


@pytest.fixture(autouse=True)
def _no_fault(monkeypatch):
    monkeypatch.delenv("WORKSHOP_FAULT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


def flags(hps: dict) -> list[str]:
    return [x for k, v in hps.items() for x in (f"--{k}", str(v))]


def random_bytes(path: Path, offset: int, n: int = 4096) -> None:
    """n random bytes over the file's own, at `offset`: a damaged disk or a bad copy."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(os.urandom(n))


def cut_short(path: Path, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


# ----------------------------------------------------------------------------- refused before anything starts


@pytest.mark.parametrize("value", ["nan", "inf", "1e999"])
@pytest.mark.parametrize("lab", LABS.values(), ids=lambda lab: lab.key)
def test_a_non_finite_learning_rate_is_refused_by_every_lab(lab, value):
    """float() reads 'nan', 'inf' and '1e999' (inf), and NaN passes the "must be positive" rule (nan <= 0 is
    False): each script's own check refuses every float flag that is not finite, naming the flag."""
    world = lab.local_hosts * lab.local_procs_per_host
    with pytest.raises(WorkshopError, match=r"--lr must be a finite number, got (nan|inf)") as info:
        lab.validate_hyperparameters({**lab.local_hyperparameters, "lr": value}, world_size=world)
    assert "set --lr to a finite number" in info.value.fix and "--hp lr=VALUE" in info.value.fix
    if "momentum" in vars(lab.load_script().build_parser().parse_args([])):
        with pytest.raises(WorkshopError, match=r"--momentum must be a finite number"):
            lab.validate_hyperparameters({**lab.local_hyperparameters, "momentum": value}, world_size=world)


@pytest.mark.parametrize("args", [
    ["run", "data_parallel", "--hp", "lr=nan"],
    ["run", "model_parallel", "--hp", "lr=inf"],
    ["tune", "data_parallel", "--param", "lr=0.01,nan"],
    ["tune", "data_parallel", "--param", "lr=0.001:inf:log", "--trials", "2"],
])
def test_the_cli_refuses_non_finite_values_before_anything_starts(args, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("something started"))
    assert main([*args, "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "finite" in err and "Fix:" in err, err
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- a search ranks a NaN run diverged


def test_a_trial_that_ends_on_a_nan_objective_ranks_diverged_with_the_reason(tmp_path):
    """A trial whose run exited 0 with test_accuracy=nan (a script that trains on NaN) is not "ok", and is
    never the best: NaN compares neither better nor worse than a real value."""
    from workshop.search import Objective, SearchSpace
    from workshop.tuning import Trial, TuneResult, _collect, _write_json

    goal = Objective.parse(LAB3, None)
    trials = [Trial(1, {"lr": "1e9"}), Trial(2, {"lr": "0.02"})]
    for trial, accuracy in zip(trials, (math.nan, 0.9), strict=True):
        trial.folder = tmp_path / f"trial-{trial.index:03d}"
        trial.folder.mkdir()
        (trial.folder / "trial.log").write_text("")
        _write_json(trial.folder / "result.json", {"returncode": 0, "final": {"test_accuracy": accuracy}, "records": []})
        _collect(trial, 0, 12.0, goal)
    diverged, fine = trials
    assert diverged.status == "diverged" and "test_accuracy is nan: the training diverged" in diverged.failure
    assert fine.status == "ok"
    result = TuneResult(LAB3, goal, SearchSpace.parse(LAB3, ["lr=1e9,0.02"]), trials, "local", folder=tmp_path)
    assert result.best is fine and result.failed == [diverged]
    assert "diverged: test_accuracy is nan" in result.table() and "1 ok, 1 not (1 diverged)" in result.summary()


# ----------------------------------------------------------------------------- lab 3: one checkpoint, verified


def lab3_checkpoint(lab3, path: Path) -> None:
    torch.manual_seed(0)
    model = lab3.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    optimizer.step()  # momentum buffers in the optimizer's state
    lab3.save_checkpoint(path, model, optimizer, {"epoch": 1, "batch": 0, "step": 3}, 64, rank=0, world_size=1)


@pytest.mark.parametrize("damage", ["random bytes", "cut short"])
def test_lab3_a_damaged_checkpoint_is_refused_by_name(lab3, tmp_path, damage):
    """torch.load reads a checkpoint with 4 KB of random bytes in it without complaint (NaN weights, a run
    that "succeeds" at 10% accuracy), and a cut-short one with PyTorch's own words naming no file: both are
    reported as damaged, with the file's path and the fix."""
    path = tmp_path / "checkpoint.pt"
    lab3_checkpoint(lab3, path)
    assert lab3.load_checkpoint(path)["step"] == 3
    if damage == "random bytes":
        random_bytes(path, path.stat().st_size // 2)
        why = "its content no longer matches the SHA-256 saved in it"
    else:
        cut_short(path, path.stat().st_size // 3)
        why = "torch.load cannot read it (PytorchStreamReader failed reading zip archive: failed finding central directory)"
    with pytest.raises(ValueError) as info:
        lab3.load_checkpoint(path)
    message = str(info.value)
    assert message.startswith(f"The checkpoint {path} is damaged: {why}"), message
    assert f"Fix: move it out of {tmp_path} (or delete it) to train from the start" in message


# ----------------------------------------------------------------------------- lab 4: checksums, rotation


def tiny_gpt(lab4, seed: int = 0, shape: tuple[int, int, int, int] = (1, 16, 2, 8)):
    torch.manual_seed(seed)
    model = lab4.GPT(*shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, lab4.VOCAB, (2, shape[3]))).float().mean().backward()
    optimizer.step()
    return model, optimizer


def shard(folder: Path) -> Path:
    [found] = folder.glob("*.distcp")  # one rank: one shard
    return found


def test_lab4_a_damaged_checkpoint_is_passed_over_for_the_older_intact_one(lab4, tmp_path):
    model, optimizer = tiny_gpt(lab4)
    for step in (2, 4):
        lab4.save_checkpoint(tmp_path, step, model, optimizer, {"step": step}, rank=0, distributed=False)
    assert json.loads((tmp_path / "step-4" / "checksums.json").read_text())["sha256"].keys() == {
        ".metadata", "meta.pt", shard(tmp_path / "step-4").name}
    random_bytes(shard(tmp_path / "step-4"), 1000)
    assert lab4.find_checkpoint(tmp_path) == tmp_path / "step-2"  # `latest` names step-4: damaged
    damaged = []
    assert lab4.find_checkpoint(tmp_path, damaged) == tmp_path / "step-2"
    assert damaged == [(tmp_path / "step-4", f"{shard(tmp_path / 'step-4').name} does not match its SHA-256 in "
                        "checksums.json (its bytes changed after it was written)")]
    cut_short(tmp_path / "step-2" / "meta.pt", 100)
    damaged.clear()
    assert lab4.find_checkpoint(tmp_path, damaged) is None
    assert damaged[1][1].startswith("meta.pt has 100 bytes, not the ")


def test_lab4_the_rotation_never_deletes_the_last_intact_checkpoint_for_a_damaged_one(lab4, tmp_path):
    """A damaged step-8 (newer than the run's step) is not one of the two kept: after step 4 is saved, step-2
    and step-4 are the two intact ones and both stay (by number alone, step-2 went). A later save of step 8
    replaces it; once two intact newer ones exist, the older ones go."""
    model, optimizer = tiny_gpt(lab4)
    lab4.save_checkpoint(tmp_path, 2, model, optimizer, {"step": 2}, rank=0, distributed=False)
    lab4.save_checkpoint(tmp_path, 8, model, optimizer, {"step": 8}, rank=0, distributed=False)
    random_bytes(shard(tmp_path / "step-8"), 500)
    lab4.save_checkpoint(tmp_path, 4, model, optimizer, {"step": 4}, rank=0, distributed=False)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-2", "step-4", "step-8"]
    assert lab4.find_checkpoint(tmp_path) == tmp_path / "step-4"  # `latest`
    for step in (6, 8):
        lab4.save_checkpoint(tmp_path, step, model, optimizer, {"step": step}, rank=0, distributed=False)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-6", "step-8"]
    assert lab4.checkpoint_problem(tmp_path / "step-8") is None


# ----------------------------------------------------------------------------- leftovers, divergence


@pytest.mark.parametrize("lab", [LAB3, LAB4], ids=lambda lab: lab.key)
def test_what_a_killed_save_left_is_removed_and_nothing_else(lab, tmp_path, capsys):
    script = lab.load_script()
    ours = ["checkpoint.pt.tmp", "progress.json.tmp", "fault.json.tmp", "latest.tmp"]
    theirs = ["checkpoint.pt", "notes.tmp", "latest", "step-3.partial.bak", "my.partial"]
    for name in ours + theirs:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "step-3.partial").mkdir()
    (tmp_path / "step-3.partial" / "__0_0.distcp").write_bytes(b"half")
    (tmp_path / "step-2").mkdir()
    assert script.clean_stale(tmp_path) == sorted(ours + ["step-3.partial/"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*theirs, "step-2"])
    out = capsys.readouterr().out
    assert out == (f"Removed what an earlier run left unfinished in {tmp_path}: "
                   f"{', '.join(sorted(ours + ['step-3.partial/']))}.\n")
    assert script.clean_stale(tmp_path) == [] and script.clean_stale(tmp_path / "absent") == []


@pytest.mark.parametrize("lab", [LAB3, LAB4], ids=lambda lab: lab.key)
def test_a_non_finite_loss_or_weights_stop_the_run_with_the_step_and_the_fix(lab, capsys):
    """In one process (a world of one; the sum over ranks is the identity). The message is the rank's last
    line, on stdout (after its METRICS lines, where the workshop looks for why a rank ended), exit status 1."""
    script = lab.load_script()
    guard = script.Divergence(torch.device("cpu"), 0, 1, lambda t: t, "a lower --lr")
    model = torch.nn.Linear(2, 2)
    guard.note(torch.tensor(2.3), 1)
    guard.check(1, weights=model)  # all finite: goes on
    with torch.no_grad():
        model.weight[0, 0] = math.inf
    with pytest.raises(SystemExit) as info:
        guard.check(2, weights=model)
    assert info.value.code == 1
    assert "rank 0's weights were not finite after global step 2, while its loss still" in capsys.readouterr().out
    guard = script.Divergence(torch.device("cpu"), 0, 1, lambda t: t, "a lower --lr than 1e+09")
    for step, loss in ((3, math.nan), (4, math.inf)):
        guard.note(torch.tensor(loss), step)
    with pytest.raises(SystemExit) as info:
        guard.check(5)
    assert info.value.code == 1 and capsys.readouterr().out == (
        "Training diverged: the loss was nan at global step 3 on rank 0. The run stops here, before it checkpoints "
        "the broken weights: the checkpoints already written stay as they were. Fix: a lower --lr than 1e+09.\n")


def test_the_cli_says_a_run_that_had_already_finished_had_nothing_to_do():
    finished = [{"rank": 0, "step": 93, "restart": 0, "resumed_step": 93, "finished": 1}]
    assert recovery_line(finished) == ("nothing to do: the run had already finished at its last checkpoint (step 93); "
                                       "its model was evaluated and saved as it is")
    going_on = [{"rank": 0, "step": 32, "restart": 0, "resumed_step": 31}]
    assert recovery_line(going_on) == "resumed from an earlier run's checkpoint: resumed at step 31"
    restarted = [{"rank": 0, "step": 21, "restart": 1, "resumed_step": 20, "lost_steps": 10, "recover_s": 4.25}]
    assert recovery_line(restarted) == ("recovered 1 time(s): resumed at step 20, 10 step(s) redone, 4.2 s from the "
                                        "failure to training again")


# ----------------------------------------------------------------------------- the scripts, end to end (slow)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORKSHOP_FAULT", "GLOO_SOCKET_IFNAME") and not k.startswith("TORCHELASTIC_")}
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def losses(proc: subprocess.CompletedProcess) -> dict[int, float]:
    return {r["step"]: r["train_loss"] for r in metrics.parse_lines(proc.stdout.splitlines())
            if "train_loss" in r and r.get("rank") == 0}


@pytest.mark.slow
def test_lab3_a_damaged_or_cut_short_checkpoint_stops_the_run_before_training(tmp_path, channels):
    """Before: 4 KB of random bytes in checkpoint.pt gave exit 0, final_test_loss=nan, accuracy 0.1; a cut-short
    one, PyTorch's raw zip error naming no file. Now: exit 1 before any step, the file named; and the leftovers
    of a killed save are gone."""
    ckpt = tmp_path / "ckpt"

    def train(epochs: int) -> subprocess.CompletedProcess:
        hps = {"epochs": epochs, "max-steps": 3, "log-interval": 1, "threads": 1, "train": channels["train"],
               "test": channels["test"], "model-dir": tmp_path / "model", "checkpoint-dir": ckpt}
        return run([sys.executable, str(LAB3.entry_path), *flags(hps)], tmp_path)

    first = train(1)
    assert first.returncode == 0, first.stderr[-3000:]
    intact = (ckpt / "checkpoint.pt").read_bytes()
    for damage in ("random bytes", "cut short"):
        (ckpt / "checkpoint.pt").write_bytes(intact)
        if damage == "random bytes":
            random_bytes(ckpt / "checkpoint.pt", len(intact) // 3)
        else:
            cut_short(ckpt / "checkpoint.pt", len(intact) // 2)
        (ckpt / "checkpoint.pt.tmp").write_bytes(intact[:1000])  # a save killed half-way
        proc = train(2)
        assert proc.returncode == 1, proc.stdout[-2000:]
        last = proc.stdout.splitlines()[-1]  # the rank's last line: what the workshop reports as why it ended
        assert last.startswith(f"The checkpoint {ckpt / 'checkpoint.pt'} is damaged: "), proc.stdout[-2000:]
        assert f"Fix: move it out of {ckpt} (or delete it)" in last
        assert "Traceback" not in proc.stderr and "train_loss" not in proc.stdout  # no step trained
        assert f"Removed what an earlier run left unfinished in {ckpt}: checkpoint.pt.tmp." in proc.stdout
        assert not (ckpt / "checkpoint.pt.tmp").exists()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return prepare_corpus(tmp_path_factory.mktemp("corpus"))


def lab4_run(tmp_path: Path, corpus, name: str, ckpt: Path, procs: int = 2, **hps) -> subprocess.CompletedProcess:
    hps = {**GPT, "log-interval": 1, "threads": 1, "train": corpus.train_dir, "test": corpus.test_dir,
           "model-dir": tmp_path / name / "model", "checkpoint-dir": ckpt, **hps}
    launcher = ([sys.executable] if procs == 1 else
                [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(procs)])
    return run([*launcher, str(LAB4.entry_path), *flags(hps)], tmp_path / name)


@pytest.mark.slow
def test_lab4_a_damaged_checkpoint_is_reported_and_the_older_intact_one_resumed(tmp_path, corpus):
    """2 ranks, a sharded checkpoint every 3 steps. Before: random bytes in the newest one's shard trained on
    with NaN loss (and the rotation then deleted the intact older one); a cut-short file failed with
    PyTorch's raw zip error. Now each is reported by name, step-3 is resumed instead and said so, and the
    steps after it are the uninterrupted run's, loss for loss. With no intact checkpoint left, the run
    stops before training, naming them."""
    ckpt = tmp_path / "ckpt"
    first = lab4_run(tmp_path, corpus, "first", ckpt, steps=6, **{"checkpoint-every": 3})
    assert first.returncode == 0, first.stderr[-3000:]
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-3", "step-6"]
    pristine = tmp_path / "pristine"
    shutil.copytree(ckpt, pristine)
    for damage in ("random bytes", "cut short"):
        shutil.rmtree(ckpt)
        shutil.copytree(pristine, ckpt)
        if damage == "random bytes":
            victim = sorted((ckpt / "step-6").glob("*.distcp"))[1]  # rank 1's shard
            random_bytes(victim, victim.stat().st_size // 2)
            why = f"{victim.name} does not match its SHA-256 in checksums.json"
        else:
            victim = ckpt / "step-6" / "meta.pt"
            cut_short(victim, 1000)
            why = "meta.pt has 1,000 bytes, not the "
        (ckpt / "step-7.partial").mkdir()  # a save killed half-way
        proc = lab4_run(tmp_path, corpus, damage.replace(" ", "-"), ckpt, steps=8, **{"checkpoint-every": 3})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        out = proc.stdout
        assert f"The checkpoint {ckpt / 'step-6'} is damaged: {why}" in out, out[-3000:]
        assert (f"Training resumes from the older checkpoint {ckpt / 'step-3'} instead, the newest intact one."
                in out)
        assert f"resumed from {ckpt / 'step-3'} at step 3 (restart 0)" in out
        assert f"Removed what an earlier run left unfinished in {ckpt}: step-7.partial/." in out
        again = losses(proc)
        assert sorted(again) == [4, 5, 6, 7, 8]
        assert [again[s] for s in (4, 5, 6)] == [losses(first)[s] for s in (4, 5, 6)]  # the same steps, resumed
        assert all(math.isfinite(v) for v in again.values())
        # step-6 was written again (whole, intact) and step-8 after it: the two newest intact ones are kept
        assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-6", "step-8"]
        assert LAB4.load_script().checkpoint_problem(ckpt / "step-6") is None

    shutil.rmtree(ckpt)
    shutil.copytree(pristine, ckpt)
    for step in (3, 6):
        cut_short(ckpt / f"step-{step}" / "meta.pt", 1000)
    proc = lab4_run(tmp_path, corpus, "none-intact", ckpt, steps=8, **{"checkpoint-every": 3})
    assert proc.returncode != 0
    assert f"No intact checkpoint to resume from in {ckpt} (step-6: meta.pt has 1,000 bytes" in proc.stdout
    assert "Fix: move the damaged checkpoint(s) out of it" in proc.stdout
    assert "train_loss" not in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("lab", [LAB3, LAB4], ids=lambda lab: lab.key)
def test_a_nan_loss_stops_every_rank_before_it_is_checkpointed(lab, tmp_path, channels, corpus):
    """--lr 1e9 on 2 ranks: before, both labs trained on to the end with loss nan, exit 0, and wrote NaN
    checkpoints (lab 4's rotation then deleted every finite one). Now every rank stops at the first check
    after the loss goes NaN, naming the step and the rank and the fix, and every checkpoint on disk holds
    finite weights."""
    ckpt = tmp_path / "ckpt"
    if lab is LAB3:
        hps = {"epochs": 2, "max-steps": 6, "log-interval": 1, "checkpoint-every": 1, "threads": 1, "lr": 1e9,
               "train": channels["train"], "test": channels["test"], "model-dir": tmp_path / "model",
               "checkpoint-dir": ckpt}
        proc = run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(LAB3.entry_path), *flags(hps)],
                   tmp_path)
    else:
        proc = lab4_run(tmp_path, corpus, "nan", ckpt, steps=8, lr=1e9, **{"checkpoint-every": 1})
    assert proc.returncode != 0, proc.stdout[-2000:]
    err = proc.stdout
    # The loss goes NaN or a hundred times an untrained model's, or (a huge step) the weights overflow first while
    # the loss is still finite.
    found = re.search(r"Training diverged: (?:the loss was \S+ at global step (\d+) on rank [01](?:, \S+ times an "
                      r"untrained model's \([^)]*\))?( \(and on rank [01] at step \d+\))?|rank [01]'s weights were not "
                      r"finite after global step (\d+), while its loss still was)\. ", err)
    assert found, err[-3000:]
    assert " before it checkpoints the broken weights" in err and "Fix: a lower --lr than 1e+09" in err
    bad_step = int(found[1] or found[3])
    assert max(losses(proc)) == bad_step  # no step after the one that diverged (checked every step here)
    if lab is LAB3:
        state = torch.load(ckpt / "checkpoint.pt", weights_only=False) if (ckpt / "checkpoint.pt").exists() else None
        tensors = [] if state is None else list(state["model"].values())
        assert state is None or state["step"] < bad_step
    else:
        kept = sorted(ckpt.glob("step-*"))
        assert kept and all(int(p.name[5:]) < bad_step for p in kept), kept
        tensors, lab4 = [], LAB4.load_script()
        for folder in kept:  # each loaded into one process (DCP reshards the 2 ranks' shards) by the script itself
            model, optimizer = tiny_gpt(lab4, shape=(GPT["layers"], GPT["d-model"], GPT["heads"], GPT["seq-len"]))
            lab4.load_checkpoint(folder, model, optimizer)
            tensors += [p.detach() for p in model.parameters()]
    assert all(torch.isfinite(t).all() for t in tensors)


@pytest.mark.slow
def test_a_trial_at_lr_1e9_is_diverged_with_the_reason(tmp_path, mnist_dir, capsys):
    """Before: the trial trained on NaN loss and was ranked "ok" at accuracy 0.10."""
    code = main(["tune", "data_parallel", "--param", "lr=1e9", "--hosts", "1", "--parallel", "1", "--no-plot",
                 "--hp", "epochs=1", "--hp", "max-steps=6", "--hp", "log-interval=1", "--data-dir", str(mnist_dir),
                 "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1, out[-3000:]
    [search] = (tmp_path / "runs").glob("tune-*")
    [trial] = json.loads((search / "tune.json").read_text())["trials"]
    assert trial["status"] == "diverged", trial
    assert re.search(r"Training diverged: the loss was (nan|\S+ at global step \d+ on rank 0, \S+ times an untrained)",
                     trial["failure"]), trial["failure"]
    assert "trial 1/1 DIVERGED" in out and "0 ok, 1 not (1 diverged)" in out and "best:" not in out


@pytest.mark.slow
def test_resuming_a_finished_run_says_there_was_nothing_to_do(tmp_path, mnist_dir, capsys):
    """Before: `0/1 epoch(s)` and `recovered 1 time(s): resumed at step 3, at least 0 step(s) redone`, after the
    script's "0 step(s) to do again: the failed run had finished step 3" (no run had failed)."""
    args = ["run", "data_parallel", "--hosts", "1", "--data-dir", str(mnist_dir), "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--hp", "epochs=1", "--hp", "max-steps=3", "--hp", "log-interval=1", "--workdir", str(tmp_path)]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "[progress] data-parallel: 1/1 epoch(s)" in first and "recovered" not in first
    assert main([*args, "--verbose"]) == 0
    out = capsys.readouterr().out
    assert ("Nothing left to train: the run had already finished. /opt/ml/checkpoints/checkpoint.pt holds epoch 1 "
            "(step 3) and this run trains --epochs 1") in out, out[-3000:]
    assert "step(s) to do again" not in out and "recovered" not in out
    assert out.rstrip().endswith("nothing to do: the run had already finished at its last checkpoint (step 3); its model "
                                 "was evaluated and saved as it is")
    assert main(args) == 0  # the same, without --verbose: the progress line counts the epoch the run is through
    assert "[progress] data-parallel: 1/1 epoch(s)" in capsys.readouterr().out


# TensorFlow's two forms of a damaged tensor: read by another task (the status on its own line) or by the
# coordinator itself (a graph error naming where the op was defined, then the message). The second form
# was once reported as `(File "/opt/ml/input/data/code/train.py", line 566, in <module>)`.
_REMOTE = "Graph execution error:\n(0) DATA_LOSS: TensorBundle at /c/ckpt-20 shard 0: Checksum does not match\n"
_LOCAL = ('Graph execution error:\n\nDetected at node RestoreV2_1 defined at (most recent call last):\n'
          '  File "/opt/ml/input/data/code/train.py", line 566, in <module>\n\n'
          '  File "/opt/ml/input/data/code/train.py", line 387, in run_coordinator\n\n'
          'TensorBundle at /c/ckpt-20 shard 1 (576 bytes): Checksum does not match: stored 1 vs. calculated 2\n'
          '\t [[{{node RestoreV2_1}}]] [Op:__inference_tf_function_restore_158]')


@pytest.mark.parametrize("lab", [get_lab("parameter_server"), get_lab("horovod_tensorflow")], ids=lambda lab: lab.key)
@pytest.mark.parametrize("message", [_REMOTE, _LOCAL], ids=["another task", "the coordinator"])
def test_a_tensorflow_restore_error_is_one_line_with_its_status(lab, message):
    import tensorflow as tf

    module = lab.load_script()  # with the modules beside it in code/, where the helper may live
    said = module.restore_error(tf.errors.DataLossError(None, None, message))
    assert said.startswith("DATA_LOSS: TensorBundle at /c/ckpt-20 shard "), said
    assert "Checksum does not match" in said and "File " not in said and "[[" not in said and "\n" not in said


@pytest.mark.slow
def test_lab1_a_damaged_checkpoint_is_passed_over_for_the_older_one(tmp_path, channels):
    """Lab 1 (TensorFlow checks each tensor's CRC32C as it restores it): before, the coordinator failed with
    TensorFlow's error and the older checkpoint beside it was not tried. Now it is named, and ckpt-10 resumed."""
    from workshop.runner import run_local

    store = tmp_path / "checkpoints"
    common = dict(hosts=2, data_dir=channels["train"].parent, echo=False, checkpoint_dir=store)
    first = run_local(get_lab("parameter_server"), hyperparameters={"steps": 20, "log-interval": 10},
                      workdir=tmp_path / "a", **common)
    assert first.ok, first.failure
    biggest = max(store.glob("ckpt-20.data-*"), key=lambda p: p.stat().st_size)
    random_bytes(biggest, biggest.stat().st_size // 2)
    second = run_local(get_lab("parameter_server"), hyperparameters={"steps": 30, "log-interval": 10},
                       workdir=tmp_path / "b", **common)
    assert second.ok, second.failure
    text = "\n".join(second.lines)
    assert "The checkpoint /opt/ml/checkpoints/ckpt-20 is damaged: TensorFlow cannot read it (DATA_LOSS:" in text, text[-3000:]
    assert "Checksum does not match" in text
    assert "Training resumes from the older checkpoint /opt/ml/checkpoints/ckpt-10 instead, the newest intact one." in text
    assert "Resumed from /opt/ml/checkpoints/ckpt-10 at step 10." in text
    assert [r["step"] for r in second.records if "test_accuracy" in r] == [20, 30]
    assert sorted(p.name for p in store.glob("ckpt-*.index")) == ["ckpt-20.index", "ckpt-30.index"]
