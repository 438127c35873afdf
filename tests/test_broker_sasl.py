"""SASL (issue 16, part 2) against the real broker (in-process) with real clients: confluent-kafka,
kafka-python, aiokafka and kcat over SASL_SSL with SCRAM-SHA-512 and over SASL_PLAINTEXT with
PLAIN and SCRAM-SHA-256; wrong passwords and unknown users refused with
SASL_AUTHENTICATION_FAILED while other clients go on; the principal set; /metrics counting
failures and successes; the safe-by-default check treating SASL listeners as authenticated."""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from loglake.broker.config import BrokerConfig
from loglake.broker.listeners import exposed_without_authentication
from loglake.errors import ConfigError
from loglake.kafka_errors import ErrorCode
from saslkit import SASL_ERRORS_EVERY_LINE, USERS, RawClient, add_users, confluent_conf
from tlskit import Pki, make_pki, ssl_args

from brokerkit import InProcessBroker, free_port, serving_in_process

KCAT = "kcat"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[InProcessBroker]:
    """PLAINTEXT, SASL_PLAINTEXT and SASL_SSL listeners (ports in that order); alice and bob
    added with `loglake users` before the broker starts."""
    data = tmp_path_factory.mktemp("sasl") / "data"
    add_users(data)
    args = [
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "SASL_PLAINTEXT://127.0.0.1:0",
        "--listen",
        "SASL_SSL://127.0.0.1:0",
        *ssl_args(pki),
        "--allow-everyone-if-no-acl-found",  # SASL tests, not ACL tests (test_broker_sasl_acls.py)
        "--metrics-listen",
        f"127.0.0.1:{free_port()}",
    ]
    with serving_in_process(data, args, env=SASL_ERRORS_EVERY_LINE, log_level="DEBUG") as b:
        b.metrics_port = int(args[-1].rsplit(":", 1)[1])  # type: ignore[attr-defined]
        yield b


def wait_log(b: InProcessBroker, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in b.log_text().splitlines():
            if text in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no log line with {text!r}:\n{b.log_text()[-3000:]}")


def confluent_round_trip(conf: dict[str, Any], n: int = 30) -> None:
    topic = f"sasl-{uuid.uuid4().hex[:8]}"
    p = Producer(conf)
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode())
    assert p.flush(30) == 0
    c = Consumer({**conf, "group.id": uuid.uuid4().hex, "enable.partition.eof": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    assert got == [f"v{i}".encode() for i in range(n)]


# ------------------------------------------------------------------------------ round trips


def test_confluent_sasl_ssl_scram_sha512(broker: InProcessBroker, pki: Pki) -> None:
    confluent_round_trip(confluent_conf(broker.ports[2], "SASL_SSL", "SCRAM-SHA-512", ca=pki.ca))
    line = wait_log(broker, "authenticated as User:alice with SCRAM-SHA-512")
    assert "authenticated as User:alice" in line


def test_confluent_sasl_plaintext_plain_and_scram_sha256(broker: InProcessBroker) -> None:
    confluent_round_trip(confluent_conf(broker.ports[1], "SASL_PLAINTEXT", "PLAIN", user="bob"))
    wait_log(broker, "authenticated as User:bob with PLAIN")
    confluent_round_trip(confluent_conf(broker.ports[1], "SASL_PLAINTEXT", "SCRAM-SHA-256"))


def _kafka_python(port: int, protocol: str, mechanism: str, ca: Path | None = None) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    topic = f"kp-{uuid.uuid4().hex[:8]}"
    common: dict[str, Any] = {
        "bootstrap_servers": f"127.0.0.1:{port}",
        "security_protocol": protocol,
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "alice",
        "sasl_plain_password": USERS["alice"][0],
    }
    if ca is not None:
        common["ssl_cafile"] = str(ca)
    p = KafkaProducer(**common)
    for i in range(20):
        p.send(topic, f"kp{i}".encode()).get(timeout=30)
    p.close()
    c = KafkaConsumer(**common, consumer_timeout_ms=5000, auto_offset_reset="earliest")
    c.assign([KTP(topic, 0)])
    got = [m.value for m in c]
    c.close()
    assert got == [f"kp{i}".encode() for i in range(20)]


def test_kafka_python_sasl_ssl_scram_sha512_and_plain(broker: InProcessBroker, pki: Pki) -> None:
    _kafka_python(broker.ports[2], "SASL_SSL", "SCRAM-SHA-512", pki.ca)
    _kafka_python(broker.ports[1], "SASL_PLAINTEXT", "PLAIN")


def _aiokafka(port: int, protocol: str, mechanism: str, ca: Path | None = None) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as ATP
    from aiokafka.helpers import create_ssl_context

    topic = f"aio-{uuid.uuid4().hex[:8]}"

    async def run() -> list[bytes]:
        common: dict[str, Any] = {
            "bootstrap_servers": f"127.0.0.1:{port}",
            "security_protocol": protocol,
            "sasl_mechanism": mechanism,
            "sasl_plain_username": "alice",
            "sasl_plain_password": USERS["alice"][0],
        }
        if ca is not None:
            common["ssl_context"] = create_ssl_context(cafile=str(ca))
        p = AIOKafkaProducer(**common)
        await p.start()
        try:
            for i in range(20):
                await p.send_and_wait(topic, f"a{i}".encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(**common, auto_offset_reset="earliest")
        await c.start()
        try:
            c.assign([ATP(topic, 0)])
            await c.seek_to_beginning(ATP(topic, 0))
            got: list[bytes] = []
            while len(got) < 20:
                batch = await c.getmany(timeout_ms=10_000)
                if not batch:
                    break
                got += [m.value for ms in batch.values() for m in ms if m.value is not None]
            return got
        finally:
            await c.stop()

    return asyncio.run(run())


def test_aiokafka_sasl_ssl_scram_sha512_and_sasl_plaintext_scram_sha256(broker: InProcessBroker, pki: Pki) -> None:
    want = [f"a{i}".encode() for i in range(20)]
    assert _aiokafka(broker.ports[2], "SASL_SSL", "SCRAM-SHA-512", pki.ca) == want
    assert _aiokafka(broker.ports[1], "SASL_PLAINTEXT", "SCRAM-SHA-256") == want


def test_kcat_sasl_ssl_scram_sha512(broker: InProcessBroker, pki: Pki) -> None:
    topic = f"kcat-{uuid.uuid4().hex[:8]}"
    base = [
        KCAT,
        "-b",
        f"127.0.0.1:{broker.ports[2]}",
        "-X",
        "security.protocol=sasl_ssl",
        "-X",
        f"ssl.ca.location={pki.ca}",
        "-X",
        "sasl.mechanisms=SCRAM-SHA-512",
        "-X",
        "sasl.username=alice",
        "-X",
        f"sasl.password={USERS['alice'][0]}",
    ]
    subprocess.run([*base, "-P", "-t", topic], input=b"one\ntwo\nthree\n", check=True, timeout=60)
    out = subprocess.run(
        [*base, "-C", "-t", topic, "-o", "beginning", "-e", "-q"], capture_output=True, check=True, timeout=60
    )
    assert out.stdout.split() == [b"one", b"two", b"three"]


# ----------------------------------------------------------------- refused, broker unaffected


def _confluent_auth_error(conf: dict[str, Any]) -> str:
    errors: list[Any] = []
    p = Producer(
        {**conf, "error_cb": errors.append, "reconnect.backoff.ms": 1000, "reconnect.backoff.max.ms": 1000}
    )
    p.produce(f"never-{uuid.uuid4().hex[:6]}", b"x")
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        p.poll(0.2)
    p.purge()
    p.flush(1)
    assert errors, "no error reported"
    return str(errors[0])


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "whatever")])
def test_wrong_password_and_unknown_user_are_refused_alike(
    broker: InProcessBroker, pki: Pki, user: str, password: str
) -> None:
    for mechanism in ("PLAIN", "SCRAM-SHA-256"):
        conf = confluent_conf(broker.ports[1], "SASL_PLAINTEXT", mechanism, user="alice", password=password)
        conf["sasl.username"] = user
        text = _confluent_auth_error(conf)
        assert "Authentication failed during authentication due to invalid credentials" in text, text
    why = "wrong password" if user == "alice" else "unknown user"
    line = wait_log(broker, f"SASL authentication failed for User:{user} from 127.0.0.1:")
    assert "closing the connection in 100 ms" in line
    wait_log(broker, why)
    # Another client is not affected.
    confluent_round_trip(confluent_conf(broker.ports[2], "SASL_SSL", "SCRAM-SHA-512", ca=pki.ca), n=5)


