"""Lab 4's spec: a small GPT sharded with PyTorch FSDP2 (and DeepSpeed ZeRO) on CPython's documentation (see `workshop.spec`).

**SageMaker: three routes, one script.**
- `fsdp` (the default): the SageMaker PyTorch 2.13 training image (`pytorch-amzn2023`, py312: the
  torch this project pins) on any GPU instance, plain `Torchrun()`; the script's own FSDP2
  (`fully_shard`) flags do the sharding. Default: 2 x ml.g5.xlarge (one A10G, 24 GB each),
  plenty for a model of a few million parameters; at most 2 x $1.408/h x 0.5 h: the dry run
  prints `cost: at most $1.41`.
- `smp` (opt-in, `allow_unsupported_image=True`): the SageMaker model-parallel (SMP v2) image,
  `pytorch-smp` 2.5.1 (py311, container version cu124), with `Torchrun(smp=SMP(
  hybrid_shard_degree=..., sm_activation_offloading=..., activation_loading_horizon=...))`. The
  SDK writes the settings into `distributed.json` and passes them as the hyperparameter
  `mp_parameters`; the script calls `tsm.init(settings)` and maps them onto its own flags (hybrid
  sharding degree, checkpointing + offloading), then shards with FSDP2. What it does NOT do:
  SMP's own sharding and offloading plug into PyTorch's FSDP1 `FullyShardedDataParallel` API,
  which this script does not use (FSDP1 refuses CPU, where CI runs it), so SMP's implementation
  of them is never exercised; the same work is done by PyTorch itself. Its image is PyTorch
  2.5.1, past its end of patch (2025-10-29), and SMP v2 runs only on ml.p4d.24xlarge,
  ml.p4de.24xlarge and ml.p5.48xlarge (docs.aws.amazon.com/sagemaker/latest/dg/
  distributed-model-parallel-support-v2.html): 2 x ml.p4d.24xlarge cost up to $37.69 per half
  hour, for a model of a few million parameters.
- `deepspeed` (opt-in by name): DeepSpeed's ZeRO (stages 1, 2, 3, and 3 with the optimizer offloaded to the host;
  `code/deepspeed_zero.py`) on the same PyTorch 2.13 image and instances as `fsdp`, under plain `Torchrun()`: SDK v3
  has no DeepSpeed config, and DeepSpeed reads the RANK and WORLD_SIZE torchrun sets. The image has no DeepSpeed, so
  the job installs `code/requirements-deepspeed.txt` from PyPI when it starts (`SourceCode(requirements=...)`): it
  needs the internet (not the workshop network with endpoints only). The route sets `sharding=zero3`; pass another
  stage with `--hp sharding=zero1` (CLI), in both runtimes: locally `--route deepspeed` runs the same stages on the
  simulated hosts, with DeepSpeed from this environment (requirements.txt lists it).
"""

import json

from workshop.datasets.corpus import CORPUS
from workshop.errors import WorkshopError
from workshop.jobs import JobPlan, is_gpu_instance
from workshop.jobs.images import PYTORCH_IMAGE
from workshop.launchers.torchrun import TorchrunLauncher, smp_settings
from workshop.spec import Lab, SageMakerDefaults, missing_requirements

# SMP v2's instance types (AWS Developer Guide, "Supported frameworks and AWS Regions", SMP v2).
SMP_INSTANCE_TYPES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge")
SMP_IMAGE = {"framework": "pytorch-smp", "framework_version": "2.5.1", "py_version": "py311",
             "container_version": "cu124"}
SMP_OPT_IN_FIX = (
    "use route='fsdp' (the default: the supported PyTorch 2.13 image, the same FSDP2 sharding, on any GPU "
    "instance), or pass allow_unsupported_image=True (CLI: --route smp --allow-unsupported-image) to run "
    "the SMP image anyway, knowing what it does and does not show (see 4_model_parallel/lab.py)."
)

FSDP_ROUTE = SageMakerDefaults(
    **PYTORCH_IMAGE,
    instance_type="ml.g5.xlarge",  # 1 NVIDIA A10G, 24 GB; about $1.41/h
    instance_count=2,
    max_run_s=1800,
    route="fsdp",
    description="plain FSDP2 on the PyTorch 2.13 image, any GPU instance",
)
SMP_ROUTE = SageMakerDefaults(
    **SMP_IMAGE,
    instance_type="ml.p4d.24xlarge",  # 8 NVIDIA A100 40 GB; about $37.69/h
    instance_count=2,
    max_run_s=1800,
    instance_types=SMP_INSTANCE_TYPES,
    route="smp",
    description="the SMP v2 image (PyTorch 2.5.1, past its end of patch; opt-in)",
    unsupported_image_fix=SMP_OPT_IN_FIX,
)
DEEPSPEED_ROUTE = SageMakerDefaults(
    **PYTORCH_IMAGE,
    instance_type="ml.g5.xlarge",
    instance_count=2,
    max_run_s=1800,
    route="deepspeed",
    description="DeepSpeed ZeRO on the PyTorch 2.13 image, installed from PyPI when the job starts",
    hyperparameters={"sharding": "zero3"},
    requirements="requirements-deepspeed.txt",
)
ZERO_PREFIX = "zero"  # the script's DeepSpeed shardings: zero1, zero2, zero3, zero3_offload (code/arguments.py)


