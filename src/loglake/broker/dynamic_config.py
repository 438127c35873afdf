"""Dynamic broker configs: Kafka's BROKER config resource, changed at runtime and kept in the metadata log.

Theory of operation
-------------------
A broker setting has up to four layers, highest first, as Kafka's: DYNAMIC_BROKER_CONFIG (set on
the resource named by this node id), DYNAMIC_DEFAULT_BROKER_CONFIG (set on the resource named
"", the cluster-wide default), STATIC_BROKER_CONFIG (the TOML file, LOGLAKE_* environment or a
flag) and DEFAULT_CONFIG (built in). Only the settings in `DYNAMIC_KEYS` take the two dynamic
layers; the rest are described read-only and altering them is INVALID_CONFIG.

The dynamic layers are `broker_config` metadata records ({scope, configs}, replaced whole), so
they survive restarts: `BrokerConfigs.apply()` runs once at start-up (after the engine opened)
and again after every successful alter, and pushes each dynamic setting's effective value to
where it acts: the live `BrokerConfig` (max.connections, connections.max.idle.ms), the cleaner's
rate limiter, and the engine's topic defaults (every topic without its own override follows).

Which settings are dynamic, and why: those read afresh each time they act, so a new value takes
hold without a restart and without leaving state behind that the old value built:
max.connections (checked per new connection), connections.max.idle.ms (per read wait),
log.cleaner.io.max.bytes.per.second (the cleaner's token bucket; worker jobs take their share
per job), and the topic defaults that only time or size when work happens (retention, segment
roll, compaction timing, max.message.bytes — checked against the memory budget — and the
accepted-but-inert flush intervals). Listener, data directory, node id, WAL, memory and thread
settings shape structures built at start-up and stay static; so do the topic defaults that
change what produce accepts or how stored data is rewritten (cleanup policy, compression,
timestamp type, durability), which are per-topic decisions.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from loglake.broker.config import BrokerConfig
from loglake.engine import Engine
from loglake.engine.config import TOPIC_CONFIGS, ConfigType, EngineConfig
from loglake.errors import ConfigError, LoglakeError
from loglake.kafka_errors import ErrorCode

log = logging.getLogger("loglake.broker.config")


class ConfigResourceError(LoglakeError):
    """A config resource named wrongly (another broker's id, an empty group id)."""

    kafka_code = ErrorCode.INVALID_REQUEST


class ConfigPolicyError(LoglakeError):
    """A config change over a named limit."""

    kafka_code = ErrorCode.POLICY_VIOLATION


# ConfigSource (DescribeConfigsResponse.ConfigSource / synonym Source).
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
GROUP_CONFIG = 8
#: A rate at or above this is "no bound" (Kafka's log.cleaner.io.max.bytes.per.second default is Double.MAX_VALUE).
UNLIMITED_RATE = 2.0**63
#: The resource name of the cluster-wide default scope.
DEFAULT_SCOPE = ""
#: Topic configs whose broker-wide default (Kafka's broker synonym) is dynamic.
DYNAMIC_TOPIC_DEFAULTS = (
    "retention.ms", "retention.bytes", "segment.ms", "segment.bytes", "max.message.bytes",
    "delete.retention.ms", "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "max.compaction.lag.ms",
    "flush.messages", "flush.ms",
)
#: BrokerConfig fields with a Kafka name: (Kafka name, field, type, doc).
_BROKER_FIELDS: tuple[tuple[str, str, ConfigType, str], ...] = (
    ("auto.create.topics.enable", "auto_create_topics", ConfigType.BOOLEAN,
     "Create unknown topics on metadata requests and produce."),
    ("ssl.client.auth", "ssl_client_auth", ConfigType.STRING, "Whether SSL listeners ask for a client certificate."),
    ("ssl.principal.mapping.rules", "ssl_principal_mapping_rules", ConfigType.STRING,
     "How a client certificate's subject DN becomes the principal name."),
    ("num.partitions", "default_partitions", ConfigType.INT, "Partitions of auto-created topics and of CreateTopics with -1."),
    ("socket.request.max.bytes", "max_frame_bytes", ConfigType.INT, "Largest request accepted, in bytes."),
    ("queued.max.request.bytes", "queued_max_request_bytes", ConfigType.LONG,
     "Request bytes read and not yet handled, all connections; while spent, connections are not read."),
    ("max.connections", "max_connections", ConfigType.INT,
     "Most concurrent client connections; new ones beyond it are closed at once."),
    ("connections.max.idle.ms", "idle_timeout_ms", ConfigType.LONG, "Close connections idle this long."),
    ("group.initial.rebalance.delay.ms", "group_initial_rebalance_delay_ms", ConfigType.INT,
     "How long the first rebalance of a new classic group waits for more members."),
    ("group.min.session.timeout.ms", "group_min_session_timeout_ms", ConfigType.INT, "Smallest session timeout a classic member may ask for."),
    ("group.max.session.timeout.ms", "group_max_session_timeout_ms", ConfigType.INT, "Largest session timeout a classic member may ask for."),
    ("offsets.retention.minutes", "offsets_retention_minutes", ConfigType.INT,
     "Committed offsets of a group that stayed empty this long expire."),
    ("max.incremental.fetch.session.cache.slots", "max_incremental_fetch_session_cache_slots", ConfigType.INT,
     "Most incremental fetch sessions (KIP-227) the broker keeps."),
    ("min.incremental.fetch.session.eviction.ms", "min_incremental_fetch_session_eviction_ms", ConfigType.INT,
     "Fetch sessions idle this long are evicted; younger ones are not displaced by bigger ones."),
    ("group.consumer.session.timeout.ms", "group_consumer_session_timeout_ms", ConfigType.INT,
     "Session timeout of consumer-protocol (KIP-848) members."),
    ("group.consumer.min.session.timeout.ms", "group_consumer_min_session_timeout_ms", ConfigType.INT,
     "Smallest consumer.session.timeout.ms a group may set."),
    ("group.consumer.max.session.timeout.ms", "group_consumer_max_session_timeout_ms", ConfigType.INT,
     "Largest consumer.session.timeout.ms a group may set."),
    ("group.consumer.heartbeat.interval.ms", "group_consumer_heartbeat_interval_ms", ConfigType.INT,
     "Heartbeat interval given to consumer-protocol members."),
    ("group.consumer.min.heartbeat.interval.ms", "group_consumer_min_heartbeat_interval_ms", ConfigType.INT,
     "Smallest consumer.heartbeat.interval.ms a group may set."),
    ("group.consumer.max.heartbeat.interval.ms", "group_consumer_max_heartbeat_interval_ms", ConfigType.INT,
     "Largest consumer.heartbeat.interval.ms a group may set."),
    ("group.consumer.max.size", "group_consumer_max_size", ConfigType.INT, "Most members of a consumer-protocol group."),
    ("group.consumer.assignors", "group_consumer_assignors", ConfigType.LIST, "Server-side assignors; the first is the default."),
    ("group.consumer.migration.policy", "group_consumer_migration_policy", ConfigType.STRING,
     "Which empty groups may change between the classic and consumer protocols."),
    ("transaction.max.timeout.ms", "transaction_max_timeout_ms", ConfigType.INT, "Largest transaction.timeout.ms a producer may ask for."),
    ("transactional.id.expiration.ms", "transactional_id_expiration_ms", ConfigType.INT,
     "Transactional ids idle this long are forgotten."),
    ("transaction.abort.timed.out.transaction.cleanup.interval.ms", "transaction_abort_timed_out_transaction_cleanup_interval_ms",
     ConfigType.INT, "How often transactions past their timeout are aborted."),
)
#: EngineConfig fields with a Kafka name.
_ENGINE_FIELDS: tuple[tuple[str, str, ConfigType, str], ...] = (
    ("log.cleaner.io.max.bytes.per.second", "cleaner_io_max_bytes_per_second", ConfigType.LONG,
     "Cleaner and merger I/O, read plus written, in bytes per second (0 = unlimited)."),
    ("log.cleaner.threads", "cleaner_threads", ConfigType.INT, "Cleaner threads; 0 turns compaction and merging off."),
    ("log.cleaner.dedupe.buffer.size", "cleaner_dedupe_buffer_bytes", ConfigType.LONG, "Compaction's key map bound, in bytes."),
    ("log.cleaner.backoff.ms", "cleaner_backoff_ms", ConfigType.LONG, "Pause between cleaner passes that found nothing to do."),
)
#: Settings described with a null value (URLs may carry credentials).
_SENSITIVE = frozenset({"cold_store", "engine.cold_store_url", "engine.hot_store_url", "ssl_key_password"})
_BROKER_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(BrokerConfig)}
_ENGINE_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(EngineConfig) if f.default is not dataclasses.MISSING
}


