"""Spark and `loglake pipeline export` read cluster-mode topics straight from the bucket.

Three real `loglake serve --cluster` brokers (tests/brokerkit.py) over a real etcd
(tests/etcdkit.py) and moto's S3 server (tests/s3kit.py). The lowest live broker publishes the
metadata into the bucket (loglake.cluster.publish); the planner maps each partition to its merged
segments and the flush-object ranges not merged yet (loglake.spark.cluster_plan). Produced with
confluent-kafka (idempotent, acks=all) in rounds, the broker that publishes and leads a third of
the partitions killed with `kill -9` between two of them, then read back: by the planner and
reader in this process, by a store-only and a hybrid Spark read, and by `loglake pipeline
export` to Parquet. Each must give exactly the acknowledged records at their offsets, once.

Spark runs in one child process (the reads, then the export command's own entry point, which
takes the same SparkSession): the Python workers of the shared test session inherit its JVM's
environment, fixed before moto's dummy credentials existed (as tests/test_spark_s3.py explains).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import pyarrow.parquet as pq
from confluent_kafka.admin import AdminClient

import s3kit
from etcdkit import needs_etcd
from loglake.spark.model import FlushSlice
from loglake.spark.options import LoglakeOptionError, parse_read_options
from loglake.spark.plan import (
    Metadata,
    cached_store,
    load_metadata,
    ranges_for,
    select_partitions,
)
from loglake.spark.reader import read_slice
from loglake.store.s3 import register
from test_cluster_serve import WAIT_S, Cluster, create_topic, produce, serving_cluster

pytestmark = needs_etcd
moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client

TOPIC = "sparked"
PARTITIONS = 6
#: Produce rounds after the first, at most, until the published metadata holds unmerged ranges.
EXTRA_ROUNDS_MAX = 10

CHILD = """
import json, sys
from pyspark.sql import SparkSession
import loglake.spark
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
loglake.spark.register(spark)
url, topic, bootstrap = sys.argv[1:4]
out = {}
for name, extra in (("store", {}), ("hybrid", {"kafka.bootstrap.servers": bootstrap})):
    df = spark.read.format("loglake").option("path", url).option("subscribe", topic).options(**extra).load()
    out[name] = [[r["partition"], r["offset"], bytes(r["value"]).hex()] for r in df.collect()]
print("ROWS " + json.dumps(out), flush=True)
# then the `loglake pipeline export` command itself, in this process: its getOrCreate takes this
# session instead of starting a second JVM
from loglake.cli.main import main
sys.argv = ["loglake", "pipeline", "export", "--path", url, "--topic", topic, "--to", sys.argv[4]]
try:
    main()
except SystemExit as exc:
    print(f"EXPORT EXIT {exc.code}", flush=True)
    raise
"""

Rows = list[tuple[int, int, bytes]]


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, s3_client: Any
) -> Iterator[Cluster]:
    register()
    with serving_cluster(tmp_path_factory.mktemp("spark-cluster"), s3_client, moto_endpoint) as c:
        yield c


def published(c: Cluster, want: dict[int, int], topic: str = TOPIC) -> Metadata:
    """The bucket's metadata once every partition of `topic` reaches the offsets in `want`."""
    store = cached_store(c.store_url)
    deadline = time.monotonic() + WAIT_S
    ends: dict[int, int] = {}
    while time.monotonic() < deadline:
        try:
            meta = load_metadata(store)
        except Exception:  # nothing published yet
            time.sleep(0.2)
            continue
        ends = {p: pm.end for (t, p), pm in meta.partitions.items() if t == topic}
        if all(ends.get(p, 0) >= end for p, end in want.items()):
            return meta
        time.sleep(0.2)
    raise AssertionError(f"the bucket's metadata never reached {want}: {ends}")


def ends_of(acked: Rows) -> dict[int, int]:
    out: dict[int, int] = {}
    for p, o, _v in acked:
        out[p] = max(out.get(p, 0), o + 1)
    return out


def read_planned(c: Cluster, meta: Metadata, topic: str = TOPIC) -> Rows:
    """Every record the plan of `meta` covers, through the Spark reader without Spark."""
    rows: Rows = []
    for (t, _p), pm in sorted(meta.partitions.items()):
        if t != topic:
            continue
        for sl in ranges_for(c.store_url, pm, pm.log_start, pm.end):
            for batch in read_slice(sl, include_headers=False):  # type: ignore[arg-type]
                d = batch.to_pydict()
                rows.extend(zip(d["partition"], d["offset"], d["value"], strict=True))
    return rows


