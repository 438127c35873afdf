"""Group configs: Kafka 4.0's GROUP config resource (DescribeConfigs / AlterConfigs /
IncrementalAlterConfigs with resource type 32), per consumer group, kept in the metadata log.

Two configs, by Kafka's names (KIP-848's GroupConfig): `consumer.session.timeout.ms` and
`consumer.heartbeat.interval.ms`. A group without an override takes the broker's
`group.consumer.session.timeout.ms` / `group.consumer.heartbeat.interval.ms`. A value must lie in
the broker's [min, max] bounds for it, and the session timeout must exceed the heartbeat interval
(both after merging with the defaults), as Kafka's GroupConfig.validate checks; the messages are
Kafka's. Of the share-group configs (`share.*`, KIP-932) `share.auto.offset.reset` ("latest", the
default, or "earliest") and `share.isolation.level` ("read_uncommitted", the default, or
"read_committed") are taken (the share coordinator reads them with `share_config`), and the
numbers `share.record.lock.duration.ms` (Kafka 4.0's group config), `share.delivery.count.limit`
and `share.partition.max.record.locks` (KIP-1240's): a group without its own takes the broker's `group.share.*` setting, and a value must
lie in that setting's range (BROKER_SETTINGS: loglake has no separate min/max settings for them);
and `share.session.timeout.ms` / `share.heartbeat.interval.ms` (Kafka 4.0's), which default to the
broker's `group.share.session.timeout.ms` / `group.share.heartbeat.interval.ms` and must lie in
its `group.share.min/max.session.timeout.ms` / `group.share.min/max.heartbeat.interval.ms`, the
session timeout above the heartbeat interval (`validate_share`, Kafka's messages). The share
coordinator reads all five with `share_limits`. The other share configs are unknown here.

Configs are independent of a group's offsets and membership: a group may carry them before it
exists, and DeleteGroups leaves them (Kafka keeps them in the controller's metadata, which
deleting a group does not touch), so a group id that comes back finds its configs. At most
`GROUP_CONFIGS_MAX` groups carry configs; setting one on a further group is POLICY_VIOLATION.

`GroupConfigStore.overrides(group_id)` is what the KIP-848 coordinator reads (its
`group_overrides`): only the values set explicitly, as ints.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from loglake.broker.config import BrokerConfig
from loglake.broker.config_store import ConfigStore
from loglake.broker.dynamic_config import (
    DEFAULT_CONFIG,
    GROUP_CONFIG,
    STATIC_BROKER_CONFIG,
    ConfigPolicyError,
    ConfigResourceError,
    config_entry,
)
from loglake.broker.groups.limits import ConsumerLimits
from loglake.broker.settings import BROKER_SETTINGS, BrokerSetting
from loglake.broker.share.limits import GroupShareLimits, ShareLimits
from loglake.engine.config import ConfigType
from loglake.errors import ConfigError

log = logging.getLogger("loglake.broker.groups")

#: Most groups that can carry dynamic configs (each is a metadata record and a checkpoint entry).
GROUP_CONFIGS_MAX = 10_000
#: Longest group id a config can be set on (the metadata record stays small).
GROUP_ID_CHARS_MAX = 1_000

SESSION_TIMEOUT = "consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "consumer.heartbeat.interval.ms"
GROUP_CONFIG_NAMES = (SESSION_TIMEOUT, HEARTBEAT_INTERVAL)
SHARE_AUTO_OFFSET_RESET = "share.auto.offset.reset"
SHARE_ISOLATION_LEVEL = "share.isolation.level"
#: String-valued share-group configs -> the values they take (the first is the default).
SHARE_CONFIGS: dict[str, tuple[str, ...]] = {
    SHARE_AUTO_OFFSET_RESET: ("latest", "earliest"),
    SHARE_ISOLATION_LEVEL: ("read_uncommitted", "read_committed"),
}
SHARE_RECORD_LOCK_DURATION = "share.record.lock.duration.ms"
SHARE_DELIVERY_COUNT_LIMIT = "share.delivery.count.limit"
SHARE_PARTITION_MAX_RECORD_LOCKS = "share.partition.max.record.locks"
#: Int-valued share-group configs -> the broker setting (BROKER_SETTINGS row) giving their default and range.
SHARE_INT_CONFIGS: dict[str, str] = {
    SHARE_RECORD_LOCK_DURATION: "group_share_record_lock_duration_ms",
    SHARE_DELIVERY_COUNT_LIMIT: "group_share_delivery_count_limit",
    SHARE_PARTITION_MAX_RECORD_LOCKS: "group_share_partition_max_record_locks",
}
SHARE_SESSION_TIMEOUT = "share.session.timeout.ms"
SHARE_HEARTBEAT_INTERVAL = "share.heartbeat.interval.ms"
#: A share group's membership timings (Kafka 4.0's group configs) -> the broker setting giving
#: their default; their range is the broker's group.share.min/max.* settings (`validate_share`).
SHARE_TIMING_CONFIGS: dict[str, str] = {
    SHARE_SESSION_TIMEOUT: "group_share_session_timeout_ms",
    SHARE_HEARTBEAT_INTERVAL: "group_share_heartbeat_interval_ms",
}

_DOCS = {
    SESSION_TIMEOUT: "The timeout to detect client failures when using the consumer group protocol.",
    HEARTBEAT_INTERVAL: "The heartbeat interval given to the members of a consumer group.",
    SHARE_AUTO_OFFSET_RESET: "Where a share group starts reading a partition it has no state for: latest or earliest.",
    SHARE_ISOLATION_LEVEL: "Whether a share group reads records of open and aborted transactions (read_uncommitted) or not.",
    SHARE_RECORD_LOCK_DURATION: "How long a member of the share group holds the records it acquired.",
    SHARE_DELIVERY_COUNT_LIMIT: "Deliveries of a record before the share group archives it.",
    SHARE_PARTITION_MAX_RECORD_LOCKS: "Records of one partition the share group holds in flight at most.",
    SHARE_SESSION_TIMEOUT: "The timeout to detect client failures when using the share group protocol.",
    SHARE_HEARTBEAT_INTERVAL: "The heartbeat interval given to the members of a share group.",
}


def share_setting(name: str) -> BrokerSetting:
    """The broker setting an int-valued share-group config defaults to and is bounded by."""
    return BROKER_SETTINGS[SHARE_INT_CONFIGS[name]]


def parse_share_int(name: str, raw: str | None) -> int:
    """An int-valued share config's value (ConfigError, Kafka's Range wording, outside its setting's range)."""
    setting = share_setting(name)
    try:
        value = int((raw or "").strip())
    except ValueError:
        raise ConfigError(f"Invalid value {raw} for configuration {name}: Not a number of type INT") from None
    if not setting.in_bounds(value):
        raise ConfigError(
            f"Invalid value {raw} for configuration {name}: Value must be in {setting.allowed()} "
            f"(the range of {setting.described_as})"
        )
    return value


