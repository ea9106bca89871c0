"""A fake SageMaker training service for CI: moto, plus training jobs that really run.

    import fake_sagemaker
    fake = fake_sagemaker.start()          # or: with fake_sagemaker.FakeSageMaker() as fake:
    ...                                    # any SageMaker SDK v3 / boto3 code, no AWS account
    fake_sagemaker.stop()

moto (5.2.5) accepts CreateTrainingJob but marks every job Completed at once, with no logs,
no model and a made-up metric, so code that follows a job to its end (reads its CloudWatch
logs, downloads `model.tar.gz`, checks its metrics) has nothing to read; it marks every
CreateHyperParameterTuningJob Completed at once too, with a made-up best training job. This
module starts moto's `mock_aws()` in the current process and makes each CreateTrainingJob
*execute* the job it was given, on `workshop.runtime.local_cluster.LocalCluster`, from what the
SDK uploaded, after the call has returned, as the service does, and each
CreateHyperParameterTuningJob run its training jobs, several at once (6. below):

1. **The hook.** moto's SageMaker response handler for CreateTrainingJob
   (`moto.sagemaker.responses.SageMakerResponse.create_training_job`) is wrapped, so every
   client in the process is covered, whichever boto3 session made it (sagemaker-core makes
   its own clients from the trainer's session, or from a new `boto3.Session()`; a botocore
   event handler on one session would miss those). The wrapper reads the full request
   (including `Environment`, which moto's backend drops), checks it (7., 8.), lets moto record
   the job, and returns at once, as the service does: the job runs in a thread of its own
   (`FakeSageMaker.wait()` blocks until it ends). DescribeTrainingJob shows it `InProgress` while
   it runs, its `SecondaryStatus` and `SecondaryStatusTransitions` moving as the service's do
   (`Starting`, `Downloading` while the channels come from S3, `Training` while the hosts run,
   `Uploading` while the model goes to S3; on spot `Interrupted` and again from `Starting`),
   each change published as it happens, with `TrainingStartTime` set and `ModelArtifacts`,
   `TrainingEndTime`, the metrics and the times coming only at the end; then `Completed`,
   `Failed` or `Stopped`. `create_hyper_parameter_tuning_job` is wrapped the same way (6.).
1b. **The request, as the service checks it.** Before moto records anything, the whole request is
   checked against every constraint of botocore's SageMaker service model (`validate_training_request`,
   `workshop.jobs.shapes`): required members, lengths, list and map sizes (at most 50 tags, 40 metric
   definitions, 100 hyperparameters and environment variables), number ranges, enums, and patterns
   read as the service reads them (Java regular expressions over the whole value: tag keys and values
   of letters, digits, spaces and `_.:/=+-@`, environment names `[a-zA-Z_][a-zA-Z0-9_]*`, job names,
   S3 URIs on one line), nested members included. A failure is a `ValidationException` in the
   service's words ("1 validation error detected: Value 'a_b' at 'trainingJobName' failed to satisfy
   constraint: Member must satisfy regular expression pattern: ..."); then the spot rules (7.).
2. **S3 in.** Every input channel is downloaded from moto S3 (`S3Prefix`, `File`/`FastFile`,
   `FullyReplicated`): `code` (SDK 3.27 uploads the `source_dir` file by file, not as a
   tarball, under `<base job name>/<job>/input/code/`; a `.tar.gz` source_dir is unpacked as
   `sm_train.sh` would), `sm_drivers` (next to it: `sm_train.sh`, `sourcecode.json`,
   `distributed.json`, and the SDK's `container_drivers` tree, `__pycache__` included) and the
   data channels.
3. **The container, as the SDK set it up.** The local cluster's container runtime
   (`workshop.runtime.hostns`) gives each simulated host the downloaded channels under its own
   `/opt/ml`, peers that resolve as `algo-1..N` (at 127.0.0.N), a hostname that is not `algo-N`
   (SageMaker does not promise one: `hostns.instance_hostname`), `/opt/ml/input/config` and the
   data channels read-only (SageMaker does not document them as writable; the SDK's own `code`
   and `sm_drivers` channels and `/opt/ml/input` stay writable, as its scripts write there:
   `hostns.mount_input_read_only`) and runs the
   request's `ContainerEntrypoint` + `ContainerArguments`, i.e. the uploaded `sm_train.sh`:
   the SDK's `environment.py` writes `/opt/ml/input/sm_training.env` from the request's
   configs, the script `cd`s into the code, installs requirements if the SDK asked it to, and
   runs the uploaded driver (`SM_MASTER_ADDR=algo-1`, `SM_MASTER_PORT=7777`). Hosts are
   `ResourceConfig.InstanceCount` and say they are its `InstanceType`; processes per host are
   `process_count_per_node`, or, when it is null (SageMaker: one per GPU), what the driver
   finds: no GPU here, so 1. Hosts start up to `start_skew_s` apart (default 2 s,
   `FAKE_SAGEMAKER_START_SKEW_S`), as instances finish their set-up at different times. The
   request's `Environment` reaches every host. The network is the job's: with
   `EnableNetworkIsolation`, or in VPC subnets whose route table has no 0.0.0.0/0 route to a
   NAT or internet gateway (read from moto's EC2), the hosts reach only each other; otherwise
   they reach the internet (through an HTTPS proxy: `workshop.runtime.hostns`).
   `CheckpointConfig.S3Uri` is synced as SageMaker syncs it: its files are downloaded into a folder
   standing for it, which the local cluster syncs with each host's own checkpoint folder (every host
   starts with its files; what a host writes or deletes reaches it while the job runs, the last
   writer's copy staying; no host sees another's files: `workshop.runtime.checkpoint_sync`); once the
   hosts are gone, that folder goes to S3, and the keys the job downloaded and its hosts deleted are
   deleted (the real sync reaches S3 while the job runs). `MaxRuntimeInSeconds` is the run's time limit. Where Linux does not allow
   unprivileged namespaces the local cluster's process runtime runs instead (the driver
   directly, master on 127.0.0.1, no network isolation) and `JobRun.runtime` says so.
3b. **The framework toolkit, when there is no ContainerEntrypoint** (`JobRun.launch` "toolkit").
   A request without `ContainerEntrypoint` whose HyperParameters carry `sagemaker_program` (what
   SDK 3.27's `HyperparameterTuner` sends: the tuning API has no ContainerEntrypoint) runs what
   SageMaker's PyTorch and TensorFlow training images run then: their entrypoint's
   `sagemaker-training` toolkit with the image's SAGEMAKER_TRAINING_MODULE
   (`sagemaker_pytorch_container.training:main`, `sagemaker_tensorflow_container.training:main`;
   `TOOLKIT_IMAGES`; any other image fails the job, saying the fake does not know what it would
   run). `toolkit_main` emulates it on every host, from the toolkits' code: the
   `sagemaker_submit_directory` tarball (downloaded from moto S3 by the fake) extracted to
   `/opt/ml/code`; `/opt/ml/input/data/<channel>` and `inputdataconfig.json` for exactly the
   request's channels (`sm_drivers` if it has one; no `code` channel: one in the request fails
   the job, not simulated); the hyperparameters JSON-decoded, those named `sagemaker_*` and the
   toolkit's reserved ones (`_tuning_objective_metric`, ...) kept out of the script's
   arguments; the toolkit's environment (`SM_HOSTS`, `SM_CURRENT_HOST`, `SM_NUM_CPUS` (the
   simulated host's cores), `SM_NUM_GPUS` (`nvidia-smi --list-gpus`), `SM_MODEL_DIR`,
   `SM_CHANNELS`, `SM_CHANNEL_<NAME>`, `SM_HPS`, `SM_HP_<KEY>`, `SM_USER_ARGS`,
   `SM_TRAINING_ENV`, `SM_OUTPUT_DATA_DIR`, `SM_MODULE_DIR`, `SM_FRAMEWORK_PARAMS`, ... as
   `to_env_vars()` builds them; `CURRENT_HOST`, `SAGEMAKER_REGION`, `PYTHONPATH`), plus the
   framework's own: PyTorch `MASTER_ADDR` (the first host), `MASTER_PORT=7777`, `NCCL_*`,
   `SM_DLC_TORCH_VERSION`; TensorFlow `S3_REGION`, `TF_CPP_MIN_LOG_LEVEL`, and in a tuning
   job's training jobs `--model_dir <model_dir hyperparameter>/<job>/model` (`None/<job>/model`
   without one, as the TensorFlow toolkit does). Not the local cluster's additions the image
   would not have: `SM_CHECKPOINT_DIR` only if the request's Environment sets it. Then, each
   host resolves every `algo-N`, installs requirements.txt if present, logs "Invoking script
   with the following command:" and runs ONE process, `/bin/sh -c "python <program> --key value
   ..."` (sorted keys, values as Python prints them) in /opt/ml/code: no torchrun, no RANK or
   WORLD_SIZE, so a script that reads its world from a launcher is a world of one on every
   host (sagemaker-python-sdk issue #5610). A non-zero exit writes the toolkit's failure file
   (`ExecuteUserScriptError:\nExitCode N\nErrorMessage "<output from the first line naming an
   exception>"\nCommand "..."`), which becomes `FailureReason`. Not simulated: the toolkits'
   distributed runners (a `sagemaker_*_enabled` distribution hyperparameter fails the job),
   a source with `setup.py` (installed as a package), code already in the image (no
   `sagemaker_submit_directory`). This path needs the container runtime (each host its own
   `/opt/ml`); without it the job fails saying so.
4. **IAM as the SDK meets it.** The SDK's role validation stays on (`SAGEMAKER_VALIDATE_ROLE`
   unset): `tests/fake_aws_apis.py` answers `iam:SimulatePrincipalPolicy` from the role's
   policy documents, and the fake's role carries the workshop's own least-privilege policy
   (`workshop.account.role_policy`). `StopTrainingJob` exists (`fake_aws_apis`): for a job this
   fake is running, the job says `Stopping` at once, its hosts get SIGTERM and it ends `Stopped`
   (no other phase shown after `Stopping`), its model saved as SageMaker saves it. `stop()` stops
   every job still running the same way, and waits for them, before it stops moto.
5. **Logs, metrics, model out.** Each host's lines go to CloudWatch Logs group
   `/aws/sagemaker/TrainingJobs`, stream `<job>/algo-N-<epoch seconds>`, as a real job shows
   them: without the local cluster's `[host/rank]` prefix and without torchrun's
   `[defaultN]:` tag; while the job runs, each line within about half a second of its host
   printing it (`_CloudWatchTail`: the stream appears with its host's first line), timestamped
   when it was sent, the last lines before the job leaves `Training`. `FinalMetricDataList` is
   the last value each of the request's `MetricDefinitions` regexes matched in the logs. Every
   host's model folder is aggregated into `<S3OutputPath>/<job>/output/model.tar.gz` (the path
   moto reports), and every host's
   `/opt/ml/output/data` into `output.tar.gz` beside it, as the service aggregates them. The job ends
   `Completed`; `Failed` with `FailureReason` (`AlgorithmError: ` and the driver's failure
   file, else the local cluster's report) when the run fails; `Stopped`
   (`MaxRuntimeExceeded`) past its time limit.
6. **Tuning jobs** (`fake.tuning_jobs`: a `TuningRun` each, its trials' `JobRun`s in `trials`).
   CreateHyperParameterTuningJob is checked first as the service checks it
   (`validate_tuning_request`: every constraint of the service model, as for a training job (1b.),
   the name's length and pattern among them; the strategy; ResourceLimits' ranges; an objective among the definition's MetricDefinitions, in the service's words; ranges
   that are well formed, unique, at most 30, none also static; Grid only over categorical
   ranges, MaxNumberOfTrainingJobs absent or equal to the grid's size; other strategies need
   at least MaxNumberOfTrainingJobs combinations, in the service's words), each failure a
   `ValidationException` before anything is recorded or run; what the fake does not simulate
   is refused the same way, saying so (TrainingJobDefinitions, WarmStartConfig, Autotune,
   AutoParameters, TuningJobCompletionCriteria, AlgorithmName,
   HyperParameterTuningResourceConfig; Random and Bayesian without MaxNumberOfTrainingJobs).
   Then the call returns, the tuning job `InProgress`, and a thread of its own launches its
   training jobs (`tuning_trial_values`), up to MaxParallelTrainingJobs at once (another starts
   when one ends), each one's hosts pinned to its slot's share of this machine's cores
   (`workshop.tuning.core_shares`, as a local search shares them; `JobRun.cores`) so that trials
   at once do not crowd the same cores; `TuningRun.most_at_once` says how many ran together.
   Grid, every combination of the categorical values (the first range varying slowest); Random,
   MaxNumberOfTrainingJobs draws, each range on its ScalingType (Auto as Linear), seeded by
   RandomSeed; Bayesian and Hyperband are drawn as Random (no model of earlier results, no
   early stopping; TrainingJobEarlyStoppingType Auto never stops a job). Each is a real
   training job named `<tuning job>-<NNN>-<8 hex>`, created in moto's backend (so
   DescribeTrainingJob, ListTrainingJobs and its logs work as for any job; it says
   `TuningJobArn`) with the definition's AlgorithmSpecification, channels, output, resources,
   stopping condition, checkpoints, Environment, VPC and network isolation, the tuning job's
   tags, and as HyperParameters the static ones, the trial's values (text) and, as the service
   adds it, `_tuning_objective_metric` (also shown in the description's
   StaticHyperParameters); it runs as 1.-5. (so with no ContainerEntrypoint: 3b). Its
   objective is its final value of the objective metric (5.); without one, its ObjectiveStatus
   is Failed. moto's made-up results are replaced by what ran: status `InProgress` while
   trials run, then `Completed`, `Failed` ("No training job succeeded after N attempts. ...", the
   service's words; it also stops launching after 5 failures without a success; or "No
   objective metrics found after running N training jobs. ..." when none reported the
   objective) or `Stopped`; TrainingJobStatusCounters (a failure of the fake itself counts
   as RetryableError), ObjectiveStatusCounters, BestTrainingJob (the best objective for the
   objective's Type, the first of equals; no OverallBestTrainingJob, which is for warm starts),
   ConsumedResources.RuntimeInSeconds (wall clock), the end time. ResourceLimits'
   MaxRuntimeInSeconds: no training job starts after it has passed (a running one keeps its own
   limit). Each trial's instances count against the account's quota (8.): a trial that would exceed
   it, with the jobs already running, fails at once with `ResourceLimitExceeded: <the service's
   words>` (a NonRetryableError), holding nothing, and its slot is filled again when a running trial
   ends. What the service does then is not documented (the developer guide says only that every
   concurrent trial's instances count against the quotas: it might wait instead); failing is the
   stricter reading. `fake_aws_apis` adds ListTrainingJobsForHyperParameterTuningJob and
   StopHyperParameterTuningJob (which stops the running trials as StopTrainingJob does, after
   which no other starts).
7. **Managed spot training** (`EnableManagedSpotTraining`; a tuning job's definition may ask for it
   too). The request is checked first (`validate_training_request`, `_check_spot`; ValidationException,
   nothing recorded or run): MaxWaitTimeInSeconds only on a spot job ("Invalid MaxWaitTimeInSeconds.
   It is only supported when EnableManagedSpotTraining is set to true", the service's words), a spot
   job needs it, at least MaxRuntimeInSeconds (or its default of 1 day when that is not given), and
   ResourceConfig.InstancePreferences is refused with spot. Then each spot job is interrupted
   `spot_interruptions` times (`FakeSageMaker(spot_interruptions=N)`, env
   FAKE_SAGEMAKER_SPOT_INTERRUPTIONS, default 0; an attribute, so `fake_sagemaker.active().
   spot_interruptions = 1` changes a running fake). Each interruption: the fake waits until the
   attempt's hosts have written a checkpoint (a file their checkpoint folders' sync brought to the S3
   URI's stand-in that was not there, or not so, when the attempt started; files still being written
   and the labs' progress records do not count: `SPOT_NOT_CHECKPOINTS`), or, when none appears,
   `spot_checkpoint_wait_s` (env FAKE_SAGEMAKER_SPOT_CHECKPOINT_WAIT_S, default 60) seconds into the
   attempt, and says which;
   then every host gets SIGTERM (as StopTrainingJob stops them) and the local cluster stops what is
   left as it stops any failed run; what the hosts synced goes to CheckpointConfig.S3Uri; the
   job shows `Interrupted` and waits `spot_restart_wait_s` (env FAKE_SAGEMAKER_SPOT_RESTART_WAIT_S,
   default 5) for "spot capacity" (on SageMaker minutes or hours, unknown in advance: not modelled);
   then it starts again from nothing but what SageMaker gives a new attempt: new hosts (their own
   folders, `<job>/attempt-N/`), the input channels downloaded again, every host's checkpoint folder
   downloaded from S3 (`Starting`, `Downloading`, `Training` again, as the developer guide's "Managed
   Spot Training Lifecycle" shows). The attempt after the last interruption runs to its end.
   Each attempt's hosts log to new CloudWatch streams (`<job>/algo-N-<epoch seconds of that
   attempt>`, as new instances do); metrics are read from every attempt's lines, in order.
   MaxRuntimeInSeconds bounds the attempts' running time together, MaxWaitTimeInSeconds the whole
   job, from its start, interruptions and waits included: past it the job is `Stopped`,
   SecondaryStatus `MaxWaitTimeExceeded` (after `Stopping`), FailureReason "Training job reached
   its MaxWaitTimeInSeconds of N s." (the fake's words, like its MaxRuntimeExceeded one).
   **Billing**, as DescribeTrainingJob reports it: TrainingTimeInSeconds is the job's wall clock from
   its start to its end (downloads, uploads and, on spot, the interruptions and the waits for
   capacity included); BillableTimeInSeconds is, on demand, the same, and on spot the seconds the
   hosts ran, summed over the attempts (each from the first host's start to the last one's stop),
   so `1 - Billable / Training` is the share of the job's time no host ran. The spot price's
   discount is NOT modelled (the fake knows no price): on SageMaker BillableTimeInSeconds is lower
   still by that discount. `JobRun` records it all: `spot`, `interruptions`, `attempts` (each one's
   host seconds, outcome, why it was reclaimed, its checkpoint files and log streams),
   `training_time_s`, `billable_time_s`.
8. **The account's instance quota.** Every running job, and every running trial of a tuning job,
   holds its ResourceConfig's instances against the quota for its instance type, Service Quotas'
   `<type> for training job usage` (`<type> for spot training job usage` for a spot job): 4 per type
   (`FakeSageMaker(instance_quota=N)`, env FAKE_SAGEMAKER_INSTANCE_QUOTA; single quotas by name with
   `quotas={...}`), what a new account might have for ml.g5.xlarge. A CreateTrainingJob whose
   instances would exceed it with those already held is `ResourceLimitExceeded` ("The account-level
   service limit '<quota>' is N Instances, with current utilization of U Instances and a request delta
   of D Instances. Please contact AWS support to request an increase for this limit.", the service's
   words as users have reported them), nothing recorded or run; a job gives its instances back just
   before it says it ended. Service Quotas' ListServiceQuotas (moto lacks it) answers, for SageMaker,
   these quotas for every training instance type (codes of the fake's own), so the workshop's preflight
   reads what CreateTrainingJob will enforce. Not simulated: the account-wide totals ("Number of
   instances across all training jobs"), the real defaults (often 0 for p4d/p5), other services' quotas.

What it does **not** simulate: the image itself (`TrainingImage` is recorded, never pulled:
the job runs in this Python environment, and `JobRun.image_framework` says whether the image's
framework version is the one installed here), GPUs (no host has one, so NCCL/smddp paths are
never taken), IAM permissions of the job itself (the role is validated as the SDK does, but the
job's own S3 and log access is not checked against it), KMS, spot prices and real spot capacity
(7.: interruptions come when the fake is told, and the wait for capacity is a fixed one), warm pools, retries,
instance groups, Pipe mode, sharded or manifest channels, `SourceCode.command`, uncompressed
model output, CloudWatch metrics (only the final values in DescribeTrainingJob), how long the
real phases last (a simulated host starts in seconds, an instance in minutes; the fake's
`Starting` and `Downloading` are short), CloudWatch's delivery delay, Bayesian and Hyperband
search, early stopping, and prices (billing is reported in seconds only, 7.). Trials at once share
this machine's cores (each its share), where SageMaker's have instances of their own.
Nothing leaves this process's AWS calls: moto intercepts every one of them. tests/README.md has
the whole list of what CI proves and what it does not.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import copy
import io
import json
import math
import os
import random
import re
import shlex
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REGION = "us-east-1"
ROLE_NAME = "FakeSageMakerTrainingRole"
LOG_GROUP = "/aws/sagemaker/TrainingJobs"  # what workshop.jobs reads
CONTAINER_ROOT = "/opt/ml"
DRIVERS_IN_CONTAINER = "/opt/ml/input/data/sm_drivers/"
RESERVED_CHANNELS = ("code", "sm_drivers")
# In the environment of every process of one attempt of one job (see `_attempt`), and nowhere else.
ATTEMPT_ENV = "FAKE_SAGEMAKER_ATTEMPT"
DEFAULT_START_SKEW_S = 2.0
# Managed spot training (7. in the module docstring): interruptions per spot job, and how long an
# attempt may train before it is interrupted without a checkpoint.
SPOT_INTERRUPTIONS_ENV = "FAKE_SAGEMAKER_SPOT_INTERRUPTIONS"
SPOT_CHECKPOINT_WAIT_ENV = "FAKE_SAGEMAKER_SPOT_CHECKPOINT_WAIT_S"
DEFAULT_SPOT_CHECKPOINT_WAIT_S = 60.0
# After an interruption, how long the fake waits before it launches new hosts: the stand-in for the
# wait for spot capacity (on SageMaker minutes to hours, and unknown in advance).
SPOT_RESTART_WAIT_ENV = "FAKE_SAGEMAKER_SPOT_RESTART_WAIT_S"
DEFAULT_SPOT_RESTART_WAIT_S = 5.0
DEFAULT_MAX_RUNTIME_S = 24 * 3600  # StoppingCondition.MaxRuntimeInSeconds when not given (API reference: 1 day)
# What the spot watcher does not take for a checkpoint in the checkpoint folder: a file still being
# written (`*.tmp`, `*.tempstate*`, anything under a `*.partial` or `*_temp` folder: the labs' atomic
# writes, torch.distributed.checkpoint's and TensorFlow's temporaries) and the labs' progress records,
# rewritten every few steps (`progress.json`, `fault.json`), and the local runtime's own lock on the
# folder (`.workshop.lock`, workshop/runtime/folders.py: held while the job runs, gone before the
# upload; SageMaker's instances have no such file).
SPOT_NOT_CHECKPOINTS = ("*.tmp", "*.tempstate*", "progress.json", "fault.json", ".workshop.lock")
SPOT_NOT_CHECKPOINT_FOLDERS = ("*.partial", "*_temp")
FAILURE_REASON_MAX = 1024  # DescribeTrainingJob's FailureReason is at most 1024 characters
# The account's instance quota for training jobs, per instance type (Service Quotas' "<type> for training
# job usage", and "<type> for spot training job usage" for managed spot jobs): what a new account might
# have for ml.g5.xlarge. `FakeSageMaker(instance_quota=N, quotas={quota name: value})` changes it.
INSTANCE_QUOTA_ENV = "FAKE_SAGEMAKER_INSTANCE_QUOTA"
DEFAULT_INSTANCE_QUOTA = 4
_LOG_POLL_S = 0.5  # how often a running job's new log lines go to CloudWatch
_LOG_BATCH = 1000  # events per PutLogEvents call (CloudWatch allows 10,000 and 1 MB)
_TESTS_DIR = Path(__file__).resolve().parent  # the hosts import this module from here (the toolkit)
# Framework training images (repository -> framework), and the toolkit module each image names in
# SAGEMAKER_TRAINING_MODULE (aws/deep-learning-containers: the PyTorch images' "sagemaker" stage,
# the TensorFlow training images).
TOOLKIT_IMAGES = {
    "pytorch-training": ("pytorch", "sagemaker_pytorch_container.training:main"),
    "pytorch": ("pytorch", "sagemaker_pytorch_container.training:main"),
    "smdistributed-modelparallel": ("pytorch", "sagemaker_pytorch_container.training:main"),
    "tensorflow-training": ("tensorflow", "sagemaker_tensorflow_container.training:main"),
}
# Hyperparameters with which the framework toolkits run a launcher instead of the plain script
# (sagemaker_training.environment, sagemaker_pytorch_container.training, sagemaker_tensorflow_container.training).
TOOLKIT_DISTRIBUTION_HYPERPARAMETERS = (
    "sagemaker_mpi_enabled", "sagemaker_parameter_server_enabled", "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_pytorch_ddp_enabled", "sagemaker_torch_distributed_enabled", "sagemaker_pytorch_xla_multi_worker_enabled",
    "sagemaker_multi_worker_mirrored_strategy_enabled",
)
_ISOLATE_PREFIXES = ("AWS_ENDPOINT_URL", "AWS_CONTAINER_")
_ISOLATE_KEYS = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_REGION",
)


def _say(message: str) -> None:
    print(f"[fake-sagemaker] {message}", flush=True)


@dataclass
class JobRun:
    """What the fake did with one training job: a CreateTrainingJob, or a tuning job's trial."""

    name: str
    status: str = "InProgress"
    failure_reason: str | None = None
    hosts: int = 0
    procs_per_host: int = 0
    # What each host ran: the uploaded sm_train.sh's driver ("distributed_drivers/torchrun_driver.py"),
    # or the framework toolkit ("sagemaker-training toolkit (sagemaker_pytorch_container.training:main): train.py")
    driver: str = ""
    launch: str = ""  # "sm_train.sh" (the request's ContainerEntrypoint) or "toolkit" (sagemaker_program)
    tuning_job: str | None = None  # the tuning job that launched it, if any
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    log_lines: dict[str, int] = field(default_factory=dict)  # host -> lines sent to CloudWatch
    final_metrics: dict[str, float] = field(default_factory=dict)
    model_artifact: str | None = None
    output_artifact: str | None = None  # output.tar.gz: every host's /opt/ml/output/data
    wall_time_s: float = 0.0
    workdir: str = ""
    network: str = ""  # what the job's hosts could reach
    # "pytorch 2.13 (image) = 2.13.0 (here)" or "... != ...: not verified here"
    image_framework: str = ""
    runtime: str = ""  # the local cluster's runtime: "container" (sm_train.sh, algo-N) or "process"
    # Managed spot training (7. in the module docstring): whether the job asked for it, how many
    # times its hosts were reclaimed, and each attempt as it ran: {"attempt": 1, "hosts_s": seconds
    # the attempt's hosts ran, "outcome": "interrupted", "completed", "failed", "stopped" or
    # "timed out", "reclaimed": why then (spot only), "checkpoint_files": what its checkpoint folder
    # held at its end, "log_streams": its CloudWatch streams}. Every job has one attempt at least.
    spot: bool = False
    interruptions: int = 0
    attempts: list[dict[str, Any]] = field(default_factory=list)
    # What DescribeTrainingJob reports: TrainingTimeInSeconds (wall clock from the job's start to its
    # end, waiting between attempts included) and BillableTimeInSeconds (spot: the seconds its hosts
    # ran, every attempt; on demand: the training time). No spot discount is modelled.
    training_time_s: int | None = None
    billable_time_s: int | None = None
    instance_type: str = ""
    # When it started and ended (epoch seconds, this machine's clock): jobs that overlap ran at once.
    started_at: float = 0.0
    ended_at: float | None = None
    cores: list[int] = field(default_factory=list)  # a tuning job's trial: the cores its slot had ([]: all)


