"""The partition log of durability class `object` over real etcd (tests/etcdkit.py) and moto S3
(tests/s3kit.py): several `ClusterPartitionLog`s in one process stand for brokers, each with its
own EtcdMetaStore. Appends are acknowledged only after their range is committed in etcd; one PUT
carries many partitions; a leadership move fences the old leader's pending and later appends and
the new leader continues at exactly the committed end; a commit that cannot reach etcd fails its
appends and nothing of it becomes visible; merge and sweep keep every record readable once; a
raised log start (DeleteRecords, retention) is the leader's alone, fenced by its epoch, and the
sweep deletes only what lies wholly below it."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import etcdkit
import s3kit
from etcdkit import EtcdCluster, needs_etcd
from loglake.cluster.etcd import EtcdMetaStore, Guard
from loglake.cluster.etcd_client import EtcdClient
from loglake.cluster.flusher import FLUSH_PUT_ATTEMPTS, FlushSettings
from loglake.cluster.flushobj import flush_prefix
from loglake.cluster.plog import AppendAck, ClusterPartitionLog, NotLeaderError
from loglake.cluster.plog_maint import advance_start, merge, retention_start, sweep
from loglake.engine.config import TopicConfig
from loglake.errors import (
    FlushFailedError,
    LoglakeError,
    MetaFencedError,
    MetaRecordRejectedError,
    OffsetOutOfRangeError,
)
from loglake.fs.os_fs import OsFileSystem
from loglake.kafka_errors import ErrorCode
from loglake.meta.cluster import Plog, epoch_key
from loglake.meta.records import PlogLeader, PlogStart
from loglake.records.decode import decode_batch
from loglake.store.base import ObjectStore
from loglake.store.local import LocalStore
from loglake.store.retry import RetryPolicy
from test_cluster_flushobj import batch, iter_batches, topic_ids

pytestmark = needs_etcd
etcd1 = etcdkit.etcd1
moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket
fault_proxy = s3kit.fault_proxy
_proxy_server = s3kit._proxy_server

FAST = RetryPolicy(max_attempts=FLUSH_PUT_ATTEMPTS, base_delay=0.001, max_delay=0.005)
#: Flushes happen when a test says so (the time trigger is an hour away).
MANUAL = FlushSettings(object_flush_ms=3_600_000, put_retry=FAST)
CLUSTER_ID = "c1"
WAIT = 60


@dataclass
class Broker:
    node_id: int
    meta: EtcdMetaStore
    log: ClusterPartitionLog

    def close(self) -> None:
        self.log.close()
        self.meta.close()


class Cluster:
    """Brokers over one etcd prefix and one bucket."""

    def __init__(self, etcd: EtcdCluster, store: ObjectStore, *, unavailable_s: float = 15.0) -> None:
        self.etcd = etcd
        self.store = store
        self.prefix = f"/plog-test/{uuid.uuid4().hex[:8]}"
        self.unavailable_s = unavailable_s
        self.brokers: list[Broker] = []

    def broker(self, node_id: int, store: ObjectStore | None = None) -> Broker:
        meta = EtcdMetaStore(
            EtcdClient(",".join(self.etcd.endpoints), unavailable_s=self.unavailable_s), self.prefix
        )
        meta.open()
        plog = ClusterPartitionLog(
            meta, store or self.store, cluster_id=CLUSTER_ID, node_id=node_id, settings=MANUAL
        )
        b = Broker(node_id, meta, plog)
        self.brokers.append(b)
        return b

    def close(self) -> None:
        for b in self.brokers:
            b.close()


@pytest.fixture
def store(moto_endpoint: str, bucket: str) -> Iterator[ObjectStore]:
    s = s3kit.make_store(moto_endpoint, bucket)
    yield s
    s.close()


@pytest.fixture
def cluster(etcd1: EtcdCluster, store: ObjectStore) -> Iterator[Cluster]:
    c = Cluster(etcd1, store)
    yield c
    c.close()


def read_all(b: Broker, tid: str, p: int, start: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of every committed record from `start`, in order, as `b` reads them."""
    out: list[tuple[int, bytes]] = []
    offset = start
    while True:
        data = b.log.read(tid, p, offset, 1 << 20)
        if not data:
            return out
        for view in iter_batches(data):
            h, records = decode_batch(bytes(view))
            for i, r in enumerate(records):
                out.append((h.base_offset + i, r.value or b""))
            offset = h.last_offset + 1


