"""SageMaker SDK v3 driver for Horovod jobs (lab 2): exactly hosts x processes-per-host ranks.

    python hvd_driver.py          # with the SM_* variables of a SageMaker training host

`workshop.launchers.horovod.Horovod` is the `DistributedConfig` whose `driver_dir` holds this file.
`ModelTrainer` copies the folder into the `sm_drivers` channel and `sm_train.sh` runs this
driver on every host; locally, `workshop.runtime.local_cluster` runs it once per simulated host.

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

- Every host waits for every other before starting ranks. SageMaker's instances start, and
  finish their set-up (image pull, installing Horovod), minutes apart, while a rank waits for
  its peers only HOROVOD_GLOO_TIMEOUT_SECONDS (`gloo_timeout_s`). So each host, once set up,
  PUTs `workshop_ready/<host>` into the rendezvous server's key-value store on algo-1, and
  no host starts its ranks (and the Gloo clock) until every host's key is there. The wait is
  bounded by `rendezvous_wait_s` from the driver's start; past it the host fails naming the
  hosts that never reported ready. A host whose set-up fails reports `failed: <why>`
  under its key when it can, so the others stop at once with that reason.

Failure: a rank that exits non-zero stops this host's other ranks and fails the host (exit
status 1, failure file written); ranks on other hosts lose their Gloo peer and fail within
HOROVOD_GLOO_TIMEOUT_SECONDS (`gloo_timeout_s`), so nothing waits for `max_run`. Hosts other
than algo-1 wait at most `rendezvous_wait_s` for algo-1's rendezvous server, and stop their
ranks if it disappears (algo-1 ended) while they still run, after `grace_s`.

Horovod itself: no current SageMaker image ships it, and building it takes minutes. With
`install: "wheel"` the job has an input channel `horovod` (SM_CHANNEL_HOROVOD) holding the
wheel a one-host build job made once for this image (`hvd_build.py`, `workshop.launchers.horovod`) and
the wheels of its dependencies: the driver installs from it with
`pip install --no-index --find-links`, no PyPI needed. Where Horovod imports already (an image
built from 2_horovod/docker/Dockerfile, `install: "none"`, or the local cluster) nothing is
installed. Missing Horovod fails at once with the fix. On a host with GPUs (SM_NUM_GPUS > 0)
a Horovod built without NCCL is refused: its ranks would silently train on the CPU.

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
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Shared copy: keep identical in every script that has it (tests/test_copies.py).
DEFAULT_FAILURE_FILE = "/opt/ml/output/failure"
EXTENSIONS = {"pytorch": "horovod.torch", "tensorflow": "horovod.tensorflow"}
# Shared copy: keep identical in every script that has it (tests/test_copies.py).
HOROVOD_VERSION = "0.28.1"  # workshop.launchers.horovod.HOROVOD_VERSION (a test keeps them equal)
WHEEL_CHANNEL_ENV = "SM_CHANNEL_HOROVOD"  # the `horovod` input channel of wheels
READY_SCOPE = "workshop_ready"  # key-value scope on algo-1's rendezvous server: host -> ready/failed
GPU_FIX = (
    "use a CPU instance type (e.g. ml.c5.2xlarge: the workshop's Horovod wheel uses Gloo), or an image "
    "whose Horovod is built with NCCL (2_horovod/docker/Dockerfile on a GPU base with "
    "--build-arg HOROVOD_GPU=--gpu) passed as image_uri"
)


def log(message: str) -> None:
    print(f"[hvd_driver] {message}", flush=True)


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


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


def probe_horovod(framework: str, python: str) -> tuple[str | None, bool]:
    """(None, nccl_built) if Horovod with `framework` imports in `python`, else (what failed, False)."""
    module = EXTENSIONS.get(framework, "horovod")
    code = f"import {module} as hvd; print('NCCL_BUILT=%d' % int(bool(hvd.nccl_built())))"
    probe = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    if probe.returncode == 0:
        return None, "NCCL_BUILT=1" in probe.stdout
    lines = [ln for ln in probe.stderr.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else f"`import {module}` exited with status {probe.returncode}"), False


def install_from_channel(channel: str, python: str, extra_args: list[str] | None = None) -> None:
    """`pip install --no-index --find-links CHANNEL horovod==VERSION`: the channel's wheels only."""
    wheels = sorted(p.name for p in Path(channel).glob("*.whl"))
    if not any(name.startswith(f"horovod-{HOROVOD_VERSION}-") for name in wheels):
        raise RuntimeError(
            f"the horovod channel ({channel}) has no horovod-{HOROVOD_VERSION} wheel (it has: "
            f"{', '.join(wheels) or 'nothing'}). Fix: let workshop.launchers.horovod build it again (delete its "
            "S3 prefix), or pass an image with Horovod as image_uri."
        )
    cmd = [python, "-m", "pip", "install", "--no-index", "--find-links", channel, "--no-warn-script-location",
           *(extra_args or []), f"horovod=={HOROVOD_VERSION}"]
    log("installing Horovod from the horovod channel, no index: " + shlex.join(cmd))
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"installing Horovod from the horovod channel failed (status {done.returncode}):\n{tail}")
    log(f"installed Horovod from the channel in {time.monotonic() - t0:.1f} s")


