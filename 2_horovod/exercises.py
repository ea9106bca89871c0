"""Lab 2's exercises (workshop/teaching.py has the convention): what each checks, and the hint a wrong
answer gets. Each solution is in solutions/<key>.py, which the check runs for the reference answer."""

import sys
from pathlib import Path

from workshop.launchers.horovod_probe import Traffic
from workshop.teaching import Exercise, same_results

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ring_harness  # noqa: E402 - this folder's harness: the learner's ring on N gloo processes

# Each rank's bytes may differ from 2(N-1)K/N by this much: on loopback, TCP/IP headers (52 bytes a packet of
# up to 64 KiB) and gloo's few bytes of framing per message; the wrong rings send 1.5x (N = 3) or 2x (N = 4).
RING_TOLERANCE = 0.05
# The counters against 2(N-1)K: the headers (0.08% measured) and Horovod's own few messages.
WIRE_TOLERANCE = 0.02
K_PROBE = 64 << 20  # the notebook's default traffic_mib, in bytes


def judge_ring(answer, reference, context):
    """The learner's function on gloo at N = 2, 3 and 4 (ring_harness): its result against dist.all_reduce's
    on every rank, then the bytes each rank sent against 2(N-1)K/N."""
    if not callable(answer):
        return f"the answer should be a function, got {type(answer).__name__}"
    try:
        runs = ring_harness.run(answer)
    except OSError:
        return "Python cannot read your function's source: define it with `def` in the exercise cell and run the cell"
    for r in runs:
        if r.problem:
            return f"at N={r.ranks} your function {r.problem}"
        if not r.correct:
            return (f"at N={r.ranks} some rank's result differs from dist.all_reduce's (by up to {r.max_error:.3g}): "
                    "every rank must end with the sum of all N tensors, every element of it")
    for r in runs:
        # Judged by the tensors each rank passed to send (exact everywhere); the loopback's count, shown, is a
        # measurement, which a busy machine's barrier window can throw off (0.83x once, at load 17)
        sent = max(r.sent_by_rank) if r.sent_by_rank else r.per_rank_bytes
        ratio = r.per_rank_bytes / r.formula_bytes
        if abs(sent / r.formula_bytes - 1) > RING_TOLERANCE:
            how = "on the private loopback" if r.counted_by == "loopback" else "in the tensors passed to send"
            return (f"the sums are right, but at N={r.ranks} each rank sent {r.per_rank_bytes / r.tensor_bytes:.2f} K "
                    f"({how}), where a ring all-reduce sends 2(N-1)K/N = {r.formula_bytes / r.tensor_bytes:.2f} K "
                    f"({ratio:.2f}x)")
    return None


def whole_tensor_ring(tensor, rank, world_size):
    """A plausible wrong answer: a ring that passes whole tensors, N-1 times (right sums, (N-1)K bytes)."""
    import torch
    import torch.distributed as dist

    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    passing, total = tensor.clone(), tensor.clone()
    for _ in range(world_size - 1):
        incoming = torch.empty_like(passing)
        request = dist.isend(passing, right)
        dist.recv(incoming, left)
        request.wait()
        total += incoming
        passing = incoming
    tensor.copy_(total)
    return tensor


# horovod.ipynb, "Write ring all-reduce yourself"
RING_ALL_REDUCE = Exercise(
    key="ring_all_reduce", folder=HERE, name="ring_all_reduce",
    task="write ring_all_reduce(tensor, rank, world_size) with dist.isend/dist.recv: scatter-reduce, then "
         "all-gather, round the ring.",
    hint="cut the tensor into N chunks (tensor.view(-1).tensor_split(N)); in each of N-1 scatter-reduce steps a "
         "rank sends one chunk to rank+1 and adds the chunk it receives from rank-1 into its own; then each rank "
         "holds one finished chunk, and N-1 all-gather steps pass the finished chunks on. One chunk (K/N bytes) "
         "per step, never the whole tensor; and every rank sends first, so use dist.isend, then dist.recv, then "
         "wait(). Use only torch and dist inside the function.",
    judge=judge_ring,
    wrong=lambda reference, ctx: whole_tensor_ring,
    slow=True,  # its judge starts processes
)


def judge_wire(answer, reference, context):
    """Against what the loopback counters read in the notebook's Horovod runs (`traffic`), where they ran;
    against the solution's formula otherwise (sagemaker mode leaves the local measurement out)."""
    if not callable(answer):
        return f"the answer should be a function, got {type(answer).__name__}"
    measured = [t for t in context.get("traffic") or [] if isinstance(t, Traffic)]
    for t in measured:
        yours = answer(t.ranks, t.bytes_per_rank_tensor)
        if yours is None:
            return "your function returned None: it should return a number of bytes"
        if abs(float(yours) / t.measured_bytes - 1) > WIRE_TOLERANCE:
            return (f"wire_bytes({t.ranks}, K) is {float(yours) / t.bytes_per_rank_tensor:.3g} K, and the counters read "
                    f"{t.measured_bytes / t.bytes_per_rank_tensor:.3g} K in the run at N={t.ranks} "
                    f"({t.measured_bytes / float(yours):.2f}x yours)")
    return same_results(lambda ctx: [(n, K_PROBE) for n in (2, 3, 4, 8)],
                        describe=lambda a: f"wire_bytes(N={a[0]}, K={a[1]:,})")(answer, reference, context)


# horovod.ipynb, "Check the formula by measurement"
WIRE_BYTES = Exercise(
    key="wire_bytes", folder=HERE, name="wire_bytes",
    task="write wire_bytes(N, K): the bytes loopback's counters read during one all-reduce of K bytes over N ranks.",
    hint="the counters count every byte any rank sends, once, as it crosses: the N ranks' bytes together. "
         "Each rank sends one K/N chunk per step of the ring, and there are 2(N-1) steps; headers add under 0.1%.",
    judge=judge_wire,
    example=lambda: {"traffic": [  # lab 2's probe in a private namespace on a 2-core machine (test_horovod_probe)
        Traffic(2, K_PROBE, 2 * K_PROBE + 164_410, 4_002, 2_702, 0.2, 3, private_loopback=True),
        Traffic(4, K_PROBE, 6 * K_PROBE + 493_760, 13_286, 8_122, 0.4, 3, private_loopback=True)]},
    wrong=lambda reference, ctx: lambda N, K: 2 * (N - 1) * K / N,  # one rank's bytes, not all N ranks'
)
