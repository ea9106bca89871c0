"""What a job can cost at most (instances x price x `max_run`), what the network adds, and the
confirmation every launch needs before it spends anything (`require_confirmation`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from workshop.cloud.network import network_hourly_usd
from workshop.cloud.prices import INSTANCE_PRICES, PRICE_REGION, PRICES_DATE, TYPICAL_RUN_S
from workshop.errors import WorkshopError

# Managed spot training: what the preflight shows as a typical saving, and where that comes from.
TYPICAL_SPOT_DISCOUNT = 0.7
SPOT_DISCOUNT_SOURCE = (
    "the discount is not fixed: AWS says managed spot training saves up to 90% over on-demand "
    "(docs.aws.amazon.com/sagemaker/latest/dg/model-managed-spot-training.html), and the spot price moves "
    "by instance type, region and hour; 70% is an assumption for illustration, not a quote. After a job, "
    "DescribeTrainingJob's BillableTimeInSeconds against TrainingTimeInSeconds gives the real saving"
)


@dataclass(frozen=True)
class CostEstimate:
    instance_type: str
    instance_count: int
    max_run_s: int
    hourly_usd: float | None  # one instance
    upper_bound_usd: float | None  # instances x hourly x max_run
    typical_run_s: int | None
    typical_usd: float | None
    network_egress: str | None
    network_hourly_usd: float
    source: str
    trials: int = 1  # a tuning job: this many training jobs, each of instance_count instances
    spot: bool = False  # managed spot training: billed at the spot price, never above on-demand
    parallel: int = 1  # a tuning job: at most this many trials run at once

    def bound(self) -> str:
        """The bound in one phrase: "at most $1.41 (2 x ml.g5.xlarge x $1.408/h x 0.5 h)"; with no price on
        record, that there is no bound, and what it would multiply."""
        n, t, hours = self.instance_count, self.instance_type, self.max_run_s / 3600
        trials = f"{self.trials} trials x " if self.trials > 1 else ""
        if self.upper_bound_usd is None:
            text = f"an amount the workshop cannot bound (no price on record for {t}; {trials}{n} instance(s) for {hours:g} h)"
        else:
            text = f"at most ${self.upper_bound_usd:,.2f} ({trials}{n} x {t} x ${self.hourly_usd:.3f}/h x {hours:g} h)"
        if self.network_egress:
            text += f", plus ${self.network_hourly_usd:.3f} per hour for the workshop network while it exists"
        return text

    def lines(self) -> list[str]:
        n, t = self.instance_count, self.instance_type
        hours = self.max_run_s / 3600
        at_once = min(self.parallel, self.trials)
        if self.hourly_usd is None:
            out = [f"cost: {self.bound()}; see https://aws.amazon.com/sagemaker/pricing/"]
        else:
            trials = f"{self.trials} trials x " if self.trials > 1 else ""
            out = [
                f"cost: at most ${self.upper_bound_usd:,.2f} = {trials}{n} x {t} x ${self.hourly_usd:.3f}/h x "
                f"{hours:g} h (max_run; billing is per second, so a shorter job costs less)"
            ]
            if self.spot:
                out.append(
                    f"cost on spot: at most the same ${self.upper_bound_usd:,.2f} (spot is never billed above on-demand), "
                    f"about ${self.upper_bound_usd * (1 - TYPICAL_SPOT_DISCOUNT):,.2f} at a {TYPICAL_SPOT_DISCOUNT:.0%} "
                    f"discount; {SPOT_DISCOUNT_SOURCE}"
                )
            if self.trials > 1:
                out.append(f"cost: one trial at most ${self.upper_bound_usd / self.trials:,.2f}; trials running at once "
                           "cost the same in total, they only finish sooner")
            if at_once > 1:  # what the account is billed while the most trials run together
                out.append(f"cost: {at_once} trials at once are {at_once * n} x {t}: "
                           f"${at_once * n * self.hourly_usd:,.2f} per hour while they run")
            if self.typical_usd is not None:
                out.append(f"cost: typically ${self.typical_usd:,.2f} ({self.typical_run_s} s billed"
                           + (" per trial)" if self.trials > 1 else ")"))
            else:
                each = f" with {at_once} trials running ({at_once * n} instances)" if at_once > 1 else ""
                out.append("cost: typical run time on SageMaker not measured yet; each minute costs "
                           f"${at_once * n * self.hourly_usd / 60:.3f}{each}")
        if self.network_egress:
            out.append(
                f"cost: the workshop network ({self.network_egress}) adds ${self.network_hourly_usd:.3f} per hour "
                "it exists, job or not: run cleanup when done"
            )
        out.append(f"prices: {PRICE_REGION} on-demand, collected {PRICES_DATE}; {self.source}")
        return out


def estimate_cost(
    instance_type: str,
    instance_count: int,
    max_run_s: int,
    *,
    lab_key: str | None = None,
    network_egress: str | None = None,
    trials: int = 1,
    spot: bool = False,
    parallel: int = 1,
) -> CostEstimate:
    """instances x hourly price x max_run hours (x trials, for a tuning job): the most it can cost.
    `parallel`: a tuning job's trials at once, for what they cost per hour together."""
    price = INSTANCE_PRICES.get(instance_type)
    hourly = price.usd_per_hour if price else None
    typical_s = TYPICAL_RUN_S.get(lab_key or "")
    return CostEstimate(
        instance_type=instance_type,
        instance_count=instance_count,
        max_run_s=max_run_s,
        hourly_usd=hourly,
        upper_bound_usd=None if hourly is None else trials * instance_count * hourly * max_run_s / 3600,
        typical_run_s=typical_s,
        typical_usd=None if hourly is None or typical_s is None else trials * instance_count * hourly * typical_s / 3600,
        network_egress=network_egress,
        network_hourly_usd=network_hourly_usd(network_egress),
        source=price.source if price else "no price on record",
        trials=trials,
        spot=spot,
        parallel=parallel,
    )


