"""The local cluster: the SageMaker contract per host, whole tagged lines, fail-fast, no orphans."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest
from conftest import PROBE_CODE
from sagemaker.train.distributed import Torchrun

from workshop.errors import WorkshopError
from workshop.runtime import hostns
from workshop.runtime.local_cluster import (
    MARKER,
    LocalCluster,
    TrainingFailed,
    processes_with_marker,
)


def cluster(tmp_path, hosts=2, procs=2, **kw) -> LocalCluster:
    return LocalCluster(
        PROBE_CODE, "train.py", hosts=hosts, procs_per_host=procs,
        distributed=Torchrun(process_count_per_node=procs), workdir=tmp_path / "run", echo=False, **kw,
    )


def envs(result) -> dict[int, dict]:
    out = {}
    for host in result.hosts:
        for f in host.output_data_dir.glob("env-rank*.json"):
            data = json.loads(f.read_text())
            out[int(data["RANK"])] = data
    return out


def no_processes_left(result) -> bool:
    """Nothing started by this run is alive (the marker is in every process's environment)."""
    ids = {json.loads(f.read_text()).get("pid") for h in result.hosts for f in h.output_data_dir.glob("env-rank*.json")}
    alive = [pid for pid in ids if pid and _alive(pid)]
    return not alive


def _processes_in(folder) -> list:
    import psutil

    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.cwd().startswith(str(folder)) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_contract_variables_per_host_and_rank(tmp_path, channels):
    """The container runtime: each host's /opt/ml, algo-N names, the SDK's sm_train.sh and driver."""
    result = cluster(tmp_path).run({"epochs": 2, "lr": 0.1, "run-name": "probe"}, channels)
    assert result.ok and result.world_size == 4 and result.runtime == "container"
    seen = envs(result)
    assert sorted(seen) == [0, 1, 2, 3]  # torchrun gave every rank a distinct global rank
    for rank, env in seen.items():
        host = "algo-1" if rank < 2 else "algo-2"
        assert env["SM_CURRENT_HOST"] == host
        assert env["SM_CURRENT_HOST_RANK"] == str(rank // 2)
        assert json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-2"]
        assert env["SM_HOST_COUNT"] == "2"
        # SageMaker's names and port, as the SDK's environment.py sets them, resolved by name.
        assert env["SM_MASTER_ADDR"] == "algo-1" == env["MASTER_ADDR"]
        assert env["SM_MASTER_PORT"] == "7777" == env["MASTER_PORT"]
        # Peers by name; the hostname is an instance's, not algo-N, as SageMaker does not promise it.
        assert env["hostname"] == hostns.instance_hostname(host) != host
        assert env["algo-1"] == "127.0.0.1" and env["algo-2"] == "127.0.0.2"
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == str(rank % 2)
        assert env["SM_NUM_GPUS"] == "0" and int(env["SM_NUM_CPUS"]) >= 1
        # The container's own paths: each host's sandbox is its /opt/ml.
        assert env["SM_MODEL_DIR"] == "/opt/ml/model"
        assert env["SM_OUTPUT_DATA_DIR"] == "/opt/ml/output/data"
        assert env["SM_CHECKPOINT_DIR"] == "/opt/ml/checkpoints"
        assert env["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
        assert env["train_files"] == sorted(p.name for p in channels["train"].iterdir())
        assert json.loads(env["SM_CHANNELS"]) == ["train", "test", "code", "sm_drivers"]
        assert json.loads(env["SM_HPS"]) == {"epochs": 2, "lr": 0.1, "run-name": "probe"}
        assert env["SM_HP_EPOCHS"] == "2" and env["SM_HP_RUN_NAME"] == "probe"
        assert json.loads(env["SM_DISTRIBUTED_CONFIG"]) == {"process_count_per_node": 2, "smp": None}
        # SDK v3 runs the script from its own copy of the code channel, with flags from the HPs.
        assert env["cwd"] == "/opt/ml/input/data/code" == env["SM_SOURCE_DIR"]
        assert env["argv"] == ["--epochs", "2", "--lr", "0.1", "--run-name", "probe"]
        assert not any(k.startswith("AWS_") for k in env["all_keys"])  # no caller credentials inside
        # What the service lays out in /opt/ml/input is read-only (its config, its data channels and their
        # contents), but for what the SDK's own scripts write: /opt/ml/input (sm_training.env), the code
        # channel (a .tar.gz source_dir is unpacked there) and sm_drivers (chmod +x sm_train.sh).
        assert env["writable"] == {
            "/opt/ml/input": True, "/opt/ml/input/config": False, "/opt/ml/input/data": False,
            "/opt/ml/input/data/code": True, "/opt/ml/input/data/sm_drivers": True, "/opt/ml/input/data/train": False,
            "/opt/ml/model": True, "/opt/ml/output/data": True, "/opt/ml/checkpoints": True}
    for host in result.hosts:  # written by the SDK's own environment.py, in the host's /opt/ml
        exported = (host.sandbox.input_dir / "sm_training.env").read_text()
        assert f"export SM_CURRENT_HOST='{host.name}'" in exported
    config = json.loads((result.hosts[1].sandbox.config_dir / "resourceconfig.json").read_text())
    assert config["current_host"] == "algo-2" and config["hosts"] == ["algo-1", "algo-2"]
    assert json.loads((result.hosts[0].sandbox.config_dir / "hyperparameters.json").read_text())["epochs"] == "2"
    # The SDK's sm_train.sh ran the SDK's Torchrun driver, which built the SageMaker command line.
    assert any(line.endswith("Running Torchrun Driver") for line in result.lines)
    assert any("torchrun --nnodes=2 --nproc_per_node=2 --master_addr=algo-1 --master_port=7777 --node_rank=1"
               in line for line in result.lines)


@pytest.mark.slow
def test_hosts_start_apart_and_the_job_waits_for_the_late_one(tmp_path, channels):
    """SageMaker's instances finish their set-up at different times: algo-2 starts 6 s late here,
    and the job (torchrun's rendezvous waits for every node) still succeeds."""
    result = cluster(tmp_path, hosts=2, procs=1, start_skew_s=6).run({}, channels)
    seen = envs(result)
    assert result.ok and sorted(seen) == [0, 1]
    algo1, algo2 = result.hosts
    assert algo2.driver_started_s - algo1.driver_started_s >= 5.5
    assert any("starting 6 s after the first host" in line for line in result.lines)
    # The ranks start together: the early host's torchrun waited for the late one.
    assert abs(seen[1]["started"] - seen[0]["started"]) < 3
    early = cluster(tmp_path / "two", hosts=3, procs=1, start_skew_s=[4, 0, 2]).run({}, channels)
    a1, a2, a3 = early.hosts
    assert early.ok and a1.driver_started_s - a2.driver_started_s >= 3.5  # the master last: the others wait


@pytest.mark.slow
def test_a_job_without_a_route_out_has_no_network_but_its_hosts(tmp_path, channels):
    """The default: a private network with only loopback, as the workshop's endpoints-only VPC;
    `pip install` fails there, as in a job that cannot reach PyPI, and a server on this machine is
    out of reach. `internet=True`: the same private network with a way out (an HTTPS proxy on
    this machine's network), as a job with a route to the internet."""
    with socket.socket() as server:  # a server outside the job, on this machine's loopback
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"

        def answer() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(100)
                    conn.sendall(b"pong\n")

        threading.Thread(target=answer, daemon=True).start()
        private = cluster(tmp_path, hosts=2, procs=1, extra_env={"PROBE_PIP": "six", "PROBE_CONNECT": address}).run({}, channels)
        seen = envs(private)
        assert seen[0]["interfaces"] == ["lo"] == seen[1]["interfaces"]
        assert seen[0]["net_ns"] == seen[1]["net_ns"] != os.readlink("/proc/self/ns/net")  # shared, not ours
        assert seen[0]["pip_status"] != 0, seen[0]
        assert seen[0]["connect"].startswith("failed"), seen[0]["connect"]
        online = cluster(tmp_path / "online", hosts=2, procs=1, internet=True,
                         extra_env={"PROBE_CONNECT": address}).run({}, channels)
        seen = envs(online)
        assert seen[0]["interfaces"] == ["lo"] and seen[0]["net_ns"] != os.readlink("/proc/self/ns/net")
        assert seen[0]["connect"] == "pong" == seen[1]["connect"]
        assert seen[0]["hostname"] == hostns.instance_hostname("algo-1") and seen[1]["algo-1"] == "127.0.0.1"


@pytest.mark.slow
def test_process_runtime_points_the_contract_into_the_sandbox(tmp_path, channels):
    """Where Linux namespaces are unavailable: plain processes, the master on loopback."""
    result = cluster(tmp_path, runtime="process").run({"epochs": 2, "lr": 0.1, "run-name": "probe"}, channels)
    assert result.ok and result.runtime == "process"
    seen = envs(result)
    assert sorted(seen) == [0, 1, 2, 3]
    for rank, env in seen.items():
        sandbox = result.hosts[0 if rank < 2 else 1].sandbox
        assert env["SM_MASTER_ADDR"] == "127.0.0.1" == env["MASTER_ADDR"]
        assert env["SM_MASTER_PORT"] == env["MASTER_PORT"]
        assert env["SM_MODEL_DIR"] == str(sandbox.model_dir)
        assert env["SM_CHECKPOINT_DIR"] == str(sandbox.checkpoint_dir)
        assert os.path.samefile(env["SM_CHANNEL_TRAIN"], channels["train"])
        assert json.loads(env["SM_CHANNELS"]) == ["train", "test"]
        assert env["cwd"] == str(sandbox.code_dir) == env["SM_SOURCE_DIR"]


@pytest.mark.slow
def test_one_host_jobs_do_not_share_torchruns_default_port(tmp_path, channels):
    """With one host the SDK's driver passes no --master_port; torchrun would take 29500. (The
    container runtime gives every job a network of its own, where no port is shared.)"""
    result = cluster(tmp_path, hosts=1, procs=2, runtime="process").run({}, channels)
    seen = envs(result)
    assert sorted(seen) == [0, 1]
    assert {env["MASTER_PORT"] for env in seen.values()} == {seen[0]["SM_MASTER_PORT"]} != {"29500"}


@pytest.mark.slow
def test_lines_are_whole_tagged_and_parsed(tmp_path, channels):
    result = cluster(tmp_path, hosts=2, procs=1).run({}, channels)
    for rank, host in ((0, "algo-1"), (1, "algo-2")):
        assert f"[{host}/{rank}] rank {rank} says: part one, part two" in result.lines
    assert any(line.startswith("[algo-1] Executing command: torchrun") for line in result.lines)
    assert result.per_rank("train_loss") == {0: 1.0, 1: 0.5}
    assert {r["host"] for r in result.records} == {"algo-1", "algo-2"}
    log = result.log_path.read_text()
    assert "[algo-2/1] rank 1 says: part one, part two" in log
    assert (result.workdir / "logs" / "algo-2.log").is_file()


@pytest.mark.slow
def test_a_failing_rank_stops_every_host_and_shows_its_traceback(tmp_path, channels):
    c = cluster(tmp_path, extra_env={"PROBE_FAIL_RANK": "3", "PROBE_SLEEP": "600"})
    t0 = time.monotonic()
    with pytest.raises(TrainingFailed) as info:
        c.run({}, channels)
    elapsed = time.monotonic() - t0
    result = info.value.result
    assert result.returncode != 0
    first_line = str(info.value).splitlines()[0]
    assert first_line == "Rank 3 on algo-2 exited with status 1: RuntimeError: deliberate failure on rank 3", first_line
    assert "RuntimeError: deliberate failure on rank 3" in str(info.value)
    # The healthy ranks were asleep for 600 s: they were stopped, not waited for.
    assert elapsed < 120, elapsed
    assert not any("rank 0 done" in line for line in result.lines)
    assert no_processes_left(result)


@pytest.mark.slow
def test_timeout_stops_everything(tmp_path, channels):
    result = cluster(tmp_path, extra_env={"PROBE_SLEEP": "600"}).run({}, channels, timeout_s=8, check=False)
    assert result.returncode == 124 and "time limit" in result.failure
    assert no_processes_left(result)


@pytest.mark.slow
def test_interrupt_stops_everything(tmp_path, channels):
    """Ctrl-C, or a notebook's interrupt button, raises KeyboardInterrupt in the waiting call.

    The test installs what it needs rather than trusting what pytest inherited (run as a
    background job, SIGINT is ignored and the interrupt would never arrive): Python's own SIGINT
    handler, SIGINT unblocked. And it interrupts once every rank has started (each writes its
    env-rank*.json), however long that takes on a busy machine, not after a fixed time.
    """
    c = cluster(tmp_path, extra_env={"PROBE_SLEEP": "600"})
    done = threading.Event()

    def interrupt_once_every_rank_runs() -> None:
        deadline = time.monotonic() + 300
        while not done.is_set() and time.monotonic() < deadline:
            if len(list((tmp_path / "run").rglob("env-rank*.json"))) == 4:
                os.kill(os.getpid(), signal.SIGINT)
                return
            done.wait(0.2)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    waiter = threading.Thread(target=interrupt_once_every_rank_runs, daemon=True)
    waiter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            c.run({}, channels, timeout_s=400)  # never interrupted: TrainingFailed (time limit), not a hang
    finally:
        done.set()
        waiter.join()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
    pids = [json.loads(f.read_text())["pid"] for f in (tmp_path / "run").rglob("env-rank*.json")]
    assert len(pids) == 4, "the probe's ranks never all started"
    assert not [pid for pid in pids if _alive(pid)]


def test_marker_sweep_finds_processes_of_this_cluster_only(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, MARKER: "sweep-test"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        time.sleep(0.5)
        assert [p.pid for p in processes_with_marker("sweep-test")] == [proc.pid]
        assert processes_with_marker("another-cluster") == []
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hosts": 0}, "hosts must be a whole number of at least 1"),
        ({"procs_per_host": 0}, "procs_per_host must be"),
    ],
)
def test_bad_cluster_shapes_fail_before_anything_starts(tmp_path, kwargs, message):
    with pytest.raises(WorkshopError, match=message):
        LocalCluster(PROBE_CODE, workdir=tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()


def test_missing_channel_fails_before_anything_starts(tmp_path, channels):
    c = cluster(tmp_path)
    with pytest.raises(WorkshopError, match="(?s)'train' data channel points to .*python -m workshop.datasets"):
        c.run({}, {"train": tmp_path / "nowhere", "test": channels["test"]})
    with pytest.raises(WorkshopError, match="reserved"):
        c.run({}, {"code": channels["train"]})
    assert not (tmp_path / "run").exists()


def test_port_in_use_is_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(WorkshopError, match=f"Port {port} .* already in use"):
            LocalCluster(PROBE_CODE, master_port=port)


@pytest.mark.slow
def test_a_killed_notebook_kernel_takes_its_cluster_with_it(tmp_path, channels):
    """SIGKILL of the process that started the cluster (a kernel restart) leaves nothing behind."""
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from sagemaker.train.distributed import Torchrun;"
        "from workshop.runtime.local_cluster import LocalCluster;"
        "c = LocalCluster(sys.argv[2], hosts=2, procs_per_host=2, distributed=Torchrun(process_count_per_node=2),"
        " workdir=sys.argv[3], echo=False, extra_env={'PROBE_SLEEP': '600'});"
        "c.run({}, {'train': sys.argv[4]})"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, str(PROBE_CODE.parent.parent.parent), str(PROBE_CODE),
                               str(tmp_path / "run"), str(channels["train"])])
    try:
        deadline = time.monotonic() + 120
        while len(list((tmp_path / "run").rglob("env-rank*.json"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        pids = [json.loads(f.read_text())["pid"] for f in (tmp_path / "run").rglob("env-rank*.json")]
        assert len(pids) == 4, "the probe ranks never started"
        parent.kill()
        parent.wait()
        # The hosts' drivers get SIGTERM from the kernel (PR_SET_PDEATHSIG) and pass it to
        # torchrun, which stops its ranks: a few seconds, not the 600 the ranks would sleep.
        deadline = time.monotonic() + 60
        while ([p for p in pids if _alive(p)] or _processes_in(tmp_path / "run")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [p for p in pids if _alive(p)], "ranks outlived the process that started them"
        # Nor any launcher: every host's driver and torchrun ran inside the run folder.
        assert not _processes_in(tmp_path / "run"), "launchers outlived the process that started them"
    finally:
        parent.kill()
