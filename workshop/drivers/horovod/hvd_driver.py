"""SageMaker SDK v3 driver for Horovod jobs (lab 2): exactly hosts x processes-per-host ranks.

    python hvd_driver.py          # with the SM_* variables of a SageMaker training host

`workshop.horovod.Horovod` is the `DistributedConfig` whose `driver_dir` holds this file.
`ModelTrainer` copies the folder into the `sm_drivers` channel and `sm_train.sh` runs this
driver on every host; locally, `workshop.local_cluster` runs it once per simulated host.

Why not SDK v3's `MPI()`: its driver passes the per-host process count as `mpirun -np`, so two
hosts of four processes get 4 ranks, not 8; and an `mpirun` job needs MPI in the image, `sshd`
on every worker, and the right `-mca` interface options, the usual sources of multi-node hangs
(workers whose `sshd` is not up yet, traffic sent over the wrong interface). This driver
starts the ranks the way `horovodrun --gloo` does, using Horovod's own launcher code, but
without `ssh`: each host starts its own ranks.

- The rank plan is Horovod's: `get_host_assignments(parse_hosts("algo-1:P,algo-2:P,..."), H*P)`,
  hosts in SageMaker's order, so host h runs ranks h*P .. h*P+P-1 (cross rank h, local ranks
  0..P-1), the layout `horovodrun -np H*P -H algo-1:P,...` produces.
- algo-1 (SM_MASTER_ADDR) runs Horovod's `RendezvousServer` on SM_MASTER_PORT, initialised
  with that plan; the ranks find each other through it, then talk directly (Gloo over TCP).
- Every rank gets the variables `horovodrun --gloo` sets (`create_run_env_vars`,
  `create_slot_env_vars`): HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_CONTROLLER=gloo,
  HOROVOD_CPU_OPERATIONS=gloo, HOROVOD_GLOO_IFACE, HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/
  CROSS_RANK/CROSS_SIZE/HOSTNAME. The interface is named explicitly (SageMaker's
  SM_NETWORK_INTERFACE_NAME, `lo` on the local cluster), so Gloo never guesses it.
- Output is forwarded line by line, tagged `[<rank>]<stdout>:` as horovodrun tags it.

Failure: a rank that exits non-zero stops this host's other ranks and fails the host (exit
status 1, failure file written); ranks on other hosts lose their Gloo peer and fail within
HOROVOD_GLOO_TIMEOUT_SECONDS (`gloo_timeout_s`), so nothing waits for `max_run`. Hosts other
than algo-1 wait at most `rendezvous_wait_s` for algo-1's rendezvous server, and stop their
ranks if it disappears (algo-1 ended) while they still run, after `grace_s`.

Horovod itself: no current SageMaker image ships it. With `install: "build"` in the config
the driver builds Horovod 0.28.1 on each host before training, with `build_horovod.sh` from
this folder (the same script and patches as the workshop's `make horovod`; minutes per job,
paid on every host); with `install: "none"` it fails at once with the fix if Horovod or the
framework's extension is missing. The reusable alternative is an image built from
2_horovod/docker/Dockerfile.

Standard library only, plus Horovod's runner modules once Horovod is importable.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build_horovod.sh"
DEFAULT_FAILURE_FILE = "/opt/ml/output/failure"
EXTENSIONS = {"pytorch": "horovod.torch", "tensorflow": "horovod.tensorflow"}


def log(message: str) -> None:
    print(f"[hvd_driver] {message}", flush=True)


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def hyperparameters_to_cli_args(hyperparameters: dict) -> list[str]:
    """As the SDK's drivers pass them: strings as they are, everything else as JSON."""
    args: list[str] = []
    for key, value in hyperparameters.items():
        args += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return args


def write_failure_file(message: str) -> None:
    path = os.environ.get("SM_OUTPUT_FAILURE") or DEFAULT_FAILURE_FILE
    try:
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(message)
    except OSError:
        pass


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# ----------------------------------------------------------------------------- plan


def procs_per_host(config: dict, env: dict) -> int:
    """`process_count_per_node` if given, else one per GPU, else one."""
    procs = config.get("process_count_per_node")
    if procs:
        return int(procs)
    return max(1, int(env.get("SM_NUM_GPUS", "0") or 0))


