"""tests/portkit.py: ports outside the ephemeral range, a slice per xdist worker, never one a
server listens on."""

from __future__ import annotations

import socket

import pytest

import portkit


def test_ports_are_below_the_ephemeral_range_in_this_workers_slice() -> None:
    low = portkit._ephemeral_low()
    first = max(1024, low - portkit.PORTS_BELOW_EPHEMERAL) + portkit._worker_index() * portkit.PORTS_PER_WORKER
    ports = [portkit.free_port() for _ in range(50)]
    assert len(set(ports)) == 50  # not one twice before the slice is walked
    assert all(first <= p < first + portkit.PORTS_PER_WORKER and p < low for p in ports), ports


def test_a_port_something_listens_on_is_skipped() -> None:
    port = portkit.free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        # Walk the slice again from the taken port: it is passed over.
        s = portkit._Slice()
        s.next = port - s.first
        assert s.take() != port


def test_each_worker_has_its_own_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    starts = set()
    for n in range(portkit.WORKER_SLICES):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{n}")
        starts.add(portkit._Slice().first)
    assert len(starts) == portkit.WORKER_SLICES
    assert max(starts) + portkit.PORTS_PER_WORKER <= portkit._ephemeral_low()
