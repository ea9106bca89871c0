"""SageMaker SDK v3 driver: `torchrun` under its elastic agent, with a restart budget.

    python elastic_driver.py          # with the SM_* variables of a SageMaker training host

SDK v3's `Torchrun` has no restart count: its driver runs `torchrun --nnodes=N --nproc_per_node=P
--master_addr=algo-1 --master_port=7777 --node_rank=R train.py ...` (static rendezvous), and one
dead rank ends the job. `workshop.launchers.torchrun.ElasticTorchrun` is the `DistributedConfig`
whose `driver_dir` holds this file; `ModelTrainer` ships it in the `sm_drivers` channel and
`sm_train.sh` runs it on every host, as it runs the SDK's own drivers; the local cluster runs
the same file on each simulated host. Stdlib only: it runs inside the training container.

With `max_restarts` K > 0 it runs

    torchrun --nnodes=N --nproc_per_node=P --max-restarts=K --rdzv-backend=c10d
             --rdzv-endpoint=algo-1:7777 --rdzv-id=<job> --local-addr=<this host>
             --rdzv-conf=is_host=<1 on algo-1, else 0>,join_timeout=T,read_timeout=T train.py ...

The c10d rendezvous is what lets the job heal: when a rank dies, the agent on its host stops
that host's ranks and rejoins the rendezvous; the agents on the other hosts see a node waiting
and restart their ranks too, so every rank starts again (TORCHELASTIC_RESTART_COUNT = 1, 2, ...)
and the script resumes from its latest checkpoint. After K restarts a further failure ends the
job as before. Node ranks follow the hosts' names (`--local-addr`; the rendezvous sorts by it),
so global rank 0 stays on algo-1, whose model SageMaker uploads; that host's agent also serves
its workers' store at its `--local-addr`. With K = 0 the command is the SDK's own (static
rendezvous), unchanged.

The rendezvous is told, not left to guess:
- `is_host`: which host runs the rendezvous' TCP store. Left out, torchrun guesses it by matching
  this machine's hostname (or the addresses it resolves to) against the endpoint's `algo-1`
  (`_matches_machine_hostname` in torch/distributed/elastic/rendezvous/utils.py). A SageMaker
  host's hostname is not promised to be `algo-N` (ModelTrainer's `/bin/bash` entry point skips the
  images' `start_with_right_hostname.sh`; SageMaker's guide says not to rely on /etc/hostname), and
  a wrong guess on every host means no store: every agent times out connecting to algo-1:7777. The
  host SM_MASTER_ADDR names runs it. Where the master is an address, not a host's name (the local
  cluster's process runtime: 127.0.0.1, and no algo-N names resolve), the first host runs it and
  gives that address as its `--local-addr` (which sorts before every `algo-N`, so it stays node 0).
- `join_timeout` (T, `join_timeout_s`, else torchrun's 600 s): how long the rendezvous waits for
  every host; `read_timeout` = T too: torchrun's 60 s is also how long an agent keeps trying to
  reach the store, and instances come up minutes apart, so a host that starts early would give up
  on algo-1 long before the rendezvous gave up on anyone.
Before torchrun starts, every host's name must resolve (each peer's, up to T; SageMaker's guide
advises retrying the look-up), else the job fails naming the host that did not.

Environment as the SDK's torchrun driver sets it (NCCL_SOCKET_IFNAME, NCCL_PROTO=simple, EFA
variables on EFA instances); the failure file on failure (SM_OUTPUT_FAILURE, else
/opt/ml/output/failure); SIGTERM is forwarded to torchrun, which stops its ranks.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# The SDK's EFA lists, from the SDK's own `common/utils.py` next to this file in the sm_drivers
# channel (`distributed_drivers/` is where custom drivers land), so they cannot drift; the copy
# below (SDK 3.27) only if this file runs elsewhere. tests/test_fault_tolerance.py compares them.
EFA_NCCL_INSTANCES = (
    "ml.g4dn.8xlarge", "ml.g4dn.12xlarge", "ml.g5.48xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge",
    "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.trn1.32xlarge",
)
EFA_RDMA_INSTANCES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.trn1.32xlarge")
# torchrun's own join timeout (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, RendezvousTimeout).
DEFAULT_JOIN_TIMEOUT_S = 600
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
try:
    from common.utils import SM_EFA_NCCL_INSTANCES as EFA_NCCL_INSTANCES  # noqa: F811
    from common.utils import SM_EFA_RDMA_INSTANCES as EFA_RDMA_INSTANCES  # noqa: F811
except ImportError:
    pass
finally:
    sys.path.pop(0)


def hyperparameters_to_cli_args(hyperparameters: dict) -> list[str]:
    """As the SDK's drivers pass them: `--key value`, strings as they are, the rest as JSON."""
    args: list[str] = []
    for key, value in hyperparameters.items():
        args += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return args


