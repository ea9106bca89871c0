"""One progress display per local job instead of every rank's lines (`workshop.runtime.progress`).

Fast tests feed the display the lines a job prints; the slow one runs a job through the CLI whose
rank fails: it is still reported with its own lines. (The short output with the progress line and
the logs' path, and `--verbose` as before, are checked on the two runs of
tests/test_fault_tolerance.py::test_the_cli_kills_a_rank_on_another_host_and_the_run_recovers_exactly.)
"""

from __future__ import annotations

import io
import time

import pytest

from workshop.__main__ import main
from workshop.runtime.progress import HEARTBEAT_S, JobProgress, progress_total


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
    assert out.getvalue().splitlines()[0].startswith("[progress] data-parallel: 60/300 step(s) in 60.0 s; loss 1, 2/2 hosts up")


RANK_DIED = "[algo-2] E1123 16:20:58.187 5338 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 5377) of binary: python"


def test_a_rank_death_and_the_restart_show_in_the_display():
    progress, _, _ = display(max_restarts=1)
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=30 train_loss=0.32")
    progress.feed("", RANK_DIED)
    progress.set_hosts_up(2)
    assert "a rank failed: restarting" in progress.postfix()
    progress.feed("0", "[algo-1/0] METRICS rank=0 step=25 restart=1 resumed_step=24 lost_steps=6 recover_s=4.0")
    assert progress.restarts == 1 and progress.step == 25
    assert progress.postfix() == "step 25, loss 0.32, 2/2 hosts up, 1 restart(s)"
    progress.feed("", RANK_DIED)  # again, with the budget of one restart spent: the job fails
    assert progress.postfix() == "step 25, loss 0.32, 2/2 hosts up, a rank failed, 1 restart(s)"
    progress.set_hosts_up(0)
    progress.close()
    assert progress.postfix() == "step 25, loss 0.32, a rank failed, 1 restart(s)"


def test_a_rank_death_in_a_job_without_restarts_is_not_called_a_restart():
    """The issue's job had no --max-restarts, and the display said "a rank failed: restarting"."""
    progress, _, _ = display()  # no restart budget, as `run` without --max-restarts
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=30 train_loss=0.32")
    progress.feed("", RANK_DIED)
    assert progress.postfix() == "step 30, loss 0.32, 2/2 hosts up, a rank failed"


def test_a_stall_is_shown_until_a_line_comes_again():
    progress, out, clock = display()
    progress.feed("0", "[algo-1/0] METRICS rank=0 epoch=1 step=30 train_loss=0.32")
    clock.t += 120
    note = ["[stall] No rank has written a line for 120 s. Rank 1 on algo-2 stopped answering: ...",
            "[stall]   120 s ago: [algo-2/1] step 30"]
    progress.stalled(120.4, note)
    # Off a terminal too: the note's own lines at once, then the display's line (a minute has passed).
    assert out.getvalue().splitlines() == [
        *note, "[progress] data-parallel: 0/3 epoch(s) in 120.0 s; step 30, loss 0.32, 2/2 hosts up, "
               "stalled: no line for 120 s"]
    assert progress.postfix() == "step 30, loss 0.32, 2/2 hosts up, stalled: no line for 120 s"
    progress.recovered(["[stall] Ended after 130 s without a line: rank 1 on algo-2 wrote: step 31"])
    assert out.getvalue().endswith("[stall] Ended after 130 s without a line: rank 1 on algo-2 wrote: step 31\n")
    assert progress.postfix() == "step 30, loss 0.32, 2/2 hosts up"


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


def test_while_the_job_starts_the_display_says_so_and_its_clock_moves(capsys):
    """The issue: lab 1's bar stood at 0/300 for ~100 s, unchanged, while six TensorFlow processes started."""
    clock = Clock()
    progress = JobProgress("parameter-server", "step", 300, 3, live=True, clock=clock)  # tqdm on stderr here
    progress.feed("", "[algo-2] [ps_driver] started worker 0 (pid 4242)")
    assert progress.postfix() == ("starting: waiting for the first step (latest: [ps_driver] started worker 0 "
                                  "(pid 4242)), 3/3 hosts up")
    capsys.readouterr()
    for _ in range(5):  # five seconds of the cluster's loop without a line: five redraws, the clock moving
        clock.t += 0.25
        progress.tick()
        clock.t += 0.75
        progress.tick()
    redraws = capsys.readouterr().err.count("starting: waiting for the first step")
    assert 5 <= redraws <= 6, redraws
    progress.feed("0", "[algo-1/0] METRICS rank=0 step=1 train_loss=2.3")
    assert "starting" not in progress.postfix()
    progress.close()


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
