"""SageMaker's Service Quotas as a room needs them: every quota read in one listing, by name.

The per-job preflight (`workshop.cloud.preflight.check_quota`) reads the one quota its job needs; a
room's preflight (`workshop.event`) needs many at once (each instance type for training, spot
training and notebook instances, and the account-wide totals), and a table of all of them even
when several fall short, so it reads them here and decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workshop.cloud.common import code_of

# Quota names as Service Quotas lists them for SageMaker.
TRAINING_TOTAL = "Number of instances across all training jobs"
SPOT_TRAINING_TOTAL = "Number of instances across all spot training jobs"
NOTEBOOK_TOTAL = "Total number of notebook instances"


def training_quota(instance_type: str, spot: bool = False) -> str:
    return f"{instance_type} for {'spot ' if spot else ''}training job usage"


def notebook_quota(instance_type: str) -> str:
    return f"{instance_type} for notebook instance usage"


@dataclass(frozen=True)
class Quota:
    name: str
    value: float
    code: str


def sagemaker_quotas(sq: Any) -> tuple[dict[str, Quota], str | None]:
    """(every SageMaker quota by name, None), or ({}, why they could not be read)."""
    return service_quotas(sq, "sagemaker")


def service_quotas(sq: Any, service: str) -> tuple[dict[str, Quota], str | None]:
    """(every quota of `service` by name, None), or ({}, why they could not be read): no permission,
    a fake AWS without Service Quotas, no network."""
    from botocore.exceptions import BotoCoreError, ClientError

    found: dict[str, Quota] = {}
    try:
        for page in sq.get_paginator("list_service_quotas").paginate(ServiceCode=service):
            for q in page["Quotas"]:
                found[q.get("QuotaName", "")] = Quota(q.get("QuotaName", ""), float(q.get("Value", 0.0)), q.get("QuotaCode", ""))
    except NotImplementedError:
        return {}, "Service Quotas is not available here"
    except ClientError as exc:
        return {}, f"{code_of(exc) or exc}: you may lack servicequotas:ListServiceQuotas"
    except BotoCoreError as exc:
        return {}, str(exc)
    if not found:
        return {}, f"Service Quotas listed no {service} quotas"
    return found, None


def increase_command(quota: Quota, value: int, region: str, service: str = "sagemaker") -> str:
    return (f"aws service-quotas request-service-quota-increase --service-code {service} --quota-code {quota.code} "
            f"--desired-value {value} --region {region}")
