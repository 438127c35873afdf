"""The three schema formats the registry takes, parsed with their own libraries.

* Avro: fastavro's `parse_schema` checks the schema (named types of referenced schemas given as
  `named_schemas`), and the Apache `avro` package parses it again for its schema-resolution
  compatibility checker (loglake.registry.compat). The stored text is the JSON written compactly
  (whitespace gone, defaults and docs kept: Confluent's form, not Avro's Parsing Canonical Form,
  which drops defaults).
* JSON Schema: jsonschema's validator for the schema's `$schema` (draft 7 when it names none)
  checks it; stored compactly as Avro is.
* Protobuf: the text of a .proto file, parsed by proto-schema-parser (a syntax error is an invalid
  schema), or, as confluent-kafka's ProtobufSerializer sends it, a base64 FileDescriptorProto,
  read by protobuf's descriptor_pb2. Both become a `ProtoFile` for the compatibility checks;
  the text is stored as sent.

A schema that does not parse raises InvalidSchemaError (the API answers INVALID_SCHEMA).
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

__all__ = [
    "InvalidSchemaError",
    "ParsedSchema",
    "ProtoField",
    "ProtoFile",
    "ProtoMessage",
    "SchemaType",
    "normalized",
    "parse_schema",
    "record_name",
]


class SchemaType(enum.StrEnum):
    """Confluent's `schemaType` names (AVRO when a request names none)."""

    AVRO = "AVRO"
    JSON = "JSON"
    PROTOBUF = "PROTOBUF"


class InvalidSchemaError(ValueError):
    """The schema text does not parse as its type."""


@dataclass(frozen=True, slots=True)
class ProtoField:
    name: str
    number: int
    #: "optional", "required", "repeated" or "" (proto3 without a label)
    label: str
    #: a scalar's name ("int32", ...) or a named type (message or enum) with the package's prefix
    #: and any leading dot taken off; maps are "map<key,value>"
    type: str
    oneof: str | None = None


@dataclass(slots=True)
class ProtoMessage:
    fields: dict[int, ProtoField] = field(default_factory=dict)


