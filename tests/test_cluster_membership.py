"""Broker membership under etcd leases (loglake.cluster.membership) against real etcd."""

from __future__ import annotations

import threading
import time

import pytest

import etcdkit
from etcdkit import EtcdCluster, needs_etcd
from loglake.cluster.etcd_client import EtcdClient
from loglake.cluster.membership import Membership
from loglake.engine.view import BrokerInfo
from loglake.errors import NodeIdInUseError

pytestmark = needs_etcd
etcd1 = etcdkit.etcd1
etcd3 = etcdkit.etcd3

#: Test lease TTL: short so expiry tests are quick, above etcd's minimum.
TTL_S = 2
#: How long a test waits for something etcd does by itself (lease expiry); a generous bound
#: against a loaded machine, not a performance assertion.
WAIT_S = 60.0


def broker(cluster: EtcdCluster, node_id: int, **kw: object) -> Membership:
    info = BrokerInfo(node_id, (f"PLAINTEXT://127.0.0.1:{9000 + node_id}",), rack=f"r{node_id % 2}")
    return Membership(EtcdClient(",".join(cluster.endpoints)), "/c", info, ttl_s=TTL_S, **kw)  # type: ignore[arg-type]


def wait_for(condition: threading.Event) -> None:
    assert condition.wait(WAIT_S)


def test_registered_brokers_are_live_with_their_listeners_and_rack(etcd1: EtcdCluster) -> None:
    a, b = broker(etcd1, 1), broker(etcd1, 2)
    a.start()
    b.start()
    try:
        live = a.live()
        assert sorted(live) == [1, 2]
        assert live[2] == BrokerInfo(2, ("PLAINTEXT://127.0.0.1:9002",), "r0")
    finally:
        a.stop()
        b.stop()
    assert broker(etcd1, 3).live() == {}  # a clean stop revokes at once


def test_a_node_id_held_by_a_live_lease_is_refused(etcd1: EtcdCluster) -> None:
    first = broker(etcd1, 7)
    first.start()
    try:
        time.sleep(TTL_S * 1.5)  # past one TTL: the keep-alive holds the registration
        with pytest.raises(NodeIdInUseError, match="node id 7"):
            broker(etcd1, 7).start()
    finally:
        first.stop()
    again = broker(etcd1, 7)
    again.start()  # free once the holder stopped
    again.stop()


def test_lease_expiry_removes_a_broker_and_the_others_see_it(etcd1: EtcdCluster) -> None:
    watcher, doomed = broker(etcd1, 1), broker(etcd1, 2)
    watcher.start()
    doomed.start()
    gone = threading.Event()
    watcher.subscribe(lambda live: gone.set() if 2 not in live else None)
    try:
        assert sorted(watcher.refresh()) == [1, 2]
        doomed.stop(revoke=False)  # as a killed process: no revoke, the keep-alives just stop
        wait_for(gone)
        assert sorted(watcher.known) == [1]
        replacement = broker(etcd1, 2)
        replacement.start()  # the node id is free again after expiry
        replacement.stop()
    finally:
        watcher.stop()


def test_a_broker_whose_lease_is_gone_reports_it_once(etcd1: EtcdCluster) -> None:
    lost = threading.Event()
    calls: list[int] = []
    b = broker(etcd1, 5, on_lost=lambda: (calls.append(1), lost.set()))
    b.start()
    try:
        EtcdClient(",".join(etcd1.endpoints)).lease_revoke(b.lease)  # as etcd expiring it during a pause
        wait_for(lost)
        assert b.lost.is_set() and calls == [1]
        assert 5 not in b.live()
    finally:
        b.stop()


def test_registration_outlives_the_loss_of_an_etcd_member(etcd3: EtcdCluster) -> None:
    b = broker(etcd3, 4)
    b.start()
    try:
        etcd3.stop_member(0)  # the member its client talks to first
        time.sleep(TTL_S * 3)  # three TTLs: the keep-alives must have gone to the other members
        assert not b.lost.is_set()
        assert 4 in b.live()
        etcd3.start_member(0)
    finally:
        b.stop()