#: The broker settings group configs default to and are validated against: the KIP-848
#: coordinator's own `ConsumerLimits` (Kafka's `group.consumer.*` settings and defaults).
GroupConfigBounds = ConsumerLimits
KAFKA_BOUNDS = ConsumerLimits()


def default_value(bounds: ConsumerLimits, name: str) -> int:
    """The broker-level value a group without its own `name` gets."""
    return bounds.session_timeout_ms if name == SESSION_TIMEOUT else bounds.heartbeat_interval_ms


def group_config_bounds(config: BrokerConfig) -> ConsumerLimits:
    """The bounds from the broker's KIP-848 settings (`BrokerConfig.consumer_group_limits`)."""
    return config.consumer_group_limits()


def _check_timing(
    session: int, heartbeat: int, bounds: GroupConfigBounds | ShareLimits, names: tuple[str, str], kind: str
) -> None:
    """ConfigError unless a group's session timeout and heartbeat interval fit the broker's
    group.<kind>.min/max.* settings and each other (Kafka's GroupConfig messages)."""
    session_name, heartbeat_name = names
    checks = (
        (heartbeat < bounds.min_heartbeat_interval_ms,
         f"{heartbeat_name} must be greater than or equal to group.{kind}.min.heartbeat.interval.ms"),
        (heartbeat > bounds.max_heartbeat_interval_ms,
         f"{heartbeat_name} must be less than or equal to group.{kind}.max.heartbeat.interval.ms"),
        (session < bounds.min_session_timeout_ms,
         f"{session_name} must be greater than or equal to group.{kind}.min.session.timeout.ms"),
        (session > bounds.max_session_timeout_ms,
         f"{session_name} must be less than or equal to group.{kind}.max.session.timeout.ms"),
        (session <= heartbeat, f"{session_name} must be greater than {heartbeat_name}"),
    )
    for failed, message in checks:
        if failed:
            raise ConfigError(message)


