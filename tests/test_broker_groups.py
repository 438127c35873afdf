"""Consumer groups through real clients against the real broker process, one broker and a
three-broker cluster (tests/modekit.py: one of each for the module; each test its own topic).

confluent-kafka: a group of 3 splits 6 partitions, members leave and the rest take over,
committed offsets survive a restart of every broker; a restart of the group's coordinator in the
middle of a group session (clients reconnect and continue, nothing lost). kafka-python and
aiokafka: group consumption with commits.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from modekit import MODES, Served, serving

PARTITIONS = 6
GROUP_ARGS = ["--auto-create-topics"]
ENV = {"LOGLAKE_GROUP_INITIAL_REBALANCE_DELAY_MS": "0", "LOGLAKE_GROUP_MIN_SESSION_TIMEOUT_MS": "1000"}


def produce(bootstrap: str, topic: str, count: int, start: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(start, start + count):
        p.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
    assert p.flush(30) == 0


@pytest.fixture(scope="module", params=MODES)
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = Path(tmp_path_factory.mktemp(f"groups-{request.param}"))
    with serving(request.param, tmp, GROUP_ARGS, ENV) as served:
        yield served


@pytest.fixture
def topic(broker: Served) -> str:
    """A fresh topic of PARTITIONS partitions for the test, every partition with a live leader."""
    name = f"g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS)])[name].result(30)
    broker.leaders(name, PARTITIONS)
    return name


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


def test_group_of_three_splits_partitions_and_survivors_take_over(broker: Served, topic: str) -> None:
    produce(broker.bootstrap, topic, 600)
    seen: dict[int, list[bytes]] = {}
    assignments: dict[int, set[int]] = {}
    lock = threading.Lock()
    joined: set[int] = set()  # members that have had an assignment
    someone_left = threading.Event()

    def member(idx: int, stay_s: float) -> None:
        c = _consumer(broker.bootstrap, "trio")
        c.subscribe([topic])
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
                with lock:
                    everything = sum(len(v) for v in seen.values()) >= 600
                # The last member stays until every record is in (or a minute more): how long the
                # takeovers take is the machine's load, and a fixed stay cut it short under load.
                if idx < 2 or everything or time.monotonic() > deadline + 60:
                    someone_left.set()
                    break
        c.close()  # LeaveGroup: the others take over its partitions

    threads = [threading.Thread(target=member, args=(i, 3 + 4 * i)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    # While all three were members, the six partitions were split between them, two each.
    assert sorted(len(a) for a in assignments.values()) == [2, 2, 2]
    assert set().union(*assignments.values()) == set(range(PARTITIONS))
    values = [v for vs in seen.values() for v in vs]
    assert sorted(values, key=int) == [b"%d" % i for i in range(600)]  # every record exactly once
    c = _consumer(broker.bootstrap, "trio")
    committed = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    c.close()
    assert [tp.offset for tp in committed] == [100] * PARTITIONS


def test_committed_offsets_survive_a_broker_restart(broker: Served, topic: str) -> None:
    produce(broker.bootstrap, topic, 60)
    c = _consumer(broker.bootstrap, "durable")
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    c.commit(offsets=[TopicPartition(topic, p, 7 + p) for p in range(PARTITIONS)], asynchronous=False)
    c.close()
    broker.restart()
    c = _consumer(broker.bootstrap, "durable")
    committed = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=15)
    c.close()
    assert [tp.offset for tp in committed] == [7 + p for p in range(PARTITIONS)]


def test_broker_restart_in_the_middle_of_a_group_session(broker: Served, topic: str) -> None:
    produce(broker.bootstrap, topic, 300)
    got: list[bytes] = []
    stop = threading.Event()

    def consume() -> None:
        c = _consumer(broker.bootstrap, "restart", **{"reconnect.backoff.max.ms": 500})
        c.subscribe([topic])
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
    broker.restart(broker.coordinator_id("restart"))  # same port: the clients reconnect on their own
    produce(broker.bootstrap, topic, 300, start=300)
    deadline = time.monotonic() + 60
    while len(set(got)) < 600 and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    t.join(30)
    assert set(got) == {b"%d" % i for i in range(600)}  # nothing lost across the restart


def test_kafka_python_group_consumer_commits(broker: Served, topic: str) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    produce(broker.bootstrap, topic, 120)
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id="kp",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=8000,
    )
    values = [m.value for m in consumer]
    consumer.commit()
    committed = {p: consumer.committed(KTP(topic, p)) for p in range(PARTITIONS)}
    consumer.close()
    assert sorted(values, key=int) == [b"%d" % i for i in range(120)]
    assert committed == {p: 20 for p in range(PARTITIONS)}


def test_aiokafka_group_consumer_commits(broker: Served, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    produce(broker.bootstrap, topic, 60)

    async def run() -> tuple[list[bytes], dict[int, int | None]]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=broker.bootstrap,
            group_id="aio",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
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
            committed = {p: await consumer.committed(ATP(topic, p)) for p in range(PARTITIONS)}
        finally:
            await consumer.stop()
        return values, committed

    values, committed = asyncio.run(run())
    assert sorted(values, key=int) == [b"%d" % i for i in range(60)]
    assert committed == {p: 10 for p in range(PARTITIONS)}
