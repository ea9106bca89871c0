"""The SageMaker training contract for one simulated host: an `/opt/ml`-shaped sandbox and its `SM_*`.

SageMaker SDK v3 jobs start with `sm_train.sh`, which runs the SDK's `environment.py` to
turn `/opt/ml/input/config/*.json` into `SM_*` variables and then runs a driver (Torchrun,
MPI, a custom DistributedConfig, or the basic script driver). This module writes the same
config files into a per-host folder and builds the same variables, pointing into that
folder instead of `/opt/ml`. `tests/test_contract.py` runs the SDK's own `environment.py`
on the same config files and checks that every variable it sets is here too, with the same
value up to the sandbox path, so the two cannot drift apart unnoticed.

Layout of one host's sandbox (`<run>/algo-1/`, standing in for `/opt/ml`):

    input/config/{resourceconfig,inputdataconfig,hyperparameters}.json
    input/data/<channel>/   the data channels (links to the prepared folders)
    input/data/code/        a copy of the lab's code/ folder (the SDK's `code` channel)
    model/                  SM_MODEL_DIR (tarred to S3 as model.tar.gz on SageMaker)
    output/data/            SM_OUTPUT_DATA_DIR
    output/failure          written by the drivers when the job fails
    checkpoints/            SM_CHECKPOINT_DIR (synced with S3 by CheckpointConfig)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Reserved by SDK v3: the source code and its drivers travel as these input channels.
RESERVED_CHANNELS = ("code", "sm_drivers")
# Locally every simulated host reaches the master on loopback; on SageMaker it is "algo-1".
LOCAL_MASTER_ADDR = "127.0.0.1"
LOCAL_INSTANCE_TYPE = "local"
LOCAL_INTERFACE = "lo"
# What SDK v3's container scripts fix (`container_drivers/scripts/environment.py`).
SAGEMAKER_MASTER_PORT = 7777


def host_names(count: int) -> list[str]:
    """SageMaker's host names, sorted as SageMaker sorts them (as strings: algo-10 < algo-2)."""
    return sorted(f"algo-{i}" for i in range(1, count + 1))


# The CPUs a host's instance has when its instance type names no size ("local"): the smallest
# instance the labs name (ml.g5.xlarge) has 4 vCPUs.
LOCAL_INSTANCE_VCPUS = 4
_INSTANCE_SIZE = re.compile(r"(?:ml\.)?[a-z][a-z0-9-]*\.(?:(?P<n>\d*)xlarge|large|medium)")


def instance_vcpus(instance_type: str | None) -> int | None:
    """The vCPUs of an instance type, read from its size as EC2 names sizes (`medium` and `large`
    2, `xlarge` 4, `<N>xlarge` 4N): ml.g5.xlarge 4, ml.c5.2xlarge 8, ml.p4d.24xlarge 96. None for
    a name with no size ("local")."""
    m = _INSTANCE_SIZE.fullmatch(instance_type or "")
    if m is None:
        return None
    if m["n"] is None:  # large, medium
        return 2
    return 4 * int(m["n"] or 1)


def thread_pool_env(instance_type: str | None, host_cpus: int) -> dict[str, str]:
    """The variables that size a simulated host's waiting thread pools as its instance sizes them.

    Frameworks size their thread pools from the CPUs a process may use, and SageMaker's training
    images set no thread counts (TensorFlow 2.21's sets KMP_* and TF_AUTOTUNE_THRESHOLD, PyTorch's
    nothing), so on an instance the pools follow its vCPUs. A simulated host may use only its share
    of this machine's cores (`host_cpus`: one CPU per host with 2-3 hosts on 2 cores), and
    TensorFlow's inter-op pool sized from that has one thread: a parameter-server task, or any
    function waiting there for a remote tensor, blocks the very thread that would produce it, and
    the job hangs. So that pool gets the instance's vCPUs (at least the host's share where the
    type names no size); its threads mostly wait. The pools that compute (TensorFlow's intra-op
    pool, PyTorch's threads) keep following the host's share: sized for the instance, 2-3 hosts of
    4-8 busy threads each would oversubscribe 2 cores.
    """
    vcpus = instance_vcpus(instance_type) or max(LOCAL_INSTANCE_VCPUS, host_cpus)
    return {"TF_NUM_INTEROP_THREADS": str(vcpus)}


