"""Logins under hostile load (issue 31, item 3), against a real broker and in-process:

* an unknown user's SCRAM server-first message carries the iteration count and salt length real
  users have (here 8192, `loglake users add --iterations 8192`), the same salt on every ask;
* PLAIN derives for an unknown user exactly as for a real one (counted, not timed);
* failed logins are throttled per source address and per principal: past the limit a login is
  refused without its password being checked (a correct one included), while the same user
  from another address still logs in; one log line; /metrics counts it; the tables stay bounded.
"""

from __future__ import annotations

import base64
import itertools
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import loglake.scram
from loglake.broker.security import login_throttle
from loglake.broker.security.login_throttle import LoginThrottle, ThrottleScope, source_key
from loglake.broker.security.scram_store import ScramStore
from loglake.engine import Engine
from loglake.kafka_errors import ErrorCode
from loglake.meta.scram import credential_body
from loglake.scram import CredentialShape, make_credential
from saslkit import RawClient, ScramClient, users

from brokerkit import InProcessBroker, free_port, serving_in_process
from enginekit import small_config

ITERATIONS = 8192
PASSWORDS = {"carol": "carol-secret", "dave": "dave-secret"}
#: The throttle of the test broker: few failures per source, many per principal.
PER_SOURCE, PER_PRINCIPAL = 5, 1000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """A SASL_PLAINTEXT listener; carol (SCRAM-SHA-256 and -512) and dave (SCRAM-SHA-512), both
    made with 8192 iterations, as the threat model recommends."""
    data = tmp_path_factory.mktemp("hardening") / "data"
    users("add", "carol", "--password-stdin", "-m", "SCRAM-SHA-256", "-m", "SCRAM-SHA-512",
          "--iterations", str(ITERATIONS), data_dir=data, password=PASSWORDS["carol"])
    users("add", "dave", "--password-stdin", "--iterations", str(ITERATIONS), data_dir=data, password=PASSWORDS["dave"])
    metrics = free_port()
    env = {
        "LOGLAKE_SASL_LOGIN_FAILURES_PER_SOURCE": str(PER_SOURCE),
        "LOGLAKE_SASL_LOGIN_FAILURES_PER_PRINCIPAL": str(PER_PRINCIPAL),
    }
    args = ["--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--allow-everyone-if-no-acl-found",
            "--metrics-listen", f"127.0.0.1:{metrics}"]
    with serving_in_process(data, args, env=env) as b:
        b.metrics_port = metrics  # type: ignore[attr-defined]
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


def scram(port: int, user: str, password: str, source: str = "127.0.0.1", mechanism: str = "SCRAM-SHA-512") -> int:
    c = RawClient(port, source=source)
    try:
        assert c.handshake(mechanism)[0] == ErrorCode.NONE
        client = ScramClient(mechanism, user, password)
        code, _, first = c.authenticate(client.first())
        return code if code != ErrorCode.NONE else c.authenticate(client.final(first))[0]
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


# ---- throttling --------------------------------------------------------------------------------


def test_past_the_limit_an_address_is_refused_unchecked_and_others_are_not(
    broker: InProcessBroker, derivations: list[tuple[str, int, int]]
) -> None:
    port, attacker = broker.ports[0], "127.0.0.2"
    for i in range(PER_SOURCE):
        assert plain(port, "carol", f"guess-{i}", attacker) == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert len(derivations) == PER_SOURCE
    # The next ones are refused before the password is looked at: the right one too, by SCRAM too.
    assert plain(port, "carol", PASSWORDS["carol"], attacker) == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert plain(port, "nobody", "x", attacker) == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert scram(port, "carol", PASSWORDS["carol"], attacker) == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert len(derivations) == PER_SOURCE
    # carol from another address is not affected, by PLAIN or SCRAM.
    assert plain(port, "carol", PASSWORDS["carol"]) == ErrorCode.NONE
    assert scram(port, "carol", PASSWORDS["carol"]) == ErrorCode.NONE
    refused = [line for line in broker.log_text().splitlines() if "refused without checking the password" in line]
    assert len(refused) == 1, refused  # one line a window, however many are refused
    assert f"{PER_SOURCE} failed logins from {attacker} within 60 s (login throttle, per source)" in refused[0]
    text = urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10).read().decode()  # type: ignore[attr-defined]
    assert 'loglake_sasl_login_throttled_total{scope="source"} 3.0' in text
    assert 'loglake_sasl_login_throttled_total{scope="principal"} 0.0' in text
    assert 'loglake_sasl_login_throttle_entries{table="source"}' in text


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def attempt(t: LoginThrottle, principal: str, host: str, ok: bool = False) -> bool:
    """One login as the SASL session makes it: admitted (or refused), then failed or succeeded;
    whether it was admitted."""
    if t.admit(principal, host) is not None:
        return False
    if ok:
        t.succeeded(principal, host)
    else:
        t.failed(principal, host, admitted=True)
    return True


