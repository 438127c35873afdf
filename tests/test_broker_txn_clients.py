"""Transactional producers of kafka-python, aiokafka and confluent-kafka against the real broker,
read back by kcat with isolation.level=read_committed and by kafka-python's and confluent-kafka's
read_committed consumers — against one broker and a three-broker cluster (tests/modekit.py; the
transaction's coordinator and its partitions' leaders are then different brokers)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest

from modekit import MODES, Served, serving
from test_broker_malformed import RawClient

from brokerkit import Broker

PARTITIONS = 2
KCAT = shutil.which("kcat") or "/usr/bin/kcat"


@pytest.fixture(scope="module", params=MODES)
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = Path(tmp_path_factory.mktemp(f"txnclients-{request.param}"))
    with serving(request.param, tmp, ["--default-partitions", str(PARTITIONS)]) as served:
        yield served


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kcat_values(broker: Served, topic: str, isolation: str) -> list[str]:
    proc = subprocess.run(
        [KCAT, "-b", broker.bootstrap, "-C", "-t", topic, "-e", "-o", "beginning", "-q", "-f", "%s\\n",
         "-X", f"isolation.level={isolation}"],
        capture_output=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout.decode().splitlines()


def kafka_python_transactions(broker: Served, topic: str) -> tuple[list[str], list[str]]:
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=new_name("kp-tid"))
    p.init_transactions()
    committed, aborted = [], []
    for round_ in range(3):
        p.begin_transaction()
        values = [f"kp-{round_}-{i}" for i in range(20)]
        for i, v in enumerate(values):
            p.send(topic, value=v.encode(), partition=i % PARTITIONS)
        p.flush()
        if round_ == 1:
            p.abort_transaction()
            aborted += values
        else:
            p.commit_transaction()
            committed += values
    p.close()
    return committed, aborted


@pytest.mark.skipif(not Path(KCAT).exists(), reason="kcat not installed")
def test_kafka_python_producer_kcat_read_committed(broker: Served) -> None:
    topic = new_name("kp-txn")
    committed, aborted = kafka_python_transactions(broker, topic)
    assert sorted(kcat_values(broker, topic, "read_committed")) == sorted(committed)
    assert sorted(kcat_values(broker, topic, "read_uncommitted")) == sorted(committed + aborted)


def test_kafka_python_read_committed_consumer(broker: Served) -> None:
    topic = new_name("kp-rc")
    committed, _aborted = kafka_python_transactions(broker, topic)
    c = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, isolation_level="read_committed", enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    c.assign([KTopicPartition(topic, p) for p in range(PARTITIONS)])
    c.seek_to_beginning()
    got = [m.value.decode() for m in c]
    c.close()
    assert sorted(got) == sorted(committed)


def test_aiokafka_transactional_producer(broker: Served) -> None:
    topic = new_name("aio-txn")

    async def run() -> tuple[list[str], list[str]]:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=new_name("aio-tid"))
        await p.start()
        try:
            async with p.transaction():
                for i in range(10):
                    await p.send(topic, value=f"aio-ok-{i}".encode(), partition=i % PARTITIONS)
            await p.begin_transaction()
            for i in range(10):
                await p.send(topic, value=f"aio-no-{i}".encode(), partition=i % PARTITIONS)
            await p.abort_transaction()
        finally:
            await p.stop()
        return [f"aio-ok-{i}" for i in range(10)], [f"aio-no-{i}" for i in range(10)]

    committed, aborted = asyncio.run(run())
    if Path(KCAT).exists():
        assert sorted(kcat_values(broker, topic, "read_committed")) == sorted(committed)
        assert sorted(kcat_values(broker, topic, "read_uncommitted")) == sorted(committed + aborted)


def confluent_read_committed(broker: Served, topic: str, partitions: int = PARTITIONS) -> list[str]:
    """Every value a read_committed confluent-kafka consumer reads from the start to the end."""
    c = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": new_name("rc"), "isolation.level": "read_committed",
        "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "earliest",
    })  # fmt: skip
    c.assign([CTopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[str] = []
    ended: set[int] = set()
    try:
        for _ in range(600):
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                ended.add(m.partition())
                if len(ended) == partitions:
                    break
                continue
            got.append(m.value().decode())
        else:
            raise AssertionError(f"partitions {sorted(set(range(partitions)) - ended)} never reached their end")
    finally:
        c.close()
    return got


def test_confluent_transactional_producer_read_committed(broker: Served) -> None:
    topic = new_name("ck-txn")
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": new_name("ck-tid")})
    p.init_transactions(60)
    committed, aborted = [], []
    for round_ in range(4):
        p.begin_transaction()
        values = [f"ck-{round_}-{i}" for i in range(10)]
        for i, v in enumerate(values):
            p.produce(topic, value=v.encode(), partition=i % PARTITIONS)
        if round_ % 2:
            p.flush(60)  # in the log before the abort (librdkafka drops what it has not sent)
            p.abort_transaction(60)
            aborted += values
        else:
            p.commit_transaction(60)
            committed += values
    got = confluent_read_committed(broker, topic)
    assert sorted(got) == sorted(committed)  # each committed record once, no aborted one
    if Path(KCAT).exists():
        assert sorted(kcat_values(broker, topic, "read_uncommitted")) == sorted(committed + aborted)


def test_send_offsets_to_transaction(broker: Served) -> None:
    """The offsets commit with the transaction and are dropped with an aborted one. In cluster
    mode the group's coordinator is often another broker than the transaction's: four groups
    over three brokers, so some are (it stages them and commits them when the prepare record
    names the group)."""
    topic = new_name("ck-offs")
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": new_name("ck-offs-tid")})
    p.init_transactions(60)
    consumers = [Consumer({"bootstrap.servers": broker.bootstrap, "group.id": new_name(f"ck-offs-g{i}")})
                 for i in range(4)]
    try:
        for offset, commit in ((7, True), (9, False), (11, True)):
            p.begin_transaction()
            p.produce(topic, value=b"x", partition=0)
            for i, c in enumerate(consumers):
                p.send_offsets_to_transaction([CTopicPartition(topic, 0, offset + i)], c.consumer_group_metadata(), 30)
            if commit:
                p.commit_transaction(60)
            else:
                p.abort_transaction(60)
            want = offset if commit else offset - 2  # an abort leaves the previous commit's
            for i, c in enumerate(consumers):
                assert [tp.offset for tp in c.committed([CTopicPartition(topic, 0)], 30)] == [want + i], (offset, i)
    finally:
        for c in consumers:
            c.close()


def _offsets_on(b: Broker, topic: str) -> tuple[int, int, int, int]:
    """(ListOffsets latest at read_uncommitted, at read_committed, Fetch's high watermark and last
    stable offset at read_committed) of partition 0, asked of broker `b`."""
    T = ListOffsetsRequest.ListOffsetsTopic
    F = FetchRequest.FetchTopic
    out: list[int] = []
    with RawClient(b.bootstrap) as c:
        for isolation in (0, 1):
            resp = c.request(ListOffsetsRequest[7](replica_id=-1, isolation_level=isolation, topics=[
                T(name=topic, partitions=[T.ListOffsetsPartition(partition_index=0, timestamp=-1)])]))  # fmt: skip
            part = resp.topics[0].partitions[0]
            assert part.error_code == 0, part
            out.append(int(part.offset))
        resp = c.request(FetchRequest[12](max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=1, topics=[
            F(topic=topic, partitions=[F.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])]))  # fmt: skip
        part = resp.responses[0].partitions[0]
        assert part.error_code == 0, part
        out += [int(part.high_watermark), int(part.last_stable_offset)]
    return out[0], out[1], out[2], out[3]


def test_last_stable_offset_on_every_broker(broker: Served) -> None:
    """An open transaction holds the last stable offset back on every broker (in cluster mode
    also those that neither lead the partition nor coordinate the transaction); its commit moves
    it to the high watermark everywhere."""
    topic = new_name("lso")
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": new_name("lso-tid")})
    p.init_transactions(60)
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, value=f"c-{i}".encode(), partition=0)
    p.commit_transaction(60)  # offsets 0, 1 and the COMMIT marker at 2
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=f"o-{i}".encode(), partition=0)
    p.flush(60)  # offsets 3..5, open
    assert broker.agreed(lambda b: _offsets_on(b, topic)) == (6, 3, 6, 3)
    p.commit_transaction(60)  # the marker at 6
    assert broker.agreed(lambda b: _offsets_on(b, topic)) == (7, 7, 7, 7)
