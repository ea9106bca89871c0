"""Lab 4's host side: the text corpus, the SageMaker launchers (`Torchrun(smp=SMP(...))` and plain
FSDP), and the measurement grid the notebook draws.

    python -m workshop.model_parallel prepare data/corpus     # the train/test channels
    python -m workshop.model_parallel measure                 # the memory table, world sizes 1, 2, 4

**The corpus.** CPython's own reference documentation ships inside the standard library as
`pydoc_data.topics.topics` (79 topics, what `help("with")` prints: about 0.46 MB of English
prose and code). It needs no download and is the same on every machine with the same Python.
Every tenth topic (sorted by name) goes to `test`, the rest to `train`, each as `corpus.txt`
(ASCII; the script models bytes).

**SageMaker.** Two routes, one script:
- `route="fsdp"` (the default): the SageMaker PyTorch 2.13 training image (`pytorch-amzn2023`,
  py312: the torch this project pins) on any GPU instance, plain `Torchrun()`; the script's own
  FSDP2 (`fully_shard`) flags do the sharding. Default: 2 x ml.g5.xlarge (one A10G each), 30
  minutes at most: the dry run prints `cost: at most $1.41`.
- `route="smp"` (opt-in, `allow_unsupported_image=True`): the SageMaker model-parallel (SMP v2)
  image, `pytorch-smp` 2.5.1 (py311, container version cu124), with `Torchrun(smp=SMP(
  hybrid_shard_degree=..., sm_activation_offloading=..., activation_loading_horizon=...))`. The SDK
  writes the settings into `distributed.json` and passes them as the hyperparameter
  `mp_parameters`; the script calls `tsm.init(settings)` and maps them onto its own flags (hybrid
  sharding degree, checkpointing + offloading), then shards with FSDP2. What it does NOT do: SMP's
  own sharding and offloading plug into PyTorch's FSDP1 `FullyShardedDataParallel` API, which this
  script does not use (FSDP1 refuses CPU, where CI runs it), so SMP's implementation of them is
  never exercised; the same work is done by PyTorch itself. Its image is PyTorch 2.5.1, past its
  end of patch (2025-10-29), and SMP v2 runs only on ml.p4d.24xlarge, ml.p4de.24xlarge and
  ml.p5.48xlarge (docs.aws.amazon.com/sagemaker/latest/dg/distributed-model-parallel-support-v2.html):
  2 x ml.p4d.24xlarge cost up to $37.69 per half hour, for a model of a few million parameters.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workshop import REPO_ROOT
from workshop.errors import WorkshopError

CORPUS_FILE = "corpus.txt"
CHANNELS = ("train", "test")
DEFAULT_DATA_DIR = REPO_ROOT / "data" / "corpus"
TEST_EVERY = 10  # every tenth topic is held out
# SMP v2's instance types (AWS Developer Guide, "Supported frameworks and AWS Regions", SMP v2).
SMP_INSTANCE_TYPES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge")
SMP_IMAGE = {"framework": "pytorch-smp", "framework_version": "2.5.1", "py_version": "py311",
             "container_version": "cu124"}
SMP_INSTANCE_TYPE = "ml.p4d.24xlarge"  # 8 NVIDIA A100 40 GB; about $37.69/h
FSDP_IMAGE = {"framework": "pytorch-amzn2023", "framework_version": "2.13", "py_version": "py312",
              "container_version": None}
FSDP_INSTANCE_TYPE = "ml.g5.xlarge"  # 1 NVIDIA A10G, 24 GB; about $1.41/h
ROUTES = ("fsdp", "smp")
SMP_OPT_IN_FIX = (
    "use route='fsdp' (the default: the supported PyTorch 2.13 image, the same FSDP2 sharding, on any GPU "
    "instance), or pass allow_unsupported_image=True (CLI: --route smp --allow-unsupported-image) to run "
    "the SMP image anyway, knowing what it does and does not show (see workshop.model_parallel)."
)


# --------------------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class CorpusChannels:
    train_dir: Path
    test_dir: Path
    n_train: int  # characters
    n_test: int
    root: Path
    source: str

    @property
    def dirs(self) -> dict[str, Path]:
        return {"train": self.train_dir, "test": self.test_dir}


def corpus_texts() -> dict[str, str]:
    """{"train": text, "test": text} from `pydoc_data.topics` (the stdlib's own docs)."""
    from pydoc_data.topics import topics

    keys = sorted(topics)
    test = set(keys[::TEST_EVERY])
    return {
        "train": "\n\n".join(topics[k] for k in keys if k not in test),
        "test": "\n\n".join(topics[k] for k in keys if k in test),
    }


def prepare_corpus(directory: str | os.PathLike[str] | None = None) -> CorpusChannels:
    """Write `DIR/train/corpus.txt` and `DIR/test/corpus.txt` (idempotent)."""
    root = Path(directory or DEFAULT_DATA_DIR).expanduser()
    source = f"pydoc_data.topics of CPython {sys.version.split()[0]}"
    fix = ("pass --data-dir a folder you can write (it is made if missing), or --workdir DIR (the data "
           "then goes to DIR/data); in Python, prepare_corpus(FOLDER).")
    if root.exists() and not root.is_dir():
        raise WorkshopError(f"The corpus data folder {root} is a file, not a folder.", fix)
    sizes = {}
    try:
        for channel, text in corpus_texts().items():
            data = text.encode("ascii", "replace")  # a few non-ASCII characters become '?'
            folder = root / channel
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / CORPUS_FILE
            if not path.is_file() or path.read_bytes() != data:
                tmp = path.with_name("." + path.name + ".tmp")
                tmp.write_bytes(data)
                os.replace(tmp, path)
            # Written only when it changes: a prepared folder in a read-only checkout is only read.
            meta = folder / "dataset.json"
            described = json.dumps({"source": source, "characters": len(data)}) + "\n"
            if not meta.is_file() or meta.read_text() != described:
                meta.write_text(described)
            sizes[channel] = len(data)
    except OSError as exc:
        raise WorkshopError(f"Cannot write the corpus channels under {root}: {exc.strerror or exc}.", fix) from None
    return CorpusChannels(root / "train", root / "test", sizes["train"], sizes["test"], root, source)


def data_prefix(user: str | None = None, key_prefix: str | None = None) -> str:
    """S3 key prefix of the corpus channels, under the SDK's default key prefix when the SDK
    config sets one (as `workshop.sagemaker_jobs.data_prefix`), where the workshop role may read."""
    from workshop import aws

    key_prefix = aws.sdk_key_prefix() if key_prefix is None else key_prefix
    return aws.s3_key(key_prefix, aws.WORKSHOP_NAME, user or aws.user_prefix(), "data/pydoc-corpus")


def upload_corpus(channels: CorpusChannels, bucket: str, boto_session: Any) -> dict[str, str]:
    """Upload the two channel folders once (an object with the same MD5 is skipped)."""
    s3 = boto_session.client("s3")
    uris = {}
    for channel, folder in channels.dirs.items():
        key_base = f"{data_prefix()}/{channel}"
        uris[channel] = f"s3://{bucket}/{key_base}"
        for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
            body = path.read_bytes()
            key = f"{key_base}/{path.name}"
            try:
                if s3.head_object(Bucket=bucket, Key=key)["ETag"].strip('"') == hashlib.md5(body).hexdigest():
                    continue
            except Exception:  # noqa: BLE001 (absent: upload it)
                pass
            s3.put_object(Bucket=bucket, Key=key, Body=body)
    return uris


# --------------------------------------------------------------------------- SageMaker


def smp_settings(hyperparameters: Mapping[str, Any]) -> dict[str, Any]:
    value = hyperparameters.get("mp_parameters")
    if isinstance(value, str):
        value = json.loads(value)
    return dict(value or {})


def lab_for_route(route: str, instance_type: str | None = None):
    """Lab 4 with the image of `route`: the SMP image (on SMP's instance types only), or the
    ordinary PyTorch GPU image (any GPU type)."""
    from workshop.labs import get_lab

    if route not in ROUTES:
        raise WorkshopError(f"Unknown route {route!r}.", f"choose one of {', '.join(ROUTES)}.")
    lab = get_lab("model_parallel")
    smp = route == "smp"
    image = SMP_IMAGE if smp else FSDP_IMAGE
    defaults = dataclasses.replace(
        lab.sagemaker, framework=image["framework"], framework_version=image["framework_version"],
        py_version=image["py_version"], container_version=image["container_version"],
        instance_type=instance_type or (SMP_INSTANCE_TYPE if smp else FSDP_INSTANCE_TYPE),
        instance_types=SMP_INSTANCE_TYPES if smp else (),
    )
    return dataclasses.replace(lab, sagemaker=defaults)


def check_job(route: str, hyperparameters: Mapping[str, Any], instance_type: str) -> None:
    """What only the host can know: the image has the library, the instance has a GPU to offload from."""
    from workshop.sagemaker_jobs import is_gpu_instance

    smp = smp_settings(hyperparameters)
    if smp and route != "smp":
        raise WorkshopError(
            f"SMP settings {json.dumps(smp)} on the {route!r} route, whose image "
            f"({FSDP_IMAGE['framework']} {FSDP_IMAGE['framework_version']}) does not have the SageMaker "
            "model-parallel library (torch.sagemaker).",
            "drop smp=... and pass the script's own flags (sharding, hybrid-shard-degree, activation-checkpointing, "
            "activation-offloading), which do the same work; or use route='smp' with allow_unsupported_image=True "
            "(the pytorch-smp image, past its end of patch).",
        )
    if route == "smp" and instance_type not in SMP_INSTANCE_TYPES:
        raise WorkshopError(
            f"SMP v2 does not run on {instance_type}; it supports {', '.join(SMP_INSTANCE_TYPES)}.",
            "pick one of those, or route='fsdp' for other GPU instances.",
        )
    offload = smp.get("sm_activation_offloading") or hyperparameters.get("activation-offloading") == "cpu"
    if offload and not is_gpu_instance(instance_type):
        raise WorkshopError(
            f"Activation offloading on {instance_type}, which has no GPU: offloading moves activations "
            "from GPU memory to host memory, and on a CPU instance they are in host memory already.",
            "use a GPU instance type, or drop activation offloading.",
        )


def torchrun_smp(plan) -> Any:
    """`Torchrun(smp=SMP(...))` from the plan's `mp_parameters`; plain `Torchrun()` without them."""
    from sagemaker.train.distributed import SMP, Torchrun

    smp = smp_settings(plan.hyperparameters)
    if smp and "smdistributed-modelparallel" not in plan.image_uri:
        raise WorkshopError(
            f"SMP settings need the SageMaker model-parallel image; this job's image is {plan.image_uri}.",
            "use workshop.model_parallel.run_on_sagemaker(route='smp', ...).",
        )
    return Torchrun(process_count_per_node=plan.procs_per_host, smp=SMP(**smp) if smp else None)


def _register() -> None:
    from workshop import sagemaker_jobs

    sagemaker_jobs.register_launcher("torchrun_smp")(torchrun_smp)


_register()


def run_on_sagemaker(
    *,
    route: str = "fsdp",
    smp: Any = None,
    hosts: int = 2,
    hyperparameters: Mapping[str, Any] | None = None,
    instance_type: str | None = None,
    max_run_s: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    dry_run: bool = False,
    role: str | None = None,
    region: str | None = None,
    network: bool | str = False,
    subnets: Sequence[str] | None = None,
    security_group_ids: Sequence[str] | None = None,
    wait: bool = True,
    allow_unsupported_image: bool = False,
):
    """Lab 4 as a SageMaker job: the same five steps as `sagemaker_jobs.run_lab_on_sagemaker`,
    with the text corpus as the data: plain FSDP2 on the PyTorch 2.13 image (`route="fsdp"`, the
    default), or `smp` (an `SMP(...)`) on the model-parallel image (`route="smp"`, which needs
    `allow_unsupported_image=True`: that image is past its end of patch; see the module docstring).

    Every check runs before anything is uploaded or created. `dry_run` returns the
    CreateTrainingJob request (moto in-process, no account).
    """
    from workshop import aws, infra, sagemaker_jobs
    from workshop.sagemaker_jobs import (
        _build_from_plan,
        _describe_plan,
        _say,
        network_egress,
        plan_job,
        submit,
    )

    hps = dict(hyperparameters or {})
    if smp is not None:
        hps["mp_parameters"] = smp.model_dump(exclude_none=True) if hasattr(smp, "model_dump") else dict(smp)
    lab = lab_for_route(route, instance_type)
    instance_type = lab.sagemaker.instance_type
    check_job(route, hps, instance_type)
    if route == "smp":  # refused unless asked for by name (the plan's notes then say WARNING)
        sagemaker_jobs.check_image_supported(SMP_IMAGE["framework"], SMP_IMAGE["framework_version"],
                                             allow_unsupported_image=allow_unsupported_image, fix=SMP_OPT_IN_FIX)
    channels = prepare_corpus(data_dir)
    egress = network_egress(network, subnets)
    if dry_run:
        return sagemaker_jobs.dry_run(
            lab, hyperparameters=hps, role=role, instance_count=hosts, region=region, max_run_s=max_run_s,
            train_samples=channels.n_train, network=network, subnets=subnets, security_group_ids=security_group_ids,
            inputs={c: f"s3://sagemaker-dry-run/{data_prefix('dry-run')}/{c}" for c in CHANNELS},
            allow_unsupported_image=allow_unsupported_image,
        )
    _say("step 1/5: checking the job")
    boto = aws.boto_session(region)
    if not boto.region_name:
        raise WorkshopError("No AWS region configured.", "pass region='us-east-1', or set AWS_DEFAULT_REGION.")
    plan = plan_job(lab, hyperparameters=hps, region=boto.region_name, instance_count=hosts,
                    max_run_s=max_run_s, subnets=subnets, security_group_ids=security_group_ids,
                    train_samples=channels.n_train, allow_unsupported_image=allow_unsupported_image)
    given_role, role_source = sagemaker_jobs._given_role(role)
    if given_role:
        sagemaker_jobs.check_role(given_role, role_source)  # its form, before credentials are looked for
    _describe_plan(plan)
    _say("step 2/5: AWS credentials, the execution role, and the preflight checks")
    identity = aws.require_credentials(boto)
    role_arn = infra.resolve_role(role, boto)
    _say(f"the job runs as {role_arn}")
    infra.preflight(plan, role_arn, boto, identity=identity, network_egress=egress, creating_role=False)
    _say("step 3/5: " + ("the workshop network, " if egress else "") + "building the ModelTrainer")
    if egress:
        net = infra.ensure_network(boto, egress=egress)
        for line in net.lines():
            _say(line)
        plan = dataclasses.replace(plan, **net.job_args())
    session = aws.sagemaker_session(boto)
    trainer = _build_from_plan(plan, role_arn, session, validate_role=None)
    _say(f"distributed: {type(trainer.distributed).__name__}({trainer.distributed.model_dump()})")
    _say(f"step 4/5: uploading the corpus channels ({channels.source})")
    inputs = upload_corpus(channels, aws.default_bucket(session), boto)
    _say("step 5/5: submitting")
    return submit(trainer, inputs, wait=wait, logs=wait)


# --------------------------------------------------------------------------- measurements

MEASURE_MODEL = {"layers": 2, "d-model": 64, "heads": 4, "seq-len": 32, "batch-size": 8}


def measure(
    sharding: str,
    world_size: int,
    *,
    steps: int = 3,
    hyperparameters: Mapping[str, Any] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> list[dict[str, Any]]:
    """One run of the lab's script on one simulated host with `world_size` processes; returns
    each rank's accounting record (the `METRICS ... state_bytes=...` line) plus rank 0's losses."""
    from workshop.labs import get_lab
    from workshop.runner import run_local

    hps = {**MEASURE_MODEL, "steps": steps, "log-interval": steps, "eval-sequences": 8,
           "sharding": sharding, **(hyperparameters or {})}
    if sharding == "hybrid_shard" and "hybrid-shard-degree" not in hps:
        hps["hybrid-shard-degree"] = max(1, world_size // 2)
    result = run_local(get_lab("model_parallel"), hosts=1, procs_per_host=world_size, hyperparameters=hps,
                       workdir=workdir, data_dir=data_dir, echo=False)
    rows = [r for r in result.records if "state_bytes" in r]
    final = {k: result.metric(k) for k in ("final_train_loss", "test_loss", "test_accuracy")}
    return [{**r, **final} for r in sorted(rows, key=lambda r: r["rank"])]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workshop.model_parallel", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="write the train/test corpus channels")
    prep.add_argument("directory", nargs="?", default=str(DEFAULT_DATA_DIR))
    meas = sub.add_parser("measure", help="print the per-rank memory table at world sizes 1, 2, 4")
    meas.add_argument("--world-sizes", default="1,2,4")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        c = prepare_corpus(args.directory)
        print(f"{c.source}: train {c.train_dir / CORPUS_FILE} ({c.n_train:,} characters), "
              f"test {c.test_dir / CORPUS_FILE} ({c.n_test:,})")
        return 0
    print(f"{'sharding':<14} {'N':>2} {'rank':>4} {'state KB':>9} {'ideal KB':>9} {'saved act KB':>12} {'step ms':>8}")
    for n in (int(x) for x in args.world_sizes.split(",")):
        for sharding in ("no_shard", "optimizer", "shard_grad_op", "full_shard"):
            for r in measure(sharding, n)[:1]:
                print(f"{sharding:<14} {n:>2} {r['rank']:>4} {r['state_bytes'] / 1e3:>9.1f} "
                      f"{r['ideal_state_bytes'] / 1e3:>9.1f} {r['saved_act_bytes'] / 1e3:>12.1f} "
                      f"{r['step_time_s'] * 1e3:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