@dataclass(slots=True)
class ProtoFile:
    package: str = ""
    syntax: str = "proto2"
    #: full name (package left off) -> message; nested ones as "Outer.Inner"
    messages: dict[str, ProtoMessage] = field(default_factory=dict)
    #: full name -> its value names
    enums: dict[str, set[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ParsedSchema:
    schema_type: SchemaType
    #: the text stored and answered
    text: str
    #: AVRO: avro.schema.Schema; JSON: the schema document; PROTOBUF: a ProtoFile
    parsed: Any


#: A referenced schema as the parse needs it: (name as referenced, its parsed schema).
Reference = tuple[str, ParsedSchema]


def record_name(schema: ParsedSchema) -> str | None:
    """The name Confluent's RecordNameStrategy gives a schema's records: an Avro named type's full
    name, a JSON schema's `title`, a Protobuf file's first message (with its package); None when
    the schema has none (a subject cannot be named from it)."""
    if schema.schema_type is SchemaType.AVRO:
        name = getattr(schema.parsed, "fullname", None)
        return name if isinstance(name, str) and name else None
    if schema.schema_type is SchemaType.JSON:
        title = schema.parsed.get("title") if isinstance(schema.parsed, dict) else None
        return title if isinstance(title, str) and title else None
    proto: ProtoFile = schema.parsed
    first = next((m for m in proto.messages if "." not in m), None)
    if first is None:
        return None
    return f"{proto.package}.{first}" if proto.package else first


def parse_schema(schema_type: SchemaType, text: str, refs: Sequence[Reference] = ()) -> ParsedSchema:
    if schema_type is SchemaType.AVRO:
        return _parse_avro(text, refs)
    names = {name for name, _ in refs}
    if schema_type is SchemaType.JSON:
        return _parse_json(text, names)
    return _parse_protobuf(text, names)


def normalized(schema: ParsedSchema) -> ParsedSchema:
    """`schema` with its text in normal form (Confluent's ``?normalize=true``), so that schemas
    written differently but meaning the same are one schema: Avro as the avro package writes it
    back (names resolved, each named type defined once) and JSON Schema as it was read, both with
    their keys sorted and written compactly; Protobuf `.proto` text as proto-schema-parser's
    generator writes its syntax tree (a base64 descriptor is left as sent)."""
    if schema.schema_type is SchemaType.AVRO:
        text = json.dumps(schema.parsed.to_json(), separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    elif schema.schema_type is SchemaType.JSON:
        text = json.dumps(schema.parsed, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    elif _looks_base64(schema.text):
        return schema
    else:
        from proto_schema_parser.generator import Generator
        from proto_schema_parser.parser import Parser

        text = Generator().generate(Parser().parse(schema.text))
    return ParsedSchema(schema.schema_type, text, schema.parsed)


def _json_doc(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSchemaError(f"Invalid schema: the {what} schema is not JSON: {exc}") from None


def _compact(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _parse_avro(text: str, refs: Sequence[Reference]) -> ParsedSchema:
    import avro.errors
    import avro.name
    import avro.schema
    import fastavro

    doc = _json_doc(text, "Avro")
    named: dict[str, Any] = {}
    names = avro.name.Names()
    try:
        for _, ref in refs:
            fastavro.parse_schema(json.loads(ref.text), named_schemas=named)
            avro.schema.make_avsc_object(json.loads(ref.text), names)
        fastavro.parse_schema(doc, named_schemas=named)
        parsed = avro.schema.make_avsc_object(doc, names)
    except (avro.errors.AvroException, fastavro.schema.SchemaParseException, ValueError, TypeError, KeyError) as exc:
        raise InvalidSchemaError(f"Invalid schema: {exc}") from None
    return ParsedSchema(SchemaType.AVRO, _compact(doc), parsed)


def _refs_in(doc: Any) -> Iterator[str]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs_in(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _refs_in(value)


def _parse_json(text: str, names: set[str]) -> ParsedSchema:
    import jsonschema.exceptions
    import jsonschema.validators

    doc = _json_doc(text, "JSON")
    if not isinstance(doc, dict | bool):
        raise InvalidSchemaError("Invalid schema: a JSON schema is an object or a boolean")
    try:
        validator = jsonschema.validators.validator_for(doc, default=jsonschema.Draft7Validator)
        validator.check_schema(doc)
    except jsonschema.exceptions.SchemaError as exc:
        raise InvalidSchemaError(f"Invalid schema: {exc.message}") from None
    own = doc.get("$id") if isinstance(doc, dict) else None
    for ref in _refs_in(doc):
        target = ref.partition("#")[0]
        if target and target != own and target not in names and urljoin(str(own or ""), target) not in names:
            raise InvalidSchemaError(f"Invalid schema: $ref {ref!r} names no reference of the schema")
    return ParsedSchema(SchemaType.JSON, _compact(doc), doc)


# ---- Protobuf ----------------------------------------------------------------------------------


#: Imports a Protobuf schema needs no reference for: the well-known types (and Confluent's own
#: options), which every Protobuf runtime and Confluent's registry carry.
BUILTIN_IMPORTS = ("google/protobuf/", "confluent/")


def _parse_protobuf(text: str, names: set[str]) -> ParsedSchema:
    model, imports = _from_descriptor(text) if _looks_base64(text) else _from_proto_text(text)
    for imported in imports:
        if imported not in names and not imported.startswith(BUILTIN_IMPORTS):
            raise InvalidSchemaError(f"Invalid schema: import {imported!r} names no reference of the schema")
    return ParsedSchema(SchemaType.PROTOBUF, text, model)


def _looks_base64(text: str) -> bool:
    return bool(text) and "{" not in text and ";" not in text


def _from_descriptor(text: str) -> tuple[ProtoFile, list[str]]:
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        fd = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, DecodeError, ValueError) as exc:
        raise InvalidSchemaError(f"Invalid schema: not a serialized FileDescriptorProto: {exc}") from None
    out = ProtoFile(package=fd.package, syntax=fd.syntax or "proto2")
    labels = {1: "optional", 2: "required", 3: "repeated"}
    type_names = {
        v: k[len("TYPE_"):].lower() for k, v in descriptor_pb2.FieldDescriptorProto.Type.items()
    }

    def walk(prefix: str, msg: descriptor_pb2.DescriptorProto) -> None:
        name = prefix + msg.name
        model = out.messages[name] = ProtoMessage()
        oneofs = [o.name for o in msg.oneof_decl]
        maps = {n.name: n for n in msg.nested_type if n.options.map_entry}
        for f in msg.field:
            if f.type_name:
                entry = maps.get(f.type_name.rsplit(".", 1)[-1])
                ftype = (
                    _map_type(entry) if entry is not None and f.label == 3 else _named(f.type_name, out.package)
                )
            else:
                ftype = type_names[f.type]
            synthetic = f.proto3_optional
            label = "" if out.syntax == "proto3" and f.label == 1 and not synthetic else labels[f.label]
            if ftype.startswith("map<"):
                label = ""
            oneof = oneofs[f.oneof_index] if f.HasField("oneof_index") and not synthetic else None
            model.fields[f.number] = ProtoField(f.name, f.number, label, ftype, oneof)
        for nested in msg.nested_type:
            if not nested.options.map_entry:
                walk(name + ".", nested)
        for e in msg.enum_type:
            out.enums[name + "." + e.name] = {v.name for v in e.value}

    for m in fd.message_type:
        walk("", m)
    for e in fd.enum_type:
        out.enums[e.name] = {v.name for v in e.value}
    return out, list(fd.dependency)


def _map_type(entry: Any) -> str:
    from google.protobuf import descriptor_pb2

    names = {v: k[len("TYPE_"):].lower() for k, v in descriptor_pb2.FieldDescriptorProto.Type.items()}
    key, value = entry.field[0], entry.field[1]
    return f"map<{names[key.type]},{_named(value.type_name, '') if value.type_name else names[value.type]}>"


def _named(type_name: str, package: str) -> str:
    name = type_name.lstrip(".")
    if package and name.startswith(package + "."):
        name = name[len(package) + 1:]
    return name


def _from_proto_text(text: str) -> tuple[ProtoFile, list[str]]:
    from antlr4.error.ErrorListener import ErrorListener
    from proto_schema_parser import ast
    from proto_schema_parser.parser import Parser

    class Refuse(ErrorListener):  # type: ignore[misc]  # antlr4 ships no types
        def syntaxError(self, recognizer: Any, offending: Any, line: int, column: int, msg: str, e: Any) -> None:
            raise InvalidSchemaError(f"Invalid schema: line {line}:{column}: {msg}")

    def refuse_errors(recognizer: Any) -> None:
        recognizer.removeErrorListeners()
        recognizer.addErrorListener(Refuse())

    tree = Parser(setup_lexer=refuse_errors, setup_parser=refuse_errors).parse(text)
    out = ProtoFile(syntax=tree.syntax or "proto2")
    for el in tree.file_elements:
        if isinstance(el, ast.Package):
            out.package = el.name

    def label_of(card: ast.FieldCardinality | None) -> str:
        return "" if card is None else card.value.lower()

    def walk(prefix: str, msg: ast.Message) -> None:
        name = prefix + msg.name
        model = out.messages[name] = ProtoMessage()

        def add(f: Any, oneof: str | None) -> None:
            if isinstance(f, ast.Field):
                model.fields[f.number] = ProtoField(f.name, f.number, label_of(f.cardinality), _named(f.type, out.package), oneof)
            elif isinstance(f, ast.MapField):
                model.fields[f.number] = ProtoField(f.name, f.number, "", f"map<{f.key_type},{_named(f.value_type, out.package)}>", oneof)

        for el in msg.elements:
            if isinstance(el, ast.OneOf):
                for f in el.elements:
                    add(f, el.name)
            elif isinstance(el, ast.Message):
                walk(name + ".", el)
            elif isinstance(el, ast.Enum):
                out.enums[name + "." + el.name] = {v.name for v in el.elements if isinstance(v, ast.EnumValue)}
            else:
                add(el, None)

    for el in tree.file_elements:
        if isinstance(el, ast.Message):
            walk("", el)
        elif isinstance(el, ast.Enum):
            out.enums[el.name] = {v.name for v in el.elements if isinstance(v, ast.EnumValue)}
    if not out.messages and not out.enums and not any(isinstance(el, ast.Package) for el in tree.file_elements) and text.strip():
        raise InvalidSchemaError("Invalid schema: no message, enum or package in the Protobuf schema")
    return out, [el.name for el in tree.file_elements if isinstance(el, ast.Import)]
