"""One progress display per local job instead of every rank's lines (`workshop.runtime.progress`).

Fast tests feed the display the lines a job prints; the slow one runs a job through the CLI whose
rank fails: it is still reported with its own lines. (The short output with the progress line and
the logs' path, and `--verbose` as before, are checked on the two runs of
tests/test_fault_tolerance.py::test_the_cli_kills_a_rank_on_another_host_and_the_run_recovers_exactly.)
"""

from __future__ import annotations

import io
import re
import time

import pytest

from workshop.__main__ import main
from workshop.runtime.progress import (
    HEARTBEAT_S,
    JobProgress,
    LiveLine,
    notebook_bundle,
    progress_total,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def display(unit: str = "epoch", total: int | None = 3, max_restarts: int = 0) -> tuple[JobProgress, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    budget = {"max_restarts": max_restarts} if max_restarts else {}  # none given: as a job without --max-restarts
    return JobProgress("data-parallel", unit, total, 2, live=False, stream=out, clock=clock, **budget), out, clock


def test_what_a_job_counts_comes_from_its_hyperparameters():
    assert progress_total({"epochs": 3, "log-interval": 5}) == ("epoch", 3)
    assert progress_total({"steps": "60", "epochs": 2}) == ("step", 60)  # labs 1 and 4 count steps
    assert progress_total({}) == ("step", None)


def test_rank_0s_metrics_move_the_display_and_the_log_gets_one_line():
    progress, out, clock = display()
    progress.feed("1", "[algo-2/1] METRICS rank=1 epoch=1 step=5 train_loss=9.0")  # rank 0 speaks for the job
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=5 train_loss=2.5")
    progress.feed("0", "[algo-1/0] Configuration: {...}")
    assert (progress.done, progress.step, progress.loss) == (0, 5, 2.5)
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=31 test_loss=0.4 test_accuracy=0.871 "
                       "epoch_time_s=1.0 samples_per_sec=3930.9")
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=2 step=62 test_loss=0.2 test_accuracy=0.94")
    assert progress.done == 2 and progress.accuracy == 0.94
    assert out.getvalue() == ""  # nothing redraws off a terminal: nothing until the end ...
    clock.t += 12.5
    progress.close()
    progress.close()  # ... then exactly one line
    assert out.getvalue() == ("[progress] data-parallel: 2/3 epoch(s) in 12.5 s; step 62, loss 2.5, test acc 0.940, "
                              "3,931 samples/s\n")


def test_a_long_job_off_a_terminal_says_it_is_alive_once_a_minute():
    progress, out, clock = display("step", 300)
    for step in range(1, 301):
        clock.t += 1.0  # a step a second: 5 minutes
        progress.feed("0", f"[algo-1/0] METRICS rank=0 step={step} train_loss=1.0")
    assert len(out.getvalue().splitlines()) == int(300 // HEARTBEAT_S)
    assert out.getvalue().splitlines()[0].startswith("[progress] data-parallel: 60/300 step(s) in 60.0 s; training: loss 1")


RANK_DIED = "[algo-2] E1123 16:20:58.187 5338 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 5377) of binary: python"


def test_a_rank_death_and_the_restart_show_in_the_display():
    progress, _, _ = display(max_restarts=1)
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=30 train_loss=0.32")
    progress.feed("", RANK_DIED)
    progress.set_hosts_up(2)
    assert "a rank failed: restarting" in progress.postfix()
    progress.feed("0", "[algo-1/0] METRICS rank=0 step=25 restart=1 resumed_step=24 lost_steps=6 recover_s=4.0")
    assert progress.restarts == 1 and progress.step == 25
    assert progress.postfix() == "training: step 25, loss 0.32, 1 restart(s)"
    progress.feed("", RANK_DIED)  # again, with the budget of one restart spent: the job fails
    assert progress.postfix() == "training: step 25, loss 0.32, a rank failed, 1 restart(s)"
    progress.set_hosts_up(0)
    progress.close()
    assert progress.postfix() == "step 25, loss 0.32, a rank failed, 1 restart(s)"


def test_a_rank_death_in_a_job_without_restarts_is_not_called_a_restart():
    """The issue's job had no --max-restarts, and the display said "a rank failed: restarting"."""
    progress, _, _ = display()  # no restart budget, as `run` without --max-restarts
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=30 train_loss=0.32")
    progress.feed("", RANK_DIED)
    assert progress.postfix() == "training: step 30, loss 0.32, a rank failed"


def test_a_stall_is_shown_until_a_line_comes_again():
    progress, out, clock = display()
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=30 train_loss=0.32")
    clock.t += 120
    note = ["[stall] No rank has written a line for 120 s. Rank 1 on algo-2 stopped answering: ...",
            "[stall]   120 s ago: [algo-2/1] step 30"]
    progress.stalled(120.4, note)
    # Off a terminal too: the note's own lines at once, then the display's line (a minute has passed).
    assert out.getvalue().splitlines() == [
        *note, "[progress] data-parallel: 0/3 epoch(s) in 120.0 s; training: step 30, loss 0.32, "
               "stalled: no line for 120 s"]
    assert progress.postfix() == "training: step 30, loss 0.32, stalled: no line for 120 s"
    progress.recovered(["[stall] Ended after 130 s without a line: rank 1 on algo-2 wrote: step 31"])
    assert out.getvalue().endswith("[stall] Ended after 130 s without a line: rank 1 on algo-2 wrote: step 31\n")
    assert progress.postfix() == "training: step 30, loss 0.32"


@pytest.mark.slow
def test_a_failing_rank_is_reported_with_its_own_lines_without_verbose(tmp_path, mnist_dir, capsys):
    code = main(["run", "data_parallel", "--hosts", "2", "--data-dir", str(mnist_dir), "--hp", "epochs=1",
                 "--fault", "kill-rank=1@step=8", "--workdir", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 2
    assert "[progress] data-parallel: 0/1 epoch(s)" in out.out and "a rank failed" in out.out
    assert "error: Rank 1 on algo-2 was killed by SIGKILL" in out.err
    assert "The injected fault: FAULT: killing rank 1 at step 8 (--fault kill-rank=1@step=8)" in out.err
    assert "[algo-2/1] FAULT: killing rank 1 at step 8" in out.err  # the rank's own last lines


def test_while_the_job_starts_the_display_says_so_and_its_clock_moves(monkeypatch, capsys):
    """The issue: lab 1's bar stood at 0/300 for ~100 s, unchanged, while six TensorFlow processes started."""
    monkeypatch.setenv("COLUMNS", "200")
    clock = Clock()
    progress = JobProgress("parameter-server", "step", 300, 3, live=True, clock=clock)  # a terminal's line, on stderr
    progress.feed("", "[algo-2] [ps_driver] started worker 0 (pid 4242)")
    assert progress.postfix() == "hosts starting (1/3 ready)"
    capsys.readouterr()
    for _ in range(5):  # five seconds of the cluster's loop without a line: five redraws, the clock moving
        clock.t += 0.25
        progress.tick()
        clock.t += 0.75
        progress.tick()
    drawn = capsys.readouterr().err.split("\r")[1:]
    assert 5 <= len(drawn) <= 6, drawn
    assert drawn[-1].startswith("parameter-server ▕                    ▏ 0/300 steps 00:05 hosts starting (1/3 ready)")
    progress.feed("0", "[algo-1/0] METRICS rank=0 step=1 train_loss=2.3")
    assert progress.postfix() == "training: loss 2.3"
    progress.close()


# What a lab 1 job's hosts write before its first step (container runtime, cut short): sm_train.sh's shell
# trace and the JSON it prints, the drivers' lines, the processes' first lines.
LAB1_START = [
    ("", "[algo-1] Starting training script"),
    ("", "[algo-1] ++ /work/main/.venv/bin/python3 /opt/ml/input/data/sm_drivers/scripts/environment.py"),
    ("", '[algo-1]   "current_host": "algo-1",'),
    ("", "[algo-2] Starting training script"),
    ("", "[algo-1] SM_HPS={\"steps\": 300, \"log-interval\": 50}"),
    ("", "[algo-1] Running ParameterServer Driver"),
    ("", "[algo-1] ++ /work/main/.venv/bin/python3 /opt/ml/input/data/sm_drivers/distributed_drivers/ps_driver.py"),
    ("", "[algo-2] ++ cat /opt/ml/input/config/inputdataconfig.json"),
    ("", "[algo-2] Running ParameterServer Driver"),
    ("", "[algo-3] Starting training script"),
    ("", "[algo-3] Running ParameterServer Driver"),
    ("", '[algo-1] [ps_driver] started ps 0 (pid 10103): TF_CONFIG task {"type": "ps", "index": 0}; python3 train.py'),
    ("", "[algo-1] [ps0] ps 0 serving at grpc://algo-1:7778 (host algo-1; TensorFlow imported in 19.4 s, serving 19.4 "
         "s after the start)"),
    ("1", "[algo-2/1] worker 0 serving at grpc://algo-2:7781 (host algo-2; TensorFlow imported in 10.7 s, serving 10.7 "
          "s after the start)"),
    ("0", '[algo-1/0] Coordinator: 2 worker(s), 3 parameter server(s). Configuration: {"args": {"batch_size": 64}}'),
    ("0", "[algo-1/0] METRICS rank=0 variable=conv1/kernel shard=0 shards=1 device=/job:ps/replica:0/task:0/device:CPU:0"),
]
PHASES = ["hosts starting (0/3 ready)"] * 5 + ["hosts starting (1/3 ready)"] * 3 + ["hosts starting (2/3 ready)"] * 2 + [
    "importing the framework"] * 2 + ["servers starting (1 up)", "servers starting (2 up)"] + [
    "waiting for the first step"] * 2


def test_the_display_says_each_phase_in_words_and_never_shows_a_raw_line():
    """The issue: its "latest:" text showed `++ <checkout>/.venv/bin/python3 /opt/ml/input/data/sm_dri...` and
    `Configuration: {"args": {"backend": "auto", ...`, and a full bar read "300/300 step ... 2/3 hosts up"."""
    clock = Clock()
    progress = JobProgress("parameter-server", "step", 300, 3, live=False, stream=io.StringIO(), clock=clock)
    seen = []
    for rank, line in LAB1_START:
        progress.feed(rank, line)
        seen.append(progress.phase())
        text = progress.text()
        assert line.split("] ", 1)[1][:12] not in text, (line, text)  # no piece of any line it was fed
        assert not any(c in text for c in '{}"+'), text
    assert seen == PHASES
    progress.feed("0", "[algo-1/0] METRICS rank=0 step=50 train_loss=0.97 test_accuracy=0.877")
    assert progress.postfix() == "training: loss 0.97, test acc 0.877"
    clock.t += 20
    progress.feed("0", "[algo-1/0] METRICS rank=0 step=100 train_loss=0.21 test_accuracy=0.954")
    assert progress.text().startswith("parameter-server ▕██████▋             ▏ 100/300 steps 00:20 (~00:40 left) training")
    progress.feed("0", "[algo-1/0] METRICS rank=0 step=300 train_loss=0.05 test_accuracy=0.967")
    assert progress.postfix() == "finishing (0/3 hosts done): loss 0.05, test acc 0.967"
    progress.set_hosts_up(2)  # algo-1's coordinator saved the model and ended; the others follow
    assert progress.postfix() == "finishing (1/3 hosts done): loss 0.05, test acc 0.967"
    assert "hosts up" not in progress.text() and "left" not in progress.text()
    progress.close()
    assert progress.postfix() == "loss 0.05, test acc 0.967"


def test_in_the_process_runtime_a_host_is_ready_with_its_drivers_first_line():
    """No sm_train.sh there: the driver's first line is the host's first."""
    progress, _, _ = display("epoch", 3)
    assert progress.phase() == "hosts starting (0/2 ready)"
    progress.feed("", "[algo-1] [torchrun] launching 1 process")
    progress.feed("", "[algo-2] [torchrun] launching 1 process")
    assert progress.phase() == "importing the framework"
    progress.feed("0", "[algo-1/0] Backend gloo (CPU).")
    assert progress.phase() == "waiting for the first step"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminals_line_is_cut_to_its_width_and_never_wraps(monkeypatch):
    """The issue: the line dropped to a line of its own and the job's name split ("horovod-" / "tensorflow")."""
    monkeypatch.setenv("COLUMNS", "60")
    out, clock = Terminal(), Clock()
    progress = JobProgress("horovod-tensorflow", "epoch", 2, 2, live=True, clock=clock, line=LiveLine(stream=out))
    for rank, line in LAB1_START:
        progress.feed(rank, line.replace("algo-3", "algo-2"))
        clock.t += 1
        progress.tick()
    progress.stalled(130, ["[stall] No rank has written a line for 130 s."])  # a line of its own, above
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=30 train_loss=0.32 test_accuracy=0.91 samples_per_sec=812.5")
    clock.t += 1
    progress.tick()
    progress.close()
    drawn = out.getvalue()
    assert "[stall] No rank has written a line for 130 s.\n" in drawn
    redraws = [piece.split("\x1b[K")[0] for line in drawn.split("\n") for piece in line.split("\r")]
    assert all(len(piece) <= 59 for piece in redraws), max(redraws, key=len)
    assert all(piece.startswith("horovod-tensorflow ") for piece in redraws if piece and not piece.startswith("[stall]"))
    assert drawn.endswith("\n")  # the line as it ended stays, and what follows starts on a line of its own


def test_a_notebooks_line_is_one_output_redrawn_in_place_that_stays_one_row(monkeypatch):
    """No widget (a widget made JupyterLab's status bar say "Idle" while the cell ran: LiveLine's note): one
    display output, updated in place, whose HTML keeps it one row however narrow the output area."""
    import IPython.display

    shown = []

    class Handle:
        def update(self, obj, **kwargs):
            shown.append(("update", obj, kwargs))

    def fake_display(obj, **kwargs):
        shown.append(("display", obj, kwargs))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    clock = Clock()
    progress = JobProgress("horovod-tensorflow", "epoch", 2, 2, live=True, clock=clock, line=LiveLine(notebook=True))
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=30 train_loss=0.32 test_accuracy=0.91")
    clock.t += 1
    progress.tick()
    progress.close()
    assert [kind for kind, _, _ in shown] == ["display", "update", "update", "update"]
    assert shown[0][2] == {"raw": True, "display_id": True} and all(kw == {"raw": True} for _, _, kw in shown[1:])
    last = shown[-1][1]
    assert last["text/plain"].startswith("horovod-tensorflow ▕██████████          ▏ 1/2 epochs 00:01 step 30, loss 0.32")
    assert "white-space: pre" in last["text/html"] and "text-overflow: ellipsis" in last["text/html"]
    assert notebook_bundle('a <b> & "c"')["text/html"].endswith('>a &lt;b&gt; &amp; &quot;c&quot;</div>')


def test_still_in_a_notebook_is_one_line_per_cell_however_many_waits(monkeypatch):
    """The issue: lab 4's runs printed 17 "still running" lines in one run; now one line, redrawn."""
    import IPython.display

    from workshop.runtime import progress as progress_module
    from workshop.runtime.progress import still

    shown = []

    class Handle:
        def update(self, obj, **kwargs):
            shown.append(("update", obj["text/plain"]))

    def fake_display(obj, **kwargs):
        shown.append(("display", obj["text/plain"]))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    monkeypatch.setattr(progress_module, "in_notebook", lambda: True)
    monkeypatch.setattr(progress_module, "_cell_id", lambda: "cell-7")
    for key in ("no_shard", "full_shard"):
        with still(f"running {key} at N=2"):
            time.sleep(0.05)
    texts = [re.sub(r"\d+ s$", "N s", text) for _, text in shown]  # the seconds, however long the waits took
    assert [kind for kind, _ in shown].count("display") == 1 and shown[0][0] == "display"
    assert texts[0] == "  still running no_shard at N=2: N s"
    assert "  running no_shard at N=2: N s" in texts and "  still running full_shard at N=2: N s" in texts
    assert texts[-1] == "  running full_shard at N=2: N s"
    monkeypatch.setattr(progress_module, "_cell_id", lambda: "cell-8")  # the next cell: a line of its own
    with pytest.raises(ZeroDivisionError), still("measuring N=3"):
        raise ZeroDivisionError
    assert [kind for kind, _ in shown].count("display") == 2
    assert re.fullmatch(r"  measuring N=3: stopped after \d+ s", shown[-1][1])


def test_still_in_a_terminal_redraws_its_line_and_clears_it_at_the_end(monkeypatch, capsys):
    from workshop.runtime import progress as progress_module
    from workshop.runtime.progress import still

    monkeypatch.setattr(progress_module, "live_display", lambda: True)
    with still("loading the SageMaker SDK"):
        time.sleep(0.05)
    err = capsys.readouterr().err  # drawn once at the start (then once a second), cleared at the end
    assert re.fullmatch(r"\r  still loading the SageMaker SDK: \d+ s\x1b\[K\r\x1b\[K", err), err


def test_an_interrupted_job_says_so_when_its_display_closes():
    progress, out, clock = display()
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=5 train_loss=2.5")
    clock.t += 3
    progress.close(stopped=True)
    assert out.getvalue() == "[progress] data-parallel: 0/3 epoch(s) in 3.0 s; step 5, loss 2.5, stopped by an interrupt\n"


def test_a_first_run_says_it_loads_the_sdks_launchers_before_the_long_silent_import(monkeypatch, capsys):
    """Lab 1's training cell sat 25 s with no output under load: `sagemaker.train.distributed`'s first import."""
    import sys

    from workshop import runner
    from workshop.labs import get_lab

    lab = get_lab("parameter_server")

    class Imported(Exception):
        pass

    def config(*args, **kwargs):
        raise Imported  # where the import would happen: nothing starts in this test
    monkeypatch.setattr(type(lab), "distributed_config", lambda self, *a, **k: config())
    monkeypatch.delitem(sys.modules, runner.SDK_LAUNCHERS, raising=False)
    monkeypatch.setattr(runner, "live_display", lambda: False)  # a log (CI, the CLI in a pipe): its few lines only
    with pytest.raises(Imported):
        runner.run_local(lab)
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(runner, "live_display", lambda: True)  # a notebook, a terminal
    with pytest.raises(Imported):
        runner.run_local(lab)
    assert "loading the SageMaker SDK's launcher configs" in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, runner.SDK_LAUNCHERS, object())  # already loaded: nothing to say
    with pytest.raises(Imported):
        runner.run_local(lab)
    assert capsys.readouterr().out == ""


def test_still_says_a_silent_wait_goes_on_every_few_seconds_until_it_ends():
    from workshop.runtime.progress import still

    said = []
    with pytest.raises(ZeroDivisionError), still("measuring N=2", every_s=0.2, echo=said.append):
        time.sleep(0.7)
        raise ZeroDivisionError  # however it ends, the lines stop
    count = len(said)
    time.sleep(0.5)
    assert 2 <= count <= 4 and len(said) == count, said
    assert said[0] == "  still measuring N=2: 0 s"