def ensure_horovod(framework: str, install: str, python: str, channel: str | None, num_gpus: int) -> None:
    """Horovod with `framework` importable (installed from the wheel channel if need be), and
    built with NCCL if this host has GPUs. Raises RuntimeError with the fix otherwise."""
    problem, nccl = probe_horovod(framework, python)
    if problem is None:
        if channel:
            log(f"Horovod with {framework} already imports here; not installing from the horovod channel")
    elif channel:
        log(f"Horovod with {framework} does not import here yet ({problem})")
        install_from_channel(channel, python)
        problem, nccl = probe_horovod(framework, python)
        if problem:
            raise RuntimeError(f"Horovod was installed from the horovod channel but {EXTENSIONS.get(framework)} "
                               f"does not import: {problem}. The wheel was built for another image or framework "
                               "version; fix: delete its S3 prefix so that the next job builds it again for this image.")
    elif install == "wheel":
        raise RuntimeError(
            f"Horovod with {framework} support does not import in this image ({problem}), and the job has no "
            "`horovod` input channel with its wheel. Fix: start the job with workshop.runner."
            "run_on_sagemaker (it builds the wheel once and adds the channel), or add the channel "
            "yourself (InputData(channel_name='horovod', data_source=<the wheel's S3 prefix>)), or pass an "
            "image with Horovod as image_uri (2_horovod/docker/Dockerfile)."
        )
    else:
        raise RuntimeError(
            f"Horovod with {framework} support does not import in this image ({problem}). No current "
            "SageMaker image ships Horovod. Fix: run the job through workshop.runner."
            "run_on_sagemaker, which installs a wheel built once for the image from the `horovod` "
            "channel, or build a reusable image from 2_horovod/docker/Dockerfile and pass it as image_uri."
        )
    if num_gpus > 0 and not nccl:
        raise RuntimeError(
            f"this host has {num_gpus} GPU(s) but its Horovod was built without NCCL "
            f"({EXTENSIONS.get(framework)}.nccl_built() is false): the ranks would train on the CPU and "
            f"leave the GPUs idle. Fix: {GPU_FIX}."
        )
    log(f"Horovod {framework} extension imports (NCCL {'built' if nccl else 'not built: CPU/Gloo only'})")


# ----------------------------------------------------------------------------- every host ready


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # algo-1 is never behind a proxy


def kv_url(addr: str, port: int, key: str) -> str:
    return f"http://{addr}:{port}/{READY_SCOPE}/{key}"


def kv_put(addr: str, port: int, key: str, value: str, timeout: float = 5.0) -> None:
    request = urllib.request.Request(kv_url(addr, port, key), data=value.encode(), method="PUT")
    with _NO_PROXY.open(request, timeout=timeout):
        pass