def rank_plan(hosts: list[str], procs: int) -> list[dict]:
    """Every rank's slot, by Horovod's own assignment (the plan `horovodrun` makes).

    Returns dicts with hostname, rank, local_rank, cross_rank, size, local_size, cross_size.
    """
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    slots = get_host_assignments(parse_hosts(",".join(f"{h}:{procs}" for h in hosts)), len(hosts) * procs)
    return [
        {
            "hostname": s.hostname, "rank": s.rank, "local_rank": s.local_rank, "cross_rank": s.cross_rank,
            "size": s.size, "local_size": s.local_size, "cross_size": s.cross_size,
        }
        for s in slots
    ]


def rank_env(slot: dict, rendezvous_addr: str, rendezvous_port: int, iface: str, gloo_timeout_s: int) -> dict[str, str]:
    """The variables `horovodrun --gloo` gives one rank (horovod/runner/gloo_run.py)."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "NCCL_SOCKET_IFNAME": iface,
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(gloo_timeout_s),
        "HOROVOD_HOSTNAME": slot["hostname"],
        "HOROVOD_RANK": str(slot["rank"]),
        "HOROVOD_SIZE": str(slot["size"]),
        "HOROVOD_LOCAL_RANK": str(slot["local_rank"]),
        "HOROVOD_LOCAL_SIZE": str(slot["local_size"]),
        "HOROVOD_CROSS_RANK": str(slot["cross_rank"]),
        "HOROVOD_CROSS_SIZE": str(slot["cross_size"]),
    }


def start_rendezvous(port: int, hosts: list[str], procs: int):
    """Horovod's rendezvous HTTP server on `port`, initialised with the job's rank plan."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    httpd = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
    httpd.init(get_host_assignments(parse_hosts(",".join(f"{h}:{procs}" for h in hosts)), len(hosts) * procs))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


# ----------------------------------------------------------------------------- Horovod install


