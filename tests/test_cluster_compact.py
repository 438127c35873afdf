"""Compaction of cluster partitions (loglake.cluster.compact) over real etcd and moto S3, with
`ClusterPartitionLog`s in one process standing for brokers (tests/test_cluster_plog.py's
Cluster): only the leader compacts its merged segments, keeping the newest record per key at
its offset while the unmerged head stays as it is; the switch is a `plog_compacted` record
fenced by the leader's epoch, so a deposed leader's rewrite never replaces data; the replaced
segments go with the sweep after its grace."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import etcdkit
import s3kit
import test_cluster_plog
from etcdkit import needs_etcd
from loglake.cluster.compact import GENERATIONS_PER_EPOCH, compact
from loglake.cluster.plog import NotLeaderError
from loglake.cluster.plog_maint import merge, retention_start, sweep
from loglake.engine.config import TopicConfig
from loglake.errors import MetaRecordRejectedError
from loglake.meta.cluster import Plog
from loglake.meta.records import Cluster as ClusterRecord
from loglake.meta.records import PlogCompacted, TopicCreated
from loglake.records.batch import build_batch, peek_header
from loglake.records.decode import iter_records
from loglake.store.base import parse_segment_key
from test_cluster_flushobj import iter_batches, topic_ids
from test_cluster_plog import CLUSTER_ID, WAIT, Broker, Cluster, ack

pytestmark = needs_etcd
etcd1 = etcdkit.etcd1
moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket
store = test_cluster_plog.store
cluster = test_cluster_plog.cluster

#: Every merged segment is cleanable at once (no lag), tombstones kept a day.
CONFIG = TopicConfig.parse({"cleanup.policy": "compact", "min.compaction.lag.ms": "0"})
TS = 1_700_000_000_000


def keyed(b: Broker, t: str, rows: list[tuple[bytes, bytes | None]]) -> None:
    """One flush of one batch of (key, value) records (value None: a tombstone)."""
    data = build_batch((TS + i, k, v, ()) for i, (k, v) in enumerate(rows))
    f = b.log.append(t, 0, data)
    b.log.flusher.flush(WAIT)
    ack(f)


def keys_read(b: Broker, t: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record as `b` reads the partition (each record's own offset:
    a compacted batch keeps its base offset and may hold fewer records)."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while data := b.log.read(t, 0, offset, 1 << 20):
        for view in iter_batches(data):
            out += [(r.offset, r.value or b"") for r in iter_records(view)]
            offset = peek_header(view).last_offset + 1
    return out


def plog_of(b: Broker, t: str) -> Plog:
    tid = bytes.fromhex(t)
    return b.meta.read(lambda s: copy.deepcopy(s.plogs.part(tid, 0)))


def run(b: Broker, t: str, **kw: Any) -> Any:
    return compact(b.log, t, 0, "topic", CONFIG, dedupe_bytes=1 << 20, retain_empty=set(), force=True, **kw)


def test_the_leader_compacts_merged_segments_and_the_head_stays(cluster: Cluster) -> None:
    a = cluster.broker(1)
    (t,) = topic_ids(1)
    a.log.acquire(t, 0)
    for i in range(4):  # offsets 0..11: keys k0, k1, k2 four times
        keyed(a, t, [(b"k%d" % j, b"r%d-k%d" % (i, j)) for j in range(3)])
    keyed(a, t, [(b"k0", None), (b"k9", b"solo")])  # 12: a tombstone, 13
    assert len(merge(a.log, t, 0, "topic")) == 1
    keyed(a, t, [(b"k1", b"head")])  # 14: the unmerged head, never compacted
    replaced = plog_of(a, t).segments[0].key
    with pytest.raises(NotLeaderError):  # only the leader compacts
        run(cluster.broker(2), t)
    report = run(a, t)
    assert report is not None and (report.records_in, report.records_out) == (14, 4)
    reader = cluster.broker(3)
    reader.meta.sync()
    expected = [(10, b"r3-k1"), (11, b"r3-k2"), (12, b""), (13, b"solo"), (14, b"head")]
    for x in (a, reader):
        assert keys_read(x, t) == expected  # offsets kept, the tombstone kept (a day's retention)
    pl = plog_of(reader, t)
    (seg,) = pl.segments
    assert (seg.base, seg.last) == (0, 13) and seg.gen == GENERATIONS_PER_EPOCH * pl.epoch + 1
    assert parse_segment_key(seg.key).generation == seg.gen and seg.key != replaced
    assert len(pl.ranges) == 1  # the head
    # the replaced segment is swept after the grace, not before; reads never needed it again
    assert cluster.store.head(replaced) is not None
    assert replaced not in sweep(a.log).unreferenced
    sweep(a.log, delete_grace_s=0)
    assert cluster.store.head(replaced) is None
    assert keys_read(reader, t) == expected
    # a second pass of the same epoch takes the next generation
    run(a, t)
    assert plog_of(a, t).segments[0].gen == GENERATIONS_PER_EPOCH * pl.epoch + 2
    assert keys_read(reader, t) == expected


def test_a_deposed_leaders_compaction_is_refused(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = cluster.broker(1), cluster.broker(2)
    (t,) = topic_ids(1)
    a.log.acquire(t, 0)
    for i in range(3):
        keyed(a, t, [(b"k%d" % j, b"r%d" % i) for j in range(2)])
    merge(a.log, t, 0, "topic")
    before = keys_read(a, t)
    stale = a.meta.read(copy.deepcopy)  # A's view before B's acquire
    assert b.log.acquire(t, 0) == 2
    # A's view lagging the bump (as if etcd's watch had not brought it yet): A rewrites, and
    # the epoch guard refuses its switch in etcd; what it wrote is deleted again
    real_read = a.meta.read
    monkeypatch.setattr(a.meta, "read", lambda fn: fn(stale))
    with pytest.raises(NotLeaderError):
        run(a, t)
    monkeypatch.setattr(a.meta, "read", real_read)
    assert not a.log.leads(t, 0)  # fenced: it stops leading until it acquires again
    seg = plog_of(a, t).segments[0]
    prefix = seg.key.rsplit("/", 1)[0] + "/"
    assert cluster.store.list(prefix) == [seg.key]  # A's output is gone, the merged segment stays
    # the record itself, unguarded, does not apply either: its epoch is stale
    with pytest.raises(MetaRecordRejectedError):
        a.meta.append(PlogCompacted(t, 0, 1, 0, [seg.key], [seg], (0, 0, -1))).result(WAIT)
    for x in (a, b):
        x.meta.sync()
        assert plog_of(x, t).segments == [seg]
        assert keys_read(x, t) == before
    assert run(b, t) is not None  # the new leader may, under its own epoch's generations
    (new,) = plog_of(b, t).segments
    assert new.gen == 2 * GENERATIONS_PER_EPOCH + 1
    assert keys_read(b, t) == [(4, b"r2"), (5, b"r2")]


def test_tombstones_go_delete_retention_ms_after_the_pass_that_first_passed_them(cluster: Cluster) -> None:
    """With the topic in the metadata, the pass notes its clean end and marks where a single node
    does (PartitionMeta): a tombstone is kept by the first pass, and a later pass — due for it
    alone, nothing being dirty — drops it once delete.retention.ms has passed since. The policy is
    `compact,delete`: retention still works on the compacted segments."""
    a = cluster.broker(1)
    (t,) = topic_ids(1)
    topic_config = {"cleanup.policy": "compact,delete", "delete.retention.ms": "1000", "min.compaction.lag.ms": "0"}
    a.meta.append(ClusterRecord(CLUSTER_ID)).result(WAIT)
    a.meta.append(TopicCreated("tombs", t, 1, topic_config, TS)).result(WAIT)
    config = TopicConfig.parse(topic_config)
    a.log.acquire(t, 0)
    keyed(a, t, [(b"a", b"1"), (b"b", b"1")])
    keyed(a, t, [(b"a", None), (b"b", b"2")])  # 2: a's tombstone, 3
    merge(a.log, t, 0, "tombs")
    now = TS + 10_000

    def once(at: int, force: bool = False) -> Any:
        return compact(
            a.log, t, 0, "tombs", config, dedupe_bytes=1 << 20, retain_empty=set(), force=force, wall_ms=lambda: at
        )

    assert once(now) is not None  # due: everything is dirty
    assert keys_read(a, t) == [(2, b""), (3, b"2")]
    pm = a.meta.read(lambda s: copy.deepcopy(s.partitions[(bytes.fromhex(t), 0)]))
    assert (pm.clean_end, pm.clean_marks, pm.tombstone_ms) == (4, [[4, now]], now)
    assert once(now + 500) is None  # nothing dirty, the tombstone not due yet
    assert once(now + 1000) is not None  # due for the tombstone alone
    assert keys_read(a, t) == [(3, b"2")]
    assert a.meta.read(lambda s: s.partitions[(bytes.fromhex(t), 0)].tombstone_ms) == -1
    # compact,delete: retention moves the log start past the compacted segment once it is old
    assert retention_start(plog_of(a, t), TopicConfig.parse({**topic_config, "retention.ms": "1"}), now) == 4