def test_failed_authentication_answers_58_then_closes(broker: InProcessBroker) -> None:
    c = RawClient(broker.ports[1])
    try:
        assert c.handshake("PLAIN") == (ErrorCode.NONE, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
        code, message, _ = c.authenticate(b"\0alice\0not-it")
        assert code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert (
            message
            == "Authentication failed during authentication due to invalid credentials with SASL mechanism PLAIN"
        )
        assert c.closed_by_broker()
    finally:
        c.close()
    ok = RawClient(broker.ports[1])
    try:
        assert ok.handshake("PLAIN")[0] == ErrorCode.NONE
        assert ok.authenticate(b"\0bob\0" + USERS["bob"][0].encode())[0] == ErrorCode.NONE
        assert ok.api_versions() == ErrorCode.NONE  # authenticated: other requests are answered
    finally:
        ok.close()


def test_metrics_count_failures_by_principal_and_source_and_successes_by_mechanism(broker: InProcessBroker) -> None:
    c = RawClient(broker.ports[1])
    try:
        c.handshake("PLAIN")
        assert c.authenticate(b"\0metrics-probe\0x")[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
    finally:
        c.close()
    port = broker.metrics_port  # type: ignore[attr-defined]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert (
        'loglake_sasl_authentication_failures_total{principal="User:metrics-probe",source="127.0.0.1"} 1.0'
        in text
    )
    assert 'loglake_sasl_authentications_total{mechanism="PLAIN"}' in text


# --------------------------------------------------------------------------------- settings


def test_settings_and_safe_by_default() -> None:
    config = BrokerConfig.load(
        env={"LOGLAKE_SASL_ENABLED_MECHANISMS": "scram-sha-512"}, listen=["SASL_PLAINTEXT://0.0.0.0:9092"]
    )
    config.validate()
    with pytest.raises(ConfigError, match="sasl_enabled_mechanisms='GSSAPI'"):
        BrokerConfig.load(env={}, sasl_enabled_mechanisms="GSSAPI").validate()
    with pytest.raises(ConfigError, match="SASL_SSL listener needs --ssl-cert"):
        BrokerConfig.load(env={}, listen=["SASL_SSL://127.0.0.1:0"]).listeners()
    # A SASL listener authenticates every client: it may be bound beyond loopback.
    assert exposed_without_authentication(config.listeners(), "none") == []
