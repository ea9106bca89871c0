import math


def place(shapes, num_ps, min_shard_bytes):
    """{variable: [the ps task of each of its shards]}, as ParameterServerStrategy places them."""
    placement, created = {}, 0  # `created`: the variables (each shard one) made so far
    for name, shape in shapes.items():  # in the order the model creates them
        size = 4 * math.prod(shape)  # float32
        shards = max(1, min(num_ps, shape[0], math.ceil(size / min_shard_bytes)))
        placement[name] = [(created + i) % num_ps for i in range(shards)]  # round robin
        created += shards
    return placement