def test_buckets_leak_and_a_principal_is_limited_over_all_addresses() -> None:
    clock = Clock()
    t = LoginThrottle(per_source=3, per_principal=1000, window_s=60.0, clock=clock)
    assert [attempt(t, "User:a", "10.0.0.1") for _ in range(4)] == [True, True, True, False]
    refusal = t.admit("User:a", "10.0.0.1")
    assert refusal is not None and refusal.scope is ThrottleScope.SOURCE
    assert t.admit("User:other", "10.0.0.1") is not None  # per address: any name
    assert attempt(t, "User:a", "10.0.0.2")
    clock.now += 20.0  # a third of the window: one failure leaked away
    assert [attempt(t, "User:a", "10.0.0.1") for _ in range(2)] == [True, False]
    assert t.refused == {ThrottleScope.SOURCE: 4, ThrottleScope.PRINCIPAL: 0}
    # one principal from many addresses, each far below its own limit
    t = LoginThrottle(per_source=1000, per_principal=3, window_s=60.0, clock=clock)
    assert all(attempt(t, "User:a", f"10.0.1.{i}") for i in range(3))
    refusal = t.admit("User:a", "10.0.0.9")
    assert refusal is not None and refusal.scope is ThrottleScope.PRINCIPAL
    assert str(refusal) == (
        "refused without checking the password: 3 failed logins as this principal within 60 s (login throttle, per principal)"
    )
    assert attempt(t, "User:b", "10.0.0.9")
    clock.now += 20.0
    assert attempt(t, "User:a", "10.0.0.9")


def test_logins_in_flight_count_at_once_and_a_success_is_refunded() -> None:
    """Parallel connections cannot overshoot the limit: a login is charged when it is admitted."""
    clock = Clock()
    t = LoginThrottle(per_source=3, per_principal=1000, window_s=60.0, clock=clock)
    admitted = [t.admit("User:a", "10.0.0.1") is None for _ in range(8)]  # 8 connections, none answered yet
    assert admitted == [True] * 3 + [False] * 5
    for _ in range(3):
        t.succeeded("User:a", "10.0.0.1")  # all three were right: refunded
    assert [attempt(t, "User:b", "10.0.0.1") for _ in range(4)] == [True, True, True, False]
    t = LoginThrottle(per_source=3, per_principal=1000, window_s=60.0, clock=clock)
    assert all(attempt(t, "User:svc", "10.0.0.1", ok=True) for _ in range(50))  # a busy client that logs in fine
    assert attempt(t, "User:x", "10.0.0.1")
    # failures before a principal was admitted (a malformed message) are charged when they happen
    t.failed(None, "10.0.0.1", admitted=False)
    t.failed("User:y", "10.0.0.1", admitted=False)
    assert t.admit("User:x", "10.0.0.1") is not None


def test_an_address_a_principal_logged_in_from_stays_open_to_it_until_it_fails() -> None:
    clock = Clock()
    t = LoginThrottle(per_source=2, per_principal=2, window_s=60.0, clock=clock)
    assert attempt(t, "User:svc", "10.0.0.5", ok=True)
    for name in ("User:x", "User:y"):  # a neighbour behind the same address guesses other names
        assert attempt(t, name, "10.0.0.5")
    for stranger in ("10.0.0.7", "10.0.0.8"):  # strangers guess svc's password
        assert attempt(t, "User:svc", stranger)
    assert not attempt(t, "User:x", "10.0.0.5")
    assert not attempt(t, "User:svc", "10.0.0.6")
    assert attempt(t, "User:svc", "10.0.0.5", ok=True)  # logged in from there before: let through
    assert attempt(t, "User:svc", "10.0.0.5")  # ...and a failure there ends the trust
    assert not attempt(t, "User:svc", "10.0.0.5")
    # trust also ends with time
    t = LoginThrottle(per_source=2, per_principal=1000, window_s=3600.0, clock=clock)
    assert attempt(t, "User:old", "10.0.0.1", ok=True)
    clock.now += login_throttle.TRUSTED_FOR_S
    assert attempt(t, "User:z", "10.0.0.1") and attempt(t, "User:z", "10.0.0.1")
    assert not attempt(t, "User:old", "10.0.0.1")


def test_the_tables_stay_bounded_and_keep_who_is_busy() -> None:
    clock = Clock()
    t = LoginThrottle(per_source=2, per_principal=2, window_s=60.0, clock=clock)
    assert attempt(t, "User:target", "192.0.2.1") and attempt(t, "User:target", "192.0.2.1")
    for i in range(login_throttle.SOURCES_MAX + 500):
        address = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        assert attempt(t, f"User:ok{i}", address, ok=True)
        assert attempt(t, f"User:scan{i}", address)
        if i % 1000 == 0:  # under attack all along, refused unchecked: never the oldest
            assert t.admit("User:target", "192.0.2.1") is not None
    assert t.sizes() == {"source": login_throttle.SOURCES_MAX, "principal": login_throttle.PRINCIPALS_MAX,
                         "trusted": login_throttle.TRUSTED_MAX}
    refusal = t.admit("User:target", "192.0.2.1")
    assert refusal is not None and refusal.scope is ThrottleScope.SOURCE
    refusal = t.admit("User:target", "192.0.2.99")
    assert refusal is not None and refusal.scope is ThrottleScope.PRINCIPAL  # its bucket is still there


def test_ipv6_sources_count_by_their_64() -> None:
    assert source_key("2001:db8:1:2::1") == source_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert source_key("2001:db8:1:3::1") != source_key("2001:db8:1:2::1")
    assert source_key("fe80::1%eth0") == "fe80::/64"
    assert source_key("::ffff:10.0.0.1") == source_key("10.0.0.1") == "10.0.0.1"
    assert source_key("not-an-address") == "not-an-address"
    t = LoginThrottle(per_source=2, per_principal=0, window_s=60.0, clock=Clock())
    assert attempt(t, "User:a", "2001:db8::1") and attempt(t, "User:b", "2001:db8::2")
    assert not attempt(t, "User:c", "2001:db8::3")
    assert attempt(t, "User:c", "2001:db8:0:1::3")


def test_a_limit_of_zero_turns_the_scope_off() -> None:
    t = LoginThrottle(per_source=0, per_principal=0, window_s=1.0)
    assert all(attempt(t, "User:a", "10.0.0.1") for _ in range(100))
    assert t.sizes() == {"source": 0, "principal": 0, "trusted": 0}


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
