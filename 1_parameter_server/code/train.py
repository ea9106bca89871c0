"""Lab 1: asynchronous parameter-server training of a small CNN on MNIST (TensorFlow 2).

TF2's `ParameterServerStrategy` with a `ClusterCoordinator`: the model's variables live on the
parameter servers (`ps` tasks; a large one is sharded across them), the coordinator (`chief`)
runs this training loop and sends steps to the workers, and each worker, whenever it is free,
reads the current variables, computes a gradient on its own batch and applies it to the
parameter servers, without waiting for the other workers: the updates are asynchronous.

Run it (from the lab folder):

    python code/train.py                        # alone: an in-process cluster, 1 ps + 1 worker
    python -m workshop run parameter_server     # 3 simulated SageMaker hosts (local cluster)
    # On SageMaker the workshop's ParameterServer() driver starts, on every host, this script
    # twice with the job's hyperparameters, once as the host's `ps` task and once as its `chief`
    # (algo-1) or `worker` task, each told its role by its own TF_CONFIG (see
    # workshop/drivers/parameter_server/ps_driver.py and the lab's notebook).

Inputs follow the SageMaker training contract: hyperparameters as flags, data in the `train`
and `test` channels (`mnist.npz`), the model to SM_MODEL_DIR (a SavedModel and `model.npz`,
written by the coordinator), checkpoints to SM_CHECKPOINT_DIR (resumed when present). The roles
come from TF_CONFIG, which the launcher sets.

Keras 3 (TensorFlow 2.16+) cannot `model.fit` under ParameterServerStrategy, so the model is a
plain `tf.Module` and the loop is `ClusterCoordinator.schedule`: the clearer thing to teach.
The lines that make it distributed carry a `PS:` comment.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import socket
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO/WARNING lines off

import numpy as np  # noqa: E402

# Written by each worker into its working directory; the workers' input pipelines read it, so
# every step reports which worker ran it (the coordinator is not told).
WORKER_ID_FILE = "tf_worker_rank.txt"
# Shared copy: keep identical in every script that has it (tests/test_copies.py).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


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
        description="Parameter-server training (TF2 ParameterServerStrategy) of a CNN on MNIST; SageMaker contract.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("hyperparameters")
    g.add_argument("--steps", type=int, default=2000, help="training steps in all, shared by the workers as they come free")
    g.add_argument("--batch-size", type=int, default=64, help="samples per step (each step runs on one worker)")
    g.add_argument("--lr", type=float, default=0.02, help="SGD learning rate")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (its slots live next to their variables)")
    g.add_argument("--seed", type=int, default=1, help="seed for the initial weights")
    g.add_argument(
        "--log-interval", type=int, default=100,
        help="steps between the coordinator's evaluations and checkpoints (it waits for the scheduled steps there)",
    )
    g.add_argument(
        "--min-shard-bytes", type=int, default=64 * 1024,
        help="variables larger than this are sharded across the parameter servers",
    )
    g.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op threads per process (so the processes sharing a host do not fight for cores)")
    g.add_argument(
        "--slow-worker", type=int, default=0,
        help="demo: the host rank of a worker the launcher throttles (0: none); read by the launcher",
    )
    g.add_argument("--slow-factor", type=float, default=1.0, help="demo: how much slower that worker runs")
    g.add_argument(
        "--timeline-bin-s", type=float, default=0.5,
        help="width of the time bins of the per-worker step counts the coordinator reports",
    )
    d = p.add_argument_group("SageMaker contract (defaults from SM_* variables)")
    d.add_argument("--train", default=env("SM_CHANNEL_TRAIN", "data/mnist/train"), help="train channel")
    d.add_argument("--test", default=env("SM_CHANNEL_TEST", "data/mnist/test"), help="test channel")
    d.add_argument("--model-dir", default=env("SM_MODEL_DIR", "artifacts/model"), help="where the coordinator writes the model")
    d.add_argument(
        "--checkpoint-dir", default=env("SM_CHECKPOINT_DIR", "artifacts/checkpoints"),
        help="checkpoint every --log-interval steps here (the newest two are kept); resume from the newest",
    )
    d.add_argument(
        "--output-dir", default=env("SM_OUTPUT_DATA_DIR", "artifacts/output"),
        help="a worker's working directory (it writes its rank there for its input pipeline)",
    )
    return p


def check_args(args: argparse.Namespace, world_size: int = 2, train_samples: int | None = None) -> None:
    """Checks the workshop also runs before any process or job starts (raises ValueError).

    `world_size` is the number of hosts: each runs a parameter server and one training
    process (the coordinator on the first host, a worker on the others). The message names
    each broken rule, then after "Fix:" what to do about each.
    """
    parser = build_parser()
    default = parser.get_default
    problems, fixes = nonfinite_problems(args, parser)
    if problems:  # NaN passes every comparison below (nan <= 0 is False): refused first, on its own
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")
    if world_size < 2:
        problems.append(
            f"a parameter-server job needs at least 2 hosts (one coordinator, at least one worker), got {world_size}"
        )
        fixes.append("run it on 2 or more hosts, e.g. 3: one coordinator and two workers (the workshop's "
                     "command line: --hosts 3)")
    for name in ("steps", "batch_size", "log_interval", "threads", "min_shard_bytes"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            problems.append(f"{flag} must be at least 1, got {getattr(args, name)}")
            fixes.append(f"set {flag} to a whole number of at least 1, e.g. {default(name)} (its default)")
    if args.lr <= 0:
        problems.append(f"--lr must be positive, got {args.lr}")
        fixes.append(f"set --lr to a positive number, e.g. {default('lr')} (its default)")
    if not 0 <= args.momentum < 1:
        problems.append(f"--momentum must be in [0, 1), got {args.momentum}")
        fixes.append(f"set --momentum to 0 or more and below 1, e.g. {default('momentum')} (its default)")
    if args.slow_factor < 1 or args.timeline_bin_s <= 0:
        problems.append("--slow-factor must be at least 1 and --timeline-bin-s positive")
        fixes.append(f"leave --slow-factor at {default('slow_factor')} (no slowdown) or raise it, and "
                     f"--timeline-bin-s at {default('timeline_bin_s')}")
    if args.slow_worker and not 1 <= args.slow_worker < max(world_size, 2):
        problems.append(f"--slow-worker must be the host rank of a worker, 1..{world_size - 1}, got {args.slow_worker}")
        fixes.append(f"set --slow-worker to a worker's host rank, 1..{world_size - 1}, or 0 (no slow worker)")
    if train_samples is not None and train_samples < args.batch_size:
        problems.append(f"--batch-size {args.batch_size} is larger than the {train_samples} training samples")
        fixes.append(f"set --batch-size to {train_samples} or less, e.g. {min(default('batch_size'), train_samples)}")
    if problems:
        raise ValueError("; ".join(problems) + ". Fix: " + "; ".join(fixes) + ".")


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def metrics(**values) -> None:
    """One `METRICS key=value ...` line, rank first: what SageMaker's metric definitions and the
    workshop's log parser (workshop/metrics.py) read."""
    parts = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"METRICS {parts}", flush=True)


