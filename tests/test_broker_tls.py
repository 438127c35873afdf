"""Listeners and TLS (issue 16, part 1) against the real broker (in-process; the start-up rules
against `loglake serve` processes) with real clients: confluent-kafka, kafka-python, aiokafka and
kcat over SSL; mTLS with the principal taken from the client certificate; refused handshakes
(untrusted, expired, TLS 1.1, plaintext bytes, truncated) that leave the broker serving; two
listeners with their own advertised ports; the safe-by-default refusal; an encrypted key."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from loglake.broker.config import BrokerConfig
from loglake.broker.listeners import match_advertised, parse_listeners
from loglake.broker.security.tls import PrincipalMapper, subject_dn
from loglake.cli.startup import EXIT_CONFIG, EXIT_USAGE
from loglake.errors import ConfigError
from tlskit import Pki, make_pki, ssl_args

from brokerkit import InProcessBroker, serving_in_process

LOGLAKE = [sys.executable, "-m", "loglake.cli.main"]
KCAT = "kcat"
#: Each refused handshake logged (not summarised), so that each test sees its own line.
EVERY_LINE = {"LOGLAKE_LOG_RATE_LIMIT_MS": "0"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[InProcessBroker]:
    """PLAINTEXT and SSL listeners at once (the SSL one advertised as localhost); client
    certificates asked for but not required; the default principal mapping."""
    args = ["--listen", "127.0.0.1:0", "--listen", "SSL://127.0.0.1:0", "--advertised-listener", "SSL://localhost:0"]
    args += ssl_args(pki, client_auth="requested")
    # Client authentication turns allow.everyone.if.no.acl.found off by default; these tests are
    # about listeners and TLS, not ACLs (tests/test_broker_acls.py), so everyone may do everything.
    args += ["--allow-everyone-if-no-acl-found"]
    with serving_in_process(tmp_path_factory.mktemp("tls") / "data", args, env=EVERY_LINE, log_level="DEBUG") as b:
        yield b


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[InProcessBroker]:
    """One SSL listener that requires a client certificate; principals mapped by a rule."""
    args = [
        "--listen", "SSL://127.0.0.1:0", *ssl_args(pki, client_auth="required"),
        "--config", str(_toml(tmp_path_factory.mktemp("conf"), 'ssl_principal_mapping_rules = "RULE:^CN=(.*?),OU=eng,.*$/$1/U,DEFAULT"\n')),
        "--allow-everyone-if-no-acl-found",  # as above: TLS tests, not ACL tests
    ]
    with serving_in_process(tmp_path_factory.mktemp("mtls") / "data", args, env=EVERY_LINE, log_level="DEBUG") as b:
        yield b


def _toml(directory: Path, text: str) -> Path:
    path = directory / "broker.toml"
    path.write_text(text)
    return path


def ssl_conf(pki: Pki, port: int, client: Any = None) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL", "ssl.ca.location": str(pki.ca), "log_level": 0,
    }
    if client is not None:
        conf.update({"ssl.certificate.location": str(client.cert), "ssl.key.location": str(client.key)})
    return conf


def confluent_round_trip(conf: dict[str, Any], n: int = 50) -> None:
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    p = Producer(conf)
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), key=b"k")
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


def advertised(conf: dict[str, Any]) -> tuple[str, int]:
    brokers = AdminClient(conf).list_topics(timeout=15).brokers
    meta = next(iter(brokers.values()))
    return meta.host, meta.port


def wait_log(b: InProcessBroker, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in b.log_text().splitlines():
            if text in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no log line with {text!r}:\n{b.log_text()[-3000:]}")


def client_ctx(pki: Pki, client: Any = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    return ctx


def tls_talk(port: int, ctx: ssl.SSLContext) -> None:
    """Handshake and one Kafka ApiVersions round trip; raises when the broker refuses."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, ctx.wrap_socket(raw, server_hostname="localhost") as s:
        s.sendall(API_VERSIONS_V0)
        data = s.recv(4)  # TLS 1.3 reports a refused client certificate only at the first read
        if not data:
            raise ConnectionError("closed by the broker")


