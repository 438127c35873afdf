"""OffsetForLeaderEpoch, DescribeLogDirs, DescribeProducers and OffsetDelete against the real
broker (`loglake serve` with a cold store), through kafka-python's admin client, confluent-kafka
producers and consumers, and raw requests for every advertised version."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import (
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    NoError,
    NonEmptyGroupError,
    UnknownTopicOrPartitionError,
)
from kafka.structs import OffsetAndMetadata

from loglake.kafka_errors import ErrorCode
from test_broker_admin import raw_call, versions

from brokerkit import Broker, serving_broker

TIMEOUT = 15.0


@pytest.fixture(scope="module")
def cold_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("apis-cold")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, cold_dir: Path) -> Iterator[Broker]:
    with serving_broker(tmp_path_factory.mktemp("apis") / "data", ["--cold-store", f"file://{cold_dir}"]) as b:
        yield b


@pytest.fixture
def kadmin(broker: Broker) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=int(TIMEOUT * 1000))
    try:
        yield client
    finally:
        client.close()


def create(kadmin: KafkaAdminClient, name: str, partitions: int = 1) -> None:
    kadmin.create_topics([NewTopic(name, partitions, 1)])


def committed(kadmin: KafkaAdminClient, group: str) -> dict[TopicPartition, int]:
    return {tp: om.offset for tp, om in kadmin.list_group_offsets(group)[group].items()}


def produce(broker: Broker, topic: str, count: int, conf: dict[str, Any] | None = None, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, **(conf or {})})
    for i in range(count):
        producer.produce(topic, f"v{i}".encode(), partition=partition)
    assert producer.flush(TIMEOUT) == 0


# ---- DescribeLogDirs -------------------------------------------------------------------------------


def test_describe_log_dirs_lists_data_dir_and_cold_store(broker: Broker, kadmin: KafkaAdminClient, cold_dir: Path) -> None:
    create(kadmin, "dirs-a", 2)
    create(kadmin, "dirs-b", 1)
    produce(broker, "dirs-a", 20)
    [answer] = kadmin.describe_log_dirs()
    dirs = {d["log_dir"]: d for d in answer["log_dirs"]}
    assert set(dirs) == {str(broker.data_dir.resolve()), f"file://{cold_dir}"}
    hot = dirs[str(broker.data_dir.resolve())]
    cold = dirs[f"file://{cold_dir}"]
    assert hot["error_code"] == 0 and cold["error_code"] == 0
    assert hot["total_bytes"] > 0 and 0 < hot["usable_bytes"] <= hot["total_bytes"]
    assert cold["total_bytes"] == -1 and cold["usable_bytes"] == -1
    hot_sizes = {(t["name"], p["partition_index"]): p["partition_size"] for t in hot["topics"] for p in t["partitions"]}
    assert hot_sizes[("dirs-a", 0)] > 0  # 20 records, unsealed: on the data disk (WAL)
    assert hot_sizes[("dirs-a", 1)] == 0 and hot_sizes[("dirs-b", 0)] == 0
    cold_sizes = {(t["name"], p["partition_index"]): p["partition_size"] for t in cold["topics"] for p in t["partitions"]}
    assert cold_sizes[("dirs-a", 0)] == 0  # nothing relocated yet
    # A filter: only the partitions asked for, unknown ones left out.
    [answer] = kadmin.describe_log_dirs({"dirs-a": [1], "no-such-topic": [0]})
    for d in answer["log_dirs"]:
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in d["topics"]] == [("dirs-a", [1])]


@pytest.mark.parametrize("version", versions(35))
def test_describe_log_dirs_every_version(broker: Broker, kadmin: KafkaAdminClient, version: int) -> None:
    create(kadmin, f"dirs-v{version}", 1)
    resp = raw_call(broker, 35, version, topics=[{"topic": f"dirs-v{version}", "partitions": [0, 7]}])
    assert len(resp.results) == 2
    parts = [(t.name, p.partition_index) for t in resp.results[0].topics for p in t.partitions]
    assert parts == [(f"dirs-v{version}", 0)]


# ---- DescribeProducers -----------------------------------------------------------------------------


def test_describe_producers_after_idempotent_produce(broker: Broker, kadmin: KafkaAdminClient) -> None:
    create(kadmin, "prod-idem", 1)
    produce(broker, "prod-idem", 10, {"enable.idempotence": True})
    produce(broker, "prod-idem", 3)  # not idempotent: no producer state
    tp = TopicPartition("prod-idem", 0)
    states = kadmin.describe_producers([tp])
    state = states[tp]
    [active] = state.active_producers
    assert active.producer_id >= 0 and active.producer_epoch == 0
    assert active.last_sequence == 9
    assert active.last_timestamp > 0
    assert active.coordinator_epoch == -1 and active.current_transaction_start_offset == -1


def test_describe_producers_unknown_partition(broker: Broker, kadmin: KafkaAdminClient) -> None:
    resp = raw_call(broker, 61, 0, topics=[{"name": "no-such", "partition_indexes": [0]}])
    [part] = resp.topics[0].partitions
    assert part.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and part.error_message


# ---- OffsetForLeaderEpoch --------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(23))
def test_offset_for_leader_epoch_every_version(broker: Broker, kadmin: KafkaAdminClient, version: int) -> None:
    topic = f"ofle-v{version}"
    create(kadmin, topic, 1)
    produce(broker, topic, 5)
    fields: dict[str, Any] = {"replica_id": -1} if version >= 3 else {}
    parts = [
        {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0},
        {"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0},
        {"partition": 0, "current_leader_epoch": 1, "leader_epoch": 0},  # newer than the broker's
        {"partition": 3, "current_leader_epoch": -1, "leader_epoch": 0},
    ]
    resp = raw_call(broker, 23, version, topics=[{"topic": topic, "partitions": parts}], **fields)
    got = [(p.error_code, p.leader_epoch, p.end_offset) for p in resp.topics[0].partitions]
    assert got == [
        (0, 0, 5),
        (0, 0, 5),
        (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, -1),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1),
    ]


def test_list_offsets_and_metadata_report_epoch_zero(broker: Broker, kadmin: KafkaAdminClient) -> None:
    create(kadmin, "epoch-zero", 1)
    produce(broker, "epoch-zero", 2)
    meta = raw_call(broker, 3, 12, topics=[{"name": "epoch-zero"}], allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False)
    assert [p.leader_epoch for p in meta.topics[0].partitions] == [0]
    lo = raw_call(broker, 2, 4, replica_id=-1, isolation_level=0,
                  topics=[{"name": "epoch-zero", "partitions": [{"partition_index": 0, "timestamp": -1, "current_leader_epoch": -1}]}])
    part = lo.topics[0].partitions[0]
    assert (part.offset, part.leader_epoch) == (2, 0)


# ---- OffsetDelete ----------------------------------------------------------------------------------


def test_offset_delete_empty_group_unknown_group_and_unknown_topic(broker: Broker, kadmin: KafkaAdminClient) -> None:
    create(kadmin, "od-a", 2)
    group = "od-empty"
    kadmin.alter_group_offsets(group, {TopicPartition("od-a", 0): OffsetAndMetadata(1, "", -1),
                                       TopicPartition("od-a", 1): OffsetAndMetadata(2, "", -1)})
    result = kadmin.delete_group_offsets(group, [TopicPartition("od-a", 0), TopicPartition("od-missing", 0)])
    assert result == {TopicPartition("od-a", 0): NoError, TopicPartition("od-missing", 0): UnknownTopicOrPartitionError}
    assert committed(kadmin, group) == {TopicPartition("od-a", 1): 2}
    with pytest.raises(GroupIdNotFoundError):
        kadmin.delete_group_offsets("od-no-such-group", [TopicPartition("od-a", 0)])


def test_offset_delete_refuses_topics_an_active_consumer_subscribes_to(broker: Broker, kadmin: KafkaAdminClient) -> None:
    create(kadmin, "od-sub", 1)
    create(kadmin, "od-other", 1)
    produce(broker, "od-sub", 3)
    group = "od-active"
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe(["od-sub"])
        seen = 0
        for _ in range(100):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen += 1
                if seen == 3:
                    break
        assert seen == 3
        consumer.commit(asynchronous=False)
        # The group is Stable: only members commit; an offset of a topic it does not subscribe to.
        consumer.commit(offsets=[CTopicPartition("od-other", 0, 0)], asynchronous=False)
        result = kadmin.delete_group_offsets(group, [TopicPartition("od-sub", 0), TopicPartition("od-other", 0)])
        assert result == {TopicPartition("od-sub", 0): GroupSubscribedToTopicError, TopicPartition("od-other", 0): NoError}
        assert committed(kadmin, group) == {TopicPartition("od-sub", 0): 3}
    finally:
        consumer.close()
    # Once the consumer left, the group is Empty: the subscribed topic's offsets may go too.
    assert kadmin.delete_group_offsets(group, [TopicPartition("od-sub", 0)]) == {TopicPartition("od-sub", 0): NoError}
    assert committed(kadmin, group) == {}


def test_offset_delete_non_consumer_group_with_members_is_non_empty(broker: Broker, kadmin: KafkaAdminClient) -> None:
    create(kadmin, "od-conn", 1)
    join = raw_call(broker, 11, 5, group_id="od-connect", session_timeout_ms=30000, rebalance_timeout_ms=30000,
                    member_id="", group_instance_id=None, protocol_type="connect",
                    protocols=[{"name": "default", "metadata": b"\x00"}])
    if join.error_code == ErrorCode.MEMBER_ID_REQUIRED:
        join = raw_call(broker, 11, 5, group_id="od-connect", session_timeout_ms=30000, rebalance_timeout_ms=30000,
                        member_id=join.member_id, group_instance_id=None, protocol_type="connect",
                        protocols=[{"name": "default", "metadata": b"\x00"}])
    assert join.error_code == 0
    with pytest.raises(NonEmptyGroupError):
        kadmin.delete_group_offsets("od-connect", [TopicPartition("od-conn", 0)])
