"""Fetch bounds the whole response by max_bytes and each partition by partition_max_bytes, and
oversteps only by the first batch of the first partition that returns data (Kafka's KIP-74 rule),
from memory and from sealed segments alike."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.engine.engine import open_engine
from loglake.records.batch import split_batches

from brokerkit import Broker, serving_broker

VALUE_BYTES = 990_000
PER_PARTITION = 3


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with serving_broker(Path(tmp_path_factory.mktemp("fetch-limits")) / "data") as b:
        yield b


@pytest.mark.parametrize("sealed", [False, True], ids=["memory", "segments"])
def test_large_messages_over_three_partitions_with_a_small_fetch_max_bytes(broker: Broker, sealed: bool) -> None:
    topic = f"big-{'sealed' if sealed else 'memory'}"
    config = {"segment.records": "1"} if sealed else {}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 3, config=config)])[topic].result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 2_000_000, "linger.ms": 0})
    for p in range(3):
        for i in range(PER_PARTITION):
            producer.produce(topic, bytes([p * 16 + i]) * VALUE_BYTES, partition=p)
    assert producer.flush(30) == 0
    if sealed:
        deadline = time.monotonic() + 30  # wait until the broker has sealed them all
        while time.monotonic() < deadline and len(list((broker.data_dir / "segments").rglob(f"{topic}-*/*/*.seg"))) < 3 * PER_PARTITION:
            time.sleep(0.05)
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 1_000_000,
            "max.partition.fetch.bytes": 20_000_000,
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
    assert got == {p: [p * 16 + i for i in range(PER_PARTITION)] for p in range(3)}


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