def missing_extension(framework: str, python: str) -> str | None:
    """None if Horovod with `framework` imports in `python`, else what failed."""
    module = EXTENSIONS.get(framework, "horovod")
    probe = subprocess.run(
        [python, "-c", f"import {module}"], capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    if probe.returncode == 0:
        return None
    lines = [ln for ln in probe.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"`import {module}` exited with status {probe.returncode}"


def ensure_horovod(framework: str, install: str, python: str) -> None:
    problem = missing_extension(framework, python)
    if problem is None:
        return
    if install != "build":
        raise RuntimeError(
            f"Horovod with {framework} support is not importable in this image ({problem}). No current "
            "SageMaker image ships Horovod. Fix: Horovod(install='build') builds it at job start "
            "(minutes on every host), or build a reusable image from 2_horovod/docker/Dockerfile and "
            "pass it as the training image."
        )
    log(f"Horovod with {framework} is not importable ({problem}); building it now with {BUILD_SCRIPT.name}")
    t0 = time.monotonic()
    cmd = ["bash", str(BUILD_SCRIPT), "--python", python, "--frameworks", framework, "--install"]
    log("running " + shlex.join(cmd))
    code = subprocess.call(cmd)
    if code != 0:
        raise RuntimeError(f"building Horovod failed (status {code}); see the build output above")
    log(f"built and installed Horovod in {time.monotonic() - t0:.0f} s")
    problem = missing_extension(framework, python)
    if problem:
        raise RuntimeError(f"Horovod was built but {EXTENSIONS.get(framework)} still does not import: {problem}")


# ----------------------------------------------------------------------------- processes


class Rank:
    """One rank of this host, its output forwarded line by line with horovodrun's tag."""

    def __init__(self, slot: dict, cmd: list[str], env: dict[str, str]):
        self.slot = slot
        self.tag = f"[{slot['rank']}]<stdout>:"
        self.tail: list[str] = []
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=False,
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
                self.proc.terminate()
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=5)


def main() -> int:
    env = os.environ
    hosts = json.loads(env["SM_HOSTS"])
    current = env["SM_CURRENT_HOST"]
    master_addr = env.get("SM_MASTER_ADDR", hosts[0])
    port = int(env.get("SM_MASTER_PORT", "7777"))
    entry = env["SM_ENTRY_SCRIPT"]
    hps = json.loads(env.get("SM_HPS", "{}"))
    config = json.loads(env.get("SM_DISTRIBUTED_CONFIG", "{}") or "{}")
    framework = config.get("framework") or "pytorch"
    install = config.get("install") or "none"
    gloo_timeout_s = int(config.get("gloo_timeout_s") or 60)
    wait_s = float(config.get("rendezvous_wait_s") or 900)
    grace_s = float(config.get("grace_s") or 60)
    python = sys.executable or "python3"
    host_rank = hosts.index(current)
    is_master = host_rank == 0
    local = is_loopback(master_addr)
    iface = "lo" if local else env.get("SM_NETWORK_INTERFACE_NAME", "eth0")
    try:
        procs = procs_per_host(config, env)
        ensure_horovod(framework, install, python)
        plan = rank_plan(hosts, procs)
    except Exception as exc:  # noqa: BLE001 - every setup failure ends the host with its message
        log(f"ERROR: {exc}")
        write_failure_file(f"hvd_driver on {current}: {exc}")
        return 1
    mine = [s for s in plan if s["hostname"] == current]
    log(
        f"host {current} (host rank {host_rank} of {len(hosts)}): ranks {[s['rank'] for s in mine]} of "
        f"{len(plan)} ({len(hosts)} hosts x {procs}); rendezvous {master_addr}:{port}; Gloo interface {iface}"
    )

    httpd = None
    if is_master:
        try:
            httpd = start_rendezvous(port, hosts, procs)
        except OSError as exc:
            log(f"ERROR: cannot start the rendezvous server on port {port}: {exc}")
            write_failure_file(f"hvd_driver on {current}: rendezvous port {port}: {exc}")
            return 1
        log(f"rendezvous server up on port {port}")
    else:
        deadline = time.monotonic() + wait_s
        while not port_open(master_addr, port):
            if time.monotonic() > deadline:
                msg = f"no rendezvous server at {master_addr}:{port} after {wait_s:g} s (did algo-1 fail?)"
                log(f"ERROR: {msg}")
                write_failure_file(f"hvd_driver on {current}: {msg}")
                return 1
            time.sleep(0.5)

    cmd = [python, entry, *hyperparameters_to_cli_args(hps)]
    log("starting " + shlex.join(cmd) + f" as ranks {[s['rank'] for s in mine]}")
    ranks: list[Rank] = []
    for slot in mine:
        ranks.append(Rank(slot, cmd, {**env, **rank_env(slot, master_addr, port, iface, gloo_timeout_s)}))

    def on_sigterm(signum, frame):  # noqa: ARG001
        log("SIGTERM: stopping this host's ranks")
        for r in ranks:
            r.stop(grace_s=2)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)

    code, failed = 0, None
    master_gone_since = None
    try:
        while any(r.poll() is None for r in ranks):
            bad = next((r for r in ranks if r.poll() not in (None, 0)), None)
            if bad is not None:
                code, failed = 1, bad
                log(f"ERROR: rank {bad.slot['rank']} exited with status {bad.poll()}; stopping this host's other ranks")
                break
            if not is_master:
                if port_open(master_addr, port):
                    master_gone_since = None
                elif master_gone_since is None:
                    master_gone_since = time.monotonic()
                elif time.monotonic() - master_gone_since > grace_s:
                    code = 1
                    log(f"ERROR: algo-1's rendezvous server has been gone for {grace_s:g} s while ranks here still run")
                    break
            time.sleep(0.2 if is_master else 1.0)
        else:
            bad = next((r for r in ranks if r.poll() != 0), None)
            if bad is not None:
                code, failed = 1, bad
                log(f"ERROR: rank {bad.slot['rank']} exited with status {bad.poll()}")
    finally:
        for r in ranks:
            r.stop()
        if httpd is not None:
            httpd.shutdown()
    if code:
        tail = "\n".join(failed.tail[-30:]) if failed else ""
        who = f"rank {failed.slot['rank']} (status {failed.poll()})" if failed else "the job"
        write_failure_file(f"hvd_driver on {current}: {who} failed.\n{tail}")
    log(f"done, exit status {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
