"""Lab 1's checkpoints: resumed from, written at each interval, never of diverged weights.

The coordinator writes them (train.py: `tf.train.Checkpoint` of the variables, their momentum and the
step count), every --log-interval steps, to --checkpoint-dir (SageMaker syncs /opt/ml/checkpoints to S3),
and a run resumes from the newest one TensorFlow can read.
"""

from __future__ import annotations

import math
import os

from arguments import build_parser
from contract import exit_with, restore_error

CHECKPOINT_NAME = "ckpt"  # checkpoints are CHECKPOINT_NAME-<step>.index and .data-* files
CHECKPOINTS_KEPT = 2


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def diverged(loss: float, classes: int = 10, times: float = 100) -> bool:
    """Whether a loss says training diverged: not finite, or `times` times an untrained model's (the cross-entropy
    of a uniform guess over `classes`, ln 10 = 2.3 for the digits): weights that blew up, whatever they do next
    (the PyTorch scripts' `Divergence`)."""
    return not math.isfinite(loss) or loss > times * math.log(classes)


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


def resume(tf, checkpoint, directory: str, io) -> set[str]:
    """Restore `checkpoint` from the newest checkpoint in `directory` that TensorFlow can read, if any; the
    prefixes of those found damaged, which are passed over. Exits (exit_with) when every one is damaged."""
    damaged: dict[str, str] = {}  # checkpoints found damaged, and why: never resumed from, never counted as one to keep
    saved = list_checkpoints(tf, directory)
    for _, prefix in reversed(saved):  # the newest first; an older intact one if it is damaged
        try:
            # Every variable must come back; a value the model has no place for is ignored (expect_partial):
            # the save counter in a checkpoint that tf.train.CheckpointManager wrote (older versions of this script).
            # TensorFlow checks each tensor's CRC32C as it reads it: damaged bytes fail here.
            checkpoint.read(prefix, options=io).assert_existing_objects_matched().expect_partial()
        except Exception as exc:  # whatever a damaged or cut-short checkpoint raises: it cannot be used
            damaged[prefix] = restore_error(exc)
            continue
        # Each one passed over, in one line marked NOTE: the workshop shows it beside its progress display.
        for passed, why in damaged.items():
            print(f"NOTE: The checkpoint {passed} is damaged: TensorFlow cannot read it ({why}). Training resumes "
                  f"from the older checkpoint {prefix} instead, the newest intact one.", flush=True)
        print(f"Resumed from {prefix} at step {int(checkpoint.step.numpy())}.", flush=True)
        break
    else:
        if damaged:
            exit_with(
                f"No intact checkpoint to resume from in {directory} ("
                + "; ".join(f"{prefix}: TensorFlow cannot read it ({why})" for prefix, why in sorted(damaged.items()))
                + "). Fix: move "
                "the damaged checkpoint(s) (their .index and .data-* files) out of it (or delete them) to train from "
                "the start, or pass another --checkpoint-dir.")
    return set(damaged)


def checkpoint_writer(tf, checkpoint, directory: str, io, damaged: set[str]):
    """`save_checkpoint(step)`: writes ckpt-<step> and keeps the newest CHECKPOINTS_KEPT checkpoints that are
    not `damaged` (a damaged one never counts, so the last intact one is never deleted for it)."""

    # A checkpoint of variables that live on several tasks is written by a tf.function. Saved
    # eagerly (checkpoint.write, CheckpointManager.save), TensorFlow builds that function anew at
    # every save, and from the 5th save on warns that it keeps retracing; built here once, with the
    # path as a tensor argument, every save runs the same traced function.
    @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
    def write_checkpoint(prefix):
        return checkpoint.write(prefix, options=io)

    tf.io.gfile.makedirs(directory)

    def save_checkpoint(step: int) -> None:
        prefix = os.path.join(directory, f"{CHECKPOINT_NAME}-{step}")
        write_checkpoint(tf.constant(prefix)).numpy()  # .numpy(): wait until it is written
        damaged.discard(prefix)  # rewritten whole
        intact = [p for _, p in list_checkpoints(tf, directory) if p not in damaged]
        for old in intact[:-CHECKPOINTS_KEPT]:
            for path in tf.io.gfile.glob(old + ".*"):
                tf.io.gfile.remove(path)

    return save_checkpoint


def stop_if_diverged(tf, args, values: list, test_loss: float, done: int, n: int) -> None:
    """Exit (exit_with) before a checkpoint of diverged weights is written: a step of the last `n` (`values`:
    each step's loss and worker) or the test loss after step `done` diverged (`diverged`)."""
    bad = [(i, v) for i, v in enumerate(values) if diverged(float(v[0]))]
    if bad or diverged(test_loss):
        loss = float(bad[0][1][0]) if bad else test_loss
        what = (f"the loss was {loss:g} at step {done - n + bad[0][0] + 1} (counted in the order the steps were "
                f"scheduled), on worker {int(bad[0][1][1])}" if bad else f"the test loss was {loss:g} after step {done}")
        if math.isfinite(loss):
            what += f", {loss / math.log(10):.3g} times an untrained model's ({math.log(10):.2g})"
        again = ("; run again with the same --checkpoint-dir: it resumes from the last checkpoint, written before "
                 "this" if list_checkpoints(tf, args.checkpoint_dir) else "")
        exit_with(
            f"Training diverged: {what}. The run stops here, before it checkpoints the broken weights: the "
            f"checkpoints already written stay as they were. Fix: a lower --lr than {args.lr:g}, e.g. "
            f"{build_parser().get_default('lr')} (its default){again}.")
