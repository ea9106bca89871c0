def zero_bytes(stage, N, P, K=8):
    """Bytes of parameters + gradients + optimizer state that each of N ranks holds under ZeRO stage 0-3, for
    P parameters in fp32 (4 bytes each, and 4 per gradient) and K bytes of optimizer state per parameter."""
    params, grads, optim = 4 * P, 4 * P, K * P
    if stage >= 1:
        optim = optim / N    # ZeRO-1: each rank keeps the optimizer state of 1/N of the parameters
    if stage >= 2:
        grads = grads / N    # ZeRO-2: and only the gradients of those
    if stage >= 3:
        params = params / N  # ZeRO-3: and only those parameters (a block's are gathered while it computes)
    return params + grads + optim
