"""Input channels you bring (`workshop.spec.DataSource`): your own script's data, not a lab's.

    channels = GivenChannels({"train": "data/train", "config": "params.json", "test": "s3://bucket/test/"})

Each channel is what SageMaker's `InputData(channel_name=..., data_source=...)` takes: a local folder,
a local file (`file://` URIs too), or an S3 URI. A job sees every channel as a folder,
`/opt/ml/input/data/<name>/` (`SM_CHANNEL_<NAME>`): a folder's files, or the one file, under its own
name, as the SDK uploads a file. So:

- **On the local cluster** a folder is linked into every host's `/opt/ml/input/data`; a file gets a
  folder of its own that holds a link to it (`<data dir>/channels/<name>-<hash>/<file>`); an S3 URI
  is downloaded with your AWS credentials into `<data dir>/s3/<bucket>/<key>/` (unchanged files are
  skipped), or refused with the fix when there are none.
- **On SageMaker** local channels are uploaded once under your S3 prefix
  (`<workshop>/<user>/script-data/<name>/`, unchanged files skipped), where the workshop's role may
  read them; an S3 URI is passed as it is.

Every path is checked when the channels are given, before anything starts.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workshop import REPO_ROOT
from workshop.cloud import aws
from workshop.errors import WorkshopError
from workshop.runtime.contract import RESERVED_CHANNELS

DEFAULT_DIR = REPO_ROOT / "data"  # downloads and file channels' folders: data/s3/..., data/channels/...
S3_PREFIX = "script-data"  # under <workshop>/<user>/: your channels in S3
# SageMaker's ChannelName: [A-Za-z0-9\.\-_]+, at most 64 characters (CreateTrainingJob).
CHANNEL_NAME = re.compile(r"[A-Za-z0-9.\-_]{1,64}")


def check_channel_name(name: Any) -> str:
    """A channel name SageMaker takes and SDK v3 does not reserve, or a WorkshopError with the fix."""
    if not isinstance(name, str) or not CHANNEL_NAME.fullmatch(name):
        raise WorkshopError(f"Invalid channel name {name!r}: SageMaker takes 1-64 letters, digits, '.', '-' and '_'.",
                            "name it like train, test or validation.")
    if name in RESERVED_CHANNELS:
        raise WorkshopError(f"Channel name {name!r} is taken: SDK v3 sends your code and its drivers as channels "
                            f"{' and '.join(RESERVED_CHANNELS)}.", "name the channel otherwise, e.g. train or data.")
    return name


@dataclass
class ChannelSet:
    """Prepared channels (`workshop.spec.Channels`): local folders by name, and S3 URIs passed as they are."""

    local: dict[str, Path] = field(default_factory=dict)
    s3: dict[str, str] = field(default_factory=dict)
    n_train: int | None = None  # unknown: a script of your own counts its own samples

    @property
    def dirs(self) -> dict[str, Path]:
        return dict(self.local)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


class GivenChannels:
    """Your channels as a data source: `{name: folder, file, file:// URI or s3:// URI}`."""

    name = "your"

    def __init__(self, channels: Mapping[str, Any] | None = None, *, default_dir: str | Path | None = None):
        self.default_dir = Path(default_dir) if default_dir else DEFAULT_DIR
        self.local: dict[str, Path] = {}
        self.s3_uris: dict[str, str] = {}
        for name, source in (channels or {}).items():
            check_channel_name(name)
            text = os.fspath(source) if isinstance(source, os.PathLike) else source
            if not isinstance(text, str) or not text:
                raise WorkshopError(f"Channel {name!r}: {source!r} is not a path or URI.",
                                    f"pass a folder, a file or an s3:// URI, e.g. --channel {name}=data/{name}.")
            if text.startswith("s3://"):
                if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?", text):
                    raise WorkshopError(f"Channel {name!r}: {text!r} is not an S3 URI.", "write it s3://bucket/prefix/.")
                self.s3_uris[name] = text
                continue
            if text.startswith("file://"):
                text = text[len("file://"):]
            elif re.match(r"^[a-z][a-z0-9+.-]*://", text):
                raise WorkshopError(f"Channel {name!r}: {text!r} is neither a local path nor an S3 URI, the channels "
                                    "SageMaker's InputData takes here.",
                                    "pass a folder or file on this machine, a file:// URI, or an s3:// URI.")
            path = Path(text).expanduser()
            if not path.exists():
                raise WorkshopError(f"Channel {name!r}: {path} does not exist.",
                                    f"pass an existing folder or file (as an absolute path, or relative to {Path.cwd()}).")
            if not (path.is_dir() or path.is_file()):
                raise WorkshopError(f"Channel {name!r}: {path} is neither a folder nor a file.", "pass a folder or a file.")
            self.local[name] = path.resolve()

    @property
    def channels(self) -> tuple[str, ...]:
        return (*self.local, *self.s3_uris)

    @property
    def s3_channels(self) -> dict[str, str]:
        """The channels that are S3 URIs: a job reads them from there (the dry run shows them so)."""
        return dict(self.s3_uris)

    def __repr__(self) -> str:
        return f"GivenChannels({ {**{k: str(v) for k, v in self.local.items()}, **self.s3_uris} })"

    # ------------------------------------------------------------------ the local cluster

    def _folder(self, name: str, path: Path, directory: Path) -> Path:
        """A local channel as the folder a job sees: a folder as it is; a file in a folder of its own."""
        if path.is_dir():
            return path
        folder = directory / "channels" / f"{name}-{_sha(str(path))}"
        link = folder / path.name
        folder.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and Path(os.readlink(link)) != path:
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(path)
        return folder

    def prepared(self, directory: str | Path | None = None) -> ChannelSet:
        """The channels as they are, nothing downloaded: local ones as folders, S3 URIs as they are."""
        root = Path(directory) if directory else self.default_dir
        return ChannelSet({name: self._folder(name, path, root) for name, path in self.local.items()}, dict(self.s3_uris))

    def prepare(self, directory: str | Path | None = None) -> ChannelSet:
        """The channels as local folders (for the local cluster): S3 channels downloaded into
        `directory/s3/<bucket>/<key>` with your AWS credentials, unchanged files skipped."""
        root = Path(directory) if directory else self.default_dir
        channels = self.prepared(root)
        for name, uri in self.s3_uris.items():
            channels.local[name] = download(uri, root / "s3", channel=name)
        channels.s3 = {}
        return channels

    # ------------------------------------------------------------------ SageMaker

    def s3_prefix(self, user: str | None = None, key_prefix: str | None = None) -> str:
        key_prefix = aws.sdk_key_prefix() if key_prefix is None else key_prefix
        return aws.s3_key(key_prefix, aws.WORKSHOP_NAME, user or aws.user_prefix(), S3_PREFIX)

    def upload(self, channels: ChannelSet, bucket: str, boto: Any, key_prefix: str | None = None) -> dict[str, str]:
        """Upload the local channels once under `s3_prefix` (unchanged files are skipped); S3 channels as they are."""
        prefix = self.s3_prefix(key_prefix=key_prefix)
        uris = {name: upload_folder(folder, bucket, f"{prefix}/{name}", boto) for name, folder in channels.local.items()}
        return {**uris, **channels.s3}


def _s3_fix(uri: str, channel: str) -> str:
    return (f"configure AWS credentials that may read it (`aws configure`, or run on SageMaker), or download it "
            f"yourself (`aws s3 sync {uri} data/{channel}`) and pass --channel {channel}=data/{channel} "
            "(InputData(channel_name=..., data_source='data/...') in Python)")


def download(uri: str, root: Path, *, channel: str, boto: Any = None) -> Path:
    """Download the objects under `uri` (a prefix, or one object) into `root/<bucket>/<key>/` with your AWS
    credentials, as SageMaker downloads an S3Prefix channel; a file already there with the same size is kept.
    Returns the folder. Refused, with the fix, without credentials or access, or when nothing is there."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    bucket, _, key = uri[len("s3://"):].partition("/")
    folder = root / bucket / (key.strip("/") or "_bucket")
    boto = boto or aws.boto_session()
    s3 = boto.client("s3")
    try:
        objects = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            objects += [o for o in page.get("Contents", []) if not o["Key"].endswith("/")]
        if key and not key.endswith("/"):  # a prefix matches longer names too: keep the object itself, or what is under key/
            objects = [o for o in objects if o["Key"] == key or o["Key"].startswith(key + "/")]
        if not objects:
            raise WorkshopError(f"Channel {channel!r}: nothing under {uri}.",
                                "check the URI (aws s3 ls " + uri + "), or pass a local folder.")
        got = 0
        for obj in objects:
            relative = Path(obj["Key"]).name if obj["Key"] == key else obj["Key"][len(key):].lstrip("/")
            target = folder / relative
            if target.is_file() and target.stat().st_size == obj["Size"]:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial")
            s3.download_file(bucket, obj["Key"], str(partial))
            partial.replace(target)
            got += 1
    except NoCredentialsError:
        raise WorkshopError(f"Channel {channel!r} is {uri}, and no AWS credentials were found to download it for the "
                            "local run.", _s3_fix(uri, channel)) from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        raise WorkshopError(f"Channel {channel!r}: could not download {uri}: {code or exc}.", _s3_fix(uri, channel)) from None
    except BotoCoreError as exc:
        raise WorkshopError(f"Channel {channel!r}: could not download {uri}: {exc}.", _s3_fix(uri, channel)) from None
    print(f"channel {channel}: {uri} -> {folder} ({len(objects)} object(s), {got} downloaded with your AWS "
          f"credentials, {len(objects) - got} already there)", flush=True)
    return folder


