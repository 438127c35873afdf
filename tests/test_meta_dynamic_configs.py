"""Dynamic broker and group configs in the metadata: records, checkpoints (old ones still open),
engine persistence across reopen, runtime topic defaults, and the group config store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loglake.broker.config import BrokerConfig
from loglake.broker.config_store import ConfigStore
from loglake.broker.dynamic_config import (
    DEFAULT_CONFIG,
    GROUP_CONFIG,
    STATIC_BROKER_CONFIG,
    ConfigPolicyError,
    ConfigResourceError,
)
from loglake.broker.group_configs import (
    HEARTBEAT_INTERVAL,
    SESSION_TIMEOUT,
    SHARE_DELIVERY_COUNT_LIMIT,
    SHARE_PARTITION_MAX_RECORD_LOCKS,
    SHARE_RECORD_LOCK_DURATION,
    GroupConfigBounds,
    GroupConfigStore,
    group_config_bounds,
)
from loglake.broker.share.limits import GroupShareLimits, ShareLimits
from loglake.engine import Engine
from loglake.errors import ConfigError
from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.state import MetaState

from enginekit import small_config


def test_records_replace_and_remove() -> None:
    state = MetaState("c")
    state.apply("broker_config", {"scope": "", "configs": {"log.retention.ms": "1000"}})
    state.apply("broker_config", {"scope": "0", "configs": {"max.connections": "5"}})
    state.apply("broker_config", {"scope": "", "configs": {"max.connections": "9"}})  # replaced whole
    assert state.broker_configs == {"": {"max.connections": "9"}, "0": {"max.connections": "5"}}
    state.apply("broker_config", {"scope": "0", "configs": {}})
    assert state.broker_configs == {"": {"max.connections": "9"}}
    state.apply("group_config", {"g": "g1", "configs": {SESSION_TIMEOUT: "50000"}})
    state.apply("group_deleted", {"g": "g1"})  # deleting a group leaves its configs, as Kafka does
    assert state.group_configs == {"g1": {SESSION_TIMEOUT: "50000"}}
    state.apply("group_config", {"g": "g1", "configs": {}})
    assert state.group_configs == {}
    with pytest.raises(ValueError):
        state.apply("group_config", {"g": "g1", "configs": ["not", "an", "object"]})


def _checkpoint(state: MetaState, drop: tuple[str, ...] = ()) -> MetaState:
    img = capture(state)
    for key in drop:
        del img.doc[key]
    return decode_checkpoint(b"".join(encode_checkpoint(img)), path="ck")


def test_checkpoint_keeps_them_and_older_checkpoints_open_without_them() -> None:
    state = MetaState("c")
    state.apply("broker_config", {"scope": "", "configs": {"message.max.bytes": "2000"}})
    state.apply("group_config", {"g": "g", "configs": {HEARTBEAT_INTERVAL: "6000"}})
    back = _checkpoint(state)
    assert back.broker_configs == state.broker_configs and back.group_configs == state.group_configs
    old = _checkpoint(state, drop=("broker_configs", "group_configs"))  # written before dynamic configs
    assert old.broker_configs == {} and old.group_configs == {}


def test_engine_keeps_dynamic_configs_across_reopen(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "d"), small_config())
    engine.open()
    try:
        ConfigStore.of(engine).save_broker_configs("", {"log.retention.ms": "1234"})
        ConfigStore.of(engine).save_group_configs("g", {SESSION_TIMEOUT: "50000"})
    finally:
        engine.close()
    for checkpoint in (False, True):
        engine = Engine(str(tmp_path / "d"), small_config())
        engine.open()
        try:
            assert ConfigStore.of(engine).broker_configs() == {"": {"log.retention.ms": "1234"}}
            assert ConfigStore.of(engine).group_configs() == {"g": {SESSION_TIMEOUT: "50000"}}
            if checkpoint:
                engine.checkpoint_metadata()
        finally:
            engine.close()


def test_runtime_topic_defaults_reach_topics_without_an_override(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "d"), small_config())
    engine.open()
    try:
        engine.create_topic("plain", 1)
        engine.create_topic("own", 1, {"retention.ms": "99"})
        engine.set_topic_defaults({"retention.ms": "5000"})
        assert engine.catalog.topic("plain").config.retention_ms == 5000
        assert engine.catalog.topic("own").config.retention_ms == 99
        with pytest.raises(ConfigError):
            engine.set_topic_defaults({"max.message.bytes": str(engine.config.memory_budget_bytes)})
        assert engine.catalog.topic("plain").config.retention_ms == 5000  # a refused change changes nothing
    finally:
        engine.close()


def test_group_config_store(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "d"), small_config())
    engine.open()
    try:
        store = GroupConfigStore(ConfigStore.of(engine), max_groups=2)
        store.alter("g1", {SESSION_TIMEOUT: "50000"}, validate_only=False)
        assert store.overrides("g1") == {SESSION_TIMEOUT: 50000}  # only what was set, as ints
        assert store.overrides("nobody") == {}
        store.alter("g2", {HEARTBEAT_INTERVAL: "6000"}, validate_only=True)
        assert store.overrides("g2") == {}
        for bad, message in (
            ({SESSION_TIMEOUT: "44999"}, "greater than or equal to group.consumer.min.session.timeout.ms"),
            ({SESSION_TIMEOUT: "60001"}, "less than or equal to group.consumer.max.session.timeout.ms"),
            ({HEARTBEAT_INTERVAL: "4999"}, "greater than or equal to group.consumer.min.heartbeat.interval.ms"),
            ({HEARTBEAT_INTERVAL: "15001"}, "less than or equal to group.consumer.max.heartbeat.interval.ms"),
            ({SESSION_TIMEOUT: "soon"}, "Not a number"),
            ({"streams.session.timeout.ms": "50000"}, "Unknown group config name"),
        ):
            with pytest.raises(ConfigError, match=re.escape(message)):
                store.alter("g1", bad, validate_only=False)
        narrow = GroupConfigStore(ConfigStore.of(engine), lambda: GroupConfigBounds(session_timeout_ms=10_000, min_session_timeout_ms=1_000, max_session_timeout_ms=60_000, heartbeat_interval_ms=5_000, min_heartbeat_interval_ms=1_000, max_heartbeat_interval_ms=15_000))
        with pytest.raises(ConfigError, match=re.escape("must be greater than consumer.heartbeat.interval.ms")):
            narrow.alter("g9", {SESSION_TIMEOUT: "4000"}, validate_only=False)
        with pytest.raises(ConfigResourceError):
            store.alter("", {SESSION_TIMEOUT: "50000"}, validate_only=False)
        store.alter("g2", {HEARTBEAT_INTERVAL: "6000"}, validate_only=False)
        with pytest.raises(ConfigPolicyError, match="GROUP_CONFIGS_MAX"):
            store.alter("g3", {HEARTBEAT_INTERVAL: "6000"}, validate_only=False)
        store.alter("g2", {}, validate_only=False)  # removing frees a place
        store.alter("g3", {HEARTBEAT_INTERVAL: "6000"}, validate_only=False)
        reloaded = GroupConfigStore(ConfigStore.of(engine))
        reloaded.load()
        assert reloaded.groups() == ["g1", "g3"] and reloaded.overrides("g3") == {HEARTBEAT_INTERVAL: 6000}
    finally:
        engine.close()


def test_share_lock_duration_and_delivery_limit_per_group(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "d"), small_config())
    engine.open()
    try:
        broker = ShareLimits(record_lock_duration_ms=20_000, delivery_count_limit=5)
        store = GroupConfigStore(ConfigStore.of(engine), share_defaults=lambda: broker)
        assert (store.share_limit("g", SHARE_RECORD_LOCK_DURATION), store.share_limit("g", SHARE_DELIVERY_COUNT_LIMIT)) == (20_000, 5)
        store.alter("g", {SHARE_RECORD_LOCK_DURATION: "2000", SHARE_DELIVERY_COUNT_LIMIT: " 3"}, validate_only=False)
        assert (store.share_limit("g", SHARE_RECORD_LOCK_DURATION), store.share_limit("g", SHARE_DELIVERY_COUNT_LIMIT)) == (2000, 3)
        assert store.share_limit("other", SHARE_DELIVERY_COUNT_LIMIT) == 5
        assert store.current("g") == {SHARE_RECORD_LOCK_DURATION: "2000", SHARE_DELIVERY_COUNT_LIMIT: "3"}
        for bad, message in (  # the ranges of group.share.record.lock.duration.ms / group.share.delivery.count.limit
            ({SHARE_RECORD_LOCK_DURATION: "999"}, "Value must be in [1000, 3600000]"),
            ({SHARE_DELIVERY_COUNT_LIMIT: "11"}, "Value must be in [2, 10] (the range of group.share.delivery.count.limit)"),
            ({SHARE_DELIVERY_COUNT_LIMIT: "many"}, "Not a number"),
        ):
            with pytest.raises(ConfigError, match=re.escape(message)):
                store.alter("g", bad, validate_only=False)
        assert store.share_limit("g", SHARE_DELIVERY_COUNT_LIMIT) == 3  # a refused change changes nothing
        described = {e["name"]: e for e in store.describe("g", None, synonyms=True, docs=False)}
        lock = described[SHARE_RECORD_LOCK_DURATION]
        assert (lock["value"], lock["config_source"]) == ("2000", GROUP_CONFIG)
        assert [(s["name"], s["value"], s["source"]) for s in lock["synonyms"]] == [  # type: ignore[union-attr]
            (SHARE_RECORD_LOCK_DURATION, "2000", GROUP_CONFIG),
            ("group.share.record.lock.duration.ms", "20000", STATIC_BROKER_CONFIG),  # not Kafka's 30000
        ]
        fresh = {e["name"]: e for e in store.describe("new", [SHARE_DELIVERY_COUNT_LIMIT], synonyms=False, docs=False)}
        assert (fresh[SHARE_DELIVERY_COUNT_LIMIT]["value"], fresh[SHARE_DELIVERY_COUNT_LIMIT]["config_source"]) == ("5", DEFAULT_CONFIG)
        reloaded = GroupConfigStore(ConfigStore.of(engine))
        reloaded.load()
        assert reloaded.current("g") == {SHARE_RECORD_LOCK_DURATION: "2000", SHARE_DELIVERY_COUNT_LIMIT: "3"}
        # the third: share.partition.max.record.locks, in group.share.partition.max.record.locks' range
        with pytest.raises(ConfigError, match=re.escape("Value must be in [100, 10000]")):
            store.alter("g", {SHARE_PARTITION_MAX_RECORD_LOCKS: "99"}, validate_only=False)
        assert store.share_limits("g") == GroupShareLimits(2000, 3, 2000, 45_000, 5_000)
        store.alter("g", {SHARE_PARTITION_MAX_RECORD_LOCKS: "150"}, validate_only=False)
        assert store.share_limits("g") == GroupShareLimits(20_000, 5, 150, 45_000, 5_000)  # alter replaces the set (AlterConfigs)
    finally:
        engine.close()


def test_bounds_default_to_kafkas_and_follow_broker_settings() -> None:
    assert group_config_bounds(BrokerConfig()) == GroupConfigBounds()
    assert (GroupConfigBounds().session_timeout_ms, GroupConfigBounds().max_heartbeat_interval_ms) == (45_000, 15_000)  # Kafka's

    assert group_config_bounds(BrokerConfig(group_consumer_max_session_timeout_ms=90_000)).max_session_timeout_ms == 90_000


def test_cleaner_io_rate_changes_at_runtime(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "d"), small_config(cleaner_threads=1, cleaner_process=False))
    engine.open()
    try:
        engine.set_cleaner_io_rate(1234)
        assert engine.config.cleaner_io_max_bytes_per_second == 1234
        limiter = engine.cleaner.limiter
        assert limiter.bytes_per_s == 1234
        limiter.acquire(1000)  # within the bucket: no wait
        engine.set_cleaner_io_rate(0)  # unlimited
        limiter.acquire(10**12)
    finally:
        engine.close()


def test_share_session_timeout_and_heartbeat_interval_per_group(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "d"), small_config())
    engine.open()
    try:
        broker = ShareLimits(min_session_timeout_ms=2_000, min_heartbeat_interval_ms=1_000)
        store = GroupConfigStore(ConfigStore.of(engine), share_defaults=lambda: broker)
        assert store.share_limits("g")[3:] == (45_000, 5_000)  # the broker's until set
        store.alter("g", {"share.session.timeout.ms": "3000", "share.heartbeat.interval.ms": " 1000"}, validate_only=False)
        assert store.share_limits("g")[3:] == (3_000, 1_000) and store.share_limits("other")[3:] == (45_000, 5_000)
        assert store.current("g") == {"share.session.timeout.ms": "3000", "share.heartbeat.interval.ms": "1000"}
        # the broker's minimum rose since: a stored value below it is brought up to it, not refused
        broker = ShareLimits()
        assert store.share_limits("g")[3:] == (45_000, 5_000)
        reloaded = GroupConfigStore(ConfigStore.of(engine), share_defaults=lambda: broker)
        reloaded.load()
        assert reloaded.current("g") == {"share.session.timeout.ms": "3000", "share.heartbeat.interval.ms": "1000"}
        with pytest.raises(ConfigError, match=re.escape("share.session.timeout.ms must be greater than or equal to "
                                                        "group.share.min.session.timeout.ms")):
            store.alter("g", {"share.session.timeout.ms": "3000"}, validate_only=False)
    finally:
        engine.close()
