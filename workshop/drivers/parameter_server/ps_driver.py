"""SageMaker SDK v3 driver for TensorFlow 2 parameter-server jobs (lab 1).

    python ps_driver.py          # with the SM_* variables of a SageMaker training host

SDK v3 has no parameter-server launcher (its `DistributedConfig`s are `Torchrun` and `MPI`),
so the workshop ships this one: `workshop.launchers.parameter_server.ParameterServer` is the
`DistributedConfig` whose `driver_dir` holds this file. `ModelTrainer` copies the folder into
the `sm_drivers` channel (`/opt/ml/input/data/sm_drivers/distributed_drivers/`) and
`sm_train.sh` runs `python .../ps_driver.py` on every host, in the code folder, after
exporting the `SM_*` variables. Locally, `workshop.runtime.local_cluster` runs the same file once per
simulated host. It is stdlib only: it runs inside the training container.

Topology, for hosts algo-1..algo-N (N >= 2), the TF2 `ParameterServerStrategy` roles:

    every host   a parameter server (`ps` task i on host rank i): holds a shard of the variables
    algo-1       the coordinator (`chief` task 0): runs the training loop, does no SGD itself
    algo-2..N    a worker (`worker` task i-1 on host rank i): runs the steps it is sent

Ports (one scheme for both runtimes; base = SM_MASTER_PORT, 7777 on SageMaker):

    chief         base
    ps i          base + 1 + i                 (i = host rank, 0..N-1)
    worker k      base + 1 + N + k             (k = host rank - 1, 0..N-2)

so a job uses the 2N ports base..base+2N-1. On SageMaker every host is reached by its name
(algo-N); when SM_MASTER_ADDR is a loopback address (the local cluster), every simulated host
is SM_MASTER_ADDR and the distinct ports keep the 2N servers apart.

Processes per host: two runs of the entry script, `python <entry> <hyperparameters>`, as SageMaker's
script mode runs it (the job's hyperparameters as flags, nothing else), one for the host's `ps`
task and one for its `chief` or `worker` task. Each learns its role from its own `TF_CONFIG`
(`task.type`: "ps", "chief" or "worker"; TensorFlow's convention, which
`TFConfigClusterResolver` reads), so a script written for `ParameterServerStrategy` runs
unchanged: no launcher flag its argument parser would refuse. Their output is
forwarded line by line, tagged `[ps<i>] ` (parameter server) or `[chief0]: ` / `[worker<k>]: `
(the training roles; the local cluster shows those as `[algo-h/<host rank>]`).

Shutdown: parameter servers and workers are TensorFlow servers that never return
(`server.join()`). So:
- on algo-1 the driver waits for the coordinator, then stops its own parameter server and
  exits with the coordinator's exit status;
- on the other hosts the driver waits until the coordinator's port has opened and then closed
  again (the coordinator's process ended, successfully or not), then stops its processes and
  exits 0, as SageMaker's TensorFlow toolkit did for its parameter servers. It fails (exit 1)
  if the coordinator never appears within `coordinator_wait_s` or if its parameter server dies
  (the variables it holds are gone). A worker that dies is logged and tolerated: the
  coordinator carries on with the remaining workers.
- SIGTERM (SageMaker stopping the job, the local cluster stopping a host) is forwarded to the
  children; the failure file is written on failure (SM_OUTPUT_FAILURE, else
  /opt/ml/output/failure), as the SDK's drivers do.

Demo knobs, read from the hyperparameters (SM_HPS): `slow-worker` (a host rank, 0: none) and
`slow-factor` (e.g. 3: that worker runs a third of the time). The driver throttles that
worker's process by stopping and continuing it (SIGSTOP/SIGCONT, 100 ms periods): a slower
machine, simulated, without costing the other processes any CPU.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

SIGNAL_PERIOD_S = 0.1
# Shared copy: keep identical in every script that has it (tests/test_copies.py).
DEFAULT_FAILURE_FILE = "/opt/ml/output/failure"


def log(message: str) -> None:
    print(f"[ps_driver] {message}", flush=True)


# ----------------------------------------------------------------------------- topology


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def ports(base_port: int, num_hosts: int) -> dict[str, list[int]]:
    """The port of every task: see the module docstring."""
    return {
        "chief": [base_port],
        "ps": [base_port + 1 + i for i in range(num_hosts)],
        "worker": [base_port + 1 + num_hosts + k for k in range(num_hosts - 1)],
    }


def cluster_spec(hosts: list[str], master_addr: str, base_port: int) -> dict[str, list[str]]:
    """TF_CONFIG's `cluster`: chief on hosts[0], a ps on every host, workers on hosts[1:]."""
    hosts = sorted(hosts)
    if len(hosts) < 2:
        raise ValueError(
            f"a parameter-server job needs at least 2 hosts (one coordinator, one or more workers), got {len(hosts)}"
        )
    local = is_loopback(master_addr)

    def addr(host: str) -> str:
        return master_addr if local else host

    p = ports(base_port, len(hosts))
    return {
        "chief": [f"{addr(hosts[0])}:{p['chief'][0]}"],
        "ps": [f"{addr(h)}:{port}" for h, port in zip(hosts, p["ps"], strict=True)],
        "worker": [f"{addr(h)}:{port}" for h, port in zip(hosts[1:], p["worker"], strict=True)],
    }