def check_local(args) -> None:
    """What only this machine can tell before a local run: DeepSpeed is installed for a ZeRO sharding."""
    if not args.sharding.startswith(ZERO_PREFIX):
        return
    missing = missing_requirements(LAB.source_dir / DEEPSPEED_ROUTE.requirements)
    if missing:
        raise WorkshopError(
            f"--sharding {args.sharding} runs DeepSpeed's ZeRO, and this environment lacks {', '.join(missing)}.",
            f"pip install -r {LAB.folder}/code/{DEEPSPEED_ROUTE.requirements} (requirements.txt lists it too: `make "
            "setup` installs it; nothing is compiled), or run an FSDP sharding (--hp sharding=full_shard is ZeRO-3's).",
        )


def check_job(plan: JobPlan) -> JobPlan:
    """What only the host can know: the route's image has the library, the instance has a GPU to offload from."""
    smp = smp_settings(plan.hyperparameters)
    route = plan.sagemaker.route
    if smp and route != "smp":
        raise WorkshopError(
            f"SMP settings {json.dumps(smp)} on the {route!r} route, whose image "
            f"({plan.sagemaker.framework} {plan.sagemaker.framework_version}) does not have the SageMaker "
            "model-parallel library (torch.sagemaker).",
            "drop smp=... and pass the script's own flags (sharding, hybrid-shard-degree, activation-checkpointing, "
            "activation-offloading), which do the same work; or use route='smp' with allow_unsupported_image=True "
            "(the pytorch-smp image, past its end of patch).",
        )
    sharding = str(plan.hyperparameters.get("sharding", ""))
    if sharding.startswith(ZERO_PREFIX) and route != DEEPSPEED_ROUTE.route:
        raise WorkshopError(
            f"sharding={sharding} runs DeepSpeed, which the {route!r} route's image ({plan.sagemaker.framework} "
            f"{plan.sagemaker.framework_version}) does not have.",
            "use route='deepspeed' (CLI: --route deepspeed), whose job installs it; or an FSDP sharding "
            "(full_shard is ZeRO-3's, on the default route).",
        )
    if route == DEEPSPEED_ROUTE.route and not sharding.startswith(ZERO_PREFIX):
        raise WorkshopError(
            f"The deepspeed route installs DeepSpeed at its job's start for a ZeRO sharding, and sharding={sharding} "
            "is PyTorch's own.",
            "pass sharding zero1, zero2, zero3 or zero3_offload (CLI: --hp sharding=zero2), or run PyTorch's "
            "shardings on route='fsdp' (the default), which installs nothing.",
        )
    offload = smp.get("sm_activation_offloading") or plan.hyperparameters.get("activation-offloading") == "cpu"
    if offload and not is_gpu_instance(plan.instance_type):
        raise WorkshopError(
            f"Activation offloading on {plan.instance_type}, which has no GPU: offloading moves activations "
            "from GPU memory to host memory, and on a CPU instance they are in host memory already.",
            "use a GPU instance type, or drop activation offloading.",
        )
    return plan


LAB = Lab(
    key="model_parallel",
    folder="4_model_parallel",
    title="Model parallel (PyTorch FSDP2; SageMaker model parallel v2)",
    strategy="sharded data parallel (FSDP2)",
    launcher=TorchrunLauncher(smp=True),  # Torchrun(smp=SMP(...)) with SMP settings, plain Torchrun() without
    data=CORPUS,
    local_hosts=2,
    local_procs_per_host=1,
    # A tiny GPT for a quick local run; the summary's accuracy is next-character accuracy.
    local_hyperparameters={
        "steps": 60, "layers": 2, "d-model": 64, "seq-len": 32, "batch-size": 8,
        "log-interval": 10, "sharding": "full_shard",
    },
    metrics=("train_loss", "test_loss", "test_accuracy", "perplexity", "step_time_s"),
    sagemaker=FSDP_ROUTE,
    routes=(SMP_ROUTE, DEEPSPEED_ROUTE),
    sagemaker_check=check_job,
    local_check=check_local,
    checkpoint_flag="checkpoint-every",  # its default, 0, writes no checkpoint (the measurements stay clean)
    profile_flag="profile-steps",  # `python -m workshop profile model_parallel`: torch.profiler traces per rank
    aliases=("4", "4_model_parallel", "fsdp", "mp"),
)
