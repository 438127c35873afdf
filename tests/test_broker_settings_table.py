"""The one table of broker settings (`BROKER_SETTINGS`): complete rows, and everything derived from
it — `BrokerConfig`'s defaults and range checks, the dynamic broker configs, the DescribeConfigs
answer of the BROKER resource and README.md's table — agrees with it; no other module spells a
setting's default or bound."""

from __future__ import annotations

import ast
import inspect
import re
import sys
from collections.abc import Iterator
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any

import pytest

import loglake
from loglake.broker import dynamic_config, fetch_sessions, overload
from loglake.broker.config import BrokerConfig
from loglake.broker.config_store import ConfigStore
from loglake.broker.dynamic_config import DYNAMIC_KEYS, BrokerConfigs, DynamicKey
from loglake.broker.groups import limits
from loglake.broker.kafka_broker_configs import KAFKA_BROKER_CONFIGS, READ_ONLY
from loglake.broker.security.quotas import QuotaManager
from loglake.broker.settings import (
    BROKER_SETTING_ROWS,
    BROKER_SETTINGS,
    DYNAMIC_TOPIC_DEFAULTS,
    KAFKA_ONLY,
    NOT_SETTINGS,
    TABLES,
    BrokerSetting,
    Dynamic,
    _kind,
    check_value,
)
from loglake.broker.share.limits import ShareLimits
from loglake.cluster import membership
from loglake.engine import Engine
from loglake.engine.config import TOPIC_CONFIGS, ConfigType, EngineConfig
from loglake.errors import ConfigError

from enginekit import small_config

ROOT = Path(__file__).resolve().parent.parent
SRC = Path(loglake.__file__).parent
TABLE = SRC / "broker" / "settings.py"
sys.path.insert(0, str(ROOT / "scripts"))

import settings_table  # noqa: E402

