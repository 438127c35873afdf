"""The schema registry's security (issue 33): HTTPS with the broker's certificate options
(`--schema-registry-listen https://HOST:PORT`), HTTP basic auth against the broker's SCRAM users
whenever a Kafka listener authenticates (through the failed-login throttle), and ACLs on
subjects and on the registry (Redpanda's SUBJECT and REGISTRY resources) decided by the broker's
authorizer. Through confluent-kafka's SchemaRegistryClient (``ssl.ca.location``,
``basic.auth.user.info``) against a real `loglake serve`, and the refusals: 401 (40101, with a
WWW-Authenticate challenge) and 403 (40301).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from loglake.broker.config import BrokerConfig, parse_registry_listen
from loglake.broker.http import HttpRequest
from loglake.broker.security.authorizer import REGISTRY_NAME, Authorizer, Binding, ResourceType, check_binding
from loglake.broker.security.registry_auth import RegistryAuth, Unauthenticated, basic_credentials
from loglake.broker.security.sasl import SaslAuthenticator, SaslStats
from loglake.cli import command_config
from loglake.cli.remote_raw import Connection
from loglake.errors import ConfigError
from loglake.logsafe import RateLimitedLog
from loglake.meta.scram import TypicalShapes, typical_shapes
from loglake.registry import RegistryApi
from loglake.registry.api import ACCESS, On, Op
from saslkit import USERS, add_users, users
from tlskit import Pki, make_pki, ssl_args

from brokerkit import Broker, free_port

USER = json.dumps({"type": "record", "name": "User", "namespace": "ex", "fields": [{"name": "name", "type": "string"}]})
ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "ex", "fields": [{"name": "id", "type": "long"}]})
#: Kafka's codes, and loglake's for the registry's resources (what CreateAcls carries).
LITERAL, PREFIXED = 3, 4
READ, WRITE, DESCRIBE_CONFIGS, ALTER_CONFIGS = 3, 4, 10, 11
ALLOW = 3
INVALID_REQUEST = 42
SUBJECT, REGISTRY = int(ResourceType.SUBJECT), int(ResourceType.REGISTRY)
CAROL = ("carol", "carol-secret")
#: Failed logins one principal may have per window before logins are refused unchecked.
PER_PRINCIPAL = 3


class Served:
    def __init__(self, broker: Broker, port: int, pki: Pki) -> None:
        self.broker = broker
        self.url = f"https://127.0.0.1:{port}"
        self.port = port
        self.pki = pki

    def client(self, user: str, password: str | None = None) -> SchemaRegistryClient:
        secret = USERS[user][0] if password is None else password
        return SchemaRegistryClient(
            {"url": self.url, "ssl.ca.location": str(self.pki.ca), "basic.auth.user.info": f"{user}:{secret}"}
        )

    def create_acls(self, *rows: tuple[int, str, int, str, int]) -> list[int]:
        """CreateAcls as alice (the super user) over SCRAM: (type, name, pattern, principal, operation) ALLOW."""
        command_config.use({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                            "sasl.username": "alice", "sasl.password": USERS["alice"][0]})
        try:
            with Connection(self.broker.bootstrap, "test") as conn:
                resp = conn.request(30, 3, creations=[
                    {"resource_type": t, "resource_name": n, "resource_pattern_type": p, "principal": who,
                     "host": "*", "operation": op, "permission_type": ALLOW}
                    for t, n, p, who, op in rows
                ])
        finally:
            command_config.use({})
        return [int(r.error_code) for r in resp.results]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    data = tmp_path_factory.mktemp("registry-security") / "data"
    add_users(data)
    users("add", CAROL[0], "--password-stdin", data_dir=data, password=CAROL[1])
    port = free_port()
    broker = Broker(
        data,
        ["--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--super-users", "User:alice",
         "--schema-registry-listen", f"https://127.0.0.1:{port}", *ssl_args(pki)],
        env={"LOGLAKE_SASL_LOGIN_FAILURES_PER_PRINCIPAL": str(PER_PRINCIPAL)},
    ).start()
    try:
        yield Served(broker, port, pki)
    finally:
        if broker.running:
            assert broker.stop() == 0, broker.log_text()[-4000:]
        assert "Traceback" not in broker.log_text(), broker.log_text()[-4000:]


def test_a_client_with_credentials_over_https_registers_and_serializes(served: Served) -> None:
    client = served.client("alice")
    ctx = SerializationContext("users", MessageField.VALUE)
    value = AvroSerializer(client, USER)({"name": "ada"}, ctx)
    assert value is not None and value[0] == 0
    assert AvroDeserializer(served.client("alice"))(value, ctx) == {"name": "ada"}
    assert "users-value" in client.get_subjects()


def test_no_credentials_and_wrong_ones_are_401_with_a_challenge(served: Served) -> None:
    ca = str(served.pki.ca)
    resp = requests.get(f"{served.url}/subjects", verify=ca, timeout=10)
    assert resp.status_code == 401
    assert resp.json() == {"error_code": 40101, "message": "Unauthorized"}
    assert resp.headers["WWW-Authenticate"].startswith("Basic realm=")
    for header in ("Basic !!!", "Basic " + "YWxpY2U=", "Bearer abc"):  # not base64; no colon; not Basic
        resp = requests.get(f"{served.url}/subjects", verify=ca, timeout=10, headers={"Authorization": header})
        assert (resp.status_code, resp.json()["error_code"]) == (401, 40101), header
    for user, password in (("alice", "wrong"), ("nobody", "whatever")):
        with pytest.raises(SchemaRegistryError) as refused:
            served.client(user, password).get_subjects()
        assert (refused.value.http_status_code, refused.value.error_code) == (401, 40101)
    # HTTPS only, with the broker's certificate: a client that does not trust its CA, or speaks plain HTTP, gets nothing
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{served.url}/subjects", timeout=10)
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{served.port}/subjects", timeout=10)


def test_acls_on_subjects_and_on_the_registry(served: Served) -> None:
    alice, bob = served.client("alice"), served.client("bob")
    orders = alice.register_schema("orders-value", Schema(ORDER, "AVRO"))

    def refused(call: Any) -> SchemaRegistryError:
        with pytest.raises(SchemaRegistryError) as exc:
            call()
        assert (exc.value.http_status_code, exc.value.error_code) == (403, 40301), exc.value
        return exc.value

    # authenticated, granted nothing (a Kafka listener authenticates: no ACL, no access)
    assert bob.get_subjects() == []
    assert "WRITE" in refused(lambda: bob.register_schema("bob-value", Schema(USER, "AVRO"))).error_message.upper()
    refused(lambda: bob.get_schema(orders))
    refused(lambda: bob.get_compatibility())

    assert served.create_acls(
        (SUBJECT, "bob-", PREFIXED, "User:bob", WRITE),
        (SUBJECT, "bob-", PREFIXED, "User:bob", READ),
        (REGISTRY, REGISTRY_NAME, LITERAL, "User:bob", DESCRIBE_CONFIGS),
        (REGISTRY, "not-the-registry", LITERAL, "User:bob", READ),
    ) == [0, 0, 0, INVALID_REQUEST]
    bob_id = bob.register_schema("bob-value", Schema(USER, "AVRO"))
    assert bob.get_subjects() == ["bob-value"]  # READ implies DESCRIBE; orders-value is not listed
    assert json.loads(bob.get_schema(bob_id).schema_str)["name"] == "User"  # held by users-value too
    assert bob.get_latest_version("bob-value").schema_id == bob_id
    assert bob.get_compatibility() == "BACKWARD"
    refused(lambda: bob.register_schema("orders-value", Schema(USER, "AVRO")))
    refused(lambda: bob.get_latest_version("orders-value"))
    refused(lambda: bob.get_schema(orders))
    refused(lambda: bob.set_compatibility(level="NONE"))  # ALTER_CONFIGS on the registry
    refused(lambda: bob.delete_subject("bob-value"))  # DELETE on the subject
    assert alice.get_compatibility() == "BACKWARD"
    assert "DENIED principal=User:bob" in served.broker.log_text()


def test_failed_basic_logins_go_through_the_login_throttle(served: Served) -> None:
    user, password = CAROL
    assert served.client(user, password).get_subjects() == []  # carol exists (and may see nothing)
    for _ in range(PER_PRINCIPAL):  # the first failure ends the trust carol's login gave 127.0.0.1
        with pytest.raises(SchemaRegistryError):
            served.client(user, "wrong").get_subjects()
    with pytest.raises(SchemaRegistryError) as exc:
        served.client(user, password).get_subjects()  # refused unchecked: the principal's bucket is full
    assert exc.value.http_status_code == 401
    assert "login throttle, per principal" in served.broker.log_text()


def test_a_client_certificate_names_the_caller_over_https(tmp_path: Path) -> None:
    """A broker whose SSL listener requests client certificates: over the registry's HTTPS a
    verified certificate is the principal (ssl_principal_mapping_rules), as on the Kafka
    listener; without one (and without credentials) the answer is 401."""
    pki = make_pki(tmp_path / "pki", clients=("bob",))
    port = free_port()
    broker = Broker(
        tmp_path / "data",
        ["--listen", "SSL://127.0.0.1:0", *ssl_args(pki, client_auth="requested"), "--super-users", "User:alice",
         "--schema-registry-listen", f"https://127.0.0.1:{port}"],
        env={"LOGLAKE_SSL_PRINCIPAL_MAPPING_RULES": "RULE:^CN=([^,]+),.*$/$1/,DEFAULT"},
    ).start()
    try:
        def client(pair: Any) -> SchemaRegistryClient:
            return SchemaRegistryClient({"url": f"https://127.0.0.1:{port}", "ssl.ca.location": str(pki.ca),
                                         "ssl.certificate.location": str(pair.cert), "ssl.key.location": str(pair.key)})

        schema_id = client(pki.alice).register_schema("certs-value", Schema(USER, "AVRO"))  # alice: the super user
        with pytest.raises(SchemaRegistryError) as exc:
            client(pki.clients["bob"]).get_schema(schema_id)  # bob: no ACL
        assert (exc.value.http_status_code, exc.value.error_code) == (403, 40301)
        resp = requests.get(f"https://127.0.0.1:{port}/subjects", verify=str(pki.ca), timeout=10)
        assert (resp.status_code, resp.json()["error_code"]) == (401, 40101)
    finally:
        assert broker.stop() == 0, broker.log_text()[-4000:]
    assert "DENIED principal=User:bob" in broker.log_text()
    assert "Traceback" not in broker.log_text(), broker.log_text()[-4000:]


# ---- without a broker ------------------------------------------------------------------------


def test_the_listen_url_names_https() -> None:
    assert parse_registry_listen("127.0.0.1:8081") == (False, "127.0.0.1", 8081)
    assert parse_registry_listen("http://127.0.0.1:8081") == (False, "127.0.0.1", 8081)
    assert parse_registry_listen("https://0.0.0.0:8081") == (True, "0.0.0.0", 8081)
    with pytest.raises(ConfigError, match="http:// or https://"):
        parse_registry_listen("ftp://127.0.0.1:8081")
    with pytest.raises(ConfigError, match="HTTPS needs --ssl-cert"):
        BrokerConfig(schema_registry_listen="https://127.0.0.1:0").validate()


def test_basic_credentials() -> None:
    assert basic_credentials("Basic YWxpY2U6czNjcjp0") == ("alice", b"s3cr:t")  # the password may hold a colon
    for bad in ("Basic", "Basic YWxpY2U=", "Basic Ol9f", "Digest abc", "Basic " + "YQ==" * 2000):
        with pytest.raises(Unauthenticated):
            basic_credentials(bad)


def test_registry_bindings_name_the_one_registry() -> None:
    def b(rtype: int, name: str) -> Binding:
        return Binding(rtype, name, LITERAL, "User:bob", "*", READ, ALLOW)

    assert check_binding(b(SUBJECT, "orders-value")) is None
    assert check_binding(b(REGISTRY, REGISTRY_NAME)) is None
    assert check_binding(b(REGISTRY, "orders-value")) is not None


class _Guard:
    """Allows what `granted` names: (op, on, subject)."""

    def __init__(self, *granted: tuple[Op, On, str]) -> None:
        self.granted = set(granted)
        self.refusals: list[tuple[Op, On, list[str]]] = []

    def allows(self, op: Op, on: On, subject: str) -> bool:
        return (op, on, subject) in self.granted

    def refused(self, op: Op, on: On, subjects: list[str]) -> None:
        self.refusals.append((op, on, subjects))


def _concrete(route: str) -> str:
    return route.replace("{s}", "s").replace("{v}", "1").replace("{id}", "1")


def test_every_route_of_the_access_table_is_checked(tmp_path: Path) -> None:
    """Each guarded row of ACCESS refuses a caller granted nothing (403 and one refusal naming
    the row's operation and resource), and lets through one granted exactly that."""
    from loglake.engine import Engine
    from loglake.registry import SchemaRegistry

    engine = Engine(str(tmp_path / "data"))
    engine.open()
    try:
        api = RegistryApi(SchemaRegistry(engine.meta, engine._check_open))
        body = json.dumps({"schema": USER}).encode()
        assert api.handle("POST", "/subjects/s/versions", {}, body)[0] == 200
        for (method, route), rule in ACCESS.items():
            path, sent = _concrete(route), body if method in ("POST",) else b""
            if method == "PUT":
                sent = json.dumps({"compatibility": "BACKWARD"} if "config" in route else {"mode": "READWRITE"}).encode()
            if method == "DELETE":
                continue  # checked below, on a subject of its own
            nobody = _Guard()
            status, doc = api.handle(method, path, {}, sent, nobody)
            if rule is None:
                assert status == 200 and not nobody.refusals, (method, route)
                continue
            op, on = rule
            if route in ("/subjects", "/schemas/ids/{id}/subjects"):
                assert (status, doc, nobody.refusals) == (200, [], []), (method, route)  # lists only what it may see
            else:
                assert (status, doc["error_code"]) == (403, 40301), (method, route, doc)
                assert nobody.refusals == [(op, on, ["s"] if on is On.SUBJECT else [])], (method, route)
            granted = _Guard((op, on, "s" if on is On.SUBJECT else ""))
            status, doc = api.handle(method, path, {}, sent, granted)
            assert status != 403 and not granted.refusals, (method, route, doc)  # past the check
        for route in ("/subjects/{s}/versions/{v}", "/subjects/{s}", "/config/{s}", "/mode/{s}", "/config", "/mode"):
            op, on = ACCESS[("DELETE", route)] or (Op.READ, On.SUBJECT)
            nobody = _Guard()
            status, doc = api.handle("DELETE", _concrete(route), {}, b"", nobody)
            assert (status, doc["error_code"]) == (403, 40301), route
            assert nobody.refusals == [(op, on, ["s"] if on is On.SUBJECT else [])], route
    finally:
        engine.close()


def test_a_verified_client_certificate_names_the_caller(tmp_path: Path) -> None:
    """Over HTTPS with a verified client certificate and no credentials, the principal comes from
    the certificate's subject (ssl_principal_mapping_rules); without either, a broker whose
    listener authenticates answers 401."""

    class NoCredentials:
        def credential(self, user: str, mechanism: str) -> None:
            return None

        def shapes(self) -> TypicalShapes:
            return typical_shapes({})

    config = BrokerConfig(
        data_dir=str(tmp_path), listen=["SSL://127.0.0.1:0"], ssl_cert="cert.pem", ssl_client_auth="required",
        ssl_principal_mapping_rules="RULE:^CN=([^,]+),.*$/$1/",
    )
    assert config.authenticates() and not BrokerConfig(data_dir=str(tmp_path)).authenticates()
    auth = RegistryAuth(config, SaslAuthenticator(config, NoCredentials(), SaslStats()), Authorizer(),
                        RateLimitedLog(logging.getLogger("test"), 0))
    import asyncio

    def caller(dn: str | None) -> str:
        request = HttpRequest("GET", "/subjects", {}, {}, b"", "127.0.0.1", dn)
        return asyncio.run(auth.caller(request)).principal

    assert caller("CN=carol,O=loglake") == "User:carol"
    with pytest.raises(Unauthenticated):
        caller(None)
    with pytest.raises(Unauthenticated):
        caller("O=no-common-name")
