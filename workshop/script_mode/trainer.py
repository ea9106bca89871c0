"""An SDK v3 `ModelTrainer` read into a local job (`trainer_job`), and `train_locally`: every setting that shapes
the job taken as SageMaker takes it, refused where SageMaker would refuse it, and a note for each that cannot be
simulated here. The trainer itself is never changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workshop.datasets.local import GivenChannels
from workshop.errors import WorkshopError
from workshop.horovod_build import check_installed
from workshop.jobs.checks import (
    check_hyperparameters,
    check_request_fields,
    gpus_per_instance,
    is_gpu_instance,
)
from workshop.launchers.base import LauncherBase
from workshop.launchers.basic import NoLauncher
from workshop.runtime.progress import STALL_S
from workshop.script_mode.checks import read_framework
from workshop.script_mode.local import (
    LocalJob,
    command_entry,
    environment_note,
    gpu_note,
    run_job,
    s3_note,
)
from workshop.script_mode.result import ScriptResult
from workshop.script_mode.spec import DEFAULT_INSTANCE_TYPE, IMAGES, script_spec
from workshop.spec import Lab


class GivenLauncher(LauncherBase):
    """A trainer's own `distributed=` object, run as it is on every host (its processes per host settled)."""

    def __init__(self, config: Any):
        self.config = config
        self.min_hosts = 2 if type(config).__name__ == "ParameterServer" else 1
        self.name = {"Torchrun": "torchrun", "Horovod": "horovod", "ParameterServer": "parameter_server",
                     "ElasticTorchrun": "torchrun"}.get(type(config).__name__, type(config).__name__) if config else "none"

    def local_config(self, lab: Lab, procs_per_host: int | None) -> Any:
        config = self.config
        if config is None:
            return NoLauncher().local_config(lab, procs_per_host)
        if type(config).__name__ == "Horovod":
            check_installed(config.framework)  # before anything starts: a missing build says how to get one
        if "process_count_per_node" in type(config).model_fields and config.process_count_per_node != procs_per_host \
                and type(config).__name__ != "ParameterServer":
            config = config.model_copy(update={"process_count_per_node": procs_per_host})
        return config

    def sagemaker_config(self, plan: Any) -> Any:
        return self.config


def _channel_sources(trainer: Any) -> dict[str, Any]:
    """The trainer's input channels, name -> what `GivenChannels` takes (a path, file:// or s3:// URI)."""
    out: dict[str, Any] = {}
    for channel in trainer.input_data_config or []:
        name = getattr(channel, "channel_name", None)
        source = getattr(channel, "data_source", None)
        if isinstance(source, str):
            out[name] = source
            continue
        s3_uri = getattr(source, "s3_uri", None) or getattr(getattr(source, "s3_data_source", None), "s3_uri", None)
        if s3_uri:
            out[name] = s3_uri
            continue
        raise WorkshopError(f"Channel {name!r}: {type(source).__name__} data sources are not simulated here.",
                            "pass the channel as a local folder or file, a file:// URI or an s3:// URI "
                            "(InputData(channel_name=..., data_source=...)).")
    return out


