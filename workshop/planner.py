"""A planner for clusters larger than this machine: memory, step time, cost, and a strategy.

Given a model (parameters, activation bytes per sample, and either FLOPs per sample or a
measured compute time per sample), an instance type from `CATALOGUE`, a per-GPU batch size and
an instance count, it predicts for each strategy

- the memory each GPU holds (model states + activations), with and without offloading;
- the step time: compute plus communication from an alpha-beta model (ring all-reduce,
  parameter-server push/pull, hierarchical all-reduce: inside the instance, then across);
- hence samples/s, scaling efficiency against one GPU, and cost per epoch,

and `recommend()` picks a strategy the way the workshop's seed material does: fill one instance
first; plain data parallel (DDP) if the model fits in one GPU; otherwise shard, choosing the
lightest sharding that fits (optimizer state, then gradients too, then everything, then offload).

    from workshop import planner
    m = planner.transformer("gpt2-xl", layers=48, d_model=1600, heads=25, seq_len=1024, vocab=50257,
                            activation_checkpointing=True)   # or planner.Model(name, params, ...)
    print(planner.plan(m, "ml.p4d.24xlarge", batch_size=8, instance_count=2).table())
    print(planner.recommend(m, "ml.p4d.24xlarge", batch_size=8, gpus=16).reason)

Pure Python, no framework imported. The formulas (each with its source):

Memory per GPU, for Psi parameters sharded over D data-parallel ranks (ZeRO: Rajbhandari et
al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC'20,
https://arxiv.org/abs/1910.02054, section 3.1 and figure 1): mixed-precision Adam keeps
2 bytes/param of fp16/bf16 weights, 2 of gradients and K = 12 of optimizer state (fp32 master
weights, momentum, variance):

    DDP                        (2 + 2 + 12) Psi
    optimizer sharding (ZeRO-1)  2 Psi + 2 Psi + 12 Psi / D
    + gradients      (ZeRO-2)  2 Psi + (2 + 12) Psi / D
    full sharding (ZeRO-3/FSDP)  (2 + 2 + 12) Psi / D  + the gathered units: (min(2, U) 2 + 2) Psi / U

plus activations (batch x activation bytes per sample). Full sharding gathers one unit's weights
whole to compute with it, and FSDP2 prefetches the next (so two units at once), and holds one unit's
unsharded gradients until their reduce-scatter: with one unit (a model wrapped whole) that is the
whole model again, which is why FSDP is applied per layer. Offloading (ZeRO-Offload,
https://arxiv.org/abs/2101.06840; FSDP's CPUOffload) moves the optimizer state (for full
sharding: the parameters and gradients too) to host memory; the GPU keeps the rest.
`Precision` holds the bytes per parameter, so fp32 Adam (4 + 4 + 8) and fp32 SGD with momentum
(4 + 4 + 4, lab 3's CNN) work the same way.

Communication, alpha-beta (Hockney) model, message of K bytes over n ranks, link bandwidth B
and per-message latency alpha (Thakur, Rabenseifner, Gropp, "Optimization of Collective
Communication Operations in MPICH", 2005; NCCL's bus bandwidth, nccl-tests PERFORMANCE.md):

    ring all-reduce      2(n-1)/n * K/B + 2(n-1) alpha
    reduce-scatter, all-gather   (n-1)/n * K/B + (n-1) alpha   each
    hierarchical all-reduce      reduce-scatter inside the instance (NVLink), all-reduce of
                                 the 1/g shard across instances (each GPU's share of the
                                 network: B_net / g), all-gather inside the instance
    parameter server (synchronous push/pull, S servers, W workers): each worker pushes its
                                 gradient and pulls the weights, K each way; the servers take
                                 W*K in and send W*K out through S links:
                                 max(2K/B_worker, 2 W K / (S B_server)) + 2 alpha

DDP and ZeRO-1/2 move the volume of one all-reduce of the gradients per step. Communication
overlapping compute (DDP's buckets) is a parameter, `overlap` (0: none, 1: all of it hidden
behind the backward pass, taken as 2/3 of the compute).

Full sharding (ZeRO-3; PyTorch FSDP2 `fully_shard`, full_shard) works per *unit*, each module
wrapped by `fully_shard` (lab 4: one per transformer block, plus the root's embeddings and head;
`Model.fsdp_units`). For U units of equal size, a model of P parameter bytes (the dtype the
all-gather moves) and G gradient bytes (the reduce dtype), n ranks, each unit per step does:

    forward   all-gather of its weights        (n-1)/n * P/U sent per rank, (n-1) alpha
    backward  all-gather again (reshard_after_forward=True, the full_shard default), the same
              reduce-scatter of its gradients  NCCL: (n-1)/n * G/U, (n-1) alpha
                                               gloo: 2(n-1)/n * G/U, 2(n-1) alpha: PyTorch's
                                               ProcessGroupGloo has no reduce-scatter of its own;
                                               it clones the input, all-reduces it whole and keeps
                                               its chunk (measured: 64 MiB on 2 ranks put 128 MiB
                                               on loopback, as all_reduce does; all-gather 64 MiB)

so per rank-step NCCL moves (n-1)/n (2P + G), 3(n-1)/n K when P = G = K (ZeRO paper section 7's
1.5 all-reduces), gloo (n-1)/n (2P + 2G); and there are 3U collectives, each paying its latency
(U times the latency of the 1.5 all-reduces a whole-model view would count). Across instances each
collective is half of the all-reduce `algorithm` ('hierarchical': inside, then across).

Overlap (`overlap`): on GPUs FSDP2 runs its collectives on their own CUDA streams and prefetches
one unit ahead (forward: unit u+1's all-gather while unit u computes; backward: the next unit's
all-gather and the previous unit's reduce-scatter while unit u computes). With forward f and
backward b per unit (1/3 and 2/3 of the compute, / U), all-gather a and reduce-scatter r per unit,
one link carrying both:

    forward  = a + (U-1) max(f, a) + f        backward = a + (U-1) max(b, a + r) + b + r

and the exposed communication is forward + backward - compute (U=1: all of it; many units and
compute-bound: the first all-gathers and the last reduce-scatter). `overlap` interpolates between
no overlap (0) and this pipeline (1). On CPU tensors with gloo there is nothing to overlap: FSDP2's
streams are no-ops there and it issues every all-gather and reduce-scatter with async_op=False, so
the one training thread blocks on each (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py);
`backend="gloo"` instances get no overlap for full sharding whatever `overlap` says. What a unit
costs besides its bytes on such a host (FSDP2's hooks and copies, and the wake-ups of its three
blocking collectives, which the barrier-synchronised all-reduce fit does not see) can be given
as a measured `InstanceType.fsdp_unit_s` (benchmarks/bench_strategies.py measures it on toy units
with no compute and no bytes); it then replaces the collectives' latency terms, and also applies
to one process, where FSDP2 runs its hooks but no collective.

Compute per step = per-GPU batch x seconds per sample: measured, or FLOPs per sample /
(peak FLOP/s x `mfu`, the fraction of peak a real job reaches). When more processes share an
instance than it has devices (a CPU host running 4 ranks on 2 cores), they time-share:
compute is multiplied by procs / devices.

Pipeline parallel (`pipeline_step`): the model's layers cut into p stages of equal compute, one per
GPU, and each step's batch into m micro-batches. A stage computes one micro-batch's forward and
backward in t = compute / m, where compute is its share of the step (batch x seconds per sample / p).
GPipe (Huang et al., "GPipe", 2019, https://arxiv.org/abs/1811.06965: every forward, then every
backward) and 1F1B (Narayanan et al., "PipeDream", SOSP'19, and Megatron-LM's schedule, SC'21,
https://arxiv.org/abs/2104.04473, section 2.2: after p forwards, one backward per forward) both fill
and drain the pipeline: each stage waits p-1 slots of t in all, so

    step = (m + p - 1) (t + 2 o) + 2(p - 1) (alpha + b / B)        bubble = (p-1)/(m+p-1) of (m+p-1) t

where b is one micro-batch's hand-off (the boundary activation in forward, its gradient in backward:
batch / m x `Model.handoff_bytes_per_sample`), sent point to point; the hand-offs of the fill and
the drain lie on the critical path, the rest overlap compute; o is what the schedule costs per micro-batch
forward or backward besides its compute and its bytes (its blocking send and receive, its bookkeeping, each
call into the stage's layers), where it is measured (0 otherwise): 2(m + p - 1) of them lie on the critical
path, so it grows with m while the bubble shrinks. What differs is memory: a stage keeps
the activations of every micro-batch whose forward ran and whose backward has not: GPipe all m
(the whole batch's, whatever m is), 1F1B at most p on the first stage (p/m of GPipe's). 1F1B needs
m >= p. Consecutive stages sit on one instance while p fits in it (its intra-node link), else they
cross the network (a GPU's share of it).

Tensor parallel (`tensor_parallel_step`, Megatron-LM's layout: Shoeybi et al., 2019,
https://arxiv.org/abs/1909.08053, section 3): each block's first Linear split by output columns over
the degree's ranks, its last by input rows; each rank computes 1/degree of the block, and one
all-reduce of the block's output (batch x s x h numbers) joins the partial sums in the forward, one
of the same size the input's gradient in the backward; the weights never move:

    step = compute / degree + 2 x blocks x ring all-reduce(batch x s x h x bytes) + blocks x overhead

where overhead is what a split block costs besides compute and bytes where it is measured (PyTorch's
DTensor bookkeeping on a CPU). The all-reduces sit between dependent matrix products: nothing hides
them, which is why tensor parallel stays inside one instance (the function refuses a degree above its
devices).

Known simplifications, on purpose: the plans' `tensor_parallel` degree only divides the weights each
data-parallel rank holds and syncs (its step is `tensor_parallel_step`'s, on its own);
pipeline stages are equal and the pipeline is not combined with data parallelism here;
offload adds host-device transfers at `pcie_GBps` but not the CPU's optimizer time; no
stragglers, no input pipeline. Validation against measurements and published figures:
benchmarks/bench_strategies.py and its report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from workshop.errors import WorkshopError

GB = 1e9
CATALOGUE_DATE = "2026-11-22"

# --------------------------------------------------------------------------- catalogue


@dataclass(frozen=True)
class InstanceType:
    """One instance type's numbers the planner uses, with where they came from."""

    name: str
    gpus: int  # devices per instance (GPUs; for a CPU host, the cores training uses)
    gpu_memory_gb: float  # per device, GB (1e9 bytes) as the vendor states it
    network_gbps: float  # instance network bandwidth, Gbit/s (EFA where present)
    peak_tflops: float | None  # per device, dense bf16/fp16 tensor-core TFLOP/s
    intra_node_GBps: float  # per-device bandwidth between devices of one instance, GB/s
    usd_per_hour: float | None  # SageMaker training, on-demand, us-east-1
    source: str  # URL(s) the numbers were read from, and how
    date: str = CATALOGUE_DATE
    alpha_s: float = 5e-6  # latency per message between instances
    intra_alpha_s: float = 2e-6  # latency per message inside the instance
    pcie_GBps: float = 16.0  # host <-> device, per device (for offloading)
    host_memory_gb: float | None = None  # instance RAM (offloaded states live there)
    price_source: str = ""
    backend: str = "nccl"  # "nccl" (GPUs) or "gloo" (CPU tensors: no native reduce-scatter, no streams)
    # Measured fixed cost of one FSDP unit per step (hooks, copies, the latency of its blocking
    # collectives); None: the alpha terms of its collectives and no host cost (GPU hosts run ahead).
    fsdp_unit_s: float | None = None

    @property
    def network_Bps(self) -> float:
        return self.network_gbps * 1e9 / 8

    @property
    def intra_Bps(self) -> float:
        return self.intra_node_GBps * GB


