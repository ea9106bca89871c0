"""Lab 3's exercises (workshop/teaching.py has the convention): what each checks, and the hint a wrong
answer gets. Each solution is in solutions/<key>.py, which the check runs for the reference answer.
One section per notebook of this folder, in the order the notebooks run."""

import math
from pathlib import Path

from workshop.teaching import Exercise, close_to, same_results

HERE = Path(__file__).resolve().parent
K_EXAMPLE = 1_724_040  # bytes of gradients of lab 3's CNN (float32), for the tests' context

# --------------------------------------------------------------------------- data_parallel.ipynb

# "What all-reduce costs, by the formula"
RING_BYTES = Exercise(
    key="ring_bytes", folder=HERE, name="ring_bytes",
    task="write ring_bytes(N, K): the bytes each of N workers sends per step to all-reduce K bytes with a ring.",
    hint="a worker sends one chunk per ring step, and a chunk is K/N bytes, not K; there are N-1 steps of "
         "scatter-reduce and N-1 of all-gather. With one worker nothing is sent, and the total tends to 2K: "
         "it does not grow with N.",
    judge=same_results(lambda ctx: [(n, ctx["K"]) for n in (1, 2, 3, 4, 8, 64)],
                       describe=lambda args: f"ring_bytes(N={args[0]}, K={args[1]:,})"),
    example={"K": K_EXAMPLE},
    wrong=lambda reference, ctx: lambda N, K: 2 * (N - 1) * K,  # chunks of K, not K/N
)

# "Planning a cluster bigger than this machine"
RING_SECONDS = Exercise(
    key="ring_seconds", folder=HERE, name="ring_seconds",
    task="write ring_seconds(N, K, bandwidth, alpha): the alpha-beta time of that ring all-reduce.",
    hint="two terms: every ring step is one message, so 2(N-1) latencies alpha; and the bytes each worker "
         "sends, ring_bytes(N, K), at `bandwidth` bytes per second. Small messages are latency-bound, big ones "
         "bandwidth-bound.",
    judge=same_results(lambda ctx: [(n, k, 1.25e9, 5e-6) for n in (2, 8, 64) for k in (4e3, ctx["K"], 5e8)],
                       describe=lambda a: f"ring_seconds(N={a[0]}, K={a[1]:,.0f}, bandwidth={a[2]:.3g}, alpha={a[3]:g})"),
    example=lambda: {"K": K_EXAMPLE, "ring_bytes": RING_BYTES.reference({"K": K_EXAMPLE})},
    wrong=lambda reference, ctx: lambda N, K, bandwidth, alpha: ctx["ring_bytes"](N, K) / bandwidth,  # no latency
)


# --------------------------------------------------------------------------- job_parallelism.ipynb

# "The question", before the searches run
LR_FACTOR = Exercise(
    key="lr_factor", folder=HERE, name="lr_factor",
    task="write lr_factor: by how much the linear scaling rule says the best learning rate grows from world size "
         "world_sizes[0] to world_sizes[1].",
    hint="the rule scales the learning rate with the global batch, linearly: every rank keeps its batch of 64, so "
         "the global batch grows by the ratio of the world sizes, and so does the rate. (The square-root rule, "
         "sqrt of that ratio, is another hypothesis; the search tests the linear one.)",
    judge=close_to(0.01),
    example={"world_sizes": (1, 2)},
    wrong=lambda reference, ctx: math.sqrt(reference),  # the square-root rule
)

# "Run the searches": what a search of independent trials costs in wall time
SEARCH_SECONDS = Exercise(
    key="search_seconds", folder=HERE, name="search_seconds",
    task="write search_seconds(trials, parallel, trial_s): the wall time of a search of independent trials, "
         "`parallel` at a time.",
    hint="trials run in waves of `parallel`, and a wave lasts as long as one trial (nothing passes between "
         "trials); a last wave that is only part full still takes a whole trial's time: count waves, rounding up.",
    judge=same_results(lambda ctx: [(len(ctx["lrs"]), ctx["parallel"], 30.0), (6, 2, 30.0), (5, 2, 10.0),
                                    (6, 4, 20.0), (12, 1, 20.0), (1, 8, 20.0)],
                       describe=lambda a: f"search_seconds(trials={a[0]}, parallel={a[1]}, trial_s={a[2]:g})"),
    example={"lrs": (0.0125, 0.025, 0.05, 0.1, 0.2, 0.4), "parallel": 2},
    wrong=lambda reference, ctx: lambda trials, parallel, trial_s: trials * trial_s / parallel,  # no last wave
)


