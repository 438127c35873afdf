"""Unknown users under hostile load (issue 31, item 3), against a real broker and in-process:

* an unknown user's SCRAM server-first message carries the iteration count and salt length real
  users have (here 8192, `loglake users add --iterations 8192`), the same salt on every ask;
* PLAIN derives for an unknown user exactly as for a real one (counted, not timed).
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import loglake.scram
from loglake.broker.security.scram_store import ScramStore
from loglake.engine import Engine
from loglake.kafka_errors import ErrorCode
from loglake.meta.scram import credential_body
from loglake.scram import CredentialShape, make_credential
from saslkit import RawClient, ScramClient, users

from brokerkit import InProcessBroker, serving_in_process
from enginekit import small_config

ITERATIONS = 8192
PASSWORDS = {"carol": "carol-secret", "dave": "dave-secret"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """A SASL_PLAINTEXT listener; carol (SCRAM-SHA-256 and -512) and dave (SCRAM-SHA-512), both
    made with 8192 iterations, as the threat model recommends."""
    data = tmp_path_factory.mktemp("hardening") / "data"
    users("add", "carol", "--password-stdin", "-m", "SCRAM-SHA-256", "-m", "SCRAM-SHA-512",
          "--iterations", str(ITERATIONS), data_dir=data, password=PASSWORDS["carol"])
    users("add", "dave", "--password-stdin", "--iterations", str(ITERATIONS), data_dir=data, password=PASSWORDS["dave"])
    args = ["--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--allow-everyone-if-no-acl-found"]
    with serving_in_process(data, args) as b:
        yield b


_probes = itertools.count(1)


def server_first(port: int, mechanism: str, user: str) -> dict[str, str]:
    """The attributes of the server-first message the broker answers `user`'s client-first with
    (asked from an address of its own: an exchange left unfinished counts as a failed login)."""
    c = RawClient(port, source=f"127.0.1.{next(_probes)}")
    try:
        assert c.handshake(mechanism)[0] == ErrorCode.NONE
        code, _, answer = c.authenticate(ScramClient(mechanism, user, "irrelevant").first())
        assert code == ErrorCode.NONE
        return dict(part.split("=", 1) for part in answer.decode().split(","))
    finally:
        c.close()


def plain(port: int, user: str, password: str, source: str = "127.0.0.1") -> int:
    c = RawClient(port, source=source)
    try:
        assert c.handshake("PLAIN")[0] == ErrorCode.NONE
        return c.authenticate(b"\0" + user.encode() + b"\0" + password.encode())[0]
    finally:
        c.close()


@pytest.fixture
def derivations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """(mechanism, iterations, salt bytes) of every PBKDF2 derivation the broker does meanwhile
    (the test's own clients import the function by name and are not counted)."""
    seen: list[tuple[str, int, int]] = []
    real: Callable[[str, bytes, bytes, int], bytes] = loglake.scram.salted_password

    def counted(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
        seen.append((mechanism, iterations, len(salt)))
        return real(mechanism, password, salt, iterations)

    monkeypatch.setattr(loglake.scram, "salted_password", counted)
    return seen


# ---- enumeration -------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_an_unknown_users_server_first_looks_like_a_real_users(broker: InProcessBroker, mechanism: str) -> None:
    port = broker.ports[0]
    real = server_first(port, mechanism, "carol")
    ghost = server_first(port, mechanism, "nobody")
    assert real["i"] == ghost["i"] == str(ITERATIONS)
    assert len(base64.b64decode(ghost["s"])) == len(base64.b64decode(real["s"]))
    assert server_first(port, mechanism, "nobody")["s"] == ghost["s"]  # a second ask: the same salt
    assert server_first(port, mechanism, "nobody2")["s"] != ghost["s"]
    assert server_first(port, mechanism, "carol")["s"] == real["s"]


def test_plain_derives_for_an_unknown_user_as_for_a_real_one(
    broker: InProcessBroker, derivations: list[tuple[str, int, int]]
) -> None:
    source = "127.0.0.3"  # its own address: these failures do not count against the other tests'
    assert plain(broker.ports[0], "carol", "wrong", source) == ErrorCode.SASL_AUTHENTICATION_FAILED
    real = list(derivations)
    derivations.clear()
    assert plain(broker.ports[0], "nobody", "wrong", source) == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert real == [("SCRAM-SHA-512", ITERATIONS, 32)]
    assert derivations == real


# ---- the shapes of fake credentials ------------------------------------------------------------


def test_fake_credentials_take_the_shape_most_users_have(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "d"), small_config())
    engine.open()
    try:
        store = ScramStore.of(engine)
        assert store.shapes().shape("SCRAM-SHA-512") == CredentialShape()  # no users: what `users add` makes
        assert store.shapes().plain == ("SCRAM-SHA-512", CredentialShape())
        for name, iterations in (("a", 8192), ("b", 8192), ("c", 4096)):
            store.save(name, "SCRAM-SHA-256", credential_body(make_credential("SCRAM-SHA-256", "pw", iterations)))
        store.save("k", "SCRAM-SHA-256", credential_body(make_credential("SCRAM-SHA-256", "pw", 4096, salt=b"x" * 20)))
        shapes = store.shapes()
        assert shapes.shape("SCRAM-SHA-256") == CredentialShape(8192, 32)  # the most common, not the default
        assert shapes.plain == ("SCRAM-SHA-256", CredentialShape(8192, 32))  # nobody has SHA-512
        assert store.shapes() is shapes  # computed once per change, not per login
        for name in ("c", "k"):
            store.save(name, "SCRAM-SHA-256", credential_body(make_credential("SCRAM-SHA-256", "pw", 16384, salt=b"y" * 24)))
        store.save("d", "SCRAM-SHA-256", credential_body(make_credential("SCRAM-SHA-256", "pw", 16384, salt=b"z" * 24)))
        assert store.shapes().shape("SCRAM-SHA-256") == CredentialShape(16384, 24)  # a record changed it
    finally:
        engine.close()


def test_a_fake_salt_has_the_length_asked_for_and_is_stable() -> None:
    for length in (16, 32, 64, 100):
        shape = CredentialShape(12288, length)
        a = loglake.scram.fake_credential(b"k" * 32, "SCRAM-SHA-256", "ghost", shape)
        assert (a.iterations, len(a.salt)) == (12288, length)
        assert a == loglake.scram.fake_credential(b"k" * 32, "SCRAM-SHA-256", "ghost", shape)
    # the default shape's salt is what fake credentials had before shapes (one HMAC block, cut)
    long = loglake.scram.fake_credential(b"k" * 32, "SCRAM-SHA-512", "ghost", CredentialShape(4096, 100))
    assert loglake.scram.fake_credential(b"k" * 32, "SCRAM-SHA-512", "ghost").salt == long.salt[:32]
