"""Every bound of the share coordinator, by Kafka's setting name, with Kafka 4.1's defaults.

`BrokerConfig.share_limits()` reads the broker's `group.share.*` settings into one (broker/settings.py is the one
table of their names, defaults and ranges); the other fields are loglake's own bounds on what a
client can make the broker hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

#: `share.auto.offset.reset` values (a group config in Kafka; "latest" by default).
AUTO_OFFSET_RESETS = ("latest", "earliest")


class GroupShareLimits(NamedTuple):
    """One share group's share.record.lock.duration.ms, share.delivery.count.limit,
    share.partition.max.record.locks, share.session.timeout.ms and share.heartbeat.interval.ms
    (its group configs, else the broker's group.share.* settings)."""

    lock_ms: int
    delivery_limit: int
    max_locks: int
    session_timeout_ms: int
    heartbeat_interval_ms: int


@dataclass(frozen=True, slots=True)
class ShareLimits:
    #: group.share.session.timeout.ms: a member silent this long is removed (its records released).
    session_timeout_ms: int = 45_000
    #: group.share.min/max.session.timeout.ms: the range of a group's share.session.timeout.ms
    min_session_timeout_ms: int = 45_000
    max_session_timeout_ms: int = 60_000
    #: group.share.heartbeat.interval.ms
    heartbeat_interval_ms: int = 5_000
    #: group.share.min/max.heartbeat.interval.ms: the range of a group's share.heartbeat.interval.ms
    min_heartbeat_interval_ms: int = 5_000
    max_heartbeat_interval_ms: int = 15_000
    #: group.share.max.size: members per share group (GROUP_MAX_SIZE_REACHED past it).
    max_size: int = 200
    #: group.share.record.lock.duration.ms: how long an acquired record stays acquired.
    record_lock_duration_ms: int = 30_000
    #: group.share.delivery.count.limit: deliveries before a record is archived.
    delivery_count_limit: int = 5
    #: group.share.partition.max.record.locks: in-flight records per share-partition (the offsets
    #: between the start offset and the first never acquired); acquisition stops there.
    partition_max_record_locks: int = 2000
    #: group.share.max.share.sessions: share sessions this broker keeps (SHARE_SESSION_LIMIT_REACHED).
    max_share_sessions: int = 2000
    #: share groups this broker coordinates (loglake's bound; GROUP_MAX_SIZE_REACHED past it).
    max_groups: int = 10_000
    #: share-partitions this broker holds in memory (loglake's bound: a fetch for a further one is
    #: answered with no records until one is dropped with its group).
    max_partitions: int = 100_000
    #: topics a member may subscribe to (loglake's bound; INVALID_REQUEST past it).
    max_subscribed_topics: int = 10_000

    def of_group(self) -> GroupShareLimits:
        """The bounds a group config may set for one group, as this broker sets them for all."""
        return GroupShareLimits(self.record_lock_duration_ms, self.delivery_count_limit, self.partition_max_record_locks,
                                self.session_timeout_ms, self.heartbeat_interval_ms)

    def check(self) -> None:
        """ValueError unless the session and heartbeat settings fit their ranges and each other
        (Kafka's GroupCoordinatorConfig checks)."""
        if not self.min_session_timeout_ms <= self.session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("need group.share.min.session.timeout.ms <= group.share.session.timeout.ms "
                             "<= group.share.max.session.timeout.ms")
        if not self.min_heartbeat_interval_ms <= self.heartbeat_interval_ms <= self.max_heartbeat_interval_ms:
            raise ValueError("need group.share.min.heartbeat.interval.ms <= group.share.heartbeat.interval.ms "
                             "<= group.share.max.heartbeat.interval.ms")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("group.share.heartbeat.interval.ms must be below group.share.session.timeout.ms")


__all__ = ["AUTO_OFFSET_RESETS", "GroupShareLimits", "ShareLimits"]
