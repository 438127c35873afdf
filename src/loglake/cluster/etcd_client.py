"""A small etcd v3 client over etcd's JSON gateway, with endpoint failover and bounded retries.

Requests are JSON POSTs to the gateway's `/v3/...` paths over a few kept-alive `http.client`
connections per endpoint (`_Endpoint`): a requests session (what `etcd3gw` uses) costs about
0.75 ms of CPU per call against 0.2 ms, and every offset commit and flush of a cluster waits for
one such call (benchmarks/group_commits.py). HTTP failures map to etcd3gw's exception types as
etcd3gw maps them; the watch stream stays on etcd3gw's session. On top of that this module adds
what the metadata store and membership need:

- several endpoints (`host:port,host:port`): a request that cannot reach one member (refused,
  timed out, 5xx: no leader, leader changed) moves on to the next, and after a round of all of
  them waits (backoff) and goes round again until `unavailable_s` has passed; then it raises
  `EtcdUnavailableError`. One warning is logged when etcd becomes unreachable and one line when
  it answers again: no line per retry.
- the calls used, with keys and values as bytes (the gateway wants base64) and int64 fields as
  ints (the gateway sends them as strings): range (optionally at a revision), txn, put, delete,
  leases, and a watch stream used as a wake-up (`watch`).

Retrying a request that timed out can apply it twice only for requests that are idempotent or
conditional: every write loglake sends is either a put of a value already decided or a
transaction with a compare that fails the second time (the metadata store recognises its own
records after an uncertain answer, loglake.cluster.etcd).
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import requests
from etcd3gw import exceptions as gw_exceptions
from etcd3gw.client import Etcd3Client

from loglake.errors import ConfigError, EtcdUnavailableError
from loglake.meta.etcd_url import parse_endpoints

__all__ = [
    "ETCD_REQUEST_TIMEOUT_S",
    "ETCD_UNAVAILABLE_S_DEFAULT",
    "EtcdClient",
    "EtcdCompactedError",
    "Guard",
    "KeyValue",
    "Watch",
    "b64",
    "prefix_end",
]

log = logging.getLogger(__name__)

#: Timeout of one HTTP request to one member (connect and each read).
ETCD_REQUEST_TIMEOUT_S = 3.0
#: How long a request keeps trying every endpoint before EtcdUnavailableError (a 3-member etcd
#: elects a new leader within a few election timeouts, about 1-3 s with etcd's defaults).
ETCD_UNAVAILABLE_S_DEFAULT = 15.0
#: Backoff between rounds over all endpoints: from the first value, doubling, up to the second.
RETRY_BACKOFF_S = (0.05, 1.0)
#: Most keys one range request returns; longer ranges are read in pages.
RANGE_PAGE_KEYS = 1000
#: Kept-alive connections one endpoint holds between requests (one per thread that calls at once;
#: more are opened when needed and closed after use).
IDLE_CONNECTIONS_MAX = 4
#: Read timeout of a watch stream: a stream that sent nothing for this long is re-opened (the
#: caller also re-reads, so a silently dead connection costs at most this much delay).
WATCH_IDLE_S = 5.0


class EtcdCompactedError(Exception):
    """A read at a revision etcd has already compacted away (internal: the reader starts over)."""


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with `prefix`."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # the whole keyspace


#: HTTP statuses and the etcd3gw exception each maps to (etcd3gw.client's table); any other
#: status but 200 is an Etcd3Exception.
_STATUS_ERRORS: dict[int, type[gw_exceptions.Etcd3Exception]] = {
    500: gw_exceptions.InternalServerError,
    503: gw_exceptions.ConnectionFailedError,
    408: gw_exceptions.ConnectionTimeoutError,
    504: gw_exceptions.ConnectionTimeoutError,
    412: gw_exceptions.PreconditionFailedError,
}


class _Endpoint:
    """One etcd member's JSON gateway over kept-alive HTTP/1.1 connections (TCP_NODELAY), any
    thread at a time each; at most IDLE_CONNECTIONS_MAX kept between requests."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connect(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        conn.connect()
        if conn.sock is not None:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST `payload` to `/v3/<path>`; the decoded answer, or an etcd3gw exception."""
        body = json.dumps(payload).encode()
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        reused = conn is not None
        while True:
            try:
                if conn is None:
                    conn = self._connect()
                conn.request("POST", "/v3/" + path, body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                break
            except TimeoutError as exc:
                if conn is not None:
                    conn.close()
                raise gw_exceptions.ConnectionTimeoutError(str(exc) or "timed out") from None
            except (OSError, http.client.HTTPException) as exc:
                if conn is not None:
                    conn.close()
                conn = None
                # A kept-alive connection the member closed meanwhile: once more on a new one
                # (what requests does); a new connection that fails is the member's failure.
                if reused and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
                    reused = False
                    continue
                raise gw_exceptions.ConnectionFailedError(str(exc) or type(exc).__name__) from None
        text = data.decode("utf-8", "replace")
        if resp.status != 200:
            conn.close()
            raise _STATUS_ERRORS.get(resp.status, gw_exceptions.Etcd3Exception)(text, resp.reason)
        if resp.will_close:
            conn.close()
        else:
            with self._lock:
                if len(self._idle) < IDLE_CONNECTIONS_MAX:
                    self._idle.append(conn)
                    conn = None
            if conn is not None:
                conn.close()
        try:
            answer = json.loads(data)
        except ValueError:
            raise gw_exceptions.Etcd3Exception(text[:300], "not JSON") from None
        if not isinstance(answer, dict):
            raise gw_exceptions.Etcd3Exception(text[:300], "not a JSON object")
        return answer

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        base64.b64decode(raw.get("key", "")),
        base64.b64decode(raw.get("value", "")),
        int(raw.get("mod_revision", 0)),
        int(raw.get("create_revision", 0)),
        int(raw.get("lease", 0)),
    )


class EtcdClient:
    """Thread-safe: each call may come from any thread (an `_Endpoint` per member; the watch
    streams on an etcd3gw session per member)."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]] | str,
        *,
        unavailable_s: float = ETCD_UNAVAILABLE_S_DEFAULT,
        request_timeout_s: float = ETCD_REQUEST_TIMEOUT_S,
    ) -> None:
        self.endpoints = parse_endpoints(endpoints) if isinstance(endpoints, str) else list(endpoints)
        if not self.endpoints:
            raise ConfigError("no etcd endpoint given")
        self.unavailable_s = unavailable_s
        self.request_timeout_s = request_timeout_s
        self._clients = [
            Etcd3Client(host, port, timeout=request_timeout_s, api_path="/v3/")
            for host, port in self.endpoints
        ]
        self._endpoints = [_Endpoint(host, port, request_timeout_s) for host, port in self.endpoints]
        self._lock = threading.Lock()
        self._current = 0
        self._down_since: float | None = None  # set while etcd is unreachable (one warning per outage)
        #: monotonic time of the last answer from any member (None: none yet); cluster health reads it
        self.last_answer: float | None = None
        self.closed = False

    def describe(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.endpoints)

    # ---- the one request path ----------------------------------------------------------------

    def call(self, path: str, payload: dict[str, Any], *, deadline_s: float | None = None) -> dict[str, Any]:
        """POST `payload` to `/v3/<path>` on a reachable member; retries and fails over as above."""
        give_up = time.monotonic() + (self.unavailable_s if deadline_s is None else deadline_s)
        backoff = RETRY_BACKOFF_S[0]
        last: str = ""
        while True:
            with self._lock:
                start = self._current
            for step in range(len(self._endpoints)):
                index = (start + step) % len(self._endpoints)
                client = self._endpoints[index]
                try:
                    result = client.post(path, payload)
                except (
                    gw_exceptions.ConnectionFailedError,
                    gw_exceptions.ConnectionTimeoutError,
                    gw_exceptions.InternalServerError,
                ) as exc:
                    last = f"{client.host}:{client.port}: {_short(exc)}"
                    continue
                except gw_exceptions.Etcd3Exception as exc:
                    text = _short(exc)
                    if "compacted" in text:
                        raise EtcdCompactedError(text) from None
                    if _retriable_text(text):
                        last = f"{client.host}:{client.port}: {text}"
                        continue
                    raise EtcdUnavailableError(f"etcd refused {path}: {text}") from None
                self._answered(index)
                return result
            if self.closed or time.monotonic() >= give_up:
                self._unreachable(last)
                raise EtcdUnavailableError(f"etcd ({self.describe()}) did not answer {path}: {last}")
            self._unreachable(last)
            time.sleep(backoff)
            backoff = min(backoff * 2, RETRY_BACKOFF_S[1])

    def _answered(self, index: int) -> None:
        with self._lock:
            self._current = index
            self.last_answer = time.monotonic()
            down, self._down_since = self._down_since, None
        if down is not None:
            log.warning("etcd answers again (%s, after %.1f s)", self.describe(), time.monotonic() - down)

    def _unreachable(self, last: str) -> None:
        with self._lock:
            first = self._down_since is None
            if first:
                self._down_since = time.monotonic()
        if first:
            log.warning(
                "etcd unreachable (%s); retrying for up to %.0f s per request", last, self.unavailable_s
            )

    # ---- key-value ---------------------------------------------------------------------------

    def range(
        self, key: bytes, range_end: bytes | None = None, *, revision: int = 0, limit: int = 0, keys_only: bool = False
    ) -> tuple[list[KeyValue], int, bool]:
        """(kvs, header revision, more) of `[key, range_end)` (or `key` alone); `keys_only`: their
        values come back empty (b"")."""
        payload: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            payload["range_end"] = b64(range_end)
        if revision:
            payload["revision"] = revision
        if limit:
            payload["limit"] = limit
        if keys_only:
            payload["keys_only"] = True
        result = self.call("kv/range", payload)
        kvs = [_kv(raw) for raw in result.get("kvs", [])]
        return kvs, int(result["header"]["revision"]), bool(result.get("more", False))

    def get(self, key: bytes, *, revision: int = 0) -> tuple[KeyValue | None, int]:
        kvs, rev, _ = self.range(key, revision=revision)
        return (kvs[0] if kvs else None), rev

    def range_all(
        self, start: bytes, end: bytes, *, revision: int = 0, keys_only: bool = False
    ) -> tuple[list[KeyValue], int]:
        """Every key of `[start, end)`, paged, all read at one revision (the first page's)."""
        out: list[KeyValue] = []
        while True:
            kvs, rev, more = self.range(start, end, revision=revision, limit=RANGE_PAGE_KEYS, keys_only=keys_only)
            revision = revision or rev
            out.extend(kvs)
            if not more or not kvs:
                return out, revision
            start = kvs[-1].key + b"\0"

    def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        payload: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            payload["lease"] = lease
        return int(self.call("kv/put", payload)["header"]["revision"])

    def delete_range(self, key: bytes, range_end: bytes | None = None) -> int:
        payload: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            payload["range_end"] = b64(range_end)
        return int(self.call("kv/deleterange", payload).get("deleted", 0))

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> tuple[bool, list[dict[str, Any]], int]:
        """(succeeded, responses, header revision). Build the parts with the helpers below."""
        result = self.call("kv/txn", {"compare": compare, "success": success, "failure": failure or []})
        return (
            bool(result.get("succeeded", False)),
            list(result.get("responses", [])),
            int(result["header"]["revision"]),
        )

    # ---- leases ------------------------------------------------------------------------------

    def lease_grant(self, ttl_s: int) -> int:
        result = self.call("lease/grant", {"TTL": ttl_s})
        if result.get("error"):
            raise EtcdUnavailableError(f"etcd refused a lease: {result['error']}")
        return int(result["ID"])

    def lease_keepalive(self, lease: int, *, deadline_s: float | None = None) -> int:
        """The lease's new TTL in seconds, or -1 when it has already expired."""
        result = self.call("lease/keepalive", {"ID": lease}, deadline_s=deadline_s)
        return int(result.get("result", {}).get("TTL", -1))

    def lease_revoke(self, lease: int) -> None:
        try:
            self.call("kv/lease/revoke", {"ID": lease}, deadline_s=self.request_timeout_s)
        except EtcdUnavailableError as exc:
            if "not found" not in str(exc):
                raise

    # ---- watch ---------------------------------------------------------------------------------

    def watch(
        self,
        key: bytes,
        range_end: bytes | None,
        wake: Callable[[], None],
        *,
        name: str,
        on_event: Callable[[int], None] | None = None,
    ) -> Watch:
        """Call `wake()` whenever a key in the range changes, from a thread of its own, until the
        returned watch is stopped.

        A wake-up only: the caller re-reads what it needs, so a lost event, a compaction or a
        reconnect never skips a change, it only delays noticing it (by at most WATCH_IDLE_S, or
        the caller's own poll). Each (re)connect also wakes the caller. With `on_event`, a message
        of events calls `on_event(newest mod revision among them)` instead (the caller tells its
        own writes from news); one that does not parse so still calls `wake()`.
        """
        return Watch(self, key, range_end, wake, name, on_event)

    def close(self) -> None:
        self.closed = True
        for client in self._clients:
            client.session.close()
        for endpoint in self._endpoints:
            endpoint.close()


