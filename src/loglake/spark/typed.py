"""Typed reads: keys and values in Confluent's wire format decoded with the schema registry.

With the source options `valueFormat`/`keyFormat` (`avro`, `json-schema` or `protobuf`) and
`schemaRegistryUrl`, the `value` (`key`) column is a struct of the subject's latest version (the
reader schema), fixed when the query is planned; each record is decoded with the schema its
wire-format id names (the writer schema), fetched once per Python worker. Confluent's wire format:
byte 0 is 0, bytes 1-4 the schema id (big-endian), then the Avro binary datum, the JSON text,
or (Protobuf) the message indexes (a zig-zag varint count and that many indexes; a single 0 byte
for the file's first message) and the message.

Avro records written with an older version are resolved to the reader schema by Avro's rules:
fields the writer lacks read as their default. The records of a batch with one schema id are
decoded together into Arrow columns (loglake.spark.avro_columns); schemas that module does not
read (arrays, maps, decimals) and records it cannot parse go through fastavro a record at a
time, which gives a failing record its reason. JSON Schema values are validated against their
writer schema and read by field name. Protobuf messages are parsed with the writer's descriptor
(a serialized FileDescriptorProto, or .proto text turned into one by
loglake.spark.proto_descriptor) and read by field name. An id the registry does not know is
asked for again after UNKNOWN_ID_RETRY_S.

A record that cannot be decoded (no magic byte, an id the registry does not know, a datum that
does not parse or does not fit the reader's types) is kept, with null in the typed column,
`decode_error` saying why and its bytes in `undecoded_key`/`undecoded_value`; a null value (a
tombstone) is no error. The subject is TopicNameStrategy's: `<topic>-value` / `<topic>-key`.

Plain Python: the Spark types are Spark's JSON form (`StructType.fromJson`), so nothing here
needs pyspark; fastavro, jsonschema and protobuf are imported when a decoder is made.
"""

from __future__ import annotations

import base64
import enum
import io
import json
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

from loglake.errors import LoglakeError
from loglake.registry.formats import SchemaType

if TYPE_CHECKING:
    import pyarrow as pa

    from loglake.spark.avro_columns import Plan

__all__ = [
    "DECODE_ERROR",
    "SCHEMA_ID_COLUMNS",
    "UNDECODED_COLUMNS",
    "Decoder",
    "Format",
    "ReaderSpec",
    "RegistryClient",
    "TypedColumnsError",
    "decode_batch",
    "decoder_for",
    "resolve_reader",
    "subject_of",
]


class Format(enum.StrEnum):
    """Values of the source options valueFormat / keyFormat."""

    AVRO = "avro"
    JSON_SCHEMA = "json-schema"
    PROTOBUF = "protobuf"


#: The registry's schemaType of each format.
SCHEMA_TYPES: dict[Format, SchemaType] = {
    Format.AVRO: SchemaType.AVRO,
    Format.JSON_SCHEMA: SchemaType.JSON,
    Format.PROTOBUF: SchemaType.PROTOBUF,
}
#: The format a registry schemaType is read with (`pipeline export --value-format registry`).
FORMAT_OF: dict[SchemaType, Format] = {t: f for f, t in SCHEMA_TYPES.items()}

#: Confluent's wire format: magic byte, then the 4-byte big-endian schema id.
MAGIC = 0
HEADER = 5
#: Columns a typed read adds (after the source's own): the schema id each record was written
#: with, why a record could not be decoded (null when it was), and its bytes as received when not.
SCHEMA_ID_COLUMNS = {"key": "key_schema_id", "value": "value_schema_id"}
DECODE_ERROR = "decode_error"
UNDECODED_COLUMNS = {"key": "undecoded_key", "value": "undecoded_value"}
#: The file name a protobuf schema registered as .proto text gets in its descriptor pool.
PROTO_FILE_NAME = "schema.proto"
#: Seconds one registry request may take.
REGISTRY_TIMEOUT_S = 30.0
#: Seconds a schema id the registry does not know reads as unknown before it is asked again.
UNKNOWN_ID_RETRY_S = 30.0
_now = time.monotonic  # the clock of UNKNOWN_ID_RETRY_S (tests move it)


class TypedColumnsError(LoglakeError):
    """The registry cannot give a reader schema, or it has types Spark columns cannot take."""


class UndecodableError(Exception):
    """One record cannot be decoded: the message is its reason."""


def subject_of(topic: str, field: str) -> str:
    """TopicNameStrategy: the subject of `topic`'s keys ("key") or values ("value")."""
    return f"{topic}-{field}"


