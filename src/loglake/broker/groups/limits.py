"""The coordinator's named limits and defaults, with Kafka's setting name (or "loglake limit") beside each.

`CoordinatorLimits.check()` runs once, in the coordinator's constructor: a bad combination is a
configuration error at start-up, never a surprise later.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUP_MAX_SIZE_DEFAULT = 1000  # group.max.size (Kafka's default is unbounded); also bounds persisted members
MAX_GROUPS_DEFAULT = 100_000  # groups held by this coordinator (loglake limit; Kafka has none)
MIN_SESSION_TIMEOUT_MS_DEFAULT = 6000  # group.min.session.timeout.ms
MAX_SESSION_TIMEOUT_MS_DEFAULT = 1_800_000  # group.max.session.timeout.ms
INITIAL_REBALANCE_DELAY_MS_DEFAULT = 3000  # group.initial.rebalance.delay.ms
NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT = 300_000  # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs
OFFSET_METADATA_MAX_BYTES_DEFAULT = 4096  # offset.metadata.max.bytes (UTF-8 bytes here)
MEMBER_METADATA_MAX_BYTES_DEFAULT = 1 << 20  # sum of one member's protocol metadata (loglake limit)
OFFSETS_RETENTION_MINUTES_DEFAULT = 10080  # offsets.retention.minutes (7 days)
OFFSETS_RETENTION_MS_DEFAULT = OFFSETS_RETENTION_MINUTES_DEFAULT * 60_000
OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT = 600_000  # offsets.retention.check.interval.ms


@dataclass(frozen=True)
class CoordinatorLimits:
    group_max_size: int = GROUP_MAX_SIZE_DEFAULT
    max_groups: int = MAX_GROUPS_DEFAULT
    min_session_timeout_ms: int = MIN_SESSION_TIMEOUT_MS_DEFAULT
    max_session_timeout_ms: int = MAX_SESSION_TIMEOUT_MS_DEFAULT
    initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS_DEFAULT
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT
    offset_metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES_DEFAULT
    member_metadata_max_bytes: int = MEMBER_METADATA_MAX_BYTES_DEFAULT
    offsets_retention_ms: int | None = OFFSETS_RETENTION_MS_DEFAULT  # None: keep offsets forever
    offsets_retention_check_interval_ms: int = OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT

    def check(self) -> None:
        if self.group_max_size < 1 or self.max_groups < 1:
            raise ValueError("group_max_size and max_groups must be >= 1")
        if not 0 < self.min_session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("need 0 < min_session_timeout_ms <= max_session_timeout_ms")
        if self.initial_rebalance_delay_ms < 0 or self.new_member_join_timeout_ms <= 0:
            raise ValueError("initial_rebalance_delay_ms must be >= 0, new_member_join_timeout_ms > 0")
        if self.offsets_retention_ms is not None and self.offsets_retention_ms <= 0:
            raise ValueError("offsets_retention_ms must be > 0 (or None to keep offsets forever)")
        if self.offsets_retention_check_interval_ms <= 0:
            raise ValueError("offsets_retention_check_interval_ms must be > 0")
        if self.offset_metadata_max_bytes < 0 or self.member_metadata_max_bytes < 0:
            raise ValueError("offset_metadata_max_bytes and member_metadata_max_bytes must be >= 0")


# ---- the consumer group protocol (KIP-848) ----------------------------------------------------------

CONSUMER_SESSION_TIMEOUT_MS_DEFAULT = 45_000  # group.consumer.session.timeout.ms
CONSUMER_MIN_SESSION_TIMEOUT_MS_DEFAULT = 45_000  # group.consumer.min.session.timeout.ms
CONSUMER_MAX_SESSION_TIMEOUT_MS_DEFAULT = 60_000  # group.consumer.max.session.timeout.ms
CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT = 5_000  # group.consumer.heartbeat.interval.ms
CONSUMER_MIN_HEARTBEAT_INTERVAL_MS_DEFAULT = 5_000  # group.consumer.min.heartbeat.interval.ms
CONSUMER_MAX_HEARTBEAT_INTERVAL_MS_DEFAULT = 15_000  # group.consumer.max.heartbeat.interval.ms
CONSUMER_MAX_SIZE_DEFAULT = 1000  # group.consumer.max.size (Kafka's default is unbounded)
CONSUMER_ASSIGNORS_DEFAULT = ("uniform", "range")  # group.consumer.assignors; the first is the default
CONSUMER_MIGRATION_POLICY_DEFAULT = "bidirectional"  # group.consumer.migration.policy
MIGRATION_POLICIES = ("disabled", "upgrade", "downgrade", "bidirectional")
KNOWN_ASSIGNORS = ("uniform", "range")
MAX_REGEX_LENGTH = 1024  # SubscribedTopicRegex, characters (loglake limit)
MAX_TOPICS_PER_SUBSCRIPTION = 10_000  # names subscribed by one member; topics one regex may match (loglake)
MAX_TOPIC_NAME_LENGTH = 249  # Kafka's topic name limit; longer subscribed names are refused


@dataclass(frozen=True)
class ConsumerLimits:
    """KIP-848 group settings (Kafka's `group.consumer.*` names) and loglake's bounds on maps."""

    session_timeout_ms: int = CONSUMER_SESSION_TIMEOUT_MS_DEFAULT
    min_session_timeout_ms: int = CONSUMER_MIN_SESSION_TIMEOUT_MS_DEFAULT
    max_session_timeout_ms: int = CONSUMER_MAX_SESSION_TIMEOUT_MS_DEFAULT
    heartbeat_interval_ms: int = CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT
    min_heartbeat_interval_ms: int = CONSUMER_MIN_HEARTBEAT_INTERVAL_MS_DEFAULT
    max_heartbeat_interval_ms: int = CONSUMER_MAX_HEARTBEAT_INTERVAL_MS_DEFAULT
    max_size: int = CONSUMER_MAX_SIZE_DEFAULT
    assignors: tuple[str, ...] = CONSUMER_ASSIGNORS_DEFAULT
    migration_policy: str = CONSUMER_MIGRATION_POLICY_DEFAULT
    max_regex_length: int = MAX_REGEX_LENGTH
    max_topics_per_subscription: int = MAX_TOPICS_PER_SUBSCRIPTION

    def check(self) -> None:
        if not 0 < self.min_session_timeout_ms <= self.session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("need 0 < group.consumer.min.session.timeout.ms <= session.timeout.ms <= max")
        if not 0 < self.min_heartbeat_interval_ms <= self.heartbeat_interval_ms <= self.max_heartbeat_interval_ms:
            raise ValueError("need 0 < group.consumer.min.heartbeat.interval.ms <= heartbeat.interval.ms <= max")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("group.consumer.heartbeat.interval.ms must be below group.consumer.session.timeout.ms")
        if self.max_size < 1:
            raise ValueError("group.consumer.max.size must be >= 1")
        if not self.assignors or any(a not in KNOWN_ASSIGNORS for a in self.assignors):
            raise ValueError(f"group.consumer.assignors: each must be one of {', '.join(KNOWN_ASSIGNORS)}")
        if self.migration_policy not in MIGRATION_POLICIES:
            raise ValueError(f"group.consumer.migration.policy must be one of {', '.join(MIGRATION_POLICIES)}")
        if self.max_regex_length < 1 or self.max_topics_per_subscription < 1:
            raise ValueError("max_regex_length and max_topics_per_subscription must be >= 1")

    def upgrade_allowed(self) -> bool:
        """An Empty classic group may become a consumer group."""
        return self.migration_policy in ("upgrade", "bidirectional")

    def downgrade_allowed(self) -> bool:
        """An Empty consumer group may become a classic group."""
        return self.migration_policy in ("downgrade", "bidirectional")
