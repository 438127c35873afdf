"""Broker settings: command-line flags, a TOML file (`--config`) and LOGLAKE_* environment variables.

Precedence: flags > environment > TOML file > defaults. Engine options go in the TOML table
`[engine]` (EngineConfig field names) and topic defaults in `[topic_defaults]` (Kafka names).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from loglake.errors import ConfigError

if TYPE_CHECKING:
    from loglake.broker.groups.limits import ConsumerLimits

#: Largest request frame accepted; Kafka's socket.request.max.bytes default is 100 MiB.
MAX_FRAME_BYTES_DEFAULT = 100 * 1024 * 1024
#: Requests one connection may have in flight before the server stops reading from it.
MAX_INFLIGHT_PER_CONNECTION_DEFAULT = 64
#: Connections idle this long are closed (Kafka's connections.max.idle.ms default is 10 min).
IDLE_TIMEOUT_MS_DEFAULT = 600_000
#: Most concurrent connections; beyond this new ones are closed at once with a log line.
MAX_CONNECTIONS_DEFAULT = 10_000


def parse_host_port(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{what} must be HOST:PORT, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    number = int(port)
    if not 0 <= number <= 65535:
        raise ConfigError(f"{what}: port {number} out of range")
    return host, number


@dataclass
class BrokerConfig:
    data_dir: str = "./loglake-data"
    cold_store: str | None = None
    listen: str = "127.0.0.1:9092"
    advertised_listener: str | None = None
    port_file: str | None = None
    metrics_listen: str | None = None
    node_id: int = 0
    auto_create_topics: bool = True
    default_partitions: int = 1
    max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT
    max_inflight_per_connection: int = MAX_INFLIGHT_PER_CONNECTION_DEFAULT
    idle_timeout_ms: int = IDLE_TIMEOUT_MS_DEFAULT
    max_connections: int = MAX_CONNECTIONS_DEFAULT
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    #: Kafka's offsets.retention.minutes: committed offsets of a group that stayed Empty this long expire.
    offsets_retention_minutes: int = 10080
    #: KIP-848 consumer groups (Kafka's group.consumer.* names with "_" for "."); see docs/GROUPS.md.
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_min_session_timeout_ms: int = 45_000
    group_consumer_max_session_timeout_ms: int = 60_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_min_heartbeat_interval_ms: int = 5_000
    group_consumer_max_heartbeat_interval_ms: int = 15_000
    group_consumer_max_size: int = 1000
    #: Comma-separated server-side assignors ("uniform", "range"); the first is the default.
    group_consumer_assignors: str = "uniform,range"
    #: "disabled" | "upgrade" | "downgrade" | "bidirectional": which Empty groups may change protocol.
    group_consumer_migration_policy: str = "bidirectional"
    engine: dict[str, Any] = field(default_factory=dict)
    topic_defaults: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        parse_host_port(self.listen, "--listen")
        if self.advertised_listener:
            parse_host_port(self.advertised_listener, "--advertised-listener")
        if self.metrics_listen:
            parse_host_port(self.metrics_listen, "--metrics-listen")
        if not 1 <= self.default_partitions <= 10_000:
            raise ConfigError("default_partitions must be in [1, 10000]")
        if self.max_frame_bytes < 1024 * 1024:
            raise ConfigError("max_frame_bytes must be at least 1 MiB")
        if self.max_inflight_per_connection < 1:
            raise ConfigError("max_inflight_per_connection must be at least 1")
        if self.offsets_retention_minutes < 1:
            raise ConfigError("offsets_retention_minutes (Kafka's offsets.retention.minutes) must be at least 1")
        try:
            self.consumer_group_limits().check()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def consumer_group_limits(self) -> ConsumerLimits:
        """The `group.consumer.*` settings as the coordinator's ConsumerLimits."""
        from loglake.broker.groups.limits import ConsumerLimits

        assignors = self.group_consumer_assignors
        names = [a.strip() for a in assignors.split(",")] if isinstance(assignors, str) else list(assignors)
        return ConsumerLimits(
            session_timeout_ms=self.group_consumer_session_timeout_ms,
            min_session_timeout_ms=self.group_consumer_min_session_timeout_ms,
            max_session_timeout_ms=self.group_consumer_max_session_timeout_ms,
            heartbeat_interval_ms=self.group_consumer_heartbeat_interval_ms,
            min_heartbeat_interval_ms=self.group_consumer_min_heartbeat_interval_ms,
            max_heartbeat_interval_ms=self.group_consumer_max_heartbeat_interval_ms,
            max_size=self.group_consumer_max_size,
            assignors=tuple(n for n in names if n),
            migration_policy=self.group_consumer_migration_policy,
        )

    @classmethod
    def load(cls, config_file: str | None = None, env: dict[str, str] | None = None, **flags: Any) -> BrokerConfig:
        values: dict[str, Any] = {}
        names = {f.name: f for f in fields(cls)}
        if config_file:
            try:
                with open(config_file, "rb") as fh:
                    raw = tomllib.load(fh)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"cannot read config file {config_file}: {exc}") from None
            for key, value in raw.items():
                name = key.replace("-", "_").replace(".", "_")
                if name not in names:
                    raise ConfigError(f"{config_file}: unknown setting {key!r}")
                values[name] = value
        environ = os.environ if env is None else env
        for name, f in names.items():
            raw_env = environ.get(f"LOGLAKE_{name.upper()}")
            if raw_env is None or name in ("engine", "topic_defaults"):
                continue
            values[name] = _coerce(name, raw_env, f.default)
        values.update({k: v for k, v in flags.items() if v is not None})
        config = cls(**values)
        config.validate()
        return config


def _coerce(name: str, raw: str, default: Any) -> Any:
    if isinstance(default, bool):
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"LOGLAKE_{name.upper()}={raw!r}: expected true/false")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"LOGLAKE_{name.upper()}={raw!r}: expected an integer") from None
    return raw
