"""Hybrid reads (kafka.bootstrap.servers): the sealed part from the stores, the live tail through a
real broker, with the seam fixed at plan time. One `loglake serve` with a PLAINTEXT and an SSL
listener serves the module; records are produced with confluent-kafka (plain and transactional)
and read by Spark (local[2]) or, where the seam itself is under test, by the source's own reader
objects in this process so that seals can be forced between planning and reading."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from loglake.meta.publish import find_clusters
from loglake.spark.model import PartitionMeta, Slice
from loglake.spark.options import LoglakeOptionError, parse_read_options, parse_write_options
from loglake.spark.plan import (
    BrokerRange,
    cached_store,
    load_metadata,
    ranges_for,
    split_slices,
)
from loglake.spark.source import LoglakeBatchReader
from saslkit import USERS, add_users
from tlskit import Pki, make_pki, ssl_args

from brokerkit import Broker, serving_broker

WAIT_S = 60.0
#: librdkafka's own log lines (connection notices) are not what these tests look at.
QUIET = {"kafka.log_level": "0"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Broker]:
    """PLAINTEXT, SSL and SASL_SSL listeners (ports in that order); the SCRAM users of saslkit."""
    data = tmp_path_factory.mktemp("hybrid") / "data"
    add_users(data)
    args = [
        "--listen", "127.0.0.1:0", "--listen", "SSL://127.0.0.1:0", "--listen", "SASL_SSL://127.0.0.1:0",
        *ssl_args(pki),
        "--allow-everyone-if-no-acl-found",  # Spark tests, not ACL tests (a SASL listener turns the default off)
    ]
    with serving_broker(data, args) as b:
        yield b


def _topic(b: Broker, partitions: int, **config: str) -> str:
    name = f"h-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(WAIT_S)
    return name


def _produce(b: Broker, topic: str, start: int, count: int, partitions: int) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 2, "log_level": 0})
    for i in range(start, start + count):
        p.produce(topic, value=b"v%06d" % i, key=b"k%d" % i, partition=i % partitions)
    assert p.flush(WAIT_S) == 0


def _options(b: Broker, topic: str, **extra: str) -> dict[str, str]:
    return {
        "path": str(b.data_dir),
        "subscribe": topic,
        "kafka.bootstrap.servers": b.bootstrap,
        **QUIET,
        **extra,
    }


def _meta(b: Broker, topic: str, partition: int = 0) -> PartitionMeta:
    """The store's published view of a partition (empty before the first publish)."""
    store = cached_store(str(b.data_dir / "segments"))
    pm = load_metadata(store).partitions.get((topic, partition)) if find_clusters(store) else None
    return pm or PartitionMeta(topic, "", partition, 0, 0, ())


def _sealed_end(b: Broker, topic: str, partition: int) -> int:
    return _meta(b, topic, partition).end


