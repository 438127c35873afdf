"""Real Kafka clients against the real broker process: confluent-kafka (librdkafka), kafka-python,
aiokafka and kcat. Every test runs against one broker and against a three-broker cluster
(tests/modekit.py; one of each for the whole module; auto-created topics get 3 partitions).
Raw requests about a partition go to its leader.

Consumers never use consumer groups: partitions are assigned explicitly (confluent-kafka needs a
group.id to build a consumer at all, but nothing is committed or fetched from the group).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

from loglake.records.batch import build_batch, peek_header
from modekit import MODES, Served, serving
from test_broker_malformed import RawClient

PARTITIONS = 3
KCAT = shutil.which("kcat") or "/usr/bin/kcat"

Message = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


@pytest.fixture(scope="module", params=MODES)
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = Path(tmp_path_factory.mktemp(f"clients-{request.param}"))
    with serving(request.param, tmp, ["--default-partitions", str(PARTITIONS)]) as served:
        yield served


def new_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------------------ murmur2


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as a signed int32."""
    m, r, mask = 0x5BD1E995, 24, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """Java's DefaultPartitioner/BuiltInPartitioner for keyed records: toPositive(murmur2) % n."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def test_murmur2_java_vectors() -> None:
    # Kafka's UtilsTest.testMurmur2.
    vectors = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    assert {k: murmur2(k) for k in vectors} == vectors


# ------------------------------------------------------------------------------------ helpers


def make_messages(n: int, seed: int, nulls: bool = True) -> list[Message]:
    """Keys on every other record, headers on every third, values 0-300 bytes (some empty, a few
    None, and None header values when `nulls`; kafka-python and aiokafka refuse None header values
    and aiokafka a record with neither key nor value)."""
    rng = random.Random(seed)
    out: list[Message] = []
    for i in range(n):
        key = b"key-%d" % rng.randrange(10_000) if i % 2 == 0 else None
        if i % 97 == 5 and (nulls or key is not None):
            value: bytes | None = None
        else:
            value = b"%d:" % i + rng.randbytes(rng.randrange(0, 300))
        headers: list[tuple[str, bytes | None]] = []
        if i % 3 == 0:
            headers = [("seq", b"%d" % i), ("h\u00e9", rng.randbytes(8))]
            if i % 9 == 0:
                headers.append(("nil", None if nulls else b""))
        out.append((key, value, headers))
    return out


def confluent_produce(
    bootstrap: str, topic: str, messages: list[Message], **config: Any
) -> dict[tuple[int, int], int]:
    """Produce with acks=all; returns {(partition, offset): message index} from the delivery reports."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **config})
    delivered: dict[tuple[int, int], int] = {}
    errors: list[str] = []

    def report(index: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                delivered[(msg.partition(), msg.offset())] = index

        return cb

    for i, (key, value, headers) in enumerate(messages):
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers or None, on_delivery=report(i))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]
    assert len(delivered) == len(messages)
    return delivered


def confluent_consumer(bootstrap: str, **config: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"unused-{uuid.uuid4().hex[:6]}",  # required by the client; never joined
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 3,
            **config,
        }
    )


