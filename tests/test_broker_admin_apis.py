"""OffsetForLeaderEpoch, DescribeLogDirs, DescribeProducers and OffsetDelete against the real
broker (`loglake serve` with a cold store), through kafka-python's admin client, confluent-kafka
producers and consumers, and raw requests for every advertised version.

Every test runs against one broker and against a three-broker cluster (tests/modekit.py); raw
requests about a partition go to its leader, about a group to its coordinator. A cluster keeps
every partition in its bucket (DescribeLogDirs says so) and its leader epochs move with
leadership, so epochs are read from Metadata rather than assumed 0."""

from __future__ import annotations

import time
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
from modekit import MODES, Served, serving
from test_broker_admin import raw_call, settled_partitions, versions

TIMEOUT = 15.0


@pytest.fixture(scope="module")
def cold_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("apis-cold")


@pytest.fixture(scope="module", params=MODES)
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, cold_dir: Path) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp(f"apis-{request.param}")
    with serving(request.param, tmp, single_args=["--cold-store", f"file://{cold_dir}"]) as served:
        yield served


@pytest.fixture
def kadmin(broker: Served) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=int(TIMEOUT * 1000))
    try:
        yield client
    finally:
        client.close()


def create(broker: Served, kadmin: KafkaAdminClient, name: str, partitions: int = 1) -> None:
    """Create the topic; return once every broker lists it and each partition has a live leader."""
    kadmin.create_topics([NewTopic(name, partitions, 1)])
    assert settled_partitions(broker, name) == partitions
    broker.leaders(name, partitions)


def epoch_of(broker: Served, topic: str) -> int:
    """Partition 0's current leader epoch, from its leader's Metadata."""
    meta = raw_call(broker.leader(topic, 0), 3, 12, topics=[{"name": topic}], allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False)
    [p] = [p for p in meta.topics[0].partitions if p.partition_index == 0]
    return int(p.leader_epoch)


def committed(kadmin: KafkaAdminClient, group: str) -> dict[TopicPartition, int]:
    return {tp: om.offset for tp, om in kadmin.list_group_offsets(group)[group].items()}


def produce(broker: Served, topic: str, count: int, conf: dict[str, Any] | None = None, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, **(conf or {})})
    for i in range(count):
        producer.produce(topic, f"v{i}".encode(), partition=partition)
    assert producer.flush(TIMEOUT) == 0


# ---- DescribeLogDirs -------------------------------------------------------------------------------


def test_describe_log_dirs_lists_data_dir_and_cold_store(broker: Served, kadmin: KafkaAdminClient, cold_dir: Path) -> None:
    """Each broker lists its data directory and the cold store (a cluster's: its bucket)."""
    create(broker, kadmin, "dirs-a", 2)
    create(broker, kadmin, "dirs-b", 1)
    produce(broker, "dirs-a", 20)
    answers = kadmin.describe_log_dirs()  # one answer per broker
    # In a cluster the brokers that did not lead the produce learn of its commit from etcd's watch:
    # ask again until each has (what a client reading from any broker may rely on).
    deadline = time.monotonic() + 30
    while broker.is_cluster and time.monotonic() < deadline and not all(
        p["partition_size"] > 0
        for a in answers
        for d in a["log_dirs"]
        if d["log_dir"].startswith("s3://")
        for t in d["topics"]
        if t["name"] == "dirs-a"
        for p in t["partitions"]
        if p["partition_index"] == 0
    ):
        time.sleep(0.1)
        answers = kadmin.describe_log_dirs()
    assert sorted(a["broker"] for a in answers) == broker.node_ids
    for answer in answers:
        data_dir = str(broker.broker(answer["broker"]).data_dir.resolve())
        dirs = {d["log_dir"]: d for d in answer["log_dirs"]}
        assert len(dirs) == 2 and data_dir in dirs
        [cold_url] = set(dirs) - {data_dir}
        if broker.cluster is not None:
            assert cold_url.startswith(f"s3://{broker.cluster.bucket}/")
        else:
            assert cold_url == f"file://{cold_dir}"
        hot, cold = dirs[data_dir], dirs[cold_url]
        assert hot["error_code"] == 0 and cold["error_code"] == 0
        assert hot["total_bytes"] > 0 and 0 < hot["usable_bytes"] <= hot["total_bytes"]
        assert cold["total_bytes"] == -1 and cold["usable_bytes"] == -1
        hot_sizes = {(t["name"], p["partition_index"]): p["partition_size"] for t in hot["topics"] for p in t["partitions"]}
        cold_sizes = {(t["name"], p["partition_index"]): p["partition_size"] for t in cold["topics"] for p in t["partitions"]}
        # 20 records: unsealed on the single broker's data disk (WAL), nothing relocated yet; in a
        # cluster in the bucket, where every partition is, nothing on any broker's disk.
        written, elsewhere = (cold_sizes, hot_sizes) if broker.is_cluster else (hot_sizes, cold_sizes)
        assert written[("dirs-a", 0)] > 0
        assert written[("dirs-a", 1)] == 0 and written[("dirs-b", 0)] == 0
        assert set(elsewhere.values()) == {0}
    # A filter: only the partitions asked for, unknown ones left out.
    for answer in kadmin.describe_log_dirs({"dirs-a": [1], "no-such-topic": [0]}):
        for d in answer["log_dirs"]:
            assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in d["topics"]] == [("dirs-a", [1])]


