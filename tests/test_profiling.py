"""The profiler report (issue 15): trace analysis on small synthetic Chrome traces, the checks made
before any process starts, and (slow) the real `profile` on lab 3 with 2 hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workshop import profiling
from workshop.__main__ import main
from workshop.errors import WorkshopError
from workshop.labs import LABS, get_lab
from workshop.profiling import profile, report_from
from workshop.trace_report import PARTS, ProfileReport, analyze, load_trace


def synthetic_trace(rank: int, world: int, waits_us: list[float], elements: int = 1000) -> dict:
    """One rank's trace as torch.profiler writes it for a DDP step on gloo: ProfilerStep#N on the
    training thread holding the DataLoader's __next__ (300 us), forward (5000), backward with the
    bucket's c10d::allreduce_ (100) inside AccumulateGrad, an unrecorded wait (waits_us[i]) that ends
    at DDP's `aten::as_strided` + `copy_bucket_to_grad` (50), the optimizer (400); gloo's own span
    on another thread (whose end runs late, as real ones do)."""
    pid, tid = 100 + rank, 100 + rank
    events, t = [], 1_000_000.0 + rank * 7  # the hosts' clocks need not agree

    def x(name, ts, dur, thread=tid, args=None, cat="cpu_op"):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": thread, "ts": ts, "dur": dur,
                       "args": args or {}})

    for i, wait in enumerate(waits_us):
        start = t
        x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 300, cat="user_annotation")
        t += 310
        x("DistributedDataParallel.forward", t, 5000, cat="user_annotation")
        x("aten::conv2d", t + 10, 4000)
        t += 5010
        x("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t, 150)
        x("c10d::allreduce_", t + 20, 100, args={"Input Dims": [[[elements]], [], [], [], [], []]})
        x("gloo:all_reduce", t + 60, 3000 + wait, thread=tid + 1, cat="user_annotation")
        t += 150 + wait  # the training thread waits, recorded as nothing
        x("aten::as_strided", t, 5)
        x("torch.distributed.ddp.reducer::copy_bucket_to_grad", t + 10, 40)
        t += 50
        x("Optimizer.step#SGD.step", t, 400, cat="user_annotation")
        t += 400
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{4 + i}", "pid": pid, "tid": tid,
                       "ts": start, "dur": t - start, "args": {}})
        t += 1
    return {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world}, "traceEvents": events}


def write_traces(folder: Path, traces: list[dict]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for trace in traces:
        path = folder / f"trace-rank{trace['distributedInfo']['rank']}.json"
        path.write_text(json.dumps(trace))
        paths.append(path)
    return paths


def test_a_steps_parts_as_the_trace_has_them():
    steps = analyze(synthetic_trace(0, 2, [2000.0, 500.0])).steps
    assert sorted(steps) == [4, 5]
    s = steps[4]
    assert s.total == pytest.approx((310 + 5010 + 150 + 2000 + 50 + 400) * 1e-6)
    assert s.data == pytest.approx(300e-6)
    assert s.comm_ops == pytest.approx(140e-6)  # c10d::allreduce_ and copy_bucket_to_grad (not gloo's thread)
    # the gap before DDP resumes (as_strided, then the copy), not the one before the all-reduce's launch
    assert s.wait == pytest.approx(2005e-6)
    assert s.compute == pytest.approx(s.total - 300e-6 - 140e-6 - 2005e-6)
    assert s.elements == 1000
    assert s.ring_bytes == pytest.approx(1000 * 4 * 2 * (2 - 1) / 2)  # the ring all-reduce: 2(N-1)/N x K


def test_the_parts_add_up_to_the_step_time_and_the_straggler_is_the_rank_that_waited_least():
    # rank 1 is slow: in every step rank 0 waits 3 ms for it, rank 1 only 0.2 ms (the transfer itself)
    report = ProfileReport.from_traces({0: synthetic_trace(0, 2, [3000, 3100, 2900]),
                                        1: synthetic_trace(1, 2, [200, 200, 200])})
    for s in report.summaries:
        assert sum(s.part(p) for p in PARTS) == pytest.approx(s.step_s, rel=1e-9)
        assert s.steps == 3
    r0, r1 = report.summaries
    assert report.straggler == 1 and r1.straggler_steps == 3 and r0.straggler_steps == 0
    assert r0.idle_s == pytest.approx(2.8e-3, rel=0.05) and r1.idle_s == pytest.approx(0.0, abs=1e-9)
    assert r0.communication_s == pytest.approx(r1.communication_s, rel=1e-6)  # the wait every rank had
    assert sum(report.share(p) for p in PARTS) == pytest.approx(1.0)
    table = report.table()
    assert "straggler: rank 1" in table and "MB sent/step" in table


def with_cpu(trace: dict, cpu_ms: list[float], cpus: list[int], machine: str) -> dict:
    """`trace` with the `workshop` entry the labs' StepProfiler writes: CPU seconds per ProfilerStep."""
    return {**trace, "workshop": {"step_cpu_s": {str(4 + i): ms / 1e3 for i, ms in enumerate(cpu_ms)},
                                  "cpus": cpus, "machine": machine}}


