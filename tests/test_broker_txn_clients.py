"""Transactional producers of kafka-python and aiokafka against the real broker, read back by
kcat with isolation.level=read_committed and by kafka-python's read_committed consumer."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition

from brokerkit import InProcessBroker, serving_in_process

PARTITIONS = 2
KCAT = shutil.which("kcat") or "/usr/bin/kcat"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data = Path(tmp_path_factory.mktemp("txnclients")) / "data"
    with serving_in_process(data, ["--default-partitions", str(PARTITIONS)]) as b:
        yield b


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kcat_values(broker: InProcessBroker, topic: str, isolation: str) -> list[str]:
    proc = subprocess.run(
        [KCAT, "-b", broker.bootstrap, "-C", "-t", topic, "-e", "-o", "beginning", "-q", "-f", "%s\\n",
         "-X", f"isolation.level={isolation}"],
        capture_output=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout.decode().splitlines()


def kafka_python_transactions(broker: InProcessBroker, topic: str) -> tuple[list[str], list[str]]:
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
def test_kafka_python_producer_kcat_read_committed(broker: InProcessBroker) -> None:
    topic = new_name("kp-txn")
    committed, aborted = kafka_python_transactions(broker, topic)
    assert sorted(kcat_values(broker, topic, "read_committed")) == sorted(committed)
    assert sorted(kcat_values(broker, topic, "read_uncommitted")) == sorted(committed + aborted)


def test_kafka_python_read_committed_consumer(broker: InProcessBroker) -> None:
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


def test_aiokafka_transactional_producer(broker: InProcessBroker) -> None:
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
