"""The TensorFlow script's checkpoints: rank 0 restores the newest (a damaged one stops every rank with
TensorFlow's reason, in one line), and no checkpoint is written of a diverged run.

Nothing here imports TensorFlow at its top: train_tensorflow.py imports it in main(), so that the
workshop can read the script's flags without it. The `# Shared copy:` definition is lab 1's too.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np

from contract import exit_with


def restore_on_rank0(ckpt, latest: str | None, ckpt_dir: Path, epoch, rank: int) -> str | None:
    """Rank 0 restores `ckpt` from `latest` (if any) and says so; the return value is why it cannot (None:
    it could, or there is nothing to restore, or this is another rank), which every rank stops with."""
    if rank != 0 or not latest:
        return None
    try:  # TensorFlow checks each tensor's CRC32C as it reads it: damaged bytes fail here
        ckpt.restore(latest).expect_partial()
    except Exception as exc:  # whatever a damaged or cut-short checkpoint raises: it cannot be used
        return (f"The checkpoint {latest} is damaged: TensorFlow cannot restore it ({restore_error(exc)}). Fix: move "
                f"its files (ckpt.*) out of {ckpt_dir} (or delete them) to train from the start, or pass "
                "another --checkpoint-dir.")
    print(f"Resumed from {latest} after epoch {int(epoch.numpy())}.", flush=True)
    return None


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def diverged(loss: float, classes: int = 10, times: float = 100) -> bool:
    """Whether a loss says training diverged: not finite, or `times` times an untrained model's (the cross-entropy
    of a uniform guess over `classes`, ln 10 = 2.3 for the digits): weights that blew up, whatever they do next
    (the PyTorch scripts' `Divergence`)."""
    return not math.isfinite(loss) or loss > times * math.log(classes)


def stop_if_diverged(hvd, model, step: int, first_bad: int, fix: str, weights: bool = False) -> None:
    """Every rank, at the same step: if any rank's loss diverged (`diverged`; `first_bad`: this rank's first
    such step, 0 for none), or with `weights` its weights are not, every rank stops with the same
    message, before the checkpoint of a diverged model is written."""
    import tensorflow as tf  # already imported by the script's main()

    rank, size = hvd.rank(), hvd.size()
    report = np.zeros((size, 2))
    report[rank, 0] = first_bad
    if weights and not all(np.isfinite(v.numpy()).all() for v in model.trainable_variables):
        report[rank, 1] = step
    report = hvd.allreduce(tf.constant(report), op=hvd.Sum, name="divergence").numpy()  # every rank's rows
    bad = sorted((int(s), r) for r in range(size) for s in report[r] if s)
    if not bad:
        return
    at, who = bad[0]
    what = (f"the loss diverged (not finite, or over 100 times an untrained model's "
            f"{math.log(10):.2g}) at step {at} on rank {who}" if report[who, 0] == at
            else f"rank {who}'s weights were not finite after step {at}, while its loss still was")
    exit_with(
        f"Training diverged: {what}. The run stops here, before it checkpoints the broken weights: the "
        f"checkpoint already written stays as it was. Fix: {fix}.")


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
