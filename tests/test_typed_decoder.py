"""The typed source's decoder without Spark: Avro records decoded a batch at a time
(loglake.spark.avro_columns) give what fastavro gives a record at a time, corrupt ones the same
reasons; an unknown schema id is asked for again once UNKNOWN_ID_RETRY_S has passed."""

from __future__ import annotations

import datetime
import io
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastavro")
pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")  # its type conversion only: no JVM starts here

import fastavro
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from loglake.registry.formats import SchemaType
from loglake.spark import typed
from loglake.spark.typed import Decoder, Format, RegisteredSchema, resolve_reader

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

INNER = {"type": "record", "name": "Inner", "fields": [
    {"name": "x", "type": "int"},
    {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-micros"}},
]}  # fmt: skip
V1: dict[str, Any] = {
    "type": "record", "name": "Event", "namespace": "t", "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": "string"},
        {"name": "score", "type": "float"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}},
        {"name": "inner", "type": ["null", INNER], "default": None},
        {"name": "dropped", "type": ["null", "string"], "default": None},
        {"name": "flag", "type": "boolean"},
        {"name": "raw", "type": "bytes"},
        {"name": "hash", "type": {"type": "fixed", "name": "H", "size": 4}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    ],
}  # fmt: skip
# the latest version: id promoted to long, score to double, `dropped` gone, two fields added
V2: dict[str, Any] = {
    **V1,
    "fields": [
        {**f, "type": {"id": "long", "score": "double"}.get(f["name"], f["type"])}
        for f in V1["fields"]
        if f["name"] != "dropped"
    ]
    + [
        {"name": "region", "type": ["null", "string"], "default": None},
        {"name": "level", "type": "int", "default": 7},
    ],
}
# arrays: not read in columns, a record at a time (fastavro)
LISTS = {"type": "record", "name": "Event", "namespace": "t", "fields": [
    {"name": "id", "type": "long"}, {"name": "tags", "type": {"type": "array", "items": "string"}},
]}  # fmt: skip


class FakeRegistry:
    url = "http://registry.invalid"

    def __init__(self, schemas: dict[int, dict[str, Any]], latest: int) -> None:
        self.schemas = schemas
        self.latest_id = latest

    def by_id(self, schema_id: int) -> RegisteredSchema:
        if schema_id not in self.schemas:
            raise typed.UndecodableError("HTTP 404 Schema not found")
        return RegisteredSchema(schema_id, SchemaType.AVRO, json.dumps(self.schemas[schema_id]), schema_id)

    def latest(self, subject: str) -> RegisteredSchema:
        return self.by_id(self.latest_id)


def _decoder(schemas: dict[int, dict[str, Any]], latest: int) -> tuple[Decoder, Any]:
    """A decoder of the reader schema `schemas[latest]`, and its column's Arrow type."""
    registry = FakeRegistry(schemas, latest)
    spec = resolve_reader(registry, "t", "value", Format.AVRO)  # type: ignore[arg-type]
    decoder = Decoder(spec)
    decoder.registry = registry  # type: ignore[assignment]
    column = to_arrow_schema(StructType.fromJson({"type": "struct", "fields": [
        {"name": "value", "type": spec.column_type, "nullable": True, "metadata": {}},
    ]}), timezone="UTC").field("value").type  # fmt: skip
    return decoder, column


def _wire(schema_id: int, schema: dict[str, Any], doc: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), doc)
    return buf.getvalue()


def _event(i: int, version: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": i, "name": f"n{i}-é", "score": i / 4, "at": T0 + datetime.timedelta(milliseconds=i),
        "kind": "ABC"[i % 3], "inner": None if i % 4 == 0 else {"x": -i, "seen": T0 + datetime.timedelta(microseconds=i)},
        "flag": bool(i % 2), "raw": bytes([i % 256]) * (i % 3), "hash": struct.pack(">I", i),
        "day": datetime.date(2026, 1, 1) + datetime.timedelta(days=i),
    }  # fmt: skip
    if version == 1:
        doc["dropped"] = None if i % 2 else f"d{i}"
    else:
        doc["region"] = None if i % 3 else f"r{i}"
        doc["level"] = i
    return doc


def _decode(decoder: Decoder, column: Any, arrow_type: Any) -> tuple[Any, Any, list[str | None]]:
    """decode_column's answer with its reasons as a list (None: decoded)."""
    got, ids, failures = decoder.decode_column(column, arrow_type)
    return got, ids, [failures.get(i) for i in range(len(column))]


def _one_at_a_time(decoder: Decoder, column: Any, arrow_type: Any) -> tuple[Any, list[str | None]]:
    values, _, errors = decoder.decode_all(column.to_pylist())
    return typed._column(values, errors, arrow_type, "value", decoder.timestamp_units), errors