def confluent_consume_all(bootstrap: str, topic: str, count: int, timeout: float = 60.0) -> list[Any]:
    consumer = confluent_consumer(bootstrap)
    consumer.assign([CTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is not None:
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    continue
                got.append(msg)
        # Nothing more than what was produced.
        extra = [m for m in consumer.consume(10_000, 1.0) if m.error() is None]
        assert not extra, f"{len(extra)} unexpected extra records"
    finally:
        consumer.close()
    assert len(got) == count, f"consumed {len(got)} of {count}"
    return got


def assert_exact(consumed: list[Any], delivered: dict[tuple[int, int], int], messages: list[Message]) -> None:
    """Every delivered record consumed once at its reported offset with its key, value and headers."""
    seen: set[tuple[int, int]] = set()
    for msg in consumed:
        pos = (msg.partition(), msg.offset())
        assert pos not in seen, f"duplicate {pos}"
        seen.add(pos)
        assert pos in delivered, f"record at {pos} was never produced"
        key, value, headers = messages[delivered[pos]]
        assert msg.key() == key, pos
        assert msg.value() == value, pos
        assert (msg.headers() or []) == headers, pos
    assert seen == set(delivered)
    # Offsets per partition are dense from 0 and follow send order (one producer, idempotent).
    for p in range(PARTITIONS):
        offsets = sorted(off for part, off in delivered if part == p)
        assert offsets == list(range(len(offsets)))
        order = [delivered[(p, off)] for off in offsets]
        assert order == sorted(order)


def raw_fetch(client: RawClient, topic: str, partition: int, offset: int, max_wait_ms: int = 0) -> Any:
    F = FetchRequest.FetchTopic
    req = FetchRequest[12](
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        max_bytes=8 << 20,
        topics=[
            F(
                topic=topic,
                partitions=[
                    F.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=4 << 20)
                ],
            )
        ],
    )
    resp = client.request(req)
    (topic_resp,) = resp.responses
    (part,) = topic_resp.partitions
    return part


def ensure_topic_raw(client: RawClient, topic: str) -> None:
    T = MetadataRequest.MetadataRequestTopic
    resp = client.request(MetadataRequest[12](topics=[T(name=topic)], allow_auto_topic_creation=True))
    assert resp.topics[0].error_code == 0
    assert len(resp.topics[0].partitions) == PARTITIONS


# ------------------------------------------------------------------------------------ confluent-kafka

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.mark.parametrize(
    ("compression", "count"), [("lz4", 100_000), ("zstd", 100_000), ("snappy", 20_000), ("gzip", 20_000)]
)
def test_confluent_compressed_round_trip(broker: Served, compression: str, count: int) -> None:
    topic = new_topic(f"cf-{compression}")
    messages = make_messages(count, seed=count + len(compression))
    delivered = confluent_produce(
        broker.bootstrap, topic, messages, **{"compression.type": compression, "enable.idempotence": True}
    )
    assert_exact(confluent_consume_all(broker.bootstrap, topic, count), delivered, messages)
    # The broker stored what the client sent: batches keep the client's compression codec.
    with RawClient(broker.leader(topic, 0).bootstrap) as c:
        part = raw_fetch(c, topic, 0, 0)
        assert part.error_code == 0 and part.high_watermark == sum(1 for p, _ in delivered if p == 0)
        header = peek_header(bytes(part.records), 0)
        assert header.compression == CODECS[compression]
        assert header.producer_id >= 0 and header.base_sequence == 0  # idempotent batches


def test_confluent_murmur2_partitioner(broker: Served) -> None:
    """Keyed records land where Java's default partitioner puts them (librdkafka murmur2_random)."""
    topic = new_topic("cf-murmur")
    keys = [b"user-%d" % i for i in range(500)] + [b"", b"\x00\xff" * 7, "\u00fc\u00f1\u00ee".encode()]
    messages: list[Message] = [(k, b"v-%d" % i, []) for i, k in enumerate(keys)]
    delivered = confluent_produce(broker.bootstrap, topic, messages, partitioner="murmur2_random")
    placed = {messages[i][0]: p for (p, _off), i in delivered.items()}
    assert placed == {k: java_partition(k, PARTITIONS) for k in keys}
    assert set(placed.values()) == set(range(PARTITIONS))
    for msg in confluent_consume_all(broker.bootstrap, topic, len(keys)):
        assert msg.partition() == java_partition(msg.key(), PARTITIONS)


# ------------------------------------------------------------------------------------ kafka-python


def test_kafka_python_default_settings_round_trip(broker: Served) -> None:
    topic = new_topic("kp")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    assert producer.config["enable_idempotence"] is True and producer.config["acks"] == -1
    messages = make_messages(3000, seed=7, nulls=False)
    futures = [producer.send(topic, key=k, value=v, headers=h) for k, v, h in messages]
    producer.flush(timeout=60)
    metas = [f.get(timeout=30) for f in futures]
    producer.close(timeout=10)
    # kafka-python's default partitioner is Java's too.
    for (key, _v, _h), meta in zip(messages, metas, strict=True):
        if key is not None:
            assert meta.partition == java_partition(key, PARTITIONS)
    by_pos = {(m.partition, m.offset): i for i, m in enumerate(metas)}
    assert len(by_pos) == len(messages)

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, consumer_timeout_ms=5000)
    tps = [KTopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    got = {}
    for msg in consumer:
        pos = (msg.partition, msg.offset)
        assert pos not in got
        got[pos] = (msg.key, msg.value, [(k, v) for k, v in msg.headers])
        if len(got) == len(messages):
            break
    assert consumer.end_offsets(tps) == {tp: sum(1 for p, _ in by_pos if p == tp.partition) for tp in tps}
    consumer.close()
    assert got == {pos: (k, v, h) for pos, (k, v, h) in ((pos, messages[i]) for pos, i in by_pos.items())}


def _idempotent_produce(pid: int, epoch: int, topic: str, seq: int, values: list[bytes]) -> Any:
    now = int(time.time() * 1000)
    batch = build_batch(
        [(now, None, v, []) for v in values], producer_id=pid, producer_epoch=epoch, base_sequence=seq
    )
    P = ProduceRequest.TopicProduceData
    return ProduceRequest[9](
        transactional_id=None,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[P(name=topic, partition_data=[P.PartitionProduceData(index=0, records=batch)])],
    )


def _partition_response(resp: Any) -> Any:
    (topic_resp,) = resp.responses
    (part,) = topic_resp.partition_responses
    return part


def test_retried_idempotent_batch_is_not_duplicated(broker: Served) -> None:
    """The same idempotent ProduceRequest sent twice (a client retry): same base offset, one copy."""
    topic = new_topic("idem")
    with RawClient(broker.first.bootstrap) as c:
        ensure_topic_raw(c, topic)
    with RawClient(broker.leader(topic, 0).bootstrap) as c:
        init = c.request(InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=60_000))
        assert init.error_code == 0 and init.producer_id >= 0
        pid, epoch = init.producer_id, init.producer_epoch

        first = _idempotent_produce(pid, epoch, topic, 0, [b"a0", b"a1", b"a2"])
        r1 = _partition_response(c.request(first))
        assert r1.error_code == 0
        r2 = _partition_response(c.request(first))  # retried after the answer was lost
        assert (r2.error_code, r2.base_offset) == (0, r1.base_offset)

        # A retry while the first attempt is still in flight (both pipelined on one connection).
        second = _idempotent_produce(pid, epoch, topic, 3, [b"b0", b"b1"])
        c1 = c.send(second)
        c2 = c.send(second)
        (g1, s1), (g2, s2) = c.receive(), c.receive()
        assert (g1, g2) == (c1, c2)
        s1, s2 = _partition_response(s1), _partition_response(s2)
        assert s1.error_code == 0 and (s2.error_code, s2.base_offset) == (0, s1.base_offset)
        assert s1.base_offset == r1.base_offset + 3

        # The next sequence appends; a gap is refused with OUT_OF_ORDER_SEQUENCE_NUMBER (45).
        r3 = _partition_response(c.request(_idempotent_produce(pid, epoch, topic, 5, [b"c0"])))
        assert (r3.error_code, r3.base_offset) == (0, r1.base_offset + 5)
        gap = _partition_response(c.request(_idempotent_produce(pid, epoch, topic, 100, [b"x"])))
        assert gap.error_code == 45

        L = ListOffsetsRequest.ListOffsetsTopic
        latest = c.request(
            ListOffsetsRequest[7](
                replica_id=-1,
                topics=[L(name=topic, partitions=[L.ListOffsetsPartition(partition_index=0, timestamp=-1)])],
            )
        )
        assert latest.topics[0].partitions[0].offset == r1.base_offset + 6

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, consumer_timeout_ms=3000)
    tp = KTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values = [(m.offset, m.value) for m in consumer]
    consumer.close()
    assert values == list(enumerate([b"a0", b"a1", b"a2", b"b0", b"b1", b"c0"]))