def test_the_machine_view_counts_the_core_time_the_ranks_did_not_use():
    """Four ranks on one 2-core machine: each rank waits ~3 ms a step, but the machine had 2 x step of
    core time and the threads used most of it: the throughput lost is 1 - CPU used / core time."""
    waits = [3000.0, 3000.0]
    # the local cluster's way: each host's ranks on a share of the CPUs (ranks 0, 1 on CPU 0; 2, 3 on CPU 1)
    traces = {r: with_cpu(synthetic_trace(r, 4, waits), [4.0, 4.0], cpus=[r // 2], machine="m1") for r in range(4)}
    report = ProfileReport.from_traces(traces)
    [view] = report.machines()
    assert view.ranks == [0, 1, 2, 3] and view.cores == 2
    step = report.summaries[0].step_s
    assert view.cpu_s == pytest.approx(4 * 4e-3) and view.capacity_s == pytest.approx(2 * step)
    assert report.lost_share() == pytest.approx(1 - 16e-3 / (2 * step))
    # the per-rank view counts every second of the wait: more than the machine lost
    assert report.share("communication") + report.share("idle") > report.lost_share()
    assert "4 rank(s) on 2 core(s)" in report.table() and "below the per-rank" in report.table()


def test_the_machine_view_groups_ranks_by_machine_and_needs_every_ranks_cpu_time():
    traces = {0: with_cpu(synthetic_trace(0, 2, [1000.0]), [5.0], cpus=list(range(8)), machine="a"),
              1: with_cpu(synthetic_trace(1, 2, [1000.0]), [3.0], cpus=list(range(8)), machine="b")}
    report = ProfileReport.from_traces(traces)
    views = report.machines()
    assert [(v.machine, v.ranks) for v in views] == [("a", [0]), ("b", [1])]
    # one rank per machine: its capacity is its own step (it cannot use the other 7 cores)
    assert views[0].capacity_s == pytest.approx(report.summaries[0].step_s)
    expected = 1 - 8e-3 / sum(s.step_s for s in report.summaries)
    assert report.lost_share() == pytest.approx(expected)
    assert "machine 2" in report.table()
    # a trace without the entry (another tool's): no machine view, the per-rank report stands
    bare = ProfileReport.from_traces({0: traces[0], 1: synthetic_trace(1, 2, [1000.0])})
    assert bare.machines() == [] and bare.lost_share() is None and "machine view" not in bare.table()


def test_the_report_writes_its_table_plot_and_traces(tmp_path):
    write_traces(tmp_path / "algo-1", [synthetic_trace(0, 2, [100, 900])])
    write_traces(tmp_path / "algo-2", [synthetic_trace(1, 2, [700, 100])])
    report = report_from([tmp_path / "algo-1", tmp_path / "algo-2"], out_dir=tmp_path / "out")
    assert (tmp_path / "out" / "profile.png").stat().st_size > 0
    assert (tmp_path / "out" / "profile.md").read_text().startswith(report.table().splitlines()[0])
    assert sorted(p.name for p in (tmp_path / "out" / "traces").iterdir()) == ["trace-rank0.json", "trace-rank1.json"]
    assert {s.straggler_steps for s in report.summaries} == {1}  # each rank was the straggler once


@pytest.mark.parametrize("key", sorted(k for k, lab in LABS.items() if lab.profile_flag is None))
def test_a_lab_that_cannot_be_profiled_is_refused_before_anything_starts(key, monkeypatch):
    monkeypatch.setattr(profiling, "run_local", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(WorkshopError) as err:
        profile(key, steps=3)
    lab = get_lab(key)
    framework = lab.sagemaker.framework if lab.sagemaker else ""
    assert ("TensorFlow" in str(err.value)) == ("tensorflow" in framework)
    assert err.value.fix and "data_parallel" in err.value.fix


@pytest.mark.parametrize("steps", [0, -1, 2.5, True])
def test_steps_below_one_are_refused_before_anything_starts(steps, monkeypatch):
    monkeypatch.setattr(profiling, "run_local", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(WorkshopError, match="steps must be a whole number") as err:
        profile("data_parallel", steps=steps)
    assert "--steps 5" in err.value.fix


def test_the_cli_refuses_steps_below_one_and_an_unprofilable_lab(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "data_parallel", "--steps", "0"])
    assert "--steps 5" in capsys.readouterr().err
    assert main(["profile", "1_parameter_server", "--steps", "2"]) == 2
    assert "TensorFlow" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["data_parallel", "horovod_pytorch"])
def test_profiled_steps_that_do_not_fit_in_an_epoch_are_refused_by_the_scripts_own_check(key):
    lab = get_lab(key)
    hps = {**lab.local_hyperparameters, **lab.profile_hyperparameters, lab.profile_flag: 20}
    # 4,000 samples over 4 ranks in batches of 64: 15 steps an epoch, 4 of them warm-up
    with pytest.raises(WorkshopError, match="does not fit in the first epoch") as err:
        lab.validate_hyperparameters(hps, world_size=4, train_samples=4000)
    assert "--profile-steps to 11 or less" in str(err.value)
    lab.validate_hyperparameters({**hps, lab.profile_flag: 11}, world_size=4, train_samples=4000)
    with pytest.raises(WorkshopError, match="--profile-steps must be 0"):
        lab.validate_hyperparameters({**hps, lab.profile_flag: -1}, world_size=4, train_samples=4000)


def test_missing_or_broken_traces_say_how_to_get_them(tmp_path):
    with pytest.raises(WorkshopError, match="No profiler traces") as err:
        report_from(tmp_path)
    assert "python -m workshop profile" in err.value.fix
    with pytest.raises(WorkshopError, match="No profiler trace at"):
        load_trace(tmp_path / "trace-rank0.json")
    (tmp_path / "trace-rank0.json").write_text('{"traceEvents": [')
    with pytest.raises(WorkshopError, match="not a Chrome trace"):
        report_from(tmp_path)
    write_traces(tmp_path, [synthetic_trace(0, 2, [100])])  # a world of 2, rank 1's trace missing
    with pytest.raises(WorkshopError, match=r"rank\(s\) 1 have none") as err:
        report_from(tmp_path)
    assert "every rank's trace" in err.value.fix
    (tmp_path / "trace-rank0.json").write_text(json.dumps({"traceEvents": [], "distributedInfo": {"rank": 0}}))
    with pytest.raises(WorkshopError, match="no ProfilerStep"):
        report_from(tmp_path)


def test_sagemaker_only_options_are_refused_in_local_mode(capsys):
    with pytest.raises(WorkshopError, match="mode='sagemaker' only"):
        profile("data_parallel", hosts=2, instance_type="ml.c5.xlarge")
    assert main(["profile", "data_parallel", "--yes"]) == 2
    assert "--yes appl(y/ies) to --mode sagemaker" in capsys.readouterr().err


@pytest.mark.slow
def test_profile_lab_3_as_a_sagemaker_job_builds_the_report_from_its_output_tar_gz(no_aws, tmp_path, mnist_dir,
                                                                                    capsys):
    """On SageMaker each host's traces are in its own /opt/ml/output/data; the service uploads them
    all in one output.tar.gz beside model.tar.gz (as the fake does), and the report is built from it."""
    import fake_sagemaker

    with fake_sagemaker.FakeSageMaker(workdir=tmp_path / "fake", start_skew_s=1.0) as fake:
        report = profile("data_parallel", hosts=2, procs_per_host=1, steps=3, mode="sagemaker",
                         data_dir=mnist_dir, runs_dir=tmp_path / "runs", confirm_cost=True)
        [run] = fake.jobs
    job = report.run
    assert job.ok and run.output_artifact == job.output_artifact
    assert job.output_artifact.endswith(f"/{job.job_name}/output/output.tar.gz")
    # the archive holds both hosts' traces (algo-1 wrote rank 0's, algo-2 rank 1's)
    out = tmp_path / "runs" / job.job_name
    assert sorted(p.relative_to(out / "output").as_posix() for p in (out / "output").rglob("*.json")) == \
        ["profile/trace-rank0.json", "profile/trace-rank1.json"]
    assert sorted(p.name for p in (out / "profile" / "traces").iterdir()) == ["trace-rank0.json", "trace-rank1.json"]
    assert (out / "profile" / "profile.png").stat().st_size > 0
    assert [s.rank for s in report.summaries] == [0, 1]
    for s in report.summaries:
        assert s.steps == 3
        assert sum(s.part(p) for p in PARTS) == pytest.approx(s.step_s, rel=1e-9)
        assert 421_642 * 4 <= s.bytes_per_step <= 421_642 * 4 + 24  # the gradients and the NaN check (above)
    printed = capsys.readouterr().out
    assert f"Output data from {job.output_artifact}" in printed and "straggler: rank" in printed


def test_a_job_without_a_model_artifact_has_no_output_to_download():
    from workshop.jobs.submit import JobResult

    done = JobResult("j", "Completed", {}, "s3://b/prefix/j/output/model.tar.gz", "url", "us-east-1")
    assert done.output_artifact == "s3://b/prefix/j/output/output.tar.gz"
    failed = JobResult("j", "Failed", {}, None, "url", "us-east-1")
    assert failed.output_artifact is None
    with pytest.raises(WorkshopError, match="no output data artifact"):
        failed.download_output("/nonexistent")


# ----------------------------------------------------------------------------- lab 2 (Horovod, PyTorch)

HVD_GRADIENTS = [[128, 3136], [10]]  # two gradients' shapes: 401,418 + 10 elements


def synthetic_horovod_trace(rank: int, world: int, waits_us: list[float]) -> dict:
    """One rank's trace as torch.profiler writes it for a Horovod (PyTorch) step: the DataLoader's
    __next__ (300 us), forward (5000), backward (Horovod's hooks enqueue each gradient's all-reduce,
    unrecorded), then the DistributedOptimizer's `Optimizer.step#SGD.step` around the wrapped SGD's own
    (400): before it, the wrapper waits (waits_us[i], unrecorded) and puts each averaged gradient back
    (`aten::set_`, 10 us each, 20 us apart), 5 us before the inner step. Horovod's background thread,
    where the all-reduce runs, is not in the trace."""
    pid = tid = 200 + rank
    events, t = [], 2_000_000.0 + rank * 11

    def x(name, ts, dur, args=None, cat="cpu_op"):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                       "args": args or {}})

    for i, wait in enumerate(waits_us):
        start = t
        x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 300, cat="user_annotation")
        t += 310
        x("aten::conv2d", t, 5000)
        t += 5010
        for _ in HVD_GRADIENTS:
            x("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t, 150)
            t += 160
        outer = t
        t += wait
        for shape in HVD_GRADIENTS:
            x("aten::set_", t, 10, args={"Input Dims": [shape, shape]})
            t += 30
        t += 5 - 20  # the inner step starts 5 us after the last set_ ends
        x("Optimizer.step#SGD.step", t, 400, cat="user_annotation")  # the wrapped SGD's step: the update
        t += 405
        x("Optimizer.step#SGD.step", outer, t - outer, cat="user_annotation")  # Horovod's wrapper around it
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{4 + i}", "pid": pid, "tid": tid,
                       "ts": start, "dur": t - start, "args": {}})
        t += 1
    return {"distributedInfo": {"backend": "horovod/gloo", "rank": rank, "world_size": world},
            "traceEvents": events}