#: ApiVersions v0, correlation id 7, client id "t".
API_VERSIONS_V0 = bytes.fromhex("0000000b" "0012" "0000" "00000007" "0001") + b"t"


# ------------------------------------------------------------------------------ unit: parsing


def test_listener_parsing_and_advertised_matching() -> None:
    ls = parse_listeners(["127.0.0.1:9092", "SSL://[::1]:9093"])
    assert [(x.protocol, x.host, x.port) for x in ls] == [("PLAINTEXT", "127.0.0.1", 9092), ("SSL", "::1", 9093)]
    assert parse_listeners("PLAINTEXT://h:1,ssl://h:2")[1].protocol == "SSL"
    assert match_advertised(ls, ["SSL://b.example:19093"]) == [None, ("b.example", 19093)]
    assert match_advertised(ls, "a.example:1,b.example:2") == [("a.example", 1), ("b.example", 2)]
    assert match_advertised(ls, ["SSL://b:2", "a:1"]) == [("a", 1), ("b", 2)]
    assert match_advertised(ls, ["b:2", "PLAINTEXT://a:1"]) == [("a", 1), ("b", 2)]  # named ones first
    with pytest.raises(ConfigError, match="more advertised listeners than listeners"):
        match_advertised(ls, ["a:1", "b:2", "c:3"])
    with pytest.raises(ConfigError, match="two PLAINTEXT listeners"):
        parse_listeners(["127.0.0.1:1", "PLAINTEXT://127.0.0.1:2"])
    with pytest.raises(ConfigError, match="unknown security protocol"):
        parse_listeners(["TLS://127.0.0.1:1"])
    with pytest.raises(ConfigError, match="no SASL_SSL listener"):
        match_advertised(ls, ["SASL_SSL://x:1"])


def test_list_settings_from_env_toml_and_flags(tmp_path: Path) -> None:
    env = {"LOGLAKE_LISTEN": "127.0.0.1:0, SSL://127.0.0.1:0", "LOGLAKE_SSL_CERT": "x.pem"}
    assert BrokerConfig.load(env=env).listen == ["127.0.0.1:0", "SSL://127.0.0.1:0"]
    toml = _toml(tmp_path, 'listen = ["127.0.0.1:0"]\nadvertised_listener = "a.example:1"\nssl_client_auth = "requested"\n')
    config = BrokerConfig.load(str(toml), env={})
    assert config.listen == ["127.0.0.1:0"] and config.advertised_listener == ["a.example:1"]
    assert BrokerConfig.load(env={}, listen=["127.0.0.1:1,SSL://127.0.0.1:2"], ssl_cert="c").listen == ["127.0.0.1:1", "SSL://127.0.0.1:2"]
    shown = BrokerConfig.load(env={}, listen=["127.0.0.1:1", "SSL://127.0.0.1:2"], ssl_cert="c", ssl_key_password="pw").describe()
    assert 'listen = ["127.0.0.1:1", "SSL://127.0.0.1:2"]  # --listen' in shown.splitlines()
    assert "pw" not in shown and 'ssl_key_password = "(hidden)"' in shown
    with pytest.raises(ConfigError, match="ssl_client_auth='maybe'"):
        BrokerConfig.load(env={"LOGLAKE_SSL_CLIENT_AUTH": "maybe"})


def test_principal_mapping_rules() -> None:
    dn = "CN=alice,OU=eng,O=loglake"
    assert PrincipalMapper("DEFAULT").name(dn) == dn
    assert PrincipalMapper("RULE:^CN=(.*?),OU=eng,.*$/$1/U,DEFAULT").name(dn) == "ALICE"
    assert PrincipalMapper("RULE:^CN=(.*?),OU=ops,.*$/$1/,DEFAULT").name(dn) == dn
    assert PrincipalMapper("RULE:^CN=([a-z]+),.*$/svc\\/$1/L").name(dn) == "svc/alice"
    assert PrincipalMapper("RULE:^CN=bob,.*$/$1/").name(dn) is None
    with pytest.raises(ConfigError, match="ssl_principal_mapping_rules"):
        PrincipalMapper("RULE:broken")
    cert = {"subject": ((("organizationName", "loglake"),), (("organizationalUnitName", "eng"),), (("commonName", "a,b"),))}
    assert subject_dn(cert) == "CN=a\\,b,OU=eng,O=loglake"


