def ring_seconds(N, K, bandwidth, alpha):
    """Seconds a ring all-reduce of K bytes over N workers takes, at `bandwidth` bytes/s per link and a
    latency of `alpha` seconds per message (the alpha-beta model)."""
    messages = 2 * (N - 1)                 # one message per ring step
    return messages * alpha + ring_bytes(N, K) / bandwidth