@dataclass
class TuningRun:
    """What the fake did with one CreateHyperParameterTuningJob: its trials, up to MaxParallelTrainingJobs at once."""

    name: str
    strategy: str = ""
    strategy_run: str = ""  # how the trials were chosen here ("Grid", "Random"; Bayesian/Hyperband: "Random")
    objective: dict[str, str] = field(default_factory=dict)  # {"Type": ..., "MetricName": ...}
    max_parallel: int = 0  # MaxParallelTrainingJobs: at most this many trials run at once
    planned: list[dict[str, str]] = field(default_factory=list)  # each trial's tuned values, in order
    trials: list[JobRun] = field(default_factory=list)  # the trials it launched, in launch order
    most_at_once: int = 0  # the most trials that were running at the same time
    status: str = "InProgress"
    failure_reason: str | None = None
    best_training_job: str | None = None
    wall_time_s: float = 0.0


class _JobError(Exception):
    """A job the fake cannot run as asked: the job fails with this reason, like SageMaker's."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class _UploadedDriver:
    """The job's `distributed=` config as the container sees it: `distributed.json` as the SDK
    uploaded it, and the driver script `sm_train.sh` runs, from the uploaded `sm_drivers`.

    Duck-types what `LocalCluster` reads from an SDK `DistributedConfig` (`driver_dir`,
    `driver_script`, `model_dump()`), so the uploaded driver runs, whatever its class was
    (the SDK's `Torchrun`/`MPI` or a workshop-owned `DistributedConfig`).
    """

    name: str
    driver_dir: str
    driver_script: str
    config: dict[str, Any]

    def model_dump(self) -> dict[str, Any]:
        return copy.deepcopy(self.config)


@dataclass
class _Attempt:
    """One attempt at a job (`FakeSageMaker._attempt`): what its hosts did, and how it ended."""

    result: Any  # the local cluster's ClusterResult
    checkpoint_dir: Path | None  # the S3 URI's stand-in, synced with each host's own checkpoint folder, if any
    lines: list[str]  # its log lines, without the local prefixes, in order
    record: dict[str, Any]  # what JobRun.attempts shows of it
    interrupted: bool  # the spot watcher reclaimed its hosts
    timed_out: bool | str  # past its time limit ("run" or "wait" once `_run` knows which limit it was)
    downloaded: list[str] = field(default_factory=list)  # the checkpoint files it started with, from S3


@dataclass
class _Launch:
    """How the local cluster runs one job: the sm_train.sh path or the framework toolkit path."""

    kind: str  # "sm_train.sh" or "toolkit"
    source_dir: Path  # copied to each host's /opt/ml/input/data/code
    entry_script: str
    procs: int
    distributed: Any
    sm_drivers_dir: Path | None
    command: list[str]  # each host's container command
    hyperparameters: dict[str, Any]  # hyperparameters.json
    runtime: str  # the local cluster's runtime ("auto", or "container" where nothing else will do)
    driver: str
    described: str
    prepare_host: Any = None  # lays out each host's sandbox before it starts (LocalCluster's prepare_host)


class _Lifecycle:
    """A running job's status as DescribeTrainingJob shows it: TrainingJobStatus, SecondaryStatus and
    SecondaryStatusTransitions, published on moto's job object at every change (a new list each time:
    another thread may be describing the job meanwhile). Once a stop is under way (StopTrainingJob, the
    fake's own stop, a time limit) the phases its run still passes through are not shown: the job says
    Stopping until it has stopped, as the service does."""

    def __init__(self, job: Any):
        self.job = job
        self.transitions: list[dict[str, Any]] = []
        self.stopping = False
        self._lock = threading.Lock()

    def phase(self, status: str, message: str) -> None:
        """The job is InProgress, in secondary status `status`."""
        with self._lock:
            if not self.stopping:
                self._append(status, message)
                self._publish("InProgress", status)

    def stop(self, message: str = "Stopping the training job") -> None:
        """The job is Stopping (once: a second stop changes nothing)."""
        with self._lock:
            if not self.stopping:
                self.stopping = True
                self._append("Stopping", message)
                self._publish("Stopping", "Stopping")

    def end(self, status: str, secondary: str, message: str) -> None:
        """The job has ended: Completed, Failed or Stopped (secondary: the same, or why it stopped)."""
        with self._lock:
            self._append(secondary, message, ended=True)
            self._publish(status, secondary)

    def _append(self, status: str, message: str, ended: bool = False) -> None:
        now = _now()
        if self.transitions:
            self.transitions[-1].setdefault("EndTime", now)
        entry = {"Status": status, "StartTime": now, "StatusMessage": message}
        if ended:
            entry["EndTime"] = now
        self.transitions.append(entry)

    def _publish(self, status: str, secondary: str) -> None:
        job = self.job
        job.secondary_status_transitions = copy.deepcopy(self.transitions)
        job.training_job_status, job.secondary_status = status, secondary
        job.last_modified_time = _now()


class _CloudWatchTail:
    """A running attempt's log lines to CloudWatch as they come, as a job's hosts send them: the local
    cluster writes every line it reads from the hosts to its `logs/cluster.log` (`[host/rank] text`, in
    the order of `ClusterResult.lines`, with notes of its own, such as a stall's, in between); this
    tails that file and puts each complete line of a host, without the local prefix, into its host's
    stream `<job>/<host>-<start_epoch>` (made when the host's first line comes), timestamped when it was
    read. `finish` sends what the file did not show (the run's last lines, or all of them where the log
    could not be written) from the run's own list, and makes a stream for each host that wrote nothing."""

    def __init__(self, boto: Any, name: str, start_epoch: int, log_path: Path, hosts: list[str]):
        self.logs = boto.client("logs")
        self.name, self.start_epoch, self.log_path, self.hosts = name, start_epoch, log_path, hosts
        self.sent = 0  # lines of the run taken so far (from the file, then from its list)
        self.per_host: dict[str, list[str]] = {}
        self.ordered: list[str] = []
        self.streams: dict[str, str] = {}
        self._pending: dict[str, list[str]] = {}
        self._offset = 0
        self._last_ms: dict[str, int] = {}
        with contextlib.suppress(self.logs.exceptions.ResourceAlreadyExistsException):
            self.logs.create_log_group(logGroupName=LOG_GROUP)

    def follow(self, done: threading.Event) -> None:
        """Until `done`: the new lines every _LOG_POLL_S seconds."""
        while not done.wait(_LOG_POLL_S):
            self.poll()

    def poll(self) -> None:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._offset)
                data = log.read()
        except OSError:
            return  # not there yet
        from workshop.metrics import CLUSTER_PREFIX

        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for raw in complete.decode("utf-8", errors="replace").splitlines():
            match = CLUSTER_PREFIX.match(raw)
            if match and match["host"] in self.hosts:  # a host's line, not the local cluster's own note
                self._take(raw)
        self._flush()

    def finish(self, lines: list[str]) -> list[str]:
        """The rest of the run's `lines`; returns the attempt's stream names."""
        self.poll()
        for line in lines[self.sent :]:
            self._take(line)
        self._flush()
        for host in self.hosts:
            self.per_host.setdefault(host, [])
            self._stream(host)
        return sorted(self.streams.values())

    def _take(self, line: str) -> None:
        from workshop.metrics import CLUSTER_PREFIX

        self.sent += 1
        match = CLUSTER_PREFIX.match(line)
        host = match["host"] if match else self.hosts[0]
        text = line[match.end() :] if match else line
        self.per_host.setdefault(host, []).append(text)
        self.ordered.append(text)
        if text.strip():
            self._pending.setdefault(host, []).append(text)

    def _stream(self, host: str) -> str:
        if host not in self.streams:
            stream = f"{self.name}/{host}-{self.start_epoch}"
            self.logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
            self.streams[host] = stream
        return self.streams[host]

    def _flush(self) -> None:
        for host, texts in sorted(self._pending.items()):
            if not texts:
                continue
            stream = self._stream(host)
            now_ms = max(int(time.time() * 1000), self._last_ms.get(host, 0))
            self._last_ms[host] = now_ms
            events = [{"timestamp": now_ms, "message": text} for text in texts]
            for i in range(0, len(events), _LOG_BATCH):
                self.logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream,
                                         logEvents=events[i : i + _LOG_BATCH])
        self._pending = {}


def safe_deserialize(value: Any) -> Any:
    """What the SDK's drivers do to each hyperparameter (`container_drivers/common/utils.py`):
    JSON-decode a string when it parses, else keep it."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise _JobError(f"ClientError: not an S3 URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def _now() -> datetime:
    return datetime.now(UTC)


class FakeSageMaker:
    """moto in this process, with CreateTrainingJob running the job. See the module docstring.

    `workdir`: where jobs run (default: a temporary folder, deleted by `stop()` unless
    `keep_runs`). `region`: the fake's region. The role it creates is `role_arn`, also exported
    as `WORKSHOP_ROLE_ARN`; `jobs` lists what it ran (and runs: each job runs in a thread of its own,
    as on SageMaker the Create call returns at once; `wait()` blocks until jobs end).

    `instance_quota`: the account's quota of instances per instance type for training jobs (default:
    env FAKE_SAGEMAKER_INSTANCE_QUOTA, else 4), on demand and spot each; `quotas` sets single quotas by
    their Service Quotas name (`{"ml.g5.xlarge for training job usage": 2}`). Both are attributes, read
    when a job or trial asks for instances.

    `spot_interruptions`: how many times each managed spot training job is interrupted (default:
    env FAKE_SAGEMAKER_SPOT_INTERRUPTIONS, else 0); `spot_checkpoint_wait_s`: how long an attempt
    may train without writing a checkpoint before it is interrupted anyway (default: env
    FAKE_SAGEMAKER_SPOT_CHECKPOINT_WAIT_S, else 60 s); `spot_restart_wait_s`: how long, after an
    interruption, the fake waits for "spot capacity" before it launches new hosts (default: env
    FAKE_SAGEMAKER_SPOT_RESTART_WAIT_S, else 5 s). All three are attributes, read when a job starts (or
    is interrupted), so a running fake can be changed (`fake_sagemaker.active().spot_interruptions = 1`).
    """

    def __init__(self, region: str = REGION, *, workdir: str | os.PathLike[str] | None = None, keep_runs: bool = False,
                 start_skew_s: float | None = None, spot_interruptions: int | None = None,
                 spot_checkpoint_wait_s: float | None = None, spot_restart_wait_s: float | None = None,
                 instance_quota: int | None = None, quotas: dict[str, float] | None = None):
        self.region = region
        self.instance_quota = int(os.environ.get(INSTANCE_QUOTA_ENV) or DEFAULT_INSTANCE_QUOTA
                                  if instance_quota is None else instance_quota)
        self.quotas = dict(quotas or {})
        if self.instance_quota < 0 or any(v < 0 for v in self.quotas.values()):
            raise ValueError(f"instance quotas must be 0 or more; got {self.instance_quota} and {self.quotas}.")
        self.spot_interruptions = int(os.environ.get(SPOT_INTERRUPTIONS_ENV) or 0
                                      if spot_interruptions is None else spot_interruptions)
        self.spot_checkpoint_wait_s = float(os.environ.get(SPOT_CHECKPOINT_WAIT_ENV) or DEFAULT_SPOT_CHECKPOINT_WAIT_S
                                            if spot_checkpoint_wait_s is None else spot_checkpoint_wait_s)
        self.spot_restart_wait_s = float(os.environ.get(SPOT_RESTART_WAIT_ENV) or DEFAULT_SPOT_RESTART_WAIT_S
                                         if spot_restart_wait_s is None else spot_restart_wait_s)
        if self.spot_interruptions < 0 or self.spot_checkpoint_wait_s <= 0 or self.spot_restart_wait_s < 0:
            raise ValueError(f"spot_interruptions and spot_restart_wait_s must be 0 or more, spot_checkpoint_wait_s "
                             f"more than 0; got {self.spot_interruptions}, {self.spot_restart_wait_s} and "
                             f"{self.spot_checkpoint_wait_s}.")
        # Instances of one job finish their set-up at different times: the last host starts this
        # late (env FAKE_SAGEMAKER_START_SKEW_S, default 2 s, so every multi-host job in CI meets it).
        self.start_skew_s = float(os.environ.get("FAKE_SAGEMAKER_START_SKEW_S", DEFAULT_START_SKEW_S)
                                  if start_skew_s is None else start_skew_s)
        self._workdir_arg = Path(workdir) if workdir else None
        self.keep_runs = keep_runs
        self.root: Path | None = None
        self.role_arn: str | None = None
        self.jobs: list[JobRun] = []  # every training job it ran, tuning jobs' trials included
        self.tuning_jobs: list[TuningRun] = []
        self._mock: Any = None
        self._saved_env: dict[str, str | None] = {}
        self._original_handlers: dict[tuple[type, str], Any] = {}  # (class, method) -> moto's own (_MISSING: none)
        self._lock = threading.Lock()  # the registries below, and the quota's count
        self._stop_requests: dict[str, threading.Event] = {}  # running job -> set by StopTrainingJob
        self._lifecycles: dict[str, _Lifecycle] = {}  # running job -> its status as described
        self._threads: dict[str, threading.Thread] = {}  # job or tuning job -> the thread that runs it
        self._in_use: dict[str, tuple[str, int]] = {}  # running job -> (quota name, instances it holds)
        self._closing = threading.Event()  # stop(): no job or trial starts any more

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeSageMaker:
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError("A FakeSageMaker is already running in this process; stop() it first.")
        import boto3
        from moto import mock_aws

        if self._workdir_arg:
            self.root = self._workdir_arg.resolve()
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            self.root = Path(tempfile.mkdtemp(prefix="fake-sagemaker-"))
        sdk_config = self.root / "sagemaker-config.yaml"
        sdk_config.write_text("SchemaVersion: '1.0'\n")  # none of the user's SDK defaults

        # No trace of a real AWS setup: no profile, endpoint, token or metadata lookup.
        for key in [k for k in os.environ if k in _ISOLATE_KEYS or k.startswith(_ISOLATE_PREFIXES)]:
            self._setenv(key, None)
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": self.region,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true",
            "SAGEMAKER_USER_CONFIG_OVERRIDE": str(sdk_config),
            "SAGEMAKER_ADMIN_CONFIG_OVERRIDE": str(sdk_config),
        }.items():
            self._setenv(key, value)
        # The SDK's role validation stays on: iam:SimulatePrincipalPolicy, which moto lacks, is
        # answered by tests/fake_aws_apis.py from the role's real policy documents.
        self._setenv("SAGEMAKER_VALIDATE_ROLE", None)

        self._mock = mock_aws()
        self._mock.start()
        try:
            import fake_aws_apis

            fake_aws_apis.install()
            fake_aws_apis.on_stop = self._stop_hook  # StopTrainingJob / StopHyperParameterTuningJob
            self.role_arn = self._create_role(boto3.Session(region_name=self.region))
            self._setenv("WORKSHOP_ROLE_ARN", self.role_arn)
            self._install_hook()
        except BaseException:
            self._mock.stop()
            self._restore_env()
            raise
        _ACTIVE = self
        _say(
            f"started: moto in-process, region {self.region}, role {self.role_arn}; "
            f"CreateTrainingJob runs the job on the local cluster (runs in {self.root})"
        )
        return self

    @staticmethod
    def _create_role(boto: Any) -> str:
        """The attendee's execution role: the workshop's own least-privilege policy
        (`workshop.account.role_policy`, for this user, bucket and key prefix), which the SDK's role
        validation then checks as it would in a real account."""
        from workshop import account, cloud
        from workshop.cloud import aws

        iam = boto.client("iam")
        account_id = boto.client("sts").get_caller_identity()["Account"]
        role = iam.create_role(RoleName=ROLE_NAME, AssumeRolePolicyDocument=json.dumps(cloud.trust_policy(account=account_id)),
                               Description="fake_sagemaker: the workshop's least-privilege training role")
        session = aws.sagemaker_session(boto)
        policy = account.role_policy(region=boto.region_name, account=account_id, bucket=aws.sdk_bucket(session),
                                     key_prefix=aws.sdk_key_prefix(session))
        iam.put_role_policy(RoleName=ROLE_NAME, PolicyName="workshop-training", PolicyDocument=json.dumps(policy))
        return role["Role"]["Arn"]

    def stop(self) -> None:
        """Stop every job and tuning job still running (as StopTrainingJob stops one: its hosts get
        SIGTERM), wait for them to end, then undo everything `start` did."""
        global _ACTIVE
        if _ACTIVE is not self:
            return
        self._closing.set()  # no trial starts any more
        with self._lock:
            running = list(self._stop_requests)
        for name in running:
            self._stop_hook(name)
        deadline = time.monotonic() + 300
        for name, thread in list(self._threads.items()):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                _say(f"{name} is still running 300 s after it was stopped; leaving it")
        _ACTIVE = None
        self._remove_hook()
        with contextlib.suppress(Exception):
            import fake_aws_apis

            fake_aws_apis.on_stop = None
            fake_aws_apis.uninstall()
        with contextlib.suppress(Exception):
            self._mock.stop()
        self._restore_env()
        if self.root and not self.keep_runs and not self._workdir_arg:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> FakeSageMaker:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def wait(self, name: str | None = None, timeout_s: float = 900.0) -> JobRun | TuningRun | None:
        """Block until the training job or tuning job `name` has ended (default: every job and tuning
        job this fake runs, those started meanwhile too), and return its record (None for all).
        TimeoutError after `timeout_s` seconds, naming what still runs."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                threads = [(n, t) for n, t in self._threads.items() if name is None or n == name]
            if name is not None and not threads:
                raise KeyError(f"fake_sagemaker runs no job or tuning job named {name!r}.")
            alive = [(n, t) for n, t in threads if t.is_alive()]
            if not alive:
                break
            for _, thread in alive:
                thread.join(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline and any(t.is_alive() for _, t in alive):
                raise TimeoutError(f"still running after {timeout_s:g} s: "
                                   f"{', '.join(n for n, t in alive if t.is_alive())}")
        if name is None:
            return None
        found = [r for r in [*self.jobs, *self.tuning_jobs] if r.name == name]
        return found[-1] if found else None

    def quota(self, instance_type: str, spot: bool = False) -> tuple[str, int]:
        """(the quota's Service Quotas name, its value) for `instance_type` training instances."""
        from workshop.cloud.quotas import training_quota

        quota = training_quota(instance_type, spot)
        return quota, int(self.quotas.get(quota, self.instance_quota))

    def _reserve(self, name: str, resource: dict[str, Any], spot: bool) -> str | None:
        """Count job `name`'s instances against the account's quota, as the service does when it
        starts a job; None, or (nothing counted) the service's words for a job over the quota (users'
        reports of CreateTrainingJob's ResourceLimitExceeded)."""
        instance_type, count = resource.get("InstanceType") or "", int(resource.get("InstanceCount") or 0)
        quota, value = self.quota(instance_type, spot)
        with self._lock:
            used = sum(n for q, n in self._in_use.values() if q == quota)
            if used + count > value:
                return (f"The account-level service limit '{quota}' is {value} Instances, with current utilization "
                        f"of {used} Instances and a request delta of {count} Instances. Please contact AWS support "
                        "to request an increase for this limit.")
            self._in_use[name] = (quota, count)
        return None

    def _release(self, name: str) -> None:
        with self._lock:
            self._in_use.pop(name, None)

    def summary(self) -> list[dict[str, Any]]:
        """The jobs run so far, as plain data."""
        return [asdict(job) for job in self.jobs]

    def tuning_summary(self) -> list[dict[str, Any]]:
        """The tuning jobs run so far, with their trials, as plain data."""
        return [asdict(tuning) for tuning in self.tuning_jobs]

    def _setenv(self, key: str, value: str | None) -> None:
        self._saved_env.setdefault(key, os.environ.get(key))
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value

    def _restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()

    # ------------------------------------------------------------------ the hook

    def _install_hook(self) -> None:
        from moto.sagemaker.responses import SageMakerResponse

        original = SageMakerResponse.__dict__["create_training_job"]
        fake = self

        def create_training_job(response: Any) -> Any:
            keys = (
                "TrainingJobName", "HyperParameters", "AlgorithmSpecification", "InputDataConfig",
                "OutputDataConfig", "ResourceConfig", "StoppingCondition", "CheckpointConfig", "Environment",
                "VpcConfig", "EnableNetworkIsolation", "EnableManagedSpotTraining",
            )
            # Copied before moto's backend sees it: moto replaces the MetricDefinitions.
            request = {key: copy.deepcopy(response._get_param(key)) for key in keys}
            # The whole request (moto's parse of it), as the service answers: a ValidationException, nothing recorded.
            validate_training_request(copy.deepcopy(response.params))
            name = request["TrainingJobName"]
            refused = fake._reserve(name, request.get("ResourceConfig") or {},
                                    bool(request.get("EnableManagedSpotTraining")))
            if refused:  # over the account's instance quota, with the jobs already running: nothing recorded
                raise _resource_limit_exceeded(refused)
            try:
                result = original(response)
                job = response.sagemaker_backend.training_jobs[name]
                fake._start_job(job, request, response.region)  # the job runs on; the call returns at once
            except BaseException:
                fake._release(name)
                raise
            return result

        original_tuning = SageMakerResponse.__dict__["create_hyper_parameter_tuning_job"]

        def create_hyper_parameter_tuning_job(response: Any) -> Any:
            keys = ("HyperParameterTuningJobName", "HyperParameterTuningJobConfig", "TrainingJobDefinition",
                    "TrainingJobDefinitions", "WarmStartConfig", "Tags", "Autotune")
            request = {key: copy.deepcopy(response._get_param(key)) for key in keys}
            validate_tuning_request(request)  # ValidationException, as the service answers: nothing recorded
            result = original_tuning(response)
            fake._start_tuning(response.sagemaker_backend, request, response.region)  # returns at once too
            return result

        def list_service_quotas(response: Any) -> str:
            """Service Quotas' ListServiceQuotas (moto lacks it) for SageMaker: the quotas this fake
            enforces, so the workshop's preflight reads what CreateTrainingJob will hold it to."""
            params = json.loads(response.body or "{}")
            if params.get("ServiceCode") != "sagemaker":
                raise NotImplementedError("fake_sagemaker lists SageMaker's training instance quotas only.")
            quotas = fake.service_quotas(response.current_account, response.region)
            start, size = int(params.get("NextToken") or 0), int(params.get("MaxResults") or 100)
            page: dict[str, Any] = {"Quotas": quotas[start : start + size]}
            if start + size < len(quotas):
                page["NextToken"] = str(start + size)
            return json.dumps(page)

        from moto.servicequotas.responses import ServiceQuotasResponse

        for cls, method, handler in (
            (SageMakerResponse, "create_training_job", create_training_job),
            (SageMakerResponse, "create_hyper_parameter_tuning_job", create_hyper_parameter_tuning_job),
            (ServiceQuotasResponse, "list_service_quotas", list_service_quotas),
        ):
            self._original_handlers[(cls, method)] = cls.__dict__.get(method, _MISSING)
            setattr(cls, method, handler)

    def _remove_hook(self) -> None:
        for (cls, method), handler in self._original_handlers.items():
            if handler is _MISSING:
                delattr(cls, method)
            else:
                setattr(cls, method, handler)
        self._original_handlers = {}

    def service_quotas(self, account: str = "123456789012", region: str = REGION) -> list[dict[str, Any]]:
        """Every training instance type's quotas (on demand and spot) as ListServiceQuotas lists them
        (the types: botocore's TrainingInstanceType; the codes: the fake's own, `L-` and 8 hex digits)."""
        import hashlib

        import botocore.session

        model = botocore.session.get_session().get_service_model("sagemaker")
        out = []
        for instance_type in model.shape_for("TrainingInstanceType").enum:
            for spot in (False, True):
                name, value = self.quota(instance_type, spot)
                code = "L-" + hashlib.sha1(name.encode()).hexdigest()[:8].upper()
                out.append({"ServiceCode": "sagemaker", "ServiceName": "Amazon SageMaker", "QuotaCode": code,
                            "QuotaArn": f"arn:aws:servicequotas:{region}:{account}:sagemaker/{code}",
                            "QuotaName": name, "Value": float(value), "Unit": "None", "Adjustable": True,
                            "GlobalQuota": False})
        return out

    def _stop_hook(self, name: str) -> bool | None:
        """fake_aws_apis.on_stop: StopTrainingJob (or StopHyperParameterTuningJob) for a job this fake
        is running. The job says Stopping at once, its hosts get SIGTERM (as SageMaker sends the
        algorithm SIGTERM) and it ends Stopped, its model saved if it wrote one; True tells
        fake_aws_apis the stop is under way."""
        with self._lock:
            event, life = self._stop_requests.get(name), self._lifecycles.get(name)
        if event is None:
            return None  # not running here: fake_aws_apis marks it Stopped
        if life is not None:
            life.stop()
        event.set()
        return True

    # ------------------------------------------------------------------ one job

    def _start_job(self, job: Any, request: dict[str, Any], region: str, *, tuning_job: str | None = None,
                   cores: list[int] | None = None, backend: Any = None) -> tuple[JobRun, threading.Thread]:
        """Start one training job (a CreateTrainingJob, or a tuning job's trial) in a thread of its own:
        moto's job says InProgress (Starting) before this returns; the thread runs it to its end and
        records the outcome on moto's job. Its instances are counted already (`_reserve`); `cores`: the
        cores its hosts may use (a tuning job's slot), else this process's; `backend`: moto's, where a
        trial's job goes once its fields are set (CreateTrainingJob's is there already)."""
        name = request["TrainingJobName"]
        resource = request.get("ResourceConfig") or {}
        run = JobRun(name=name, workdir=str(self.root / name), tuning_job=tuning_job,
                     instance_type=resource.get("InstanceType") or "", started_at=time.time(), cores=list(cores or []))
        life = _Lifecycle(job)
        # Every field the run sets later exists from now on (moto describes a job from its __dict__,
        # which another thread may be reading meanwhile); what moto made up is replaced by what the
        # request said, or by nothing yet.
        job.algorithm_specification["MetricDefinitions"] = copy.deepcopy(
            (request.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
        )
        job.environment = copy.deepcopy(request.get("Environment") or None)
        job.final_metric_data_list = []
        job.failure_reason = None
        job.model_artifacts = None  # until the model is uploaded
        job.training_start_time, job.training_end_time = _now(), None
        job.training_time_in_seconds = job.billable_time_in_seconds = None
        job.tuning_job_arn = getattr(job, "tuning_job_arn", None)
        life.phase("Starting", "Launching the simulated hosts")
        if backend is not None:
            backend.training_jobs[name] = job
        stop = threading.Event()
        thread = threading.Thread(target=self._execute, args=(job, request, region, run, stop, life),
                                  name=f"fake-sagemaker {name}", daemon=True)
        with self._lock:
            self.jobs.append(run)
            self._stop_requests[name], self._lifecycles[name], self._threads[name] = stop, life, thread
        if self._closing.is_set():  # the fake is stopping: the job stops before it starts
            self._stop_hook(name)
        thread.start()
        return run, thread

    def _execute(self, job: Any, request: dict[str, Any], region: str, run: JobRun, stop: threading.Event,
                 life: _Lifecycle) -> None:
        """The job's thread: run it to its end (`_run`) and record the outcome on moto's job."""
        import boto3

        name = run.name
        if run.cores and hasattr(os, "sched_setaffinity"):
            # This thread's cores, which its hosts inherit (the local cluster pins each host to its
            # share of them): trials that run at once do not all land on the first cores.
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, run.cores)
        status, secondary, reason = "Failed", "Failed", None
        t0 = time.monotonic()
        try:
            try:
                if stop.is_set():
                    raise _JobError("")  # stopped before it started: ends Stopped below
                boto = boto3.Session(region_name=region)
                status, secondary, reason = self._run(job, request, run, boto, life, stop)
            except _JobError as exc:
                reason = exc.reason
            except Exception as exc:  # a bug in the fake: say so, as a failed job
                traceback.print_exc()
                reason = f"InternalServerError: fake_sagemaker failed to run the job: {type(exc).__name__}: {exc}"
            if stop.is_set():  # StopTrainingJob: whatever the run made of its SIGTERM
                life.stop()
                status, secondary, reason = "Stopped", "Stopped", None
        finally:
            self._finish(job, run, life, status, secondary, reason, t0)
            with self._lock:
                self._stop_requests.pop(name, None)
                self._lifecycles.pop(name, None)

    def _finish(self, job: Any, run: JobRun, life: _Lifecycle, status: str, secondary: str, reason: str | None,
                t0: float) -> None:
        """What DescribeTrainingJob says of the ended job: its times and outcome first, then its status
        (a caller that sees Completed reads the rest), with its instances given back just before."""
        ended = _now()
        started = job.training_start_time
        job.training_end_time = ended
        job.training_time_in_seconds = max(1, int((ended - started).total_seconds()))
        # BillableTimeInSeconds: on demand, the training time; on spot, the seconds the hosts ran, over
        # every attempt (`_run` measured them), never above the training time (a subinterval of it, on
        # another clock). The spot price's discount is not modelled.
        billable = job.training_time_in_seconds
        if run.spot:
            billable = min(billable, int(sum(a["hosts_s"] for a in run.attempts)))
        job.billable_time_in_seconds = billable
        run.training_time_s, run.billable_time_s = job.training_time_in_seconds, billable
        job.failure_reason = reason[:FAILURE_REASON_MAX] if reason else None
        job.model_artifacts = {"S3ModelArtifacts": run.model_artifact} if run.model_artifact else None
        run.status, run.failure_reason = status, job.failure_reason
        run.wall_time_s = round(time.monotonic() - t0, 1)
        run.ended_at = time.time()
        self._release(run.name)  # the instances are free before the job says it ended
        life.end(status, secondary, reason or f"Training job {status.lower()}")
        _say(f"job {run.name} {status} after {run.wall_time_s:.1f} s" + (f": {reason}" if reason else ""))

    # ------------------------------------------------------------------ one tuning job

    def _start_tuning(self, backend: Any, request: dict[str, Any], region: str) -> TuningRun:
        """Start a (validated) tuning job: moto's tuning job says InProgress before this returns, and a
        thread of its own launches its trials (`_launch_trials`). See the module docstring."""
        name = request["HyperParameterTuningJobName"]
        tuning = backend.hyper_parameter_tuning_jobs[name]
        config, definition = request["HyperParameterTuningJobConfig"], request["TrainingJobDefinition"]
        objective = config["HyperParameterTuningJobObjective"]
        strategy_run, planned = tuning_trial_values(config)
        limits = config["ResourceLimits"]
        record = TuningRun(name=name, strategy=config["Strategy"], strategy_run=strategy_run,
                           objective={"Type": objective["Type"], "MetricName": objective["MetricName"]},
                           max_parallel=int(limits["MaxParallelTrainingJobs"]), planned=planned)
        # The service adds the objective's name to every training job's hyperparameters (the
        # framework toolkits keep it out of the script's arguments).
        static = {k: str(v) for k, v in (definition.get("StaticHyperParameters") or {}).items()}
        static.setdefault("_tuning_objective_metric", objective["MetricName"])
        if tuning.training_job_definition is not None:
            tuning.training_job_definition["StaticHyperParameters"] = dict(static)
        # What moto made up, replaced by what runs.
        tuning.hyper_parameter_tuning_job_status = "InProgress"
        tuning.hyper_parameter_tuning_end_time = None
        tuning.best_training_job = tuning.OverallBestTrainingJob = None
        tuning.tuning_job_completion_details = tuning.consumed_resources = None
        tuning.failure_reason = None
        tuning.launching = True  # StopHyperParameterTuningJob leaves the end to `_launch_trials`
        self._update_tuning(backend, tuning)
        _say(
            f"tuning job {name}: strategy {config['Strategy']}"
            + (f" (chosen here as {strategy_run}: no model of earlier results, no early stopping)"
               if strategy_run != config["Strategy"] else "")
            + f", {len(planned)} training job(s) {planned}, objective: {objective['Type'].lower()} "
            f"{objective['MetricName']}; up to {record.max_parallel} at once (MaxParallelTrainingJobs), each "
            "counted against the account's instance quota"
        )
        thread = threading.Thread(target=self._launch_trials, args=(backend, tuning, record, request, region, static),
                                  name=f"fake-sagemaker {name}", daemon=True)
        with self._lock:
            self.tuning_jobs.append(record)
            self._threads[name] = thread
        thread.start()
        return record

    def _launch_trials(self, backend: Any, tuning: Any, record: TuningRun, request: dict[str, Any], region: str,
                       static: dict[str, str]) -> None:
        """The tuning job's thread: its trials, up to MaxParallelTrainingJobs at once, each a job of its
        own (`_start_job`) whose hosts get one slot's share of this machine's cores; then its outcome.

        A trial whose instances would exceed the account's quota, with the jobs already running, fails
        at once with the service's ResourceLimitExceeded words (what the service does then is not
        documented: the developer guide says only that every concurrent trial's instances count against
        the quotas; a failure is the stricter choice), and its slot is filled again only when a running
        trial ends (or at once when none runs). No trial starts once the tuning job is stopped, its
        MaxRuntimeInSeconds has passed, or 5 have failed without a success (the service gives up then)."""
        from workshop.tuning import core_shares

        name = record.name
        max_runtime = request["HyperParameterTuningJobConfig"]["ResourceLimits"].get("MaxRuntimeInSeconds")
        slots = max(1, min(record.max_parallel, len(record.planned)))
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        shares = core_shares(cpus, slots)
        free = list(range(slots))
        waiting = list(enumerate(record.planned, 1))
        running: dict[str, tuple[int, threading.Thread]] = {}  # trial -> (slot, its thread)
        t0 = time.monotonic()
        said: set[str] = set()

        def may_launch() -> bool:
            if tuning.hyper_parameter_tuning_job_status != "InProgress" or self._closing.is_set():
                return False  # StopHyperParameterTuningJob, or the fake's own stop
            if max_runtime and time.monotonic() - t0 >= max_runtime:
                if "runtime" not in said:
                    said.add("runtime")
                    _say(f"tuning job {name}: its MaxRuntimeInSeconds of {max_runtime} s has passed: no more "
                         "training jobs")
                return False
            # the service gives up after 5 attempts without a success
            return not (len(record.trials) >= 5 and not any(t.status == "Completed" for t in record.trials))

        try:
            while True:
                while waiting and free and may_launch():
                    number, values = waiting.pop(0)
                    slot = free.pop(0)
                    trial, thread = self._launch_trial(backend, tuning, record, request, region, static, number, values,
                                                       list(shares[slot]))
                    if thread is None:  # refused for the quota: the slot waits for a running trial to end
                        continue
                    running[trial] = (slot, thread)
                    record.most_at_once = max(record.most_at_once, len(running))
                    self._update_tuning(backend, tuning)
                if not running:
                    if waiting and may_launch():
                        free = list(range(slots))  # nothing runs to end: try again now
                        continue
                    break
                # until one of the running trials ends
                first = next(iter(running.values()))[1]
                first.join(0.5)
                for trial, (_, thread) in list(running.items()):
                    if not thread.is_alive():
                        del running[trial]
                        free = sorted(set(range(slots)) - {s for s, _ in running.values()})
                        self._update_tuning(backend, tuning)
        finally:
            tuning.launching = False
            self._finish_tuning(backend, tuning, record, t0, stopped=self._closing.is_set())

    def _launch_trial(self, backend: Any, tuning: Any, record: TuningRun, request: dict[str, Any], region: str,
                      static: dict[str, str], number: int, values: dict[str, str],
                      cores: list[int]) -> tuple[str, threading.Thread | None]:
        """One trial: a real training job named `<tuning job>-<NNN>-<8 hex>`, created in moto's backend
        (its fields set before it is there to describe) and started, or failed at once when its instances
        would exceed the quota (no thread then)."""
        import fake_aws_apis
        from moto.sagemaker.models import FakeTrainingJob

        definition = request["TrainingJobDefinition"]
        trial = f"{record.name}-{number:03d}-{uuid.uuid4().hex[:8]}"  # SageMaker's trial names
        hyperparameters = {**static, **values}
        trial_request = {
            "TrainingJobName": trial, "HyperParameters": dict(hyperparameters),
            **{key: copy.deepcopy(definition.get(key)) for key in (
                "AlgorithmSpecification", "InputDataConfig", "OutputDataConfig", "ResourceConfig",
                "StoppingCondition", "CheckpointConfig", "Environment", "VpcConfig", "EnableNetworkIsolation",
                "EnableManagedSpotTraining")},
        }
        job = FakeTrainingJob(
            account_id=backend.account_id, region_name=backend.region_name,
            training_job_name=trial, hyper_parameters=dict(hyperparameters),
            algorithm_specification=copy.deepcopy(definition["AlgorithmSpecification"]), role_arn=definition["RoleArn"],
            input_data_config=copy.deepcopy(definition.get("InputDataConfig")),
            output_data_config=copy.deepcopy(definition["OutputDataConfig"]),
            resource_config=copy.deepcopy(definition["ResourceConfig"]),
            vpc_config=copy.deepcopy(definition.get("VpcConfig")),
            stopping_condition=copy.deepcopy(definition.get("StoppingCondition")),
            tags=copy.deepcopy(request.get("Tags")) or [],  # the tuning job's tags go to its training jobs
            enable_network_isolation=bool(definition.get("EnableNetworkIsolation")),
            enable_inter_container_traffic_encryption=bool(definition.get("EnableInterContainerTrafficEncryption")),
            enable_managed_spot_training=bool(definition.get("EnableManagedSpotTraining")),
            checkpoint_config=copy.deepcopy(definition.get("CheckpointConfig")),
            debug_hook_config=None, debug_rule_configurations=None, tensor_board_output_config=None,
            experiment_config=None,
        )
        fake_aws_apis.link_trial(job, tuning)
        refused = self._reserve(trial, definition["ResourceConfig"], bool(definition.get("EnableManagedSpotTraining")))
        if refused:
            reason = f"ResourceLimitExceeded: {refused}"
            run = JobRun(name=trial, status="Failed", failure_reason=reason, tuning_job=record.name,
                         instance_type=definition["ResourceConfig"].get("InstanceType") or "", started_at=time.time(),
                         ended_at=time.time(),
                         hyperparameters={k: safe_deserialize(v) for k, v in hyperparameters.items()})
            job.algorithm_specification["MetricDefinitions"] = copy.deepcopy(
                definition["AlgorithmSpecification"].get("MetricDefinitions") or [])
            job.final_metric_data_list, job.model_artifacts, job.failure_reason = [], None, reason
            job.training_start_time = job.training_end_time = _now()
            life = _Lifecycle(job)
            life.end("Failed", "Failed", reason)
            backend.training_jobs[trial] = job
            with self._lock:
                self.jobs.append(run)
                record.trials.append(run)
            _say(f"tuning job {record.name}: training job {trial} failed: {reason}")
            self._update_tuning(backend, tuning)
            return trial, None
        try:
            run, thread = self._start_job(job, trial_request, region, tuning_job=record.name, cores=cores,
                                          backend=backend)
        except BaseException:
            self._release(trial)
            raise
        with self._lock:
            record.trials.append(run)
        return trial, thread

    @staticmethod
    def _update_tuning(backend: Any, tuning: Any) -> list[dict[str, Any]]:
        """The tuning job's counters and best training job, from its training jobs as they are now."""
        import fake_aws_apis

        summaries = [fake_aws_apis.trial_summary(t, tuning) for t in fake_aws_apis.tuning_trials(backend, tuning)]
        statuses = [s["TrainingJobStatus"] for s in summaries]
        internal = [s for s in summaries if s["TrainingJobStatus"] == "Failed"
                    and str(s.get("FailureReason", "")).startswith("InternalServerError")]
        tuning.training_job_status_counters = {
            "Completed": statuses.count("Completed"),
            "InProgress": statuses.count("InProgress") + statuses.count("Stopping"),
            "RetryableError": len(internal),  # a failure of the service (here: of the fake), not of the job
            "NonRetryableError": statuses.count("Failed") - len(internal),
            "Stopped": statuses.count("Stopped"),
        }
        objectives = [s["ObjectiveStatus"] for s in summaries]
        tuning.objective_status_counters = {k: objectives.count(k) for k in ("Succeeded", "Pending", "Failed")}
        scored = [s for s in summaries if s["ObjectiveStatus"] == "Succeeded"]
        maximize = (tuning.hyper_parameter_tuning_job_config["HyperParameterTuningJobObjective"]["Type"] == "Maximize")
        best = None
        for summary in scored:  # the first of equals wins
            value = summary["FinalHyperParameterTuningJobObjectiveMetric"]["Value"]
            if best is None or (value > best[0] if maximize else value < best[0]):
                best = (value, summary)
        tuning.best_training_job = best[1] if best else None
        tuning.last_modified_time = _now()
        return summaries

    def _finish_tuning(self, backend: Any, tuning: Any, record: TuningRun, t0: float, *, stopped: bool) -> None:
        summaries = self._update_tuning(backend, tuning)
        ended = _now()
        reason = None
        if stopped or tuning.hyper_parameter_tuning_job_status in ("Stopping", "Stopped"):
            status = "Stopped"
        elif summaries and all(s["TrainingJobStatus"] == "Failed" for s in summaries):
            status = "Failed"  # the service's words
            reason = (f"No training job succeeded after {len(summaries)} attempts. Please take a look at the "
                      "training job failures to get more details.")
        elif not any(s["ObjectiveStatus"] == "Succeeded" for s in summaries):
            status = "Failed"
            reason = (f"No objective metrics found after running {len(summaries)} training jobs. Please ensure that "
                      "the custom algorithm is emitting the objective metric as defined by the regular expression provided.")
        else:
            status = "Completed"
        tuning.hyper_parameter_tuning_job_status = status
        tuning.failure_reason = reason
        tuning.hyper_parameter_tuning_end_time = tuning.last_modified_time = ended
        record.wall_time_s = round(time.monotonic() - t0, 1)
        tuning.consumed_resources = {"RuntimeInSeconds": int(round(time.monotonic() - t0))}
        record.status, record.failure_reason = status, reason
        best = tuning.best_training_job
        record.best_training_job = best["TrainingJobName"] if best else None
        _say(f"tuning job {record.name} {status} after {record.wall_time_s:.1f} s, {len(summaries)} training job(s)"
             + (f"; best: {best['TrainingJobName']} {best['TunedHyperParameters']} "
                f"{best['FinalHyperParameterTuningJobObjectiveMetric']['MetricName']}="
                f"{best['FinalHyperParameterTuningJobObjectiveMetric']['Value']:g}" if best else "")
             + (f": {reason}" if reason else ""))

    def _run(self, job: Any, request: dict[str, Any], run: JobRun, boto: Any, life: _Lifecycle,
             stop: threading.Event) -> tuple[str, str, str | None]:
        name = run.name
        workdir = Path(run.workdir)
        if workdir.exists():
            shutil.rmtree(workdir)
        s3 = boto.client("s3")

        # --- what the job asks for, and what the fake cannot do
        resource = request.get("ResourceConfig") or {}
        if resource.get("InstanceGroups") or not resource.get("InstanceCount"):
            raise _JobError("ClientError: fake_sagemaker simulates homogeneous clusters only (InstanceCount).")
        hosts = int(resource["InstanceCount"])
        channels = {}
        for channel in request.get("InputDataConfig") or []:
            source = (channel.get("DataSource") or {}).get("S3DataSource")
            channel_name = channel["ChannelName"]
            if source is None:
                raise _JobError(f"ClientError: channel {channel_name!r}: only S3 data sources are simulated.")
            unsupported = [
                what
                for what, ok in (
                    (f"S3DataType {source.get('S3DataType')}", source.get("S3DataType", "S3Prefix") == "S3Prefix"),
                    (f"InputMode {channel.get('InputMode')}", channel.get("InputMode", "File") in ("File", "FastFile")),
                    (
                        f"S3DataDistributionType {source.get('S3DataDistributionType')}",
                        source.get("S3DataDistributionType", "FullyReplicated") == "FullyReplicated",
                    ),
                    (f"CompressionType {channel.get('CompressionType')}", channel.get("CompressionType", "None") == "None"),
                )
                if not ok
            ]
            if unsupported:
                raise _JobError(f"ClientError: channel {channel_name!r}: fake_sagemaker does not simulate {', '.join(unsupported)}.")
            channels[channel_name] = source["S3Uri"]
        spec = request.get("AlgorithmSpecification") or {}
        command = list(spec.get("ContainerEntrypoint") or []) + list(spec.get("ContainerArguments") or [])
        toolkit = not command and "sagemaker_program" in (request.get("HyperParameters") or {})
        if toolkit:
            if "code" in channels:
                raise _JobError("ClientError: fake_sagemaker does not simulate a `code` input channel in a job that "
                                "runs the framework toolkit (sagemaker_program): the toolkit's code comes from "
                                "sagemaker_submit_directory, at /opt/ml/code.")
        elif not command:
            raise _JobError("ClientError: the request sets no ContainerEntrypoint and no sagemaker_program "
                            "hyperparameter: fake_sagemaker runs SDK v3 `source_code` jobs (whose entrypoint runs "
                            "sm_train.sh) and the framework images' toolkit (sagemaker_program), not bare training images.")
        else:
            for reserved in RESERVED_CHANNELS:
                if reserved not in channels:
                    raise _JobError(
                        f"ClientError: no {reserved!r} channel: fake_sagemaker runs SDK v3 `source_code` jobs "
                        "(the code and sm_drivers channels), not bare training images."
                    )

        # --- managed spot training: the job's time limits, and how many times it is interrupted
        spot = bool(request.get("EnableManagedSpotTraining"))
        stopping = request.get("StoppingCondition") or {}
        max_run = stopping.get("MaxRuntimeInSeconds")
        max_wait = stopping.get("MaxWaitTimeInSeconds") if spot else None
        checkpoint = request.get("CheckpointConfig") or {}
        planned = self.spot_interruptions if spot else 0
        run.spot = spot
        if spot:
            _say(f"job {name}: managed spot training, MaxWaitTimeInSeconds {max_wait}; the fake interrupts it "
                 f"{planned} time(s), each once its hosts have written a checkpoint (or after "
                 f"{self.spot_checkpoint_wait_s:g} s of training without one)"
                 + ("" if checkpoint.get("S3Uri") else "; it has no CheckpointConfig, so each attempt starts afresh"))

        # --- the attempts: one, or on spot one more after each interruption
        t_job = time.monotonic()
        ordered: list[str] = []
        used_s = 0.0  # seconds the hosts ran, every attempt
        attempt: _Attempt | None = None
        # "run" or "wait": the limit that ended the job before another attempt could start ("stop": StopTrainingJob did)
        out_of_time = None
        while True:
            number = len(run.attempts) + 1
            run_left = max_run - used_s if max_run else None
            wait_left = max_wait - (time.monotonic() - t_job) if max_wait else None
            limits = [x for x in (run_left, wait_left) if x is not None]
            timeout = min(limits) if limits else None
            binding = "wait" if wait_left is not None and (run_left is None or wait_left < run_left) else "run"
            if number > 1:
                if timeout is not None and timeout <= 0:
                    out_of_time = binding
                    break
                life.phase("Starting", "Launching the simulated hosts again, after the spot interruption")
            reclaim_after = self.spot_checkpoint_wait_s if run.interruptions < planned else None
            attempt = self._attempt(number, workdir if number == 1 else workdir / f"attempt-{number}", request, run,
                                    boto, life, stop, hosts=hosts, channels=channels, command=command,
                                    toolkit=toolkit, timeout_s=timeout, reclaim_after_s=reclaim_after)
            ordered += attempt.lines
            used_s += attempt.result.wall_time_s
            if not attempt.interrupted:
                attempt.timed_out = attempt.timed_out and binding
                break
            # Interrupted: what the hosts had synced to S3 is there for the next attempt (the real sync is
            # continuous; here the folder is uploaded whole once the hosts are gone).
            run.interruptions += 1
            if attempt.checkpoint_dir is not None and attempt.checkpoint_dir.is_dir():
                _sync_checkpoints(s3, attempt, checkpoint["S3Uri"])
            life.phase("Interrupted", f"Training job interrupted: its spot instances were reclaimed (fake_sagemaker, "
                                      f"interruption {run.interruptions} of {planned}: {attempt.record['reclaimed']})")
            # Waiting for spot capacity (the fake's stand-in: a fixed wait, within what is left of
            # MaxWaitTimeInSeconds); StopTrainingJob ends the wait, and the job.
            restart_wait = self.spot_restart_wait_s
            if max_wait:
                restart_wait = max(0.0, min(restart_wait, max_wait - (time.monotonic() - t_job)))
            _say(f"job {name}: attempt {number} interrupted after {attempt.result.wall_time_s:.1f} s "
                 f"({attempt.record['reclaimed']}); "
                 + (f"its checkpoint folder ({', '.join(attempt.record['checkpoint_files']) or 'empty'}) is in "
                    f"{checkpoint['S3Uri']}; " if checkpoint.get("S3Uri") else "no CheckpointConfig: nothing is kept; ")
                 + f"waiting {restart_wait:g} s for spot capacity, then starting it again on new hosts")
            if stop.wait(restart_wait):
                out_of_time = "stop"  # StopTrainingJob while it waited: `_execute` ends the job Stopped
                break
        assert attempt is not None  # the first attempt always runs
        result, checkpoint_dir = attempt.result, attempt.checkpoint_dir
        if out_of_time in ("run", "wait"):
            _say(f"job {name}: its Max{'WaitTime' if out_of_time == 'wait' else 'Runtime'}InSeconds has passed: "
                 "no attempt starts after the interruption")

        # --- metrics: the last value each MetricDefinitions regex matched (every attempt's logs, in order)
        ended = _now()
        final = []
        for definition in (request.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []:
            value = None
            pattern = re.compile(definition["Regex"])
            for text in ordered:
                match = pattern.search(text)
                if match:
                    with contextlib.suppress(ValueError, IndexError, TypeError):
                        number = float(match.group(1))
                        if number == number and abs(number) != float("inf"):
                            value = number
            if value is not None:
                final.append({"MetricName": definition["Name"], "Value": value, "Timestamp": ended})
                run.final_metrics[definition["Name"]] = value
        job.final_metric_data_list = final

        if out_of_time == "stop":  # the hosts were gone already: nothing to upload, no model
            return "Stopped", "Stopped", None
        if out_of_time:
            life.stop()
            if out_of_time == "wait":
                return "Stopped", "MaxWaitTimeExceeded", f"Training job reached its MaxWaitTimeInSeconds of {max_wait} s."
            return "Stopped", "MaxRuntimeExceeded", f"Training job reached its MaxRuntimeInSeconds of {max_run} s."

        # --- checkpoints and the model out
        timed_out = attempt.timed_out
        if timed_out == "wait":  # the developer guide's spot lifecycle: Training, then Stopping, MaxWaitTimeExceeded
            life.stop()
        else:
            life.phase("Uploading", "Uploading generated training model")
        if checkpoint_dir is not None and checkpoint_dir.is_dir():
            _sync_checkpoints(s3, attempt, checkpoint["S3Uri"])
        # SageMaker saves the model of a job stopped at max runtime, or by StopTrainingJob, too: every
        # host's /opt/ml/model in one model.tar.gz, every host's /opt/ml/output/data in output.tar.gz
        if result.ok or timed_out or stop.is_set():
            # where moto reports it, and SageMaker puts it: <S3OutputPath>/<job>/output/model.tar.gz
            artifact = os.path.join(request["OutputDataConfig"]["S3OutputPath"], name, "output", "model.tar.gz")
            bucket, key = _split_s3(artifact)
            s3.put_object(Bucket=bucket, Key=key, Body=_tar_gz(*(h.model_dir for h in result.hosts)))
            run.model_artifact = artifact
            output = artifact.rsplit("/", 1)[0] + "/output.tar.gz"
            bucket, key = _split_s3(output)
            s3.put_object(Bucket=bucket, Key=key, Body=_tar_gz(*(h.output_data_dir for h in result.hosts)))
            run.output_artifact = output
        if result.ok:
            return "Completed", "Completed", None
        if timed_out == "wait":
            return "Stopped", "MaxWaitTimeExceeded", f"Training job reached its MaxWaitTimeInSeconds of {max_wait} s."
        if timed_out:
            return "Stopped", "MaxRuntimeExceeded", f"Training job reached its MaxRuntimeInSeconds of {max_run} s."
        return "Failed", "Failed", "AlgorithmError: " + _failure_text(result)

    def _attempt(self, number: int, adir: Path, request: dict[str, Any], run: JobRun, boto: Any, life: _Lifecycle,
                 stop: threading.Event, *, hosts: int, channels: dict[str, str], command: list[str], toolkit: bool,
                 timeout_s: float | None, reclaim_after_s: float | None) -> _Attempt:
        """One attempt at the job, on hosts of its own in `adir` (the job's folder for the first; on spot,
        `attempt-N` for the next ones): the input channels and the checkpoints from S3, the hosts' run,
        their logs to CloudWatch (streams of its own). With `reclaim_after_s`, the spot watcher
        interrupts it once a checkpoint appears, or after that many seconds of training without one."""
        from workshop.runtime.contract import host_names
        from workshop.runtime.local_cluster import LocalCluster, choose_runtime

        name = run.name
        s3 = boto.client("s3")
        spec = request.get("AlgorithmSpecification") or {}
        resource = request.get("ResourceConfig") or {}

        # --- S3 in
        life.phase("Downloading", "Downloading input data")
        input_dir = adir / "input"
        local_channels: dict[str, Path] = {}
        for channel_name, uri in channels.items():
            dest = input_dir / channel_name
            if _download_prefix(s3, uri, dest) == 0:
                raise _JobError(f"ClientError: Data download failed: no objects under {uri} (channel {channel_name!r}).")
            local_channels[channel_name] = dest
        if toolkit:
            launch = self._toolkit_launch(request, local_channels, adir, s3, boto.region_name)
        else:
            launch = self._sm_train_launch(request, local_channels, command)
        environment = dict(request.get("Environment") or {})
        internet, network = self._internet_route(request, boto)
        container = choose_runtime(launch.runtime)[0] == "container"  # the choice the cluster below makes
        # Paths into /opt/ml are right inside the container runtime; the process runtime has no
        # /opt/ml and sets those variables to each host's sandbox itself.
        dropped = [] if container else sorted(k for k, v in environment.items() if str(v).startswith(CONTAINER_ROOT))
        extra_env = {k: str(v) for k, v in environment.items() if k not in dropped}
        extra_env["TRAINING_JOB_NAME"] = name  # SageMaker's value, not the local cluster's run name
        # What marks this attempt's processes for StopTrainingJob and the spot reclaim: job names are the
        # SDK's base name and a timestamp to the second, so another fake (another test process) can run a
        # job of the same name on this machine at the same time.
        extra_env[ATTEMPT_ENV] = uuid.uuid4().hex
        checkpoint = request.get("CheckpointConfig") or {}
        checkpoint_dir, downloaded = None, []
        if checkpoint.get("S3Uri"):
            checkpoint_dir = adir / "checkpoints-s3"
            checkpoint_dir.mkdir(parents=True, exist_ok=True)
            _download_prefix(s3, checkpoint["S3Uri"], checkpoint_dir)
            downloaded = _files(checkpoint_dir)
        run.hosts, run.procs_per_host = hosts, launch.procs
        run.hyperparameters = {k: safe_deserialize(v) for k, v in (request.get("HyperParameters") or {}).items()}
        run.driver, run.launch = launch.driver, launch.kind
        run.network = network
        run.image_framework = image_framework_note(spec.get("TrainingImage") or "")

        # --- the run
        life.phase("Training", "Training in progress (local cluster)" + (f", attempt {number}" if number > 1 else ""))
        _say(
            f"job {name}" + (f" attempt {number}" if number > 1 else "")
            + f": {hosts} simulated host(s) x {launch.procs} process(es), {launch.described}, "
            f"hyperparameters {json.dumps(run.hyperparameters)}, channels {sorted(local_channels)}"
            + f"; network: {network}; hosts start up to {self.start_skew_s:g} s apart; {run.image_framework}"
            + (f"; not passed (container paths): {', '.join(dropped)}" if dropped else "")
            + (f"; checkpoints from S3: {', '.join(_files(checkpoint_dir)) or 'none'}" if number > 1 and checkpoint_dir else "")
        )
        if stop.is_set():
            raise _JobError("")  # StopTrainingJob came first: nothing starts
        previous = [int(s.rsplit("-", 1)[1]) for a in run.attempts for s in a["log_streams"]]
        start_epoch = max([int(time.time())] + [p + 1 for p in previous])  # each attempt's streams are new ones
        reclaim, found = threading.Event(), {}
        tail = _CloudWatchTail(boto, name, start_epoch, (adir / "hosts").resolve() / "logs" / "cluster.log",
                               host_names(hosts))
        try:
            cluster = LocalCluster(
                launch.source_dir, launch.entry_script, hosts=hosts, procs_per_host=launch.procs,
                distributed=launch.distributed, name=name, workdir=adir / "hosts", extra_env=extra_env, echo=False,
                internet=internet, start_skew_s=self.start_skew_s if hosts > 1 else 0.0,
                sm_drivers_dir=launch.sm_drivers_dir, container_command=launch.command,
                instance_type=resource.get("InstanceType"), runtime=launch.runtime, prepare_host=launch.prepare_host,
            )
            done = threading.Event()
            watchers = [threading.Thread(target=_stop_when_asked, args=(extra_env[ATTEMPT_ENV], (stop, reclaim), done),
                                        daemon=True),
                        threading.Thread(target=tail.follow, args=(done,), daemon=True)]
            if reclaim_after_s is not None:
                watchers.append(threading.Thread(
                    target=_reclaim_when_checkpointed, daemon=True,
                    args=(name, checkpoint_dir, _checkpoint_state(checkpoint_dir), reclaim_after_s, reclaim, done, found)))
            for watcher in watchers:
                watcher.start()
            try:
                result = cluster.run(
                    launch.hyperparameters, local_channels, checkpoint_dir=checkpoint_dir,
                    timeout_s=float(timeout_s) if timeout_s else None, check=False,
                )
            finally:
                done.set()
                for watcher in watchers:
                    watcher.join()
        except Exception as exc:  # WorkshopError: e.g. no such entry script in the code channel
            raise _JobError(f"AlgorithmError: {exc}") from None
        run.runtime = result.runtime

        # --- logs out, as SageMaker shows them: one stream per host (per attempt), no local prefixes; all
        # but the last lines went while the hosts ran
        streams = tail.finish(result.lines)
        ordered = tail.ordered
        for host, lines in tail.per_host.items():
            run.log_lines[host] = run.log_lines.get(host, 0) + len(lines)

        timed_out = result.returncode == 124 and bool(timeout_s) and "time limit" in (result.failure or "")
        interrupted = reclaim.is_set() and not result.ok and not stop.is_set() and not timed_out
        if result.ok:
            outcome = "completed"
        elif interrupted:
            outcome = "interrupted"
        elif stop.is_set():
            outcome = "stopped"
        else:
            outcome = "timed out" if timed_out else "failed"
        record: dict[str, Any] = {"attempt": number, "hosts_s": round(result.wall_time_s, 3), "outcome": outcome}
        if run.spot:
            if reclaim.is_set():
                record["reclaimed"] = found.get("why", "")
                if not interrupted:
                    record["reclaimed"] += " (too late: the attempt had ended)" if result.ok else " (the attempt ended otherwise)"
            else:
                record["reclaimed"] = "not interrupted" if reclaim_after_s is None else "not interrupted: it ended first"
        record["checkpoint_files"] = _files(checkpoint_dir)
        record["log_streams"] = streams
        run.attempts.append(record)
        return _Attempt(result=result, checkpoint_dir=checkpoint_dir, lines=ordered, record=record,
                        interrupted=interrupted, timed_out=timed_out, downloaded=downloaded)

    @staticmethod
    def _sm_train_launch(request: dict[str, Any], local_channels: dict[str, Path], command: list[str]) -> _Launch:
        """SDK v3 `source_code` jobs: the request's entrypoint runs the uploaded sm_train.sh, which runs
        the uploaded driver on the code channel."""
        drivers_dir, code_dir = local_channels.pop("sm_drivers"), local_channels.pop("code")
        sm_train = _read_text(drivers_dir / "sm_train.sh")
        source_code = json.loads(_read_text(drivers_dir / "sourcecode.json") or "{}") or {}
        distributed_json = json.loads(_read_text(drivers_dir / "distributed.json") or "{}") or {}
        if not sm_train:
            raise _JobError("ClientError: the sm_drivers channel has no sm_train.sh.")
        if source_code.get("command") or "SAGEMAKER_BASE_COMMAND_EOF" in sm_train:
            raise _JobError("ClientError: fake_sagemaker does not run SourceCode.command jobs, only entry scripts.")
        for archive in re.findall(r"^tar -xzf (\S+)", sm_train, re.MULTILINE):  # a .tar.gz source_dir
            _extract_tar_gz(code_dir / archive, code_dir)
        drivers = re.findall(rf"^\$SM_PYTHON_CMD {re.escape(DRIVERS_IN_CONTAINER)}(distributed_drivers/\S+\.py)\s*$", sm_train, re.MULTILINE)
        if len(drivers) != 1:
            raise _JobError(f"ClientError: cannot tell which driver sm_train.sh runs (found {drivers}).")
        driver = drivers_dir / drivers[0]
        label = re.search(r'^echo "Running (.+) Driver"', sm_train, re.MULTILINE)
        entry_script = source_code.get("entry_script")
        if not entry_script:
            raise _JobError("ClientError: sourcecode.json names no entry_script.")
        if distributed_json:
            distributed = _UploadedDriver(
                name=label.group(1) if label else driver.stem,
                driver_dir=str(driver.parent),
                driver_script=driver.name,
                config=distributed_json,
            )
            # null: one process per GPU on SageMaker; the simulated hosts have none.
            procs = int(distributed_json.get("process_count_per_node") or 1)
        else:
            distributed, procs = None, 1  # the basic script driver (LocalCluster's own copy of it)
        hyperparameters = {k: safe_deserialize(v) for k, v in (request.get("HyperParameters") or {}).items()}
        return _Launch(
            kind="sm_train.sh", source_dir=code_dir, entry_script=entry_script, procs=procs, distributed=distributed,
            sm_drivers_dir=drivers_dir, command=command, hyperparameters=hyperparameters, runtime="auto",
            driver=str(Path(drivers[0])),
            described=(f"{distributed.name + ' driver' if distributed else 'basic script driver'} ({drivers[0]}) "
                       f"from the uploaded sm_drivers, {entry_script} from the uploaded code"),
        )

    @staticmethod
    def _toolkit_launch(request: dict[str, Any], local_channels: dict[str, Path], workdir: Path, s3: Any,
                        region: str) -> _Launch:
        """No ContainerEntrypoint but `sagemaker_program`: what a SageMaker framework image runs then,
        its `sagemaker-training` toolkit (`toolkit_main`, on every host), with the code from
        `sagemaker_submit_directory` at /opt/ml/code."""
        from workshop.runtime.local_cluster import choose_runtime

        runtime, why = choose_runtime("auto")
        if runtime != "container":
            raise _JobError(
                "ClientError: this job has no ContainerEntrypoint, so its image's framework toolkit would run "
                "its sagemaker_program; fake_sagemaker emulates that toolkit only on the local cluster's container "
                f"runtime (each host with its own /opt/ml), which cannot run here: {why}."
            )
        spec = request.get("AlgorithmSpecification") or {}
        image = spec.get("TrainingImage") or ""
        framework, module = _toolkit_of(image)
        raw = {k: str(v) for k, v in (request.get("HyperParameters") or {}).items()}
        hps = {k: safe_deserialize(v) for k, v in raw.items()}
        enabled = [k for k in TOOLKIT_DISTRIBUTION_HYPERPARAMETERS if hps.get(k)]
        if enabled:
            raise _JobError("ClientError: fake_sagemaker emulates the toolkit's plain-script path only (one "
                            f"`python <program>` per host), not its distributed runners ({', '.join(enabled)}).")
        program = str(hps["sagemaker_program"])
        submit = hps.get("sagemaker_submit_directory")
        if not submit:
            raise _JobError("ClientError: no sagemaker_submit_directory: the toolkit would run the program from the "
                            "image's own /opt/ml/code, and fake_sagemaker never pulls the image.")
        submit = str(submit)
        if not submit.startswith("s3://"):
            raise _JobError(f"ClientError: sagemaker_submit_directory {submit!r} is not an S3 URI: fake_sagemaker "
                            "does not simulate code already in the image.")
        code_dir, tarball = workdir / "sourcedir", workdir / "sourcedir.tar.gz"
        bucket, key = _split_s3(submit)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            tarball.write_bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            _extract_tar_gz(tarball, code_dir)
        except Exception as exc:  # noqa: BLE001 - what the toolkit reports: a framework error, the job fails
            raise _JobError(f"AlgorithmError: Framework Error: cannot download and extract {submit}: {exc}") from None
        if (code_dir / "setup.py").exists():
            raise _JobError("ClientError: the source has a setup.py, which the toolkit installs as a Python package "
                            "and runs with `python -m`: fake_sagemaker does not simulate that.")
        if not (code_dir / program).is_file():
            raise _JobError(f"AlgorithmError: ExecuteUserScriptError: the sagemaker_program {program!r} is not in "
                            f"{submit}, so python finds no /opt/ml/code/{program}.")
        input_data_config = {}
        for channel in request.get("InputDataConfig") or []:
            source = channel["DataSource"]["S3DataSource"]
            entry = {"TrainingInputMode": channel.get("InputMode") or spec.get("TrainingInputMode") or "File",
                     "S3DistributionType": source.get("S3DataDistributionType") or "FullyReplicated",
                     "RecordWrapperType": channel.get("RecordWrapperType") or "None"}
            if channel.get("ContentType"):
                entry["ContentType"] = channel["ContentType"]
            input_data_config[channel["ChannelName"]] = entry
        environment = request.get("Environment") or {}
        config = {
            "framework": framework, "framework_module": module, "region": region,
            # What the local cluster's containers carry that the image's would not (unless the job sets it).
            "unset": [k for k in ("SM_CHECKPOINT_DIR", "PET_TEE") if k not in environment],
            "hide_path": str(_TESTS_DIR),
        }
        sm_drivers_channel = "sm_drivers" in local_channels
        boot = (f"import sys; sys.path.insert(0, {str(_TESTS_DIR)!r}); import fake_sagemaker; "
                "sys.exit(fake_sagemaker.toolkit_main(sys.argv[1:]))")
        return _Launch(
            kind="toolkit", source_dir=code_dir, entry_script=program, procs=1, distributed=None,
            sm_drivers_dir=local_channels.pop("sm_drivers", None), command=[sys.executable, "-c", boot, json.dumps(config)],
            hyperparameters=raw, runtime="container",
            driver=f"sagemaker-training toolkit ({module}): python {program}",
            described=(f"the image's framework toolkit ({module}, no ContainerEntrypoint): `python {program}` once per "
                       f"host from {submit} at /opt/ml/code, no launcher"),
            prepare_host=lambda sandbox: toolkit_layout(sandbox.root, input_data_config, sm_drivers_channel),
        )

    @staticmethod
    def _internet_route(request: dict[str, Any], boto: Any) -> tuple[bool, str]:
        """Whether the job's hosts can reach the internet, as SageMaker decides it: not with network
        isolation; in a VPC only through a 0.0.0.0/0 route (NAT or internet gateway) in the route
        table of its subnets (explicitly associated, else the VPC's main table); without a VPC, yes."""
        if request.get("EnableNetworkIsolation"):
            return False, "none (network isolation)"
        subnets = (request.get("VpcConfig") or {}).get("Subnets") or []
        if not subnets:
            return True, "internet (no VPC)"
        ec2 = boto.client("ec2")
        routed = []
        for subnet_id in subnets:
            tables = ec2.describe_route_tables(Filters=[{"Name": "association.subnet-id", "Values": [subnet_id]}])["RouteTables"]
            if not tables:
                vpc_id = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"][0]["VpcId"]
                tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc_id]},
                                                            {"Name": "association.main", "Values": ["true"]}])["RouteTables"]
            routes = [r for t in tables for r in t.get("Routes", []) if r.get("DestinationCidrBlock") == "0.0.0.0/0"
                      and (r.get("NatGatewayId") or str(r.get("GatewayId", "")).startswith("igw-"))]
            routed.append(bool(routes))
        if all(routed):
            return True, f"internet (VPC subnets {', '.join(subnets)} route 0.0.0.0/0 out)"
        return False, f"only the job's hosts (VPC subnets {', '.join(subnets)} have no route to the internet)"


