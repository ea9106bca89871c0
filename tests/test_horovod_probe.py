"""Lab 2's all-reduce probe without Horovod: its private loopback, its fallback, its explanation.

The probe itself (horovodrun, real ranks) runs in lab 2's notebook and `test_lab2_horovod.py`; these
tests start no training process.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest

from workshop.errors import WorkshopError
from workshop.launchers import horovod_probe
from workshop.launchers.horovod_probe import (
    HEADER_BYTES,
    MODULE,
    PRIVATE_NETWORK_FLAG,
    RESULT_PREFIX,
    Traffic,
    explain,
    in_private_network,
    measure_allreduce,
    private_network,
)

K = 64 << 20


def _traffic(ranks: int = 2, excess: int = 0, packets: int = 4_000, background: int = 2_000, private: bool = True):
    predicted = 2 * (ranks - 1) * K
    return Traffic(ranks=ranks, bytes_per_rank_tensor=K, measured_bytes=predicted + excess,
                   background_bytes=background, packets=packets, seconds=0.1, repeats=3, private_loopback=private)


def test_explain_credits_the_headers_when_the_numbers_say_so() -> None:
    t = _traffic(excess=4_000 * HEADER_BYTES + 1_500)
    text = explain(t)
    assert HEADER_BYTES == 52  # IPv4 20 + TCP with timestamps 32; lo does not count the link header
    assert f"{4_000 * HEADER_BYTES + 1_500:+,} bytes" in text and f"4,000 x {HEADER_BYTES}" in text
    assert "headers account for the excess" in text and "explain only" not in text


def test_explain_does_not_credit_the_headers_with_a_shared_loopbacks_traffic() -> None:
    # The run lab 2's user saw: ratio 1.1015 on the shared loopback, 3,529.5 excess bytes per packet.
    excess = int(0.1015 * 2 * K)
    t = _traffic(excess=excess, packets=round(excess / 3529.5), private=False)
    text = explain(t)
    assert f"{excess / t.packets:,.1f} bytes per packet" in text and "3,529." in text
    assert "headers account" not in text and "2(N-1)K to within" not in text
    assert "other traffic on this machine's shared loopback" in text
    assert f"only {t.packets * HEADER_BYTES / excess:.0%} of the excess" in text  # what the headers explain


def test_explain_in_a_private_namespace_names_what_else_it_can_be() -> None:
    text = explain(_traffic(excess=4_000 * HEADER_BYTES + 2_000_000))
    assert "segments TCP sent again" in text and "shared loopback" not in text


def test_explain_says_when_the_data_came_to_less_than_the_formula() -> None:
    assert "less than 2(N-1)K" in explain(_traffic(excess=-1_000_000))


def test_explain_on_the_numbers_lab_2_measured_in_a_private_namespace() -> None:
    # N=2 and N=4, K=64 MiB, in lab 2's notebook on a 2-core machine: a few bytes per packet beyond the headers.
    for ranks, excess, background, packets in ((2, 164_410, 4_002, 2_702), (4, 493_760, 13_286, 8_122)):
        t = Traffic(ranks, K, 2 * (ranks - 1) * K + excess, background, packets, 0.2, 3, private_loopback=True)
        text = explain(t)
        assert f"{packets:,} x 52 = {packets * 52:,} bytes" in text, text
        assert f"The other {excess - packets * 52:,} bytes" in text, text
        assert "the data itself was 2(N-1)K to within 0.0" in text, text


def _fake_probe(monkeypatch: pytest.MonkeyPatch, network: tuple[bool, str]) -> list[list[str]]:
    """measure_allreduce with horovodrun stubbed: the commands it would run are collected."""
    import workshop.launchers.horovod as horovod

    commands: list[list[str]] = []
    result = {"ranks": 2, "bytes_per_rank_tensor": 1 << 20, "measured_bytes": 2 << 20, "background_bytes": 10,
              "packets": 40, "seconds": 0.01, "repeats": 1}

    def run(cmd, **kwargs):
        commands.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=RESULT_PREFIX + json.dumps(result) + "\n", stderr="")

    monkeypatch.setattr(horovod_probe, "available", lambda: True)
    monkeypatch.setattr(horovod_probe.shutil, "which", lambda name: sys.executable)
    monkeypatch.setattr(horovod, "check_installed", lambda framework: None)
    monkeypatch.setattr(horovod_probe, "private_network", lambda: network)
    monkeypatch.setattr(horovod_probe.subprocess, "run", run)
    return commands


def test_the_probe_runs_in_a_private_network_where_it_can(monkeypatch, capsys) -> None:
    commands = _fake_probe(monkeypatch, (True, "ok"))
    t = measure_allreduce(2, 1 << 20, repeats=1)
    assert t is not None and t.private_loopback
    assert commands[0][:4] == [sys.executable, "-m", MODULE, PRIVATE_NETWORK_FLAG]
    assert commands[0][4] == sys.executable and "--gloo" in commands[0]  # then horovodrun, unchanged
    assert "shared loopback" not in capsys.readouterr().out
    assert "a private loopback" in horovod_probe.describe(t)


def test_without_namespaces_the_probe_falls_back_and_says_why(monkeypatch, capsys) -> None:
    commands = _fake_probe(monkeypatch, (False, "this system refuses an unprivileged network namespace (EPERM)"))
    t = measure_allreduce(2, 1 << 20, repeats=1)
    out = capsys.readouterr().out
    assert t is not None and not t.private_loopback
    assert commands[0][0] == sys.executable and commands[0][1] == "--gloo"  # horovodrun itself, no wrapper
    assert "shared loopback" in out and "refuses an unprivileged network namespace (EPERM)" in out
    assert "the shared loopback" in horovod_probe.describe(t)
    with pytest.raises(WorkshopError, match="No private network namespace"):
        measure_allreduce(2, 1 << 20, repeats=1, private=True)
    capsys.readouterr()
    measure_allreduce(2, 1 << 20, repeats=1, private=False)
    assert "private=False" in capsys.readouterr().out


CHILD = """
import socket, sys
from workshop.runtime.netcounters import read_loopback
def send(n):
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer = server.accept()[0]
    client.sendall(b"x" * n); client.close()
    got = 0
    while chunk := peer.recv(1 << 16):
        got += len(chunk)
    assert got == n
