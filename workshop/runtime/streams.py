"""A host's output as whole lines per rank, and the run's record of them (`Transcript`).

A host writes one stream of bytes: its launchers' own lines (sm_train.sh, the driver, torchrun)
and every rank's, which the launchers tag. `split_ranks` finds the tags and `Transcript` keeps
what each stream said and when: what `workshop.runtime.stalls` watches and
`workshop.runtime.failures` reads when a job fails. A stream is a (host, rank) pair, rank "" for
the host's own lines.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass, field

# Per-rank tags that launchers put in front of their workers' output:
#   torchrun --tee (PET_TEE):       "[default0]:text"      local rank
#   mpirun --tag-output:            "[1,3]<stdout>:text"   global rank
#   horovodrun (gloo):              "[3]<stdout>:text"     global rank
# A launcher that forwards partial lines repeats the tag mid-line ("a, [default0]:b"), so
# tags are found anywhere in a line and each rank's text is rebuilt into whole lines.
#   workshop ps_driver (lab 1):     "[chief0]:text", "[worker1]:text"   one training process
#                                   per host, shown as the host's rank; its parameter servers'
#                                   lines ("[ps2] text") stay the host's own lines
_RANK_TAG = re.compile(
    r"\[default(?P<local>\d+)\]:|\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:|\[(?P<hvd>\d+)\]<std(?:out|err)>:"
    r"|\[(?:chief|worker)(?P<tf>\d+)\]: ?"
)
# sm_train.sh's line just before it runs the driver (sagemaker/train/templates.py).
DRIVER_START = re.compile(r"^Running .+ [Dd]river$")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")  # PyTorch's own prefix on a rank's stderr lines
# A line a script marks for its user (the labs': a damaged checkpoint passed over): the local cluster shows it
# beside its progress display, where the other lines are only in the logs.
NOTE = "NOTE: "
TAIL_LINES = 400  # how many of each stream's last lines a run keeps


def split_ranks(text: str, host_rank: int, procs_per_host: int) -> list[tuple[str, str]]:
    """`"a[default0]:b[default1]:c"` -> `[("", "a"), ("0", "b"), ("1", "c")]` (global ranks), for
    a line of the host `host_rank` of a cluster of `procs_per_host` processes per host."""
    out: list[tuple[str, str]] = []
    rank, pos = "", 0
    for m in _RANK_TAG.finditer(text):
        if m.start() > pos or out or rank:
            out.append((rank, text[pos : m.start()]))
        if m["local"] is not None:
            rank = str(host_rank * procs_per_host + int(m["local"]))
        elif m["tf"] is not None:
            rank = str(host_rank)
        else:
            rank = m["mpi"] if m["mpi"] is not None else m["hvd"]
        pos = m.end()
    out.append((rank, text[pos:]))
    return [(r, t) for r, t in out[:-1] if t] + [out[-1]]


def bare(line: str) -> str:
    """A line without the cluster's `[host/rank]` tag and PyTorch's `[rankN]:` prefix."""
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    return _RANK_PREFIX.sub("", line)


def is_note(line: str) -> bool:
    """Whether a line (tagged or not) is one its script marked for its user (`NOTE: ...`)."""
    return bare(line).startswith(NOTE)


def who(host: str, rank: str) -> str:
    """A stream in words: "rank 1 on algo-2", or "the launcher on algo-1" for the host's own lines."""
    return f"rank {rank} on {host}" if rank else f"the launcher on {host}"


@dataclass
class Transcript:
    """Every line a run's hosts wrote, in order, with each stream's last lines and when each came."""

    lines: list[str] = field(default_factory=list)  # every line, tagged `[host/rank]`, in the order they came
    # (host, rank) -> its last TAIL_LINES lines, each with its number in `lines`
    tails: dict[tuple[str, str], deque[tuple[int, str]]] = field(default_factory=dict)
    last_line_at: dict[tuple[str, str], float] = field(default_factory=dict)  # (host, rank) -> when (monotonic)
    last_line_any: float = 0.0  # when the run's last line came (or the hosts started, before any)
    # Where the stop began: lines before it are the job's own doing; what follows is the stop's.
    stop_line: int | None = None

    def add(self, host: str, rank: str, line: str) -> None:
        self.tails.setdefault((host, rank), deque(maxlen=TAIL_LINES)).append((len(self.lines), line))
        self.lines.append(line)
        self.last_line_at[(host, rank)] = self.last_line_any = time.monotonic()