# --------------------------------------------------------------------- two listeners, clients


def test_two_listeners_port_file_and_metadata_per_listener(broker: InProcessBroker, pki: Pki) -> None:
    plain, tls = broker.ports
    assert broker.port == plain and tls != plain
    assert advertised({"bootstrap.servers": f"127.0.0.1:{plain}", "log_level": 0}) == ("127.0.0.1", plain)
    # matched by protocol; port 0 is the port the listener got; the certificate names localhost
    assert advertised(ssl_conf(pki, tls)) == ("localhost", tls)
    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{plain}", "log_level": 0})
    configs = admin.describe_configs([resource])[resource].result(timeout=15)
    assert configs["listeners"].value == f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}"
    assert configs["advertised.listeners"].value == f"PLAINTEXT://127.0.0.1:{plain},SSL://localhost:{tls}"


def test_confluent_over_ssl(broker: InProcessBroker, pki: Pki) -> None:
    confluent_round_trip(ssl_conf(pki, broker.ports[1]))


def test_requested_client_certificate_gives_the_full_subject_or_anonymous(broker: InProcessBroker, pki: Pki) -> None:
    tls_talk(broker.ports[1], client_ctx(pki, pki.alice))
    assert "on SSL listener" in wait_log(broker, "principal User:CN=alice,OU=eng,O=loglake")  # DEFAULT: Kafka's DN string
    before = broker.log_text().count("on SSL listener: principal User:ANONYMOUS")
    tls_talk(broker.ports[1], client_ctx(pki))
    deadline = time.monotonic() + 10
    while broker.log_text().count("on SSL listener: principal User:ANONYMOUS") == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert broker.log_text().count("on SSL listener: principal User:ANONYMOUS") > before
    assert "on PLAINTEXT listener: principal User:ANONYMOUS" in broker.log_text()
    with pytest.raises((ssl.SSLError, ConnectionError)):  # requested: a certificate that does not verify is refused
        tls_talk(broker.ports[1], client_ctx(pki, pki.untrusted))


def test_kafka_python_over_ssl(broker: InProcessBroker, pki: Pki) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    topic = f"kp-{uuid.uuid4().hex[:8]}"
    common = {"bootstrap_servers": f"127.0.0.1:{broker.ports[1]}", "security_protocol": "SSL", "ssl_cafile": str(pki.ca)}
    p = KafkaProducer(**common)
    for i in range(20):
        p.send(topic, f"kp{i}".encode()).get(timeout=30)
    p.close()
    c = KafkaConsumer(**common, consumer_timeout_ms=5000, auto_offset_reset="earliest")
    c.assign([KTP(topic, 0)])
    got = [m.value for m in c]
    c.close()
    assert got == [f"kp{i}".encode() for i in range(20)]


def test_aiokafka_over_ssl(broker: InProcessBroker, pki: Pki) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as ATP
    from aiokafka.helpers import create_ssl_context

    topic = f"aio-{uuid.uuid4().hex[:8]}"

    async def run() -> list[bytes]:
        common = {
            "bootstrap_servers": f"127.0.0.1:{broker.ports[1]}", "security_protocol": "SSL",
            "ssl_context": create_ssl_context(cafile=str(pki.ca)),
        }
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

    assert asyncio.run(run()) == [f"a{i}".encode() for i in range(20)]


