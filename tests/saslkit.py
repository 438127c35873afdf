"""Helpers of the SASL tests: users made with the real `loglake users` command, client settings
per library, and a raw Kafka-protocol client that speaks SaslHandshake/SaslAuthenticate by hand
(so malformed and out-of-order exchanges can be sent on purpose)."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import socket
import ssl
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from loglake.scram import MECHANISMS, salted_password

LOGLAKE = [sys.executable, "-m", "loglake.cli.main"]
#: The users every SASL test broker has: name -> (password, mechanisms).
USERS = {
    "alice": ("alice-secret", ["SCRAM-SHA-256", "SCRAM-SHA-512"]),
    "bob": ("bob-secret", ["SCRAM-SHA-256"]),
}
SASL_ERRORS_EVERY_LINE = {"LOGLAKE_LOG_RATE_LIMIT_MS": "0"}


def users(
    *args: str, data_dir: Path, password: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `loglake users ARGS --data-dir D` (the password on stdin)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run(
        [*LOGLAKE, "users", *args, "--data-dir", str(data_dir)],
        input=(password + "\n") if password is not None else "",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


def add_users(data_dir: Path) -> None:
    for name, (password, mechs) in USERS.items():
        users(
            "add",
            name,
            "--password-stdin",
            *[a for m in mechs for a in ("--mechanism", m)],
            data_dir=data_dir,
            password=password,
        )


def confluent_conf(
    port: int,
    protocol: str,
    mechanism: str,
    user: str = "alice",
    password: str | None = None,
    ca: Path | None = None,
) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": protocol,
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": USERS[user][0] if password is None else password,
        "log_level": 0,
    }
    if ca is not None:
        conf["ssl.ca.location"] = str(ca)
    return conf


# ---------------------------------------------------------------- a raw Kafka client, by hand

API_VERSIONS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 3, 17, 36


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def request(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    """A non-flexible request (header v1, client id "t")."""
    payload = struct.pack(">hhi", api_key, version, correlation) + _str("t") + body
    return struct.pack(">i", len(payload)) + payload


class RawClient:
    """One connection to a listener; `ssl_ca` wraps it in TLS first; `source` is the loopback
    address it connects from (127.0.0.2 is another client address to the broker)."""

    def __init__(self, port: int, ssl_ca: Path | None = None, timeout: float = 10.0, source: str | None = None) -> None:
        raw = socket.create_connection(
            ("127.0.0.1", port), timeout=timeout, source_address=None if source is None else (source, 0)
        )
        if ssl_ca is not None:
            ctx = ssl.create_default_context(cafile=str(ssl_ca))
            raw = ctx.wrap_socket(raw, server_hostname="localhost")
        self.sock = raw
        self.correlation = 0
        self.session_lifetime_ms = -1  # what the last SaslAuthenticate v1 answered

    def close(self) -> None:
        self.sock.close()

    def send(self, api_key: int, version: int, body: bytes) -> None:
        self.correlation += 1
        self.sock.sendall(request(api_key, version, self.correlation, body))

    def recv(self) -> bytes:
        """One response body (after the correlation id); ConnectionError when the broker closed."""
        size = struct.unpack(">i", self._exact(4))[0]
        payload = self._exact(size)
        assert struct.unpack(">i", payload[:4])[0] == self.correlation
        return payload[4:]

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed by the broker")
            out += chunk
        return out

    def closed_by_broker(self) -> bool:
        """True once the broker closed the connection (reads end), within the socket timeout."""
        try:
            while True:
                if not self.sock.recv(4096):
                    return True
        except (ConnectionError, ssl.SSLError):
            return True
        except TimeoutError:
            return False

    def handshake(self, mechanism: str, version: int = 1) -> tuple[int, list[str]]:
        self.send(SASL_HANDSHAKE, version, _str(mechanism))
        body = self.recv()
        code, count = struct.unpack(">hi", body[:6])
        pos, mechs = 6, []
        for _ in range(count):
            (n,) = struct.unpack(">h", body[pos : pos + 2])
            mechs.append(body[pos + 2 : pos + 2 + n].decode())
            pos += 2 + n
        return code, mechs

    def authenticate(self, token: bytes, version: int = 0) -> tuple[int, str | None, bytes]:
        """SaslAuthenticate v0 or v1 (v1 answers a KIP-368 session lifetime: `session_lifetime_ms`)."""
        self.send(SASL_AUTHENTICATE, version, struct.pack(">i", len(token)) + token)
        body = self.recv()
        (code,) = struct.unpack(">h", body[:2])
        (n,) = struct.unpack(">h", body[2:4])
        message = None if n < 0 else body[4 : 4 + n].decode()
        pos = 4 + max(n, 0)
        (m,) = struct.unpack(">i", body[pos : pos + 4])
        if version >= 1:
            (self.session_lifetime_ms,) = struct.unpack(">q", body[pos + 4 + max(m, 0) : pos + 12 + max(m, 0)])
        return code, message, body[pos + 4 : pos + 4 + max(m, 0)]

    def api_versions(self) -> int:
        self.send(API_VERSIONS, 0, b"")
        return int(struct.unpack(">h", self.recv()[:2])[0])


#: Salted passwords kept (a benchmark authenticates as one user thousands of times: the broker's
#: cost is what it measures, not the client's PBKDF2).
SALTED_CACHE_ENTRIES = 64


@functools.lru_cache(maxsize=SALTED_CACHE_ENTRIES)
def _salted(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    return salted_password(mechanism, password, salt, iterations)


class ScramClient:
    """The client side of one SCRAM exchange (RFC 5802), for tests that tamper with it."""

    def __init__(
        self, mechanism: str, user: str, password: str, nonce: str = "clientnonce0123456789"
    ) -> None:
        self.mechanism, self.user, self.password, self.nonce = mechanism, user, password, nonce
        self.first_bare = f"n={user},r={nonce}"
        self.server_first = ""

    def first(self) -> bytes:
        return ("n,," + self.first_bare).encode()

    def final(self, server_first: bytes, nonce: str | None = None) -> bytes:
        self.server_first = server_first.decode()
        attrs = dict(part.split("=", 1) for part in self.server_first.split(","))
        h = MECHANISMS[self.mechanism]
        salted = _salted(
            self.mechanism, self.password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
        )
        without_proof = f"c=biws,r={attrs['r'] if nonce is None else nonce}"
        auth = f"{self.first_bare},{self.server_first},{without_proof}".encode()
        client_key = hmac.digest(salted, b"Client Key", h)
        signature = hmac.digest(hashlib.new(h, client_key).digest(), auth, h)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
