"""The capstone notebook's own code (3_data_parallel/your_script.ipynb, capstone.py): its framework scripts are the
tests' unmodified ones, kept identical; the learner's prepare() goes into a copy of the ordinary script with every
other line unchanged. (Its two exercises run in tests/test_exercises.py, the notebook under nbval and in sagemaker mode.)"""

from __future__ import annotations

import ast

import pytest
from conftest import FIXTURES

from workshop import REPO_ROOT
from workshop.spec import load_module

LAB = REPO_ROOT / "3_data_parallel"


@pytest.mark.parametrize("copy, original", [
    ("tensorflow_ps/train.py", "tf_parameter_server/train.py"),
    ("horovod/pytorch_mnist.py", "horovod_pytorch_mnist/pytorch_mnist.py"),
])
def test_the_notebooks_framework_scripts_are_the_unmodified_ones(copy, original):
    assert (LAB / "your_script" / copy).read_text() == (FIXTURES / "unmodified" / original).read_text()


def test_the_learners_prepare_replaces_the_scripts_own_and_nothing_else_changes(tmp_path):
    capstone = load_module(LAB / "capstone.py", "_capstone", with_siblings=True)
    solution = load_module(LAB / "solutions" / "prepare.py", "_prepare_solution")
    folder = capstone.data_parallel_script(solution.prepare, tmp_path / "code")
    written = (folder / "train.py").read_text()
    tree = ast.parse(written)
    prepares = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "prepare"]
    assert len(prepares) == 1 and "DistributedSampler(train_set)" in ast.get_source_segment(written, prepares[0])
    removed = [line for line in capstone.diff(folder).splitlines() if line.startswith("-") and not line.startswith("---")]
    assert removed and all("prepare" in line or "return model, DataLoader" in line or "One process" in line
                           or "one process" in line for line in removed), removed