def load_channel(channel_dir: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    path = Path(channel_dir) / "mnist.npz"
    if not path.is_file():
        raise FileNotFoundError(
            f"The {name!r} channel has no {path.name} at {path}. Fix: prepare the data with "
            f"`python -m workshop.datasets mnist DIR` and pass --{name} DIR/{name} (locally), or give the "
            f"job a {name!r} input channel (SageMaker)."
        )
    with np.load(path) as data:
        return data["images"].astype(np.uint8), data["labels"].astype(np.int64)


def normalize(tf, images):
    x = tf.cast(images, tf.float32) / 255.0
    return tf.expand_dims((x - MNIST_MEAN) / MNIST_STD, -1)


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


# ----------------------------------------------------------------------------- roles


def configure_threads(tf, threads: int):
    """Intra-op threads: --threads per process, so that the processes sharing a host (its parameter
    server, its worker or the coordinator) do not fight for its cores. Inter-op threads stay at
    TensorFlow's default, one per CPU of the host: 8 on ml.c5.2xlarge; the local cluster's hosts
    set their instance's count (TF_NUM_INTEROP_THREADS), not their share of this machine. A task
    needs more than one: with one, a function waiting for a remote tensor blocks the very thread
    that would produce it, and training hangs."""
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads)


# The in-process cluster's one process serves the parameter server, the worker and the coordinator;
# as TensorFlow's parameter-server tutorial does for its in-process cluster, it gets this many
# inter-op threads where it may use fewer CPUs.
IN_PROCESS_INTER_OP_THREADS = 2