@dataclass(frozen=True)
class DynamicKey:
    """A broker setting that may change at runtime: its Kafka name, type and accepted range."""

    name: str
    type: ConfigType
    low: float
    high: float | None = None
    #: The topic config it is the default of (None: a broker setting of its own).
    topic_config: str | None = None

    def parse(self, raw: str | None) -> str:
        """The normalized value, or ConfigError (INVALID_CONFIG)."""
        if raw is None:
            raise ConfigError(f"Null value not supported for broker config {self.name}")
        if self.topic_config is not None:
            try:
                TOPIC_CONFIGS[self.topic_config].parse(raw)
            except ConfigError as exc:
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: {exc}") from None
            return raw.strip()
        try:
            # Kafka's log.cleaner.io.max.bytes.per.second is a double: accept "1.5E7" and keep whole bytes.
            number = float(raw) if self.type is ConfigType.DOUBLE else int(raw)
        except ValueError:
            raise ConfigError(f"Invalid value {raw} for configuration {self.name}: not a number") from None
        if number != number or number < self.low or (self.high is not None and number > self.high):
            bound = "inf" if self.high is None else f"{self.high:g}"
            raise ConfigError(f"Invalid value {raw} for configuration {self.name}: must be in [{self.low:g}, {bound}]")
        if number >= UNLIMITED_RATE:
            return "0"  # Kafka's default, Double.MAX_VALUE, means no bound: loglake's 0
        return str(int(number))


