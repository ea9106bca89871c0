"""The smallest distributed job: join the process group (gloo), all-reduce one tensor, leave.

Used by benchmarks/bench_runtime.py to measure what a launcher costs per job, with almost no
training in the way. Reads only what torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, ...).
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(value)
expected = dist.get_world_size() * (dist.get_world_size() + 1) / 2
assert value.item() == expected, (value.item(), expected)
if dist.get_rank() == 0:
    print(f"METRICS rank=0 world_size={dist.get_world_size()} allreduce_sum={value.item():g}", flush=True)
dist.destroy_process_group()
os._exit(0)  # nothing left to flush; skip the interpreter's slow teardown of torch, equally for every launcher
