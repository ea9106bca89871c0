"""A room's shared copy of the labs' data in S3: uploaded once by the organizer, read by every
attendee's jobs (`python -m workshop event data`; `workshop.runner` uses it when it matches).

The copy sits where a user's own data would, under a user name no attendee can have:
`<SDK key prefix>/<workshop>/_room/data/<dataset>/<channel>/...` (`room_prefix`). User prefixes are
`[a-z0-9-]` only (`workshop.cloud.aws.sanitize_name`), so `_room` is nobody's, and nobody's cleanup
deletes it. Every workshop execution role may read it (`workshop.cloud.role.role_policy`, statement
`RoomData`); only the organizer writes it.

A job uses the room's copy only when every file of its local channels is there with the same size
and MD5 (`room_channel_uris`): the channels a job's hyperparameters were checked against are the
ones it trains on. Otherwise it uploads its own, as it always did.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workshop.cloud import aws
from workshop.cloud.common import aws_error, code_of

# The room's "user" in S3 keys: a leading underscore, which no sanitized user name has.
ROOM_USER = "_room"


def room_prefix(key_prefix: str | None = None) -> str:
    """The room's shared prefix (ends with '/'), after the SDK's default key prefix if the SDK
    config sets one (`key_prefix`; None: read it from the config)."""
    key_prefix = aws.sdk_key_prefix() if key_prefix is None else key_prefix
    return aws.s3_key(key_prefix, aws.WORKSHOP_NAME, ROOM_USER) + "/"


def _files(dirs: Mapping[str, Path]) -> list[tuple[str, Path]]:
    """(key under the data prefix, file) for every file a job's upload would send: each channel's
    files, as `<channel>/<path in the channel>`, leaving out hidden files (an interrupted write's)."""
    out = []
    for channel, folder in dirs.items():
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            if not any(part.startswith(".") for part in path.relative_to(folder).parts):
                out.append((f"{channel}/{path.relative_to(folder).as_posix()}", path))
    return out


def _same(head: Mapping[str, Any], size: int, md5: str) -> bool:
    """An object with this size and MD5 (the single-part ETag, or the md5 the upload stored)."""
    return head.get("ContentLength") == size and md5 in (head.get("ETag", "").strip('"'),
                                                         head.get("Metadata", {}).get("md5"))


def upload_room_copy(boto: Any, bucket: str, prefix: str, dirs: Mapping[str, Path]) -> tuple[int, int]:
    """Upload the channel folders `dirs` under `prefix` in `bucket`, each file once (an object with
    the same size and MD5 is skipped); returns (uploaded, skipped)."""
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = boto.client("s3")
    prefix = prefix.strip("/")
    uploaded = skipped = 0
    try:
        for key, path in _files(dirs):
            body = path.read_bytes()
            md5 = hashlib.md5(body).hexdigest()
            full = f"{prefix}/{key}"
            try:
                if _same(s3.head_object(Bucket=bucket, Key=full), len(body), md5):
                    skipped += 1
                    continue
            except ClientError as exc:
                if code_of(exc) not in ("404", "NoSuchKey", "NotFound"):
                    raise
            s3.put_object(Bucket=bucket, Key=full, Body=body, Metadata={"md5": md5},
                          ContentMD5=base64.b64encode(bytes.fromhex(md5)).decode())
            uploaded += 1
    except (BotoCoreError, ClientError) as exc:
        raise aws_error(f"Uploading the room's data to s3://{bucket}/{prefix}/ failed", exc) from None
    return uploaded, skipped


def room_channel_uris(boto: Any, bucket: str, prefix: str, dirs: Mapping[str, Path]) -> dict[str, str] | None:
    """`{channel: s3 URI}` of the room's copy under `prefix` if its channels hold exactly the files
    of the local channels `dirs`, each with the same size and MD5; None otherwise (no copy, another
    copy, or no permission to read it): the caller then uploads its own. Reads only."""
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = boto.client("s3")
    prefix = prefix.strip("/")
    files = _files(dirs)
    try:
        there: set[str] = set()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
            there |= {o["Key"][len(prefix) + 1:] for o in page.get("Contents", [])}
        in_channels = {k for k in there if k.split("/", 1)[0] in dirs}
        if in_channels != {key for key, _ in files}:
            return None  # no room copy (every job outside an event: one call), or not this data
        for key, path in files:
            body = path.read_bytes()
            if not _same(s3.head_object(Bucket=bucket, Key=f"{prefix}/{key}"), len(body), hashlib.md5(body).hexdigest()):
                return None
    except (BotoCoreError, ClientError):
        return None
    return {channel: f"s3://{bucket}/{prefix}/{channel}" for channel in dirs}