DYNAMIC_KEYS: Mapping[str, DynamicKey] = {
    k.name: k
    for k in (
        DynamicKey("max.connections", ConfigType.INT, 1, 2**31 - 1),
        DynamicKey("connections.max.idle.ms", ConfigType.LONG, 1000),
        DynamicKey("log.cleaner.io.max.bytes.per.second", ConfigType.DOUBLE, 0),
        *(
            DynamicKey(TOPIC_CONFIGS[t].broker_synonym or t, TOPIC_CONFIGS[t].type, 0, topic_config=t)
            for t in DYNAMIC_TOPIC_DEFAULTS
        ),
    )
}


@dataclass(frozen=True)
class Setting:
    """One row of the broker's DescribeConfigs: name, static value and default, type, doc."""

    name: str
    static: str | None
    default: str | None
    type: ConfigType
    doc: str
    sensitive: bool = False

    @property
    def dynamic(self) -> bool:
        return self.name in DYNAMIC_KEYS


def config_entry(
    name: str, value: str | None, source: int, config_type: int, doc: str | None, *,
    read_only: bool, synonyms: list[dict[str, Any]], sensitive: bool = False,
) -> dict[str, Any]:
    """One DescribeConfigs entry (topic, broker and group resources alike)."""
    return {
        "name": name,
        "value": None if sensitive else value,
        "read_only": read_only,
        "is_default": source == DEFAULT_CONFIG,
        "config_source": source,
        "is_sensitive": sensitive,
        "synonyms": synonyms,
        "config_type": config_type,
        "documentation": doc,
    }


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _loglake_type(value: Any) -> ConfigType:
    if isinstance(value, bool):
        return ConfigType.BOOLEAN
    if isinstance(value, int):
        return ConfigType.LONG
    if isinstance(value, float):
        return ConfigType.DOUBLE
    return ConfigType.STRING