class Watch:
    """A watch stream used as a wake-up (see EtcdClient.watch); `stop()` closes it at once."""

    def __init__(
        self,
        client: EtcdClient,
        key: bytes,
        range_end: bytes | None,
        wake: Callable[[], None],
        name: str,
        on_event: Callable[[int], None] | None = None,
    ) -> None:
        self._client = client
        self._on_event = on_event
        self._create: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            self._create["range_end"] = b64(range_end)
        self._wake = wake
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._response: requests.Response | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        clients = self._client._clients
        index = 0
        while not self._stop.is_set():
            gw = clients[index % len(clients)]
            index += 1
            try:
                resp = gw.session.post(
                    gw.get_url("watch"),
                    json={"create_request": self._create},
                    stream=True,
                    timeout=(self._client.request_timeout_s, WATCH_IDLE_S),
                )
                with self._lock:
                    self._response = resp
                if self._stop.is_set():
                    resp.close()
                    return
                with resp:
                    if resp.status_code != 200:
                        raise requests.exceptions.ConnectionError(f"HTTP {resp.status_code}")
                    self._wake()
                    for line in resp.iter_lines():
                        if self._stop.is_set():
                            return
                        if line and b'"events"' in line:
                            newest = self._newest(line) if self._on_event is not None else None
                            if newest is None or self._on_event is None:
                                self._wake()
                            else:
                                self._on_event(newest)
            except (requests.exceptions.RequestException, OSError, ValueError, AttributeError):
                pass  # idle timeout, a member down, a stream closed by stop(): reconnect (to the next member)
            finally:
                with self._lock:
                    self._response = None
            if self._stop.wait(RETRY_BACKOFF_S[0] if index % len(clients) else RETRY_BACKOFF_S[1]):
                return
            self._wake()

    @staticmethod
    def _newest(line: bytes) -> int | None:
        """The newest mod revision among a watch message's events (None: not such a message)."""
        try:
            events = json.loads(line)["result"]["events"]
            return max(int(ev["kv"]["mod_revision"]) for ev in events)
        except (ValueError, KeyError, TypeError):
            return None

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            resp = self._response
        if resp is not None:
            try:
                resp.raw._fp.fp.raw._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked read now
            except (AttributeError, OSError):
                pass  # not a plain socket (or already closed): the read times out within WATCH_IDLE_S
        self._thread.join(WATCH_IDLE_S + self._client.request_timeout_s)


