"""Share-partition states in cluster mode are written only by the partition's current leader
(loglake.cluster.shares), over real etcd (tests/etcdkit.py): two `EtcdMetaStore`s on one prefix,
each with its share coordinator over a `FencedShareStore`, stand for two brokers; leadership
moves as `ClusterPartitionLog.acquire` moves it (the epoch key bumped in the transaction of the
`plog_leader` record).

* the new leader loads what the deposed one stored (acknowledged records stay acknowledged);
* the deposed leader's later writes are refused (MetaFencedError), its copy is forgotten, and
  the new leader's state is what every broker reads;
* an admin's write (no leader epoch) is not fenced;
* the ShareAcknowledge handler answers a fenced acknowledgement NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

import etcdkit
from etcdkit import EtcdCluster, needs_etcd
from loglake.broker.handlers.share_groups import _durable, _Part
from loglake.broker.share.coordinator import ShareCoordinator
from loglake.broker.share.limits import ShareLimits
from loglake.broker.share.states import AckType, RecordState
from loglake.broker.share.store import ShareKey
from loglake.cluster.etcd import EtcdMetaStore, Guard
from loglake.cluster.etcd_client import EtcdClient
from loglake.cluster.shares import FencedShareStore
from loglake.errors import MetaFencedError
from loglake.kafka_errors import ErrorCode
from loglake.meta.cluster import epoch_key
from loglake.meta.records import PlogLeader

pytestmark = needs_etcd
etcd1 = etcdkit.etcd1

WAIT = 30
TID = "cd" * 16
KEY: ShareKey = ("g", TID, 0)


class Broker:
    def __init__(self, etcd: EtcdCluster, prefix: str, node_id: int) -> None:
        self.node_id = node_id
        self.meta = EtcdMetaStore(EtcdClient(",".join(etcd.endpoints)), prefix)
        self.meta.open()
        self.store = FencedShareStore(self.meta)
        self.share = ShareCoordinator(
            self.store, ShareLimits(), topic_partitions=lambda name: (TID, 1),
            initial_offset=lambda tid, p, reset: 0, clock=lambda: 1_000,
        )

    def acquire(self) -> int:
        """Lead partition 0 as `ClusterPartitionLog.acquire` does: bump the epoch key and append
        `plog_leader` in one guarded transaction."""
        raw, _ = self.meta.get_key(epoch_key(TID, 0))
        old = int(raw) if raw is not None else 0
        guard = Guard(epoch_key(TID, 0), value=raw) if raw is not None else Guard(epoch_key(TID, 0), mod_revision=0)
        self.meta.append_if(PlogLeader(TID, 0, old + 1, self.node_id), [guard],
                            {epoch_key(TID, 0): str(old + 1).encode()}).result(WAIT)
        return old + 1

    def leader_epoch(self) -> int:
        """What `engine.leader_epoch` reads: the partition's epoch in this broker's metadata state."""
        return int(self.meta.read(lambda s: s.plogs.part(bytes.fromhex(TID), 0).epoch))

    def stored(self) -> tuple[int, list[tuple[int, int, int, int]]]:
        self.meta.sync()
        got = self.store.load(KEY)
        assert got is not None
        return got.start, got.batches


@pytest.fixture
def brokers(etcd1: EtcdCluster) -> Iterator[tuple[Broker, Broker]]:
    prefix = f"/shares-test/{uuid.uuid4().hex[:8]}"
    a, b = Broker(etcd1, prefix, 1), Broker(etcd1, prefix, 2)
    yield a, b
    a.meta.close()
    b.meta.close()


ACCEPT, RELEASE = [int(AckType.ACCEPT)], [int(AckType.RELEASE)]


def test_a_deposed_leaders_share_writes_are_refused_and_the_new_leaders_state_wins(
    brokers: tuple[Broker, Broker],
) -> None:
    a, b = brokers
    a.acquire()
    epoch_a = a.leader_epoch()
    sp_a = a.share.partition(KEY, epoch_a)
    assert sp_a is not None
    # broker 1 hands records 0..9 to a member, which accepts 0..3
    assert sp_a.acquire("m1", [(0, 9, False)], 10, 1_000) == [(0, 9, 1)]
    assert sp_a.acknowledge("m1", 0, 3, ACCEPT) == ErrorCode.NONE
    a.share.persist(KEY).result(WAIT)
    assert a.stored()[0] == 4

    # broker 2 takes the partition over (a restart, a new assignment) and loads what 1 stored
    b.acquire()
    b.meta.sync()
    sp_b = b.share.partition(KEY, b.leader_epoch())
    assert sp_b is not None and sp_b.start == 4
    assert sp_b.acquire("m2", [(0, 9, False)], 10, 1_000) == [(4, 9, 2)]  # 4..9 again: a redelivery
    assert sp_b.acknowledge("m2", 4, 7, ACCEPT) == ErrorCode.NONE
    b.share.persist(KEY).result(WAIT)

    # broker 1 has not noticed: its member releases everything it still holds, which would put
    # 4..7 back as available; the write is fenced
    assert sp_a.acknowledge("m1", 4, 9, RELEASE) == ErrorCode.NONE
    with pytest.raises(MetaFencedError):
        a.share.persist(KEY).result(WAIT)
    start, batches = a.stored()
    assert start == 8 and batches == [(8, 9, int(RecordState.AVAILABLE), 2)]  # 2's state, as 2 wrote it
    # broker 1 forgets its copy: its next use loads the stored state again, even before its
    # metadata shows the new epoch
    again = a.share.partition(KEY, epoch_a)
    assert again is not None and again is not sp_a and again.start == 8

    # the new leader carries on; an admin's reset (no leader epoch) is not fenced
    assert sp_b.acknowledge("m2", 8, 9, ACCEPT) == ErrorCode.NONE
    b.share.persist(KEY).result(WAIT)
    assert a.stored()[0] == 10
    a.share.reset(KEY, 3).result(WAIT)
    assert b.stored() == (3, [])


def test_a_share_partition_created_by_a_deposed_leader_is_not_stored(brokers: tuple[Broker, Broker]) -> None:
    a, b = brokers
    a.acquire()
    epoch_a = a.leader_epoch()
    b.acquire()
    b.meta.sync()
    assert b.share.partition(KEY, b.leader_epoch()) is not None
    b.share.persist(KEY).result(WAIT)
    # broker 1 still believes it leads at its epoch: the state it initialises is fenced...
    assert a.share.partition(("g2", TID, 0), epoch_a) is not None
    with pytest.raises(MetaFencedError):  # after the first write in etcd's order: both were refused
        a.share.persist(("g2", TID, 0)).result(WAIT)
    a.meta.sync()
    assert a.store.load(("g2", TID, 0)) is None
    # ...and so is an acknowledgement, which the handler answers NOT_LEADER_OR_FOLLOWER
    part = _Part(TID, 0, "t")
    sp = a.share.partition(KEY, epoch_a)
    assert sp is not None and sp.acquire("m1", [(0, 0, False)], 1, 1_000) == [(0, 0, 1)]
    assert sp.acknowledge("m1", 0, 0, ACCEPT) == ErrorCode.NONE
    saves: list[tuple[_Part, Future[int]]] = [(part, a.share.persist(KEY))]
    asyncio.run(_durable(saves))
    assert part.ack_error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert b.stored()[0] == 0  # nothing of broker 1's acknowledgement landed
