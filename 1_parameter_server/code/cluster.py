"""Lab 1's TensorFlow processes: their threads, the workers' ranks, the in-process cluster, and the
time and bytes of each run of steps.

A parameter server or a worker is a TensorFlow server (train.py's `run_server`); the cluster they form
comes from TF_CONFIG, which the launcher sets, or, when the script runs alone, from
`in_process_resolver`: one parameter server and one worker in the coordinator's own process.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

# Written by each worker into its working directory; the workers' input pipelines read it, so
# every step reports which worker ran it (the coordinator is not told).
WORKER_ID_FILE = "tf_worker_rank.txt"


def write_worker_id(output_dir: str, rank: int) -> None:
    """Make `output_dir` this process's working directory and write the worker's rank there (WORKER_ID_FILE)."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    os.chdir(output_dir)
    Path(WORKER_ID_FILE).write_text(str(rank))


def configure_threads(tf, threads: int):
    """Intra-op threads: --threads per process, so that the processes sharing a host (its parameter
    server, its worker or the coordinator) do not fight for its cores. Inter-op threads stay at
    TensorFlow's default, one per CPU of the host: 8 on ml.c5.2xlarge; the local cluster's hosts
    set their instance's count (TF_NUM_INTEROP_THREADS), not their share of this machine. A task
    needs more than one: with one, a function waiting for a remote tensor blocks the very thread
    that would produce it, and training hangs."""
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads)


# The in-process cluster's one process serves the parameter server, the worker and the coordinator;
# as TensorFlow's parameter-server tutorial does for its in-process cluster, it gets this many
# inter-op threads where it may use fewer CPUs.
IN_PROCESS_INTER_OP_THREADS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_process_resolver(tf, args):
    """No launcher: one ps and one worker server in this very process, the coordinator too."""
    spec = tf.train.ClusterSpec({
        "ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"], "chief": [f"127.0.0.1:{free_port()}"],
    })
    write_worker_id(args.output_dir, 1)  # the in-process worker reads WORKER_ID_FILE from here
    config = configure_threads(tf, args.threads)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if usable < IN_PROCESS_INTER_OP_THREADS:
        config.inter_op_parallelism_threads = IN_PROCESS_INTER_OP_THREADS
    for job in ("ps", "worker"):
        tf.distribute.Server(spec, job_name=job, task_index=0, protocol="grpc", config=config, start=True)
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="chief", task_id=0, rpc_layer="grpc")


class Window:
    """`with window:` around a run of steps: its seconds and, where every task of the cluster `spec` is
    on this machine (a local cluster, the in-process one), the bytes its tasks sent each other.

    Those bytes all cross the loopback interface, whose kernel counters (Linux's /proc/net/dev; on
    loopback each byte is counted once) the coordinator reads before and after: the workers' pulls of
    the variables and pushes of the gradients, and the coordinator's few bytes per step it schedules.
    On a real cluster the tasks talk over the network, which this machine's counters see only in part:
    then `traffic()` is empty, as it is without the counters."""

    def __init__(self, spec: dict):
        tasks = [address for job in spec.values() for address in (job.values() if isinstance(job, dict) else job)]
        try:
            self.local = all(socket.gethostbyname(a.rsplit(":", 1)[0]).startswith("127.") for a in tasks)
        except OSError:
            self.local = False
        self.seconds, self.bytes = 0.0, None

    def __enter__(self):
        self._t0, self._sent = time.perf_counter(), self._loopback()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t0
        sent = self._loopback()
        self.bytes = None if sent is None or self._sent is None else sent - self._sent
        return False

    def traffic(self) -> dict:
        """{"loopback_bytes": N} for the metric line, or {} where the bytes were not counted."""
        return {} if self.bytes is None else {"loopback_bytes": self.bytes}

    def _loopback(self) -> int | None:
        if not self.local:
            return None
        try:
            lines = Path("/proc/net/dev").read_text().splitlines()[2:]
        except OSError:
            return None
        for line in lines:
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[8])  # transmit bytes (on loopback, the same as received)
        return None
