"""One live progress display per local job, instead of every rank's log lines.

The ranks' `METRICS key=value ...` lines (`workshop.metrics`) already say how far a job is: the
global step, the epoch, the latest training loss and test accuracy. `JobProgress` reads them as
the local cluster relays each line and shows one line per job, redrawn in place:

    data-parallel ▕█████████████▍      ▏ 2/3 epochs 00:09 (~00:04 left) training: step 62, loss 0.219, test acc 0.940

Before rank 0's first step the line says, in words, which phase the job is in (a parameter server's
six TensorFlow processes take a minute or more to start), never a raw log line:

    hosts starting (1/3 ready)   each host's set-up (`sm_train.sh`) before its driver runs
    importing the framework      the drivers started the processes, which import PyTorch or TensorFlow
    servers starting (2 up)      lab 1: TensorFlow servers serving, before the coordinator (rank 0) speaks
    waiting for the first step   the processes are up (they printed), the first step's numbers not yet
    training                     rank 0 reported a step
    finishing (2/3 hosts done)   the last step is done, or a host has ended: saving, stopping

Where it is drawn (`LiveLine`):
- in a notebook, one output redrawn in place (IPython's `display(..., display_id=True)` and its
  update): HTML that never wraps (one row, cut with an ellipsis where the output area is narrow), with
  the same line as text for any other front end. Not a widget: a widget makes JupyterLab's widget
  manager open a subshell on the kernel's control channel, whose reply's "idle" status JupyterLab takes
  for the kernel's, so its status bar read "Idle" for the rest of a running cell (`LiveLine`'s note);
- in a terminal, one line redrawn with a carriage return, cut to the terminal's width so it never wraps
  (a wrapped line is not redrawn in place but repeated);
- anywhere else (a pipe, CI's log, a test capturing output) nothing redraws: one line when the job
  ends, and one a minute while it runs, so a log stays short but a long job is seen to be alive.

A live line is redrawn every second, so its clock moves even while nothing is written. Interrupted,
it says so. `still` is the same line for a wait that prints nothing of its own (an import, a run whose
output comes at its end).

The full logs are in the run's folder, whose path the cluster prints; `verbose=True` (CLI:
`--verbose`) streams every line as before instead. A failure is reported as before (the failing
rank and its traceback), after the display is closed. A job whose ranks have all gone silent (the
local cluster's stall watch, `LocalCluster(stall_s=...)`) is said so, in the display and in lines of
its own, each rank's last line with them, until it recovers or ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import html
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from workshop import metrics

# torchrun's agent when a rank ends badly; the labs' scripts when they resume after a restart.
_RANK_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+")
# A host's own lines: `sm_train.sh` begins its set-up so (the container runtime), and says so as it runs the driver.
_SETUP_START = ("Starting training script", "[hostns]")
_DRIVER_START = re.compile(r"^Running .+ [Dd]river$")
# A TensorFlow server (lab 1's parameter servers and workers) once it serves: `ps 0 serving at grpc://...`. On 2 cores
# six TensorFlow processes import it for 10-20 s, and the servers come up one by one: the display counts them.
_SERVING = re.compile(r"(?:^|\] )(?:ps|worker) \d+ serving at ")
HEARTBEAT_S = 60.0  # not live: a line this often while the job runs
TICK_S = 1.0  # live: the display is redrawn at least this often, so its clock moves while no rank writes
REDRAW_S = 0.2  # live: and at most this often, however fast the lines come
STALL_S = 120.0  # no line from any rank for this long: the job stalls (LocalCluster's stall_s)
BAR_WIDTH = 20  # characters of the bar
NOTEBOOK_STYLE = ("white-space: pre; overflow: hidden; text-overflow: ellipsis; padding-left: var(--jp-code-padding, 5px); "
                  "font-family: var(--jp-code-font-family, monospace); font-size: var(--jp-code-font-size, 13px); "
                  "line-height: var(--jp-code-line-height, 1.3)")


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (a notebook): there a table is displayed, rendered, not printed."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def live_display(stream: TextIO | None = None) -> bool:
    """Whether a display can be redrawn here: a Jupyter kernel (an output redrawn in place) or a terminal."""
    if in_notebook():
        return True
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def _cell_id() -> str | None:
    """The running notebook cell's request id (None outside a kernel): a `still` line is one per cell."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    header = (getattr(shell, "parent_header", None) or {}).get("header") or {}
    return header.get("msg_id")