def ack(f: Future[AppendAck]) -> AppendAck:
    return f.result(WAIT)


def test_appends_ack_after_commit_and_many_partitions_share_one_put(cluster: Cluster) -> None:
    a = cluster.broker(1)
    watcher = cluster.broker(2)
    tids = topic_ids(2)
    parts = [(t, p) for t in tids for p in range(40)]  # 80 partitions: two commit transactions
    for t, p in parts:
        assert a.log.acquire(t, p) == 1
    futures = {tp: a.log.append(*tp, batch(0, 3, f"{tp[0][:4]}-{tp[1]}")) for tp in parts}
    assert not any(f.done() for f in futures.values())  # nothing is acknowledged before the flush
    a.log.flusher.flush(WAIT)
    acks = {tp: ack(f) for tp, f in futures.items()}
    assert a.log.flusher.stats.puts == 1 and a.log.flusher.stats.objects == 1
    assert {x.key for x in acks.values()} == {next(iter(acks.values())).key}
    # acknowledged means committed: another broker's store sees every range once it catches up
    watcher.meta.sync()
    for (t, p), x in acks.items():
        assert (x.base_offset, x.last_offset, x.leader_epoch) == (0, 2, 1)
        assert watcher.log.committed_end(t, p) == 3
        assert read_all(watcher, t, p) == [(i, f"{t[:4]}-{p}@{i}".encode()) for i in range(3)]
    # a second flush continues every partition at its committed end
    second = a.log.append(tids[0], 5, batch(0, 2, "second"))
    a.log.flusher.flush(WAIT)
    again = ack(second)
    assert (again.base_offset, again.last_offset) == (3, 4)
    assert a.log.flusher.stats.objects == 2


def test_leadership_move_fences_the_old_leader_and_the_new_one_continues(cluster: Cluster) -> None:
    a, b = cluster.broker(1), cluster.broker(2)
    (t,) = topic_ids(1)
    a.log.acquire(t, 0)
    acked: dict[int, bytes] = {}
    for i in range(3):
        f = a.log.append(t, 0, batch(0, 4, f"a{i}"))
        a.log.flusher.flush(WAIT)
        x = ack(f)
        for off in range(x.base_offset, x.last_offset + 1):
            acked[off] = f"a{i}@{off - x.base_offset}".encode()
    end = max(acked) + 1
    pending = a.log.append(t, 0, batch(0, 5, "lost"))  # buffered, not flushed: B takes over now
    assert b.log.acquire(t, 0) == 2
    stale_bump = Guard(epoch_key(t, 0), value=b"1")  # A's stale view loses a bump race cleanly
    with pytest.raises(MetaFencedError):
        a.meta.append_if(PlogLeader(t, 0, 2, 1), [stale_bump]).result(WAIT)
    a.log.flusher.flush(WAIT)
    with pytest.raises(FlushFailedError) as info:
        pending.result(WAIT)
    assert info.value.kafka_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and info.value.retriable
    with pytest.raises((NotLeaderError, MetaFencedError)):
        a.log.append(t, 0, batch(0, 1, "later"))
    assert not a.log.leads(t, 0)
    x = b.log.append(t, 0, batch(0, 2, "b"))
    b.log.flusher.flush(WAIT)
    got = ack(x)
    assert (got.base_offset, got.leader_epoch) == (end, 2)  # exactly A's committed end
    acked[end], acked[end + 1] = b"b@0", b"b@1"
    records = read_all(b, t, 0)
    assert [o for o, _ in records] == list(range(end + 2))  # once each, no gap
    assert dict(records) == acked
    assert not any(v.startswith(b"lost") or v.startswith(b"later") for _, v in records)


