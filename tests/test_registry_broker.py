"""The schema registry served by a broker (`loglake serve --schema-registry-listen`), through
confluent-kafka's own SchemaRegistryClient and its Avro, JSON Schema and Protobuf serializers:
records produced through the broker and read back decoded, 409 for an incompatible schema,
the registry kept across a kill -9, and the HTTP endpoint's bounds.
"""

from __future__ import annotations

import json
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from loglake.registry import CONTENT_TYPE as CT

from brokerkit import Broker, free_port, start_on_port

USER_V1 = json.dumps(
    {"type": "record", "name": "User", "namespace": "ex", "fields": [{"name": "name", "type": "string"}]}
)
USER_V2 = json.dumps(
    {
        "type": "record", "name": "User", "namespace": "ex",
        "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int", "default": 0}],
    }
)  # fmt: skip
USER_BAD = json.dumps(
    {
        "type": "record", "name": "User", "namespace": "ex",
        "fields": [{"name": "name", "type": "string"}, {"name": "email", "type": "string"}],
    }
)  # fmt: skip


class Served:
    def __init__(self, broker: Broker, registry_port: int) -> None:
        self.broker = broker
        self.url = f"http://127.0.0.1:{registry_port}"
        self.registry_port = registry_port

    def client(self) -> SchemaRegistryClient:
        return SchemaRegistryClient({"url": self.url})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port()
    broker = Broker(
        tmp_path_factory.mktemp("registry") / "data",
        ["--schema-registry-listen", f"127.0.0.1:{port}", "--default-partitions", "1"],
    ).start()
    try:
        yield Served(broker, port)
    finally:
        if broker.running:
            assert broker.stop() == 0, broker.log_text()[-4000:]
        assert "Traceback" not in broker.log_text(), broker.log_text()[-4000:]


def produce_and_read(bootstrap: str, topic: str, values: list[bytes]) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for v in values:
        producer.produce(topic, v)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    out: list[bytes] = []
    try:
        for _ in range(300):
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                value = msg.value()
                assert value is not None
                out.append(value)
                if len(out) == len(values):
                    break
    finally:
        consumer.close()
    return out


def test_avro_through_the_broker_and_409_for_an_incompatible_schema(served: Served) -> None:
    client = served.client()
    topic = "users-avro"
    ser = AvroSerializer(client, USER_V1)
    ctx = SerializationContext(topic, MessageField.VALUE)
    raw = [ser({"name": f"u{i}"}, ctx) for i in range(3)]
    assert all(r is not None and r[0] == 0 for r in raw)  # Confluent's wire format: magic 0, id
    got = produce_and_read(served.broker.bootstrap, topic, [r for r in raw if r is not None])
    de = AvroDeserializer(SchemaRegistryClient({"url": served.url}))
    assert [de(v, ctx) for v in got] == [{"name": "u0"}, {"name": "u1"}, {"name": "u2"}]
    # a compatible evolution: version 2; data of version 1 read with version 2's reader schema
    v2 = client.register_schema(f"{topic}-value", Schema(USER_V2, "AVRO"))
    reader = AvroDeserializer(SchemaRegistryClient({"url": served.url}), USER_V2)
    assert reader(got[0], ctx) == {"name": "u0", "age": 0}
    assert client.get_latest_version(f"{topic}-value").version == 2 and client.get_schema(v2).schema_str
    with pytest.raises(SchemaRegistryError) as exc:
        client.register_schema(f"{topic}-value", Schema(USER_BAD, "AVRO"))
    assert (exc.value.http_status_code, exc.value.error_code) == (409, 409)
    assert client.test_compatibility(f"{topic}-value", Schema(USER_BAD, "AVRO")) is False
    assert client.test_compatibility(f"{topic}-value", Schema(USER_V2, "AVRO")) is True
    with pytest.raises(SchemaRegistryError) as exc:
        client.get_version("nobody-value", 1)
    assert (exc.value.http_status_code, exc.value.error_code) == (404, 40401)


def test_json_schema_through_the_broker(served: Served) -> None:
    client = served.client()
    topic = "orders-json"
    schema = json.dumps(
        {"type": "object", "properties": {"id": {"type": "integer"}, "item": {"type": "string"}}, "required": ["id"]}
    )
    ser = JSONSerializer(schema, client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    raw = ser({"id": 7, "item": "book"}, ctx)
    assert raw is not None
    got = produce_and_read(served.broker.bootstrap, topic, [raw])
    de = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": served.url}))
    assert de(got[0], ctx) == {"id": 7, "item": "book"}
    assert client.get_latest_version(f"{topic}-value").schema.schema_type == "JSON"


def _proto_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto(name="loglake_test/reading.proto", package="loglake.test", syntax="proto3")
    msg = fd.message_type.add(name="Reading")
    msg.field.add(name="sensor", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=1)
    msg.field.add(name="value", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE, label=1)
    pool = descriptor_pool.Default()
    try:
        pool.Add(fd)
    except TypeError:
        pass  # added by an earlier run in this process
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("loglake.test.Reading"))