def tf_configs(hosts: list[str], current_host: str, master_addr: str, base_port: int) -> dict[str, dict]:
    """The TF_CONFIG of each process this host runs: {"ps": ..., "chief" or "worker": ...}.

    The one place in the project that turns the SageMaker host list into TF_CONFIG; the
    tests import it from here.
    """
    hosts = sorted(hosts)
    if current_host not in hosts:
        raise ValueError(f"the current host {current_host!r} is not in the host list {hosts}")
    cluster = cluster_spec(hosts, master_addr, base_port)
    rank = hosts.index(current_host)
    trainer = {"type": "chief", "index": 0} if rank == 0 else {"type": "worker", "index": rank - 1}
    return {
        "ps": {"cluster": cluster, "task": {"type": "ps", "index": rank}, "environment": "cloud"},
        trainer["type"]: {"cluster": cluster, "task": trainer, "environment": "cloud"},
    }


# ----------------------------------------------------------------------------- processes


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def hyperparameters_to_cli_args(hyperparameters: dict) -> list[str]:
    """As the SDK's drivers pass them: strings as they are, everything else as JSON."""
    args: list[str] = []
    for key, value in hyperparameters.items():
        args += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return args


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def write_failure_file(message: str) -> None:
    path = os.environ.get("SM_OUTPUT_FAILURE") or DEFAULT_FAILURE_FILE
    try:
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(message)
    except OSError:
        pass


def port_open(address: str, timeout: float = 1.0) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


class Child:
    """One process of this host, its output forwarded line by line with a tag."""

    def __init__(self, name: str, tag: str, cmd: list[str], env: dict[str, str]):
        self.name = name
        self.tag = tag
        self.tail: list[str] = []
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.reader = threading.Thread(target=self._forward, daemon=True)
        self.reader.start()

    def _forward(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.tail = (self.tail + [line])[-60:]
            sys.stdout.write(f"{self.tag}{line}\n")
            sys.stdout.flush()
        self.proc.stdout.close()

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)  # a throttled process must be able to exit
                self.proc.terminate()
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=5)


def throttle(child: Child, factor: float) -> None:
    """Run `child` 1/factor of the time: SIGSTOP/SIGCONT in SIGNAL_PERIOD_S periods."""
    run_s = SIGNAL_PERIOD_S / factor
    while child.poll() is None:
        time.sleep(run_s)
        try:
            child.proc.send_signal(signal.SIGSTOP)
            time.sleep(SIGNAL_PERIOD_S - run_s)
            child.proc.send_signal(signal.SIGCONT)
        except ProcessLookupError:
            return