def test_a_commit_etcd_never_got_fails_its_appends_and_stays_invisible(
    etcd1: EtcdCluster, store: ObjectStore
) -> None:
    c = Cluster(etcd1, store, unavailable_s=2.0)
    try:
        a = c.broker(1)
        (t,) = topic_ids(1)
        a.log.acquire(t, 0)
        first = a.log.append(t, 0, batch(0, 3, "kept"))
        a.log.flusher.flush(WAIT)
        assert ack(first).last_offset == 2
        doomed = a.log.append(t, 0, batch(0, 3, "doomed"))
        etcd1.stop_member(0)
        try:
            a.log.flusher.flush(WAIT)
            with pytest.raises(FlushFailedError) as info:
                doomed.result(WAIT)
            assert info.value.retriable
            with pytest.raises(Exception) as refused:  # stopped until re-acquired
                a.log.append(t, 0, batch(0, 1, "refused"))
            assert getattr(refused.value, "retriable", False)
        finally:
            etcd1.start_member(0)
        assert a.log.acquire(t, 0) == 2  # the truth from etcd: the end is still 3
        again = a.log.append(t, 0, batch(0, 2, "again"))
        a.log.flusher.flush(WAIT)
        assert ack(again).base_offset == 3  # the failed append's offsets are reused
        other = c.broker(2)
        other.meta.sync()
        values = [v for _, v in read_all(other, t, 0)]
        assert values == [b"kept@0", b"kept@1", b"kept@2", b"again@0", b"again@1"]
        # the object of the failed flush is in the bucket, named by nothing: an orphan
        listed = store.list(flush_prefix(CLUSTER_ID))
        assert len(listed) == 3
    finally:
        c.close()


def test_merge_then_read_gives_the_same_records_and_sweep_deletes_only_unreferenced(cluster: Cluster) -> None:
    a = cluster.broker(1)
    tids = topic_ids(2)
    parts = [(t, p) for t in tids for p in range(2)]
    for tp in parts:
        a.log.acquire(*tp)
    for i in range(4):
        fs = [a.log.append(*tp, batch(0, 3, f"r{i}")) for tp in parts]
        a.log.flusher.flush(WAIT)
        for f in fs:
            ack(f)
    reader = cluster.broker(2)
    reader.meta.sync()
    before = {tp: read_all(reader, *tp) for tp in parts}
    assert all(len(v) == 12 for v in before.values())
    # an orphan: a flush whose commit was fenced (B took partition 0 of the first topic)
    thief = cluster.broker(3)
    doomed = a.log.append(tids[0], 0, batch(0, 1, "orphan"))
    thief.log.acquire(tids[0], 0)
    a.log.flusher.flush(WAIT)
    with pytest.raises(FlushFailedError):
        doomed.result(WAIT)
    with pytest.raises(NotLeaderError):  # only the leader merges
        merge(a.log, tids[0], 0, "topic0")
    merged = []
    for t, p in parts:
        owner = thief if (t, p) == (tids[0], 0) else a
        merged += merge(owner.log, t, p, f"topic{tids.index(t)}")
    assert len(merged) == 4
    reader.meta.sync()
    gets = reader.log.reader.gets
    for tp in parts:
        assert read_all(reader, *tp) == before[tp]
    assert reader.log.reader.gets > gets  # the segments were read from the bucket
    # sweep: the four flush objects are unreferenced now, plus one orphan; a fresh commit stays
    fresh = a.log.append(tids[1], 1, batch(0, 1, "fresh"))
    a.log.flusher.flush(WAIT)
    keep = ack(fresh).key
    none_yet = sweep(a.log)  # inside both graces: nothing goes
    assert none_yet.unreferenced == [] and none_yet.orphans == []
    report = sweep(a.log, delete_grace_s=0, orphan_grace_s=0)
    assert len(report.unreferenced) == 4 and len(report.orphans) == 1
    assert cluster.store.list(flush_prefix(CLUSTER_ID)) == [keep]
    assert read_all(reader, tids[1], 1)[-1] == (12, b"fresh@0")
    for tp in parts:
        assert read_all(reader, *tp)[:12] == before[tp]


def test_sweep_removes_what_a_broker_killed_mid_put_left_in_a_shared_folder(etcd1: EtcdCluster, tmp_path: Path) -> None:
    """Over a folder (brokers on one host), a broker killed during a PUT leaves its temp file;
    the sweep removes it once the orphans' grace has passed, and never an upload under way."""
    store = LocalStore(str(tmp_path / "shared"), OsFileSystem())
    c = Cluster(etcd1, store)
    try:
        a = c.broker(1)
        (t,) = topic_ids(1)
        a.log.acquire(t, 0)
        f = a.log.append(t, 0, batch(0, 2, "x"))
        a.log.flusher.flush(WAIT)
        kept = ack(f).key
        folder = tmp_path / "shared" / os.path.dirname(kept)
        now_ms = int(time.time() * 1000)
        dead = folder / f"00000000000000000099.lfo.{now_ms - 3_600_000}-{'a' * 16}.tmp"  # an hour old
        busy = folder / f"00000000000000000100.lfo.{now_ms}-{'b' * 16}.tmp"  # a PUT under way
        dead.write_bytes(b"half a flush object")
        busy.write_bytes(b"being written")
        report = sweep(a.log)
        assert report.abandoned == 1 and not dead.exists() and busy.exists()
        assert store.list(flush_prefix(CLUSTER_ID)) == [kept] and report.orphans == []
    finally:
        c.close()


