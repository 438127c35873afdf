"""A `.proto` file's text as the FileDescriptorProto protoc would make of it, with no compiler:
parsed by proto-schema-parser (the registry's parser, loglake.registry.formats), then its
messages, enums, fields, oneofs and maps written out as descriptors, type names resolved by
protobuf's scoping rules. What decoding needs and no more: options other than a field's
`default` and proto3's `optional` are left out (they do not change how a message parses);
extensions, services and groups are refused.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ProtoTextError", "file_descriptor", "imports_of"]

#: Scalar type names -> FieldDescriptorProto.Type values.
SCALARS = {
    "double": 1, "float": 2, "int64": 3, "uint64": 4, "int32": 5, "fixed64": 6, "fixed32": 7, "bool": 8,
    "string": 9, "bytes": 12, "uint32": 13, "sfixed32": 15, "sfixed64": 16, "sint32": 17, "sint64": 18,
}  # fmt: skip
_TYPE_MESSAGE = 11
_TYPE_ENUM = 14
_LABEL_OPTIONAL, _LABEL_REQUIRED, _LABEL_REPEATED = 1, 2, 3


class ProtoTextError(ValueError):
    """The text does not parse, or uses what is not turned into descriptors here."""


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def _parse(text: str) -> Any:
    from proto_schema_parser.parser import Parser

    try:
        return Parser().parse(text)
    except Exception as exc:  # antlr reports syntax errors its own ways
        raise ProtoTextError(f"the .proto text does not parse: {exc}") from None


def imports_of(text: str) -> list[str]:
    """The files the `.proto` text imports."""
    from proto_schema_parser import ast

    return [el.name for el in _parse(text).file_elements if isinstance(el, ast.Import)]


def file_descriptor(text: str, name: str, pool: Any) -> Any:
    """The FileDescriptorProto of the `.proto` text (named `name`); `pool` holds its imports
    (names it defines outside the file are looked up there)."""
    from google.protobuf import descriptor_pb2
    from proto_schema_parser import ast

    tree = _parse(text)
    syntax = tree.syntax or "proto2"
    fd = descriptor_pb2.FileDescriptorProto(name=name, syntax=syntax)
    package = next((el.name for el in tree.file_elements if isinstance(el, ast.Package)), "")
    fd.package = package
    fd.dependency.extend(el.name for el in tree.file_elements if isinstance(el, ast.Import))
    root = "." + package if package else ""

    # every message and enum the file defines, by full name (with the leading dot)
    kinds: dict[str, int] = {}

    def collect(scope: str, elements: list[Any]) -> None:
        for el in elements:
            if isinstance(el, ast.Message):
                kinds[f"{scope}.{el.name}"] = _TYPE_MESSAGE
                collect(f"{scope}.{el.name}", el.elements)
            elif isinstance(el, ast.Enum):
                kinds[f"{scope}.{el.name}"] = _TYPE_ENUM

    collect(root, tree.file_elements)

    def external(full: str) -> int | None:
        for find, kind in ((pool.FindMessageTypeByName, _TYPE_MESSAGE), (pool.FindEnumTypeByName, _TYPE_ENUM)):
            try:
                find(full[1:])
            except KeyError:
                continue
            return kind
        return None

    def resolve(ref: str, scope: str) -> tuple[int, str]:
        """(TYPE_MESSAGE or TYPE_ENUM, full name) of a type named in `scope`: the innermost
        scope whose name with the reference's first part exists, as protoc resolves."""
        if ref.startswith("."):
            candidates = [ref]
        else:
            first = ref.partition(".")[0]
            candidates = []
            s = scope
            while True:
                if f"{s}.{first}" in kinds or external(f"{s}.{first}") is not None:
                    candidates.append(f"{s}.{ref}")
                    break
                if not s:
                    break
                s = s.rpartition(".")[0]
            candidates.append("." + ref)
        for full in candidates:
            kind = kinds.get(full) or external(full)
            if kind is not None:
                return kind, full
        raise ProtoTextError(f"type {ref!r} (in {scope or 'the file'}) is not defined")

    def set_type(f: Any, type_name: str, scope: str) -> None:
        if type_name in SCALARS:
            f.type = SCALARS[type_name]
        else:
            f.type, f.type_name = resolve(type_name, scope)

    def message(out: Any, msg: Any, scope: str) -> None:
        out.name = msg.name
        here = f"{scope}.{msg.name}"
        proto3_optional: list[Any] = []

        def add_field(el: Any, oneof: int | None) -> None:
            f = out.field.add(name=el.name, number=el.number, json_name=_json_name(el.name))
            if isinstance(el, ast.MapField):
                entry = out.nested_type.add(name=_camel(el.name) + "Entry")
                entry.options.map_entry = True
                key = entry.field.add(name="key", number=1, label=_LABEL_OPTIONAL, json_name="key")
                set_type(key, el.key_type, here)
                value = entry.field.add(name="value", number=2, label=_LABEL_OPTIONAL, json_name="value")
                set_type(value, el.value_type, here)
                f.label, f.type, f.type_name = _LABEL_REPEATED, _TYPE_MESSAGE, f"{here}.{entry.name}"
                return
            card = el.cardinality.value if el.cardinality is not None else None
            f.label = {"REPEATED": _LABEL_REPEATED, "REQUIRED": _LABEL_REQUIRED}.get(card or "", _LABEL_OPTIONAL)
            set_type(f, el.type, here)
            if oneof is not None:
                f.oneof_index = oneof
            elif card == "OPTIONAL" and syntax == "proto3":
                proto3_optional.append(f)
            for opt in el.options or ():
                if opt.name == "default":
                    value = opt.value
                    f.default_value = ("true" if value else "false") if isinstance(value, bool) else str(getattr(value, "name", value))

        for el in msg.elements:
            if isinstance(el, ast.Field | ast.MapField):
                add_field(el, None)
            elif isinstance(el, ast.OneOf):
                out.oneof_decl.add(name=el.name)
                for member in el.elements:
                    if isinstance(member, ast.Field):
                        add_field(member, len(out.oneof_decl) - 1)
            elif isinstance(el, ast.Message):
                message(out.nested_type.add(), el, here)
            elif isinstance(el, ast.Enum):
                enum(out.enum_type.add(), el)
            elif isinstance(el, ast.Extension):
                raise ProtoTextError(f"message {msg.name}: extensions are not read")
        for f in proto3_optional:  # proto3 `optional`: a synthetic oneof of its own, after the real ones
            f.proto3_optional = True
            out.oneof_decl.add(name="_" + f.name)
            f.oneof_index = len(out.oneof_decl) - 1

    def enum(out: Any, el: Any) -> None:
        out.name = el.name
        for v in el.elements:
            if isinstance(v, ast.EnumValue):
                out.value.add(name=v.name, number=v.number)

    for el in tree.file_elements:
        if isinstance(el, ast.Message):
            message(fd.message_type.add(), el, root)
        elif isinstance(el, ast.Enum):
            enum(fd.enum_type.add(), el)
        elif isinstance(el, ast.Extension):
            raise ProtoTextError("extensions are not read")
    return fd


def _json_name(name: str) -> str:
    parts = name.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])
