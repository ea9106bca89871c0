"""Run a lab end to end in one call, in either runtime: the local cluster or a SageMaker job.

The CLI (`python -m workshop run LAB`) and the notebooks both come here, so a notebook cell and
the command line do exactly the same thing. Nothing here names a lab: the lab's spec brings its
launcher and its data source (`workshop.spec`).

    from workshop.labs import get_lab
    from workshop.runner import run_local, run_on_sagemaker
    run_local(get_lab("data_parallel"), hosts=2)                     # simulated hosts, this machine
    run_on_sagemaker(get_lab("data_parallel"), hosts=2, dry_run=True)  # the request, no account
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workshop.account import ensure_role
from workshop.cloud import aws
from workshop.cloud.cost import Confirm, require_confirmation
from workshop.cloud.network import ensure_network
from workshop.cloud.preflight import preflight
from workshop.cloud.role import resolve_role, role_name
from workshop.cloud.room import ROOM_USER, room_channel_uris
from workshop.errors import WorkshopError
from workshop.jobs import (
    DryRunRequest,
    JobRequest,
    JobResult,
    build_from_plan,
    check_internet,
    check_role,
    check_s3_scope,
    describe_plan,
    network_egress,
    plan_job,
    prepare_launcher,
    submit,
)
from workshop.jobs import (
    dry_run as dry_run_request,
)
from workshop.jobs.checks import given_role
from workshop.jobs.common import say
from workshop.jobs.tuning import (
    TuningOutcome,
    build_tuner,
    describe_tuning,
    follow_tuning,
    plan_tuning,
    staged_source,
    start_tuning,
    tuning_outcome,
)
from workshop.labs import get_lab
from workshop.runtime.local_cluster import ClusterResult, LocalCluster, check_cluster_size
from workshop.runtime.progress import STALL_S, live_display, still
from workshop.search import Objective, SearchSpace
from workshop.spec import Lab

SDK_LAUNCHERS = "sagemaker.train.distributed"  # what `Lab.distributed_config` imports (Torchrun, MPI, ...)


def run_local(
    lab: Lab,
    *,
    hosts: int | None = None,
    procs_per_host: int | None = None,
    hyperparameters: dict[str, Any] | None = None,
    data_dir: str | Path | None = None,
    workdir: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    runs_dir: str | Path | None = None,
    timeout_s: float | None = None,
    echo: bool = True,
    check: bool = True,
    max_restarts: int = 0,
    verbose: bool = False,
    stall_s: float | None = STALL_S,
    route: str | None = None,
    cluster_options: Mapping[str, Any] | None = None,
) -> ClusterResult:
    """Run `lab` on the local cluster; every check happens before any process starts.

    Hyperparameters are the lab's small local defaults updated with `route`'s own (a SageMaker route
    that sets script flags, e.g. lab 4's deepspeed: `Lab.route_hyperparameters`), then `hyperparameters`; the data
    is the lab's data source, prepared in `data_dir` (default: its own folder under `data/`).
    `workdir` is this run's folder; without it the run gets a new one under `runs_dir`
    (default: the checkout's runs/). `checkpoint_dir` stands in for the job's checkpoint S3 URI:
    each host's own checkpoint folder is synced with it (see `LocalCluster.run`). `max_restarts`: restarts of every rank after a failure
    (torchrun's elastic agent; the torchrun labs), each resuming from the latest checkpoint.
    `echo`: say what the run does, with one live progress display (steps or epochs done, loss,
    accuracy, hosts up) and the logs' path; `verbose`: stream every rank's lines instead.
    `stall_s`: when no rank has written a line for this long, the run says it stalls and who
    stopped answering (see `LocalCluster`; None or 0: never).
    The lab's `environment` reaches every process; `cluster_options` are more `LocalCluster` settings
    (`instance_type`, `sm_drivers_dir`, `internet`: a script of your own's job, `workshop.script_mode`).
    """
    hosts = lab.local_hosts if hosts is None else hosts
    procs_per_host = lab.local_procs_per_host if procs_per_host is None else procs_per_host
    check_cluster_size(hosts, procs_per_host)
    hps = {**lab.local_hyperparameters, **lab.route_hyperparameters(route), **(hyperparameters or {})}
    # Types first, no data needed, and before the SDK's import below: a typo is refused in a fraction of a second.
    args = lab.validate_hyperparameters(hps, world_size=hosts * procs_per_host)
    if lab.local_check is not None:  # what only this machine can tell, e.g. a framework the run needs is installed
        lab.local_check(args)
    # The launcher's config is the SDK's: a long, silent first import. Said where someone watches (a notebook,
    # a terminal); a log (CI, a pipe) keeps its few lines.
    if echo and SDK_LAUNCHERS not in sys.modules and live_display():
        print(f"{lab.label}: loading the SageMaker SDK's launcher configs, once per Python process "
              "(5 s on an idle 2-core machine, up to a minute on a busy one) ...", flush=True)
        with still("loading the SageMaker SDK"):
            lab.distributed_config(procs_per_host, max_restarts=max_restarts)  # the import, with a line every 10 s
    cluster = LocalCluster(  # checks hosts and procs_per_host
        lab.source_dir,
        lab.entry_script,
        hosts=hosts,
        procs_per_host=procs_per_host,
        distributed=lab.distributed_config(procs_per_host, max_restarts=max_restarts),
        name=lab.key.replace("_", "-"),
        workdir=workdir,
        runs_dir=runs_dir,
        echo=echo,
        verbose=verbose,
        stall_s=stall_s,
        extra_env=dict(lab.environment) or None,
        **dict(cluster_options or {}),
    )
    # A folder it cannot write, or one another job is using, fails now, not after the data; the lock is
    # held until the run ends (`LocalCluster.run` takes it again for the run itself).
    with cluster.checkpoint_lock(checkpoint_dir):
        channels = lab.data.prepare(data_dir)
        lab.validate_hyperparameters(hps, world_size=cluster.world_size, train_samples=channels.n_train)
        return cluster.run(
            hps, channels.dirs, checkpoint_dir=checkpoint_dir, timeout_s=timeout_s, check=check
        )


def run_on_sagemaker(
    lab: Lab | str | JobRequest,
    *,
    hosts: int | None = None,
    data_dir: str | os.PathLike[str] | Any = None,
    dry_run: bool = False,
    wait: bool = True,
    create_role: bool = False,
    confirm_cost: bool | Confirm = False,
    space: SearchSpace | None = None,
    objective: Objective | None = None,
    parallel: int | None = None,
    **fields: Any,
) -> JobResult | TuningOutcome | DryRunRequest:
    """Run a lab as a SageMaker training job (or, with `dry_run`, show the request only).

    With a search `space` (`workshop.search`), run it as one hyperparameter tuning job instead:
    every trial a job like the one described here, at most `parallel` at once, ranked by
    `objective` (default: the lab's accuracy); returns a `workshop.jobs.tuning.TuningOutcome`.
    `workshop.tuning.tune` is the friendlier way in.

    `lab` is a lab (or its name) or a `workshop.jobs.JobRequest`; `hosts` is the instance count
    and `fields` any other `JobRequest` field (hyperparameters, route, instance_type,
    procs_per_host, max_run_s, region, role, network, subnets, security_group_ids, image_uri,
    allow_unsupported_image, ...). Five steps, each printed:

    1. `plan_job`: every offline check (no AWS);
    2. credentials, the execution role, the launcher's look-ups, and the preflight
       (`workshop.cloud.preflight`: permission simulation, the Service Quotas value for the
       instance type, the cost bound), before anything is created or uploaded; then the cost
       must be confirmed (below);
    3. the workshop role and network if asked for, the launcher's set-up steps, the `ModelTrainer`;
    4. the lab's data channels go to S3 once (its data source, from `data_dir`);
    5. `submit` starts the job and follows its logs; returns a `JobResult`.

    Every user error is a `WorkshopError` raised in steps 1-3, before any data is uploaded or any
    job created. A dry run needs no credentials and no role (`workshop.jobs.dry_run`).

    `confirm_cost`: a real run spends money, so it starts only once its cost bound (printed by
    the preflight: instances x price x `max_run`, the network's hourly cost, a set-up job's) is
    confirmed: `confirm_cost=True`, or `WORKSHOP_CONFIRM_COST=1` in the environment (CI), or a
    function that asks and returns True (the CLI on a terminal). Otherwise a `WorkshopError`
    repeating the bound is raised at the end of step 2, before anything is created or uploaded.
    A dry run needs no confirmation.

    `network` (True/"endpoints" or "nat") runs the job in the workshop's own VPC (created or
    reused; it costs per hour while it exists, so run `workshop.account.cleanup()` when done);
    `create_role` creates or reuses the workshop's least-privilege execution role when no role is
    given. `image_uri`: your own training image instead of the lab's framework image.
    `allow_unsupported_image`: run a framework image past its end of patch anyway.
    """
    if isinstance(lab, str):
        lab = get_lab(lab)
    if hosts is not None:
        fields["instance_count"] = hosts
    request = JobRequest.of(lab, **fields)
    data = request.lab.data
    egress = network_egress(request.network, request.subnets)
    if dry_run:
        say("dry run: checking the job (no AWS account is used)")
        channels = data.prepared(data_dir)
        if channels is None:
            say(f"(the {data.name} channels in {data_dir or data.default_dir} are not prepared yet; "
                "a real run prepares them)")
        return dry_run_request(request, train_samples=channels.n_train if channels else None, space=space,
                               objective=objective, parallel=parallel)

    say("step 1/5: checking the job")
    boto = aws.boto_session(request.region)
    if not boto.region_name:
        raise WorkshopError(
            "No AWS region configured.",
            "pass region='us-east-1' (CLI: --region), or `export AWS_DEFAULT_REGION=us-east-1`.",
        )
    plan = plan_job(request, region=boto.region_name)
    plan = check_internet(plan, egress)
    tuning = None
    if space is not None:
        tuning = plan_tuning(plan, space, objective or Objective.parse(request.lab, None), parallel)
    role, role_source = given_role(request.role)
    if role:
        check_role(role, role_source)  # its form, before credentials are looked for
    describe_plan(plan)
    for line in describe_tuning(tuning) if tuning else ():
        say(line)

    say("step 2/5: AWS credentials, the execution role, and the preflight checks")
    identity = aws.require_credentials(boto)
    say(f"calling AWS as {identity} in {boto.region_name}")
    creating_role = create_role and not role
    if creating_role:  # created in step 3, after the preflight; its ARN is known already
        partition, account = identity.split(":")[1], identity.split(":")[4]
        role_arn = f"arn:{partition}:iam::{account}:role/{role_name()}"
    else:
        role_arn = resolve_role(request.role, boto)
    say(f"the job runs as {role_arn}")
    # The launcher's own look-ups (read-only, e.g. lab 2's Horovod wheel in S3), then the
    # internet check again with what they found; the bucket is named, not created, here.
    session = aws.sagemaker_session(boto)
    # The S3 locations against the role now known, in the bucket the SDK will really use.
    plan = check_s3_scope(plan, role_arn, aws.sdk_bucket(session), aws.sdk_key_prefix(session))
    known = len(plan.notes)
    plan, prep_steps = prepare_launcher(plan, aws.sdk_bucket(session), boto)
    plan = check_internet(plan, egress)
    for note in plan.notes[known:]:
        say(note)
    report = preflight(plan, role_arn, boto, identity=identity, network_egress=egress, creating_role=creating_role,
                       tuning=tuning)
    channels = data.prepared(data_dir)
    if channels is None:
        say(f"preparing the {data.name} channels in {data_dir or data.default_dir}")
        channels = data.prepare(data_dir)
    # Now that the data is known, the script checks each rank's share of it (every trial's).
    for trial in tuning.trials if tuning else [{}]:
        request.lab.validate_hyperparameters({**plan.hyperparameters, **trial}, world_size=plan.world_size,
                                             train_samples=channels.n_train)
    # Every check passed: the cost bound printed above is confirmed, or nothing is created.
    bound = report.cost.bound() + "".join(f", plus {step.cost}" for step in prep_steps if step.cost)
    how = require_confirmation("this tuning job" if tuning else "this job", bound, confirm_cost)
    say(f"cost confirmed ({how}): {bound}")

    say("step 3/5: " + ("the workshop role, " if creating_role else "") + ("the workshop network, " if egress else "")
        + "building the ModelTrainer")
    if creating_role:
        created = ensure_role(boto)
        say(f"role {created.arn} " + ("created" if created.created else "reused"))
    if egress:
        net = ensure_network(boto, egress=egress)
        for line in net.lines():
            say(line)
        plan = dataclasses.replace(plan, **net.job_args())
    for step in prep_steps:  # e.g. lab 2's one-time Horovod build job
        say(step.what)
        step.run(plan, role_arn, session)
    trainer = build_from_plan(plan, role_arn, session, validate_role=None)
    say(f"distributed: {type(trainer.distributed).__name__}({trainer.distributed.model_dump()})" if trainer.distributed
        else "distributed: none (the entry once per host, as SageMaker runs it without distributed=)")

    say(f"step 4/5: uploading the {data.name} channels (unchanged files are skipped)")
    bucket = aws.default_bucket(session)
    key_prefix = aws.sdk_key_prefix(session)
    # An event's room: the organizer's copy when it holds exactly these channels (workshop.cloud.room).
    inputs = room_channel_uris(boto, bucket, data.s3_prefix(ROOM_USER, key_prefix), channels.dirs)
    if inputs:
        say("using the room's copy (uploaded once by the event's organizer): "
            + ", ".join(f"{c}={u}" for c, u in inputs.items()))
    else:
        inputs = dict(data.upload(channels, bucket, boto, key_prefix=key_prefix))
    inputs.update(plan.extra_inputs)  # the launcher's channels (lab 2: `horovod`, its wheels)

    if tuning is None:
        say("step 5/5: submitting")
        return submit(trainer, inputs, wait=wait, logs=wait)
    say(f"step 5/5: starting tuning job {tuning.name} ({tuning.n_trials} trials, at most {tuning.max_parallel} at once)"
        + ("; waiting for it to end" if wait else ""))
    with staged_source(request.lab) as staged:
        start_tuning(build_tuner(tuning, trainer, staged), inputs, tuning.name, wait=False)
    if wait:  # its staged source is uploaded: the folder goes now, not when the tuning job ends
        follow_tuning(boto, tuning.name)
    outcome = tuning_outcome(boto, tuning.name)
    say(f"tuning job {tuning.name}: {outcome.status}" + (f"; best trial {outcome.best}" if outcome.best else ""))
    return outcome

