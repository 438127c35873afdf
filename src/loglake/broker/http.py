"""The broker's one small HTTP/1.1 server, on its asyncio loop: /metrics and the health endpoints
(loglake.broker.metrics) and the schema registry's REST API (`--schema-registry-listen`).

Bounded in every dimension a client controls: the request head (`HttpLimits.head_bytes`, also
the stream's buffer), the number of header lines, the body (Content-Length only, at most
`body_bytes`; chunked bodies are refused with 411), the connections open at once (one past the
limit is answered 503 and closed), the time to send a head (and a body, and an idle keep-alive
connection's next request: `timeout_s`) and the requests one connection may make. A handler is
given the request whole and answers one response; what it raises is logged and answered 500.

With an `ssl.SSLContext` (the broker's, `loglake.broker.security.tls.server_context`) the endpoint
is HTTPS: the handshake must finish within `HANDSHAKE_TIMEOUT_S`, and a verified client
certificate's subject DN comes with each request of the connection (`HttpRequest.peer_dn`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, urlsplit

from loglake.broker.security.tls import HANDSHAKE_TIMEOUT_S, subject_dn

__all__ = ["HttpLimits", "HttpRequest", "HttpResponse", "HttpServer", "serve_http"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HttpLimits:
    #: largest request head (request line and headers)
    head_bytes: int = 8192
    #: most header lines
    headers_max: int = 64
    #: largest body (0: requests carry none)
    body_bytes: int = 0
    #: most connections open at once
    connections_max: int = 64
    #: longest wait for a head, a body or an idle connection's next request
    timeout_s: float = 10.0
    #: most requests one connection makes (1: every answer closes the connection)
    requests_per_connection: int = 1


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    #: the path without its query, as sent (percent-escapes kept: the handler splits, then unquotes)
    path: str
    query: dict[str, str]
    #: header names in lower case
    headers: dict[str, str]
    body: bytes = b""
    #: the client's address
    peer_host: str = ""
    #: over HTTPS, the subject DN (RFC 2253) of the client certificate the handshake verified
    peer_dn: str | None = None


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str = "text/plain"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class _Refused(Exception):
    def __init__(self, status: HTTPStatus) -> None:
        self.status = status


def _text(status: HTTPStatus) -> HttpResponse:
    return HttpResponse(int(status), f"{status.phrase}\n".encode())


async def _read_request(
    reader: asyncio.StreamReader, limits: HttpLimits, peer_host: str = "", peer_dn: str | None = None
) -> HttpRequest | None:
    """The next request, None at a clean end of the connection."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=limits.timeout_s)
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise _Refused(HTTPStatus.BAD_REQUEST) from None
        return None
    except asyncio.LimitOverrunError:
        raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) from None
    if len(head) > limits.head_bytes:
        raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(HTTPStatus.BAD_REQUEST)
    if len(lines) - 1 > limits.headers_max:
        raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise _Refused(HTTPStatus.BAD_REQUEST)
        headers[name.strip().lower()] = value.strip()
    if "transfer-encoding" in headers:
        raise _Refused(HTTPStatus.LENGTH_REQUIRED)
    body = b""
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise _Refused(HTTPStatus.BAD_REQUEST) from None
        if length < 0:
            raise _Refused(HTTPStatus.BAD_REQUEST)
        if length > limits.body_bytes:
            raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        try:
            body = await asyncio.wait_for(reader.readexactly(length), timeout=limits.timeout_s)
        except asyncio.IncompleteReadError:
            return None
    target = urlsplit(parts[1])
    return HttpRequest(parts[0], target.path or "/", dict(parse_qsl(target.query)), headers, body, peer_host, peer_dn)


def _encode(response: HttpResponse, keep_alive: bool) -> bytes:
    try:
        phrase = HTTPStatus(response.status).phrase
    except ValueError:
        phrase = ""
    extra = "".join(f"{k}: {v}\r\n" for k, v in response.headers.items())
    return (
        f"HTTP/1.1 {response.status} {phrase}\r\nContent-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n{extra}Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode() + response.body


class HttpServer:
    """A serving endpoint: `close` stops accepting and closes the connections open (a keep-alive
    one waiting for its next request ends at once, not when the loop is torn down)."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.close()


def _peer(writer: asyncio.StreamWriter) -> tuple[str, str | None]:
    """The connection's client address, and the subject DN of its verified client certificate."""
    peer = writer.get_extra_info("peername")
    host = str(peer[0]) if isinstance(peer, tuple) else ""
    obj = writer.get_extra_info("ssl_object")
    cert = obj.getpeercert() if isinstance(obj, ssl.SSLObject) else None
    return host, (subject_dn(cert) if cert else None)


async def serve_http(
    host: str, port: int, handler: Handler, limits: HttpLimits, name: str, tls: ssl.SSLContext | None = None
) -> HttpServer:
    """Serve `handler` on host:port (HTTPS with `tls`); `name` says which endpoint in logs."""
    served = HttpServer()
    writers = served.writers

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        try:
            if len(writers) > limits.connections_max:
                writer.write(_encode(_text(HTTPStatus.SERVICE_UNAVAILABLE), False))
                await writer.drain()
                return
            peer_host, peer_dn = _peer(writer)
            for served in range(1, limits.requests_per_connection + 1):
                try:
                    request = await _read_request(reader, limits, peer_host, peer_dn)
                except _Refused as refused:
                    writer.write(_encode(_text(refused.status), False))
                    await writer.drain()
                    return
                if request is None:
                    return
                keep_alive = (
                    served < limits.requests_per_connection and request.headers.get("connection", "").lower() != "close"
                )
                try:
                    response = await handler(request)
                except Exception:
                    log.exception("%s: %s %s failed", name, request.method, request.path)
                    response = _text(HTTPStatus.INTERNAL_SERVER_ERROR)
                writer.write(_encode(response, keep_alive))
                await writer.drain()
                if not keep_alive:
                    return
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # the loop is ending with this connection open: it ends here (Python 3.11's stream
            # callback would log a cancelled connection task's CancelledError as a traceback)
            pass
        except Exception:
            log.exception("%s endpoint failed", name)
        finally:
            writers.discard(writer)
            writer.close()

    served.server = await asyncio.start_server(
        on_connection, host, port, limit=limits.head_bytes, ssl=tls,
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if tls is not None else None,
    )
    return served
