"""Fetch bounds the whole response by max_bytes and each partition by partition_max_bytes, and
oversteps only by the first batch of the first partition that returns data (Kafka's KIP-74 rule),
from memory, from hot segments (sendfile) and from the cold store alike, with every client.

The broker tests run against one broker and against a three-broker cluster (tests/modekit.py).
A cluster reads every partition from its bucket, so there the "memory" case is that read; it has
no local segment files and no tier to relocate to (loglake.cluster.shared_log.REFUSED), so the
"segments" and "cold" cases are skipped there, naming the refusal. Raw fetches go to each
partition's leader."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer
from kafka.protocol.consumer import FetchRequest

from loglake.broker.protocol import FetchPartition, FetchResponseData, FetchTopic, fetch_limit_violations
from loglake.cluster.shared_log import REFUSED
from loglake.engine.engine import open_engine
from loglake.engine.partition_log import Feature
from loglake.records.batch import build_batch, split_batches
from loglake.records.decode import decode_batches
from modekit import MODES, Served, serving
from test_broker_malformed import RawClient

VALUE_BYTES = 990_000
PER_PARTITION = 3
#: Where each case's data is read from: the memory buffer, hot segment files, the cold store.
TIERS = {
    "memory": {},
    "segments": {"segment.records": "1"},
    "cold": {"segment.records": "1", "hot.retain.segments": "0", "retention.ms": "-1"},
}
#: What a tier needs of the partition log (cluster mode offers neither).
TIER_FEATURES = {"segments": Feature.LOCAL_SEGMENTS, "cold": Feature.TIERING}
#: The issue's consumer settings, in each client's spelling.
FETCH_MAX_BYTES = 1_000_000
PARTITION_MAX_BYTES = 20_000_000


@pytest.fixture(scope="module")
def cold_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The single broker's cold store (a cluster's is its bucket)."""
    return Path(tmp_path_factory.mktemp("fetch-limits-cold"))


@pytest.fixture(scope="module", params=MODES)
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, cold_dir: Path) -> Iterator[Served]:
    root = Path(tmp_path_factory.mktemp(f"fetch-limits-{request.param}"))
    with serving(request.param, root, single_args=["--cold-store", f"file://{cold_dir}"]) as served:
        yield served


@pytest.fixture(scope="module")
def producer(broker: Served) -> Iterator[Producer]:
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    yield p
    p.flush(10)
    del p  # before the broker stops, so that it does not keep reconnecting


_topic_numbers = itertools.count()


def _big_topic(broker: Served, cold_dir: Path, tier: str, client: str) -> str:
    """A 3-partition topic holding PER_PARTITION messages of ~1 MB each, in the given tier."""
    feature = TIER_FEATURES.get(tier)
    if feature is not None and broker.refuses(feature):
        pytest.skip(f"no {tier} tier in cluster mode: {REFUSED[feature]}")
    topic = f"big-{tier}-{client}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 3, config=TIERS[tier])])[topic].result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 2_000_000, "linger.ms": 0})
    for p in range(3):
        for i in range(PER_PARTITION):
            producer.produce(topic, bytes([p * 16 + i]) * VALUE_BYTES, partition=p)
    assert producer.flush(30) == 0
    if broker.is_cluster:
        return topic  # acknowledged once in the bucket, where every read comes from
    local = broker.first.data_dir / "segments"
    bucket = cold_dir
    deadline = time.monotonic() + 60  # wait until the broker has sealed (and relocated) them all
    while time.monotonic() < deadline:
        hot = len(list(local.rglob(f"{topic}-*/*/*.seg")))
        cold = len(list(bucket.rglob(f"{topic}-*/*/*.seg")))
        if tier == "memory" or (tier == "segments" and hot >= 3 * PER_PARTITION) or (tier == "cold" and cold >= 3 * PER_PARTITION and hot == 0):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"{topic}: segments did not reach the {tier} tier (hot {hot}, cold {cold})")
    return topic


def _expected() -> dict[int, list[int]]:
    return {p: [p * 16 + i for i in range(PER_PARTITION)] for p in range(3)}


@pytest.mark.parametrize("tier", list(TIERS))
def test_large_messages_over_three_partitions_with_a_small_fetch_max_bytes(broker: Served, cold_dir: Path, tier: str) -> None:
    topic = _big_topic(broker, cold_dir, tier, "confluent")
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": FETCH_MAX_BYTES,
            "max.partition.fetch.bytes": PARTITION_MAX_BYTES,
            "receive.message.max.bytes": 1_000_512,
        }
    )
    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    errors: list[str] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < 3 * PER_PARTITION and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                errors.append(str(msg.error()))
                continue
            value = msg.value()
            assert value is not None and len(value) == VALUE_BYTES
            got[msg.partition()].append(value[0])
    finally:
        consumer.close()
    assert errors == []
    assert got == _expected()
    assert "size rule" not in broker.log_text()