def test_store_only_spark_and_export_read_every_acknowledged_record_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    create_topic(c, TOPIC, PARTITIONS)
    c.wait_leaders(TOPIC, {1, 2, 3}, PARTITIONS)
    acked = produce(c, TOPIC, [f"r1-{i}".encode() for i in range(600)], PARTITIONS)

    # kill -9 the broker that publishes (the lowest live node id) and leads a third of the
    # partitions; the next round goes to the new leaders, node 2 publishes from then on
    c.kill(1)
    c.wait_leaders(TOPIC, {2, 3}, PARTITIONS)
    acked += produce(c, TOPIC, [f"r2-{i}".encode() for i in range(600)], PARTITIONS)

    # more rounds until one published state has both merged segments and unmerged flush ranges
    # (merges run every second: a read right after a produce round usually finds ranges)
    for n in range(EXTRA_ROUNDS_MAX):
        acked += produce(c, TOPIC, [f"r{n + 3}-{i}".encode() for i in range(120)], PARTITIONS)
        meta = published(c, ends_of(acked))
        parts = [pm for (t, _), pm in meta.partitions.items() if t == TOPIC]
        if any(pm.flush for pm in parts) and any(pm.segments for pm in parts):
            break
    else:
        pytest.fail(
            f"no published state with both merged segments and flush ranges in {EXTRA_ROUNDS_MAX} rounds"
        )

    want = sorted(acked)
    assert len({(p, o) for p, o, _ in want}) == len(want)  # every ack at its own offset
    ends = ends_of(acked)
    assert {p: pm.end for (t, p), pm in meta.partitions.items() if t == TOPIC} == ends
    kinds = {
        type(sl)
        for (t, _), pm in meta.partitions.items()
        if t == TOPIC
        for sl in ranges_for("", pm, 0, pm.end)
    }
    assert FlushSlice in kinds and len(kinds) == 2  # segments and flush ranges both planned
    assert sorted(read_planned(c, meta)) == want

    # Spark: store-only and hybrid (the tail past the published state through a broker)
    env = {**os.environ, **s3kit.DUMMY_ENV, "PYSPARK_PYTHON": sys.executable}
    out = tmp_path / "parquet"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, c.store_url, TOPIC, c.bootstrap(), str(out)],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout[-2000:] + child.stderr[-4000:]
    line = next(x for x in child.stdout.splitlines() if x.startswith("ROWS "))
    got = json.loads(line[len("ROWS ") :])
    store_rows = sorted((p, o, bytes.fromhex(v)) for p, o, v in got["store"])
    # the store-only read sees what the bucket's metadata had when Spark planned: all of `want`
    # (published above) and nothing that was not acknowledged
    assert store_rows == want
    assert sorted((p, o, bytes.fromhex(v)) for p, o, v in got["hybrid"]) == want

    table = pq.read_table(str(out), columns=["partition", "offset", "value"]).to_pydict()
    exported = sorted(zip(table["partition"], table["offset"], table["value"], strict=True))
    assert [(int(p), int(o), bytes(v)) for p, o, v in exported] == want

    # a tail past what the bucket's copy may hold yet: the source's own reader (the code Spark
    # calls, without a JVM) gives all of it with kafka.bootstrap.servers, however far the copy
    # got; store-only it gives a prefix of each partition that holds at least `want`
    tail = produce(c, TOPIC, [f"tail-{i}".encode() for i in range(300)], PARTITIONS)
    every = sorted([*acked, *tail])
    hybrid = source_rows({"path": c.store_url, "subscribe": TOPIC, "kafka.bootstrap.servers": c.bootstrap()})
    assert hybrid == every
    store_only = source_rows({"path": c.store_url, "subscribe": TOPIC})
    assert set(want) <= set(store_only) <= set(every)
    for p in range(PARTITIONS):
        offsets = [o for q, o, _ in store_only if q == p]
        assert offsets == list(range(len(offsets)))  # no gap, no repeat


def source_rows(options: dict[str, str]) -> Rows:
    """(partition, offset, value) of a batch read through the source's reader, no Spark."""
    from loglake.spark.source import LoglakeBatchReader

    reader = LoglakeBatchReader(parse_read_options(options, "batch"))
    rows: Rows = []
    for part in reader.partitions():
        for batch in reader.read(part):
            d = batch.to_pydict()
            rows.extend(zip(d["partition"], d["offset"], d["value"], strict=True))
    return sorted(rows)


