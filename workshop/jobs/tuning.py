"""A search as one SageMaker hyperparameter tuning job: SDK v3's `HyperparameterTuner` over the
lab's `ModelTrainer`, each trial a full distributed job with the lab's launcher.

Facts relied on (SageMaker Python SDK 3.27, `sagemaker/train/tuner.py`):
- `HyperparameterTuner(model_trainer, objective_metric_name, hyperparameter_ranges,
  metric_definitions, strategy, objective_type, max_jobs, max_parallel_jobs, ...)`; `tune(inputs,
  job_name, wait)` sends CreateHyperParameterTuningJob. Grid search needs categorical ranges only
  and `max_jobs=None` (the service counts the grid).
- The request's `TrainingJobDefinition.AlgorithmSpecification` has no ContainerEntrypoint (the
  API has none), so the trials do not run `sm_train.sh` as a standalone job does. The tuner
  uploads the `sm_drivers` channel, sets `sagemaker_program` to the lab's script and
  `sagemaker_submit_directory` to a `sourcedir.tar.gz` of `source_code.source_dir`, and the
  image's toolkit then runs `python train.py ...` once per host: no torchrun, every host a world
  of one (sagemaker-python-sdk issue #5610; still so in 3.27, and tests/test_fake_tuning.py
  shows it on the fake service, which runs the toolkit path as the images do).
- The workaround here: the source dir the tuner packs is a copy of the lab's `code/` plus
  `workshop_trial.py` (`workshop/drivers/tuning/`), and `sagemaker_program` names it. The toolkit
  runs it on every host; it hands over to the uploaded `sm_train.sh`, so each trial runs exactly
  the standalone job's driver (Torchrun, the workshop's parameter-server or Horovod driver).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workshop.cloud import aws
from workshop.errors import WorkshopError
from workshop.jobs.common import SOURCE_IGNORE_PATTERNS, say
from workshop.jobs.plan import JobPlan
from workshop.search import Objective, SearchSpace
from workshop.spec import Lab

TRIAL_PROGRAM = "workshop_trial.py"
TRIAL_DRIVER = Path(__file__).resolve().parent.parent / "drivers" / "tuning" / TRIAL_PROGRAM
TUNING_JOB_NAME_MAX = 32  # CreateHyperParameterTuningJob's limit
_STAMP = "%m%d%H%M%S"  # 10 characters: one tuning job per second and user is plenty


@dataclass(frozen=True)
class TuningPlan:
    """A checked search on SageMaker: the per-trial job, the space, the objective, the limits."""

    job: JobPlan
    space: SearchSpace
    objective: Objective
    max_parallel: int
    name: str

    @property
    def trials(self) -> list[dict[str, str]]:
        return self.space.trials()

    @property
    def n_trials(self) -> int:
        return len(self.trials)

    @property
    def strategy(self) -> str:
        return "Grid" if self.space.is_grid else "Random"

    @property
    def instances_at_once(self) -> int:
        return self.max_parallel * self.job.instance_count


def tuning_job_name(base_job_name: str, now: float | None = None) -> str:
    """`<base>-<MMDDhhmmss>` in 32 characters: the base (which starts with the user's prefix, so
    cleanup finds it) is cut, never the time stamp."""
    stamp = time.strftime(_STAMP, time.gmtime(now))
    return f"{base_job_name[: TUNING_JOB_NAME_MAX - len(stamp) - 1].rstrip('-')}-{stamp}"


def plan_tuning(plan: JobPlan, space: SearchSpace, objective: Objective, parallel: int | None = None,
                train_samples: int | None = None) -> TuningPlan:
    """Every offline check of the search: the parallelism, and each trial's hyperparameters
    against the lab script's parser at the job's world size (no AWS)."""
    n = len(space.trials())
    if parallel is None:
        parallel = min(n, 2)
    if parallel < 1:
        raise WorkshopError(f"--parallel must be at least 1, got {parallel}.",
                            "pass --parallel 2 (trials running at once), or leave it out.")
    parallel = min(parallel, n)
    if plan.spot:
        raise WorkshopError(
            "Spot trials are not supported: a tuning job's trials sync no checkpoints (one S3 prefix would be "
            "shared by every trial), so an interrupted trial would start again from nothing.",
            "drop spot for the search (CLI: --spot), or run single jobs on spot with `python -m workshop run --spot`.",
        )
    if objective.metric not in [d["Name"] for d in plan.metric_definitions]:
        raise WorkshopError(f"The job defines no metric {objective.metric!r} to rank trials by.",
                            f"pick one of {', '.join(d['Name'] for d in plan.metric_definitions)}.")
    for trial in space.trials():
        plan.lab.validate_hyperparameters({**plan.hyperparameters, **trial}, world_size=plan.world_size,
                                          train_samples=train_samples)
    return TuningPlan(job=plan, space=space, objective=objective, max_parallel=parallel,
                      name=tuning_job_name(plan.base_job_name))


def describe_tuning(tplan: TuningPlan) -> list[str]:
    job = tplan.job
    return [
        f"search: {tplan.space.describe()}; objective: {tplan.objective.direction.lower()} {tplan.objective.metric}",
        *tplan.space.notes,
        f"tuning job {tplan.name}: strategy {tplan.strategy}, {tplan.n_trials} training job(s), at most "
        f"{tplan.max_parallel} at once ({tplan.instances_at_once} x {job.instance_type} at most at once); "
        f"each trial a {job.instance_count}-instance job with the lab's {job.lab.launcher.name} launcher",
    ]


@contextlib.contextmanager
def staged_source(lab: Lab) -> Iterator[Path]:
    """A copy of the lab's `code/` plus `workshop_trial.py`: the source dir the tuner packs."""
    if (lab.source_dir / TRIAL_PROGRAM).exists():
        raise WorkshopError(f"{lab.source_dir} has a file named {TRIAL_PROGRAM}, the name the workshop's tuning "
                            "entry point takes.", f"rename {lab.source_dir / TRIAL_PROGRAM}.")
    with tempfile.TemporaryDirectory(prefix="workshop-tuning-src-") as tmp:
        staged = Path(tmp) / "code"
        shutil.copytree(lab.source_dir, staged, ignore=shutil.ignore_patterns(*SOURCE_IGNORE_PATTERNS))
        shutil.copy2(TRIAL_DRIVER, staged / TRIAL_PROGRAM)
        yield staged


