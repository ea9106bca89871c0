"""How every process of one local run is found: each carries the run's marker in its environment.

The local cluster sets the marker on every host it starts; the drivers' signal handlers and the
tests use it to find (and sweep) whatever a run left, whichever process group it ended up in.
"""

from __future__ import annotations

import os

import psutil

MARKER = "WORKSHOP_CLUSTER_ID"


def processes_with_marker(cluster_id: str) -> list[psutil.Process]:
    """Every live process whose environment carries this cluster's marker."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARKER) == cluster_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found
