import torch
import torch.distributed as dist


def ring_all_reduce(tensor, rank, world_size):
    """Sum `tensor` over all ranks, in place: scatter-reduce, then all-gather, round a ring."""
    chunks = tensor.view(-1).tensor_split(world_size)  # N chunks: views into `tensor`, K/N bytes each
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):  # scatter-reduce: pass a chunk right, add the one from the left
        outgoing = chunks[(rank - step) % world_size]
        target = chunks[(rank - step - 1) % world_size]
        incoming = torch.empty_like(target)
        request = dist.isend(outgoing, right)  # not dist.send: every rank sends first, and a blocking
        dist.recv(incoming, left)              # send would wait for a receiver that is sending too
        request.wait()
        target += incoming
    # Now this rank holds the finished sum of chunk rank+1; all-gather passes the finished chunks on.
    for step in range(world_size - 1):
        request = dist.isend(chunks[(rank + 1 - step) % world_size], right)
        dist.recv(chunks[(rank - step) % world_size], left)
        request.wait()
    return tensor