def parameter_ranges(space: SearchSpace) -> dict[str, Any]:
    """The SDK's ranges: lists are categorical (the values as text); ranges continuous or integer."""
    from sagemaker.core.parameter import CategoricalParameter, ContinuousParameter, IntegerParameter

    ranges: dict[str, Any] = {}
    for p in space.params:
        if not p.is_range:
            ranges[p.name] = CategoricalParameter(list(p.values))
        else:
            kind = IntegerParameter if p.kind == "int" else ContinuousParameter
            low, high = (int(p.low), int(p.high)) if p.kind == "int" else (p.low, p.high)
            ranges[p.name] = kind(low, high, scaling_type="Logarithmic" if p.log else "Linear")
    return ranges


def _tuner_class() -> type:
    from sagemaker.train.tuner import HyperparameterTuner

    class WorkshopTuner(HyperparameterTuner):
        """`HyperparameterTuner` whose trials run the job's `sm_train.sh` (see the module docstring)."""

        @classmethod
        def _prepare_model_trainer_for_tuning(cls, model_trainer, inputs=None, job_name=None, **kwargs):
            super()._prepare_model_trainer_for_tuning(model_trainer, inputs, job_name, **kwargs)
            hps = model_trainer.hyperparameters or {}
            if hps.get("sagemaker_program") != model_trainer.source_code.entry_script:
                raise WorkshopError(  # the SDK changed how it prepares trials: the workaround must be re-checked
                    "This SageMaker SDK prepares tuning jobs differently from 3.27 (no sagemaker_program set to the "
                    "entry script), so the workshop cannot make its trials run the distributed driver.",
                    "install the SDK version in requirements.txt (pip install -r requirements.txt).",
                )
            hps["sagemaker_program"] = TRIAL_PROGRAM

    return WorkshopTuner


def build_tuner(tplan: TuningPlan, trainer: Any, staged: Path) -> Any:
    """The SDK's tuner over `trainer` (built from `tplan.job`), packing `staged` as the source dir.

    The trials sync no checkpoints with S3: the definition's CheckpointConfig would be one S3
    prefix for every trial, so a trial could resume another's checkpoint (the labs' scripts resume
    from whatever their checkpoint folder holds), and the tuner passes the trainer's config
    without the S3 URI that `ModelTrainer.train()` fills in, which the API requires. Each trial
    starts fresh and checkpoints into its own container only."""
    trainer.source_code = trainer.source_code.model_copy(update={"source_dir": str(staged)})
    trainer.checkpoint_config = None
    job = tplan.job
    return _tuner_class()(
        model_trainer=trainer,
        objective_metric_name=tplan.objective.metric,
        objective_type=tplan.objective.direction,
        hyperparameter_ranges=parameter_ranges(tplan.space),
        metric_definitions=[dict(d) for d in job.metric_definitions],
        strategy=tplan.strategy,
        max_jobs=None if tplan.space.is_grid else tplan.n_trials,
        max_parallel_jobs=tplan.max_parallel,
        random_seed=None if tplan.space.is_grid else tplan.space.seed,
        tags=[dict(t) for t in job.tags],
        base_tuning_job_name=tplan.name,
    )