def test_columns_match_fastavro_record_at_a_time() -> None:
    decoder, arrow_type = _decoder({1: V1, 2: V2, 3: LISTS}, 2)
    raws: list[bytes | None] = [_wire(1 + i % 2, (V1, V2)[i % 2], _event(i, 1 + i % 2)) for i in range(300)]
    raws[5] = None  # a tombstone
    column = pa.array(raws, pa.binary())
    got, ids, errors = _decode(decoder, column, arrow_type)
    want, want_errors = _one_at_a_time(decoder, column, arrow_type)
    assert errors == want_errors == [None] * 300
    assert got.to_pylist() == want.to_pylist()
    assert got.type == arrow_type and got[5].as_py() is None
    assert ids.to_pylist() == [None if i == 5 else 1 + i % 2 for i in range(300)]
    row = got[3].as_py()  # version 2: its own fields; version 1 (row 2): the added ones' defaults
    assert (row["id"], row["level"], row["region"], row["kind"]) == (3, 3, "r3", "A")
    assert (got[2].as_py()["level"], got[2].as_py()["region"]) == (7, None)
    assert row["at"] == T0 + datetime.timedelta(milliseconds=3)
    assert decoder._plans[1] is not None and decoder._plans[2] is not None  # read in columns


def test_corrupt_records_get_fastavros_reasons() -> None:
    decoder, arrow_type = _decoder({1: V1, 2: V2}, 2)
    good = _wire(2, V2, _event(1, 2))
    raws = [
        good,
        good[:-3],  # cut short
        good + b"\x00",  # a byte after the datum
        b"plain text",  # no magic byte
        good[:5] + b"\x02" + good[6:],  # a negative int for the record's id... still a valid datum
        _wire(9, V2, _event(2, 2)),  # an id the registry does not know
        _wire(1, V1, {**_event(3, 1), "name": "x"}).replace(b"\x02x", b"\x02\xff"),  # bad UTF-8
        good,
    ]
    column = pa.array(raws, pa.binary())
    got, ids, errors = _decode(decoder, column, arrow_type)
    want, want_errors = _one_at_a_time(decoder, column, arrow_type)
    assert errors == want_errors
    assert [e is None for e in errors] == [True, False, False, False, True, False, False, True]
    assert "corrupt Avro datum" in str(errors[1]) and "1 bytes after it" in str(errors[2])
    assert "not in Confluent's wire format" in str(errors[3]) and "HTTP 404" in str(errors[5])
    assert "UnicodeDecodeError" in str(errors[6])
    assert [v for v, e in zip(got.to_pylist(), errors, strict=True) if e is None] == [
        v for v, e in zip(want.to_pylist(), want_errors, strict=True) if e is None
    ]
    assert got[4].as_py()["id"] == 1 and ids.to_pylist()[3] is None and ids.to_pylist()[5] == 9


def test_unreadable_in_columns_falls_back_to_fastavro() -> None:
    decoder, arrow_type = _decoder({3: LISTS}, 3)
    column = pa.array([_wire(3, LISTS, {"id": i, "tags": [f"t{i}"] * i}) for i in range(4)], pa.binary())
    got, _, errors = _decode(decoder, column, arrow_type)
    assert errors == [None] * 4 and decoder._plans[3] is None
    assert got.to_pylist() == [{"id": i, "tags": [f"t{i}"] * i} for i in range(4)]


# ---- unknown ids, against a broker's registry ----------------------------------------------------


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from brokerkit import free_port, serving_broker

    port = free_port()
    data: Path = tmp_path_factory.mktemp("decoder") / "data"
    with serving_broker(data, ["--schema-registry-listen", f"127.0.0.1:{port}"]):
        yield f"http://127.0.0.1:{port}"


def test_unknown_schema_id_is_asked_again(registry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry})
    first = client.register_schema("late-value", Schema(json.dumps(V2), "AVRO"))
    decoder = Decoder(resolve_reader(typed.RegistryClient(registry), "late", "value", Format.AVRO))
    _, arrow_type = _decoder({first: V2}, first)
    late_id = first + 1  # the registry's next id: V1, registered after the first miss
    record = pa.array([_wire(late_id, V1, _event(1, 1))], pa.binary())
    clock = [1000.0]
    monkeypatch.setattr(typed, "_now", lambda: clock[0])
    _, _, errors = _decode(decoder, record, arrow_type)
    assert "HTTP 404" in str(errors[0])
    assert client.register_schema("late-other-value", Schema(json.dumps(V1), "AVRO")) == late_id
    clock[0] += typed.UNKNOWN_ID_RETRY_S - 1
    assert "HTTP 404" in str(_decode(decoder, record, arrow_type)[2][0])  # still cached
    clock[0] += 2
    got, ids, errors = _decode(decoder, record, arrow_type)
    assert errors == [None] and ids.to_pylist() == [late_id]
    assert got[0].as_py()["name"] == "n1-é"


def test_a_promotion_the_columns_cannot_cast_reads_record_at_a_time() -> None:
    writer = {"type": "record", "name": "P", "fields": [{"name": "b", "type": "bytes"}, {"name": "i", "type": "int"}]}
    reader = {"type": "record", "name": "P", "fields": [{"name": "b", "type": "string"}, {"name": "i", "type": "float"}]}
    decoder, arrow_type = _decoder({1: writer, 2: reader}, 2)
    column = pa.array([_wire(1, writer, {"b": b"ok", "i": (1 << 24) + 1}), _wire(1, writer, {"b": b"\xff", "i": 1})])
    got, _, errors = _decode(decoder, column, arrow_type)
    want, want_errors = _one_at_a_time(decoder, column, arrow_type)
    assert errors == want_errors and errors[0] is None and "UnicodeDecodeError" in str(errors[1])
    assert got[0].as_py() == want[0].as_py() == {"b": "ok", "i": float(1 << 24)}  # float32's nearest
