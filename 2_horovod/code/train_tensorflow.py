"""Lab 2: Horovod data-parallel training of a small CNN on MNIST, TensorFlow flavour.

The same job as `train_pytorch.py` (same CNN, same data, same flags and metric lines) with
TensorFlow 2.21 and Keras 3: every rank holds a full copy of the model, trains on its own
shard of the data, and Horovod averages the gradients with ring all-reduce each step.

Why a `GradientTape` loop and not `model.fit` with `horovod.tensorflow.keras`: Horovod 0.28.1's
Keras integration was written for Keras 2. Under TensorFlow 2.21's Keras 3 it imports, but
`model.fit` fails (it calls `.ref()` on Keras 3 variables, and its callbacks call
`keras.backend.constant`, gone in Keras 3); it works only with the legacy `tf-keras` package
(`TF_USE_LEGACY_KERAS=1`), a frozen branch. A custom loop needs only Horovod's TensorFlow ops,
works with today's Keras, and shows each step Horovod adds, which `fit` hides. Keras 3
variables wrap a `tf.Variable` (`.value`); Horovod's ops are given those.

Run it (from the lab folder):

    python code/train_tensorflow.py                                   # one process
    horovodrun --gloo -np 2 -H localhost:2 python code/train_tensorflow.py
    python -m workshop run horovod_tensorflow --hosts 2               # 2 simulated SageMaker hosts

Inputs follow the SageMaker training contract (see train_pytorch.py). The lines that make it
distributed carry a `Horovod:` comment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO/WARNING lines off

import numpy as np  # noqa: E402

# Shared copy: keep identical in every script that has it (tests/test_copies.py).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
REBUILD_FIX = (
    "Fix: build Horovod with TensorFlow support: `make horovod` in the workshop (or "
    "HOROVOD_WITH_TENSORFLOW=1 when building it yourself); on SageMaker run the job with "
    "workshop.runner.run_on_sagemaker (it installs the wheel built once for the image) "
    "or the image from 2_horovod/docker/Dockerfile."
)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def str2bool(text: str) -> bool:
    """SageMaker passes every hyperparameter as text, so booleans arrive as 'true'/'false'."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def nonfinite_problems(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """check_args' first rule, as (problems, fixes), both empty when it holds: every float flag has a finite
    value. argparse's float() reads 'nan', 'inf' and '1e999' (inf) without complaint, and they pass the rules
    that follow (nan <= 0 is False, and so is nan > 0); a run with --lr nan trains on NaN from its first step."""
    problems, fixes = [], []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if action.type is float and isinstance(value, float) and not math.isfinite(value):
            flag = max(action.option_strings, key=len)
            problems.append(f"{flag} must be a finite number, got {value}")
            fixes.append(f"set {flag} to a finite number, e.g. {action.default} (its default)")
    return problems, fixes


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def restore_error(exc: BaseException) -> str:
    """What TensorFlow said when it could not restore a checkpoint, in one line, led by its status's name
    and without its op's wrapping (`{{function_node ...}}`, `[Op:RestoreV2]`, `[[{{node ...}}]]`) or the
    places the op was defined (`File "...", line N`): e.g. "DATA_LOSS: TensorBundle at ... Checksum does
    not match". From a graph whose error came from another task, the line with its status (`(0) DATA_LOSS:
    ...`); from a local one, the message's first line that is neither a headline nor a place."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    status = [re.sub(r"^\(\d+\)\s*", "", line) for line in lines if re.match(r"(\(\d+\)\s*)?[A-Z_]{4,}:\s", line)]
    if status:
        text = status[0]
    else:
        said = [line for line in lines if not line.endswith(":") and not line.startswith(('File "', "[["))]
        text = said[0] if said else type(exc).__name__
        code = getattr(exc, "error_code", None)  # tf.errors.OpError's status, e.g. 15 for DATA_LOSS
        name = {v: k for k, v in vars(sys.modules["tensorflow"].errors).items()
                if k.isupper() and isinstance(v, int)}.get(code) if "tensorflow" in sys.modules else None
        text = f"{name}: {text}" if name else text
    text = re.sub(r"\s*\[Op:\w+\]$", "", re.sub(r"^\{\{.*?\}\}\s*", "", text))
    return text if len(text) <= 300 else text[:297] + "..."


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def exit_with(message: str) -> None:
    """End this process with `message` as its last line, and exit status 1. On stdout, after the METRICS
    lines printed before it: a launcher relays a rank's stdout and stderr apart, so a message on stderr
    (SystemExit's) can arrive before them, and the workshop reports a rank's last line as why it ended."""
    print(message, flush=True)
    raise SystemExit(1)


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        description="Horovod (TensorFlow) data-parallel training of a CNN on MNIST; SageMaker contract.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("hyperparameters")
    g.add_argument("--epochs", type=int, default=5, help="passes over the training set")
    g.add_argument(
        "--batch-size", type=int, default=64,
        help="samples per step on each rank (the global batch is this times the number of ranks)",
    )
    g.add_argument(
        "--lr", type=float, default=0.02,
        help="SGD learning rate for one rank; multiplied by the number of ranks when --scale-lr",
    )
    g.add_argument(
        "--scale-lr", type=str2bool, default=True,
        help="linear scaling rule: lr x ranks, since the global batch grows with them",
    )
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--seed", type=int, default=1, help="seed for weights and shuffling")
    g.add_argument(
        "--fp16-allreduce", type=str2bool, default=False,
        help="compress gradients to float16 for the all-reduce (half the bytes on the wire)",
    )
    g.add_argument("--log-interval", type=int, default=20, help="steps between train-loss lines")
    g.add_argument(
        "--max-steps", type=int, default=0,
        help="stop each epoch after this many steps (0: the whole epoch); for quick runs",
    )
    g.add_argument(
        "--threads", type=int, default=0,
        help="CPU threads per rank (0: this host's CPUs divided by its ranks)",
    )
    d = p.add_argument_group("SageMaker contract (defaults from SM_* variables)")
    d.add_argument("--train", default=env("SM_CHANNEL_TRAIN", "data/mnist/train"), help="train channel")
    d.add_argument("--test", default=env("SM_CHANNEL_TEST", "data/mnist/test"), help="test channel")
    d.add_argument("--model-dir", default=env("SM_MODEL_DIR", "artifacts/model"), help="where rank 0 writes the model")
    d.add_argument(
        "--checkpoint-dir", default=env("SM_CHECKPOINT_DIR", "artifacts/checkpoints"),
        help="rank 0 checkpoints each epoch here; every rank resumes from it when it holds one",
    )
    return p


def check_args(args: argparse.Namespace, world_size: int = 1, train_samples: int | None = None) -> None:
    """Checks the workshop also runs before it starts any process or job (raises ValueError).

    The message names each broken rule, then after "Fix:" what to do about each, so the
    workshop (and a reader of the job's log) can tell the user what to change.
    """
    parser = build_parser()
    default = parser.get_default
    problems, fixes = nonfinite_problems(args, parser)
    if problems:  # NaN passes every comparison below (nan <= 0 is False): refused first, on its own
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")
    for name in ("epochs", "batch_size", "log_interval"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            problems.append(f"{flag} must be at least 1, got {getattr(args, name)}")
            fixes.append(f"set {flag} to a whole number of at least 1, e.g. {default(name)} (its default)")
    if args.lr <= 0:
        problems.append(f"--lr must be positive, got {args.lr}")
        fixes.append(f"set --lr to a positive number, e.g. {default('lr')} (its default)")
    if args.max_steps < 0 or args.threads < 0:
        problems.append("--max-steps and --threads must be 0 or more")
        fixes.append("set --max-steps and --threads to 0 (their defaults: whole epochs, an automatic thread count) or more")
    if world_size < 1:
        problems.append(f"the number of ranks must be at least 1, got {world_size}")
        fixes.append("run at least one process")
    if train_samples is not None and train_samples // world_size < args.batch_size:
        per_rank = train_samples // world_size
        problems.append(
            f"each of the {world_size} ranks gets {per_rank} training samples, fewer "
            f"than one --batch-size of {args.batch_size} (the batch size is per rank)"
        )
        fixes.append(f"set --batch-size to {per_rank} or less, e.g. {min(default('batch_size'), per_rank)}, or run fewer processes"
                     if per_rank else "run fewer processes than there are training samples")
    if problems:
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")


def load_channel(channel_dir: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    path = Path(channel_dir) / "mnist.npz"
    if not path.is_file():
        raise FileNotFoundError(
            f"The {name!r} channel has no {path.name} at {path}. Fix: prepare the data with "
            f"`python -m workshop.datasets mnist DIR` and pass --{name} DIR/{name} (locally), or give the "
            f"job a {name!r} input channel (SageMaker)."
        )
    with np.load(path) as data:
        images, labels = data["images"], data["labels"]
    x = ((images.astype("float32") / 255.0 - MNIST_MEAN) / MNIST_STD)[..., None]  # NHWC
    return x, labels.astype("int64")


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def metrics(**values) -> None:
    """One `METRICS key=value ...` line, rank first: what SageMaker's metric definitions and the
    workshop's log parser (workshop/metrics.py) read."""
    parts = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"METRICS {parts}", flush=True)


def build_model(keras):
    """Lab 3's CNN in Keras: two conv blocks and two dense layers, ~0.42M parameters."""
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dropout(0.25),
            layers.Dense(10),
        ]
    )


def tf_vars(variables):
    """The `tf.Variable` inside each Keras 3 variable: what Horovod's TensorFlow ops handle."""
    return [getattr(v, "value", v) for v in variables]


def weights_digest(model) -> str:
    """A short hash of every variable's bytes: equal on every rank iff the weights are."""
    h = hashlib.sha256()
    for v in model.variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()[:16]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    train_x, train_y = load_channel(args.train, "train")
    test_x, test_y = load_channel(args.test, "test")

    import tensorflow as tf

    try:
        import horovod.tensorflow as hvd
    except ImportError as exc:
        raise SystemExit(f"Horovod's TensorFlow support is not importable here ({exc}). {REBUILD_FIX}") from exc

    hvd.init()  # Horovod: join the job; rank, size and local rank come from the launcher's HOROVOD_* variables
    rank, size, local_size = hvd.rank(), hvd.size(), hvd.local_size()
    check_args(args, size, train_samples=len(train_x))
    # The host's CPUs (SM_NUM_CPUS), or fewer if this process may use fewer (a simulated host pinned
    # to its share of a laptop's cores): one thread pool per rank, sized so ranks do not fight.
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpus = min(int(os.environ.get("SM_NUM_CPUS", usable)), usable)
    threads = args.threads or max(1, cpus // local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:  # Horovod: one GPU per local rank
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
    keras = tf.keras
    keras.utils.set_random_seed(args.seed + rank)  # different on purpose: the broadcast below makes them equal

    lr = args.lr * size if args.scale_lr else args.lr  # Horovod: the global batch is size x --batch-size
    config = {
        "args": vars(args),
        "framework": "tensorflow",
        "ranks": size,
        "local_ranks": local_size,
        "hosts": hvd.cross_size(),
        "controller": "gloo" if hvd.gloo_enabled() else "mpi",
        "device": "gpu" if gpus else "cpu",
        "threads_per_rank": threads,
        "global_batch_size": args.batch_size * size,
        "effective_lr": lr,
        "train_samples": len(train_x),
        "test_samples": len(test_x),
        "host": os.environ.get("SM_CURRENT_HOST", platform.node()),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "horovod": __import__("horovod").__version__,
        "python": platform.python_version(),
    }
    if rank == 0:
        print(
            f"Horovod {config['horovod']} ({config['controller']} controller): {size} ranks on "
            f"{hvd.cross_size()} host(s); global batch {args.batch_size} x {size} = {args.batch_size * size}; "
            "learning rate "
            + (f"{args.lr} x {size} = {lr:g} (linear scaling rule)" if args.scale_lr else f"{lr:g} (not scaled)"),
            flush=True,
        )
        print("Configuration: " + json.dumps(config, sort_keys=True), flush=True)

    model = build_model(keras)
    optimizer = keras.optimizers.SGD(learning_rate=lr, momentum=args.momentum)
    optimizer.build(model.trainable_variables)  # create the momentum slots now, so they can be broadcast
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Checkpoint: rank 0 restores it (if any); the broadcast below then gives it to every rank.
    epoch_var = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch_var)
    ckpt_dir = Path(args.checkpoint_dir)
    latest = tf.train.latest_checkpoint(str(ckpt_dir)) if ckpt_dir.is_dir() else None
    damaged = None  # why rank 0 cannot resume from `latest`: every rank stops with it, before training
    if rank == 0 and latest:
        try:  # TensorFlow checks each tensor's CRC32C as it reads it: damaged bytes fail here
            ckpt.restore(latest).expect_partial()
        except Exception as exc:  # whatever a damaged or cut-short checkpoint raises: it cannot be used
            damaged = (f"The checkpoint {latest} is damaged: TensorFlow cannot restore it ({restore_error(exc)}). Fix: move "
                       f"its files (ckpt.*) out of {ckpt_dir} (or delete them) to train from the start, or pass "
                       "another --checkpoint-dir.")
        else:
            print(f"Resumed from {latest} after epoch {int(epoch_var.numpy())}.", flush=True)
    damaged = hvd.broadcast_object(damaged, root_rank=0, name="checkpoint_damaged")  # Horovod: rank 0's verdict
    if damaged:
        exit_with(damaged)
    # Horovod: start every rank from rank 0's weights, optimizer state and epoch.
    hvd.broadcast_variables(tf_vars(model.variables) + tf_vars(optimizer.variables) + [epoch_var], root_rank=0)
    start_epoch = int(epoch_var.numpy()) + 1
    if rank == 0 and latest and start_epoch > args.epochs:
        print(f"Nothing left to train: the run had already finished. {latest} holds epoch {start_epoch - 1} and this "
              f"run trains --epochs {args.epochs}; its model is evaluated and saved as it is.", flush=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        # Horovod: a tape whose gradient() all-reduces (averages) every gradient over the ranks.
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, tf_vars(model.trainable_variables))
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def eval_sums(x, y):
        logits = model(x, training=False)
        loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float64))
        return tf.cast(loss, tf.float64), correct

    def evaluate():
        """Exact test loss and accuracy: each rank scores every size()-th sample, then the sums
        are all-reduced."""
        xs, ys = test_x[rank::size], test_y[rank::size]
        totals = np.zeros(3)
        for i in range(0, len(xs), 1000):
            loss, correct = eval_sums(xs[i : i + 1000], ys[i : i + 1000])
            totals += [float(loss), float(correct), len(ys[i : i + 1000])]
        totals = hvd.allreduce(tf.constant(totals), op=hvd.Sum, name="eval_totals").numpy()  # Horovod: global sums
        return totals[0] / totals[2], totals[1] / totals[2]

    def stop_if_diverged(step: int, first_bad: int, weights: bool = False) -> None:
        """Every rank, at the same step: if any rank's loss was not finite (`first_bad`: this rank's first
        such step, 0 for none), or with `weights` its weights are not, every rank stops with the same
        message, before the checkpoint of a diverged model is written."""
        report = np.zeros((size, 2))
        report[rank, 0] = first_bad
        if weights and not all(np.isfinite(v.numpy()).all() for v in model.trainable_variables):
            report[rank, 1] = step
        report = hvd.allreduce(tf.constant(report), op=hvd.Sum, name="divergence").numpy()  # Horovod: every rank's
        bad = sorted((int(s), r) for r in range(size) for s in report[r] if s)
        if not bad:
            return
        at, who = bad[0]
        what = (f"the loss was not finite at step {at} on rank {who}" if report[who, 0] == at
                else f"rank {who}'s weights were not finite after step {at}, while its loss still was")
        scaled = f" (x {size} ranks = {lr:g}, --scale-lr)" if args.scale_lr and size > 1 else ""
        exit_with(
            f"Training diverged: {what}. The run stops here, before it checkpoints the broken weights: the "
            f"checkpoint already written stays as it was. Fix: a lower --lr than {args.lr:g}{scaled}, e.g. "
            f"{build_parser().get_default('lr')} (its default), with an empty --checkpoint-dir (a run that resumes "
            "takes its learning rate from the checkpoint).")

    steps_per_epoch = len(train_x) // size // args.batch_size
    step = (start_epoch - 1) * steps_per_epoch
    first_bad = 0  # this rank's first step whose loss was not finite
    test_loss = test_acc = float("nan")
    for epoch in range(start_epoch, args.epochs + 1):
        # Horovod: each rank takes a disjoint 1/size shard of the epoch's shuffle (same seed everywhere).
        order = np.random.default_rng(args.seed + epoch).permutation(len(train_x))[rank::size]
        t0 = time.perf_counter()
        seen = 0
        for i in range(1, steps_per_epoch + 1):
            idx = order[(i - 1) * args.batch_size : i * args.batch_size]
            loss = train_step(train_x[idx], train_y[idx])
            step += 1
            seen += len(idx)
            if not first_bad and not math.isfinite(float(loss)):
                first_bad = step
            if i % args.log_interval == 0:
                metrics(rank=rank, epoch=epoch, step=step, train_loss=float(loss))
                stop_if_diverged(step, first_bad)  # Horovod: every rank, at the same step
            if args.max_steps and i >= args.max_steps:
                break
        epoch_time = time.perf_counter() - t0
        stop_if_diverged(step, first_bad, weights=True)  # before the epoch's test and checkpoint
        test_loss, test_acc = evaluate()
        epoch_var.assign(epoch)
        if rank == 0:  # Horovod: only rank 0 writes, so ranks never race on the same files
            metrics(
                rank=0, epoch=epoch, step=step, test_loss=test_loss, test_accuracy=test_acc,
                epoch_time_s=epoch_time, samples_per_sec=seen * size / epoch_time,
            )
            ckpt.write(str(ckpt_dir / "ckpt"))
            (ckpt_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt"\nall_model_checkpoint_paths: "ckpt"\n')

    if start_epoch > args.epochs:
        test_loss, test_acc = evaluate()
        if rank == 0:  # the test of the epoch the checkpoint ended, as that epoch's own line
            metrics(rank=0, epoch=start_epoch - 1, step=step, test_loss=test_loss, test_accuracy=test_acc)

    digest = weights_digest(model)
    metrics(rank=rank, weights_sha256=digest)
    digests = hvd.allgather_object(digest, name="digests")  # Horovod: every rank's copy of the weights, compared
    identical = len(set(digests)) == 1
    if rank == 0:
        metrics(rank=0, final_test_accuracy=test_acc, final_test_loss=test_loss, weights_identical=int(identical))
        model_dir = Path(args.model_dir)
        model_dir.mkdir(parents=True, exist_ok=True)
        model.save(model_dir / "model.keras")
        (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        print(f"Saved the model and its configuration to {model_dir}.", flush=True)
    hvd.join()  # Horovod: leave in step, so no rank exits while a peer still talks to it
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
