"""Simulated SageMaker hosts as the container sees them: `/opt/ml`, `algo-N`, and the job's network.

A SageMaker training host is a container whose `/opt/ml` holds the job's config, data, code and
drivers, whose peers resolve as `algo-1..algo-N`, and whose network is the job's (the internet, or
only what a VPC subnet routes to). Its hostname is NOT promised to be `algo-N`: SageMaker's guide
says not to rely on `/etc/hostname` in a training container, and the images' entry point
(`start_with_right_hostname.sh`, which makes `gethostname()` answer `algo-N`) is replaced by
ModelTrainer's `/bin/bash`. The local cluster gives each of its simulated hosts the same view with
Linux namespaces, no privileges needed (`unshare -r`, as the benchmarks already use):

- a **user namespace** (we are "root" inside it, which lets us do the rest);
- a **network namespace** per job, shared by its hosts, holding only a loopback interface: the
  hosts reach each other and nothing else, as in the workshop's endpoints-only VPC or a job with
  network isolation. A job that has a route to the internet gets a way out too: an HTTP CONNECT
  proxy (`HTTPS_PROXY`, which pip, boto3 and urllib honour) served from this machine's network,
  so its hosts still have a network of their own and SageMaker's fixed ports (7777 and up) never
  meet another job's;
- a **mount namespace** per host, in which the host's sandbox folder is mounted at `/opt/ml` and a
  hosts file maps `algo-N` to `127.0.0.N` (every 127/8 address is local to the loopback
  interface, so each host has an address of its own). What the service lays out in
  `/opt/ml/input` before the container starts is mounted read-only where the SDK's own scripts
  do not write (`mount_input_read_only`): SageMaker does not document it as writable;
- a **UTS namespace** per host, whose hostname is an instance's, `ip-10-0-1-N.ec2.internal`
  (`instance_hostname`), not `algo-N`. It resolves, through the same hosts file, to `127.1.0.N`: an
  address of the host's that is not the one `algo-N` resolves to. So whatever works out "which host
  am I" from the hostname (torchrun's c10d rendezvous, unless told `is_host`) gets it wrong here, as
  it can on SageMaker, instead of passing by luck; a job must go by `SM_CURRENT_HOST`.

So the SDK's generated `sm_train.sh` runs unchanged: it reads `/opt/ml/input/config`, writes
`/opt/ml/input/sm_training.env`, `cd`s into `/opt/ml/input/data/code` and runs the driver, which
builds `torchrun --master_addr=algo-1 --master_port=7777 ...` exactly as on SageMaker.

Where Linux does not allow unprivileged namespaces (another OS, a hardened kernel, a container
without them), `available()` says why and the local cluster falls back to plain processes with the
master on 127.0.0.1, and says so.

Entry points (run by the local cluster, not by hand):

    python -m workshop.runtime.hostns hold [--proxy]        # holds the job's user and network namespaces
    python -m workshop.runtime.hostns host SPEC.json        # one simulated host: enter, mount, run
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from workshop.runtime.processes import PARENT_ENV, DeferredInterrupt, forward_sigterm

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000
MNT_DETACH = 0x2
# statvfs's flags for a mount's settings, and the mount flags they stand for (a remount in a user
# namespace must keep those it inherited, or the kernel refuses it).
_KEPT_MOUNT_FLAGS = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC,
                     os.ST_NOATIME: MS_NOATIME, os.ST_NODIRATIME: MS_NODIRATIME, os.ST_RELATIME: MS_RELATIME}
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

CONTAINER_ROOT = "/opt/ml"
HOSTS_FILE = "/etc/hosts"
INPUT_CONFIG = f"{CONTAINER_ROOT}/input/config"
INPUT_DATA = f"{CONTAINER_ROOT}/input/data"
# The SDK's own channels, which its own scripts write (see `mount_input_read_only`).
WRITABLE_CHANNELS = ("code", "sm_drivers")
# Loopback addresses of the simulated hosts: algo-N is 127.0.0.N (127/8 is all loopback on Linux).
HOST_ADDRESS = "127.0.0.{}"
# A simulated host's hostname (its UTS name), as an EC2 instance's, and the address it resolves to: one
# of the host's own that no `algo-N` name resolves to (see the module's docstring).
INSTANCE_HOSTNAME = "ip-10-0-1-{}.ec2.internal"
INSTANCE_ADDRESS = "127.1.0.{}"
# Inside a job's private network: where its way out listens, for a job with a route to the internet.
PROXY_PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"


def proxy_env(hosts: list[str]) -> dict[str, str]:
    """The variables that send a job's web traffic out through its namespace's proxy."""
    no_proxy = ",".join(["localhost", "127.0.0.1", *hosts])
    return {"HTTPS_PROXY": PROXY_URL, "HTTP_PROXY": PROXY_URL, "https_proxy": PROXY_URL,
            "http_proxy": PROXY_URL, "NO_PROXY": no_proxy, "no_proxy": no_proxy}


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    # The C library this process already has loaded: no ctypes.util.find_library, which runs
    # ldconfig in a subprocess (also in a child between fork and exec, via die_with_parent).
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def unshare(flags: int) -> None:
    _check(_libc().unshare(flags), "unshare")


def setns(path: str, nstype: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _check(_libc().setns(fd, nstype), f"setns {path}")
    finally:
        os.close(fd)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source} on {target}")


def umount(target: str) -> None:
    _check(_libc().umount2(target.encode(), MNT_DETACH), f"umount {target}")


def mount_read_only(path: str) -> None:
    """Make `path` (a folder; a link is followed) read-only in this mount namespace: a bind mount of
    itself, remounted read-only with the settings its file system already has."""
    real = os.path.realpath(path)
    mount(real, real, None, MS_BIND | MS_REC)
    flags = os.statvfs(real).f_flag
    kept = 0
    for st_flag, ms_flag in _KEPT_MOUNT_FLAGS.items():
        if flags & st_flag:
            kept |= ms_flag
    mount(None, real, None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept)


def mount_input_read_only() -> None:
    """Make read-only what SageMaker lays out in /opt/ml/input before the container starts and
    does not document as writable, leaving writable only what the SDK's own scripts write:

    - `/opt/ml/input/config` (the job's config files): read-only;
    - `/opt/ml/input/data` itself (no entry can be added or removed) and every data channel, with
      its contents (a channel is a link to its data here; on SageMaker a FastFile channel is a
      read-only mount): read-only;
    - the `sm_drivers` and `code` channels: writable, as SDK v3 needs them (its container arguments
      run `chmod +x /opt/ml/input/data/sm_drivers/sm_train.sh`, and its sm_train.sh unpacks a
      `.tar.gz` source_dir inside `code`);
    - `/opt/ml/input` itself: writable, for sm_train.sh writes `/opt/ml/input/sm_training.env`
      there (so every SDK v3 job needs it). /opt/ml/model, /opt/ml/output and /opt/ml/checkpoints
      are the job's to write.
    """
    mount_read_only(INPUT_CONFIG)
    for entry in sorted(Path(INPUT_DATA).iterdir()):
        if entry.name in WRITABLE_CHANNELS and not entry.is_symlink():
            # A mount of its own: it stays writable when its folder is remounted read-only below.
            mount(str(entry), str(entry), None, MS_BIND | MS_REC)
        elif entry.is_dir():
            mount_read_only(str(entry))
    mount_read_only(INPUT_DATA)


def sethostname(name: str) -> None:
    data = name.encode()
    _check(_libc().sethostname(data, len(data)), "sethostname")


def map_root(uid: int, gid: int) -> None:
    """Inside a new user namespace: be root there, mapped to our own uid/gid outside."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def loopback_up() -> None:
    """`ip link set lo up`, without iproute2: a new network namespace's loopback starts down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def hosts_file_text(hosts: list[str]) -> str:
    """/etc/hosts of a simulated host: localhost, algo-N at 127.0.0.N, and each host's instance
    hostname at an address of its own (`instance_hostname`)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for name in hosts:
        lines.append(f"{host_address(name)}\t{name}")
    for name in hosts:
        lines.append(f"{INSTANCE_ADDRESS.format(_host_number(name))}\t{instance_hostname(name)}")
    return "\n".join(lines) + "\n"


def _host_number(name: str) -> int:
    number = int(name.rsplit("-", 1)[-1])
    if not 1 <= number <= 254:
        raise ValueError(f"host {name!r}: at most 254 simulated hosts have loopback addresses of their own")
    return number


def host_address(name: str) -> str:
    """algo-N -> 127.0.0.N (N up to 254)."""
    return HOST_ADDRESS.format(_host_number(name))


def instance_hostname(name: str) -> str:
    """algo-N -> the hostname its simulated host has: ip-10-0-1-N.ec2.internal, not algo-N."""
    return INSTANCE_HOSTNAME.format(_host_number(name))


# ----------------------------------------------------------------------------- can we?


@lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """Whether this machine lets an unprivileged process make the namespaces, and if not, why."""
    if not sys.platform.startswith("linux"):
        return False, f"Linux namespaces do not exist on {sys.platform}"
    if not Path("/opt").is_dir() or not Path(HOSTS_FILE).is_file():
        return False, "this system has no /opt folder or no /etc/hosts to stand in for"
    probe = subprocess.run(
        entry_command("probe"),
        capture_output=True, text=True, timeout=60, env=_clean_env(),
    )
    if probe.returncode == 0 and probe.stdout.strip() == "ok":
        return True, "user, network, mount and UTS namespaces"
    reason = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
    return False, f"this kernel refuses unprivileged namespaces ({reason})"


# The folder the `workshop` package is in: how its own processes (below) import it without `site`.
PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)