def _price(name: str) -> tuple[float | None, str]:
    """The price from workshop.cloud's table (one place for prices), else None."""
    from workshop.cloud.prices import INSTANCE_PRICES, PRICE_REGION, PRICES_DATE

    price = INSTANCE_PRICES.get(name)
    if price is None:
        return None, "no price on record in workshop.cloud.INSTANCE_PRICES"
    return price.usd_per_hour, f"workshop.cloud ({PRICE_REGION}, {PRICES_DATE}): {price.source}"


_UNVERIFIED = (
    "unverified: AWS/NVIDIA product pages are not reachable from the machine this was written "
    "on; values as those pages publish them, to be checked at "
)


def _entry(name: str, **kw) -> InstanceType:
    usd, why = _price(name)
    return InstanceType(name=name, usd_per_hour=usd, price_source=why, **kw)


# GPU peak (dense, no sparsity): A100 312 TFLOP/s bf16 (NVIDIA A100 datasheet); H100 SXM 989
# (H100 datasheet); V100 SXM2 125 fp16 tensor (V100 datasheet); A10G and T4 left out (None)
# where no AWS-published figure was at hand: give flops via compute_s_per_sample instead.
CATALOGUE: dict[str, InstanceType] = {
    e.name: e
    for e in [
        _entry(
            "ml.p4d.24xlarge", gpus=8, gpu_memory_gb=40, network_gbps=400, peak_tflops=312,
            intra_node_GBps=300, host_memory_gb=1152,
            source=_UNVERIFIED + "https://aws.amazon.com/ec2/instance-types/p4/ (8 A100 40 GB, "
            "400 Gbps EFA, NVSwitch 600 GB/s bidirectional) and "
            "https://www.nvidia.com/en-us/data-center/a100/",
        ),
        _entry(
            "ml.p4de.24xlarge", gpus=8, gpu_memory_gb=80, network_gbps=400, peak_tflops=312,
            intra_node_GBps=300, host_memory_gb=1152,
            source=_UNVERIFIED + "https://aws.amazon.com/ec2/instance-types/p4/ (8 A100 80 GB)",
        ),
        _entry(
            "ml.p5.48xlarge", gpus=8, gpu_memory_gb=80, network_gbps=3200, peak_tflops=989,
            intra_node_GBps=450, host_memory_gb=2048,
            source=_UNVERIFIED + "https://aws.amazon.com/ec2/instance-types/p5/ (8 H100 80 GB, "
            "3200 Gbps EFAv2, NVSwitch 900 GB/s bidirectional) and "
            "https://www.nvidia.com/en-us/data-center/h100/",
        ),
        _entry(
            "ml.p3.2xlarge", gpus=1, gpu_memory_gb=16, network_gbps=10, peak_tflops=125,
            intra_node_GBps=150, host_memory_gb=61,
            source=_UNVERIFIED + "https://aws.amazon.com/ec2/instance-types/p3/ (1 V100 16 GB, "
            "up to 10 Gbps)",
        ),
        _entry(
            "ml.p3.16xlarge", gpus=8, gpu_memory_gb=16, network_gbps=25, peak_tflops=125,
            intra_node_GBps=150, host_memory_gb=488,
            source=_UNVERIFIED + "https://aws.amazon.com/ec2/instance-types/p3/ (8 V100 16 GB, "
            "NVLink 300 GB/s, 25 Gbps)",
        ),
        _entry(
            "ml.p3dn.24xlarge", gpus=8, gpu_memory_gb=32, network_gbps=100, peak_tflops=125,
            intra_node_GBps=150, host_memory_gb=768,
            source=_UNVERIFIED + "https://aws.amazon.com/ec2/instance-types/p3/ (8 V100 32 GB, "
            "100 Gbps EFA)",
        ),
        _entry(
            "ml.g5.xlarge", gpus=1, gpu_memory_gb=24, network_gbps=10, peak_tflops=None,
            intra_node_GBps=16, host_memory_gb=16,
            source=_UNVERIFIED + "https://aws.amazon.com/ec2/instance-types/g5/ (1 A10G 24 GB, "
            "up to 10 Gbps)",
        ),
        _entry(
            "ml.g5.12xlarge", gpus=4, gpu_memory_gb=24, network_gbps=40, peak_tflops=None,
            intra_node_GBps=16, host_memory_gb=192,
            source=_UNVERIFIED + "https://aws.amazon.com/ec2/instance-types/g5/ (4 A10G 24 GB, "
            "PCIe, no NVLink, 40 Gbps)",
        ),
        _entry(
            "ml.g4dn.xlarge", gpus=1, gpu_memory_gb=16, network_gbps=25, peak_tflops=None,
            intra_node_GBps=16, host_memory_gb=16,
            source=_UNVERIFIED + "https://aws.amazon.com/ec2/instance-types/g4/ (1 T4 16 GB, "
            "up to 25 Gbps)",
        ),
    ]
}


