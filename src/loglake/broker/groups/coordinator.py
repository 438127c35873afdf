"""The group coordinator: Kafka's classic consumer-group protocol, one object per broker.

asyncio-native and single-threaded: every method runs on the broker's event loop, so there are
no locks. JoinGroup and SyncGroup may park (resolved by other requests or by timers);
OffsetCommit and DeleteGroups wait for their store record to be durable without blocking the
loop; everything else answers at once. Timers use `loop.call_later` on the loop given to the
constructor (or the running loop at first use); commit timestamps and offset retention use the
`clock` (wall-clock seconds, `time.time` by default).

This class only wires the parts together and is the public API (docs/GROUPS.md):

    coordinator ──▶ membership (Join/Sync/Heartbeat/Leave) ──▶ rebalance (phases, timers, liveness)
                ├─▶ offsets (OffsetCommit/OffsetFetch) ──────────▶ rebalance
                ├─▶ admin (List/Describe/Delete, retention)
                ├─▶ consumer (KIP-848 ConsumerGroupHeartbeat) · consumer_admin (ConsumerGroupDescribe,
                │            commit/fetch rules) ──▶ assignors · reconcile · consumer_persistence
                └─▶ persistence (saved state ⇄ Group) · registry (groups, store, loop) · changes

At start-up it loads every group from the store: groups saved Stable resume at their
generation with their members and assignments, each member's session starting afresh.

Results carry Kafka error codes (`loglake.broker.groups.errors`); nothing here raises for bad
input.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from loglake.broker.groups import errors as E
from loglake.broker.groups.admin import GroupAdmin, GroupDescription, MemberDescription
from loglake.broker.groups.consumer import (
    ConsumerProtocol,
    GroupOverrides,
    HeartbeatRequest,
    HeartbeatResult,
    TopicCatalog,
    TopicFilter,
)
from loglake.broker.groups.consumer_admin import (
    ConsumerGroupDescription,
    describe,
    validate_commit,
    validate_fetch,
)
from loglake.broker.groups.group import Group, GroupState, JoinResult, SyncResult, join_error, sync_error
from loglake.broker.groups.limits import (
    GROUP_MAX_SIZE_DEFAULT,
    INITIAL_REBALANCE_DELAY_MS_DEFAULT,
    MAX_GROUPS_DEFAULT,
    MAX_SESSION_TIMEOUT_MS_DEFAULT,
    MEMBER_METADATA_MAX_BYTES_DEFAULT,
    MIN_SESSION_TIMEOUT_MS_DEFAULT,
    NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT,
    OFFSET_METADATA_MAX_BYTES_DEFAULT,
    OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT,
    OFFSETS_RETENTION_MS_DEFAULT,
    ConsumerLimits,
    CoordinatorLimits,
)
from loglake.broker.groups.membership import Membership
from loglake.broker.groups.offset_delete import delete_offsets
from loglake.broker.groups.offsets import OffsetCommitItem, OffsetFetchItem, Offsets
from loglake.broker.groups.persistence import restore_group
from loglake.broker.groups.rebalance import Rebalancer
from loglake.broker.groups.registry import GroupRegistry, TopicExists
from loglake.broker.groups.store import GroupStore

log = logging.getLogger(__name__)


class GroupCoordinator:
    def __init__(
        self,
        store: GroupStore,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        clock: Callable[[], float] | None = None,
        topic_exists: TopicExists | None = None,
        group_max_size: int = GROUP_MAX_SIZE_DEFAULT,
        max_groups: int = MAX_GROUPS_DEFAULT,
        min_session_timeout_ms: int = MIN_SESSION_TIMEOUT_MS_DEFAULT,
        max_session_timeout_ms: int = MAX_SESSION_TIMEOUT_MS_DEFAULT,
        initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS_DEFAULT,
        new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT,
        offset_metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES_DEFAULT,
        member_metadata_max_bytes: int = MEMBER_METADATA_MAX_BYTES_DEFAULT,
        offsets_retention_ms: int | None = OFFSETS_RETENTION_MS_DEFAULT,
        offsets_retention_check_interval_ms: int = OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT,
        consumer_limits: ConsumerLimits | None = None,
        topic_catalog: TopicCatalog | None = None,
        group_overrides: GroupOverrides | None = None,
    ) -> None:
        """`topic_exists(topic, partition)`: lets the periodic cleanup drop offsets of deleted topics.

        KIP-848: `consumer_limits` holds the `group.consumer.*` settings; `topic_catalog()` maps
        every topic name to (topic id hex, partition count); `group_overrides(group_id)` gives a
        group's own `consumer.session.timeout.ms` / `consumer.heartbeat.interval.ms` (Kafka's
        group config resource), {} when it has none.
        """
        self.limits = CoordinatorLimits(
            group_max_size, max_groups, min_session_timeout_ms, max_session_timeout_ms,
            initial_rebalance_delay_ms, new_member_join_timeout_ms, offset_metadata_max_bytes,
            member_metadata_max_bytes, offsets_retention_ms, offsets_retention_check_interval_ms,
        )
        self.limits.check()
        self.consumer_limits = consumer_limits or ConsumerLimits()
        self.consumer_limits.check()
        self._reg = GroupRegistry(store, self.limits, loop, clock, topic_exists)
        self._rebalancer = Rebalancer(self._reg)
        self._membership = Membership(self._reg, self._rebalancer)
        self._offsets = Offsets(self._reg, self._rebalancer)
        self._admin = GroupAdmin(self._reg)
        self._consumer = ConsumerProtocol(self._reg, self.consumer_limits, topic_catalog, group_overrides)
        self._catalog = topic_catalog
        self._unarmed: list[Group] = []  # resumed groups whose member sessions wait for the loop
        now = self._reg.now_ms()
        for group_id, stored in store.load().items():
            group = restore_group(group_id, stored, self.limits, now, self.consumer_limits)
            self._reg.groups[group_id] = group
            if group.members or (group.consumer is not None and group.consumer.members):
                self._unarmed.append(group)
        if self._reg.groups:
            log.info("loaded %d consumer groups (%d resumed Stable with %d members)", len(self._reg.groups),
                     len(self._unarmed),
                     sum(len(g.members) + (len(g.consumer.members) if g.consumer else 0) for g in self._unarmed))
        if len(self._reg.groups) > self.limits.max_groups:
            log.warning("%d stored consumer groups exceed max_groups=%d; no new group until some go",
                        len(self._reg.groups), self.limits.max_groups)
        self._start()

    def set_topic_filter(self, topic_filter: TopicFilter, generation: Callable[[], int]) -> None:
        """Narrow KIP-848 regex subscriptions to the topics each member may DESCRIBE (the broker's
        ACLs); `generation()` moves whenever a decision may have changed."""
        self._consumer.topic_filter = topic_filter
        self._consumer.filter_generation = generation

    def _start(self) -> None:
        """Arm what needs the event loop, once it runs: resumed sessions and the cleanup timer."""
        if self._unarmed and self._reg.running_loop() is not None:
            groups, self._unarmed = self._unarmed, []
            for group in groups:
                if self._reg.live(group) and group.consumer is not None:
                    self._consumer.arm_restored(group)
                elif self._reg.live(group) and group.is_(GroupState.STABLE):
                    self._rebalancer.start_restored(group)
        self._admin.ensure_cleanup_timer()

    # ==== membership ============================================================================

    async def join_group(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        *,
        require_known_member_id: bool,
        supports_skip_assignment: bool = False,
        reason: str | None = None,
    ) -> JoinResult:
        """JoinGroup. Parks until the join phase completes when the member takes part in a rebalance.

        `require_known_member_id`: JoinGroup v4+ (KIP-394); `supports_skip_assignment`: v9+
        (KIP-814); `rebalance_timeout_ms`: pass the session timeout for v0.
        """
        self._start()
        existing = self._reg.groups.get(group_id)
        if existing is not None and existing.consumer is not None:
            if existing.consumer.members or not self.consumer_limits.downgrade_allowed():
                return join_error(member_id, E.INCONSISTENT_GROUP_PROTOCOL)
            self._to_classic(existing)
        return await self._membership.join_group(
            group_id, member_id, group_instance_id, protocol_type, protocols, session_timeout_ms,
            rebalance_timeout_ms, client_id, client_host, require_known_member_id=require_known_member_id,
            supports_skip_assignment=supports_skip_assignment, reason=reason,
        )

    async def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: list[tuple[str, bytes]],
    ) -> SyncResult:
        """SyncGroup; followers park until the leader's assignment is saved and distributed.

        `protocol_type`/`protocol_name`: None when the request version lacks them (< v5).
        """
        self._start()
        return await self._membership.sync_group(
            group_id, generation_id, member_id, group_instance_id, protocol_type, protocol_name, assignments
        )

    def _to_classic(self, group: Group) -> None:
        """An Empty consumer group becomes a classic group (migration policy allows a downgrade)."""
        assert group.consumer is not None
        group.generation_id = max(group.generation_id, group.consumer.group_epoch)
        group.consumer = None
        group.protocol_type = None
        log.info("group %r: Empty consumer group converted to a classic group", group.group_id)

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> int:
        self._start()
        return self._membership.heartbeat(group_id, generation_id, member_id, group_instance_id)

    def leave_group(
        self, group_id: str, members: list[tuple[str, str | None]]
    ) -> tuple[int, list[tuple[str, str | None, int]]]:
        """LeaveGroup (v3+ batch form). For v0-2 the handler answers with the single member's error.

        A member id of "" with a group instance id removes that static member (admin removal).
        """
        self._start()
        return self._membership.leave_group(group_id, members)

    # ==== offsets ==================================================================================

    async def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[OffsetCommitItem],
        *,
        topic_exists: Callable[[str, int], bool],
    ) -> list[tuple[str, int, int]]:
        """OffsetCommit; answers once the accepted offsets are durable. Never blocks the loop.

        For a consumer-protocol group `generation_id` is the member epoch (consumer_admin.py).
        A partition of a topic that does not exist answers UNKNOWN_TOPIC_OR_PARTITION before the
        group is asked (Kafka checks the metadata before the coordinator sees the commit).
        """
        self._start()
        known = [item for item in offsets if topic_exists(item[0], item[1])]
        answered = await self._commit_known(group_id, generation_id, member_id, group_instance_id, known,
                                            topic_exists) if known else []
        codes = {(t, p): code for t, p, code in answered}
        return [(t, p, codes.get((t, p), E.UNKNOWN_TOPIC_OR_PARTITION)) for t, p, *_ in offsets]

    async def _commit_known(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[OffsetCommitItem],
        topic_exists: Callable[[str, int], bool],
    ) -> list[tuple[str, int, int]]:
        group = self._reg.groups.get(group_id)
        if group is not None and group.consumer is not None and not group.deleting:
            code = validate_commit(group.consumer, member_id, generation_id, [(t, p) for t, p, *_ in offsets])
            if code != E.NONE:
                return [(t, p, code) for t, p, *_ in offsets]
            generation_id, member_id, group_instance_id = -1, "", None  # validated: commit as admin
        return await self._offsets.commit(
            group_id, generation_id, member_id, group_instance_id, offsets, topic_exists=topic_exists
        )

    async def commit_txn_offsets(
        self, group_id: str, offsets: list[OffsetCommitItem], *, topic_exists: Callable[[str, int], bool]
    ) -> list[tuple[str, int, int]]:
        """A committed transaction's offsets (TxnOffsetCommit): durable on return, no member checks."""
        self._start()
        return await self._offsets.commit(group_id, -1, "", None, offsets, topic_exists=topic_exists, trusted=True)

    def fetch_offsets(
        self,
        group_id: str,
        partitions: list[tuple[str, int]] | None,
        member_id: str | None = None,
        member_epoch: int = -1,
    ) -> tuple[int, list[OffsetFetchItem]]:
        """OffsetFetch. `partitions=None`: every committed offset; a missing one reads offset -1.

        `member_id`/`member_epoch` (v9) are checked for consumer-protocol groups only.
        """
        group = self._reg.groups.get(group_id)
        if group is not None and group.consumer is not None and not self._reg.closed:
            code = validate_fetch(group.consumer, member_id, member_epoch)
            if code != E.NONE:
                return code, []
        return self._offsets.fetch(group_id, partitions)

    # ==== the consumer group protocol (KIP-848) ====================================================

    async def consumer_heartbeat(self, request: HeartbeatRequest) -> HeartbeatResult:
        """ConsumerGroupHeartbeat; answered once any change it made is durable."""
        self._start()
        return await self._consumer.heartbeat(request)

    def consumer_describe(self, group_id: str) -> ConsumerGroupDescription:
        """ConsumerGroupDescribe for one group."""
        if self._reg.closed:
            return ConsumerGroupDescription(E.COORDINATOR_NOT_AVAILABLE, None, group_id)
        names = {tid: name for name, (tid, _n) in (self._catalog() if self._catalog else {}).items()}
        return describe(group_id, self._reg.groups.get(group_id), names)

    # ==== admin ====================================================================================

    def list_groups(self, states_filter: list[str] | None = None) -> list[tuple[str, str, str]]:
        return [row[:3] for row in self._admin.list_groups(states_filter)]

    def list_groups_typed(
        self, states_filter: list[str] | None = None, types_filter: list[str] | None = None
    ) -> list[tuple[str, str, str, str]]:
        """ListGroups v5: (group_id, protocol_type, state, group type "classic" | "consumer")."""
        return self._admin.list_groups(states_filter, types_filter)

    def describe_group(self, group_id: str) -> GroupDescription:
        return self._admin.describe_group(group_id)

    async def delete_groups(self, group_ids: Iterable[str]) -> list[tuple[str, int]]:
        """DeleteGroups: only Empty groups; answered once their offsets and state are deleted durably."""
        return await self._admin.delete_groups(group_ids)

    async def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> tuple[int, list[tuple[str, int, int]]]:
        """OffsetDelete (groups/offset_delete.py): (group error, [(topic, partition, error)])."""
        return await delete_offsets(self._reg, group_id, partitions)

    async def cleanup_expired(self) -> int:
        """One offset-cleanup round (also runs by itself every check interval); returns offsets expired."""
        return await self._admin.cleanup_expired()

    def close(self) -> None:
        """Stop: cancel every timer and answer parked JoinGroup/SyncGroup with NOT_COORDINATOR (as
        Kafka does when a coordinator unloads a group; clients rediscover the coordinator). Saves
        nothing: the store already holds every acknowledged commit and the last group states,
        which the next start resumes. Afterwards every API answers COORDINATOR_NOT_AVAILABLE."""
        if self._reg.closed:
            return
        self._reg.closed = True
        self._admin.stop()
        for group in list(self._reg.groups.values()):
            self._consumer.stop(group)
            for member in list(group.members.values()):
                self._reg.cancel(member.heartbeat_timer)
                member.heartbeat_timer = None
                group.complete_join(member, join_error(member.member_id, E.NOT_COORDINATOR))
                group.complete_sync(member, sync_error(E.NOT_COORDINATOR))
            self._reg.kill(group)
        self._reg.groups.clear()

    # ==== introspection (tests, metrics) ===========================================================

    def group_state(self, group_id: str) -> str | None:
        group = self._reg.groups.get(group_id)
        return group.state.value if group is not None else None

    def generation(self, group_id: str) -> int | None:
        group = self._reg.groups.get(group_id)
        return group.generation_id if group is not None else None

    def __len__(self) -> int:
        return len(self._reg.groups)


__all__ = [
    "GROUP_MAX_SIZE_DEFAULT",
    "MAX_GROUPS_DEFAULT",
    "MEMBER_METADATA_MAX_BYTES_DEFAULT",
    "NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT",
    "OFFSET_METADATA_MAX_BYTES_DEFAULT",
    "ConsumerGroupDescription",
    "GroupCoordinator",
    "GroupDescription",
    "HeartbeatRequest",
    "HeartbeatResult",
    "MemberDescription",
]
