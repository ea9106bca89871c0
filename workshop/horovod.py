"""Lab 2's launcher: a `DistributedConfig` for Horovod jobs, its checks, and its registration.

    from workshop.horovod import Horovod
    ModelTrainer(..., distributed=Horovod(framework="pytorch", install="build"))   # SageMaker
    LocalCluster(..., distributed=Horovod(framework="pytorch"))                    # same driver

SDK v3's `MPI()` starts the wrong number of ranks on more than one host (it passes the
per-host count as `mpirun -np`), and no current SageMaker image ships Horovod. The workshop's
driver (`workshop/drivers/horovod/hvd_driver.py`) starts exactly hosts x processes-per-host
ranks with Horovod's own rendezvous and rank plan (what `horovodrun --gloo` does, without
ssh), and can build Horovod on each host at job start (`install="build"`) with the same
patched build the workshop's set-up uses.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Literal

from sagemaker.train.distributed import DistributedConfig

from workshop.errors import WorkshopError

DRIVER_DIR = Path(__file__).resolve().parent / "drivers" / "horovod"
DRIVER_SCRIPT = "hvd_driver.py"
HOROVOD_VERSION = "0.28.1"
REBUILD = "`make horovod` (builds Horovod 0.28.1 with the workshop's patches; ~5 min the first time, ~1 min from the cached wheel)"
# Measured on this workshop's 2-core machines: 218-528 s for both frameworks. One framework
# on a 4-8 vCPU training instance is quicker; the estimate below is what the notebook states.
BUILD_MINUTES_ESTIMATE = (4, 8)


class Horovod(DistributedConfig):
    """Horovod ranks on every host, Gloo controller, Horovod's rendezvous on algo-1.

    framework: "pytorch" or "tensorflow": which of Horovod's extensions the script needs.
    install: "none" (the image has Horovod) or "build" (build it on each host at job start).
    process_count_per_node: ranks per host; None: one per GPU, one on CPU instances.
    gloo_timeout_s: how long a rank waits for a peer before failing (a dead peer ends the job).
    rendezvous_wait_s: how long other hosts wait for algo-1 (longer than a build at job start).
    """

    framework: Literal["pytorch", "tensorflow"] = "pytorch"
    install: Literal["none", "build"] = "none"
    process_count_per_node: int | None = None
    gloo_timeout_s: int = 60
    rendezvous_wait_s: int = 1800
    grace_s: int = 60

    @property
    def driver_dir(self) -> str:
        return str(DRIVER_DIR)

    @property
    def driver_script(self) -> str:
        return DRIVER_SCRIPT


def load_driver() -> ModuleType:
    """The driver as a module (its `rank_plan`, `rank_env`), for tests and notebooks."""
    spec = importlib.util.spec_from_file_location("hvd_driver", DRIVER_DIR / DRIVER_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_EXTENSION_DIR = {"pytorch": ("torch", "torch", "mpi_lib_v2"), "tensorflow": ("tensorflow", "tensorflow", "mpi_lib")}


def check_installed(framework: str) -> None:
    """Fail with the fix unless this environment's Horovod was built for `framework` as installed.

    Reads metadata only (no framework import): Horovod records the framework versions it was
    built against in `horovod/metadata.json`, and each framework's extension is a shared library.
    """
    if framework not in _EXTENSION_DIR:
        raise WorkshopError(f"Unknown Horovod framework {framework!r}.", "use 'pytorch' or 'tensorflow'.")
    try:
        version = importlib.metadata.version("horovod")
    except importlib.metadata.PackageNotFoundError:
        raise WorkshopError(
            "Horovod is not installed in this environment (it is not on PyPI as a wheel, and no "
            "framework wheel includes it).",
            f"run {REBUILD}.",
        ) from None
    spec = importlib.util.find_spec("horovod")
    root = Path(spec.origin).parent if spec and spec.origin else None
    subdir, package, library = _EXTENSION_DIR[framework]
    if root is None or not any((root / subdir).glob(f"{library}*.so")):
        raise WorkshopError(
            f"Horovod {version} here was built without {framework} support (no "
            f"horovod/{subdir}/{library}*.so).",
            f"rebuild it with {framework}: {REBUILD} (set HOROVOD_WITH_{framework.upper()}=1 if you build it yourself).",
        )
    try:
        built_for = json.loads((root / "metadata.json").read_text()).get(framework)
        installed = importlib.metadata.version(package)
    except (OSError, ValueError, importlib.metadata.PackageNotFoundError):
        return
    if built_for and built_for.split("+")[0] != installed.split("+")[0]:
        raise WorkshopError(
            f"Horovod {version} was built against {package} {built_for}, but {package} {installed} is "
            "installed: its extension would fail to load or crash.",
            f"rebuild it: {REBUILD}.",
        )


def _register() -> None:
    from workshop import sagemaker_jobs

    @sagemaker_jobs.register_launcher("horovod")
    def _horovod(plan) -> Horovod:
        # SageMaker's framework images have no Horovod: build it at job start on each host.
        # An image of your own (image_uri=..., e.g. from 2_horovod/docker/Dockerfile) has it.
        framework = "tensorflow" if plan.lab.sagemaker.framework == "tensorflow" else "pytorch"
        return Horovod(
            framework=framework,
            install="none" if plan.custom_image else "build",
            process_count_per_node=plan.procs_per_host,
        )


_register()
