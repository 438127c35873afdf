"""Confluent's Schema Registry REST API over a `SchemaRegistry`: routes and JSON answers.

`RegistryApi.handle(method, path, query, body)` answers one request as (HTTP status, JSON
document); it blocks (a write waits until its record is durable), so the broker's HTTP server
calls it off the event loop. Errors are Confluent's: ``{"error_code": N, "message": "..."}``
with the code's HTTP status (loglake.registry.errors). Content type of every answer:
`CONTENT_TYPE`.

Routes (Confluent's, as confluent-kafka's SchemaRegistryClient calls them):
``/subjects`` GET; ``/subjects/{s}`` POST (lookup) and DELETE; ``/subjects/{s}/versions`` GET
and POST (register); ``/subjects/{s}/versions/{v}`` GET and DELETE (v a number, ``latest`` or -1);
``/subjects/{s}/versions/{v}/schema`` GET (the bare text); ``/subjects/{s}/versions/{v}/referencedby``
GET; ``/schemas/ids/{id}`` GET (+ ``/schema``, ``/subjects``, ``/versions``); ``/schemas/types``
GET; ``/config`` and ``/config/{s}`` GET, PUT, DELETE; ``/mode`` and ``/mode/{s}`` GET, PUT,
DELETE (``PUT /mode?force=true``: IMPORT on a registry that holds subjects);
``/compatibility/subjects/{s}/versions/{v}`` and ``/compatibility/subjects/{s}/versions`` POST;
``/`` GET ({}). Register, lookup and compatibility take ``?normalize=true``.

Access: each request needs an operation on a resource, Redpanda's schema registry ACLs (its
table of endpoints, operations and resources, v25.2): a subject (``SUBJECT``) or the registry
as a whole (``REGISTRY``: the global config and mode, ``/schemas/ids/{id}/versions``,
``.../referencedby``). `handle` asks the `Guard` it is given (the broker's authorizer for the
request's principal; `OPEN` by default) and answers FORBIDDEN when it refuses; ``/subjects`` and
``/schemas/ids/{id}/subjects`` list only the subjects the caller may DESCRIBE, and
``/schemas/ids/{id}`` needs READ on one of the subjects that hold the schema (on the REGISTRY
when none does any more). `ACCESS` is the
table, one row a route.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import unquote

from loglake.errors import LoglakeError
from loglake.registry.errors import RegistryError, RegistryErrorCode
from loglake.registry.formats import SchemaType
from loglake.registry.service import RegisterRequest, SchemaRegistry

__all__ = ["ACCESS", "CONTENT_TYPE", "OPEN", "Answer", "Guard", "On", "Op", "RawText", "RegistryApi", "encode_answer"]

#: The content type of every answer (Confluent's v1).
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

#: (HTTP status, JSON-able document)
Answer = tuple[int, Any]


class Op(enum.StrEnum):
    """What a request does to its resource, by the names of Kafka's ACL operations."""

    READ = "READ"
    WRITE = "WRITE"
    DELETE = "DELETE"
    DESCRIBE = "DESCRIBE"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    ALTER_CONFIGS = "ALTER_CONFIGS"


class On(enum.StrEnum):
    """What a request acts on: one subject, or the registry as a whole (Redpanda's resource types)."""

    SUBJECT = "SUBJECT"
    REGISTRY = "REGISTRY"


