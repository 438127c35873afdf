"""Consumer groups through real clients against the real broker process.

confluent-kafka: a group of 3 splits 6 partitions, members leave and the rest take over,
committed offsets survive a broker restart; a broker restart in the middle of a group session
(clients reconnect and continue, nothing lost). kafka-python and aiokafka: group consumption
with commits.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import loglake

from brokerkit import Broker

PARTITIONS = 6
GROUP_ARGS = ["--auto-create-topics"]
ENV = {"LOGLAKE_GROUP_INITIAL_REBALANCE_DELAY_MS": "0", "LOGLAKE_GROUP_MIN_SESSION_TIMEOUT_MS": "1000"}


def make_topic(data_dir: Path, name: str, partitions: int = PARTITIONS) -> None:
    with loglake.open(str(data_dir)) as log:
        log.create_topic(name, partitions)


def produce(bootstrap: str, topic: str, count: int, start: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(start, start + count):
        p.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
    assert p.flush(30) == 0


@pytest.fixture
def broker(tmp_path: Path):  # type: ignore[no-untyped-def]
    make_topic(tmp_path / "data", "g")
    b = Broker(tmp_path / "data", GROUP_ARGS, env=ENV).start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.stop()


def _consumer(bootstrap: str, group: str, **extra: object) -> Consumer:
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    }
    conf.update(extra)
    return Consumer(conf)


def test_group_of_three_splits_partitions_and_survivors_take_over(broker: Broker) -> None:
    produce(broker.bootstrap, "g", 600)
    seen: dict[int, list[bytes]] = {}
    assignments: dict[int, set[int]] = {}
    lock = threading.Lock()
    joined: set[int] = set()  # members that have had an assignment
    someone_left = threading.Event()

    def member(idx: int, stay_s: float) -> None:
        c = _consumer(broker.bootstrap, "trio")
        c.subscribe(["g"])
        deadline = None
        give_up = time.monotonic() + 30
        while True:
            m = c.poll(0.2)  # keep polling while waiting for the others: a rebalance needs it
            if c.assignment() and not someone_left.is_set():
                # The assignment in force while all three are members (with a rebalance delay of
                # 0 the first member may hold all six until the others' JoinGroups arrive).
                with lock:
                    assignments[idx] = {tp.partition for tp in c.assignment()}
                    joined.add(idx)
            if deadline is None and (len(joined) == 3 or time.monotonic() > give_up):
                deadline = time.monotonic() + stay_s
            if m is not None and not m.error():
                with lock:
                    seen.setdefault(idx, []).append(m.value())
                c.commit(m, asynchronous=False)
            if deadline is not None and time.monotonic() > deadline:
                someone_left.set()
                break
        c.close()  # LeaveGroup: the others take over its partitions

    threads = [threading.Thread(target=member, args=(i, 3 + 4 * i)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # While all three were members, the six partitions were split between them, two each.
    assert sorted(len(a) for a in assignments.values()) == [2, 2, 2]
    assert set().union(*assignments.values()) == set(range(PARTITIONS))
    values = [v for vs in seen.values() for v in vs]
    assert sorted(values, key=int) == [b"%d" % i for i in range(600)]  # every record exactly once
    c = _consumer(broker.bootstrap, "trio")
    committed = c.committed([TopicPartition("g", p) for p in range(PARTITIONS)], timeout=10)
    c.close()
    assert [tp.offset for tp in committed] == [100] * PARTITIONS


def test_committed_offsets_survive_a_broker_restart(broker: Broker) -> None:
    produce(broker.bootstrap, "g", 60)
    c = _consumer(broker.bootstrap, "durable")
    c.assign([TopicPartition("g", p, 0) for p in range(PARTITIONS)])
    c.commit(offsets=[TopicPartition("g", p, 7 + p) for p in range(PARTITIONS)], asynchronous=False)
    c.close()
    broker.restart()
    c = _consumer(broker.bootstrap, "durable")
    committed = c.committed([TopicPartition("g", p) for p in range(PARTITIONS)], timeout=15)
    c.close()
    assert [tp.offset for tp in committed] == [7 + p for p in range(PARTITIONS)]


def test_broker_restart_in_the_middle_of_a_group_session(broker: Broker) -> None:
    produce(broker.bootstrap, "g", 300)
    got: list[bytes] = []
    stop = threading.Event()

    def consume() -> None:
        c = _consumer(broker.bootstrap, "restart", **{"reconnect.backoff.max.ms": 500})
        c.subscribe(["g"])
        while not stop.is_set():
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
                c.commit(m, asynchronous=False)
        c.close()

    t = threading.Thread(target=consume)
    t.start()
    deadline = time.monotonic() + 30
    while len(got) < 300 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(got) == 300
    port = broker.port
    broker.extra_args = [*GROUP_ARGS, "--listen", f"127.0.0.1:{port}"]
    broker.stop()
    broker.start()  # same port: the clients reconnect on their own
    produce(broker.bootstrap, "g", 300, start=300)
    deadline = time.monotonic() + 60
    while len(set(got)) < 600 and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    t.join(30)
    assert set(got) == {b"%d" % i for i in range(600)}  # nothing lost across the restart


def test_kafka_python_group_consumer_commits(broker: Broker) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    produce(broker.bootstrap, "g", 120)
    consumer = KafkaConsumer(
        "g",
        bootstrap_servers=broker.bootstrap,
        group_id="kp",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=8000,
    )
    values = [m.value for m in consumer]
    consumer.commit()
    committed = {p: consumer.committed(KTP("g", p)) for p in range(PARTITIONS)}
    consumer.close()
    assert sorted(values, key=int) == [b"%d" % i for i in range(120)]
    assert committed == {p: 20 for p in range(PARTITIONS)}


def test_aiokafka_group_consumer_commits(broker: Broker) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    produce(broker.bootstrap, "g", 60)

    async def run() -> tuple[list[bytes], dict[int, int | None]]:
        consumer = AIOKafkaConsumer(
            "g", bootstrap_servers=broker.bootstrap, group_id="aio", auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        values: list[bytes] = []
        try:
            deadline = time.monotonic() + 30
            while len(values) < 60 and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    values.extend(r.value for r in records)
            await consumer.commit()
            committed = {p: await consumer.committed(ATP("g", p)) for p in range(PARTITIONS)}
        finally:
            await consumer.stop()
        return values, committed

    values, committed = asyncio.run(run())
    assert sorted(values, key=int) == [b"%d" % i for i in range(60)]
    assert committed == {p: 10 for p in range(PARTITIONS)}
