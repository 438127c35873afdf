"""SCRAM math and the server's side of the exchange against RFC 5802's and RFC 7677's test
vectors; the exchange's refusals; PLAIN against a SCRAM credential; fake credentials of unknown
users; SCRAM credentials in the metadata state and its checkpoints."""

from __future__ import annotations

import base64

import pytest

import loglake.meta.scram as meta_scram
from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.state import MetaState
from loglake.scram import (
    MECHANISMS,
    ScramClient,
    ScramError,
    ScramServer,
    fake_credential,
    make_credential,
    verify_password,
)

# RFC 7677 section 3: SCRAM-SHA-256, user "user", password "pencil".
RFC7677 = {
    "client_first": "n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
    "server_nonce": "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
    "salt": "W22ZaJ0SNY7soEsUEjb6gQ==",
    "server_first": "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
    "client_final": "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
    "server_final": "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
}
# RFC 5802 section 5: SCRAM-SHA-1 (not offered by loglake; the same code with SHA-1 plugged in).
RFC5802 = {
    "client_first": "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
    "server_nonce": "3rfcNHYJY1ZVvWVs7j",
    "salt": "QSXCR+Q6sek8bf92",
    "server_first": "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
    "client_final": "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
    "server_final": "v=rmF9pqV8S7suAoZWja4dJRkFsKQ=",
}


def _exchange(mechanism: str, v: dict[str, str]) -> ScramServer:
    server = ScramServer(mechanism, server_nonce=v["server_nonce"])
    assert server.first(v["client_first"].encode()) == "user"
    cred = make_credential(mechanism, "pencil", 4096, salt=base64.b64decode(v["salt"]))
    assert server.server_first(cred).decode() == v["server_first"]
    return server


def test_rfc7677_sha256_vector() -> None:
    server = _exchange("SCRAM-SHA-256", RFC7677)
    assert server.final(RFC7677["client_final"].encode()).decode() == RFC7677["server_final"]


def test_rfc7677_sha256_vector_client_side() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", client_nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first().decode() == RFC7677["client_first"]
    assert client.final(RFC7677["server_first"].encode()).decode() == RFC7677["client_final"]
    client.verify(RFC7677["server_final"].encode())  # raises when the signature differs
    with pytest.raises(ScramError, match="signature"):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))


def test_rfc5802_sha1_vector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MECHANISMS, "SCRAM-SHA-1", "sha1")
    server = _exchange("SCRAM-SHA-1", RFC5802)
    assert server.final(RFC5802["client_final"].encode()).decode() == RFC5802["server_final"]


@pytest.mark.parametrize(
    ("final", "why"),
    [
        (RFC7677["client_final"].replace("p=dHzb", "p=dHzc"), "wrong password"),
        (RFC7677["client_final"].replace("k0,p=", "k1,p="), "not the nonce of this exchange"),
        (RFC7677["client_final"].replace("c=biws", "c=eSws"), "does not echo the gs2 header"),
        (RFC7677["client_final"] + ",x=1", "extension"),
        (RFC7677["client_final"].replace("p=dHzb", "p=!!"), "not base64"),
        ("c=biws,r=x", "missing attribute"),
    ],
)
def test_client_final_refused(final: str, why: str) -> None:
    server = _exchange("SCRAM-SHA-256", RFC7677)
    with pytest.raises(ScramError, match=why):
        server.final(final.encode())


@pytest.mark.parametrize(
    ("first", "why"),
    [
        ("n,a=admin,n=user,r=abc", "no authorization id"),
        ("p=tls-server-end-point,,n=user,r=abc", "channel binding"),
        ("n,,m=ext,n=user,r=abc", "mandatory extension"),
        ("n,,n=user,r=abc,ext=1", "extension"),
        ("n,,n=us=41er,r=abc", "invalid '=' escape"),
        ("n,,n=,r=abc", "empty or over-long user name"),
        ("n,,n=user,r=", "nonce is empty"),
        ("n,,n=user,r=" + "a" * 2000, "nonce is empty, too long"),
        ("x", "gs2 header"),
    ],
)
def test_client_first_refused(first: str, why: str) -> None:
    with pytest.raises(ScramError, match=why):
        ScramServer("SCRAM-SHA-512").first(first.encode())