#: (method, route) -> what it needs; None: open to anyone (authenticated, when the broker asks
#: for credentials). The routes as the module doc writes them; ``{s}`` is the subject checked.
ACCESS: dict[tuple[str, str], tuple[Op, On] | None] = {
    ("GET", "/"): None,
    ("GET", "/subjects"): (Op.DESCRIBE, On.SUBJECT),  # lists only those
    ("POST", "/subjects/{s}"): (Op.READ, On.SUBJECT),
    ("DELETE", "/subjects/{s}"): (Op.DELETE, On.SUBJECT),
    ("GET", "/subjects/{s}/versions"): (Op.DESCRIBE, On.SUBJECT),
    ("POST", "/subjects/{s}/versions"): (Op.WRITE, On.SUBJECT),
    ("GET", "/subjects/{s}/versions/{v}"): (Op.READ, On.SUBJECT),
    ("DELETE", "/subjects/{s}/versions/{v}"): (Op.DELETE, On.SUBJECT),
    ("GET", "/subjects/{s}/versions/{v}/schema"): (Op.READ, On.SUBJECT),
    ("GET", "/subjects/{s}/versions/{v}/referencedby"): (Op.DESCRIBE, On.REGISTRY),
    ("GET", "/schemas/types"): None,
    ("GET", "/schemas/ids/{id}"): (Op.READ, On.SUBJECT),  # on one subject holding it
    ("GET", "/schemas/ids/{id}/schema"): (Op.READ, On.SUBJECT),  # on one subject holding it
    ("GET", "/schemas/ids/{id}/subjects"): (Op.DESCRIBE, On.SUBJECT),  # lists only those
    ("GET", "/schemas/ids/{id}/versions"): (Op.DESCRIBE, On.REGISTRY),
    ("GET", "/config"): (Op.DESCRIBE_CONFIGS, On.REGISTRY),
    ("PUT", "/config"): (Op.ALTER_CONFIGS, On.REGISTRY),
    ("DELETE", "/config"): (Op.ALTER_CONFIGS, On.REGISTRY),
    ("GET", "/config/{s}"): (Op.DESCRIBE_CONFIGS, On.SUBJECT),
    ("PUT", "/config/{s}"): (Op.ALTER_CONFIGS, On.SUBJECT),
    ("DELETE", "/config/{s}"): (Op.ALTER_CONFIGS, On.SUBJECT),
    ("GET", "/mode"): (Op.DESCRIBE_CONFIGS, On.REGISTRY),
    ("PUT", "/mode"): (Op.ALTER_CONFIGS, On.REGISTRY),
    ("DELETE", "/mode"): (Op.ALTER_CONFIGS, On.REGISTRY),
    ("GET", "/mode/{s}"): (Op.DESCRIBE_CONFIGS, On.SUBJECT),
    ("PUT", "/mode/{s}"): (Op.ALTER_CONFIGS, On.SUBJECT),
    ("DELETE", "/mode/{s}"): (Op.ALTER_CONFIGS, On.SUBJECT),
    ("POST", "/compatibility/subjects/{s}/versions"): (Op.READ, On.SUBJECT),
    ("POST", "/compatibility/subjects/{s}/versions/{v}"): (Op.READ, On.SUBJECT),
}


class Guard(Protocol):
    """Who asks, and what they may do (the broker's authorizer for the request's principal)."""

    def allows(self, op: Op, on: On, subject: str) -> bool:
        """Whether the caller may `op` the subject (`subject` is "" for the REGISTRY resource)."""
        ...

    def refused(self, op: Op, on: On, subjects: list[str]) -> None:
        """A request was refused for want of `op` on these subjects (none: the REGISTRY)."""
        ...


class _Open:
    def allows(self, op: Op, on: On, subject: str) -> bool:
        return True

    def refused(self, op: Op, on: On, subjects: list[str]) -> None:
        pass


#: Everyone may do everything (the registry without the broker's authorizer).
OPEN: Guard = _Open()


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "false").lower() == "true"