class BrokerConfigs:
    """The broker's settings with their dynamic layers; applies them where they act."""

    def __init__(
        self, config: BrokerConfig, engine: Engine, host_port: tuple[str, int, str, int], endpoints: tuple[str, str] | None = None
    ) -> None:
        self.config = config  # live: dynamic values are written into it
        self.engine = engine
        self.node = str(config.node_id)
        #: The static topic defaults (TOML [topic_defaults] and [engine] topic_defaults), before dynamic ones.
        self.static_topic_defaults = dict(engine.config.topic_defaults)
        self.settings = self._static_settings(dataclasses.replace(config), dataclasses.replace(engine.config), host_port, endpoints)
        self.stored: dict[str, dict[str, str]] = {}

    # ---- what the settings are -------------------------------------------------------------------

    def _static_settings(
        self, conf: BrokerConfig, econf: EngineConfig, host_port: tuple[str, int, str, int], endpoints: tuple[str, str] | None
    ) -> dict[str, Setting]:
        host, port, adv_host, adv_port = host_port
        listeners, advertised = endpoints or (f"PLAINTEXT://{host}:{port}", f"PLAINTEXT://{adv_host}:{adv_port}")
        node = str(conf.node_id)
        rows = [
            Setting("broker.id", node, "0", ConfigType.INT, "This broker's id (node_id)."),
            Setting("node.id", node, "0", ConfigType.INT, "This broker's id (node_id)."),
            Setting("log.dirs", self.engine.data_dir, None, ConfigType.STRING, "The data directory (--data-dir)."),
            Setting("listeners", listeners, None, ConfigType.STRING, "Where the broker listens."),
            Setting("advertised.listeners", advertised,
                    None if conf.advertised_listener else advertised,
                    ConfigType.STRING, "The address clients are told to connect to."),
            Setting("default.replication.factor", "1", "1", ConfigType.INT, "Always 1: loglake is a single broker."),
            Setting("offsets.topic.replication.factor", "1", "1", ConfigType.SHORT, "Always 1: loglake is a single broker."),
        ]
        named = {"node_id", "data_dir", "listen", "advertised_listener", "engine", "topic_defaults"}
        for kafka_name, attr, ctype, doc in _BROKER_FIELDS:
            named.add(attr)
            rows.append(Setting(kafka_name, _text(getattr(conf, attr)), _text(_BROKER_DEFAULTS[attr]), ctype, doc))
        engine_named = {"topic_defaults"}
        for kafka_name, attr, ctype, doc in _ENGINE_FIELDS:
            engine_named.add(attr)
            rows.append(Setting(kafka_name, _text(getattr(econf, attr)), _text(_ENGINE_DEFAULTS.get(attr)), ctype, doc))
        for name, key in TOPIC_CONFIGS.items():
            if key.broker_synonym is not None:
                rows.append(Setting(key.broker_synonym, self.static_topic_defaults.get(name, key.default), key.default,
                                    key.type, f"Default of topic config {name}: {key.doc}"))
        # loglake's own settings, by the names the TOML file uses
        for f in fields(BrokerConfig):
            if f.name not in named:
                rows.append(Setting(f.name, _text(getattr(conf, f.name)), _text(_BROKER_DEFAULTS[f.name]),
                                    _loglake_type(f.default), "loglake broker setting (TOML, LOGLAKE_* or flag).",
                                    sensitive=f.name in _SENSITIVE))
        for f in fields(EngineConfig):
            if f.name not in engine_named:
                name = f"engine.{f.name}"
                value = getattr(econf, f.name)
                rows.append(Setting(name, _text(value), _text(_ENGINE_DEFAULTS.get(f.name)), _loglake_type(value),
                                    "loglake engine setting (TOML [engine] table).", sensitive=name in _SENSITIVE))
        return {r.name: r for r in rows}

    def layers(self, name: str) -> list[tuple[int, str | None]]:
        """(source, value) of every layer `name` has, highest first; the first one is in effect."""
        out: list[tuple[int, str | None]] = []
        node_value = self.stored.get(self.node, {}).get(name)
        if node_value is not None:
            out.append((DYNAMIC_BROKER_CONFIG, node_value))
        default_value = self.stored.get(DEFAULT_SCOPE, {}).get(name)
        if default_value is not None:
            out.append((DYNAMIC_DEFAULT_BROKER_CONFIG, default_value))
        setting = self.settings[name]
        if setting.static != setting.default:
            out.append((STATIC_BROKER_CONFIG, setting.static))
        if setting.default is not None or not out:  # an unset optional setting: its default, null
            out.append((DEFAULT_CONFIG, setting.default))
        return out

    def topic_default_layers(self, topic_config: str) -> list[tuple[int, str, str | None]]:
        """(source, broker setting name, value) of a topic config's broker-wide default, highest first."""
        key = TOPIC_CONFIGS[topic_config]
        if key.broker_synonym is None:
            static = self.static_topic_defaults.get(topic_config)
            rows: list[tuple[int, str, str | None]] = []
            if static is not None:
                rows.append((STATIC_BROKER_CONFIG, topic_config, static))
            return [*rows, (DEFAULT_CONFIG, topic_config, key.default)]
        return [(source, key.broker_synonym, value) for source, value in self.layers(key.broker_synonym)]

    # ---- describing --------------------------------------------------------------------------------

    def describe(
        self, scope: str, keys: Iterable[str] | None, *, synonyms: bool, docs: bool
    ) -> list[dict[str, Any]]:
        """DescribeConfigs entries: this node's every setting, or ("") the cluster-wide dynamic defaults set."""
        self.check_scope(scope)
        wanted = None if keys is None else set(keys)
        out: list[dict[str, Any]] = []
        for name, setting in self.settings.items():
            if wanted is not None and name not in wanted:
                continue
            layers = self.layers(name)
            if scope == DEFAULT_SCOPE:
                layers = [layer for layer in layers if layer[0] == DYNAMIC_DEFAULT_BROKER_CONFIG]
                if not layers:
                    continue  # Kafka lists only the defaults that were set
            source, value = layers[0]
            out.append(config_entry(
                name, value, source, setting.type, setting.doc if docs else None, read_only=not setting.dynamic,
                synonyms=[{"name": name, "value": None if setting.sensitive else v, "source": s} for s, v in layers]
                if synonyms else [],
                sensitive=setting.sensitive,
            ))
        return out

    def check_scope(self, scope: str) -> None:
        if scope not in (DEFAULT_SCOPE, self.node):
            raise ConfigResourceError(f"Unexpected broker id, expected {self.node} or empty string, but received {scope}"
            )

    # ---- altering ----------------------------------------------------------------------------------

    def check_name(self, name: str) -> DynamicKey:
        key = DYNAMIC_KEYS.get(name)
        if key is not None:
            return key
        if name in self.settings:
            raise ConfigError(f"Cannot update these configs dynamically: {name} (restart with it in "
                             f"the config file, environment or flags; dynamic: {', '.join(DYNAMIC_KEYS)})")
        raise ConfigError(f"Unknown broker config: {name}")

    def alter(self, scope: str, new: dict[str, str], *, validate_only: bool) -> None:
        """Replace `scope`'s dynamic configs with `new` (already checked by name and value), durably."""
        self.check_scope(scope)
        stored = {**self.stored, scope: new}
        self.engine.config.check_topic_defaults(self._topic_defaults(stored))
        if validate_only:
            return
        self.engine.save_dynamic_configs("broker", scope, new)
        self.stored = {k: v for k, v in stored.items() if v}
        self.apply()
        log.info("dynamic broker configs of %s now %s", repr(scope) if scope == DEFAULT_SCOPE else f"node {scope}", new)

    def current(self, scope: str) -> dict[str, str]:
        return dict(self.stored.get(scope, {}))

    # ---- applying ----------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the stored dynamic configs and apply them (start-up). A stored value this broker can
        no longer take (say, max.message.bytes over a smaller memory budget) is skipped with a log line."""
        self.stored = self.engine.dynamic_configs("broker")
        for scope, configs in list(self.stored.items()):
            for name in list(configs):
                if name not in DYNAMIC_KEYS:
                    log.warning("ignoring stored dynamic broker config %s of scope %r: not dynamic in this release", name, scope)
                    del configs[name]
        try:
            self.engine.config.check_topic_defaults(self._topic_defaults(self.stored))
        except ConfigError as exc:
            log.warning("ignoring stored dynamic topic defaults: %s", exc)
            for configs in self.stored.values():
                for key in DYNAMIC_KEYS.values():
                    if key.topic_config is not None:
                        configs.pop(key.name, None)
        self.apply()
        if self.stored:
            log.info("dynamic broker configs applied: %s", self.stored)

    def effective(self, name: str) -> str | None:
        return self.layers(name)[0][1]

    def _topic_defaults(self, stored: dict[str, dict[str, str]]) -> dict[str, str]:
        defaults = dict(self.static_topic_defaults)
        for key in DYNAMIC_KEYS.values():
            if key.topic_config is None:
                continue
            value = stored.get(self.node, {}).get(key.name, stored.get(DEFAULT_SCOPE, {}).get(key.name))
            if value is not None:
                defaults[key.topic_config] = value
        return defaults

    def apply(self) -> None:
        """Push every dynamic setting's effective value to where it acts."""
        appliers: dict[str, Callable[[str], None]] = {
            "max.connections": lambda v: setattr(self.config, "max_connections", int(v)),
            "connections.max.idle.ms": lambda v: setattr(self.config, "idle_timeout_ms", int(v)),
            "log.cleaner.io.max.bytes.per.second": lambda v: self.engine.set_cleaner_io_rate(int(v)),
        }
        for name, fn in appliers.items():
            value = self.effective(name)
            if value is not None:
                fn(value)
        defaults = self._topic_defaults(self.stored)
        if defaults != self.engine.config.topic_defaults:
            self.engine.set_topic_defaults(defaults)