# ---- the registry over HTTP --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    schema_id: int
    schema_type: SchemaType
    text: str
    version: int = 0
    has_references: bool = False


class RegistryClient:
    """The few GETs a typed read needs, with credentials from the URL's user info (Basic)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TypedColumnsError(f"schemaRegistryUrl must be an http(s):// URL, not {url!r}")
        self._auth: str | None = None
        if parts.username is not None:
            from urllib.parse import unquote

            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self._auth = "Basic " + base64.b64encode(token).decode()
        netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
        self.url = urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def _get(self, path: str) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, headers={"Accept": "application/json"})
        if self._auth:
            req.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(req, timeout=REGISTRY_TIMEOUT_S) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("message", "")
            except (ValueError, AttributeError):
                message = ""
            said = f"registry {self.url}{path}: HTTP {exc.code} {message}".rstrip()
            if exc.code == HTTPStatus.NOT_FOUND:  # the registry has no such schema: the record cannot be read
                raise UndecodableError(said) from None
            # anything else (refused, unavailable) fails the task rather than dead-lettering records
            raise TypedColumnsError(said) from None
        except (OSError, ValueError) as exc:
            raise TypedColumnsError(f"registry {self.url}{path}: {exc}") from None
        if not isinstance(doc, dict):
            raise TypedColumnsError(f"registry {self.url}{path}: not a JSON object")
        return doc

    def _schema(self, doc: Mapping[str, Any], schema_id: int) -> RegisteredSchema:
        return RegisteredSchema(
            schema_id,
            SchemaType(doc.get("schemaType") or SchemaType.AVRO),
            str(doc["schema"]),
            int(doc.get("version", 0)),
            bool(doc.get("references")),
        )

    def by_id(self, schema_id: int) -> RegisteredSchema:
        return self._schema(self._get(f"/schemas/ids/{schema_id}"), schema_id)

    def latest(self, subject: str) -> RegisteredSchema:
        try:
            doc = self._get(f"/subjects/{quote(subject, safe='')}/versions/latest")
        except UndecodableError as exc:
            raise TypedColumnsError(f"no reader schema for subject {subject!r}: {exc}") from None
        return self._schema(doc, int(doc["id"]))


# ---- reader schemas as Spark types (Spark's JSON form) ---------------------------------------------

SparkType = Any  # Spark's JSON form of a data type: a name ("long") or a dict

_AVRO_PRIMITIVES: dict[str, str] = {
    "boolean": "boolean",
    "int": "integer",
    "long": "long",
    "float": "float",
    "double": "double",
    "bytes": "binary",
    "string": "string",
}
#: Avro logical types read as their underlying type: fastavro would hand out Python objects
#: (uuid.UUID, datetime.time) Spark has no column for.
_PLAIN_LOGICAL = ("uuid", "time-millis", "time-micros")


def _field(name: str, data_type: SparkType) -> dict[str, Any]:
    # every field nullable: a value of an older version, or a new optional field, may be null,
    # and an Iceberg table can only gain optional columns
    return {"name": name, "type": data_type, "nullable": True, "metadata": {}}


def _strip_logical(doc: Any) -> Any:
    """The Avro schema with the logical types of _PLAIN_LOGICAL taken off (read as their base)."""
    if isinstance(doc, list):
        return [_strip_logical(d) for d in doc]
    if isinstance(doc, dict):
        out = {k: _strip_logical(v) for k, v in doc.items()}
        if out.get("logicalType") in _PLAIN_LOGICAL:
            del out["logicalType"]
        return out
    return doc


#: Avro timestamp logical types -> microseconds per unit.
_TIMESTAMP_UNITS = {
    "timestamp-millis": 1000, "timestamp-micros": 1, "local-timestamp-millis": 1000, "local-timestamp-micros": 1,
}  # fmt: skip


def _raw_timestamps(doc: Any) -> tuple[Any, dict[str, int]]:
    """(the record schema with its top-level timestamp fields read as plain longs, those fields'
    microseconds per unit): Arrow turns a column of integers into timestamps many times faster
    than one of datetime objects. Nested timestamps stay fastavro's datetimes."""
    if not (isinstance(doc, dict) and doc.get("type") == "record"):
        return doc, {}
    units: dict[str, int] = {}
    fields = []
    for f in doc["fields"]:
        t = f["type"]
        branches = t if isinstance(t, list) else [t]
        stripped = []
        for b in branches:
            if isinstance(b, dict) and b.get("type") == "long" and b.get("logicalType") in _TIMESTAMP_UNITS:
                units[f["name"]] = _TIMESTAMP_UNITS[b["logicalType"]]
                b = {k: v for k, v in b.items() if k != "logicalType"}
            stripped.append(b)
        fields.append({**f, "type": stripped if isinstance(t, list) else stripped[0]})
    return {**doc, "fields": fields}, units