# --------------------------------------------------------------------------- fault_tolerance.ipynb

# "1. A rank dies, and the job heals itself", before the run
STEPS_LOST = Exercise(
    key="steps_lost", folder=HERE, name="steps_lost",
    task="write steps_lost(S, C, E): the steps done twice when a rank dies right after step S, with a checkpoint "
         "every C steps and at the end of every epoch of E steps.",
    hint="the restarted job resumes from the newest checkpoint at or before step S and redoes the steps after it. "
         "Checkpoints fall at every multiple of C and at every epoch's end (every multiple of E): the nearer of the "
         "two below S counts, and a fault right after a checkpoint loses nothing.",
    judge=same_results(lambda ctx: [(ctx["fault_step"], c, ctx["steps_per_epoch"]) for c in ctx["intervals"]]
                       + [(20, 4, 31), (31, 16, 31), (25, 16, 20), (7, 8, 31), (40, 8, 31)],
                       describe=lambda a: f"steps_lost(S={a[0]}, C={a[1]}, E={a[2]})"),
    example={"fault_step": 30, "intervals": (4, 8, 16), "steps_per_epoch": 31},
    wrong=lambda reference, ctx: lambda S, C, E: S % C,  # the epoch's own checkpoint forgotten
)

# "3. How often to checkpoint", after the measured table
WASTED_SHARE = Exercise(
    key="wasted_share", folder=HERE, name="wasted_share",
    task="write wasted_share(T, C, M): the share of the time lost with a checkpoint of C seconds every T seconds "
         "and a failure every M seconds on average.",
    hint="two terms that pull T opposite ways: writing, one checkpoint of C seconds per interval of T seconds; and "
         "redoing, since a failure strikes at a random moment of an interval it throws away half an interval on "
         "average, and failures come 1/M times a second.",
    judge=same_results(lambda ctx: [(t, c, m) for t, c, m in ((10.0, 0.01, 3600.0), (600.0, 120.0, 43200.0),
                                                              (3600.0, 120.0, 43200.0), (1.0, 0.5, 100.0))],
                       describe=lambda a: f"wasted_share(T={a[0]:g}, C={a[1]:g}, M={a[2]:g})"),
    example={},
    wrong=lambda reference, ctx: lambda T, C, M: C / T + T / M,  # a whole interval lost per failure
)


# --------------------------------------------------------------------------- your_script.ipynb

# "Make it data parallel": the lines that turn an ordinary script into a DDP one
import capstone  # noqa: E402 - this folder's: runs an answer on two ranks (gloo), and the wrong one the tests give


def _judge_prepare(answer, reference, context):
    return capstone.judge_prepare(answer, reference, context)


def _without_sampler(reference, context):
    return capstone.without_sampler


PREPARE = Exercise(
    key="prepare", folder=HERE, name="prepare",
    task="write prepare(model, train_set, batch_size): join the process group, wrap the model in DDP, and give each "
         "rank its own share of train_set; return (model, loader).",
    hint="three lines, each doing one thing: dist.init_process_group('gloo') joins the ranks torchrun started (it "
         "reads RANK, WORLD_SIZE and MASTER_ADDR); DDP(model) averages the gradients in backward(), so the copies "
         "stay identical; a DataLoader with sampler=DistributedSampler(train_set) (and no shuffle=True: the sampler "
         "shuffles) gives each rank a different slice.",
    judge=_judge_prepare, wrong=_without_sampler, slow=True,
)

# "Run it on 2 simulated hosts", before the run: what each rank's share of an epoch is
BATCHES_PER_RANK = Exercise(
    key="batches_per_rank", folder=HERE, name="batches_per_rank",
    task="write batches_per_rank(samples, world_size, batch_size): the batches each rank takes per epoch with a "
         "DistributedSampler.",
    hint="the sampler gives every rank the same number of samples, samples / world_size rounded up (it repeats a "
         "few to even the shares out), and the DataLoader cuts a rank's share into batches of batch_size, the last "
         "one partial: round up twice.",
    judge=same_results(lambda ctx: [(4000, 2, 64), (4000, 3, 64), (4001, 2, 64), (10, 4, 3), (64, 1, 64), (65, 1, 64)],
                       describe=lambda a: f"batches_per_rank(samples={a[0]}, world_size={a[1]}, batch_size={a[2]})"),
    wrong=lambda reference, ctx: lambda samples, world_size, batch_size: samples // (world_size * batch_size),
)
