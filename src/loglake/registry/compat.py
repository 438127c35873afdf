"""Compatibility of a new schema with a subject's earlier ones, by Confluent's levels and rules.

`check(level, new, olds)` is what registration and POST /compatibility do: `olds` are the
subject's live versions, oldest first; a non-transitive level compares with the latest only.
BACKWARD: the new schema reads what the old one wrote; FORWARD: the old reads what the new wrote;
FULL both. It answers the reasons it is incompatible (empty: compatible).

* Avro: the Apache avro package's ReaderWriterCompatibilityChecker, which implements the Avro
  specification's schema resolution (the rules Confluent's registry applies).
* JSON Schema: Confluent's rules (its JSON Schema diff): a reader must accept every document the
  writer accepts. A property added while the writer's content model is open (additionalProperties
  absent or true) is incompatible, unless the writer's partially open model (an
  additionalProperties schema) is covered by it; removed from an open reader it is compatible,
  from a closed one not; a required property added is incompatible; types may widen (integer to
  number, a type added) but not narrow or change; enum values may be added, not removed; maximums
  (maxLength, maximum, maxItems, maxProperties) may grow, minimums shrink, neither appear;
  additionalProperties may open, not close. A local `$ref` ("#/$defs/...") both sides make is
  followed into each document (recursive schemas end); any other `$ref` must stay the same.
* Protobuf: Confluent's rules (its Protobuf diff), applied as Confluent does: BACKWARD compares
  (old -> new), FORWARD (new -> old). Incompatible: the package changed, a message removed, a
  field's kind changed (scalar, message, enum, map), its scalar type changed outside the wire-
  compatible groups (int32/uint32/int64/uint64/bool, sint32/sint64, fixed32/sfixed32,
  fixed64/sfixed64, string/bytes), its named type changed, a required field added or removed, a
  label change between repeated and not for numeric fields, a field moved into an existing oneof,
  several fields moved into a new oneof, an enum removed. Fields, messages and enum values added
  or removed otherwise, and renamed fields, are compatible.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from loglake.registry.formats import ParsedSchema, ProtoFile, SchemaType

__all__ = ["Compatibility", "check", "compatible_pair"]


class Compatibility(enum.StrEnum):
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        return self.value.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        return self.value.startswith(("FORWARD", "FULL"))


def check(level: Compatibility, new: ParsedSchema, olds: Sequence[ParsedSchema]) -> list[str]:
    """Why `new` is not compatible with `olds` under `level` (oldest first); [] when it is."""
    if level is Compatibility.NONE or not olds:
        return []
    against = olds if level.transitive else olds[-1:]
    out: list[str] = []
    for old in reversed(against):  # Confluent reports the newest conflict first
        if old.schema_type is not new.schema_type:
            out.append(f"schema type {new.schema_type} differs from the previous {old.schema_type}")
            continue
        if level.backward:
            out.extend(f"BACKWARD: {r}" for r in compatible_pair(reader=new, writer=old))
        if level.forward:
            out.extend(f"FORWARD: {r}" for r in compatible_pair(reader=old, writer=new))
    return out


def compatible_pair(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` ([] when it can)."""
    if reader.schema_type is SchemaType.AVRO:
        return _avro(reader.parsed, writer.parsed)
    if reader.schema_type is SchemaType.JSON:
        return _JsonDiff(reader.parsed, writer.parsed).diff(reader.parsed, writer.parsed, "#")
    return _protobuf(original=writer.parsed, update=reader.parsed)


# ---- Avro ----------------------------------------------------------------------------------------


def _avro(reader: Any, writer: Any) -> list[str]:
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]  # avro leaves it untyped
    result = checker.get_compatibility(reader, writer)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    return [
        f"{', '.join(sorted(str(m) for m in result.messages)) or 'incompatible'} at {', '.join(sorted(result.locations))}"
    ]


# ---- JSON Schema -----------------------------------------------------------------------------------

_MAXIMUMS = ("maxLength", "maximum", "exclusiveMaximum", "maxItems", "maxProperties")
_MINIMUMS = ("minLength", "minimum", "exclusiveMinimum", "minItems", "minProperties")


