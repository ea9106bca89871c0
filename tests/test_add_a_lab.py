"""CONTRIBUTING.md's walkthrough, run: a lab added as a folder and its spec, and nothing else.

The two files are taken from CONTRIBUTING.md's code blocks as they are written there, put in a
scratch folder, loaded the way the registry loads every lab, and run on the local cluster and
as a SageMaker dry run. If the walkthrough stops working, this fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import isolate_aws

from workshop import REPO_ROOT
from workshop.errors import WorkshopError
from workshop.labs import LABS, load_lab_folder
from workshop.runner import run_local, run_on_sagemaker

FOLDER = "9_hello_allreduce"


def walkthrough_files() -> dict[str, str]:
    """{relative path: text} of every ```python block in CONTRIBUTING.md headed `# <folder>/<path>`."""
    text = (REPO_ROOT / "CONTRIBUTING.md").read_text()
    files = {}
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        head, _, body = block.partition("\n")
        if head.startswith(f"# {FOLDER}/"):
            files[head[2:].strip()] = body
    return files


@pytest.fixture
def tiny_lab(tmp_path: Path):
    files = walkthrough_files()
    assert set(files) == {f"{FOLDER}/lab.py", f"{FOLDER}/code/train.py"}
    for relative, body in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(body)
    (lab,) = load_lab_folder(tmp_path / FOLDER)
    return lab


def test_the_lab_is_its_folder_and_its_spec(tiny_lab, tmp_path):
    assert tiny_lab.path == tmp_path / FOLDER and tiny_lab.entry_path.is_file()
    assert tiny_lab.key not in LABS  # the repository's labs are untouched
    with pytest.raises(WorkshopError, match="--rounds must be at least 1") as info:
        tiny_lab.validate_hyperparameters({"rounds": 0}, world_size=2)
    assert "fix: pass --rounds 1 or more" in str(info.value)


def test_the_lab_dry_runs_on_sagemaker(tiny_lab, monkeypatch, tmp_path, capsys):
    isolate_aws(monkeypatch, tmp_path, "Alice Example")
    request = run_on_sagemaker(tiny_lab, hosts=3, hyperparameters={"rounds": 4}, dry_run=True, region="us-east-1")
    assert request["ResourceConfig"] == {"InstanceType": "ml.m5.xlarge", "InstanceCount": 3, "VolumeSizeInGB": 30}
    assert request["AlgorithmSpecification"]["TrainingImage"].endswith("pytorch:2.13-cpu-amzn2023-sagemaker")
    assert request["HyperParameters"] == {"rounds": "4"}
    assert request.code_files == ["train.py"]
    assert request.channel("train").endswith("/data/mnist/train")
    assert {d["Name"] for d in request["AlgorithmSpecification"]["MetricDefinitions"]} == {"rank_sum"}
    tags = {t["Key"]: t["Value"] for t in request["Tags"]}
    assert tags["workshop-lab"] == "hello_allreduce"
    assert "dry run: nothing was uploaded or created" in capsys.readouterr().out


@pytest.mark.slow
def test_the_lab_runs_on_the_local_cluster(tiny_lab, mnist_dir, tmp_path):
    result = run_local(tiny_lab, data_dir=mnist_dir, workdir=tmp_path / "runs", echo=False)
    assert result.ok and len(result.hosts) == 2
    # Round 1 (the last of the lab's 2 local rounds): ranks 0 and 1 each add rank + 1.
    assert result.metric("rank_sum") == (0 + 1) + (1 + 1)
    assert (result.model_dir / "done.txt").read_text() == "2 ranks\n"
