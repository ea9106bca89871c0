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

Your own training script: `workshop.train_locally(trainer)` runs an SDK v3 `ModelTrainer` on the local
cluster (`workshop.script_mode`; `python -m workshop run-script DIR/ENTRY`; docs/your-script.md).
"""

import importlib
import sys
from pathlib import Path

# The SageMaker SDK imports jsonschema (to check its config file), and jsonschema imports rfc3987_syntax
# wherever it is installed (JupyterLab's jupyter-events asks for it) to check the "iri" format: that module
# builds an Earley parser when imported, 4.7 s of CPU out of the SDK's 6.8 s here, paid by every notebook's
# first SageMaker cell and every command that submits a job. Nothing the SDK or the workshop validates uses
# that format; without the module, jsonschema leaves "iri" unchecked, as it does wherever it is not installed.
# (benchmarks/bench_cli.py times the SDK's import both ways; tests/test_architecture.py checks this.)
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

REPO_ROOT = Path(__file__).resolve().parent.parent

# The package's front door to what lives in its top layer, loaded on first use (PEP 562): `import workshop`
# stays light (the SDK takes seconds to import), and nothing here depends on the layers above at import time.
_FRONT_DOOR = {"train_locally": "workshop.script_mode", "ScriptResult": "workshop.script_mode"}


def __getattr__(name: str):
    if name in _FRONT_DOOR:
        return getattr(importlib.import_module(_FRONT_DOOR[name]), name)
    raise AttributeError(f"module 'workshop' has no attribute {name!r}")


__all__ = ["REPO_ROOT", "ScriptResult", "train_locally"]
