"""The schema registry's state in the metadata (loglake.registry gives it meaning).

Four record kinds:

* ``schema_version`` ``{subject, version, id, type, schema, refs}``: version `version` of
  `subject` is schema `id` (`type` AVRO, JSON or PROTOBUF; `schema` its text; `refs`
  ``[[name, subject, version], ...]``, the schemas it references). It applies only when
  `version` is above every version the subject holds (soft-deleted ones included) and `id`
  either names the same schema already (same type, text and refs: a schema registered under a
  second subject keeps its id, as Confluent's does) or is a new schema's id at or above the next
  free one (`next_id`), whose text is not stored under another id. Two brokers racing to
  register (cluster mode) therefore never give one schema two ids nor two schemas one id: the
  record that comes second does not apply and its writer tries again.
* ``schema_deleted`` ``{subject, versions, permanent}``: those versions are soft-deleted, or
  with `permanent` removed (a version must be soft-deleted before it may be removed). A schema
  id no version refers to any more is forgotten too; ids are never handed out again.
* ``schema_config`` ``{subject, config}``: the subject's config (``""``: the global one),
  replaced whole; ``{}`` removes it. Today `config` holds ``compatibilityLevel``.
* ``schema_mode`` ``{subject, mode}``: the subject's mode (``""``: the global one); null removes.

Checkpoints carry the table as ``schemas`` (absent when the registry is empty, so checkpoints
of a broker that never served a registry are the bytes they always were).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "SCHEMAS_MAX",
    "SCHEMA_TYPES",
    "RegisteredVersion",
    "SchemaRef",
    "SchemaTable",
    "StoredSchema",
    "apply_schema_config",
    "apply_schema_deleted",
    "apply_schema_mode",
    "apply_schema_version",
    "load_schemas",
    "schemas_doc",
]

#: The schema types a record may carry (Confluent's `schemaType` names).
SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
#: Most schema ids the registry keeps (every one is in every checkpoint and in memory).
SCHEMAS_MAX = 100_000

#: A reference: (name as the schema spells it, subject, version)
SchemaRef = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class StoredSchema:
    schema_type: str
    text: str
    refs: tuple[SchemaRef, ...]


@dataclass(slots=True)
class RegisteredVersion:
    schema_id: int
    deleted: bool = False


@dataclass(eq=False)
class SchemaTable:
    """Schemas by id, subjects' versions, configs and modes."""

    schemas: dict[int, StoredSchema] = field(default_factory=dict)
    #: the same schema -> its id (a schema has one id)
    ids: dict[StoredSchema, int] = field(default_factory=dict)
    #: subject -> version -> what it is (versions ascending)
    subjects: dict[str, dict[int, RegisteredVersion]] = field(default_factory=dict)
    #: the lowest id a new schema may take (ids are never reused)
    next_id: int = 1
    #: subject ("" the global one) -> config
    configs: dict[str, dict[str, str]] = field(default_factory=dict)
    #: subject ("" the global one) -> mode
    modes: dict[str, str] = field(default_factory=dict)

    def in_use(self, schema_id: int) -> bool:
        return any(v.schema_id == schema_id for versions in self.subjects.values() for v in versions.values())


class SchemaState(Protocol):
    """The part of the metadata state (loglake.meta.state.MetaState) the registry lives in."""

    @property
    def schemas(self) -> SchemaTable: ...


def _refs(raw: Any) -> tuple[SchemaRef, ...]:
    return tuple((str(name), str(subject), int(version)) for name, subject, version in raw or ())


