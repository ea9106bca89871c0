"""Lab 1's second, smaller run for the notebook: the same script with one worker, which no other worker can
overtake.

    from measure import one_worker                     # what the notebook calls (its folder is on the path)
    python 1_parameter_server/measure.py --steps 300   # the run's staleness and final accuracy

`python code/train.py` with no TF_CONFIG runs an in-process cluster (code/cluster.py's `in_process_resolver`):
one parameter server, one worker and the coordinator in one process, seconds to start where three simulated
hosts take a minute. The coordinator's thread for a worker waits for one step to end before it sends the next,
so a lone worker's every gradient must have staleness 0: the check that the count is right. Trained for as many
updates as the notebook's job, with the same batch, learning rate and momentum, it is the same model trained by
plain (synchronous) SGD: what the job's stale gradients cost is the difference.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from workshop import metrics
from workshop.labs import get_lab


def one_worker(steps: int, hyperparameters: Mapping[str, Any] | None = None, timeout_s: float = 600) -> list[dict]:
    """Lab 1's script alone (an in-process cluster: 1 parameter server, 1 worker) for `steps` steps, in a
    folder of its own that is deleted afterwards; returns its metric records (workshop.metrics)."""
    lab = get_lab("parameter_server")
    channels = lab.data.prepare()
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SM_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written into code/, the job's source_dir
    with tempfile.TemporaryDirectory(prefix="lab1-one-worker-") as tmp:
        argv = [sys.executable, str(lab.entry_path), "--steps", str(steps),
                "--train", str(channels.dirs["train"]), "--test", str(channels.dirs["test"]),
                "--model-dir", f"{tmp}/model", "--checkpoint-dir", f"{tmp}/checkpoints", "--output-dir", f"{tmp}/output"]
        for key, value in (hyperparameters or {}).items():
            argv += [f"--{key}", str(value)]
        proc = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"lab 1's script alone exited with status {proc.returncode}:\n{tail}")
    return metrics.parse_lines(proc.stdout.splitlines())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="training steps (updates)")
    args = p.parse_args(argv)
    records = one_worker(args.steps, {"log-interval": 50})
    print(f"1 worker, {args.steps} steps: staleness mean {metrics.last(records, 'staleness_mean')}, "
          f"max {metrics.last(records, 'staleness_max')}; test accuracy {metrics.last(records, 'final_test_accuracy')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
