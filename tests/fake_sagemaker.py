"""A fake SageMaker training service for CI: moto, plus training jobs that really run.

    import fake_sagemaker
    fake = fake_sagemaker.start()          # or: with fake_sagemaker.FakeSageMaker() as fake:
    ...                                    # any SageMaker SDK v3 / boto3 code, no AWS account
    fake_sagemaker.stop()

moto (5.2.5) accepts CreateTrainingJob but marks every job Completed at once, with no logs,
no model and a made-up metric, so code that follows a job to its end (reads its CloudWatch
logs, downloads `model.tar.gz`, checks its metrics) has nothing to read. This module starts
moto's `mock_aws()` in the current process and makes each CreateTrainingJob *execute* the job
it was given, on `workshop.runtime.local_cluster.LocalCluster`, from what the SDK uploaded:

1. **The hook.** moto's SageMaker response handler for CreateTrainingJob
   (`moto.sagemaker.responses.SageMakerResponse.create_training_job`) is wrapped, so every
   client in the process is covered, whichever boto3 session made it (sagemaker-core makes
   its own clients from the trainer's session, or from a new `boto3.Session()`; a botocore
   event handler on one session would miss those). The wrapper reads the full request
   (including `Environment`, which moto's backend drops), lets moto record the job, then
   runs the job synchronously inside the call, so the job is finished by the time
   `CreateTrainingJob` returns and `DescribeTrainingJob` says Completed, Failed or Stopped.
2. **S3 in.** Every input channel is downloaded from moto S3 (`S3Prefix`, `File`/`FastFile`,
   `FullyReplicated`): `code` (SDK 3.27 uploads the `source_dir` file by file, not as a
   tarball, under `<base job name>/<job>/input/code/`; a `.tar.gz` source_dir is unpacked as
   `sm_train.sh` would), `sm_drivers` (next to it: `sm_train.sh`, `sourcecode.json`,
   `distributed.json`, and the SDK's `container_drivers` tree, `__pycache__` included) and the
   data channels.
3. **The container, as the SDK set it up.** The local cluster's container runtime
   (`workshop.runtime.hostns`) gives each simulated host the downloaded channels under its own
   `/opt/ml`, the hostname `algo-N` (peers resolve as `algo-1..N` at 127.0.0.N) and runs the
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
   `CheckpointConfig.S3Uri` is synced into the hosts' checkpoint folders before the run and
   back after it. `MaxRuntimeInSeconds` is the run's time limit. Where Linux does not allow
   unprivileged namespaces the local cluster's process runtime runs instead (the driver
   directly, master on 127.0.0.1, no network isolation) and `JobRun.runtime` says so.
4. **IAM as the SDK meets it.** The SDK's role validation stays on (`SAGEMAKER_VALIDATE_ROLE`
   unset): `tests/fake_aws_apis.py` answers `iam:SimulatePrincipalPolicy` from the role's
   policy documents, and the fake's role carries the workshop's own least-privilege policy
   (`workshop.account.role_policy`). `StopTrainingJob` exists (`fake_aws_apis`).
5. **Logs, metrics, model out.** Each host's lines go to CloudWatch Logs group
   `/aws/sagemaker/TrainingJobs`, stream `<job>/algo-N-<epoch seconds>`, as a real job shows
   them: without the local cluster's `[host/rank]` prefix and without torchrun's
   `[defaultN]:` tag. `FinalMetricDataList` is the last value each of the request's
   `MetricDefinitions` regexes matched in the logs. Rank 0's host's model folder is uploaded
   as `<S3OutputPath>/<job>/output/model.tar.gz` (the path moto reports). The job ends
   `Completed`; `Failed` with `FailureReason` (`AlgorithmError: ` and the driver's failure
   file, else the local cluster's report) when the run fails; `Stopped`
   (`MaxRuntimeExceeded`) past its time limit.

What it does **not** simulate: the image itself (`TrainingImage` is recorded, never pulled:
the job runs in this Python environment, and `JobRun.image_framework` says whether the image's
framework version is the one installed here), GPUs (no host has one, so NCCL/smddp paths are
never taken), IAM permissions of the job itself (the role is validated as the SDK does, but the
job's own S3 and log access is not checked against it), KMS, spot, warm pools, retries,
instance groups, Pipe mode, sharded or manifest channels, `SourceCode.command`, uncompressed
model output, CloudWatch metrics (only the final values in DescribeTrainingJob), the
InProgress phase (the job has ended before CreateTrainingJob returns), and billing. Nothing
leaves this process's AWS calls: moto intercepts every one of them. tests/README.md has the
whole list of what CI proves and what it does not.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import threading
import time
import traceback
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
DEFAULT_START_SKEW_S = 2.0
FAILURE_REASON_MAX = 1024  # DescribeTrainingJob's FailureReason is at most 1024 characters
_LOG_BATCH = 1000  # events per PutLogEvents call (CloudWatch allows 10,000 and 1 MB)
_ISOLATE_PREFIXES = ("AWS_ENDPOINT_URL", "AWS_CONTAINER_")
_ISOLATE_KEYS = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_REGION",
)


def _say(message: str) -> None:
    print(f"[fake-sagemaker] {message}", flush=True)


@dataclass
class JobRun:
    """What the fake did with one CreateTrainingJob."""

    name: str
    status: str = "InProgress"
    failure_reason: str | None = None
    hosts: int = 0
    procs_per_host: int = 0
    driver: str = ""
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    log_lines: dict[str, int] = field(default_factory=dict)  # host -> lines sent to CloudWatch
    final_metrics: dict[str, float] = field(default_factory=dict)
    model_artifact: str | None = None
    wall_time_s: float = 0.0
    workdir: str = ""
    network: str = ""  # what the job's hosts could reach
    # "pytorch 2.13 (image) = 2.13.0 (here)" or "... != ...: not verified here"
    image_framework: str = ""
    runtime: str = ""  # the local cluster's runtime: "container" (sm_train.sh, algo-N) or "process"


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
    as `WORKSHOP_ROLE_ARN`; `jobs` lists what it ran.
    """

    def __init__(self, region: str = REGION, *, workdir: str | os.PathLike[str] | None = None, keep_runs: bool = False,
                 start_skew_s: float | None = None):
        self.region = region
        # Instances of one job finish their set-up at different times: the last host starts this
        # late (env FAKE_SAGEMAKER_START_SKEW_S, default 2 s, so every multi-host job in CI meets it).
        self.start_skew_s = float(os.environ.get("FAKE_SAGEMAKER_START_SKEW_S", DEFAULT_START_SKEW_S)
                                  if start_skew_s is None else start_skew_s)
        self._workdir_arg = Path(workdir) if workdir else None
        self.keep_runs = keep_runs
        self.root: Path | None = None
        self.role_arn: str | None = None
        self.jobs: list[JobRun] = []
        self._mock: Any = None
        self._saved_env: dict[str, str | None] = {}
        self._original_handler: Any = None
        self._lock = threading.Lock()

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
            fake_aws_apis.on_stop = None
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
        role = iam.create_role(RoleName=ROLE_NAME, AssumeRolePolicyDocument=json.dumps(cloud.trust_policy()),
                               Description="fake_sagemaker: the workshop's least-privilege training role")
        account_id = boto.client("sts").get_caller_identity()["Account"]
        session = aws.sagemaker_session(boto)
        policy = account.role_policy(region=boto.region_name, account=account_id, bucket=aws.sdk_bucket(session),
                                     key_prefix=aws.sdk_key_prefix(session))
        iam.put_role_policy(RoleName=ROLE_NAME, PolicyName="workshop-training", PolicyDocument=json.dumps(policy))
        return role["Role"]["Arn"]

    def stop(self) -> None:
        global _ACTIVE
        if _ACTIVE is not self:
            return
        _ACTIVE = None
        self._remove_hook()
        with contextlib.suppress(Exception):
            import fake_aws_apis

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

    def summary(self) -> list[dict[str, Any]]:
        """The jobs run so far, as plain data."""
        return [asdict(job) for job in self.jobs]

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
                "VpcConfig", "EnableNetworkIsolation",
            )
            # Copied before moto's backend sees it: moto replaces the MetricDefinitions.
            request = {key: copy.deepcopy(response._get_param(key)) for key in keys}
            result = original(response)
            job = response.sagemaker_backend.training_jobs[request["TrainingJobName"]]
            fake._execute(job, request, response.region)
            return result

        self._original_handler = original
        SageMakerResponse.create_training_job = create_training_job

    def _remove_hook(self) -> None:
        if self._original_handler is not None:
            from moto.sagemaker.responses import SageMakerResponse

            SageMakerResponse.create_training_job = self._original_handler
            self._original_handler = None

    # ------------------------------------------------------------------ one job

    def _execute(self, job: Any, request: dict[str, Any], region: str) -> None:
        """Run one job to its end and record the outcome on moto's job object."""
        import boto3

        name = request["TrainingJobName"]
        run = JobRun(name=name, workdir=str(self.root / name))
        self.jobs.append(run)
        boto = boto3.Session(region_name=region)
        started = _now()
        transitions = [{"Status": "Starting", "StartTime": started, "StatusMessage": "Launching the simulated hosts"}]
        # What moto made up is replaced by what the request said.
        job.algorithm_specification["MetricDefinitions"] = copy.deepcopy(
            (request.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
        )
        job.environment = copy.deepcopy(request.get("Environment") or None)
        job.training_job_status, job.secondary_status = "InProgress", "Starting"
        job.final_metric_data_list = []
        job.failure_reason = None
        status, secondary, reason = "Failed", "Failed", None
        t0 = time.monotonic()
        with self._lock:  # one job at a time: the simulated hosts share this machine's cores
            try:
                status, secondary, reason = self._run(job, request, run, boto, transitions)
            except _JobError as exc:
                reason = exc.reason
            except KeyboardInterrupt:
                status, secondary, reason = "Stopped", "Stopped", "Interrupted while the fake ran the job."
                self._finish(job, run, started, transitions, status, secondary, reason, t0)
                raise
            except Exception as exc:  # a bug in the fake: say so, as a failed job
                traceback.print_exc()
                reason = f"InternalServerError: fake_sagemaker failed to run the job: {type(exc).__name__}: {exc}"
        self._finish(job, run, started, transitions, status, secondary, reason, t0)

    def _finish(self, job, run, started, transitions, status, secondary, reason, t0) -> None:
        ended = _now()
        transitions[-1].setdefault("EndTime", ended)
        transitions.append({"Status": secondary, "StartTime": ended, "StatusMessage": reason or f"Training job {status.lower()}"})
        job.training_job_status, job.secondary_status = status, secondary
        job.secondary_status_transitions = transitions
        job.training_start_time, job.training_end_time, job.last_modified_time = started, ended, ended
        job.training_time_in_seconds = max(1, int((ended - started).total_seconds()))
        if reason:
            job.failure_reason = reason[:FAILURE_REASON_MAX]
        if run.model_artifact is None:
            job.model_artifacts = None  # no model: DescribeTrainingJob leaves ModelArtifacts out
        run.status, run.failure_reason = status, job.failure_reason
        run.wall_time_s = round(time.monotonic() - t0, 1)
        _say(f"job {run.name} {status} after {run.wall_time_s:.1f} s" + (f": {reason}" if reason else ""))

    def _run(self, job: Any, request: dict[str, Any], run: JobRun, boto: Any, transitions: list) -> tuple[str, str, str | None]:
        from workshop.metrics import CLUSTER_PREFIX
        from workshop.runtime.local_cluster import LocalCluster, choose_runtime

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
        for reserved in RESERVED_CHANNELS:
            if reserved not in channels:
                raise _JobError(
                    f"ClientError: no {reserved!r} channel: fake_sagemaker runs SDK v3 `source_code` jobs "
                    "(the code and sm_drivers channels), not bare training images."
                )

        # --- S3 in
        transitions[-1]["EndTime"] = _now()
        transitions.append({"Status": "Downloading", "StartTime": _now(), "StatusMessage": "Downloading input data"})
        input_dir = workdir / "input"
        local_channels: dict[str, Path] = {}
        for channel_name, uri in channels.items():
            dest = input_dir / channel_name
            if _download_prefix(s3, uri, dest) == 0:
                raise _JobError(f"ClientError: Data download failed: no objects under {uri} (channel {channel_name!r}).")
            local_channels[channel_name] = dest
        drivers_dir, code_dir = local_channels.pop("sm_drivers"), local_channels.pop("code")
        sm_train = _read_text(drivers_dir / "sm_train.sh")
        source_code = json.loads(_read_text(drivers_dir / "sourcecode.json") or "{}") or {}
        distributed_json = json.loads(_read_text(drivers_dir / "distributed.json") or "{}") or {}
        if not sm_train:
            raise _JobError("ClientError: the sm_drivers channel has no sm_train.sh.")
        if source_code.get("command") or "SAGEMAKER_BASE_COMMAND_EOF" in sm_train:
            raise _JobError("ClientError: fake_sagemaker does not run SourceCode.command jobs, only entry scripts.")
        for archive in re.findall(r"^tar -xzf (\S+)", sm_train, re.MULTILINE):  # a .tar.gz source_dir
            with tarfile.open(code_dir / archive) as tar:
                if hasattr(tarfile, "data_filter"):  # Python 3.11.4+
                    tar.extractall(code_dir, filter="data")
                else:
                    tar.extractall(code_dir)
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
        environment = dict(request.get("Environment") or {})
        spec = request.get("AlgorithmSpecification") or {}
        command = list(spec.get("ContainerEntrypoint") or []) + list(spec.get("ContainerArguments") or [])
        if not command:
            raise _JobError("ClientError: the request sets no ContainerEntrypoint: fake_sagemaker runs SDK v3 "
                            "`source_code` jobs, whose entrypoint runs sm_train.sh.")
        internet, network = self._internet_route(request, boto)
        container = choose_runtime("auto")[0] == "container"  # the choice the cluster below makes
        # Paths into /opt/ml are right inside the container runtime; the process runtime has no
        # /opt/ml and sets those variables to each host's sandbox itself.
        dropped = [] if container else sorted(k for k, v in environment.items() if str(v).startswith(CONTAINER_ROOT))
        extra_env = {k: str(v) for k, v in environment.items() if k not in dropped}
        extra_env["TRAINING_JOB_NAME"] = name  # SageMaker's value, not the local cluster's run name
        checkpoint = request.get("CheckpointConfig") or {}
        checkpoint_dir = None
        if checkpoint.get("S3Uri"):
            checkpoint_dir = workdir / "checkpoints-s3"
            checkpoint_dir.mkdir(parents=True, exist_ok=True)
            _download_prefix(s3, checkpoint["S3Uri"], checkpoint_dir)
        max_run = (request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
        run.hosts, run.procs_per_host, run.hyperparameters = hosts, procs, hyperparameters
        run.driver = str(Path(drivers[0]))
        run.network = network
        run.image_framework = image_framework_note(spec.get("TrainingImage") or "")

        # --- the run
        transitions[-1]["EndTime"] = _now()
        transitions.append({"Status": "Training", "StartTime": _now(), "StatusMessage": "Training in progress (local cluster)"})
        _say(
            f"job {name}: {hosts} simulated host(s) x {procs} process(es), "
            f"{distributed.name + ' driver' if distributed else 'basic script driver'} ({run.driver}) "
            f"from the uploaded sm_drivers, {entry_script} from the uploaded code, hyperparameters "
            f"{json.dumps(hyperparameters)}, channels {sorted(local_channels)}"
            + f"; network: {network}; hosts start up to {self.start_skew_s:g} s apart; {run.image_framework}"
            + (f"; not passed (container paths): {', '.join(dropped)}" if dropped else "")
        )
        start_epoch = int(time.time())
        try:
            cluster = LocalCluster(
                code_dir, entry_script, hosts=hosts, procs_per_host=procs, distributed=distributed,
                name=name, workdir=workdir / "hosts", extra_env=extra_env, echo=False,
                internet=internet, start_skew_s=self.start_skew_s if hosts > 1 else 0.0,
                sm_drivers_dir=drivers_dir, container_command=command,
                instance_type=resource.get("InstanceType"),
            )
            result = cluster.run(
                hyperparameters, local_channels, checkpoint_dir=checkpoint_dir,
                timeout_s=float(max_run) if max_run else None, check=False,
            )
        except Exception as exc:  # WorkshopError: e.g. no such entry script in the code channel
            raise _JobError(f"AlgorithmError: {exc}") from None
        run.runtime = result.runtime

        # --- logs out, as SageMaker shows them: one stream per host, no local prefixes
        per_host: dict[str, list[str]] = {host.name: [] for host in result.hosts}
        ordered: list[str] = []
        for line in result.lines:
            match = CLUSTER_PREFIX.match(line)
            host = match["host"] if match else result.hosts[0].name
            text = line[match.end() :] if match else line
            per_host.setdefault(host, []).append(text)
            ordered.append(text)
        self._put_logs(boto, name, per_host, start_epoch)
        run.log_lines = {host: len(lines) for host, lines in per_host.items()}

        # --- metrics: the last value each MetricDefinitions regex matched
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

        # --- checkpoints and the model out
        transitions[-1]["EndTime"] = _now()
        transitions.append({"Status": "Uploading", "StartTime": _now(), "StatusMessage": "Uploading generated training model"})
        if checkpoint_dir is not None and checkpoint_dir.is_dir():
            _upload_dir(s3, checkpoint_dir, checkpoint["S3Uri"])
        timed_out = result.returncode == 124 and bool(max_run) and "time limit" in (result.failure or "")
        if result.ok or timed_out:  # SageMaker saves the model of a job stopped at max runtime too
            artifact = job.model_artifacts["S3ModelArtifacts"]
            bucket, key = _split_s3(artifact)
            s3.put_object(Bucket=bucket, Key=key, Body=_tar_gz(result.model_dir))
            run.model_artifact = artifact
        if result.ok:
            return "Completed", "Completed", None
        if timed_out:
            return "Stopped", "MaxRuntimeExceeded", f"Training job reached its MaxRuntimeInSeconds of {max_run} s."
        return "Failed", "Failed", "AlgorithmError: " + _failure_text(result)

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

    def _put_logs(self, boto: Any, name: str, per_host: dict[str, list[str]], start_epoch: int) -> None:
        logs = boto.client("logs")
        with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_group(logGroupName=LOG_GROUP)
        base_ms = start_epoch * 1000
        for host, lines in sorted(per_host.items()):
            stream = f"{name}/{host}-{start_epoch}"
            logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
            events = [{"timestamp": base_ms + i, "message": text} for i, text in enumerate(t for t in lines if t.strip())]
            for i in range(0, len(events), _LOG_BATCH):
                logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=events[i : i + _LOG_BATCH])


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
        from importlib.metadata import version

        here = version(module)  # the distribution: torch or tensorflow
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


def _tar_gz(folder: Path) -> bytes:
    """`model.tar.gz` of a model folder's contents (member names relative to it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        if folder.is_dir():
            for path in sorted(folder.rglob("*")):
                tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    return buffer.getvalue()


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


# ---------------------------------------------------------------------- module-level switch

_ACTIVE: FakeSageMaker | None = None


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