def test_kcat_over_ssl(broker: InProcessBroker, pki: Pki) -> None:
    topic = f"kcat-{uuid.uuid4().hex[:8]}"
    base = [KCAT, "-b", f"127.0.0.1:{broker.ports[1]}", "-X", "security.protocol=ssl", "-X", f"ssl.ca.location={pki.ca}"]
    subprocess.run([*base, "-P", "-t", topic], input=b"one\ntwo\nthree\n", check=True, timeout=60)
    out = subprocess.run([*base, "-C", "-t", topic, "-o", "beginning", "-e", "-q"], capture_output=True, check=True, timeout=60)
    assert out.stdout.split() == [b"one", b"two", b"three"]


# -------------------------------------------------------------------- refused, broker unaffected


def test_plaintext_bytes_to_the_tls_port_close_with_one_line(broker: InProcessBroker, pki: Pki) -> None:
    with socket.create_connection(("127.0.0.1", broker.ports[1]), timeout=10) as s:
        s.sendall(API_VERSIONS_V0)
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
    line = wait_log(broker, "(not TLS: is a PLAINTEXT client pointed at the SSL listener?)")
    assert "TLS handshake failed on the SSL listener" in line, line
    confluent_round_trip(ssl_conf(pki, broker.ports[1]), n=5)


