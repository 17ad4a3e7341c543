"""The test helpers' ports: never the kernel's to hand to an outgoing connection meanwhile."""

from __future__ import annotations

import socket
from pathlib import Path

from tinct_testing.controlplane.harness import FREE_PORTS, free_port


def test_ports_are_free_distinct_and_outside_the_ephemeral_range() -> None:
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports), "a port given twice"
    if FREE_PORTS is not None:
        outside = [p for p in ports if p not in FREE_PORTS or low <= p <= high or p >= 30000]
        assert not outside, f"ports an outgoing connection may take meanwhile: {outside[:10]}"
    for port in ports[:50]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # nothing holds it