# ---------------------------------------------------------------------- helpers

# Image repositories -> the framework they carry (the tag's first field is its version).
_IMAGE_FRAMEWORKS = {
    "pytorch-training": "torch", "pytorch": "torch", "smdistributed-modelparallel": "torch",
    "tensorflow-training": "tensorflow",
}


def image_framework_note(image_uri: str) -> str:
    """Whether the job's image carries the framework version this environment runs it with.

    `...pytorch-training:2.9-gpu-py312` -> torch 2.9 in the image; compared with the installed
    torch (major.minor). A job whose image carries another version runs here with this one, so
    what it proves about that image is limited: the note says so."""
    match = re.search(r"/([a-z0-9-]+):(\d+\.\d+)(?:\.\d+)?-", image_uri)
    if not match or match.group(1) not in _IMAGE_FRAMEWORKS:
        return f"image {image_uri or '(none)'}: its framework is not known to the fake; not compared"
    module = _IMAGE_FRAMEWORKS[match.group(1)]
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            here = version(module)  # the distribution: torch or tensorflow
        except PackageNotFoundError:
            here = version(f"{module}-cpu")  # requirements.txt installs tensorflow-cpu: the same module
    except Exception:  # noqa: BLE001
        return f"{module} {match.group(2)} in the image; not installed here"
    same = ".".join(here.split("+")[0].split(".")[:2]) == match.group(2)
    verdict = "the same" if same else "NOT the same: what this job shows about that image is not verified here"
    return f"{module} {match.group(2)} in the image, {here} here: {verdict}"


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def _download_prefix(s3: Any, uri: str, dest: Path) -> int:
    """Every object under `uri` (an S3 key prefix) into `dest`, keeping the paths below the
    prefix, as SageMaker fills `/opt/ml/input/data/<channel>`. Returns the number of files."""
    bucket, prefix = _split_s3(uri)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    count = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            key = obj["Key"]
            if key.endswith("/"):
                continue  # a "folder" marker
            relative = key[len(prefix) :].lstrip("/") or key.rsplit("/", 1)[-1]
            target = (root / relative).resolve()
            if root not in target.parents:
                raise _JobError(f"ClientError: S3 key {key!r} would land outside its channel folder.")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            count += 1
    return count