def test_truncated_tls_handshake(broker: InProcessBroker, pki: Pki) -> None:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = client_ctx(pki).wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = outgoing.read()
    before = broker.log_text().count("TLS handshake failed")
    with socket.create_connection(("127.0.0.1", broker.ports[1]), timeout=10) as s:
        s.sendall(hello[: len(hello) // 2])
    deadline = time.monotonic() + 10
    while broker.log_text().count("TLS handshake failed") == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert broker.log_text().count("TLS handshake failed") > before
    tls_talk(broker.ports[1], client_ctx(pki))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tls_1_1_client_is_refused(broker: InProcessBroker, pki: Pki) -> None:
    ctx = client_ctx(pki)
    ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this OpenSSL offer TLS 1.1 at all
    except ssl.SSLError:
        pass
    with pytest.raises((ssl.SSLError, ConnectionError)):
        tls_talk(broker.ports[1], ctx)
    assert "older than 1.2" in wait_log(broker, "TLS handshake failed on the SSL listener: UNSUPPORTED_PROTOCOL")
    tls_talk(broker.ports[1], client_ctx(pki))


def test_a_client_refusing_the_broker_certificate_is_told_apart(broker: InProcessBroker, pki: Pki) -> None:
    """The client's alert about the broker's certificate (unknown CA, a host name the certificate
    does not name) is logged as the client refusing the broker, not as a bad client certificate."""
    for ctx, host, alert in (
        (ssl.create_default_context(), "localhost", "TLSV1_ALERT_UNKNOWN_CA"),  # the system CAs: not ours
        (client_ctx(pki), "not-the-broker.example", "SSLV3_ALERT_BAD_CERTIFICATE"),  # main blamed the client here
    ):
        with pytest.raises(ssl.SSLCertVerificationError), socket.create_connection(
            ("127.0.0.1", broker.ports[1]), timeout=10
        ) as raw:
            ctx.wrap_socket(raw, server_hostname=host)
        line = wait_log(broker, f"the client did not accept the broker's certificate: {alert}")
        assert "client certificate was not accepted" not in line, line
    tls_talk(broker.ports[1], client_ctx(pki))


def test_eof_with_the_last_handshake_flight_logs_no_asyncio_warning(broker: InProcessBroker, pki: Pki) -> None:
    """A client whose Finished and close_notify arrive together: asyncio handles the EOF before
    start_tls returns, which a plain stream protocol answers "keep open" (and asyncio warns)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = client_ctx(pki).wrap_bio(incoming, outgoing, server_hostname="localhost")
    with socket.create_connection(("127.0.0.1", broker.ports[1]), timeout=10) as s:
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                s.sendall(outgoing.read())
                incoming.write(s.recv(65536))
        with pytest.raises(ssl.SSLWantReadError):
            obj.unwrap()
        s.sendall(outgoing.read())  # the client's Finished and its close_notify, one segment
        s.settimeout(10)
        while s.recv(4096):  # the broker closes
            pass
    tls_talk(broker.ports[1], client_ctx(pki))
    assert "eof_received" not in broker.log_text()


def test_mtls_principal_from_the_certificate(mtls: InProcessBroker, pki: Pki) -> None:
    confluent_round_trip(ssl_conf(pki, mtls.port, pki.alice), n=5)
    line = wait_log(mtls, "principal User:ALICE")
    assert "on SSL listener" in line


def test_mtls_refuses_missing_untrusted_and_expired_certificates(mtls: InProcessBroker, pki: Pki) -> None:
    for client in (None, pki.untrusted, pki.expired):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            tls_talk(mtls.port, client_ctx(pki, client))
    for words in ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate",
                  "CERTIFICATE_VERIFY_FAILED: certificate has expired"):  # missing, untrusted CA, expired
        line = wait_log(mtls, words)
        assert "(the client certificate was not accepted" in line and "did not accept the broker's" not in line, line
    # librdkafka without a certificate gets no metadata
    with pytest.raises(KafkaException):
        AdminClient(ssl_conf(pki, mtls.port)).list_topics(timeout=3)
    tls_talk(mtls.port, client_ctx(pki, pki.alice))


# ----------------------------------------------------------------------------- start-up rules


def serve(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOGLAKE, "serve", *args], capture_output=True, text=True, timeout=timeout)


def test_public_listener_without_authentication_is_refused(tmp_path: Path, pki: Pki) -> None:
    for listen in ("0.0.0.0:0", "SSL://0.0.0.0:0"):
        result = serve("--data-dir", str(tmp_path / "d"), "--listen", listen, *ssl_args(pki, client_auth="requested"))
        assert result.returncode == EXIT_USAGE, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: refusing to start") and "--allow-unauthenticated-public-listener" in line
    assert not (tmp_path / "d").exists()  # refused before anything was opened


def test_public_listeners_that_authenticate_or_are_allowed_start(tmp_path: Path, pki: Pki) -> None:
    with serving_in_process(tmp_path / "a", ["--listen", "SSL://0.0.0.0:0", *ssl_args(pki, client_auth="required")]) as b:
        tls_talk(b.port, client_ctx(pki, pki.alice))
    with serving_in_process(tmp_path / "b", ["--listen", "PLAINTEXT://0.0.0.0:0", "--allow-unauthenticated-public-listener"]) as b:
        assert advertised({"bootstrap.servers": f"127.0.0.1:{b.port}", "log_level": 0})[1] == b.port


def test_public_sasl_listener_starts_and_sasl_ssl_needs_a_certificate(tmp_path: Path) -> None:
    # SASL authenticates every client (tests/test_broker_sasl*.py): no override needed beyond loopback.
    with serving_in_process(tmp_path / "a", ["--listen", "SASL_PLAINTEXT://0.0.0.0:0"]) as b:
        assert b.port > 0
    result = serve("--data-dir", str(tmp_path / "d"), "--listen", "SASL_SSL://127.0.0.1:0")
    assert result.returncode == EXIT_CONFIG and "SASL_SSL listener needs --ssl-cert" in result.stderr, result.stderr


def test_encrypted_key_with_its_password(tmp_path: Path, pki: Pki) -> None:
    with serving_in_process(tmp_path / "d", ["--listen", "SSL://127.0.0.1:0", *ssl_args(pki, encrypted=True)]) as b:
        confluent_round_trip(ssl_conf(pki, b.port), n=3)
    args = ["--listen", "SSL://127.0.0.1:0", *ssl_args(pki, encrypted=True)]
    args[args.index("--ssl-key-password") + 1] = "wrong"
    result = serve("--data-dir", str(tmp_path / "e"), *args)
    assert result.returncode == EXIT_CONFIG, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "wrong --ssl-key-password" in line, line
