"""`super_users` (issue 31, item 6): a certificate principal with commas
(``User:CN=admin,OU=eng,O=example``) is one principal. A string is separated by ``;`` as Kafka's
super.users is, a TOML array is taken element by element, a legacy comma list of plain names
still works; DescribeConfigs joins with ``;``; a real broker lets the DN do what ACLs would refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from aclkit import TlsClient, create_topic
from loglake.broker.config import BrokerConfig, split_principals
from loglake.broker.dynamic_config import BrokerConfigs
from loglake.engine import Engine
from loglake.errors import ConfigError
from loglake.kafka_errors import ErrorCode
from tlskit import Pki, make_pki, ssl_args

from brokerkit import Broker, serving_in_process
from enginekit import small_config

DN = "User:CN=admin,OU=eng,O=example"


def test_super_users_separated_by_semicolons_name_a_certificate_principal(tmp_path: Path) -> None:
    assert BrokerConfig.load(env={}, super_users=DN).super_users == [DN]
    assert BrokerConfig.load(env={}, super_users=f"{DN};User:ops").super_users == [DN, "User:ops"]
    assert BrokerConfig.load(env={"LOGLAKE_SUPER_USERS": f" {DN} ; User:ops ;"}).super_users == [DN, "User:ops"]
    toml = tmp_path / "b.toml"
    toml.write_text(f'super_users = "{DN};User:ops"\n')
    assert BrokerConfig.load(str(toml), env={}).super_users == [DN, "User:ops"]
    toml.write_text(f'super_users = ["{DN}", "User:CN=x,O=y", "User:a,User:b"]\n')
    # an array is taken element by element: nothing is split inside one
    assert BrokerConfig.load(str(toml), env={}).super_users == [DN, "User:CN=x,O=y", "User:a,User:b"]


def test_a_comma_list_of_plain_principals_still_works() -> None:
    assert split_principals("User:admin,User:ops", "t") == ["User:admin", "User:ops"]
    assert split_principals("User:admin, Group:ops;User:x", "t") == ["User:admin", "Group:ops", "User:x"]
    # one part is no Type:name, or has a '=' (a DN): the whole is one principal
    assert split_principals("User:CN=a,OU=b", "t") == ["User:CN=a,OU=b"]
    assert split_principals("User:a,User:CN=b,O=c", "t") == ["User:a,User:CN=b,O=c"]
    with pytest.raises(ConfigError, match=r"super_users='OU=eng' \(from t\)"):
        split_principals("User:admin;OU=eng", "t")


def test_super_users_are_described_as_kafka_writes_them(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "d"), small_config())
    engine.open()
    try:
        config = BrokerConfig.load(env={}, super_users=f"{DN};User:ops")
        described = BrokerConfigs(config, engine, ("127.0.0.1", 9092, "127.0.0.1", 9092)).describe("0", None, synonyms=False, docs=False)
        (entry,) = [e for e in described if e["name"] == "super.users"]
        assert entry["value"] == f"{DN};User:ops"
    finally:
        engine.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), clients=("admin", "eve"))


def test_a_certificate_principal_with_commas_is_a_super_user(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> None:
    """mTLS, principals are the certificates' DNs (the default mapping), no ACLs at all: admin's
    DN, named in the TOML array, may create a topic; eve may not."""
    conf = tmp_path_factory.mktemp("conf") / "broker.toml"
    conf.write_text('super_users = ["User:CN=admin,O=loglake"]\n')
    args = ["--listen", "SSL://127.0.0.1:0", *ssl_args(pki, client_auth="required"), "--config", str(conf)]
    with serving_in_process(tmp_path_factory.mktemp("dn") / "data", args) as b:
        admin, eve = TlsClient(b.port, pki, "admin"), TlsClient(b.port, pki, "eve")
        try:
            assert create_topic(eve, "dn-topic") == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            assert create_topic(admin, "dn-topic") == ErrorCode.NONE
        finally:
            admin.close()
            eve.close()


NOBODY_MAY = "with no super user and no ACL binding"


def start_warnings(data_dir: Path, *args: str) -> list[str]:
    """The WARNING lines a real `loglake serve` prints (at its default log level) by the time it listens."""
    broker = Broker(data_dir, ["--listen", "127.0.0.1:0", *args], log_level="WARNING").start()
    broker.stop()
    return [line for line in broker.log_text().splitlines() if " WARNING " in line]


def test_a_broker_nobody_may_use_or_administer_says_so_once_at_start(tmp_path: Path) -> None:
    # a SASL listener authenticates clients, so nothing is open to everyone, and nobody is super
    sasl = ("--listen", "SASL_PLAINTEXT://127.0.0.1:0")
    (line,) = [w for w in start_warnings(tmp_path / "locked", *sasl) if NOBODY_MAY in w]
    assert "because a listener authenticates clients" in line
    assert "hint: start with --super-users User:NAME" in line and "--allow-everyone-if-no-acl-found" in line
    assert "nobody may grant an ACL" in line
    # set off by hand on a PLAINTEXT broker: the same line, without the listener's reason
    (line,) = [w for w in start_warnings(tmp_path / "off", "--no-allow-everyone-if-no-acl-found") if NOBODY_MAY in w]
    assert "because" not in line
    # a super user can grant what is needed; a PLAINTEXT broker is open to everyone: nothing to say
    assert not [w for w in start_warnings(tmp_path / "super", *sasl, "--super-users", "User:admin") if NOBODY_MAY in w]
    assert not [w for w in start_warnings(tmp_path / "open") if NOBODY_MAY in w]