def _upload_dir(s3: Any, folder: Path, uri: str) -> None:
    bucket, prefix = _split_s3(uri)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        key = "/".join(part for part in (prefix.rstrip("/"), path.relative_to(folder).as_posix()) if part)
        s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


def _sync_checkpoints(s3: Any, attempt: _Attempt, uri: str) -> None:
    """What the attempt's hosts left in S3 once they are gone: the local cluster has synced each host's
    checkpoint folder with `attempt.checkpoint_dir` as SageMaker syncs it with `uri` (what a host wrote or
    changed, the last writer's copy, and what it deleted: `workshop.runtime.checkpoint_sync`); that folder
    goes to `uri`, and the keys the attempt downloaded and its hosts deleted are deleted. (The real sync is
    continuous; here it reaches S3 once the hosts are gone.)"""
    _upload_dir(s3, attempt.checkpoint_dir, uri)
    bucket, prefix = _split_s3(uri)
    for relative in sorted(set(attempt.downloaded) - set(_files(attempt.checkpoint_dir))):
        s3.delete_object(Bucket=bucket, Key="/".join(part for part in (prefix.rstrip("/"), relative) if part))


def _tar_gz(*folders: Path) -> bytes:
    """`model.tar.gz` (or `output.tar.gz`) of the hosts' folders' contents, member names relative to
    each: SageMaker aggregates every host's folder into one archive. Hosts should not write the same
    name; where two do, the first host's file is the one archived (the service documents no order)."""
    buffer = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for folder in folders:
            if not folder.is_dir():
                continue
            for path in sorted(folder.rglob("*")):
                name = path.relative_to(folder).as_posix()
                if name in seen:
                    continue
                seen.add(name)
                tar.add(path, arcname=name, recursive=False)
    return buffer.getvalue()


