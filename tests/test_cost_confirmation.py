"""A launch that costs money asks first (issue 16, item 3).

`run_on_sagemaker`, `tune(mode="sagemaker")` and the CLI's `run`, `tune` and `network` print the
cost bound, then go on only once it is confirmed: `confirm_cost=True`, `--yes`, an answer on a
terminal, or `WORKSHOP_CONFIRM_COST=1`. Without it they stop with the bound and the fix, and the
refusal leaves nothing behind in (moto's) AWS: no role, no network, no bucket or object, no job.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest

from workshop import runner
from workshop.cloud import aws
from workshop.cloud.cost import CONFIRM_COST_ENV, estimate_cost, require_confirmation
from workshop.cloud.network import find_network
from workshop.errors import WorkshopError

REGION = "us-east-1"
# Lab 3's SageMaker defaults (2 x ml.g5.xlarge, max_run 1 h) and the workshop network's endpoints.
JOB_BOUND = "at most $2.82 (2 x ml.g5.xlarge x $1.408/h x 1 h)"
NETWORK_BOUND = ", plus $0.040 per hour for the workshop network while it exists"
HPS = {"epochs": 1, "batch-size": 2}


@pytest.fixture
def boto(moto_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")  # moto has no iam:SimulatePrincipalPolicy
    return moto_session


def created(boto: Any) -> dict[str, list[str]]:
    """Everything a launch could have created, by kind (empty lists: nothing)."""
    sm, s3, ec2 = boto.client("sagemaker"), boto.client("s3"), boto.client("ec2")
    return {
        "roles": [r["RoleName"] for r in boto.client("iam").list_roles()["Roles"]],
        "network": [v for v in [find_network(boto)] if v],
        "endpoints": [e["VpcEndpointId"] for e in ec2.describe_vpc_endpoints()["VpcEndpoints"]],
        "buckets": [b["Name"] for b in s3.list_buckets()["Buckets"]],
        "training jobs": [j["TrainingJobName"] for j in sm.list_training_jobs()["TrainingJobSummaries"]],
        "tuning jobs": [j["HyperParameterTuningJobName"]
                        for j in sm.list_hyper_parameter_tuning_jobs()["HyperParameterTuningJobSummaries"]],
    }


NOTHING = {"roles": [], "network": [], "endpoints": [], "buckets": [], "training jobs": [], "tuning jobs": []}


# --------------------------------------------------------------------------- the rule, alone


def test_the_bound_in_one_phrase() -> None:
    assert estimate_cost("ml.g5.xlarge", 2, 3600).bound() == JOB_BOUND
    assert estimate_cost("ml.g5.xlarge", 2, 3600, network_egress="endpoints").bound() == JOB_BOUND + NETWORK_BOUND
    assert estimate_cost("ml.g5.xlarge", 2, 1800, trials=6).bound() == (
        "at most $8.45 (6 trials x 2 x ml.g5.xlarge x $1.408/h x 0.5 h)")
    assert estimate_cost("ml.nosuch.xlarge", 3, 1800).bound() == (
        "an amount the workshop cannot bound (no price on record for ml.nosuch.xlarge; 3 instance(s) for 0.5 h)")


def test_only_true_an_answer_yes_or_the_variable_confirm(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def answer(yes: bool):
        return lambda sentence: asked.append(sentence) or yes

    assert require_confirmation("this job", JOB_BOUND, True) == "confirm_cost=True"
    assert require_confirmation("this job", JOB_BOUND, answer(True)) == "answered yes"
    assert asked == [f"This job can cost {JOB_BOUND}"]
    for unconfirmed in (False, None, 1, "yes", answer(False)):
        with pytest.raises(WorkshopError) as info:
            require_confirmation("this job", JOB_BOUND, unconfirmed)
        assert info.value.message == (f"Not started: this job can cost {JOB_BOUND}, and that cost was not confirmed. "
                                      "Nothing has been created, uploaded or started.")
        for fix in ("confirm_cost=True", "`confirm_cost = True` in the parameters cell", "--yes",
                    f"{CONFIRM_COST_ENV}=1"):
            assert fix in info.value.fix
    for value in ("1", "true", "YES"):
        monkeypatch.setenv(CONFIRM_COST_ENV, value)
        assert require_confirmation("this job", JOB_BOUND, False) == f"{CONFIRM_COST_ENV}={value}"
    monkeypatch.setenv(CONFIRM_COST_ENV, "0")
    with pytest.raises(WorkshopError, match="not confirmed"):
        require_confirmation("this job", JOB_BOUND, False)


# --------------------------------------------------------------------------- Python: run_on_sagemaker, tune


def test_an_unconfirmed_job_prints_its_bound_then_stops_with_nothing_created(
    boto: Any, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The most a refusal can leave behind: with create_role and network, every kind of thing."""
    with pytest.raises(WorkshopError) as info:
        runner.run_on_sagemaker("data_parallel", hosts=2, hyperparameters=HPS, data_dir=data_dir, region=REGION,
                                network=True, create_role=True)
    assert info.value.message.startswith(f"Not started: this job can cost {JOB_BOUND}{NETWORK_BOUND}, and that cost")
    out = capsys.readouterr().out
    assert f"cost: {JOB_BOUND.replace('(', '= ').rstrip(')')}" in out  # the preflight's own line, printed first
    assert "step 3/5" not in out
    assert created(boto) == NOTHING