def avro_spark_type(schema: Any, named: dict[str, Any] | None = None, namespace: str = "") -> SparkType:
    """The Spark type of an Avro schema (JSON document): records are structs, a union of null and
    one type is that type (nullable), enums are strings, fixed is binary, logical types date,
    timestamp-millis/micros (timestamp), local-timestamp-* (timestamp_ntz) and decimal map to
    Spark's; uuid reads as a string, time-millis/micros as their int/long."""
    named = {} if named is None else named
    if isinstance(schema, str):
        if schema in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[schema]
        if schema == "null":
            raise TypedColumnsError("an Avro null outside a union has no Spark column")
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        for name in (full, schema):
            if name in named:
                if named[name] is None:
                    raise TypedColumnsError(f"the Avro type {name} is recursive: Spark columns cannot be")
                return named[name]
        raise TypedColumnsError(f"unknown Avro type {schema!r}")
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise TypedColumnsError(
                f"the Avro union {json.dumps(schema)} has no Spark column (only a union of null and one type has)"
            )
        return avro_spark_type(branches[0], named, namespace)
    if not isinstance(schema, dict):
        raise TypedColumnsError(f"not an Avro schema: {schema!r}")
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        if precision > 38:
            raise TypedColumnsError(f"decimal({precision},{scale}) is wider than Spark's decimals (38 digits)")
        out: SparkType = f"decimal({precision},{scale})"
    elif logical == "date" and kind == "int":
        return "date"
    elif logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return "timestamp"
    elif logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return "timestamp_ntz"
    elif kind == "record" or kind == "error":
        ns = schema.get("namespace", namespace)
        name = schema["name"] if "." in schema["name"] or not ns else f"{ns}.{schema['name']}"
        named[name] = None  # a reference to itself inside is recursion
        fields = [_field(f["name"], avro_spark_type(f["type"], named, ns)) for f in schema["fields"]]
        out = {"type": "struct", "fields": fields}
    elif kind == "enum":
        out = "string"
    elif kind == "fixed":
        out = "binary"
    elif kind == "array":
        return {"type": "array", "elementType": avro_spark_type(schema["items"], named, namespace), "containsNull": True}
    elif kind == "map":
        value = avro_spark_type(schema["values"], named, namespace)
        return {"type": "map", "keyType": "string", "valueType": value, "valueContainsNull": True}
    else:
        return avro_spark_type(kind, named, namespace)
    if kind in ("record", "error", "enum", "fixed"):
        ns = schema.get("namespace", namespace)
        name = schema["name"] if "." in schema["name"] or not ns else f"{ns}.{schema['name']}"
        named[name] = out
    return out


