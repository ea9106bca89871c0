# ✏️ Exercise 2: the batches each rank takes per epoch (a DistributedSampler's share, cut into batches).
import math


def batches_per_rank(samples, world_size, batch_size):
    return math.ceil(math.ceil(samples / world_size) / batch_size)