def test_reads_refuse_offsets_outside_the_committed_log(cluster: Cluster) -> None:
    a = cluster.broker(1)
    (t,) = topic_ids(1)
    a.log.acquire(t, 0)
    f = a.log.append(t, 0, batch(0, 2, "x"))
    a.log.flusher.flush(WAIT)
    ack(f)
    assert a.log.read(t, 0, 2, 100) == b""
    with pytest.raises(OffsetOutOfRangeError):
        a.log.read(t, 0, 3, 100)
    with pytest.raises(NotLeaderError):
        cluster.broker(2).log.append(t, 0, batch(0, 1, "y"))


# ---- the log start: DeleteRecords and retention ----------------------------------------------------


def flushed(b: Broker, t: str, p: int, count: int, tag: str, ts: int = 1_700_000_000_000) -> AppendAck:
    f = b.log.append(t, p, batch(0, count, tag, ts))
    b.log.flusher.flush(WAIT)
    return ack(f)


def start_of(b: Broker, t: str, p: int) -> int:
    return int(b.meta.read(lambda s: s.plogs.part(bytes.fromhex(t), p).log_start))


def test_the_leader_raises_the_log_start_and_every_broker_reads_from_it(cluster: Cluster) -> None:
    a, other = cluster.broker(1), cluster.broker(2)
    (t,) = topic_ids(1)
    a.log.acquire(t, 0)
    for i in range(3):
        flushed(a, t, 0, 4, f"r{i}")  # three ranges: 0..3, 4..7, 8..11
    merge(a.log, t, 0, "topic")  # one segment 0..11
    flushed(a, t, 0, 4, "r3")  # and a range 12..15
    with pytest.raises(NotLeaderError):  # only the leader raises it
        advance_start(other.log, t, 0, 5)
    with pytest.raises(OffsetOutOfRangeError):  # past the high watermark
        advance_start(a.log, t, 0, 17)
    assert advance_start(a.log, t, 0, 5) == 5
    assert advance_start(a.log, t, 0, 2) == 5  # below the start: nothing changes
    other.meta.sync()
    assert start_of(other, t, 0) == 5
    for b in (a, other):
        with pytest.raises(OffsetOutOfRangeError):
            b.log.read(t, 0, 4, 1 << 20)
        records = read_all(b, t, 0, start=5)
        assert [o for o, _ in records if o >= 5] == list(range(5, 16))  # the batch holding 5 starts at 4
    # the segment 0..11 still holds the start: it stays, and nothing more is for the sweep
    kept = a.meta.read(lambda s: (dict(s.plogs.dropped), len(s.plogs.free), s.plogs.part(bytes.fromhex(t), 0)))
    assert kept[:2] == ({}, 3) and (len(kept[2].segments), len(kept[2].ranges)) == (1, 1)
    assert advance_start(a.log, t, 0, -1) == 16  # -1: the high watermark
    other.meta.sync()
    for b in (a, other):
        assert start_of(b, t, 0) == 16 and b.log.read(t, 0, 16, 100) == b""
        with pytest.raises(OffsetOutOfRangeError):
            b.log.read(t, 0, 15, 100)
    x = flushed(a, t, 0, 2, "after")  # appends go on at the end
    other.meta.sync()
    assert (x.base_offset, read_all(other, t, 0, start=16)) == (16, [(16, b"after@0"), (17, b"after@1")])