def trainer_job(trainer: Any, *, data_dir: str | Path | None = None) -> LocalJob:
    """Read a `ModelTrainer` into a `LocalJob`: every setting that shapes the job, refused where SageMaker
    would refuse it, and a note for each that cannot be simulated here."""
    from sagemaker.train.model_trainer import Mode

    on_sagemaker = getattr(trainer, "training_mode", None) != Mode.LOCAL_CONTAINER
    code = trainer.source_code
    if code is None or not code.source_dir:
        raise WorkshopError("train_locally runs a trainer's SourceCode, and this one has no source_dir.",
                            "pass source_code=SourceCode(source_dir='code', entry_script='train.py') (a folder here).")
    if str(code.source_dir).startswith("s3://") or str(code.source_dir).endswith(".tar.gz"):
        raise WorkshopError(f"source_dir={code.source_dir!r}: train_locally runs a folder on this machine.",
                            "pass the unpacked folder as source_dir (the same object then runs on SageMaker too).")
    entry = code.entry_script or command_entry(code.command or "", Path(code.source_dir))
    if not entry:
        raise WorkshopError(f"SourceCode(command={code.command!r}) names no file of {code.source_dir}.",
                            "name the script by its path in source_dir, e.g. command='python train.py'.")
    compute = trainer.compute
    if getattr(compute, "instance_groups", None):
        raise WorkshopError("Heterogeneous clusters (Compute(instance_groups=...)) are not simulated here.",
                            "pass instance_type= and instance_count= for train_locally.")
    instance_type = compute.instance_type or DEFAULT_INSTANCE_TYPE
    count = compute.instance_count or 1
    config = trainer.distributed
    kind = type(config).__name__ if config is not None else None
    if kind == "MPI":
        raise WorkshopError("SDK v3's MPI() is not simulated: its driver passes the per-host process count as mpirun's "
                            "-np (two hosts of four get 4 ranks, not 8) and needs sshd between the hosts.",
                            "use the workshop's Horovod config (workshop.launchers.horovod.Horovod), which runs the same "
                            "script with the right rank count, here and on SageMaker.")
    notes: list[str] = []
    warnings: list[str] = []
    gpus = gpus_per_instance(instance_type) if instance_type.startswith("ml.") and is_gpu_instance(instance_type) else 0
    given = getattr(config, "process_count_per_node", None) if config is not None else None
    procs = given or (gpus if gpus and kind in ("Torchrun", "Horovod", "ElasticTorchrun") else 1)
    if kind == "ParameterServer":
        procs = 1
    if gpus:
        notes.append(gpu_note(instance_type, gpus, procs_from_gpus=not given and procs == gpus and kind is not None))
    notes.append(environment_note(trainer.training_image))
    hyperparameters = dict(trainer.hyperparameters or {})
    smp = getattr(config, "smp", None)
    if smp is not None:
        hyperparameters.update(smp._to_mp_hyperparameters())  # noqa: SLF001 - what ModelTrainer adds to the request
        notes.append("SMP (Torchrun(smp=...)): the SMP library (torch.sagemaker) is not installed here; its settings "
                     "reach the script as the mp_parameters hyperparameter only")
    networking = trainer.networking
    internet = not (networking and (networking.enable_network_isolation or networking.subnets))
    if networking and networking.subnets:
        notes.append("the VPC subnets: the hosts get a private network without internet (a NAT route is not simulated)")
    checkpoint = trainer.checkpoint_config
    if checkpoint is not None and checkpoint.s3_uri:
        notes.append(f"the checkpoint S3 URI {checkpoint.s3_uri} (pass checkpoint_dir= for its local stand-in)")
    if checkpoint is not None and checkpoint.local_path and checkpoint.local_path.rstrip("/") != "/opt/ml/checkpoints":
        notes.append(f"the checkpoint folder {checkpoint.local_path}: each host's is /opt/ml/checkpoints (SM_CHECKPOINT_DIR)")
    # What CreateTrainingJob would refuse: refused for a trainer meant for SageMaker, said for a Docker one.
    problem = request_problems(trainer)
    if problem is not None and on_sagemaker:
        raise problem
    if problem is not None:  # Mode.LOCAL_CONTAINER: the SDK sends nothing, but the same object would be refused
        warnings.append(f"on SageMaker: {problem}")
    check_hyperparameters(hyperparameters)  # sm_train.sh could not deliver them, whatever the mode
    sources = _channel_sources(trainer)
    channels = GivenChannels(sources, default_dir=data_dir)
    notes += s3_note(channels)
    launcher = GivenLauncher(config) if config is not None else NoLauncher()
    framework = getattr(config, "framework", None) or read_framework(Path(code.source_dir) / entry)
    spec = script_spec(code.source_dir, entry, launcher=launcher, channels=channels,
                       environment={str(k): str(v) for k, v in (trainer.environment or {}).items()},
                       framework=framework if framework in IMAGES else "pytorch",
                       instance_type=instance_type if instance_type.startswith("ml.") else DEFAULT_INSTANCE_TYPE,
                       instance_count=count, procs_per_host=procs, requirements=code.requirements)
    stop = trainer.stopping_condition
    options = {"instance_type": instance_type if instance_type.startswith("ml.") else None, "internet": internet}
    return LocalJob(spec=spec, hosts=count, procs_per_host=procs, hyperparameters=hyperparameters, notes=notes,
                    warnings=warnings, cluster_options=options, timeout_s=getattr(stop, "max_runtime_in_seconds", None),
                    source_code=code if code.command else None,
                    skip_imports=("horovod",) if kind == "Horovod" else ())


