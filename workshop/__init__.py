"""Shared helpers of the distributed-training workshop, in layers that import one way.

- `workshop.errors`, `workshop.metrics`: the error type and the one metric-line format.
- `workshop.spec`: what a lab is (`Lab`); each lab folder's `lab.py` defines one.
- `workshop.runtime`: the local runtime, N simulated SageMaker hosts on this machine.
- `workshop.cloud`: AWS plumbing (sessions, network, role, preflight, cleanup, prices).
- `workshop.jobs`: the SageMaker job path (request, plan, trainer, dry run, submit, logs).
- `workshop.launchers`, `workshop.datasets`: how labs start, and their data.
- `workshop.labs`: the registry of labs; `workshop.runner`: a lab end to end, in either runtime.

CONTRIBUTING.md has the layer table and walks through adding a lab. Run a lab headless with
`python -m workshop run LAB`; see `python -m workshop --help`.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

__all__ = ["REPO_ROOT"]
