"""KIP-368 re-authentication against the real broker: `connections_max_reauth_ms` is answered as
SaslAuthenticate's session lifetime; an expired session's next request (other than SaslHandshake
and SaslAuthenticate) closes the connection; re-authentication on the connection starts a new
lifetime, with the same mechanism and principal only; a user deleted meanwhile fails it; and
librdkafka, which re-authenticates when told a lifetime, keeps producing across several."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ScramMechanism, UserScramCredentialDeletion

from loglake.broker.config import BrokerConfig
from loglake.kafka_errors import ErrorCode
from saslkit import (
    METADATA,
    SASL_ERRORS_EVERY_LINE,
    USERS,
    RawClient,
    ScramClient,
    add_users,
    confluent_conf,
    users,
)

from brokerkit import InProcessBroker, serving_in_process

# librdkafka re-authenticates at 90 % of a session's lifetime, so a client thread late by more
# than a tenth of it is cut off; 1,500 ms left 150 ms and a loaded CI run's was 177 ms late.
LIFETIME_MS = 4000
PASSWORD = USERS["alice"][0]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """PLAINTEXT (for the admin client) and SASL_PLAINTEXT listeners; sessions of 4 s."""
    data = tmp_path_factory.mktemp("reauth") / "data"
    add_users(data)
    users("add", "carol", "--password-stdin", "--mechanism", "SCRAM-SHA-256", data_dir=data, password="carol-secret")
    args = ["--listen", "127.0.0.1:0", "--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--allow-everyone-if-no-acl-found"]
    env = {**SASL_ERRORS_EVERY_LINE, "LOGLAKE_CONNECTIONS_MAX_REAUTH_MS": str(LIFETIME_MS)}
    with serving_in_process(data, args, env=env, log_level="DEBUG") as b:
        yield b


def plain(user: str, password: str) -> bytes:
    return b"\0" + user.encode() + b"\0" + password.encode()


def login(port: int, user: str = "alice", password: str = PASSWORD) -> RawClient:
    c = RawClient(port)
    assert c.handshake("PLAIN") == (ErrorCode.NONE, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
    assert c.authenticate(plain(user, password), version=1)[0] == ErrorCode.NONE
    return c


def metadata(c: RawClient) -> None:
    c.send(METADATA, 1, b"\xff\xff\xff\xff")  # every topic
    c.recv()


def test_off_by_default_as_in_kafka() -> None:
    assert BrokerConfig().connections_max_reauth_ms == 0


def test_an_expired_session_is_closed_at_its_next_request(broker: InProcessBroker) -> None:
    c = login(broker.ports[1])
    assert c.session_lifetime_ms == LIFETIME_MS
    metadata(c)
    time.sleep(LIFETIME_MS / 1000 + 0.3)
    c.send(METADATA, 1, b"\xff\xff\xff\xff")
    assert c.closed_by_broker()
    assert "without re-authentication" in broker.log_text()


def test_reauthentication_starts_a_new_lifetime(broker: InProcessBroker) -> None:
    c = login(broker.ports[1])
    time.sleep(LIFETIME_MS / 1000 * 0.6)
    assert c.handshake("PLAIN")[0] == ErrorCode.NONE
    assert c.authenticate(plain("alice", PASSWORD), version=1)[0] == ErrorCode.NONE
    assert c.session_lifetime_ms == LIFETIME_MS
    time.sleep(LIFETIME_MS / 1000 * 0.6)  # past the first session's end, within the second's
    metadata(c)
    # SCRAM re-authenticates too
    s = ScramClient("SCRAM-SHA-256", "alice", PASSWORD)
    c2 = RawClient(broker.ports[1])
    assert c2.handshake("SCRAM-SHA-256")[0] == ErrorCode.NONE
    code, _, first = c2.authenticate(s.first(), version=1)
    assert code == ErrorCode.NONE and c2.authenticate(s.final(first), version=1)[0] == ErrorCode.NONE
    again = ScramClient("SCRAM-SHA-256", "alice", PASSWORD, nonce="another-nonce-0123456")
    assert c2.handshake("SCRAM-SHA-256")[0] == ErrorCode.NONE
    code, _, first = c2.authenticate(again.first(), version=1)
    assert code == ErrorCode.NONE and c2.authenticate(again.final(first), version=1)[0] == ErrorCode.NONE
    metadata(c2)
    c.close()
    c2.close()


def test_reauthentication_keeps_the_mechanism_and_the_principal(broker: InProcessBroker) -> None:
    c = login(broker.ports[1])
    assert c.handshake("SCRAM-SHA-256") == (ErrorCode.UNSUPPORTED_SASL_MECHANISM, ["PLAIN"])
    assert c.closed_by_broker()
    c = login(broker.ports[1])
    assert c.handshake("PLAIN")[0] == ErrorCode.NONE
    code, message, _ = c.authenticate(plain("bob", USERS["bob"][0]), version=1)
    assert code == ErrorCode.SASL_AUTHENTICATION_FAILED, message
    assert c.closed_by_broker()
    assert "a principal cannot change" in broker.log_text()


def test_a_deleted_user_fails_reauthentication(broker: InProcessBroker) -> None:
    c = login(broker.ports[1], "carol", "carol-secret")
    metadata(c)
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.ports[0]}"})
    deletion = UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256)
    admin.alter_user_scram_credentials([deletion])["carol"].result(timeout=15)
    assert c.handshake("PLAIN")[0] == ErrorCode.NONE
    assert c.authenticate(plain("carol", "carol-secret"), version=1)[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert c.closed_by_broker()


def test_librdkafka_reauthenticates_and_keeps_producing(broker: InProcessBroker) -> None:
    before = broker.log_text().count("re-authenticated as User:alice")
    closed_before = broker.log_text().count("without re-authentication")
    topic = f"reauth-{uuid.uuid4().hex[:8]}"
    errors: list[str] = []
    p = Producer({**confluent_conf(broker.ports[1], "SASL_PLAINTEXT", "SCRAM-SHA-256"), "linger.ms": 0})
    sent = 0
    end = time.monotonic() + 3 * LIFETIME_MS / 1000  # three session lifetimes
    while time.monotonic() < end:
        p.produce(topic, value=b"%d" % sent, on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
        sent += 1
        p.poll(0.1)
    assert p.flush(30) == 0 and errors == []
    log = broker.log_text()
    assert log.count("re-authenticated as User:alice") - before >= 2, log[-3000:]
    assert log.count("without re-authentication") == closed_before  # it was never cut off
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{broker.ports[0]}", "group.id": topic,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[int] = []
    deadline = time.monotonic() + 30
    while len(got) < sent and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and not m.error():
            got.append(int(m.value()))
    consumer.close()
    assert got == list(range(sent)) and sent > 20