def entry_command(*args: str) -> list[str]:
    """`python -m workshop.runtime.hostns ARGS`, for the processes that make and enter the namespaces
    (the probe, the holder, each host's entry). They import only the standard library and this
    package, so they start without `site` (-S; it finds the package through PYTHONPATH, see
    `with_package`): its .pth files cost a tenth of a second or more per process, and the holder and a
    host's entry start one after the other before each job's hosts run anything."""
    return [sys.executable, "-S", "-m", "workshop.runtime.hostns", *args]


def with_package(env: dict[str, str]) -> dict[str, str]:
    """`env` with PACKAGE_ROOT first on PYTHONPATH (for `entry_command`'s processes)."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)}


def _clean_env() -> dict[str, str]:
    return with_package(dict(os.environ))


def _probe() -> int:
    """In a child: every step a host takes, on a throwaway copy of /opt/ml."""
    import tempfile

    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWUTS)
    map_root(uid, gid)
    loopback_up()
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    sethostname(instance_hostname("algo-1"))
    with tempfile.TemporaryDirectory() as tmp:
        hosts = Path(tmp) / "hosts"
        hosts.write_text(hosts_file_text(["algo-1", "algo-2"]))
        mount(str(hosts), HOSTS_FILE, None, MS_BIND)
        sandbox = Path(tmp) / "sandbox"
        sandbox.mkdir()
        (sandbox / "input" / "config").mkdir(parents=True)
        _mount_opt_ml(sandbox, Path(tmp) / "opt-stash")
        (Path(CONTAINER_ROOT) / "probe").write_text("x")
        assert (sandbox / "probe").read_text() == "x"
        mount_read_only(INPUT_CONFIG)
        try:
            (Path(INPUT_CONFIG) / "probe").write_text("x")
            raise AssertionError(f"{INPUT_CONFIG} is still writable after a read-only remount")
        except OSError as exc:
            if exc.errno != errno.EROFS:
                raise
        umount(INPUT_CONFIG)  # else the folder is busy, and the temporary folder stays
        assert socket.gethostbyname("algo-2") == "127.0.0.2"
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
    print("ok")
    return 0


# ----------------------------------------------------------------------------- the job's namespaces


class NamespaceHolder:
    """A process holding the job's user namespace and its private network (with `proxy`, a way
    out of it: see `_egress`).

    Hosts join it with setns; it lives until `close()` (or until this process dies: it gets
    SIGKILL then, and the namespaces live on only as long as a host is still in them).
    """

    def __init__(self, *, proxy: bool = False):
        cmd = entry_command("hold", *(["--proxy"] if proxy else []))
        # No preexec_fn (the holder asks to die with us itself, see die_with_parent_from_start):
        # Python code between fork and exec can deadlock on a lock another thread held, and a
        # Ctrl-C inside Popen would lose the process it started.
        with DeferredInterrupt():
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={**_clean_env(), PARENT_ENV: str(os.getpid())}, start_new_session=True,
            )
        try:
            line = self.proc.stdout.readline().decode().strip()
        except BaseException:  # Ctrl-C while it starts: nobody else knows this process
            self.proc.kill()
            self.proc.wait()
            raise
        if line != "ready":
            err = self.proc.stderr.read().decode().strip() if self.proc.poll() is not None else ""
            self.close()
            raise OSError(f"could not create the job's namespaces: {err or line or 'no answer'}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        # Killed, not asked: it has nothing to save (the namespaces go with the last process in
        # them), and its interpreter's orderly exit would only make every job end later.
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream:
                with contextlib.suppress(OSError):
                    stream.close()


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Runs in a child (before exec, or after fork): `sig` reaches it when its parent dies."""
    if sys.platform.startswith("linux"):
        try:
            _libc().prctl(1, sig)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def die_with_parent_from_start(sig: int) -> None:
    """`die_with_parent(sig)`, called by a started process itself, first thing, instead of in a
    `preexec_fn` by the process that starts it (see `Supervisor._start` in workshop.runtime.supervisor).

    The parent passes its pid in PARENT_ENV. One that died before this ran (between our exec
    and now) sends no signal; we were adopted by another process then, which the pid shows, and
    we leave at once, having started nothing yet.
    """
    expected = os.environ.pop(PARENT_ENV, "")
    die_with_parent(sig)
    if expected.isdigit() and os.getppid() != int(expected):
        os._exit(128 + sig)


