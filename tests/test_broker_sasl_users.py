"""Managing SASL users: `loglake users` on a data directory with no broker and with one running
(through the broker's inbox), confluent-kafka's AdminClient describe/alter SCRAM credentials
round trip with Kafka's error codes, and credentials surviving a broker restart."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from loglake.kafka_errors import ErrorCode
from saslkit import USERS, RawClient, ScramClient, add_users, confluent_conf, users

from brokerkit import InProcessBroker, serving_in_process


def scram_login(port: int, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> int:
    """The error code of a SCRAM exchange as `user` (NONE when it authenticated)."""
    c = RawClient(port)
    try:
        assert c.handshake(mechanism)[0] == ErrorCode.NONE
        scram = ScramClient(mechanism, user, password)
        code, _, server_first = c.authenticate(scram.first())
        if code != ErrorCode.NONE:
            return code
        return c.authenticate(scram.final(server_first))[0]
    finally:
        c.close()


def listed(data_dir: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = json.loads(users("list", "--json", data_dir=data_dir).stdout)
    return out


def test_users_without_a_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert listed(data) == {}
    secret = "not!in#base64"  # so that finding it in the metadata cannot be chance
    users(
        "add",
        "carol",
        "--password-stdin",
        "-m",
        "SCRAM-SHA-256",
        "--iterations",
        "8192",
        data_dir=data,
        password=secret,
    )
    users("add", "carol", "--password-stdin", data_dir=data, password=secret)  # default SCRAM-SHA-512
    assert listed(data) == {"carol": {"SCRAM-SHA-256": 8192, "SCRAM-SHA-512": 4096}}
    users("delete", "carol", "--mechanism", "SCRAM-SHA-256", data_dir=data)
    assert listed(data) == {"carol": {"SCRAM-SHA-512": 4096}}
    missing = users("delete", "dave", data_dir=data, check=False)
    assert missing.returncode == 1 and "user 'dave' has no credentials" in missing.stderr
    bad = users(
        "add", "x", "--password-stdin", "--iterations", "100", data_dir=data, password="pw", check=False
    )
    assert bad.returncode == 2 and "--iterations" in bad.stderr
    empty = users("add", "x", "--password-stdin", data_dir=data, password="", check=False)
    assert empty.returncode == 1 and "the password is empty" in empty.stderr
    # The metadata holds no password, only the derived credential.
    meta = b"".join(p.read_bytes() for p in (data / "meta").rglob("*") if p.is_file())
    assert b"carol" in meta and secret.encode() not in meta


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data = tmp_path_factory.mktemp("users") / "data"
    add_users(data)
    with serving_in_process(data, [
        "--listen", "127.0.0.1:0", "--listen", "SASL_PLAINTEXT://127.0.0.1:0",
        "--allow-everyone-if-no-acl-found",  # SASL tests, not ACL tests (test_broker_sasl_acls.py)
    ]) as b:
        yield b


def test_users_while_the_broker_runs(broker: InProcessBroker) -> None:
    port = broker.ports[1]
    assert scram_login(port, "erin", "first") == ErrorCode.SASL_AUTHENTICATION_FAILED
    users(
        "add", "erin", "--password-stdin", "-m", "SCRAM-SHA-256", data_dir=broker.data_dir, password="first"
    )
    assert scram_login(port, "erin", "first") == ErrorCode.NONE
    users(
        "add", "erin", "--password-stdin", "-m", "SCRAM-SHA-256", data_dir=broker.data_dir, password="second"
    )
    assert scram_login(port, "erin", "first") == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert scram_login(port, "erin", "second") == ErrorCode.NONE
    assert listed(broker.data_dir)["erin"] == {"SCRAM-SHA-256": 4096}
    users("delete", "erin", data_dir=broker.data_dir)
    assert "erin" not in listed(broker.data_dir)
    assert scram_login(port, "erin", "second") == ErrorCode.SASL_AUTHENTICATION_FAILED
    refused = users("delete", "erin", data_dir=broker.data_dir, check=False)
    assert refused.returncode == 1 and "user 'erin' has no credentials" in refused.stderr


def test_admin_client_scram_credentials_round_trip(broker: InProcessBroker) -> None:
    admin = AdminClient(confluent_conf(broker.ports[1], "SASL_PLAINTEXT", "SCRAM-SHA-512"))
    sha256 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("frank", sha256, b"frank-pw", b"salt-of-frank")]
    )
    futures["frank"].result(timeout=15)
    assert scram_login(broker.ports[1], "frank", "frank-pw") == ErrorCode.NONE
    described = admin.describe_user_scram_credentials(["frank", "alice"])
    frank = described["frank"].result(timeout=15)
    assert [(i.mechanism, i.iterations) for i in frank.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_256, 8192)
    ]
    alice = described["alice"].result(timeout=15)
    assert sorted(i.mechanism for i in alice.scram_credential_infos) == [
        ScramMechanism.SCRAM_SHA_256,
        ScramMechanism.SCRAM_SHA_512,
    ]
    everyone = admin.describe_user_scram_credentials().result(timeout=15)
    assert {"alice", "bob", "frank"} <= set(everyone)
    with pytest.raises(KafkaException) as missing:
        admin.describe_user_scram_credentials(["nobody"])["nobody"].result(timeout=15)
    assert missing.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND
    too_few = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 1000)
    with pytest.raises(KafkaException) as weak:
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion("gina", too_few, b"pw")])[
            "gina"
        ].result(timeout=15)
    assert weak.value.args[0].code() == ErrorCode.UNACCEPTABLE_CREDENTIAL
    with pytest.raises(KafkaException) as absent:
        admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion("frank", ScramMechanism.SCRAM_SHA_512)]
        )["frank"].result(timeout=15)
    assert absent.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND
    twice = [
        UserScramCredentialUpsertion("hank", sha256, b"a"),
        UserScramCredentialDeletion("hank", ScramMechanism.SCRAM_SHA_256),
    ]
    with pytest.raises(KafkaException) as dup:
        admin.alter_user_scram_credentials(twice)["hank"].result(timeout=15)
    assert dup.value.args[0].code() == ErrorCode.DUPLICATE_RESOURCE
    admin.alter_user_scram_credentials([UserScramCredentialDeletion("frank", ScramMechanism.SCRAM_SHA_256)])[
        "frank"
    ].result(timeout=15)
    assert scram_login(broker.ports[1], "frank", "frank-pw") == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_credentials_survive_a_restart(broker: InProcessBroker) -> None:
    admin = AdminClient(confluent_conf(broker.ports[1], "SASL_PLAINTEXT", "PLAIN"))
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    admin.alter_user_scram_credentials([UserScramCredentialUpsertion("ivan", info, b"ivan-pw")])[
        "ivan"
    ].result(timeout=15)
    broker.restart()
    assert scram_login(broker.ports[1], "ivan", "ivan-pw", "SCRAM-SHA-512") == ErrorCode.NONE
    assert scram_login(broker.ports[1], "alice", USERS["alice"][0]) == ErrorCode.NONE
    # PLAIN checks the same credential.
    c = RawClient(broker.ports[1])
    try:
        c.handshake("PLAIN")
        assert c.authenticate(b"\0ivan\0ivan-pw")[0] == ErrorCode.NONE
    finally:
        c.close()


def test_users_through_bootstrap_server(broker: InProcessBroker) -> None:
    """The same command over the Kafka protocol (Describe/AlterUserScramCredentials)."""
    remote = ("--bootstrap-server", broker.bootstrap)  # the PLAINTEXT listener
    users(
        "add",
        "judy",
        "--password-stdin",
        "-m",
        "SCRAM-SHA-256",
        "--iterations",
        "4096",
        *remote,
        data_dir=broker.data_dir,
        password="judy-pw",
    )
    assert scram_login(broker.ports[1], "judy", "judy-pw") == ErrorCode.NONE
    shown = json.loads(users("list", "--json", *remote, data_dir=broker.data_dir).stdout)
    assert shown["judy"] == {"SCRAM-SHA-256": 4096} and "alice" in shown
    users("delete", "judy", *remote, data_dir=broker.data_dir)
    assert "judy" not in json.loads(users("list", "--json", *remote, data_dir=broker.data_dir).stdout)
    refused = users("delete", "judy", "-m", "SCRAM-SHA-512", *remote, data_dir=broker.data_dir, check=False)
    assert refused.returncode == 1 and "user judy" in refused.stderr, refused.stderr


def test_inbox_answers_a_bad_request_with_an_error(broker: InProcessBroker) -> None:
    inbox = broker.data_dir / "users-inbox"
    (inbox / "1-garbage.request.json").write_text("{not json")
    (inbox / "2-unknown.request.json").write_text('{"op": "drop-table"}')
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not (inbox / "2-unknown.result.json").exists():
        time.sleep(0.1)
    assert json.loads((inbox / "1-garbage.result.json").read_text())["ok"] is False
    assert json.loads((inbox / "2-unknown.result.json").read_text()) == {
        "ok": False,
        "error": "unknown operation 'drop-table'",
    }
    assert not (inbox / "1-garbage.request.json").exists() and not (inbox / "2-unknown.request.json").exists()
    assert scram_login(broker.ports[1], "alice", USERS["alice"][0]) == ErrorCode.NONE  # the broker goes on