def test_a_horovod_step_waits_in_its_optimizer_and_moves_the_gradients_it_puts_back():
    steps = analyze(synthetic_horovod_trace(0, 2, [2000.0])).steps
    s = steps[4]
    assert s.total == pytest.approx((310 + 5010 + 2 * 160 + 2000 + 45 + 405) * 1e-6)
    assert s.data == pytest.approx(300e-6)
    assert s.comm_ops == pytest.approx(20e-6)  # the two aten::set_ (the averaged gradients put back)
    assert s.wait == pytest.approx((2000 + 20 + 5) * 1e-6)  # the wrapper's step before the inner one, less them
    assert s.compute == pytest.approx(s.total - 300e-6 - 20e-6 - 2025e-6)
    assert s.elements == 128 * 3136 + 10
    assert s.ring_bytes == pytest.approx((128 * 3136 + 10) * 4 * 2 * (2 - 1) / 2)  # ring all-reduce: 2(N-1)/N x K
    four = analyze(synthetic_horovod_trace(0, 4, [2000.0])).steps[4]
    assert four.ring_bytes == pytest.approx((128 * 3136 + 10) * 4 * 2 * (4 - 1) / 4)

    # rank 1 is slow: rank 0 waits 3 ms for it in every step, rank 1 0.2 ms (the all-reduce's tail)
    report = ProfileReport.from_traces({0: synthetic_horovod_trace(0, 2, [3000, 3000]),
                                        1: synthetic_horovod_trace(1, 2, [200, 200])})
    for r in report.summaries:
        assert sum(r.part(p) for p in PARTS) == pytest.approx(r.step_s, rel=1e-9)
        assert r.communication_s == pytest.approx((20 + 200 + 25) * 1e-6)  # set_ + the wait every rank had
        assert r.data_s == pytest.approx(300e-6)
        assert r.bytes_per_step == pytest.approx((128 * 3136 + 10) * 4)
    r0, r1 = report.summaries
    assert r0.idle_s == pytest.approx(2800e-6) and r1.idle_s == pytest.approx(0.0, abs=1e-12)
    assert report.straggler == 1
    assert "2 ranks (horovod/gloo)" in report.table()


