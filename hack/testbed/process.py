"""Managed server processes for the test bed: start on loopback, wait until ready, stop cleanly.

Every server runs in its own process group so that stop() also reaps the children a launcher
script may fork, and a failed readiness check names the component and shows its log tail.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parents[2]


class TestbedError(RuntimeError):
    """A test-bed component failed to provision or start."""

    __test__ = False


def cache_dir() -> Path:
    return Path(os.environ.get("CHSINK_CACHE", Path.home() / ".cache" / "chsink"))


def versions() -> dict[str, str]:
    """The pinned versions from hack/versions.env (the cache is keyed by them)."""
    out: dict[str, str] = {}
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def k8s_part(name: str) -> str:
    """The cache part of a Kubernetes build ("k8s": apiserver and kubectl, "k8s-node": the node's binaries),
    keyed by the release and the build's own revision, as hack/provision.sh names it."""
    v = versions()
    return f"{name}-{v['K8S_VERSION']}-{v['K8S_BUILD']}"


def cached(part: str) -> Path:
    """Path of a provisioned part (waiting for the background provisioning of `make test` when it is not there
    yet), or a clear error telling how to provision it."""
    path = cache_dir() / part
    if not path.exists():
        await_provisioning()
    if not path.exists():
        raise TestbedError(f"test bed part {part!r} missing at {path}: run `make setup` (hack/provision.sh)")
    return path


def await_provisioning(limit: float = 3600) -> None:
    """Waits until the background provisioning `make test` started (hack/setup.sh test) is done; raises with its
    log when it failed, or when it has not ended within `limit` seconds. Returns at once when none runs."""
    import fcntl

    lock = cache_dir() / "provision-late.lock"
    if not lock.exists():
        return
    log = cache_dir() / "provision-late.log"
    deadline = time.monotonic() + limit
    with open(lock) as f:
        while True:  # the background holds it exclusively until it ends
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    msg = f"the background provisioning has not ended after {limit:.0f}s; see {log}"
                    raise TestbedError(msg) from None
                time.sleep(2)
    rc = cache_dir() / "provision-late.rc"
    if rc.exists() and rc.read_text().strip() != "0":
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise TestbedError(f"the background provisioning failed (exit {rc.read_text().strip()}):\n{tail}")


_GIVEN: set[int] = set()  # every port free_port handed out in this process
_SLICES = 8  # xdist workers with a port range of their own


def _port_slice() -> range:
    """The ports this process may hand out: below the kernel's ephemeral range, where no connection takes its
    source port (a connection to the node's address once took the kubelet's port before it bound it: `bind:
    address already in use`), and below Kubernetes' NodePort range. Each xdist worker has a slice of its own, so
    two workers never pick one port between one's probe and its server's bind; a process a worker starts (a
    bench harness) shares its slice and relies on the probe and its random pick."""
    low = min(int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]), 30_000)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    span = (low - 10_000) // _SLICES
    first = 10_000 + (int(worker) % _SLICES if worker.isdigit() else 0) * span
    return range(first, first + span)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free for a server to listen on at `host`, from this process's slice (`_port_slice`), never one this
    process handed out before: each probe's socket is closed before the server binds, so a probe alone may
    pass one port twice (Kafka's listener and its controller once got one port between them). Probed on
    loopback whatever `host` is, where a server listening on every address shows too: the node's address may not
    be up yet when its ports are chosen."""
    for port in random.sample(_port_slice(), 200):
        if port in _GIVEN:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise TestbedError(f"no free port for {host} in {_port_slice()}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


class ManagedProcess:
    """One server process with a log file under its work dir."""

    name = "server"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def ready(self) -> bool:
        raise NotImplementedError

    def prepare(self) -> None:
        """One-time work before the first start (formatting storage, writing configs)."""

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 90.0) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=self.workdir, env=self.env(), start_new_session=True,
        )
        log.close()
        self.wait_until(self.ready, timeout, "ready")

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise TestbedError(
                    f"{self.name} exited with code {self.proc.returncode} before {what}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            with contextlib.suppress(Exception):
                if check():
                    return
            time.sleep(0.2)
        raise TestbedError(f"{self.name} not {what} after {timeout:.0f}s; log {self.log_path}:\n{self.log_tail()}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, for fault injection."""
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def restart(self, timeout: float = 90.0) -> None:
        self.stop()
        self.start(timeout)

    def __enter__(self) -> Self:
        self.prepare()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# The test bed's JVMs (its Kafka, its registry, the tests' Spark drivers) each live for seconds to minutes: the
# JVM's optimising compiler (C2) would spend much of that compiling code the run ends before it pays back (in
# `make bench`'s cold runs the JIT compilers took 45% of the driver JVM's CPU). The first tier alone (C1) compiles
# quickly; what the program does is the same.
SHORT_LIVED_JIT = "-XX:TieredStopAtLevel=1"


def scratch_env(scratch: Path, short_lived: bool = False) -> dict[str, str]:
    """Environment that keeps a process tree's temporary files (Python's, Spark's block managers and the
    native libraries its JVMs unpack) under `scratch` instead of /tmp, even when the tree is SIGKILLed.
    `short_lived`: the Spark drivers it starts compile with SHORT_LIVED_JIT and map Spark's classes from the
    test bed's archive where it has been made (hack/testbed/cds.py): the tests', not the demo's, nor the
    benchmark's, which run as a user would."""
    from .cds import archive_option

    (scratch / "spark-local").mkdir(parents=True, exist_ok=True)
    jit = f" {SHORT_LIVED_JIT}{archive_option()}" if short_lived else ""
    return {"TMPDIR": str(scratch), "SPARK_LOCAL_DIRS": str(scratch / "spark-local"),
            "SPARK_SUBMIT_OPTS": f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData{jit}",
            "SPARK_LAUNCHER_OPTS": "-XX:-UsePerfData"}  # spark-submit's own launcher JVM
