"""One live progress display per local job, instead of every rank's log lines.

The ranks' `METRICS key=value ...` lines (`workshop.metrics`) already say how far a job is: the
global step, the epoch, the latest training loss and test accuracy. `JobProgress` reads them as
the local cluster relays each line and shows one display per job:

    data_parallel  2/3 epoch [00:09<00:04] step 62, loss 0.219, test acc 0.940, 180 samples/s, 2/2 hosts up

- in a notebook, tqdm's widget (ipywidgets); in a terminal, one line redrawn in place;
- anywhere else (a pipe, CI's log, a test capturing output) nothing redraws: one line when the job
  ends, and one a minute while it runs, so a log stays short but a long job is seen to be alive.

Until rank 0's first step the display says the job is starting and shows the last line any process
wrote (a parameter server's six TensorFlow processes take a minute or more to start); a live display is
redrawn every second, so its clock moves even while nothing is written. Interrupted, it says so.

The full logs are in the run's folder, whose path the cluster prints; `verbose=True` (CLI:
`--verbose`) streams every line as before instead. A failure is reported as before (the failing
rank and its traceback), after the display is closed. A job whose ranks have all gone silent (the
local cluster's stall watch, `LocalCluster(stall_s=...)`) is said so, in the display and in lines of
its own, each rank's last line with them, until it recovers or ends.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from workshop import metrics

# torchrun's agent when a rank ends badly; the labs' scripts when they resume after a restart.
_RANK_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+")
HEARTBEAT_S = 60.0  # not live: a line this often while the job runs
TICK_S = 1.0  # live: the display is redrawn at least this often, so its clock moves while no rank writes
STALL_S = 120.0  # no line from any rank for this long: the job stalls (LocalCluster's stall_s)


@contextlib.contextmanager
def still(what: str, every_s: float = 10.0, echo: Callable[[str], None] = print) -> Iterator[None]:
    """Around a wait that prints nothing of its own (an import, a measurement): a line every `every_s`
    seconds, `  still {what}: N s`, from a thread of its own, until the block ends (however it ends)."""
    done = threading.Event()
    t0 = time.monotonic()

    def tick() -> None:
        while not done.wait(every_s):
            echo(f"  still {what}: {time.monotonic() - t0:.0f} s")

    ticker = threading.Thread(target=tick, name="workshop-still", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (a notebook): there a table is displayed, rendered, not printed."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def live_display(stream: TextIO | None = None) -> bool:
    """Whether a display can be redrawn here: a Jupyter kernel (tqdm's widget) or a terminal."""
    if in_notebook():
        return True
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def progress_total(hyperparameters: dict[str, Any]) -> tuple[str, int | None]:
    """What a job counts and how many: ("step", steps) for a job given `steps`, else ("epoch", epochs)
    for one given `epochs` (total None when neither is given: the display counts without a total)."""
    for key, unit in (("steps", "step"), ("epochs", "epoch")):
        value = hyperparameters.get(key)
        if value is not None:
            try:
                return unit, int(value)
            except (TypeError, ValueError):
                break
    return "step", None


class JobProgress:
    """The display of one job; `feed` every relayed line, `set_hosts_up` as hosts end, `close` at the end."""

    def __init__(self, name: str, unit: str, total: int | None, hosts: int, *, live: bool | None = None,
                 stream: TextIO | None = None, clock=time.monotonic, max_restarts: int = 0):
        self.name, self.unit, self.total, self.hosts = name, unit, total, hosts
        self.max_restarts = max_restarts  # the job's restart budget: a rank's death restarts it only with one
        self.stream = stream or sys.stdout
        self.live = live_display() if live is None else live
        self.clock = clock
        self.t0 = self.last_line_t = clock()
        self.done = 0
        self.step: int | None = None
        self.loss: float | None = None
        self.accuracy: float | None = None
        self.samples_per_sec: float | None = None
        self.hosts_up = hosts
        self.restarts = 0
        self.rank_deaths = 0
        self.quiet_s: float | None = None  # while the job stalls: how long no rank has written a line
        self._epochs_done: set[int] = set()
        self._closed = False
        self._stopped = False  # closed by an interrupt
        self._latest = ""  # while the job starts: the last line any of its processes wrote
        self._drawn_t = self.t0  # when the live display was last redrawn
        self._deaths_seen_at_restart = 0  # rank failures the last restart answered
        self._bar = None
        if self.live:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=name, unit=unit, leave=True, dynamic_ncols=True,
                             bar_format="{desc} {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}] {postfix}"
                             if total else "{desc} {n_fmt} {unit} [{elapsed}] {postfix}")

    # ------------------------------------------------------------------ input

    def feed(self, rank: str, line: str) -> None:
        """One relayed line (`[host/rank] text`); `rank` is "" for a host's own (launcher) lines."""
        text = line.split("] ", 1)[-1]
        if self.step is None and text.strip():
            self._latest = text.strip()
        if not rank:
            if _RANK_FAILED.search(text):
                self.rank_deaths += 1
                self._refresh()
            return
        for record in metrics.parse_lines([line]):
            self._record(record)

    def set_hosts_up(self, up: int) -> None:
        if up != self.hosts_up:
            self.hosts_up = up
            self._refresh()

    def _record(self, record: dict[str, Any]) -> None:
        if record.get("rank", 0) != 0:
            return  # rank 0 speaks for the job (lab 1: the coordinator)
        if "resumed_step" in record and record.get("restart"):  # restart k of this job (0: a new job resuming)
            self.restarts = max(self.restarts, int(record["restart"]))
            self._deaths_seen_at_restart = self.rank_deaths
        if "step" in record and isinstance(record["step"], int):
            self.step = record["step"]
        if "train_loss" in record:
            self.loss = record["train_loss"]
        if "test_accuracy" in record:
            self.accuracy = record["test_accuracy"]
            if isinstance(record.get("epoch"), int):
                self._epochs_done.add(record["epoch"])
        if "samples_per_sec" in record:
            self.samples_per_sec = record["samples_per_sec"]
        if self.unit == "epoch":  # the epochs the job is through: a resumed one did the first ones before
            done = max(self._epochs_done, default=0)
        else:
            done = self.step or 0
        self._set(done)

    # ------------------------------------------------------------------ output

    def tick(self) -> None:
        """Called often (the cluster's loop): redraw a live display once a second even when no line came,
        so its clock moves while the processes start (lab 1: six TensorFlow processes, a minute or more)
        and through a long step; off a terminal, the minute's line comes even from a silent job."""
        if self._bar is None or self.clock() - self._drawn_t >= TICK_S:
            self._refresh()

    def postfix(self) -> str:
        parts = []
        if self.step is None and not self._closed:  # no step yet: say what the wait is
            latest = self._latest if len(self._latest) <= 60 else self._latest[:57] + "..."
            parts.append("starting: waiting for the first step" + (f" (latest: {latest})" if latest else ""))
        if self.unit != "step" and self.step is not None:
            parts.append(f"step {self.step}")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3g}")
        if self.accuracy is not None:
            parts.append(f"test acc {self.accuracy:.3f}")
        if self.samples_per_sec is not None:
            parts.append(f"{self.samples_per_sec:,.0f} samples/s")
        if not self._closed:
            parts.append(f"{self.hosts_up}/{self.hosts} hosts up")
        if self.rank_deaths > self._deaths_seen_at_restart:
            # torchrun restarts the ranks only while the job has restarts left (--max-restarts K)
            restarting = not self._closed and self.restarts < self.max_restarts
            parts.append("a rank failed: restarting" if restarting else "a rank failed")
        if self.quiet_s is not None and not self._closed:
            parts.append(f"stalled: no line for {self.quiet_s:.0f} s")
        if self.restarts:
            parts.append(f"{self.restarts} restart(s)")
        if self._stopped:
            parts.append("stopped by an interrupt")
        return ", ".join(parts)

    def summary(self) -> str:
        """The display as one line of text."""
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        return f"[progress] {self.name}: {count} {self.unit}(s) in {self.clock() - self.t0:.1f} s; {self.postfix()}"

    def stalled(self, quiet_s: float, lines: list[str]) -> None:
        """No rank has written a line for `quiet_s` seconds: show it, and print `lines` (who is
        stalled, each rank's last line) under the display."""
        self.quiet_s = quiet_s
        self._print(lines)
        self._refresh()

    def recovered(self, lines: list[str]) -> None:
        """The stall is over: a rank wrote again."""
        self.quiet_s = None
        self._print(lines)
        self._refresh()

    def notice(self, lines: list[str]) -> None:
        """Lines a script marked for its user (`NOTE: ...`: a damaged checkpoint passed over), printed with the
        display (in the log too, as every line)."""
        self._print(lines)
        self._refresh()

    def _print(self, lines: list[str]) -> None:
        if self._bar is not None:
            for line in lines:
                self._bar.write(line, file=self.stream)  # above a terminal's bar; a notebook's widget stays
        else:
            print("\n".join(lines), file=self.stream, flush=True)

    def _set(self, done: int) -> None:
        self.done = done
        if self._bar is not None:
            self._bar.n = min(done, self.total) if self.total else done
        self._refresh()

    def _refresh(self) -> None:
        if self._bar is not None:
            self._drawn_t = self.clock()
            self._bar.set_postfix_str(self.postfix(), refresh=False)
            self._bar.refresh()
        elif self.clock() - self.last_line_t >= HEARTBEAT_S:
            self.last_line_t = self.clock()
            print(self.summary(), file=self.stream, flush=True)

    def close(self, stopped: bool = False) -> None:
        """End the display: the bar stays as it ended (live), or its one line is printed. `stopped`: the job
        was interrupted (Ctrl-C, a notebook's interrupt), and the display says so rather than stay as it was."""
        if self._closed:
            return
        self._closed = True
        self._stopped = stopped
        if self._bar is not None:
            self._bar.set_postfix_str(self.postfix(), refresh=False)
            self._bar.close()
            self._bar = None
        else:
            print(self.summary(), file=self.stream, flush=True)
