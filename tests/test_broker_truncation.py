"""A consumer detects log truncation through leader epochs (KIP-320) against the real broker.

The broker is killed (SIGKILL) after a confluent-kafka consumer read records of a
`durability=ephemeral` topic: those lived only in memory, so the restart loses them (the log end
goes back to 0) and recovery starts leader epoch 1 there. The consumer sees epoch 1 in Metadata,
validates its position (offset 20, epoch 0 — stamped in the batches it read) with
OffsetForLeaderEpoch, learns epoch 0 ended at 0, and, with `auto.offset.reset=error`, reports
the truncation (librdkafka 2.x: an `_AUTO_OFFSET_RESET` error whose text is its
"Partition log truncation detected" reason). A `durability=fsync` topic loses nothing and keeps epoch 0.
OffsetDelete's deletions survive the restart (they are metadata records).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import OffsetAndMetadata

from loglake.kafka_errors import ErrorCode
from test_broker_admin import raw_call

from brokerkit import Broker, free_port, start_on_port

TIMEOUT = 15.0
#: Polls a consumer gets to show an event (each up to 0.5 s): a bound, not a timing assertion.
POLLS_MAX = 120


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[Broker]:
    port = free_port()
    b = Broker(tmp_path / "data", ["--listen", f"127.0.0.1:{port}"])
    start_on_port(b, port)
    try:
        yield b
    finally:
        if b.proc is not None and b.proc.poll() is None:
            b.stop()


def epochs(broker: Broker, topic: str) -> list[int]:
    meta = raw_call(broker, 3, 12, topics=[{"name": topic}], allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False)
    return [p.leader_epoch for p in meta.topics[0].partitions]


def fetch_error(broker: Broker, topic: str, current_epoch: int) -> tuple[int, int | None]:
    """(error code, leader epoch of the `current_leader` tag or None) of a Fetch v12 at offset 0."""
    resp = raw_call(broker, 1, 12, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                    session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[], topics=[
                        {"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": current_epoch,
                                                         "fetch_offset": 0, "last_fetched_epoch": -1,
                                                         "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}])
    part = resp.responses[0].partitions[0]
    leader = part.current_leader
    return part.error_code, (leader.leader_epoch if leader is not None and leader.leader_epoch >= 0 else None)


def read_values(consumer: Consumer, count: int) -> list[tuple[int, int | None, bytes | None]]:
    """(offset, leader epoch, value) of the next `count` records (errors skipped)."""
    out: list[tuple[int, int | None, bytes | None]] = []
    for _ in range(POLLS_MAX):
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            out.append((msg.offset(), msg.leader_epoch(), msg.value()))
            if len(out) == count:
                break
    return out


def test_consumer_detects_truncation_after_unclean_restart(broker: Broker) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic("lost", 1, 1, topic_configs={"durability": "ephemeral"}),
                         NewTopic("kept", 1, 1, topic_configs={"durability": "fsync"})])
    admin.close()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(20):
        producer.produce("lost", b"%d" % i, partition=0)
        producer.produce("kept", b"%d" % i, partition=0)
    assert producer.flush(TIMEOUT) == 0

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "trunc", "enable.auto.commit": False,
                         "auto.offset.reset": "error", "topic.metadata.refresh.interval.ms": 1000})
    # With a reset policy instead, librdkafka seeks to where the epoch ended and reads on from there.
    follower = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "trunc-follow", "enable.auto.commit": False,
                         "auto.offset.reset": "latest", "topic.metadata.refresh.interval.ms": 1000})
    try:
        consumer.assign([CTopicPartition("lost", 0, 0)])
        follower.assign([CTopicPartition("lost", 0, 0)])
        assert read_values(consumer, 20) == [(i, 0, b"%d" % i) for i in range(20)]  # epoch 0 stamped in every batch
        assert len(read_values(follower, 20)) == 20

        port = broker.port
        broker.stop(signal.SIGKILL)
        start_on_port(broker, port)
        assert epochs(broker, "lost") == [1]
        assert epochs(broker, "kept") == [0]
        assert "leader epoch 1 starts at offset 0" in broker.log_text()
        # A request still holding epoch 0 is fenced; one with epoch 1 learns where epoch 0 ended.
        assert fetch_error(broker, "lost", current_epoch=0) == (ErrorCode.FENCED_LEADER_EPOCH, 1)
        assert fetch_error(broker, "lost", current_epoch=2) == (ErrorCode.UNKNOWN_LEADER_EPOCH, 1)
        assert fetch_error(broker, "kept", current_epoch=0) == (0, None)
        ofle = raw_call(broker, 23, 4, replica_id=-1, topics=[{"topic": "lost", "partitions": [
            {"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0},
            {"partition": 0, "current_leader_epoch": 1, "leader_epoch": 0},
            {"partition": 0, "current_leader_epoch": 1, "leader_epoch": 1},
        ]}])
        assert [(p.error_code, p.leader_epoch, p.end_offset) for p in ofle.topics[0].partitions] == [
            (ErrorCode.FENCED_LEADER_EPOCH, -1, -1), (0, 0, 0), (0, 1, 0)]

        error = None
        for _ in range(POLLS_MAX):
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is not None, f"record {msg.offset()} read past the truncation"
                error = msg.error()
                break
        # librdkafka 2.x: validation found epoch 0 ended at 0 < position 20; with
        # auto.offset.reset=error it resets to INVALID and reports it as _AUTO_OFFSET_RESET whose
        # text carries the _LOG_TRUNCATION reason.
        assert error is not None
        assert error.code() == KafkaError._AUTO_OFFSET_RESET, error
        text = error.str()
        assert "Partition log truncation detected at offset 20 (leader epoch 0)" in text, text
        assert "broker end offset is 0" in text, text

        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
        for i in range(3):
            producer.produce("lost", b"new%d" % i, partition=0)
        assert producer.flush(TIMEOUT) == 0
        # Offsets 0..2 again, but new records of epoch 1: the follower reads them, none is skipped.
        assert read_values(follower, 3) == [(i, 1, b"new%d" % i) for i in range(3)]
    finally:
        consumer.close()
        follower.close()


def test_offset_delete_survives_restart(broker: Broker) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic("od-durable", 2, 1)])
    admin.alter_group_offsets("od-restart", {TopicPartition("od-durable", 0): OffsetAndMetadata(5, "", -1),
                                             TopicPartition("od-durable", 1): OffsetAndMetadata(6, "", -1)})
    admin.delete_group_offsets("od-restart", [TopicPartition("od-durable", 0)])
    admin.close()
    port = broker.port
    broker.stop(signal.SIGKILL)
    start_on_port(broker, port)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        left = admin.list_group_offsets("od-restart")["od-restart"]
        assert {tp: om.offset for tp, om in left.items()} == {TopicPartition("od-durable", 1): 6}
    finally:
        admin.close()
