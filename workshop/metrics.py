"""The one metric-line format, shared by SageMaker metric definitions and local log parsing.

Training scripts print lines like

    METRICS rank=0 epoch=2 step=120 train_loss=0.1834
    METRICS rank=0 epoch=2 test_loss=0.0912 test_accuracy=0.9710 samples_per_sec=812.4

(`key=value` pairs after the word `METRICS`; numbers where they can be, text otherwise).
The same regular expressions feed SageMaker's `metric_definitions` (so CloudWatch charts them)
and `parse_lines` here (so a local run, or a SageMaker job's downloaded log, is a list of
records that the plot helpers draw per rank).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

PREFIX = "METRICS"
# A number as Python's repr/format prints it, including nan and inf.
NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf)"
# `[algo-1/0] ` or `[algo-1] ` in front of a line: the local cluster's prefix.
CLUSTER_PREFIX = re.compile(r"^\[(?P<host>[^\]/\s]+)(?:/(?P<rank>\d+))?\]\s?")
_PAIR = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>\S+)")


def format_line(**values: Any) -> str:
    """The line a script prints; `rank` first so SageMaker regexes can pin a rank."""
    parts = []
    for key in sorted(values, key=lambda k: (k != "rank", k not in ("epoch", "step"))):
        value = values[key]
        if isinstance(value, float):
            value = f"{value:.6g}"
        parts.append(f"{key}={value}")
    return f"{PREFIX} " + " ".join(parts)


def metric_regex(name: str, rank: int | None = 0) -> str:
    """The regex whose first group captures metric `name` (from `rank`'s lines only, if set).

    Used as a SageMaker metric definition and by `parse_lines`' tests: one regex, two uses.
    """
    rank_part = rf"rank={rank}\b.*?" if rank is not None else ".*?"
    return rf"{PREFIX} {rank_part}\b{re.escape(name)}=({NUMBER})"


def sagemaker_metric_definitions(names: Iterable[str], rank: int | None = 0) -> list[dict[str, str]]:
    """`[{"Name": ..., "Regex": ...}]` for `ModelTrainer`/CreateTrainingJob."""
    return [{"Name": name, "Regex": metric_regex(name, rank)} for name in names]


def _value(text: str) -> Any:
    try:
        number = float(text)
    except ValueError:
        return text
    if math.isfinite(number) and number.is_integer() and re.fullmatch(r"[-+]?\d+", text):
        return int(number)
    return number


def parse_line(line: str) -> dict[str, Any] | None:
    """One record from one log line, or None when the line carries no metrics.

    When two ranks' output was glued into one line, only the first record is taken here;
    `parse_lines` takes them all.
    """
    records = _parse(line)
    return records[0] if records else None


def _parse(line: str) -> list[dict[str, Any]]:
    host = prefix_rank = None
    match = CLUSTER_PREFIX.match(line)
    if match:
        host, prefix_rank = match["host"], match["rank"]
        line = line[match.end() :]
    records = []
    for chunk in line.split(PREFIX + " ")[1:]:
        record: dict[str, Any] = {m["key"]: _value(m["value"]) for m in _PAIR.finditer(chunk)}
        if not record:
            continue
        if host is not None:
            record.setdefault("host", host)
        if prefix_rank is not None and len(records) == 0:
            record.setdefault("rank", int(prefix_rank))
        records.append(record)
    return records


def parse_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    return [record for line in lines for record in _parse(line)]


def last(records: list[dict[str, Any]], key: str, rank: int | None = 0) -> Any:
    """The last value of `key` (from `rank`'s records if given), or None."""
    for record in reversed(records):
        if key in record and (rank is None or record.get("rank") == rank):
            return record[key]
    return None


def state_lines(records: list[dict[str, Any]]) -> list[str]:
    """One line per rank for the records that account for what a rank holds (`state_bytes`, `ideal_state_bytes`,
    as lab 4's script prints them): its parameters, gradients and optimizer state in bytes, against the theory
    for its sharding (the ideal share of the full state), and its step time. [] when no record has them."""
    rows = sorted((r for r in records if "state_bytes" in r and "ideal_state_bytes" in r), key=lambda r: r.get("rank", 0))
    lines = []
    for r in rows:
        ratio = r["state_bytes"] / r["ideal_state_bytes"] if r["ideal_state_bytes"] else math.nan
        parts = ", ".join(f"{kind} {r[key]:,}" + (f" (theory {r['theory_' + key]:,})" if "theory_" + key in r else "")
                          for kind, key in (("parameters", "param_bytes"), ("gradients", "grad_bytes"),
                                            ("optimizer", "optim_bytes")) if key in r)
        step = f"; {r['step_time_s'] * 1e3:.1f} ms per step" if "step_time_s" in r else ""
        lines.append(f"rank {r.get('rank', 0)} ({r.get('sharding', '?')}): holds {r['state_bytes']:,} bytes of state, "
                     f"{ratio:.3f} x the theory's {r['ideal_state_bytes']:,} ({parts}){step}")
    return lines


def series(records: list[dict[str, Any]], y: str, x: str = "step") -> dict[int, tuple[list, list]]:
    """Per rank: (xs, ys) of every record that has both `x` and `y`."""
    out: dict[int, tuple[list, list]] = {}
    for record in records:
        if x in record and y in record:
            xs, ys = out.setdefault(record.get("rank", 0), ([], []))
            xs.append(record[x])
            ys.append(record[y])
    return out


def plot_per_rank(records: list[dict[str, Any]], panels: list[tuple[str, str]], title: str = "",
                  labels: dict[int, str] | None = None):
    """One subplot per (x, y) pair, one line per rank, labelled `rank N` unless `labels` names that
    rank's role (lab 1: rank 0 is the coordinator, which computes no gradients). Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (x, y) in zip(axes[0], panels, strict=True):
        points: set[Any] = set()
        for rank, (xs, ys) in sorted(series(records, y, x).items()):
            ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, label=(labels or {}).get(rank, f"rank {rank}"))
            points.update(xs)
        if x in ("epoch", "step") and 0 < len(points) < 20:  # few points, each marked: a tick under each one
            ax.set_xticks(sorted(points))
        elif x in ("epoch", "step"):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
