"""Kafka's broker config names (loglake.broker.kafka_broker_configs) joined with loglake's settings.

Every name Kafka documents is known: a name a loglake setting carries acts; the others are
described with Kafka's default, taken and stored with no effect where Kafka can change them at
runtime, and refused where Kafka's update mode is read-only. The list has one owner: no other
broker module spells a Kafka broker config name that no loglake setting carries.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import loglake
from loglake.broker.config import BrokerConfig
from loglake.broker.config_store import ConfigStore
from loglake.broker.dynamic_config import INERT_DOC, INERT_KEYS, BrokerConfigs, shown
from loglake.broker.kafka_broker_configs import CLUSTER_WIDE, KAFKA_BROKER_CONFIGS, PER_BROKER, READ_ONLY
from loglake.broker.settings import BROKER_SETTING_ROWS, INERT_DYNAMIC, KAFKA_ONLY
from loglake.engine import Engine
from loglake.engine.config import TOPIC_CONFIGS, ConfigType
from loglake.errors import ConfigError

from enginekit import small_config

SRC = Path(loglake.__file__).parent
OWNER = SRC / "broker" / "kafka_broker_configs.py"
#: A value each Kafka type takes, and one it refuses (None: every string is taken).
SAMPLE: dict[ConfigType, tuple[str, str | None]] = {
    ConfigType.BOOLEAN: ("true", "yes"), ConfigType.INT: ("123", "2147483648"), ConfigType.SHORT: ("12", "32768"),
    ConfigType.LONG: ("123456789012", "1.5"), ConfigType.DOUBLE: ("0.25", "nan"), ConfigType.STRING: ("x", None),
    ConfigType.LIST: ("a,b", None), ConfigType.CLASS: ("com.example.C", None), ConfigType.PASSWORD: ("secret", None),
}


@pytest.fixture
def broker_configs(tmp_path: Path) -> Iterator[BrokerConfigs]:
    engine = Engine(str(tmp_path / "d"), small_config())
    engine.open()
    try:
        yield BrokerConfigs(BrokerConfig(), engine, ("127.0.0.1", 9092, "127.0.0.1", 9092))
    finally:
        engine.close()


def test_the_table_is_kafkas_shape() -> None:
    assert len(KAFKA_BROKER_CONFIGS) > 300
    assert {k.mode for k in KAFKA_BROKER_CONFIGS.values()} == {READ_ONLY, PER_BROKER, CLUSTER_WIDE}
    relogin = KAFKA_BROKER_CONFIGS["sasl.kerberos.min.time.before.relogin"]
    assert (relogin.type, relogin.default, relogin.mode) == (ConfigType.LONG, "60000", PER_BROKER)
    assert KAFKA_BROKER_CONFIGS["log.dirs"].mode == READ_ONLY


def test_a_setting_named_by_kafka_has_kafkas_type() -> None:
    for setting in BROKER_SETTING_ROWS:
        for name in (setting.described_as, *setting.aliases):
            if name in KAFKA_BROKER_CONFIGS:
                assert KAFKA_BROKER_CONFIGS[name].type == setting.type, name
    for key in TOPIC_CONFIGS.values():
        if key.broker_synonym in KAFKA_BROKER_CONFIGS:
            assert KAFKA_BROKER_CONFIGS[key.broker_synonym].type == key.type, key.broker_synonym


def test_kafka_only_is_what_no_setting_carries() -> None:
    carried = {n for s in BROKER_SETTING_ROWS for n in (s.described_as, *s.aliases)}
    carried |= {k.broker_synonym for k in TOPIC_CONFIGS.values() if k.broker_synonym}
    assert set(KAFKA_ONLY) == set(KAFKA_BROKER_CONFIGS) - carried
    assert set(INERT_DYNAMIC) == {n for n, k in KAFKA_ONLY.items() if k.mode != READ_ONLY}
    assert set(INERT_KEYS) == set(INERT_DYNAMIC)


def test_every_kafka_name_round_trips(broker_configs: BrokerConfigs) -> None:
    """Every Kafka broker config: stored and described back where Kafka takes it at runtime, else refused."""
    node: dict[str, str] = {}
    for name, kafka in KAFKA_ONLY.items():
        good, bad = SAMPLE[kafka.type]
        if kafka.mode == READ_ONLY:
            with pytest.raises(ConfigError, match=re.escape(f"Cannot update these configs dynamically: {name}")):
                broker_configs.parse("0", name, good)
            continue
        node[name] = broker_configs.parse("0", name, good)
        if kafka.mode == PER_BROKER:
            with pytest.raises(ConfigError, match="broker id must be specified"):
                broker_configs.parse("", name, good)
        if bad is not None:
            with pytest.raises(ConfigError, match=re.escape(f"Invalid value {bad} for configuration {name}")):
                broker_configs.parse("0", name, bad)
    broker_configs.alter("0", node, validate_only=False)
    entries = {e["name"]: e for e in broker_configs.describe("0", list(node), synonyms=True, docs=True)}
    assert set(entries) == set(node)
    for name, value in node.items():
        e = entries[name]
        secret = KAFKA_ONLY[name].type is ConfigType.PASSWORD
        assert (e["value"], e["config_source"], e["read_only"], e["documentation"]) == (
            None if secret else value, 2, False, INERT_DOC), name
    broker_configs.load()  # a restart keeps them
    assert broker_configs.current("0") == node


def test_validate_only_stores_nothing(broker_configs: BrokerConfigs) -> None:
    name = "sasl.kerberos.min.time.before.relogin"
    broker_configs.alter("0", {name: broker_configs.parse("0", name, "120000")}, validate_only=True)
    assert broker_configs.current("0") == {} and ConfigStore.of(broker_configs.engine).broker_configs() == {}


def test_passwords_are_never_logged() -> None:
    assert shown({"ssl.keystore.password": "s3cret", "num.io.threads": "4"}) == {
        "ssl.keystore.password": "[hidden]", "num.io.threads": "4"}


def _kafka_only_literals(path: Path) -> list[str]:
    return [
        f"{path.name}:{node.lineno} {node.value}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KAFKA_ONLY
    ]


def test_no_broker_module_but_the_owner_spells_a_kafka_only_name() -> None:
    # the broker's modules only: the CLI and Spark spell Kafka's client configs, some of which
    # share a name with a broker config (ssl.truststore.location)
    found = [hit for path in sorted((SRC / "broker").rglob("*.py")) if path != OWNER for hit in _kafka_only_literals(path)]
    # loglake's single replica is described under Kafka's names, with a fixed value
    assert [h for h in found if not h.endswith(("default.replication.factor", "offsets.topic.replication.factor"))] == []


def test_the_owner_scan_sees_a_spelled_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('INERT = ("sasl.kerberos.kinit.cmd",)\n')
    assert _kafka_only_literals(module) == ["m.py:1 sasl.kerberos.kinit.cmd"]