def kv_get(addr: str, port: int, key: str, timeout: float = 5.0) -> str | None:
    """The value under `key`, None if it is not there yet; OSError if the server cannot be reached."""
    try:
        with _NO_PROXY.open(kv_url(addr, port, key), timeout=timeout) as response:
            return response.read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise OSError(f"rendezvous server answered {exc.code}") from None


def report(addr: str, port: int, host: str, status: str) -> bool:
    """Put this host's status ("ready" or "failed: ...") on algo-1; False if it cannot be reached."""
    try:
        kv_put(addr, port, host, status)
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_for_hosts(addr: str, port: int, hosts: list[str], deadline: float, wait_s: float, poll_s: float = 0.5,
                   server_gone_s: float = 15.0) -> None:
    """Return once every host reported ready; raise RuntimeError naming the missing or failed ones."""
    pending = list(hosts)
    unreachable_since = None
    while True:
        still = []
        for host in pending:
            try:
                value = kv_get(addr, port, host)
            except OSError:
                still = pending
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > server_gone_s:
                    raise RuntimeError(f"the rendezvous server at {addr}:{port} went away while hosts "
                                       f"{', '.join(pending)} were not ready yet (did algo-1 fail?)") from None
                break
            unreachable_since = None
            if value is None:
                still.append(host)
            elif value.startswith("failed"):
                raise RuntimeError(f"host {host} reported that its set-up {value}")
        pending = still
        if not pending:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"host{'s' if len(pending) > 1 else ''} {', '.join(pending)} did not report ready within "
                f"rendezvous_wait_s={wait_s:g} s of this host's start (not ready: {', '.join(pending)}; ready: "
                f"{', '.join(h for h in hosts if h not in pending) or 'none'}). Their instances started late or "
                "their set-up failed or hangs: see their logs. Fix: a larger rendezvous_wait_s if they were "
                "only slow."
            )
        time.sleep(poll_s)


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
    started = time.monotonic()
    deadline = started + wait_s  # every wait for the other hosts ends here
    channel = env.get(WHEEL_CHANNEL_ENV) or None
    if channel and not os.path.isdir(channel):
        channel = None
    num_gpus = int(env.get("SM_NUM_GPUS", "0") or 0)
    try:
        procs = procs_per_host(config, env)
        ensure_horovod(framework, install, python, channel, num_gpus)
        plan = rank_plan(hosts, procs)
    except Exception as exc:  # noqa: BLE001 - every setup failure ends the host with its message
        log(f"ERROR: {exc}")
        write_failure_file(f"hvd_driver on {current}: {exc}")
        if not is_master and port_open(master_addr, port):  # tell the others, so they stop now
            report(master_addr, port, current, f"failed on {current}: {exc}"[:2000])
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
        while not port_open(master_addr, port):
            if time.monotonic() > deadline:
                msg = f"no rendezvous server at {master_addr}:{port} after {wait_s:g} s (did algo-1 fail?)"
                log(f"ERROR: {msg}")
                write_failure_file(f"hvd_driver on {current}: {msg}")
                return 1
            time.sleep(0.5)

    # No rank starts (and no Gloo timeout runs) before every host is set up.
    try:
        if not report(master_addr, port, current, "ready"):
            raise RuntimeError(f"cannot reach the rendezvous server at {master_addr}:{port} to report ready")
        left = max(0.0, deadline - time.monotonic())
        log(f"{current} is ready; waiting for all {len(hosts)} hosts to report ready (at most {left:.0f} s more)")
        wait_for_hosts(master_addr, port, hosts, deadline, wait_s)
    except RuntimeError as exc:
        log(f"ERROR: {exc}")
        write_failure_file(f"hvd_driver on {current}: {exc}")
        if httpd is not None:
            httpd.shutdown()
        return 1
    log(f"every host is ready ({time.monotonic() - started:.1f} s after this driver started); starting the ranks")

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