@pytest.mark.slow
@pytest.mark.horovod
def test_profile_lab_2_pytorch_on_two_hosts(tmp_path, channels):
    import math

    report = profile("horovod_pytorch", hosts=2, steps=3, data_dir=channels["train"].parent,
                     runs_dir=tmp_path / "runs", echo=False)
    run = report.run
    assert run.ok and run.world_size == 2
    out = run.workdir / "profile"
    assert sorted(p.name for p in (out / "traces").iterdir()) == \
        ["horovod-timeline.json", "trace-rank0.json", "trace-rank1.json"]
    # each host wrote its rank's trace; rank 0 (on algo-1) also wrote Horovod's timeline of the profiled steps
    assert [sorted(p.name for p in (h.output_data_dir / "profile").iterdir()) for h in run.hosts] == \
        [["horovod-timeline.json", "trace-rank0.json"], ["trace-rank1.json"]]
    assert (out / "profile.png").stat().st_size > 0
    assert "2 ranks (horovod/gloo)" in (out / "profile.md").read_text()
    gradients = 421_642  # the CNN's parameters (lab 3's), all-reduced once a step
    assert [s.rank for s in report.summaries] == [0, 1]
    for s in report.summaries:
        assert s.steps == 3
        assert sum(s.part(p) for p in PARTS) == pytest.approx(s.step_s, rel=1e-9)
        assert s.communication_s > 0 and s.data_s > 0 and s.compute_s > 0
        # fp32, ring all-reduce; and the NaN check's all-reduce at a log line (lab 3's test above)
        assert gradients * 4 <= s.bytes_per_step <= gradients * 4 + 24
    # Horovod's own record agrees: every gradient all-reduced in each profiled step, with these shapes, and
    # the NaN check's table (Divergence: world size x 3) at the log line
    timeline = json.loads((run.hosts[0].output_data_dir / "profile" / "horovod-timeline.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in timeline if e.get("name") == "process_name" and "name" in e["args"]}
    shapes = {e["pid"]: json.loads(e["args"]["shape"]) for e in timeline
              if e.get("ph") == "E" and "shape" in e.get("args", {})}
    assert [shapes.pop(pid) for pid in list(shapes) if names[pid] == "allreduce.divergence"] in ([], [[2, 3]])
    assert sorted(names[pid] for pid in shapes) == sorted(f"allreduce.{n}.{w}" for n in ("conv1", "conv2", "fc1", "fc2")
                                                           for w in ("weight", "bias"))
    assert sum(math.prod(shape) for shape in shapes.values()) == gradients
    assert sum(e.get("name") == "ALLREDUCE" for e in timeline) >= 3 * len(shapes)
    assert run.metric("weights_identical") == 1


@pytest.mark.parametrize(("backend", "rs_factor"), [("gloo", 2 * 3 / 4), ("nccl", 3 / 4)])
def test_fsdp_collectives_count_the_whole_tensor_and_gloos_reduce_scatter_is_an_all_reduce(backend, rs_factor):
    """FSDP's all-gather records the gathered output first; its reduce-scatter records this rank's
    shard first and the whole input second: the bytes are of the whole tensor either way, and on gloo
    a reduce-scatter moves an all-reduce's 2(N-1)/N (PyTorch's gloo all-reduces the input)."""
    full, shard, world = 4000, 1000, 4
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 0.0,
               "dur": 1000.0, "args": {}}]
    for i, (name, dims) in enumerate([("c10d::_allgather_base_", [[full], [shard]]),
                                      ("c10d::_reduce_scatter_base_", [[shard], [full]])]):
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 100.0 + 300 * i,
                       "dur": 50.0, "args": {"Input Dims": [*dims, [], []]}})
    trace = {"distributedInfo": {"backend": backend, "rank": 0, "world_size": world}, "traceEvents": events}
    step = analyze(trace).steps[4]
    assert step.elements == 2 * full
    assert step.ring_bytes == pytest.approx(4 * full * (3 / 4 + rs_factor))


