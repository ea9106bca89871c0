"""What each lab is: its folder, launcher, local defaults and SageMaker defaults.

The CLI (`python -m workshop run LAB`), the notebooks and the tests all read this one table,
so a lab's defaults live in exactly one place.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from workshop import REPO_ROOT
from workshop.errors import WorkshopError


@dataclass(frozen=True)
class SageMakerDefaults:
    """How a lab runs on SageMaker unless the caller says otherwise."""

    framework: str  # image family for sagemaker.core.image_uris.retrieve
    framework_version: str
    py_version: str
    instance_type: str
    instance_count: int
    launcher: str  # "torchrun", "horovod", "parameter_server" (see workshop.sagemaker_jobs)
    procs_per_host: int | None = None  # None: one per GPU (the launcher's own default)
    max_run_s: int = 3600
    volume_size_gb: int = 30
    container_version: str | None = None  # only the SMP images need it (e.g. "cu124")
    # The only instance types the route can use (empty: any SageMaker training type): plan_job
    # refuses others, and preflight suggests nothing else when the quota is short.
    instance_types: tuple[str, ...] = ()


# The PyTorch labs run the SageMaker PyTorch 2.13 training image (SDK 3.27's `pytorch-amzn2023`
# family: Amazon Linux 2023, Python 3.12, CPU and CUDA 13.3 GPU variants), the PyTorch this
# project pins (torch==2.13.0), so what CI runs locally is what the job runs. End of patch
# 2027-07-20 (see workshop.sagemaker_jobs.IMAGE_SUPPORT). It has no smddp and no SMP.
PYTORCH_IMAGE = {"framework": "pytorch-amzn2023", "framework_version": "2.13", "py_version": "py312"}


@dataclass(frozen=True)
class Lab:
    key: str  # short name used on the command line
    folder: str  # top-level folder, e.g. "3_data_parallel"
    title: str
    strategy: str
    launcher: str  # local launcher: "torchrun", ...
    entry_script: str = "train.py"
    local_hosts: int = 2
    local_procs_per_host: int = 1
    # Hyperparameters for the local default run (small and fast; the script's own
    # defaults are the SageMaker-sized ones).
    local_hyperparameters: dict[str, Any] = field(default_factory=dict)
    # The metric the summary table reports, as printed by the script (see workshop.metrics).
    accuracy_metric: str = "test_accuracy"
    # Metrics the script prints (rank 0's lines); SageMaker charts these.
    metrics: tuple[str, ...] = ("train_loss", "test_loss", "test_accuracy", "samples_per_sec")
    sagemaker: SageMakerDefaults | None = None
    aliases: tuple[str, ...] = ()
    # Names that select this lab together with its siblings in the same folder (lab 2 has a
    # PyTorch and a TensorFlow script): `python -m workshop run 2_horovod` runs both.
    group_aliases: tuple[str, ...] = ()
    # "module:function" that writes the lab's input channels into a folder (None: the default)
    # and returns an object with `.dirs` and `.n_train`; None: MNIST (workshop.data.prepare_mnist).
    data_preparer: str | None = None

    @property
    def label(self) -> str:
        """The folder, and the script when the folder has more than one lab."""
        shared = sum(lab.folder == self.folder for lab in LABS.values()) > 1
        return f"{self.folder} ({Path(self.entry_script).stem})" if shared else self.folder

    @property
    def path(self) -> Path:
        return REPO_ROOT / self.folder

    @property
    def source_dir(self) -> Path:
        """The lab's `code/` folder: its SageMaker `source_dir`, uploaded as is."""
        return self.path / "code"

    @property
    def entry_path(self) -> Path:
        return self.source_dir / self.entry_script

    def distributed_config(self, procs_per_host: int | None = None):
        """The SDK v3 `distributed=` config for this lab: the same object configures the
        SageMaker job and tells the local cluster which driver to run."""
        if self.launcher == "torchrun":
            from sagemaker.train.distributed import Torchrun

            return Torchrun(process_count_per_node=procs_per_host)
        if self.launcher == "parameter_server":
            from workshop.parameter_server import ParameterServer

            if procs_per_host not in (None, 1):
                raise WorkshopError(
                    f"Lab {self.key!r} runs one training process per host (plus a parameter server), "
                    f"not {procs_per_host}.",
                    "use --procs-per-host 1 (the default) and more hosts for more workers.",
                )
            return ParameterServer()
        if self.launcher == "horovod":
            from workshop.horovod import Horovod, check_installed

            framework = "tensorflow" if self.sagemaker and self.sagemaker.framework == "tensorflow" else "pytorch"
            check_installed(framework)  # before any process starts: a missing build says how to get one
            return Horovod(framework=framework, process_count_per_node=procs_per_host)
        raise WorkshopError(f"Lab {self.key!r} has no launcher {self.launcher!r} yet.")

    def load_script(self) -> ModuleType:
        """Import the entry script as a module (without running its `main`)."""
        spec = importlib.util.spec_from_file_location(f"_workshop_lab_{self.key}", self.entry_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def validate_hyperparameters(
        self, hyperparameters: dict[str, Any], world_size: int = 1, train_samples: int | None = None
    ):
        """Parse the hyperparameters with the script's own argument parser.

        The script is the one source of truth for its flags and their types, so a typo
        or a non-numeric value fails here, before any process starts or anything is
        spent, with argparse's message. Scripts may also define `check_args(args,
        world_size)` for checks that depend on the cluster's size.
        """
        script = self.load_script()
        argv = hyperparameters_to_argv(hyperparameters)
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                parser = script.build_parser()
                parser.prog = self.entry_script
                args = parser.parse_args(argv)
        except SystemExit as exc:
            message = stderr.getvalue().strip().splitlines()
            detail = message[-1] if message else f"exit status {exc.code}"
            raise WorkshopError(
                f"Invalid hyperparameters for lab {self.key!r} ({shlex.join(argv)}): {detail}",
                f"see `python {self.folder}/code/{self.entry_script} --help` for every flag and its type.",
            ) from None
        check = getattr(script, "check_args", None)
        if check is not None:
            try:
                check(args, world_size, train_samples=train_samples)
            except ValueError as exc:
                rules, fix = split_fix(str(exc), vars(args))
                raise WorkshopError(
                    f"Invalid hyperparameters for lab {self.key!r}: {rules}",
                    fix or f"change the value it names; `python {self.folder}/code/{self.entry_script} --help` "
                    "lists every flag with its default.",
                ) from None
        return args


def split_fix(text: str, hyperparameters: dict[str, Any]) -> tuple[str, str | None]:
    """A script's check message -> (the broken rules, the fix or None).

    The scripts' `check_args` convention: the rules, then " Fix: " and what to do about each,
    in the script's own flags (it also runs alone, on SageMaker). The fix then says once how the
    first flag it names is written on the workshop's command line. `hyperparameters`: the
    script's parsed arguments, which tell its flags from anything else the fix names.
    """
    rules, sep, fix = text.rpartition(" Fix: ")
    if not sep:
        return text, None
    flags = [f for f in re.findall(r"--([a-z][a-z0-9_-]*)", fix) if f.replace("-", "_") in hyperparameters]
    if flags:
        fix = f"{fix.rstrip('.')}. On the command line: --hp {flags[0]}=VALUE."
    return rules.rstrip(". "), fix


def hyperparameters_to_argv(hyperparameters: dict[str, Any]) -> list[str]:
    """`{"epochs": 3}` -> `["--epochs", "3"]`, the way SDK v3's drivers pass them.

    Strings pass as they are and everything else as JSON (SDK v3:
    `container_drivers/common/utils.py: hyperparameters_to_cli_args`).
    """
    import json

    argv: list[str] = []
    for key, value in hyperparameters.items():
        argv += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return argv


LABS: dict[str, Lab] = {
    lab.key: lab
    for lab in [
        Lab(
            key="parameter_server",
            folder="1_parameter_server",
            title="Parameter server (TensorFlow 2 ParameterServerStrategy)",
            strategy="asynchronous parameter server",
            launcher="parameter_server",
            local_hosts=3,  # 3 parameter servers, the coordinator, 2 workers: 6 TF processes
            local_procs_per_host=1,
            local_hyperparameters={"steps": 300, "log-interval": 50},
            metrics=("train_loss", "test_loss", "test_accuracy", "steps_per_sec", "final_test_accuracy"),
            sagemaker=SageMakerDefaults(
                framework="tensorflow",
                framework_version="2.21",
                py_version="py312",
                instance_type="ml.c5.2xlarge",
                instance_count=3,
                launcher="parameter_server",
                procs_per_host=1,
            ),
            aliases=("1", "1_parameter_server", "ps"),
        ),
        Lab(
            key="horovod_pytorch",
            folder="2_horovod",
            title="Horovod ring all-reduce (PyTorch)",
            strategy="ring all-reduce (Horovod, PyTorch)",
            launcher="horovod",
            entry_script="train_pytorch.py",
            local_hosts=2,
            local_procs_per_host=1,
            local_hyperparameters={"epochs": 3, "log-interval": 5},
            sagemaker=SageMakerDefaults(
                **PYTORCH_IMAGE,
                # CPU instances: the workshop's Horovod wheel (built once per image) uses Gloo (see workshop.horovod).
                instance_type="ml.c5.2xlarge",
                instance_count=2,
                launcher="horovod",
                procs_per_host=1,
            ),
            aliases=("2_horovod_pytorch", "hvd-pytorch", "horovod-pytorch"),
            group_aliases=("2", "2_horovod", "horovod"),
        ),
        Lab(
            key="horovod_tensorflow",
            folder="2_horovod",
            title="Horovod ring all-reduce (TensorFlow)",
            strategy="ring all-reduce (Horovod, TensorFlow)",
            launcher="horovod",
            entry_script="train_tensorflow.py",
            local_hosts=2,
            local_procs_per_host=1,
            local_hyperparameters={"epochs": 3, "log-interval": 5},
            sagemaker=SageMakerDefaults(
                framework="tensorflow",
                framework_version="2.21",
                py_version="py312",
                instance_type="ml.c5.2xlarge",
                instance_count=2,
                launcher="horovod",
                procs_per_host=1,
            ),
            aliases=("2_horovod_tensorflow", "hvd-tensorflow", "horovod-tensorflow"),
            group_aliases=("2", "2_horovod", "horovod"),
        ),
        Lab(
            key="data_parallel",
            folder="3_data_parallel",
            title="Data parallel (PyTorch DDP)",
            strategy="synchronous all-reduce (DDP)",
            launcher="torchrun",
            local_hosts=2,
            local_procs_per_host=1,
            # log-interval 5: a few points per epoch on the 4,000-digit subset, for the plots
            local_hyperparameters={"epochs": 3, "log-interval": 5},
            sagemaker=SageMakerDefaults(
                **PYTORCH_IMAGE,
                instance_type="ml.g5.xlarge",
                instance_count=2,
                launcher="torchrun",
            ),
            aliases=("3", "3_data_parallel", "ddp"),
        ),
        Lab(
            key="model_parallel",
            folder="4_model_parallel",
            title="Model parallel (PyTorch FSDP2; SageMaker model parallel v2)",
            strategy="sharded data parallel (FSDP2)",
            launcher="torchrun",
            local_hosts=2,
            local_procs_per_host=1,
            # A tiny GPT for a quick local run; the summary's accuracy is next-character accuracy.
            local_hyperparameters={
                "steps": 60, "layers": 2, "d-model": 64, "seq-len": 32, "batch-size": 8,
                "log-interval": 10, "sharding": "full_shard",
            },
            metrics=("train_loss", "test_loss", "test_accuracy", "perplexity", "step_time_s"),
            # The plain-FSDP route: the script's own FSDP2 on 2 x 1 A10G (24 GB), plenty for a model of
            # a few million parameters; at most 2 x $1.408/h x 0.5 h = $1.41. The SMP route (2 x
            # ml.p4d.24xlarge, up to $37.69 for the same 30 minutes) is opt-in: see workshop.model_parallel.
            sagemaker=SageMakerDefaults(
                **PYTORCH_IMAGE,
                instance_type="ml.g5.xlarge",
                instance_count=2,
                launcher="torchrun_smp",  # Torchrun(smp=SMP(...)) with SMP settings, plain Torchrun() without
                max_run_s=1800,
            ),
            aliases=("4", "4_model_parallel", "fsdp", "mp"),
            data_preparer="workshop.model_parallel:prepare_corpus",
        ),
    ]
}


def get_lab(name: str) -> Lab:
    """Find a lab by key, folder name, number or alias."""
    for lab in LABS.values():
        if name == lab.key or name in lab.aliases:
            return lab
    group = [lab for lab in LABS.values() if name in lab.group_aliases]
    if group:
        raise WorkshopError(
            f"{name!r} names {len(group)} labs: " + ", ".join(lab.key for lab in group) + ".",
            "pick one of them (the command line's `run` takes the folder and runs them all).",
        )
    known = ", ".join(f"{lab.key} ({lab.folder})" for lab in LABS.values())
    raise WorkshopError(f"Unknown lab {name!r}.", f"choose one of: {known}, or 'all'.")


def get_labs(name: str) -> list[Lab]:
    """The labs `name` selects: one by key or alias, or every lab of a folder (e.g. 2_horovod)."""
    group = [lab for lab in LABS.values() if name in lab.group_aliases]
    return group or [get_lab(name)]