before = read_loopback()
print("ready", flush=True)
sys.stdin.readline()                      # the parent sends 8 MiB on the machine's loopback meanwhile
between = read_loopback()
send(1 << 20)                             # and this process 1 MiB on its own
after = read_loopback()
print((between - before).tx_bytes, (after - between).tx_bytes, flush=True)
"""


def test_a_private_network_counts_its_own_bytes_and_not_the_machines() -> None:
    ok, why = private_network()
    if not ok:
        pytest.skip(why)
    child = subprocess.Popen(in_private_network([sys.executable, "-c", CHILD]), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        server = socket.create_server(("127.0.0.1", 0))
        with socket.create_connection(server.getsockname()) as client, server.accept()[0] as peer:
            drain = threading.Thread(target=lambda: [None for _ in iter(lambda: peer.recv(1 << 16), b"")])
            drain.start()
            client.sendall(b"y" * (8 << 20))  # 8 MiB on the machine's loopback
            client.shutdown(socket.SHUT_WR)
            drain.join(timeout=30)
        child.stdin.write("go\n")
        child.stdin.flush()
        outside, own = map(int, child.stdout.readline().split())
    finally:
        child.kill() if child.poll() is None else None
        child.wait(timeout=30)
    assert outside < 4096, f"the machine's loopback traffic reached the namespace's counters: {outside} bytes"
    assert (1 << 20) <= own < (1 << 20) * 1.01, own
