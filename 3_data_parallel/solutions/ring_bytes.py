def ring_bytes(N, K):
    """Bytes each of N workers sends per step when a ring all-reduce sums K bytes of gradients."""
    chunk = K / N              # the gradients are cut into N chunks, one per worker
    steps = 2 * (N - 1)        # N-1 steps of scatter-reduce, then N-1 of all-gather
    return steps * chunk       # one chunk sent per step: 2(N-1)K/N, which tends to 2K, never more
