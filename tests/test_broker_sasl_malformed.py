"""Malformed and out-of-order SASL against a real broker, sent by hand (saslkit.RawClient):
truncated handshakes, giant tokens, SCRAM with a wrong nonce, a client-final message replayed on
a new connection, requests before authentication, plaintext sent to the SASL_SSL port, a second
handshake, SaslAuthenticate out of order or on a listener without SASL, handshake v0, an
unsupported mechanism. Each gets a clear error (or is closed with one log line), and a
well-behaved client keeps working afterwards."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest

from loglake.broker.security.sasl import SASL_MAX_RECEIVE_BYTES
from loglake.kafka_errors import ErrorCode
from saslkit import SASL_ERRORS_EVERY_LINE, USERS, RawClient, ScramClient, add_users, request
from tlskit import make_pki, ssl_args

from brokerkit import InProcessBroker, serving_in_process

ENABLED = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """PLAINTEXT, SASL_PLAINTEXT and SASL_SSL listeners (ports in that order)."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    data = tmp_path_factory.mktemp("sasl-bad") / "data"
    add_users(data)
    args = [
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "SASL_PLAINTEXT://127.0.0.1:0",
        "--listen",
        "SASL_SSL://127.0.0.1:0",
        "--allow-everyone-if-no-acl-found",  # SASL tests, not ACL tests (test_broker_sasl_acls.py)
    ]
    with serving_in_process(data, [*args, *ssl_args(pki)], env=SASL_ERRORS_EVERY_LINE) as b:
        yield b
        _still_serves(b)


def _still_serves(b: InProcessBroker) -> None:
    """A well-behaved client authenticates and is answered."""
    c = RawClient(b.ports[1])
    try:
        assert c.handshake("SCRAM-SHA-512")[0] == ErrorCode.NONE
        scram = ScramClient("SCRAM-SHA-512", "alice", USERS["alice"][0])
        code, _, server_first = c.authenticate(scram.first())
        assert code == ErrorCode.NONE
        code, _, server_final = c.authenticate(scram.final(server_first))
        assert code == ErrorCode.NONE and server_final.startswith(b"v=")
        assert c.api_versions() == ErrorCode.NONE
    finally:
        c.close()