@pytest.mark.parametrize("version", versions(35))
def test_describe_log_dirs_every_version(broker: Served, kadmin: KafkaAdminClient, version: int) -> None:
    create(broker, kadmin, f"dirs-v{version}", 1)
    resp = raw_call(broker.first, 35, version, topics=[{"topic": f"dirs-v{version}", "partitions": [0, 7]}])
    assert len(resp.results) == 2
    parts = [(t.name, p.partition_index) for t in resp.results[0].topics for p in t.partitions]
    assert parts == [(f"dirs-v{version}", 0)]


# ---- DescribeProducers -----------------------------------------------------------------------------


def test_describe_producers_after_idempotent_produce(broker: Served, kadmin: KafkaAdminClient) -> None:
    create(broker, kadmin, "prod-idem", 1)
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


def test_describe_producers_unknown_partition(broker: Served, kadmin: KafkaAdminClient) -> None:
    resp = raw_call(broker.first, 61, 0, topics=[{"name": "no-such", "partition_indexes": [0]}])
    [part] = resp.topics[0].partitions
    assert part.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and part.error_message


# ---- OffsetForLeaderEpoch --------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(23))
def test_offset_for_leader_epoch_every_version(broker: Served, kadmin: KafkaAdminClient, version: int) -> None:
    topic = f"ofle-v{version}"
    create(broker, kadmin, topic, 1)
    produce(broker, topic, 5)
    epoch = epoch_of(broker, topic)  # 0 on a single broker
    fields: dict[str, Any] = {"replica_id": -1} if version >= 3 else {}
    parts = [
        {"partition": 0, "current_leader_epoch": -1, "leader_epoch": epoch},
        {"partition": 0, "current_leader_epoch": epoch, "leader_epoch": epoch},
        {"partition": 0, "current_leader_epoch": epoch + 1, "leader_epoch": epoch},  # newer than the broker's
        {"partition": 3, "current_leader_epoch": -1, "leader_epoch": epoch},
    ]
    resp = raw_call(broker.leader(topic, 0), 23, version, topics=[{"topic": topic, "partitions": parts}], **fields)
    got = [(p.error_code, p.leader_epoch, p.end_offset) for p in resp.topics[0].partitions]
    assert got == [
        (0, epoch, 5),
        (0, epoch, 5),
        (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, -1),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1),
    ]


def test_list_offsets_and_metadata_report_the_leader_epoch(broker: Served, kadmin: KafkaAdminClient) -> None:
    """Every broker's Metadata and the leader's ListOffsets name one epoch: 0 on a single broker
    (epochs move only when an operator bumps one), the leadership's in a cluster."""
    create(broker, kadmin, "epoch-zero", 1)
    produce(broker, "epoch-zero", 2)
    epochs = set()
    for n in broker.node_ids:
        meta = raw_call(broker.broker(n), 3, 12, topics=[{"name": "epoch-zero"}], allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False)
        epochs |= {p.leader_epoch for p in meta.topics[0].partitions}
    [epoch] = epochs
    assert epoch >= 0 if broker.is_cluster else epoch == 0
    lo = raw_call(broker.leader("epoch-zero", 0), 2, 4, replica_id=-1, isolation_level=0,
                  topics=[{"name": "epoch-zero", "partitions": [{"partition_index": 0, "timestamp": -1, "current_leader_epoch": -1}]}])
    part = lo.topics[0].partitions[0]
    assert (part.offset, part.leader_epoch) == (2, epoch)


# ---- OffsetDelete ----------------------------------------------------------------------------------


def test_offset_delete_empty_group_unknown_group_and_unknown_topic(broker: Served, kadmin: KafkaAdminClient) -> None:
    create(broker, kadmin, "od-a", 2)
    group = "od-empty"
    kadmin.alter_group_offsets(group, {TopicPartition("od-a", 0): OffsetAndMetadata(1, "", -1),
                                       TopicPartition("od-a", 1): OffsetAndMetadata(2, "", -1)})
    result = kadmin.delete_group_offsets(group, [TopicPartition("od-a", 0), TopicPartition("od-missing", 0)])
    assert result == {TopicPartition("od-a", 0): NoError, TopicPartition("od-missing", 0): UnknownTopicOrPartitionError}
    assert committed(kadmin, group) == {TopicPartition("od-a", 1): 2}
    with pytest.raises(GroupIdNotFoundError):
        kadmin.delete_group_offsets("od-no-such-group", [TopicPartition("od-a", 0)])


def test_offset_delete_refuses_topics_an_active_consumer_subscribes_to(broker: Served, kadmin: KafkaAdminClient) -> None:
    create(broker, kadmin, "od-sub", 1)
    create(broker, kadmin, "od-other", 1)
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


def test_offset_delete_non_consumer_group_with_members_is_non_empty(broker: Served, kadmin: KafkaAdminClient) -> None:
    create(broker, kadmin, "od-conn", 1)
    coordinator = broker.broker(broker.coordinator_id("od-connect"))
    join = raw_call(coordinator, 11, 5, group_id="od-connect", session_timeout_ms=30000, rebalance_timeout_ms=30000,
                    member_id="", group_instance_id=None, protocol_type="connect",
                    protocols=[{"name": "default", "metadata": b"\x00"}])
    if join.error_code == ErrorCode.MEMBER_ID_REQUIRED:
        join = raw_call(coordinator, 11, 5, group_id="od-connect", session_timeout_ms=30000, rebalance_timeout_ms=30000,
                        member_id=join.member_id, group_instance_id=None, protocol_type="connect",
                        protocols=[{"name": "default", "metadata": b"\x00"}])
    assert join.error_code == 0
    with pytest.raises(NonEmptyGroupError):
        kadmin.delete_group_offsets("od-connect", [TopicPartition("od-conn", 0)])