@pytest.mark.parametrize("tier", ["memory", "cold"])
def test_kafka_python_with_a_small_fetch_max_bytes(broker: Served, cold_dir: Path, tier: str) -> None:
    topic = _big_topic(broker, cold_dir, tier, "kafkapython")
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_bytes=FETCH_MAX_BYTES,
        max_partition_fetch_bytes=PARTITION_MAX_BYTES,
        consumer_timeout_ms=20_000,
    )
    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    try:
        for msg in consumer:
            assert len(msg.value) == VALUE_BYTES
            got[msg.partition].append(msg.value[0])
            if sum(map(len, got.values())) == 3 * PER_PARTITION:
                break
    finally:
        consumer.close()
    assert got == _expected()


@pytest.mark.parametrize("tier", ["memory", "segments"])
def test_aiokafka_with_a_small_fetch_max_bytes(broker: Served, cold_dir: Path, tier: str) -> None:
    topic = _big_topic(broker, cold_dir, tier, "aiokafka")

    async def consume() -> dict[int, list[int]]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=broker.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_bytes=FETCH_MAX_BYTES,
            max_partition_fetch_bytes=PARTITION_MAX_BYTES,
        )
        got: dict[int, list[int]] = {0: [], 1: [], 2: []}
        await consumer.start()
        try:
            async with asyncio.timeout(60):
                while sum(map(len, got.values())) < 3 * PER_PARTITION:
                    msg = await consumer.getone()
                    assert msg.value is not None and len(msg.value) == VALUE_BYTES
                    got[msg.partition].append(msg.value[0])
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(consume()) == _expected()


# ---- every response obeys the rule: raw Fetch requests with random sizes and limits ----------------


def _raw_fetch(client: RawClient, topic: str, partitions: list[tuple[int, int, int]], max_bytes: int, min_bytes: int = 1, max_wait_ms: int = 0) -> tuple[object, list[int]]:
    """A Fetch v12 for (partition, offset, partition_max_bytes)...; the response and, per requested
    partition, the batch sizes it carried."""
    F = FetchRequest.FetchTopic
    req = FetchRequest[12](
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        topics=[F(topic=topic, partitions=[F.FetchPartition(partition=p, fetch_offset=o, partition_max_bytes=m) for p, o, m in partitions])],
    )
    resp = client.request(req)
    return resp, [len(bytes(p.records or b"")) for p in resp.responses[0].partitions]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.lists(st.integers(min_value=1, max_value=40_000), min_size=0, max_size=6), min_size=1, max_size=4),
    max_bytes=st.integers(min_value=0, max_value=120_000),
    partition_max=st.lists(st.integers(min_value=0, max_value=80_000), min_size=4, max_size=4),
    order=st.randoms(use_true_random=False),
)
def test_every_fetch_response_obeys_the_size_rule(
    broker: Served, producer: Producer, sizes: list[list[int]], max_bytes: int, partition_max: list[int], order: random.Random
) -> None:
    """Random message sizes per partition, random max_bytes / partition_max_bytes and partition
    order: the broker's answer holds at most the limits, except the first partition with data, which
    may hold exactly one batch more; and a partition with data is skipped only for lack of room.
    Each leader is asked for the partitions it leads (one request: the single broker)."""
    topic = f"prop-{next(_topic_numbers)}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, len(sizes))])[topic].result(10)
    for p, values in enumerate(sizes):
        for size in values:
            producer.produce(topic, b"v" * size, partition=p)
            producer.flush(10)  # one batch per message: the first-batch exception is exact
    everything = [(p, 0, partition_max[p]) for p in range(len(sizes))]
    order.shuffle(everything)
    leaders = broker.leaders(topic, len(sizes))
    for node in sorted(set(leaders.values())):
        request = [r for r in everything if leaders[r[0]] == node]
        with RawClient(broker.broker(node).bootstrap) as client:
            resp, got = _raw_fetch(client, topic, request, max_bytes)
        total = 0
        seen_data = False
        for (p, _offset, p_max), size, part in zip(request, got, resp.responses[0].partitions, strict=True):  # type: ignore[attr-defined]
            assert part.partition_index == p and part.error_code == 0
            batches = split_batches(bytes(part.records)) if size else []
            limit = min(p_max, max(max_bytes - total, 0))
            if size > limit:
                assert not seen_data and len(batches) == 1, (p, size, limit, len(batches))
            if sizes[p] and not size:
                assert seen_data, "the first partition with data must return at least one batch"
            seen_data = seen_data or size > 0
            total += size
    assert "size rule" not in broker.log_text()


