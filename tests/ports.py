"""Ports for the servers the tests start: a broker, the control plane, an operator's webhook.

A test picks a port, hands it to a process, and that process binds it seconds later (a JVM
starting, an operator whose webhook server waits for its policy index). A port picked the
usual way (bind port 0, read it, close) is one of the kernel's ephemeral ports, the same range
every outgoing connection on the machine takes its local port from: on a busy machine a Kafka
client, kubectl or the API server can take it in those seconds, and the server then cannot
bind (EADDRINUSE: a connected socket holds the port). A fresh-clone CI run lost a webhook test
and a Spark cluster that way. The ports here are taken below the ephemeral range, where no
connection is given a port, and checked free when picked; only another explicit bind can
still take one.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000
"""Below this are the well-known defaults of the servers around here (Kafka's 9092, Spark's
4040 and 8080, Prometheus's 9090)."""
ATTEMPTS = 100
_CHOICE = random.SystemRandom()
"""Not the module's generator: tests seed that one, and two xdist workers would pick alike."""


def _first_ephemeral_port() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port() -> int:
    """A loopback port below the ephemeral range that nothing listens on or holds now."""
    below = _first_ephemeral_port()
    for _ in range(ATTEMPTS if below > LOWEST else 0):
        port = _CHOICE.randrange(LOWEST, below)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the ephemeral range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