class LiveLine:
    """One line of text redrawn in place: an output of the notebook's cell, or a terminal's line.

    In a notebook it is a display output updated in place (`update_display_data`), not an ipywidget: the
    first widget a kernel shows makes JupyterLab's widget manager send `create_subshell_request` on the
    control channel; the kernel answers it at once, between a "busy" and an "idle" status, and JupyterLab
    shows the last status it received whatever request it answers (jupyterlab/jupyterlab#10701), so the
    status bar said "Idle" until the running cell ended. The HTML never wraps, so a narrow output area cuts
    the line (with an ellipsis) rather than breaking it, a job's name included.

    `draw` may be called from any thread (`still`'s ticker); a notebook's updates then carry the cell
    that made the line, as JupyterLab routes an update only within its cell's request."""

    def __init__(self, stream: TextIO | None = None, notebook: bool | None = None):
        self.notebook = in_notebook() if notebook is None else notebook
        self.stream = stream or sys.stderr  # a terminal's line: stderr, as tqdm's, so stdout stays the run's own
        self.text = ""
        self._handle = None
        self._drawn = False
        self._lock = threading.Lock()
        self._context = contextvars.copy_context()  # the cell's request, for draws from another thread

    def draw(self, text: str) -> None:
        with self._lock:
            self.text = text
            if self.notebook:
                self._context.run(self._show, text)
            else:
                self.stream.write("\r" + fit(text, _columns(self.stream)) + "\x1b[K")
                self.stream.flush()
            self._drawn = True

    def _show(self, text: str) -> None:
        from IPython.display import display

        bundle = notebook_bundle(text)
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)

    def write(self, line: str) -> None:
        """A line of its own, under (notebook) or above (terminal) the live one."""
        with self._lock:
            if self.notebook:
                print(line, flush=True)
            else:
                self.stream.write("\r\x1b[K" + line + "\n")
                if self._drawn:
                    self.stream.write(fit(self.text, _columns(self.stream)) + "\x1b[K")
                self.stream.flush()

    def close(self, text: str | None = None, keep: bool = True) -> None:
        """The last drawing: `text` (else the line as it is) stays; `keep=False`: a terminal's line is
        cleared instead (a notebook's output stays, as `text`)."""
        if text is not None and (self.notebook or keep):
            self.draw(text)
        if not self.notebook and self._drawn:
            with self._lock:
                self.stream.write("\n" if keep else "\r\x1b[K")
                self.stream.flush()
                self._drawn = False


def notebook_bundle(text: str) -> dict[str, str]:
    """A notebook's output of one line: HTML that stays one row (cut with an ellipsis where the output area
    is narrower), and the same text for a front end that shows no HTML."""
    return {"text/plain": text, "text/html": f'<div style="{NOTEBOOK_STYLE}">{html.escape(text)}</div>'}


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return int(os.environ.get("COLUMNS", "") or 100)


def fit(text: str, columns: int) -> str:
    """`text` cut to fit a terminal `columns` wide (one short, so the cursor never wraps the line)."""
    width = max(columns - 1, 10)
    return text if len(text) <= width else text[: width - 3] + "..."


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """`▕████▌     ▏`: `done` of `total` in eighths of a character."""
    eighths = round(width * 8 * min(max(done, 0), total) / total) if total > 0 else 0
    full, part = divmod(eighths, 8)
    return "▕" + "█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "") + " " * (width - full - (1 if part else 0)) + "▏"