def get_instance(instance_type: str | InstanceType) -> InstanceType:
    if isinstance(instance_type, InstanceType):
        return instance_type
    found = CATALOGUE.get(instance_type) or CATALOGUE.get(f"ml.{instance_type}")
    if found is None:
        raise WorkshopError(
            f"The planner's catalogue has no instance type {instance_type!r}.",
            f"use one of {', '.join(sorted(CATALOGUE))}, or pass a planner.InstanceType(...) "
            "with its GPUs, memory, network bandwidth and price.",
        )
    return found


def local_instance(devices: int, alpha_s: float, bandwidth_Bps: float, name: str = "this machine",
                   backend: str = "gloo", fsdp_unit_s: float | None = None) -> InstanceType:
    """A CPU host as the planner sees it: `devices` cores, loopback with a measured alpha/B, gloo;
    `fsdp_unit_s`: FSDP's measured fixed cost per unit per step at this process count, if known."""
    _check_backend(backend)
    if fsdp_unit_s is not None and fsdp_unit_s < 0:
        raise WorkshopError(f"fsdp_unit_s must be 0 or more, got {fsdp_unit_s}.",
                            "give the measured seconds per FSDP unit per step, or None.")
    return InstanceType(
        name=name, gpus=devices, gpu_memory_gb=math.inf, network_gbps=bandwidth_Bps * 8 / 1e9,
        peak_tflops=None, intra_node_GBps=bandwidth_Bps / GB, usd_per_hour=None,
        source="measured: benchmarks/bench_allreduce.py", alpha_s=alpha_s, intra_alpha_s=alpha_s,
        backend=backend, fsdp_unit_s=fsdp_unit_s,
    )


BACKENDS = ("nccl", "gloo")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise WorkshopError(f"Unknown backend {backend!r}.", f"use one of {', '.join(BACKENDS)}.")