def _short(exc: BaseException) -> str:
    """etcd's own message when the gateway sent one (etcd3gw keeps the body as `detail_text`)."""
    detail = getattr(exc, "detail_text", None)
    text = " ".join(str(a) for a in exc.args if a) or type(exc).__name__
    if isinstance(detail, str):
        try:
            doc = json.loads(detail)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and (doc.get("message") or doc.get("error")):
            text = str(doc.get("message") or doc["error"])
        elif detail and not text.strip():
            text = detail
    return text[:300]


def _retriable_text(text: str) -> bool:
    """etcd's own transient refusals (no leader, elections, overload) are retried like a network error."""
    return any(
        s in text
        for s in (
            "no leader",
            "leader changed",
            "timed out",
            "too many requests",
            "unhealthy",
            "not capable",
            "stopped",
        )
    )


# ---- transaction parts (the gateway's JSON shapes) --------------------------------------------


def cmp_mod(key: bytes, mod_revision: int) -> dict[str, Any]:
    """Holds when `key`'s last change was at `mod_revision` (0: the key does not exist)."""
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": mod_revision}


def cmp_value(key: bytes, value: bytes) -> dict[str, Any]:
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


def cmp_absent(key: bytes) -> dict[str, Any]:
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}


def op_put(key: bytes, value: bytes, *, lease: int = 0) -> dict[str, Any]:
    put: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        put["lease"] = lease
    return {"request_put": put}


