"""The workshop's AWS resources for one attendee, over every lab: the execution role and cleanup.

`workshop.cloud` knows no lab, so the S3 prefixes a role may use and cleanup may delete (the
shared data, and the jobs of each lab, keyed by base job name) come from here, with every lab's
key from the registry (`workshop.labs.job_keys`).

    from workshop.account import cleanup, ensure_role
    cleanup()                      # stop your jobs; delete your network and role (S3: opt-in)
"""

from __future__ import annotations

from typing import Any

from workshop.cloud import cleanup as cloud_cleanup
from workshop.cloud import role as cloud_role
from workshop.labs import job_keys


def ensure_role(session: Any = None, **kwargs: Any) -> cloud_role.RoleInfo:
    """Create or reuse your workshop execution role (`workshop.cloud.role.ensure_role`) for every lab."""
    return cloud_role.ensure_role(session, job_keys=job_keys(), **kwargs)


def role_policy(**kwargs: Any) -> dict[str, Any]:
    """The role's inline policy (`workshop.cloud.role.role_policy`) for every lab."""
    return cloud_role.role_policy(job_keys=job_keys(), **kwargs)


def s3_prefixes(user: str | None = None, key_prefix: str | None = None) -> list[str]:
    """Your workshop S3 prefixes (`workshop.cloud.role.s3_prefixes`) for every lab."""
    return cloud_role.s3_prefixes(job_keys(), user, key_prefix)


def shipped_policy_documents(**kwargs: Any) -> dict[str, dict[str, Any]]:
    """Every IAM policy document the workshop writes, by name (for the wildcard check)."""
    return cloud_role.shipped_policy_documents(job_keys(), **kwargs)


def cleanup(session: Any = None, **kwargs: Any) -> cloud_cleanup.CleanupReport:
    """Stop your running workshop jobs, delete your network and role, and (with `delete_s3=True`)
    your S3 prefixes (`workshop.cloud.cleanup.cleanup`), for every lab. Running it twice is harmless."""
    return cloud_cleanup.cleanup(session, job_keys=job_keys(), **kwargs)