def _hold(proxy: bool) -> int:
    """Make the namespaces; with `proxy`, also the job's way out (see `_egress`)."""
    die_with_parent_from_start(signal.SIGKILL)
    uid, gid = os.getuid(), os.getgid()
    if proxy:
        inside, outside = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.fork() == 0:  # the child keeps this machine's network: it makes the outbound connections
            inside.close()
            die_with_parent(signal.SIGKILL)
            _egress(outside)
            os._exit(0)
        outside.close()
    unshare(CLONE_NEWUSER | CLONE_NEWNET)
    map_root(uid, gid)
    loopback_up()
    if proxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", PROXY_PORT))
        listener.listen(64)

        def hand_over() -> None:  # each connection's socket goes to the child, which serves it
            while True:
                conn, _ = listener.accept()
                socket.send_fds(inside, [b"c"], [conn.fileno()])
                conn.close()

        threading.Thread(target=hand_over, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # until the local cluster closes our stdin (or dies)
    return 0


def _egress(channel: socket.socket) -> None:
    """An HTTP CONNECT proxy on this machine's network, for the sockets the job's namespace
    hands over: a job with a route to the internet reaches it through `HTTPS_PROXY` (pip, boto3,
    urllib honour it), while its hosts keep a network of their own (so SageMaker's fixed ports,
    7777 and up, never meet another job's)."""
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(channel, 1, 1)
        except OSError:
            return
        if not fds:
            return  # the holder is gone
        threading.Thread(target=_serve_connect, args=(socket.socket(fileno=fds[0]),), daemon=True).start()


def _serve_connect(client: socket.socket) -> None:
    upstream = None
    try:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
        request, _, rest = head.partition(b"\r\n\r\n")
        method, target, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split()
        if method != "CONNECT":
            client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        host, _, port = target.rpartition(":")
        try:
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=30)
        except OSError as exc:
            client.sendall(f"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nX-Reason: {exc}\r\n\r\n".encode())
            return
        upstream.settimeout(None)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        if rest:
            upstream.sendall(rest)
        _pipe(client, upstream)
    except (OSError, ValueError):
        pass
    finally:
        client.close()
        if upstream is not None:
            upstream.close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    def copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=copy, args=(b, a), daemon=True)
    other.start()
    copy(a, b)
    other.join()


