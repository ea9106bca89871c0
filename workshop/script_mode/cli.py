"""`python -m workshop run-script DIR/ENTRY`: a script of your own, on the local cluster or as a SageMaker job
(the `ModelTrainer` you would write by hand, through `workshop.runner.run_on_sagemaker`: preflight, cost bound and
confirmation, dry run). `workshop.__main__` adds the command and hands it its arguments."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from workshop.datasets.local import GivenChannels
from workshop.errors import WorkshopError
from workshop.launchers.basic import NoLauncher
from workshop.launchers.horovod import HorovodLauncher
from workshop.launchers.parameter_server import ParameterServerLauncher
from workshop.launchers.torchrun import TorchrunLauncher
from workshop.script_mode.checks import read_framework
from workshop.script_mode.local import LocalJob, environment_note, run_job, s3_note
from workshop.script_mode.spec import (
    DEFAULT_INSTANCE_TYPE,
    IMAGES,
    LAUNCHERS,
    ScriptSpec,
    script_spec,
)


def _pairs(items: list[str], flag: str, example: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise WorkshopError(f"{flag} {item!r} is not NAME=VALUE.", f"write it like {flag} {example}.")
        out[key] = value
    return out


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default where it has one; none where the help says what it is (None: worked out)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, [], False):
            return action.help
        return super()._get_help_string(action)


def add_parser(sub: Any, run: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `run-script` command: its own options, and those of `run` that a script's job takes too."""
    p = sub.add_parser(
        "run-script", help="run a training script of your own, unchanged (docs/your-script.md)",
        description="Run a training script the workshop did not write on the local cluster (each host simulated, "
                    "no Docker), or as a SageMaker job: the ModelTrainer you would write by hand. See docs/your-script.md.",
        formatter_class=_Help)
    p.add_argument("entry", metavar="DIR/ENTRY", help="your entry script; its folder is the job's source_dir, uploaded as is")
    p.add_argument("--launcher", choices=LAUNCHERS, default="none",
                   help="torchrun: SDK v3's Torchrun(); horovod, parameter-server: the workshop's Horovod and "
                        "ParameterServer configs; none: the entry once per host, as SageMaker runs it without distributed=")
    p.add_argument("--hosts", type=int, default=None, help="hosts (SageMaker instances); default 2, 1 with --launcher none")
    p.add_argument("--procs-per-host", type=int, default=None,
                   help="training processes per host (torchrun, horovod); default 1 (on SageMaker: one per GPU)")
    p.add_argument("--channel", action="append", default=[], metavar="NAME=PATH",
                   help="an input channel (repeatable): a local folder or file, or an s3:// URI; the script finds it "
                        "in /opt/ml/input/data/NAME (SM_CHANNEL_NAME)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable of every process (repeatable; ModelTrainer(environment=...))")
    p.add_argument("--framework", choices=tuple(IMAGES), default=None,
                   help="what the script uses (Horovod's extension, the SageMaker image); default: read from its imports")
    p.add_argument("--requirements", default=None, metavar="FILE",
                   help="a requirements file in DIR that the SageMaker job installs (locally it must be installed "
                        "already); default: DIR/requirements.txt when there is one")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="where S3 channels are downloaded and file channels get their folders (default data/; with "
                        "--workdir, DIR/data)")
    p.add_argument("--instance-type", default=None, help=f"sagemaker mode: instance type (default {DEFAULT_INSTANCE_TYPE})")
    p.add_argument("--image", default=None, metavar="URI",
                   help="sagemaker mode: your training image (default: the framework's SageMaker image, "
                        "pytorch-amzn2023 2.13 or tensorflow 2.21)")
    p.add_argument("--max-run", type=int, default=3600, metavar="SECONDS",
                   help="sagemaker mode: SageMaker stops (and stops billing) the job after this")
    taken = {a.dest for a in p._actions}
    for action in run._actions:
        if action.option_strings and action.dest not in taken | {"help", "route", "data_dir"}:
            p._add_action(action)
    return p