def run_server(tf, args, resolver) -> int:
    """PS: a parameter server or a worker is a TensorFlow server; it serves until stopped."""
    task_type, task_id = resolver.task_type, resolver.task_id
    config = configure_threads(tf, args.threads)
    if task_type == "worker":
        # The worker's rank (= its host rank) for its input pipeline; see WORKER_ID_FILE.
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        os.chdir(args.output_dir)
        Path(WORKER_ID_FILE).write_text(str(task_id + 1))
    if task_type == "ps":
        tf.config.set_visible_devices([], "GPU")  # variables on the host's CPU memory
    server = tf.distribute.Server(  # PS: start this task's gRPC server from TF_CONFIG's cluster
        resolver.cluster_spec(), job_name=task_type, task_index=task_id,
        protocol=resolver.rpc_layer or "grpc", config=config, start=True,
    )
    print(f"{task_type} {task_id} serving at {server.target} (host {os.environ.get('SM_CURRENT_HOST', platform.node())})", flush=True)
    server.join()  # never returns: the launcher stops this process when training has ended
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_process_resolver(tf, args):
    """No launcher: one ps and one worker server in this very process, the coordinator too."""
    spec = tf.train.ClusterSpec({
        "ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"], "chief": [f"127.0.0.1:{free_port()}"],
    })
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    os.chdir(args.output_dir)  # the in-process worker reads WORKER_ID_FILE from here
    Path(WORKER_ID_FILE).write_text("1")
    config = configure_threads(tf, args.threads)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if usable < IN_PROCESS_INTER_OP_THREADS:
        config.inter_op_parallelism_threads = IN_PROCESS_INTER_OP_THREADS
    for job in ("ps", "worker"):
        tf.distribute.Server(spec, job_name=job, task_index=0, protocol="grpc", config=config, start=True)
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="chief", task_id=0, rpc_layer="grpc")


CHECKPOINT_NAME = "ckpt"  # checkpoints are CHECKPOINT_NAME-<step>.index and .data-* files
CHECKPOINTS_KEPT = 2


