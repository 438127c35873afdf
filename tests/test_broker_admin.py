"""Admin APIs against the real broker process: confluent-kafka and kafka-python admin clients,
raw requests for every advertised version, and the effects seen by producers and consumers.

Every test that uses the module's `broker` runs against one broker and against a three-broker
cluster (tests/modekit.py). Raw admin requests go to the first broker (any broker takes them);
a check of what a client may read from any broker first waits until all brokers agree
(`Served.agreed`). What cluster mode refuses by design — compaction — is asserted refused
there, with the feature's Kafka code; DeleteRecords and retention hold in both modes."""

from __future__ import annotations

import re
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpResourceType
from kafka.admin import KafkaAdminClient
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic
from kafka.protocol.parser import KafkaProtocol

from loglake.broker.protocol import SUPPORTED, request_class
from loglake.cli.remote_raw import build as _build
from loglake.cluster.flushobj import iter_batches
from loglake.engine.config import TOPIC_CONFIG_KEYS, TOPIC_CONFIG_NAMES
from loglake.engine.partition_log import Feature
from loglake.kafka_errors import ErrorCode
from loglake.records.decode import decode_batch
from modekit import MODES, Served, serving
from test_broker_clients import raw_fetch
from test_broker_malformed import RawClient

from brokerkit import Broker, running_broker

TIMEOUT = 15.0
TOPIC, BROKER = ConfigResource.Type.TOPIC, ConfigResource.Type.BROKER


@pytest.fixture(scope="module", params=MODES)
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(request.param, tmp_path_factory.mktemp(f"admin-{request.param}")) as served:
        yield served


@pytest.fixture
def admin(broker: Served) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def policy(broker: Served) -> str:
    """The non-default cleanup.policy the tests set: compact, or delete where compaction is
    refused (cluster mode; test_compaction_is_offered_or_refused asserts the refusal)."""
    return "delete" if broker.refuses(Feature.COMPACTION) else "compact"


def node_of(broker: Served) -> str:
    """The BROKER config resource of the broker raw requests go to (the first)."""
    return str(broker.node_ids[0])


def listed(broker: Served) -> list[tuple[int, str, int]]:
    """(node id, host, port) of every broker, as DescribeCluster and Metadata list them."""
    return [(n, "127.0.0.1", broker.broker(n).port) for n in broker.node_ids]


def result(fut: Future[Any]) -> Any:
    return fut.result(timeout=TIMEOUT)


def error_of(fut: Future[Any]) -> KafkaError:
    exc = fut.exception(timeout=TIMEOUT)
    assert isinstance(exc, KafkaException), exc
    err = exc.args[0]
    assert isinstance(err, KafkaError)
    return err


def create(
    broker: Served, admin: AdminClient, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    """Create the topic; return once every broker has it (whichever broker a client asks next)."""
    result(admin.create_topics([NewTopic(name, partitions, config=config or {})])[name])
    assert settled_partitions(broker, name) == partitions


def settled_configs(broker: Served, name: str) -> None:
    """Wait until every broker describes the topic's configs alike."""

    def configs(b: Broker) -> Any:
        resp = raw_call(b, 32, 4, include_synonyms=False, include_documentation=False,
                        resources=[{"resource_type": 2, "resource_name": name, "configuration_keys": None}])
        [r] = resp.results
        return r.error_code, sorted((c.name, c.value, c.config_source) for c in r.configs)

    broker.agreed(configs)


def settled_partitions(broker: Served, name: str) -> int | None:
    """The topic's partition count (None: no such topic) once every broker's Metadata agrees."""

    def count(b: Broker) -> int | None:
        resp = raw_call(b, 3, 12, topics=[{"name": name, "topic_id": uuid.UUID(int=0)}],
                        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        [t] = resp.topics
        return None if t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION else len(t.partitions)

    return broker.agreed(count)


def describe_topic(broker: Served, admin: AdminClient, name: str) -> dict[str, Any]:
    settled_configs(broker, name)
    res = ConfigResource(TOPIC, name)
    return dict(result(admin.describe_configs([res])[res]))


def partitions_of(broker: Served, admin: AdminClient, name: str) -> int | None:
    """The topic's partition count, None if it does not exist (a Metadata request that never
    creates), as the admin client reads it once every broker agrees."""
    settled_partitions(broker, name)
    fut = admin.describe_topics(TopicCollection([name]))[name]
    exc = fut.exception(timeout=TIMEOUT)
    if exc is not None:
        assert error_of(fut).code() == KafkaError.UNKNOWN_TOPIC_OR_PART, exc
        return None
    return len(fut.result().partitions)


def produce(
    broker: Served,
    topic: str,
    values: list[bytes],
    partition: int = 0,
    conf: dict[str, Any] | None = None,
    keyed: bool = False,
) -> list[Any]:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, **(conf or {})})
    reports: list[Any] = []
    for v in values:
        key = v if keyed else None
        producer.produce(topic, v, key, partition=partition, on_delivery=lambda err, msg: reports.append((err, msg)))
    assert producer.flush(TIMEOUT) == 0
    return reports