def validate(values: dict[str, int], bounds: GroupConfigBounds) -> None:
    """ConfigError (INVALID_CONFIG) unless the merged values fit the bounds (Kafka's messages)."""
    session = values.get(SESSION_TIMEOUT, bounds.session_timeout_ms)
    heartbeat = values.get(HEARTBEAT_INTERVAL, bounds.heartbeat_interval_ms)
    _check_timing(session, heartbeat, bounds, (SESSION_TIMEOUT, HEARTBEAT_INTERVAL), "consumer")


def validate_share(values: dict[str, int], limits: ShareLimits) -> None:
    """ConfigError (INVALID_CONFIG) unless a share group's merged session timeout and heartbeat
    interval fit the broker's group.share.min/max.* settings and each other (Kafka's messages)."""
    session = values.get(SHARE_SESSION_TIMEOUT, limits.session_timeout_ms)
    heartbeat = values.get(SHARE_HEARTBEAT_INTERVAL, limits.heartbeat_interval_ms)
    _check_timing(session, heartbeat, limits, (SHARE_SESSION_TIMEOUT, SHARE_HEARTBEAT_INTERVAL), "share")


def parse_value(name: str, raw: str | None) -> int:
    if name not in GROUP_CONFIG_NAMES and name not in SHARE_TIMING_CONFIGS:
        raise ConfigError(f"Unknown group config name: {name}")
    if raw is None:
        raise ConfigError(f"Null value not supported for group configs: {name}")
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"Invalid value {raw} for configuration {name}: Not a number of type INT") from None
    if not 1 <= value <= 2**31 - 1:
        raise ConfigError(f"Invalid value {raw} for configuration {name}: Value must be at least 1")
    return value


def canonical_value(name: str, raw: str | None) -> str:
    """The value of any group config as stored (ConfigError if it is not one, or not valid)."""
    if name in SHARE_INT_CONFIGS:
        return str(parse_share_int(name, raw))
    if name in SHARE_TIMING_CONFIGS:
        return str(parse_value(name, raw))
    return parse_share_value(name, raw) if name in SHARE_CONFIGS else str(parse_value(name, raw))


def parse_share_value(name: str, raw: str | None) -> str:
    allowed = SHARE_CONFIGS[name]
    value = (raw or "").strip().lower()
    if value not in allowed:
        raise ConfigError(f"Invalid value {raw} for configuration {name}: String must be one of: {', '.join(allowed)}")
    return value


