"""The one table of topic configs (`TOPIC_CONFIG_KEYS`): complete rows, and README.md lists them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from loglake.engine.config import (
    INTEGER_RANGES,
    TOPIC_CONFIG_KEYS,
    TOPIC_CONFIG_NAMES,
    TOPIC_CONFIGS,
    ConfigType,
    TopicConfig,
    TopicConfigKey,
)
from loglake.errors import ConfigError

README = Path(__file__).resolve().parent.parent / "README.md"
#: The types loglake's topic configs use (DescribeConfigs v3+ sends them to clients).
USED_TYPES = {ConfigType.INT, ConfigType.LONG, ConfigType.DOUBLE, ConfigType.STRING, ConfigType.LIST}


def test_names_are_unique_and_in_table_order() -> None:
    assert tuple(k.name for k in TOPIC_CONFIG_KEYS) == TOPIC_CONFIG_NAMES
    assert len(set(TOPIC_CONFIG_NAMES)) == len(TOPIC_CONFIG_KEYS) == len(TOPIC_CONFIGS)


@pytest.mark.parametrize("key", TOPIC_CONFIG_KEYS, ids=lambda k: k.name)
def test_every_key_has_a_type_doc_and_valid_default(key: TopicConfigKey) -> None:
    assert key.type in USED_TYPES
    assert key.doc.strip() and key.doc.endswith(".")
    key.parse(key.default)  # the default is an accepted value
    if key.type in (ConfigType.INT, ConfigType.LONG, ConfigType.DOUBLE):
        assert key.low is not None  # every number has a floor
        assert not key.choices and key.check is None
    if key.type is ConfigType.LIST:
        assert key.choices
    assert key.broker_synonym is None or key.broker_synonym.strip()


def test_hot_retain_keys_are_in_the_table() -> None:
    assert TOPIC_CONFIGS["hot.retain.segments"].type is ConfigType.INT
    assert TOPIC_CONFIGS["hot.retain.bytes"].type is ConfigType.LONG
    config = TopicConfig.parse()
    assert (config.hot_retain_segments, config.hot_retain_bytes) == (4, 0)


def test_parse_keeps_accepted_values() -> None:
    config = TopicConfig.parse(
        {"cleanup.policy": " compact , delete", "compression.type": "ZSTD", "durability": "disk",
         "hot.retain.bytes": "1024", "segment.bytes": "14"}
    )
    assert config.cleanup_policy == "compact,delete"
    assert config.compression_type == "ZSTD"
    assert config.hot_retain_bytes == 1024 and config.segment_bytes == 14
    for bad in ({"segment.bytes": "13"}, {"min.insync.replicas": "2"}, {"durability": "object"},
                {"compression.type": "brotli"}, {"cleanup.policy": ""}, {"hot.retain.segments": "-1"}):
        with pytest.raises(ConfigError):
            TopicConfig.parse(bad)


def test_readme_lists_every_key_with_its_type_and_default() -> None:
    rows = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[1:-1]]
        for line in README.read_text().splitlines()
        if line.startswith("| `")
    }
    for key in TOPIC_CONFIG_KEYS:
        row = rows.get(f"`{key.name}`")
        assert row is not None, f"README.md has no row for topic config {key.name}"
        assert row[1] == key.type.name.lower(), key.name
        assert row[2].startswith(f"`{key.default}`"), key.name


def test_double_configs_parse_and_refuse_out_of_range() -> None:
    assert TopicConfig.parse({"min.cleanable.dirty.ratio": "0.25"}).min_cleanable_dirty_ratio == 0.25
    for bad in ("1.5", "-0.1", "nan", "half"):
        with pytest.raises(ConfigError):
            TopicConfig.parse({"min.cleanable.dirty.ratio": bad})


@pytest.mark.parametrize(
    "key", [k for k in TOPIC_CONFIG_KEYS if k.type in INTEGER_RANGES], ids=lambda k: k.name
)
def test_an_integer_config_holds_what_its_java_type_holds(key: TopicConfigKey) -> None:
    """A LONG past 2**63 - 1 (or an INT past 2**31 - 1) is refused as Kafka refuses it, not kept
    as a number no Kafka client can parse (retention.ms=99999999999999999999999 was accepted)."""
    low, high = INTEGER_RANGES[key.type]
    top = high if key.high is None else key.high
    bottom = low if key.low is None else key.low
    assert key.parse(str(top)) == top and key.parse(str(bottom)) == bottom
    for outside in (top + 1, bottom - 1, high + 1, 10**23):
        with pytest.raises(ConfigError, match=rf"must be in \[{bottom}, {top}\]"):
            key.parse(str(outside))
