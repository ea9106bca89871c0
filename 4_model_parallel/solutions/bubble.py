def bubble(p, m):
    """The share of a pipeline step each of p stages waits, when the batch is split into m micro-batches."""
    waiting = p - 1      # slots a stage waits: for the first micro-batch to reach it, for the last gradient to return
    step = m + p - 1     # slots in the step: its own m micro-batches' work, and the wait
    return waiting / step
