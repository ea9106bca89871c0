"""Every notebook, top to bottom, in `mode = "sagemaker"`, against a fake SageMaker.

nbval runs the notebooks in `local` mode (the default); this test covers the cells that run only
in `sagemaker` mode. Each notebook `[0-9]_*/*.ipynb` is executed with nbclient in this
environment's Python, with two cells injected:

- first: start `tests/fake_sagemaker.py` in the kernel (moto in-process, with
  CreateTrainingJob running the job it was given on the local cluster: S3 in, CloudWatch logs,
  metrics, `model.tar.gz` out; no AWS account), and make the workshop's waits poll every 2 s (its
  jobs run after their Create call, as on SageMaker, and the workshop follows them);
- right after the `parameters`-tagged cell: `mode = "sagemaker"` and `confirm_cost = True` (each
  notebook's own parameter, passed by its SageMaker cells: the confirmation a reader gives after
  reading the cost bound), plus `OVERRIDES` below.

and one at the end that prints what the fake ran. The notebook must run without an error, and
its outputs must show that a training job really ran and completed there: the fake's record of
each job (Completed, log lines in CloudWatch, a model in S3), the workshop's `Completed` line for
that job with its console URL, and an accuracy line. A notebook whose sagemaker cells silently
did nothing fails.

Cells tagged `local-work` are left out: they measure on this machine and check what they measured,
the same in both modes (they never read `mode`: tests/test_notebook_hygiene.py), and nbval runs and
checks them in local mode. What this run adds is the sagemaker branch, so it runs only that.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from workshop import teaching

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
NOTEBOOKS = sorted(REPO.glob("[0-9]_*/*.ipynb"))
KERNEL_NAME = "workshop-fake-sagemaker-test"
CELL_TIMEOUT_S = 900
# Cells that do the same local work in both modes (a measurement grid, a profile and their checks): nbval
# runs them in local mode; the sagemaker-mode run leaves them out (the notebook's cell metadata tags them).
LOCAL_WORK_TAG = "local-work"
# Extra parameter values per notebook ("<folder>/<notebook stem>" -> code), e.g. smaller sizes for slow labs.
# (Cells that do only local work are local-work cells, left out above, not shrunk here.)
OVERRIDES: dict[str, str] = {
    # Two epochs, not three: what only this run covers is the sagemaker branch (the one-host build job, the wheel
    # channel, both jobs, their records from CloudWatch and their models from S3); nbval's local run trains all
    # three. After two the checks' bar (0.90) holds with room: 0.945 (PyTorch) and 0.944 (TensorFlow) in a
    # local run of 2 hosts (2026-11-26).
    "2_horovod/horovod": "epochs = 2\n",
    # Spot jobs on the fake are reclaimed once (after their first checkpoint, or 60 s into an attempt without one) and
    # restarted from S3. Real spot jobs are mostly never reclaimed: the notebook's spot check holds both ways
    # (tests/test_lab3_findings.py runs it on a job that was not interrupted, and on one reclaimed before a checkpoint).
    "3_data_parallel/fault_tolerance": "import fake_sagemaker\nfake_sagemaker.active().spot_interruptions = 1\n",
    # tests/test_fake_tuning.py covers the fake's tuning path; what only this run covers is the notebook's
    # sagemaker branch: two tuning jobs, their cost lines, their trials' results in the analysis and its checks.
    # Three learning rates (of 6) keep that analysis a real test, as nbval's local run does with all six: around
    # the divergence edge (lr 0.2 at world size 1, 0.4 at 2: a local run on 2026-11-26 measured 0.911, 0.100,
    # 0.100 against 0.938, 0.915, 0.339) the curves match at a factor of 2 (mean difference 0.12, against 0.36
    # unshifted and 0.57 at 4). Each factor still compares at least one point; a fourth rate would add a trial
    # per world size.
    "3_data_parallel/job_parallelism": "lrs = (0.1, 0.2, 0.4)\n",
    # The fake runs one CPU process per host (2 in all), not 8 GPUs per p4d: shard over those 2, with a
    # tiny model and few steps. Every route runs: the default (plain FSDP), the DeepSpeed route (its job
    # pip-installs DeepSpeed, already here) and the opt-in SMP route, so that no sagemaker cell goes unexecuted.
    "4_model_parallel/model_parallel": (
        'sagemaker_routes = ("fsdp", "smp", "deepspeed")\n'
        "allow_unsupported_image = True\n"
        "smp_hybrid_shard_degree = 2\n"
        'job_model = {"layers": 2, "d-model": 64, "heads": 4, "seq-len": 32, "batch-size": 16, "steps": 40}\n'
    ),
}
# Lines each notebook's sagemaker run must print, on top of the checks every notebook gets.
EXPECTED_OUTPUT: dict[str, tuple[str, ...]] = {
    "1_parameter_server/parameter_server": (
        "final test accuracy:", "variable shards, all on parameter-server tasks", "steps asynchronously",
        "[infra] cost: at most", "[infra] quota:", "[infra] network deleted:",  # preflight, then cleanup
    ),
    "2_horovod/horovod": (
        "pytorch Completed", "tensorflow Completed", "ranks, one set of weights",
        "[infra] cost: at most", "[infra] quota:", "[infra] network deleted:",  # preflight, then cleanup
        # Horovod built once per image by a one-host job, then installed from the wheel channel.
        "[hvd_build]", "Horovod wheel for", "[horovod] wheel for",
    ),
    "3_data_parallel/data_parallel": (
        "final test accuracy:", "weights digest per rank:", "ranks, one set of weights",
        "[infra] cost: at most", "[infra] quota:", "[infra] network deleted:",  # preflight, then cleanup
    ),
    # The capstone: the ModelTrainer the notebook built, submitted itself after the preflight; its logs and model.
    "3_data_parallel/your_script": (
        "test accuracy:", "model files:", "step 2/3: the preflight checks", "[infra] cost: at most", "[infra] quota:",
    ),
    # Two tuning jobs (world sizes 1 and 2), each trial run by the fake through the image's toolkit
    # and the workshop's trial entry (sagemaker-python-sdk#5610), ranked by the service.
    "3_data_parallel/job_parallelism": (
        "CreateHyperParameterTuningJob", "the toolkit runs workshop_trial.py", "[infra] cost: at most",
        "3 trials x 1 x ml.g5.xlarge", "3 trials x 2 x ml.g5.xlarge", "[infra] quota:",  # the 3 lrs of OVERRIDES
        "Completed; best trial", "the curves match best at a factor of 2", "[infra] network deleted:",
    ),
    # The rank kill healed inside a SageMaker job (the elastic driver in sm_drivers), then a spot job
    # interrupted once, resumed from its S3 checkpoint, billed for less than it trained.
    "3_data_parallel/fault_tolerance": (
        "=== on SageMaker: rank 1 killed after step 30, max_restarts=1 ===", "FAULT: killing rank 1 at step 30",
        "resumed at step 24, 6 steps redone", "Interrupted -> Starting", "managed spot: billable",
        "resumed from /opt/ml/checkpoints/checkpoint.pt", "[infra] cost: at most", "[infra] quota:",
        "all checks passed",
    ),
    "4_model_parallel/model_parallel": (
        "final next-character test accuracy:", "SMP route launcher:", "smdistributed-modelparallel:2.5.1-gpu-py311-cu124",
        "pytorch:2.13-cu133-amzn2023-sagemaker", "plain PyTorch applies the same SMP settings",
        "[infra] cost: at most $1.41 = 2 x ml.g5.xlarge",  # the default route: a few dollars at most
        "WARNING: The SageMaker model-parallel (SMP v2) image",  # the opt-in route says what it is
        # the DeepSpeed route: its job installs DeepSpeed when it starts, then trains ZeRO-3
        "the 'deepspeed' route's job installs 4_model_parallel/code/requirements-deepspeed.txt", "deepspeed Completed",
    ),
}
SUMMARY_MARK = "FAKE_SAGEMAKER_JOBS="
PYTHON_MARK = "FAKE_SAGEMAKER_KERNEL_PYTHON="

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A kernelspec, in a JUPYTER_PATH of its own, that runs this very interpreter."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "workshop (fake SageMaker test)",
                "language": "python",
            }
        )
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", str(root))
        mp.setenv("MPLBACKEND", "Agg")
        yield KERNEL_NAME


def _code(source: str, tag: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = [tag]
    return cell


def is_local_work(cell: nbformat.NotebookNode) -> bool:
    return LOCAL_WORK_TAG in cell.get("metadata", {}).get("tags", [])


def _prepare(nb: nbformat.NotebookNode, key: str) -> nbformat.NotebookNode:
    """The notebook with the fake started first, `mode = "sagemaker"` and `confirm_cost = True` after
    its parameters, its local-work cells left out, and the solution of each exercise in its cell."""
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{key}: expected one cell tagged 'parameters', found {len(tagged)}"
    start = _code(
        "import sys\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        # What every test process does (conftest): the SDK's config schema checked once, botocore's models
        # parsed once (tests/speedups.py; 4-5 s of a kernel's CPU, no result changed).
        "import speedups\n"
        "speedups.install()\n"
        "import fake_sagemaker\n"
        "fake_sagemaker.start()\n"
        # The fake's jobs last seconds to minutes, not the real ones' many minutes: the workshop's waits poll
        # every 2 s, not every 15 s (POLL_S: what a room of attendees sharing one account can afford).
        "import importlib\n"
        "importlib.import_module('workshop.jobs.submit').POLL_S = 2.0\n"
        f"print({PYTHON_MARK!r} + sys.executable)\n",
        "injected-fake-sagemaker",
    )
    assert "confirm_cost = False" in nb.cells[tagged[0]].source, f"{key}: no confirm_cost parameter"
    params = _code('mode = "sagemaker"\nconfirm_cost = True\n' + OVERRIDES.get(key, ""), "injected-parameters")
    summary = _code(
        "import json\n"
        f"print({SUMMARY_MARK!r} + json.dumps(fake_sagemaker.active().summary()))\n"
        "fake_sagemaker.stop()\n",
        "injected-summary",
    )
    cells = [cell for cell in nb.cells if not is_local_work(cell)]
    for cell in cells:  # the solutions in place, as nbval's run has them (conftest: with_solution)
        solution = teaching.solved_source(REPO / f"{key}.ipynb", cell)
        if solution is not None:
            cell.source = solution
    cells.insert(cells.index(nb.cells[tagged[0]]) + 1, params)
    nb.cells = [start, *cells, summary]
    return nb


def _stream_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                parts.append(output.get("text", ""))
            elif "data" in output and "text/plain" in output["data"]:
                parts.append(output["data"]["text/plain"] + "\n")
    return "".join(parts)


@pytest.mark.timeout(3600)
# Lab 2's notebook needs Horovod: it runs last, once the set-up's background build is done (conftest).
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.horovod) if p.parent.name == "2_horovod" else p
                                  for p in NOTEBOOKS], ids=[f"{p.parent.name}/{p.stem}" for p in NOTEBOOKS])
def test_notebook_runs_in_sagemaker_mode(path: Path, kernel_name: str, tmp_path: Path) -> None:
    from nbclient import NotebookClient

    key = f"{path.parent.name}/{path.stem}"
    nb = _prepare(nbformat.read(path, as_version=4), key)
    artifacts = path.parent / "artifacts"
    artifacts_before = set(artifacts.iterdir()) if artifacts.is_dir() else set()
    client = NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=CELL_TIMEOUT_S,
        allow_errors=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()  # raises CellExecutionError, with the cell and its traceback
    finally:
        nbformat.write(nb, tmp_path / path.name)  # the executed notebook, for a look after a failure
        if artifacts.is_dir():  # models the notebook downloaded (its sagemaker cells write there)
            for created in set(artifacts.iterdir()) - artifacts_before:
                shutil.rmtree(created, ignore_errors=True)
            if not artifacts_before and not any(artifacts.iterdir()):
                artifacts.rmdir()

    text = _stream_text(nb)
    kernel_python = re.search(rf"^{re.escape(PYTHON_MARK)}(.*)$", text, re.MULTILINE)
    assert kernel_python and Path(kernel_python.group(1)) == Path(sys.executable), "the kernel is not this venv's Python"

    summary = re.search(rf"^{re.escape(SUMMARY_MARK)}(.*)$", text, re.MULTILINE)
    assert summary, "the injected summary cell printed nothing"
    jobs = json.loads(summary.group(1))
    assert jobs, f"{path.name} ran no SageMaker training job in sagemaker mode"
    for job in jobs:
        name = job["name"]
        assert job["status"] == "Completed", f"job {name}: {job['status']}: {job['failure_reason']}"
        assert job["hosts"] >= 1 and sum(job["log_lines"].values()) > 0, job
        assert job["model_artifact"], job
        if job.get("tuning_job"):  # a trial: the workshop followed its tuning job, and listed the trial
            assert f"tuning job {job['tuning_job']}: Completed" in text
            continue
        # The workshop followed the job while it ran (its secondary statuses) to its end, and said so, with
        # its console URL.
        assert f"[sagemaker] {name}: Training - " in text and f"[sagemaker] {name}: Completed - " in text
        assert f"[sagemaker] job {name} Completed" in text
        assert f"#/jobs/{name}" in text
    trials: dict[str, list[dict]] = {}
    for job in jobs:
        if job.get("tuning_job"):
            trials.setdefault(job["tuning_job"], []).append(job)
    for tuning_job, its in trials.items():  # the notebooks' tuning jobs run 2 trials at once: some overlapped
        assert len(its) < 2 or any(a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"]
                                   for i, a in enumerate(its) for b in its[i + 1 :]), (tuning_job, its)
    assert re.search(r"accuracy[^\n]*\d\.\d+", text, re.IGNORECASE), "no accuracy line in the outputs"
    # Every launch was confirmed by the notebook's own parameter, after its cost bound was printed.
    assert "cost confirmed (confirm_cost=True)" in text and text.index("cost: at most") < text.index("cost confirmed")
    for expected in EXPECTED_OUTPUT.get(key, ()):
        assert expected in text, f"{expected!r} is missing from the outputs"
    if "download_model(" in "".join(c.source for c in nb.cells):  # the model the job wrote came from S3
        assert any(f"Model from {job['model_artifact']}" in text for job in jobs)