def test_restore_refuses_a_cluster_bucket(cluster: Cluster, tmp_path: Path) -> None:
    """(`pipeline verify` proves a cluster bucket: test_spark_pipeline.py.)"""
    import loglake
    from loglake.errors import ConfigError

    with pytest.raises(ConfigError, match="cluster-mode"):
        loglake.open(str(tmp_path / "single"), cold_store=cluster.store_url)


def test_a_deleted_topic_is_not_read(cluster: Cluster) -> None:
    c = cluster
    create_topic(c, "doomed", 2)
    c.wait_leaders("doomed", set(c.brokers), 2)
    acked = produce(c, "doomed", [f"d-{i}".encode() for i in range(40)], 2)
    meta = published(c, ends_of(acked), topic="doomed")
    assert sorted(read_planned(c, meta, "doomed")) == sorted(acked)
    admin = AdminClient({"bootstrap.servers": c.bootstrap()})
    admin.delete_topics(["doomed"])["doomed"].result(30)
    store = cached_store(c.store_url)
    deadline = time.monotonic() + WAIT_S
    while "doomed" in (meta := load_metadata(store)).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "doomed" not in meta.topics
    assert not [tp for tp in meta.partitions if tp[0] == "doomed"]
    opts = parse_read_options({"path": c.store_url, "assign": json.dumps({"doomed": [0]})}, "batch")
    with pytest.raises(LoglakeOptionError, match="does not exist"):
        select_partitions(opts, meta)


def test_the_bucket_keeps_only_the_newest_checkpoints(cluster: Cluster) -> None:
    from loglake.cluster.publish import CHECKPOINTS_KEPT
    from loglake.meta.publish import meta_prefix

    store = cached_store(cluster.store_url)
    prefix = meta_prefix(load_metadata(store).cluster_id)
    names = [k[len(prefix) :] for k in store.list(prefix)]
    assert names and all(n.startswith("checkpoint-") for n in names)  # checkpoints only, no log pieces
    # a publish may be between its PUT and its trim while we list: one more at most
    assert len(names) <= CHECKPOINTS_KEPT + 1


def test_read_committed_from_the_bucket_skips_aborted_and_stops_at_an_open_transaction(cluster: Cluster) -> None:
    """A cluster's transactions are the metadata's (txn records, loglake.meta.txn): a read of the
    bucket at read_committed (the export's default) drops aborted batches, in merged segments and
    unmerged flush ranges alike, and ends at the first offset of a transaction still open."""
    import uuid

    from confluent_kafka import Consumer, Producer, TopicPartition

    c = cluster
    create_topic(c, "txns", 2)
    c.wait_leaders("txns", set(c.brokers), 2)
    producer = Producer({"bootstrap.servers": c.bootstrap(), "transactional.id": f"spark-{uuid.uuid4().hex[:8]}",
                         "linger.ms": 0})
    producer.init_transactions(WAIT_S)

    def txn(prefix: str, end: bool | None) -> None:
        producer.begin_transaction()
        for i in range(10):
            producer.produce("txns", f"{prefix}-{i}".encode(), partition=i % 2)
        producer.flush(WAIT_S)
        if end is True:
            producer.commit_transaction(WAIT_S)
        elif end is False:
            producer.abort_transaction(WAIT_S)

    txn("a", True)
    txn("b", False)
    txn("c", True)
    txn("d", None)  # produced and flushed, still open

    def read(isolation: str) -> list[str]:
        # read_uncommitted: the high watermark, past the open transaction (confluent-kafka's
        # default, read_committed, gives the last stable offset, and the wait below would end
        # before the open transaction's records were published)
        watermarks = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": "wm",
                               "isolation.level": "read_uncommitted"})
        try:
            ends = {p: watermarks.get_watermark_offsets(TopicPartition("txns", p), timeout=WAIT_S)[1] for p in range(2)}
        finally:
            watermarks.close()
        published(c, ends, topic="txns")  # the bucket's copy holds everything produced so far
        rows = source_rows({"path": c.store_url, "subscribe": "txns", "kafka.isolation.level": isolation})
        return sorted(v.decode() for _p, _o, v in rows)

    def values(*prefixes: str) -> list[str]:
        return sorted(f"{x}-{i}" for x in prefixes for i in range(10))

    assert read("read_uncommitted") == values("a", "b", "c", "d")
    assert read("read_committed") == values("a", "c")
    producer.commit_transaction(WAIT_S)  # d: the last stable offset moves past it
    assert read("read_committed") == values("a", "c", "d")
