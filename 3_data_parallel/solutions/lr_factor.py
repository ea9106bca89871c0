# The linear scaling rule: the learning rate grows with the global batch (ranks x batch per rank); the batch
# per rank is the same at both world sizes, so the factor is their ratio.
lr_factor = world_sizes[1] / world_sizes[0]
