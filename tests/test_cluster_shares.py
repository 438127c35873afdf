"""Share-partition states in cluster mode are written only by the partition's current leader
(loglake.cluster.shares), over real etcd (tests/etcdkit.py): two `EtcdMetaStore`s on one prefix,
each with its share coordinator over a `FencedShareStore`, stand for two brokers; leadership
moves as `ClusterPartitionLog.acquire` moves it (the epoch key bumped in the transaction of the
`plog_leader` record).

* the new leader loads what the deposed one stored (acknowledged records stay acknowledged);
* the deposed leader's later writes are refused (MetaFencedError), its copy is forgotten, and
  the new leader's state is what every broker reads;
* an admin's write (no leader epoch) is not fenced by the epoch, but is a compare-and-swap on the
  share-partition's gen key: a leader's write made from the state it held before the admin's
  commit is refused and the admin's state stays (no lost update), also after DeleteGroups, and
  concurrent admin writes each commit under their own gen;
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
from loglake.broker.handlers.share_groups import _durable, _Part, _stored
from loglake.broker.share.coordinator import ShareCoordinator
from loglake.broker.share.limits import ShareLimits
from loglake.broker.share.states import AckType, RecordState
from loglake.broker.share.store import ShareKey
from loglake.cluster.etcd import EtcdMetaStore, Guard
from loglake.cluster.etcd_client import EtcdClient
from loglake.cluster.shares import ADMIN_WRITE_ATTEMPTS_MAX, FencedShareStore, gen_key
from loglake.errors import MetaFencedError
from loglake.kafka_errors import ErrorCode
from loglake.meta.cluster import epoch_key
from loglake.meta.records import PlogLeader, ShareState

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


def test_a_leaders_write_after_an_admins_reset_is_refused_and_the_admins_state_stays(
    brokers: tuple[Broker, Broker],
) -> None:
    a, b = brokers
    b.acquire()
    b.meta.sync()
    sp = b.share.partition(KEY, b.leader_epoch())
    assert sp is not None
    assert sp.acquire("m1", [(0, 9, False)], 10, 1_000) == [(0, 9, 1)]
    assert sp.acknowledge("m1", 0, 1, ACCEPT) == ErrorCode.NONE
    b.share.persist(KEY).result(WAIT)
    # broker 1 (the group's coordinator) resets the group to offset 5; broker 2, the leader,
    # has not applied it yet and acknowledges 2..3 from what it holds: that write would put
    # start 4 and 5..9 acquired back over the admin's state
    a.share.reset(KEY, 5).result(WAIT)
    assert sp.acknowledge("m1", 2, 3, ACCEPT) == ErrorCode.NONE
    with pytest.raises(MetaFencedError):
        b.share.persist(KEY).result(WAIT)
    assert a.stored() == (5, []) and b.stored() == (5, [])
    # the leader loads the admin's state at its next use and carries on from it
    again = b.share.partition(KEY, b.leader_epoch())
    assert again is not None and again is not sp and again.start == 5
    assert again.acquire("m1", [(0, 9, False)], 10, 1_000) == [(5, 9, 1)]  # delivery counts forgotten
    assert again.acknowledge("m1", 5, 9, ACCEPT) == ErrorCode.NONE
    b.share.persist(KEY).result(WAIT)
    assert a.stored() == (10, [])


def test_a_leaders_copy_of_a_deleted_share_group_is_refused_and_it_starts_afresh(
    brokers: tuple[Broker, Broker],
) -> None:
    a, b = brokers
    b.acquire()
    b.meta.sync()
    sp = b.share.partition(KEY, b.leader_epoch())
    assert sp is not None
    assert sp.acquire("m1", [(0, 9, False)], 10, 1_000) == [(0, 9, 1)]
    b.share.persist(KEY).result(WAIT)
    a.meta.sync()  # DeleteGroups removes the share-partitions its broker knows of
    for f in a.share.delete_group("g"):  # DeleteGroups through broker 1
        f.result(WAIT)
    assert sp.acknowledge("m1", 0, 9, ACCEPT) == ErrorCode.NONE
    with pytest.raises(MetaFencedError):  # it would bring the deleted group's state back
        b.share.persist(KEY).result(WAIT)
    a.meta.sync()
    assert a.store.load(KEY) is None
    # a new member of the group starts it afresh at the gen the deletion left, and its writes land
    fresh = b.share.partition(KEY, b.leader_epoch())
    assert fresh is not None and fresh.start == 0 and fresh.acquire("m2", [(0, 9, False)], 10, 1_000) == [(0, 9, 1)]
    assert fresh.acknowledge("m2", 0, 2, ACCEPT) == ErrorCode.NONE
    b.share.persist(KEY).result(WAIT)
    assert a.stored() == (3, [(3, 9, int(RecordState.AVAILABLE), 1)])  # acquisitions are not stored


def test_concurrent_admin_writes_each_commit_under_their_own_gen(brokers: tuple[Broker, Broker]) -> None:
    a, b = brokers
    resets = [a.share.reset(KEY, 1), b.share.reset(KEY, 2), a.share.reset(KEY, 3), b.share.reset(KEY, 4)]
    for f in resets:
        f.result(WAIT)
    a.meta.sync()
    b.meta.sync()
    raw, _ = a.meta.get_key(gen_key(KEY))
    assert raw == b"4" and a.store.generation(KEY) == 4 and b.store.generation(KEY) == 4
    assert a.stored()[0] in (3, 4) and a.stored() == b.stored()  # the last committed of each broker's own order


def test_a_state_stored_with_a_gen_before_gen_keys_existed_gets_its_key(brokers: tuple[Broker, Broker]) -> None:
    a, b = brokers
    b.acquire()
    a.meta.append(ShareState("g", TID, 0, 3, 3, [], 2)).result(WAIT)  # an older release's admin reset
    b.meta.sync()
    sp = b.share.partition(KEY, b.leader_epoch())
    assert sp is not None and sp.start == 3
    assert sp.acquire("m1", [(0, 9, False)], 10, 1_000) == [(3, 9, 1)]
    assert sp.acknowledge("m1", 3, 4, ACCEPT) == ErrorCode.NONE
    with pytest.raises(MetaFencedError):  # no gen key yet: refused once, which gives it one
        b.share.persist(KEY).result(WAIT)
    assert b.meta.get_key(gen_key(KEY))[0] == b"2"
    again = b.share.partition(KEY, b.leader_epoch())
    assert again is not None and again.start == 3
    assert again.acquire("m1", [(0, 9, False)], 10, 1_000) == [(3, 9, 1)]
    assert again.acknowledge("m1", 3, 4, ACCEPT) == ErrorCode.NONE
    b.share.persist(KEY).result(WAIT)
    assert a.stored()[0] == 5


def test_an_admin_write_that_keeps_losing_its_compare_gives_up_after_the_bound(
    brokers: tuple[Broker, Broker], monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, _ = brokers
    a.share.reset(KEY, 1).result(WAIT)
    reads: list[str] = []
    real = a.meta.get_key

    def stale(key: str) -> tuple[bytes | None, int]:  # as if another admin moved the gen after each read
        if key == gen_key(KEY):
            reads.append(key)
            return b"0", 0
        return real(key)

    monkeypatch.setattr(a.meta, "get_key", stale)
    refused = a.share.reset(KEY, 7)
    with pytest.raises(MetaFencedError, match="admin writes in a row"):
        refused.result(WAIT)
    assert len(reads) == ADMIN_WRITE_ATTEMPTS_MAX
    assert a.stored() == (1, [])  # nothing of the refused write landed
    # the handlers answer it COORDINATOR_NOT_AVAILABLE (retriable), not by closing the connection
    row: dict[str, object] = {"partition_index": 0, "error_code": 0}
    asyncio.run(_stored([(row, refused)]))
    assert row["error_code"] == ErrorCode.COORDINATOR_NOT_AVAILABLE
