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

Inputs follow the SageMaker training contract (see train_pytorch.py; the flags are in arguments.py,
the checkpoints' helpers in checkpointing_tf.py). The lines that make it distributed carry a
`Horovod:` comment.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO/WARNING lines off

import numpy as np  # noqa: E402

from arguments import check_args, lower_lr_fix, parser_for  # noqa: E402
from checkpointing_tf import diverged, restore_error, restore_on_rank0, stop_if_diverged  # noqa: E402, F401 (restore_error: the tests read it here)
from contract import MNIST_MEAN, MNIST_STD, describe_run, exit_with, metrics, threads_per_rank  # noqa: E402

build_parser = partial(parser_for, "tensorflow")  # the flags (the workshop reads them too)


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
    threads = threads_per_rank(args.threads, local_size)  # this host's CPUs, shared by its ranks
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:  # Horovod: one GPU per local rank
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
    keras = tf.keras
    keras.utils.set_random_seed(args.seed + rank)  # different on purpose: the broadcast below makes them equal

    lr = args.lr * size if args.scale_lr else args.lr  # Horovod: the global batch is size x --batch-size
    config = describe_run(hvd, args, lr, "tensorflow", "gpu" if gpus else "cpu", threads, len(train_x), len(test_x),
                          tensorflow=tf.__version__, keras=keras.__version__)

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
    damaged = restore_on_rank0(ckpt, latest, ckpt_dir, epoch_var, rank)  # why rank 0 cannot resume (None: it can)
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

    steps_per_epoch = len(train_x) // size // args.batch_size
    step = (start_epoch - 1) * steps_per_epoch
    first_bad = 0  # this rank's first step whose loss diverged (not finite, or 100x an untrained model's)
    fix = lower_lr_fix(args, size, lr)  # what to do if training diverges
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
            if not first_bad and diverged(float(loss)):
                first_bad = step
            if i % args.log_interval == 0:
                metrics(rank=rank, epoch=epoch, step=step, train_loss=float(loss))
                stop_if_diverged(hvd, model, step, first_bad, fix)  # every rank, at the same step
            if args.max_steps and i >= args.max_steps:
                break
        epoch_time = time.perf_counter() - t0
        stop_if_diverged(hvd, model, step, first_bad, fix, weights=True)  # before the epoch's test and checkpoint
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


def weights_digest(model) -> str:
    """A short hash of every variable's bytes: equal on every rank iff the weights are."""
    h = hashlib.sha256()
    for v in model.variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()[:16]


REBUILD_FIX = (
    "Fix: build Horovod with TensorFlow support: `make horovod` in the workshop (or "
    "HOROVOD_WITH_TENSORFLOW=1 when building it yourself); on SageMaker run the job with "
    "workshop.runner.run_on_sagemaker (it installs the wheel built once for the image) "
    "or the image from 2_horovod/docker/Dockerfile."
)


if __name__ == "__main__":
    sys.exit(main())
