"""`SchemaRegistry`: the registry's operations over the metadata store.

Its state is the metadata state's `schemas` table (loglake.meta.schemas); every change is one
record appended through `MetaStore.append`, so the registry is as durable as the topics, is in
checkpoints, and in cluster mode is one registry through etcd: each broker reads its own applied
state and writes records that apply only from the state they were decided on (a register that
lost a race to another broker is refused by the state and decided again, `WRITE_TRIES` times).

Calls block until their record is durable: the HTTP side runs them off the event loop.
Answers are the JSON documents of Confluent's REST API (loglake.registry.api routes to them).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loglake.errors import MetaRecordRejectedError
from loglake.meta.records import MetaRecord, SchemaConfig, SchemaDeleted, SchemaMode, SchemaVersion
from loglake.meta.schemas import SchemaRef, SchemaTable, StoredSchema
from loglake.meta.store import MetaStore
from loglake.registry.compat import Compatibility, check
from loglake.registry.errors import RegistryError, RegistryErrorCode
from loglake.registry.formats import InvalidSchemaError, ParsedSchema, SchemaType, normalized, parse_schema

__all__ = ["DEFAULT_COMPATIBILITY", "MODES", "RegisterRequest", "SchemaRegistry"]

#: The compatibility level of a subject and a registry that set none (Confluent's default).
DEFAULT_COMPATIBILITY = Compatibility.BACKWARD
#: The modes Confluent's registry has; READWRITE is the default.
MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE", "IMPORT")
#: How often a change decided from a stale state (another broker wrote first) is decided again.
WRITE_TRIES = 8
#: Parsed schemas kept (by id: an id's schema never changes).
PARSED_CACHE = 1024
#: Longest reference chain followed (a cycle is refused, as is a chain deeper than this).
REFERENCE_DEPTH_MAX = 32
#: Highest version number (Confluent's: a Java int).
VERSION_MAX = 2**31 - 1
#: The config key Confluent's API and our records use for the level.
COMPATIBILITY_KEY = "compatibilityLevel"


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    """A schema as POSTed: type, text, references; and in IMPORT mode the id and version it is to
    keep (Confluent's ``id`` and ``version`` fields; None: not given)."""

    schema_type: SchemaType
    schema: str
    refs: tuple[SchemaRef, ...] = ()
    schema_id: int | None = None
    version: int | None = None

    @classmethod
    def from_json(cls, doc: Any) -> RegisterRequest:
        if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
            raise RegistryError(RegistryErrorCode.INVALID_SCHEMA, "Invalid schema: the request has no \"schema\" string")
        try:
            schema_type = SchemaType(doc.get("schemaType") or "AVRO")
        except ValueError:
            raise RegistryError(
                RegistryErrorCode.INVALID_SCHEMA, f"Invalid schema type {doc.get('schemaType')!r}"
            ) from None
        refs = []
        for ref in doc.get("references") or ():
            try:
                refs.append((str(ref["name"]), str(ref["subject"]), int(ref["version"])))
            except (KeyError, TypeError, ValueError):
                raise RegistryError(RegistryErrorCode.INVALID_SCHEMA, f"Invalid schema reference {ref!r}") from None
        return cls(schema_type, doc["schema"], tuple(refs), _given(doc, "id", -1), _given(doc, "version", 0))


def _given(doc: dict[str, Any], key: str, absent: int) -> int | None:
    """A register request's `id` or `version`: None when missing or Confluent's "not given"
    (`absent`: id -1, version 0); INVALID_VERSION / ID_DOES_NOT_MATCH when out of range."""
    raw = doc.get(key)
    if raw is None or raw == absent:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= VERSION_MAX:
        if key == "version":
            raise RegistryError.invalid_version(str(raw))
        raise RegistryError(RegistryErrorCode.ID_DOES_NOT_MATCH, f"Invalid schema id {raw!r}: ids are between 1 and 2^31-1")
    return raw


def _refs_json(refs: Sequence[SchemaRef]) -> list[dict[str, Any]]:
    return [{"name": n, "subject": s, "version": v} for n, s, v in refs]


def schema_json(stored: StoredSchema) -> dict[str, Any]:
    """The fields Confluent answers for a schema: schemaType only when not AVRO, references
    only when there are some."""
    out: dict[str, Any] = {}
    if stored.schema_type != SchemaType.AVRO:
        out["schemaType"] = stored.schema_type
    if stored.refs:
        out["references"] = _refs_json(stored.refs)
    out["schema"] = stored.text
    return out


def parse_version(raw: str) -> int | None:
    """A version path segment: its number, None for "latest" (and -1); INVALID_VERSION otherwise."""
    if raw == "latest":
        return None
    try:
        v = int(raw)
    except ValueError:
        raise RegistryError.invalid_version(raw) from None
    if v == -1:
        return None
    if not 1 <= v <= VERSION_MAX:
        raise RegistryError.invalid_version(raw)
    return v


def parse_level(raw: Any) -> Compatibility:
    try:
        return Compatibility(str(raw).upper())
    except ValueError:
        raise RegistryError(
            RegistryErrorCode.INVALID_COMPATIBILITY_LEVEL,
            "Invalid compatibility level. Valid values are none, backward, forward, full, backward_transitive, "
            "forward_transitive, and full_transitive",
        ) from None


def _id_taken(known: int, wanted: int) -> RegistryError:
    return RegistryError(
        RegistryErrorCode.ID_DOES_NOT_MATCH, f"Schema already registered with id {known} instead of input id {wanted}"
    )


class SchemaRegistry:
    def __init__(self, meta: MetaStore, check_open: Callable[[], None]) -> None:
        self.meta = meta
        self._check_open = check_open
        self._parsed: OrderedDict[int, ParsedSchema] = OrderedDict()
        self._lock = threading.Lock()  # the parse cache's (calls run on executor threads)

    # ---- plumbing ------------------------------------------------------------------------------

    def _read(self, fn: Callable[[SchemaTable], Any]) -> Any:
        return self.meta.read(lambda s: fn(s.schemas))

    def _append(self, record: MetaRecord) -> None:
        self._check_open()
        self.meta.append(record).result()

    def _parse(self, stored: StoredSchema, schema_id: int | None, depth: int = 0) -> ParsedSchema:
        if schema_id is not None:
            with self._lock:
                hit = self._parsed.get(schema_id)
                if hit is not None:
                    self._parsed.move_to_end(schema_id)
                    return hit
        if depth > REFERENCE_DEPTH_MAX:
            raise RegistryError(RegistryErrorCode.INVALID_SCHEMA, "Invalid schema: references nest too deep (or form a cycle)")
        refs = [(name, self._resolve(subject, version, depth + 1)) for name, subject, version in stored.refs]
        try:
            parsed = parse_schema(SchemaType(stored.schema_type), stored.text, refs)
        except InvalidSchemaError as exc:
            raise RegistryError(RegistryErrorCode.INVALID_SCHEMA, str(exc)) from None
        if schema_id is not None:
            with self._lock:
                self._parsed[schema_id] = parsed
                while len(self._parsed) > PARSED_CACHE:
                    self._parsed.popitem(last=False)
        return parsed

    def _resolve(self, subject: str, version: int, depth: int) -> ParsedSchema:
        def find(t: SchemaTable) -> tuple[int, StoredSchema] | None:
            rv = t.subjects.get(subject, {}).get(version)
            return None if rv is None else (rv.schema_id, t.schemas[rv.schema_id])

        found = self._read(find)
        if found is None:
            raise RegistryError(
                RegistryErrorCode.INVALID_SCHEMA, f"Invalid schema: reference {subject!r} version {version} not found"
            )
        return self._parse(found[1], found[0], depth)

    # ---- reading ---------------------------------------------------------------------------------

    def subjects(self, deleted: bool = False, prefix: str = "") -> list[str]:
        def fn(t: SchemaTable) -> list[str]:
            return sorted(
                s for s, vs in t.subjects.items()
                if s.startswith(prefix) and (deleted or any(not v.deleted for v in vs.values()))
            )

        out: list[str] = self._read(fn)
        return out

    def _versions(self, t: SchemaTable, subject: str, deleted: bool) -> list[int]:
        vs = t.subjects.get(subject)
        live = [v for v, rv in (vs or {}).items() if deleted or not rv.deleted]
        if not live:
            raise RegistryError.subject_not_found(subject)
        return sorted(live)

    def versions(self, subject: str, deleted: bool = False) -> list[int]:
        out: list[int] = self._read(lambda t: self._versions(t, subject, deleted))
        return out

    def version(self, subject: str, raw_version: str, deleted: bool = False) -> dict[str, Any]:
        wanted = parse_version(raw_version)

        def fn(t: SchemaTable) -> dict[str, Any]:
            versions = self._versions(t, subject, deleted)
            if wanted is None:
                v = versions[-1]
            else:
                rv = t.subjects[subject].get(wanted)
                if rv is None or (rv.deleted and not deleted):
                    raise RegistryError.version_not_found(wanted)
                v = wanted
            rv = t.subjects[subject][v]
            return {"subject": subject, "version": v, "id": rv.schema_id, **schema_json(t.schemas[rv.schema_id])}

        out: dict[str, Any] = self._read(fn)
        return out

    def schema_by_id(self, schema_id: int, subject: str | None = None) -> dict[str, Any]:
        def fn(t: SchemaTable) -> dict[str, Any]:
            stored = t.schemas.get(schema_id)
            if stored is None or (subject is not None and not any(
                rv.schema_id == schema_id for rv in t.subjects.get(subject, {}).values()
            )):
                raise RegistryError.schema_not_found(schema_id)
            return schema_json(stored)

        out: dict[str, Any] = self._read(fn)
        return out

    def parsed_by_id(self, schema_id: int) -> ParsedSchema | None:
        """The parsed schema of an id (cached: an id's schema never changes), None if unknown."""
        stored: StoredSchema | None = self._read(lambda t: t.schemas.get(schema_id))
        return None if stored is None else self._parse(stored, schema_id)

    def id_versions(self, schema_id: int, deleted: bool = False) -> list[dict[str, Any]]:
        def fn(t: SchemaTable) -> list[dict[str, Any]]:
            if schema_id not in t.schemas:
                raise RegistryError.schema_not_found(schema_id)
            return [
                {"subject": s, "version": v}
                for s, vs in sorted(t.subjects.items())
                for v, rv in vs.items()
                if rv.schema_id == schema_id and (deleted or not rv.deleted)
            ]

        out: list[dict[str, Any]] = self._read(fn)
        return out

    def referenced_by(self, subject: str, raw_version: str) -> list[int]:
        """Ids of the schemas in use that reference the subject's version."""
        wanted = (subject, int(self.version(subject, raw_version)["version"]))

        def fn(t: SchemaTable) -> list[int]:
            return sorted(
                sid for sid, s in t.schemas.items() if t.in_use(sid) and any((rs, rv) == wanted for _, rs, rv in s.refs)
            )

        out: list[int] = self._read(fn)
        return out

    # ---- registering -----------------------------------------------------------------------------

    def _mode(self, t: SchemaTable, subject: str) -> str:
        return t.modes.get(subject) or t.modes.get("") or "READWRITE"

    def level(self, t: SchemaTable, subject: str) -> Compatibility:
        raw = t.configs.get(subject, {}).get(COMPATIBILITY_KEY) or t.configs.get("", {}).get(COMPATIBILITY_KEY)
        return Compatibility(raw) if raw else DEFAULT_COMPATIBILITY

    def _prepare(self, req: RegisterRequest, normalize: bool = False) -> tuple[StoredSchema, ParsedSchema]:
        parsed = self._parse(StoredSchema(req.schema_type, req.schema, req.refs), None)
        if normalize:
            parsed = normalized(parsed)
        return StoredSchema(req.schema_type, parsed.text, req.refs), parsed

    def _live(self, t: SchemaTable, subject: str) -> list[tuple[int, int, StoredSchema]]:
        """(version, id, schema) of the subject's versions not deleted, oldest first."""
        vs = t.subjects.get(subject, {})
        return [(v, rv.schema_id, t.schemas[rv.schema_id]) for v, rv in sorted(vs.items()) if not rv.deleted]

    def register(self, subject: str, req: RegisterRequest, normalize: bool = False) -> dict[str, Any]:
        """Register `req` under `subject` (its id when it is a live version already).

        As Confluent's: a request that names its id or version (an import) needs the subject in
        IMPORT mode and is not checked for compatibility; one that names neither needs READWRITE.
        """
        stored, parsed = self._prepare(req, normalize)
        importing = req.schema_id is not None or req.version is not None
        for _ in range(WRITE_TRIES):
            def decide(t: SchemaTable) -> tuple[int, int | None, str, Compatibility, list[tuple[int, int, StoredSchema]]]:
                mode = self._mode(t, subject)
                live = self._live(t, subject)
                for v, i, s in live:
                    if s == stored and (req.version is None or req.version == v):
                        if req.schema_id is not None and req.schema_id != i:
                            raise _id_taken(i, req.schema_id)
                        return i, None, mode, self.level(t, subject), live
                versions = t.subjects.get(subject, {})
                held = versions.get(req.version) if req.version is not None else None
                if held is not None and t.schemas[held.schema_id] == stored and req.schema_id in (None, held.schema_id):
                    return held.schema_id, None, mode, self.level(t, subject), live  # imported before (soft-deleted since)
                newest = max(versions) if versions else 0
                if not importing:
                    return t.ids.get(stored, t.next_id), newest + 1, mode, self.level(t, subject), live
                if mode != "IMPORT":
                    return 0, 0, mode, self.level(t, subject), live
                return self._import_id(t, stored, req), self._import_version(subject, newest, req), mode, self.level(t, subject), live

            schema_id, version, mode, level, live = self._read(decide)
            if version is None:
                return {"id": schema_id}
            if mode in ("READONLY", "READONLY_OVERRIDE"):
                raise RegistryError(RegistryErrorCode.OPERATION_NOT_PERMITTED, f"Subject {subject} is in read-only mode")
            if importing and mode != "IMPORT":
                raise RegistryError(RegistryErrorCode.OPERATION_NOT_PERMITTED, f"Subject {subject} is not in import mode")
            if not importing and mode != "READWRITE":
                raise RegistryError(RegistryErrorCode.OPERATION_NOT_PERMITTED, f"Subject {subject} is not in read-write mode")
            # An import replays a history as it was: its schemas were checked when they were registered
            reasons = [] if importing else check(level, parsed, [self._parse(s, i) for _, i, s in live])
            if reasons:
                raise RegistryError(
                    RegistryErrorCode.INCOMPATIBLE_SCHEMA,
                    f"Schema being registered is incompatible with an earlier schema for subject \"{subject}\", "
                    f"details: {reasons}",
                )
            try:
                self._append(SchemaVersion(subject, version, schema_id, stored.schema_type, stored.text, stored.refs))
            except MetaRecordRejectedError:
                continue  # another broker registered first: decide again from the state it left
            return {"id": schema_id}
        raise RegistryError(RegistryErrorCode.STORE_ERROR, "Error while registering the schema: too many concurrent writers")

    @staticmethod
    def _import_id(t: SchemaTable, stored: StoredSchema, req: RegisterRequest) -> int:
        """The id an import gives `stored`: the one asked for, if it is free or is this schema's.
        An id below the next free one that no schema holds (one permanently deleted) is refused:
        loglake never hands an id out twice (loglake.meta.schemas)."""
        known = t.ids.get(stored)
        wanted = req.schema_id
        if wanted is None:
            return known if known is not None else t.next_id
        if known is not None and known != wanted:
            raise _id_taken(known, wanted)
        holder = t.schemas.get(wanted)
        if holder is not None and holder != stored:
            raise RegistryError(
                RegistryErrorCode.ID_DOES_NOT_MATCH,
                f"Overwrite new schema with id {wanted} is not permitted: the id holds another schema",
            )
        if holder is None and wanted < t.next_id:
            raise RegistryError(
                RegistryErrorCode.ID_DOES_NOT_MATCH,
                f"Schema id {wanted} is below the registry's next free id {t.next_id}; "
                "loglake never hands an id out twice (import schemas in the order of their ids)",
            )
        return wanted

    @staticmethod
    def _import_version(subject: str, newest: int, req: RegisterRequest) -> int:
        if req.version is None:
            return newest + 1
        if req.version <= newest:
            raise RegistryError(
                RegistryErrorCode.INVALID_VERSION,
                f"Version {req.version} of subject {subject} is not above its newest version {newest}",
            )
        return req.version

    def lookup(self, subject: str, req: RegisterRequest, deleted: bool = False, normalize: bool = False) -> dict[str, Any]:
        """The subject's version holding exactly this schema (POST /subjects/{subject})."""
        stored, _ = self._prepare(req, normalize)

        def fn(t: SchemaTable) -> dict[str, Any]:
            vs = t.subjects.get(subject)
            if not vs or not (deleted or any(not rv.deleted for rv in vs.values())):
                raise RegistryError.subject_not_found(subject)
            for v, rv in sorted(vs.items(), reverse=True):
                if t.schemas[rv.schema_id] == stored and (deleted or not rv.deleted):
                    return {"subject": subject, "version": v, "id": rv.schema_id, **schema_json(stored)}
            raise RegistryError.schema_not_found()

        out: dict[str, Any] = self._read(fn)
        return out

    def test_compatibility(
        self, subject: str, raw_version: str | None, req: RegisterRequest, normalize: bool = False
    ) -> list[str]:
        """Why `req` is incompatible with the subject's version (None: all the level names)."""
        _, parsed = self._prepare(req, normalize)
        wanted = None if raw_version is None else parse_version(raw_version)

        def fn(t: SchemaTable) -> tuple[Compatibility, list[tuple[int, int, StoredSchema]]]:
            live = self._live(t, subject)
            if raw_version is not None:
                if not live:
                    raise RegistryError.subject_not_found(subject)
                chosen = live[-1:] if wanted is None else [x for x in live if x[0] == wanted]
                if not chosen:
                    raise RegistryError.version_not_found(raw_version)
                return self.level(t, subject), chosen
            return self.level(t, subject), live

        level, against = self._read(fn)
        return check(level, parsed, [self._parse(s, i) for _, i, s in against])

    # ---- deleting ---------------------------------------------------------------------------------

    def _referenced(self, t: SchemaTable, subject: str, versions: Sequence[int]) -> bool:
        wanted = {(subject, v) for v in versions}
        return any(
            (s, v) in wanted
            for sid, stored in t.schemas.items()
            if t.in_use(sid)
            for _, s, v in stored.refs
        )

    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        def fn(t: SchemaTable) -> list[int]:
            vs = t.subjects.get(subject)
            if not vs:
                raise RegistryError.subject_not_found(subject)
            if permanent:
                if any(not rv.deleted for rv in vs.values()):
                    raise RegistryError(
                        RegistryErrorCode.SUBJECT_NOT_SOFT_DELETED,
                        f"Subject '{subject}' was not deleted first before being permanently deleted",
                    )
                return sorted(vs)
            live = [v for v, rv in sorted(vs.items()) if not rv.deleted]
            if not live:
                raise RegistryError(
                    RegistryErrorCode.SUBJECT_SOFT_DELETED,
                    f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently",
                )
            if self._referenced(t, subject, live):
                raise RegistryError(
                    RegistryErrorCode.REFERENCE_EXISTS, f"One or more references exist to the schema {{subject={subject}}}"
                )
            return live

        versions: list[int] = self._read(fn)
        self._append(SchemaDeleted(subject, versions, permanent))
        if permanent:
            self._append(SchemaConfig(subject, {}))
            self._append(SchemaMode(subject, None))
        return versions

    def delete_version(self, subject: str, raw_version: str, permanent: bool) -> int:
        wanted = parse_version(raw_version)

        def fn(t: SchemaTable) -> int:
            vs = t.subjects.get(subject)
            if not vs:
                raise RegistryError.subject_not_found(subject)
            if wanted is None:
                live = [v for v, rv in vs.items() if not rv.deleted]
                if not live:
                    raise RegistryError.version_not_found(raw_version)
                v = max(live)
            else:
                v = wanted
            rv = vs.get(v)
            if rv is None:
                raise RegistryError.version_not_found(v)
            if permanent and not rv.deleted:
                raise RegistryError(
                    RegistryErrorCode.SCHEMAVERSION_NOT_SOFT_DELETED,
                    f"Subject '{subject}' Version {v} was not deleted first before being permanently deleted",
                )
            if not permanent and rv.deleted:
                raise RegistryError(
                    RegistryErrorCode.SCHEMAVERSION_SOFT_DELETED,
                    f"Subject '{subject}' Version {v} was soft deleted.Set permanent=true to delete permanently",
                )
            if self._referenced(t, subject, [v]):
                raise RegistryError(
                    RegistryErrorCode.REFERENCE_EXISTS,
                    f"One or more references exist to the schema {{subject={subject},version={v}}}",
                )
            return v

        version: int = self._read(fn)
        self._append(SchemaDeleted(subject, [version], permanent))
        return version

    # ---- config and mode ----------------------------------------------------------------------------

    def get_config(self, subject: str, default_to_global: bool) -> dict[str, Any]:
        """Subject "" is the global config."""
        def fn(t: SchemaTable) -> dict[str, Any]:
            own = t.configs.get(subject, {}).get(COMPATIBILITY_KEY)
            if own is None and subject and not default_to_global:
                raise RegistryError(
                    RegistryErrorCode.SUBJECT_LEVEL_COMPATIBILITY_NOT_CONFIGURED,
                    f"Subject '{subject}' does not have subject-level compatibility configured",
                )
            return {COMPATIBILITY_KEY: str(self.level(t, subject))}

        out: dict[str, Any] = self._read(fn)
        return out

    def set_config(self, subject: str, body: Any) -> dict[str, Any]:
        raw = body.get("compatibility") if isinstance(body, dict) else None
        level = parse_level(raw)
        self._append(SchemaConfig(subject, {COMPATIBILITY_KEY: str(level)}))
        return {"compatibility": str(level)}

    def delete_config(self, subject: str) -> dict[str, Any]:
        old = self.get_config(subject, default_to_global=not subject)
        self._append(SchemaConfig(subject, {}))
        return old

    def get_mode(self, subject: str, default_to_global: bool) -> dict[str, Any]:
        def fn(t: SchemaTable) -> dict[str, Any]:
            own = t.modes.get(subject)
            if own is None and subject and not default_to_global:
                raise RegistryError(
                    RegistryErrorCode.SUBJECT_LEVEL_MODE_NOT_CONFIGURED,
                    f"Subject '{subject}' does not have subject-level mode configured",
                )
            return {"mode": self._mode(t, subject)}

        out: dict[str, Any] = self._read(fn)
        return out

    def set_mode(self, subject: str, body: Any, force: bool = False) -> dict[str, Any]:
        """Set the subject's mode ("" the global one). IMPORT is refused where subjects hold
        live versions (the subject, or any for the global mode) unless `force` (Confluent's)."""
        mode = str(body.get("mode", "")).upper() if isinstance(body, dict) else ""
        if mode not in MODES:
            raise RegistryError(
                RegistryErrorCode.INVALID_MODE,
                "Invalid mode. Valid values are READWRITE, READONLY, READONLY_OVERRIDE, and IMPORT.",
            )
        if mode == "IMPORT" and not force:
            def occupied(t: SchemaTable) -> bool:
                if t.modes.get(subject) == "IMPORT":
                    return False
                held = [subject] if subject else list(t.subjects)
                return any(not rv.deleted for s in held for rv in t.subjects.get(s, {}).values())

            if self._read(occupied):
                raise RegistryError(
                    RegistryErrorCode.OPERATION_NOT_PERMITTED,
                    "Cannot import since found existing subjects (set force=true to import anyway)",
                )
        self._append(SchemaMode(subject, mode))
        return {"mode": mode}

    def delete_mode(self, subject: str) -> dict[str, Any]:
        old = self.get_mode(subject, default_to_global=False)
        self._append(SchemaMode(subject, None))
        return old