def list_checkpoints(tf, directory: str) -> list[tuple[int, str]]:
    """(step, path prefix) of each checkpoint in `directory`, oldest first. A checkpoint's .index
    file is the last it writes (its shards are first written under a temporary name), so a
    checkpoint whose .index is there is complete."""
    found = []
    for index in tf.io.gfile.glob(os.path.join(directory, f"{CHECKPOINT_NAME}-*.index")):
        prefix = index[: -len(".index")]
        step = prefix.rsplit("-", 1)[1]
        if step.isdigit():
            found.append((int(step), prefix))
    return sorted(found)


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

    placement = {}
    for name in SHAPES:
        parts = components(model.weights[name])
        placement[name] = [v.device for v in parts]
        for i, v in enumerate(parts):
            metrics(rank=0, variable=name, shard=i, shards=len(parts), device=v.device)

    # Resume: the checkpoint holds the variables, their momentum and the step count.
    checkpoint = tf.train.Checkpoint(model=model, slots=slots, step=step_counter)
    # PS: by default each parameter server writes its own variables' shard to the checkpoint path
    # on its own host's disk, and one of them merges the parts: that needs a file system every host
    # shares. SageMaker's /opt/ml/checkpoints is per host, so all checkpoint I/O goes through the
    # coordinator's CPU instead: the whole checkpoint lands on algo-1, whose folder SageMaker syncs.
    io = tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")
    damaged: set[str] = set()  # checkpoints found damaged: never resumed from, never counted as one to keep
    saved = list_checkpoints(tf, args.checkpoint_dir)
    for _, prefix in reversed(saved):  # the newest first; an older intact one if it is damaged
        try:
            # Every variable must come back; a value the model has no place for is ignored (expect_partial):
            # the save counter in a checkpoint that tf.train.CheckpointManager wrote (older versions of this script).
            # TensorFlow checks each tensor's CRC32C as it reads it: damaged bytes fail here.
            checkpoint.read(prefix, options=io).assert_existing_objects_matched().expect_partial()
        except Exception as exc:  # whatever a damaged or cut-short checkpoint raises: it cannot be used
            print(f"The checkpoint {prefix} is damaged: TensorFlow cannot read it ({restore_error(exc)}). Training does "
                  "not resume from it.", flush=True)
            damaged.add(prefix)
            continue
        if damaged:
            print(f"Resuming from the older checkpoint {prefix} instead, the newest intact one.", flush=True)
        print(f"Resumed from {prefix} at step {int(step_counter.numpy())}.", flush=True)
        break
    else:
        if damaged:
            exit_with(
                f"No intact checkpoint to resume from in {args.checkpoint_dir} ({', '.join(sorted(damaged))}). Fix: move "
                "the damaged checkpoint(s) (their .index and .data-* files) out of it (or delete them) to train from "
                "the start, or pass another --checkpoint-dir.")

    # A checkpoint of variables that live on several tasks is written by a tf.function. Saved
    # eagerly (checkpoint.write, CheckpointManager.save), TensorFlow builds that function anew at
    # every save, and from the 5th save on warns that it keeps retracing; built here once, with the
    # path as a tensor argument, every save runs the same traced function.
    @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
    def write_checkpoint(prefix):
        return checkpoint.write(prefix, options=io)

    tf.io.gfile.makedirs(args.checkpoint_dir)

    def save_checkpoint(step: int) -> None:
        """Writes ckpt-<step> and keeps the newest CHECKPOINTS_KEPT checkpoints that are not damaged (a
        damaged one never counts, so the last intact one is never deleted for it)."""
        prefix = os.path.join(args.checkpoint_dir, f"{CHECKPOINT_NAME}-{step}")
        write_checkpoint(tf.constant(prefix)).numpy()  # .numpy(): wait until it is written
        damaged.discard(prefix)  # rewritten whole
        intact = [p for _, p in list_checkpoints(tf, args.checkpoint_dir) if p not in damaged]
        for old in intact[:-CHECKPOINTS_KEPT]:
            for path in tf.io.gfile.glob(old + ".*"):
                tf.io.gfile.remove(path)

    def dataset_fn():
        # PS: runs on each worker: its own shuffled, endless stream of batches, tagged with its rank.
        worker = tf.strings.to_number(tf.strings.strip(tf.io.read_file(WORKER_ID_FILE)), tf.int32)
        ds = tf.data.Dataset.from_tensor_slices((train_x, train_y)).shuffle(len(train_y)).repeat()
        ds = ds.batch(args.batch_size, drop_remainder=True)
        return ds.map(lambda x, y: (normalize(tf, x), y, worker)).prefetch(2)

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    lr, momentum = args.lr, args.momentum
    default_lr = build_parser().get_default("lr")

    @tf.function
    def train_step(iterator):
        # PS: executes on whichever worker is free: read the variables from the parameter servers,
        # compute the gradient of one batch, and apply it there at once, without waiting for others.
        x, y, worker = next(iterator)
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
        return loss, worker, tf.timestamp()

    config = {
        "args": vars(args), "cluster": spec, "num_ps": num_ps, "num_workers": num_workers,
        "placement": placement, "tensorflow": tf.__version__, "python": platform.python_version(),
        "host": os.environ.get("SM_CURRENT_HOST", platform.node()),
    }
    print(f"Coordinator: {num_workers} worker(s), {num_ps} parameter server(s). Configuration: "
          + json.dumps(config, sort_keys=True), flush=True)

    done = int(step_counter.numpy())
    events: list[tuple[float, int]] = []  # (time the step ended on its worker, worker rank)
    test_loss = test_acc = float("nan")
    t0 = time.time()
    while done < args.steps:
        n = min(args.log_interval, args.steps - done)
        t_interval = time.perf_counter()
        # PS: schedule() returns at once; the steps queue up and the free workers take them.
        results = [coordinator.schedule(train_step, args=(per_worker_iterator,)) for _ in range(n)]
        coordinator.join()  # wait for these steps (a worker that died has its steps rerun elsewhere)
        elapsed = time.perf_counter() - t_interval
        values = [r.fetch() for r in results]
        losses = [float(v[0]) for v in values]
        events += [(float(v[2]), int(v[1])) for v in values]
        done += n
        step_counter.assign(done)
        test_loss, test_acc = evaluate(tf, model, test_x, test_y)
        metrics(rank=0, step=done, train_loss=float(np.mean(losses)), test_loss=test_loss,
                test_accuracy=test_acc, steps_per_sec=n / elapsed)
        bad = [(i, v) for i, v in enumerate(values) if not math.isfinite(float(v[0]))]
        if bad or not math.isfinite(test_loss):  # never a checkpoint of diverged weights
            what = (f"the loss was {float(bad[0][1][0])} at step {done - n + bad[0][0] + 1} (counted in the order "
                    f"the steps were scheduled), on worker {int(bad[0][1][1])}" if bad
                    else f"the test loss was {test_loss} after step {done}")
            again = ("; run again with the same --checkpoint-dir: it resumes from the last checkpoint, written before "
                     "this" if list_checkpoints(tf, args.checkpoint_dir) else "")
            exit_with(
                f"Training diverged: {what}. The run stops here, before it checkpoints the broken weights: the "
                f"checkpoints already written stay as they were. Fix: a lower --lr than {args.lr:g}, e.g. "
                f"{default_lr} (its default){again}.")
        save_checkpoint(done)

    if not events:  # a finished run resumed: report the model as it is
        test_loss, test_acc = evaluate(tf, model, test_x, test_y)
    report_timeline(events, t0, args.timeline_bin_s)
    metrics(rank=0, final_test_accuracy=test_acc, final_test_loss=test_loss, steps=done,
            workers_used=len({w for _, w in events}), wall_time_s=time.time() - t_start)
    save_model(tf, args, model, config, test_acc)
    return 0