def clock_text(seconds: float) -> str:
    """`mm:ss`, or `h:mm:ss` from an hour."""
    minutes, secs = divmod(int(max(seconds, 0)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


@contextlib.contextmanager
def still(what: str, every_s: float = 10.0, echo: Callable[[str], None] | None = None) -> Iterator[None]:
    """Around a wait that prints nothing of its own (an import, a measurement): where a display is live
    (a notebook, a terminal), one line `  still {what}: N s` redrawn every second, which ends as
    `  {what}: N s` (a notebook; a terminal's is cleared) -- one line per notebook cell, however many
    waits the cell has; elsewhere (a log), or with `echo`, that line printed every `every_s` seconds.
    From a thread of its own, until the block ends (however it ends)."""
    done = threading.Event()
    t0 = time.monotonic()
    line = None
    if echo is None and live_display():
        line = _cell_line() if in_notebook() else LiveLine()
    say = echo or print

    def tick() -> None:
        if line is not None:
            while True:
                line.draw(f"  still {what}: {time.monotonic() - t0:.0f} s")
                if done.wait(TICK_S):
                    return
        while not done.wait(every_s):
            say(f"  still {what}: {time.monotonic() - t0:.0f} s")

    ticker = threading.Thread(target=tick, name="workshop-still", daemon=True)
    ticker.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        done.set()
        ticker.join()
        if line is not None:
            took = f"{time.monotonic() - t0:.0f} s"
            line.close(f"  {what}: {took}" if ok else f"  {what}: stopped after {took}", keep=line.notebook)


_cell_lines: dict[str, LiveLine] = {}  # a notebook cell's request id -> its one `still` line


def _cell_line() -> LiveLine:
    """The `still` line of the running cell: made by its first wait, redrawn by the next ones."""
    cell = _cell_id()
    line = _cell_lines.get(cell) if cell else None
    if line is None:
        line = LiveLine(notebook=True)
        if cell:
            _cell_lines.clear()  # an earlier cell's line is done with
            _cell_lines[cell] = line
    return line


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
                 stream: TextIO | None = None, clock=time.monotonic, max_restarts: int = 0,
                 line: LiveLine | None = None):
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
        self._setting_up: set[str] = set()  # hosts in `sm_train.sh`'s set-up, their drivers not yet started
        self._ready: set[str] = set()  # hosts whose driver runs (or whose processes wrote)
        self._ranks_up = False  # a rank (not a host's launcher) has written a line
        self._serving: set[str] = set()  # TensorFlow servers that serve (lab 1), until rank 0 speaks
        self._rank0_up = False  # rank 0 (lab 1: the coordinator) has written a line
        self._first_step: tuple[float, int] | None = None  # when rank 0's first step came, and the count then
        self._drawn_t = self.t0 - TICK_S  # when the live display was last redrawn
        self._dirty = False  # it has news a redraw held back (REDRAW_S)
        self._deaths_seen_at_restart = 0  # rank failures the last restart answered
        self._line = (line or LiveLine()) if self.live else None
        if self._line is not None:
            self._line.draw(self.text())

    # ------------------------------------------------------------------ input

    def feed(self, rank: str, line: str) -> None:
        """One relayed line (`[host/rank] text`); `rank` is "" for a host's own (launcher) lines."""
        tag, _, text = line.partition("] ")
        host = tag.lstrip("[").split("/")[0]
        phase = self.phase()
        if _SERVING.search(text):
            self._serving.add(text.split(" serving at ")[0])
        if rank:
            self._ranks_up = True
            self._rank0_up = self._rank0_up or rank == "0"
            self._ready.add(host)
        elif host not in self._ready:
            if text.startswith(_SETUP_START) or host in self._setting_up:  # sm_train.sh's set-up ...
                self._setting_up.add(host)
                if _DRIVER_START.match(text):  # ... ends as it runs the driver
                    self._ready.add(host)
            elif text.strip():  # the process runtime: the driver's own first line
                self._ready.add(host)
        if self.phase() != phase:
            self._refresh(soon=True)
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
        since = self.clock() - self._drawn_t
        if self._line is None or since >= TICK_S or (self._dirty and since >= REDRAW_S):
            self._refresh()

    def phase(self) -> str | None:
        """Which phase the job is in, in words (None once the display is closed)."""
        if self._closed:
            return None
        if self.step is None:
            if not self._ranks_up and len(self._ready) < self.hosts:
                return f"hosts starting ({len(self._ready)}/{self.hosts} ready)"
            if self._serving and not self._rank0_up:
                return f"servers starting ({len(self._serving)} up)"
            if not self._ranks_up:
                return "importing the framework"
            return "waiting for the first step"
        if (self.total and self.done >= self.total) or self.hosts_up < self.hosts:
            return f"finishing ({self.hosts - self.hosts_up}/{self.hosts} hosts done)"
        return "training"

    def postfix(self) -> str:
        """The phase, then what rank 0 reported and what went wrong: `training: step 62, loss 0.219`."""
        parts = []
        if self.unit != "step" and self.step is not None:
            parts.append(f"step {self.step}")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3g}")
        if self.accuracy is not None:
            parts.append(f"test acc {self.accuracy:.3f}")
        if self.samples_per_sec is not None:
            parts.append(f"{self.samples_per_sec:,.0f} samples/s")
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
        phase = self.phase()
        if phase is None:
            return ", ".join(parts)
        return f"{phase}: {', '.join(parts)}" if parts else phase

    def text(self) -> str:
        """The live line: name, bar, count, clock (and time left), phase and numbers."""
        now = self.clock()
        units = self.unit + ("" if self.total == 1 else "s")
        if self.total:
            count = f"{bar(self.done, self.total)} {min(self.done, self.total)}/{self.total} {units}"
        else:
            count = f"{self.done} {units}"
        elapsed = clock_text(now - self.t0)
        if self._first_step is not None and not self._closed and self.total and self.done < self.total:
            t_first, done_first = self._first_step
            if self.done > done_first and now > t_first:
                left = (self.total - self.done) * (now - t_first) / (self.done - done_first)
                elapsed += f" (~{clock_text(left)} left)"
        return f"{self.name} {count} {elapsed} {self.postfix()}".rstrip()

    def summary(self) -> str:
        """The display as one line of text (a log's)."""
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        return f"[progress] {self.name}: {count} {self.unit}(s) in {self.clock() - self.t0:.1f} s; {self.postfix()}"

    def stalled(self, quiet_s: float, lines: list[str]) -> None:
        """No rank has written a line for `quiet_s` seconds: show it, and print `lines` (who is
        stalled, each rank's last line) with the display."""
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
        if self._line is not None:
            for line in lines:
                self._line.write(line)  # above a terminal's line; under a notebook's, which stays in place
        else:
            print("\n".join(lines), file=self.stream, flush=True)

    def _set(self, done: int) -> None:
        if self._first_step is None:
            self._first_step = (self.clock(), done)
        self.done = done
        self._refresh(soon=True)

    def _refresh(self, soon: bool = False) -> None:
        """Redraw a live display (with `soon`, not if it was drawn in the last REDRAW_S: a burst of lines
        is one redraw, the next tick's); off a terminal, the minute's line if it is due."""
        now = self.clock()
        if self._line is not None:
            if not soon or now - self._drawn_t >= REDRAW_S:
                self._drawn_t, self._dirty = now, False
                self._line.draw(self.text())
            else:
                self._dirty = True
        elif now - self.last_line_t >= HEARTBEAT_S:
            self.last_line_t = now
            print(self.summary(), file=self.stream, flush=True)

    def close(self, stopped: bool = False) -> None:
        """End the display: the line stays as it ended (live), or its one line is printed. `stopped`: the job
        was interrupted (Ctrl-C, a notebook's interrupt), and the display says so rather than stay as it was."""
        if self._closed:
            return
        self._closed = True
        self._stopped = stopped
        if self._line is not None:
            self._line.close(self.text())
            self._line = None
        else:
            print(self.summary(), file=self.stream, flush=True)
