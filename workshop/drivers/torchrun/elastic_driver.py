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
             --rdzv-endpoint=algo-1:7777 --rdzv-id=<job> --local-addr=<this host> train.py ...

The c10d rendezvous is what lets the job heal: when a rank dies, the agent on its host stops
that host's ranks and rejoins the rendezvous; the agents on the other hosts see a node waiting
and restart their ranks too, so every rank starts again (TORCHELASTIC_RESTART_COUNT = 1, 2, ...)
and the script resumes from its latest checkpoint. After K restarts a further failure ends the
job as before. Node ranks follow the hosts' names (`--local-addr`; the rendezvous sorts by it),
so global rank 0 stays on algo-1, whose model SageMaker uploads. With K = 0 the command is the
SDK's own (static rendezvous), unchanged.

Environment as the SDK's torchrun driver sets it (NCCL_SOCKET_IFNAME, NCCL_PROTO=simple, EFA
variables on EFA instances); the failure file on failure (SM_OUTPUT_FAILURE, else
/opt/ml/output/failure); SIGTERM is forwarded to torchrun, which stops its ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

# The SDK's EFA lists, from the SDK's own `common/utils.py` next to this file in the sm_drivers
# channel (`distributed_drivers/` is where custom drivers land), so they cannot drift; the copy
# below (SDK 3.27) only if this file runs elsewhere. tests/test_fault_tolerance.py compares them.
EFA_NCCL_INSTANCES = (
    "ml.g4dn.8xlarge", "ml.g4dn.12xlarge", "ml.g5.48xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge",
    "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.trn1.32xlarge",
)
EFA_RDMA_INSTANCES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.trn1.32xlarge")
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
            f"--local-addr={env['SM_CURRENT_HOST']}",
        ]
        join_timeout = config.get("join_timeout_s")
        if join_timeout:
            cmd.append(f"--rdzv-conf=join_timeout={int(join_timeout)}")
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
