"""SASL/OAUTHBEARER against the real broker with confluent-kafka (librdkafka): a JWKS-checked
broker takes a token signed by the identity provider's key for the right issuer and audience,
and refuses an expired one, one for another audience and one signed by another key; an
unsecured-validator broker (the explicit opt-in) takes librdkafka's own unsigned token. The
token's exp bounds the session lifetime (KIP-368). OAUTHBEARER without a validator does not start."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from confluent_kafka import Producer
from cryptography.hazmat.primitives.asymmetric import rsa

from loglake.broker.config import BrokerConfig
from loglake.broker.security.oauthbearer import JwksValidator, TokenRefused, UnsecuredValidator, client_token
from loglake.errors import ConfigError
from saslkit import SASL_ERRORS_EVERY_LINE, RawClient

from brokerkit import InProcessBroker, serving_in_process

ISSUER, AUDIENCE = "https://idp.example", "loglake"
KID = "k1"


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


IDP_KEY, OTHER_KEY = rsa_key(), rsa_key()


def token(key: rsa.RSAPrivateKey = IDP_KEY, *, sub: str = "svc-a", aud: str = AUDIENCE, exp_in: float = 300) -> str:
    now = time.time()
    claims = {"sub": sub, "iss": ISSUER, "aud": aud, "iat": int(now), "exp": int(now + exp_in),
              "scope": ["kafka.read", "kafka.write"]}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": KID})


def jwks_document(key: rsa.RSAPrivateKey = IDP_KEY, kid: str = KID) -> bytes:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return json.dumps({"keys": [{**jwk, "kid": kid, "use": "sig", "alg": "RS256"}]}).encode()


class _Jwks(http.server.BaseHTTPRequestHandler):
    """The identity provider's JWKS endpoint; counts its fetches."""

    fetches = 0

    def do_GET(self) -> None:
        type(self).fetches += 1
        body = jwks_document()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def idp() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Jwks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    server.shutdown()
    thread.join(10)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, idp: str) -> Iterator[InProcessBroker]:
    root = tmp_path_factory.mktemp("oauth")
    env = {
        **SASL_ERRORS_EVERY_LINE,
        "LOGLAKE_SASL_ENABLED_MECHANISMS": "OAUTHBEARER,SCRAM-SHA-256",
        "LOGLAKE_SASL_OAUTHBEARER_VALIDATOR": "jwks",
        "LOGLAKE_SASL_OAUTHBEARER_JWKS_ENDPOINT_URL": idp,
        "LOGLAKE_SASL_OAUTHBEARER_EXPECTED_ISSUER": ISSUER,
        "LOGLAKE_SASL_OAUTHBEARER_EXPECTED_AUDIENCE": AUDIENCE,
    }
    args = ["--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--allow-everyone-if-no-acl-found"]
    with serving_in_process(root / "data", args, env=env, log_level="DEBUG") as b:
        yield b


def oauth_conf(port: int, make: Callable[[], str]) -> dict[str, Any]:
    def refresh(_config: str) -> tuple[str, float, str, dict[str, str]]:
        t = make()
        claims = jwt.decode(t, options={"verify_signature": False})
        # librdkafka will not send a token it knows to be expired: tell it a later expiry, so the
        # broker is the one that finds it out
        return t, max(float(claims["exp"]), time.time() + 60), str(claims["sub"]), {}

    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "oauth_cb": refresh, "log_level": 0}


def produced(conf: dict[str, Any], n: int = 5) -> bool:
    """Whether `n` records are acknowledged (no: authentication refused, they time out)."""
    acked: list[bool] = []
    p = Producer({**conf, "message.timeout.ms": 8000})
    for i in range(n):
        p.produce(f"oauth-{uuid.uuid4().hex[:6]}", b"%d" % i, on_delivery=lambda err, _m: acked.append(err is None))
    p.flush(20)
    return len(acked) == n and all(acked)


def test_a_signed_token_for_this_audience_authenticates(broker: InProcessBroker) -> None:
    assert produced(oauth_conf(broker.port, token))
    assert produced(oauth_conf(broker.port, lambda: token(sub="svc-b")))
    log = broker.log_text()
    assert "authenticated as User:svc-a with OAUTHBEARER" in log and "as User:svc-b" in log
    assert "token of User:svc-a has scopes [kafka.read kafka.write]" in log
    assert _Jwks.fetches == 1  # fetched once, then cached


def test_a_file_jwks_is_read_again_when_it_changes(tmp_path: Path) -> None:
    jwks = tmp_path / "jwks.json"
    jwks.write_bytes(jwks_document(OTHER_KEY, "k0"))
    settings = BrokerConfig(sasl_oauthbearer_validator="jwks", sasl_oauthbearer_jwks_endpoint_url=jwks.as_uri(),
                            sasl_oauthbearer_expected_audience=AUDIENCE)
    v = JwksValidator(settings)
    with pytest.raises(TokenRefused, match="no key with kid 'k1'"):
        v.validate(token())
    jwks.write_bytes(jwks_document())
    os.utime(jwks, (time.time() + 5, time.time() + 5))  # a new mtime even within the clock's resolution
    assert v.validate(token()).principal == "svc-a"


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: token(exp_in=-120), "ExpiredSignatureError"),
        (lambda: token(aud="someone-else"), "InvalidAudienceError"),
        (lambda: token(OTHER_KEY), "InvalidSignatureError"),
    ],
    ids=["expired", "wrong-audience", "wrongly-signed"],
)
def test_bad_tokens_are_refused(broker: InProcessBroker, make: Callable[[], str], why: str) -> None:
    assert not produced(oauth_conf(broker.port, make), n=1)
    assert why in broker.log_text()