def raw_call(broker: Broker, api_key: int, version: int, **fields: Any) -> Any:
    """Send one request of exactly this version to `broker` and return the decoded response."""
    cls = request_class(api_key)
    request = cls[version](**_build(cls._struct, version, fields))
    proto = KafkaProtocol(client_id="admin-test")
    proto.send_request(request)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=TIMEOUT) as sock:
        sock.sendall(proto.send_bytes())
        while True:
            data = sock.recv(65536)
            assert data, "broker closed the connection"
            responses = proto.receive_bytes(data)
            if responses:
                return responses[0][1]


def versions(api_key: int) -> list[int]:
    r = SUPPORTED[api_key]
    return list(range(r.min_version, r.max_version + 1))


# ---- confluent-kafka AdminClient --------------------------------------------------------------------


def test_create_topics(admin: AdminClient, broker: Served) -> None:
    config = {"retention.ms": "60000", "cleanup.policy": policy(broker)}
    futures = admin.create_topics(
        [NewTopic("ct-a", 3, config=config), NewTopic("ct-b", -1), NewTopic("ct-rf1", 2, replication_factor=1)]
    )
    for fut in futures.values():
        assert result(fut) is None
    assert partitions_of(broker, admin, "ct-a") == 3
    assert partitions_of(broker, admin, "ct-b") == 1  # the broker default
    assert partitions_of(broker, admin, "ct-rf1") == 2

    assert result(admin.create_topics([NewTopic("ct-validate", 2)], validate_only=True)["ct-validate"]) is None
    assert partitions_of(broker, admin, "ct-validate") is None

    assert error_of(admin.create_topics([NewTopic("ct-a", 1)])["ct-a"]).code() == KafkaError.TOPIC_ALREADY_EXISTS
    err = error_of(admin.create_topics([NewTopic("ct-bad", 1, config={"no.such.config": "1"})])["ct-bad"])
    assert err.code() == KafkaError.INVALID_CONFIG and "no.such.config" in err.str()
    err = error_of(admin.create_topics([NewTopic("ct-bad", 1, config={"retention.ms": "soon"})])["ct-bad"])
    assert err.code() == KafkaError.INVALID_CONFIG
    # More replicas than live brokers (one, or the cluster's three): refused, the live ones counted.
    live = len(broker.node_ids)
    err = error_of(admin.create_topics([NewTopic("ct-rf-over", 1, replication_factor=live + 1)])["ct-rf-over"])
    assert err.code() == KafkaError.INVALID_REPLICATION_FACTOR
    # The live count when the broker answered: a lease that lapsed on a loaded machine (2 s in
    # the tests' cluster) leaves fewer for a moment, never more.
    registered = re.search(r"only (\d+) broker\(s\) are registered", err.str())
    assert registered is not None and 1 <= int(registered.group(1)) <= live, err.str()
    err = error_of(admin.create_topics([NewTopic("bad name!", 1)])["bad name!"])
    assert err.code() == KafkaError.TOPIC_EXCEPTION
    here, nowhere = broker.node_ids[0], max(broker.node_ids) + 1  # the controller, no broker
    err = error_of(admin.create_topics([NewTopic("ct-assign", 2, replica_assignment=[[here], [nowhere]])])["ct-assign"])
    assert err.code() == KafkaError.INVALID_REQUEST
    # A trivial manual assignment (every partition on the broker asked, the controller) is fine.
    assert result(admin.create_topics([NewTopic("ct-assign", 2, replica_assignment=[[here], [here]])])["ct-assign"]) is None
    assert partitions_of(broker, admin, "ct-assign") == 2
    for name in ("ct-bad", "ct-rf-over", "bad name!"):
        assert partitions_of(broker, admin, name) is None


