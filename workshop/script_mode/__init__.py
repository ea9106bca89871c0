"""Your own training script, unchanged, on the local cluster and as a SageMaker job (script mode).

    import workshop
    result = workshop.train_locally(trainer)    # the SDK v3 ModelTrainer you would submit; no Docker
    result.model_archive                        # model.tar.gz, every host's /opt/ml/model, as SageMaker makes it
    trainer.train()                             # the same object on SageMaker

    python -m workshop run-script DIR/ENTRY [--launcher torchrun|horovod|parameter-server|none] [--hosts N]
        [--channel NAME=PATH ...] [--hp KEY=VALUE ...] [--env KEY=VALUE ...] [--mode sagemaker [--dry-run]]

A script the workshop did not write becomes an ad-hoc lab (`ScriptSpec`, key `workshop.spec.SCRIPT_KEY`):
its folder is the `source_dir`, its channels a `workshop.datasets.local.GivenChannels`, its launcher one of
the workshop's (or the trainer's own `distributed=` object). So everything `python -m workshop run` offers
serves it unchanged: `workshop.runner.run_local` (progress display, stall reports, checkpoint folder,
restarts) and `workshop.runner.run_on_sagemaker` (preflight, cost bound and confirmation, dry run).

Before anything starts: the entry and the modules beside it that it imports must compile (a syntax error is
shown once, here, not once per rank); for a local run, what it imports and what its requirements file names
must be installed in this environment (named, with the command that installs them: nothing is installed for
you); hyperparameters SageMaker would refuse, or that `sm_train.sh` could not deliver, are refused; and one
line says what this machine cannot simulate (a GPU instance's GPUs, the image's own packages, SMP, ...).
After a local run every host's `/opt/ml/model` and `/opt/ml/output/data` are aggregated into one
`model.tar.gz` and one `output.tar.gz` (`workshop.runtime.artifacts`), a name two hosts wrote is reported,
and an empty model folder is said. docs/your-script.md is the user's page.

- `spec`: `ScriptSpec`, the ad-hoc lab, and `script_spec`, which checks and builds one;
- `checks`: what is checked about the script before anything starts (compiles, imports, requirements);
- `local`: a script's job on the local cluster (`run_job`), and the line of what is not simulated;
- `result`: `ScriptResult`, the archives, per-host folders, logs and lines of a local run;
- `trainer`: a `ModelTrainer` read into a job, and `train_locally`;
- `sagemaker`: `sagemaker_settings(mode)` (a trainer's session, role and job name, by a notebook's `mode`) and
  `submit_trainer`: the same trainer object sent to SageMaker after the preflight and the cost confirmation;
- `cli`: `python -m workshop run-script`.
"""

from workshop.script_mode.result import HostFolders, ScriptResult
from workshop.script_mode.sagemaker import sagemaker_settings, submit_trainer
from workshop.script_mode.spec import ScriptSpec, script_spec
from workshop.script_mode.trainer import train_locally, trainer_job

__all__ = ["HostFolders", "ScriptResult", "ScriptSpec", "sagemaker_settings", "script_spec", "submit_trainer",
           "train_locally", "trainer_job"]