class GroupConfigStore:
    """Per-group config overrides: validated, persisted as `group_config` records, read by the coordinator."""

    def __init__(
        self, records: ConfigStore, bounds: Callable[[], GroupConfigBounds] = lambda: KAFKA_BOUNDS,
        max_groups: int = GROUP_CONFIGS_MAX, share_defaults: Callable[[], ShareLimits] = ShareLimits,
    ) -> None:
        """`share_defaults`: the broker's `group.share.*` settings, which groups without their own
        share.record.lock.duration.ms / share.delivery.count.limit take."""
        self.records = records
        self.bounds = bounds
        self.share_defaults = share_defaults
        self.max_groups = max_groups
        self._configs: dict[str, dict[str, int]] = {}
        #: group -> share config -> value (SHARE_CONFIGS)
        self._shares: dict[str, dict[str, str]] = {}

    def load(self) -> None:
        """Read the stored configs (start-up). A stored value outside today's bounds is kept: the
        coordinator clamps what it uses; describing shows what was set."""
        self._configs = {}
        self._shares = {}
        for group, configs in self.records.group_configs().items():
            self.changed(group, configs)
        if self._configs:
            log.info("dynamic configs of %d group(s) loaded", len(self._configs))

    def changed(self, group_id: str, configs: dict[str, str]) -> None:
        """Take `group_id`'s stored configs as they now are ({}: none), read at start-up or
        recorded since (in cluster mode by any broker: `ConfigStore.follow_groups`)."""
        kept = {
            name: int(value) for name, value in configs.items()
            if name in GROUP_CONFIG_NAMES and value.strip().lstrip("-").isdigit()
        }
        shares = {name: value for name, value in configs.items()
                  if value in SHARE_CONFIGS.get(name, ()) or _valid_share_int(name, value)
                  or _valid_share_timing(name, value)}
        if len(kept) + len(shares) != len(configs):
            log.warning("group %s: ignoring stored configs this release does not take: %s", group_id,
                        sorted(set(configs) - set(kept) - set(shares)))
        self._hold(group_id, kept, shares)

    def _hold(self, group_id: str, values: dict[str, int], shares: dict[str, str]) -> None:
        """Keep `group_id`'s configs as they now are; a group with none is forgotten."""
        if values:
            self._configs[group_id] = values
        else:
            self._configs.pop(group_id, None)
        if shares:
            self._shares[group_id] = shares
        else:
            self._shares.pop(group_id, None)

    def overrides(self, group_id: str) -> dict[str, int]:
        """The configs set explicitly on `group_id` (Kafka names -> int); {} when none."""
        return dict(self._configs.get(group_id, {}))

    def share_config(self, group_id: str, name: str) -> str:
        """The group's share config `name` (SHARE_CONFIGS), its default unless set. Read from the
        metadata store, not this store's copy: in a cluster another broker may have set it."""
        value = self.records.group_config(group_id, name)
        allowed = SHARE_CONFIGS[name]
        return value if value in allowed else allowed[0]

    def share_limit(self, group_id: str, name: str) -> int:
        """The group's int-valued share config `name` (SHARE_INT_CONFIGS), the broker's setting
        unless set; read from the metadata store, as `share_config`."""
        value = self.records.group_config(group_id, name)
        if value is not None and _valid_share_int(name, value):
            return int(value)
        return _share_default(self.share_defaults(), name)

    def share_timing(self, group_id: str, name: str) -> int:
        """The group's share.session.timeout.ms / share.heartbeat.interval.ms (SHARE_TIMING_CONFIGS),
        the broker's group.share.* setting unless set; a stored value outside today's
        group.share.min/max.* range is brought into it (as the KIP-848 coordinator clamps)."""
        limits = self.share_defaults()
        if name == SHARE_SESSION_TIMEOUT:
            default, lo, hi = limits.session_timeout_ms, limits.min_session_timeout_ms, limits.max_session_timeout_ms
        else:
            default, lo, hi = (limits.heartbeat_interval_ms, limits.min_heartbeat_interval_ms,
                               limits.max_heartbeat_interval_ms)
        value = self.records.group_config(group_id, name)
        if value is None or not _valid_share_timing(name, value):
            return default
        return max(lo, min(hi, int(value)))

    def share_limits(self, group_id: str) -> GroupShareLimits:
        """The group's int-valued share configs, as the share coordinator applies them."""
        return GroupShareLimits(self.share_limit(group_id, SHARE_RECORD_LOCK_DURATION),
                                self.share_limit(group_id, SHARE_DELIVERY_COUNT_LIMIT),
                                self.share_limit(group_id, SHARE_PARTITION_MAX_RECORD_LOCKS),
                                self.share_timing(group_id, SHARE_SESSION_TIMEOUT),
                                self.share_timing(group_id, SHARE_HEARTBEAT_INTERVAL))

    def share_auto_offset_reset(self, group_id: str) -> str:
        return self.share_config(group_id, SHARE_AUTO_OFFSET_RESET)

    def share_read_committed(self, group_id: str) -> bool:
        return self.share_config(group_id, SHARE_ISOLATION_LEVEL) == "read_committed"

    def groups(self) -> list[str]:
        return sorted(set(self._configs) | set(self._shares))

    def describe(self, group_id: str, keys: Iterable[str] | None, *, synonyms: bool, docs: bool) -> list[dict[str, object]]:
        check_group_id(group_id)
        bounds = self.bounds()
        set_values = self._configs.get(group_id, {})
        wanted = None if keys is None else set(keys)
        out: list[dict[str, object]] = []
        for name in GROUP_CONFIG_NAMES:
            if wanted is not None and name not in wanted:
                continue
            default = default_value(bounds, name)
            default_source = DEFAULT_CONFIG if default == default_value(KAFKA_BOUNDS, name) else STATIC_BROKER_CONFIG
            layers: list[tuple[int, str, int]] = []
            if name in set_values:
                layers.append((GROUP_CONFIG, name, set_values[name]))
            layers.append((default_source, f"group.{name}", default))
            source, _, value = layers[0]
            out.append(config_entry(
                name, str(value), source, ConfigType.INT, _DOCS[name] if docs else None, read_only=False,
                synonyms=[{"name": n, "value": str(v), "source": s} for s, n, v in layers] if synonyms else [],
            ))
        shares = self._shares.get(group_id, {})
        for name in SHARE_INT_CONFIGS:
            if wanted is not None and name not in wanted:
                continue
            setting = share_setting(name)
            default = _share_default(self.share_defaults(), name)
            default_source = DEFAULT_CONFIG if default == setting.default else STATIC_BROKER_CONFIG
            share_layers = [(GROUP_CONFIG, name, shares[name])] if name in shares else []
            share_layers.append((default_source, setting.described_as, str(default)))
            top_source, _, top_value = share_layers[0]
            out.append(config_entry(
                name, top_value, top_source, ConfigType.INT, _DOCS[name] if docs else None, read_only=False,
                synonyms=[{"name": n, "value": v, "source": s} for s, n, v in share_layers] if synonyms else [],
            ))
        for name, setting_name in SHARE_TIMING_CONFIGS.items():
            if wanted is not None and name not in wanted:
                continue
            setting = BROKER_SETTINGS[setting_name]
            default = _timing_default(self.share_defaults(), name)
            default_source = DEFAULT_CONFIG if default == setting.default else STATIC_BROKER_CONFIG
            timing_layers = [(GROUP_CONFIG, name, shares[name])] if name in shares else []
            timing_layers.append((default_source, setting.described_as, str(default)))
            top_source, _, top_value = timing_layers[0]
            out.append(config_entry(
                name, top_value, top_source, ConfigType.INT, _DOCS[name] if docs else None, read_only=False,
                synonyms=[{"name": n, "value": v, "source": s} for s, n, v in timing_layers] if synonyms else [],
            ))
        for name, allowed in SHARE_CONFIGS.items():
            if wanted is not None and name not in wanted:
                continue
            shown, shown_source = (shares[name], GROUP_CONFIG) if name in shares else (allowed[0], DEFAULT_CONFIG)
            out.append(config_entry(
                name, shown, shown_source, ConfigType.STRING, _DOCS[name] if docs else None, read_only=False,
                synonyms=[{"name": name, "value": shown, "source": shown_source}] if synonyms else [],
            ))
        return out

    def current(self, group_id: str) -> dict[str, str]:
        return {**{k: str(v) for k, v in self._configs.get(group_id, {}).items()}, **self._shares.get(group_id, {})}

    def alter(self, group_id: str, new: dict[str, str], *, validate_only: bool) -> None:
        """Replace the group's configs with `new` (Kafka names -> strings); {} removes them. Durable on return."""
        check_group_id(group_id)
        shares = {name: parse_share_value(name, raw) for name, raw in new.items() if name in SHARE_CONFIGS}
        shares.update({name: str(parse_share_int(name, raw)) for name, raw in new.items() if name in SHARE_INT_CONFIGS})
        timings = {name: parse_value(name, raw) for name, raw in new.items() if name in SHARE_TIMING_CONFIGS}
        shares.update({name: str(value) for name, value in timings.items()})
        values = {name: parse_value(name, raw) for name, raw in new.items()
                  if name not in SHARE_CONFIGS and name not in SHARE_INT_CONFIGS and name not in SHARE_TIMING_CONFIGS}
        validate(values, self.bounds())
        validate_share(timings, self.share_defaults())
        known = set(self._configs) | set(self._shares)
        if (values or shares) and group_id not in known and len(known) >= self.max_groups:
            raise ConfigPolicyError(
                f"at most {self.max_groups} groups may carry dynamic configs (GROUP_CONFIGS_MAX); "
                "delete the configs of a group that no longer needs them"
            )
        if validate_only:
            return
        self.records.save_group_configs(group_id, {**{k: str(v) for k, v in values.items()}, **shares})
        self._hold(group_id, values, shares)
        log.info("dynamic configs of group %s now %s", group_id, {**values, **shares})


def _valid_share_int(name: str, value: str) -> bool:
    try:
        return name in SHARE_INT_CONFIGS and share_setting(name).in_bounds(int(value))
    except ValueError:
        return False


def _valid_share_timing(name: str, value: str) -> bool:
    return name in SHARE_TIMING_CONFIGS and value.strip().isdigit() and 1 <= int(value) <= 2**31 - 1


def _timing_default(limits: ShareLimits, name: str) -> int:
    return limits.session_timeout_ms if name == SHARE_SESSION_TIMEOUT else limits.heartbeat_interval_ms


def _share_default(limits: ShareLimits, name: str) -> int:
    group = limits.of_group()
    return {SHARE_RECORD_LOCK_DURATION: group.lock_ms, SHARE_DELIVERY_COUNT_LIMIT: group.delivery_limit,
            SHARE_PARTITION_MAX_RECORD_LOCKS: group.max_locks}[name]


def check_group_id(group_id: str) -> None:
    if not group_id:
        raise ConfigResourceError("Group name cannot be empty")
    if len(group_id) > GROUP_ID_CHARS_MAX:
        raise ConfigResourceError(f"Group name is longer than {GROUP_ID_CHARS_MAX} characters")
