def wasted_share(T, C, M):
    """Share of the time lost with a checkpoint of C seconds every T seconds of training and a failure every
    M seconds on average: writing the checkpoints, plus the work the failures throw away."""
    writing = C / T            # each interval of T seconds pays one checkpoint
    redoing = (T / 2) / M      # a failure strikes at a random moment: half an interval lost, 1/M failures a second
    return writing + redoing   # (the restart itself is paid per failure whatever T is: it does not move the best T)