def apply_schema_version(state: SchemaState, b: dict[str, Any]) -> None:
    table = state.schemas
    subject, version, schema_id = str(b["subject"]), int(b["version"]), int(b["id"])
    schema_type = str(b["type"])
    if schema_type not in SCHEMA_TYPES:
        raise ValueError(f"schema type {schema_type!r} is not one of {SCHEMA_TYPES}")
    stored = StoredSchema(schema_type, str(b["schema"]), _refs(b.get("refs")))
    versions = table.subjects.get(subject, {})
    if versions and version <= max(versions):
        raise ValueError(f"subject {subject!r} already holds version {max(versions)}; {version} is not above it")
    if version < 1:
        raise ValueError(f"schema version {version} is below 1")
    known = table.ids.get(stored)
    if known is None:
        if schema_id < table.next_id:
            raise ValueError(f"schema id {schema_id} is taken; the next free one is {table.next_id}")
        if len(table.schemas) >= SCHEMAS_MAX:
            raise ValueError(f"the registry holds {SCHEMAS_MAX} schemas, its limit")
        table.schemas[schema_id] = stored
        table.ids[stored] = schema_id
        table.next_id = schema_id + 1
    elif known != schema_id:
        raise ValueError(f"that schema is id {known}, not {schema_id}")
    table.subjects.setdefault(subject, {})[version] = RegisteredVersion(schema_id)


def apply_schema_deleted(state: SchemaState, b: dict[str, Any]) -> None:
    table = state.schemas
    subject = str(b["subject"])
    versions = table.subjects.get(subject)
    wanted = [int(v) for v in b["versions"]]
    if versions is None or any(v not in versions for v in wanted):
        raise ValueError(f"subject {subject!r} does not hold versions {wanted}")
    permanent = bool(b["permanent"])
    if permanent and any(not versions[v].deleted for v in wanted):
        raise ValueError("a version must be soft-deleted before it is deleted permanently")
    for v in wanted:
        if not permanent:
            versions[v].deleted = True
            continue
        schema_id = versions.pop(v).schema_id
        if not versions:
            del table.subjects[subject]
        if not table.in_use(schema_id):
            table.ids.pop(table.schemas.pop(schema_id), None)


def apply_schema_config(state: SchemaState, b: dict[str, Any]) -> None:
    config = b["config"]
    if not isinstance(config, dict):
        raise ValueError("config is not an object")
    subject = str(b["subject"])
    if config:
        state.schemas.configs[subject] = {str(k): str(v) for k, v in config.items()}
    else:
        state.schemas.configs.pop(subject, None)


def apply_schema_mode(state: SchemaState, b: dict[str, Any]) -> None:
    subject, mode = str(b["subject"]), b.get("mode")
    if mode is None:
        state.schemas.modes.pop(subject, None)
    else:
        state.schemas.modes[subject] = str(mode)


def schemas_doc(state: SchemaState) -> dict[str, Any] | None:
    """The checkpoint's ``schemas`` (None when the registry is empty: the key is left out)."""
    t = state.schemas
    if not (t.schemas or t.subjects or t.configs or t.modes or t.next_id != 1):
        return None
    return {
        "next_id": t.next_id,
        "schemas": [[i, s.schema_type, s.text, [list(r) for r in s.refs]] for i, s in t.schemas.items()],
        "subjects": {s: [[v, rv.schema_id, rv.deleted] for v, rv in vs.items()] for s, vs in t.subjects.items()},
        "configs": {s: dict(c) for s, c in t.configs.items()},
        "modes": dict(t.modes),
    }


def load_schemas(state: SchemaState, doc: dict[str, Any]) -> None:
    raw = doc.get("schemas")
    if not raw:
        return
    t = state.schemas
    t.next_id = int(raw["next_id"])
    for schema_id, schema_type, text, refs in raw["schemas"]:
        stored = StoredSchema(str(schema_type), str(text), _refs(refs))
        t.schemas[int(schema_id)] = stored
        t.ids[stored] = int(schema_id)
    for subject, rows in raw["subjects"].items():
        t.subjects[str(subject)] = {int(v): RegisteredVersion(int(i), bool(d)) for v, i, d in rows}
    for subject, config in raw["configs"].items():
        t.configs[str(subject)] = {str(k): str(v) for k, v in config.items()}
    t.modes.update({str(s): str(m) for s, m in raw["modes"].items()})

