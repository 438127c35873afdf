"""The remote commands say what the broker did (issue 34, item 7): a principal without an ACL is
told authorization was denied on the topic, for that principal, with a `hint:` on how ACLs are
granted (it used to read `unknown topic 'greetings'` for a topic that exists, and produce
`create topic greetings: Authorization failed.`); a plaintext command pointed at a TLS or SASL
listener is told it connected and got no plaintext answer, with a hint naming --command-config
(it used to wait 10 s and say `cannot reach a broker`).

One broker, as a real subprocess: SASL_PLAINTEXT, PLAINTEXT and SSL listeners on loopback, users
alice (super user) and bob; the real `loglake` command runs against it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from loglake.cli.remote import REMOTE_TIMEOUT_S
from saslkit import USERS, add_users
from tlskit import make_pki, ssl_args

from brokerkit import Broker, serving_broker

TOPIC = "greetings"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("cli-auth")
    pki = make_pki(root / "pki")
    add_users(root / "data")
    args = [
        "--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--listen", "PLAINTEXT://127.0.0.1:0", "--listen", "SSL://127.0.0.1:0",
        *ssl_args(pki), "--sasl-enabled-mechanisms", "SCRAM-SHA-256", "--super-users", "User:alice",
        "--no-allow-everyone-if-no-acl-found",
    ]
    with serving_broker(root / "data", args) as b:
        for user in USERS:
            (root / f"{user}.properties").write_text(
                "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                f"sasl.username={user}\nsasl.password={USERS[user][0]}\n"
            )
        b.root = root  # type: ignore[attr-defined]
        assert cli(["topics", "create", TOPIC], b, "alice").returncode == 0
        yield b


def address(b: Broker, listener: int) -> str:
    return f"127.0.0.1:{b.ports[listener]}"


def cli(args: Sequence[str], b: Broker, user: str | None, *, listener: int = 0, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`loglake ARGS --bootstrap-server` on listener `listener` (0 SASL, 1 PLAINTEXT, 2 SSL), as `user`."""
    config = ["--command-config", str(b.root / f"{user}.properties")] if user else []  # type: ignore[attr-defined]
    env = {k: v for k, v in os.environ.items() if k not in ("LOGLAKE_BOOTSTRAP_SERVER", "LOGLAKE_COMMAND_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "loglake.cli.main", *args, "--bootstrap-server", address(b, listener), *config],
        input=stdin, capture_output=True, text=True, timeout=120, env=env,
    )


def error_and_hint(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), result.stderr
    return lines[0], lines[1]


def alice_grants(b: Broker, operation: AclOperation) -> None:
    admin = AdminClient({
        "bootstrap.servers": address(b, 0), "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice", "sasl.password": USERS["alice"][0],
    })
    binding = AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:bob", "*", operation, AclPermissionType.ALLOW)
    for future in admin.create_acls([binding]).values():
        future.result(timeout=30)


@pytest.mark.parametrize(
    "args, stdin",
    [(["topics", "describe", TOPIC], None), (["consume", TOPIC], None), (["produce", TOPIC], "hello\n")],
    ids=["describe", "consume", "produce"],
)
def test_a_principal_without_an_acl_is_told_authorization_was_denied(broker: Broker, args: list[str], stdin: str | None) -> None:
    error, hint = error_and_hint(cli(args, broker, "bob", stdin=stdin))
    assert f"authorization denied on topic '{TOPIC}' for User:bob" in error, error
    assert "unknown topic" not in error and "create topic" not in error
    assert "User:bob" in hint and "--super-users" in hint and "create_acls" in hint, hint


def test_an_anonymous_client_is_named_as_such(broker: Broker) -> None:
    error, _hint = error_and_hint(cli(["consume", TOPIC], broker, None, listener=1))
    assert f"authorization denied on topic '{TOPIC}' for User:ANONYMOUS" in error, error


def test_a_topic_that_does_not_exist_is_still_unknown_to_a_super_user(broker: Broker) -> None:
    result = cli(["consume", "no-such-topic"], broker, "alice")
    assert result.returncode == 1 and result.stderr.strip() == "error: unknown topic 'no-such-topic'", result.stderr


def test_produce_without_write_is_told_so(broker: Broker) -> None:
    alice_grants(broker, AclOperation.DESCRIBE)  # bob sees the topic now, but may not write to it
    error, hint = error_and_hint(cli(["produce", TOPIC], broker, "bob", stdin="hello\n"))
    assert f"authorization denied on topic '{TOPIC}' for User:bob" in error and "write" in error, error
    assert "User:bob" in hint


@pytest.mark.parametrize("listener", [0, 2], ids=["sasl", "tls"])
def test_a_plaintext_command_on_a_tls_or_sasl_listener(broker: Broker, listener: int) -> None:
    started = time.monotonic()
    error, hint = error_and_hint(cli(["topics", "list"], broker, None, listener=listener))
    assert error == (
        f"error: connected to {address(broker, listener)} but it did not answer a plaintext Kafka request: "
        "is it a TLS or SASL listener?"
    )
    assert "--command-config" in hint
    assert time.monotonic() - started < REMOTE_TIMEOUT_S  # told at once, not after the timeout


def test_hints_do_not_leak_into_a_well_configured_command(broker: Broker) -> None:
    result = cli(["topics", "list"], broker, "alice")
    assert result.returncode == 0 and TOPIC in result.stdout and result.stderr == "", result.stderr