def test_the_token_lifetime_bounds_the_session(broker: InProcessBroker) -> None:
    c = RawClient(broker.port)
    assert c.handshake("OAUTHBEARER")[0] == 0
    message = b"n,,\x01auth=Bearer " + token(exp_in=60).encode() + b"\x01\x01"
    assert c.authenticate(message, version=1)[0] == 0
    assert 50_000 < c.session_lifetime_ms <= 60_000
    c.close()


@pytest.fixture(scope="module")
def unsecured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    env = {"LOGLAKE_SASL_ENABLED_MECHANISMS": "OAUTHBEARER", "LOGLAKE_SASL_OAUTHBEARER_VALIDATOR": "unsecured"}
    args = ["--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--allow-everyone-if-no-acl-found"]
    with serving_in_process(tmp_path_factory.mktemp("unsecured") / "data", args, env=env, log_level="DEBUG") as b:
        yield b


def test_the_unsecured_validator_takes_librdkafkas_unsigned_token(unsecured: InProcessBroker) -> None:
    conf = {"bootstrap.servers": f"127.0.0.1:{unsecured.port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": "principal=alice lifeSeconds=600", "log_level": 0}
    assert produced(conf)
    assert "authenticated as User:alice with OAUTHBEARER" in unsecured.log_text()


def test_unsecured_semantics() -> None:
    def unsigned(claims: dict[str, object], alg: str = "none", sig: str = "") -> str:
        part = lambda d: jwt.utils.base64url_encode(json.dumps(d).encode()).decode()  # noqa: E731
        return f"{part({'alg': alg})}.{part(claims)}.{sig}"

    v = UnsecuredValidator("sub", 30, clock=lambda: 1000.0)
    assert v.validate(unsigned({"sub": "bob", "exp": 2000, "iat": 900})).principal == "bob"
    assert v.validate(unsigned({"sub": "bob", "exp": 980})).expires_at == 980  # within the skew
    for claims, alg, sig in (
        ({"sub": "bob", "exp": 900}, "none", ""),  # expired
        ({"sub": "bob"}, "none", ""),  # no exp
        ({"exp": 2000}, "none", ""),  # no principal
        ({"sub": "bob", "exp": 2000, "iat": 1100}, "none", ""),  # issued in the future
        ({"sub": "bob", "exp": 2000}, "RS256", "c2ln"),  # signed: not for this validator
    ):
        with pytest.raises(TokenRefused):
            v.validate(unsigned(claims, alg, sig))
    # the scope claim as Kafka's validators read it: a string is one scope, a list its strings
    assert v.validate(unsigned({"sub": "bob", "exp": 2000, "scope": "read"})).scopes == {"read"}
    assert v.validate(unsigned({"sub": "bob", "exp": 2000, "scope": ["a", "b"]})).scopes == {"a", "b"}
    assert v.validate(unsigned({"sub": "bob", "exp": 2000, "scope": 7})).scopes == frozenset()
    assert v.validate(unsigned({"sub": "bob", "exp": 2000})).scopes == frozenset()
    other = UnsecuredValidator("sub", 30, clock=lambda: 1000.0, scope_claim="scp")
    assert other.validate(unsigned({"sub": "bob", "exp": 2000, "scp": ["x"], "scope": "y"})).scopes == {"x"}
    for scope in (["a", ""], ["a", 3], [" "]):
        with pytest.raises(TokenRefused, match="empty or non-string scope"):
            v.validate(unsigned({"sub": "bob", "exp": 2000, "scope": scope}))
    assert client_token(b"n,,\x01auth=Bearer abc.def.\x01host=x\x01\x01") == "abc.def."
    for bad in (b"n,,\x01auth=Basic x\x01\x01", b"y,,\x01auth=Bearer t\x01\x01", b"n,,\x01auth=Bearer t\x01"):
        with pytest.raises(TokenRefused):
            client_token(bad)


def test_oauthbearer_needs_an_explicit_validator(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="OAUTHBEARER needs both"):
        BrokerConfig.load(env={"LOGLAKE_SASL_ENABLED_MECHANISMS": "OAUTHBEARER"})
    with pytest.raises(ConfigError, match="OAUTHBEARER needs both"):
        BrokerConfig.load(env={"LOGLAKE_SASL_OAUTHBEARER_VALIDATOR": "unsecured"})
    with pytest.raises(ConfigError, match="needs sasl_oauthbearer_jwks_endpoint_url"):
        BrokerConfig.load(env={"LOGLAKE_SASL_ENABLED_MECHANISMS": "OAUTHBEARER", "LOGLAKE_SASL_OAUTHBEARER_VALIDATOR": "jwks"})
    with pytest.raises(ConfigError, match="expected one of unsecured, jwks"):
        BrokerConfig.load(env={"LOGLAKE_SASL_ENABLED_MECHANISMS": "OAUTHBEARER", "LOGLAKE_SASL_OAUTHBEARER_VALIDATOR": "maybe"})
