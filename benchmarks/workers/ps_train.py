"""Lab 1's parameter-server script, with lab 3's CNN, for benchmarks/bench_strategies.py.

Lab 1's model (1_parameter_server/code/train.py, `SHAPES`) is a narrower CNN than lab 3's
(conv 16 and 32 channels, ~0.23M parameters, against 32 and 64, ~0.42M). To compare the
strategies on the same model, this wrapper imports lab 1's script unchanged and replaces only
its model: the shapes of lab 3's `Net` (conv 3x3x1x32, conv 3x3x32x64, dense 3136x128,
dense 128x10, same padding, ReLU, 2x2 max pooling; lab 3's dropout is left out), then runs lab
1's `main()`: the same roles, driver, coordinator loop and METRICS lines.

    python benchmarks/workers/ps_train.py ...            # what the PS driver runs on each host
    python benchmarks/workers/ps_train.py --bench-compute-only --steps 60 --batch-size 64
        # the same model and step with no parameter server: compute time alone

Every flag is lab 1's (`--help`), except `--bench-compute-only`.
"""

from __future__ import annotations

import sys
import time

from workshop import REPO_ROOT
from workshop.spec import load_module

LAB1 = REPO_ROOT / "1_parameter_server" / "code" / "train.py"
LAB3_SHAPES = {  # lab 3's Net, in lab 1's (TensorFlow) layout
    "conv1/kernel": (3, 3, 1, 32), "conv1/bias": (32,),
    "conv2/kernel": (3, 3, 32, 64), "conv2/bias": (64,),
    "dense1/kernel": (7 * 7 * 64, 128), "dense1/bias": (128,),
    "dense2/kernel": (128, 10), "dense2/bias": (10,),
}


def load_lab1():
    module = load_module(LAB1, "lab1_train", with_siblings=True)  # with the modules beside it in code/
    module.SHAPES = LAB3_SHAPES
    module.make_model_class = make_model_class
    return module


def make_model_class(tf):
    class CNN(tf.Module):
        """Lab 3's layers: conv-pool (32), conv-pool (64), dense 128, dense 10."""

        def __init__(self, weights):
            super().__init__(name="cnn")
            self.weights = {n: tf.Variable(w, name=n.replace("/", "_")) for n, w in weights.items()}

        def __call__(self, x):
            w = self.weights
            h = tf.nn.relu(tf.nn.conv2d(x, w["conv1/kernel"], 1, "SAME") + w["conv1/bias"])
            h = tf.nn.max_pool2d(h, 2, 2, "VALID")
            h = tf.nn.relu(tf.nn.conv2d(h, w["conv2/kernel"], 1, "SAME") + w["conv2/bias"])
            h = tf.nn.max_pool2d(h, 2, 2, "VALID")
            h = tf.reshape(h, [-1, 7 * 7 * 64])
            h = tf.nn.relu(tf.matmul(h, tf.convert_to_tensor(w["dense1/kernel"])) + w["dense1/bias"])
            return tf.matmul(h, tf.convert_to_tensor(w["dense2/kernel"])) + w["dense2/bias"]

    return CNN


def compute_only(lab1, argv) -> int:
    """Lab 1's train step (same model, loss, momentum update) on local variables, timed."""
    args = lab1.build_parser().parse_args(argv)
    import tensorflow as tf

    lab1.configure_threads(tf, args.threads)
    x_all, y_all = lab1.load_channel(args.train, "train")
    model = make_model_class(tf)(lab1.initial_weights(args.seed))
    params = [model.weights[n] for n in LAB3_SHAPES]
    slots = [tf.Variable(tf.zeros(v.shape)) for v in params]
    ds = tf.data.Dataset.from_tensor_slices((x_all, y_all)).shuffle(len(y_all)).repeat()
    it = iter(ds.batch(args.batch_size, drop_remainder=True).map(lambda x, y: (lab1.normalize(tf, x), y)).prefetch(2))

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        grads = tape.gradient(loss, params)
        for var, slot, grad in zip(params, slots, grads, strict=True):
            slot.assign(args.momentum * slot + grad)
            var.assign_sub(args.lr * slot)
        return loss

    done = 0
    while done < args.steps:
        n = min(args.log_interval, args.steps - done)
        t0 = time.perf_counter()
        for _ in range(n):
            loss = train_step(*next(it))
        float(loss)
        elapsed = time.perf_counter() - t0
        done += n
        lab1.metrics(rank=0, step=done, train_loss=float(loss), steps_per_sec=n / elapsed)
    return 0


def main() -> int:
    lab1 = load_lab1()
    argv = sys.argv[1:]
    if "--bench-compute-only" in argv:
        argv.remove("--bench-compute-only")
        return compute_only(lab1, argv)
    return lab1.main(argv)


if __name__ == "__main__":
    sys.exit(main())
