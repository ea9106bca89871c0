"""Run one trial of a SageMaker tuning job the way a standalone SDK v3 job runs: through the
job's uploaded `sm_train.sh` and its distributed driver (torchrun, mpirun, the workshop's own).

Why this exists (SageMaker Python SDK 3.27, sagemaker-python-sdk issue #5610): the
CreateHyperParameterTuningJob API has no ContainerEntrypoint, so a tuning job's trials start
the image's own entry point, the `sagemaker-training` toolkit. `HyperparameterTuner` uploads
the `sm_drivers` channel but points the toolkit at the lab's script (`sagemaker_program`), and
the toolkit runs it as one plain `python train.py ...` per host: no torchrun, no ranks, every
host a world of one. The workshop names this file as `sagemaker_program` instead (it is added
to the uploaded `sourcedir.tar.gz` next to the lab's code), so on every host the toolkit runs:

    python workshop_trial.py --lr 0.02 ...      (cwd /opt/ml/code, the unpacked source dir)

and this script then does what the standalone job's entrypoint does:

1. drops the entries SageMaker reserves from `/opt/ml/input/config/hyperparameters.json` (the
   original is kept as `hyperparameters.toolkit.json`): the toolkit's `sagemaker_*` and the tuning
   service's `_tuning_objective_metric` (any key starting with `_`; no script flag does).
   `sm_train.sh` passes every entry of that file to the lab's script as a flag, and the script
   knows none of them;
2. makes `/opt/ml/input/data/code` (where `sm_train.sh` looks for the code) the unpacked source
   dir, since a tuning job has no `code` channel;
3. replaces itself with `bash /opt/ml/input/data/sm_drivers/sm_train.sh`.

The trial's hyperparameters come from that file (the platform writes the trial's values into
it); the command-line flags the toolkit passes are the same values and are not read. Standard
library only: it runs in the training image, where the workshop is not installed.
"""

import json
import os
import sys
from pathlib import Path

CONFIG = Path("/opt/ml/input/config/hyperparameters.json")
DRIVERS = Path("/opt/ml/input/data/sm_drivers")
CODE_CHANNEL = Path("/opt/ml/input/data/code")
FAILURE_FILE = Path("/opt/ml/output/failure")
RESERVED_PREFIXES = ("sagemaker_", "_")  # the toolkit's, and the tuning service's (_tuning_objective_metric)


def fail(message: str) -> None:
    print(f"workshop_trial: {message}", file=sys.stderr, flush=True)
    FAILURE_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(FAILURE_FILE, "a", encoding="utf-8") as f:
        f.write(message + "\n")
    sys.exit(1)


def main() -> None:
    train_script = DRIVERS / "sm_train.sh"
    if not train_script.is_file():
        fail(f"no {train_script}: the tuning job has no sm_drivers channel (SDK v3's HyperparameterTuner adds it).")
    hyperparameters = json.loads(CONFIG.read_text(encoding="utf-8"))
    kept = {k: v for k, v in hyperparameters.items() if not k.startswith(RESERVED_PREFIXES)}
    if kept != hyperparameters:
        CONFIG.with_name("hyperparameters.toolkit.json").write_text(json.dumps(hyperparameters), encoding="utf-8")
        partial = CONFIG.with_name(CONFIG.name + ".partial")
        partial.write_text(json.dumps(kept), encoding="utf-8")
        os.replace(partial, CONFIG)
    if not CODE_CHANNEL.exists():
        CODE_CHANNEL.symlink_to(Path.cwd(), target_is_directory=True)
    print(f"workshop_trial: running sm_train.sh with the trial's hyperparameters {json.dumps(kept)}", flush=True)
    os.execvp("bash", ["bash", str(train_script)])


if __name__ == "__main__":
    main()
