"""Validated topics (confluent.value.schema.validation, docs/SCHEMA_REGISTRY.md): a broker with its
registry refuses produced records that are not in the registry's wire format with a schema id of
the topic's subject — one partition's records whole, with each refused record's index, the
request's other partitions appended — and, at `full`, records that do not decode."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastavro")

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka.protocol.producer import ProduceRequest

from loglake.engine.config import SUBJECT_NAME_STRATEGIES
from loglake.kafka_errors import ErrorCode
from loglake.records import build_batch
from test_broker_malformed import RawClient

from brokerkit import InProcessBroker, free_port, serving_in_process

USER = json.dumps({"type": "record", "name": "User", "namespace": "ex", "fields": [{"name": "name", "type": "string"}]})
OTHER = json.dumps({"type": "record", "name": "Other", "namespace": "ex", "fields": [{"name": "n", "type": "long"}]})


class Served:
    def __init__(self, broker: InProcessBroker, port: int) -> None:
        self.broker = broker
        self.registry = SchemaRegistryClient({"url": f"http://127.0.0.1:{port}"})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port()
    with serving_in_process(tmp_path_factory.mktemp("validated") / "data", ["--schema-registry-listen", f"127.0.0.1:{port}"]) as b:
        yield Served(b, port)


def topics(s: Served, **configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": s.broker.bootstrap})
    for fut in admin.create_topics([NewTopic(name, 2, config=c) for name, c in configs.items()]).values():
        fut.result(30)


def framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def produce(s: Served, parts: dict[tuple[str, int], list[bytes | None]]) -> dict[tuple[str, int], Any]:
    """One Produce v9 request with one batch per (topic, partition); its partition responses."""
    by_topic: dict[str, dict[int, bytes]] = {}
    for (topic, p), values in parts.items():
        by_topic.setdefault(topic, {})[p] = build_batch([(1_000 + i, None, v, []) for i, v in enumerate(values)])
    P = ProduceRequest.TopicProduceData
    request = ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
        P(name=t, partition_data=[P.PartitionProduceData(index=i, records=b) for i, b in ps.items()])
        for t, ps in by_topic.items()
    ])  # fmt: skip
    with RawClient(s.broker.bootstrap) as c:
        resp = c.request(request)
    return {(t.name, p.index): p for t in resp.responses for p in t.partition_responses}


def ends(s: Served, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": s.broker.bootstrap, "group.id": "unused", "log_level": 3})
    try:
        return [consumer.get_watermark_offsets(CTopicPartition(topic, p), timeout=10)[1] for p in range(2)]
    finally:
        consumer.close()


def test_good_headerless_unknown_and_wrong_subject_records_in_one_request(served: Served) -> None:
    s = served
    topics(s, checked={"confluent.value.schema.validation": "true"}, unchecked={})
    user_id = s.registry.register_schema("checked-value", Schema(USER, "AVRO"))
    other_id = s.registry.register_schema("elsewhere-value", Schema(OTHER, "AVRO"))
    good = framed(user_id, b"\x06ann")
    parts = produce(s, {
        ("checked", 0): [good, b"plain text", framed(999_999, b"\x06bob"), framed(other_id, b"\x02"), None],
        ("checked", 1): [good, None],  # a tombstone is never checked
        ("unchecked", 0): [b"plain text"],
    })  # fmt: skip
    refused = parts[("checked", 0)]
    assert (refused.error_code, refused.base_offset) == (ErrorCode.INVALID_RECORD, -1)
    assert [e.batch_index for e in refused.record_errors] == [1, 2, 3]
    messages = [e.batch_index_error_message for e in refused.record_errors]
    assert "not in the schema registry's wire format" in messages[0]
    assert "schema id 999999 is unknown" in messages[1]
    assert f"schema id {other_id} is not registered under subject 'checked-value'" in messages[2]
    assert "3 of 5 record(s) of topic 'checked'" in refused.error_message
    for key in (("checked", 1), ("unchecked", 0)):
        assert (parts[key].error_code, parts[key].base_offset) == (0, 0)
    assert ends(s, "checked") == [0, 2] and ends(s, "unchecked") == [1, 0]


def test_confluent_serializer_records_pass_and_a_plain_producer_is_refused(served: Served) -> None:
    s = served
    topics(s, clients={"confluent.value.schema.validation": "true"})
    serialize = AvroSerializer(s.registry, USER)
    producer = Producer({"bootstrap.servers": s.broker.bootstrap, "linger.ms": 0})
    reports: list[KafkaError | None] = []
    value = serialize({"name": "cy"}, SerializationContext("clients", MessageField.VALUE))
    producer.produce("clients", value, partition=0, on_delivery=lambda err, _m: reports.append(err))
    producer.flush(30)
    producer.produce("clients", b"no header", partition=1, on_delivery=lambda err, _m: reports.append(err))
    producer.flush(30)
    assert reports[0] is None
    assert reports[1] is not None and reports[1].code() == KafkaError.INVALID_RECORD
    assert ends(s, "clients") == [1, 0]


def test_full_decodes_and_record_name_strategies_name_the_subject(served: Served) -> None:
    s = served
    topics(
        s,
        full={"confluent.value.schema.validation": "full"},
        byname={"confluent.value.schema.validation": "true",
                "confluent.value.subject.name.strategy": SUBJECT_NAME_STRATEGIES[1]},
        bytopicname={"confluent.key.schema.validation": "true",
                     "confluent.key.subject.name.strategy": SUBJECT_NAME_STRATEGIES[2]},
    )  # fmt: skip
    full_id = s.registry.register_schema("full-value", Schema(USER, "AVRO"))
    named_id = s.registry.register_schema("ex.User", Schema(USER, "AVRO"))  # RecordNameStrategy's subject
    other_id = s.registry.register_schema("another-value", Schema(OTHER, "AVRO"))
    keyed_id = s.registry.register_schema("bytopicname-ex.User", Schema(USER, "AVRO"))
    parts = produce(s, {
        ("full", 0): [framed(full_id, b"\x06ann")],
        ("full", 1): [framed(full_id, b"\x06ann"), framed(full_id, b"\x40x"), framed(full_id, b"\x06annEXTRA")],
        ("byname", 0): [framed(named_id, b"\x06ann")],
        ("byname", 1): [framed(other_id, b"\x02")],  # ex.Other: no such subject
    })  # fmt: skip
    assert parts[("full", 0)].error_code == 0
    bad = parts[("full", 1)]
    assert bad.error_code == ErrorCode.INVALID_RECORD and [e.batch_index for e in bad.record_errors] == [1, 2]
    assert all("does not decode" in e.batch_index_error_message for e in bad.record_errors)
    assert parts[("byname", 0)].error_code == 0
    wrong = parts[("byname", 1)]
    assert [e.batch_index_error_message for e in wrong.record_errors] == [
        f"value: schema id {other_id} is not registered under subject 'ex.Other'"
    ]
    # keys: TopicRecordNameStrategy names <topic>-<record name>; the value is not checked here
    with RawClient(s.broker.bootstrap) as c:
        P = ProduceRequest.TopicProduceData
        batch = build_batch([(1, framed(keyed_id, b"\x06k"), b"v", []), (2, b"bare key", b"v", [])])
        resp = c.request(ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
            P(name="bytopicname", partition_data=[P.PartitionProduceData(index=0, records=batch)])]))
    (part,) = resp.responses[0].partition_responses
    assert [(e.batch_index, e.batch_index_error_message.split(":")[0]) for e in part.record_errors] == [(1, "key")]


def test_a_refused_record_is_named_by_its_index_across_the_batches_of_a_partition(served: Served) -> None:
    # a batch whose records all pass is checked by its distinct headers (one here) and counted
    # whole; the refused record of the next batch is still named by its index in the partition
    s = served
    topics(s, batched={"confluent.value.schema.validation": "true"})
    user_id = s.registry.register_schema("batched-value", Schema(USER, "AVRO"))
    good = framed(user_id, b"\x06ann")
    records = build_batch([(1, None, good, []) for _ in range(3)]) + build_batch(
        [(2, None, good, []), (3, None, framed(user_id + 1_000, b"\x06bob"), [])]
    )
    P = ProduceRequest.TopicProduceData
    with RawClient(s.broker.bootstrap) as c:
        resp = c.request(ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
            P(name="batched", partition_data=[P.PartitionProduceData(index=0, records=records)])]))  # fmt: skip
    (part,) = resp.responses[0].partition_responses
    assert part.error_code == ErrorCode.INVALID_RECORD
    assert [e.batch_index for e in part.record_errors] == [4]
    assert "1 of 5 record(s) of topic 'batched'" in part.error_message
    assert ends(s, "batched") == [0, 0]
