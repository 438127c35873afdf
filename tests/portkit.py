"""Ports for servers a test starts on a port it chose (a broker that must come back on the same
port, a metrics or registry listener, etcd's peer URLs): the one owner of `free_port()`.

Asking the kernel for a free port (bind to port 0) hands out a port of the ephemeral range
(`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 on Linux), the range every outgoing
connection takes its local port from. With three pytest-xdist workers opening client
connections all the time, a port chosen that way was sometimes in use by the time the broker
bound it — a client's connection had taken it as its local port, or another worker had been
handed the same number — and a broker restart then failed for its whole retry budget ("could
not listen on port ... again", tests/test_cluster_racks.py under CI).

So ports come from below the ephemeral range, where the kernel never places a connection's
local port, and each xdist worker draws from a slice of its own (`PORTS_PER_WORKER`), walking it
from a random start and skipping ports something listens on: two workers never pick the same
port, and a worker does not pick one twice until it has walked its whole slice.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

#: Ports below the ephemeral range handed out to tests, in slices per xdist worker.
PORTS_BELOW_EPHEMERAL = 12_000
#: The slice of each worker (gw0, gw1, ...); workers past the eighth share slices modulo 8.
WORKER_SLICES = 8
PORTS_PER_WORKER = PORTS_BELOW_EPHEMERAL // WORKER_SLICES
#: Linux's default when /proc does not say.
DEFAULT_EPHEMERAL_LOW = 32_768


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _worker_index() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # the controller and plain runs: slice 0
    digits = name.removeprefix("gw")
    return (int(digits) if digits.isdigit() else 0) % WORKER_SLICES


class _Slice:
    def __init__(self) -> None:
        base = max(1024, _ephemeral_low() - PORTS_BELOW_EPHEMERAL)
        self.first = base + _worker_index() * PORTS_PER_WORKER
        self.next = random.randrange(PORTS_PER_WORKER)
        self.lock = threading.Lock()

    def take(self) -> int:
        with self.lock:
            for _ in range(PORTS_PER_WORKER):
                port = self.first + self.next
                self.next = (self.next + 1) % PORTS_PER_WORKER
                if _bindable(port):
                    return port
        raise RuntimeError(f"no free port in {self.first}-{self.first + PORTS_PER_WORKER - 1}")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the servers bind (asyncio, etcd, moto): a port in TIME_WAIT after a stop is usable.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


_SLICE: _Slice | None = None
_SLICE_LOCK = threading.Lock()


def free_port() -> int:
    """A port nothing listens on right now, outside the ephemeral range, this worker's alone."""
    global _SLICE
    with _SLICE_LOCK:
        if _SLICE is None:
            _SLICE = _Slice()
        current = _SLICE
    return current.take()