def main() -> int:
    env = os.environ
    hosts = json.loads(env["SM_HOSTS"])
    current = env["SM_CURRENT_HOST"]
    master_addr = env.get("SM_MASTER_ADDR", "algo-1")
    base_port = int(env.get("SM_MASTER_PORT", "7777"))
    entry = env["SM_ENTRY_SCRIPT"]
    hps = json.loads(env.get("SM_HPS", "{}"))
    config = json.loads(env.get("SM_DISTRIBUTED_CONFIG", "{}") or "{}")
    wait_s = float(config.get("coordinator_wait_s") or 600)
    try:
        configs = tf_configs(hosts, current, master_addr, base_port)
    except ValueError as exc:
        log(f"ERROR: {exc}")
        write_failure_file(f"ps_driver: {exc}")
        return 1
    rank = sorted(hosts).index(current)
    cluster = configs["ps"]["cluster"]
    log(f"host {current} (rank {rank} of {len(hosts)}); cluster {json.dumps(cluster)}")

    python = sys.executable or "python3"
    args = hyperparameters_to_cli_args(hps)
    children: list[Child] = []

    def start(role: str, index: int, tag: str) -> Child:
        child_env = dict(env)
        child_env["TF_CONFIG"] = json.dumps(configs[role])
        cmd = [python, entry, *args]  # script mode: the hyperparameters only; the role is in TF_CONFIG
        child = Child(f"{role}{index}", tag, cmd, child_env)
        children.append(child)
        # The pid is said because the command lines of a host's two processes are the same.
        log(f"started {role} {index} (pid {child.proc.pid}): TF_CONFIG task {json.dumps(configs[role]['task'])}; "
            f"{' '.join(cmd)}")
        return child

    def on_sigterm(signum, frame):  # noqa: ARG001
        log("SIGTERM: stopping this host's processes")
        for child in children:
            child.stop(grace_s=2)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)

    ps = start("ps", rank, f"[ps{rank}] ")
    if rank == 0:
        trainer = start("chief", 0, "[chief0]: ")
    else:
        trainer = start("worker", rank - 1, f"[worker{rank - 1}]: ")
        slow_rank = int(hps.get("slow-worker", 0) or 0)
        factor = float(hps.get("slow-factor", 1) or 1)
        if slow_rank == rank and factor > 1:
            log(f"throttling this worker to 1/{factor:g} of the time (slow-worker={slow_rank})")
            threading.Thread(target=throttle, args=(trainer, factor), daemon=True).start()

    code = 0
    failed: Child | None = None
    try:
        if rank == 0:
            while trainer.poll() is None:
                if ps.poll() is not None:
                    log(f"ERROR: the parameter server exited with status {ps.poll()} before training ended")
                    code, failed = 1, ps
                    break
                time.sleep(0.2)
            else:
                code = trainer.poll()
                failed = trainer if code else None
                log(f"the coordinator exited with status {code}; stopping this host's parameter server")
        else:
            chief = cluster["chief"][0]
            seen, worker_reported, deadline = False, False, time.monotonic() + wait_s
            misses = 0  # consecutive failed connections once the coordinator was up
            while True:
                if ps.poll() is not None:
                    log(f"ERROR: the parameter server exited with status {ps.poll()}; its variables are lost")
                    code, failed = 1, ps
                    break
                if trainer.poll() is not None and not worker_reported:
                    worker_reported = True
                    log(
                        f"the worker exited with status {trainer.poll()}; the coordinator carries on with "
                        "the remaining workers, and this host keeps its parameter server"
                    )
                up = port_open(chief)
                misses = 0 if up else misses + 1
                if up and not seen:
                    seen = True
                    log(f"the coordinator is up at {chief}")
                elif seen and misses >= 2:
                    log(f"the coordinator at {chief} is gone: training has ended; stopping this host's processes")
                    break
                elif not seen and time.monotonic() > deadline:
                    log(f"ERROR: no coordinator at {chief} after {wait_s:g} s")
                    code = 1
                    break
                time.sleep(1.0)
    finally:
        for child in children:
            child.stop()
    if code:
        source = failed or ps
        write_failure_file(f"ps_driver on {current}: {source.name} failed (status {code}).\n" + "\n".join(source.tail[-30:]))
    log(f"done, exit status {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
