import math


def search_seconds(trials, parallel, trial_s):
    """Wall time of a search of `trials` independent trials of `trial_s` seconds each, `parallel` at a time."""
    waves = math.ceil(trials / parallel)   # trials run in waves of `parallel`; a part-full last wave is a wave
    return waves * trial_s                 # nothing passes between trials: no communication term