def _extract_tar_gz(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:gz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)


def _toolkit_of(image_uri: str) -> tuple[str, str]:
    """(framework, SAGEMAKER_TRAINING_MODULE) of a SageMaker framework training image, whose
    entrypoint runs the `sagemaker-training` toolkit; a job on any other image is refused."""
    match = re.search(r"/([a-z0-9-]+):([^/]+)$", image_uri)
    known = TOOLKIT_IMAGES.get(match.group(1)) if match else None
    if known is None or "-ec2" in match.group(2):
        raise _JobError(
            f"ClientError: the image {image_uri or '(none)'} is not one of SageMaker's PyTorch or TensorFlow training "
            "images, whose framework toolkit runs sagemaker_program when the job has no ContainerEntrypoint: "
            "fake_sagemaker does not know what it would run."
        )
    return known


def _stop_when_asked(attempt: str, events: tuple[threading.Event, ...], done: threading.Event) -> None:
    """While a job's `attempt` runs: once one of `events` is set (StopTrainingJob asks, or the spot
    watcher reclaims the hosts), SIGTERM every process of its hosts (as SageMaker signals the
    algorithm), again each half second until the run has ended; the local cluster then stops what is
    left as it stops any failed run (SIGTERM to each host's process group, SIGKILL after its grace
    period). Its hosts' processes, and only they, carry `ATTEMPT_ENV=attempt`."""
    import psutil

    while not done.wait(0.5):
        if not any(event.is_set() for event in events):
            continue
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error, OSError):
                if proc.environ().get(ATTEMPT_ENV) == attempt:
                    proc.terminate()


