def wire_bytes(N, K):
    """Bytes the loopback counters read during one ring all-reduce of K bytes over N ranks."""
    per_rank = 2 * (N - 1) * K / N  # one K/N chunk per step, 2(N-1) steps (exercise 1)
    return N * per_rank             # every rank's bytes cross the counters once: 2(N-1)K in all
