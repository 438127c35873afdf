"""Dynamic configs against the real broker: flush.* topic configs, dynamic broker configs (BROKER
resource, node id or "" default) that change behaviour at runtime and after a restart, group
configs (GROUP resource), and authorized operations in Metadata and DescribeCluster."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicCollection, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KpNewTopic

from test_broker_admin import error_of, produce, raw_call, result, versions

from brokerkit import InProcessBroker, serving_in_process

TOPIC, BROKER, GROUP = ConfigResource.Type.TOPIC, ConfigResource.Type.BROKER, ConfigResource.Type.GROUP
SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
LONG_MAX = "9223372036854775807"
#: The static max_connections the module's broker runs with (its TOML file).
STATIC_MAX_CONNECTIONS = "5000"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    root = tmp_path_factory.mktemp("dynamic")
    config = root / "broker.toml"
    config.write_text(f'max_connections = {STATIC_MAX_CONNECTIONS}\n\n[topic_defaults]\n"segment.ms" = "7200000"\n')
    with serving_in_process(root / "data", ["--config", str(config)]) as b:
        yield b


@pytest.fixture
def admin(broker: InProcessBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def alter(admin: AdminClient, rtype: Any, name: str, *ops: tuple[str, str | None, AlterConfigOpType]) -> Any:
    """IncrementalAlterConfigs of one resource: None, or the KafkaError it failed with."""
    res = ConfigResource(rtype, name, incremental_configs=[ConfigEntry(n, v, incremental_operation=op) for n, v, op in ops])
    fut = admin.incremental_alter_configs([res])[res]
    return error_of(fut) if fut.exception(timeout=15) is not None else None


def alter_default(broker: InProcessBroker, *ops: tuple[str, str | None, AlterConfigOpType]) -> tuple[int, str | None]:
    """IncrementalAlterConfigs of the cluster-wide default broker resource ("": confluent-kafka
    refuses an empty resource name, so a raw request); (error code, message)."""
    resp = raw_call(broker, 44, 1, validate_only=False, resources=[{
        "resource_type": 4, "resource_name": "",
        "configs": [{"name": n, "config_operation": op.value, "value": v} for n, v, op in ops],
    }])
    return resp.responses[0].error_code, resp.responses[0].error_message


def describe(admin: AdminClient, rtype: Any, name: str) -> dict[str, Any]:
    res = ConfigResource(rtype, name)
    return dict(result(admin.describe_configs([res])[res]))


def describe_raw(broker: InProcessBroker, rtype: int, name: str, keys: list[str] | None = None) -> Any:
    resp = raw_call(broker, 32, 4, include_synonyms=True, include_documentation=True, resources=[
        {"resource_type": rtype, "resource_name": name, "configuration_keys": keys},
    ])
    return resp.results[0]


def closed_when_idle(broker: InProcessBroker) -> bool:
    """Open a connection, send nothing, and see the broker close it (the socket timeout only bounds a hang)."""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as sock:
        return sock.recv(1) == b""


# ---- flush.ms / flush.messages ----------------------------------------------------------------------


def test_flush_configs_are_accepted_stored_and_described(admin: AdminClient, broker: InProcessBroker) -> None:
    result(admin.create_topics([NewTopic("fl", 1, config={"flush.ms": "1000", "flush.messages": "1"})])["fl"])
    configs = describe(admin, TOPIC, "fl")
    assert configs["flush.ms"].value == "1000" and configs["flush.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["flush.messages"].value == "1"
    assert alter(admin, TOPIC, "fl", ("flush.ms", "250", SET), ("flush.messages", None, DELETE)) is None
    configs = describe(admin, TOPIC, "fl")
    assert configs["flush.ms"].value == "250"
    assert configs["flush.messages"].value == LONG_MAX and configs["flush.messages"].is_default
    entry = {c.name: c for c in describe_raw(broker, 2, "fl", ["flush.messages"]).configs}["flush.messages"]
    assert [(s.name, s.source) for s in entry.synonyms] == [("log.flush.interval.messages", 5)]
    assert "durability" in entry.documentation
    err = alter(admin, TOPIC, "fl", ("flush.messages", "0", SET))  # Kafka's floor is 1
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG
    # kafka-python's admin client and the legacy AlterConfigs take them too
    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        kp.create_topics([KpNewTopic("fl-kp", 1, 1, topic_configs={"flush.ms": "5", "flush.messages": "7"})])
    finally:
        kp.close()
    assert describe(admin, TOPIC, "fl-kp")["flush.messages"].value == "7"
    res = ConfigResource(TOPIC, "fl-kp", set_config={"flush.ms": "9"})
    with pytest.warns(DeprecationWarning):
        assert result(admin.alter_configs([res])[res]) is None
    assert describe(admin, TOPIC, "fl-kp")["flush.ms"].value == "9"


# ---- dynamic broker configs --------------------------------------------------------------------------


def test_message_max_bytes_default_changes_at_runtime_with_kafkas_precedence(admin: AdminClient, broker: InProcessBroker) -> None:
    result(admin.create_topics([NewTopic("mm", 1)])["mm"])
    no_retry = {"compression.type": "none", "retries": 0}
    [(err, _)] = produce(broker, "mm", [b"x" * 5000], conf=no_retry)
    assert err is None

    assert alter_default(broker, ("message.max.bytes", "2000", SET)) == (0, None)  # the cluster-wide default
    [(err, _)] = produce(broker, "mm", [b"x" * 5000], conf=no_retry)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    topic = describe(admin, TOPIC, "mm")["max.message.bytes"]
    assert (topic.value, topic.source) == ("2000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    default_scope = describe_raw(broker, 4, "").configs
    assert [(c.name, c.value, c.config_source) for c in default_scope] == [("message.max.bytes", "2000", 3)]

    assert alter(admin, BROKER, "0", ("message.max.bytes", "3000", SET)) is None  # this node beats the default
    [(err, _)] = produce(broker, "mm", [b"x" * 2500], conf=no_retry)
    assert err is None
    node = describe_raw(broker, 4, "0", ["message.max.bytes"]).configs[0]
    assert (node.value, node.config_source, node.read_only) == ("3000", 2, False)
    assert [(s.value, s.source) for s in node.synonyms] == [("3000", 2), ("2000", 3), ("1048588", 5)]

    assert alter(admin, BROKER, "0", ("message.max.bytes", None, DELETE)) is None
    assert alter_default(broker, ("message.max.bytes", None, DELETE)) == (0, None)
    [(err, _)] = produce(broker, "mm", [b"x" * 5000], conf=no_retry)
    assert err is None
    topic = describe(admin, TOPIC, "mm")["max.message.bytes"]
    assert (topic.value, topic.source) == ("1048588", ConfigSource.DEFAULT_CONFIG.value)
    assert describe_raw(broker, 4, "").configs == []  # "" lists only the defaults set, as Kafka


def test_idle_timeout_changes_at_runtime_and_reverts(admin: AdminClient, broker: InProcessBroker) -> None:
    assert alter_default(broker, ("connections.max.idle.ms", "1000", SET)) == (0, None)
    assert closed_when_idle(broker)
    assert alter_default(broker, ("connections.max.idle.ms", None, DELETE)) == (0, None)
    entry = describe(admin, BROKER, "0")["connections.max.idle.ms"]
    assert (entry.value, entry.source) == ("600000", ConfigSource.DEFAULT_CONFIG.value)


def test_static_layer_and_legacy_alter_configs_replace(admin: AdminClient, broker: InProcessBroker) -> None:
    entry = describe(admin, BROKER, "0")["max.connections"]
    assert (entry.value, entry.source, entry.is_read_only) == (STATIC_MAX_CONNECTIONS, 4, False)
    res = ConfigResource(BROKER, "0", set_config={"max.connections": "400", "log.cleaner.io.max.bytes.per.second": "1.5E7"})
    with pytest.warns(DeprecationWarning):
        assert result(admin.alter_configs([res])[res]) is None
    configs = describe(admin, BROKER, "0")
    assert configs["max.connections"].value == "400" and configs["max.connections"].source == 2
    assert configs["log.cleaner.io.max.bytes.per.second"].value == "15000000"
    res = ConfigResource(BROKER, "0", set_config={"log.retention.ms": "86400000"})  # replaces the node's whole set
    with pytest.warns(DeprecationWarning):
        assert result(admin.alter_configs([res])[res]) is None
    configs = describe(admin, BROKER, "0")
    assert (configs["max.connections"].value, configs["max.connections"].source) == (STATIC_MAX_CONNECTIONS, 4)
    segment = describe(admin, TOPIC, "mm")["segment.ms"]  # from [topic_defaults]: static
    assert (segment.value, segment.source) == ("7200000", ConfigSource.STATIC_BROKER_CONFIG.value)
    res = ConfigResource(BROKER, "0", set_config={})
    with pytest.warns(DeprecationWarning):
        assert result(admin.alter_configs([res])[res]) is None
    assert describe(admin, TOPIC, "mm")["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def test_kip848_and_transaction_settings_are_described_by_kafkas_names(admin: AdminClient) -> None:
    configs = describe(admin, BROKER, "0")
    expected = {
        "group.consumer.session.timeout.ms": "45000",
        "group.consumer.heartbeat.interval.ms": "5000",
        "group.consumer.assignors": "uniform,range",
        "group.consumer.migration.policy": "bidirectional",
        "transaction.max.timeout.ms": "900000",
    }
    assert {k: configs[k].value for k in expected} == expected
    assert all(configs[k].is_read_only for k in expected)


def test_read_only_unknown_and_bad_values_are_refused(admin: AdminClient, broker: InProcessBroker) -> None:
    for name, value, words in (
        ("num.partitions", "3", "Cannot update these configs dynamically"),
        ("log.cleanup.policy", "compact", "Cannot update these configs dynamically"),
        ("engine.wal_shards", "2", "Cannot update these configs dynamically"),
        ("no.such.config", "1", "Unknown broker config"),
        ("max.connections", "0", "max.connections"),
        ("log.retention.ms", "-2", "log.retention.ms"),
        ("message.max.bytes", str(1 << 30), "max.message.bytes"),  # over a quarter of the memory budget
    ):
        err = alter(admin, BROKER, "0", (name, value, SET))
        assert err is not None and err.code() == KafkaError.INVALID_CONFIG and words in err.str(), (name, err)
    resp = raw_call(broker, 44, 1, validate_only=False, resources=[  # another broker's id (a client would wait for it)
        {"resource_type": 4, "resource_name": "7", "configs": [{"name": "max.connections", "config_operation": 0, "value": "9"}]},
    ])
    assert resp.responses[0].error_code == 42 and "Unexpected broker id" in resp.responses[0].error_message
    err = alter(admin, BROKER, "0", ("max.connections", "10", AlterConfigOpType.APPEND))
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG
    res = ConfigResource(BROKER, "0", incremental_configs=[ConfigEntry("max.connections", "10", incremental_operation=SET)])
    assert result(admin.incremental_alter_configs([res], validate_only=True)[res]) is None
    assert describe(admin, BROKER, "0")["max.connections"].value == STATIC_MAX_CONNECTIONS
    resp = raw_call(broker, 44, 1, validate_only=False, resources=[
        {"resource_type": 8, "resource_name": "0", "configs": [{"name": "kafka", "config_operation": 0, "value": "DEBUG"}]},
    ])
    assert resp.responses[0].error_code == 42
    node = describe(admin, BROKER, "0")
    assert node["broker.id"].is_read_only and node["engine.wal_shards"].is_read_only
    assert node["engine.cold_store_url"].value is None and node["engine.cold_store_url"].is_sensitive


def test_kafkas_own_broker_config_names_are_accepted_stored_and_described(admin: AdminClient) -> None:
    """An admin tool's per-broker configs by Kafka's names: a name loglake does not act on is taken
    and described back ("accepted, no effect here"); Kafka's read-only ones are refused."""
    relogin, threads = "sasl.kerberos.min.time.before.relogin", "num.io.threads"
    assert describe(admin, BROKER, "0")[relogin].value == "60000"  # Kafka's default
    assert alter(admin, BROKER, "0", (relogin, "120000", SET), (threads, "4", SET)) is None
    node = describe(admin, BROKER, "0")
    assert (node[relogin].value, node[relogin].source) == ("120000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert node[threads].value == "4" and not node[relogin].is_read_only
    err = alter(admin, BROKER, "0", (relogin, "soon", SET))
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG and relogin in err.str()
    err = alter(admin, BROKER, "0", ("log.dir", "/tmp/x", SET))  # read-only in Kafka too
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG and "Cannot update these configs dynamically" in err.str()
    res = ConfigResource(BROKER, "0", incremental_configs=[ConfigEntry(threads, "9", incremental_operation=SET)])
    assert result(admin.incremental_alter_configs([res], validate_only=True)[res]) is None
    assert describe(admin, BROKER, "0")[threads].value == "4"
    assert alter(admin, BROKER, "0", (relogin, None, DELETE), (threads, None, DELETE)) is None
    assert describe(admin, BROKER, "0")[relogin].source == ConfigSource.DEFAULT_CONFIG.value


# ---- group configs -----------------------------------------------------------------------------------


def test_group_configs_set_describe_validate(admin: AdminClient, broker: InProcessBroker) -> None:
    configs = describe(admin, GROUP, "gc")  # a group without configs shows the broker's defaults
    assert (configs["consumer.session.timeout.ms"].value, configs["consumer.session.timeout.ms"].source) == ("45000", 5)
    assert alter(admin, GROUP, "gc", ("consumer.session.timeout.ms", "50000", SET)) is None
    configs = describe(admin, GROUP, "gc")
    session, heartbeat = configs["consumer.session.timeout.ms"], configs["consumer.heartbeat.interval.ms"]
    assert (session.value, session.source) == ("50000", ConfigSource.GROUP_CONFIG.value)
    assert (heartbeat.value, heartbeat.source) == ("5000", ConfigSource.DEFAULT_CONFIG.value)
    raw = describe_raw(broker, 32, "gc", ["consumer.session.timeout.ms"]).configs[0]
    assert [(s.name, s.value, s.source) for s in raw.synonyms] == [
        ("consumer.session.timeout.ms", "50000", 8), ("group.consumer.session.timeout.ms", "45000", 5),
    ]
    for name, value, words in (
        ("consumer.session.timeout.ms", "44999", "must be greater than or equal to group.consumer.min.session.timeout.ms"),
        ("consumer.session.timeout.ms", "60001", "must be less than or equal to group.consumer.max.session.timeout.ms"),
        ("consumer.heartbeat.interval.ms", "4999", "must be greater than or equal to group.consumer.min.heartbeat"),
        ("consumer.heartbeat.interval.ms", "15001", "must be less than or equal to group.consumer.max.heartbeat"),
        ("streams.session.timeout.ms", "50000", "Unknown group config name"),
        ("consumer.session.timeout.ms", "lots", "Not a number"),
    ):
        err = alter(admin, GROUP, "gc", (name, value, SET))
        assert err is not None and err.code() == KafkaError.INVALID_CONFIG and words in err.str(), (name, err)
    assert describe(admin, GROUP, "gc")["consumer.session.timeout.ms"].value == "50000"
    res = ConfigResource(GROUP, "gc", set_config={"consumer.heartbeat.interval.ms": "6000"})
    with pytest.warns(DeprecationWarning):
        assert result(admin.alter_configs([res])[res]) is None  # replaces the set: the session timeout goes
    configs = describe(admin, GROUP, "gc")
    assert configs["consumer.session.timeout.ms"].is_default and configs["consumer.heartbeat.interval.ms"].value == "6000"


def test_deleting_a_group_keeps_its_configs(admin: AdminClient, broker: InProcessBroker) -> None:
    result(admin.create_topics([NewTopic("gd-t", 1)])["gd-t"])
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "gd", "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition("gd-t", 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    assert alter(admin, GROUP, "gd", ("consumer.heartbeat.interval.ms", "7000", SET)) is None
    [fut] = admin.delete_consumer_groups(["gd"]).values()
    assert result(fut) is None
    assert describe(admin, GROUP, "gd")["consumer.heartbeat.interval.ms"].value == "7000"  # Kafka keeps them too


# ---- authorized operations ---------------------------------------------------------------------------

TOPIC_OPS = {3, 4, 5, 6, 7, 8, 10, 11}
CLUSTER_OPS = {5, 7, 8, 9, 10, 11, 12}


def test_authorized_operations_with_confluent_admin(admin: AdminClient) -> None:
    result(admin.create_topics([NewTopic("ao", 1)])["ao"])
    described = result(admin.describe_topics(TopicCollection(["ao"]), include_authorized_operations=True)["ao"])
    assert {op.value for op in described.authorized_operations} == TOPIC_OPS
    cluster = result(admin.describe_cluster(include_authorized_operations=True))
    assert {op.value for op in cluster.authorized_operations} == CLUSTER_OPS
    plain = result(admin.describe_topics(TopicCollection(["ao"]))["ao"])
    assert not plain.authorized_operations


@pytest.mark.parametrize("version", [v for v in versions(3) if v >= 8])
def test_raw_metadata_authorized_operations(broker: InProcessBroker, version: int) -> None:
    fields: dict[str, Any] = {"topics": [{"name": "ao-raw", "topic_id": None}] if version >= 10 else [{"name": "ao-raw"}],
                              "allow_auto_topic_creation": True, "include_topic_authorized_operations": True}
    if version <= 10:
        fields["include_cluster_authorized_operations"] = True
    resp = raw_call(broker, 3, version, **fields)
    assert resp.topics[0].authorized_operations == TOPIC_OPS
    if version <= 10:
        assert resp.authorized_operations == CLUSTER_OPS
    fields["include_topic_authorized_operations"] = False
    if version <= 10:
        fields["include_cluster_authorized_operations"] = False
    resp = raw_call(broker, 3, version, **fields)
    assert resp.topics[0].authorized_operations is None  # not requested: Kafka's -2147483648
    if version <= 10:
        assert resp.authorized_operations is None


# ---- restart: runs last, it restarts the module's broker ---------------------------------------------


def test_zz_dynamic_configs_survive_restart(broker: InProcessBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert alter_default(broker, ("message.max.bytes", "2000", SET), ("connections.max.idle.ms", "1000", SET)) == (0, None)
    assert alter(admin, BROKER, "0", ("log.retention.ms", "3600000", SET)) is None
    assert alter(admin, GROUP, "gr", ("consumer.session.timeout.ms", "55000", SET)) is None
    del admin

    broker.restart()
    assert closed_when_idle(broker)  # applied at start-up, before the first client
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    result(admin.create_topics([NewTopic("rs-dyn", 1)])["rs-dyn"])
    [(err, _)] = produce(broker, "rs-dyn", [b"x" * 5000], conf={"compression.type": "none", "retries": 0})
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    node = describe(admin, BROKER, "0")
    assert (node["message.max.bytes"].value, node["message.max.bytes"].source) == ("2000", 3)
    assert (node["log.retention.ms"].value, node["log.retention.ms"].source) == ("3600000", 2)
    retention = describe(admin, TOPIC, "rs-dyn")["retention.ms"]
    assert (retention.value, retention.source) == ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert describe(admin, GROUP, "gr")["consumer.session.timeout.ms"].value == "55000"
    assert alter_default(broker, ("connections.max.idle.ms", None, DELETE)) == (0, None)
