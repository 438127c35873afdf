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
