"""SASL principals drive ACLs: a SCRAM user is `User:NAME` to the authorizer.

A broker with only a SASL_PLAINTEXT listener (so allow.everyone.if.no.acl.found defaults to false)
and `--super-users User:alice`: bob, authenticated but granted nothing, is refused; alice grants
him WRITE and READ on one topic and READ on one group through the AdminClient; then bob produces
and consumes that topic and is still refused another one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from loglake.cli import command_config
from loglake.cli.remote_raw import Connection
from saslkit import add_users, confluent_conf

from brokerkit import InProcessBroker, serving_in_process

#: How long a client call may take before the test gives up.
CALL_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data = tmp_path_factory.mktemp("sasl-acls") / "data"
    add_users(data)
    args = ["--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--super-users", "User:alice"]
    with serving_in_process(data, args) as b:
        yield b


def conf(b: InProcessBroker, user: str, **extra: Any) -> dict[str, Any]:
    return {**confluent_conf(b.ports[0], "SASL_PLAINTEXT", "SCRAM-SHA-256", user=user), **extra}


def produce_error(b: InProcessBroker, user: str, topic: str) -> KafkaError | None:
    """Produce one record as `user`; the delivery error (None when it was acknowledged)."""
    errors: list[KafkaError | None] = []
    p = Producer(conf(b, user, **{"message.timeout.ms": 10_000}))
    p.produce(topic, b"v", on_delivery=lambda err, _msg: errors.append(err))
    p.flush(CALL_TIMEOUT_S)
    assert len(errors) == 1
    return errors[0]


def test_a_scram_principal_gets_what_its_bindings_allow(broker: InProcessBroker) -> None:
    admin = AdminClient(conf(broker, "alice"))
    for f in admin.create_topics([NewTopic(t, 1) for t in ("bob-t", "other-t")]).values():
        f.result(CALL_TIMEOUT_S)

    err = produce_error(broker, "bob", "bob-t")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    def allow(rtype: ResourceType, name: str, op: AclOperation) -> AclBinding:
        return AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:bob", "*", op, AclPermissionType.ALLOW)

    bindings = [
        allow(ResourceType.TOPIC, "bob-t", AclOperation.WRITE),
        allow(ResourceType.TOPIC, "bob-t", AclOperation.READ),
        allow(ResourceType.GROUP, "bob-g", AclOperation.READ),
    ]
    for f in admin.create_acls(bindings).values():
        f.result(CALL_TIMEOUT_S)

    assert produce_error(broker, "bob", "bob-t") is None
    err = produce_error(broker, "bob", "other-t")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    c = Consumer(conf(broker, "bob", **{"group.id": "bob-g", "auto.offset.reset": "earliest"}))
    c.assign([TopicPartition("bob-t", 0, 0)])
    deadline = time.monotonic() + CALL_TIMEOUT_S
    got = None
    while got is None and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None:
            assert m.error() is None, m.error()
            got = m.value()
    assert got == b"v"
    c.commit(asynchronous=False)
    c.close()

    # alice, the super user, sees both topics; bob's Metadata lists only the one he may describe.
    assert {"bob-t", "other-t"} <= set(admin.list_topics(timeout=CALL_TIMEOUT_S).topics)
    bob_admin = AdminClient(conf(broker, "bob"))
    assert set(bob_admin.list_topics(timeout=CALL_TIMEOUT_S).topics) == {"bob-t"}
    (refusal,) = bob_admin.create_acls([allow(ResourceType.TOPIC, "other-t", AclOperation.READ)]).values()
    with pytest.raises(KafkaException) as refused:
        refusal.result(CALL_TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED



def test_a_regex_subscription_gets_only_topics_the_member_may_describe(broker: InProcessBroker) -> None:
    """KIP-848 ConsumerGroupHeartbeat v1 with SubscribedTopicRegex, sent as bob over SCRAM: the
    regex matches two topics, bob may describe one, so the group assigns him only that one (Kafka
    narrows resolved regexes the same way), from the heartbeat after the join (a regex new to the
    group is resolved after it, as Kafka resolves it asynchronously). Sent raw, because librdkafka resolves a regex itself
    against the (already narrowed) Metadata and sends names instead."""
    admin = AdminClient(conf(broker, "alice"))
    for f in admin.create_topics([NewTopic(t, 2) for t in ("rxa-open", "rxa-secret")]).values():
        f.result(CALL_TIMEOUT_S)

    def allow(rtype: ResourceType, name: str, op: AclOperation) -> AclBinding:
        return AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:bob", "*", op, AclPermissionType.ALLOW)

    for f in admin.create_acls(
        [allow(ResourceType.TOPIC, "rxa-open", AclOperation.READ), allow(ResourceType.GROUP, "rxa-g", AclOperation.READ)]
    ).values():
        f.result(CALL_TIMEOUT_S)
    described = admin.describe_topics(TopicCollection(["rxa-open", "rxa-secret"]))
    names = {}
    for name, f in described.items():
        tid = f.result(CALL_TIMEOUT_S).topic_id
        bits = (tid.get_most_significant_bits() << 64) | (tid.get_least_significant_bits() & (2**64 - 1))
        names[uuid.UUID(int=bits & (2**128 - 1))] = name
    bob = confluent_conf(broker.ports[0], "SASL_PLAINTEXT", "SCRAM-SHA-256", user="bob")
    command_config.use({k: v for k, v in bob.items() if k.startswith(("sasl.", "security."))})
    try:
        with Connection(f"127.0.0.1:{broker.ports[0]}", "test") as conn:
            joined = conn.request(
                68, 1, group_id="rxa-g", member_id=uuid.uuid4().hex[:22], member_epoch=0, instance_id=None,
                rack_id=None, rebalance_timeout_ms=30_000, subscribed_topic_names=[],
                subscribed_topic_regex="rxa-.*", server_assignor=None, topic_partitions=None,
            )
            assert joined.error_code == 0 and not joined.assignment.topic_partitions, joined  # a new regex: later
            resp = conn.request(
                68, 1, group_id="rxa-g", member_id=joined.member_id, member_epoch=joined.member_epoch, instance_id=None,
                rack_id=None, rebalance_timeout_ms=-1, subscribed_topic_names=None,
                subscribed_topic_regex=None, server_assignor=None, topic_partitions=[],
            )
    finally:
        command_config.use({})
    assert resp.error_code == 0, resp
    assigned = {names.get(tp.topic_id, str(tp.topic_id)): sorted(tp.partitions) for tp in resp.assignment.topic_partitions}
    assert assigned == {"rxa-open": [0, 1]}, (assigned, names)
