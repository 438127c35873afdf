"""Dynamic broker configs: Kafka's BROKER config resource, changed at runtime and kept in the metadata log.

Theory of operation
-------------------
A broker setting has up to four layers, highest first, as Kafka's: DYNAMIC_BROKER_CONFIG (set on
the resource named by this node id), DYNAMIC_DEFAULT_BROKER_CONFIG (set on the resource named
"", the cluster-wide default), STATIC_BROKER_CONFIG (the TOML file, LOGLAKE_* environment or a
flag) and DEFAULT_CONFIG (built in). Which settings there are, their Kafka names, types, defaults,
bounds and documentation, and which are dynamic, is the table `loglake.broker.settings.BROKER_SETTINGS`
(with `DYNAMIC_TOPIC_DEFAULTS` for the topic defaults); `DYNAMIC_KEYS` is derived from it. Only those
take the two dynamic layers and act; the rest are described read-only and altering them is
INVALID_CONFIG. Kafka's other broker configs (`loglake.broker.kafka_broker_configs`, through
`settings.KAFKA_ONLY`) are described with Kafka's default; those Kafka can change at runtime
(`INERT_KEYS`) take the dynamic layers too, stored and described back with no effect ("accepted,
no effect here"), and Kafka's read-only ones are refused as Kafka refuses them.

The dynamic layers are `broker_config` metadata records ({scope, configs}, replaced whole), so
they survive restarts: `BrokerConfigs.apply()` runs once at start-up (after the engine opened),
again after every successful alter, and again whenever another broker of a cluster records a
change of the cluster-wide defaults (`load` again, following `ConfigStore.follow_brokers`), and
pushes each dynamic setting's effective value to where it acts: the live `BrokerConfig` (max.connections, connections.max.idle.ms: a broker setting
made dynamic must be read where it acts, never copied at start-up), the cleaner's rate limiter
(`_ENGINE_APPLIERS`), and the engine's topic defaults (every topic without its own override follows).

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
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields

from loglake.broker.config import BrokerConfig
from loglake.broker.config_store import ConfigStore
from loglake.broker.kafka_broker_configs import READ_ONLY, KafkaBrokerConfig
from loglake.broker.settings import (
    BROKER_SETTINGS,
    DYNAMIC_TOPIC_DEFAULTS,
    INERT_DYNAMIC,
    KAFKA_ONLY,
    NOT_SETTINGS,
    BrokerSetting,
    Dynamic,
)
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
#: Engine settings shown with a null value (URLs may carry credentials); broker ones say so in their row.
_SENSITIVE_ENGINE_SETTINGS = frozenset({"cold_store_url", "hot_store_url"})
_ENGINE_DEFAULTS: dict[str, object] = {
    f.name: f.default for f in fields(EngineConfig) if f.default is not dataclasses.MISSING
}
#: How a dynamic engine setting reaches the running engine, by EngineConfig field.
_ENGINE_APPLIERS: Mapping[str, Callable[[Engine, int], None]] = {
    "cleaner_io_max_bytes_per_second": Engine.set_cleaner_io_rate,
}
#: DescribeConfigs rows of no setting: loglake keeps one replica of everything.
_FIXED: tuple[tuple[str, ConfigType], ...] = (
    ("default.replication.factor", ConfigType.INT),
    ("offsets.topic.replication.factor", ConfigType.SHORT),
)


@dataclass(frozen=True)
class DynamicKey:
    """A broker config AlterConfigs may change at runtime: a dynamic row of the table (`setting`),
    or the broker-wide default of a topic config (`topic_config`)."""

    name: str
    type: ConfigType
    dynamic: Dynamic
    setting: BrokerSetting | None = None
    #: The topic config it is the default of (None: a setting of the table).
    topic_config: str | None = None
    #: A Kafka broker config loglake does not act on: stored and described, no effect.
    inert: KafkaBrokerConfig | None = None

    def check_scope(self, scope: str) -> None:
        """ConfigError unless it may be set on `scope` (a per-broker setting only on a node id, as Kafka's)."""
        if self.dynamic is Dynamic.PER_BROKER and scope == DEFAULT_SCOPE:
            raise ConfigError(f"Cannot update these configs at default cluster level, broker id must be specified: {self.name}")

    def parse(self, raw: str | None, engine: EngineConfig) -> str:
        """The normalized value, or ConfigError (INVALID_CONFIG). A row's bounds are the table's;
        an engine setting's are the engine's (`EngineConfig.validate` of `engine` with the value)."""
        if raw is None:
            raise ConfigError(f"Null value not supported for broker config {self.name}")
        if self.inert is not None:
            return _kafka_value(self.name, self.type, raw)
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
        if number != number:
            raise ConfigError(f"Invalid value {raw} for configuration {self.name}: not a number")
        if self.type is ConfigType.DOUBLE and number >= UNLIMITED_RATE:
            number = 0  # Kafka's default, Double.MAX_VALUE, means no bound: loglake's 0
        value = int(number)
        setting = self.setting
        if setting is not None and setting.engine_field is not None:
            candidate = dataclasses.replace(engine)
            setattr(candidate, setting.engine_field, value)
            try:
                candidate.validate()
            except ConfigError as exc:
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: {exc}") from None
        elif setting is not None and not setting.in_bounds(value):
            raise ConfigError(f"Invalid value {raw} for configuration {self.name}: must be in {setting.allowed()}")
        return str(value)


DYNAMIC_KEYS: Mapping[str, DynamicKey] = {
    k.name: k
    for k in (
        *(
            DynamicKey(s.described_as, s.type, s.dynamic, setting=s)
            for s in BROKER_SETTINGS.values()
            if s.dynamic is not Dynamic.READ_ONLY
        ),
        *(
            DynamicKey(TOPIC_CONFIGS[t].broker_synonym or t, TOPIC_CONFIGS[t].type, Dynamic.CLUSTER_WIDE, topic_config=t)
            for t in DYNAMIC_TOPIC_DEFAULTS
        ),
    )
}


#: Kafka broker configs loglake accepts at runtime without acting on them (`settings.INERT_DYNAMIC`).
INERT_KEYS: Mapping[str, DynamicKey] = {
    name: DynamicKey(name, k.type, Dynamic(k.mode), inert=k) for name, k in INERT_DYNAMIC.items()
}
#: What DescribeConfigs says of a Kafka broker config loglake does not act on.
INERT_DOC = "Kafka broker config: accepted and stored, no effect here."
READ_ONLY_KAFKA_DOC = "Kafka broker config: no effect here (read-only, as in Kafka)."
_INT_RANGES = {
    ConfigType.SHORT: (-(2**15), 2**15 - 1), ConfigType.INT: (-(2**31), 2**31 - 1), ConfigType.LONG: (-(2**63), 2**63 - 1),
}


def _kafka_value(name: str, ctype: ConfigType, raw: str) -> str:
    """`raw` checked against a Kafka config type (Kafka's ConfigDef parsing, without its validators)."""
    text = raw.strip()
    if ctype is ConfigType.BOOLEAN:
        if text.lower() not in ("true", "false"):
            raise ConfigError(f"Invalid value {raw} for configuration {name}: Expected value to be either true or false")
        return text.lower()
    if ctype in _INT_RANGES:
        low, high = _INT_RANGES[ctype]
        try:
            number = int(text)
        except ValueError:
            raise ConfigError(f"Invalid value {raw} for configuration {name}: Not a number of type {ctype.name}") from None
        if not low <= number <= high:
            raise ConfigError(f"Invalid value {raw} for configuration {name}: Not a number of type {ctype.name}")
        return str(number)
    if ctype is ConfigType.DOUBLE:
        try:
            double = float(text)
        except ValueError:
            double = float("nan")
        if double != double:
            raise ConfigError(f"Invalid value {raw} for configuration {name}: Not a number of type DOUBLE")
        return text
    return text


def key_of(name: str) -> DynamicKey | None:
    """The dynamic key of a broker config AlterConfigs takes, acting or inert; None for any other."""
    return DYNAMIC_KEYS.get(name) or INERT_KEYS.get(name)


def shown(configs: Mapping[str, str]) -> dict[str, str]:
    """`configs` for a log line: a password-typed value is never written out."""
    return {n: "[hidden]" if (k := key_of(n)) is not None and k.type is ConfigType.PASSWORD else v for n, v in configs.items()}


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
        return key_of(self.name) is not None


def config_entry(
    name: str, value: str | None, source: int, config_type: int, doc: str | None, *,
    read_only: bool, synonyms: list[dict[str, object]], sensitive: bool = False,
) -> dict[str, object]:
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


def _text(value: object, separator: str = ",") -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return separator.join(str(v) for v in value)
    return str(value)


def _loglake_type(value: object) -> ConfigType:
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
        #: where the dynamic layers are kept (`broker_config` records)
        self.records = ConfigStore.of(engine)
        self.node = str(config.node_id)
        #: The static topic defaults (TOML [topic_defaults] and [engine] topic_defaults), before dynamic ones.
        self.static_topic_defaults = dict(engine.config.topic_defaults)
        self.settings = self._static_settings(dataclasses.replace(config), dataclasses.replace(engine.config), host_port, endpoints)
        self.stored: dict[str, dict[str, str]] = {}
        # `stored` and what `apply` pushed: an alter here and a reload (another broker's change)
        # run on worker threads at once.
        self._lock = threading.Lock()

    # ---- what the settings are -------------------------------------------------------------------

    def _static_settings(
        self, conf: BrokerConfig, econf: EngineConfig, host_port: tuple[str, int, str, int], endpoints: tuple[str, str] | None
    ) -> dict[str, Setting]:
        host, port, adv_host, adv_port = host_port
        listeners, advertised = endpoints or (f"PLAINTEXT://{host}:{port}", f"PLAINTEXT://{adv_host}:{adv_port}")
        # What the running broker resolved rather than read (an absolute path, bound ports):
        # (value, default); the unset advertised listeners are the listeners, as Kafka's default.
        resolved: dict[str, tuple[str | None, str | None]] = {
            "data_dir": (self.engine.data_dir, None),
            "listen": (listeners, None),
            "advertised_listener": (advertised, None if conf.advertised_listener else advertised),
        }
        rows: list[Setting] = []
        for setting in BROKER_SETTINGS.values():
            if setting.name in resolved:
                value, default = resolved[setting.name]
            else:
                efield = setting.engine_field
                value = _text(getattr(econf, efield) if efield is not None else getattr(conf, setting.name), setting.separator)
                default = _text(setting.default, setting.separator)
            for name in (*setting.aliases, setting.described_as):
                rows.append(Setting(name, value, default, setting.type, setting.doc, sensitive=setting.sensitive))
        rows += [Setting(name, "1", "1", ctype, "Always 1: loglake keeps a single replica.") for name, ctype in _FIXED]
        for name, key in TOPIC_CONFIGS.items():
            if key.broker_synonym is not None:
                rows.append(Setting(key.broker_synonym, self.static_topic_defaults.get(name, key.default), key.default,
                                    key.type, f"Default of topic config {name}: {key.doc}"))
        described = {r.name for r in rows}
        for name, kafka in KAFKA_ONLY.items():
            if name not in described:
                rows.append(Setting(name, kafka.default, kafka.default, kafka.type,
                                    READ_ONLY_KAFKA_DOC if kafka.mode == READ_ONLY else INERT_DOC,
                                    sensitive=kafka.type is ConfigType.PASSWORD))
        # the engine's other settings, by the names the TOML file's [engine] table uses
        for f in fields(EngineConfig):
            name = f"engine.{f.name}"
            if f.name not in NOT_SETTINGS and name not in BROKER_SETTINGS:
                value = getattr(econf, f.name)
                rows.append(Setting(name, _text(value), _text(_ENGINE_DEFAULTS.get(f.name)), _loglake_type(value),
                                    "loglake engine setting (TOML [engine] table).",
                                    sensitive=f.name in _SENSITIVE_ENGINE_SETTINGS))
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
    ) -> list[dict[str, object]]:
        """DescribeConfigs entries: this node's every setting, or ("") the cluster-wide dynamic defaults set."""
        self.check_scope(scope)
        wanted = None if keys is None else set(keys)
        out: list[dict[str, object]] = []
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

    def parse(self, scope: str, name: str, raw: str | None) -> str:
        """The normalized value of `name` set on `scope`, or ConfigError (INVALID_CONFIG): unknown,
        read-only, per-broker on the cluster-wide scope, or a bad value."""
        key = self.check_name(name)
        key.check_scope(scope)
        return key.parse(raw, self.engine.config)

    def check_name(self, name: str) -> DynamicKey:
        key = key_of(name)
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
        with self._lock:
            self.records.save_broker_configs(scope, new)
            self.stored = {k: v for k, v in {**self.stored, scope: new}.items() if v}
            self.apply()
        log.info("dynamic broker configs of %s now %s", repr(scope) if scope == DEFAULT_SCOPE else f"node {scope}", shown(new))

    def current(self, scope: str) -> dict[str, str]:
        return dict(self.stored.get(scope, {}))

    # ---- applying ----------------------------------------------------------------------------------

    def concerns(self, scope: str) -> bool:
        """Whether the dynamic configs of `scope` are layers of this broker's settings."""
        return scope in (DEFAULT_SCOPE, self.node)

    def load(self) -> None:
        """Read the stored dynamic configs and apply them: at start-up, and again whenever a
        `broker_config` record of a scope this broker takes is applied (in cluster mode another
        broker may have recorded it: `ConfigStore.follow_brokers`). A stored value this broker can
        no longer take (say, max.message.bytes over a smaller memory budget, or a value out of this
        release's bounds) is skipped with a log line."""
        with self._lock:
            before = self.stored
            self._load()
            if self.stored and self.stored != before:
                log.info("dynamic broker configs applied: %s", {scope: shown(c) for scope, c in self.stored.items()})

    def _load(self) -> None:
        self.stored = {scope: c for scope, c in self.records.broker_configs().items() if self.concerns(scope)}
        for scope, configs in list(self.stored.items()):
            for name, value in list(configs.items()):
                key = key_of(name)
                if key is None:
                    log.warning("ignoring stored dynamic broker config %s of scope %r: not dynamic in this release", name, scope)
                    del configs[name]
                    continue
                try:
                    key.check_scope(scope)
                    key.parse(value, self.engine.config)
                except ConfigError as exc:
                    log.warning("ignoring stored dynamic broker config %s of scope %r: %s", name, scope, exc)
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
        for key in DYNAMIC_KEYS.values():
            setting = key.setting
            value = None if setting is None else self.effective(key.name)
            if setting is None or value is None:
                continue  # topic defaults: below, all at once
            if setting.engine_field is None:
                setattr(self.config, setting.name, int(value))
            else:
                _ENGINE_APPLIERS[setting.engine_field](self.engine, int(value))
        defaults = self._topic_defaults(self.stored)
        if defaults != self.engine.config.topic_defaults:
            self.engine.set_topic_defaults(defaults)
