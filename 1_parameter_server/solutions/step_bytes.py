def step_bytes(K, workers):
    """Bytes one worker moves per step (sent and received) with K bytes of variables on the parameter servers."""
    pull = K  # it reads every variable from the parameter servers
    push = K  # and sends back a gradient of the same size; the update runs where the variable lives
    return pull + push  # 2K, however many workers there are: each talks only to the servers
