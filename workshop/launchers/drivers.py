"""Where the workshop's own SageMaker drivers are, and the parameter server's port scheme.

The drivers (`workshop/drivers/<name>/`, stdlib only) ship in a job's `sm_drivers` channel. Both a
launcher module and its SDK config (`workshop.launchers.configs`, imported only when a job's config
is built) need their paths, so they live here, in a module that imports nothing heavy.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from workshop.spec import load_module

DRIVERS = Path(__file__).resolve().parent.parent / "drivers"
PARAMETER_SERVER_DIR, PARAMETER_SERVER_SCRIPT = DRIVERS / "parameter_server", "ps_driver.py"
HOROVOD_DIR, HOROVOD_SCRIPT = DRIVERS / "horovod", "hvd_driver.py"
ELASTIC_TORCHRUN_DIR, ELASTIC_TORCHRUN_SCRIPT = DRIVERS / "torchrun", "elastic_driver.py"


def load_parameter_server_driver() -> ModuleType:
    """Lab 1's driver as a module (its `tf_configs`, `cluster_spec` and `ports`)."""
    return load_module(PARAMETER_SERVER_DIR / PARAMETER_SERVER_SCRIPT, "ps_driver")


def parameter_server_job_ports(base_port: int, hosts: int) -> list[int]:
    """Every port a parameter-server job of `hosts` hosts uses from `base_port` (the driver's scheme)."""
    return sorted(p for ports in load_parameter_server_driver().ports(base_port, hosts).values() for p in ports)
