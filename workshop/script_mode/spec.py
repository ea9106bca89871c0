"""A script of your own as an ad-hoc lab (`ScriptSpec`, key `workshop.spec.SCRIPT_KEY`): its folder is the
`source_dir`, its channels a `workshop.datasets.local.GivenChannels`, its launcher one of the workshop's (or a
trainer's own `distributed=` object), so that `workshop.runner.run_local` and `run_on_sagemaker` serve it as
they serve the labs."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from workshop.datasets.local import GivenChannels
from workshop.errors import WorkshopError
from workshop.jobs.checks import check_hyperparameters
from workshop.jobs.images import PYTORCH_IMAGE
from workshop.script_mode.checks import check_compiles, parse_script
from workshop.spec import SCRIPT_KEY, Lab, SageMakerDefaults

LAUNCHERS = ("torchrun", "horovod", "parameter-server", "none")
IMAGES = {"pytorch": dict(PYTORCH_IMAGE),
          "tensorflow": {"framework": "tensorflow", "framework_version": "2.21", "py_version": "py312"}}
DEFAULT_INSTANCE_TYPE = "ml.m5.xlarge"  # 4 vCPUs, no GPU: the cheapest type every example here fits


@dataclass(frozen=True)
class ScriptSpec(Lab):
    """A script of your own as a lab: `code_dir` is its source_dir (anywhere), `requirements` the file in it
    that a SageMaker job installs. Hyperparameters are checked against what SageMaker takes, and against the
    script's own `build_parser()` only where it has one (the labs' convention); otherwise they pass as given."""

    code_dir: str = ""
    requirements: str | None = None

    @property
    def source_dir(self) -> Path:
        return Path(self.code_dir)

    @property
    def label(self) -> str:
        return f"your script {self.entry_script}"

    @property
    def job_label(self) -> str:
        return self.label  # the summary says "your script train.py", not the key its jobs are filed under

    @property
    def has_parser(self) -> bool:
        """Whether the entry defines `build_parser()` at its top level (then its flags are checked here too)."""
        tree = parse_script(self.entry_path)
        return any(isinstance(n, ast.FunctionDef) and n.name == "build_parser" for n in tree.body)

    def validate_hyperparameters(self, hyperparameters: Mapping[str, Any], world_size: int = 1,
                                 train_samples: int | None = None) -> Any:
        check_hyperparameters(hyperparameters)  # what CreateTrainingJob refuses, what sm_train.sh cannot deliver
        if self.entry_path.suffix == ".py" and self.has_parser:
            return super().validate_hyperparameters(hyperparameters, world_size, train_samples)
        return SimpleNamespace(**{str(k).replace("-", "_"): v for k, v in hyperparameters.items()})


def script_spec(source_dir: str | Path, entry_script: str, *, launcher: Any, channels: GivenChannels,
                environment: Mapping[str, str] | None = None, framework: str = "pytorch",
                instance_type: str = DEFAULT_INSTANCE_TYPE, instance_count: int = 2, procs_per_host: int | None = 1,
                requirements: str | None = None, max_run_s: int = 3600) -> ScriptSpec:
    """The ad-hoc lab of a script: checked here (the folder, the entry, that it compiles, the requirements file)."""
    source = Path(source_dir).expanduser()
    if not source.is_dir():
        raise WorkshopError(f"No folder {source} (the job's source_dir).", "pass the folder that holds your entry script.")
    source = source.resolve()
    if not (source / entry_script).is_file():
        near = sorted(p.name for p in source.glob("*.py"))[:8]
        raise WorkshopError(f"No entry script {entry_script!r} in {source}"
                            + (f" (its Python files: {', '.join(near)})." if near else " (it has no Python file)."),
                            "pass DIR/ENTRY of a script that exists, e.g. `python -m workshop run-script code/train.py`.")
    check_compiles(source, entry_script)
    if requirements is not None and not (source / requirements).is_file():
        raise WorkshopError(f"The requirements file {requirements!r} is not in {source}: SageMaker installs it from "
                            "the job's source_dir.", "put it in that folder, or leave requirements out.")
    image = IMAGES[framework]
    return ScriptSpec(
        key=SCRIPT_KEY, folder=str(source), title=f"your script {entry_script}", strategy=f"{launcher.name} launcher",
        launcher=launcher, data=channels, entry_script=entry_script, local_hosts=instance_count,
        local_procs_per_host=procs_per_host or 1, accuracy_metric="", metrics=(), environment=dict(environment or {}),
        code_dir=str(source), requirements=requirements,
        sagemaker=SageMakerDefaults(**image, instance_type=instance_type, instance_count=instance_count,
                                    procs_per_host=procs_per_host, max_run_s=max_run_s, requirements=requirements),
    )
