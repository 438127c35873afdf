"""Test kit for the S3 backend: a moto S3 server on 127.0.0.1 and a fault-injecting HTTP proxy.

Test modules bind the fixtures they use as module globals (`bucket = s3kit.bucket`):

- `moto_endpoint` (module): a `ThreadedMotoServer` on a free port; dummy AWS credentials in
  the environment of the test process and no AWS config files, so nothing real is reached.
- `s3_client`: a raw boto3 client on moto (to look behind the store's back).
- `bucket`: a fresh bucket per test.
- `fault_proxy`: a `FaultProxy` in front of moto, reset per test.

The proxy speaks real HTTP/1.1 on 127.0.0.1 (keep-alive, Content-Length bodies, Expect:
100-continue) and can be switched at runtime to answer errors, delay, cut a response body off
after some bytes, or pretend a bucket is gone; it logs every request it saw.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import logging
import os
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import boto3
import botocore.config
import pytest
from moto.server import ThreadedMotoServer

from loglake.store.retry import RetryPolicy
from loglake.store.s3 import S3Store

REGION = "us-east-1"
DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "loglake-test-key",
    "AWS_SECRET_ACCESS_KEY": "loglake-test-secret",
    "AWS_SESSION_TOKEN": "loglake-test-token",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": "/nonexistent/loglake-test-aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/loglake-test-aws-credentials",
    "AWS_EC2_METADATA_DISABLED": "true",
}
UNSET_ENV = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")

#: Requests the proxy remembers for `requests()`; a cluster benchmark or a long fault schedule
#: sends hundreds of thousands.
SEEN_MAX = 200_000
#: How often a request held by a blackhole checks whether the fault has ended.
BLACKHOLE_POLL_S = 0.05

#: Retries for tests: the real attempt count, tiny sleeps.
FAST_RETRY = RetryPolicy(max_attempts=6, base_delay=0.005, max_delay=0.02)


def store_url(endpoint: str, bucket: str, prefix: str = "", **options: object) -> str:
    """An `open_store` URL for `bucket`/`prefix` on `endpoint` (path-style, test region)."""
    query = {"endpoint_url": endpoint, "region": REGION, "path_style": "true"}
    query.update({k: str(v) for k, v in options.items()})
    path = f"/{prefix.strip('/')}" if prefix.strip("/") else ""
    return f"s3://{bucket}{path}?{urlencode(query)}"


def make_store(endpoint: str, bucket: str, prefix: str = "", **kwargs: Any) -> S3Store:
    """An S3Store on `endpoint` with the test defaults (fast retries, short timeouts)."""
    kwargs.setdefault("retry", FAST_RETRY)
    kwargs.setdefault("connect_timeout", 2.0)
    kwargs.setdefault("read_timeout", 5.0)
    return S3Store(bucket, prefix, endpoint_url=endpoint, region=REGION, path_style=True, **kwargs)


def raw_client(endpoint: str) -> Any:
    """A plain boto3 client on `endpoint` (boto3's own defaults, path-style)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        config=botocore.config.Config(s3={"addressing_style": "path"}),
    )


# ---- the fault proxy --------------------------------------------------------------------------


@dataclass
class Fault:
    """One switched-on misbehaviour; `remaining` requests left (None: until cleared)."""

    kind: str  # "status", "delay", "reset", "bucket_gone", "blackhole"
    remaining: int | None
    method: str | None = None
    path_contains: str | None = None
    status: int = 500
    code: str = "InternalError"
    delay: float = 0.0
    reset_after: int = 0
    until: float | None = None  # monotonic deadline (bucket_gone "for a while")
    skip: int = 0  # let this many matching requests through first

    def matches(self, method: str, path: str) -> bool:
        """Whether this fault applies to a request (`path` without the query)."""
        if self.until is not None and time.monotonic() >= self.until:
            return False
        if self.method is not None and method != self.method:
            return False
        if self.kind == "bucket_gone":  # path-style: /<bucket> or /<bucket>/<key>
            prefix = self.path_contains or ""
            return path == prefix or path.startswith(prefix + "/")
        return self.path_contains is None or self.path_contains in path


@dataclass
class Seen:
    """A request the proxy received, and what it did with it."""

    method: str
    path: str
    headers: dict[str, str]
    fault: str | None = None
    status: int = 0


@dataclass
class _Request:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None


_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "expect", "te", "upgrade"}
)


def _error_xml(code: str, message: str, extra: str = "") -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>{extra}"
        "<RequestId>fault-proxy</RequestId></Error>"
    ).encode()