def _files(folder: Path | None) -> list[str]:
    """The files under `folder`, as sorted relative paths ([] when there is no folder)."""
    if folder is None or not folder.is_dir():
        return []
    try:
        return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    except OSError:  # a folder removed while it was read (a checkpoint being replaced): read it again
        return _files(folder) if folder.is_dir() else []


def _is_checkpoint(relative: str) -> bool:
    """Whether a file in the checkpoint folder counts as a checkpoint for the spot watcher (not one
    still being written, not a progress record: SPOT_NOT_CHECKPOINTS, SPOT_NOT_CHECKPOINT_FOLDERS)."""
    import fnmatch

    *folders, filename = relative.split("/")
    if any(fnmatch.fnmatch(filename, pattern) for pattern in SPOT_NOT_CHECKPOINTS):
        return False
    return not any(fnmatch.fnmatch(part, pattern) for part in folders for pattern in SPOT_NOT_CHECKPOINT_FOLDERS)


def _checkpoint_state(folder: Path | None) -> dict[str, tuple[int, int, int]]:
    """relative path -> (inode, size, mtime in ns) of each checkpoint file under `folder`."""
    state = {}
    for relative in _files(folder):
        if _is_checkpoint(relative):
            with contextlib.suppress(OSError):  # replaced meanwhile
                st = (folder / relative).stat()
                state[relative] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return state


