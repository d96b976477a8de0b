"""The loopback ports the harness gives replicas: a slot's replica is killed and started
again on its port, so no outgoing connection may take that port in between."""

import os
import subprocess
import sys
from pathlib import Path

from harness.replicas import free_port

EPHEMERAL_LOW = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_a_free_port_is_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    assert all(port < EPHEMERAL_LOW for port in ports), ports
    assert len(set(ports)) == len(ports)


def test_two_workers_walk_apart() -> None:
    def first_ports(worker: str) -> set[int]:
        code = "from harness.replicas import free_port; print(*[free_port() for _ in range(50)])"
        env = os.environ | {"PYTEST_XDIST_WORKER": worker}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, text=True, capture_output=True
        ).stdout
        return {int(port) for port in out.split()}

    assert not first_ports("gw0") & first_ports("gw1")
