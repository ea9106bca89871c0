"""What lab 3's notebooks read from their runs: the rows of their tables, their findings in words, and the
bodies of their longer checks (each raises AssertionError with what went wrong, as the notebooks' own
assert cells do). Every number comes from a run or from the workshop's planner; nothing is typed in.

    from findings import recovery, tradeoff            # the notebooks put this folder on sys.path

Sections, one per notebook: data_parallel.ipynb (the profile's finding), job_parallelism.ipynb (the
learning-rate curves), fault_tolerance.ipynb (restarts, checkpoint intervals, lab 4's sharded checkpoint,
managed spot). The plots are in figures.py beside it.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workshop.teaching import Shown, table

# --------------------------------------------------------------------------- data_parallel.ipynb


def mean_part(report: Any, part: str) -> float:
    """Seconds per step of `part` (compute, communication, data, idle, step), mean over a profile's ranks."""
    return sum(s.part(part) for s in report.summaries) / len(report.summaries)


def waiting_share(report: Any) -> float:
    """The share of a step in which a rank is not computing: communication + idle."""
    return report.share("communication") + report.share("idle")


def measured_rows(profiles: Mapping[int, Any], K: float) -> list[dict[str, Any]]:
    """One row per profile (ranks -> ProfileReport): the step, its parts, the bytes each rank sent against
    the ring's 2(N-1)/N, and the machine view (the core time communication cost the machine)."""
    rows = []
    for ranks, report in profiles.items():
        sent = report.summaries[0].bytes_per_step
        views = report.machines()
        rows.append({
            "ranks": ranks, "step ms": 1e3 * mean_part(report, "step"),
            "compute ms": 1e3 * mean_part(report, "compute"),
            "communication": report.share("communication"), "idle": report.share("idle"),
            "straggler": f"rank {report.straggler}", "sent per rank (K)": sent / K,
            "2(N-1)/N": 2 * (ranks - 1) / ranks,
            "throughput lost (machine view)": views[0].lost_share if len(views) == 1 else None,
        })
    return rows


def planner_rows(planner: Any, model: Any, layouts: Mapping[int, Mapping[str, int]], profiles: Mapping[int, Any],
                 batch: int, K: float, instance: str = "ml.p4d.24xlarge") -> list[dict[str, Any]]:
    """The planner's step for the same layouts on `instance` (DDP, fp32 SGD), beside the measured profile:
    compute and all-reduce times, the all-reduce's share of the step with no overlap and with all of it
    hidden behind the backward pass, and by how much the GPU and the network shrink each part."""
    rows = []
    for ranks, layout in layouts.items():
        shape = {"instance_count": layout["hosts"], "procs_per_instance": layout.get("procs_per_host", 1)}
        serial, hidden = (planner.step_time(model, instance, planner.DDP, batch, precision=planner.FP32_SGD_MOMENTUM,
                                            overlap=overlap, **shape) for overlap in (0.0, 1.0))
        report = profiles[ranks]
        rows.append({
            "ranks": ranks, "layout": f"{shape['instance_count']} x {shape['procs_per_instance']} GPU",
            "compute us": 1e6 * serial.compute_s, "all-reduce us": 1e6 * serial.comm_s,
            "all-reduce share": serial.exposed_comm_s / serial.total_s,
            "if hidden by DDP": hidden.exposed_comm_s / hidden.total_s,
            "compute: CPU / GPU": mean_part(report, "compute") / serial.compute_s,
            "all-reduce: here / GPU": mean_part(report, "communication") / serial.comm_s,
            "sent per GPU (K)": serial.bytes_per_gpu / K,
        })
    return rows