def metadata_replicas(b: Broker, name: str) -> list[tuple[int, int, list[int], list[int]]]:
    """(partition, leader, replicas, ISR) of each partition, as `b`'s Metadata reports them."""
    resp = raw_call(b, 3, 12, topics=[{"name": name, "topic_id": uuid.UUID(int=0)}],
                    allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    [t] = resp.topics
    return sorted((p.partition_index, p.leader_id, list(p.replica_nodes), list(p.isr_nodes)) for p in t.partitions)


def test_replication_factor_up_to_the_live_brokers(admin: AdminClient, broker: Served) -> None:
    """A factor of every live broker (1 on a single node, 3 in the cluster) is accepted and
    remembered: every broker's Metadata reports that many replicas per partition, the leader first,
    the ISR the same (in a cluster any live broker serves a partition from the bucket), the admin
    client describes them, and CreateTopics v5+ answers the factor."""
    rf, name = len(broker.node_ids), "rf-all"
    assert result(admin.create_topics([NewTopic(name, 4, replication_factor=rf)])[name]) is None
    assert settled_partitions(broker, name) == 4
    broker.leaders(name, 4)
    reported = broker.agreed(lambda b: metadata_replicas(b, name))
    for _p, leader, replicas, isr in reported:
        assert replicas[0] == leader and isr == replicas and sorted(replicas) == broker.node_ids
    described = result(admin.describe_topics(TopicCollection([name]))[name])
    assert [len(p.replicas) for p in described.partitions] == [rf] * 4
    topic = {"name": "rf-validate", "num_partitions": 1, "replication_factor": rf, "assignments": [], "configs": []}
    [answer] = raw_call(broker.first, 19, 5, topics=[topic], timeout_ms=5000, validate_only=True).topics
    assert (answer.error_code, answer.replication_factor) == (0, rf)
    if broker.is_cluster:  # fewer than every broker: each partition names that many, followers spread
        assert result(admin.create_topics([NewTopic("rf-two", 6, replication_factor=2)])["rf-two"]) is None
        assert settled_partitions(broker, "rf-two") == 6
        broker.leaders("rf-two", 6)
        two = broker.agreed(lambda b: metadata_replicas(b, "rf-two"))
        assert all(len(set(r)) == 2 and r[0] == leader and isr == r for _p, leader, r, isr in two)
        assert len({r[1] for _p, _l, r, _i in two}) > 1, two


def test_compaction_is_offered_or_refused(admin: AdminClient, broker: Served) -> None:
    """A compacted topic is created, and a topic altered to compaction; cluster mode refuses both
    with the feature's code (loglake.cluster.shared_log.REFUSED), creating nothing."""
    futures = [admin.create_topics([NewTopic("cmp-new", 1, config={"cleanup.policy": "compact"})])["cmp-new"]]
    create(broker, admin, "cmp-alter")
    res = incremental("cmp-alter", ("cleanup.policy", "compact", AlterConfigOpType.SET))
    futures.append(admin.incremental_alter_configs([res])[res])
    if broker.refuses(Feature.COMPACTION):
        assert [error_of(f).code() for f in futures] == [broker.refusal_code(Feature.COMPACTION)] * 2
        assert partitions_of(broker, admin, "cmp-new") is None
        assert describe_topic(broker, admin, "cmp-alter")["cleanup.policy"].value == "delete"
    else:
        assert [result(f) for f in futures] == [None, None]
        assert describe_topic(broker, admin, "cmp-new")["cleanup.policy"].value == "compact"
        assert describe_topic(broker, admin, "cmp-alter")["cleanup.policy"].value == "compact"


def test_describe_configs_topic_and_broker(admin: AdminClient, broker: Served) -> None:
    create(broker, admin, "dc", config={"retention.ms": "60000"})
    configs = describe_topic(broker, admin, "dc")
    retention = configs["retention.ms"]
    assert retention.value == "60000" and retention.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not retention.is_default and not retention.is_read_only and not retention.is_sensitive
    mmb = configs["max.message.bytes"]
    assert mmb.value == "1048588" and mmb.source == ConfigSource.DEFAULT_CONFIG.value and mmb.is_default
    assert {"cleanup.policy", "segment.bytes", "compression.type", "durability"} <= set(configs)

    missing = ConfigResource(TOPIC, "dc-missing")
    assert error_of(admin.describe_configs([missing])[missing]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    res = ConfigResource(BROKER, node_of(broker))
    configs = dict(result(admin.describe_configs([res])[res]))
    assert configs["log.dirs"].value == str(broker.first.data_dir)
    assert configs["broker.id"].value == node_of(broker) and configs["broker.id"].is_read_only
    assert configs["num.partitions"].value == "1"
    assert configs["auto.create.topics.enable"].value == "true"
    assert configs["message.max.bytes"].value == "1048588"


def test_describe_configs_lists_every_topic_config(admin: AdminClient, broker: Served) -> None:
    """Every key of the engine's table, hot.retain.* included, with its type and documentation."""
    create(broker, admin, "dc-all", config={"hot.retain.segments": "2"})
    configs = describe_topic(broker, admin, "dc-all")
    assert set(configs) == set(TOPIC_CONFIG_NAMES)
    segments, size = configs["hot.retain.segments"], configs["hot.retain.bytes"]
    assert segments.value == "2" and segments.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert size.value == "0" and size.is_default and size.source == ConfigSource.DEFAULT_CONFIG.value

    resource = {"resource_type": 2, "resource_name": "dc-all", "configuration_keys": None}
    resp = raw_call(broker.first, 32, 4, resources=[resource], include_synonyms=False, include_documentation=True)
    entries = {c.name: c for c in resp.results[0].configs}
    assert list(entries) == list(TOPIC_CONFIG_NAMES)
    for key in TOPIC_CONFIG_KEYS:
        entry = entries[key.name]
        assert (entry.config_type, entry.documentation, entry.read_only) == (key.type, key.doc, key.read_only)
    resp = raw_call(broker.first, 32, 4, resources=[resource], include_synonyms=False, include_documentation=False)
    assert all(c.documentation is None for c in resp.results[0].configs)


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_alter_configs_replaces_overrides(admin: AdminClient, broker: Served) -> None:
    create(broker, admin, "ac", config={"retention.ms": "60000", "cleanup.policy": policy(broker)})
    res = ConfigResource(TOPIC, "ac", set_config={"segment.ms": "120000"})
    assert result(admin.alter_configs([res], validate_only=True)[res]) is None
    assert describe_topic(broker, admin, "ac")["retention.ms"].value == "60000"
    assert result(admin.alter_configs([res])[res]) is None
    configs = describe_topic(broker, admin, "ac")
    assert configs["segment.ms"].value == "120000"
    assert configs["retention.ms"].is_default and configs["cleanup.policy"].value == "delete"

    bad = ConfigResource(TOPIC, "ac", set_config={"segment.ms": "-5"})
    assert error_of(admin.alter_configs([bad])[bad]).code() == KafkaError.INVALID_CONFIG
    missing = ConfigResource(TOPIC, "ac-missing", set_config={"segment.ms": "1000"})
    assert error_of(admin.alter_configs([missing])[missing]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    node = ConfigResource(BROKER, node_of(broker), set_config={"num.partitions": "3"})  # read-only: not dynamic
    err = error_of(admin.alter_configs([node])[node])
    assert err.code() == KafkaError.INVALID_CONFIG and "Cannot update these configs dynamically" in err.str()


def incremental(name: str, *ops: tuple[str, str | None, AlterConfigOpType]) -> ConfigResource:
    entries = [ConfigEntry(n, v, incremental_operation=op) for n, v, op in ops]
    return ConfigResource(TOPIC, name, incremental_configs=entries)


def test_incremental_alter_configs(admin: AdminClient, broker: Served) -> None:
    create(broker, admin, "iac", config={"retention.ms": "60000", "segment.ms": "120000"})
    compacts = policy(broker) == "compact"
    res = incremental(
        "iac",
        ("retention.bytes", "1000000", AlterConfigOpType.SET),
        ("segment.ms", None, AlterConfigOpType.DELETE),
        *([("cleanup.policy", "compact", AlterConfigOpType.APPEND)] if compacts else []),
    )
    assert result(admin.incremental_alter_configs([res])[res]) is None
    configs = describe_topic(broker, admin, "iac")
    assert configs["retention.ms"].value == "60000"  # untouched
    assert configs["retention.bytes"].value == "1000000"
    assert configs["segment.ms"].is_default
    assert configs["cleanup.policy"].value == ("delete,compact" if compacts else "delete")

    if compacts:
        res = incremental("iac", ("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT))
        assert result(admin.incremental_alter_configs([res])[res]) is None
    assert describe_topic(broker, admin, "iac")["cleanup.policy"].value == policy(broker)

    res = incremental("iac", ("retention.ms", "5", AlterConfigOpType.SET))
    assert result(admin.incremental_alter_configs([res], validate_only=True)[res]) is None
    assert describe_topic(broker, admin, "iac")["retention.ms"].value == "60000"

    for bad in (
        incremental("iac", ("retention.ms", "1000", AlterConfigOpType.APPEND)),  # not a list config
        incremental("iac", ("cleanup.policy", policy(broker), AlterConfigOpType.SUBTRACT)),  # leaves it empty
        incremental("iac", ("no.such.config", "1", AlterConfigOpType.SET)),
        incremental("iac", ("max.message.bytes", "lots", AlterConfigOpType.SET)),
    ):
        assert error_of(admin.incremental_alter_configs([bad])[bad]).code() == KafkaError.INVALID_CONFIG
    assert describe_topic(broker, admin, "iac")["cleanup.policy"].value == policy(broker)
    node = ConfigResource(BROKER, node_of(broker), incremental_configs=[
        ConfigEntry("num.partitions", "3", incremental_operation=AlterConfigOpType.SET)
    ])
    assert error_of(admin.incremental_alter_configs([node])[node]).code() == KafkaError.INVALID_CONFIG


def test_create_partitions_then_produce(admin: AdminClient, broker: Served) -> None:
    create(broker, admin, "cp", 2)
    assert result(admin.create_partitions([NewPartitions("cp", 4)], validate_only=True)["cp"]) is None
    assert partitions_of(broker, admin, "cp") == 2
    assert result(admin.create_partitions([NewPartitions("cp", 4)])["cp"]) is None
    assert partitions_of(broker, admin, "cp") == 4
    assert error_of(admin.create_partitions([NewPartitions("cp", 3)])["cp"]).code() == KafkaError.INVALID_PARTITIONS
    assert error_of(admin.create_partitions([NewPartitions("cp", 4)])["cp"]).code() == KafkaError.INVALID_PARTITIONS
    err = error_of(admin.create_partitions([NewPartitions("cp-missing", 4)])["cp-missing"])
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    [(err, msg)] = produce(broker, "cp", [b"to-the-new-partition"], partition=3)
    assert err is None and msg.partition() == 3 and msg.offset() == 0


def test_delete_records(admin: AdminClient, broker: Served) -> None:
    create(broker, admin, "dr", 2)
    reports = produce(broker, "dr", [b"v%d" % i for i in range(10)])
    assert [err for err, _m in reports] == [None] * 10
    futures = admin.delete_records([TopicPartition("dr", 0, 4)])
    [fut] = futures.values()
    assert result(fut).low_watermark == 4
    # every broker serves reads from the new start on, and none below it
    assert broker.agreed(lambda b: fetched(b, "dr", 3)) == (ErrorCode.OFFSET_OUT_OF_RANGE, [])
    assert broker.agreed(lambda b: fetched(b, "dr", 4)) == (ErrorCode.NONE, [b"v4", b"v5"])

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "dr-g", "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition("dr", 0)])
        msg = consumer.poll(TIMEOUT)
        assert msg is not None and msg.error() is None
        assert (msg.offset(), msg.value()) == (4, b"v4")
        assert consumer.get_watermark_offsets(TopicPartition("dr", 0), timeout=TIMEOUT) == (4, 10)
        [by_time] = consumer.offsets_for_times([TopicPartition("dr", 0, 0)], timeout=TIMEOUT)
        assert by_time.offset == 4  # ListOffsets by time finds nothing below the start
    finally:
        consumer.close()

    [fut] = admin.delete_records([TopicPartition("dr", 0, 11)]).values()
    assert error_of(fut).code() == KafkaError.OFFSET_OUT_OF_RANGE
    [fut] = admin.delete_records([TopicPartition("dr", 0, 2)]).values()  # below the start: no-op
    assert result(fut).low_watermark == 4
    [fut] = admin.delete_records([TopicPartition("dr", 0, -1)]).values()  # -1 = high watermark
    assert result(fut).low_watermark == 10
    [fut] = admin.delete_records([TopicPartition("dr", 7, 0)]).values()  # librdkafka finds no leader itself
    assert error_of(fut).code() in (KafkaError._NOENT, KafkaError.UNKNOWN_TOPIC_OR_PART)
    if broker.is_cluster:  # only the partition's leader raises its start, as in Kafka
        leader = broker.leader("dr", 1)
        other = next(broker.broker(n) for n in broker.node_ids if broker.broker(n) is not leader)
        topics = [{"name": "dr", "partitions": [{"partition_index": 1, "offset": 0}]}]
        resp = raw_call(other, 21, 2, topics=topics, timeout_ms=5000)
        [part] = resp.topics[0].partitions
        assert (part.low_watermark, part.error_code) == (-1, ErrorCode.NOT_LEADER_OR_FOLLOWER)


def fetched(b: Broker, topic: str, offset: int) -> tuple[int, list[bytes]]:
    """(error code, the first two values from `offset`) of a Fetch of partition 0 sent to `b`."""
    with RawClient(b.bootstrap) as raw:
        part = raw_fetch(raw, topic, 0, offset)
    values: list[bytes] = []
    for view in iter_batches(part.records or b""):
        h, records = decode_batch(bytes(view))
        values += [r.value or b"" for i, r in enumerate(records) if h.base_offset + i >= offset]
    return part.error_code, values[:2]


def earliest(b: Broker, topic: str) -> int:
    """The partition's earliest offset as `b` answers ListOffsets."""
    resp = raw_call(b, 2, 1, replica_id=-1, topics=[{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -2}]}])
    [part] = resp.topics[0].partitions
    assert part.error_code == 0, part
    return int(part.offset)


def test_retention_drops_records_past_retention_ms(admin: AdminClient, broker: Served) -> None:
    """Records older than retention.ms go with their whole segment (single node) or merged
    segment or flush range (cluster, its leader's maintenance round); the earliest offset moves
    past them on every broker and a fetch below it is out of range."""
    create(broker, admin, "ret", config={"retention.ms": "3600000", "segment.records": "1"})
    old = int(time.time() * 1000) - 7_200_000  # two hours ago: past retention.ms at once
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    reports: list[Any] = []
    for i in range(3):
        producer.produce("ret", b"old%d" % i, partition=0, timestamp=old + i,
                         on_delivery=lambda err, msg: reports.append((err, msg)))  # fmt: skip
        assert producer.flush(TIMEOUT) == 0
    assert [(err, m.offset()) for err, m in reports] == [(None, 0), (None, 1), (None, 2)]
    [(err, msg)] = produce(broker, "ret", [b"new"])
    assert err is None and msg.offset() == 3
    deadline = time.monotonic() + 90  # a cluster's maintenance round runs every 10 s by default
    while earliest(broker.leader("ret", 0), "ret") < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert broker.agreed(lambda b: earliest(b, "ret")) == 3
    assert broker.agreed(lambda b: fetched(b, "ret", 2)) == (ErrorCode.OFFSET_OUT_OF_RANGE, [])
    assert broker.agreed(lambda b: fetched(b, "ret", 3)) == (ErrorCode.NONE, [b"new"])


def test_max_message_bytes_is_enforced(admin: AdminClient, broker: Served) -> None:
    create(broker, admin, "mmb", config={"max.message.bytes": "2000"})
    [(err, _msg)] = produce(broker, "mmb", [b"x" * 5000], conf={"compression.type": "none", "retries": 0})
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    [(err, msg)] = produce(broker, "mmb", [b"x" * 500], conf={"compression.type": "none"})
    assert err is None and msg.offset() == 0


def test_delete_topics(admin: AdminClient, broker: Served) -> None:
    create(broker, admin, "dt-a")
    create(broker, admin, "dt-b", 2)
    futures = admin.delete_topics(["dt-a", "dt-b"])
    assert all(result(f) is None for f in futures.values())
    assert partitions_of(broker, admin, "dt-a") is None and partitions_of(broker, admin, "dt-b") is None
    err = error_of(admin.delete_topics(["dt-a"])["dt-a"])
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    create(broker, admin, "dt-a", 3)  # the name can be used again
    assert partitions_of(broker, admin, "dt-a") == 3


def test_list_all_topics(admin: AdminClient, broker: Served) -> None:
    # librdkafka's all-topics Metadata v9+ request carries trailing bytes (librdkafka#5049).
    create(broker, admin, "lt")
    assert "lt" in admin.list_topics(timeout=5).topics


def test_describe_cluster(admin: AdminClient, broker: Served) -> None:
    cluster = result(admin.describe_cluster())  # librdkafka asks with Metadata, kafka-python with DescribeCluster
    assert cluster.cluster_id and cluster.controller.id == broker.node_ids[0]
    assert sorted((n.id, n.host, n.port) for n in cluster.nodes) == listed(broker)


# ---- kafka-python KafkaAdminClient --------------------------------------------------------------------


def test_kafka_python_admin(broker: Served) -> None:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=int(TIMEOUT * 1000))
    try:
        cluster = client.describe_cluster()  # the DescribeCluster API
        assert cluster["controller_id"] == broker.node_ids[0]
        assert sorted((n["broker_id"], "127.0.0.1", n["port"]) for n in cluster["brokers"]) == listed(broker)
        client.create_topics([KpNewTopic("kp", 2, 1, topic_configs={"retention.ms": "90000"})])
        assert settled_partitions(broker, "kp") == 2
        assert "kp" in client.list_topics()
        settled_configs(broker, "kp")
        described = client.describe_configs([KpConfigResource(KpResourceType.TOPIC, "kp")])
        assert described["topic"]["kp"]["retention.ms"]["value"] == "90000"
        every = client.describe_configs([KpConfigResource(KpResourceType.TOPIC, "kp")], config_filter="all")
        assert every["topic"]["kp"]["segment.bytes"]["config_source"] == "DEFAULT_CONFIG"
        node = client.describe_configs([KpConfigResource(KpResourceType.BROKER, node_of(broker))], config_filter="all")
        assert node["broker"][node_of(broker)]["num.partitions"]["value"] == "1"

        altered = client.alter_configs([KpConfigResource(KpResourceType.TOPIC, "kp", configs={"segment.ms": "70000"})])
        assert altered == {"topic": {"kp": "OK"}}
        # kafka-python's non-incremental alter describes first and sends everything back: every
        # broker must have the change above (a cluster's others learn it from etcd's watch)
        settled_configs(broker, "kp")
        legacy = client.alter_configs(
            [KpConfigResource(KpResourceType.TOPIC, "kp", configs={"retention.bytes": "123456"})], incremental=False
        )
        assert legacy == {"topic": {"kp": "OK"}}
        settled_configs(broker, "kp")
        modified = client.describe_configs([KpConfigResource(KpResourceType.TOPIC, "kp")])["topic"]["kp"]
        # kafka-python carries the other modified configs over into the non-incremental request.
        assert {k: v["value"] for k, v in modified.items()} == {
            "retention.ms": "90000", "segment.ms": "70000", "retention.bytes": "123456",
        }

        client.create_partitions({"kp": KpNewPartitions(5)})
        assert settled_partitions(broker, "kp") == 5
        assert len(client.describe_topics(["kp"])[0]["partitions"]) == 5
        client.delete_topics(["kp"])
        assert settled_partitions(broker, "kp") is None
        assert "kp" not in client.list_topics()
    finally:
        client.close()


# ---- raw requests: every advertised version ------------------------------------------------------------


@pytest.mark.parametrize("version", versions(19))
def test_raw_create_and_delete_every_version(broker: Served, version: int) -> None:
    name = f"raw-{version}"
    topics = [
        {"name": name, "num_partitions": 2, "replication_factor": -1, "assignments": [],
         "configs": [{"name": "retention.ms", "value": "1000"}]},
        {"name": "raw-dup", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []},
        {"name": "raw-dup", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []},
    ]
    resp = raw_call(broker.first, 19, version, topics=topics, timeout_ms=5000, validate_only=False)
    ok, dup1, dup2 = resp.topics
    assert (ok.name, ok.error_code) == (name, 0)
    assert dup1.error_code == dup2.error_code == 42
    if version >= 5:
        assert (ok.num_partitions, ok.replication_factor) == (2, 1)
        configs = {c.name: c for c in ok.configs}
        assert configs["retention.ms"].value == "1000" and configs["retention.ms"].config_source == 1
        assert configs["segment.bytes"].config_source == 5 and not configs["segment.bytes"].read_only
    if version >= 7:
        assert ok.topic_id != uuid.UUID(int=0)

    delete_version = min(version, SUPPORTED[20].max_version)
    if delete_version >= 6:
        resp = raw_call(broker.first, 20, delete_version, topics=[{"name": name, "topic_id": uuid.UUID(int=0)}], timeout_ms=5000)
    else:
        resp = raw_call(broker.first, 20, delete_version, topic_names=[name, "raw-missing"], timeout_ms=5000)
        assert resp.responses[1].error_code == 3
    assert (resp.responses[0].name, resp.responses[0].error_code) == (name, 0)


def test_raw_delete_topics_by_id(broker: Served, admin: AdminClient) -> None:
    create(broker, admin, "by-id")
    meta = raw_call(broker.first, 3, 12, topics=[{"name": "by-id", "topic_id": uuid.UUID(int=0)}],
                    allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    topic_id = meta.topics[0].topic_id
    unknown = uuid.uuid4()
    resp = raw_call(broker.first, 20, 6, timeout_ms=5000, topics=[
        {"name": None, "topic_id": topic_id},
        {"name": None, "topic_id": unknown},
        {"name": "by-id", "topic_id": topic_id},
    ])
    assert [(r.name, r.topic_id, r.error_code) for r in resp.responses] == [
        ("by-id", topic_id, 0), (None, unknown, 100), ("by-id", topic_id, 42),
    ]
    assert partitions_of(broker, admin, "by-id") is None


@pytest.mark.parametrize("version", versions(32))
def test_raw_describe_configs_every_version(broker: Served, admin: AdminClient, version: int) -> None:
    create(broker, admin, f"rdc-{version}", config={"cleanup.policy": policy(broker)})
    resources = [
        {"resource_type": 2, "resource_name": f"rdc-{version}", "configuration_keys": ["cleanup.policy", "retention.ms"]},
        {"resource_type": 4, "resource_name": "", "configuration_keys": None},
        {"resource_type": 4, "resource_name": "7", "configuration_keys": None},
        {"resource_type": 16, "resource_name": "x", "configuration_keys": None},
    ]
    resp = raw_call(broker.first, 32, version, resources=resources, include_synonyms=True, include_documentation=True)
    topic, node, other_node, unknown = resp.results
    assert topic.error_code == 0 and node.error_code == 0
    assert other_node.error_code == 42 and unknown.error_code == 42 and unknown.error_message
    configs = {c.name: c for c in topic.configs}
    assert set(configs) == {"cleanup.policy", "retention.ms"}
    entry = configs["cleanup.policy"]
    assert (entry.value, entry.config_source) == (policy(broker), 1)
    assert [(s.name, s.value, s.source) for s in entry.synonyms] == [
        ("cleanup.policy", policy(broker), 1), ("log.cleanup.policy", "delete", 5),
    ]
    if version >= 3:
        assert entry.config_type == 7 and configs["retention.ms"].config_type == 5  # LIST, LONG
        assert entry.documentation
    assert all(c.read_only for c in node.configs)


@pytest.mark.parametrize("api_key", [33, 44])
def test_raw_alter_configs_every_version(broker: Served, admin: AdminClient, api_key: int) -> None:
    for version in versions(api_key):
        name = f"rac-{api_key}-{version}"
        create(broker, admin, name)
        entry: dict[str, Any] = {"name": "retention.ms", "value": "4242"}
        if api_key == 44:
            entry["config_operation"] = 0
        resources = [
            {"resource_type": 2, "resource_name": name, "configs": [entry]},
            {"resource_type": 2, "resource_name": name + "-missing", "configs": [entry]},
            {"resource_type": 2, "resource_name": name + "-x", "configs": [entry, entry]},
            {"resource_type": 4, "resource_name": "7", "configs": []},  # another broker's id
        ]
        resp = raw_call(broker.first, api_key, version, resources=resources, validate_only=False)
        assert [r.error_code for r in resp.responses] == [0, 3, 42, 42]
        assert describe_topic(broker, admin, name)["retention.ms"].value == "4242"


@pytest.mark.parametrize("version", versions(37))
def test_raw_create_partitions_every_version(broker: Served, admin: AdminClient, version: int) -> None:
    name = f"rcp-{version}"
    create(broker, admin, name)
    here = broker.node_ids[0]  # the broker asked
    topics = [
        {"name": name, "count": 3, "assignments": [{"broker_ids": [here]}, {"broker_ids": [here]}]},
        {"name": "rcp-missing", "count": 3, "assignments": None},
    ]
    resp = raw_call(broker.first, 37, version, topics=topics, timeout_ms=5000, validate_only=False)
    assert [r.error_code for r in resp.results] == [0, 3]
    resp = raw_call(broker.first, 37, version, timeout_ms=5000, validate_only=False,
                    topics=[{"name": name, "count": 4, "assignments": [{"broker_ids": [here, here + 1]}]}])
    assert resp.results[0].error_code == 39
    assert partitions_of(broker, admin, name) == 3


@pytest.mark.parametrize("version", versions(21))
def test_raw_delete_records_every_version(broker: Served, admin: AdminClient, version: int) -> None:
    name = f"rdr-{version}"
    create(broker, admin, name)
    produce(broker, name, [b"a", b"b", b"c"])
    topics = [
        {"name": name, "partitions": [{"partition_index": 0, "offset": 2}, {"partition_index": 1, "offset": 0}]},
        {"name": "rdr-missing", "partitions": [{"partition_index": 0, "offset": 0}]},
    ]
    resp = raw_call(broker.leader(name, 0), 21, version, topics=topics, timeout_ms=5000)
    got = [(t.name, p.partition_index, p.low_watermark, p.error_code) for t in resp.topics for p in t.partitions]
    assert got == [(name, 0, 2, 0), (name, 1, -1, 3), ("rdr-missing", 0, -1, 3)]


@pytest.mark.parametrize("version", versions(60))
def test_raw_describe_cluster_every_version(broker: Served, version: int) -> None:
    fields: dict[str, Any] = {"include_cluster_authorized_operations": False}
    if version >= 1:
        fields["endpoint_type"] = 1
    for n in broker.node_ids:  # every broker lists them all
        resp = raw_call(broker.broker(n), 60, version, **fields)
        assert resp.error_code == 0 and resp.controller_id == broker.node_ids[0] and resp.cluster_id
        assert sorted((b.broker_id, b.host, b.port) for b in resp.brokers) == listed(broker)
        assert resp.authorized_operations is None  # not requested
    resp = raw_call(broker.first, 60, version, **{**fields, "include_cluster_authorized_operations": True})
    assert resp.authorized_operations == {5, 7, 8, 9, 10, 11, 12}
    if version >= 1:
        resp = raw_call(broker.first, 60, version, include_cluster_authorized_operations=False, endpoint_type=2)
        assert resp.error_code == 114 and not resp.brokers


def test_broker_settings_show_as_static_config(tmp_path: Path) -> None:
    """Topic defaults and partition count from the broker's config file; a node id other than 0."""
    config = tmp_path / "broker.toml"
    config.write_text('node_id = 3\ndefault_partitions = 2\n\n[topic_defaults]\n"retention.ms" = "3600000"\n')
    with running_broker(tmp_path / "data", ["--config", str(config), "--no-auto-create-topics"]) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        assert result(admin.create_topics([NewTopic("st", -1)])["st"]) is None
        assert partitions_of(Served("single", {3: b}), admin, "st") == 2
        res = ConfigResource(TOPIC, "st")
        entry = result(admin.describe_configs([res], request_timeout=TIMEOUT)[res])["retention.ms"]
        assert entry.value == "3600000" and entry.source == ConfigSource.STATIC_BROKER_CONFIG.value
        resp = raw_call(b, 32, 4, include_synonyms=True, include_documentation=False, resources=[
            {"resource_type": 2, "resource_name": "st", "configuration_keys": ["retention.ms"]},
            {"resource_type": 4, "resource_name": "3", "configuration_keys": None},
            {"resource_type": 4, "resource_name": "0", "configuration_keys": None},
        ])
        topic, node, other = resp.results
        assert [(s.name, s.value, s.source) for s in topic.configs[0].synonyms] == [
            ("log.retention.ms", "3600000", 4), ("log.retention.ms", "604800000", 5),
        ]
        configs = {c.name: (c.value, c.config_source) for c in node.configs}
        assert configs["broker.id"] == ("3", 4) and configs["num.partitions"] == ("2", 4)
        assert configs["auto.create.topics.enable"] == ("false", 4)
        assert configs["log.retention.ms"] == ("3600000", 4) and configs["log.segment.bytes"][1] == 5
        assert other.error_code == 42
        resp = raw_call(b, 19, 7, timeout_ms=5000, validate_only=False, topics=[
            {"name": "st-assigned", "num_partitions": -1, "replication_factor": -1, "configs": [],
             "assignments": [{"partition_index": 0, "broker_ids": [3]}]},
        ])
        assert resp.topics[0].error_code == 0 and resp.topics[0].num_partitions == 1


# ---- durability: runs last, it restarts the module's broker ------------------------------------------------


def test_zz_admin_changes_survive_restart(broker: Served) -> None:
    """Every broker stopped, then started: the topics and their configs are where they were."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create(broker, admin, "rs", 1, config={"retention.ms": "77777"})
    res = incremental("rs", ("cleanup.policy", policy(broker), AlterConfigOpType.SET))
    assert result(admin.incremental_alter_configs([res])[res]) is None
    assert result(admin.create_partitions([NewPartitions("rs", 3)])["rs"]) is None
    produce(broker, "rs", [b"a", b"b", b"c"], keyed=True)  # a compacted topic refuses keyless records
    [fut] = admin.delete_records([TopicPartition("rs", 0, 2)]).values()
    start = result(fut).low_watermark
    assert start == 2
    del admin

    broker.restart()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert partitions_of(broker, admin, "rs") == 3
    configs = describe_topic(broker, admin, "rs")
    assert configs["retention.ms"].value == "77777" and configs["cleanup.policy"].value == policy(broker)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "rs-g"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("rs", 0), timeout=TIMEOUT) == (start, 3)
    finally:
        consumer.close()
    assert partitions_of(broker, admin, "dt-b") is None and partitions_of(broker, admin, "ct-a") == 3