def test_protobuf_through_the_broker(served: Served) -> None:
    client = served.client()
    topic = "readings-proto"
    cls = _proto_class()
    ser = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    raw = ser(cls(sensor="t1", value=21.5), ctx)
    assert raw is not None
    got = produce_and_read(served.broker.bootstrap, topic, [raw])
    de = ProtobufDeserializer(cls, {"use.deprecated.format": False})
    back = de(got[0], ctx)
    assert (back.sensor, back.value) == ("t1", 21.5)
    latest = client.get_latest_version(f"{topic}-value")
    assert latest.schema.schema_type == "PROTOBUF" and latest.version == 1


def test_references_and_the_rest_routes(served: Served) -> None:
    client = served.client()
    address = json.dumps({"type": "record", "name": "Address", "namespace": "ex", "fields": [{"name": "city", "type": "string"}]})
    client.register_schema("address", Schema(address, "AVRO"))
    person = json.dumps({"type": "record", "name": "Person", "namespace": "ex", "fields": [{"name": "home", "type": "ex.Address"}]})
    pid = client.register_schema("person-value", Schema(person, "AVRO", [SchemaReference("ex.Address", "address", 1)]))
    got = client.get_schema(pid)
    assert [r.name for r in got.references] == ["ex.Address"]
    # the serializer resolves the named type through the registry (GET the referenced version)
    with_ref = Schema(person, "AVRO", [SchemaReference("ex.Address", "address", 1)])
    ser = AvroSerializer(client, with_ref, conf={"auto.register.schemas": False, "use.latest.version": True})
    ctx = SerializationContext("person", MessageField.VALUE)
    raw = ser({"home": {"city": "Oslo"}}, ctx)
    assert raw is not None and AvroDeserializer(SchemaRegistryClient({"url": served.url}))(raw, ctx) == {"home": {"city": "Oslo"}}
    r = requests.get(f"{served.url}/subjects/person-value/versions/1/schema", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"] == CT and json.loads(r.text)["name"] == "Person"
    r = requests.get(f"{served.url}/schemas/ids/{pid}/versions", timeout=10)
    assert r.json() == [{"subject": "person-value", "version": 1}]
    r = requests.get(f"{served.url}/subjects/person-value/versions/x", timeout=10)
    assert (r.status_code, r.json()["error_code"]) == (422, 42202)
    r = requests.get(f"{served.url}/schemas/ids/9999", timeout=10)
    assert (r.status_code, r.json()["error_code"]) == (404, 40403)
    r = requests.post(f"{served.url}/subjects/person-value/versions", data=b'{"schema": "{\\"type\\": 1}"}', headers={"Content-Type": CT}, timeout=10)
    assert (r.status_code, r.json()["error_code"]) == (422, 42201)
    assert client.get_compatibility() == "BACKWARD"
    client.set_compatibility("person-value", "FULL")
    assert client.get_compatibility("person-value") == "FULL"
    with pytest.raises(SchemaRegistryError) as exc:  # person-value still references it
        client.delete_subject("address")
    assert exc.value.error_code == 42206


def test_the_http_endpoint_is_bounded(served: Served) -> None:
    r = requests.post(f"{served.url}/subjects/big/versions", data=b"x" * (1024 * 1024 + 1), timeout=10)
    assert r.status_code == 413
    r = requests.get(f"{served.url}/subjects", headers={f"X-{i}": "1" for i in range(120)}, timeout=10)
    assert r.status_code == 431
    with socket.create_connection(("127.0.0.1", served.registry_port), timeout=10) as s:
        s.sendall(b"GET /subjects HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 411")
    # keep-alive: two requests on one connection
    with socket.create_connection(("127.0.0.1", served.registry_port), timeout=10) as s:
        s.sendall(b"GET /schemas/types HTTP/1.1\r\nHost: x\r\n\r\nGET /schemas/types HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 2 and data.count(b'["AVRO","JSON","PROTOBUF"]') == 2


def test_the_registry_survives_kill_9(tmp_path: Path) -> None:
    port, kafka = free_port(), free_port()
    broker = Broker(tmp_path / "data", ["--listen", f"127.0.0.1:{kafka}", "--schema-registry-listen", f"127.0.0.1:{port}"])
    start_on_port(broker, kafka)
    try:
        client = SchemaRegistryClient({"url": f"http://127.0.0.1:{port}"})
        first = client.register_schema("k-value", Schema(USER_V1, "AVRO"))
        second = client.register_schema("k-value", Schema(USER_V2, "AVRO"))
        client.set_compatibility("k-value", "FULL_TRANSITIVE")
        broker.stop(signal.SIGKILL)
        start_on_port(broker, kafka)
        client = SchemaRegistryClient({"url": f"http://127.0.0.1:{port}"})
        assert client.get_subjects() == ["k-value"] and client.get_versions("k-value") == [1, 2]
        assert client.get_schema(first).schema_str == json.dumps(json.loads(USER_V1), separators=(",", ":"))
        assert client.get_compatibility("k-value") == "FULL_TRANSITIVE"
        assert client.register_schema("k-value", Schema(USER_V2, "AVRO")) == second
        assert client.register_schema("other", Schema('"string"', "AVRO")) == second + 1
    finally:
        if broker.running:
            broker.stop()
