"""A script's job on the local cluster (`run_job`): the checks only this machine can make, the one line that says
what it cannot simulate, `workshop.runner.run_local` (everything `python -m workshop run` offers a lab's local
run), then the archives."""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workshop.errors import WorkshopError
from workshop.runtime.local_cluster import choose_runtime
from workshop.runtime.progress import STALL_S
from workshop.script_mode.checks import check_imports, check_requirements
from workshop.script_mode.result import ScriptResult, collect
from workshop.script_mode.spec import ScriptSpec

# --------------------------------------------------------------------------- what cannot be simulated


def _installed(name: str) -> str | None:
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(name)
    return None


def environment_note(image: str | None) -> str:
    """The image is never pulled: what every host runs instead."""
    frameworks = ", ".join(f"{n} {v}" for n in ("torch", "tensorflow", "horovod") if (v := _installed(n)))
    which = f"image {image}" if image else "the training image"
    return (f"{which} is not pulled: every host runs this environment's Python {sys.version.split()[0]}"
            + (f" and its packages ({frameworks})" if frameworks else ""))


def gpu_note(instance_type: str, gpus: int, procs_from_gpus: bool) -> str:
    return (f"{instance_type}'s {gpus} GPU(s): each host runs on this machine's CPUs (torch.cuda.is_available() is "
            "False, SM_NUM_GPUS=0)" + (f"; {gpus} process(es) per host, one per GPU as on SageMaker" if procs_from_gpus else ""))


def s3_note(channels: Any) -> list[str]:
    """The channels in S3: downloaded with your credentials here, read with the job's role on SageMaker."""
    names = sorted(getattr(channels, "s3_channels", {}) or {})
    return [f"S3 channel(s) {', '.join(names)}: downloaded with your AWS credentials into the data folder before the "
            "hosts start (SageMaker's instances read them with the job's role)"] if names else []


def runtime_note() -> str | None:
    runtime, why = choose_runtime("auto")
    if runtime == "container":
        return None
    return (f"the hosts' /opt/ml ({why}: the process runtime): the SM_* variables point into each host's folder "
            "of the run, and a script that hard-codes /opt/ml paths fails here")


def say_notes(notes: list[str], echo: bool) -> None:
    if echo and notes:
        print("not simulated here: " + "; ".join(n.rstrip(".") for n in notes) + ".", flush=True)


# --------------------------------------------------------------------------- running it locally


@dataclass
class LocalJob:
    """Everything a local run of a script needs, settled and checked."""

    spec: ScriptSpec
    hosts: int
    procs_per_host: int
    hyperparameters: dict[str, Any]
    notes: list[str]  # what cannot be simulated, said in one line before anything starts
    warnings: list[str] = field(default_factory=list)  # what SageMaker would refuse of a Docker-mode trainer
    cluster_options: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None
    source_code: Any = None  # the SDK SourceCode when it has a command= (its sm_train.sh runs it)
    skip_imports: tuple[str, ...] = ()


def local_checks(job: LocalJob, notes: list[str], echo: bool) -> Callable[[Any], None]:
    """What only this machine can tell, before anything starts (`Lab.local_check`: after the hyperparameters'
    checks, before the cluster is built): the requirements file, then the imports (what the file does not
    name, or a script without one); then the line that says what is not simulated."""

    def check(_args: Any) -> None:
        source = job.spec.source_dir
        if job.spec.requirements:
            unchecked = check_requirements(source / job.spec.requirements)
            if unchecked:
                notes.append(f"{job.spec.requirements}'s lines {', '.join(unchecked)} (not checked against this "
                             "environment)")
        entry = job.spec.entry_script
        if job.source_code is not None and getattr(job.source_code, "command", None):
            entry = command_entry(job.source_code.command, source) or entry
        check_imports(source, entry, skip=job.skip_imports)
        say_notes(notes, echo)
        for line in job.warnings if echo else ():
            print(line, flush=True)

    return check


def command_entry(command: str, source_dir: Path) -> str | None:
    """The first word of a `SourceCode(command=...)` that is a file of `source_dir` (`python train.py ...` -> train.py)."""
    for word in shlex.split(command):
        if (Path(source_dir) / word).is_file():
            return word
    return None


def run_job(job: LocalJob, *, workdir: str | Path | None = None, runs_dir: str | Path | None = None,
            data_dir: str | Path | None = None, checkpoint_dir: str | Path | None = None, max_restarts: int = 0,
            echo: bool = True, verbose: bool = False, stall_s: float | None = STALL_S, check: bool = True) -> ScriptResult:
    """Run a settled `LocalJob` with `workshop.runner.run_local`; the notes line first, the archives after."""
    from workshop.runner import run_local

    least = getattr(job.spec.launcher, "min_hosts", 1)
    if job.hosts < least:
        raise WorkshopError(f"A {job.spec.launcher.name} job needs at least {least} hosts, got {job.hosts} (SageMaker "
                            "refuses it too): one coordinator and at least one worker.",
                            f"pass --hosts {least} or more (Compute(instance_count={least})).")
    runtime = runtime_note()
    notes = job.notes + ([runtime] if runtime else [])
    spec = dataclasses.replace(job.spec, local_check=local_checks(job, notes, echo))
    with tempfile.TemporaryDirectory(prefix="workshop-sm-drivers-") as tmp:
        options = dict(job.cluster_options)
        if job.source_code is not None and getattr(job.source_code, "command", None):
            if runtime:
                raise WorkshopError("SourceCode(command=...) runs on the local cluster only in its container runtime, "
                                    f"which this machine does not allow ({choose_runtime('auto')[1]}).",
                                    "use entry_script= (and hyperparameters) instead of command=, or run it on Linux "
                                    "with unprivileged user namespaces.")
            from workshop.runtime.contract import write_sm_drivers

            distributed = spec.distributed_config(job.procs_per_host, max_restarts=max_restarts)
            options["sm_drivers_dir"] = write_sm_drivers(Path(tmp) / "sm_drivers", spec.source_dir, spec.entry_script,
                                                         distributed, source_code=job.source_code)
        cluster = run_local(spec, hosts=job.hosts, procs_per_host=job.procs_per_host, hyperparameters=job.hyperparameters,
                            data_dir=data_dir, workdir=workdir, checkpoint_dir=checkpoint_dir, runs_dir=runs_dir,
                            timeout_s=job.timeout_s, echo=echo, check=False, max_restarts=max_restarts, verbose=verbose,
                            stall_s=stall_s, cluster_options=options)
    result = collect(cluster, notes, echo=echo)
    if check:
        cluster.check()
    return result