def command(args: argparse.Namespace, hps: dict[str, Any], confirm: Any) -> int:
    """`python -m workshop run-script`: the script's job on the local cluster, or on SageMaker."""
    entry = Path(args.entry)
    env = _pairs(args.env, "--env", "KEY=VALUE")
    channels = GivenChannels(_pairs(args.channel, "--channel", "train=data/train"),
                             default_dir=args.data_dir or (Path(args.workdir) / "data" if args.workdir else None))
    source = entry.parent if str(entry.parent) else Path(".")
    hosts = args.hosts if args.hosts is not None else (1 if args.launcher == "none" else 2)
    for value, flag in ((hosts, "--hosts"), (args.procs_per_host, "--procs-per-host")):
        if value is not None and value < 1:
            raise WorkshopError(f"{flag} {value} is not a number of at least 1.", f"write it like {flag} 2.")
    if not (source / entry.name).is_file():
        script_spec(source, entry.name, launcher=NoLauncher(), channels=channels)  # says what is there
    framework = args.framework or read_framework(source / entry.name)
    launcher = {"torchrun": TorchrunLauncher(), "horovod": HorovodLauncher(framework),
                "parameter-server": ParameterServerLauncher(), "none": NoLauncher()}[args.launcher]
    requirements = args.requirements
    if requirements is None and (source / "requirements.txt").is_file():
        requirements = "requirements.txt"
    spec = script_spec(source, entry.name, launcher=launcher, channels=channels, environment=env, framework=framework,
                       instance_type=args.instance_type or DEFAULT_INSTANCE_TYPE, instance_count=hosts,
                       procs_per_host=args.procs_per_host or (None if args.mode == "sagemaker" else 1),
                       requirements=requirements, max_run_s=args.max_run)
    if args.fault:
        flags = spec.script_parser() if spec.has_parser else None
        if flags is None or not any("--fault" in a.option_strings for a in flags._actions):
            raise WorkshopError(
                "--fault passes the script a --fault kill-rank=R@step=S flag, and your script has no such flag: the "
                "workshop's faults are injected by the labs' scripts themselves (3_data_parallel/code/fault_tolerance.py).",
                "drop --fault, or give the script a --fault flag in its build_parser() that kills the rank it names.")
        hps = {**hps, "fault": args.fault}
    if args.mode == "local":
        return _local(args, spec, hosts, hps)
    return _sagemaker(args, spec, hosts, hps, confirm)


def _local(args: argparse.Namespace, spec: ScriptSpec, hosts: int, hps: dict[str, Any]) -> int:
    sagemaker_only = [flag for flag, value in (
        ("--dry-run", args.dry_run), ("--spot", args.spot), ("--max-wait", args.max_wait is not None),
        ("--instance-type", args.instance_type), ("--image", args.image), ("--role", args.role),
        ("--region", args.region), ("--create-role", args.create_role), ("--network", args.network != "none"),
        ("--allow-unsupported-image", args.allow_unsupported_image)) if value]
    if sagemaker_only:
        raise WorkshopError(f"{', '.join(sagemaker_only)} appl{'ies' if len(sagemaker_only) == 1 else 'y'} to "
                            "--mode sagemaker.", "drop them, or add --mode sagemaker.")
    notes = [environment_note(None), *s3_note(spec.data)]
    job = LocalJob(spec=spec, hosts=hosts, procs_per_host=args.procs_per_host or 1, hyperparameters=hps, notes=notes,
                   cluster_options={"internet": True},
                   skip_imports=("horovod",) if spec.launcher.name == "horovod" else ())
    result = run_job(job, runs_dir=Path(args.workdir) / "runs" if args.workdir else None,
                     data_dir=args.data_dir or (Path(args.workdir) / "data" if args.workdir else None),
                     checkpoint_dir=args.checkpoint_dir, max_restarts=args.max_restarts, verbose=args.verbose,
                     stall_s=args.stall_after)
    return 0 if result.ok else 1


def _sagemaker(args: argparse.Namespace, spec: ScriptSpec, hosts: int, hps: dict[str, Any], confirm: Any) -> int:
    from workshop.runner import run_on_sagemaker

    if args.checkpoint_dir:
        raise WorkshopError("--checkpoint-dir applies to --mode local: a SageMaker job's checkpoints go to S3.",
                            "drop --checkpoint-dir.")
    result = run_on_sagemaker(
        spec, hosts=hosts, procs_per_host=args.procs_per_host, hyperparameters=hps, data_dir=args.data_dir,
        instance_type=args.instance_type, image_uri=args.image, dry_run=args.dry_run, role=args.role,
        region=args.region, network=False if args.network == "none" else args.network, create_role=args.create_role,
        allow_unsupported_image=args.allow_unsupported_image, max_restarts=args.max_restarts, spot=args.spot,
        max_wait_s=args.max_wait, max_run_s=args.max_run, confirm_cost=confirm)
    return 0 if args.dry_run or getattr(result, "ok", True) else 1
