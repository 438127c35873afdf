"""Typed reads without Spark: the source's valueFormat/keyFormat/schemaRegistryUrl options and
their errors, and the Spark types (Spark's JSON form) Avro and JSON Schema reader schemas map to."""

from __future__ import annotations

from typing import Any

import pytest

from loglake.spark.options import LoglakeOptionError, TypedOptions, parse_typed_options
from loglake.spark.typed import (
    Format,
    RegistryClient,
    TypedColumnsError,
    avro_spark_type,
    json_schema_spark_type,
)

URL = "http://127.0.0.1:8081"


def _struct(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {
        "type": "struct",
        "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
    }


# ---- options --------------------------------------------------------------------------------------


def test_typed_options_parse() -> None:
    assert parse_typed_options({"subscribe": "t"}) is None
    got = parse_typed_options({"subscribe": " t ", "ValueFormat": "AVRO", "keyformat": "json-schema", "schemaRegistryUrl": URL})
    assert got == TypedOptions("t", Format.AVRO, Format.JSON_SCHEMA, URL)
    assign = parse_typed_options({"assign": '{"t2": [0, 1]}', "valueFormat": "protobuf", "schemaRegistryUrl": URL})
    assert assign == TypedOptions("t2", Format.PROTOBUF, None, URL)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"valueFormat": "xml", "schemaRegistryUrl": URL}, "option valueFormat must be one of avro, json-schema, protobuf, got 'xml'"),
        ({"keyFormat": "thrift", "schemaRegistryUrl": URL}, "option keyFormat must be one of"),
        ({"schemaRegistryUrl": URL}, "option schemaRegistryUrl is used only with valueFormat or keyFormat"),
        ({"valueFormat": "avro"}, "option schemaRegistryUrl is required with valueFormat/keyFormat"),
        ({"valueFormat": "avro", "schemaRegistryUrl": "127.0.0.1:8081"}, "must be an http(s):// URL, got '127.0.0.1:8081'"),
        ({"valueFormat": "avro", "schemaRegistryUrl": URL, "subscribe": "a,b"}, "valueFormat/keyFormat read one topic"),
    ],
)  # fmt: skip
def test_typed_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(LoglakeOptionError) as err:
        parse_typed_options({"subscribe": "t", **options})
    assert message in str(err.value)


def test_registry_url_user_info_becomes_basic_auth() -> None:
    client = RegistryClient("https://us%40r:p%3Ass@registry.example:8443/base/")
    assert client.url == "https://registry.example:8443/base"
    assert client._auth == "Basic dXNAcjpwOnNz"  # base64("us@r:p:ss")
    with pytest.raises(TypedColumnsError, match="must be an http"):
        RegistryClient("ftp://registry.example")


# ---- Avro -> Spark ----------------------------------------------------------------------------------


def test_avro_types() -> None:
    schema = {
        "type": "record", "name": "R", "namespace": "ns", "fields": [
            {"name": "b", "type": "boolean"}, {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
            {"name": "f", "type": "float"}, {"name": "d", "type": "double"}, {"name": "by", "type": "bytes"},
            {"name": "s", "type": "string"},
            {"name": "opt", "type": ["null", "string"]},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
            {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 2}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "lts", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
            {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
            {"name": "arr", "type": {"type": "array", "items": "E"}},
            {"name": "m", "type": {"type": "map", "values": ["null", "long"]}},
            {"name": "inner", "type": {"type": "record", "name": "In", "fields": [{"name": "x", "type": "ns.F"}]}},
        ],
    }  # fmt: skip
    assert avro_spark_type(schema) == _struct(
        ("b", "boolean"), ("i", "integer"), ("l", "long"), ("f", "float"), ("d", "double"), ("by", "binary"),
        ("s", "string"), ("opt", "string"), ("e", "string"), ("fx", "binary"), ("day", "date"), ("ts", "timestamp"),
        ("tsu", "timestamp"), ("lts", "timestamp_ntz"), ("dec", "decimal(10,2)"),
        ("arr", {"type": "array", "elementType": "string", "containsNull": True}),
        ("m", {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}),
        ("inner", _struct(("x", "binary"))),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("null", "an Avro null outside a union"),
        (["null", "int", "string"], "only a union of null and one type"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 0}, "wider than Spark's decimals"),
        ({"type": "record", "name": "L", "fields": [{"name": "next", "type": ["null", "L"]}]}, "recursive"),
        ("Nowhere", "unknown Avro type 'Nowhere'"),
    ],
)  # fmt: skip
def test_avro_types_spark_cannot_take(schema: Any, message: str) -> None:
    with pytest.raises(TypedColumnsError, match=message):
        avro_spark_type(schema)


# ---- JSON Schema -> Spark ------------------------------------------------------------------------


def test_json_schema_types() -> None:
    schema = {
        "type": "object",
        "definitions": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}},
        "properties": {
            "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"}, "s": {"type": "string"},
            "maybe": {"type": ["null", "integer"]},
            "either": {"oneOf": [{"type": "null"}, {"type": "string"}]},
            "list": {"type": "array", "items": {"type": "integer"}},
            "free": {"type": "object"},
            "any": {},
            "mixed": {"type": ["string", "integer"]},
            "p": {"$ref": "#/definitions/point"},
        },
    }  # fmt: skip
    assert json_schema_spark_type(schema) == _struct(
        ("i", "long"), ("n", "double"), ("b", "boolean"), ("s", "string"), ("maybe", "long"), ("either", "string"),
        ("list", {"type": "array", "elementType": "long", "containsNull": True}),
        ("free", {"type": "map", "keyType": "string", "valueType": "string", "valueContainsNull": True}),
        ("any", "string"), ("mixed", "string"), ("p", _struct(("x", "double"))),
    )  # fmt: skip


def test_json_schema_types_spark_cannot_take() -> None:
    with pytest.raises(TypedColumnsError, match="recursive"):
        json_schema_spark_type({"type": "object", "properties": {"self": {"$ref": "#"}}})
    with pytest.raises(TypedColumnsError, match="not local"):
        json_schema_spark_type({"type": "object", "properties": {"o": {"$ref": "other.json#/x"}}})