def test_a_deposed_leaders_log_start_is_refused(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = cluster.broker(1), cluster.broker(2)
    (t,) = topic_ids(1)
    a.log.acquire(t, 0)
    flushed(a, t, 0, 10, "x")
    tid = bytes.fromhex(t)
    stale: Plog = a.meta.read(lambda s: s.plogs.part(tid, 0))
    stale = Plog(stale.epoch, stale.leader, stale.end, list(stale.segments), list(stale.ranges))
    assert b.log.acquire(t, 0) == 2
    a.meta.sync()  # A has seen the bump: its own check refuses before anything is written
    with pytest.raises(NotLeaderError):
        advance_start(a.log, t, 0, 5)
    # A's view lagging the bump (as if etcd's watch had not brought it yet): the record is
    # written, and the epoch guard refuses it in etcd
    real_read = a.meta.read
    monkeypatch.setattr(a.meta, "read", lambda fn: stale)
    with pytest.raises(NotLeaderError):
        advance_start(a.log, t, 0, 5)
    monkeypatch.setattr(a.meta, "read", real_read)
    assert not a.log.leads(t, 0)  # fenced: it stops leading until it acquires again
    # the record itself, unguarded, does not apply on any broker either: its epoch is stale
    with pytest.raises(MetaRecordRejectedError):
        a.meta.append(PlogStart(t, 0, 1, 0, 5)).result(WAIT)
    for x in (a, b):
        x.meta.sync()
        assert start_of(x, t, 0) == 0
        assert [o for o, _ in read_all(x, t, 0)] == list(range(10))
    assert advance_start(b.log, t, 0, 5) == 5  # the new leader may


def test_retention_raises_the_start_past_whole_sources_and_the_sweep_deletes_only_those(cluster: Cluster) -> None:
    a, other = cluster.broker(1), cluster.broker(2)
    (t,) = topic_ids(1)
    a.log.acquire(t, 0)
    old, new = 1_700_000_000_000, 1_700_000_100_000
    flushed(a, t, 0, 5, "old0", old)
    flushed(a, t, 0, 5, "old1", old)
    [seg] = merge(a.log, t, 0, "topic", wall_ms=lambda: new)  # segment 0..9, records at `old`
    k2 = flushed(a, t, 0, 5, "old2", old).key  # range 10..14 at `old`
    k3 = flushed(a, t, 0, 5, "new", new).key  # range 15..19 at `new`
    tid = bytes.fromhex(t)

    def current() -> Plog:
        return a.meta.read(lambda s: s.plogs.part(tid, 0))

    by_time = TopicConfig.parse({"retention.ms": "50000"})
    now = new + 1000
    assert retention_start(current(), by_time, now) == 15  # the segment and the old range: whole
    assert retention_start(current(), TopicConfig.parse({"retention.ms": "-1"}), now) is None
    assert retention_start(current(), TopicConfig.parse({"cleanup.policy": "compact", "retention.ms": "1"}), now) is None
    range_bytes = current().ranges[-1].length
    by_size = TopicConfig.parse({"retention.ms": "-1", "retention.bytes": str(range_bytes)})
    assert retention_start(current(), by_size, now) == 15  # keeps what fits: the newest range
    assert retention_start(current(), TopicConfig.parse({"retention.ms": "-1", "retention.bytes": str(10**9)}), now) is None
    assert advance_start(a.log, t, 0, 15, wall_ms=lambda: now) == 15
    assert retention_start(current(), by_time, now) is None  # done: nothing more is due
    unreferenced = sweep(a.log, wall_ms=lambda: now)  # inside the grace: nothing goes
    assert unreferenced.unreferenced == [] and cluster.store.list(seg.key)
    report = sweep(a.log, delete_grace_s=0, wall_ms=lambda: now + 1)
    # the merged segment and the flush objects wholly below the start (the two merged into the
    # segment were free already, then old2's); the range still read stays
    assert seg.key in report.unreferenced and k2 in report.unreferenced and k3 not in report.unreferenced
    assert cluster.store.list(seg.key) == [] and cluster.store.list(flush_prefix(CLUSTER_ID)) == [k3]
    other.meta.sync()
    assert read_all(other, t, 0, start=15) == [(15 + i, f"new@{i}".encode()) for i in range(5)]
    with pytest.raises(OffsetOutOfRangeError):
        other.log.read(t, 0, 14, 100)


# ---- the property: random interleavings against a model log ---------------------------------------

#: One step of a schedule: (what, broker index, partition)
Step = tuple[str, int, int]
steps = st.lists(
    st.tuples(
        st.sampled_from(["append", "append", "append", "flush", "move", "put_fails", "acquire_again"]),
        st.integers(0, 1),
        st.integers(0, 1),
    ),
    min_size=1,
    max_size=18,
)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schedule=steps)
def test_random_interleavings_keep_every_acknowledged_record_once_at_its_offset(
    etcd1: EtcdCluster, moto_endpoint: str, bucket: str, fault_proxy: s3kit.FaultProxy, schedule: list[Step]
) -> None:
    """Appends, flushes, failed PUTs and leadership moves between two brokers, in any order: what
    a reader sees afterwards is exactly the acknowledged records, each once, at its acknowledged
    offset, with no gap — the model log is the acknowledgements."""
    store = s3kit.make_store(fault_proxy.endpoint, bucket)
    c = Cluster(etcd1, store)
    try:
        brokers = [c.broker(1), c.broker(2)]
        (t,) = topic_ids(1, seed=len(schedule))
        brokers[0].log.acquire(t, 0)
        brokers[1].log.acquire(t, 1)
        futures: list[tuple[int, Future[AppendAck], str]] = []
        n = 0
        for what, i, p in schedule:
            b = brokers[i]
            if what == "append":
                tag = f"v{n}"
                n += 1
                try:
                    futures.append((p, b.log.append(t, p, batch(0, 1 + n % 3, tag)), tag))
                except (NotLeaderError, LoglakeError):
                    pass  # refused up front: never acknowledged
            elif what == "flush":
                b.log.flusher.flush(WAIT)
            elif what == "move":
                b.log.acquire(t, p)
            elif what == "acquire_again" and not b.log.leads(t, p):
                b.log.acquire(t, p)  # a stopped partition restarts from the committed end
            elif what == "put_fails":
                fault_proxy.fail(1000, method="PUT")
                try:
                    b.log.flusher.flush(WAIT)
                finally:
                    fault_proxy.clear()
        for b in brokers:
            b.log.flusher.flush(WAIT)
        model: dict[int, dict[int, bytes]] = {0: {}, 1: {}}
        for p, f, tag in futures:
            try:
                x = f.result(WAIT)
            except LoglakeError as exc:
                assert exc.retriable, exc
                continue
            for k in range(x.last_offset - x.base_offset + 1):
                model[p][x.base_offset + k] = f"{tag}@{k}".encode()
        reader = c.broker(3)
        reader.meta.sync()
        for p in (0, 1):
            got = read_all(reader, t, p)
            assert [o for o, _ in got] == list(range(len(got)))  # dense, each offset once
            assert dict(got) == model[p]  # exactly the acknowledged records, where they were acked
    finally:
        c.close()
        store.close()