class RegistryApi:
    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    def handle(self, method: str, path: str, query: Mapping[str, str], body: bytes, guard: Guard = OPEN) -> Answer:
        """One request's answer, for a caller `guard` says what of; never raises for a request
        the API refuses."""
        try:
            parts = [unquote(p) for p in path.strip("/").split("/") if p]
            return 200, self._route(method, parts, query, body, _Access(guard, method))
        except RegistryError as exc:
            return exc.code.http_status, {"error_code": int(exc.code), "message": exc.message}
        except LoglakeError as exc:  # the metadata store refused: closing, failed, a record that lost a race
            code = RegistryErrorCode.STORE_ERROR
            return code.http_status, {"error_code": int(code), "message": f"Error in the backend data store: {exc}"}

    def _body(self, body: bytes) -> Any:
        try:
            return json.loads(body or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RegistryError(RegistryErrorCode.BAD_REQUEST, f"Unrecognized request body: {exc}") from None

    def _route(self, method: str, parts: list[str], query: Mapping[str, str], body: bytes, access: _Access) -> Any:
        r = self.registry
        deleted = _flag(query, "deleted")
        normalize = _flag(query, "normalize")
        n = len(parts)
        if n == 0:
            return self._only(method, "GET", {})  # open
        head = parts[0]
        if head == "subjects":
            if n == 1:
                self._only(method, "GET")
                return access.visible("/subjects", r.subjects(deleted, query.get("subjectPrefix", "")))
            subject = parts[1]
            if n == 2:
                if method == "POST":
                    access.need("/subjects/{s}", subject)
                    return r.lookup(subject, RegisterRequest.from_json(self._body(body)), deleted, normalize)
                self._only(method, "DELETE")
                access.need("/subjects/{s}", subject)
                return r.delete_subject(subject, _flag(query, "permanent"))
            if parts[2] != "versions":
                raise self._not_found()
            if n == 3:
                if method == "POST":
                    access.need("/subjects/{s}/versions", subject)
                    return r.register(subject, RegisterRequest.from_json(self._body(body)), normalize)
                self._only(method, "GET")
                access.need("/subjects/{s}/versions", subject)
                return r.versions(subject, deleted)
            version = parts[3]
            if n == 4:
                if method != "DELETE":
                    self._only(method, "GET")
                access.need("/subjects/{s}/versions/{v}", subject)
                if method == "DELETE":
                    return r.delete_version(subject, version, _flag(query, "permanent"))
                return r.version(subject, version, deleted)
            if n == 5 and parts[4] == "schema":
                self._only(method, "GET")
                access.need("/subjects/{s}/versions/{v}/schema", subject)
                return RawText(r.version(subject, version, deleted)["schema"])
            if n == 5 and parts[4] == "referencedby":
                self._only(method, "GET")
                access.need("/subjects/{s}/versions/{v}/referencedby")
                return r.referenced_by(subject, version)
            raise self._not_found()
        if head == "schemas":
            if n == 2 and parts[1] == "types":
                self._only(method, "GET")
                return [t.value for t in SchemaType]
            if n >= 3 and parts[1] == "ids":
                self._only(method, "GET")
                schema_id = self._id(parts[2])
                if n == 3:
                    access.need_one("/schemas/ids/{id}", self._holders(schema_id))
                    return r.schema_by_id(schema_id, query.get("subject"))
                if n == 4 and parts[3] == "schema":
                    access.need_one("/schemas/ids/{id}/schema", self._holders(schema_id))
                    return RawText(r.schema_by_id(schema_id, query.get("subject"))["schema"])
                if n == 4 and parts[3] == "subjects":
                    held = sorted({row["subject"] for row in r.id_versions(schema_id, deleted)})
                    return access.visible("/schemas/ids/{id}/subjects", held)
                if n == 4 and parts[3] == "versions":
                    access.need("/schemas/ids/{id}/versions")
                    return r.id_versions(schema_id, deleted)
            raise self._not_found()
        if head in ("config", "mode") and n <= 2:
            subject = parts[1] if n == 2 else ""
            fallback = _flag(query, "defaultToGlobal")
            if method not in ("GET", "PUT"):
                self._only(method, "DELETE")
            access.need(f"/{head}/{{s}}" if subject else f"/{head}", subject)
            if method == "GET":
                return r.get_config(subject, fallback) if head == "config" else r.get_mode(subject, fallback)
            if method == "PUT":
                doc = self._body(body)
                return r.set_config(subject, doc) if head == "config" else r.set_mode(subject, doc, _flag(query, "force"))
            self._only(method, "DELETE")
            return r.delete_config(subject) if head == "config" else r.delete_mode(subject)
        if head == "compatibility" and n in (4, 5) and parts[1] == "subjects" and parts[3] == "versions":
            self._only(method, "POST")
            access.need("/compatibility/subjects/{s}/versions" + ("/{v}" if n == 5 else ""), parts[2])
            reasons = r.test_compatibility(
                parts[2], parts[4] if n == 5 else None, RegisterRequest.from_json(self._body(body)), normalize
            )
            out: dict[str, Any] = {"is_compatible": not reasons}
            if _flag(query, "verbose"):
                out["messages"] = reasons
            return out
        raise self._not_found()

    def _holders(self, schema_id: int) -> list[str] | None:
        """The subjects that hold the schema (soft-deleted versions too: the id is still served);
        None when there is no such schema."""
        try:
            return sorted({row["subject"] for row in self.registry.id_versions(schema_id, True)})
        except RegistryError:
            return None  # the lookup answers it (schema not found)

    @staticmethod
    def _id(raw: str) -> int:
        try:
            return int(raw)
        except ValueError:
            raise RegistryError.schema_not_found() from None

    @staticmethod
    def _only(method: str, allowed: str, answer: Any = None) -> Any:
        if method != allowed:
            raise RegistryError(RegistryErrorCode.METHOD_NOT_ALLOWED, "HTTP 405 Method Not Allowed")
        return answer

    @staticmethod
    def _not_found() -> RegistryError:
        return RegistryError(RegistryErrorCode.NOT_FOUND, "HTTP 404 Not Found")


class _Access:
    """One request's checks against `ACCESS` (its method's rows) through the caller's guard."""

    def __init__(self, guard: Guard, method: str) -> None:
        self.guard = guard
        self.method = method

    def _rule(self, route: str) -> tuple[Op, On]:
        rule = ACCESS[(self.method, route)]
        assert rule is not None, f"{self.method} {route} is open"
        return rule

    def need(self, route: str, subject: str = "") -> None:
        """FORBIDDEN unless the caller may do what the route does (to `subject`, for a SUBJECT route)."""
        op, on = self._rule(route)
        if not self.guard.allows(op, on, subject):
            self.guard.refused(op, on, [subject] if on is On.SUBJECT else [])
            raise RegistryError.forbidden(op.value, on.value, subject if on is On.SUBJECT else "")

    def need_one(self, route: str, subjects: list[str] | None) -> None:
        """FORBIDDEN unless the caller may do what the route does to one of `subjects` (None: no
        such schema, the lookup answers it; none: a schema no subject holds, the same operation
        on the REGISTRY)."""
        op, on = self._rule(route)
        if subjects is None:
            return
        if not subjects:
            if not self.guard.allows(op, On.REGISTRY, ""):
                self.guard.refused(op, On.REGISTRY, [])
                raise RegistryError.forbidden(op.value, On.REGISTRY.value, "")
            return
        if not any(self.guard.allows(op, on, s) for s in subjects):
            self.guard.refused(op, on, subjects)
            raise RegistryError.forbidden(op.value, on.value, "")

    def visible(self, route: str, subjects: list[str]) -> list[str]:
        """The subjects of a list the caller may see."""
        op, on = self._rule(route)
        return [s for s in subjects if self.guard.allows(op, on, s)]


class RawText(str):
    """An answer that is the schema's text itself (``.../schema``), not a JSON string of it."""

    __slots__ = ()


def encode_answer(doc: Any) -> bytes:
    """The answer's bytes: a RawText as it is, anything else as JSON."""
    if isinstance(doc, RawText):
        return str(doc).encode()
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()

