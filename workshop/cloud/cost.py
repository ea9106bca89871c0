"""What a job can cost at most (instances x price x `max_run`), and what the network adds."""

from __future__ import annotations

from dataclasses import dataclass

from workshop.cloud.network import network_hourly_usd
from workshop.cloud.prices import INSTANCE_PRICES, PRICE_REGION, PRICES_DATE, TYPICAL_RUN_S

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

    def lines(self) -> list[str]:
        n, t = self.instance_count, self.instance_type
        hours = self.max_run_s / 3600
        if self.hourly_usd is None:
            out = [f"cost: no price on record for {t}; see https://aws.amazon.com/sagemaker/pricing/"]
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
            if self.typical_usd is not None:
                out.append(f"cost: typically ${self.typical_usd:,.2f} ({self.typical_run_s} s billed"
                           + (" per trial)" if self.trials > 1 else ")"))
            else:
                out.append("cost: typical run time on SageMaker not measured yet; each minute costs "
                           f"${n * self.hourly_usd / 60:.3f}")
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
) -> CostEstimate:
    """instances x hourly price x max_run hours (x trials, for a tuning job): the most it can cost."""
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
    )
