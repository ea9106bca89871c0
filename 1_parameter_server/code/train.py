"""Lab 1: asynchronous parameter-server training of a small CNN on MNIST (TensorFlow 2).

TF2's `ParameterServerStrategy` with a `ClusterCoordinator`: the model's variables live on the
parameter servers (`ps` tasks; a large one is sharded across them), the coordinator (`chief`)
runs this training loop and sends steps to the workers, and each worker, whenever it is free,
reads the current variables, computes a gradient on its own batch and applies it to the
parameter servers, without waiting for the other workers: the updates are asynchronous. Each step
reports its gradient's staleness: the updates other workers pushed between its read and its push.

Run it (from the lab folder):

    python code/train.py                        # alone: an in-process cluster, 1 ps + 1 worker
    python -m workshop run parameter_server     # 3 simulated SageMaker hosts (local cluster)
    # On SageMaker the workshop's driver (workshop/drivers/parameter_server/ps_driver.py) starts it
    # twice on every host with the job's hyperparameters: as the host's `ps` task, and as its `chief`
    # (algo-1) or `worker` task, each told its role by its own TF_CONFIG.

Inputs follow the SageMaker training contract: hyperparameters as flags, data in the `train`
and `test` channels (`mnist.npz`), the model to SM_MODEL_DIR (a SavedModel and `model.npz`,
written by the coordinator), checkpoints to SM_CHECKPOINT_DIR (resumed when present). The
modules beside this script in code/ hold the flags (arguments.py), the contract (contract.py),
the processes' set-up (cluster.py), the checkpoints (checkpointing.py) and the reports (timeline.py).

Keras 3 (TensorFlow 2.16+) cannot `model.fit` under ParameterServerStrategy, so the model is a
plain `tf.Module` and the loop is `ClusterCoordinator.schedule`: the clearer thing to teach.
The lines that make it distributed carry a `PS:` comment.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

STARTED = time.perf_counter()  # the process's start-up phases are timed from here (each task prints its own)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO/WARNING lines off

import numpy as np  # noqa: E402

from arguments import build_parser, check_args  # noqa: E402
from checkpointing import checkpoint_writer, resume, stop_if_diverged  # noqa: E402
from cluster import WORKER_ID_FILE, Window, configure_threads, in_process_resolver, write_worker_id  # noqa: E402
from contract import load_channel, metrics, normalize, restore_error, run_configuration, save_model  # noqa: E402, F401 (restore_error: the tests read it here)
from timeline import count_push, report_staleness, report_timeline, serving_line  # noqa: E402


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("train", "test", "model_dir", "checkpoint_dir", "output_dir"):
        setattr(args, name, str(Path(getattr(args, name)).resolve()))  # before any chdir
    import tensorflow as tf

    import_s = time.perf_counter() - STARTED  # TensorFlow's import: the longest part of a task's start-up
    # PS: the role comes from TF_CONFIG's task.type (the launcher passes only hyperparameters); none: in-process.
    if os.environ.get("TF_CONFIG"):
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    else:
        resolver = in_process_resolver(tf, args)
    if resolver.task_type in ("ps", "worker"):
        return run_server(tf, args, resolver, import_s)
    code = run_coordinator(tf, args, resolver)
    sys.stdout.flush()
    sys.stderr.flush()
    # The coordinator's background threads (one per worker, some perhaps waiting for a dead
    # worker to come back) would hold the interpreter at exit; the work is done and saved.
    os._exit(code)


def run_server(tf, args, resolver, import_s: float) -> int:
    """PS: a parameter server or a worker is a TensorFlow server; it serves until stopped."""
    task_type, task_id = resolver.task_type, resolver.task_id
    config = configure_threads(tf, args.threads)
    if task_type == "worker":
        write_worker_id(args.output_dir, task_id + 1)  # its rank (= its host rank), for its input pipeline
    if task_type == "ps":
        tf.config.set_visible_devices([], "GPU")  # variables on the host's CPU memory
    server = tf.distribute.Server(  # PS: start this task's gRPC server from TF_CONFIG's cluster
        resolver.cluster_spec(), job_name=task_type, task_index=task_id,
        protocol=resolver.rpc_layer or "grpc", config=config, start=True,
    )
    print(serving_line(task_type, task_id, server.target, import_s, STARTED), flush=True)
    server.join()  # never returns: the launcher stops this process when training has ended
    return 0


def run_coordinator(tf, args, resolver) -> int:
    t_start = time.time()
    configure_threads(tf, args.threads)
    train_x, train_y = load_channel(args.train, "train")
    test_x, test_y = load_channel(args.test, "test")
    spec = resolver.cluster_spec().as_dict()
    num_ps, num_workers = len(spec.get("ps", [])), len(spec.get("worker", []))
    check_args(args, num_workers + 1, train_samples=len(train_y))

    # PS: variables larger than --min-shard-bytes are split across (at most) every parameter server.
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=args.min_shard_bytes, max_shards=num_ps
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    # PS: the coordinator sends functions to the workers and tracks them; it computes no gradients.
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

    CNN = make_model_class(tf)
    with strategy.scope():  # PS: variables created here live on the parameter servers
        model = CNN(initial_weights(args.seed))
        params = [c for name in SHAPES for c in components(model.weights[name])]
        slots = []
        for var in params:  # momentum buffers, each on the same parameter server as its variable
            with strategy.extended.colocate_vars_with(var):
                slots.append(tf.Variable(tf.zeros(var.shape), trainable=False, name=var.name.split(":")[0] + "_momentum"))
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # Staleness: the updates pushed so far (created last: the model's variables keep their places).
        updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates_pushed")

    placement = {name: [v.device for v in components(model.weights[name])] for name in SHAPES}
    for name, devices in placement.items():  # where each variable (each shard of it) lives
        for i, device in enumerate(devices):
            metrics(rank=0, variable=name, shard=i, shards=len(devices), device=device)

    # Resume: the checkpoint holds the variables, their momentum and the step count.
    checkpoint = tf.train.Checkpoint(model=model, slots=slots, step=step_counter)
    # PS: by default each parameter server writes its own variables' shard to the checkpoint path
    # on its own host's disk, and one of them merges the parts: that needs a file system every host
    # shares. SageMaker's /opt/ml/checkpoints is per host, so all checkpoint I/O goes through the
    # coordinator's CPU instead: the whole checkpoint lands on algo-1, whose folder SageMaker syncs.
    io = tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")
    damaged = resume(tf, checkpoint, args.checkpoint_dir, io)  # from the newest checkpoint TensorFlow can read
    save_checkpoint = checkpoint_writer(tf, checkpoint, args.checkpoint_dir, io, damaged)

    def dataset_fn():
        # PS: runs on each worker: its own shuffled, endless stream of batches, tagged with its rank.
        worker = tf.strings.to_number(tf.strings.strip(tf.io.read_file(WORKER_ID_FILE)), tf.int32)
        ds = tf.data.Dataset.from_tensor_slices((train_x, train_y)).shuffle(len(train_y)).repeat()
        ds = ds.batch(args.batch_size, drop_remainder=True)
        return ds.map(lambda x, y: (normalize(tf, x), y, worker)).prefetch(2)

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    lr, momentum = args.lr, args.momentum

    @tf.function
    def train_step(iterator):
        # PS: executes on whichever worker is free: read the variables from the parameter servers,
        # compute the gradient of one batch, and apply it there at once, without waiting for others.
        x, y, worker = next(iterator)
        # Staleness: the count of updates, read with the variables as the step starts (on every server at once).
        read_at = updates.read_value()
        with tf.GradientTape() as tape:
            logits = model(x)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        grads = tape.gradient(loss, params)
        for var, slot, grad in zip(params, slots, grads, strict=True):
            # PS: the update runs on the parameter server that holds the variable, so only the
            # gradient travels (K bytes); computed here, it would pull the momentum and push it
            # back too (measured: 5K bytes per step instead of 2K, benchmarks/bench_strategies.py).
            with tf.device(var.device):
                slot.assign(momentum * slot + grad)
                var.assign_sub(lr * slot)
        # Staleness: the updates other workers pushed between this step's read and its push.
        return loss, worker, tf.timestamp(), count_push(tf, updates, after=grads) - read_at

    config = run_configuration(tf, args, spec, placement)  # printed once, and saved beside the model

    done = int(step_counter.numpy())
    events: list[tuple[float, int, int]] = []  # (time the step ended on its worker, worker rank, staleness)
    test_loss = test_acc = float("nan")
    t0, window = time.time(), Window(spec)
    while done < args.steps:
        n = min(args.log_interval, args.steps - done)
        with window:  # these n steps' seconds and, on a local cluster, the bytes between the tasks
            # PS: schedule() returns at once; the steps queue up and the free workers take them.
            results = [coordinator.schedule(train_step, args=(per_worker_iterator,)) for _ in range(n)]
            coordinator.join()  # wait for these steps (a worker that died has its steps rerun elsewhere)
        values = [r.fetch() for r in results]
        events += [(float(v[2]), int(v[1]), int(v[3])) for v in values]
        done += n
        step_counter.assign(done)
        test_loss, test_acc = evaluate(tf, model, test_x, test_y)
        metrics(rank=0, step=done, train_loss=float(np.mean([float(v[0]) for v in values])), test_loss=test_loss,
                test_accuracy=test_acc, steps_per_sec=n / window.seconds, **window.traffic())
        stop_if_diverged(tf, args, values, test_loss, done, n)  # never a checkpoint of diverged weights
        save_checkpoint(done)

    if not events:  # a finished run resumed: report the model as it is
        test_loss, test_acc = evaluate(tf, model, test_x, test_y)
    report_timeline(events, t0, args.timeline_bin_s)
    report_staleness(events)
    metrics(rank=0, final_test_accuracy=test_acc, final_test_loss=test_loss, steps=done,
            workers_used=len({w for _, w, _ in events}), wall_time_s=time.time() - t_start)
    # PS: the trained variables, read from the parameter servers, saved as a SavedModel and model.npz.
    weights = {name: tf.convert_to_tensor(var).numpy() for name, var in model.weights.items()}
    save_model(tf, args.model_dir, make_model_class(tf), weights, config, test_acc)
    return 0


# ----------------------------------------------------------------------------- the model

SHAPES = {  # name -> shape; a small CNN, ~0.23M parameters, >95% on the 4,000-digit subset
    "conv1/kernel": (3, 3, 1, 16), "conv1/bias": (16,),
    "conv2/kernel": (3, 3, 16, 32), "conv2/bias": (32,),
    "dense1/kernel": (7 * 7 * 32, 128), "dense1/bias": (128,),
    "dense2/kernel": (128, 10), "dense2/bias": (10,),
}


def initial_weights(seed: int) -> dict[str, np.ndarray]:
    """He-normal kernels, zero biases (numpy, so every process agrees without a broadcast)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in SHAPES.items():
        if name.endswith("bias"):
            out[name] = np.zeros(shape, np.float32)
        else:
            fan_in = int(np.prod(shape[:-1]))
            out[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return out


def make_model_class(tf):
    class CNN(tf.Module):
        """conv-pool, conv-pool, dense, dense. Variables created under the strategy's scope go
        to the parameter servers; elsewhere (the exported copy) they are ordinary."""

        def __init__(self, weights: dict[str, np.ndarray]):
            super().__init__(name="cnn")
            self.weights = {n: tf.Variable(w, name=n.replace("/", "_")) for n, w in weights.items()}

        def __call__(self, x):
            w = self.weights
            h = tf.nn.relu(tf.nn.conv2d(x, w["conv1/kernel"], 1, "SAME") + w["conv1/bias"])
            h = tf.nn.max_pool2d(h, 2, 2, "VALID")
            h = tf.nn.relu(tf.nn.conv2d(h, w["conv2/kernel"], 1, "SAME") + w["conv2/bias"])
            h = tf.nn.max_pool2d(h, 2, 2, "VALID")
            h = tf.reshape(h, [-1, 7 * 7 * 32])
            # PS: a sharded kernel is read shard by shard from its parameter servers and concatenated.
            h = tf.nn.relu(tf.matmul(h, tf.convert_to_tensor(w["dense1/kernel"])) + w["dense1/bias"])
            return tf.matmul(h, tf.convert_to_tensor(w["dense2/kernel"])) + w["dense2/bias"]

    return CNN


def components(variable) -> list:
    """The tf.Variables behind a variable: its shards if it is a ShardedVariable."""
    return list(variable.variables) if hasattr(variable, "variables") and not hasattr(variable, "handle") else [variable]


def evaluate(tf, model, images, labels) -> tuple[float, float]:
    logits = model(normalize(tf, images))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    acc = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
    return float(loss), float(acc)


if __name__ == "__main__":
    sys.exit(main())