def request_problems(trainer: Any) -> WorkshopError | None:
    """What CreateTrainingJob would refuse in the trainer's own settings (the job name its base_job_name makes,
    its instance type and count, its environment), as one WorkshopError listing each, or None."""
    from workshop.jobs.checks import training_instance_types

    lines, fixes = [], []
    members = {"TrainingJobName": f"{trainer.base_job_name or 'job'}-{'0' * 14}"[:63],
               "Environment": {str(k): str(v) for k, v in (trainer.environment or {}).items()},
               "ResourceConfig.InstanceCount": trainer.compute.instance_count}
    try:
        check_request_fields(members)
    except WorkshopError as exc:
        lines += [line.strip() for line in exc.message.splitlines()[1:]]
        fixes.append(exc.fix)
    itype = trainer.compute.instance_type
    if itype and itype not in training_instance_types():
        lines.append(f"InstanceType = {itype!r}: not a SageMaker training instance type")
        fixes.append("use one of the ml. types, e.g. Compute(instance_type='ml.m5.xlarge')")
    if not lines:
        return None
    return WorkshopError("CreateTrainingJob would refuse this trainer's job: " + "; ".join(lines) + ".",
                         "; ".join(f.rstrip(".") for f in fixes) + ".")


def train_locally(trainer: Any, *, workdir: str | Path | None = None, runs_dir: str | Path | None = None,
                  data_dir: str | Path | None = None, checkpoint_dir: str | Path | None = None, echo: bool = True,
                  verbose: bool = False, stall_s: float | None = STALL_S, timeout_s: float | None = None,
                  check: bool = True) -> ScriptResult:
    """Run an SDK v3 `ModelTrainer`'s job on the local cluster, no Docker: each instance a simulated host.

    The trainer is built exactly as for SageMaker (`Mode.SAGEMAKER_TRAINING_JOB`, or the SDK's Docker-based
    `Mode.LOCAL_CONTAINER`): its `SourceCode` (source_dir with entry_script, or command; requirements, which must
    be installed here already), `Compute` (instance_count hosts; instance_type is what they say they are),
    `distributed` (`Torchrun`, the workshop's `Horovod` or `ParameterServer`, or none: the entry once per host),
    `hyperparameters`, `environment`, `input_data_config` (local folders or files, `file://` or `s3://` URIs,
    downloaded with your credentials) and `stopping_condition` (the run's time limit, unless `timeout_s`). The
    trainer is not changed: `trainer.train()` then submits the same job to SageMaker.

    `workdir`: this run's folder (default: a new one under `runs_dir`, the checkout's runs/); `data_dir`: where
    S3 channels are downloaded and file channels get their folders (default data/); `checkpoint_dir`: the
    checkpoint S3 URI's local stand-in (see `workshop.runner.run_local`); `echo`, `verbose`, `stall_s`: as for
    the labs. Returns a `ScriptResult` (the archives, per-host folders, logs, lines, metrics, name clashes);
    with `check`, a failed run raises `workshop.runtime.local_cluster.TrainingFailed` (its `.result` has the logs).
    """
    job = trainer_job(trainer, data_dir=data_dir)
    if timeout_s is not None:
        job.timeout_s = timeout_s
    return run_job(job, workdir=workdir, runs_dir=runs_dir, data_dir=data_dir, checkpoint_dir=checkpoint_dir,
                   echo=echo, verbose=verbose, stall_s=stall_s, check=check)