def wait_log(b: InProcessBroker, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in b.log_text().splitlines():
            if text in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no log line with {text!r}:\n{b.log_text()[-3000:]}")


def test_scram_with_a_wrong_nonce_is_refused(broker: InProcessBroker) -> None:
    c = RawClient(broker.ports[1])
    try:
        c.handshake("SCRAM-SHA-256")
        scram = ScramClient("SCRAM-SHA-256", "alice", USERS["alice"][0])
        code, _, server_first = c.authenticate(scram.first())
        assert code == ErrorCode.NONE and server_first.startswith(b"r=" + scram.nonce.encode())
        code, message, _ = c.authenticate(scram.final(server_first, nonce=scram.nonce + "forged"))
        assert code == ErrorCode.SASL_AUTHENTICATION_FAILED and "SCRAM-SHA-256" in (message or "")
        assert c.closed_by_broker()
    finally:
        c.close()
    wait_log(broker, "client-final nonce is not the nonce of this exchange")
    _still_serves(broker)


def test_a_replayed_client_final_message_is_refused(broker: InProcessBroker) -> None:
    first = RawClient(broker.ports[1])
    scram = ScramClient("SCRAM-SHA-512", "alice", USERS["alice"][0], nonce="replayednonce")
    try:
        first.handshake("SCRAM-SHA-512")
        _, _, server_first = first.authenticate(scram.first())
        final = scram.final(server_first)
        assert first.authenticate(final)[0] == ErrorCode.NONE
    finally:
        first.close()
    again = RawClient(broker.ports[1])
    try:
        again.handshake("SCRAM-SHA-512")
        assert again.authenticate(scram.first())[0] == ErrorCode.NONE  # the same client-first
        assert again.authenticate(final)[0] == ErrorCode.SASL_AUTHENTICATION_FAILED  # captured proof
        assert again.closed_by_broker()
    finally:
        again.close()


def test_requests_before_authentication_close_the_connection(broker: InProcessBroker) -> None:
    c = RawClient(broker.ports[1])
    try:
        assert c.api_versions() == ErrorCode.NONE  # allowed before authentication
        c.send(3, 1, struct.pack(">i", -1))  # Metadata v1, all topics
        assert c.closed_by_broker()
    finally:
        c.close()
    wait_log(broker, "Metadata request before SASL authentication on the SASL_PLAINTEXT listener")


def test_a_giant_token_closes_the_connection_with_one_line(broker: InProcessBroker) -> None:
    c = RawClient(broker.ports[1])
    try:
        c.handshake("PLAIN")
        token = b"\0alice\0" + b"x" * SASL_MAX_RECEIVE_BYTES
        frame = request(36, 0, 9, struct.pack(">i", len(token)) + token)
        try:
            c.sock.sendall(frame)
        except OSError:
            pass  # closed while we were still sending: that is the point
        assert c.closed_by_broker()
    finally:
        c.close()
    wait_log(
        broker,
        "before SASL authentication finished on the SASL_PLAINTEXT listener (over SASL_MAX_RECEIVE_BYTES",
    )


def test_truncated_handshakes(broker: InProcessBroker) -> None:
    # A frame whose string claims more bytes than the frame has: a malformed request, closed.
    c = RawClient(broker.ports[1])
    try:
        c.sock.sendall(request(17, 1, 1, struct.pack(">h", 50) + b"PLA"))
        assert c.closed_by_broker()
    finally:
        c.close()
    # Half a frame, then the client goes away: nothing to answer, nothing breaks.
    with socket.create_connection(("127.0.0.1", broker.ports[1]), timeout=5) as s:
        s.sendall(request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN")[:9])
    _still_serves(broker)


def test_plaintext_to_the_sasl_ssl_port(broker: InProcessBroker) -> None:
    with socket.create_connection(("127.0.0.1", broker.ports[2]), timeout=10) as s:
        s.sendall(request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN"))
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
    line = wait_log(broker, "TLS handshake failed on the SASL_SSL listener")
    assert "not TLS" in line, line


def test_handshake_state_errors(broker: InProcessBroker) -> None:
    twice = RawClient(broker.ports[1])
    try:
        assert twice.handshake("PLAIN") == (ErrorCode.NONE, ENABLED)
        assert twice.handshake("PLAIN") == (ErrorCode.ILLEGAL_SASL_STATE, ENABLED)
        assert twice.closed_by_broker()
    finally:
        twice.close()
    early = RawClient(broker.ports[1])
    try:
        code, message, _ = early.authenticate(b"\0alice\0x")
        assert (
            code == ErrorCode.ILLEGAL_SASL_STATE
            and message == "Unexpected SaslAuthenticate before SaslHandshake"
        )
        assert early.closed_by_broker()
    finally:
        early.close()
    unknown = RawClient(broker.ports[1])
    try:
        assert unknown.handshake("GSSAPI") == (ErrorCode.UNSUPPORTED_SASL_MECHANISM, ENABLED)
        assert unknown.closed_by_broker()
    finally:
        unknown.close()
    v0 = RawClient(broker.ports[1])
    try:
        assert v0.handshake("PLAIN", version=0)[0] == ErrorCode.UNSUPPORTED_VERSION
        assert v0.closed_by_broker()
    finally:
        v0.close()
    wait_log(broker, "SaslHandshake v0 on the SASL_PLAINTEXT listener asks for raw SASL tokens")


def test_sasl_on_a_listener_without_sasl(broker: InProcessBroker) -> None:
    c = RawClient(broker.ports[0], timeout=2)
    try:
        assert c.handshake("PLAIN") == (ErrorCode.ILLEGAL_SASL_STATE, ENABLED)
        assert c.authenticate(b"\0alice\0x")[0] == ErrorCode.ILLEGAL_SASL_STATE
        assert c.api_versions() == ErrorCode.NONE  # the connection stays as it was
    finally:
        c.close()
