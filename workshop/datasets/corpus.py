"""CPython's reference documentation as a text corpus: lab 4's data source.

CPython ships its own reference documentation inside the standard library as
`pydoc_data.topics.topics` (79 topics, what `help("with")` prints: about 0.46 MB of English
prose and code). It needs no download and is the same on every machine with the same Python.
Every tenth topic (sorted by name) goes to `test`, the rest to `train`, each as `corpus.txt`
(ASCII; the script models bytes).

    python -m workshop.datasets.corpus data/corpus
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workshop import REPO_ROOT
from workshop.cloud import aws
from workshop.errors import WorkshopError
from workshop.runtime.folders import check_free_space, disk_full_message, is_disk_full

CORPUS_FILE = "corpus.txt"


CHANNELS = ("train", "test")


DEFAULT_DATA_DIR = REPO_ROOT / "data" / "corpus"


TEST_EVERY = 10  # every tenth topic is held out


@dataclass(frozen=True)
class CorpusChannels:
    train_dir: Path
    test_dir: Path
    n_train: int  # characters
    n_test: int
    root: Path
    source: str

    @property
    def dirs(self) -> dict[str, Path]:
        return {"train": self.train_dir, "test": self.test_dir}


def corpus_texts() -> dict[str, str]:
    """{"train": text, "test": text} from `pydoc_data.topics` (the stdlib's own docs)."""
    from pydoc_data.topics import topics

    keys = sorted(topics)
    test = set(keys[::TEST_EVERY])
    return {
        "train": "\n\n".join(topics[k] for k in keys if k not in test),
        "test": "\n\n".join(topics[k] for k in keys if k in test),
    }


SOURCE_PREFIX = "pydoc_data.topics of CPython"  # how the workshop's dataset.json names what it wrote


def prepare_corpus(directory: str | os.PathLike[str] | None = None) -> CorpusChannels:
    """Write `DIR/train/corpus.txt` and `DIR/test/corpus.txt` (idempotent). A corpus the workshop did not
    write there is never replaced: checked and used as it is (`users_corpus`), or refused when only some
    channels are there. The space the files need is checked before any is written."""
    root = Path(directory or DEFAULT_DATA_DIR).expanduser()
    source = f"{SOURCE_PREFIX} {sys.version.split()[0]}"
    fix = ("pass --data-dir a folder you can write (it is made if missing), or --workdir DIR (the data "
           "then goes to DIR/data); in Python, prepare_corpus(FOLDER).")
    if root.exists() and not root.is_dir():
        raise WorkshopError(f"The corpus data folder {root} is a file, not a folder.", fix)
    texts = {channel: text.encode("ascii", "replace")  # a few non-ASCII characters become '?'
             for channel, text in corpus_texts().items()}
    theirs = users_corpus(root, texts)
    if theirs is not None:
        return theirs
    sizes = {}
    try:
        for channel, data in texts.items():
            folder = root / channel
            path = folder / CORPUS_FILE
            if not path.is_file() or path.read_bytes() != data:
                check_free_space(root, len(data) + 4096, f"the corpus channel {channel}", fix)
                folder.mkdir(parents=True, exist_ok=True)
                # A name of its own: two commands preparing the folder at once never write one file together.
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{CORPUS_FILE}.", suffix=".tmp")
                try:
                    with os.fdopen(fd, "wb") as handle:
                        handle.write(data)
                    os.chmod(tmp, 0o644)
                    os.replace(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
            # Written only when it changes: a prepared folder in a read-only checkout is only read.
            meta = folder / "dataset.json"
            described = json.dumps({"source": source, "characters": len(data)}) + "\n"
            if not meta.is_file() or meta.read_text() != described:
                meta.write_text(described)
            sizes[channel] = len(data)
    except OSError as exc:
        if is_disk_full(exc):
            raise WorkshopError(disk_full_message(root, "writing the corpus channels", sum(map(len, texts.values()))),
                                fix) from None
        raise WorkshopError(f"Cannot write the corpus channels under {root}: {exc.strerror or exc}.", fix) from None
    return CorpusChannels(root / "train", root / "test", sizes["train"], sizes["test"], root, source)


def users_corpus(root: Path, texts: dict[str, bytes]) -> CorpusChannels | None:
    """The corpus in `root` if the workshop did not write it (a corpus.txt that is neither the text the
    workshop writes, `texts`, nor described by the workshop's dataset.json): checked (`check_channel`) and
    returned to be used as it is, said so; None when there is none. Only some channels there: refused with
    the fix. A corpus.txt the workshop wrote and someone changed since is refused by `check_channel`."""
    theirs = []
    for channel, data in texts.items():
        folder = root / channel
        try:
            content = (folder / CORPUS_FILE).read_bytes()
        except OSError:
            continue
        if content == data:
            continue
        try:
            meta = json.loads((folder / "dataset.json").read_text())
        except (OSError, ValueError):
            meta = None
        if isinstance(meta, dict) and str(meta.get("source", "")).startswith(SOURCE_PREFIX):
            check_channel(folder)  # the workshop's, from another Python (replaced), unless changed since
            continue
        theirs.append(channel)
    if not theirs:
        return None
    files = ", ".join(str(root / c / CORPUS_FILE) for c in theirs)
    missing = [str(root / c / CORPUS_FILE) for c in CHANNELS if not (root / c / CORPUS_FILE).is_file()]
    if missing:
        raise WorkshopError(
            f"{files} {'is' if len(theirs) == 1 else 'are'} not the workshop's corpus, and {', '.join(missing)} is "
            "missing: the workshop does not replace data it did not write.",
            f"add the missing channel ({CORPUS_FILE}, text) to use your corpus; or pass --data-dir another folder "
            f"(prepare_corpus(OTHER) in Python), where the workshop writes its own; or delete {files}.",
        )
    train, test = (check_channel(root / channel) for channel in CHANNELS)
    print(f"corpus: using the text in {root} as it is: {train:,} train / {test:,} test bytes, checked (the workshop "
          "did not write it, so it does not replace it).")
    return CorpusChannels(root / "train", root / "test", train, test, root, f"{CORPUS_FILE} files in {root}")


def check_channel(channel_dir: str | os.PathLike[str]) -> int:
    """A channel's corpus.txt as the script reads it (bytes): there, readable, not empty, and as long
    as its dataset.json records when it has one (a shorter file was cut off). Returns its size in
    bytes; refuses with a `WorkshopError` naming the file and the fix, before anything is uploaded."""
    folder = Path(channel_dir).expanduser()
    path, root = folder / CORPUS_FILE, folder.parent
    fix = (f"delete {path} and run again, which writes the corpus channels in {root} afresh "
           f"(or `python -m workshop.datasets.corpus {root}`).")
    try:
        size = len(path.read_bytes())
    except OSError as exc:
        raise WorkshopError(f"Cannot read the corpus channel file {path} ({exc.strerror or exc}).", fix) from None
    if size == 0:
        raise WorkshopError(f"The corpus channel file {path} is empty, so every rank would fail on it.", fix)
    try:
        recorded = json.loads((folder / "dataset.json").read_text()).get("characters")
    except (OSError, ValueError, AttributeError):
        recorded = None  # a corpus written by hand: any text will do
    if isinstance(recorded, int) and recorded != size:
        raise WorkshopError(f"The corpus channel file {path} has {size:,} bytes where its dataset.json records "
                            f"{recorded:,}: it was cut off or changed.", fix)
    return size


def data_prefix(user: str | None = None, key_prefix: str | None = None) -> str:
    """S3 key prefix of the corpus channels, under the SDK's default key prefix when the SDK
    config sets one (as `workshop.datasets.mnist.data_prefix`), where the workshop role may read."""
    key_prefix = aws.sdk_key_prefix() if key_prefix is None else key_prefix
    return aws.s3_key(key_prefix, aws.WORKSHOP_NAME, user or aws.user_prefix(), "data/pydoc-corpus")


def upload_corpus(channels: CorpusChannels, bucket: str, boto_session: Any,
                  key_prefix: str | None = None) -> dict[str, str]:
    """Upload the two channel folders once (an object with the same MD5 is skipped)."""
    for folder in channels.dirs.values():  # nothing goes to S3 that the job's ranks could not read
        check_channel(folder)
    s3 = boto_session.client("s3")
    uris = {}
    for channel, folder in channels.dirs.items():
        key_base = f"{data_prefix(key_prefix=key_prefix)}/{channel}"
        uris[channel] = f"s3://{bucket}/{key_base}"
        for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
            body = path.read_bytes()
            key = f"{key_base}/{path.name}"
            try:
                if s3.head_object(Bucket=bucket, Key=key)["ETag"].strip('"') == hashlib.md5(body).hexdigest():
                    continue
            except Exception:  # noqa: BLE001 (absent: upload it)
                pass
            s3.put_object(Bucket=bucket, Key=key, Body=body)
    return uris


class CorpusSource:
    """The corpus as a lab's data source (`workshop.spec.DataSource`): lab 4."""

    name = "pydoc-corpus"
    channels = CHANNELS
    default_dir = DEFAULT_DATA_DIR

    def prepare(self, directory: str | os.PathLike[str] | None = None) -> CorpusChannels:
        return prepare_corpus(directory)

    def prepared(self, directory: Any = None) -> CorpusChannels | None:
        """The channels in `directory` (or `directory` itself, if it is prepared channels), or None. A
        channel file that is there but empty or cut off is refused (`check_channel`)."""
        if isinstance(directory, CorpusChannels):
            return directory
        root = Path(self.default_dir if directory is None else directory).expanduser()
        files = [root / channel / CORPUS_FILE for channel in CHANNELS]
        if not all(f.is_file() for f in files):
            return None
        train, test = (check_channel(root / channel) for channel in CHANNELS)
        return CorpusChannels(root / "train", root / "test", train, test, root, f"{CORPUS_FILE} files in {root}")

    def s3_prefix(self, user: str | None = None, key_prefix: str | None = None) -> str:
        return data_prefix(user, key_prefix)

    def upload(self, channels: CorpusChannels, bucket: str, boto: Any, key_prefix: str | None = None) -> dict[str, str]:
        return upload_corpus(channels, bucket, boto, key_prefix=key_prefix)

    def __repr__(self) -> str:
        return "CorpusSource()"


CORPUS = CorpusSource()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python -m workshop.datasets.corpus [DIR]  (default: data/corpus)", file=sys.stderr)
        return 2
    c = prepare_corpus(args[0] if args else None)
    print(f"{c.source}: train {c.train_dir / CORPUS_FILE} ({c.n_train:,} characters), "
          f"test {c.test_dir / CORPUS_FILE} ({c.n_test:,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
