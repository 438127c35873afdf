"""Typed reads and typed Iceberg exports: keys and values in Confluent's wire format, decoded with
the schema registry a broker serves (`loglake serve --schema-registry-listen`). Produced by
confluent-kafka's own serializers; three Avro versions (each adds an optional field), records of
older versions read with the latest; undecodable records in the dead-letter table; Protobuf
values written with a serialized descriptor and read with a later version registered as .proto
text."""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")
pytest.importorskip("fastavro")

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from brokerkit import Broker, free_port, serving_broker

WAIT_S = 30
QUIET = {"kafka.log_level": "0"}
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _user(version: int) -> str:
    fields: list[dict[str, Any]] = [
        {"name": "name", "type": "string"},
        {"name": "signup", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tier", "type": {"type": "enum", "name": "Tier", "symbols": ["FREE", "PRO"]}},
    ]
    if version >= 2:
        fields.append({"name": "age", "type": ["null", "int"], "default": None})
    if version >= 3:
        fields.append({"name": "tags", "type": ["null", {"type": "array", "items": "string"}], "default": None})
    return json.dumps({"type": "record", "name": "User", "namespace": "ex", "fields": fields})


def _doc(version: int, i: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": f"u{i}", "signup": T0 + datetime.timedelta(seconds=i), "tier": "PRO" if i % 2 else "FREE"}
    if version >= 2:
        doc["age"] = 20 + i
    if version >= 3:
        doc["tags"] = [f"t{i}"]
    return doc


#: What the table holds for record i of version v: (name, age, tags)
def _want(version: int, i: int) -> tuple[Any, ...]:
    return (f"u{i}", 20 + i if version >= 2 else None, [f"t{i}"] if version >= 3 else None)


#: not Confluent's wire format; and a datum cut short after a good header
NO_MAGIC = b"plain text, no schema id"


class Served:
    def __init__(self, broker: Broker, port: int) -> None:
        self.broker = broker
        self.registry = f"http://127.0.0.1:{port}"

    def topic(self, partitions: int = 2) -> str:
        name = f"typed-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap, "log_level": 0})
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(WAIT_S)
        return name

    def produce_avro(self, topic: str, version: int, numbers: range) -> None:
        ser = AvroSerializer(SchemaRegistryClient({"url": self.registry}), _user(version))
        ctx = SerializationContext(topic, MessageField.VALUE)
        self.produce(topic, [(f"k{i}".encode(), ser(_doc(version, i), ctx)) for i in numbers])

    def produce(self, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
        p = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 2, "log_level": 0})
        for n, (key, value) in enumerate(records):
            p.produce(topic, value=value, key=key, partition=n % 2)
        assert p.flush(WAIT_S) == 0

    def options(self, topic: str, **extra: str) -> dict[str, str]:
        return {
            "path": str(self.broker.data_dir),
            "subscribe": topic,
            "kafka.bootstrap.servers": self.broker.bootstrap,
            **QUIET,
            **extra,
        }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port()
    data = tmp_path_factory.mktemp("typed") / "data"
    with serving_broker(data, ["--schema-registry-listen", f"127.0.0.1:{port}"]) as b:
        yield Served(b, port)


def _read(spark: Any, options: dict[str, str]) -> Any:
    import loglake.spark

    loglake.spark.register(spark)
    r = spark.read.format("loglake")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _truncated(served: Served, topic: str) -> bytes:
    ser = AvroSerializer(SchemaRegistryClient({"url": served.registry}), _user(1))
    good = ser(_doc(1, 99), SerializationContext(topic, MessageField.VALUE))
    assert good is not None
    return good[:8]


def test_avro_versions_read_with_the_latest_schema(spark: Any, served: Served) -> None:
    topic = served.topic()
    served.produce_avro(topic, 1, range(0, 4))
    served.produce_avro(topic, 2, range(4, 8))
    served.produce_avro(topic, 3, range(8, 12))
    served.produce(topic, [(b"bad", NO_MAGIC), (b"tomb", None)])
    df = _read(spark, served.options(topic, valueFormat="avro", schemaRegistryUrl=served.registry))
    value_type = df.schema["value"].dataType
    assert [f.name for f in value_type.fields] == ["name", "signup", "tier", "age", "tags"]
    assert [f.dataType.simpleString() for f in value_type.fields] == [
        "string", "timestamp", "string", "int", "array<string>",
    ]  # fmt: skip
    assert df.columns[-4:] == ["value_schema_id", "decode_error", "undecoded_key", "undecoded_value"]
    rows = df.select(
        "key", "value.name", "value.signup", "value.tier", "value.age", "value.tags", "value_schema_id",
        "decode_error", "undecoded_value",
    ).collect()  # fmt: skip
    by_key = {bytes(r["key"]): r for r in rows}
    ids = SchemaRegistryClient({"url": served.registry})
    version_ids = [ids.get_version(f"{topic}-value", v).schema_id for v in (1, 2, 3)]
    for i in range(12):
        r = by_key[f"k{i}".encode()]
        version = 1 + i // 4
        assert (r["name"], r["age"], r["tags"]) == _want(version, i)
        assert r["signup"] == (T0 + datetime.timedelta(seconds=i)).replace(tzinfo=None)  # session tz UTC
        assert r["tier"] == ("PRO" if i % 2 else "FREE")
        assert r["value_schema_id"] == version_ids[version - 1]
        assert r["decode_error"] is None and r["undecoded_value"] is None
    bad = by_key[b"bad"]
    assert bad["name"] is None and bad["value_schema_id"] is None
    assert "not in Confluent's wire format" in bad["decode_error"] and bytes(bad["undecoded_value"]) == NO_MAGIC
    tomb = by_key[b"tomb"]  # a null value is no error
    assert tomb["name"] is None and tomb["decode_error"] is None


def test_typed_iceberg_export_evolves_and_dead_letters(spark: Any, served: Served, tmp_path: Path) -> None:
    from loglake.spark.iceberg import export_iceberg, open_catalog

    topic = served.topic()
    served.produce_avro(topic, 1, range(0, 4))
    served.produce_avro(topic, 2, range(4, 8))
    truncated = _truncated(served, topic)
    served.produce(topic, [(b"bad", NO_MAGIC), (b"cut", truncated), (b"unknown", b"\x00\x00\x00\x7f\x7fxyz")])
    uri = f"sqlite:///{tmp_path}/catalog.db"
    warehouse = str(tmp_path / "warehouse")

    def export() -> Any:
        return export_iceberg(
            spark, str(served.broker.data_dir), topic, catalog_uri=uri, table_name="lake.users", warehouse=warehouse,
            value_format="registry", registry_url=served.registry,
            source_options={"kafka.bootstrap.servers": served.broker.bootstrap, **QUIET},
        )  # fmt: skip

    first = export()
    assert (first.rows, first.dead_letters) == (8, 3)
    catalog = open_catalog(uri, warehouse, {})
    table = catalog.load_table("lake.users")
    assert [f.name for f in table.schema().fields][-5:] == ["value_schema_id", "name", "signup", "tier", "age"]
    # a third version: its new field becomes a new column, older rows read null in it
    served.produce_avro(topic, 3, range(8, 12))
    second = export()
    assert (second.rows, second.dead_letters) == (4, 0)
    again = export()  # nothing new: neither table gains a snapshot
    assert (again.rows, again.dead_letters, again.batches) == (0, 0, 0)

    table = catalog.load_table("lake.users")
    dlq = catalog.load_table("lake.users_dlq")
    assert len(table.snapshots()) == 2 and len(dlq.snapshots()) == 1
    fields = {f.name: str(f.field_type) for f in table.schema().fields}
    assert fields["tags"] == "list<string>" and fields["signup"] == "timestamptz" and fields["age"] == "int"
    assert "value" not in fields and fields["key"] == "binary"
    data = table.scan().to_arrow()
    got = sorted(zip(*(data.column(c).to_pylist() for c in ("name", "age", "tags")), strict=True))
    want = sorted(_want(1 + i // 4, i) for i in range(12))
    assert got == want
    dead = dlq.scan().to_arrow().sort_by("key")
    assert dead.column("key").to_pylist() == [b"bad", b"cut", b"unknown"]
    assert dead.column("value").to_pylist() == [NO_MAGIC, truncated, b"\x00\x00\x00\x7f\x7fxyz"]
    reasons = dead.column("reason").to_pylist()
    assert "not in Confluent's wire format" in reasons[0]
    assert "corrupt Avro datum" in reasons[1]
    assert "schema id 32639" in reasons[2] and "HTTP 404" in reasons[2]

    from test_spark_iceberg import _duckdb

    con = _duckdb(table.metadata_location)
    duck = con.execute(
        "SELECT name, age, tags, tier, signup FROM iceberg_scan(?) ORDER BY name", [table.metadata_location]
    ).fetchall()
    assert sorted((n, a, t) for n, a, t, _, _ in duck) == want
    assert {str(type(s).__name__) for *_, s in duck} == {"datetime"}
    assert con.execute("SELECT count(*), min(reason) FROM iceberg_scan(?)", [dlq.metadata_location]).fetchone()[0] == 3


def test_json_schema_values(spark: Any, served: Served) -> None:
    topic = served.topic()
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "score": {"type": "number"}, "labels": {"type": "array", "items": {"type": "string"}}},
            "required": ["id"],
        }
    )
    ser = JSONSerializer(schema, SchemaRegistryClient({"url": served.registry}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    good = [ser({"id": i, "score": i / 2, "labels": [f"l{i}"]}, ctx) for i in range(4)]
    header = good[0][:5] if good[0] else b""
    served.produce(topic, [(f"k{i}".encode(), v) for i, v in enumerate(good)] + [(b"bad", header + b'{"score": 1}')])
    df = _read(spark, served.options(topic, valueFormat="json-schema", schemaRegistryUrl=served.registry))
    rows = {bytes(r["key"]): r for r in df.select("key", "value.*", "decode_error").collect()}
    assert [(rows[f"k{i}".encode()]["id"], rows[f"k{i}".encode()]["score"], rows[f"k{i}".encode()]["labels"]) for i in range(4)] == [
        (i, i / 2, [f"l{i}"]) for i in range(4)
    ]
    assert "'id' is a required property" in rows[b"bad"]["decode_error"]


#: The second version of the Protobuf values, registered as .proto text: `region` added.
ORDER_V2 = """syntax = "proto3";
package ex;
message Order {
  enum Kind { BUY = 0; SELL = 1; }
  int64 id = 1;
  string user = 2;
  Kind kind = 3;
  repeated string tags = 4;
  string region = 5;
}
"""


def _order_v1() -> Any:
    """The first version's message class, built at runtime (no protoc here)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="order.proto", package="ex", syntax="proto3")
    msg = file.message_type.add(name="Order")
    kind = msg.enum_type.add(name="Kind")
    kind.value.add(name="BUY", number=0)
    kind.value.add(name="SELL", number=1)
    msg.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    msg.field.add(name="user", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    msg.field.add(name="kind", number=3, type=field.TYPE_ENUM, type_name=".ex.Order.Kind", label=field.LABEL_OPTIONAL)
    msg.field.add(name="tags", number=4, type=field.TYPE_STRING, label=field.LABEL_REPEATED)
    return message_factory.GetMessageClass(descriptor_pool.DescriptorPool().Add(file).message_types_by_name["Order"])


def test_protobuf_values_with_a_proto_text_reader(spark: Any, served: Served) -> None:
    topic = served.topic()
    order = _order_v1()
    client = SchemaRegistryClient({"url": served.registry})
    ser = ProtobufSerializer(order, client, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    records = [(f"k{i}".encode(), ser(order(id=i, user=f"u{i}", kind=i % 2, tags=[f"t{i}"]), ctx)) for i in range(3)]
    v1 = client.get_latest_version(f"{topic}-value")
    assert "{" not in v1.schema.schema_str  # the serializer registers the serialized descriptor
    v2 = client.register_schema(f"{topic}-value", Schema(ORDER_V2, "PROTOBUF"))
    # a version-2 record: the first message (index 0), then field 5 (`region`, length-delimited)
    body = order(id=3, user="u3", kind=1).SerializeToString() + b"\x2a\x02r3"
    records.append((b"k3", b"\x00" + v2.to_bytes(4, "big") + b"\x00" + body))
    served.produce(topic, records)
    df = _read(spark, served.options(topic, valueFormat="protobuf", schemaRegistryUrl=served.registry))
    assert [f.name for f in df.schema["value"].dataType.fields] == ["id", "user", "kind", "tags", "region"]
    rows = {bytes(r["key"]): r for r in df.select("key", "value.*", "value_schema_id", "decode_error").collect()}
    # each record is parsed with its writer's descriptor: version 1 has no `region` (null)
    got = [tuple(rows[f"k{i}".encode()][c] for c in ("id", "user", "kind", "tags", "region", "value_schema_id")) for i in range(4)]
    assert got == [
        (0, "u0", "BUY", ["t0"], None, v1.schema_id),
        (1, "u1", "SELL", ["t1"], None, v1.schema_id),
        (2, "u2", "BUY", ["t2"], None, v1.schema_id),
        (3, "u3", "SELL", [], "r3", v2),
    ]
    assert all(r["decode_error"] is None for r in rows.values())
