"""On-demand prices the cost estimates use, each with where it came from (a leaf module)."""

from __future__ import annotations

from dataclasses import dataclass

PRICES_DATE = "2026-11-22"  # when these numbers were collected


PRICE_REGION = "us-east-1"  # on-demand list prices there; other regions differ


@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    source: str
    verified: bool = False  # True only when read from an AWS pricing page itself


_SECONDARY = (
    "unverified: not read from aws.amazon.com/sagemaker/pricing (not reachable from here); "
    "the value published in public SageMaker cost tables, "
)


# SageMaker *training* on-demand prices, USD per instance-hour. Check
# https://aws.amazon.com/sagemaker/pricing/ (On-Demand, Training) before relying on them.
INSTANCE_PRICES: dict[str, Price] = {
    "ml.m5.xlarge": Price(0.23, _SECONDARY + "two tables agree (0.230)"),
    "ml.c5.xlarge": Price(0.204, _SECONDARY + "one table"),
    "ml.c5.2xlarge": Price(0.408, _SECONDARY + "one table"),
    "ml.g4dn.xlarge": Price(0.736, _SECONDARY + "two tables agree (0.736/0.7364)"),
    "ml.g5.xlarge": Price(1.408, _SECONDARY + "four tables agree (1.408/1.41)"),
    "ml.g5.2xlarge": Price(1.515, _SECONDARY + "three tables agree (1.515/1.52)"),
    "ml.g5.12xlarge": Price(7.09, _SECONDARY + "three tables agree"),
    "ml.p3.2xlarge": Price(3.825, _SECONDARY + "two tables agree (3.825/3.83)"),
    "ml.p4d.24xlarge": Price(37.688, _SECONDARY + "one table (37.69)"),
    # SMP v2's third instance type (4_model_parallel/lab.py): 8 x H100. The table that gives it gives
    # ml.p4d.24xlarge as 37.69, as above; EC2's own p5.48xlarge (not SageMaker's) is listed at 98.32.
    "ml.p5.48xlarge": Price(113.14, _SECONDARY + "one table (113.14)"),
}


# Network pieces, USD per hour while they exist (whether or not a job runs).
NETWORK_PRICES: dict[str, Price] = {
    "interface_endpoint": Price(
        0.01,
        "per endpoint per AZ-hour, plus $0.01/GB processed: aws.amazon.com/privatelink/pricing "
        "(per-GB tier read there; the hourly rate from public cost guides, unverified)",
    ),
    "nat_gateway": Price(
        0.045,
        "per hour, plus $0.045/GB processed: aws.amazon.com/vpc/pricing as quoted by public "
        "cost guides (us-east-1), unverified",
    ),
    "public_ipv4": Price(0.005, "per public IPv4 address-hour (the NAT gateway's), public cost guides, unverified"),
    "s3_gateway_endpoint": Price(0.0, "gateway endpoints for S3 have no hourly or per-GB charge"),
}


# SageMaker *notebook instance* on-demand prices, USD per instance-hour (a room's attendees each run
# one for the event's hours; `python -m workshop event preflight`). Same caveat as above.
NOTEBOOK_PRICES: dict[str, Price] = {
    "ml.t3.medium": Price(0.05, _SECONDARY + "two tables agree (0.05)"),
    "ml.t3.large": Price(0.10, _SECONDARY + "two tables agree (0.10)"),
    "ml.t3.xlarge": Price(0.20, _SECONDARY + "one table"),
    "ml.m5.xlarge": Price(0.23, _SECONDARY + "one table"),
    "ml.c5.xlarge": Price(0.204, _SECONDARY + "one table"),
}


# A notebook instance's ML storage volume, USD per GB-month (billed while the instance exists; a month
# is 730 hours), unverified: the value public SageMaker cost tables publish, one table.
NOTEBOOK_STORAGE_USD_PER_GB_MONTH = 0.14


# Measured SageMaker billable seconds per lab (none measured yet: no account here).
TYPICAL_RUN_S: dict[str, int] = {}