def test_saslname_escapes_and_final_before_first() -> None:
    assert ScramServer("SCRAM-SHA-512").first(b"y,,n=a=2Cb=3Dc,r=xyz") == "a,b=c"
    with pytest.raises(ScramError, match="before client-first"):
        ScramServer("SCRAM-SHA-512").final(b"c=biws,r=x,p=AA==")


def test_plain_against_scram_credential_and_fake_credentials() -> None:
    cred = make_credential("SCRAM-SHA-512", "s3cret", 4096)
    assert verify_password(cred, b"s3cret") and not verify_password(cred, b"s3cret ")
    with pytest.raises(ValueError, match="iterations"):
        make_credential("SCRAM-SHA-512", "x", 100)
    a = fake_credential(b"k" * 32, "SCRAM-SHA-512", "ghost")
    assert a == fake_credential(b"k" * 32, "SCRAM-SHA-512", "ghost")  # stable: a retry sees the same salt
    assert a.salt != fake_credential(b"k" * 32, "SCRAM-SHA-512", "ghost2").salt
    assert a.salt != fake_credential(b"j" * 32, "SCRAM-SHA-512", "ghost").salt
    assert a.iterations == cred.iterations and len(a.salt) == len(cred.salt)
    assert not verify_password(a, b"")


def _record(user: str, mechanism: str, password: str | None) -> dict[str, object]:
    cred = None if password is None else meta_scram.credential_body(make_credential(mechanism, password))
    return {"user": user, "mechanism": mechanism, "cred": cred}


def test_metadata_records_and_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    state = MetaState("c")
    state.apply("scram_credential", _record("alice", "SCRAM-SHA-256", "a"))
    state.apply("scram_credential", _record("alice", "SCRAM-SHA-512", "a"))
    state.apply("scram_credential", _record("bob", "SCRAM-SHA-512", "b"))
    state.apply("scram_credential", _record("bob", "SCRAM-SHA-512", None))
    assert sorted(state.scram) == ["alice"] and sorted(state.scram["alice"]) == [
        "SCRAM-SHA-256",
        "SCRAM-SHA-512",
    ]
    loaded = decode_checkpoint(b"".join(encode_checkpoint(capture(state))), path="ck")
    assert loaded.scram == state.scram
    cred = meta_scram.to_credential("SCRAM-SHA-512", loaded.scram["alice"]["SCRAM-SHA-512"])
    assert verify_password(cred, b"a")
    with pytest.raises(ValueError, match="unknown mechanism"):
        state.apply("scram_credential", _record("carol", "SCRAM-SHA-512", "c") | {"mechanism": "MD5"})
    monkeypatch.setattr(meta_scram, "SCRAM_USERS_MAX", 1)
    with pytest.raises(ValueError, match="SCRAM_USERS_MAX"):
        state.apply("scram_credential", _record("carol", "SCRAM-SHA-512", "c"))
    state.apply("scram_credential", _record("alice", "SCRAM-SHA-512", "new"))  # replacing is no new user


def test_failure_labels_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import loglake.broker.security.sasl as sasl

    monkeypatch.setattr(sasl, "SASL_FAILURE_LABELS_MAX", 3)
    stats = sasl.SaslStats()
    for i in range(10):
        stats.failed(f"User:scan{i}", "10.0.0.9")
    stats.failed("User:scan0", "10.0.0.9")  # a pair already counted keeps its own label
    assert stats.failures == {
        ("User:scan0", "10.0.0.9"): 2,
        ("User:scan1", "10.0.0.9"): 1,
        ("User:scan2", "10.0.0.9"): 1,
        (sasl.OVERFLOW_LABEL, sasl.OVERFLOW_LABEL): 7,
    }
