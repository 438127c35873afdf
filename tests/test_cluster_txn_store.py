"""Cluster mode's transaction coordinators over real etcd (tests/etcdkit.py): `FencedTxnStore`s in
one process stand for two brokers' coordinators (loglake.cluster.txn).

* a coordinator that takes a transactional id over loads what the previous one recorded, because
  it claims the id before loading it;
* the deposed coordinator's later records are fenced (MetaFencedError): nothing it writes lands;
* an id neither loaded is claimed at its first record; the loser of that race is fenced;
* marker reports of transactions no longer prepared are swept;
* a cluster partition's log start drops aborted-transaction entries below it (the bound of the
  aborted index, as a single node's log start record does).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import etcdkit
from etcdkit import EtcdCluster, needs_etcd
from loglake.cluster.etcd import EtcdMetaStore
from loglake.cluster.etcd_client import EtcdClient, prefix_end
from loglake.cluster.txn import MARKERS_PREFIX, FencedTxnStore, LeaderMarkers
from loglake.errors import MetaFencedError
from loglake.meta.records import (
    Cluster,
    PlogCommit,
    PlogLeader,
    PlogStart,
    RecordKind,
    TopicCreated,
    TxnRecord,
)
from loglake.meta.state import MetaState

etcd1 = etcdkit.etcd1
WAIT = 30
TID = "ab" * 16


@dataclass
class View:
    node_id: int


def body(tid: str, epoch: int, state: str = "empty", **extra: object) -> dict[str, object]:
    b: dict[str, object] = {
        "tid": tid, "pid": 1000, "epoch": epoch, "state": state, "timeout_ms": 60_000, "start_ms": -1,
        "last_ms": 0, "parts": [], "names": [], "groups": [], "offsets": {},
    }  # fmt: skip
    b.update(extra)
    return b


@pytest.fixture
def metas(etcd1: EtcdCluster) -> Iterator[tuple[EtcdMetaStore, EtcdMetaStore]]:
    prefix = f"/txn-test/{uuid.uuid4().hex[:8]}"
    a = EtcdMetaStore(EtcdClient(",".join(etcd1.endpoints)), prefix)
    b = EtcdMetaStore(EtcdClient(",".join(etcd1.endpoints)), prefix)
    a.open()
    b.open()
    yield a, b
    a.close()
    b.close()


def recorded(meta: EtcdMetaStore, tid: str) -> dict[str, object] | None:
    meta.sync()
    return meta.read(lambda s: s.txns.get(tid))


@needs_etcd
def test_a_deposed_coordinator_cannot_record(metas: tuple[EtcdMetaStore, EtcdMetaStore]) -> None:
    ma, mb = metas
    a, b = FencedTxnStore(ma, View(1)), FencedTxnStore(mb, View(2))
    try:
        assert a.load(lambda _t: True) == {}
        a.record(body("t1", 0)).result(WAIT)  # a new id: claimed at its first record
        a.record(body("t1", 1)).result(WAIT)
        # node 2 takes t1 over: it loads what node 1 recorded
        loaded = b.load(lambda t: t == "t1")
        assert loaded["t1"]["epoch"] == 1
        with pytest.raises(MetaFencedError):
            a.record(body("t1", 7)).result(WAIT)
        b.record(body("t1", 2)).result(WAIT)
        assert recorded(ma, "t1")["epoch"] == 2  # type: ignore[index]
    finally:
        a.close()
        b.close()


@needs_etcd
def test_a_new_id_is_claimed_once(metas: tuple[EtcdMetaStore, EtcdMetaStore]) -> None:
    ma, mb = metas
    a, b = FencedTxnStore(ma, View(1)), FencedTxnStore(mb, View(2))
    try:
        a.load(lambda _t: True)
        b.load(lambda _t: True)
        b.record(body("t2", 0)).result(WAIT)
        with pytest.raises(MetaFencedError):  # both believed they coordinate it: the second loses
            a.record(body("t2", 5)).result(WAIT)
        assert recorded(ma, "t2")["epoch"] == 0  # type: ignore[index]
    finally:
        a.close()
        b.close()


def test_cluster_log_start_drops_aborted_entries_below_it() -> None:
    s = MetaState()
    for r in (
        Cluster("c1"),
        TopicCreated("t", TID, 1, {}, 0),
        PlogLeader(TID, 0, 1, 1),
        PlogCommit("flush/0001", [(TID, 0, 1, 0, 29, 64, 2000, 30, 1700000000000, 777, 3)]),
    ):
        s.apply(r.kind, r.body())
    for pid, first, marker in ((7, 0, 9), (8, 10, 19)):
        rec = TxnRecord.from_body(
            body(f"x{pid}", 0, "complete_abort", pid=pid, parts=[[TID, 0, first]], names=["t"], markers=[[TID, 0, marker]])
        )
        s.apply(RecordKind.TXN, rec.body())
    pm = s.partitions[(bytes.fromhex(TID), 0)]
    assert pm.aborted_txns == [[7, 0, 9], [8, 10, 19]]
    start = PlogStart(TID, 0, 1, 0, 15)
    s.apply(start.kind, start.body())
    assert pm.aborted_txns == [[8, 10, 19]]


@needs_etcd
def test_marker_reports_of_completed_transactions_are_swept(metas: tuple[EtcdMetaStore, EtcdMetaStore]) -> None:
    ma, _mb = metas
    store = FencedTxnStore(ma, View(1))
    leaders = LeaderMarkers(None, None, ma)  # type: ignore[arg-type]  # the sweep asks etcd only
    try:
        store.load(lambda _t: True)
        store.record(body("t3", 0, "prepare_commit", attempt="live", start_ms=1)).result(WAIT)
        base = ma.keys.key(MARKERS_PREFIX)
        for key in ("live/aa.0", "live/aa.1", "done/aa.0"):  # "done": a coordinator died before deleting
            ma.client.put(base + key.encode(), b"5")
        assert leaders.sweep() == 1
        kvs, _ = ma.client.range_all(base, prefix_end(base))
        assert sorted(kv.key[len(base) :].decode() for kv in kvs) == ["live/aa.0", "live/aa.1"]
    finally:
        store.close()