def join_timeout_s(env: dict) -> int:
    """How long the hosts wait for each other: the config's `join_timeout_s`, else torchrun's default."""
    config = json.loads(env.get("SM_DISTRIBUTED_CONFIG") or "{}")
    return int(config.get("join_timeout_s") or DEFAULT_JOIN_TIMEOUT_S)


def runs_the_store(env: dict) -> bool:
    """Whether this host runs the rendezvous' TCP store: the host SM_MASTER_ADDR names (algo-1 on
    SageMaker), decided from SM_* and never from the hostname; where the master is an address, not one
    of SM_HOSTS (the local cluster's process runtime: 127.0.0.1), the first host."""
    hosts = json.loads(env.get("SM_HOSTS") or "[]")
    master = env["SM_MASTER_ADDR"]
    if master in hosts:
        return env["SM_CURRENT_HOST"] == master
    return int(env.get("SM_CURRENT_HOST_RANK") or 0) == 0


def torchrun_command(env: dict) -> list[str]:
    """The torchrun command line for this host, from the SM_* variables in `env`."""
    config = json.loads(env.get("SM_DISTRIBUTED_CONFIG") or "{}")
    hyperparameters = json.loads(env.get("SM_HPS") or "{}")
    procs = int(config.get("process_count_per_node") or 0) or int(env.get("SM_NUM_GPUS") or 0) \
        or int(env.get("SM_NUM_NEURONS") or 0) or 1
    hosts = int(env["SM_HOST_COUNT"])
    restarts = int(config.get("max_restarts") or 0)
    cmd = ["torchrun", f"--nnodes={hosts}", f"--nproc_per_node={procs}"]
    if restarts > 0:
        cmd += [
            f"--max-restarts={restarts}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={env['SM_MASTER_ADDR']}:{env['SM_MASTER_PORT']}",
            f"--rdzv-id={env.get('TRAINING_JOB_NAME') or 'workshop-job'}",
            f"--local-addr={env['SM_MASTER_ADDR'] if runs_the_store(env) else env['SM_CURRENT_HOST']}",
        ]
        timeout = join_timeout_s(env)
        cmd.append(f"--rdzv-conf=is_host={int(runs_the_store(env))},join_timeout={timeout},read_timeout={timeout}")
    elif hosts > 1:
        cmd += [f"--master_addr={env['SM_MASTER_ADDR']}", f"--master_port={env['SM_MASTER_PORT']}",
                f"--node_rank={env['SM_CURRENT_HOST_RANK']}"]
    return [*cmd, env["SM_ENTRY_SCRIPT"], *hyperparameters_to_cli_args(hyperparameters)]


def setup_env(env: dict) -> None:
    instance_type = env.get("SM_CURRENT_INSTANCE_TYPE", "")
    if instance_type in EFA_NCCL_INSTANCES:
        env["FI_PROVIDER"] = "efa"
    if instance_type in EFA_RDMA_INSTANCES:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
        env["RDMAV_FORK_SAFE"] = "1"
    env["NCCL_SOCKET_IFNAME"] = env.get("SM_NETWORK_INTERFACE_NAME", "eth0")
    env["NCCL_PROTO"] = "simple"


def unresolved_host(hosts: list[str], timeout_s: float, *, resolve: Callable[[str], object] = socket.getaddrinfo,
                    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Wait until every name in `hosts` resolves, up to `timeout_s` in all; the first that did not, or None."""
    deadline = clock() + timeout_s
    said = False
    for name in hosts:
        while True:
            try:
                resolve(name, None)
                break
            except OSError:  # socket.gaierror included
                if clock() >= deadline:
                    return name
                if not said:
                    print(f"elastic_driver: waiting for {name} to resolve (hosts come up at different times)", flush=True)
                    said = True
                sleep(1.0)
    return None


def write_failure(message: str) -> None:
    path = os.environ.get("SM_OUTPUT_FAILURE", "/opt/ml/output/failure")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            with open(path, "w", encoding="utf-8") as f:
                f.write(message)
    except OSError:
        pass


def main() -> int:
    env = dict(os.environ)
    setup_env(env)
    hosts = json.loads(env.get("SM_HOSTS") or "[]")
    # Hosts found by name (the master is one of them, as on SageMaker); the local cluster's process
    # runtime gives its master as an address and has no algo-N names.
    if len(hosts) > 1 and env.get("SM_MASTER_ADDR") in hosts:
        timeout = join_timeout_s(env)
        missing = unresolved_host(hosts, timeout)
        if missing is not None:
            message = (f"host {missing} does not resolve after {timeout} s, so this host cannot reach it "
                       f"(hosts {', '.join(hosts)}; this is {env.get('SM_CURRENT_HOST')})")
            print(f"elastic_driver: {message}", file=sys.stderr, flush=True)
            write_failure(message)
            return 1
    cmd = torchrun_command(env)
    print(f"elastic_driver: {' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, env=env)

    def forward(signum, frame):  # noqa: ARG001
        if proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    code = proc.wait()
    if code != 0:
        write_failure(f"torchrun exited with status {code} (see the job's logs for the failing rank)")
    return code


if __name__ == "__main__":
    sys.exit(main())