def profile_finding(profiles: Mapping[int, Any], gpu_rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The profile's finding in words, from the two profiles and the planner's rows."""
    small, large = sorted(profiles)
    a, b = profiles[small], profiles[large]
    grew = b.summaries[0].bytes_per_step / a.summaries[0].bytes_per_step
    ring = (large - 1) / large / ((small - 1) / small)
    cores = len(os.sched_getaffinity(0))
    waiting = {n: waiting_share(r) for n, r in profiles.items()}
    lines = [
        f"From {small} to {large} ranks the bytes each rank sent grew {grew:.2f}x, as 2(N-1)/N does ({ring:.2f}x), "
        f"not {large / small:.0f}x as the load on a parameter server would.",
        f"Compute per rank-step went from {1e3 * mean_part(a, 'compute'):.0f} to {1e3 * mean_part(b, 'compute'):.0f} ms "
        f"({large} processes on {cores} cores), and the share of a step not computing "
        f"{'rose' if waiting[large] > waiting[small] else 'fell'} from {waiting[small]:.0%} to {waiting[large]:.0%}.",
    ]
    for ranks, report in profiles.items():
        views = report.machines()
        if len(views) == 1 and ranks > views[0].cores:
            lines.append(f"At {ranks} ranks on {views[0].cores} cores the machine view lost {views[0].lost_share:.0%} "
                         f"of the throughput, less than the {waiting_share(report):.0%} of a step each rank spent "
                         "not computing: while one rank waits, another computes on its core.")
    share = gpu_rows[-1]["all-reduce share"]
    ranks = gpu_rows[-1]["ranks"]
    if share > 0.5:
        lines.append(f"On GPUs the all-reduce is most of this small model's step ({share:.0%} at {ranks} ranks): "
                     "it stops scaling, as the planner's efficiency plot showed; a model with more compute per byte "
                     "of gradients (GPT-2 there) keeps its all-reduce a small share of the step.")
    else:
        lines.append(f"On GPUs this model's compute still outweighs its all-reduce ({share:.0%} of the step at "
                     f"{ranks} ranks).")
    return lines


def ddp_plan_rows(planner: Any, model: Any, per_gpu_batch: int, precision: Any, counts: Sequence[int],
                  instance: str = "ml.p4d.24xlarge", samples: int = 1_000_000) -> list[dict[str, Any]]:
    """The planner's plain-DDP row at each instance count: step, exposed all-reduce, efficiency, and the
    time and cost of an epoch of `samples` samples."""
    rows = []
    for n in counts:
        plan = planner.plan(model, instance, per_gpu_batch, n, precision=precision, strategies=(planner.DDP,),
                            dataset_samples=samples)
        r = plan.row(planner.DDP)
        rows.append({"instances": n, "GPUs": n * plan.instance.gpus, "step ms": 1e3 * r.step.total_s,
                     "all-reduce ms": 1e3 * r.step.exposed_comm_s, "efficiency": r.efficiency,
                     "epoch s": r.epoch_s, "USD per epoch": r.cost_per_epoch_usd})
    return rows


def strategy_table(plan: Any) -> Shown:
    """Every strategy of a planner `Plan` as a table: memory per GPU, whether it fits, step, efficiency, cost."""
    rows = [{"strategy": r.label, "GB per GPU": r.memory.total / 1e9, "fits": "yes" if r.fits else "no",
             "host GB per GPU": r.memory.host / 1e9, "step s": r.step.total_s, "comm s": r.step.exposed_comm_s,
             "samples/s": r.samples_per_sec, "efficiency": r.efficiency, "USD per epoch": r.cost_per_epoch_usd}
            for r in plan.rows]
    usable = plan.instance.gpu_memory_gb * plan.usable_fraction
    caption = (f"{plan.model.name}: {plan.model.params / 1e9:.3g}B params, {plan.precision.name}; "
               f"{plan.instance_count} x {plan.instance.name} ({plan.world_size} GPUs, {plan.instance.gpu_memory_gb:g} GB "
               f"each, {usable:.0f} GB usable), batch {plan.batch_size} per GPU")
    return table(rows, caption=caption, formats={"GB per GPU": ",.1f", "host GB per GPU": ",.1f", "step s": ".3g",
                                                 "comm s": ".3g", "samples/s": ",.1f", "efficiency": ".2f",
                                                 "USD per epoch": ",.2f"})


# --------------------------------------------------------------------------- job_parallelism.ipynb


CHANCE = 0.10  # ten digit classes: the accuracy of a guess, and of a model that diverged


def factor_rows(acc: Mapping[int, Sequence[float]], lrs: Sequence[float], world_sizes: Sequence[int],
                shifts: int = 3) -> tuple[list[dict[str, Any]], int]:
    """Which learning-rate factor moves the larger world's curve onto the smaller one's: for a shift of 0, 1,
    2 ... grid steps (factors 1, 2, 4 on a grid that doubles), the mean |accuracy difference| of the points
    it lines up. Returns the rows and the best factor."""
    lo, hi = world_sizes
    rows = []
    for steps in range(shifts):
        diffs = [abs(acc[hi][i + steps] - acc[lo][i]) for i in range(len(lrs) - steps)]
        if diffs:
            rows.append({"lr factor": 2 ** steps, "mean |accuracy difference|": sum(diffs) / len(diffs),
                         "points compared": len(diffs)})
    best = min(rows, key=lambda r: r["mean |accuracy difference|"])["lr factor"]
    for row in rows:
        row["best"] = "<- best" if row["lr factor"] == best else ""
    return rows, best


def curve_ends(acc: Mapping[int, Sequence[float]], lrs: Sequence[float], world_sizes: Sequence[int]) -> list[str]:
    """What the curves did at their two ends, read from this run: at the smallest rate, whether the larger
    world (half the steps per epoch) trained less far; at the large rates, where each world diverged (an
    accuracy near chance, 0.10) and whether the larger batch still trained there."""
    lo, hi = world_sizes
    first = (f"At the smallest rate ({lrs[0]:g}) world size {hi} reached {acc[hi][0]:.3f} against {acc[lo][0]:.3f} at "
             f"world size {lo}: ")
    if acc[hi][0] < acc[lo][0]:
        first += ("below, as half the steps per epoch predict when each step is no larger (what `--scale-lr` "
                  "fixes).")
    else:
        first += "not below here: at this rate one epoch was enough for both."
    lines = [first]
    diverged = {n: [lr for lr, a in zip(lrs, acc[n], strict=True) if a <= CHANCE + 0.05] for n in world_sizes}
    for n in world_sizes:
        if diverged[n]:
            lines.append(f"World size {n} diverged (accuracy within 0.05 of chance, {CHANCE:.2f}) at lr "
                         f"{', '.join(f'{lr:g}' for lr in diverged[n])}.")
        else:
            lines.append(f"World size {n} trained at every rate searched (none ended near chance, {CHANCE:.2f}).")
    rescued = [lr for lr in diverged[lo] if lr not in diverged[hi]]
    if rescued:
        lines.append(f"At lr {', '.join(f'{lr:g}' for lr in rescued)} the larger batch still trained: its gradient "
                     f"averages {hi // lo}x the samples, so it is less noisy and tolerates a larger step.")
    return lines


def search_rows(searches: Mapping[int, Any], elapsed: Mapping[int, float], parallel: int,
                search_seconds: Callable[[int, int, float], float]) -> list[dict[str, Any]]:
    """Per search: its trials, the seconds they ran in all, the wall time, how many ran at once on average,
    and `search_seconds(trials, parallel, mean trial seconds)` (the exercise's formula) beside it."""
    rows = []
    for n, result in searches.items():
        times = [t.wall_s for t in result.trials if t.wall_s]
        busy = sum(times)
        mean = busy / len(times) if times else 0.0
        rows.append({"world size": n, "trials": len(result.trials), "mean trial s": mean, "trial-seconds": busy,
                     "elapsed s": elapsed[n], "at once (mean)": busy / elapsed[n] if elapsed[n] else 0.0,
                     "search_seconds(...)": search_seconds(len(result.trials), parallel, mean)})
    return rows


# --------------------------------------------------------------------------- fault_tolerance.ipynb


def check_fault_parameters(total_steps: int, fault_step: int, intervals: Iterable[int]) -> None:
    """The parameters cell's fault and checkpoint intervals fall inside the run."""
    assert 1 <= fault_step < total_steps, (
        f"fault_step must be from 1 to {total_steps - 1}: the run has {total_steps} steps")
    assert all(0 < n < total_steps for n in intervals), f"intervals must be from 1 to {total_steps - 1}"


def records_of(run: Any) -> list[dict[str, Any]]:
    """A local run's METRICS records, or a SageMaker job's (read from CloudWatch), or a list of them."""
    if isinstance(run, list):
        return run
    records = run.records
    return records() if callable(records) else records


def recovery(run: Any) -> dict[str, Any]:
    """The resumed run's METRICS record (rank 0, once the first step after the restart was done):
    restart, resumed_step, lost_steps, recover_s. Exactly one is expected."""
    found = [r for r in records_of(run) if "resumed_step" in r]
    assert len(found) == 1, f"expected one recovery record (one restart), found {len(found)}: {found}"
    return found[0]


RECOVERY_KEYS = ("FAULT:", "failed (exitcode", "resumed from", "to do again", "Resumed from", "final_test_accuracy",
                 "succeeded")


def lines_with(run: Any, *keys: str, width: int = 160) -> list[str]:
    """The run's log lines (each `[host/rank] ...`) whose text holds one of `keys`, cut to `width`."""
    out = []
    for line in run.lines:
        text = line.split("] ", 1)[-1]
        if any(key in text for key in keys):
            out.append(line[:width])
    return out


def step_seconds(reference: Any, steps_per_epoch: int) -> float:
    """One training step's seconds in the reference run: rank 0's median epoch time / steps per epoch."""
    epochs = [r["epoch_time_s"] for r in reference.records if r.get("rank") == 0 and "epoch_time_s" in r]
    return statistics.median(epochs) / steps_per_epoch


def tradeoff(runs: Mapping[Any, Any], step_s: float, predicted_lost: Callable[[int], int]) -> list[dict[str, Any]]:
    """One row per checkpoint interval (the runs keyed by interval, same fault): checkpoints written and
    their median time, the overhead (a checkpoint per interval of steps), the steps redone (predicted by
    `predicted_lost(interval)`, and measured), the time this fault cost (steps redone + recovery), the
    restart (death to training again, less the step done), and the expected loss of a failure at a random
    moment (half an interval of steps, plus the restart)."""
    rows = []
    for n in sorted(k for k in runs if isinstance(k, int)):
        result = runs[n]
        rec = recovery(result)
        checkpoint_s = statistics.median(r["checkpoint_s"] for r in result.records if "checkpoint_s" in r)
        restart_s = rec["recover_s"] - step_s
        rows.append({
            "checkpoint every (steps)": n,
            "checkpoints": sum("checkpoint_s" in r for r in result.records),
            "ms per checkpoint": 1e3 * checkpoint_s,
            "overhead": checkpoint_s / (n * step_s),
            "steps lost: yours": predicted_lost(n),
            "steps lost: measured": rec["lost_steps"],
            "time lost (s)": rec["lost_steps"] * step_s + rec["recover_s"],
            "restart (s)": restart_s,
            "expected per failure (s)": n / 2 * step_s + restart_s,
        })
    return rows


TRADEOFF_FORMATS = {"ms per checkpoint": ".1f", "overhead": ".1%", "time lost (s)": ".1f", "restart (s)": ".1f",
                    "expected per failure (s)": ".1f"}


def tradeoff_summary(rows: Sequence[Mapping[str, Any]], step_s: float) -> str:
    """The table's balance in words: a checkpoint against a step, and the restart against the rework."""
    checkpoint_ms = statistics.median(r["ms per checkpoint"] for r in rows)
    restart_s = statistics.median(r["restart (s)"] for r in rows)
    longest = max(rows, key=lambda r: r["checkpoint every (steps)"])
    rework_s = longest["checkpoint every (steps)"] / 2 * step_s
    bigger = "the restart" if restart_s > rework_s else "the rework"
    return (f"One step: {1e3 * step_s:.0f} ms; one checkpoint: {checkpoint_ms:.1f} ms; the restart (death to training "
            f"again, less one step): {restart_s:.1f} s in the median. Even at every "
            f"{longest['checkpoint every (steps)']} steps, half an interval of rework is {rework_s:.1f} s: {bigger} "
            "is most of what a failure costs here.")


def show_sharded_checkpoint(lost: Any, store: Path, width: int = 160) -> tuple[str, dict[str, list[str]]]:
    """Lab 4's failed run: print how it failed, the checkpoint folder (S3's stand-in) and what each host's
    own folder holds. Returns the newest checkpoint's name and the shard files of the store and each host."""
    print(f"the job failed, as expected (exit status {lost.returncode}):")
    print("\n".join(line[:width] for line in (lost.failure or "").splitlines()[:2]))
    latest = (store / "latest").read_text()
    print(f"\nthe checkpoint folder (S3's stand-in): latest -> {latest}")
    for path in sorted((store / latest).iterdir()):
        print(f"  {latest}/{path.name:<16} {path.stat().st_size:>9,} bytes")
    shards = {"store": sorted(p.name for p in (store / latest).glob("*.distcp"))}
    for host in lost.hosts:  # each host's own /opt/ml/checkpoints
        folder = host.checkpoint_dir / latest
        shards[host.name] = sorted(p.name for p in folder.glob("*.distcp"))
        print(f"{host.name}'s own folder: {latest}/ holds {', '.join(sorted(p.name for p in folder.iterdir()))}")
    return latest, shards


def check_lab4_reshard(lost: Any, resumed: Any, latest: str, shards: Mapping[str, list[str]], hosts: int,
                       fault_step: int, every: int = 10) -> None:
    """Lab 4: the 2-rank job failed; the 1-rank job resumed from its last sharded checkpoint, resharded, and
    knew from the dead job's fault record how many steps it redoes. Each host held its own rank's shard
    (and the index); the store, as S3, every host's."""
    assert not lost.ok and resumed.ok, (lost.returncode, resumed.failure)
    assert latest == f"step-{fault_step // every * every}", latest
    assert shards == {"store": [f"__{r}_0.distcp" for r in range(hosts)],
                      **{host.name: [f"__{rank}_0.distcp"] for rank, host in enumerate(lost.hosts)}}, shards
    text = resumed.lines
    assert any(f"resumed from /opt/ml/checkpoints/{latest} at step {fault_step // every * every}" in line for line in text)
    assert any(f"written by {hosts} rank(s); torch.distributed.checkpoint resharded it over 1" in line for line in text)
    assert any(f"{fault_step % every} step(s) to do again: the failed run had finished step {fault_step} (its fault "
               "record)" in line for line in text)


@dataclass
class SpotOutcome:
    """What a finished managed spot job shows: its secondary status transitions (DescribeTrainingJob), its
    rank 0's steps, checkpoints and resumes in log order (`events`: ("step", N) for a train-loss line,
    ("checkpoint", N) for a checkpoint written after step N, ("resumed", N) for a run that resumed from the
    step-N checkpoint), and the seconds billed against the seconds trained."""

    completed: bool
    statuses: list[str]
    events: list[tuple[str, int]] = field(default_factory=list)
    billable_s: int | None = None
    training_s: int | None = None
    accuracy: float | None = None

    @property
    def interruptions(self) -> int:
        return self.statuses.count("Interrupted")

    @property
    def resumed_steps(self) -> list[int]:
        return [n for kind, n in self.events if kind == "resumed"]

    def lines(self) -> list[str]:
        said = [f"status transitions: {' -> '.join(self.statuses)}"]
        if self.interruptions:
            said.append(f"interrupted {self.interruptions} time(s); resumed at step(s) "
                        f"{', '.join(map(str, self.resumed_steps)) or 'none (started over)'}")
        else:
            said.append("not interrupted: SageMaker kept its spot instances to the end (most spot jobs run through)")
        if self.billable_s is not None and self.training_s:
            said.append(f"managed spot: billable {self.billable_s} s of {self.training_s} s training: a saving of "
                        f"{1 - self.billable_s / self.training_s:.0%} (1 - billable / training, AWS's formula)")
        said.append(f"final test accuracy: {self.accuracy}")
        return said


def spot_events(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """Rank 0's steps, checkpoints and resumes, in log order (see `SpotOutcome.events`)."""
    events = []
    for r in records:
        if r.get("rank", 0) != 0:
            continue
        if "resumed_step" in r:
            events.append(("resumed", int(r["resumed_step"])))
        elif "checkpoint_s" in r:
            events.append(("checkpoint", int(r["step"])))
        elif "train_loss" in r:
            events.append(("step", int(r["step"])))
    return events


def spot_outcome(job: Any) -> SpotOutcome:
    """A finished SageMaker spot job's `SpotOutcome`: DescribeTrainingJob's transitions and times, and its
    METRICS lines from CloudWatch."""
    import boto3

    described = boto3.Session(region_name=job.region).client("sagemaker").describe_training_job(
        TrainingJobName=job.job_name)
    return SpotOutcome(
        completed=job.ok, statuses=[t["Status"] for t in described.get("SecondaryStatusTransitions", [])],
        events=spot_events(job.records()), billable_s=job.billable_time_s, training_s=job.training_time_s,
        accuracy=job.metric("test_accuracy"))


def checkpointed_before_start_over(events: Sequence[tuple[str, int]]) -> list[int]:
    """The checkpoints written before a run started over from step 0 (a step, or a checkpoint, below the one
    before it: a new attempt that resumed nothing); [] when none did (an attempt reclaimed before it logged
    anything leaves no trace to go back from)."""
    previous = None
    for i, (kind, n) in enumerate(events):
        if kind == "resumed":
            continue
        if previous is not None and (n < previous or (n == previous and kind == "step")):
            return sorted(m for k, m in events[:i] if k == "checkpoint")
        previous = n
    return []


def check_spot(spot: SpotOutcome) -> str:
    """The claims a spot job backs whether or not SageMaker reclaimed it (on a real account most spot jobs are
    never interrupted): it completed and was billed for no more than it trained; if it was not interrupted, it
    ran through without resuming; if it was, each restart resumed from a checkpoint written before it, or,
    reclaimed before its first checkpoint, started over. Returns what held, in words."""
    assert spot.completed, f"the spot job did not complete: {spot.statuses}"
    if spot.billable_s is not None and spot.training_s is not None:
        assert spot.billable_s <= spot.training_s, (
            f"billed {spot.billable_s} s for {spot.training_s} s of training: spot bills only the seconds its "
            "instances ran")
    if not spot.interruptions:
        assert not spot.resumed_steps, (
            f"never interrupted, yet it resumed at step(s) {spot.resumed_steps}: a job's own checkpoint prefix "
            "starts empty")
        return "the spot job was not interrupted and ran through from its first step"
    written = {n for kind, n in spot.events if kind == "checkpoint"}
    for n in spot.resumed_steps:
        assert n in written, f"resumed at step {n}, but the job wrote no checkpoint of that step ({sorted(written)})"
    if not spot.resumed_steps:  # then it started over: only right if nothing was checkpointed before it did
        assert not checkpointed_before_start_over(spot.events), (
            f"interrupted after checkpoints at steps {checkpointed_before_start_over(spot.events)}, yet it started "
            "over instead of resuming: is the checkpoint folder reaching S3 (CheckpointConfig)?")
    return (f"the spot job was interrupted {spot.interruptions} time(s) and resumed at step(s) "
            f"{', '.join(map(str, spot.resumed_steps)) or 'none: it was reclaimed before its first checkpoint'}")