# --------------------------------------------------------------------------- model, precision


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of the model states (ZeRO paper's 2 + 2 + K accounting)."""

    name: str
    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float

    @property
    def total(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


MIXED_ADAM = Precision("mixed-precision Adam (2+2+12)", 2, 2, 12)
FP32_ADAM = Precision("fp32 Adam (4+4+8)", 4, 4, 8)
FP32_SGD_MOMENTUM = Precision("fp32 SGD with momentum (4+4+4)", 4, 4, 4)


@dataclass(frozen=True)
class Model:
    """What the planner needs to know about a model."""

    name: str
    params: float
    activation_bytes_per_sample: float = 0.0
    flops_per_sample: float | None = None  # forward + backward (e.g. 6 x params x tokens)
    compute_s_per_sample: float | None = None  # measured on one device; wins over flops
    # Modules wrapped by FSDP's fully_shard that hold parameters: one all-gather unit each
    # (lab 4: one per transformer block + the root's embeddings and head; lab 3's CNN in
    # benchmarks/workers/cnn_worker.py: its 4 layers). Only full sharding's step time uses it.
    fsdp_units: int = 1
    # Bytes one sample hands from a pipeline stage to the next (the boundary activation; its gradient
    # comes back as many): only pipeline_step uses it. A transformer's: seq_len x d_model x 2 (16-bit).
    handoff_bytes_per_sample: float = 0.0

    def __post_init__(self):
        if not self.params > 0:
            raise WorkshopError(f"Model {self.name!r}: params must be positive, got {self.params}.",
                                "give the parameter count, e.g. sum(p.numel() for p in model.parameters()).")
        if self.activation_bytes_per_sample < 0:
            raise WorkshopError(f"Model {self.name!r}: activation_bytes_per_sample is negative.",
                                "give bytes of activations kept per sample (0 if unknown).")
        for name in ("flops_per_sample", "compute_s_per_sample"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise WorkshopError(f"Model {self.name!r}: {name} must be positive, got {value}.",
                                    "leave it None or give a positive number.")
        if self.handoff_bytes_per_sample < 0:
            raise WorkshopError(f"Model {self.name!r}: handoff_bytes_per_sample is negative.",
                                "give the bytes of one sample's activation at a stage boundary (0 if unknown).")
        if not isinstance(self.fsdp_units, int) or isinstance(self.fsdp_units, bool) or self.fsdp_units < 1:
            raise WorkshopError(f"Model {self.name!r}: fsdp_units must be a whole number of at least 1, "
                                f"got {self.fsdp_units!r}.",
                                "count the modules fully_shard wraps that hold parameters (1: the whole model).")


def transformer(
    name: str, layers: int, d_model: int, heads: int, seq_len: int, vocab: int,
    activation_checkpointing: bool = False, stores_attention_scores: bool = True,
    tied_embeddings: bool = True,
) -> Model:
    """A GPT-style decoder as the planner sees it, from the published formulas.

    - parameters: 12 L h^2 + 13 L h (attention and MLP weights and biases, two layer norms)
      + (V + s) h (token and position embeddings) + 2h (final layer norm), + V h more when the
      output layer is not tied to the token embedding (lab 4's model);
    - training FLOPs per sequence (Narayanan et al., "Efficient Large-Scale Language Model
      Training on GPU Clusters Using Megatron-LM", SC'21, https://arxiv.org/abs/2104.04473,
      equation 3 without recomputation): 72 s L h^2 (1 + s/(6h)) + 6 s h V; with activation
      checkpointing the layers' forward runs twice: 96 s L h^2 (1 + s/(6h)) + 6 s h V;
    - activation bytes kept per sequence (Korthikanti et al., "Reducing Activation
      Recomputation in Large Transformer Models", https://arxiv.org/abs/2205.05198, equation 1,
      16-bit activations): s h (34 + 5 a s / h) per layer; without the attention scores (fused
      / flash attention) s h 34; with full checkpointing only each layer's input, 2 s h;
    - FSDP units: one per layer plus the root (embeddings, final norm, head), as lab 4 wraps it;
    - a pipeline stage hands on one layer's output per sequence: s h values of 16 bits.
    """
    for label, value in (("layers", layers), ("d_model", d_model), ("heads", heads),
                         ("seq_len", seq_len), ("vocab", vocab)):
        _positive_int(label, value)
    if d_model % heads:
        raise WorkshopError(f"d_model={d_model} is not divisible by heads={heads}.",
                            "each head gets d_model / heads dimensions: choose a divisor.")
    L, h, a, s, V = layers, d_model, heads, seq_len, vocab
    params = 12 * L * h * h + 13 * L * h + (V + s) * h + 2 * h + (0 if tied_embeddings else V * h)
    layer_flops = (96 if activation_checkpointing else 72) * s * L * h * h * (1 + s / (6 * h))
    flops = layer_flops + 6 * s * h * V
    if activation_checkpointing:
        acts = 2 * s * h * L
    else:
        acts = s * h * (34 + (5 * a * s / h if stores_attention_scores else 0)) * L
    return Model(name, params=params, activation_bytes_per_sample=acts, flops_per_sample=flops,
                 fsdp_units=L + 1, handoff_bytes_per_sample=2 * s * h)


# --------------------------------------------------------------------------- strategies

DDP, ZERO1, ZERO2, FULL, PS = "ddp", "zero1", "zero2", "full_shard", "parameter_server"
STRATEGIES = (DDP, ZERO1, ZERO2, FULL, PS)
LABELS = {
    DDP: "DDP (replicated)",
    ZERO1: "optimizer-state sharding (ZeRO-1)",
    ZERO2: "gradient + optimizer sharding (ZeRO-2)",
    FULL: "full sharding (ZeRO-3 / FSDP)",
    PS: "parameter server (sync push/pull)",
}
# Lightest first: the order recommend() tries them in.
SHARDING_ORDER = (ZERO1, ZERO2, FULL)


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise WorkshopError(f"Unknown strategy {strategy!r}.", f"use one of {', '.join(STRATEGIES)}.")


def _positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise WorkshopError(f"{name} must be a whole number of at least 1, got {value!r}.",
                            f"pass {name}=1 or more.")


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU (and per GPU's share of host memory, when offloading)."""

    params: float
    grads: float
    optimizer: float
    activations: float
    host: float = 0.0  # offloaded to the instance's CPU memory, per GPU
    # Full sharding's transient buffers: the units gathered at once (the one computing and the
    # one prefetched) and one unit's unsharded gradients before its reduce-scatter.
    gathered: float = 0.0

    @property
    def model_states(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.model_states + self.activations + self.gathered


def memory_per_gpu(
    model: Model, strategy: str, batch_size: int, data_parallel: int,
    precision: Precision = MIXED_ADAM, offload: bool = False, tensor_parallel: int = 1,
) -> Memory:
    """Memory one GPU holds: the ZeRO accounting above, for `data_parallel` sharding ranks."""
    _check_strategy(strategy)
    _positive_int("batch_size", batch_size)
    _positive_int("data_parallel", data_parallel)
    _positive_int("tensor_parallel", tensor_parallel)
    psi = model.params / tensor_parallel  # weights each data-parallel rank replicates or shards
    d = data_parallel
    p, g, o = psi * precision.param_bytes, psi * precision.grad_bytes, psi * precision.optimizer_bytes
    if strategy in (DDP, PS):  # a PS worker holds a full copy of weights and gradients too
        if strategy == PS:
            o = 0.0  # the optimizer state lives on the parameter servers
    elif strategy == ZERO1:
        o /= d
    elif strategy == ZERO2:
        g, o = g / d, o / d
    elif strategy == FULL:
        p, g, o = p / d, g / d, o / d
    acts = batch_size * model.activation_bytes_per_sample / tensor_parallel
    gathered = 0.0
    if strategy == FULL:  # FSDP2: the computing unit + the prefetched one, whole; one unit's gradients
        u = model.fsdp_units
        gathered = psi / u * (min(2, u) * precision.param_bytes + precision.grad_bytes)
    host = 0.0
    if offload:
        host, o = o, 0.0
        if strategy == FULL:  # FSDP CPUOffload / ZeRO-Infinity: the shards live on the host
            host, p, g = host + p + g, 0.0, 0.0
    return Memory(p, g, o, acts, host, gathered)


# --------------------------------------------------------------------------- communication


def ring_allreduce_s(nbytes: float, n: int, bandwidth_Bps: float, alpha_s: float) -> float:
    """Ring all-reduce: each rank sends and receives 2(n-1)/n of the message."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bandwidth_Bps + 2 * (n - 1) * alpha_s


def ring_half_s(nbytes: float, n: int, bandwidth_Bps: float, alpha_s: float) -> float:
    """Reduce-scatter or all-gather on a ring: half an all-reduce."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bandwidth_Bps + (n - 1) * alpha_s


def hierarchical_allreduce_s(nbytes: float, inst: InstanceType, gpus_per_node: int, nodes: int) -> float:
    """Reduce-scatter inside each instance, all-reduce of each 1/g shard across instances
    (g rings in parallel, each with 1/g of the network), all-gather inside."""
    inside = 2 * ring_half_s(nbytes, gpus_per_node, inst.intra_Bps, inst.intra_alpha_s)
    across = ring_allreduce_s(nbytes / gpus_per_node, nodes, inst.network_Bps / gpus_per_node, inst.alpha_s)
    return inside + across


def flat_ring_bandwidth(inst: InstanceType, gpus_per_node: int, nodes: int) -> tuple[float, float]:
    """(bandwidth per rank, alpha) of one flat ring over all GPUs: across instances every GPU
    gets its share of the network."""
    if nodes == 1:
        return inst.intra_Bps, inst.intra_alpha_s
    return min(inst.intra_Bps, inst.network_Bps / gpus_per_node), inst.alpha_s


def allreduce_s(nbytes: float, inst: InstanceType, gpus_per_node: int, nodes: int,
                algorithm: str = "hierarchical") -> float:
    if algorithm == "hierarchical" and nodes > 1:
        return hierarchical_allreduce_s(nbytes, inst, gpus_per_node, nodes)
    if algorithm not in ("hierarchical", "ring"):
        raise WorkshopError(f"Unknown all-reduce algorithm {algorithm!r}.", "use 'ring' or 'hierarchical'.")
    bw, alpha = flat_ring_bandwidth(inst, gpus_per_node, nodes)
    return ring_allreduce_s(nbytes, gpus_per_node * nodes, bw, alpha)


def allgather_s(nbytes: float, inst: InstanceType, gpus_per_node: int, nodes: int,
                algorithm: str = "hierarchical") -> float:
    """All-gather of an `nbytes` result (each rank holds 1/n of it): half an all-reduce, ring or
    hierarchical, on NCCL and on gloo alike."""
    return allreduce_s(nbytes, inst, gpus_per_node, nodes, algorithm) / 2


def reduce_scatter_s(nbytes: float, inst: InstanceType, gpus_per_node: int, nodes: int,
                     algorithm: str = "hierarchical", backend: str | None = None) -> float:
    """Reduce-scatter of an `nbytes` input: half an all-reduce on NCCL; on gloo a whole one
    (ProcessGroupGloo clones the input, all-reduces it and keeps its own chunk)."""
    backend = inst.backend if backend is None else backend
    _check_backend(backend)
    full = allreduce_s(nbytes, inst, gpus_per_node, nodes, algorithm)
    return full if backend == "gloo" else full / 2


@dataclass(frozen=True)
class FsdpComm:
    """Full sharding's collectives in one step, per rank: `units` units, each with `allgathers`
    all-gathers of its weights and one reduce-scatter of its gradients."""

    units: int
    allgathers: int  # per unit: 2 with reshard_after_forward (full_shard), 1 without
    allgather_bytes: float  # bytes one rank sends in one unit's all-gather
    reduce_scatter_bytes: float  # ... in one unit's reduce-scatter (gloo: a whole all-reduce's)
    allgather_s: float  # one unit's all-gather (its latency included unless fixed_s is measured)
    reduce_scatter_s: float  # one unit's reduce-scatter (likewise)
    fixed_s: float = 0.0  # measured fixed cost per unit (InstanceType.fsdp_unit_s), never hidden

    @property
    def collectives(self) -> int:
        return self.units * (self.allgathers + 1) if self.allgather_bytes or self.reduce_scatter_bytes else 0

    @property
    def bytes_per_rank(self) -> float:
        return self.units * (self.allgathers * self.allgather_bytes + self.reduce_scatter_bytes)

    @property
    def serial_s(self) -> float:
        """Every collective and fixed cost one after the other: nothing overlapped."""
        return self.units * (self.allgathers * self.allgather_s + self.reduce_scatter_s + self.fixed_s)

    def exposed_s(self, compute_s: float, overlap: float) -> float:
        """What compute does not hide. overlap=1: FSDP2's one-unit-ahead prefetch pipeline (see the
        module docstring); 0: none; in between, a mix of the two."""
        if overlap == 0 or compute_s <= 0:
            return self.serial_s
        u, a, r = self.units, self.allgather_s, self.reduce_scatter_s
        a_back = a if self.allgathers > 1 else 0.0  # backward re-gathers only if resharded
        f, b = compute_s / 3 / u, compute_s * 2 / 3 / u
        forward = a + (u - 1) * max(f, a) + f
        backward = a_back + (u - 1) * max(b, a_back + r) + b + r
        pipelined = max(0.0, forward + backward - compute_s) + u * self.fixed_s
        return (1 - overlap) * self.serial_s + overlap * pipelined


def fsdp_comm(model: Model, instance_type: str | InstanceType, data_parallel: int, gpus_per_node: int,
              nodes: int, precision: Precision = MIXED_ADAM, tensor_parallel: int = 1,
              algorithm: str = "hierarchical", comm_dtype_bytes: float | None = None,
              reshard_after_forward: bool = True) -> FsdpComm:
    """One step of FSDP's per-unit collectives over `data_parallel` ranks (the module docstring's
    formulas): all-gathers move the weights (`precision.param_bytes`), reduce-scatters the
    gradients (`comm_dtype_bytes`, else `precision.grad_bytes`). One rank (FSDP2 at world size 1)
    runs no collective, only its fixed per-unit cost, if measured."""
    inst = get_instance(instance_type)
    _positive_int("data_parallel", data_parallel)
    u, n = model.fsdp_units, data_parallel
    fixed = inst.fsdp_unit_s or 0.0
    if n == 1:
        return FsdpComm(u, 2 if reshard_after_forward else 1, 0.0, 0.0, 0.0, 0.0, fixed)
    psi = model.params / tensor_parallel
    p_unit, g_unit = psi * precision.param_bytes / u, psi * (comm_dtype_bytes or precision.grad_bytes) / u
    rs_volume = 2 if inst.backend == "gloo" else 1
    # A measured per-unit cost includes the collectives' latency: time their bytes only.
    timing = replace(inst, alpha_s=0.0, intra_alpha_s=0.0) if inst.fsdp_unit_s is not None else inst
    return FsdpComm(
        units=u, allgathers=2 if reshard_after_forward else 1,
        allgather_bytes=(n - 1) / n * p_unit, reduce_scatter_bytes=rs_volume * (n - 1) / n * g_unit,
        allgather_s=allgather_s(p_unit, timing, gpus_per_node, nodes, algorithm),
        reduce_scatter_s=reduce_scatter_s(g_unit, timing, gpus_per_node, nodes, algorithm),
        fixed_s=fixed,
    )


def parameter_server_s(nbytes: float, workers: int, servers: int, worker_Bps: float,
                       server_Bps: float, alpha_s: float) -> float:
    """Synchronous push (gradients) and pull (weights), K bytes each way per worker."""
    if workers < 1 or servers < 1:
        raise WorkshopError("A parameter server needs at least one worker and one server.",
                            "use 2 or more instances (one coordinates, the rest work).")
    worker_side = 2 * nbytes / worker_Bps
    server_side = 2 * workers * nbytes / (servers * server_Bps)
    return max(worker_side, server_side) + 2 * alpha_s


# --------------------------------------------------------------------------- step time


@dataclass(frozen=True)
class Step:
    compute_s: float
    comm_s: float  # communication time, before overlap
    exposed_comm_s: float  # what is left after overlap with the backward pass
    bytes_per_gpu: float  # bytes each GPU sends per step (ring: 2(n-1)/n K ...)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exposed_comm_s


def compute_s_per_sample(model: Model, inst: InstanceType, mfu: float) -> float:
    if model.compute_s_per_sample is not None:
        return model.compute_s_per_sample
    if model.flops_per_sample is None:
        raise WorkshopError(f"Model {model.name!r} has neither compute_s_per_sample nor flops_per_sample.",
                            "measure seconds per sample on one device, or give FLOPs per sample "
                            "(about 6 x parameters x tokens for a transformer).")
    if inst.peak_tflops is None:
        raise WorkshopError(f"The catalogue has no peak FLOP/s for {inst.name}.",
                            "give the model's measured compute_s_per_sample on that GPU instead.")
    if not 0 < mfu <= 1:
        raise WorkshopError(f"mfu must be in (0, 1], got {mfu}.", "use e.g. 0.4 (40% of peak).")
    return model.flops_per_sample / (inst.peak_tflops * 1e12 * mfu)


def step_time(
    model: Model, instance_type: str | InstanceType, strategy: str, batch_size: int,
    instance_count: int = 1, procs_per_instance: int | None = None,
    precision: Precision = MIXED_ADAM, offload: bool = False, tensor_parallel: int = 1,
    mfu: float = 0.4, overlap: float = 0.0, algorithm: str = "hierarchical",
    comm_dtype_bytes: float | None = None,
) -> Step:
    """Predicted time of one training step (every rank does one micro-batch of `batch_size`)."""
    _check_strategy(strategy)
    inst = get_instance(instance_type)
    _positive_int("batch_size", batch_size)
    _positive_int("instance_count", instance_count)
    procs = inst.gpus if procs_per_instance is None else procs_per_instance
    _positive_int("procs_per_instance", procs)
    if not 0 <= overlap <= 1:
        raise WorkshopError(f"overlap must be in [0, 1], got {overlap}.", "use 0 (none) to 1 (all).")
    world = procs * instance_count
    if world % tensor_parallel:
        raise WorkshopError(f"tensor_parallel={tensor_parallel} does not divide the {world} processes.",
                            "choose a degree that divides the GPUs per instance.")
    dp = world // tensor_parallel
    # Time-sharing: more processes than devices on an instance (CPU hosts) slow each one down.
    share = max(1.0, procs / inst.gpus)
    # Tensor parallelism splits each sample's FLOPs over its `tensor_parallel` GPUs.
    compute = batch_size * compute_s_per_sample(model, inst, mfu) * share / tensor_parallel
    grad_bytes = model.params / tensor_parallel * (comm_dtype_bytes or precision.grad_bytes)
    nodes, g = instance_count, procs // tensor_parallel if procs >= tensor_parallel else 1
    if strategy == PS:
        # One server per instance (lab 1's layout); every instance's link serves both roles.
        workers = world if instance_count > 1 else max(1, world)
        link = inst.network_Bps / procs if instance_count > 1 else inst.intra_Bps
        server_link = inst.network_Bps if instance_count > 1 else inst.intra_Bps
        comm = parameter_server_s(grad_bytes, workers, instance_count, link, server_link,
                                  inst.alpha_s if instance_count > 1 else inst.intra_alpha_s)
        sent = 2 * grad_bytes
    elif strategy == FULL:
        fsdp = fsdp_comm(model, inst, dp, max(1, g), nodes, precision, tensor_parallel, algorithm,
                         comm_dtype_bytes)
        comm, sent = fsdp.serial_s, fsdp.bytes_per_rank
    else:
        comm = allreduce_s(grad_bytes, inst, max(1, g), nodes, algorithm) if dp > 1 else 0.0
        sent = 2 * (dp - 1) / dp * grad_bytes if dp > 1 else 0.0
    pcie = 0.0
    if offload:
        # Gradients down to the host, updated weights back up, over PCIe, per GPU's shard.
        shard = model.params / tensor_parallel / (dp if strategy != DDP else 1)
        pcie = shard * (precision.grad_bytes + precision.param_bytes) / (inst.pcie_GBps * GB)
    if strategy == FULL:
        # gloo (CPU tensors): FSDP2 blocks on every collective, so nothing overlaps.
        exposed = fsdp.exposed_s(compute, 0.0 if inst.backend == "gloo" else overlap) + pcie
    else:
        exposed = max(0.0, comm + pcie - overlap * compute * 2 / 3)
    return Step(compute, comm + pcie, exposed, sent)


# --------------------------------------------------------------------------- pipeline parallel

GPIPE, ONE_F_ONE_B = "gpipe", "1f1b"
SCHEDULES = (GPIPE, ONE_F_ONE_B)


def bubble(stages: int, microbatches: int) -> float:
    """The share of a pipeline step each stage waits, filling and draining: (p-1)/(m+p-1)."""
    _positive_int("stages", stages)
    _positive_int("microbatches", microbatches)
    return (stages - 1) / (microbatches + stages - 1)


@dataclass(frozen=True)
class PipelineStep:
    """One step of a pipeline of `stages` stages over `microbatches` micro-batches, per stage."""

    schedule: str
    stages: int
    microbatches: int
    compute_s: float  # one stage's forward and backward of all m micro-batches
    bubble_s: float  # the p-1 micro-batch slots it waits while the pipeline fills and drains
    handoff_s: float  # the hand-offs on the critical path: 2(p-1) point-to-point messages
    overhead_s: float  # the schedule's own cost: 2(m+p-1) forwards and backwards x microbatch_overhead_s
    handoff_bytes: float  # bytes a stage sends on per step (activations forward, or gradients back)
    activation_bytes: float  # the most a stage keeps for backward at once (the first stage's)
    microbatches_held: int  # how many micro-batches' activations that is

    @property
    def total_s(self) -> float:
        return self.compute_s + self.bubble_s + self.handoff_s + self.overhead_s

    @property
    def idle_share(self) -> float:
        """The share of the step a stage is not computing: the bubble, the exposed hand-offs and the schedule's
        own cost."""
        return 1 - self.compute_s / self.total_s if self.total_s else 0.0


def pipeline_step(model: Model, instance_type: str | InstanceType, stages: int, microbatches: int,
                  batch_size: int, schedule: str = ONE_F_ONE_B, mfu: float = 0.4,
                  procs_per_instance: int | None = None, microbatch_overhead_s: float = 0.0) -> PipelineStep:
    """Predicted step of a pipeline (the module docstring's formula): `batch_size` samples per step, split
    into `microbatches`, through `stages` stages of equal compute, one per GPU (or core).
    `microbatch_overhead_s`: what the schedule costs per micro-batch forward or backward on a stage besides its
    compute and its bytes, if measured (code/pipeline.py runs the same schedule on a model too narrow to
    compute); 2(m + p - 1) of them lie on the step's critical path."""
    if schedule not in SCHEDULES:
        raise WorkshopError(f"Unknown pipeline schedule {schedule!r}.", f"use one of {', '.join(SCHEDULES)}.")
    inst = get_instance(instance_type)
    for label, value in (("stages", stages), ("microbatches", microbatches), ("batch_size", batch_size)):
        _positive_int(label, value)
    if not microbatch_overhead_s >= 0:
        raise WorkshopError(f"microbatch_overhead_s must be 0 or more, got {microbatch_overhead_s}.",
                            "give the measured seconds a schedule costs per micro-batch forward or backward "
                            "besides compute and bytes, or 0.")
    if microbatches > batch_size:
        raise WorkshopError(f"{microbatches} micro-batches of a batch of {batch_size}: some would be empty.",
                            "use at most batch_size micro-batches.")
    if schedule == ONE_F_ONE_B and microbatches < stages:
        raise WorkshopError(f"1F1B needs at least one micro-batch per stage: m={microbatches} < p={stages}.",
                            f"use microbatches={stages} or more, or schedule='gpipe'.")
    per_instance = min(stages, inst.gpus) if procs_per_instance is None else procs_per_instance
    _positive_int("procs_per_instance", per_instance)
    share = max(1.0, per_instance / inst.gpus)  # more stages than devices on an instance: they time-share
    compute = batch_size * compute_s_per_sample(model, inst, mfu) * share / stages
    p, m = stages, microbatches
    b = batch_size / m * model.handoff_bytes_per_sample
    if stages <= per_instance:  # every stage on one instance: its intra-node link
        alpha, bandwidth = inst.intra_alpha_s, inst.intra_Bps
    else:
        alpha, bandwidth = inst.alpha_s, min(inst.intra_Bps, inst.network_Bps / inst.gpus)
    held = m if schedule == GPIPE else min(m, p)
    return PipelineStep(
        schedule, p, m, compute_s=compute, bubble_s=(p - 1) * compute / m,
        handoff_s=2 * (p - 1) * (alpha + b / bandwidth) if p > 1 else 0.0,
        overhead_s=2 * (m + p - 1) * microbatch_overhead_s if p > 1 else 0.0,
        handoff_bytes=batch_size * model.handoff_bytes_per_sample if p > 1 else 0.0,
        activation_bytes=held * batch_size / m * model.activation_bytes_per_sample / p,
        microbatches_held=held,
    )


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Row:
    strategy: str
    offload: bool
    memory: Memory
    fits: bool
    step: Step
    samples_per_sec: float
    efficiency: float  # samples/s / (GPUs x samples/s of one GPU with no communication)
    epoch_s: float | None
    cost_per_epoch_usd: float | None

    @property
    def label(self) -> str:
        return LABELS[self.strategy] + (" + offload" if self.offload else "")


@dataclass
class Plan:
    model: Model
    instance: InstanceType
    batch_size: int
    instance_count: int
    procs_per_instance: int
    precision: Precision
    rows: list[Row] = field(default_factory=list)
    usable_fraction: float = 0.9

    @property
    def world_size(self) -> int:
        return self.instance_count * self.procs_per_instance

    def row(self, strategy: str, offload: bool = False) -> Row:
        for r in self.rows:
            if r.strategy == strategy and r.offload == offload:
                return r
        raise WorkshopError(f"No row for {strategy!r} (offload={offload}) in this plan.",
                            f"use one of {', '.join(sorted({r.strategy for r in self.rows}))}.")

    def table(self) -> str:
        """A markdown table of every strategy."""
        cap = self.instance.gpu_memory_gb * self.usable_fraction
        head = (
            f"{self.model.name}: {self.model.params / 1e9:.3g}B params, {self.precision.name}; "
            f"{self.instance_count} x {self.instance.name} ({self.world_size} GPUs, "
            f"{self.instance.gpu_memory_gb:g} GB each, {cap:.0f} GB usable), batch {self.batch_size} per GPU\n\n"
            "| strategy | GB per GPU | fits | host GB per GPU | step s | comm s | samples/s | "
            "efficiency | $ per epoch |\n|---|---:|:-:|---:|---:|---:|---:|---:|---:|"
        )
        body = []
        for r in self.rows:
            cost = "-" if r.cost_per_epoch_usd is None else f"{r.cost_per_epoch_usd:,.2f}"
            body.append(
                f"| {r.label} | {r.memory.total / GB:,.1f} | {'yes' if r.fits else 'no'} "
                f"| {r.memory.host / GB:,.1f} | {r.step.total_s:.3g} | {r.step.exposed_comm_s:.3g} "
                f"| {r.samples_per_sec:,.1f} | {r.efficiency:.2f} | {cost} |"
            )
        return "\n".join([head, *body])


def plan(
    model: Model, instance_type: str | InstanceType, batch_size: int, instance_count: int = 1,
    procs_per_instance: int | None = None, precision: Precision = MIXED_ADAM,
    dataset_samples: int | None = None, tensor_parallel: int = 1, mfu: float = 0.4,
    overlap: float = 0.0, algorithm: str = "hierarchical", usable_fraction: float = 0.9,
    strategies: tuple[str, ...] = STRATEGIES,
) -> Plan:
    """Memory, step time, efficiency and cost of every strategy, with and without offload."""
    inst = get_instance(instance_type)
    _positive_int("batch_size", batch_size)
    _positive_int("instance_count", instance_count)
    procs = inst.gpus if procs_per_instance is None else procs_per_instance
    _positive_int("procs_per_instance", procs)
    if dataset_samples is not None:
        _positive_int("dataset_samples", dataset_samples)
    if not 0 < usable_fraction <= 1:
        raise WorkshopError(f"usable_fraction must be in (0, 1], got {usable_fraction}.",
                            "use e.g. 0.9: leave 10% for the framework and fragmentation.")
    world = procs * instance_count
    if world % tensor_parallel:
        raise WorkshopError(f"tensor_parallel={tensor_parallel} does not divide the {world} processes.",
                            "choose a degree that divides the GPUs per instance.")
    dp = world // tensor_parallel
    result = Plan(model, inst, batch_size, instance_count, procs, precision, usable_fraction=usable_fraction)
    one = step_time(model, inst, DDP, batch_size, 1, 1, precision, mfu=mfu)
    per_gpu_alone = batch_size / one.compute_s
    cap = inst.gpu_memory_gb * GB * usable_fraction
    for strategy in strategies:
        if strategy == PS and instance_count < 2:
            continue  # lab 1's layout needs a coordinator instance and worker instances
        for offload in (False, True):
            if strategy == PS and offload:
                continue
            mem = memory_per_gpu(model, strategy, batch_size, dp, precision, offload, tensor_parallel)
            st = step_time(model, inst, strategy, batch_size, instance_count, procs, precision,
                           offload, tensor_parallel, mfu, overlap, algorithm)
            sps = dp * batch_size / st.total_s
            eff = sps / (world * per_gpu_alone)
            epoch = dataset_samples / sps if dataset_samples else None
            cost = (epoch / 3600 * instance_count * inst.usd_per_hour
                    if epoch is not None and inst.usd_per_hour is not None else None)
            result.rows.append(Row(strategy, offload, mem, mem.total <= cap, st, sps, eff, epoch, cost))
    return result


# --------------------------------------------------------------------------- recommendation


@dataclass(frozen=True)
class Recommendation:
    strategy: str
    offload: bool
    instance_count: int
    procs_per_instance: int
    reason: str
    plan: Plan

    @property
    def label(self) -> str:
        return LABELS[self.strategy] + (" + offload" if self.offload else "")


def recommend(
    model: Model, instance_type: str | InstanceType, batch_size: int,
    instance_count: int | None = None, gpus: int | None = None, **kwargs,
) -> Recommendation:
    """The seed material's rule: fill one instance first; data parallel if the model fits in
    one GPU; otherwise shard, the lightest sharding that fits; offload only if none does.

    `gpus`: how many GPUs the job wants (default: one full instance); they fill instances in
    order. `instance_count`: instead of `gpus`, use this many full instances.
    """
    inst = get_instance(instance_type)
    _positive_int("batch_size", batch_size)
    if instance_count is not None and gpus is not None:
        raise WorkshopError("Give either instance_count or gpus, not both.",
                            "gpus=N fills instances in order; instance_count=N uses N full instances.")
    if gpus is not None:
        _positive_int("gpus", gpus)
        count = math.ceil(gpus / inst.gpus)
        procs = inst.gpus if count > 1 else gpus  # fill one instance first
    else:
        count = 1 if instance_count is None else instance_count
        _positive_int("instance_count", count)
        procs = inst.gpus
    strategies = tuple(s for s in STRATEGIES if s != PS)
    p = plan(model, inst, batch_size, count, procs, strategies=strategies, **kwargs)
    cap = inst.gpu_memory_gb * p.usable_fraction
    ddp = p.row(DDP)
    where = f"{count} x {inst.name}, {procs} GPU(s) per instance"
    if ddp.fits:
        return Recommendation(
            DDP, False, count, procs,
            f"The model with its optimizer state and a batch of {batch_size} needs "
            f"{ddp.memory.total / GB:.1f} GB per GPU, within the {cap:.0f} GB usable of one "
            f"{inst.gpu_memory_gb:g} GB GPU: plain data parallel (DDP), no sharding needed ({where}). "
            + ("One instance is filled before any second one is added." if procs == inst.gpus or count == 1 else ""),
            p,
        )
    for offload in (False, True):
        for strategy in SHARDING_ORDER:
            row = p.row(strategy, offload)
            if row.fits:
                return Recommendation(
                    strategy, offload, count, procs,
                    f"DDP needs {ddp.memory.total / GB:.1f} GB per GPU, more than the {cap:.0f} GB "
                    f"usable; {row.label} is the lightest sharding that fits: "
                    f"{row.memory.total / GB:.1f} GB per GPU over {p.world_size} GPUs ({where})"
                    + (f", with {row.memory.host / GB:.1f} GB per GPU in host memory." if offload else "."),
                    p,
                )
    full = p.row(FULL, True)
    fixed = full.memory.activations + full.memory.gathered  # neither falls with more instances
    need = math.ceil(model.params * p.precision.total / (cap * GB - fixed) / inst.gpus) if cap * GB > fixed else None
    raise WorkshopError(
        f"Nothing fits on {where}: even full sharding needs "
        f"{p.row(FULL).memory.total / GB:.1f} GB per GPU (activations "
        f"{full.memory.activations / GB:.1f} GB of it) against {cap:.0f} GB usable.",
        (f"use about {need} or more instances, " if need else "")
        + "a smaller batch_size (or activation checkpointing to shrink activations), "
        "or an instance type with more GPU memory.",
    )


def with_compute(model: Model, compute_s_per_sample: float) -> Model:
    """The same model with a measured compute time per sample (e.g. from a benchmark)."""
    return replace(model, compute_s_per_sample=compute_s_per_sample)


# --------------------------------------------------------------------------- tensor parallel

@dataclass(frozen=True)
class TensorParallelStep:
    """One step of `blocks` blocks each split over `degree` ranks (column-wise, then row-wise), per rank."""

    degree: int
    blocks: int
    compute_s: float  # each rank's share of the forward and backward: the whole's / degree
    comm_s: float  # the all-reduces: 2 per block (forward: the output; backward: the input's gradient)
    overhead_s: float  # the split blocks' own cost besides compute and bytes (block_overhead_s x blocks)
    allreduces: int
    allreduce_bytes: float  # one all-reduce's payload: the block's output, batch x bytes per sample
    sent_bytes: float  # what each rank sends per step (ring: 2(n-1)/n of each payload)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s + self.overhead_s


def tensor_parallel_step(model: Model, instance_type: str | InstanceType, degree: int, batch_size: int,
                         blocks: int = 1, mfu: float = 0.4, block_overhead_s: float = 0.0) -> TensorParallelStep:
    """Predicted step of tensor parallelism over `degree` ranks of one instance (Megatron-LM's layout: Shoeybi
    et al., "Megatron-LM", 2019, https://arxiv.org/abs/1909.08053, section 3): each of `blocks` blocks (a
    transformer layer has 2, its attention and its MLP) has its first Linear split by output columns and its
    last by input rows, so each rank computes 1/degree of the block, and one all-reduce of the block's output
    joins the partial sums in the forward, one of the same size the input's gradient in the backward:

        step = compute / degree + 2 x blocks x ring all-reduce(batch x s x h x bytes)

    `Model.handoff_bytes_per_sample` is the block's output per sample (s x h x its dtype's bytes); `compute` is
    the whole blocks' forward and backward on one rank (batch x seconds per sample). The all-reduces sit
    between dependent matrix products, so nothing hides them here (no overlap); the weights never move.
    `block_overhead_s`: what a split block costs per step besides its compute and its bytes (PyTorch's DTensor
    bookkeeping and the wake-ups of its blocking collectives), if measured (code/tensor_parallel.py times a split
    block too small to compute or send anything against its whole); it is added once per block and step."""
    inst = get_instance(instance_type)
    for label, value in (("degree", degree), ("batch_size", batch_size), ("blocks", blocks)):
        _positive_int(label, value)
    if not block_overhead_s >= 0:
        raise WorkshopError(f"block_overhead_s must be 0 or more, got {block_overhead_s}.",
                            "give the measured seconds a split block costs per step besides compute and bytes, or 0.")
    if degree > inst.gpus:
        raise WorkshopError(f"Tensor parallel over {degree} ranks on one {inst.name} of {inst.gpus} device(s): its "
                            "all-reduces would cross the network at every block.",
                            f"use a degree of at most {inst.gpus} (one instance), and data or pipeline parallel "
                            "across instances.")
    payload = batch_size * model.handoff_bytes_per_sample
    count = 2 * blocks if degree > 1 else 0
    per = ring_allreduce_s(payload, degree, inst.intra_Bps, inst.intra_alpha_s) if degree > 1 else 0.0
    return TensorParallelStep(
        degree, blocks, compute_s=batch_size * compute_s_per_sample(model, inst, mfu) / degree, comm_s=count * per,
        overhead_s=blocks * block_overhead_s if degree > 1 else 0.0,
        allreduces=count, allreduce_bytes=payload, sent_bytes=count * 2 * (degree - 1) / degree * payload,
    )
