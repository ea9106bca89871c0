"""Lab 3's script in every way it is meant to run: alone, under torchrun, on the local cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workshop import metrics
from workshop.errors import WorkshopError
from workshop.labs import get_lab
from workshop.runner import run_local

LAB = get_lab("data_parallel")
SCRIPT = LAB.entry_path
BIN = Path(sys.executable).parent
QUICK = {"epochs": 1, "max-steps": 4, "log-interval": 2}


def flags(hps: dict) -> list[str]:
    return [x for k, v in hps.items() for x in (f"--{k}", str(v))]


def run_script(cmd: list[str], tmp_path: Path, channels, extra: dict, env: dict | None = None) -> subprocess.CompletedProcess:
    args = flags({**extra, "train": channels["train"], "test": channels["test"],
                  "model-dir": tmp_path / "model", "checkpoint-dir": tmp_path / "ckpt"})
    if env:
        env = {**{k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}, **env}
    return subprocess.run(cmd + [str(SCRIPT)] + args, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env or None)


@pytest.mark.slow
def test_runs_alone_with_no_launcher(tmp_path, channels):
    proc = run_script([sys.executable], tmp_path, channels, QUICK)
    assert proc.returncode == 0, proc.stderr
    records = metrics.parse_lines(proc.stdout.splitlines())
    assert metrics.last(records, "weights_identical") == 1
    assert "gloo: no GPU is visible" in proc.stdout
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["world_size"] == 1 and config["effective_lr"] == config["args"]["lr"]
    state = torch.load(tmp_path / "model" / "model.pt", weights_only=True)
    assert state["fc2.weight"].shape == (10, 128)


@pytest.mark.slow
def test_runs_under_torchrun(tmp_path, channels):
    proc = run_script([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"], tmp_path, channels, QUICK)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = metrics.parse_lines(proc.stdout.splitlines())
    assert metrics.last(records, "weights_identical") == 1
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["world_size"] == 2 and config["effective_lr"] == pytest.approx(2 * config["args"]["lr"])
    assert config["threads_per_rank"] == max(1, os.cpu_count() // 2)  # ranks share the cores


@pytest.mark.parametrize(
    ("hps", "hosts", "message"),
    [
        ({"epochs": "three"}, 2, "argument --epochs: invalid int value: 'three'"),
        ({"lr": "fast"}, 2, "argument --lr: invalid float value"),
        ({"batch-size": 3000}, 2, "each of the 2 ranks gets 2000 training samples"),
        ({"batch-size": 0}, 2, "--batch-size must be at least 1"),
        ({"backend": "mpi"}, 2, "invalid choice: 'mpi'"),
        ({"no-such-flag": 1}, 2, "unrecognized arguments: --no-such-flag"),
        ({}, 0, "hosts must be a whole number of at least 1"),
    ],
)
def test_bad_input_fails_before_any_process_starts(tmp_path, channels, hps, hosts, message):
    with pytest.raises(WorkshopError, match=message):
        run_local(LAB, hosts=hosts, hyperparameters=hps, workdir=tmp_path / "run",
                  data_dir=channels["train"].parent, echo=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_missing_channel_in_the_script_names_the_fix(tmp_path, channels):
    proc = run_script([sys.executable], tmp_path, {"train": tmp_path / "nothing", "test": channels["test"]}, QUICK)
    assert proc.returncode != 0
    assert "The 'train' channel has no mnist.npz" in proc.stderr and "python -m workshop.datasets mnist" in proc.stderr


def test_backend_choice(monkeypatch):
    script = LAB.load_script()
    assert script.choose_backend("auto", cuda=False)[0] == "gloo"
    assert script.choose_backend("auto", cuda=True)[0] == "nccl"
    with pytest.raises(RuntimeError, match="needs CUDA"):
        script.choose_backend("nccl", cuda=False)
    monkeypatch.setenv("SM_CURRENT_INSTANCE_TYPE", "ml.g5.xlarge")
    with pytest.raises(RuntimeError, match="supported only on GPU instances ml.p4d.24xlarge"):
        script.choose_backend("smddp", cuda=True)
    # On a smddp instance without the library (any machine but SageMaker's image), auto falls back.
    monkeypatch.setenv("SM_CURRENT_INSTANCE_TYPE", "ml.p4d.24xlarge")
    assert script.choose_backend("auto", cuda=True)[0] == "nccl"
    with pytest.raises(RuntimeError, match="library is not installed"):
        script.choose_backend("smddp", cuda=True)


def test_gloo_binds_to_sagemakers_network_interface(monkeypatch):
    """Issue 11, defect 6: on CPU hosts, gloo uses SM_NETWORK_INTERFACE_NAME instead of guessing."""
    script = LAB.load_script()
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")  # recorded, so whatever the script sets is undone
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.setenv("SM_NETWORK_INTERFACE_NAME", "eth0")
    assert script.set_gloo_interface("nccl") is None and "GLOO_SOCKET_IFNAME" not in os.environ
    assert script.set_gloo_interface("gloo") == "eth0" and os.environ["GLOO_SOCKET_IFNAME"] == "eth0"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ens5")  # set by the user: left alone
    assert script.set_gloo_interface("gloo") is None and os.environ["GLOO_SOCKET_IFNAME"] == "ens5"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.delenv("SM_NETWORK_INTERFACE_NAME")
    assert script.set_gloo_interface("gloo") is None and "GLOO_SOCKET_IFNAME" not in os.environ
    calls = [line for line in SCRIPT.read_text().splitlines() if "set_gloo_interface(backend)" in line]
    source = SCRIPT.read_text()  # called once, in ddp_setup, before the process group is made
    assert len(calls) == 1 and source.index("set_gloo_interface(backend)") < source.index("dist.init_process_group(")


@pytest.mark.slow
def test_gloo_really_uses_the_interface_sagemaker_names(tmp_path, channels):
    env = {"SM_NETWORK_INTERFACE_NAME": "lo"}
    proc = run_script([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"], tmp_path, channels, QUICK, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "model" / "config.json").read_text())["gloo_socket_ifname"] == "lo"
    # An interface the host lacks fails in gloo itself: the variable reaches it.
    bad = run_script([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"], tmp_path, channels, QUICK,
                     env={"SM_NETWORK_INTERFACE_NAME": "nosuch0"})
    assert bad.returncode != 0 and "nosuch0" in bad.stderr
