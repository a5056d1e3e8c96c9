"""The test bed's ports: a port handed to one server is never handed to another. Each probe socket is closed
before the server binds, so the kernel may give the same port again: Kafka's listener and its controller got one
port between them in CI (`If you have two listeners on the same port ...`). And a port the kernel gives is one
its connections take their source ports from: one took the kubelet's (`bind: address already in use`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hack.testbed.node import NODE_IP
from hack.testbed.process import REPO, free_port

EPHEMERAL_LOW = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_a_process_never_gets_the_same_port_twice_and_none_a_connection_could_hold() -> None:
    ports = [free_port() for _ in range(1000)] + [free_port(NODE_IP) for _ in range(1000)]
    assert len(set(ports)) == len(ports) and max(ports) < EPHEMERAL_LOW


def test_two_workers_never_pick_the_same_port() -> None:
    def ports_of(worker: str) -> set[int]:
        code = "import json; from hack.testbed.process import free_port; print(json.dumps([free_port() for _ in range(1500)]))"
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTEST_XDIST_WORKER": worker}).stdout
        return set(json.loads(out))
    assert not ports_of("gw0") & ports_of("gw1")
