"""Compacted topics (cleanup.policy includes compact) refuse records without a key, as Kafka does.

The whole batch is refused with INVALID_RECORD (87), the keyless records named by their index in
the batch; nothing of it is appended and no offset is used up. Checked in the engine, through the
embedded API, with raw Produce requests and with confluent-kafka against the real broker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import ProduceRequest

import loglake
from loglake.engine import Engine, EngineConfig
from loglake.errors import InvalidRecordError, MissingKeyError
from loglake.kafka_errors import ErrorCode
from loglake.records import CODEC_GZIP, CODEC_NONE, CODEC_ZSTD, BatchBuilder, build_batch
from test_broker_malformed import RawClient

from brokerkit import InProcessBroker, serving_in_process
from enginekit import read_all

INVALID_RECORD = 87
POLICIES = ["compact", "compact,delete", "delete,compact"]

Rec = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def recs(*keys: bytes | None) -> list[Rec]:
    return [(1000 + i, key, b"v%d" % i, []) for i, key in enumerate(keys)]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with Engine(str(tmp_path / "data"), EngineConfig(wal_shards=1)) as e:
        yield e


def offsets(engine: Engine, topic: str, partition: int = 0) -> tuple[int, int]:
    info = engine.partition_info(topic, partition)
    return info.next_offset, info.high_watermark


# ------------------------------------------------------------------------------------ engine


def test_error_is_an_invalid_record_error_with_record_errors() -> None:
    exc = MissingKeyError("t", 2, [1, 4, 5, 6, 9])
    assert isinstance(exc, InvalidRecordError) and exc.kafka_code == ErrorCode.INVALID_RECORD == INVALID_RECORD
    assert exc.batch_indexes == (1, 4, 5, 6, 9)
    assert [i for i, _m in exc.record_errors] == [1, 4, 5, 6, 9]
    assert all("t-2" in m and "key" in m for _i, m in exc.record_errors)
    assert "t-2" in str(exc) and "1, 4, 5 and 2 more" in str(exc)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_GZIP, CODEC_ZSTD])
def test_keyless_batch_refused_whole(engine: Engine, policy: str, codec: int) -> None:
    engine.create_topic("t", 1, {"cleanup.policy": policy})
    assert engine.append_batch("t", 0, build_batch(recs(b"a", b"b"), compression=codec)).result().base_offset == 0
    used = engine.memory_pool.used_bytes
    bad = build_batch(recs(b"k0", None, b"k2", None), compression=codec)
    with pytest.raises(MissingKeyError) as err:
        engine.append_batch("t", 0, bad)
    assert err.value.batch_indexes == (1, 3)
    assert [i for i, _m in err.value.record_errors] == [1, 3]
    assert offsets(engine, "t") == (2, 2)  # nothing appended, no offset used up
    assert engine.memory_pool.used_bytes == used
    # The next keyed batch continues where the log was.
    assert engine.append_batch("t", 0, build_batch(recs(b"c"), compression=codec)).result().base_offset == 2
    assert [(o, k) for o, k, _v in read_all(engine, "t")[0]] == [(0, b"a"), (1, b"b"), (2, b"c")]


@pytest.mark.parametrize("policy", POLICIES)
def test_append_records_refuses_keyless(engine: Engine, policy: str) -> None:
    engine.create_topic("t", 1, {"cleanup.policy": policy})
    with pytest.raises(MissingKeyError) as err:
        engine.append_records("t", 0, iter(recs(None, b"k", None)))
    assert err.value.batch_indexes == (0, 2)
    assert offsets(engine, "t") == (0, 0)
    result = engine.append_records("t", 0, iter(recs(b"k", b"", b"x"))).result()  # an empty key is a key
    assert (result.base_offset, result.last_offset) == (0, 2)


def test_first_offending_batch_is_reported_and_none_appended(engine: Engine) -> None:
    """Several batches in one append: indexes count within the offending batch; the good one is not kept."""
    engine.create_topic("t", 1, {"cleanup.policy": "compact"})
    good = build_batch(recs(b"a", b"b", b"c"))
    bad = build_batch(recs(b"d", None))
    worse = build_batch(recs(None, None))
    with pytest.raises(MissingKeyError) as err:
        engine.append_batch("t", 0, good + bad + worse)
    assert err.value.batch_indexes == (1,)
    assert offsets(engine, "t") == (0, 0)
    assert engine.append_batch("t", 0, good + good).result().last_offset == 5


def test_control_batches_are_exempt(engine: Engine) -> None:
    engine.create_topic("t", 1, {"cleanup.policy": "compact"})
    builder = BatchBuilder(is_control=True, producer_id=7, producer_epoch=0, is_transactional=True)
    builder.append(1000, None, b"\x00\x00\x00\x00\x00\x00", [])
    assert engine.append_batch("t", 0, builder.build()).result().base_offset == 0
    assert offsets(engine, "t") == (1, 1)


def test_delete_policy_accepts_keyless(engine: Engine) -> None:
    engine.create_topic("t", 1)  # cleanup.policy=delete by default
    engine.create_topic("d", 1, {"cleanup.policy": "delete"})
    for topic in ("t", "d"):
        assert engine.append_batch(topic, 0, build_batch(recs(None, b"k", None))).result().last_offset == 2
        assert engine.append_records(topic, 0, recs(None)).result().base_offset == 3


def test_altering_the_policy_applies_to_later_appends(engine: Engine) -> None:
    engine.create_topic("t", 1)
    assert engine.append_records("t", 0, recs(None)).result().base_offset == 0
    engine.alter_topic_config("t", {"cleanup.policy": "compact"})
    with pytest.raises(MissingKeyError):
        engine.append_batch("t", 0, build_batch(recs(None)))
    engine.alter_topic_config("t", {})
    assert engine.append_batch("t", 0, build_batch(recs(None))).result().base_offset == 1


def test_topic_compression_does_not_hide_keyless_records(engine: Engine) -> None:
    """compression.type on the topic rewrites batches; the check sees the producer's records first."""
    engine.create_topic("t", 1, {"cleanup.policy": "compact", "compression.type": "zstd"})
    with pytest.raises(MissingKeyError) as err:
        engine.append_batch("t", 0, build_batch(recs(b"a", None), compression=CODEC_GZIP))
    assert err.value.batch_indexes == (1,)
    assert engine.append_batch("t", 0, build_batch(recs(b"a", b"b"), compression=CODEC_GZIP)).result().last_offset == 1


