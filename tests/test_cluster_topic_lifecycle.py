"""A cluster topic's creation and deletion over real etcd (tests/etcdkit.py) and moto S3
(tests/s3kit.py), several stores in one process standing for brokers (issue 18's fault-test
findings):

* brokers creating one topic name at once make one topic: one `topic_created` record applies, the
  others' records are skipped by every broker alike (the state refuses a name created twice) and
  their writers answer TOPIC_ALREADY_EXISTS; no broker logs that race as an error, live or at start;
* deleting a topic hands its flush objects and merged segments to the sweep, which deletes them
  after the grace (and not before), leaving other topics' objects alone.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import etcdkit
import s3kit
import test_cluster_plog
from etcdkit import EtcdCluster, needs_etcd
from loglake.cluster.etcd import EtcdMetaStore
from loglake.cluster.etcd_client import EtcdClient, prefix_end
from loglake.cluster.flushobj import flush_prefix
from loglake.cluster.plog_maint import merge, sweep
from loglake.engine.catalog import Catalog
from loglake.engine.config import EngineConfig
from loglake.errors import TopicExistsError
from loglake.meta import records
from loglake.meta.records import RecordKind, decode_record
from test_cluster_flushobj import batch
from test_cluster_plog import CLUSTER_ID, WAIT, Cluster, read_all

pytestmark = needs_etcd
etcd1 = etcdkit.etcd1
moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket
store = test_cluster_plog.store  # a store over the bucket, and a cluster of brokers over etcd1 and it
cluster = test_cluster_plog.cluster

#: Brokers racing to create each name, and the names raced.
RACERS = 3
NAMES = 8


def topic_records(meta: EtcdMetaStore) -> list[dict[str, object]]:
    """Every topic_created body in the log, as etcd holds it (rejected ones included)."""
    base = meta.keys.key("meta/log/")
    kvs, _ = meta.client.range_all(base, prefix_end(base))
    out = []
    for kv in kvs:
        kind, body = decode_record(kv.value[8:], where=kv.key.decode(), position=0)
        if kind is RecordKind.TOPIC_CREATED:
            out.append(body)
    return out


@pytest.fixture
def stores(etcd1: EtcdCluster) -> Iterator[list[EtcdMetaStore]]:
    prefix = f"/topics-test/{uuid.uuid4().hex[:8]}"
    made = []
    for _ in range(RACERS):
        meta = EtcdMetaStore(EtcdClient(",".join(etcd1.endpoints)), prefix)
        meta.open()
        made.append(meta)
    made[0].append(records.Cluster(CLUSTER_ID)).result(WAIT)  # what a broker's first start writes
    yield made
    for meta in made:
        meta.close()


def test_brokers_creating_one_name_at_once_make_one_topic(
    stores: list[EtcdMetaStore], caplog: pytest.LogCaptureFixture
) -> None:
    catalogs = [Catalog(meta, EngineConfig(), time.time) for meta in stores]
    outcomes: dict[str, list[str]] = {f"t{i}": [] for i in range(NAMES)}
    lock = threading.Lock()

    def create(catalog: Catalog, name: str, start: threading.Barrier) -> None:
        start.wait()
        try:
            catalog.create_topic(name, 2, None, validate_only=False)
            result = "created"
        except TopicExistsError:
            result = "exists"
        with lock:
            outcomes[name].append(result)

    for name in outcomes:
        start = threading.Barrier(RACERS)
        threads = [threading.Thread(target=create, args=(c, name, start)) for c in catalogs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
    for name, results in outcomes.items():
        assert sorted(results) == ["created"] + ["exists"] * (RACERS - 1), name
    records = topic_records(stores[0])
    assert {str(r["name"]) for r in records} == set(outcomes)
    applied = {str(r["name"]): str(r["id"]) for r in records if bytes.fromhex(str(r["id"])) in stores[0].state.topics}
    assert sorted(applied) == sorted(outcomes)  # one record per name applied
    for meta in stores:
        meta.sync()
        assert {n: tid.hex() for n, tid in meta.state.names.items()} == applied  # every broker agrees
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # a late broker replays the log without an ERROR line
    with caplog.at_level(logging.INFO, logger="loglake.cluster.etcd"):
        late = EtcdMetaStore(stores[0].client, stores[0].prefix)
        late.open()
        late.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # a name deleted and created again is created
    c0 = catalogs[0]
    old_id = c0.topic("t0").topic_id
    c0.delete_topic("t0")
    catalogs[1].create_topic("t0", 1, None, validate_only=False)
    stores[2].sync()
    assert stores[2].state.names["t0"] != old_id
    with pytest.raises(TopicExistsError):
        catalogs[2].create_topic("t0", 1, None, validate_only=False)


def test_a_deleted_topics_flush_objects_and_segments_are_swept_after_the_grace(cluster: Cluster) -> None:
    a = cluster.broker(1)
    a.meta.append(records.Cluster(CLUSTER_ID)).result(WAIT)
    catalog = Catalog(a.meta, EngineConfig(), time.time)
    gone = catalog.create_topic("gone", 2, None, validate_only=False).topic_id
    kept = catalog.create_topic("kept", 1, None, validate_only=False).topic_id
    parts = [(gone, 0), (gone, 1), (kept, 0)]
    for tp in parts:
        a.log.acquire(*tp)
    for i in range(2):  # two flush objects, each holding all three partitions
        fs = [a.log.append(*tp, batch(0, 2, f"m{i}")) for tp in parts]
        a.log.flusher.flush(WAIT)
        for f in fs:
            f.result(WAIT)
    segments = merge(a.log, gone, 0, "gone")  # partition 0 merged; partition 1 keeps its ranges
    assert segments
    seg_keys = {s.key for s in segments}
    flush_keys = set(cluster.store.list(flush_prefix(CLUSTER_ID)))
    assert len(flush_keys) == 2
    # a third flush object only the deleted topic's partition 1 uses
    solo = a.log.append(gone, 1, batch(0, 1, "solo"))
    a.log.flusher.flush(WAIT)
    solo_key = solo.result(WAIT).key
    a.log.release(gone, 0)
    a.log.release(gone, 1)
    catalog.delete_topic("gone")
    before = set(cluster.store.list(""))
    assert seg_keys <= before and solo_key in before
    early = sweep(a.log)  # inside the grace: nothing goes
    assert early.unreferenced == [] and early.orphans == []
    report = sweep(a.log, delete_grace_s=0)
    after = set(cluster.store.list(""))
    assert seg_keys.isdisjoint(after) and solo_key not in after  # the deleted topic's own objects
    assert flush_keys <= after  # still holding the live topic's ranges
    assert set(report.unreferenced) == seg_keys | {solo_key}
    a.meta.sync()
    assert a.meta.read(
        lambda s: (dict(s.plogs.dropped), [k for k in s.plogs.parts if k[0] == bytes.fromhex(gone)])
    ) == ({}, [])
    reader = cluster.broker(2)
    reader.meta.sync()
    assert [o for o, _ in read_all(reader, kept, 0)] == [0, 1, 2, 3]
    # once the live topic is merged too, its flush objects are unreferenced and swept as before
    merge(a.log, kept, 0, "kept")
    sweep(a.log, delete_grace_s=0)
    assert not (flush_keys & set(cluster.store.list("")))
