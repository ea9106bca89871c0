"""A room of attendees sharing one AWS account, for its organizer: the CloudFormation template,
the room's preflight (quotas and cost), the labs' data uploaded once, and the teardown.

    python -m workshop event template --attendees 30 --repository https://github.com/<owner>/<repo>.git > workshop-event.yaml
    python -m workshop event preflight --attendees 30 [--hours 3]   # quotas to request, the cost bound
    python -m workshop event data                                    # the labs' data in S3 once, for the room
    python -m workshop event cleanup [--stack NAME] [--yes]          # everything tagged by the workshop

What each lab's notebooks start on SageMaker comes from the labs' specs (the default route's one job,
or `Lab.notebook_jobs`) and their launchers' one-time set-up jobs (`setup_jobs`, e.g. lab 2's Horovod
build), so a new lab is planned for without touching this module. The AWS plumbing is in
`workshop.cloud` (`stack`, `quotas`, `room`, `sweep`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workshop import REPO_ROOT
from workshop.cloud import aws
from workshop.cloud import quotas as sq_names
from workshop.cloud.network import network_hourly_usd
from workshop.cloud.prices import (
    INSTANCE_PRICES,
    NOTEBOOK_PRICES,
    NOTEBOOK_STORAGE_USD_PER_GB_MONTH,
    PRICE_REGION,
    PRICES_DATE,
)
from workshop.cloud.room import ROOM_USER, room_prefix, upload_room_copy
from workshop.cloud.stack import (
    DEFAULT_NOTEBOOK_TYPE,
    DEFAULT_PLATFORM,
    DEFAULT_VOLUME_GB,
    TEMPLATE_BODY_MAX_BYTES,
    attendees,
    check_size,
    template,
    to_yaml,
)
from workshop.errors import WorkshopError
from workshop.labs import LABS, job_keys

SCRIPTS = REPO_ROOT / "scripts" / "notebook-instance"
DEFAULT_HOURS = 3.0  # a guided workshop: two or three hours
VPC_QUOTA = "VPCs per Region"  # Service Quotas, service code vpc


def say(message: str) -> None:
    print(f"[event] {message}", flush=True)


# --------------------------------------------------------------------------- the template


def default_repository() -> str | None:
    """This checkout's `origin`, if it is an https URL a notebook instance can clone."""
    try:
        url = subprocess.run(["git", "-C", str(REPO_ROOT), "remote", "get-url", "origin"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return url if url.startswith("https://") else None


def lifecycle_scripts() -> tuple[str, str]:
    """The notebook-instance scripts (on-create, on-start) the template embeds."""
    texts = []
    for name in ("on-create.sh", "on-start.sh"):
        path = SCRIPTS / name
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise WorkshopError(f"The lifecycle script {path} cannot be read: {exc.strerror or exc}.",
                                "run from a full checkout of the workshop (scripts/notebook-instance/).") from None
    return texts[0], texts[1]


def event_template(count: int, *, repository: str | None = None, first: int = 1, name_prefix: str = "attendee",
                   instance_type: str = DEFAULT_NOTEBOOK_TYPE, volume_gb: int = DEFAULT_VOLUME_GB,
                   platform: str = DEFAULT_PLATFORM, with_network: bool = False,
                   wheelhouse: str | None = None) -> dict[str, Any]:
    """The room's CloudFormation template (`workshop.cloud.stack.template`) for every lab's jobs."""
    repository = repository or default_repository()
    if not repository:
        raise WorkshopError("No repository for the notebook instances to clone: this checkout has no https `origin`.",
                            "pass --repository https://github.com/<owner>/<repository>.git.")
    on_create, on_start = lifecycle_scripts()
    variables = {"WORKSHOP_WHEELHOUSE": wheelhouse} if wheelhouse else {}
    return template(attendees(count, first=first, name_prefix=name_prefix), job_keys=job_keys(), repository=repository,
                    on_create=on_create, on_start=on_start, variables=variables, instance_type=instance_type,
                    volume_gb=volume_gb, platform=platform, with_network=with_network)


# --------------------------------------------------------------------------- the room's plan


@dataclass(frozen=True)
class Step:
    """Jobs of one kind an attendee starts: `jobs` of `instance_count` x `instance_type`, each at most
    `max_run_s`, at most `parallel` at once."""

    lab: str
    where: str  # the notebook, or the lab's set-up job
    instance_type: str
    instance_count: int
    max_run_s: int
    jobs: int = 1
    parallel: int = 1
    spot: bool = False

    @property
    def at_once(self) -> int:
        return self.instance_count * self.parallel

    def bound_usd(self) -> float | None:
        price = INSTANCE_PRICES.get(self.instance_type)
        return None if price is None else self.jobs * self.instance_count * price.usd_per_hour * self.max_run_s / 3600

    def describe(self, rate: float | None = None) -> str:
        """"6 jobs x 2 x ml.g5.xlarge x 0.5 h, 2 at once", with `rate` "... x $1.408/h x 0.5 h ..."."""
        jobs = f"{self.jobs} jobs" if self.jobs > 1 else "1 job"
        parallel = f", {self.parallel} at once" if self.parallel > 1 else ""
        spot = " spot" if self.spot else ""
        price = f" x ${rate:.3f}/h" if rate is not None else ""
        return f"{jobs} x {self.instance_count} x {self.instance_type}{spot}{price} x {self.max_run_s / 3600:g} h{parallel}"


def lab_steps(region: str) -> list[Step]:
    """What every lab's notebooks start on SageMaker in sagemaker mode, per attendee: each lab's
    `notebook_jobs` (or its default route's one job), planned offline as the notebooks plan them,
    plus each launcher's one-time set-up jobs (once per attendee and key)."""
    from workshop.jobs import plan_job

    steps: list[Step] = []
    seen: set[str] = set()
    for lab in LABS.values():
        if lab.sagemaker is None or not getattr(lab.launcher, "on_sagemaker", True):
            continue
        for entry in lab.notebook_jobs or (None,):
            if entry is None:
                plan = plan_job(lab, region=region, hyperparameters={})
                where, jobs, parallel, spot = f"{lab.label}: its job", 1, 1, False
            else:
                plan = plan_job(lab, region=region, hyperparameters={}, route=entry.route,
                                instance_count=entry.instance_count, max_run_s=entry.max_run_s)
                where, jobs, parallel, spot = f"{lab.folder_name}/{entry.notebook}", entry.jobs, entry.parallel, entry.spot
            steps.append(Step(lab.key, where, plan.instance_type, plan.instance_count, plan.max_run_s, jobs, parallel, spot))
            for job in getattr(lab.launcher, "setup_jobs", lambda plan: [])(plan):
                if job.identity not in seen:
                    seen.add(job.identity)
                    steps.append(Step(lab.key, f"{lab.label}: {job.what}", job.instance_type, job.instance_count,
                                      job.max_run_s))
    return steps


@dataclass
class QuotaRow:
    quota: str  # its name in Service Quotas
    per_attendee: int
    need: int
    why: str  # the step that needs the most at once
    value: float | None = None  # None: not read
    code: str = ""
    status: str = "not checked"  # ok, SHORT, not offered, not checked

    @property
    def short(self) -> bool:
        return self.status in ("SHORT", "not offered")


@dataclass
class CostLine:
    what: str
    how: str
    usd: float | None  # None: no price on record


@dataclass
class EventReport:
    attendees: int
    hours: float
    region: str
    quotas: list[QuotaRow]
    costs: list[CostLine]
    quota_note: str | None = None  # why quotas were not checked
    data: list[str] = field(default_factory=list)  # the room's shared data, what is there

    @property
    def per_attendee_usd(self) -> float:
        return sum(c.usd for c in self.costs if c.usd is not None)

    @property
    def total_usd(self) -> float:
        return self.per_attendee_usd * self.attendees

    @property
    def short(self) -> list[QuotaRow]:
        return [q for q in self.quotas if q.short]

    def increases(self) -> list[str]:
        """The exact requests for every quota that falls short (by its code; a type a region does not
        offer has none to request)."""
        return [sq_names.increase_command(sq_names.Quota(q.quota, q.value or 0.0, q.code), q.need, self.region,
                                          "vpc" if q.quota == VPC_QUOTA else "sagemaker")
                for q in self.quotas if q.status == "SHORT" and q.code]

    def lines(self) -> list[str]:
        n = self.attendees
        out = [f"Event preflight: {n} attendee(s) in {self.region}, {self.hours:g} h. Assumed: every attendee runs the "
               "same step at the same time (a guided workshop), so each quota must hold attendees x the most one "
               "attendee's step runs at once; anything else running in the account counts too."]
        out.append("")
        out.append("Quotas (Service Quotas, SageMaker" + (", VPC" if any(q.quota == VPC_QUOTA for q in self.quotas) else "")
                   + ")" + (f": not checked ({self.quota_note})" if self.quota_note else ""))
        headers = ["quota", "per attendee", f"x {n}", "quota", "status", "set by"]
        rows = [[q.quota, str(q.per_attendee), str(q.need), "-" if q.value is None else f"{q.value:g}",
                 q.status + (f" by {q.need - int(q.value)}" if q.status == "SHORT" and q.value is not None else ""), q.why]
                for q in self.quotas]
        out += _table(headers, rows)
        out.append("")
        out.append(f"Cost bound per attendee (on-demand prices, {PRICE_REGION}, collected {PRICES_DATE}; billing is per "
                   "second, every job stops at its max_run, spot is never billed above on-demand):")
        rows = [[c.what, c.how, "no price on record" if c.usd is None else f"${c.usd:,.2f}"] for c in self.costs]
        out += _table(["what", "how", "at most"], rows)
        unpriced = [c.what for c in self.costs if c.usd is None]
        out.append(f"per attendee: at most ${self.per_attendee_usd:,.2f}" + (f" plus {', '.join(unpriced)} (no price on record)" if unpriced else "")
                   + f"; {n} attendee(s): at most ${self.total_usd:,.2f}")
        if self.data:
            out.append("")
            out += self.data
        requests = self.increases()
        out.append("")
        if requests:
            out.append("Quota increases to request before the event (approval can take days):")
            out += [f"  {r}" for r in requests]
        elif self.quota_note:
            out.append("Quotas not checked: run this with credentials that may call servicequotas:ListServiceQuotas.")
        elif all(q.status == "ok" for q in self.quotas):
            out.append("Every quota holds the room.")
        missing = [q.quota for q in self.quotas if q.status == "not offered"]
        if missing:
            out.append(f"Not offered in {self.region} (no quota to raise): {', '.join(missing)}; pick another type or region.")
        unlisted = [q.quota for q in self.quotas if q.status == "not listed"]
        if unlisted:
            out.append(f"Not listed by Service Quotas here (look in its console): {', '.join(unlisted)}.")
        return out


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=True)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return [line(headers), line(["-" * w for w in widths]), *map(line, rows)]


def quota_rows(steps: list[Step], count: int, notebook_type: str, with_network: bool) -> list[QuotaRow]:
    """The quotas the room needs: per instance type (training, spot training), the totals across
    training jobs, the notebook instances, and (with the network) one VPC per attendee."""
    rows: list[QuotaRow] = []
    peaks: dict[tuple[str, bool], Step] = {}
    for step in steps:
        key = (step.instance_type, step.spot)
        if key not in peaks or step.at_once > peaks[key].at_once:
            peaks[key] = step
    for (instance_type, spot), step in sorted(peaks.items()):
        rows.append(QuotaRow(sq_names.training_quota(instance_type, spot), step.at_once, count * step.at_once,
                             f"{step.where} ({step.describe()})"))
    for spot, name in ((False, sq_names.TRAINING_TOTAL), (True, sq_names.SPOT_TRAINING_TOTAL)):
        kind = [s for s in steps if s.spot == spot]
        if kind:
            top = max(kind, key=lambda s: s.at_once)
            rows.append(QuotaRow(name, top.at_once, count * top.at_once, f"{top.where} ({top.describe()})"))
    rows.append(QuotaRow(sq_names.notebook_quota(notebook_type), 1, count, "one notebook instance each"))
    rows.append(QuotaRow(sq_names.NOTEBOOK_TOTAL, 1, count, "one notebook instance each"))
    if with_network:
        rows.append(QuotaRow(VPC_QUOTA, 1, count, "the template's network: one VPC each"))
    return rows


def check_quota_rows(rows: list[QuotaRow], sagemaker: dict[str, Any], vpc: dict[str, Any]) -> None:
    """Fill in each row's quota and status from the quotas read (by name)."""
    for row in rows:
        quotas = vpc if row.quota == VPC_QUOTA else sagemaker
        quota = quotas.get(row.quota)
        if not quotas:
            continue  # that service's quotas could not be read: "not checked"
        if quota is None:
            # A type the region does not offer has no quota listed; a total missing from the list is unknown.
            per_type = row.quota.endswith(("training job usage", "notebook instance usage"))
            row.status = "not offered" if per_type else "not listed"
            continue
        row.value, row.code = quota.value, quota.code
        row.status = "ok" if quota.value >= row.need else "SHORT"


def cost_lines(steps: list[Step], hours: float, notebook_type: str, volume_gb: int, with_network: bool) -> list[CostLine]:
    notebook = NOTEBOOK_PRICES.get(notebook_type)
    out = [
        CostLine(f"notebook instance {notebook_type}", (f"${notebook.usd_per_hour:.3f}/h x " if notebook else "") + f"{hours:g} h",
                 None if notebook is None else notebook.usd_per_hour * hours),
        CostLine("its ML storage volume", f"{volume_gb} GB x ${NOTEBOOK_STORAGE_USD_PER_GB_MONTH:.2f}/GB-month x {hours:g} h",
                 volume_gb * NOTEBOOK_STORAGE_USD_PER_GB_MONTH * hours / 730),  # 730 h in a month, as AWS bills it
    ]
    if with_network:
        hourly = network_hourly_usd("endpoints")
        out.append(CostLine("its workshop network (interface endpoints)", f"${hourly:.3f}/h x {hours:g} h", hourly * hours))
    for step in steps:
        price = INSTANCE_PRICES.get(step.instance_type)
        out.append(CostLine(step.where, step.describe(price.usd_per_hour if price else None), step.bound_usd()))
    return out


def room_data_lines(boto: Any, bucket: str) -> list[str]:
    """Whether the room's copy of each lab's data is in S3 (a listing; nothing is prepared or written)."""
    s3 = boto.client("s3")
    lines = [f"The room's data (read by every attendee's jobs; `python -m workshop event data` uploads it) in s3://{bucket}/:"]
    for data in {lab.data.name: lab.data for lab in LABS.values()}.values():
        prefix = data.s3_prefix(ROOM_USER, "")
        try:
            count = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("KeyCount", 0)
        except Exception as exc:  # noqa: BLE001 - no permission, no network: say so, decide nothing
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", str(exc))
            if code != "NoSuchBucket":
                lines.append(f"  {data.name}: not checked ({code})")
                continue
            count = 0  # no bucket yet: `event data` creates it
        lines.append(f"  {data.name}: {prefix}/ " + (f"has {count} file(s)" if count else "is empty: run `python -m workshop event data`"))
    return lines


def preflight(count: int, *, hours: float = DEFAULT_HOURS, notebook_type: str = DEFAULT_NOTEBOOK_TYPE,
              volume_gb: int = DEFAULT_VOLUME_GB, with_network: bool = False, session: Any = None,
              region: str | None = None, show: bool = True) -> EventReport:
    """The room's quotas against the account's Service Quotas, and its cost bound, per attendee and in
    all; reads only. Needs credentials (the quotas are the account's)."""
    if count < 1:
        raise WorkshopError(f"--attendees must be at least 1, got {count}.", "pass e.g. --attendees 30.")
    if hours <= 0:
        raise WorkshopError(f"--hours must be more than 0, got {hours:g}.", "pass the event's length, e.g. --hours 3.")
    boto = aws.boto_session(region) if session is None else aws.as_boto_session(session)
    identity = aws.require_credentials(boto)
    region = boto.region_name
    steps = lab_steps(region)
    rows = quota_rows(steps, count, notebook_type, with_network)
    sagemaker, why = sq_names.sagemaker_quotas(boto.client("service-quotas"))
    vpc: dict[str, Any] = {}
    if with_network and not why:
        vpc, _ = sq_names.service_quotas(boto.client("service-quotas"), "vpc")
    if not why:
        check_quota_rows(rows, sagemaker, vpc)
    if with_network:  # every VPC in the region counts against the quota, the default VPC too
        existing = len(boto.client("ec2").describe_vpcs()["Vpcs"])
        for row in rows:
            if row.quota == VPC_QUOTA and existing:
                row.need += existing
                row.why += f", plus the {existing} already in {region}"
                if row.value is not None:
                    row.status = "ok" if row.value >= row.need else "SHORT"
    account = identity.split(":")[4]
    report = EventReport(count, hours, region, rows, cost_lines(steps, hours, notebook_type, volume_gb, with_network),
                         quota_note=why, data=room_data_lines(boto, f"sagemaker-{region}-{account}"))
    if show:
        print("\n".join(report.lines()), flush=True)
    return report


# --------------------------------------------------------------------------- the room's data


def ensure_bucket(boto: Any, bucket: str) -> None:
    """Create `bucket` (the SDK's default bucket for the account) if it does not exist."""
    from botocore.exceptions import BotoCoreError, ClientError

    from workshop.cloud.common import aws_error, code_of

    s3 = boto.client("s3")
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if code_of(exc) not in ("404", "NoSuchBucket", "NotFound"):
            raise aws_error(f"Reading the bucket {bucket} failed", exc) from None
        try:
            extra = {} if boto.region_name == "us-east-1" else {
                "CreateBucketConfiguration": {"LocationConstraint": boto.region_name}}
            s3.create_bucket(Bucket=bucket, **extra)
        except (BotoCoreError, ClientError) as create_exc:
            raise aws_error(f"Creating the bucket {bucket} failed", create_exc) from None


def upload_data(session: Any = None, *, region: str | None = None, directory: str | Path | None = None,
                show: bool = True) -> dict[str, str]:
    """Prepare every lab's data here (in each data source's own folder, or under `directory`, as
    `--workdir` does) and upload it once to the room's prefix, in the bucket the attendees' notebooks
    use (`sagemaker-<region>-<account>`, no SDK key prefix: the notebook instances have no SDK config,
    and the template's roles read exactly there). Unchanged files are skipped. Returns {dataset: its
    S3 prefix}."""
    boto = aws.boto_session(region) if session is None else aws.as_boto_session(session)
    identity = aws.require_credentials(boto)
    bucket = f"sagemaker-{boto.region_name}-{identity.split(':')[4]}"
    ensure_bucket(boto, bucket)
    out = {}
    for data in {lab.data.name: lab.data for lab in LABS.values()}.values():
        channels = data.prepare(None if directory is None else Path(directory) / Path(data.default_dir).name)
        prefix = data.s3_prefix(ROOM_USER, "")
        uploaded, skipped = upload_room_copy(boto, bucket, prefix, channels.dirs)
        out[data.name] = f"s3://{bucket}/{prefix}"
        if show:
            say(f"{data.name}: {uploaded} file(s) uploaded, {skipped} unchanged -> s3://{bucket}/{prefix}/")
    if show:
        say(f"every attendee's execution role reads s3://{bucket}/{room_prefix('')} (statement RoomData); a job uses "
            "the room's copy when it holds exactly the channels the notebook prepared, else uploads its own")
    return out


# --------------------------------------------------------------------------- the room's teardown


def cleanup(session: Any = None, *, stack: str | None = None, confirm: bool | Callable[[str], bool] = False,
            delete_s3: bool = False, region: str | None = None, show: bool = True) -> list[str]:
    """List everything the workshop made here (every attendee's: `workshop.cloud.sweep.inventory`),
    then, once confirmed, stop and delete it (`teardown`); with `delete_s3`, also every attendee's
    workshop prefixes and the room's data. Unconfirmed: a WorkshopError, nothing deleted."""
    from workshop.cloud import sweep
    from workshop.cloud.cleanup import delete_s3_prefixes

    boto = aws.boto_session(region) if session is None else aws.as_boto_session(session)
    identity = aws.require_credentials(boto)
    found = sweep.inventory(boto, stack=stack)
    users = sorted({i.user for i in found.items() if i.user})
    bucket = f"sagemaker-{boto.region_name}-{identity.split(':')[4]}"
    prefixes = [*(p for u in users for p in _user_prefixes(u)), room_prefix("")] if delete_s3 else []
    if show:
        print(f"The workshop's resources in {boto.region_name} (tag workshop={aws.WORKSHOP_NAME}"
              + (f"; stack {stack}" if stack else "") + "):\n" + found.table(), flush=True)
        if delete_s3:
            print(f"and in s3://{bucket}/: everything under " + ", ".join(prefixes), flush=True)
    if found.empty and not delete_s3:
        return []
    what = f"{len(found.items())} resource(s)" + (" and those S3 prefixes" if delete_s3 else "")
    if not (confirm is True or (callable(confirm) and confirm(f"Stop and delete these {what}"))):
        raise WorkshopError(f"Nothing was stopped or deleted: deleting {what} was not confirmed.",
                            "read the list above, then run again with --yes (or answer y on a terminal).")
    done = sweep.teardown(boto, found)
    if delete_s3:
        from botocore.exceptions import ClientError

        try:
            count = delete_s3_prefixes(boto.client("s3"), bucket, prefixes)
        except ClientError as exc:
            from workshop.cloud.common import aws_error, code_of

            if code_of(exc) not in ("404", "NoSuchBucket", "NotFound"):
                raise aws_error(f"Deleting the workshop's objects in {bucket} failed", exc) from None
            count = 0
        done.append(f"deleted {count} S3 object(s)")
        if show:
            say(done[-1])
    return done


def _user_prefixes(user: str) -> list[str]:
    from workshop.account import s3_prefixes

    return s3_prefixes(user, "")


# --------------------------------------------------------------------------- the command line


def add_parser(sub: Any) -> None:
    """`python -m workshop event ...` (called by `workshop.__main__.build_parser`)."""
    event = sub.add_parser("event", help="for an organizer: a room of attendees in one AWS account")
    what = event.add_subparsers(dest="event_command", required=True)
    tpl = what.add_parser("template", help="the CloudFormation template: a notebook instance and roles per attendee",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tpl.add_argument("--attendees", type=int, required=True, help="how many attendees (notebook instances)")
    tpl.add_argument("--first", type=int, default=1, help="the first attendee's number (to split a room into stacks)")
    tpl.add_argument("--name-prefix", default="attendee", help="notebook instances are <prefix>-01, <prefix>-02, ...")
    tpl.add_argument("--repository", default=argparse.SUPPRESS,  # no "(default: None)": it is this checkout's origin
                     help="the https URL the notebook instances clone (default: this checkout's origin)")
    tpl.add_argument("--instance-type", default=DEFAULT_NOTEBOOK_TYPE, help="the notebook instances' type")
    tpl.add_argument("--volume-gb", type=int, default=DEFAULT_VOLUME_GB, help="each notebook instance's ML storage volume")
    tpl.add_argument("--platform", default=DEFAULT_PLATFORM, help="the notebook instances' platform identifier")
    tpl.add_argument("--with-network", action="store_true",
                     help="each attendee's workshop VPC too (interface endpoints: $0.04/h each while it exists)")
    tpl.add_argument("--wheelhouse", default=None, metavar="URI",
                     help="a folder or s3:// URI with a prebuilt Horovod wheel for the notebook instances' set-up")
    tpl.add_argument("--format", choices=("yaml", "json"), default="yaml")
    pre = what.add_parser("preflight", help="the room's quotas (and the increases to request) and its cost bound",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    pre.add_argument("--attendees", type=int, required=True)
    pre.add_argument("--hours", type=float, default=DEFAULT_HOURS, help="how long the notebook instances run")
    pre.add_argument("--instance-type", default=DEFAULT_NOTEBOOK_TYPE, help="the notebook instances' type")
    pre.add_argument("--volume-gb", type=int, default=DEFAULT_VOLUME_GB)
    pre.add_argument("--with-network", action="store_true", help="the template makes each attendee's network")
    pre.add_argument("--region", default=None)
    data = what.add_parser("data", help="prepare the labs' data and upload it once for every attendee's jobs")
    data.add_argument("--region", default=None)
    clean = what.add_parser("cleanup", help="list, then stop and delete, everything tagged by the workshop here")
    clean.add_argument("--stack", default=None, help="also delete this CloudFormation stack (the event's)")
    clean.add_argument("--delete-s3", action="store_true", help="also every attendee's workshop S3 prefixes and the room's data")
    clean.add_argument("--yes", "-y", action="store_true", help="delete without asking, having read the list")
    clean.add_argument("--region", default=None)


def deletion_confirmation(yes: bool) -> bool | Callable[[str], bool]:
    """True with --yes; on a terminal, a question asked after the list; else False (nothing deleted)."""
    if yes:
        return True
    if sys.stdin is None or not sys.stdin.isatty():
        return False

    def ask(sentence: str) -> bool:
        try:
            return input(f"{sentence}? [y/N] ").strip().lower() in ("y", "yes")
        except EOFError:
            return False

    return ask


def run(args: argparse.Namespace) -> int:
    """`python -m workshop event ...`; WorkshopErrors go to the caller (exit status 2)."""
    if args.event_command == "template":
        document = event_template(args.attendees, repository=getattr(args, "repository", None), first=args.first,
                                  name_prefix=args.name_prefix, instance_type=args.instance_type,
                                  volume_gb=args.volume_gb, platform=args.platform, with_network=args.with_network,
                                  wheelhouse=args.wheelhouse)
        text = json.dumps(document, indent=1) + "\n" if args.format == "json" else to_yaml(document)
        check_size(text, args.attendees)
        sys.stdout.write(text)
        size = len(text.encode())
        where = ("over CloudFormation's 51,200 bytes for a template passed inline: deploy it from S3, e.g. "
                 "`aws cloudformation deploy --template-file FILE --stack-name NAME --s3-bucket BUCKET "
                 "--capabilities CAPABILITY_NAMED_IAM`" if size > TEMPLATE_BODY_MAX_BYTES else
                 "deploy it with `aws cloudformation deploy --template-file FILE --stack-name NAME "
                 "--capabilities CAPABILITY_NAMED_IAM`")
        print(f"[event] {len(document['Resources'])} resources, {size:,} bytes; {where}; then "
              "`python -m workshop event preflight`, and after the event `python -m workshop event cleanup --stack NAME`",
              file=sys.stderr, flush=True)
        return 0
    if args.event_command == "preflight":
        report = preflight(args.attendees, hours=args.hours, notebook_type=args.instance_type, volume_gb=args.volume_gb,
                           with_network=args.with_network, region=args.region)
        return 1 if report.short else 0
    if args.event_command == "data":
        upload_data(region=args.region)
        return 0
    cleanup(stack=args.stack, confirm=deletion_confirmation(args.yes), delete_s3=args.delete_s3, region=args.region)
    return 0
