"""AWS plumbing: sessions, prices, the workshop network, the execution role, preflight, cleanup.

It knows no lab: what it needs of a job (instance type, count, `max_run`, base job name) it is
given, and the S3 prefixes a role may use are passed in by the caller (`workshop.account`).
Everything is plain boto3 (EC2, IAM, STS, Service Quotas, SageMaker, S3): no CloudFormation
stack to roll back, each resource found again by its tags, so every call is idempotent and
testable under moto (`tests/test_infra.py`).

- `aws`: sessions, credentials, the user's prefix, the SDK's bucket and key prefix.
- `prices`: the on-demand prices the cost estimates use (a leaf: numbers and their sources).
- `cost`: the cost bound of a job and of the workshop network, and the confirmation of it that
  every launch needs (`require_confirmation`, `WORKSHOP_CONFIRM_COST`).
- `network`: one VPC per user (`ensure_network`, `find_network`, `delete_network`).
- `role`: the least-privilege execution role (`ensure_role`, `role_policy`, `resolve_role`).
- `preflight`: permissions, the Service Quotas value and the cost, before anything is created.
- `cleanup`: stop the user's jobs, delete the network, the role and (opt-in) S3 objects.
- `common`: tags, polling and error wording shared by the above.
- for an organizer's room (`workshop.event`): `stack` (the CloudFormation template for N attendees),
  `quotas` (SageMaker's Service Quotas by name), `room` (the labs' data in S3 once, for every
  attendee), `sweep` (everything tagged by the workshop, whoever's: listed, then deleted).

Every resource is tagged `workshop=distributed-training-workshop` and
`workshop-user=<workshop.cloud.aws.user_prefix()>`, the same tags the SageMaker jobs carry.
"""

from workshop.cloud import aws
from workshop.cloud.cleanup import CleanupReport, delete_s3_prefixes, stop_user_jobs
from workshop.cloud.common import TAG_RESOURCE, TAG_USER, TAG_WORKSHOP, workshop_tags
from workshop.cloud.cost import CONFIRM_COST_ENV, CostEstimate, estimate_cost, require_confirmation
from workshop.cloud.network import (
    DEFAULT_CIDR,
    EGRESS_CHOICES,
    INTERFACE_ENDPOINTS,
    Network,
    delete_network,
    ensure_network,
    find_network,
    network_hourly_usd,
)
from workshop.cloud.preflight import (
    PASS_ROLE_CONTEXT,
    PreflightReport,
    check_permissions,
    check_quota,
    dry_run_lines,
    job_permission_checks,
    preflight,
)
from workshop.cloud.prices import INSTANCE_PRICES, NETWORK_PRICES, PRICE_REGION, PRICES_DATE, Price
from workshop.cloud.role import (
    RoleInfo,
    delete_role,
    resolve_role,
    role_name,
    trust_policy,
    wildcard_violations,
)

__all__ = [
    "CONFIRM_COST_ENV", "CleanupReport", "CostEstimate", "DEFAULT_CIDR", "EGRESS_CHOICES", "INSTANCE_PRICES", "INTERFACE_ENDPOINTS",
    "NETWORK_PRICES", "Network", "PASS_ROLE_CONTEXT", "PRICES_DATE", "PRICE_REGION", "PreflightReport", "Price",
    "RoleInfo", "TAG_RESOURCE", "TAG_USER", "TAG_WORKSHOP", "aws", "check_permissions", "check_quota",
    "delete_network", "delete_role", "delete_s3_prefixes", "dry_run_lines", "ensure_network", "estimate_cost",
    "find_network", "job_permission_checks", "network_hourly_usd", "preflight", "require_confirmation", "resolve_role", "role_name",
    "stop_user_jobs", "trust_policy", "wildcard_violations", "workshop_tags",
]