def _json_ref(root: Mapping[str, Any], ref: str) -> Any:
    if ref == "#":  # the schema itself
        return root
    if not ref.startswith("#/"):
        raise TypedColumnsError(f"JSON Schema $ref {ref!r} is not local to the schema")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def json_schema_spark_type(schema: Any, root: Mapping[str, Any] | None = None, depth: int = 0) -> SparkType:
    """The Spark type of a JSON Schema: objects with `properties` are structs (one field a
    property), arrays of `items` arrays, integer long, number double, a type list with null the
    other type; a local `$ref` is followed; anything else (no type, several types) is a string
    holding the JSON text."""
    root = schema if root is None else root
    if depth > 32:
        raise TypedColumnsError("the JSON Schema is recursive: Spark columns cannot be")
    if not isinstance(schema, dict):
        return "string"
    if "$ref" in schema:
        return json_schema_spark_type(_json_ref(root, schema["$ref"]), root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        kind = rest[0] if len(rest) == 1 else None
    for combo in ("oneOf", "anyOf"):
        if kind is None and combo in schema:
            rest = [s for s in schema[combo] if not (isinstance(s, dict) and s.get("type") == "null")]
            if len(rest) == 1:
                return json_schema_spark_type(rest[0], root, depth + 1)
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties")
        if not props:
            return {"type": "map", "keyType": "string", "valueType": "string", "valueContainsNull": True}
        return {
            "type": "struct",
            "fields": [_field(n, json_schema_spark_type(s, root, depth + 1)) for n, s in props.items()],
        }
    if kind == "array":
        items = json_schema_spark_type(schema.get("items", {}), root, depth + 1)
        return {"type": "array", "elementType": items, "containsNull": True}
    return {"integer": "long", "number": "double", "boolean": "boolean", "string": "string"}.get(str(kind), "string")


# Protobuf field types (FieldDescriptor.TYPE_*) -> Spark types
_PROTO_SCALARS = {
    1: "double", 2: "float", 3: "long", 4: "long", 5: "integer", 6: "long", 7: "integer", 8: "boolean",
    9: "string", 12: "binary", 13: "long", 14: "string", 15: "integer", 16: "long", 17: "integer", 18: "long",
}  # fmt: skip
_TYPE_MESSAGE = 11
_TYPE_ENUM = 14


def protobuf_spark_type(message: Any, depth: int = 0) -> SparkType:
    """The Spark type of a protobuf message Descriptor: fields by name, repeated as arrays, maps
    as maps, enums as their value names, 64-bit unsigned as long, nested messages as structs."""
    if depth > 32:
        raise TypedColumnsError(f"the protobuf message {message.full_name} is recursive: Spark columns cannot be")
    fields = []
    for f in message.fields:
        if f.type == _TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            data_type: SparkType = {
                "type": "map",
                "keyType": _proto_field_type(key_f, depth),
                "valueType": _proto_field_type(value_f, depth),
                "valueContainsNull": True,
            }
        else:
            data_type = _proto_field_type(f, depth)
            if _is_repeated(f):
                data_type = {"type": "array", "elementType": data_type, "containsNull": True}
        fields.append(_field(f.name, data_type))
    return {"type": "struct", "fields": fields}


def _is_repeated(f: Any) -> bool:
    return bool(getattr(f, "is_repeated", None) if hasattr(f, "is_repeated") else f.label == 3)


def _proto_field_type(f: Any, depth: int) -> SparkType:
    if f.type == _TYPE_MESSAGE:
        return protobuf_spark_type(f.message_type, depth + 1)
    return _PROTO_SCALARS[f.type]


# ---- reader specs (driver) and decoders (executors) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class ReaderSpec:
    """What one typed column is read as, fixed on the driver when the query is planned."""

    field: str  # "key" or "value"
    format: Format
    subject: str
    registry_url: str
    #: the reader schema: the subject's latest version when planned
    schema_id: int
    version: int
    text: str
    #: Spark's JSON form of the column's type
    spark_type: str
    #: the value's type is no struct: the column is a struct of one field `value` holding it
    wrapped: bool = False

    @property
    def column_type(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.spark_type)
        return doc


def _protobuf_pool(text: str) -> tuple[Any, Any]:
    """(the file's descriptor, its pool) of a protobuf schema as the registry holds it: a base64
    FileDescriptorProto (confluent-kafka's serializer registers that) or .proto text (turned into
    one by loglake.spark.proto_descriptor)."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    from loglake.registry.formats import _looks_base64
    from loglake.spark.proto_descriptor import ProtoTextError, file_descriptor, imports_of

    pool = descriptor_pool.DescriptorPool()
    from google.protobuf import descriptor_pb2 as builtins

    if _looks_base64(text):
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))
        dependencies = list(proto.dependency)
    else:
        try:
            dependencies = imports_of(text)
        except ProtoTextError as exc:
            raise TypedColumnsError(str(exc)) from None
    for dep in dependencies:  # the well-known types the schema imports
        if dep.startswith("google/protobuf/"):
            module = dep.removeprefix("google/protobuf/").removesuffix(".proto") + "_pb2"
            import importlib

            try:
                pb2 = importlib.import_module(f"google.protobuf.{module}")
            except ImportError:
                raise TypedColumnsError(f"protobuf import {dep} is not available") from None
            file_proto = builtins.FileDescriptorProto()
            pb2.DESCRIPTOR.CopyToProto(file_proto)
            pool.Add(file_proto)
        else:
            raise TypedColumnsError(f"protobuf schema imports {dep}: schema references are not read yet")
    if not _looks_base64(text):
        try:
            proto = file_descriptor(text, PROTO_FILE_NAME, pool)
        except ProtoTextError as exc:
            raise TypedColumnsError(str(exc)) from None
    try:
        return pool.Add(proto), pool
    except TypeError as exc:  # the pool refuses a descriptor that does not hold together
        raise TypedColumnsError(f"protobuf schema: {exc}") from None


def resolve_reader(registry: RegistryClient, topic: str, field: str, fmt: Format) -> ReaderSpec:
    """The reader spec of `topic`'s keys or values: the latest version of its subject, checked to
    be of `fmt`, and its Spark type."""
    subject = subject_of(topic, field)
    latest = registry.latest(subject)
    if latest.schema_type != SCHEMA_TYPES[fmt]:
        raise TypedColumnsError(
            f"subject {subject!r} holds {latest.schema_type} schemas, not {SCHEMA_TYPES[fmt]} ({field}Format={fmt})"
        )
    if latest.has_references:
        raise TypedColumnsError(f"subject {subject!r}: schemas with references are not read yet")
    try:
        if fmt == Format.AVRO:
            spark_type = avro_spark_type(_strip_logical(json.loads(latest.text)))
        elif fmt == Format.JSON_SCHEMA:
            spark_type = json_schema_spark_type(json.loads(latest.text))
        else:
            file_desc, _ = _protobuf_pool(latest.text)
            spark_type = protobuf_spark_type(next(iter(file_desc.message_types_by_name.values())))
    except (KeyError, TypeError, ValueError) as exc:
        raise TypedColumnsError(f"subject {subject!r} version {latest.version}: {exc!r}") from None
    wrapped = field == "value" and not (isinstance(spark_type, dict) and spark_type.get("type") == "struct")
    if wrapped:
        spark_type = {"type": "struct", "fields": [_field("value", spark_type)]}
    return ReaderSpec(
        field, fmt, subject, registry.url, latest.schema_id, latest.version, latest.text, json.dumps(spark_type), wrapped
    )


def _header(raw: bytes) -> int:
    if len(raw) < HEADER or raw[0] != MAGIC:
        raise UndecodableError("not in Confluent's wire format (no magic byte 0 and schema id)")
    schema_id: int = struct.unpack_from(">i", raw, 1)[0]
    return schema_id


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(raw):
            raise UndecodableError("truncated protobuf message indexes")
        b = raw[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos  # zig-zag
        shift += 7
        if shift > 63:
            raise UndecodableError("bad varint in protobuf message indexes")


class Decoder:
    """Decodes one typed column's bytes on an executor: writer schemas by id, cached."""

    def __init__(self, spec: ReaderSpec) -> None:
        self.spec = spec
        self.registry = RegistryClient(spec.registry_url)
        #: writer schemas' decode functions by id; with the monotonic time an unknown id's entry
        #: expires (None: kept for the worker's life)
        self._writers: dict[int, tuple[Callable[[bytes], Any], float | None]] = {}
        #: the registry's writer schemas by id (the ids it knows)
        self._found: dict[int, RegisteredSchema] = {}
        #: Avro: the columnar plan of each writer schema id (None: read a record at a time)
        self._plans: dict[int, Plan | None] = {}
        self._lock = threading.Lock()
        self._reader: Any = None
        self._reader_doc: Any = None
        #: top-level fields decoded as integers of this many microseconds (Avro timestamps)
        self.timestamp_units: dict[str, int] = {}
        if spec.format == Format.AVRO:
            import fastavro

            self._reader_doc = _strip_logical(json.loads(spec.text))
            reader_doc, self.timestamp_units = _raw_timestamps(self._reader_doc)
            self._reader = fastavro.parse_schema(reader_doc)

    def _writer(self, schema_id: int) -> Callable[[bytes], Any]:
        entry = self._writers.get(schema_id)
        if entry is not None and (entry[1] is None or entry[1] > _now()):
            return entry[0]
        with self._lock:
            entry = self._writers.get(schema_id)
            if entry is None or (entry[1] is not None and entry[1] <= _now()):
                entry = self._make_writer(schema_id)
                self._writers[schema_id] = entry
        return entry[0]

    def _make_writer(self, schema_id: int) -> tuple[Callable[[bytes], Any], float | None]:
        try:
            found = self.registry.by_id(schema_id)
        except UndecodableError as exc:
            reason = f"schema id {schema_id}: {exc}"

            def unknown(payload: bytes) -> Any:
                raise UndecodableError(reason)

            # the id may be registered later (a producer registers before it writes, but a
            # registry replica may lag): asked again once this has passed
            return unknown, _now() + UNKNOWN_ID_RETRY_S
        self._found[schema_id] = found
        return self._make_known(found), None

    def _make_known(self, found: RegisteredSchema) -> Callable[[bytes], Any]:
        schema_id = found.schema_id
        if found.schema_type != SCHEMA_TYPES[self.spec.format]:
            reason = f"schema id {schema_id} is a {found.schema_type} schema, not {SCHEMA_TYPES[self.spec.format]}"

            def mismatch(payload: bytes) -> Any:
                raise UndecodableError(reason)

            return mismatch
        if self.spec.format == Format.AVRO:
            return self._avro(found)
        if self.spec.format == Format.JSON_SCHEMA:
            return self._json(found)
        return self._protobuf(found)

    def _avro(self, found: RegisteredSchema) -> Callable[[bytes], Any]:
        import fastavro
        from fastavro.read import SchemaResolutionError

        writer = fastavro.parse_schema(_raw_timestamps(_strip_logical(json.loads(found.text)))[0])
        reader = self._reader
        same = found.schema_id == self.spec.schema_id

        def decode(payload: bytes) -> Any:
            bio = io.BytesIO(payload)
            bio.seek(HEADER)
            try:
                out = fastavro.schemaless_reader(bio, writer, None if same else reader)
            except SchemaResolutionError as exc:
                raise UndecodableError(f"schema id {found.schema_id} cannot be read as version {self.spec.version}: {exc}") from None
            except (EOFError, ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError, OverflowError) as exc:
                raise UndecodableError(f"corrupt Avro datum (schema id {found.schema_id}): {type(exc).__name__}: {exc}") from None
            if bio.tell() != len(payload):
                raise UndecodableError(
                    f"corrupt Avro datum (schema id {found.schema_id}): {len(payload) - bio.tell()} bytes after it"
                )
            return out

        return decode

    def _json(self, found: RegisteredSchema) -> Callable[[bytes], Any]:
        import jsonschema

        doc = json.loads(found.text)
        validator = jsonschema.validators.validator_for(doc)(doc)

        def decode(payload: bytes) -> Any:
            try:
                value = json.loads(payload[HEADER:])
            except ValueError as exc:
                raise UndecodableError(f"not JSON (schema id {found.schema_id}): {exc}") from None
            error = jsonschema.exceptions.best_match(validator.iter_errors(value))
            if error is not None:
                raise UndecodableError(f"does not match schema id {found.schema_id}: {error.message}")
            return value

        return decode

    def _protobuf(self, found: RegisteredSchema) -> Callable[[bytes], Any]:
        from google.protobuf import message_factory

        try:
            file_desc, _ = _protobuf_pool(found.text)
        except TypedColumnsError as exc:
            reason = str(exc)

            def unreadable(payload: bytes) -> Any:
                raise UndecodableError(reason)

            return unreadable
        top = list(file_desc.message_types_by_name.values())

        def decode(payload: bytes) -> Any:
            count, pos = _read_varint(payload, HEADER)
            indexes = [0]
            if count:
                indexes = []
                for _ in range(count):
                    idx, pos = _read_varint(payload, pos)
                    indexes.append(idx)
            try:
                desc = top[indexes[0]]
                for idx in indexes[1:]:
                    desc = desc.nested_types[idx]
            except IndexError:
                raise UndecodableError(f"message indexes {indexes} name no message of schema id {found.schema_id}") from None
            msg = message_factory.GetMessageClass(desc)()
            try:
                msg.ParseFromString(payload[pos:])
            except Exception as exc:  # protobuf's DecodeError (a Message.Error subclass per backend)
                raise UndecodableError(f"corrupt protobuf message (schema id {found.schema_id}): {exc}") from None
            return _proto_dict(msg)

        return decode

    def decode(self, raw: bytes | None) -> tuple[Any, int | None]:
        """(the value, its schema id); None for a null. Raises UndecodableError."""
        if raw is None:
            return None, None
        schema_id = _header(raw)
        value = self._writer(schema_id)(raw)
        if self.spec.wrapped:
            value = {"value": value}
        return value, schema_id

    def _plan(self, schema_id: int, arrow_type: pa.DataType) -> Plan | None:
        """The columnar plan of an Avro writer schema id (None: its records are read one at a
        time, which also says why an unknown or unreadable one fails)."""
        if schema_id in self._plans:
            return self._plans[schema_id]
        self._writer(schema_id)  # fetched (or found unknown, for a while) once
        found = self._found.get(schema_id)
        if found is None:
            return None  # not cached: an unknown id is asked again after UNKNOWN_ID_RETRY_S
        from loglake.spark.avro_columns import Unsupported, compile_plan

        plan: Plan | None = None
        if found.schema_type == SchemaType.AVRO:
            try:
                writer_doc = _strip_logical(json.loads(found.text))
                plan = compile_plan(writer_doc, self._reader_doc, arrow_type, self.spec.wrapped)
            except (Unsupported, KeyError, TypeError, ValueError):
                plan = None
        self._plans[schema_id] = plan
        return plan

    def decode_column(
        self, column: pa.Array, arrow_type: pa.DataType
    ) -> tuple[pa.Array, pa.Array, dict[int, str]]:
        """(the typed column of `column`'s bytes, their schema ids, why the records that could
        not be decoded could not, by row). Avro records of a schema id with a columnar plan are decoded a
        batch at a time (loglake.spark.avro_columns); the rest, and any that plan cannot
        read, a record at a time."""
        import numpy as np
        import pyarrow as pa

        from loglake.spark.avro_columns import PAD

        n = len(column)
        if self.spec.format != Format.AVRO or n == 0:
            values, found_ids, errs = self.decode_all(column.to_pylist())
            typed = _column(values, errs, arrow_type, self.spec.field, self.timestamp_units)
            return typed, pa.array(found_ids, pa.int32()), {i: e for i, e in enumerate(errs) if e is not None}
        if pa.types.is_large_binary(column.type):
            column = column.cast(pa.binary())
        bufs = column.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int32)[column.offset : column.offset + n + 1].astype(np.int64)
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        data = np.concatenate([data, np.zeros(PAD, np.uint8)])  # one copy: every plan reads it
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        starts = offsets[:-1]
        framed = valid & (offsets[1:] - starts >= HEADER) & (data[starts] == MAGIC)
        at = np.where(framed, starts, 0)
        ids = (
            (data[at + 1].astype(np.int64) << 24) | (data[at + 2].astype(np.int64) << 16)
            | (data[at + 3].astype(np.int64) << 8) | data[at + 4].astype(np.int64)
        )  # fmt: skip
        ids = np.where(ids >= 1 << 31, ids - (1 << 32), ids)  # the id is a signed int (as _header reads it)
        parts: list[tuple[Any, pa.Array]] = []
        slow = [np.flatnonzero(valid & ~framed)]
        for schema_id in np.unique(ids[framed]).tolist():
            rows = np.flatnonzero(framed & (ids == schema_id))
            plan = self._plan(int(schema_id), arrow_type)
            if plan is None:
                slow.append(rows)
                continue
            try:
                typed, bad = plan.decode(data, starts[rows] + HEADER, offsets[rows + 1])
            except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, OverflowError):
                # a cast the plan's columns cannot make (bytes that are no UTF-8 read as a
                # string, an int a float32 cannot hold exactly): fastavro's way, with its reasons
                slow.append(rows)
                continue
            if bad.any():
                slow.append(rows[bad])
                typed, rows = typed.filter(pa.array(~bad)), rows[~bad]
            parts.append((rows, typed))
        errors: dict[int, str] = {}
        slow_rows = np.concatenate(slow)
        if slow_rows.size:
            slow_rows.sort()
            raws = column.take(pa.array(slow_rows)).to_pylist()
            values, _, errs = self.decode_all(raws)
            parts.append((slow_rows, _column(values, errs, arrow_type, self.spec.field, self.timestamp_units)))
            for i, e in zip(slow_rows.tolist(), errs, strict=True):
                if e is not None:
                    errors[i] = e
        index = np.full(n, -1, dtype=np.int64)
        base = 0
        for rows, _ in parts:
            index[rows] = np.arange(base, base + rows.size, dtype=np.int64)
            base += rows.size
        joined = pa.concat_arrays([typed for _, typed in parts]) if parts else pa.nulls(0, arrow_type)
        out = joined.take(pa.array(index, mask=index < 0))
        return out, pa.array(ids.astype(np.int32), mask=~framed), errors

    def decode_all(self, raws: Sequence[bytes | None]) -> tuple[list[Any], list[int | None], list[str | None]]:
        values: list[Any] = []
        ids: list[int | None] = []
        errors: list[str | None] = []
        for raw in raws:
            try:
                value, schema_id = self.decode(raw)
            except UndecodableError as exc:
                values.append(None)
                ids.append(_id_or_none(raw))
                errors.append(f"{self.spec.field}: {exc}")
                continue
            values.append(value)
            ids.append(schema_id)
            errors.append(None)
        return values, ids, errors


