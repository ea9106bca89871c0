"""Pipeline parallel on 2 stages, measured: GPipe and 1F1B, each stage's idle share against the bubble (p-1)/(m+p-1),
the activations each stage keeps, and the planner's step time beside the measured one.

    python benchmarks/bench_pipeline.py [--rounds 3] [--steps 5] [--out-dir images/]
    make bench-pipeline

Each round is one run of lab 4's `code/pipeline.py` under torchrun: 2 processes (one stage each, gloo, one thread
each) train a stack of Linear + Tanh layers (lab 4's `measure.PIPELINE_MODEL`) one step at a time with
`torch.distributed.pipelining`'s GPipe and 1F1B schedules at m = 1, 2, 4 and 8 micro-batches (1F1B needs m >= p:
not at m = 1), and the same schedules on a model of the same depth too narrow to compute (width 2), whose step is
the schedule's own work. Per stage and step the script times its own forwards and backwards; the rest of the step is its idle
share. Linux's scheduler statistics give the share of the step each stage was ready to run but waited for a core
while other processes had both (0 on an otherwise idle machine): a stage held up that way holds up the other, whose
idle share then exceeds the bubble. It counts the micro-batches whose activations it keeps at once and their bytes (saved_tensors_hooks), and
checks the loss and every gradient against the same model run whole in one process. The rounds are pooled: medians
per stage, and the step's range over every round and stage.

The planner (`workshop.planner.pipeline_step`) predicts each step from what the same run measured apart from the
pipeline: the whole model's forward and backward in one process (both ranks at once, as their stages then run:
its compute per sample), a ping-pong between the two ranks of 4 bytes and of the batch's hand-off (the link's
latency and bandwidth), and each schedule's own cost per micro-batch forward or backward o (the narrow model's
steps less their hand-offs' latency, over their 2(m + p - 1) forwards and backwards): step = (m + p - 1)(t + 2o) +
2(p - 1)(alpha + b/B), t one micro-batch's forward and backward on one stage, b one micro-batch's hand-off. Nothing
is fitted to the pipeline's steps. The planner's idle share is 1 - compute / step: the bubble, the schedule's own
cost and the hand-offs.

Output: the table on stdout; `bench_pipeline.md` and `bench_pipeline.png` in --out-dir. About a minute per round
on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, load_average  # noqa: E402

from workshop import REPO_ROOT, planner  # noqa: E402

LAB = REPO_ROOT / "4_model_parallel"
sys.path.insert(0, str(LAB))  # the lab's own measurement, findings and figure: the notebook's
import figures  # noqa: E402
import findings  # noqa: E402
import measure  # noqa: E402

TARGET = 0.25  # idle share within 25% of the bubble, step within 25% of the planner's (issue 42)


def markdown(rows: list[dict]) -> str:
    head = ("| schedule | m | idle share, stage 0 / 1 | bubble (p-1)/(m+p-1) | idle / bubble | waited for a core, "
            "stage 0 / 1 | planner's idle share (idle / planner's) | micro-batches kept, stage 0 / 1 "
            "| MB kept, stage 0 (planner) | step ms (range) | planner step ms (error) |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    body = []
    for r in rows:
        idle = sum(r["idle"]) / len(r["idle"])
        low, high = r["step_range_s"]
        predicted = r["planner"]
        body.append(
            f"| {'GPipe' if r['schedule'] == planner.GPIPE else '1F1B'} | {r['m']} "
            f"| {' / '.join(f'{x:.3f}' for x in r['idle'])} | {r['bubble']:.3f} | {idle / r['bubble']:.2f} "
            f"| {' / '.join(f'{x:.3f}' for x in r['queued'])} "
            f"| {predicted.idle_share:.3f} ({idle / predicted.idle_share:.2f}) "
            f"| {' / '.join(str(x) for x in r['held'])} "
            f"| {r['saved_bytes'][0] / 1e6:.1f} ({predicted.activation_bytes / 1e6:.1f}) "
            f"| {r['step_s'] * 1e3:.0f} ({low * 1e3:.0f}-{high * 1e3:.0f}) "
            f"| {predicted.total_s * 1e3:.0f} ({predicted.total_s / r['step_s'] - 1:+.0%}) |")
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="runs of the whole sweep (pooled)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per schedule and m in each run")
    p.add_argument("--microbatches", type=int, nargs="+", default=list(measure.PIPELINE_MICROBATCHES),
                   help="values of m")
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "images", help="where outputs go")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")  # the figure goes to a file
    if args.rounds < 1 or args.steps < 1:
        sys.exit("--rounds and --steps must be 1 or more")
    started = time.perf_counter()
    machine = describe_machine()
    load_before = load_average()
    print(f"Pipeline parallel, 2 stages, GPipe and 1F1B at m = {args.microbatches}: {args.rounds} round(s) of "
          f"code/pipeline.py ({measure.PIPELINE_MODEL}), {args.steps} timed steps each.", flush=True)
    records = []
    for i in range(args.rounds):
        t0 = time.perf_counter()
        records += measure.pipeline(args.microbatches, steps=args.steps)
        print(f"  round {i + 1}: {time.perf_counter() - t0:.0f} s", flush=True)
    load_after = load_average()
    findings.check_pipeline(records)  # the losses, gradients and activation counts: not timing
    rows = findings.pipeline_rows(records)
    model, machine_seen = findings.pipeline_planner(records)
    overheads = findings.pipeline_overheads(records)
    table = markdown(rows)
    first = records[0]
    header = (f"Machine: {machine['summary']}. Load average (1/5/15 min) {load_before} before, {load_after} after. "
              f"Model: {first['world_size']} stages x {first['layers_per_stage']} Linear({first['d_model']}) + Tanh, "
              f"batch {first['batch_size']}, fp32, one thread per stage; {args.rounds} round(s) x {args.steps} timed "
              f"steps.")
    link = (f"Measured in the same runs for the planner: one process's forward + backward "
            f"{model.compute_s_per_sample * first['batch_size'] * 1e3:.0f} ms per batch "
            f"({model.compute_s_per_sample * 1e6:.0f} us per sample); the link between the stages: alpha "
            f"{machine_seen.intra_alpha_s * 1e6:.0f} us, B {machine_seen.intra_Bps / 1e9:.2f} GB/s (ping-pong); "
            f"each schedule's own cost per micro-batch forward or backward (the same schedules on a model of width "
            f"{first['overhead_width']}): GPipe {overheads[planner.GPIPE] * 1e3:.2f} ms, 1F1B "
            f"{overheads[planner.ONE_F_ONE_B] * 1e3:.2f} ms.")
    within = [r for r in rows if r["m"] >= 2]
    idle_ok = [abs(sum(r["idle"]) / len(r["idle"]) / r["bubble"] - 1) <= TARGET for r in within]
    modelled_ok = [abs(sum(r["idle"]) / len(r["idle"]) / r["planner"].idle_share - 1) <= TARGET for r in within]
    step_ok = [abs(r["planner"].total_s / r["step_s"] - 1) <= TARGET for r in rows]
    queued = [x for r in rows for x in r["queued"]]
    verdict = (f"Idle share within {TARGET:.0%} of the bubble (m >= 2): {sum(idle_ok)} of {len(idle_ok)} rows; "
               f"of the planner's idle share (the bubble, the schedule's own cost, the hand-offs): {sum(modelled_ok)} "
               f"of {len(modelled_ok)}. "
               f"Planner's step within {TARGET:.0%} of the measured: {sum(step_ok)} of {len(step_ok)} rows. "
               f"The stages waited for a core {min(queued):.0%}-{max(queued):.0%} of their steps (other processes "
               f"had the cores).")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "bench_pipeline.md").write_text("\n\n".join([header, table, link, verdict]) + "\n")
    figures.plot_pipeline(records, args.out_dir / "bench_pipeline.png",
                          title=f"Pipeline parallel, 2 stages, measured ({machine['date']}, load {load_before})")
    print()
    print(header)
    print()
    print(table)
    print()
    print(link)
    print(verdict)
    print(f"\nWrote bench_pipeline.md and .png to {args.out_dir} in {time.perf_counter() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