def test_a_confirmed_job_starts(boto: Any, data_dir: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(aws.ROLE_ENV, boto.client("iam").create_role(
        RoleName="Training", AssumeRolePolicyDocument="{}")["Role"]["Arn"])
    for how, confirm in (("confirm_cost=True", True), (f"{CONFIRM_COST_ENV}=1", False)):
        if not confirm:
            monkeypatch.setenv(CONFIRM_COST_ENV, "1")
        result = runner.run_on_sagemaker("data_parallel", hosts=2, hyperparameters=HPS, data_dir=data_dir,
                                         region=REGION, wait=False, confirm_cost=confirm)
        out = capsys.readouterr().out
        assert out.index("cost: at most") < out.index(f"cost confirmed ({how}): {JOB_BOUND}") < out.index("step 3/5")
        assert result.job_name in created(boto)["training jobs"]


def test_a_dry_run_needs_no_confirmation(no_aws: None, data_dir: Path) -> None:
    request = runner.run_on_sagemaker("data_parallel", hosts=2, hyperparameters=HPS, data_dir=data_dir, dry_run=True)
    assert request["ResourceConfig"]["InstanceCount"] == 2


def test_an_unconfirmed_tuning_job_states_every_trial_and_creates_nothing(boto: Any, data_dir: Path) -> None:
    from workshop.tuning import tune

    with pytest.raises(WorkshopError) as info:
        tune("data_parallel", ["lr=0.01,0.05"], mode="sagemaker", hosts=2, parallel=2, hyperparameters=HPS,
             data_dir=data_dir, region=REGION, create_role=True)
    assert info.value.message.startswith(
        "Not started: this tuning job can cost at most $5.63 (2 trials x 2 x ml.g5.xlarge x $1.408/h x 1 h)")
    assert created(boto) == NOTHING


def test_a_horovod_build_job_is_in_the_bound(boto: Any, data_dir: Path) -> None:
    """Lab 2's one-time build job runs before the training job: its bound is confirmed with it."""
    with pytest.raises(WorkshopError) as info:
        runner.run_on_sagemaker("horovod_pytorch", hosts=2, hyperparameters=HPS, data_dir=data_dir, region=REGION,
                                create_role=True)
    assert info.value.message.startswith(
        "Not started: this job can cost at most $0.82 (2 x ml.c5.2xlarge x $0.408/h x 1 h), plus at most $0.41 for "
        "the one-time Horovod build job (1 x ml.c5.2xlarge x $0.408/h x 1 h), and that cost was not confirmed.")
    assert created(boto) == NOTHING


# --------------------------------------------------------------------------- the CLI


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def cli(args: list[str], monkeypatch: pytest.MonkeyPatch, *, tty: bool, answer: str | None = None) -> list[str]:
    """Run the CLI with stdin a terminal or not; `answer`: what the user types (None: end of input).
    Returns the prompts it showed."""
    from workshop.__main__ import main

    prompts: list[str] = []

    def fake_input(prompt: str = "") -> str:
        prompts.append(prompt)
        if answer is None:
            raise EOFError
        return answer

    monkeypatch.setattr(sys, "stdin", Terminal() if tty else io.StringIO())
    monkeypatch.setattr("builtins.input", fake_input)
    prompts.append(main(args))  # the exit status, last
    return prompts


def run_args(data_dir: Path, *extra: str) -> list[str]:
    return ["run", "data_parallel", "--mode", "sagemaker", "--hosts", "2", "--data-dir", str(data_dir),
            "--hp", "batch-size=2", "--hp", "epochs=1", "--region", REGION, "--create-role", *extra]


@pytest.mark.parametrize(("tty", "answer"), [(False, None), (True, "n"), (True, ""), (True, None)],
                         ids=["not-a-terminal", "answered-n", "answered-nothing", "end-of-input"])
def test_the_cli_refuses_without_a_yes(boto: Any, data_dir: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch, tty: bool, answer: str | None) -> None:
    *prompts, code = cli(run_args(data_dir, "--network", "endpoints"), monkeypatch, tty=tty, answer=answer)
    captured = capsys.readouterr()
    assert code == 2
    assert prompts == ([f"This job can cost {JOB_BOUND}{NETWORK_BOUND}. Start it? [y/N] "] if tty else [])
    assert f"error: Not started: this job can cost {JOB_BOUND}{NETWORK_BOUND}" in captured.err
    assert "--yes" in captured.err and "cost: at most $2.82" in captured.out
    assert created(boto) == NOTHING


@pytest.mark.parametrize(("tty", "answer", "extra"), [(True, "y", ()), (False, None, ("--yes",))],
                         ids=["answered-y", "yes-flag"])
def test_the_cli_starts_the_job_once_confirmed(boto: Any, data_dir: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch, tty: bool, answer: str | None,
                                               extra: tuple[str, ...]) -> None:
    *prompts, code = cli(run_args(data_dir, *extra), monkeypatch, tty=tty, answer=answer)
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert len(prompts) == (1 if tty else 0)
    assert ("cost confirmed (answered yes)" if tty else "cost confirmed (confirm_cost=True)") in out
    assert len(created(boto)["training jobs"]) == 1


def test_the_cli_tune_refuses_without_a_yes(boto: Any, data_dir: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    *_, code = cli(["tune", "data_parallel", "--param", "lr=0.01,0.05", "--mode", "sagemaker", "--hosts", "2",
                    "--parallel", "2", "--data-dir", str(data_dir), "--hp", "batch-size=2", "--region", REGION,
                    "--create-role"], monkeypatch, tty=False)
    assert code == 2
    assert "error: Not started: this tuning job can cost at most $5.63" in capsys.readouterr().err
    assert created(boto) == NOTHING


def test_the_cli_network_asks_too(boto: Any, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The workshop network costs per hour whether a job runs or not."""
    bound = "$0.040 per hour while it exists, job or not (interface endpoints; `python -m workshop cleanup` deletes it)"
    *prompts, code = cli(["network", "--region", REGION], monkeypatch, tty=True, answer="n")
    assert code == 2 and prompts == [f"The workshop network can cost {bound}. Start it? [y/N] "]
    assert f"Not started: the workshop network can cost {bound}" in capsys.readouterr().err
    *_, code = cli(["network", "--region", REGION], monkeypatch, tty=False)
    assert code == 2 and created(boto) == NOTHING
    *prompts, code = cli(["network", "--region", REGION, "--yes"], monkeypatch, tty=True)
    assert code == 0 and prompts == []  # --yes: not asked
    assert created(boto)["network"]