def _types(schema: dict[str, Any]) -> set[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def _accepts_anything(schema: Any) -> bool:
    return schema is True or schema == {}


def _pointer(root: Any, ref: str) -> Any:
    """The part of `root` a local JSON pointer ("#/$defs/a") names, None when none."""
    node = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


class _JsonDiff:
    """Confluent's JSON Schema rules between two schema documents; a local `$ref` ("#/...") that
    both name alike is followed into each document (each pair once: recursive schemas end)."""

    def __init__(self, reader_root: Any, writer_root: Any) -> None:
        self.roots = (reader_root, writer_root)
        self.seen: set[tuple[str, str]] = set()

    def follow(self, reader: dict[str, Any], writer: dict[str, Any], at: str) -> list[str] | None:
        """The differences behind a local $ref both sides make (None: not one)."""
        r_ref, w_ref = reader.get("$ref"), writer.get("$ref")
        if not (isinstance(r_ref, str) and isinstance(w_ref, str) and r_ref.startswith("#") and w_ref.startswith("#")):
            return None
        if (r_ref, w_ref) in self.seen:
            return []
        self.seen.add((r_ref, w_ref))
        r_target, w_target = _pointer(self.roots[0], r_ref), _pointer(self.roots[1], w_ref)
        if r_target is None or w_target is None:
            return [f"{at}: $ref {r_ref if r_target is None else w_ref} does not resolve"]
        rest_r = {k: v for k, v in reader.items() if k != "$ref"}
        rest_w = {k: v for k, v in writer.items() if k != "$ref"}
        return self.diff(r_target, w_target, at) + (self.diff(rest_r, rest_w, at) if rest_r or rest_w else [])

    def diff(self, reader: Any, writer: Any, at: str) -> list[str]:
        """Reasons some document `writer` accepts is refused by `reader` (Confluent's rules)."""
        if _accepts_anything(reader) or writer is False:
            return []
        if reader is False:
            return [f"{at}: the schema accepts nothing any more"]
        if writer is True:
            writer = {}
        if not isinstance(reader, dict) or not isinstance(writer, dict):
            return [f"{at}: schema changed"]
        out: list[str] = []
        followed = self.follow(reader, writer, at)
        if followed is not None:
            return followed
        if reader.get("$ref") != writer.get("$ref"):
            out.append(f"{at}: $ref changed")
        rt, wt = _types(reader), _types(writer)
        if rt is not None:
            if wt is None:
                out.append(f"{at}: type narrowed to {sorted(rt)}")
            else:
                widened = rt | ({"integer"} if "number" in rt else set())
                if not wt <= widened:
                    out.append(f"{at}: type changed from {sorted(wt)} to {sorted(rt)}")
        for key in _MAXIMUMS:
            if key in reader and (key not in writer or reader[key] < writer[key]):
                out.append(f"{at}: {key} added or decreased")
        for key in _MINIMUMS:
            if key in reader and (key not in writer or reader[key] > writer[key]):
                out.append(f"{at}: {key} added or increased")
        for key in ("enum",):
            if key in reader and (key not in writer or not all(v in reader[key] for v in writer[key])):
                out.append(f"{at}: enum narrowed")
        if "const" in reader and reader.get("const") != writer.get("const"):
            out.append(f"{at}: const changed")
        if "pattern" in reader and reader.get("pattern") != writer.get("pattern"):
            out.append(f"{at}: pattern added or changed")
        out.extend(self.obj(reader, writer, at))
        for key in ("items", "not"):
            if key in reader or key in writer:
                out.extend(self.diff(reader.get(key, True), writer.get(key, True), f"{at}/{key}"))
        for key in ("oneOf", "anyOf"):
            if key in reader or key in writer:
                r_alts, w_alts = reader.get(key, [reader]), writer.get(key, [writer])
                if key not in reader and key in writer:
                    out.append(f"{at}: {key} removed")
                    continue
                for i, w in enumerate(w_alts):
                    if all(self.diff(r, w, f"{at}/{key}/{i}") for r in r_alts):
                        out.append(f"{at}/{key}/{i}: no alternative of the new schema accepts it")
        if "allOf" in reader or "allOf" in writer:
            r_all, w_all = reader.get("allOf", []), writer.get("allOf", [])
            if len(r_all) > len(w_all):
                out.append(f"{at}: allOf gained a schema")
            for i, (r, w) in enumerate(zip(r_all, w_all, strict=False)):
                out.extend(self.diff(r, w, f"{at}/allOf/{i}"))
        return out


    def obj(self, reader: dict[str, Any], writer: dict[str, Any], at: str) -> list[str]:
        out: list[str] = []
        r_props: dict[str, Any] = reader.get("properties", {})
        w_props: dict[str, Any] = writer.get("properties", {})
        r_more = reader.get("additionalProperties", True)
        w_more = writer.get("additionalProperties", True)
        for name, w in w_props.items():
            if name in r_props:
                out.extend(self.diff(r_props[name], w, f"{at}/properties/{name}"))
            elif r_more is False:
                out.append(f"{at}/properties/{name}: property removed from a closed content model")
            elif r_more is not True and self.diff(r_more, w, f"{at}/properties/{name}"):
                out.append(f"{at}/properties/{name}: removed property not covered by additionalProperties")
        for name, r in r_props.items():
            if name in w_props:
                continue
            if w_more is False or _accepts_anything(r):
                continue
            if w_more is True:
                out.append(f"{at}/properties/{name}: property added to an open content model")
            elif self.diff(r, w_more, f"{at}/properties/{name}"):
                out.append(f"{at}/properties/{name}: added property not covered by the partially open content model")
        added_required = set(reader.get("required", [])) - set(writer.get("required", []))
        if added_required:
            out.append(f"{at}: required properties added: {sorted(added_required)}")
        if r_more is not True and w_more is not False:
            if r_more is False or w_more is True:
                out.append(f"{at}: additionalProperties narrowed")
            else:
                out.extend(self.diff(r_more, w_more, f"{at}/additionalProperties"))
        return out


# ---- Protobuf --------------------------------------------------------------------------------------

_SCALAR_GROUPS = (
    {"int32", "uint32", "int64", "uint64", "bool"},
    {"sint32", "sint64"},
    {"fixed32", "sfixed32"},
    {"fixed64", "sfixed64"},
    {"string", "bytes"},
    {"double"},
    {"float"},
)
_SCALARS = set().union(*_SCALAR_GROUPS)
_NUMERIC = _SCALARS - {"string", "bytes"}


def _kind(t: str, file: ProtoFile) -> str:
    if t in _SCALARS:
        return "scalar"
    if t.startswith("map<"):
        return "map"
    short = t.rsplit(".", 1)[-1]
    if any(name.rsplit(".", 1)[-1] == short for name in file.enums):
        return "enum"
    return "message"


def _protobuf(original: ProtoFile, update: ProtoFile) -> list[str]:
    """Confluent's incompatible differences from `original` to `update`."""
    out: list[str] = []
    if original.package != update.package:
        out.append(f"PACKAGE_CHANGED: {original.package!r} -> {update.package!r}")
    if original.syntax != update.syntax:
        out.append(f"SYNTAX_VERSION_CHANGED: {original.syntax} -> {update.syntax}")
    for name in original.enums:
        if name not in update.enums:
            out.append(f"ENUM_REMOVED: {name}")
    for name, old in original.messages.items():
        new = update.messages.get(name)
        if new is None:
            out.append(f"MESSAGE_REMOVED: {name}")
            continue
        moved_to_new_oneof: dict[str, int] = {}
        new_oneofs = {f.oneof for f in new.fields.values()} - {f.oneof for f in old.fields.values()}
        for number, of in old.fields.items():
            nf = new.fields.get(number)
            where = f"{name}.{of.name} ({number})"
            if nf is None:
                if of.label == "required":
                    out.append(f"REQUIRED_FIELD_REMOVED: {where}")
                continue
            ok, nk = _kind(of.type, original), _kind(nf.type, update)
            if ok != nk:
                out.append(f"FIELD_KIND_CHANGED: {where} {ok} -> {nk}")
            elif ok == "scalar" and not any(of.type in g and nf.type in g for g in _SCALAR_GROUPS):
                out.append(f"FIELD_SCALAR_KIND_CHANGED: {where} {of.type} -> {nf.type}")
            elif ok != "scalar" and of.type.rsplit(".", 1)[-1] != nf.type.rsplit(".", 1)[-1]:
                out.append(f"FIELD_NAMED_TYPE_CHANGED: {where} {of.type} -> {nf.type}")
            if (of.label == "repeated") != (nf.label == "repeated") and ok == "scalar" and of.type in _NUMERIC:
                out.append(f"FIELD_NUMERIC_LABEL_CHANGED: {where}")
            if (of.label == "required") != (nf.label == "required"):
                out.append(f"REQUIRED_FIELD_{'ADDED' if nf.label == 'required' else 'REMOVED'}: {where}")
            if of.oneof is None and nf.oneof is not None:
                if nf.oneof in new_oneofs:
                    moved_to_new_oneof[nf.oneof] = moved_to_new_oneof.get(nf.oneof, 0) + 1
                else:
                    out.append(f"FIELD_MOVED_TO_EXISTING_ONEOF: {where}")
        out.extend(f"MULTIPLE_FIELDS_MOVED_TO_ONEOF: {name}.{o}" for o, n in moved_to_new_oneof.items() if n > 1)
        for number, nf in new.fields.items():
            if number not in old.fields and nf.label == "required":
                out.append(f"REQUIRED_FIELD_ADDED: {name}.{nf.name} ({number})")
    return out
