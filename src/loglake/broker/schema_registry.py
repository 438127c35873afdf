"""Serving the schema registry's REST API (`--schema-registry-listen [http://|https://]HOST:PORT`).

The broker's HTTP server (loglake.broker.http) on the broker's loop takes the requests; each is
answered by loglake.registry's `RegistryApi` on a worker thread (a write waits until its record is
durable, in cluster mode committed in etcd), so the loop never blocks on it. The registry is the
engine's: every broker of a cluster serves the one registry its metadata holds. Over HTTPS
with the broker's certificate (`tls`); each request's caller is authenticated and authorized by
`RegistryAuth` (loglake.broker.security.registry_auth) before the API sees it.
"""

from __future__ import annotations

import asyncio
import importlib
import ssl

from loglake.broker.http import HttpLimits, HttpRequest, HttpResponse, HttpServer, serve_http
from loglake.broker.security.registry_auth import WWW_AUTHENTICATE, RegistryAuth, Unauthenticated
from loglake.engine import Engine
from loglake.extras import MissingExtraError
from loglake.registry import CONTENT_TYPE, RegistryApi, SchemaRegistry
from loglake.registry.api import encode_answer
from loglake.registry.errors import RegistryError

__all__ = ["REGISTRY_LIMITS", "serve_schema_registry"]

#: The registry endpoint's bounds: a schema of up to 1 MiB in its JSON request (a metadata record
#: holds at most 16 MiB), clients that keep their connection (confluent-kafka's does).
REGISTRY_LIMITS = HttpLimits(
    head_bytes=16 * 1024,
    headers_max=100,
    body_bytes=1024 * 1024,
    connections_max=256,
    timeout_s=30.0,
    requests_per_connection=10_000,
)

#: The modules the registry's formats need (the 'registry' extra), checked at start-up so a
#: missing one is one line at `serve`, not a 500 at the first schema.
_NEEDED = ("fastavro", "avro", "jsonschema", "proto_schema_parser", "google.protobuf")


def check_extra() -> None:
    for module in _NEEDED:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            raise MissingExtraError("the schema registry (--schema-registry-listen)", module) from None


def _unauthorized() -> HttpResponse:
    err = RegistryError.unauthorized()
    body = encode_answer({"error_code": int(err.code), "message": err.message})
    return HttpResponse(err.code.http_status, body, CONTENT_TYPE, {"WWW-Authenticate": WWW_AUTHENTICATE})


async def serve_schema_registry(
    host: str, port: int, engine: Engine, auth: RegistryAuth, tls: ssl.SSLContext | None = None
) -> HttpServer:
    """Serve the open `engine`'s registry on host:port (HTTPS with `tls`) to callers `auth` admits."""
    check_extra()
    api = RegistryApi(SchemaRegistry(engine.meta, engine.check_writable))
    loop = asyncio.get_running_loop()

    async def handle(request: HttpRequest) -> HttpResponse:
        try:
            caller = await auth.caller(request)
        except Unauthenticated:
            return _unauthorized()
        status, doc = await loop.run_in_executor(
            None, api.handle, request.method, request.path, request.query, request.body, caller
        )
        return HttpResponse(status, encode_answer(doc), CONTENT_TYPE)

    return await serve_http(host, port, handle, REGISTRY_LIMITS, "schema registry", tls)