def _serialize(value: Any) -> str:
    """As the SDK writes values into sm_training.env: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class HostSandbox:
    """One simulated host's `/opt/ml`."""

    root: Path

    @property
    def input_dir(self) -> Path:
        return self.root / "input"

    @property
    def config_dir(self) -> Path:
        return self.root / "input" / "config"

    @property
    def data_dir(self) -> Path:
        return self.root / "input" / "data"

    @property
    def code_dir(self) -> Path:
        return self.data_dir / "code"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.output_dir / "data"

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    def create(
        self,
        *,
        current_host: str,
        hosts: list[str],
        channels: dict[str, Path],
        hyperparameters: dict[str, Any],
        source_dir: Path,
        instance_type: str = LOCAL_INSTANCE_TYPE,
        sm_drivers: Path | None = None,
    ) -> None:
        """Lay out the sandbox and its config files as SageMaker does before the job starts.

        With `sm_drivers` (the container runtime), the job's `sm_drivers` channel is copied in
        too, and `inputdataconfig.json` lists the `code` and `sm_drivers` channels as a
        SageMaker job's does (SDK v3 sends them as input channels).
        """
        for d in (self.config_dir, self.data_dir, self.model_dir, self.output_data_dir, self.checkpoint_dir):
            d.mkdir(parents=True, exist_ok=True)
        resource = {
            "current_host": current_host,
            "current_instance_type": instance_type,
            "current_group_name": "homogeneousCluster",
            "hosts": hosts,
            "instance_groups": [
                {"instance_group_name": "homogeneousCluster", "instance_type": instance_type, "hosts": hosts}
            ],
            "network_interface_name": LOCAL_INTERFACE,
        }
        listed = [*channels, *(RESERVED_CHANNELS if sm_drivers is not None else ())]
        input_data = {
            name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}
            for name in listed
        }
        # SageMaker stores every hyperparameter value as a string (JSON for non-strings).
        hps = {k: _serialize(v) for k, v in hyperparameters.items()}
        for name, content in (
            ("resourceconfig.json", resource),
            ("inputdataconfig.json", input_data),
            ("hyperparameters.json", hps),
        ):
            (self.config_dir / name).write_text(json.dumps(content, indent=2) + "\n")
        for name, path in channels.items():
            link = self.data_dir / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(Path(path).resolve(), target_is_directory=True)
        # Each host gets its own copy of the code, as on SageMaker: a script that reaches
        # outside its code/ folder fails here just as it would in the container.
        if self.code_dir.exists():
            shutil.rmtree(self.code_dir)
        shutil.copytree(source_dir, self.code_dir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if sm_drivers is not None:
            drivers = self.data_dir / "sm_drivers"
            if drivers.exists():
                shutil.rmtree(drivers)
            shutil.copytree(sm_drivers, drivers)

    def environment(
        self,
        *,
        current_host: str,
        hosts: list[str],
        channels: list[str],
        hyperparameters: dict[str, Any],
        entry_script: str,
        distributed: dict[str, Any] | None,
        driver_dir: Path | None,
        master_port: int,
        num_cpus: int,
        job_name: str,
        instance_type: str = LOCAL_INSTANCE_TYPE,
    ) -> dict[str, str]:
        """The `SM_*` variables the SDK's `environment.py` would export, pointing here."""
        hosts = sorted(hosts)
        env: dict[str, Any] = {
            "SM_MODEL_DIR": str(self.model_dir),
            "SM_INPUT_DIR": str(self.input_dir),
            "SM_INPUT_DATA_DIR": str(self.data_dir),
            "SM_INPUT_CONFIG_DIR": str(self.config_dir),
            "SM_OUTPUT_DIR": str(self.output_dir),
            "SM_OUTPUT_FAILURE": str(self.failure_file),
            "SM_OUTPUT_DATA_DIR": str(self.output_data_dir),
            "SM_LOG_LEVEL": 20,
            "SM_MASTER_ADDR": LOCAL_MASTER_ADDR,
            "SM_MASTER_PORT": master_port,
            "SM_SOURCE_DIR": str(self.code_dir),
            "SM_ENTRY_SCRIPT": entry_script,
        }
        if distributed is not None:
            env["SM_DISTRIBUTED_DRIVER_DIR"] = str(driver_dir)
            env["SM_DISTRIBUTED_CONFIG"] = distributed
        for name in channels:
            env[f"SM_CHANNEL_{name.upper()}"] = str(self.data_dir / name)
        env["SM_CHANNELS"] = list(channels)
        for key, value in hyperparameters.items():
            env[f"SM_HP_{key.replace('-', '_').upper()}"] = value
        env["SM_HPS"] = dict(hyperparameters)
        env.update(
            {
                "SM_CURRENT_HOST": current_host,
                "SM_CURRENT_INSTANCE_TYPE": instance_type,
                "SM_HOSTS": hosts,
                "SM_NETWORK_INTERFACE_NAME": LOCAL_INTERFACE,
                "SM_HOST_COUNT": len(hosts),
                "SM_CURRENT_HOST_RANK": hosts.index(current_host),
                "SM_NUM_CPUS": num_cpus,
                "SM_NUM_GPUS": 0,
                "SM_NUM_NEURONS": 0,
            }
        )
        resource = json.loads((self.config_dir / "resourceconfig.json").read_text())
        input_data = json.loads((self.config_dir / "inputdataconfig.json").read_text())
        env["SM_RESOURCE_CONFIG"] = resource
        env["SM_INPUT_DATA_CONFIG"] = input_data
        env["SM_TRAINING_ENV"] = {
            "channel_input_dirs": {name: env[f"SM_CHANNEL_{name.upper()}"] for name in channels},
            "current_host": current_host,
            "current_instance_type": instance_type,
            "hosts": hosts,
            "master_addr": LOCAL_MASTER_ADDR,
            "master_port": master_port,
            "hyperparameters": env["SM_HPS"],
            "input_data_config": input_data,
            "input_config_dir": str(self.config_dir),
            "input_data_dir": str(self.data_dir),
            "input_dir": str(self.input_dir),
            "job_name": job_name,
            "log_level": 20,
            "model_dir": str(self.model_dir),
            "network_interface_name": LOCAL_INTERFACE,
            "num_cpus": num_cpus,
            "num_gpus": 0,
            "num_neurons": 0,
            "output_data_dir": str(self.output_data_dir),
            "resource_config": resource,
        }
        # Not set by SageMaker itself: the workshop's jobs set it next to their
        # CheckpointConfig (local path /opt/ml/checkpoints), so scripts read one variable.
        env["SM_CHECKPOINT_DIR"] = str(self.checkpoint_dir)
        env["TRAINING_JOB_NAME"] = job_name
        return {k: _serialize(v) for k, v in env.items()}


def base_process_env() -> dict[str, str]:
    """The parent's environment minus anything that would make a child think it is already
    part of a distributed job (a notebook started under torchrun, say)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SM_", "OMPI_", "PET_"))}
    return {**env, **bytecode_cache(env)}


def bytecode_cache(env: dict[str, str]) -> dict[str, str]:
    """Where the machine sets PYTHONDONTWRITEBYTECODE (CI images and some hosted notebooks do) and the workshop runs
    from its virtual environment: bytecode written once into the environment's own cache (`<venv>/pycache`, never
    beside a source, so no job's source_dir gains a __pycache__), as `make test` does. Without it every process of
    every job compiles TensorFlow from source: lab 1's six processes on 2 cores took 33-68 s to import it (2026-11-28), against
    a few seconds from bytecode (the set-up installs with --no-compile to fit a notebook instance's disk). Nothing
    changes where bytecode is written already, or where a cache is set."""
    if not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX") or sys.prefix == sys.base_prefix:
        return {}
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(Path(sys.prefix) / "pycache")}


def container_process_env(job_name: str) -> dict[str, str]:
    """The environment a simulated container starts with (before `sm_train.sh` adds the `SM_*`).

    This machine's environment, as `base_process_env`, less what a training container would not
    have: the caller's AWS credentials and settings and the SageMaker SDK's (the SDK's
    `environment.py` logs every variable of the container), and pip's settings. Plus what SageMaker sets:
    `TRAINING_JOB_NAME`, and the workshop's own `SM_CHECKPOINT_DIR` (its jobs set it next to
    their CheckpointConfig).
    """
    env = {k: v for k, v in base_process_env().items() if not k.startswith(("AWS_", "SAGEMAKER_", "PIP_"))}
    env["TRAINING_JOB_NAME"] = job_name
    # Nor this machine's pip configuration (local wheel folders, mirrors): a `pip install` in
    # the job meets the job's network as it is, not a cache that no training image has.
    env["PIP_CONFIG_FILE"] = os.devnull
    env["SM_CHECKPOINT_DIR"] = "/opt/ml/checkpoints"
    return env


def container_command() -> list[str]:
    """The image entrypoint and arguments SDK v3 sets for `source_code` jobs (the SDK's own
    constants: `/bin/bash -c "chmod +x .../sm_train.sh && .../sm_train.sh"`)."""
    from sagemaker.train.constants import DEFAULT_CONTAINER_ARGUMENTS, DEFAULT_CONTAINER_ENTRYPOINT

    return [*DEFAULT_CONTAINER_ENTRYPOINT, *DEFAULT_CONTAINER_ARGUMENTS]


def write_sm_drivers(dest: Path, source_dir: Path, entry_script: str, distributed: Any = None,
                     source_code: Any = None) -> Path:
    """The `sm_drivers` channel exactly as SDK v3's `ModelTrainer` builds it before uploading it
    (`sagemaker/train/model_trainer.py: _create_training_job_args`): the SDK's container drivers,
    its `install_requirements.py`, the `distributed=` config's driver folder, and the generated
    `sm_train.sh`, `sourcecode.json` and `distributed.json`, by the SDK's own functions.
    `source_code`: the job's own `SourceCode` (a `command=`, its `args`), instead of `source_dir` and
    `entry_script` alone."""
    from types import SimpleNamespace

    import sagemaker.core.utils.install_requirements as install_requirements
    from sagemaker.core.training.configs import SourceCode
    from sagemaker.train.constants import SM_DRIVERS_LOCAL_PATH
    from sagemaker.train.model_trainer import ModelTrainer

    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(SM_DRIVERS_LOCAL_PATH, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(install_requirements.__file__, dest / "scripts" / "install_requirements.py")
    if distributed is not None:
        shutil.copytree(distributed.driver_dir, dest / "distributed_drivers", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    source_code = source_code or SourceCode(source_dir=str(source_dir), entry_script=entry_script)
    tmp = SimpleNamespace(name=str(dest))
    # All _prepare_train_script reads of self (hyperparameters: only for its warning about a command's)
    trainer = SimpleNamespace(_jumpstart_config=None, hyperparameters={})
    ModelTrainer._prepare_train_script(trainer, tmp, source_code, distributed)
    ModelTrainer._write_source_code_json(trainer, tmp, source_code)
    ModelTrainer._write_distributed_json(trainer, tmp, distributed)
    return dest
