"""The test bed's ports: a port handed to one server is never handed to another by the same process. Each probe
socket is closed before the server binds, so the kernel may give the same port again: Kafka's listener and its
controller got one port between them in CI (`If you have two listeners on the same port ...`)."""

from __future__ import annotations

from pathlib import Path

from hack.testbed.node import NODE_IP
from hack.testbed.process import free_port


def test_a_process_never_gets_the_same_port_twice() -> None:
    ports = [free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)


def test_a_port_on_the_nodes_address_is_below_the_ephemeral_range_and_not_given_twice() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port(NODE_IP) for _ in range(1000)]
    assert len(set(ports)) == len(ports) and max(ports) < low