def upload_folder(folder: Path, bucket: str, prefix: str, boto: Any) -> str:
    """Upload `folder`'s files under `s3://bucket/prefix/`, each only when S3 lacks it with the same MD5; its URI."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    s3 = aws.as_boto_session(boto).client("s3")
    uploaded = skipped = 0
    try:
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            body = path.read_bytes()
            md5 = hashlib.md5(body).hexdigest()
            try:
                head = s3.head_object(Bucket=bucket, Key=key)
            except ClientError:
                head = None
            if head and head.get("ContentLength") == len(body) and md5 in (head.get("ETag", "").strip('"'),
                                                                           head.get("Metadata", {}).get("md5")):
                skipped += 1
                continue
            s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata={"md5": md5})
            uploaded += 1
    except NoCredentialsError:
        raise WorkshopError("No AWS credentials found for the S3 upload.", aws.CREDENTIALS_FIX) from None
    except (ClientError, BotoCoreError) as exc:
        raise WorkshopError(f"S3 upload of {folder} to s3://{bucket}/{prefix}/ failed: {exc}",
                            f"allow s3:PutObject and s3:GetObject on arn:aws:s3:::{bucket}/{prefix}/* for you.") from None
    uri = f"s3://{bucket}/{prefix}"
    print(f"S3: {folder} -> {uri} ({uploaded} file(s) uploaded, {skipped} already there)", flush=True)
    return uri
