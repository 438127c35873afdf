"""`--command-config FILE`: the CLI's `--bootstrap-server` commands over TLS and SASL listeners.

One broker with SASL_SSL (SCRAM), SASL_PLAINTEXT and an ACL regime (alice is a super user, bob
has no binding); every command runs as `python -m loglake.cli.main`, as a user would type it.
Both client paths are covered: librdkafka's (topics, produce, consume, users) and the CLI's own
requests (client quotas, `loglake.cli.remote_raw`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from loglake.cli.command_config import parse
from loglake.cli.common import CliError
from loglake.scram import ScramClient, ScramError, ScramServer, make_credential
from saslkit import USERS, add_users
from tlskit import Pki, make_pki, ssl_args

from brokerkit import Broker, serving_broker


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Broker]:
    """SASL_SSL then SASL_PLAINTEXT listeners; alice a super user, bob without bindings."""
    data = tmp_path_factory.mktemp("cmdconf") / "data"
    add_users(data)
    args = [
        "--listen",
        "SASL_SSL://127.0.0.1:0",
        "--listen",
        "SASL_PLAINTEXT://127.0.0.1:0",
        *ssl_args(pki),
        "--super-users",
        "User:alice",
    ]
    # A wrong password makes librdkafka retry in a burst (about ten logins per command) as alice
    # from the address every test here logs in from: no failed-login throttle here (that is
    # tests/test_sasl_login_hardening.py's subject).
    unthrottled = {"LOGLAKE_SASL_LOGIN_FAILURES_PER_SOURCE": "0", "LOGLAKE_SASL_LOGIN_FAILURES_PER_PRINCIPAL": "0"}
    with serving_broker(data, args, env=unthrottled) as b:
        yield b


def _props(path: Path, lines: Sequence[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _sasl_ssl(tmp_path: Path, pki: Pki, user: str = "alice", password: str | None = None) -> Path:
    """A client.properties as a Kafka user writes it (with a Java JAAS line for the login)."""
    password = USERS[user][0] if password is None else password
    return _props(
        tmp_path / f"{user}.properties",
        [
            "# SASL_SSL with SCRAM-SHA-512",
            "security.protocol=SASL_SSL",
            "sasl.mechanism: SCRAM-SHA-512",
            f"ssl.ca.location={pki.ca}",
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{user}" password="{password}";',
        ],
    )


def cli(
    args: Sequence[str], env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOGLAKE_")}
    return subprocess.run(
        [sys.executable, "-m", "loglake.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
        env={**clean, **(env or {})},
    )


def ok(args: Sequence[str], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = cli(args, **kw)  # type: ignore[arg-type]
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


def fails(args: Sequence[str], **kw: object) -> str:
    proc = cli(args, **kw)  # type: ignore[arg-type]
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2, proc.stderr  # one error line (and at most one hint), never a traceback
    assert "Traceback" not in proc.stderr
    return proc.stderr


# ---------------------------------------------------------------- the file


def test_properties_lines_comments_and_separators() -> None:
    text = "# comment\n! also a comment\n\nsecurity.protocol = SASL_SSL\nsasl.mechanism: PLAIN\nssl.ca.location=/a=b\n"
    assert parse(text, "f") == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "ssl.ca.location": "/a=b",
    }


def test_a_jaas_line_becomes_username_and_password() -> None:
    line = 'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="a b" password="p\\"w";'
    assert parse(line, "f") == {"sasl.username": "a b", "sasl.password": 'p"w'}


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("no separator here", "f:2: expected key=value"),
        ("bootstrap.servers=h:1", "f:2: bootstrap.servers is set by loglake itself"),
        (
            "ssl.truststore.location=/x.jks",
            "f:2: ssl.truststore.location is a Java client setting; use ssl.ca.location",
        ),
        ("sasl.jaas.config=PlainLoginModule required;", 'f:2: sasl.jaas.config needs username="…"'),
    ],
)
def test_a_bad_line_is_named(line: str, says: str) -> None:
    with pytest.raises(CliError) as err:
        parse("# first\n" + line, "f")
    assert says in str(err.value)


def test_scram_client_refuses_a_weak_iteration_count_and_a_forged_server() -> None:
    client = ScramClient("SCRAM-SHA-256", "alice", "pw")
    client.first()
    nonce = client.first().decode().split("r=", 1)[1]
    with pytest.raises(ScramError, match="iterations"):
        client.final(f"r={nonce}xyz,s=c2FsdA==,i=1".encode())
    client = ScramClient("SCRAM-SHA-256", "alice", "pw")
    server = ScramServer("SCRAM-SHA-256")
    server.first(client.first())
    # a server holding another credential for alice: its signature cannot match ours
    final = client.final(server.server_first(make_credential("SCRAM-SHA-256", "other")))
    with pytest.raises(ScramError, match="signature"):
        client.verify(b"v=" + final[-20:])


# ---------------------------------------------------------------- against the broker


def test_topics_produce_consume_over_sasl_ssl(broker: Broker, pki: Pki, tmp_path: Path) -> None:
    conf = str(_sasl_ssl(tmp_path, pki))
    b = ["--bootstrap-server", f"127.0.0.1:{broker.ports[0]}", "--command-config", conf]
    topic = f"cc-{uuid.uuid4().hex[:8]}"
    ok(["topics", "create", topic, "--partitions", "2", *b])
    assert topic in ok(["topics", "list", *b]).stdout.split()
    ok(["produce", topic, "--partition", "0", *b], stdin="one\ntwo\n")
    out = ok(["consume", topic, "--partition", "0", "--from", "earliest", "--max-records", "2", *b]).stdout
    assert out.splitlines() == ["one", "two"]


def test_the_environment_variable_names_the_file(broker: Broker, pki: Pki, tmp_path: Path) -> None:
    conf = str(_sasl_ssl(tmp_path, pki))
    out = ok(
        ["topics", "list", "--bootstrap-server", f"127.0.0.1:{broker.ports[0]}"],
        env={"LOGLAKE_COMMAND_CONFIG": conf},
    )
    assert out.returncode == 0


def test_a_wrong_password_is_one_line_naming_the_refusal(broker: Broker, pki: Pki, tmp_path: Path) -> None:
    conf = str(_sasl_ssl(tmp_path, pki, password="not-it"))
    b = ["--bootstrap-server", f"127.0.0.1:{broker.ports[0]}", "--command-config", conf]
    assert "refused the connection" in fails(["topics", "list", *b])
    assert "refused the connection" in fails(["configs", "describe", "--entity-type", "users", *b])


def test_quotas_over_sasl_ssl_scram_and_sasl_plaintext_plain(
    broker: Broker, pki: Pki, tmp_path: Path
) -> None:
    scram = [
        "--bootstrap-server",
        f"127.0.0.1:{broker.ports[0]}",
        "--command-config",
        str(_sasl_ssl(tmp_path, pki)),
    ]
    plain = _props(
        tmp_path / "plain.properties",
        [
            "security.protocol=SASL_PLAINTEXT",
            "sasl.mechanism=PLAIN",
            "sasl.username=alice",
            f"sasl.password={USERS['alice'][0]}",
        ],
    )
    via_plain = ["--bootstrap-server", f"127.0.0.1:{broker.ports[1]}", "--command-config", str(plain)]
    user = f"u{uuid.uuid4().hex[:6]}"
    ok(
        [
            "configs",
            "alter",
            "--entity-type",
            "users",
            "--entity-name",
            user,
            "--add-config",
            "producer_byte_rate=1024",
            *scram,
        ]
    )
    shown = json.loads(
        ok(
            ["configs", "describe", "--entity-type", "users", "--entity-name", user, "--json", *via_plain]
        ).stdout
    )
    assert json.dumps(shown).count("1024") == 1, shown


def test_bob_logs_in_but_is_not_allowed(broker: Broker, pki: Pki, tmp_path: Path) -> None:
    bob = (
        _sasl_ssl(tmp_path, pki, user="bob").read_text().replace("SCRAM-SHA-512", "SCRAM-SHA-256")
    )  # bob's one mechanism
    bob_ssl = _props(tmp_path / "bob256.properties", bob.splitlines())
    b = ["--bootstrap-server", f"127.0.0.1:{broker.ports[0]}", "--command-config", str(bob_ssl)]
    err = fails(
        [
            "configs",
            "alter",
            "--entity-type",
            "users",
            "--entity-name",
            "x",
            "--add-config",
            "producer_byte_rate=1",
            *b,
        ]
    )
    assert "CLUSTER_AUTHORIZATION_FAILED" in err, err


def test_unknown_tls_settings_are_refused_by_the_quota_path(broker: Broker, pki: Pki, tmp_path: Path) -> None:
    conf = _props(
        tmp_path / "x.properties", [*_sasl_ssl(tmp_path, pki).read_text().splitlines(), "ssl.cipher.suites=X"]
    )
    b = ["--bootstrap-server", f"127.0.0.1:{broker.ports[0]}", "--command-config", str(conf)]
    assert "does not support ssl.cipher.suites" in fails(
        ["configs", "describe", "--entity-type", "users", *b]
    )


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    err = fails(
        ["topics", "list", "--bootstrap-server", "127.0.0.1:1", "--command-config", str(tmp_path / "nope")]
    )
    assert "--command-config" in err and "nope" in err
