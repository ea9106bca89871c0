"""The workshop's command line.

    python -m workshop labs
    python -m workshop run LAB [--hosts N] [--procs-per-host P] [--mode local|sagemaker]
                               [--dry-run] [--hp KEY=VALUE ...] [--route ROUTE]
                               [--allow-unsupported-image] [--workdir DIR] [--checkpoint-dir DIR]
                               [--max-restarts K] [--fault kill-rank=R@step=S] [--spot [--max-wait S]] [--yes]
                               [--verbose] [--stall-after SECONDS]
    python -m workshop run all            # every lab, locally, then a summary table
    python -m workshop run-script DIR/ENTRY [--launcher torchrun|horovod|parameter-server|none] [--hosts N]
                               [--channel NAME=PATH ...] [--hp KEY=VALUE ...] [--env KEY=VALUE ...]
                               [--mode sagemaker [--dry-run] [--image URI] ...]   # your own script, unchanged
    python -m workshop tune LAB --param lr=0.01,0.02,0.04 [--param batch-size=32,64] [--trials N]
                                [--parallel K] [--mode local|sagemaker] [--dry-run] [--hp KEY=VALUE ...] [--yes]
    python -m workshop profile LAB [--hosts N] [--procs-per-host P] [--steps S] [--hp KEY=VALUE ...]
                             [--mode sagemaker [--yes] [--instance-type T] ...]
                                                                # where each rank's step time goes
    python -m workshop network [--nat] [--show] [--cidr CIDR] [--yes]   # the workshop VPC (create/reuse)
    python -m workshop role                                     # the workshop's execution role
    python -m workshop cleanup [--delete-s3]                    # stop jobs, delete network/role
    python -m workshop event template|preflight|data|cleanup ... # an organizer's room (workshop.event)
    python -m workshop horovod [--wait] | start | build | publish DEST   # lab 2's Horovod build (status, wait)

`run all` in local mode is the workshop's main job (`make workshop`). Whatever costs money (a
SageMaker job or tuning job, the workshop network) prints its cost bound first and starts only
once confirmed: on a terminal it asks; `--yes` (or WORKSHOP_CONFIRM_COST=1) confirms up front;
without either, elsewhere, it stops with exit status 2 and creates nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workshop.errors import WorkshopError
from workshop.jobs.submit import StillRunning
from workshop.labs import LABS, Lab, get_labs
from workshop.metrics import state_lines
from workshop.runtime.processes import Stopped, Terminated, sigterm_as_interrupt
from workshop.runtime.progress import STALL_S
from workshop.spec import given_as


def parse_hp(items: list[str]) -> dict[str, Any]:
    """`["epochs=3", "lr=0.1"]` -> `{"epochs": 3, "lr": 0.1}` (JSON where it parses, else text)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise WorkshopError(f"--hp {item!r} is not KEY=VALUE.", "write it like --hp epochs=3.")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def count_of(what: str, flag: str, example: int):
    """An argparse type for `flag`: a whole number of at least 1, else a message that ends with
    its fix (argparse alone says only "invalid int value")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number of {what} (a whole number, at least 1).\n"
                f"  Fix: write it like {flag} {example}, or leave {flag} out for the lab's default "
                "(`python -m workshop labs` lists them)."
            )
        return value

    return parse


def seconds_of(flag: str, example: int):
    """An argparse type for `flag`: a number of seconds, 0 or more (0: never), else a message that
    ends with its fix."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0:  # NaN too
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number of seconds (0 or more).\n"
                f"  Fix: write it like {flag} {example}, or {flag} 0 to turn it off."
            )
        return value

    return parse