# ------------------------------------------------------------------------------------ embedded API


def test_embedded_api(tmp_path: Path) -> None:
    with loglake.open(str(tmp_path / "data"), wal_shards=1) as log:
        log.create_topic("c", partitions=3, config={"cleanup.policy": "compact,delete"})
        with pytest.raises(MissingKeyError) as err:
            log.produce("c", b"v")
        assert err.value.batch_indexes == (0,) and err.value.kafka_code == INVALID_RECORD
        with pytest.raises(MissingKeyError) as err:
            log.produce_batch("c", [(b"k%d" % i, b"v") for i in range(10)] + [(None, b"x"), (b"z", b"y"), (None, b"w")])
        # Indexes into the records given, checked before any partition was appended to.
        assert err.value.batch_indexes == (10, 12) and err.value.partition is None
        assert all(log.engine.partition_info("c", p).high_watermark == 0 for p in range(3))
        with pytest.raises(MissingKeyError) as err:
            log.produce_batch("c", [(b"a", b"1"), (None, b"2")], partition=1, compression="zstd")
        assert err.value.batch_indexes == (1,) and err.value.partition == 1
        metas = log.produce_batch("c", [(b"k%d" % i, b"v") for i in range(10)])
        assert len(metas) == 10 and log.produce("c", b"v", key=b"k").offset >= 0
        assert sum(log.engine.partition_info("c", p).high_watermark for p in range(3)) == 11
        log.create_topic("plain")
        assert log.produce("plain", b"v").offset == 0


# ------------------------------------------------------------------------------------ real broker


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with serving_in_process(Path(tmp_path_factory.mktemp("compacted")) / "data") as b:
        yield b


def create_topics(broker: InProcessBroker, prefix: str, partitions: int = 2) -> tuple[str, str]:
    """A compacted topic and a delete-policy one."""
    suffix = uuid.uuid4().hex[:8]
    compacted, plain = f"{prefix}-c-{suffix}", f"{prefix}-d-{suffix}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics(
        [NewTopic(compacted, partitions, config={"cleanup.policy": "compact"}), NewTopic(plain, partitions)]
    )
    for fut in futures.values():
        fut.result(timeout=30)
    return compacted, plain


