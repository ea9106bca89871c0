"""What a job leaves, laid out as SageMaker lays it out: one `model.tar.gz` and one `output.tar.gz`.

SageMaker copies every host's `/opt/ml/model` into one compressed tar file, `model.tar.gz`, and
every host's `/opt/ml/output/data` into `output.tar.gz` (AWS Developer Guide, "How Amazon SageMaker
processes training output"): "If multiple containers in a single training job write to this directory
they should ensure no file/directory names clash. SageMaker aggregates the result in a TAR file."
Which host's file survives a clash is not promised.

    archive = aggregate({"algo-1": Path(".../algo-1/model"), "algo-2": ...}, Path("run/output/model.tar.gz"))
    archive.members       # {"model.pth": "algo-1", ...}: each name archived, and whose it is
    archive.clash_lines() # one line per group of names that more than one host wrote, naming the hosts

Here the first host's file (in SageMaker's host order: algo-1, algo-10, algo-2, ...) is the one
archived, as the fake SageMaker's archives do, and every clash is reported, never silently resolved.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from pathlib import Path

SHOWN_NAMES = 4  # at most this many names in one clash line (then "and N more")


@dataclass(frozen=True)
class Clash:
    """A name (a file's path inside the archive) that more than one host wrote."""

    name: str
    hosts: tuple[str, ...]  # every host that wrote it, in host order
    kept: str  # whose file the archive holds


@dataclass
class Archive:
    """One aggregated archive: where it is, what it holds (name -> the host whose file it is), and the clashes."""

    path: Path
    what: str  # "model" or "output": which folder of the hosts it aggregates
    folder: str  # that folder inside the container, e.g. /opt/ml/model
    members: dict[str, str] = field(default_factory=dict)
    clashes: list[Clash] = field(default_factory=list)
    bytes: int = 0  # the files' sizes together, before compression

    @property
    def empty(self) -> bool:
        return not self.members

    def hosts(self) -> list[str]:
        """The hosts that contributed at least one file, in host order."""
        return sorted(set(self.members.values()), key=_host_order)

    def summary(self) -> str:
        """One line: where the archive is and what is in it, or that no host wrote anything."""
        if self.empty:
            return (f"{self.path.name}: empty: no host wrote anything into {self.folder} "
                    f"(the archive is at {self.path})")
        hosts = self.hosts()
        return (f"{self.path.name}: {len(self.members)} file(s), {_size(self.bytes)}, from "
                f"{', '.join(hosts)} -> {self.path}")

    def clash_lines(self) -> list[str]:
        """One line per set of hosts that wrote the same names: which names, which hosts, what SageMaker
        does about it, and the fix. Empty when no name clashes."""
        groups: dict[tuple[str, ...], list[Clash]] = {}
        for clash in self.clashes:
            groups.setdefault(clash.hosts, []).append(clash)
        lines = []
        for hosts, clashes in groups.items():
            names = [c.name for c in clashes]
            shown = ", ".join(names[:SHOWN_NAMES]) + (f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else "")
            lines.append(
                f"name clash in {self.path.name}: {shown} written by {_and(list(hosts))}: SageMaker keeps one "
                f"of them and does not promise which (kept here: {clashes[0].kept}'s). Fix: write "
                f"{'it' if len(names) == 1 else 'them'} from one host only (e.g. where SM_CURRENT_HOST is "
                f"algo-1, or rank 0), or give each host's file a name of its own."
            )
        return lines


def _host_order(name: str) -> str:
    return name  # SageMaker sorts its hosts as strings (algo-10 before algo-2), and so does the local cluster


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"  # not reached


def _files(folder: Path) -> dict[str, Path]:
    """Every file (and link) under `folder`, by its path relative to it; empty folders count as nothing."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()}


def aggregate(folders: dict[str, Path], dest: Path, *, what: str = "model", folder: str = "/opt/ml/model") -> Archive:
    """Write one gzipped tar of every host's `folders[host]` at `dest`, names relative to each host's
    folder, as SageMaker aggregates `/opt/ml/model` (or `/opt/ml/output/data`); an empty archive when no
    host wrote anything (SageMaker uploads one too). A name more than one host wrote is a `Clash`: the
    first host's file is archived (hosts in SageMaker's order), and every host that wrote it is named."""
    order = sorted(folders, key=_host_order)
    seen: dict[str, list[str]] = {}
    chosen: dict[str, Path] = {}
    for host in order:
        for name, path in _files(Path(folders[host])).items():
            seen.setdefault(name, []).append(host)
            chosen.setdefault(name, path)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    archive = Archive(dest, what, folder)
    with tarfile.open(dest, "w:gz") as tar:
        for name in sorted(chosen):
            path = chosen[name]
            tar.add(path, arcname=name, recursive=False)
            archive.members[name] = seen[name][0]
            if path.is_file():
                archive.bytes += path.stat().st_size
    archive.clashes = [Clash(name, tuple(hosts), hosts[0]) for name, hosts in sorted(seen.items()) if len(hosts) > 1]
    return archive
