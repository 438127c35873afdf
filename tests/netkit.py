"""Network namespaces for the network-partition tests: each broker on a host of its own.

A `Host` is a network namespace joined to the test's namespace by a veth pair. The test side of
the pair carries two addresses, one per service the broker reaches there — `etcd_ip` for etcd and
`bucket_ip` for the S3 proxy (both listen on every address of the test's namespace) — and the
broker listens on `ip`, where the test's clients reach it. So one service can be cut from one
broker while everything else still talks to it: `cut("etcd")` adds a blackhole route for that
service's address inside the broker's namespace, which drops what the broker sends there (its
connections hang, new ones fail), while its clients and the other service still get through.
`heal(...)` removes the route.

Needs root and iproute2 (`ip netns`, veth): CI runs as root. `needs_netns` skips without them
locally and fails under CI (a missing capability must not pass as a green run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

#: The services a broker reaches outside its namespace, by the last octet of their address.
SERVICES = {"etcd": 1, "bucket": 3}
#: The broker's own address's last octet.
BROKER_OCTET = 2


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def _probe() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    name = f"llprobe{uuid.uuid4().hex[:6]}"
    try:
        _run("ip", "netns", "add", name)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` failed: {exc.stderr.strip()}"
    _run("ip", "netns", "del", name)
    return None


_WHY_NOT = _probe()
if _WHY_NOT is not None and os.environ.get("CI"):
    raise RuntimeError(f"the network-partition tests cannot run under CI: {_WHY_NOT}")
needs_netns = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


class Host:
    """One network namespace with a veth pair to the test's namespace (see the module doc)."""

    def __init__(self, subnet: int) -> None:
        tag = uuid.uuid4().hex[:6]
        self.ns = f"ll{tag}"
        self._outer = f"llo{tag}"  # interface names: at most 15 characters
        self._inner = f"lli{tag}"
        self.subnet = subnet
        self.cuts: set[str] = set()
        self._up = False

    def _addr(self, octet: int) -> str:
        return f"10.{self.subnet >> 8}.{self.subnet & 0xFF}.{octet}"

    @property
    def ip(self) -> str:
        """The broker's address (its clients connect here)."""
        return self._addr(BROKER_OCTET)

    def service_ip(self, service: str) -> str:
        """Where the broker reaches `service` ("etcd" or "bucket")."""
        return self._addr(SERVICES[service])

    def up(self) -> Host:
        _run("ip", "netns", "add", self.ns)
        self._up = True
        _run("ip", "link", "add", self._outer, "type", "veth", "peer", "name", self._inner)
        _run("ip", "link", "set", self._inner, "netns", self.ns)
        for octet in SERVICES.values():
            _run("ip", "addr", "add", f"{self._addr(octet)}/24", "dev", self._outer)
        _run("ip", "link", "set", self._outer, "up")
        inside = ("ip", "netns", "exec", self.ns)
        _run(*inside, "ip", "addr", "add", f"{self.ip}/24", "dev", self._inner)
        _run(*inside, "ip", "link", "set", self._inner, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        return self

    def wrap(self) -> list[str]:
        """The command prefix that runs a process on this host."""
        return ["ip", "netns", "exec", self.ns]

    def cut(self, service: str) -> None:
        """Drop everything the broker sends to `service` (its clients still reach it)."""
        _run("ip", "netns", "exec", self.ns, "ip", "route", "add", "blackhole", f"{self.service_ip(service)}/32")
        self.cuts.add(service)

    def heal(self, service: str) -> None:
        _run("ip", "netns", "exec", self.ns, "ip", "route", "del", "blackhole", f"{self.service_ip(service)}/32")
        self.cuts.discard(service)

    def down(self) -> None:
        """Remove the namespace and the pair; never raises (it runs in `finally`)."""
        if not self._up:
            return
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self._outer], capture_output=True)  # gone with the ns, usually
        self._up = False


def subnets(count: int) -> list[int]:
    """`count` subnets (10.X.Y.0/24 as X*256+Y) unlikely to collide with another test's: the test
    process's id picks the range, so parallel workers do not share addresses."""
    base = 0x4000 + (os.getpid() % 0x3000) * 4
    return [base + i for i in range(count)]