def _reclaim_when_checkpointed(name: str, folder: Path | None, before: dict[str, tuple[int, int, int]], wait_s: float,
                               reclaim: threading.Event, done: threading.Event, found: dict[str, Any]) -> None:
    """The spot interruption of one attempt: set `reclaim` (which `_stop_when_asked` turns into
    SIGTERM for every host) once the hosts have written a checkpoint, a checkpoint file under `folder`
    (the S3 URI's stand-in, which the hosts' own folders are synced with) that was not there (or not so)
    at the attempt's start, or, if
    none appears, `wait_s` seconds into the attempt. `found["why"]` says which."""
    t0 = time.monotonic()
    while not done.wait(0.2):
        now = _checkpoint_state(folder)
        new = sorted(k for k, v in now.items() if before.get(k) != v)
        elapsed = time.monotonic() - t0
        if new:
            found["why"] = f"the hosts wrote a checkpoint ({', '.join(new)}) {elapsed:.1f} s into the attempt"
        elif elapsed >= wait_s:
            found["why"] = (f"no checkpoint {wait_s:g} s into the attempt"
                            + ("" if folder is not None else " (the job has no CheckpointConfig)")
                            + ": interrupted without one")
        else:
            continue
        _say(f"spot: reclaiming the hosts of job {name} (SIGTERM): {found['why']}")
        reclaim.set()
        return


def _failure_text(result: Any) -> str:
    """The driver's failure file (what SageMaker reports) of the host that failed first, else
    the local cluster's own report."""
    # The report's first line names the rank that failed first; a line of its own, its host.
    failed_first = re.search(r"^Host (\S+) failed", result.failure or "", re.MULTILINE)
    hosts = sorted(result.hosts, key=lambda h: (not failed_first or h.name != failed_first.group(1), h.host_rank))
    for host in hosts:
        text = _read_text(host.sandbox.failure_file).strip()
        if text:
            return text
    return result.failure or f"exit status {result.returncode}"


# ---------------------------------------------------------------------- tuning jobs: the request, the trials

TUNING_STRATEGIES = ("Bayesian", "Random", "Hyperband", "Grid")
_RANGE_KINDS = (("IntegerParameterRanges", "Integer"), ("ContinuousParameterRanges", "Continuous"),
                ("CategoricalParameterRanges", "Categorical"))
_MAX_TUNED = 30  # ParameterRanges: at most 30 hyperparameters over all its ranges
_MAX_HYPERPARAMETERS = 100  # static + tuned


@dataclass(frozen=True)
class _Range:
    kind: str  # Integer, Continuous, Categorical
    name: str
    low: float = 0.0
    high: float = 0.0
    scaling: str = "Auto"
    values: tuple[str, ...] = ()

    @property
    def size(self) -> float:
        """How many distinct values it has (Continuous: infinitely many)."""
        if self.kind == "Categorical":
            return len(self.values)
        return int(self.high) - int(self.low) + 1 if self.kind == "Integer" else math.inf

    def draw(self, rng: random.Random) -> str:
        """One random value, on the range's scale (Auto: linear), as text (SageMaker's hyperparameters)."""
        if self.kind == "Categorical":
            return rng.choice(self.values)
        low, high = self.low, self.high
        if self.scaling == "Logarithmic":
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
        elif self.scaling == "ReverseLogarithmic":
            value = 1.0 - math.exp(rng.uniform(math.log(1.0 - high), math.log(1.0 - low)))
        else:
            value = rng.uniform(low, high)
        if self.kind == "Integer":
            return str(min(int(high), max(int(low), round(value))))
        return repr(min(high, max(low, value)))


def _constraint(value: Any, where: str, rule: str) -> Exception:
    """The service's wording for a request that breaks a documented constraint."""
    from moto.sagemaker.exceptions import ValidationError

    return ValidationError(message=f"1 validation error detected: Value '{value}' at '{where}' failed to satisfy "
                                   f"constraint: {rule}")


def _resource_limit_exceeded(message: str) -> Exception:
    """CreateTrainingJob's ResourceLimitExceeded (a boto3 client sees ClientError with that code)."""
    from moto.sagemaker.exceptions import SagemakerClientError

    class ResourceLimitExceeded(SagemakerClientError):
        code = "ResourceLimitExceeded"

    return ResourceLimitExceeded(message)


def _refusal(message: str) -> Exception:
    from moto.sagemaker.exceptions import ValidationError

    return ValidationError(message=message)


def _check_model(operation: str, request: dict[str, Any]) -> None:
    """Every constraint of the service model on the request (`workshop.jobs.shapes`: required members,
    types, lengths, list and map sizes, number ranges, enums, patterns read as the service reads them,
    in nested structures, lists and maps), refused in the service's words (`shapes.service_message`:
    "1 validation error detected: Value 'a_b' at 'trainingJobName' failed to satisfy constraint: Member
    must satisfy regular expression pattern: ..."; a type error is worded by the fake). A pattern that
    cannot be translated from Java lets its member through unchecked: none of the two operations' can't."""
    from workshop.jobs import shapes

    report = shapes.check_request(operation, request)
    if report.violations:
        raise _refusal(shapes.service_message(report.violations))


def validate_training_request(request: dict[str, Any]) -> None:
    """CreateTrainingJob's checks: the service model's constraints (`_check_model`), then managed spot
    training's, as the API reference (CreateTrainingJob, StoppingCondition, ResourceConfig) and the
    developer guide ("Managed Spot Training") state them; each failure is a ValidationException before
    anything is recorded or run (see `_check_spot`)."""
    _check_model("CreateTrainingJob", request)
    _check_spot(request, "")


def _check_spot(spec: dict[str, Any], where: str) -> None:
    """The spot rules, for a CreateTrainingJob request or a tuning job's TrainingJobDefinition (`where`
    prefixes the fields' names in the messages):

    - StoppingCondition.MaxWaitTimeInSeconds only with EnableManagedSpotTraining (the service's own
      words, as users have quoted them for CreateTrainingJob and CreateHyperParameterTuningJob);
    - EnableManagedSpotTraining needs MaxWaitTimeInSeconds ("Set EnableManagedSpotTraining to True and
      specify the MaxWaitTimeInSeconds"), equal to or greater than MaxRuntimeInSeconds (the API
      reference; the developer guide says "larger") or than its default of 1 day when it is not given;
    - ResourceConfig.InstancePreferences "is mutually exclusive with ... EnableManagedSpotTraining".
    The wording of the last three is the fake's: the service's is not known to it."""
    spot = bool(spec.get("EnableManagedSpotTraining"))
    stopping = spec.get("StoppingCondition") or {}
    wait, runtime = stopping.get("MaxWaitTimeInSeconds"), stopping.get("MaxRuntimeInSeconds")
    if wait is not None and not spot:
        raise _refusal("Invalid MaxWaitTimeInSeconds. It is only supported when EnableManagedSpotTraining is set to true")
    if not spot:
        return
    if wait is None:
        raise _refusal(f"Invalid MaxWaitTimeInSeconds. {where}EnableManagedSpotTraining is true, so "
                       f"{where}StoppingCondition.MaxWaitTimeInSeconds must be given: how long the managed spot "
                       "training job has to complete, waiting for spot capacity included.")
    limit = DEFAULT_MAX_RUNTIME_S if runtime is None else runtime
    if wait < limit:
        raise _refusal(f"Invalid MaxWaitTimeInSeconds. {where}StoppingCondition.MaxWaitTimeInSeconds ({wait}) must be "
                       f"equal to or greater than MaxRuntimeInSeconds ({limit}"
                       + (", its default when not given" if runtime is None else "") + ").")
    if (spec.get("ResourceConfig") or {}).get("InstancePreferences"):
        raise _refusal(f"{where}ResourceConfig.InstancePreferences is mutually exclusive with EnableManagedSpotTraining.")


def _parse_ranges(config: dict[str, Any]) -> list[_Range]:
    """The ParameterRanges, checked as the API reference and the developer guide ("Define
    Hyperparameter Ranges") state them; ValidationException for what breaks them."""
    ranges = config.get("ParameterRanges") or {}
    if ranges.get("AutoParameters"):
        raise _refusal("fake_sagemaker does not simulate AutoParameters (Autotune).")
    parsed: list[_Range] = []
    for key, kind in _RANGE_KINDS:
        for entry in ranges.get(key) or []:
            name = str(entry.get("Name") or "")
            if not name:
                raise _refusal(f"A {kind} parameter range has no Name.")
            if kind == "Categorical":
                values = tuple(str(v) for v in entry.get("Values") or [])
                if not 1 <= len(values) <= 30:
                    raise _constraint(list(values), f"hyperParameterTuningJobConfig.parameterRanges.categoricalParameterRanges.{name}.values",
                                      "Member must have length between 1 and 30")
                parsed.append(_Range(kind, name, values=values))
                continue
            number = int if kind == "Integer" else float
            try:
                low, high = number(entry.get("MinValue")), number(entry.get("MaxValue"))
            except (TypeError, ValueError):
                raise _refusal(f"The {kind} parameter range {name!r} needs a MinValue and a MaxValue that are "
                               f"{'integers' if kind == 'Integer' else 'numbers'}, got {entry.get('MinValue')!r} and "
                               f"{entry.get('MaxValue')!r}.") from None
            if not (math.isfinite(low) and math.isfinite(high)) or low > high:
                raise _refusal(f"The {kind} parameter range {name!r} has MinValue {low} above MaxValue {high}.")
            scaling = entry.get("ScalingType") or "Auto"
            if scaling not in ("Auto", "Linear", "Logarithmic", "ReverseLogarithmic"):
                raise _constraint(scaling, f"parameterRanges.{name}.scalingType",
                                  "Member must satisfy enum value set: [Auto, Linear, Logarithmic, ReverseLogarithmic]")
            if scaling == "Logarithmic" and low <= 0:
                raise _refusal(f"Logarithmic scaling works only for ranges that have values greater than 0: {name!r} "
                               f"starts at {low}.")
            if scaling == "ReverseLogarithmic":
                if kind == "Integer":
                    raise _refusal(f"Reverse logarithmic scaling is only supported for continuous hyperparameter "
                                   f"ranges, not for the integer range {name!r}.")
                if low < 0 or high >= 1:
                    raise _refusal(f"Reverse logarithmic scaling works only for ranges that are entirely within "
                                   f"0 <= x < 1: {name!r} is [{low}, {high}].")
            parsed.append(_Range(kind, name, float(low), float(high), scaling))
    return parsed


def validate_tuning_request(request: dict[str, Any]) -> list[_Range]:
    """CreateHyperParameterTuningJob's checks, as the API reference (CreateHyperParameterTuningJob,
    HyperParameterTuningJobConfig, ResourceLimits, ParameterRanges) and the developer guide state
    them; each failure is a ValidationException (moto's ValidationError, which a boto3 client sees
    as ClientError code ValidationException) before anything is recorded or run. What the fake does
    not simulate is refused the same way, saying so. Returns the parameter ranges."""
    _check_model("CreateHyperParameterTuningJob", request)  # the name's length and pattern among them
    if request.get("TrainingJobDefinitions"):
        raise _refusal("fake_sagemaker does not simulate TrainingJobDefinitions (several training job definitions "
                       "in one tuning job): send one TrainingJobDefinition.")
    definition = request.get("TrainingJobDefinition")
    if not definition:
        raise _refusal("The request needs a TrainingJobDefinition (or TrainingJobDefinitions).")
    for key in ("WarmStartConfig", "Autotune"):
        if request.get(key):
            raise _refusal(f"fake_sagemaker does not simulate {key}.")
    config = request.get("HyperParameterTuningJobConfig") or {}
    strategy = config.get("Strategy")
    if strategy not in TUNING_STRATEGIES:
        raise _constraint(strategy, "hyperParameterTuningJobConfig.strategy",
                          f"Member must satisfy enum value set: [{', '.join(TUNING_STRATEGIES)}]")
    limits = config.get("ResourceLimits") or {}
    where = "hyperParameterTuningJobConfig.resourceLimits"
    for key, field_name in (("MaxParallelTrainingJobs", "maxParallelTrainingJobs"),
                            ("MaxNumberOfTrainingJobs", "maxNumberOfTrainingJobs")):
        value = limits.get(key)
        if (value is not None or key == "MaxParallelTrainingJobs") and (not isinstance(value, int) or value < 1):
            raise _constraint(value, f"{where}.{field_name}", "Member must have value greater than or equal to 1")
    runtime = limits.get("MaxRuntimeInSeconds")
    if runtime is not None and not 120 <= runtime <= 15768000:
        raise _constraint(runtime, f"{where}.maxRuntimeInSeconds",
                          "Member must have value greater than or equal to 120 and less than or equal to 15768000")
    seed = config.get("RandomSeed")
    if seed is not None and seed < 0:
        raise _constraint(seed, "hyperParameterTuningJobConfig.randomSeed", "Member must have value greater than or equal to 0")
    if config.get("StrategyConfig") and strategy != "Hyperband":
        raise _refusal("StrategyConfig (HyperbandStrategyConfig) is only supported for the Hyperband strategy.")
    if config.get("TuningJobCompletionCriteria"):
        raise _refusal("fake_sagemaker does not simulate TuningJobCompletionCriteria.")
    early = config.get("TrainingJobEarlyStoppingType") or "Off"
    if early not in ("Off", "Auto"):
        raise _constraint(early, "hyperParameterTuningJobConfig.trainingJobEarlyStoppingType",
                          "Member must satisfy enum value set: [Off, Auto]")
    objective = config.get("HyperParameterTuningJobObjective")
    if not objective or not objective.get("MetricName"):
        raise _refusal("The tuning job has no HyperParameterTuningJobObjective: give its Type and MetricName, one "
                       "of the training job definition's MetricDefinitions.")
    if objective.get("Type") not in ("Maximize", "Minimize"):
        raise _constraint(objective.get("Type"), "hyperParameterTuningJobConfig.hyperParameterTuningJobObjective.type",
                          "Member must satisfy enum value set: [Maximize, Minimize]")
    spec = definition.get("AlgorithmSpecification") or {}
    if spec.get("AlgorithmName"):
        raise _refusal("fake_sagemaker does not simulate AlgorithmName (algorithm resources): give a TrainingImage.")
    if not spec.get("TrainingImage"):
        raise _refusal("The TrainingJobDefinition's AlgorithmSpecification needs a TrainingImage (or an AlgorithmName).")
    if objective["MetricName"] not in [d.get("Name") for d in spec.get("MetricDefinitions") or []]:
        # the service's own words
        raise _refusal("A metric is required for this hyperparameter tuning job objective. Provide a metric in the "
                       "metric definitions.")
    if definition.get("HyperParameterTuningResourceConfig"):
        raise _refusal("fake_sagemaker does not simulate HyperParameterTuningResourceConfig: give a ResourceConfig.")
    if not definition.get("ResourceConfig"):
        raise _refusal("The TrainingJobDefinition needs a ResourceConfig (or a HyperParameterTuningResourceConfig).")
    _check_spot(definition, "TrainingJobDefinition.")
    ranges = _parse_ranges(config)
    names = [r.name for r in ranges]
    if not names:
        raise _refusal("The tuning job has no ParameterRanges: it has nothing to tune.")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise _refusal(f"A hyperparameter may have one range only; more than one: {', '.join(repeated)}.")
    if len(names) > _MAX_TUNED:
        raise _refusal(f"A tuning job searches at most {_MAX_TUNED} hyperparameters over all its ParameterRanges, "
                       f"this one {len(names)}.")
    static = definition.get("StaticHyperParameters") or {}
    both = sorted(set(names) & set(static))
    if both:
        raise _refusal(f"The hyperparameter(s) {', '.join(both)} are both static (TrainingJobDefinition."
                       "StaticHyperParameters) and tuned (ParameterRanges): each is one or the other.")
    if len(static) + len(names) > _MAX_HYPERPARAMETERS:
        raise _refusal(f"A tuning job has at most {_MAX_HYPERPARAMETERS} hyperparameters (static and tuned), this one "
                       f"{len(static) + len(names)}.")
    max_jobs = limits.get("MaxNumberOfTrainingJobs")
    combinations = math.prod(r.size for r in ranges)
    if strategy == "Grid":
        other = [f"{r.name} ({r.kind})" for r in ranges if r.kind != "Categorical"]
        if other:
            raise _refusal("Only categorical parameters are supported when using the grid search strategy: "
                           f"{', '.join(other)} is not.")
        if max_jobs is not None and max_jobs != combinations:
            raise _refusal(f"With the Grid strategy, MaxNumberOfTrainingJobs ({max_jobs}) must equal the total number "
                           f"of distinct categorical combinations possible ({combinations}), or be left out.")
    else:
        if max_jobs is None:
            raise _refusal(f"fake_sagemaker needs ResourceLimits.MaxNumberOfTrainingJobs with the {strategy} strategy "
                           "(it runs that many training jobs).")
        if combinations < max_jobs:  # the service's own words
            raise _refusal("You don't have enough combinations of hyperparameter ranges. The total number of "
                           f"hyperparameter combinations for the provided ranges [{float(combinations)}] must be equal "
                           f"or greater than the value of MaxNumberOfJobs, [{max_jobs}]. Provide additional ranges.")
    return ranges


