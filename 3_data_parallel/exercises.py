"""Lab 3's exercises (workshop/teaching.py has the convention): what each checks, and the hint a wrong
answer gets. Each solution is in solutions/<key>.py, which the check runs for the reference answer."""

from pathlib import Path

from workshop.teaching import Exercise, same_results

HERE = Path(__file__).resolve().parent
K_EXAMPLE = 1_724_040  # bytes of gradients of lab 3's CNN (float32), for the tests' context

# data_parallel.ipynb, "What all-reduce costs, by the formula"
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

# data_parallel.ipynb, "Planning a cluster bigger than this machine"
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
