"""Lab 4's exercises (workshop/teaching.py has the convention): what each checks, and the hint a wrong
answer gets. Each solution is in solutions/<key>.py, which the check runs for the reference answer."""

from pathlib import Path

from workshop.teaching import Exercise, same_results

HERE = Path(__file__).resolve().parent
P_EXAMPLE = 134_912  # parameters of the GPT the grid measures (measure.py's MEASURE_MODEL), for the tests' context

# model_parallel.ipynb, "What has to fit, by the formula": written before the grid measures every row
ZERO_BYTES = Exercise(
    key="zero_bytes", folder=HERE, name="zero_bytes",
    task="write zero_bytes(stage, N, P, K=8): the bytes of parameters + gradients + optimizer state each of N "
         "ranks holds under ZeRO stage 0, 1, 2 or 3 (fp32 weights and gradients, K bytes of optimizer state "
         "per parameter).",
    hint="each stage shards one more kind, in this order: stage 1 the optimizer state (K bytes per parameter), "
         "stage 2 the gradients too (4), stage 3 the parameters too (4). Of what is sharded a rank holds 1/N; "
         "what is not sharded it holds whole. At N = 1 every stage holds (4 + 4 + K) P, and only stage 3 "
         "tends to 0 as N grows.",
    judge=same_results(lambda ctx: [(stage, n, p, k) for k in (8, 12) for p in (ctx["P"], 7e9)
                                    for n in (1, 2, 4, 64) for stage in (0, 1, 2, 3)],
                       describe=lambda a: f"zero_bytes(stage={a[0]}, N={a[1]}, P={a[2]:,.0f}, K={a[3]})"),
    example={"P": P_EXAMPLE},
    # everything divided by N as soon as anything is sharded: the stages told apart by nothing
    wrong=lambda reference, ctx: lambda stage, N, P, K=8: (8 + K) * P / (N if stage else 1),
)

# model_parallel.ipynb, "Activations: what checkpointing keeps": written before the grid measures it
CHECKPOINTED_BYTES = Exercise(
    key="checkpointed_bytes", folder=HERE, name="checkpointed_bytes",
    task="write checkpointed_bytes(layers, batch, seq_len, d_model, N): the bytes of activations one of N ranks "
         "keeps for backward inside the blocks with activation checkpointing (fp32).",
    hint="with checkpointing each block keeps only its input, one (sequences, seq_len, d_model) tensor of fp32 "
         "values (4 bytes each) per layer, and recomputes the rest in backward; and a rank computes only its "
         "slice of the global batch: batch / N sequences. No parameter count appears: activations grow with the "
         "tokens (batch x seq_len) and only linearly with d_model.",
    judge=same_results(lambda ctx: [(2, 8, 32, 64, n) for n in (1, 2, 4)] + [(32, 64, 4096, 4096, 16),
                                                                             (4, 16, 128, 256, 8)],
                       describe=lambda a: f"checkpointed_bytes(layers={a[0]}, batch={a[1]}, seq_len={a[2]}, "
                                          f"d_model={a[3]}, N={a[4]})"),
    # the whole batch on every rank: the data-parallel split forgotten
    wrong=lambda reference, ctx: lambda layers, batch, seq_len, d_model, N: layers * batch * seq_len * d_model * 4,
)

# model_parallel.ipynb, "Pipeline parallel, measured": written before the two schedules run
BUBBLE = Exercise(
    key="bubble", folder=HERE, name="bubble",
    task="write bubble(p, m): the share of a pipeline step each of p stages waits (the bubble), when the batch "
         "is split into m micro-batches (GPipe or 1F1B).",
    hint="count in slots, one slot being one micro-batch's forward and backward on one stage. A stage does m "
         "slots of work, but the step lasts longer: the first micro-batch takes p - 1 slots to reach the last "
         "stage, and the last gradient p - 1 slots to come back, so each stage waits p - 1 of the step's m + p - 1 "
         "slots. One stage never waits; more micro-batches shrink the share, never to 0.",
    judge=same_results(lambda ctx: [(p, m) for p in (1, 2, 4, 8) for m in (1, 2, 4, 8, 32)],
                       describe=lambda a: f"bubble(p={a[0]}, m={a[1]})"),
    # the wait over the work (p-1)/m, not over the whole step
    wrong=lambda reference, ctx: lambda p, m: (p - 1) / m,
)