def watermarks(broker: InProcessBroker, topic: str, partitions: int = 2) -> list[int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused", "log_level": 3})
    try:
        return [consumer.get_watermark_offsets(CTopicPartition(topic, p), timeout=10)[1] for p in range(partitions)]
    finally:
        consumer.close()


def produce_request(version: int, topics: dict[str, dict[int, bytes]]) -> Any:
    P = ProduceRequest.TopicProduceData
    return ProduceRequest[version](
        transactional_id=None,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[
            P(name=name, partition_data=[P.PartitionProduceData(index=i, records=b) for i, b in parts.items()])
            for name, parts in topics.items()
        ],
    )


@pytest.mark.parametrize("version", [8, 9, 12])
def test_raw_produce_returns_record_errors(broker: InProcessBroker, version: int) -> None:
    compacted, plain = create_topics(broker, f"raw{version}")
    bad = build_batch(recs(b"k0", None, b"k2", b"k3", None), compression=CODEC_GZIP)
    good = build_batch(recs(b"a", b"b"))
    with RawClient(broker.bootstrap) as c:
        resp = c.request(produce_request(version, {compacted: {0: bad, 1: good}, plain: {0: build_batch(recs(None))}}))
    parts = {(t.name, p.index): p for t in resp.responses for p in t.partition_responses}
    refused = parts[(compacted, 0)]
    assert (refused.error_code, refused.base_offset) == (INVALID_RECORD, -1)
    assert [e.batch_index for e in refused.record_errors] == [1, 4]
    assert all("key" in e.batch_index_error_message for e in refused.record_errors)
    assert compacted in refused.error_message and "1, 4" in refused.error_message
    # The request's other partitions were appended.
    for key in ((compacted, 1), (plain, 0)):
        assert (parts[key].error_code, parts[key].base_offset, parts[key].record_errors) == (0, 0, [])
        assert parts[key].error_message is None
    assert watermarks(broker, compacted) == [0, 2]
    assert watermarks(broker, plain) == [1, 0]


def test_raw_produce_before_v8_has_only_the_code(broker: InProcessBroker) -> None:
    compacted, _plain = create_topics(broker, "raw7")
    with RawClient(broker.bootstrap) as c:
        resp = c.request(produce_request(7, {compacted: {0: build_batch(recs(None))}}))
    (part,) = resp.responses[0].partition_responses
    assert (part.error_code, part.base_offset) == (INVALID_RECORD, -1)
    assert watermarks(broker, compacted) == [0, 0]


@pytest.mark.parametrize("idempotence", [False, True])
def test_confluent_producer(broker: InProcessBroker, idempotence: bool) -> None:
    compacted, plain = create_topics(broker, "cf")
    config = {"acks": "all", "linger.ms": 50, "enable.idempotence": idempotence, "log_level": 3}
    producer = Producer({"bootstrap.servers": broker.bootstrap, **config})
    reports: dict[str, tuple[Any, Any]] = {}

    def report(name: str) -> Any:
        return lambda err, msg: reports.__setitem__(name, (err, msg))

    producer.produce(compacted, key=b"k", value=b"first", partition=0, on_delivery=report("keyed"))
    assert producer.flush(30) == 0
    err, msg = reports["keyed"]
    assert err is None and (msg.partition(), msg.offset()) == (0, 0)

    # One flush: the keyless record fails, the batches of the other partition and topic succeed.
    producer.produce(compacted, value=b"no key", partition=0, on_delivery=report("keyless"))
    producer.produce(compacted, key=b"k1", value=b"v", partition=1, on_delivery=report("other partition"))
    producer.produce(plain, value=b"no key is fine", partition=0, on_delivery=report("other topic"))
    deadline = time.monotonic() + 30
    while len(reports) < 4 and time.monotonic() < deadline:
        producer.poll(0.1)
    assert producer.flush(30) == 0
    err, _msg = reports["keyless"]
    assert err is not None and err.code() == KafkaError.INVALID_RECORD == INVALID_RECORD, err
    assert not err.retriable()
    for name in ("other partition", "other topic"):
        err, msg = reports[name]
        assert err is None, (name, err)
        assert msg.offset() == 0
    assert watermarks(broker, compacted) == [1, 1]
    assert watermarks(broker, plain) == [1, 0]

    # The refused batch used up no offset (nor, for the idempotent producer, a sequence the broker kept).
    producer.produce(compacted, key=b"k", value=b"after", partition=0, on_delivery=report("after"))
    assert producer.flush(30) == 0
    err, msg = reports["after"]
    assert err is None and msg.offset() == 1, err
