def checkpointed_bytes(layers, batch, seq_len, d_model, N):
    """Bytes of activations one of N ranks keeps for backward inside the blocks with activation checkpointing
    (fp32), when the global batch of `batch` sequences is split over the N ranks."""
    sequences = batch // N                           # data parallel: each rank computes its slice of the batch
    block_input = sequences * seq_len * d_model * 4  # a block's input: (sequences, seq_len, d_model), 4 bytes each
    return layers * block_input                      # one kept per block; the rest is recomputed in backward