# ----------------------------------------------------------------------------- one host


@dataclass
class HostSpec:
    """What one simulated host needs; written as JSON for `python -m workshop.runtime.hostns host`."""

    name: str  # algo-N
    hostname: str  # its UTS name (`instance_hostname`)
    sandbox: str  # mounted at /opt/ml
    hosts_file: str  # mounted at /etc/hosts
    command: list[str]
    holder_pid: int  # the NamespaceHolder whose user and network namespaces the host joins
    stash: str  # an empty folder outside the sandbox, for the original /opt
    start_delay_s: float = 0.0
    cpus: list[int] = field(default_factory=list)  # CPU affinity of the host (empty: all)
    checkpoints: str = ""  # a folder mounted at /opt/ml/checkpoints (the run's checkpoint_dir); "": the sandbox's
    # The container's PYTHONPATH (None: unset), put back before `command` runs: the entry process's own
    # has the package first (`with_package`).
    pythonpath: str | None = None

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path


def _mount_opt_ml(sandbox: Path, stash: Path) -> None:
    """Mount `sandbox` at /opt/ml, leaving everything else in /opt where it was.

    /opt/ml does not exist on this machine and we may not create it there, so: move the real /opt
    aside (a bind mount into `stash`), put an empty tmpfs on /opt, mount each original entry back
    into it, then add ml/.
    """
    opt = Path("/opt")
    if (opt / "ml").is_dir():  # a machine that has one (a SageMaker notebook instance): mount over it
        mount(str(sandbox), CONTAINER_ROOT, None, MS_BIND | MS_REC)
        return
    stash.mkdir(parents=True, exist_ok=True)
    mount(str(opt), str(stash), None, MS_BIND | MS_REC)
    mount("tmpfs", str(opt), "tmpfs", 0, "mode=755")
    for entry in sorted(stash.iterdir()):
        target = opt / entry.name
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry))
            continue
        if entry.is_dir():
            target.mkdir()
        else:
            target.touch()
        mount(str(entry), str(target), None, MS_BIND | MS_REC)
    (opt / "ml").mkdir()
    mount(str(sandbox), CONTAINER_ROOT, None, MS_BIND | MS_REC)
    umount(str(stash))


