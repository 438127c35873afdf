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
DELETE; ``/compatibility/subjects/{s}/versions/{v}`` and ``/compatibility/subjects/{s}/versions``
POST; ``/`` GET ({}).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from loglake.errors import LoglakeError
from loglake.registry.errors import RegistryError, RegistryErrorCode
from loglake.registry.formats import SchemaType
from loglake.registry.service import RegisterRequest, SchemaRegistry

__all__ = ["CONTENT_TYPE", "Answer", "RawText", "RegistryApi", "encode_answer"]

#: The content type of every answer (Confluent's v1).
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

#: (HTTP status, JSON-able document)
Answer = tuple[int, Any]


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "false").lower() == "true"


class RegistryApi:
    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    def handle(self, method: str, path: str, query: Mapping[str, str], body: bytes) -> Answer:
        """One request's answer; never raises for a request the API refuses."""
        try:
            return 200, self._route(method, [unquote(p) for p in path.strip("/").split("/") if p], query, body)
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

    def _route(self, method: str, parts: list[str], query: Mapping[str, str], body: bytes) -> Any:
        r = self.registry
        deleted = _flag(query, "deleted")
        n = len(parts)
        if n == 0:
            return self._only(method, "GET", {})
        head = parts[0]
        if head == "subjects":
            if n == 1:
                self._only(method, "GET")
                return r.subjects(deleted, query.get("subjectPrefix", ""))
            subject = parts[1]
            if n == 2:
                if method == "POST":
                    return r.lookup(subject, RegisterRequest.from_json(self._body(body)), deleted)
                self._only(method, "DELETE")
                return r.delete_subject(subject, _flag(query, "permanent"))
            if parts[2] != "versions":
                raise self._not_found()
            if n == 3:
                if method == "POST":
                    return r.register(subject, RegisterRequest.from_json(self._body(body)))
                self._only(method, "GET")
                return r.versions(subject, deleted)
            version = parts[3]
            if n == 4:
                if method == "DELETE":
                    return r.delete_version(subject, version, _flag(query, "permanent"))
                self._only(method, "GET")
                return r.version(subject, version, deleted)
            if n == 5 and parts[4] == "schema":
                self._only(method, "GET")
                return RawText(r.version(subject, version, deleted)["schema"])
            if n == 5 and parts[4] == "referencedby":
                self._only(method, "GET")
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
                    return r.schema_by_id(schema_id, query.get("subject"))
                if n == 4 and parts[3] == "schema":
                    return RawText(r.schema_by_id(schema_id, query.get("subject"))["schema"])
                if n == 4 and parts[3] == "subjects":
                    return sorted({row["subject"] for row in r.id_versions(schema_id, deleted)})
                if n == 4 and parts[3] == "versions":
                    return r.id_versions(schema_id, deleted)
            raise self._not_found()
        if head in ("config", "mode") and n <= 2:
            subject = parts[1] if n == 2 else ""
            fallback = _flag(query, "defaultToGlobal")
            if method == "GET":
                return r.get_config(subject, fallback) if head == "config" else r.get_mode(subject, fallback)
            if method == "PUT":
                doc = self._body(body)
                return r.set_config(subject, doc) if head == "config" else r.set_mode(subject, doc)
            self._only(method, "DELETE")
            return r.delete_config(subject) if head == "config" else r.delete_mode(subject)
        if head == "compatibility" and n in (4, 5) and parts[1] == "subjects" and parts[3] == "versions":
            self._only(method, "POST")
            reasons = r.test_compatibility(parts[2], parts[4] if n == 5 else None, RegisterRequest.from_json(self._body(body)))
            out: dict[str, Any] = {"is_compatible": not reasons}
            if _flag(query, "verbose"):
                out["messages"] = reasons
            return out
        raise self._not_found()

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


class RawText(str):
    """An answer that is the schema's text itself (``.../schema``), not a JSON string of it."""

    __slots__ = ()


def encode_answer(doc: Any) -> bytes:
    """The answer's bytes: a RawText as it is, anything else as JSON."""
    if isinstance(doc, RawText):
        return str(doc).encode()
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()

