"""What the AWS modules share: the workshop's tags, polling, and AWS errors said with their fix."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from workshop.cloud import aws
from workshop.errors import WorkshopError

TAG_WORKSHOP = "workshop"


TAG_USER = "workshop-user"


TAG_RESOURCE = "workshop-resource"  # which piece of the network: "vpc", "private-subnet", ...


# On what an event's CloudFormation stack made for an attendee (its role, its network): the stack's
# name. The attendee's own cleanup leaves those to the stack and the organizer (`event cleanup`).
TAG_STACK = "workshop-stack"


POLL_S = 5.0


def say(message: str) -> None:
    print(f"[infra] {message}", flush=True)


def workshop_tags(user: str | None = None, **extra: str) -> list[dict[str, str]]:
    tags = {TAG_WORKSHOP: aws.WORKSHOP_NAME, TAG_USER: user or aws.user_prefix(), **extra}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def tag_spec(resource_type: str, user: str, resource: str) -> list[dict[str, Any]]:
    name = f"{aws.WORKSHOP_NAME}-{user}-{resource}"
    return [{"ResourceType": resource_type, "Tags": workshop_tags(user, **{TAG_RESOURCE: resource, "Name": name})}]


def user_filters(user: str, resource: str | None = None) -> list[dict[str, Any]]:
    filters = [
        {"Name": f"tag:{TAG_WORKSHOP}", "Values": [aws.WORKSHOP_NAME]},
        {"Name": f"tag:{TAG_USER}", "Values": [user]},
    ]
    if resource:
        filters.append({"Name": f"tag:{TAG_RESOURCE}", "Values": [resource]})
    return filters


def code_of(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def aws_error(what: str, exc: Exception) -> WorkshopError:
    """A botocore error as a WorkshopError that names its fix."""
    code = code_of(exc)
    if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
        return WorkshopError(
            f"{what}: permission denied ({exc}).",
            "ask your administrator to allow the action named in the message for this user or role "
            "(`python -m workshop run LAB --mode sagemaker --dry-run` lists what the workshop calls).",
        )
    if code.endswith("LimitExceeded"):
        return WorkshopError(f"{what}: an account limit was reached ({exc}).",
                             "delete unused resources of that kind, or request a higher limit in Service Quotas.")
    if code in ("ExpiredToken", "InvalidClientTokenId", "UnrecognizedClientException", "AuthFailure"):
        return WorkshopError(f"{what}: AWS rejected the credentials ({exc}).", aws.CREDENTIALS_FIX)
    return WorkshopError(f"{what}: {exc}", "see the message; nothing else was changed after this step.")


def poll(check: Callable[[], tuple[bool, str]], what: str, timeout_s: float, poll_s: float = POLL_S) -> None:
    """Call `check` until it says done; raise a WorkshopError with its last state at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, state = check()
        if done:
            return
        if time.monotonic() >= deadline:
            raise WorkshopError(
                f"Timed out after {timeout_s:g} s waiting for {what} (last state: {state}).",
                "look at it in the AWS console; run the same call again to resume, or cleanup to remove it.",
            )
        time.sleep(poll_s)
