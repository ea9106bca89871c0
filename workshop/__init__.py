"""Shared helpers of the distributed-training workshop.

- `workshop.runtime.local_cluster`: simulates N SageMaker hosts on this machine (the local runtime).
- `workshop.sagemaker_jobs`: builds, dry-runs and submits SDK v3 `ModelTrainer` jobs.
- `workshop.data`: writes the MNIST `train`/`test` channels and uploads them to S3.
- `workshop.metrics`: the one metric-line format, its regexes, log parsing and plots.
- `workshop.labs`: what each lab is (folder, launcher, defaults), used by the CLI and notebooks.

Run a lab headless with `python -m workshop run LAB`; see `python -m workshop --help`.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

__all__ = ["REPO_ROOT"]
