"""Run a lab end to end in one call: validate, prepare data, start the local cluster.

The CLI (`python -m workshop run LAB`) and the notebooks' `local` mode both come here, so
a notebook cell and the command line do exactly the same thing.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from workshop import REPO_ROOT
from workshop.data import prepare_mnist
from workshop.labs import Lab
from workshop.runtime.local_cluster import ClusterResult, LocalCluster

DEFAULT_DATA_DIR = REPO_ROOT / "data" / "mnist"


def run_local(
    lab: Lab,
    *,
    hosts: int | None = None,
    procs_per_host: int | None = None,
    hyperparameters: dict[str, Any] | None = None,
    data_dir: str | Path | None = None,
    workdir: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    runs_dir: str | Path | None = None,
    timeout_s: float | None = None,
    echo: bool = True,
    check: bool = True,
) -> ClusterResult:
    """Run `lab` on the local cluster; every check happens before any process starts.

    Hyperparameters are the lab's small local defaults updated with `hyperparameters`.
    `workdir` is this run's folder; without it the run gets a new one under `runs_dir`
    (default: the checkout's runs/). `checkpoint_dir` is the hosts' checkpoint folder for the
    whole run (see `LocalCluster.run`).
    """
    hosts = lab.local_hosts if hosts is None else hosts
    procs_per_host = lab.local_procs_per_host if procs_per_host is None else procs_per_host
    cluster = LocalCluster(  # checks hosts and procs_per_host
        lab.source_dir,
        lab.entry_script,
        hosts=hosts,
        procs_per_host=procs_per_host,
        distributed=lab.distributed_config(procs_per_host),
        name=lab.key.replace("_", "-"),
        workdir=workdir,
        runs_dir=runs_dir,
        echo=echo,
    )
    cluster.checkpoint_store(checkpoint_dir)  # a folder it cannot write fails now, not after the data
    hps = {**lab.local_hyperparameters, **(hyperparameters or {})}
    lab.validate_hyperparameters(hps, world_size=cluster.world_size)  # types first: no data needed
    if lab.data_preparer:  # the lab's own data (lab 4: a text corpus)
        module, _, function = lab.data_preparer.partition(":")
        channels = getattr(importlib.import_module(module), function)(data_dir)
    else:
        channels = prepare_mnist(data_dir or DEFAULT_DATA_DIR)
    lab.validate_hyperparameters(hps, world_size=cluster.world_size, train_samples=channels.n_train)
    return cluster.run(
        hps, channels.dirs, checkpoint_dir=checkpoint_dir, timeout_s=timeout_s, check=check
    )
