"""The local sandbox's SM_* variables against the SDK's own `environment.py` on the same configs.

SDK v3's container entry script runs `sm_drivers/scripts/environment.py`, which reads
/opt/ml/input/config/*.json and exports every SM_* variable. Here it runs on the config
files the local cluster wrote, with its /opt/ml paths pointed at the sandbox, and every
variable it exports must be in the local cluster's environment with the same value, except
the few that differ by design (listed, with the reason).
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest
from conftest import PROBE_CODE
from sagemaker.train.distributed import Torchrun

from workshop.runtime.contract import HostSandbox, host_names

# Different locally on purpose: loopback instead of algo-1:7777 (there is no DNS name
# algo-1 here, and several local jobs must not share a port); each simulated host gets
# its share of this machine's CPUs; the driver folder is the installed SDK's.
BY_DESIGN = {"SM_MASTER_ADDR", "SM_MASTER_PORT", "SM_NUM_CPUS", "SM_DISTRIBUTED_DRIVER_DIR", "SM_TRAINING_ENV"}


@pytest.fixture
def sdk_environment(monkeypatch):
    drivers = Path(Torchrun().driver_dir).parent
    monkeypatch.syspath_prepend(str(drivers))
    spec = importlib.util.spec_from_file_location("sdk_environment", drivers / "scripts" / "environment.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("sdk_environment", None)


def exported(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        out[key] = shlex.split(value)[0] if value else ""
    return out


def test_local_environment_matches_the_sdks(tmp_path, channels, sdk_environment, monkeypatch):
    hosts = host_names(3)
    sandbox = HostSandbox(tmp_path / "algo-2")
    hps = {"epochs": 3, "lr": 0.05, "backend": "gloo", "scale-lr": True}
    sandbox.create(current_host="algo-2", hosts=hosts, channels=channels, hyperparameters=hps, source_dir=PROBE_CODE)
    distributed = Torchrun(process_count_per_node=2)
    ours = sandbox.environment(
        current_host="algo-2", hosts=hosts, channels=list(channels), hyperparameters=hps,
        entry_script="train.py", distributed=distributed.model_dump(), driver_dir=Path(distributed.driver_dir),
        master_port=29511, num_cpus=1, job_name="job-1",
    )

    env = sdk_environment
    for name, path in {
        "SM_MODEL_DIR": sandbox.model_dir, "SM_INPUT_DIR": sandbox.input_dir,
        "SM_INPUT_DATA_DIR": sandbox.data_dir, "SM_INPUT_CONFIG_DIR": sandbox.config_dir,
        "SM_OUTPUT_DIR": sandbox.output_dir, "SM_OUTPUT_FAILURE": sandbox.failure_file,
        "SM_OUTPUT_DATA_DIR": sandbox.output_data_dir, "SM_SOURCE_DIR_PATH": sandbox.code_dir,
    }.items():
        monkeypatch.setattr(env, name, str(path))
    monkeypatch.setattr(env, "read_source_code_json", lambda: {"entry_script": "train.py"})
    monkeypatch.setattr(env, "read_distributed_json", lambda: distributed.model_dump())
    monkeypatch.setattr(env, "num_gpus", lambda: 0)
    monkeypatch.setattr(env, "num_neurons", lambda: 0)
    monkeypatch.setenv("TRAINING_JOB_NAME", "job-1")
    configs = {n: json.loads((sandbox.config_dir / f"{n}.json").read_text()) for n in ("resourceconfig", "inputdataconfig", "hyperparameters")}
    out = tmp_path / "sm_training.env"
    env.set_env(configs["resourceconfig"], configs["inputdataconfig"], configs["hyperparameters"], output_file=str(out))
    sdk = exported(out)

    assert len(sdk) > 30
    missing = sorted(set(sdk) - set(ours))
    assert not missing, f"the SDK sets variables the local cluster does not: {missing}"
    different = {k: (sdk[k], ours[k]) for k in sdk if k not in BY_DESIGN and sdk[k] != ours[k]}
    assert not different, different
    # The by-design differences are the ones we say they are.
    assert sdk["SM_MASTER_ADDR"] == "algo-1" and ours["SM_MASTER_ADDR"] == "127.0.0.1"
    sdk_training, our_training = json.loads(sdk["SM_TRAINING_ENV"]), json.loads(ours["SM_TRAINING_ENV"])
    assert set(sdk_training) == set(our_training)
    for key in set(sdk_training) - {"master_addr", "master_port", "num_cpus"}:
        assert sdk_training[key] == our_training[key], key