def _wait_sealed(b: Broker, topic: str, partition: int, at_least: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while _sealed_end(b, topic, partition) < at_least:
        assert time.monotonic() < deadline, f"{topic}-{partition} not sealed up to {at_least}"
        time.sleep(0.2)


def _rows(df: Any) -> list[tuple[int, int, bytes]]:
    return sorted(
        (r.partition, r.offset, bytes(r.value)) for r in df.select("partition", "offset", "value").collect()
    )


def _read(spark: Any, options: dict[str, str]) -> Any:
    import loglake.spark

    loglake.spark.register(spark)
    r = spark.read.format("loglake")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _exactly_once(rows: list[tuple[int, int, bytes]], partitions: int) -> None:
    """Each partition's offsets are 0, 1, 2, ... once each, and every value once."""
    for p in range(partitions):
        offs = [o for q, o, _v in rows if q == p]
        assert offs == list(range(len(offs))), f"partition {p}: offsets not 0..n-1 once each"
    values = [v for _p, _o, v in rows]
    assert len(values) == len(set(values))


# ---- options and planning (no broker) -----------------------------------------------------------


def test_kafka_options_map_to_librdkafka_or_are_refused() -> None:
    base = {"path": "/x", "subscribe": "t"}
    with pytest.raises(LoglakeOptionError, match=r"only with kafka\.bootstrap\.servers"):
        parse_read_options({**base, "kafka.security.protocol": "SSL"}, "batch")
    opts = parse_read_options(
        {
            **base,
            "kafka.bootstrap.servers": "h:9",
            "kafka.security.protocol": "SSL",
            "kafka.SSL.CA.location": "/ca",
        },
        "batch",
    )
    assert opts.hybrid and opts.kafka_config == (("security.protocol", "SSL"), ("ssl.ca.location", "/ca"))
    for options in (base, {**base, "kafka.bootstrap.servers": "h:9"}):
        with pytest.raises(LoglakeOptionError, match=r"Java client setting .* use kafka\.ssl\.ca\.location"):
            parse_read_options(
                {**options, "kafka.bootstrap.servers": "h:9", "kafka.ssl.truststore.location": "/t.jks"},
                "stream",
            )
    with pytest.raises(LoglakeOptionError, match=r"kafka\.group\.id cannot be set: no consumer group"):
        parse_read_options({**base, "kafka.bootstrap.servers": "h:9", "kafka.group.id": "g"}, "batch")
    with pytest.raises(LoglakeOptionError, match=r"use kafka\.sasl\.username and kafka\.sasl\.password"):
        parse_write_options({"kafka.bootstrap.servers": "h:9", "kafka.sasl.jaas.config": "x"})
    w = parse_write_options({"kafka.bootstrap.servers": "h:9", "kafka.security.protocol": "SSL"})
    assert w.producer_config == {"security.protocol": "SSL"}
    # names librdkafka does not know fail on the driver, before any task runs
    from loglake.spark.broker import BrokerView

    bad = parse_read_options(
        {**base, "kafka.bootstrap.servers": "127.0.0.1:1", "kafka.no.such.setting": "1"}, "batch"
    )
    with pytest.raises(LoglakeOptionError, match=r"not valid librdkafka settings.*no\.such\.setting"):
        BrokerView(bad)


def test_the_seam_splits_a_partition_into_slices_and_one_broker_range() -> None:
    from loglake.spark.model import SegmentInfo

    segs = (SegmentInfo("a", 0, 49, 100, 0, 50), SegmentInfo("b", 50, 99, 100, 0, 50))
    pm = PartitionMeta("t", "", 0, 0, 130, segs, seam=100)
    got = ranges_for("/s", pm, 20, 130)
    assert [(type(r).__name__, r.start, r.end) for r in got] == [
        ("Slice", 20, 50),
        ("Slice", 50, 100),
        ("BrokerRange", 100, 130),
    ]
    assert ranges_for("/s", pm, 110, 120) == [BrokerRange("t", 0, 110, 120)]
    assert all(isinstance(r, Slice) for r in ranges_for("/s", pm, 0, 90))
    pieces = split_slices([BrokerRange("t", 0, 100, 130)], 3)
    assert [(r.start, r.end) for r in pieces] == [(100, 110), (110, 120), (120, 130)]


# ---- reads through a real broker --------------------------------------------------------------


def test_read_right_after_producing_returns_every_record(spark: Any, broker: Broker) -> None:
    topic = _topic(broker, 3)
    _produce(broker, topic, 0, 300, 3)
    rows = _rows(_read(spark, _options(broker, topic, includeHeaders="true")))
    assert len(rows) == 300
    _exactly_once(rows, 3)
    assert sorted(v for _p, _o, v in rows) == [b"v%06d" % i for i in range(300)]


def test_seals_during_a_read_lose_and_duplicate_nothing(spark: Any, broker: Broker) -> None:
    topic = _topic(broker, 2, **{"segment.records": "40"})
    _produce(broker, topic, 0, 250, 2)
    for p in (0, 1):
        _wait_sealed(broker, topic, p, 120)
    # plan now (part sealed, part tail: a few records more than the last seal), seal more,
    # then run the planned tasks
    produced = 250
    for _attempt in range(20):
        reader = LoglakeBatchReader(parse_read_options(_options(broker, topic), "batch"))
        parts = reader.partitions()
        planned = [part.value for part in parts]  # type: ignore[attr-defined]
        if {r.partition for r in planned if isinstance(r, BrokerRange)} == {0, 1}:
            break
        _produce(broker, topic, produced, 6, 2)
        produced += 6
    assert any(isinstance(r, Slice) for r in planned)
    seams = {r.partition: r.start for r in planned if isinstance(r, BrokerRange)}
    ends = {p: max(r.end for r in planned if r.partition == p) for p in (0, 1)}
    assert all(seams[p] < ends[p] for p in (0, 1))
    _produce(broker, topic, produced, 250, 2)
    produced += 250
    for p in (0, 1):
        _wait_sealed(broker, topic, p, ends[p])  # the planned tail is sealed now
    got = sorted(
        (int(p), int(o), bytes(v))
        for part in parts
        for batch in reader.read(part)
        for p, o, v in zip(
            batch.column("partition").to_pylist(),
            batch.column("offset").to_pylist(),
            batch.column("value").to_pylist(),
            strict=True,
        )
    )
    assert len(got) == ends[0] + ends[1]
    _exactly_once(got, 2)
    # and a Spark read while a producer keeps sealing segments
    stop = threading.Event()
    total = [produced]

    def keep_producing() -> None:
        while not stop.is_set() and total[0] < 3000:
            _produce(broker, topic, total[0], 100, 2)
            total[0] += 100

    t = threading.Thread(target=keep_producing)
    t.start()
    try:
        during = _rows(_read(spark, _options(broker, topic)))
    finally:
        stop.set()
        t.join()
    assert len(during) >= produced
    _exactly_once(during, 2)
    after = _rows(_read(spark, _options(broker, topic, minPartitions="6")))
    assert len(after) == total[0]
    _exactly_once(after, 2)


def _stream(
    spark: Any, options: dict[str, str], checkpoint: Path, seen: list[list[tuple[int, int, bytes]]]
) -> Any:
    import loglake.spark

    loglake.spark.register(spark)

    def sink(df: Any, _batch_id: int) -> None:
        seen.append(_rows(df))

    r = spark.readStream.format("loglake")
    for k, v in options.items():
        r = r.option(k, v)
    return (
        r.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )


def test_streaming_available_now_over_a_topic_being_produced_to(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    topic = _topic(broker, 2, **{"segment.records": "150"})
    _produce(broker, topic, 0, 400, 2)
    stop = threading.Event()
    produced = [400]

    def keep_producing() -> None:
        while not stop.is_set() and produced[0] < 2000:
            _produce(broker, topic, produced[0], 50, 2)
            produced[0] += 50
            time.sleep(0.05)

    seen: list[list[tuple[int, int, bytes]]] = []
    opts = _options(broker, topic, maxOffsetsPerTrigger="300")
    t = threading.Thread(target=keep_producing)
    t.start()
    try:
        q = _stream(spark, opts, tmp_path / "ckpt", seen).start()
        assert q.awaitTermination(WAIT_S * 2)
    finally:
        stop.set()
        t.join()
    first_run = len(seen)
    q = _stream(spark, opts, tmp_path / "ckpt", seen).start()  # the rest, from the checkpoint
    assert q.awaitTermination(WAIT_S * 2)
    batches = [rows for rows in seen if rows]
    assert first_run >= 2 and all(len(rows) <= 300 + 2 for rows in batches)
    union = sorted(row for rows in seen for row in rows)
    assert len(union) == produced[0]
    _exactly_once(union, 2)


def _set_segment_ms(b: Broker, topic: str, value: str) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entry = ConfigEntry("segment.ms", value, incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 0})
    admin.incremental_alter_configs([res])[res].result(WAIT_S)


def test_read_committed_stops_at_the_last_stable_offset(spark: Any, broker: Broker) -> None:
    topic = _topic(broker, 1)
    conf = {"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "log_level": 0}
    tx = Producer({**conf, "transactional.id": f"tx-{topic}"})
    plain = Producer(conf)
    tx.init_transactions(WAIT_S)
    want: list[bytes] = []

    def txn(tag: bytes, n: int, commit: bool | None) -> None:
        tx.begin_transaction()
        for i in range(n):
            tx.produce(topic, value=b"%s-%02d" % (tag, i), partition=0)
            tx.flush(WAIT_S)
        if commit is True:
            tx.commit_transaction(WAIT_S)
            want.extend(b"%s-%02d" % (tag, i) for i in range(n))
        elif commit is False:
            tx.abort_transaction(WAIT_S)

    # sealed: a committed transaction (offsets 0-9, marker 10), plain records (11-15), an
    # aborted transaction (16-24, marker 25)
    txn(b"committed", 10, True)
    for i in range(5):
        plain.produce(topic, value=b"plain-%02d" % i, partition=0)
        want.append(b"plain-%02d" % i)
    plain.flush(WAIT_S)
    txn(b"aborted", 9, False)
    _set_segment_ms(broker, topic, "1")
    _wait_sealed(broker, topic, 0, 26)
    _set_segment_ms(broker, topic, "3600000")
    # the tail: an aborted transaction (26-27, marker 28) the broker side must skip, a committed
    # one whose COMMIT marker (32) is the last offset before the last stable offset (33, where
    # the open transaction starts), then plain records after it
    txn(b"tail-aborted", 2, False)
    txn(b"late", 3, True)
    txn(b"open", 4, None)
    for i in range(3):
        plain.produce(topic, value=b"after-%02d" % i, partition=0)
    plain.flush(WAIT_S)
    try:
        committed = _options(broker, topic, **{"kafka.isolation.level": "read_committed"})
        planned = [
            part.value for part in LoglakeBatchReader(parse_read_options(committed, "batch")).partitions()
        ]  # type: ignore[attr-defined]
        assert [r for r in planned if isinstance(r, BrokerRange)] == [BrokerRange(topic, 0, 26, 33)]
        assert max(r.end for r in planned if isinstance(r, Slice)) == 26
        rows = _rows(_read(spark, committed))
        assert sorted(v for _p, _o, v in rows) == sorted(want)
        everything = _rows(_read(spark, _options(broker, topic)))
        assert len(everything) == 10 + 5 + 9 + 2 + 3 + 4 + 3
    finally:
        tx.abort_transaction(WAIT_S)


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_secured_listener_read_and_write(spark: Any, broker: Broker, pki: Pki, protocol: str) -> None:
    """The writer and the hybrid reader take Spark's kafka.security.protocol / kafka.ssl.* /
    kafka.sasl.* options: over TLS, and over TLS with SCRAM-SHA-512."""
    topic = _topic(broker, 2)
    tls = {
        "kafka.bootstrap.servers": f"127.0.0.1:{broker.ports[1 if protocol == 'SSL' else 2]}",
        "kafka.security.protocol": protocol,
        "kafka.ssl.ca.location": str(pki.ca),
        **QUIET,
    }
    if protocol == "SASL_SSL":
        tls |= {"kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": "alice",
                "kafka.sasl.password": USERS["alice"][0]}
    df = spark.createDataFrame([(f"k{i}", f"ssl-{i}") for i in range(120)], "key string, value string")
    w = df.write.format("loglake").option("topic", topic).mode("append")
    for k, v in tls.items():
        w = w.option(k, v)
    w.save()
    rows = _rows(_read(spark, {"path": str(broker.data_dir), "subscribe": topic, **tls}))
    assert sorted(v for _p, _o, v in rows) == sorted(f"ssl-{i}".encode() for i in range(120))
    # a Java-only setting fails the query at planning, naming librdkafka's equivalent
    with pytest.raises(Exception, match=r"kafka\.ssl\.ca\.location"):
        _read(
            spark,
            {**tls, "path": str(broker.data_dir), "subscribe": topic, "kafka.ssl.truststore.location": "x"},
        ).collect()


def test_a_broker_of_another_cluster_is_refused(broker: Broker, tmp_path: Path) -> None:
    import loglake

    with loglake.open(str(tmp_path / "other")) as log:
        log.create_topic("t", 1)
        log.produce("t", b"x", partition=0)
        log.flush()
    options = {
        "path": str(tmp_path / "other"),
        "subscribe": "t",
        "kafka.bootstrap.servers": broker.bootstrap,
        **QUIET,
    }
    with pytest.raises(LoglakeOptionError, match=r"serves cluster .* holds cluster"):
        LoglakeBatchReader(parse_read_options(options, "batch")).partitions()


def test_log_start_moved_past_a_planned_range_and_timestamps_in_the_tail(broker: Broker) -> None:
    """DeleteRecords between planning and reading: failOnDataLoss=true fails the task naming the
    gone offsets, false reads what is left. A starting timestamp past the sealed segments is
    found by the broker (ListOffsets by time)."""
    from confluent_kafka import TopicPartition

    from loglake.spark.plan import DataLossError

    topic = _topic(broker, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "log_level": 0})
    t0 = 1_700_000_000_000
    for i in range(100):
        p.produce(topic, value=b"v%03d" % i, partition=0, timestamp=t0 + i)
    assert p.flush(WAIT_S) == 0
    since = LoglakeBatchReader(
        parse_read_options(_options(broker, topic, startingTimestamp=str(t0 + 37)), "batch")
    )
    assert since.offset_ranges() == {(topic, 0): (37, 100)}
    strict = LoglakeBatchReader(parse_read_options(_options(broker, topic), "batch"))
    lenient = LoglakeBatchReader(parse_read_options(_options(broker, topic, failOnDataLoss="false"), "batch"))
    planned_strict, planned_lenient = strict.partitions(), lenient.partitions()
    assert [part.value for part in planned_strict] == [BrokerRange(topic, 0, 0, 100)]  # type: ignore[attr-defined]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    for fut in admin.delete_records([TopicPartition(topic, 0, 60)]).values():
        fut.result(WAIT_S)
    with pytest.raises(DataLossError, match=r"offsets 0\.\.59 are gone"):
        for part in planned_strict:
            list(strict.read(part))
    offsets = [
        o for part in planned_lenient for b in lenient.read(part) for o in b.column("offset").to_pylist()
    ]
    assert offsets == list(range(60, 100))


def test_a_segment_gone_since_planning_is_read_through_the_broker(broker: Broker) -> None:
    """Segments deleted after planning (DeleteRecords, as retention would): with a broker the task
    asks it for those offsets instead of failing on the missing object, so data loss is judged by
    the broker's log start like any broker range."""
    from confluent_kafka import TopicPartition

    from loglake.spark.plan import DataLossError

    topic = _topic(broker, 1, **{"segment.records": "20"})
    for k in range(5):  # five segments of 20
        _produce(broker, topic, 20 * k, 20, 1)
        _wait_sealed(broker, topic, 0, 20 * (k + 1))
    strict = LoglakeBatchReader(parse_read_options(_options(broker, topic), "batch"))
    lenient = LoglakeBatchReader(parse_read_options(_options(broker, topic, failOnDataLoss="false"), "batch"))
    planned_strict, planned_lenient = strict.partitions(), lenient.partitions()
    slices = [part.value for part in planned_strict]  # type: ignore[attr-defined]
    assert all(isinstance(s, Slice) for s in slices) and len(slices) >= 5
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    for fut in admin.delete_records([TopicPartition(topic, 0, 60)]).values():
        fut.result(WAIT_S)
    first = broker.data_dir / "segments" / slices[0].key
    deadline = time.monotonic() + WAIT_S
    while first.exists():
        assert time.monotonic() < deadline, f"{first} was not deleted"
        time.sleep(0.2)
    with pytest.raises(DataLossError, match=r"offsets 0\.\.\d+ are gone \(log start is now 60"):
        for part in planned_strict:
            list(strict.read(part))
    offsets = [
        o for part in planned_lenient for b in lenient.read(part) for o in b.column("offset").to_pylist()
    ]
    assert offsets[-40:] == list(range(60, 100)) and len(offsets) == len(set(offsets))


def test_tiered_segments_come_through_the_broker_without_cold_path(tmp_path: Path) -> None:
    cold = tmp_path / "cold"
    cold.mkdir()
    with serving_broker(tmp_path / "data", ["--cold-store", f"file://{cold}"]) as b:
        topic = _topic(b, 1, **{"segment.records": "20", "hot.retain.segments": "1"})
        for k in range(5):
            _produce(b, topic, 20 * k, 20, 1)
            _wait_sealed(b, topic, 0, 20 * (k + 1))
        _produce(b, topic, 100, 7, 1)  # an unsealed tail too
        deadline = time.monotonic() + WAIT_S
        while not any(s.tier == "cold" for s in _meta(b, topic).segments):
            assert time.monotonic() < deadline, "nothing was tiered"
            time.sleep(0.2)
        with pytest.raises(LoglakeOptionError, match="coldPath"):
            LoglakeBatchReader(
                parse_read_options({"path": str(b.data_dir), "subscribe": topic}, "batch")
            ).partitions()
        reader = LoglakeBatchReader(parse_read_options(_options(b, topic), "batch"))
        parts = reader.partitions()
        planned = [part.value for part in parts]  # type: ignore[attr-defined]
        assert BrokerRange(topic, 0, 0, planned[0].end) == planned[0] and planned[0].end >= 20
        offsets = sorted(
            o for part in parts for batch in reader.read(part) for o in batch.column("offset").to_pylist()
        )
        assert offsets == list(range(107))
        # a timestamp lookup needs no coldPath either: the broker answers it
        since = LoglakeBatchReader(parse_read_options(_options(b, topic, startingTimestamp="0"), "batch"))
        assert since.offset_ranges() == {(topic, 0): (0, 107)}


def test_iceberg_export_lands_the_tail(spark: Any, broker: Broker, tmp_path: Path) -> None:
    """`pipeline export --format iceberg -o kafka.bootstrap.servers=...`: the table gets records
    nothing has sealed yet, each once; a second run adds only what came since."""
    pytest.importorskip("pyiceberg")
    from loglake.spark.iceberg import export_iceberg, open_catalog

    topic = _topic(broker, 2)
    _produce(broker, topic, 0, 150, 2)
    options = {"kafka.bootstrap.servers": broker.bootstrap, **QUIET}

    def export() -> int:
        return export_iceberg(
            spark,
            str(broker.data_dir),
            topic,
            catalog_uri=f"sqlite:///{tmp_path}/catalog.db",
            table_name="lake.tail",
            warehouse=str(tmp_path / "warehouse"),
            source_options=options,
        ).rows

    assert export() == 150
    _produce(broker, topic, 150, 30, 2)
    assert export() == 30
    table = open_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "warehouse"), {}).load_table(
        "lake.tail"
    )
    data = table.scan().to_arrow()
    rows = sorted(
        zip(
            data.column("partition").to_pylist(),
            data.column("offset").to_pylist(),
            data.column("value").to_pylist(),
            strict=True,
        )
    )
    assert len(rows) == 180
    _exactly_once(rows, 2)