# ------------------------------------------------------------------------------------ aiokafka


def test_aiokafka_round_trip(broker: Served) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATopicPartition

    topic = new_topic("aio")
    messages = make_messages(2000, seed=11, nulls=False)

    async def run() -> tuple[list[Any], dict[tuple[int, int], tuple[Any, ...]]]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True, acks="all")
        await producer.start()
        try:
            futures = [await producer.send(topic, key=k, value=v, headers=h) for k, v, h in messages]
            metas = list(await asyncio.gather(*futures))
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        got: dict[tuple[int, int], tuple[Any, ...]] = {}
        try:
            consumer.assign([ATopicPartition(topic, p) for p in range(PARTITIONS)])
            await consumer.seek_to_beginning()
            deadline = time.monotonic() + 30
            while len(got) < len(messages) and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=1000, max_records=5000)
                for records in batches.values():
                    for r in records:
                        assert (r.partition, r.offset) not in got
                        got[(r.partition, r.offset)] = (r.key, r.value, list(r.headers))
        finally:
            await consumer.stop()
        return metas, got

    metas, got = asyncio.run(run())
    expected = {(m.partition, m.offset): messages[i] for i, m in enumerate(metas)}
    assert len(expected) == len(messages)
    assert got == {pos: (k, v, [(hk, hv) for hk, hv in h]) for pos, (k, v, h) in expected.items()}


# ------------------------------------------------------------------------------------ kcat