def test_min_bytes_waits_for_more_data_on_a_partition_that_had_some(broker: Served, producer: Producer) -> None:
    """A long poll holds the response until min_bytes have arrived, also when the partition already
    had data below min_bytes (not only when it was empty)."""
    topic = "minbytes"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1)])[topic].result(10)
    producer.produce(topic, b"a" * 100, partition=0)
    assert producer.flush(10) == 0

    def produce_later() -> None:
        time.sleep(0.5)
        producer.produce(topic, b"b" * 5_000, partition=0)
        producer.flush(10)

    thread = threading.Thread(target=produce_later)
    with RawClient(broker.leader(topic, 0).bootstrap, timeout=30) as client:
        thread.start()
        resp, (size,) = _raw_fetch(client, topic, [(0, 0, 1 << 20)], 1 << 20, min_bytes=4_000, max_wait_ms=20_000)
    thread.join()
    data = bytes(resp.responses[0].partitions[0].records)  # type: ignore[attr-defined]
    assert size == len(data)
    assert [r.value for _h, records in decode_batches(data) for r in records] == [b"a" * 100, b"b" * 5_000]


# ---- the check itself --------------------------------------------------------------------------


def _response(*partitions: list[bytes]) -> FetchResponseData:
    return FetchResponseData(responses=[FetchTopic(topic="t", partitions=[FetchPartition(i, records=chunks) for i, chunks in enumerate(partitions)])])


def test_limit_check_allows_only_one_first_batch_over() -> None:
    small = build_batch([(0, None, b"x" * 100, [])])
    big = build_batch([(0, None, b"x" * 5_000, [])])

    def first(chunk: object) -> int:
        from loglake.broker.protocol import batch_bytes

        return batch_bytes(chunk)  # type: ignore[arg-type]

    limits = [[1_000, 1_000, 1_000]]
    # the first partition with data may overstep by one batch
    assert fetch_limit_violations(_response([], [big], [small]), 1_000, limits, first) == [(0, 2, f"{len(small)} record bytes where 0 fit")]
    assert fetch_limit_violations(_response([], [big], []), 1_000, limits, first) == []
    # but not by two batches, and a later partition not at all
    assert fetch_limit_violations(_response([big, big]), 1_000, limits, first)[0][:2] == (0, 0)
    assert fetch_limit_violations(_response([small], [big]), 10_000, limits, first)[0][:2] == (0, 1)
    # within the limits: fine
    assert fetch_limit_violations(_response([small], [small], [small]), 10_000, limits, first) == []


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=5_000), min_size=1, max_size=12),
    max_bytes=st.integers(min_value=1, max_value=12_000),
    seal_after=st.integers(min_value=0, max_value=12),
    start=st.integers(min_value=0, max_value=11),
)
def test_reads_respect_the_limit_except_by_one_first_batch(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], max_bytes: int, seal_after: int, start: int
) -> None:
    """The engine's side of the rule, from memory and from segments: without `min_one` a read never
    returns more than `max_bytes`; with it, more only as one single batch."""
    engine = open_engine(str(tmp_path_factory.mktemp("limits")), cleaner_threads=0, wal_shards=1)
    try:
        engine.create_topic("t", 1)
        for i, size in enumerate(sizes):
            engine.append_records("t", 0, [(None, None, b"x" * size, [])]).result()
            if i + 1 == seal_after:
                engine.flush()
        offset = min(start, len(sizes) - 1)
        for min_one in (False, True):
            result = engine.read("t", 0, offset, max_bytes, min_one=min_one)
            data = b"".join(bytes(c) for c in result.chunks)  # type: ignore[arg-type]
            batches = split_batches(data) if data else []
            if len(data) > max_bytes:
                assert min_one and len(batches) == 1, (min_one, len(data), max_bytes, len(batches))
            if min_one:
                assert batches, "a read with min_one returns at least one batch when there is data"
    finally:
        engine.close()


def test_min_bytes_zero_is_answered_at_once(broker: Served) -> None:
    """Kafka: "if the client sets min_bytes to 0 the server will always respond immediately". Here
    max_wait_ms is 30 s and the client's socket gives up after 10 s: only an immediate answer passes."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("minzero", 1)])["minzero"].result(10)
    with RawClient(broker.leader("minzero", 0).bootstrap, timeout=10) as client:
        resp, (size,) = _raw_fetch(client, "minzero", [(0, 0, 1 << 20)], 1 << 20, min_bytes=0, max_wait_ms=30_000)
    assert size == 0 and resp.responses[0].partitions[0].error_code == 0  # type: ignore[attr-defined]