def report_timeline(events: list[tuple[float, int]], t0: float, bin_s: float) -> None:
    """Per worker: steps completed by the end of each time bin, and its mean step time.

    Measured on the workers: each step returns the worker's rank and the time it finished
    (`tf.timestamp()` there). Hosts' clocks agree to milliseconds (NTP on SageMaker; one clock
    locally), far finer than the bins.
    """
    if not events:
        return
    start = min(t0, min(t for t, _ in events))
    end = max(t for t, _ in events) - start
    for worker in sorted({w for _, w in events}):
        times = sorted(t - start for t, w in events if w == worker)
        edges = np.arange(bin_s, end + bin_s, bin_s)
        counts = np.searchsorted(times, edges, side="right")
        for t, c in zip(edges, counts, strict=True):
            metrics(rank=0, worker=worker, t=float(round(t, 3)), worker_steps=int(c))
        busy = (times[-1] - times[0]) / max(len(times) - 1, 1)
        metrics(rank=0, worker=worker, worker_total_steps=len(times), worker_step_time_s=float(busy))


def save_model(tf, args, model, config, test_acc) -> None:
    """A SavedModel (loads with tf.saved_model.load, no code needed) and model.npz (numpy)."""
    model_dir = Path(args.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    weights = {name: tf.convert_to_tensor(var).numpy() for name, var in model.weights.items()}  # PS: pulled from the ps
    np.savez(model_dir / "model.npz", **weights)
    exported = make_model_class(tf)(weights)  # an ordinary, local copy
    exported.serve = tf.function(
        lambda images: {"logits": exported(normalize(tf, images))},
        input_signature=[tf.TensorSpec([None, 28, 28], tf.uint8, name="images")],
    )
    # Every run has a cluster (TF_CONFIG's, or the in-process one): save on the coordinator's own CPU.
    with tf.device("/job:chief/replica:0/task:0/device:CPU:0"):
        tf.saved_model.save(exported, str(model_dir / "saved_model"), signatures={"serving_default": exported.serve})
    (model_dir / "config.json").write_text(json.dumps({**config, "test_accuracy": test_acc}, indent=2, sort_keys=True) + "\n")
    print(f"Saved the model (saved_model/, model.npz) and its configuration to {model_dir}.", flush=True)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("train", "test", "model_dir", "checkpoint_dir", "output_dir"):
        setattr(args, name, str(Path(getattr(args, name)).resolve()))  # before any chdir
    import tensorflow as tf

    # PS: the role comes from TF_CONFIG's task.type, as TensorFlow's convention has it (the launcher
    # passes the script nothing but its hyperparameters); no TF_CONFIG: an in-process cluster.
    if os.environ.get("TF_CONFIG"):
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    else:
        resolver = in_process_resolver(tf, args)
    if resolver.task_type in ("ps", "worker"):
        return run_server(tf, args, resolver)
    code = run_coordinator(tf, args, resolver)
    sys.stdout.flush()
    sys.stderr.flush()
    # The coordinator's background threads (one per worker, some perhaps waiting for a dead
    # worker to come back) would hold the interpreter at exit; the work is done and saved.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