def test_the_markdown_table_renders_and_several_reports_share_one_plot(tmp_path):
    from workshop.trace_report import plot_reports

    report = ProfileReport.from_traces({0: synthetic_trace(0, 2, [3000, 3100]), 1: synthetic_trace(1, 2, [200, 200])})
    plain, md = report.table().splitlines(), report.table(markdown=True).splitlines()
    # the same lines, with a blank line before and after the table and between the notes
    assert [line for line in md if line] == plain
    first, last = md.index(plain[1]), md.index(plain[-2])
    assert md[first - 1] == "" and md[last + 1] == "" and md[-2] == ""
    other = ProfileReport.from_traces({0: synthetic_trace(0, 2, [100]), 1: synthetic_trace(1, 2, [900])})
    fig = plot_reports({"a": report, "b": other}, "two runs", tmp_path / "both.png")
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["a\nrank 0", "a\nrank 1 *", "b\nrank 0 *", "b\nrank 1"]
    assert (tmp_path / "both.png").stat().st_size > 0


def test_in_a_notebook_the_table_is_rendered_once_not_printed_too(tmp_path, monkeypatch, capsys):
    """The issue: lab 3's profiler cells printed the raw pipe table, then the next cell rendered it again."""
    import IPython.display

    write_traces(tmp_path / "algo-1", [synthetic_trace(0, 2, [100, 900])])
    write_traces(tmp_path / "algo-2", [synthetic_trace(1, 2, [700, 100])])
    report = report_from([tmp_path / "algo-1", tmp_path / "algo-2"], out_dir=tmp_path / "out")
    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    monkeypatch.setattr(profiling, "in_notebook", lambda: True)
    profiling._say(report, tmp_path / "out", echo=True)
    [table] = shown
    assert isinstance(table, IPython.display.Markdown) and table.data == report.table(markdown=True)
    out = capsys.readouterr().out
    assert report.table().splitlines()[1] not in out and out.startswith("Traces (open in https://ui.perfetto.dev)")
    monkeypatch.setattr(profiling, "in_notebook", lambda: False)  # a terminal: printed, once
    profiling._say(report, tmp_path / "out", echo=True)
    assert capsys.readouterr().out.count(report.table().splitlines()[1]) == 1 and len(shown) == 1