def tuning_trial_values(config: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """(how the trials are chosen here, each trial's tuned values as text, in launch order).

    Grid: every combination of the categorical values, the first range varying slowest, each
    range's values in their order. Random: MaxNumberOfTrainingJobs independent draws, each
    range on its scale (Auto: linear), from `random.Random(RandomSeed)` (unseeded without one).
    Bayesian and Hyperband: drawn as Random (no model of earlier results, no early stopping)."""
    ranges = _parse_ranges(config)
    strategy = config["Strategy"]
    if strategy == "Grid":
        import itertools

        combos = itertools.product(*[r.values for r in ranges])
        return "Grid", [dict(zip([r.name for r in ranges], combo, strict=True)) for combo in combos]
    seed = config.get("RandomSeed")
    rng = random.Random(seed) if seed is not None else random.Random()
    count = int(config["ResourceLimits"]["MaxNumberOfTrainingJobs"])
    return "Random", [{r.name: r.draw(rng) for r in ranges} for _ in range(count)]


# ---------------------------------------------------------------------- the framework toolkit, on each host

# sagemaker_training.params.SAGEMAKER_HYPERPARAMETERS: neither passed to the script nor framework parameters.
TOOLKIT_RESERVED_HYPERPARAMETERS = (
    "sagemaker_program", "sagemaker_submit_directory", "sagemaker_enable_cloudwatch_metrics", "sagemaker_region",
    "sagemaker_container_log_level", "sagemaker_job_name", "default_user_module_name", "_tuning_objective_metric",
    "sagemaker_s3_output",
)
# sagemaker_training._PYTHON_ERRORS_: the built-in exception names and four more; a failed script's
# output from the first line naming one of them is the failure's ErrorMessage.
_TOOLKIT_ERROR_NAMES = tuple(n for n in dir(builtins) if "Error" in n or "Exception" in n) + (
    "Invalid requirement", "ResourceExhaustedError", "OutOfRangeError", "InvalidArgumentError")


def toolkit_layout(root: Path, input_data_config: dict[str, Any], sm_drivers_channel: bool) -> None:
    """A host of a job without a ContainerEntrypoint as SageMaker lays it out for the request, before
    the container starts (`root` is the host's /opt/ml; the local cluster laid it out for sm_train.sh):
    `inputdataconfig.json` and /opt/ml/input/data for exactly the request's channels (the local
    cluster always adds `code` and `sm_drivers`), the code at /opt/ml/code (the toolkit downloads
    `sagemaker_submit_directory` there itself: the fake has downloaded and extracted it into the
    `code` channel already)."""
    config_dir, data_dir, code_dir = root / "input" / "config", root / "input" / "data", root / "code"
    (config_dir / "inputdataconfig.json").write_text(json.dumps(input_data_config))
    if not sm_drivers_channel:
        shutil.rmtree(data_dir / "sm_drivers", ignore_errors=True)
    if (data_dir / "code").is_dir():
        shutil.rmtree(code_dir, ignore_errors=True)
        shutil.move(str(data_dir / "code"), str(code_dir))
    code_dir.mkdir(exist_ok=True)  # the images have an empty /opt/ml/code


def toolkit_main(argv: list[str]) -> int:
    """What a SageMaker framework training image runs on each host of a job without a
    ContainerEntrypoint: its entrypoint's `train`, i.e. `sagemaker_training.trainer.train()` with the
    image's SAGEMAKER_TRAINING_MODULE (`sagemaker_pytorch_container.training:main`, or the
    TensorFlow one), emulated from the toolkits' code (sagemaker-training 5.1, the PyTorch and
    TensorFlow training toolkits). Runs INSIDE a simulated host of the container runtime, where
    `/opt/ml` is this host's, as `python -c` (the fake's container command); `argv[0]` is the fake's
    JSON config.

    1. The host as SageMaker lays it out for this request (`toolkit_layout`, before the container
       starts: the local cluster mounts /opt/ml/input/config and /opt/ml/input/data read-only).
    2. `Environment()`: the hyperparameters JSON-decoded, those named `sagemaker_*` (and
       `_tuning_objective_metric`, ...) kept out of the script's arguments, `SM_*` from
       `to_env_vars()`, `CURRENT_HOST`, `SAGEMAKER_JOB_NAME`, `SAGEMAKER_REGION`; the framework's
       own additions (PyTorch: `MASTER_ADDR` = the first host, `MASTER_PORT=7777`, `NCCL_*`,
       `SM_DLC_TORCH_VERSION`, and nothing else: no RANK or WORLD_SIZE, no launcher; TensorFlow:
       `model_dir` in a tuning job's trials, `S3_REGION`, `TF_CPP_MIN_LOG_LEVEL`).
    3. `entry_point.run`: each host name resolved, requirements.txt installed, then one
       `/bin/sh -c "python <program> --key value ..."` (the toolkit joins the command with spaces)
       in /opt/ml/code, its output relayed line by line; a non-zero exit writes
       `/opt/ml/output/failure` as `ExecuteUserScriptError:\\nExitCode N\\nErrorMessage "..."\\nCommand "..."`
       and exits 1, success writes /opt/ml/output/success.
    """
    import importlib.metadata
    import socket
    import subprocess

    cfg = json.loads(argv[0])
    base = Path(CONTAINER_ROOT)
    config_dir, data_dir, code_dir = base / "input" / "config", base / "input" / "data", base / "code"
    output_dir = base / "output"

    def log(message: str, level: str = "INFO") -> None:  # logging_config.configure_logger's format
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        print(f"{stamp} sagemaker-training-toolkit {level:<8} {message}", flush=True)

    # 1. the host as the request lays it out: done before the container started (`toolkit_layout`)
    for key in cfg["unset"]:
        os.environ.pop(key, None)
    if cfg["framework_module"]:
        os.environ["SAGEMAKER_TRAINING_MODULE"] = cfg["framework_module"]  # the image's ENV

    # 2. the environment
    raw = json.loads((config_dir / "hyperparameters.json").read_text())
    hps: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            hps[key] = json.loads(value)
        except (ValueError, TypeError):
            log(f"Failed to parse hyperparameter {key} value {value} to Json.\nReturning the value itself")
            hps[key] = value
    resource = json.loads((config_dir / "resourceconfig.json").read_text())
    input_data = json.loads((config_dir / "inputdataconfig.json").read_text())
    sagemaker_hps = {k: v for k, v in hps.items() if k in TOOLKIT_RESERVED_HYPERPARAMETERS or k.startswith("sagemaker_")}
    user_hps = {k: v for k, v in hps.items() if k not in sagemaker_hps}
    framework_params = {k: v for k, v in sagemaker_hps.items() if k not in TOOLKIT_RESERVED_HYPERPARAMETERS}
    hosts, current_host = resource["hosts"], resource["current_host"]
    os.environ["SAGEMAKER_JOB_NAME"] = str(sagemaker_hps.get("sagemaker_job_name", ""))
    os.environ["CURRENT_HOST"] = current_host
    os.environ["SAGEMAKER_REGION"] = str(sagemaker_hps.get("sagemaker_region", cfg["region"]) or "")
    group = resource.get("current_group_name", "homogeneousCluster")
    groups = resource.get("instance_groups", [])
    distribution_groups = framework_params.get(
        "sagemaker_distribution_instance_groups",
        [group] if any(framework_params.get(k) for k in TOOLKIT_DISTRIBUTION_HYPERPARAMETERS) else [],
    )
    distribution_hosts = ([h for g in groups if g["instance_group_name"] in distribution_groups for h in g["hosts"]]
                          if groups else list(hosts))
    master = distribution_hosts[0] if distribution_hosts else hosts[0]
    program = os.environ.get("SAGEMAKER_PROGRAM") or str(sagemaker_hps.get("sagemaker_program"))
    job_name = os.environ.get("TRAINING_JOB_NAME")
    instance_type = resource.get("current_instance_type", "local")
    try:
        gpus = sum(1 for line in subprocess.check_output(["nvidia-smi", "--list-gpus"], text=True).splitlines()
                   if line.startswith("GPU "))
    except (OSError, subprocess.CalledProcessError):
        gpus = 0
    # multiprocessing.cpu_count() in the toolkit: the instance's cores; here the simulated host's share
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    mp_parameters = os.environ.get("SM_HP_MP_PARAMETERS")
    if cfg["framework"] == "tensorflow":
        if "_tuning_objective_metric" in hps:  # sagemaker_tensorflow_container.training.main
            model_dir = hps.get("model_dir")
            user_hps["model_dir"] = (model_dir if model_dir and str(model_dir).startswith("/opt/ml")
                                     else f"{model_dir}/{job_name}/model")  # "None/<job>/model" without one
        os.environ.update({"S3_REGION": os.environ["SAGEMAKER_REGION"], "TF_CPP_MIN_LOG_LEVEL": "1", "S3_USE_HTTPS": "1"})
    training_env = {
        "additional_framework_parameters": framework_params,
        "channel_input_dirs": {name: str(data_dir / name) for name in input_data},
        "current_host": current_host,
        "current_instance_group": group,
        "current_instance_group_hosts": next((g["hosts"] for g in groups if g["instance_group_name"] == group), []),
        "current_instance_type": instance_type,
        "distribution_hosts": distribution_hosts,
        "distribution_instance_groups": distribution_groups,
        "framework_module": os.environ.get("SAGEMAKER_TRAINING_MODULE"),
        "hosts": hosts,
        "hyperparameters": user_hps,
        "input_config_dir": str(config_dir),
        "input_data_config": input_data,
        "input_dir": str(base / "input"),
        "instance_groups": [g["instance_group_name"] for g in groups],
        "instance_groups_dict": {g["instance_group_name"]: g for g in groups},
        "is_hetero": len(groups) > 1,
        "is_master": current_host == master,
        "is_modelparallel_enabled": mp_parameters and mp_parameters != "{}",
        "is_smddpmprun_installed": shutil.which("smddpmprun") is not None,
        "is_smddprun_installed": shutil.which("smddprun") is not None,
        "job_name": job_name,
        "log_level": sagemaker_hps.get("sagemaker_container_log_level", 20),
        "master_hostname": master,
        "model_dir": str(base / "model"),
        "module_dir": str(sagemaker_hps.get("sagemaker_submit_directory", str(code_dir))),
        "module_name": program[:-3] if program.endswith(".py") else program,
        "network_interface_name": resource.get("network_interface_name", "eth0"),
        "num_cpus": cpus,
        "num_gpus": gpus,
        "num_neurons": 64 if "trn2.48xlarge" in instance_type else 0,  # no neuron-ls here
        "output_data_dir": str(output_dir / "data"),
        "output_dir": str(output_dir),
        "output_intermediate_dir": str(output_dir / "intermediate"),
        "resource_config": resource,
        "topology": resource.get("topology", []),
        "user_entry_point": program,
    }

    def text(value: Any) -> str:  # mapping.to_env_vars
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    def cmd_arg(value: Any) -> str:  # mapping.to_cmd_args
        if hasattr(value, "items"):
            return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
        return "" if value is None else str(value)

    args = []
    for key in sorted(user_hps):
        args += [f"--{key}" if len(key) > 1 else f"-{key}", cmd_arg(user_hps[key])]
    env_vars = {
        f"SM_{k.upper()}": text(v) for k, v in {
            "hosts": hosts, "network_interface_name": training_env["network_interface_name"], "hps": user_hps,
            "user_entry_point": program, "framework_params": framework_params, "resource_config": resource,
            "input_data_config": input_data, "output_data_dir": training_env["output_data_dir"],
            "channels": sorted(input_data), "current_host": current_host, "current_instance_type": instance_type,
            "current_instance_group": group, "current_instance_group_hosts": training_env["current_instance_group_hosts"],
            "instance_groups": training_env["instance_groups"], "instance_groups_dict": training_env["instance_groups_dict"],
            "distribution_instance_groups": distribution_groups, "is_hetero": training_env["is_hetero"],
            "module_name": training_env["module_name"], "log_level": training_env["log_level"],
            "framework_module": training_env["framework_module"], "input_dir": training_env["input_dir"],
            "input_config_dir": training_env["input_config_dir"], "output_dir": training_env["output_dir"],
            "num_cpus": cpus, "num_gpus": gpus, "num_neurons": training_env["num_neurons"],
            "model_dir": training_env["model_dir"], "module_dir": training_env["module_dir"],
            "training_env": training_env, "user_args": args,
            "output_intermediate_dir": training_env["output_intermediate_dir"],
            **{f"channel_{name}": path for name, path in training_env["channel_input_dirs"].items()},
            **{f"hp_{key}": value for key, value in user_hps.items()},
        }.items()
    }

    def resolve_hosts() -> None:  # entry_point._dns_lookup, retried as the toolkit does
        for host in hosts:
            deadline, delay = time.monotonic() + 15 * 60, 0.1
            while True:
                try:
                    socket.gethostbyname(host)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(delay)
                    delay = min(delay * 2, 30.0)

    def fail(message: str) -> int:  # trainer.train: a ClientError
        failure = output_dir / "failure"
        if not failure.exists():
            failure.write_text(message)
        log("Reporting training FAILURE", "ERROR")
        log(message, "ERROR")
        log("Encountered exit_code 1", "ERROR")
        return 1

    def check_error(cmd: list[str], error_class: str) -> int:  # process.check_error(capture_error=True)
        proc = subprocess.Popen(["/bin/sh", "-c", " ".join(cmd)], cwd=code_dir, env=os.environ.copy(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
        outputs: list[list[str]] = [[], []]

        def watch(stream: Any, output: list[str]) -> None:
            started = False
            for line in stream:
                line = line.rstrip("\n")
                print(line, flush=True)
                if started:
                    if line not in output:
                        output.append(line.strip(" :\n") + "\n")
                elif any(name in line for name in _TOOLKIT_ERROR_NAMES):
                    started = True
                    output.append(line.strip(" :\n") + "\n")

        readers = [threading.Thread(target=watch, args=(s, o)) for s, o in zip((proc.stdout, proc.stderr), outputs, strict=True)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        code = proc.wait()
        if code == 0:
            return 0
        stderr = " ".join(" ".join(o) for o in outputs)
        stderr = "\n".join(dict.fromkeys(stderr.split("\n"))).strip()
        extra = '\nExtraInfo "OutOfMemory: Process killed by SIGKILL (signal 9)"' if code == 137 else ""
        return fail(f'{error_class}:\nExitCode {code}\nErrorMessage "{stderr}"{extra}\nCommand "{" ".join(cmd)}"'.strip())

    try:
        log(f"Imported framework {cfg['framework_module'].split(':')[0]}")
        resolve_hosts()  # the PyTorch toolkit's, then entry_point.run's own
        if cfg["framework"] == "pytorch":
            os.environ.update({"NCCL_SOCKET_IFNAME": training_env["network_interface_name"], "NCCL_IB_DISABLE": "1",
                               "NCCL_DEBUG": "WARN", "MASTER_ADDR": master, "MASTER_PORT": "7777"})
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                os.environ["SM_DLC_TORCH_VERSION"] = importlib.metadata.version("torch")
        log("Invoking user training script.")
        python = sys.executable
        if program.endswith(".py") and (code_dir / "requirements.txt").exists():
            log("Installing dependencies from requirements.txt")
            if check_error([python, "-m", "pip", "install", "-r", "requirements.txt"], "InstallRequirementsError"):
                return 1
        elif not program.endswith(".py"):
            os.chmod(code_dir / program, 0o777)
        search_path = [str(code_dir)] + [p for p in sys.path if p and p not in (cfg["hide_path"], str(code_dir))]
        env_vars["PYTHONPATH"] = ":".join(search_path)  # environment.write_env_vars
        os.environ.update(env_vars)
        resolve_hosts()
        if program.endswith(".py"):
            cmd = [python, program, *args]
        else:
            cmd = ["/bin/sh", "-c", f'"./{program} {" ".join(shlex.quote(a) for a in args)}"']
        log("Invoking user script\n\nTraining Env:\n\n" + json.dumps(training_env, indent=4)
            + "\n\nEnvironment variables:\n\n" + "\n".join(f"{k}={v}" for k, v in env_vars.items())
            + "\n\nInvoking script with the following command:\n\n" + " ".join(cmd) + "\n\n")
        if check_error(cmd, "ExecuteUserScriptError"):
            return 1
    except Exception as exc:  # noqa: BLE001 - trainer.train: any other error is a framework error
        import traceback as tb

        failure = output_dir / "failure"
        message = f"Framework Error: \n{tb.format_exc()}\n{exc}"
        if not failure.exists():
            failure.write_text(message)
        log("Reporting training FAILURE", "ERROR")
        log(message, "ERROR")
        return int(getattr(exc, "errno", None) or 1)
    log("Reporting training SUCCESS")
    (output_dir / "success").write_text("")
    return 0


# ---------------------------------------------------------------------- module-level switch

_ACTIVE: FakeSageMaker | None = None
_MISSING = object()  # a method moto's response class does not have


def start(region: str = REGION, **kwargs: Any) -> FakeSageMaker:
    """Start the fake in this process and return it; if one is running already (a notebook
    cell run twice), return that one. `stop()` undoes everything."""
    if _ACTIVE is not None:
        if _ACTIVE.region != region:
            raise RuntimeError(f"A FakeSageMaker in {_ACTIVE.region} is running; stop() it first.")
        return _ACTIVE
    fake = FakeSageMaker(region, **kwargs).start()
    atexit.register(fake.stop)
    return fake


def stop() -> None:
    if _ACTIVE is not None:
        _ACTIVE.stop()


def active() -> FakeSageMaker | None:
    return _ACTIVE
