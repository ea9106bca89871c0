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

and this script then does what the standalone job's entrypoint does. It writes nothing under
/opt/ml/input: SageMaker puts the job's config and channels there and does not document them as
writable. What it writes goes into a folder of its own next to the code (`.workshop-trial/` in
/opt/ml/code, which the toolkit itself wrote):

1. the job's environment file, written by the SDK's own `environment.py` (from the `sm_drivers`
   channel) from `/opt/ml/input/config/` as `sm_train.sh` has it written, but without the
   hyperparameters SageMaker reserves: the toolkit's `sagemaker_*` and the tuning service's
   `_tuning_objective_metric` (any key starting with `_`; no script flag does), which the driver
   would pass to the lab's script as flags it does not know; and with `SM_SOURCE_DIR` where the
   code is (a tuning job has no `code` channel);
2. a copy of `sm_train.sh` whose three lines that name those container paths point at what step 1
   made: it sources that environment file (instead of running `environment.py` into
   /opt/ml/input/sm_training.env) and `cd`s into the code where the toolkit put it (instead of
   /opt/ml/input/data/code);
3. replaces itself with `bash` on that copy: requirements, driver and script run as in the
   standalone job.

The trial's hyperparameters come from hyperparameters.json (the platform writes the trial's
values into it); the command-line flags the toolkit passes are the same values and are not read.
Standard library only: it runs in the training image, where the workshop is not installed.
"""

import json
import os
import shlex
import sys
from pathlib import Path

CONFIG_DIR = Path("/opt/ml/input/config")
DRIVERS = Path("/opt/ml/input/data/sm_drivers")
FAILURE_FILE = Path("/opt/ml/output/failure")
SCRATCH = ".workshop-trial"  # in the code folder (the working directory)
RESERVED_PREFIXES = ("sagemaker_", "_")  # the toolkit's, and the tuning service's (_tuning_objective_metric)
# The lines of the SDK's generated sm_train.sh (SDK 3.27: sagemaker/train/templates.py, and the
# working directory from ModelTrainer._prepare_train_script) that a trial's copy replaces.
ENVIRONMENT_STEP = "$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/scripts/environment.py"
SOURCE_STEP = "source /opt/ml/input/sm_training.env"
CODE_STEP = "cd /opt/ml/input/data/code"


def fail(message: str) -> None:
    print(f"workshop_trial: {message}", file=sys.stderr, flush=True)
    FAILURE_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(FAILURE_FILE, "a", encoding="utf-8") as f:
        f.write(message + "\n")
    sys.exit(1)


def write_environment(hyperparameters: dict, code: Path, path: Path) -> None:
    """The environment file `sm_train.sh` sources, written by the SDK's own `environment.py` with
    these hyperparameters, and `SM_SOURCE_DIR` = `code`."""
    sys.path.insert(0, str(DRIVERS / "scripts"))
    import environment  # the SDK's (it puts the sm_drivers channel on sys.path for its own imports)

    environment.set_env(
        resource_config=json.loads((CONFIG_DIR / "resourceconfig.json").read_text(encoding="utf-8")),
        input_data_config=json.loads((CONFIG_DIR / "inputdataconfig.json").read_text(encoding="utf-8")),
        hyperparameters_config=hyperparameters,
        output_file=str(path),
    )
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"export SM_SOURCE_DIR='{code}'\n")


def main() -> None:
    train_script = DRIVERS / "sm_train.sh"
    if not train_script.is_file():
        fail(f"no {train_script}: the tuning job has no sm_drivers channel (SDK v3's HyperparameterTuner adds it).")
    script = train_script.read_text(encoding="utf-8")
    missing = [step for step in (ENVIRONMENT_STEP, SOURCE_STEP, CODE_STEP) if step not in script]
    if missing:
        fail(f"{train_script} has no line `{missing[0]}`: it is not what SageMaker SDK 3.27 generates, so "
             "workshop_trial.py cannot run it (install the SDK version in the workshop's requirements.txt).")
    hyperparameters = json.loads((CONFIG_DIR / "hyperparameters.json").read_text(encoding="utf-8"))
    kept = {k: v for k, v in hyperparameters.items() if not k.startswith(RESERVED_PREFIXES)}
    code = Path.cwd()
    scratch = code / SCRATCH
    scratch.mkdir(exist_ok=True)
    env_file, trial_script = scratch / "sm_training.env", scratch / "sm_train.sh"
    write_environment(kept, code, env_file)
    trial_script.write_text(
        script.replace(ENVIRONMENT_STEP, "echo " + shlex.quote(f"Environment variables written to {env_file} by workshop_trial.py"))
        .replace(SOURCE_STEP, f"source {shlex.quote(str(env_file))}")
        .replace(CODE_STEP, f"cd {shlex.quote(str(code))}"),
        encoding="utf-8",
    )
    print(f"workshop_trial: running sm_train.sh with the trial's hyperparameters {json.dumps(kept)}", flush=True)
    os.execvp("bash", ["bash", str(trial_script)])


if __name__ == "__main__":
    main()