def test_abandon_fails_uncommitted_appends_at_once_and_they_never_commit(
    cluster: Cluster, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that stops leading for its health (loglake.cluster.view) fails its appends not
    committed yet at once, not when their PUT settles; the range they were in is then refused
    at commit, so nothing the client was told failed can land."""
    import threading

    a = cluster.broker(1)
    tid = topic_ids(1)[0]
    a.log.acquire(tid, 0)
    first = a.log.append(tid, 0, batch(0, 3, "kept"))
    a.log.flusher.flush(WAIT)
    assert ack(first).last_offset == 2
    entered, gate = threading.Event(), threading.Event()
    real_put = store.put

    def held_put(key: str, parts: list[bytes]) -> None:  # a bucket that holds the request
        entered.set()
        assert gate.wait(WAIT)
        real_put(key, parts)

    monkeypatch.setattr(store, "put", held_put)
    late = a.log.append(tid, 0, batch(0, 2, "late"))
    flushing = threading.Thread(target=a.log.flusher.flush, args=(WAIT,))
    flushing.start()
    assert entered.wait(WAIT)
    assert a.log.abandon(tid, 0) == 1
    with pytest.raises(NotLeaderError):
        late.result(1)  # at once, while its PUT is still held
    with pytest.raises(NotLeaderError):
        a.log.append(tid, 0, batch(0, 1, "refused"))
    gate.set()
    flushing.join(WAIT)
    assert a.log.committed_end(tid, 0) == 3
    assert [v for _, v in read_all(a, tid, 0)] == [v for _, v in read_all(cluster.broker(2), tid, 0)]
    assert len(read_all(a, tid, 0)) == 3
    a.log.release(tid, 0)  # drains: nothing left in flight