def test_collectives_per_step_counts_each_kind_and_the_whole_tensors():
    """Lab 4's cell that counted FSDP's collectives from a trace (20 lines of parser in the notebook) is
    `workshop.trace_report.collectives_per_step`."""
    from workshop.trace_report import collectives_per_step

    full, shard = 4000, 2000
    events = []
    for step in (4, 5):  # two profiled steps, each: 2 all-gathers, 1 reduce-scatter, the loss's all-reduce
        t = 10_000.0 * step
        events.append({"ph": "X", "name": f"ProfilerStep#{step}", "ts": t, "dur": 1000.0, "args": {}})
        for i, (name, dims) in enumerate([("c10d::_allgather_base_", [[full], [shard]]),
                                          ("c10d::_allgather_base_", [[full], [shard]]),
                                          ("c10d::_reduce_scatter_base_", [[shard], [full]]),
                                          ("c10d::allreduce_", [[[1]]])]):
            events.append({"ph": "X", "name": name, "ts": t + 100 * (i + 1), "dur": 10.0, "args": {"Input Dims": dims}})
    events.append({"ph": "X", "name": "c10d::allreduce_", "ts": 1.0, "dur": 1.0, "args": {"Input Dims": [[[9]]]}})  # outside
    assert collectives_per_step({"traceEvents": events}) == {
        "all-gather": (2, 2 * full), "reduce-scatter": (1, full), "all-reduce of a scalar (the logged loss)": (1, 1)}