def start_tuning(tuner: Any, inputs: Mapping[str, str], name: str, wait: bool) -> Any:
    """CreateHyperParameterTuningJob; with `wait`, until the tuning job ends (`follow_tuning`: the
    workshop's own wait, which shows the trials as they start and end, rather than the SDK's, which
    shows a spinner and raises on a Failed tuning job)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        tuner.tune(inputs=dict(inputs), job_name=name, wait=False)
    except (BotoCoreError, ClientError) as exc:
        raise WorkshopError(f"SageMaker did not start tuning job {name}: {exc}",
                            "check the message; nothing else was created by this step.") from None
    if wait:
        follow_tuning(tuner.sagemaker_session.boto_session, name)
    return tuner.latest_tuning_job


def follow_tuning(boto: Any, name: str) -> None:
    """Poll tuning job `name` until it ends, printing its status with how many of its training jobs run,
    and each training job's status as it changes (with its objective, or why it failed).

    Ctrl-C stops the wait, not the tuning job (it goes on starting its trials): `StillRunning` says so,
    and how to stop it and its running trials."""
    import importlib

    submit = importlib.import_module("workshop.jobs.submit")  # the module (its POLL_S, read at each poll)

    sm = aws.as_boto_session(boto).client("sagemaker")
    shown: dict[str, str] = {}  # trial -> the status shown
    last = None
    try:
        while True:
            described = sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
            status = described["HyperParameterTuningJobStatus"]
            for trial in tuning_trials(boto, name):
                if shown.get(trial.name) == trial.status:
                    continue
                shown[trial.name] = trial.status
                values = ", ".join(f"{k}={v}" for k, v in trial.hyperparameters.items())
                say(f"training job {trial.name} ({values}): {trial.status}"
                    + (f", objective {trial.objective:g}" if trial.objective is not None else "")
                    + (f": {trial.failure}" if trial.failure else ""))
            running = (described.get("TrainingJobStatusCounters") or {}).get("InProgress", 0)
            if (status, running) != last:
                say(f"tuning job {name}: {status}, {running} training job(s) running")
                last = (status, running)
            if status in submit.TERMINAL_STATUSES:
                return
            time.sleep(submit.POLL_S)
    except KeyboardInterrupt as exc:
        command = submit.stop_command(name, aws.as_boto_session(boto).region_name, tuning=True)
        raise submit.interrupted_wait(exc, f"tuning job {name}", "it ends (it goes on starting its remaining trials)",
                                      command) from None


@dataclass
class TrialSummary:
    """One training job of a tuning job, as ListTrainingJobsForHyperParameterTuningJob reports it."""

    name: str
    hyperparameters: dict[str, str]
    status: str
    objective: float | None
    wall_s: float | None
    failure: str | None = None


def tuning_trials(boto: Any, name: str) -> list[TrialSummary]:
    """The tuning job's training jobs, oldest first."""
    sm = aws.as_boto_session(boto).client("sagemaker")
    out: list[TrialSummary] = []
    for page in sm.get_paginator("list_training_jobs_for_hyper_parameter_tuning_job").paginate(
            HyperParameterTuningJobName=name):
        for s in page["TrainingJobSummaries"]:
            start, end = s.get("TrainingStartTime"), s.get("TrainingEndTime")
            metric = s.get("FinalHyperParameterTuningJobObjectiveMetric") or {}
            out.append(TrialSummary(
                name=s["TrainingJobName"],
                hyperparameters={k: str(v).strip('"') for k, v in (s.get("TunedHyperParameters") or {}).items()},
                status=s["TrainingJobStatus"],
                objective=metric.get("Value"),
                wall_s=(end - start).total_seconds() if start and end else None,
                failure=s.get("FailureReason"),
            ))
    return sorted(out, key=lambda t: t.name)


@dataclass
class TuningOutcome:
    """A tuning job after it ended (or as far as it got): its status, trials and best trial."""

    name: str
    status: str
    trials: list[TrialSummary]
    best: str | None  # the best trial's training job name, as the service chose it
    failure: str | None = None


def tuning_outcome(boto: Any, name: str) -> TuningOutcome:
    """DescribeHyperParameterTuningJob and its trials."""
    sm = aws.as_boto_session(boto).client("sagemaker")
    described = sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
    best = (described.get("BestTrainingJob") or {}).get("TrainingJobName")
    return TuningOutcome(name=name, status=described["HyperParameterTuningJobStatus"], trials=tuning_trials(boto, name),
                         best=best, failure=described.get("FailureReason") or None)