def _enter(spec: HostSpec) -> None:
    setns(f"/proc/{spec.holder_pid}/ns/user", CLONE_NEWUSER)
    setns(f"/proc/{spec.holder_pid}/ns/net", CLONE_NEWNET)
    unshare(CLONE_NEWNS | CLONE_NEWUTS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    sethostname(spec.hostname)
    mount(spec.hosts_file, HOSTS_FILE, None, MS_BIND)
    _mount_opt_ml(Path(spec.sandbox), Path(spec.stash))
    if spec.checkpoints:
        # The run's checkpoint folder itself, not a copy: what the job writes there is in the
        # caller's folder at once, whatever happens to the local cluster afterwards.
        mount(spec.checkpoints, f"{CONTAINER_ROOT}/checkpoints", None, MS_BIND | MS_REC)
    mount_input_read_only()
    if spec.cpus:
        os.sched_setaffinity(0, spec.cpus)


def _host(spec_path: str) -> int:
    # The same SIGTERM handling as the process runtime's host: forward it to the host's whole
    # process group, and if the local cluster died (PR_SET_PDEATHSIG), sweep for it.

    signal.signal(signal.SIGTERM, forward_sigterm)
    die_with_parent_from_start(signal.SIGTERM)
    spec = HostSpec(**json.loads(Path(spec_path).read_text()))
    if spec.pythonpath is None:  # the container's environment, as the local cluster built it
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = spec.pythonpath
    try:
        _enter(spec)
    except OSError as exc:
        print(f"[hostns] {spec.name}: cannot set up the simulated host: {exc}", flush=True)
        return 70
    if spec.start_delay_s > 0:
        print(f"[hostns] {spec.name}: starting {spec.start_delay_s:g} s after the first host "
              "(simulated start skew: SageMaker's instances come up at different times)", flush=True)
        time.sleep(spec.start_delay_s)
    return subprocess.Popen(spec.command, cwd=CONTAINER_ROOT, stdin=subprocess.DEVNULL).wait()


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"]:
        return _probe()
    if argv[:1] == ["hold"]:
        return _hold("--proxy" in argv[1:])
    if argv[:1] == ["host"] and len(argv) == 2:
        code = _host(argv[1])
        return code if code >= 0 else 128 - code
    print(__doc__.split("Entry points")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