def local_data_dir(lab: Lab, args: argparse.Namespace):
    """--data-dir if given; else with --workdir DIR the lab's data folder under DIR/data (as the
    checkout has it under data/: mnist/, or lab 4's corpus/), so that nothing is written into
    the checkout; else None (the checkout's data/)."""
    if args.data_dir or not args.workdir:
        return args.data_dir
    return Path(args.workdir) / "data" / Path(lab.data.default_dir).name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workshop", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("labs", help="list the labs and their defaults")
    run = sub.add_parser("run", help="run a lab (or all) headless", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run.add_argument("lab", help="lab key, folder or number (see `labs`), or 'all'")
    run.add_argument("--hosts", type=count_of("hosts", "--hosts", 2), default=None,
                     help="hosts (SageMaker instances); default: the lab's")
    run.add_argument("--procs-per-host", type=count_of("processes per host", "--procs-per-host", 1), default=None,
                     help="processes per host; default: the lab's")
    run.add_argument("--mode", choices=("local", "sagemaker"), default="local", help="where to run")
    run.add_argument("--dry-run", action="store_true", help="sagemaker mode: print the CreateTrainingJob request, start nothing")
    run.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="a hyperparameter (repeatable)")
    run.add_argument("--data-dir", default=None,
                     help="the lab's data folder (default: data/mnist, lab 4 data/corpus; with --workdir, under DIR/data)")
    run.add_argument("--workdir", default=None, metavar="DIR",
                     help="where everything a local run writes goes: its run folders in DIR/runs, its data "
                          "(unless --data-dir) in DIR/data (default: the checkout's runs/ and data/)")
    run.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                     help="local mode: the checkpoint S3 URI's stand-in: each host's own checkpoint folder "
                          "(/opt/ml/checkpoints) starts with its files and syncs with it as SageMaker syncs S3, so a "
                          "run stopped any way keeps its checkpoints there and the next run resumes from them "
                          "(several labs: one subfolder per lab)")
    run.add_argument("--max-restarts", type=int, default=0, metavar="K",
                     help="restart every rank up to K times after a failure, resuming from the latest checkpoint "
                          "(torchrun's elastic agent; labs 3 and 4)")
    run.add_argument("--verbose", action="store_true",
                     help="local mode: stream every rank's log lines instead of one progress display per job")
    run.add_argument("--stall-after", type=seconds_of("--stall-after", 120), default=STALL_S, metavar="SECONDS",
                     help="local mode: when no rank has written a line for this long, say the job stalls, with "
                          "each rank's last line and the rank that stopped answering (0: never)")
    run.add_argument("--fault", default=None, metavar="kill-rank=R@step=S",
                     help="fault injection: kill rank R right after step S, once (the script's --fault; "
                          "with --max-restarts the job recovers)")
    run.add_argument("--spot", action="store_true",
                     help="sagemaker mode: managed spot training (cheaper; SageMaker may interrupt the job and "
                          "restart it, which resumes from its checkpoint in S3)")
    run.add_argument("--max-wait", type=int, default=None, metavar="SECONDS",
                     help="sagemaker mode, with --spot: the job's whole time, waiting for capacity included "
                          "(at least its max run; default twice it)")
    run.add_argument("--instance-type", default=None, help="sagemaker mode: instance type; default: the lab's")
    run.add_argument("--role", default=None, help="sagemaker mode: execution role ARN (or set WORKSHOP_ROLE_ARN)")
    run.add_argument("--region", default=None, help="sagemaker mode: AWS region (default: your AWS config's)")
    run.add_argument("--network", choices=("none", "endpoints", "nat"), default="none",
                     help="sagemaker mode: run in the workshop VPC, reaching AWS through interface endpoints or a NAT gateway")
    run.add_argument("--create-role", action="store_true", help="sagemaker mode: create/reuse the workshop's execution role")
    run.add_argument("--route", default=None,
                     help="the lab's SageMaker route (lab 4: fsdp; deepspeed, DeepSpeed ZeRO, installed at the job's "
                     "start; smp, the SMP v2 image, opt-in); default: the lab's first. Locally, a route that sets "
                     "script flags runs with them (lab 4's deepspeed: --hp sharding=zero1|zero2|zero3|zero3_offload)")
    run.add_argument("--yes", "-y", action="store_true",
                     help="sagemaker mode: start without asking, having read the cost bound (default: ask on a "
                          "terminal, refuse elsewhere; WORKSHOP_CONFIRM_COST=1 confirms too)")
    run.add_argument("--allow-unsupported-image", action="store_true",
                     help="sagemaker mode: run a framework image past its end of patch anyway (smddp, lab 4's SMP route)")
    tune = sub.add_parser("tune", help="a hyperparameter search: many independent trials (job parallelism)")
    tune.add_argument("lab", help="lab key, folder or number (see `labs`)")
    tune.add_argument("--param", action="append", default=[], metavar="NAME=VALUES", required=True,
                      help="a searched hyperparameter (repeatable): a list NAME=A,B,C (a grid), or a range "
                           "NAME=LOW:HIGH or NAME=LOW:HIGH:log (random draws; needs --trials)")
    tune.add_argument("--trials", type=count_of("trials", "--trials", 4), default=None,
                      help="random draws instead of the whole grid (default: the whole grid)")
    tune.add_argument("--parallel", type=int, default=None, metavar="K",
                      help="trials at once (default: local, this machine's cores per trial's processes; SageMaker, 2)")
    tune.add_argument("--objective", default=None, metavar="METRIC[:max|min]",
                      help="the metric trials are ranked by (default: the lab's accuracy, maximized)")
    tune.add_argument("--seed", type=int, default=0, help="seed of the random draws")
    tune.add_argument("--no-plot", action="store_true", help="local mode: do not write the plot")
    for action in run._actions:  # the run command's options, except those a search does not take
        # --stall-after too: a trial runs without a display, so it would say nothing.
        if action.dest in ("help", "lab", "checkpoint_dir", "max_restarts", "fault", "spot", "max_wait", "stall_after") \
                or not action.option_strings:
            continue
        tune._add_action(action)
    prof = sub.add_parser("profile", help="run a lab under torch.profiler: where each rank's step time goes",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    prof.add_argument("lab", help="lab key, folder or number (see `labs`)")
    prof.add_argument("--steps", type=count_of("steps", "--steps", 5), default=5,
                      help="profiled steps on every rank (after the script's warm-up steps)")
    for action in run._actions:  # the run command's local options
        if action.dest in ("hosts", "procs_per_host", "hp", "data_dir", "workdir", "verbose", "stall_after", "mode",
                           "instance_type", "role", "region", "create_role", "route", "yes", "allow_unsupported_image"):
            prof._add_action(action)
    net = sub.add_parser("network", help="create or reuse (or --show) your workshop VPC")
    net.add_argument("--nat", action="store_true", help="a NAT gateway instead of interface endpoints (reaches PyPI)")
    net.add_argument("--show", action="store_true", help="only say whether it exists; create nothing")
    net.add_argument("--cidr", default=None, help="the VPC's CIDR block (default 10.87.0.0/16, or the first free 10.N.0.0/16)")
    net.add_argument("--yes", "-y", action="store_true",
                     help="create it without asking (it costs per hour while it exists)")
    net.add_argument("--region", default=None)
    role = sub.add_parser("role", help="create or reuse your workshop SageMaker execution role")
    role.add_argument("--region", default=None)
    from workshop import horovod_build

    horovod_build.build_parser(sub.add_parser(
        "horovod", help="lab 2's Horovod: its background build's status (--wait: wait for it), start, build, "
                        "publish DEST (a room's wheelhouse)", description=horovod_build.__doc__.split("\n\n")[0]))
    clean = sub.add_parser("cleanup", help="stop your running workshop jobs, delete your workshop network and role")
    clean.add_argument("--delete-s3", action="store_true", help="also delete your workshop objects in S3")
    clean.add_argument("--region", default=None)
    from workshop.event import add_parser as add_event_parser

    add_event_parser(sub)
    from workshop.script_mode.cli import add_parser as add_script_parser

    add_script_parser(sub, run)  # run-script: a training script of your own (docs/your-script.md)
    return parser


def cost_confirmation(args: argparse.Namespace) -> bool | Callable[[str], bool]:
    """What confirms a launch's cost: True with --yes; on a terminal, a question, asked once the
    bound is printed; else False, and the launch stops before creating anything (the runner, or
    `require_confirmation`, decides; WORKSHOP_CONFIRM_COST=1 confirms in every case)."""
    if args.yes:
        return True
    if sys.stdin is None or not sys.stdin.isatty():
        return False

    def ask(sentence: str) -> bool:
        try:
            answer = input(f"{sentence}. Start it? [y/N] ")
        except EOFError:
            return False
        return answer.strip().lower() in ("y", "yes")

    return ask


def run_infra(args: argparse.Namespace) -> int:
    from workshop import account
    from workshop.cloud import aws, network

    boto = aws.boto_session(args.region)
    if args.command == "cleanup":
        account.cleanup(boto, delete_s3=args.delete_s3)
        return 0
    aws.require_credentials(boto)
    if args.command == "role":
        info = account.ensure_role(boto)
        print(f"{info.arn} ({'created' if info.created else 'reused'}); use it with --role {info.arn}")
        return 0
    if args.show:
        vpc = network.find_network(boto)
        print(f"workshop network: {vpc or 'none'}")
        return 0
    from workshop.cloud.cost import require_confirmation

    egress = "nat" if args.nat else "endpoints"
    bound = (f"${network.network_hourly_usd(egress):.3f} per hour while it exists, job or not "
             f"({'a NAT gateway' if args.nat else 'interface endpoints'}; `python -m workshop cleanup` deletes it)")
    require_confirmation("the workshop network", bound, cost_confirmation(args))
    net = network.ensure_network(boto, egress=egress, cidr=args.cidr)
    print("\n".join(net.lines()))
    return 0


def run_one(lab: Lab, args: argparse.Namespace, hps: dict[str, Any]):
    # The scripts' checks of a fault given as --fault name that flag, not --hp fault=VALUE.
    with given_as({"fault": "--fault kill-rank=R@step=S"}) if args.fault else contextlib.nullcontext():
        return _run_one(lab, args, hps)


def _run_one(lab: Lab, args: argparse.Namespace, hps: dict[str, Any]):
    from workshop.runner import run_local, run_on_sagemaker

    if args.mode == "local":
        if args.dry_run:
            raise WorkshopError("--dry-run applies to --mode sagemaker.", "drop --dry-run, or add --mode sagemaker.")
        if args.spot or args.max_wait is not None:
            raise WorkshopError("--spot and --max-wait apply to --mode sagemaker: the local cluster has no spot "
                                "instances (kill a rank with --fault to see a recovery).",
                                "drop them, or add --mode sagemaker.")
        result = run_local(
            lab, hosts=args.hosts, procs_per_host=args.procs_per_host, hyperparameters=hps,
            data_dir=local_data_dir(lab, args), checkpoint_dir=args.checkpoint_dir,
            runs_dir=Path(args.workdir) / "runs" if args.workdir else None, max_restarts=args.max_restarts,
            verbose=args.verbose, stall_s=args.stall_after, route=args.route,
        )
        recovery = recovery_line(result.records)
        if recovery:
            print(recovery, flush=True)
        for line in state_lines(result.records):  # lab 4's per-rank accounting, against its theory
            print(line, flush=True)
        return result
    if args.checkpoint_dir:
        raise WorkshopError(
            "--checkpoint-dir applies to --mode local: a SageMaker job's checkpoints go to S3.",
            "drop --checkpoint-dir (in Python, run_on_sagemaker(checkpoint_s3_uri=...) sets the S3 location).",
        )
    defaults = lab.sagemaker_route(args.route)  # an unknown route is refused here, with the lab's routes
    return run_on_sagemaker(
        lab,
        route=args.route,
        hosts=args.hosts or defaults.instance_count,
        procs_per_host=args.procs_per_host or defaults.procs_per_host,
        hyperparameters=hps,
        data_dir=local_data_dir(lab, args),
        instance_type=args.instance_type,
        dry_run=args.dry_run,
        role=args.role,
        region=args.region,
        network=False if args.network == "none" else args.network,
        create_role=args.create_role,
        allow_unsupported_image=args.allow_unsupported_image,
        max_restarts=args.max_restarts,
        spot=args.spot,
        max_wait_s=args.max_wait,
        confirm_cost=cost_confirmation(args),
    )


def recovery_line(records: list[dict[str, Any]]) -> str | None:
    """What a run that resumed from a checkpoint did, from the script's METRICS (`resumed_step`, `restart`,
    `lost_steps`, `recover_s`, `finished`); None for a run that started from scratch.

    A restart after a failure, or a new run over a failed run's checkpoint (what that run lost is known):
    "recovered N time(s): ...". A new run over a checkpoint whose run had already finished: nothing to
    do, said so. A new run continuing a finished shorter one (more epochs): "resumed ...", no recovery."""
    resumed = [r for r in records if "resumed_step" in r and r.get("rank", 0) == 0]
    if not resumed:
        return None
    if len(resumed) == 1 and not resumed[0].get("restart") and resumed[0].get("finished"):
        return (f"nothing to do: the run had already finished at its last checkpoint (step {resumed[0]['resumed_step']}); "
                "its model was evaluated and saved as it is")
    parts = []
    for r in resumed:
        lost = (f", {r['lost_steps']} step(s) redone" if "lost_steps" in r
                else f", at least {r['lost_steps_at_least']} step(s) redone" if "lost_steps_at_least" in r else "")
        took = f", {r['recover_s']:.1f} s from the failure to training again" if "recover_s" in r else ""
        left = ", its last: nothing left to train" if r.get("finished") else ""
        parts.append(f"resumed at step {r['resumed_step']}{lost}{took}{left}")
    failures = [r for r in resumed if r.get("restart") or "lost_steps" in r or "lost_steps_at_least" in r]
    if not failures:  # a new run going on from a finished run's checkpoint: nothing failed
        return "resumed from an earlier run's checkpoint: " + "; ".join(parts)
    return f"recovered {len(failures)} time(s): " + "; ".join(parts)


def run_tune(args: argparse.Namespace, hps: dict[str, Any]) -> int:
    from workshop.labs import get_lab
    from workshop.tuning import tune

    lab = get_lab(args.lab)
    common = dict(trials=args.trials, parallel=args.parallel, mode=args.mode, hyperparameters=hps, hosts=args.hosts,
                  procs_per_host=args.procs_per_host, objective=args.objective, seed=args.seed,
                  data_dir=local_data_dir(lab, args), dry_run=args.dry_run)
    if args.mode == "local":
        sagemaker_only = [flag for flag, value in (("--instance-type", args.instance_type), ("--role", args.role),
                          ("--region", args.region), ("--route", args.route), ("--create-role", args.create_role),
                          ("--network", args.network != "none"),
                          ("--allow-unsupported-image", args.allow_unsupported_image)) if value]
        if sagemaker_only:
            raise WorkshopError(f"{', '.join(sagemaker_only)} apply to --mode sagemaker.",
                                "drop them, or add --mode sagemaker.")
        result = tune(lab, args.param, runs_dir=Path(args.workdir) / "runs" if args.workdir else None,
                      plot=not args.no_plot, **common)
    else:
        result = tune(lab, args.param, route=args.route, instance_type=args.instance_type, role=args.role,
                      region=args.region, network=False if args.network == "none" else args.network,
                      create_role=args.create_role, allow_unsupported_image=args.allow_unsupported_image,
                      confirm_cost=cost_confirmation(args), **common)
    if args.dry_run:
        return 0
    return 0 if result.best is not None and not result.failed else 1


def summary_table(rows: list[dict[str, Any]]) -> str:
    headers = ["lab", "strategy", "hosts x procs", "test accuracy", "wall time", "status"]
    body = [
        [
            r["lab"],
            r["strategy"],
            r["layout"],
            "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}",
            f"{r['wall_s']:.1f} s",
            r["status"],
        ]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *body, strict=True)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def run_all(args: argparse.Namespace, hps: dict[str, Any]) -> int:
    if args.mode != "local":
        raise WorkshopError("`run all` runs every lab locally.", "run one lab at a time with --mode sagemaker.")
    return run_many(list(LABS.values()), args, hps)


def run_many(labs: list[Lab], args: argparse.Namespace, hps: dict[str, Any]) -> int:
    """Run `labs` one after the other (a failure does not stop the rest), then a summary table."""
    if args.mode != "local" and len(labs) > 1:
        raise WorkshopError(
            f"{args.lab!r} is {len(labs)} labs; in sagemaker mode run one job at a time.",
            "name one: " + ", ".join(lab.key for lab in labs) + ".",
        )
    if args.route is not None and len(labs) > 1:
        raise WorkshopError(f"--route {args.route} names one lab's route, and {args.lab!r} is {len(labs)} labs.",
                            "run the lab whose route it is on its own, e.g. `python -m workshop run model_parallel "
                            f"--route {args.route}`, or drop --route.")
    # Labs whose local runs need what the set-up still builds in the background (lab 2's Horovod)
    # run last, each once it is ready: the others need not wait for it.
    pending = {lab.key: lab.launcher.local_setup_pending() for lab in labs} if args.mode == "local" else {}
    later = [lab for lab in labs if pending.get(lab.key)]
    if later:
        now = [lab for lab in labs if lab not in later]
        print(f"{next(filter(None, pending.values()))}: running "
              + (", ".join(lab.label for lab in now) + " first, then " if now else "")
              + ", ".join(lab.label for lab in later) + " once it is ready", flush=True)
    rows, failed = {}, 0
    for lab in [lab for lab in labs if lab not in later] + later:
        print(f"\n=== {lab.label}: {lab.title} ===", flush=True)
        t0 = time.monotonic()
        hosts = args.hosts or lab.local_hosts
        procs = args.procs_per_host or lab.local_procs_per_host
        row = {"lab": lab.label, "strategy": lab.strategy, "layout": f"{hosts} x {procs}", "accuracy": None}
        lab_args = args
        if args.checkpoint_dir and len(labs) > 1:  # one folder per lab: their checkpoints do not mix
            lab_args = argparse.Namespace(**{**vars(args), "checkpoint_dir": str(Path(args.checkpoint_dir) / lab.key)})
        try:
            if lab in later:
                lab.launcher.wait_for_local_setup(lambda line: print(line, flush=True))
                t0 = time.monotonic()  # the lab's wall time, not the wait's
            result = run_one(lab, lab_args, hps)
            row.update(accuracy=result.metric(lab.accuracy_metric), wall_s=result.wall_time_s, status="ok")
        except WorkshopError as exc:
            failed += 1
            print(f"error: {exc}", file=sys.stderr, flush=True)
            row.update(wall_s=time.monotonic() - t0, status="FAILED")
        rows[lab.key] = row
    print("\nSummary (local mode)\n" + summary_table([rows[lab.key] for lab in labs]), flush=True)
    return 1 if failed else 0


def check_fault_labs(labs: list[Lab]) -> None:
    """Refuse --fault for a lab whose script cannot inject one (it has no --fault flag), before anything
    starts: argparse's "unrecognized arguments" would not say which labs can."""
    from workshop.search import script_flags

    without = [lab for lab in labs if "fault" not in script_flags(lab)]
    if not without:
        return
    able = [lab for lab in LABS.values() if "fault" in script_flags(lab)]
    names = " and ".join(f"{lab.key} ({lab.label})" for lab in able) or "no lab"
    example = able[0].key if able else "LAB"
    raise WorkshopError(
        f"--fault kills a rank on purpose to show a recovery, and {', '.join(lab.key for lab in without)} "
        f"cannot inject one (its script has no --fault): faults are for {names}, whose ranks torchrun restarts "
        "with --max-restarts.",
        f"drop --fault, or run one of those with it, e.g. `python -m workshop run {example} "
        "--fault kill-rank=1@step=30 --max-restarts 1`.",
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM (`kill`, `timeout`, a cancelled CI job) stops what the command started as Ctrl-C does.
    with sigterm_as_interrupt():
        return _command(args)


def _command(args: argparse.Namespace) -> int:
    try:
        if args.command == "labs":
            for lab in LABS.values():
                print(
                    f"{lab.key:<16} {lab.folder:<20} {lab.strategy}; local {lab.local_hosts} x "
                    f"{lab.local_procs_per_host}, SageMaker {lab.sagemaker.instance_count} x {lab.sagemaker.instance_type}"
                )
            return 0
        if args.command in ("network", "role", "cleanup"):
            return run_infra(args)
        if args.command == "event":
            from workshop.event import run as run_event

            return run_event(args)
        if args.command == "horovod":
            from workshop import horovod_build

            return horovod_build.run(args)
        hps = parse_hp(args.hp)
        if args.command == "run-script":
            from workshop.script_mode.cli import command as run_script

            return run_script(args, hps, cost_confirmation(args))
        if getattr(args, "fault", None):
            if "fault" in hps:
                raise WorkshopError("--fault and --hp fault=... both given.", "give it once, as --fault.")
            check_fault_labs(list(LABS.values()) if args.lab == "all" else get_labs(args.lab))
            hps["fault"] = args.fault
        if args.command == "tune":
            return run_tune(args, hps)
        if args.command == "profile":
            from workshop.profiling import profile

            sagemaker: dict[str, Any] = {}
            if args.mode == "sagemaker":
                sagemaker = dict(instance_type=args.instance_type, role=args.role, region=args.region,
                                 create_role=args.create_role, route=args.route,
                                 allow_unsupported_image=args.allow_unsupported_image,
                                 confirm_cost=cost_confirmation(args))
            else:
                given = [flag for flag, value in (("--instance-type", args.instance_type), ("--role", args.role),
                                                  ("--region", args.region), ("--create-role", args.create_role),
                                                  ("--route", args.route), ("--yes", args.yes),
                                                  ("--allow-unsupported-image", args.allow_unsupported_image))
                         if value]
                if given:
                    raise WorkshopError(f"{', '.join(given)} appl(y/ies) to --mode sagemaker.",
                                        "drop them, or add --mode sagemaker.")
            profile(args.lab, hosts=args.hosts, procs_per_host=args.procs_per_host, steps=args.steps,
                    hyperparameters=hps, mode=args.mode, data_dir=local_data_dir(get_labs(args.lab)[0], args),
                    runs_dir=Path(args.workdir) / "runs" if args.workdir else None, verbose=args.verbose,
                    stall_s=args.stall_after, **sagemaker)
            return 0
        if args.lab == "all":
            return run_all(args, hps)
        labs = get_labs(args.lab)
        if len(labs) == 1:
            run_one(labs[0], args, hps)
            return 0
        return run_many(labs, args, hps)
    except WorkshopError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Terminated as exc:
        if getattr(exc, "still_running", None):  # a wait for a SageMaker job: its line said how to stop the job
            print("Stopped by SIGTERM: the workshop stopped waiting; the job on SageMaker goes on (above: how to "
                  "stop it).", file=sys.stderr)
        else:
            print("Stopped by SIGTERM; every process the workshop started has been stopped.", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt as exc:
        if isinstance(exc, StillRunning):  # a SageMaker job or tuning job goes on: its line says how to stop it
            print(exc, file=sys.stderr)
            print("Interrupted: the workshop stopped waiting; the job on SageMaker goes on (above: how to stop it).",
                  file=sys.stderr)
            return 130
        if isinstance(exc, Stopped):  # a local job's own line: how many processes, where its logs are
            print(exc, file=sys.stderr)
        print("Interrupted; every process the workshop started has been stopped.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