# Set to 1 (or true, yes) to confirm every launch's cost without asking: CI, and scripts that have
# read the bound already. Anything else confirms nothing.
CONFIRM_COST_ENV = "WORKSHOP_CONFIRM_COST"

# A way to ask: given "This job can cost at most $...", True to go on (the CLI asks on a terminal).
Confirm = Callable[[str], bool]


def confirmed_by_env() -> bool:
    return os.environ.get(CONFIRM_COST_ENV, "").strip().lower() in ("1", "true", "yes")


def require_confirmation(what: str, bound: str, confirm: bool | Confirm) -> str:
    """Go on only once the cost `bound` of `what` ("this job") is confirmed; returns how it was.

    `confirm`: True (the caller read the bound: `confirm_cost=True`, the CLI's --yes), or a
    function that asks, given "This job can cost ..." (the CLI on a terminal);
    `WORKSHOP_CONFIRM_COST=1` in the environment confirms too. Anything
    else raises a WorkshopError that repeats the bound: called before anything is created, it
    leaves nothing behind.
    """
    if confirm is True:
        return "confirm_cost=True"
    if confirmed_by_env():
        return f"{CONFIRM_COST_ENV}={os.environ[CONFIRM_COST_ENV].strip()}"
    if callable(confirm) and confirm(f"{what[:1].upper()}{what[1:]} can cost {bound}"):
        return "answered yes"
    raise WorkshopError(
        f"Not started: {what} can cost {bound}, and that cost was not confirmed. Nothing has been created, "
        "uploaded or started.",
        "read the cost bound above, then confirm it: in Python pass confirm_cost=True (in a notebook, set "
        "`confirm_cost = True` in the parameters cell and run this cell again); on the command line add --yes "
        f"(or answer y when asked); in CI set {CONFIRM_COST_ENV}=1.",
    )