def kcat(broker: Served, *args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(
        [KCAT, "-b", broker.bootstrap, *args], input=stdin, capture_output=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


@pytest.mark.skipif(not Path(KCAT).exists(), reason="kcat not installed")
def test_kcat_round_trip(broker: Served) -> None:
    topic = new_topic("kcat")
    lines = [f"k{i}:value {i} " + "x" * (i % 50) for i in range(500)]
    # Producing to a topic creates it (Metadata auto-create); partition 0 keeps the order total.
    kcat(broker, "-P", "-t", topic, "-p", "0", "-K", ":", stdin=("\n".join(lines) + "\n").encode())
    # More records spread over all partitions by kcat's default partitioner.
    spread = [f"s{i}:spread {i}" for i in range(300)]
    kcat(broker, "-P", "-t", topic, "-K", ":", stdin=("\n".join(spread) + "\n").encode())

    meta = json.loads(kcat(broker, "-L", "-J", "-t", topic))
    (tmeta,) = meta["topics"]
    assert tmeta["topic"] == topic and len(tmeta["partitions"]) == PARTITIONS
    assert sorted(b["id"] for b in meta["brokers"]) == broker.node_ids
    text = kcat(broker, "-L").decode()
    assert f'topic "{topic}" with {PARTITIONS} partitions' in text

    out = kcat(broker, "-C", "-t", topic, "-p", "0", "-e", "-o", "beginning", "-f", "%o|%k:%s\\n").decode()
    p0 = out.splitlines()
    assert [line.split("|", 1)[1] for line in p0[: len(lines)]] == lines
    assert [int(line.split("|", 1)[0]) for line in p0] == list(range(len(p0)))

    everything = (
        kcat(broker, "-C", "-t", topic, "-e", "-o", "beginning", "-f", "%k:%s\\n").decode().splitlines()
    )
    assert sorted(everything) == sorted(lines + spread)

    # Offset from the end: the last two records of each partition.
    tail = (
        kcat(broker, "-C", "-t", topic, "-p", "0", "-e", "-o", "-2", "-f", "%o|%k:%s\\n")
        .decode()
        .splitlines()
    )
    assert tail == p0[-2:]
    tail_all = kcat(broker, "-C", "-t", topic, "-e", "-o", "-2", "-f", "%p|%k:%s\\n").decode().splitlines()
    assert len(tail_all) == 2 * PARTITIONS
    for p in range(PARTITIONS):
        part_lines = kcat(broker, "-C", "-t", topic, "-p", str(p), "-e", "-o", "beginning", "-f", "%k:%s\\n")
        want = part_lines.decode().splitlines()[-2:]
        assert sorted(line.split("|", 1)[1] for line in tail_all if line.startswith(f"{p}|")) == sorted(want)


# ------------------------------------------------------------------------------------ offsets


def test_offsets_for_times_and_watermarks(broker: Served) -> None:
    topic = new_topic("times")
    base = int(time.time() * 1000) - 3_600_000  # an hour ago, one record per second
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(20):
        producer.produce(topic, value=b"t%d" % i, partition=0, timestamp=base + 1000 * i)
        producer.flush(10)  # one batch per record: the index has to look inside segments and batches
    for i in range(20, 40):
        producer.produce(topic, value=b"t%d" % i, partition=0, timestamp=base + 1000 * i)
    assert producer.flush(10) == 0

    consumer = confluent_consumer(broker.bootstrap)
    try:
        assert consumer.get_watermark_offsets(CTopicPartition(topic, 0), timeout=10) == (0, 40)
        assert consumer.get_watermark_offsets(CTopicPartition(topic, 1), timeout=10) == (0, 0)
        queries = {
            base - 1: 0,  # before everything: the first offset
            base: 0,
            base + 1: 1,  # first record with timestamp >= the query
            base + 2500: 3,
            base + 19_000: 19,
            base + 25_000: 25,  # inside a multi-record batch
            base + 39_000: 39,
            base + 39_001: -1,  # after everything: no offset (OFFSET_END)
        }
        for ts, want in queries.items():
            (got,) = consumer.offsets_for_times([CTopicPartition(topic, 0, ts)], timeout=10)
            assert got.error is None
            assert got.offset == want, (ts - base, got.offset, want)
        # The offset found is where consuming starts: the record there has the right timestamp.
        (start,) = consumer.offsets_for_times([CTopicPartition(topic, 0, base + 12_500)], timeout=10)
        consumer.assign([start])
        msg = consumer.consume(1, 10)[0]
        assert (msg.offset(), msg.value(), msg.timestamp()[1]) == (13, b"t13", base + 13_000)
    finally:
        consumer.close()

    kp = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    tp = KTopicPartition(topic, 0)
    assert kp.beginning_offsets([tp]) == {tp: 0} and kp.end_offsets([tp]) == {tp: 40}
    found = kp.offsets_for_times({tp: base + 30_000})[tp]
    assert found is not None and (found.offset, found.timestamp) == (30, base + 30_000)
    assert kp.offsets_for_times({tp: base + 10**9})[tp] is None
    kp.close()


# ------------------------------------------------------------------------------------ long poll


def test_fetch_long_poll_wakes_on_produce(broker: Served) -> None:
    """A consumer waiting at the end gets a record produced 1 s later."""
    topic = new_topic("longpoll")
    confluent_produce(broker.bootstrap, topic, [(None, b"first", [])], partitioner="murmur2_random")
    consumer = confluent_consumer(broker.bootstrap, **{"fetch.wait.max.ms": 2000})
    # Start at the end of every partition.
    consumer.assign(
        [
            CTopicPartition(topic, p, consumer.get_watermark_offsets(CTopicPartition(topic, p))[1])
            for p in range(PARTITIONS)
        ]
    )
    received: list[tuple[bytes, float]] = []

    def consume() -> None:
        deadline = time.monotonic() + 20
        while not received and time.monotonic() < deadline:
            for msg in consumer.consume(10, 0.2):
                if msg.error() is None:
                    received.append((msg.value(), time.monotonic()))

    thread = threading.Thread(target=consume)
    thread.start()
    time.sleep(1.0)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    producer.produce(topic, value=b"wake-up", partition=1)
    assert producer.flush(10) == 0
    thread.join(30)
    consumer.close()
    assert [v for v, _t in received] == [b"wake-up"]


def test_raw_fetch_long_poll(broker: Served) -> None:
    """Fetch(max_wait 5 s, min_bytes 1) at the end is parked, then answered when a record arrives;
    with nothing arriving it is answered empty after max_wait (not at once)."""
    topic = new_topic("rawpoll")
    with RawClient(broker.first.bootstrap) as c:
        ensure_topic_raw(c, topic)
    with RawClient(broker.leader(topic, 0).bootstrap, timeout=30) as c:
        started = time.monotonic()
        empty = raw_fetch(c, topic, 0, 0, max_wait_ms=800)
        waited = time.monotonic() - started
        assert empty.error_code == 0 and not empty.records
        assert waited >= 0.7, f"an empty long poll returned after {waited:.3f} s"

        def produce_later() -> None:
            time.sleep(1.0)
            p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
            p.produce(topic, value=b"wake-up-raw", partition=0)
            p.flush(10)

        thread = threading.Thread(target=produce_later)
        started = time.monotonic()
        thread.start()
        part = raw_fetch(c, topic, 0, 0, max_wait_ms=5000)
        woke = time.monotonic() - started
        thread.join()
        assert part.error_code == 0 and part.high_watermark == 1
        assert b"wake-up-raw" in bytes(part.records)
        assert woke < 4.5, f"the parked fetch was answered after {woke:.2f} s, not when the record came"


def test_log_append_time_topic_stamps_the_brokers_time(broker: Served) -> None:
    """message.timestamp.type=LogAppendTime: the broker stamps each batch with its own time and
    says so in the Produce answer; consumers see the type and the time (in cluster mode too,
    where the batches were stored as the producer sent them)."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = new_topic("lat")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, config={"message.timestamp.type": "LogAppendTime"})])[topic].result(30)
    before = int(time.time() * 1000)
    with RawClient(broker.leader(topic, 0).bootstrap) as c:
        P = ProduceRequest.TopicProduceData
        batch = build_batch([(5, b"k", b"v", [])])
        resp = c.request(ProduceRequest[8](
            transactional_id=None, acks=-1, timeout_ms=30_000,
            topic_data=[P(name=topic, partition_data=[P.PartitionProduceData(index=0, records=batch)])],
        ))  # fmt: skip
        part = resp.responses[0].partition_responses[0]
    after = int(time.time() * 1000)
    stamp = part.log_append_time_ms
    assert part.error_code == 0 and before <= stamp <= after
    c2 = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lat", "enable.auto.commit": False})
    try:
        c2.assign([CTopicPartition(topic, 0, OFFSET_BEGINNING)])
        msg = None
        deadline = time.monotonic() + 30
        while msg is None and time.monotonic() < deadline:
            msg = c2.poll(0.5)
        assert msg is not None and msg.error() is None
        assert msg.timestamp() == (TIMESTAMP_LOG_APPEND_TIME, stamp)
    finally:
        c2.close()