BROKER_ROWS = [s for s in BROKER_SETTING_ROWS if s.engine_field is None]
BOUNDED = [s for s in BROKER_ROWS if s.bounds is not None]
#: Python type of a setting -> the DescribeConfigs types that may describe it.
DESCRIBED_AS = {
    bool: {ConfigType.BOOLEAN},
    int: {ConfigType.INT, ConfigType.LONG, ConfigType.SHORT, ConfigType.DOUBLE},
    str: {ConfigType.STRING, ConfigType.LIST, ConfigType.PASSWORD},
    list: {ConfigType.STRING, ConfigType.LIST},
}
#: Setting names that are common words elsewhere in src/ (a protocol field, an etcd key), so the
#: scan for spelled bounds does not watch them.
NOT_WATCHED = {"node_id", "cluster"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# ---- the rows ----------------------------------------------------------------------------------------


def test_names_are_unique_and_described_names_do_not_collide() -> None:
    assert len(BROKER_SETTINGS) == len(BROKER_SETTING_ROWS)
    described = [n for s in BROKER_SETTING_ROWS for n in (s.described_as, *s.aliases)]
    described += [k.broker_synonym for k in TOPIC_CONFIGS.values() if k.broker_synonym is not None]
    described += [f"engine.{f.name}" for f in fields(EngineConfig)]
    assert len(described) == len(set(described))


@pytest.mark.parametrize("setting", BROKER_SETTING_ROWS, ids=lambda s: s.name)
def test_every_row_is_complete(setting: BrokerSetting) -> None:
    assert setting.doc.strip() and setting.doc.endswith("."), setting.name
    assert setting.kafka is not None or not setting.aliases
    if setting.engine_field is not None:
        assert setting.engine_field in {f.name for f in fields(EngineConfig)} - NOT_SETTINGS
        assert setting.kafka is not None, "an engine setting is a row only for its Kafka name"
        assert setting.bounds is None, "an engine setting's range is the engine's"
    if setting.bounds is not None:
        low, high = setting.bounds
        assert low <= high
        assert isinstance(setting.default, int) and low <= setting.default <= high
    if setting.dynamic is not Dynamic.READ_ONLY:
        assert setting.kafka is not None, "AlterConfigs knows a dynamic setting by its Kafka name"
        assert type(setting.default) is int, "BrokerConfigs.apply pushes whole numbers"
        assert setting.engine_field is not None or setting.bounds is not None


def test_every_broker_config_field_is_a_row() -> None:
    settings = [f.name for f in fields(BrokerConfig) if f.name not in TABLES]
    assert sorted(settings) == sorted(s.name for s in BROKER_ROWS)


@pytest.mark.parametrize("f", [f for f in fields(BrokerConfig) if f.name not in TABLES], ids=lambda f: f.name)
def test_dataclass_defaults_are_the_tables(f: Field[Any]) -> None:
    setting = BROKER_SETTINGS[f.name]
    if f.default_factory is not MISSING:
        default = f.default_factory()
        assert isinstance(default, list) and tuple(default) == setting.default
    else:
        assert f.default == setting.default and type(f.default) is type(setting.default)
    assert setting.type in DESCRIBED_AS[_kind(f)], f.name


def test_engine_rows_take_their_default_from_the_engine() -> None:
    engine = EngineConfig()
    for setting in BROKER_SETTING_ROWS:
        if setting.engine_field is not None:
            assert setting.default == getattr(engine, setting.engine_field)


def _class_defaults(source: str, cls: str) -> list[str]:
    """`line name = source` of every field default of class `cls` that is not read from the table
    (default_of, list_default) and not None (unset)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for stmt in node.body:
                if not (isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name)):
                    continue
                if stmt.target.id in TABLES:
                    continue
                text = ast.unparse(stmt.value)
                if text == "None" or re.fullmatch(r"(default_of\(.*\)|field\(default_factory=list_default\(.*\)\))", text):
                    continue
                out.append(f"{stmt.lineno} {stmt.target.id} = {text}")
    return out


def test_broker_config_spells_no_default() -> None:
    assert _class_defaults((SRC / "broker" / "config.py").read_text(), "BrokerConfig") == []


def test_the_default_scan_sees_a_spelled_default() -> None:
    source = "class BrokerConfig:\n    max_connections: int = 10_000\n    listen: list[str] = field(default_factory=lambda: ['a'])\n"
    assert len(_class_defaults(source, "BrokerConfig")) == 2


def _watched() -> set[str]:
    names = {s.name for s in BROKER_ROWS} | {n for s in BROKER_SETTING_ROWS for n in (s.kafka, *s.aliases) if n}
    return names - NOT_WATCHED


def _has_int(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and type(n.value) is int for n in ast.walk(node))


def spelled_bounds(source: str, filename: str) -> list[str]:
    """`file:line name` wherever a setting's name sits beside a number: a dict entry, the
    arguments of a call (a keyword too), the items of a tuple or list."""
    watched = _watched()
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        groups: list[list[ast.expr]] = []
        if isinstance(node, ast.Dict):
            groups += [[k, v] for k, v in zip(node.keys, node.values, strict=True) if k is not None]
        elif isinstance(node, ast.Call):
            groups.append(list(node.args))
            groups += [[ast.Constant(kw.arg), kw.value] for kw in node.keywords if kw.arg is not None]
        elif isinstance(node, ast.Tuple | ast.List):
            groups.append(list(node.elts))
        for group in groups:
            for i, item in enumerate(group):
                if isinstance(item, ast.Constant) and item.value in watched and any(
                    _has_int(other) for j, other in enumerate(group) if j != i
                ):
                    found.append(f"{filename}:{getattr(node, 'lineno', '?')} {item.value}")
    return found


def test_no_module_outside_the_table_spells_a_setting_with_a_number() -> None:
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if path != TABLE:
            found += spelled_bounds(path.read_text(), str(path.relative_to(SRC)))
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        'BOUNDS = {"max_connections": (1, 1_000_000)}',  # what the table replaced
        'DynamicKey("max.connections", ConfigType.INT, 1, 2**31 - 1)',
        'KEYS = (("connections.max.idle.ms", 1000),)',
        "BrokerConfig(max_connections=5)",
    ],
)
def test_the_bound_scan_sees_a_spelled_bound(source: str) -> None:
    assert spelled_bounds(source, "m.py") != []


def test_modules_acting_on_a_setting_hold_the_tables_default() -> None:
    """Defaults spelled where the setting acts too, because importing that module into the table
    would load the protocol codec, the group coordinator or the etcd client into every CLI command
    (or, for overload, make an import cycle with BrokerConfig)."""
    d = {s.name: s.default for s in BROKER_ROWS}
    sessions = ("max_incremental_fetch_session_cache_slots", "min_incremental_fetch_session_eviction_ms", "fetch_session_max_partitions")
    assert tuple(d[n] for n in sessions) == (
        fetch_sessions.CACHE_SLOTS_DEFAULT, fetch_sessions.EVICTION_MS_DEFAULT, fetch_sessions.SESSION_PARTITIONS_DEFAULT,
    )
    classic = ("group_min_session_timeout_ms", "group_max_session_timeout_ms", "group_initial_rebalance_delay_ms", "offsets_retention_minutes")
    assert tuple(d[n] for n in classic) == (
        limits.MIN_SESSION_TIMEOUT_MS_DEFAULT, limits.MAX_SESSION_TIMEOUT_MS_DEFAULT, limits.INITIAL_REBALANCE_DELAY_MS_DEFAULT,
        limits.OFFSETS_RETENTION_MINUTES_DEFAULT,
    )
    assert BrokerConfig().consumer_group_limits() == limits.ConsumerLimits()  # KIP-848's, from the table and the coordinator alike
    assert BrokerConfig().share_limits() == ShareLimits()  # KIP-932's, from the table and the share coordinator alike
    assert d["cluster_lease_ttl_s"] == membership.BROKER_LEASE_TTL_S_DEFAULT
    assert BROKER_SETTINGS["cluster_lease_ttl_s"].bounds == (membership.BROKER_LEASE_TTL_S_MIN, 3600)
    assert d["queued_max_request_bytes"] == overload.QUEUED_MAX_REQUEST_BYTES_DEFAULT  # unused since the table
    window = inspect.signature(QuotaManager).parameters
    assert (d["quota_window_num"], d["quota_window_size_seconds"]) == (window["window_num"].default, window["window_size_s"].default)


# ---- validation: each bound, both sides, with the table's message ------------------------------------


@pytest.mark.parametrize("setting", BOUNDED, ids=lambda s: s.name)
def test_bounds_are_inclusive_and_refused_one_beyond(setting: BrokerSetting) -> None:
    assert setting.bounds is not None
    low, high = setting.bounds
    for ok in (low, high):
        assert check_value(setting.name, int, ok, "test", from_text=False) == ok
    for bad in (low - 1, high + 1):
        message = f"{setting.name}={bad} (from {_flag(setting.name)}): out of range, allowed {setting.allowed()}"
        with pytest.raises(ConfigError, match=re.escape(message)):
            BrokerConfig.load(None, {}, **{setting.name: bad})
        with pytest.raises(ConfigError, match=re.escape(f"(from default): out of range, allowed {setting.allowed()}")):
            BrokerConfig(**{setting.name: bad}).validate()  # type: ignore[arg-type]


def test_max_connections_takes_any_int32_statically_and_dynamically() -> None:
    """The two tables this one replaced disagreed: [1, 1000000] at start-up, [1, 2**31-1] at runtime."""
    assert BrokerConfig.load(env={"LOGLAKE_MAX_CONNECTIONS": str(2**31 - 1)}).max_connections == 2**31 - 1
    assert DYNAMIC_KEYS["max.connections"].parse(str(2**31 - 1), EngineConfig()) == str(2**31 - 1)
    with pytest.raises(ConfigError, match=re.escape("allowed [1, 2147483647]")):
        BrokerConfig.load(env={"LOGLAKE_MAX_CONNECTIONS": str(2**31)})


# ---- dynamic settings --------------------------------------------------------------------------------


def test_every_dynamic_setting_is_in_the_table() -> None:
    rows = {s.described_as: s for s in BROKER_SETTING_ROWS if s.dynamic is not Dynamic.READ_ONLY}
    topic_defaults = {TOPIC_CONFIGS[t].broker_synonym: t for t in DYNAMIC_TOPIC_DEFAULTS}
    assert None not in topic_defaults, "a dynamic topic default is known by its Kafka broker setting"
    assert set(DYNAMIC_KEYS) == set(rows) | set(topic_defaults)
    for name, key in DYNAMIC_KEYS.items():
        if name in rows:
            assert (key.setting, key.type, key.dynamic, key.topic_config) == (rows[name], rows[name].type, rows[name].dynamic, None)
        else:
            assert key.setting is None and key.topic_config == topic_defaults[name]
    engine_rows = {s.engine_field for s in rows.values() if s.engine_field is not None}
    assert engine_rows == set(dynamic_config._ENGINE_APPLIERS), "every dynamic engine setting reaches the engine"


@pytest.mark.parametrize("key", list(DYNAMIC_KEYS.values()), ids=lambda k: k.name)
def test_every_dynamic_key_takes_its_default_and_refuses_junk(key: DynamicKey) -> None:
    default = str(key.setting.default) if key.setting is not None else TOPIC_CONFIGS[str(key.topic_config)].default
    assert key.parse(default, EngineConfig()) == default
    for junk in ("lots", None):
        with pytest.raises(ConfigError, match=re.escape(key.name)):
            key.parse(junk, EngineConfig())


@pytest.mark.parametrize("setting", [s for s in BOUNDED if s.dynamic is not Dynamic.READ_ONLY], ids=lambda s: s.name)
def test_dynamic_bounds_are_the_tables(setting: BrokerSetting) -> None:
    assert setting.bounds is not None
    key = DYNAMIC_KEYS[setting.described_as]
    low, high = setting.bounds
    for ok in (low, high):
        assert key.parse(str(ok), EngineConfig()) == str(ok)
    for bad in (low - 1, high + 1):
        message = f"Invalid value {bad} for configuration {key.name}: must be in {setting.allowed()}"
        with pytest.raises(ConfigError, match=re.escape(message)):
            key.parse(str(bad), EngineConfig())


def test_a_dynamic_engine_setting_is_checked_by_the_engine() -> None:
    key = DYNAMIC_KEYS["log.cleaner.io.max.bytes.per.second"]
    assert key.parse("1.5E7", EngineConfig()) == "15000000"
    assert key.parse("1.7976931348623157E308", EngineConfig()) == "0"  # Kafka's default: unlimited
    with pytest.raises(ConfigError, match=r"cleaner_io_max_bytes_per_second .*must be >= 0"):
        key.parse("-1", EngineConfig())
    with pytest.raises(ConfigError, match="not a number"):
        key.parse("nan", EngineConfig())


def test_scopes_of_per_broker_and_cluster_wide_settings() -> None:
    row = BROKER_SETTINGS["max_connections"]
    per_broker = DynamicKey("x.per.broker", ConfigType.INT, Dynamic.PER_BROKER, setting=row)
    per_broker.check_scope("0")
    with pytest.raises(ConfigError, match=re.escape("broker id must be specified: x.per.broker")):
        per_broker.check_scope("")
    for scope in ("0", ""):
        DYNAMIC_KEYS["max.connections"].check_scope(scope)


# ---- DescribeConfigs of the BROKER resource ----------------------------------------------------------


@pytest.fixture
def broker_configs(tmp_path: Path) -> Iterator[BrokerConfigs]:
    engine = Engine(str(tmp_path / "d"), small_config())
    engine.open()
    try:
        yield BrokerConfigs(BrokerConfig(), engine, ("127.0.0.1", 9092, "127.0.0.1", 9092))
    finally:
        engine.close()


def test_describe_configs_is_the_table(broker_configs: BrokerConfigs) -> None:
    entries = {e["name"]: e for e in broker_configs.describe("0", None, synonyms=True, docs=True)}
    resolved = {"data_dir", "listen", "advertised_listener"}  # described with what the broker resolved
    for setting in BROKER_SETTING_ROWS:
        for name in (setting.described_as, *setting.aliases):
            e = entries.pop(name)
            assert (e["config_type"], e["documentation"], e["read_only"], e["is_sensitive"]) == (
                setting.type, setting.doc, setting.dynamic is Dynamic.READ_ONLY, setting.sensitive,
            ), name
            if setting.name in resolved or setting.engine_field is not None:
                continue
            default = setting.default
            text = None if default is None else (",".join(default) if isinstance(default, tuple) else str(default).lower()
                                                 if isinstance(default, bool) else str(default))
            assert (e["value"], e["is_default"]) == (None if setting.sensitive else text, True), name
    assert {"default.replication.factor", "offsets.topic.replication.factor"} <= set(entries)
    rest = set(entries) - {"default.replication.factor", "offsets.topic.replication.factor"}
    synonyms = {k.broker_synonym for k in TOPIC_CONFIGS.values() if k.broker_synonym is not None}
    engine = {f"engine.{f.name}" for f in fields(EngineConfig) if f.name not in NOT_SETTINGS}
    kafka_only = set(KAFKA_ONLY) - {"default.replication.factor", "offsets.topic.replication.factor"}
    assert rest == synonyms | (engine - set(BROKER_SETTINGS)) | kafka_only, (
        "described: the table, the topic defaults, the engine, Kafka's other broker configs"
    )
    for name in kafka_only:
        e = entries[name]
        kafka = KAFKA_BROKER_CONFIGS[name]
        assert (e["config_type"], e["read_only"], e["is_default"]) == (kafka.type, kafka.mode == READ_ONLY, True), name
        assert e["value"] == (None if kafka.type is ConfigType.PASSWORD else kafka.default), name


def test_altering_goes_through_the_table(broker_configs: BrokerConfigs) -> None:
    assert broker_configs.parse("0", "max.connections", "77") == "77"
    for name, words in (("num.partitions", "Cannot update these configs dynamically"), ("no.such", "Unknown broker config")):
        with pytest.raises(ConfigError, match=words):
            broker_configs.parse("0", name, "3")
    broker_configs.alter("", {"max.connections": "77", "connections.max.idle.ms": "5000"}, validate_only=False)
    assert (broker_configs.config.max_connections, broker_configs.config.idle_timeout_ms) == (77, 5000)
    broker_configs.alter("", {}, validate_only=False)
    assert (broker_configs.config.max_connections, broker_configs.config.idle_timeout_ms) == (
        BROKER_SETTINGS["max_connections"].default, BROKER_SETTINGS["idle_timeout_ms"].default,
    )


def test_a_stored_value_out_of_this_releases_bounds_is_skipped(broker_configs: BrokerConfigs) -> None:
    engine = broker_configs.engine
    ConfigStore.of(engine).save_broker_configs("", {"connections.max.idle.ms": str(10 * 24 * 3600 * 1000), "max.connections": "55"})
    broker_configs.load()
    assert broker_configs.current("") == {"max.connections": "55"}
    assert (broker_configs.config.max_connections, broker_configs.config.idle_timeout_ms) == (55, 600_000)


# ---- README.md ---------------------------------------------------------------------------------------


def test_readme_table_is_the_generated_one() -> None:
    readme = settings_table.README.read_text()
    assert settings_table.spliced(readme, settings_table.render()) == readme, (
        "README.md's table of broker settings is stale: run python scripts/settings_table.py --write"
    )


def test_readme_table_has_a_row_per_setting() -> None:
    table = settings_table.render()
    assert table.count("\n") == 2 + len(BROKER_SETTING_ROWS)
    assert "| `max_connections` | `max.connections` | `10000` | `[1, 2147483647]` | cluster-wide |" in table
    assert "| `node_id` | `node.id`, `broker.id` | `0` |" in table
    assert settings_table.human("idle_timeout_ms", 7 * 24 * 3600 * 1000) == "7 days"
    assert settings_table.human("max_frame_bytes", 100 * 1024 * 1024) == "100 MiB"
    assert settings_table.human("max_connections", 10_000) is None