def _proto_value(f: Any, v: Any) -> Any:
    if f.type == _TYPE_MESSAGE:
        return _proto_dict(v)
    if f.type == _TYPE_ENUM:
        known = f.enum_type.values_by_number.get(v)
        return known.name if known is not None else str(v)
    return v


def _proto_dict(msg: Any) -> dict[str, Any]:
    """A message as the dict of its Spark struct: unset message fields null, enums by name."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        v = getattr(msg, f.name)
        if f.type == _TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            value_f = f.message_type.fields_by_name["value"]
            out[f.name] = [(k, _proto_value(value_f, x)) for k, x in v.items()]
        elif _is_repeated(f):
            out[f.name] = [_proto_value(f, x) for x in v]
        elif f.type == _TYPE_MESSAGE and not msg.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = _proto_value(f, v)
    return out


def _id_or_none(raw: bytes | None) -> int | None:
    if raw is None or len(raw) < HEADER or raw[0] != MAGIC:
        return None
    schema_id: int = struct.unpack_from(">i", raw, 1)[0]
    return schema_id


#: Decoders of this Python worker by (registry, field, reader schema id): a worker runs many
#: tasks, and each writer schema is fetched once.
_DECODERS: dict[tuple[str, str, int, str], Decoder] = {}
_DECODERS_LOCK = threading.Lock()


def decoder_for(spec: ReaderSpec) -> Decoder:
    key = (spec.registry_url, spec.field, spec.schema_id, spec.format)
    with _DECODERS_LOCK:
        found = _DECODERS.get(key)
        if found is None or found.spec != spec:
            found = _DECODERS[key] = Decoder(spec)
        return found


def _column(
    values: list[Any], errors: list[str | None], arrow_type: pa.DataType, field: str, units: dict[str, int]
) -> pa.Array:
    """`values` as an Arrow array of `arrow_type`; a value that does not fit (a JSON value of
    another type than the reader's, a number out of range) becomes null with its reason."""
    import pyarrow as pa

    try:
        if pa.types.is_struct(arrow_type):
            return _struct_array(values, arrow_type, units)
        return pa.array(values, type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        pass
    for i, v in enumerate(values):
        if v is None:
            continue
        try:
            pa.array([v], type=arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
            values[i] = None
            if errors[i] is None:
                errors[i] = f"{field}: does not fit the column's type: {exc}"
    if pa.types.is_struct(arrow_type):
        return _struct_array(values, arrow_type, units)
    return pa.array(values, type=arrow_type)


def _struct_array(values: list[Any], arrow_type: pa.StructType, units: dict[str, int]) -> pa.Array:
    """`values` (dicts or None) as a struct array, built a field at a time: pyarrow converts a
    list of scalars per field about ten times faster than a list of dicts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fields = [arrow_type.field(i) for i in range(arrow_type.num_fields)]
    children = []
    for f in fields:
        column = [None if v is None else v.get(f.name) for v in values]
        unit = units.get(f.name)
        if unit is not None and pa.types.is_timestamp(f.type):
            ints = pa.array(column, type=pa.int64())
            children.append((pc.multiply_checked(ints, unit) if unit != 1 else ints).cast(f.type))
        else:
            children.append(pa.array(column, type=f.type))
    mask = pa.array([v is None for v in values], type=pa.bool_())
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def decode_batch(batch: pa.RecordBatch, specs: Sequence[ReaderSpec], schema: pa.Schema) -> pa.RecordBatch:
    """A batch of the source's columns with the typed columns of `specs`, in `schema`'s order
    (loglake.spark.source.typed_schema)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    out: dict[str, pa.Array] = {name: batch.column(name) for name in batch.schema.names}
    failures: dict[int, str] = {}  # by row: the first column's reason (key before value)
    for spec in specs:
        typed, ids, errs = decoder_for(spec).decode_column(batch.column(spec.field), schema.field(spec.field).type)
        for i, e in errs.items():
            failures.setdefault(i, e)
        out[spec.field] = typed
        out[SCHEMA_ID_COLUMNS[spec.field]] = ids
    if failures:
        # a record one column of which failed after the other decoded: null in both
        errors: list[str | None] = [None] * n
        for i, e in failures.items():
            errors[i] = e
        failed = pa.array([e is not None for e in errors])
        for spec in specs:
            out[spec.field] = pc.if_else(failed, pa.scalar(None, out[spec.field].type), out[spec.field])
        for field, name in UNDECODED_COLUMNS.items():
            raw = batch.column(field)
            out[name] = pc.if_else(failed, raw, pa.scalar(None, raw.type))
        out[DECODE_ERROR] = pa.array(errors, type=pa.string())
    else:
        for name in UNDECODED_COLUMNS.values():
            out[name] = pa.nulls(n, pa.binary())
        out[DECODE_ERROR] = pa.nulls(n, pa.string())
    return pa.RecordBatch.from_arrays([out[f.name] for f in schema], schema=schema)
