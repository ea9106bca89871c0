"""Lab 1's side of the SageMaker training contract, and the small helpers its modules share.

The data channels (`--train`, `--test`: `mnist.npz` each), the `METRICS` lines SageMaker's metric
definitions and the workshop read, a last line that says why a process stopped, and TensorFlow's
restore errors in one line. Several are copies of the other labs' (tests/test_copies.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
from pathlib import Path

import numpy as np

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


def run_configuration(tf, args: argparse.Namespace, spec: dict, placement: dict) -> dict:
    """The coordinator's configuration line: the flags, the cluster and where each variable lives; also
    saved beside the model (config.json)."""
    num_ps, num_workers = len(spec.get("ps", [])), len(spec.get("worker", []))
    config = {
        "args": vars(args), "cluster": spec, "num_ps": num_ps, "num_workers": num_workers,
        "placement": placement, "tensorflow": tf.__version__, "python": platform.python_version(),
        "host": os.environ.get("SM_CURRENT_HOST", platform.node()),
    }
    print(f"Coordinator: {num_workers} worker(s), {num_ps} parameter server(s). Configuration: "
          + json.dumps(config, sort_keys=True), flush=True)
    return config


def save_model(tf, model_dir: str, model_class, weights: dict[str, np.ndarray], config: dict, test_acc: float) -> None:
    """A SavedModel (loads with tf.saved_model.load, no code needed) and model.npz (numpy) of `weights`,
    and config.json, in SM_MODEL_DIR (`model_dir`), which SageMaker uploads as the job's model."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    np.savez(model_dir / "model.npz", **weights)
    exported = model_class(weights)  # an ordinary, local copy
    exported.serve = tf.function(
        lambda images: {"logits": exported(normalize(tf, images))},
        input_signature=[tf.TensorSpec([None, 28, 28], tf.uint8, name="images")],
    )
    # Every run has a cluster (TF_CONFIG's, or the in-process one): save on the coordinator's own CPU.
    with tf.device("/job:chief/replica:0/task:0/device:CPU:0"):
        tf.saved_model.save(exported, str(model_dir / "saved_model"), signatures={"serving_default": exported.serve})
    (model_dir / "config.json").write_text(json.dumps({**config, "test_accuracy": test_acc}, indent=2, sort_keys=True) + "\n")
    print(f"Saved the model (saved_model/, model.npz) and its configuration to {model_dir}.", flush=True)
