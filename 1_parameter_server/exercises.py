"""Lab 1's exercises (workshop/teaching.py has the convention): what each checks, and the hint a wrong
answer gets. Each solution is in solutions/<key>.py, which the check runs for the reference answer.

Both are checked against the run: where TensorFlow placed each variable (the coordinator's placement
lines), and the bytes the steps moved (the loopback bytes the coordinator counted around each run of
steps, on a local cluster; `figures.step_bytes_measured`)."""

import math
import re
from pathlib import Path

from workshop.teaching import Exercise

HERE = Path(__file__).resolve().parent
# Lab 1's CNN (code/train.py's SHAPES, in the order it creates them), for the tests' context.
SHAPES = {"conv1/kernel": (3, 3, 1, 16), "conv1/bias": (16,), "conv2/kernel": (3, 3, 16, 32), "conv2/bias": (32,),
          "dense1/kernel": (1568, 128), "dense1/bias": (128,), "dense2/kernel": (128, 10), "dense2/bias": (10,)}
K_EXAMPLE = 4 * sum(math.prod(s) for s in SHAPES.values())  # 827,688 bytes of float32 variables
MIN_SHARD_BYTES = 64 * 1024  # code/arguments.py's default
# The loopback bytes per step against the learner's: the TCP/IP headers and gRPC's framing add a few percent,
# and the coordinator's few bytes per step it schedules; forgetting the pull (K) or counting a ring's 2(N-1)K/N
# at 2 workers (K) is 2x off.
STEP_TOLERANCE = 0.25


def _task(device: str) -> int:
    match = re.search(r"/task:(\d+)", device)
    return int(match.group(1)) if match else -1


def judge_place(answer, reference, context):
    """The learner's placement for this run's parameter servers against where the run's variables were
    (its `placement` lines), then against TensorFlow's rule for other numbers of parameter servers."""
    if not callable(answer):
        return f"the answer should be a function, got {type(answer).__name__}"
    shapes, num_ps, min_shard = context["shapes"], context["hosts"], context.get("min_shard_bytes", MIN_SHARD_BYTES)
    yours = answer(shapes, num_ps, min_shard)
    if not isinstance(yours, dict):
        return f"place(...) returned {type(yours).__name__}, not a dict of variable -> list of ps tasks"
    measured = {name: [_task(d) for d in devices] for name, devices in (context.get("placement") or {}).items()}
    for name in shapes:
        if name in measured and list(yours.get(name, [])) != measured[name]:
            return (f"{name}: yours {list(yours.get(name, []))}, and the run placed it on ps tasks {measured[name]} "
                    f"(with {num_ps} parameter servers)")
    for n in (1, 2, 4, 5):
        theirs, mine = reference(shapes, n, min_shard), answer(shapes, n, min_shard)
        for name in shapes:
            if list(mine.get(name, [])) != theirs[name]:
                return f"with {n} parameter servers, {name}: yours {list(mine.get(name, []))}, TensorFlow's {theirs[name]}"
    return None


def whole_round_robin(shapes, num_ps, min_shard_bytes):
    """A plausible wrong answer: round robin, but no variable sharded."""
    return {name: [i % num_ps] for i, name in enumerate(shapes)}


# parameter_server.ipynb, "Where each variable lives"
PLACE = Exercise(
    key="place", folder=HERE, name="place",
    task="write place(shapes, num_ps, min_shard_bytes): each variable's list of ps tasks, one per shard.",
    hint="ParameterServerStrategy counts the variables as it creates them (each shard counts as one) and puts "
         "the i-th on ps task i mod num_ps. A variable of more than min_shard_bytes (4 bytes a float32) is cut "
         "along its first axis into min(num_ps, ceil(bytes / min_shard_bytes)) shards, each placed in turn.",
    judge=judge_place,
    example=lambda: {"shapes": SHAPES, "hosts": 3, "min_shard_bytes": MIN_SHARD_BYTES, "placement": {
        name: [f"/job:ps/replica:0/task:{t}/device:CPU:0" for t in tasks] for name, tasks in {
            "conv1/kernel": [0], "conv1/bias": [1], "conv2/kernel": [2], "conv2/bias": [0],
            "dense1/kernel": [1, 2, 0], "dense1/bias": [1], "dense2/kernel": [2], "dense2/bias": [0]}.items()}},
    wrong=lambda reference, ctx: whole_round_robin,
)


def judge_step_bytes(answer, reference, context):
    """Against the bytes per step this run moved (where it counted them), then the rule for 1 to 64 workers."""
    if not callable(answer):
        return f"the answer should be a function, got {type(answer).__name__}"
    K, workers, measured = context["K"], context["hosts"] - 1, context.get("measured_step_bytes")
    yours = answer(K, workers)
    if yours is None:
        return "your function returned None: it should return a number of bytes"
    if measured and abs(measured / float(yours) - 1) > STEP_TOLERANCE:
        return (f"step_bytes(K, {workers}) is {float(yours) / K:.3g} K, and this run's steps moved "
                f"{measured / K:.3g} K each ({measured / float(yours):.2f}x yours)")
    for n in (1, 2, 4, 16, 64):
        got, want = answer(K, n), reference(K, n)
        if not math.isclose(float(got), want, rel_tol=0.02):
            return f"step_bytes(K, {n}) is {float(got) / K:.3g} K, which is not what one worker moves with {n} workers"
    return None


# parameter_server.ipynb, "What one step moves"
STEP_BYTES = Exercise(
    key="step_bytes", folder=HERE, name="step_bytes",
    task="write step_bytes(K, workers): the bytes one worker sends and receives per step, K bytes of variables.",
    hint="follow one step on one worker (code/train.py's train_step): what it must read before it can compute, and "
         "what it sends back; the momentum update runs on the parameter server. Does anything there depend on how "
         "many other workers there are?",
    judge=judge_step_bytes,
    example={"K": K_EXAMPLE, "hosts": 3, "measured_step_bytes": 1.04 * 2 * K_EXAMPLE},
    wrong=lambda reference, ctx: lambda K, workers: K,  # the gradient pushed, the variables' pull forgotten
)
