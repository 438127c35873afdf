"""Real consumers of a many-partition topic read every record exactly once while it is being
written, with the broker's fetch sessions (KIP-227) in use where the client asks for them; the
broker's metrics say whether sessions were used."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from test_broker_observability import samples, scrape

from brokerkit import InProcessBroker, free_port, serving_in_process

PARTITIONS = 48
RECORDS = 2_400
#: Longest a consumer may take to read everything (a bound on a hang, not a measurement).
CONSUME_DEADLINE_S = 120.0

Record = tuple[int, int, bytes]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    port = free_port()
    with serving_in_process(Path(tmp_path_factory.mktemp("fsess-clients")) / "data", ["--metrics-listen", f"127.0.0.1:{port}"]) as b:
        b.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
        yield b


_names = itertools.count()


def _metric(b: InProcessBroker, family: str) -> float:
    families, _ = scrape(b.metrics_url)  # type: ignore[attr-defined]
    return sum(s.value for s in samples(families, family) if not s.name.endswith("_created"))


def _produce_while(b: InProcessBroker, topic: str, started: threading.Event) -> threading.Thread:
    """Writes RECORDS records round-robin over the partitions, slowly enough to overlap the consumer."""

    def run() -> None:
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 1})
        started.wait(30)
        for i in range(RECORDS):
            p.produce(topic, value=f"r{i}".encode(), partition=i % PARTITIONS)
            if i % 200 == 199:
                p.flush(30)
                time.sleep(0.05)
        assert p.flush(30) == 0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _check(got: list[Record]) -> None:
    assert len(got) == RECORDS, f"{len(got)} records read, {len(set(got))} distinct"
    assert len(set(got)) == RECORDS
    assert {v for _p, _o, v in got} == {f"r{i}".encode() for i in range(RECORDS)}
    for p in range(PARTITIONS):
        offsets = sorted(o for q, o, _v in got if q == p)
        assert offsets == list(range(len(offsets)))


def _new_topic(b: InProcessBroker) -> str:
    name = f"fsess-clients-{next(_names)}"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
    return name


def _consume(b: InProcessBroker, poll: Callable[[], list[Record]], started: threading.Event, topic: str) -> list[Record]:
    writer = _produce_while(b, topic, started)
    got: list[Record] = []
    deadline = time.monotonic() + CONSUME_DEADLINE_S
    while len(got) < RECORDS and time.monotonic() < deadline:
        got.extend(poll())
        started.set()
    writer.join(60)
    # Anything more (a duplicate) would show up now.
    for _ in range(3):
        got.extend(poll())
    return got


def test_kafka_python_consumer_uses_sessions_and_reads_everything_once(broker: InProcessBroker) -> None:
    topic = _new_topic(broker)
    created, incremental = _metric(broker, "loglake_fetch_sessions_opened"), _metric(broker, "loglake_fetch_incremental")
    errors = _metric(broker, "loglake_fetch_session_errors")
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100)
    consumer.assign([KTopicPartition(topic, p) for p in range(PARTITIONS)])
    consumer.seek_to_beginning()

    def poll() -> list[Record]:
        batches = consumer.poll(timeout_ms=200, max_records=500)
        return [(r.partition, r.offset, r.value) for records in batches.values() for r in records]

    try:
        got = _consume(broker, poll, threading.Event(), topic)
    finally:
        consumer.close()
    _check(got)
    assert _metric(broker, "loglake_fetch_sessions_opened") > created
    assert _metric(broker, "loglake_fetch_incremental") > incremental
    assert _metric(broker, "loglake_fetch_session_errors") == errors


def test_confluent_consumer_reads_everything_once(broker: InProcessBroker) -> None:
    """librdkafka (2.16) does not implement KIP-227: it sends session id 0, epoch -1 (sessionless
    full fetches), which must keep working beside session users."""
    topic = _new_topic(broker)
    opened = _metric(broker, "loglake_fetch_sessions_opened")
    consumer = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
    })
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])

    def poll() -> list[Record]:
        out = []
        for m in consumer.consume(500, timeout=0.2):
            assert m.error() is None, m.error()
            out.append((m.partition(), m.offset(), m.value()))
        return out

    try:
        got = _consume(broker, poll, threading.Event(), topic)
    finally:
        consumer.close()
    _check(got)
    assert _metric(broker, "loglake_fetch_sessions_opened") == opened
