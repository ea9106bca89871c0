def steps_lost(S, C, E):
    """Steps done twice when a rank dies right after global step S, with a checkpoint every C steps and at
    the end of every epoch of E steps: the restarted job resumes from the newest checkpoint at or before S."""
    since_interval = S % C     # steps since the last checkpoint of the interval (0: one was just written)
    since_epoch_end = S % E    # steps since the last epoch's end, which also wrote one
    return min(since_interval, since_epoch_end)   # the newer of the two is where the job resumes
