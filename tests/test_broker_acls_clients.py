"""ACLs on a real broker with real clients: confluent-kafka's AdminClient creates, describes and
deletes bindings; an idempotent producer and a consumer group work by their ACLs; Metadata and
ListGroups list only what the principal may describe; one audit line per denied request; the
bindings survive a restart. Broker and principals: tests/aclkit.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kafka.protocol.admin import ListGroupsRequest
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest

from aclkit import (
    DESCRIBE,
    READ,
    WRITE,
    TlsClient,
    acl_broker,
    acl_pki,
    batch,
    create_topic,
    describe_acls,
    grant,
    metadata_names,
    offset_commit,
    open_clients,
    produce,
)
from loglake.kafka_errors import ErrorCode as E
from tlskit import Pki

from brokerkit import InProcessBroker


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return acl_pki(tmp_path_factory)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[InProcessBroker]:
    yield from acl_broker(tmp_path_factory, pki)


@pytest.fixture(scope="module")
def clients(broker: InProcessBroker, pki: Pki) -> Iterator[dict[str, TlsClient]]:
    yield from open_clients(broker, pki)


@pytest.fixture(scope="module")
def granted(clients: dict[str, TlsClient]) -> None:
    grant(clients)


def test_metadata_lists_only_what_the_principal_may_describe(clients: dict[str, TlsClient], granted: None) -> None:
    bob, eve, admin = clients["bob"], clients["eve"], clients["admin"]
    assert create_topic(admin, "other-t") in (0, E.TOPIC_ALREADY_EXISTS)
    every = metadata_names(admin, None)
    assert {"pub-t", "other-t"} <= set(every)
    assert set(metadata_names(bob, None)) == {n for n in every if n.startswith("pub-")}
    assert metadata_names(eve, None) == {}
    assert metadata_names(eve, ["pub-t"]) == {"pub-t": E.TOPIC_AUTHORIZATION_FAILED}
    # Auto-creation needs CREATE: eve may not (whether or not the topic exists, the same answer).
    assert metadata_names(eve, ["pub-auto-eve"], create=True) == {"pub-auto-eve": E.TOPIC_AUTHORIZATION_FAILED}
    assert metadata_names(bob, ["pub-auto-bob"], create=True) == {"pub-auto-bob": 0}
    # Authorized operations come from the ACLs: bob may do everything to pub-t but not WRITE pub-denied.
    resp = bob.request(MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name="pub-denied")],
                                           allow_auto_topic_creation=False, include_topic_authorized_operations=True))
    ops = resp.topics[0].authorized_operations
    assert READ in ops and DESCRIBE in ops and WRITE not in ops


def test_list_groups_filtered(clients: dict[str, TlsClient], granted: None) -> None:
    bob, eve = clients["bob"], clients["eve"]
    assert offset_commit(bob) == 0
    for who, c in (("bob", bob), ("eve", eve)):
        groups = [g.group_id for g in c.request(ListGroupsRequest[4](states_filter=[])).groups]
        assert ("g-bob" in groups) == (who == "bob")


def audit_lines(b: InProcessBroker) -> list[str]:
    return [line for line in b.log_text().splitlines() if "DENIED principal=" in line]


def test_audit_line_once_per_denied_request(broker: InProcessBroker, clients: dict[str, TlsClient], granted: None) -> None:
    eve = clients["eve"]
    before = len(audit_lines(broker))
    # One Produce naming two forbidden topics, three partitions: one line.
    P = ProduceRequest.TopicProduceData
    records = batch()
    eve.request(ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
        P(name="pub-t", partition_data=[P.PartitionProduceData(index=i, records=records) for i in (0, 1)]),
        P(name="other-t", partition_data=[P.PartitionProduceData(index=0, records=records)]),
    ]))
    deadline = time.monotonic() + 10
    while len(audit_lines(broker)) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a second line, if any, would come right after the first
    new = audit_lines(broker)[before:]
    assert len(new) == 1, new
    line = new[0]
    for part in ("principal=User:eve", "host=127.0.0.1", "api=Produce", "operation=WRITE", "resource_type=TOPIC",
                 "'other-t'", "'pub-t'"):
        assert part in line, line
    # OffsetFetch v8 naming two groups eve may not describe: both refused, one line.
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    before = len(audit_lines(broker))
    resp = eve.request(OffsetFetchRequest[8](groups=[G(group_id="g-bob", topics=None), G(group_id="g-x", topics=None)],
                                             require_stable=False))
    assert [g.error_code for g in resp.groups] == [E.GROUP_AUTHORIZATION_FAILED] * 2
    time.sleep(0.3)
    new = audit_lines(broker)[before:]
    assert len(new) == 1 and "api=OffsetFetch" in new[0] and "'g-bob','g-x'" in new[0], new


def _admin(broker: InProcessBroker, pki: Pki, who: str) -> AdminClient:
    pair = pki.clients[who]
    return AdminClient({"bootstrap.servers": broker.bootstrap, "security.protocol": "SSL", "ssl.ca.location": str(pki.ca),
                        "ssl.certificate.location": str(pair.cert), "ssl.key.location": str(pair.key), "log_level": 0})


def test_admin_client_create_describe_delete_round_trip(broker: InProcessBroker, pki: Pki, granted: None) -> None:
    admin = _admin(broker, pki, "admin")
    name = f"rt-{uuid.uuid4().hex[:6]}"
    bindings = [
        AclBinding(ResourceType.TOPIC, name, ResourcePatternType.LITERAL, "User:carol", "*", AclOperation.READ, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, name, ResourcePatternType.PREFIXED, "User:carol", "10.0.0.1", AclOperation.WRITE, AclPermissionType.DENY),
        AclBinding(ResourceType.GROUP, name, ResourcePatternType.LITERAL, "User:*", "*", AclOperation.ALL, AclPermissionType.ALLOW),
    ]
    for fut in admin.create_acls(bindings, request_timeout=15).values():
        assert fut.result() is None
    match = AclBindingFilter(ResourceType.ANY, name, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY)
    described = admin.describe_acls(match, request_timeout=15).result()
    assert sorted(map(str, described)) == sorted(map(str, bindings))
    # MATCH: the bindings that apply to a topic named name + "-x" (the prefixed one).
    applies = AclBindingFilter(ResourceType.TOPIC, name + "-x", ResourcePatternType.MATCH, None, None, AclOperation.ANY, AclPermissionType.ANY)
    assert [b.host for b in admin.describe_acls(applies, request_timeout=15).result()] == ["10.0.0.1"]
    bad = AclBinding(ResourceType.BROKER, "not-the-cluster", ResourcePatternType.LITERAL, "User:carol", "*", AclOperation.ALTER, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as err:
        admin.create_acls([bad], request_timeout=15)[bad].result()
    assert err.value.args[0].code() == E.INVALID_REQUEST
    only_topic = AclBindingFilter(ResourceType.TOPIC, name, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY)
    deleted = admin.delete_acls([only_topic], request_timeout=15)[only_topic].result()
    assert sorted(map(str, deleted)) == sorted(map(str, bindings[:2]))
    assert [str(b) for b in admin.describe_acls(match, request_timeout=15).result()] == [str(bindings[2])]
    # Not a super user and no ALTER on the cluster: refused.
    eve = _admin(broker, pki, "eve")  # held: a dropped client cancels its futures
    with pytest.raises(KafkaException) as err:
        eve.create_acls(bindings[:1], request_timeout=15)[bindings[0]].result()
    assert err.value.args[0].code() == E.CLUSTER_AUTHORIZATION_FAILED


def _client_conf(broker: InProcessBroker, pki: Pki, who: str) -> dict[str, Any]:
    pair = pki.clients[who]
    return {"bootstrap.servers": broker.bootstrap, "security.protocol": "SSL", "ssl.ca.location": str(pki.ca),
            "ssl.certificate.location": str(pair.cert), "ssl.key.location": str(pair.key), "log_level": 0}


def test_confluent_idempotent_producer_and_group_consumer(broker: InProcessBroker, pki: Pki, granted: None) -> None:
    """Real clients: bob's idempotent producer (InitProducerId by WRITE on a topic, Kafka 3+) and
    subscribing consumer (group g-bob) work; eve's consumer is told GROUP_AUTHORIZATION_FAILED."""
    topic = f"pub-cg-{uuid.uuid4().hex[:6]}"
    producer = Producer({**_client_conf(broker, pki, "bob"), "enable.idempotence": True})
    for i in range(20):
        producer.produce(topic, value=b"m%d" % i)
    assert producer.flush(30) == 0
    consumer = Consumer({**_client_conf(broker, pki, "bob"), "group.id": "g-bob", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < 20 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert got == [b"m%d" % i for i in range(20)]
    eve = Consumer({**_client_conf(broker, pki, "eve"), "group.id": "g-bob", "auto.offset.reset": "earliest"})
    eve.subscribe([topic])
    error = None
    deadline = time.monotonic() + 30
    while error is None and time.monotonic() < deadline:
        msg = eve.poll(0.5)
        if msg is not None and msg.error():
            error = msg.error()
    eve.close()
    assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error


def test_acls_survive_a_restart(broker: InProcessBroker, pki: Pki, clients: dict[str, TlsClient], granted: None) -> None:
    """Last in the module: the clients' connections close with the restart."""
    for c in clients.values():
        c.close()
    broker.restart()
    bob, eve = TlsClient(broker.port, pki, "bob"), TlsClient(broker.port, pki, "eve")
    try:
        assert produce(bob, "pub-t", batch()) == [0]
        assert produce(bob, "pub-denied", batch()) == [E.TOPIC_AUTHORIZATION_FAILED]
        assert produce(eve, "pub-t", batch()) == [E.TOPIC_AUTHORIZATION_FAILED]
        assert describe_acls(TlsClient(broker.port, pki, "admin")) == 0
    finally:
        bob.close()
        eve.close()