def op_get(key: bytes) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


def op_delete(key: bytes, range_end: bytes | None = None) -> dict[str, Any]:
    req: dict[str, Any] = {"key": b64(key)}
    if range_end is not None:
        req["range_end"] = b64(range_end)
    return {"request_delete_range": req}


@dataclass(frozen=True)
class Guard:
    """A compare in a conditional append (loglake.cluster.etcd's `append_if`): `key` (relative to the
    cluster prefix) holds `value`, or was last changed at `mod_revision` (0: the key does not
    exist). Exactly one of them is given."""

    key: str
    value: bytes | None = None
    mod_revision: int | None = None

    def __post_init__(self) -> None:
        if (self.value is None) == (self.mod_revision is None):
            raise ValueError("a Guard compares either a value or a mod revision")

    def compare(self, full_key: bytes) -> dict[str, Any]:
        return (
            cmp_value(full_key, self.value)
            if self.value is not None
            else cmp_mod(full_key, self.mod_revision or 0)
        )

    def holds(self, kvs: list[KeyValue]) -> bool:
        """Whether the guard holds for the key's current value (`kvs` from an op_get)."""
        if self.value is not None:
            return bool(kvs) and kvs[0].value == self.value
        return (kvs[0].mod_revision if kvs else 0) == self.mod_revision


def response_kvs(response: dict[str, Any]) -> list[KeyValue]:
    """The key-values of one `op_get` response inside a txn answer."""
    return [_kv(raw) for raw in response.get("response_range", {}).get("kvs", [])]
