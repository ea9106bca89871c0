"""Shared fixtures: the MNIST subset once per session, and no data downloads in tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workshop import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures"
PROBE_CODE = FIXTURES / "probe"


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory) -> Path:
    """The 5,000-digit subset as train/test channels (tests never download)."""
    from workshop.data import prepare_mnist

    root = tmp_path_factory.mktemp("mnist")
    prepare_mnist(root, source="subset")
    return root


@pytest.fixture(scope="session")
def channels(mnist_dir) -> dict[str, Path]:
    return {"train": mnist_dir / "train", "test": mnist_dir / "test"}


@pytest.fixture(autouse=True)
def _offline_mnist(monkeypatch):
    monkeypatch.setenv("WORKSHOP_MNIST_SOURCE", os.environ.get("WORKSHOP_MNIST_SOURCE", "subset"))


def repo_path(*parts: str) -> Path:
    return REPO_ROOT.joinpath(*parts)