class FaultProxy:
    """An HTTP/1.1 forwarding proxy to `upstream` ("host", port) with switchable faults."""

    def __init__(self, upstream: tuple[str, int], listen_host: str = "127.0.0.1") -> None:
        """`listen_host`: "0.0.0.0" for brokers in other network namespaces (tests/netkit.py)."""
        self.upstream = upstream
        #: The latest requests, oldest dropped past SEEN_MAX (a long cluster run makes many).
        self.seen: collections.deque[Seen] = collections.deque(maxlen=SEEN_MAX)
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self.in_flight = 0
        #: The most requests the proxy was handling at the same moment (since `clear`).
        self.max_in_flight = 0
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve_connection(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((listen_host, 0), Handler)
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            socks = list(self._sockets)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    # ---- switches -------------------------------------------------------------------------

    def _add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def fail(
        self,
        times: int,
        status: int = 500,
        code: str = "InternalError",
        *,
        method: str | None = None,
        path_contains: str | None = None,
        skip: int = 0,
    ) -> Fault:
        """Answer the next `times` matching requests (after `skip` of them) with `status` and an
        S3 error `code`. `path_contains` is matched against the path without the query."""
        return self._add(Fault("status", times, method, path_contains, status=status, code=code, skip=skip))

    def storm(
        self,
        seconds: float | None = None,
        status: int = 503,
        code: str = "ServiceUnavailable",
        *,
        method: str | None = None,
    ) -> Fault:
        """A 5xx storm: answer every matching request with `status` for `seconds` (None: until
        `clear`)."""
        until = None if seconds is None else time.monotonic() + seconds
        return self._add(Fault("status", None, method, None, status=status, code=code, until=until))

    def slow_down(self, times: int, *, method: str | None = None) -> Fault:
        """S3's throttling answer: 503 SlowDown."""
        return self.fail(times, 503, "SlowDown", method=method)

    def delay(
        self,
        seconds: float,
        times: int | None = None,
        *,
        method: str | None = None,
        path_contains: str | None = None,
    ) -> Fault:
        """Hold the next `times` (None: all) matching responses back for `seconds`."""
        return self._add(Fault("delay", times, method, path_contains, delay=seconds))

    def reset(
        self,
        after_bytes: int,
        times: int = 1,
        *,
        method: str | None = "GET",
        path_contains: str | None = None,
        skip: int = 0,
    ) -> Fault:
        """Forward the request, then send the response headers and only `after_bytes` bytes of
        its body, and close the connection (a connection reset mid-response)."""
        return self._add(Fault("reset", times, method, path_contains, reset_after=after_bytes, skip=skip))

    def bucket_gone(self, bucket: str, seconds: float | None = None) -> Fault:
        """Answer every request for `bucket` with 404 NoSuchBucket (for `seconds`, or until
        `bucket_back`)."""
        until = None if seconds is None else time.monotonic() + seconds
        return self._add(Fault("bucket_gone", None, None, f"/{bucket}", status=404, until=until))

    def blackhole(self, seconds: float | None = None) -> Fault:
        """The bucket unreachable, as a network partition makes it: every request (also on new
        connections) is read and then held without an answer until `seconds` pass or `clear` /
        `heal`, and its connection is then closed unanswered; clients see read timeouts and
        resets, never an S3 error."""
        until = None if seconds is None else time.monotonic() + seconds
        return self._add(Fault("blackhole", None, None, None, until=until))

    def heal(self, fault: Fault) -> None:
        """Switch one fault off (whatever its kind) and release requests it holds."""
        with self._lock:
            if fault in self._faults:
                self._faults.remove(fault)

    def bucket_back(self, bucket: str) -> None:
        with self._lock:
            self._faults = [
                f for f in self._faults if not (f.kind == "bucket_gone" and f.path_contains == f"/{bucket}")
            ]

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self.seen.clear()
            self.max_in_flight = self.in_flight

    def requests(self, method: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if method is None or s.method == method]

    # ---- serving --------------------------------------------------------------------------

    def _take(self, req: _Request) -> Fault | None:
        path = req.path.split("?", 1)[0]
        with self._lock:
            for fault in self._faults:
                if fault.matches(req.method, path):
                    if fault.skip > 0:
                        fault.skip -= 1
                        continue
                    if fault.remaining is not None:
                        fault.remaining -= 1
                        if fault.remaining <= 0:
                            self._faults.remove(fault)
                    return fault
        return None

    def _serve_connection(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)
        rfile = sock.makefile("rb")
        try:
            while True:
                req = _read_request(rfile, sock)
                if req is None:
                    return
                with self._lock:
                    self.in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    if not self._answer(sock, req):
                        return
                finally:
                    with self._lock:
                        self.in_flight -= 1
        except OSError:
            return  # the client went away (e.g. it timed out while we were delaying)
        finally:
            with self._lock:
                self._sockets.discard(sock)
            with contextlib.suppress(OSError):
                rfile.close()
                sock.close()

    def _answer(self, sock: socket.socket, req: _Request) -> bool:
        """Answer one request; False when the connection must be closed."""
        fault = self._take(req)
        seen = Seen(
            req.method, req.path, {k.lower(): v for k, v in req.headers}, fault.kind if fault else None
        )
        with self._lock:
            self.seen.append(seen)
        if fault is not None and fault.kind == "blackhole":
            while True:  # hold the request until the fault ends; then hang up unanswered
                with self._lock:
                    active = fault in self._faults and fault.matches(req.method, req.path.split("?", 1)[0])
                if not active:
                    return False
                time.sleep(BLACKHOLE_POLL_S)
        if fault is not None and fault.kind in ("status", "bucket_gone"):
            code = "NoSuchBucket" if fault.kind == "bucket_gone" else fault.code
            body = b"" if req.method == "HEAD" else _error_xml(code, "injected by the fault proxy")
            seen.status = fault.status
            _send(sock, fault.status, [("Content-Type", "application/xml")], body, len(body))
            return True
        status, reason, headers, body = self._forward(req)
        seen.status = status
        if fault is not None and fault.kind == "delay":
            time.sleep(fault.delay)
        length = _content_length(headers) if req.method == "HEAD" else len(body)
        if fault is not None and fault.kind == "reset":
            _send(sock, status, headers, body[: fault.reset_after], length, reason)
            sock.shutdown(socket.SHUT_RDWR)
            return False
        _send(sock, status, headers, body, length, reason)
        return True

    def _forward(self, req: _Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            headers = {
                k: v for k, v in req.headers if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length"
            }
            body = req.body if (req.body or req.method not in ("GET", "HEAD", "DELETE")) else None
            conn.request(req.method, req.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            return resp.status, resp.reason, out, data
        finally:
            conn.close()


def _content_length(headers: list[tuple[str, str]]) -> int:
    for k, v in headers:
        if k.lower() == "content-length":
            return int(v)
    return 0


def _send(
    sock: socket.socket,
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    content_length: int,
    reason: str = "",
) -> None:
    reason = reason or http.client.responses.get(status, "Status")
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() != "content-length"]
    lines.append(f"Content-Length: {content_length}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


def _read_request(rfile: Any, sock: socket.socket) -> _Request | None:
    line = rfile.readline(65537)
    while line in (b"\r\n", b"\n"):
        line = rfile.readline(65537)
    if not line:
        return None
    method, path, _version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    headers: list[tuple[str, str]] = []
    while True:
        hline = rfile.readline(65537)
        if hline in (b"\r\n", b"\n", b""):
            break
        name, _, value = hline.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    req = _Request(method, path, headers, b"")
    if (req.header("Expect") or "").lower() == "100-continue":
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    if (req.header("Transfer-Encoding") or "").lower() == "chunked":
        chunks = []
        while True:
            size = int(rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                break
            chunks.append(rfile.read(size))
            rfile.readline()
        req.body = b"".join(chunks)
    else:
        req.body = rfile.read(int(req.header("Content-Length") or 0))
    return req


# ---- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (random free port) for one test module; the dummy AWS
    environment is set while it runs."""
    saved = {k: os.environ.get(k) for k in (*DUMMY_ENV, *UNSET_ENV)}
    os.environ.update(DUMMY_ENV)
    for k in UNSET_ENV:
        os.environ.pop(k, None)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def s3_client(moto_endpoint: str) -> Any:
    return raw_client(moto_endpoint)


@pytest.fixture
def bucket(s3_client: Any) -> str:
    """A fresh, empty bucket for one test."""
    name = f"t-{uuid.uuid4().hex[:20]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def _proxy_server(moto_endpoint: str) -> Iterator[FaultProxy]:
    host, port = moto_endpoint.removeprefix("http://").rsplit(":", 1)
    proxy = FaultProxy((host, int(port))).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def fault_proxy(_proxy_server: FaultProxy) -> Iterator[FaultProxy]:
    """The fault proxy in front of moto, with no faults and an empty log."""
    _proxy_server.clear()
    yield _proxy_server
    _proxy_server.clear()


def seed_objects(bucket: str, keys: list[str], body: bytes = b"x") -> None:
    """Create objects straight in the in-process moto backend, bypassing HTTP (moto takes
    ~15 ms per PutObject; listing tests need a thousand objects)."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for key in keys:
        backend.put_object(bucket, key, body)
