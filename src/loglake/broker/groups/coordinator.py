"""The group coordinator: Kafka's classic consumer-group protocol over `Group` state machines.

asyncio-native and single-threaded: every method runs on the broker's event loop, so there are
no locks. JoinGroup and SyncGroup may park (they return awaitables resolved by other requests or
by timers); everything else answers immediately. Timers use `loop.call_later` on the loop given
to the constructor (or the running loop at first use); commit timestamps and offset retention
use the `clock` (wall-clock seconds, `time.time` by default).

Results carry Kafka error codes (`loglake.broker.groups.errors`); nothing here raises for bad
input. See `group.py` for the state machine and docs/_groups.md for the API contract.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from loglake.broker.groups import errors as E
from loglake.broker.groups.group import (
    Group,
    GroupState,
    JoinResult,
    Member,
    SyncResult,
    join_error,
    sync_error,
)
from loglake.broker.groups.offsets import GroupOffsets, OffsetEntry, OffsetsStore, TopicPartition

log = logging.getLogger(__name__)

# ---- named limits and defaults ---------------------------------------------------------------
GROUP_MAX_SIZE_DEFAULT = 1000  # group.max.size (Kafka's default is unbounded)
MAX_GROUPS_DEFAULT = 100_000  # groups held by this coordinator (Kafka has no such limit)
MIN_SESSION_TIMEOUT_MS_DEFAULT = 6000  # group.min.session.timeout.ms
MAX_SESSION_TIMEOUT_MS_DEFAULT = 1_800_000  # group.max.session.timeout.ms
INITIAL_REBALANCE_DELAY_MS_DEFAULT = 3000  # group.initial.rebalance.delay.ms
NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT = 300_000  # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs
OFFSET_METADATA_MAX_BYTES_DEFAULT = 4096  # offset.metadata.max.bytes (UTF-8 bytes here)
MEMBER_METADATA_MAX_BYTES_DEFAULT = 1 << 20  # sum of one member's protocol metadata (loglake limit)
OFFSETS_RETENTION_MS_DEFAULT = 7 * 24 * 3600 * 1000  # offsets.retention.minutes = 10080
OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT = 600_000  # offsets.retention.check.interval.ms

OffsetCommitItem = tuple[str, int, int, int, str | None]  # topic, partition, offset, leader_epoch, metadata
OffsetFetchItem = tuple[str, int, int, int, str, int]  # topic, partition, offset, leader_epoch, metadata, error


@dataclass
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes  # of the chosen protocol; empty unless the group is Stable (as Kafka)
    assignment: bytes  # empty unless the group is Stable


@dataclass
class GroupDescription:
    error_code: int
    group_id: str
    state: str  # "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"
    protocol_type: str
    protocol: str  # chosen protocol when Stable, else ""
    members: list[MemberDescription] = field(default_factory=list)


class GroupCoordinator:
    def __init__(
        self,
        offsets_store: OffsetsStore,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        clock: Callable[[], float] | None = None,
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
    ) -> None:
        if group_max_size < 1 or max_groups < 1:
            raise ValueError("group_max_size and max_groups must be >= 1")
        if not 0 < min_session_timeout_ms <= max_session_timeout_ms:
            raise ValueError("need 0 < min_session_timeout_ms <= max_session_timeout_ms")
        if initial_rebalance_delay_ms < 0 or new_member_join_timeout_ms <= 0:
            raise ValueError("initial_rebalance_delay_ms must be >= 0, new_member_join_timeout_ms > 0")
        if offsets_retention_ms is not None and offsets_retention_ms <= 0:
            raise ValueError("offsets_retention_ms must be > 0 (or None to keep offsets forever)")
        self._store = offsets_store
        self._loop = loop
        self._clock = clock or time.time
        self.group_max_size = group_max_size
        self.max_groups = max_groups
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.new_member_join_timeout_ms = new_member_join_timeout_ms
        self.offset_metadata_max_bytes = offset_metadata_max_bytes
        self.member_metadata_max_bytes = member_metadata_max_bytes
        self.offsets_retention_ms = offsets_retention_ms
        self.offsets_retention_check_interval_ms = offsets_retention_check_interval_ms
        self._closed = False
        self._cleanup_timer: asyncio.TimerHandle | None = None
        self._groups: dict[str, Group] = {}
        now = self._now_ms()
        for group_id, offsets in offsets_store.load().items():
            group = Group(group_id, now)  # loaded groups count as "Empty since now" for retention
            group.offsets = dict(offsets)
            self._groups[group_id] = group

    # ==== plumbing ================================================================================

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _call_later(self, delay_ms: int, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self._get_loop().call_later(max(delay_ms, 0) / 1000.0, callback)

    def _ensure_cleanup_timer(self) -> None:
        """Arm the periodic retention check (lazily: the loop may not run yet at construction)."""
        if self._cleanup_timer is not None or self._closed or self.offsets_retention_ms is None:
            return
        if self._loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # called outside the loop (embedded use): retention only via cleanup_expired()
        self._cleanup_timer = self._call_later(self.offsets_retention_check_interval_ms, self._on_cleanup_timer)

    def _on_cleanup_timer(self) -> None:
        self._cleanup_timer = None
        try:
            self.cleanup_expired()
        except Exception:
            log.exception("consumer-group offset cleanup failed")
        self._ensure_cleanup_timer()

    def _live(self, group: Group) -> bool:
        """Timers capture a group; it may have been deleted (and maybe re-created) since."""
        return not self._closed and self._groups.get(group.group_id) is group and not group.is_(GroupState.DEAD)

    @staticmethod
    def _cancel(handle: asyncio.TimerHandle | None) -> None:
        if handle is not None:
            handle.cancel()

    def _new_group(self, group_id: str) -> Group | None:
        if len(self._groups) >= self.max_groups:
            log.warning("refusing new group %r: %d groups held (max_groups)", group_id, len(self._groups))
            return None
        group = Group(group_id, self._now_ms())
        self._groups[group_id] = group
        return group

    # ==== JoinGroup ==============================================================================

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
        outcome = self._join(
            group_id,
            member_id,
            group_instance_id,
            protocol_type,
            protocols,
            session_timeout_ms,
            rebalance_timeout_ms,
            client_id,
            client_host,
            require_known_member_id,
            supports_skip_assignment,
            reason,
        )
        if isinstance(outcome, JoinResult):
            return outcome
        return await outcome

    def _join(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
        supports_skip_assignment: bool,
        reason: str | None,
    ) -> JoinResult | asyncio.Future[JoinResult]:
        if self._closed:
            return join_error(member_id, E.COORDINATOR_NOT_AVAILABLE)
        if not group_id:
            return join_error(member_id, E.INVALID_GROUP_ID)
        if not self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms:
            return join_error(member_id, E.INVALID_SESSION_TIMEOUT)
        # First occurrence of each protocol name wins (the wire collection is keyed by name).
        unique: dict[str, bytes] = {}
        for name, data in protocols:
            unique.setdefault(name, bytes(data))
        protocols = list(unique.items())
        if sum(len(m) for _, m in protocols) > self.member_metadata_max_bytes:
            return join_error(member_id, E.INVALID_REQUEST)
        rebalance_timeout_ms = max(rebalance_timeout_ms, 0)
        self._ensure_cleanup_timer()

        group = self._groups.get(group_id)
        created = group is None
        if group is None:
            if member_id:
                return join_error(member_id, E.UNKNOWN_MEMBER_ID)
            group = self._new_group(group_id)
            if group is None:
                return join_error(member_id, E.UNKNOWN_SERVER_ERROR)

        outcome: JoinResult | asyncio.Future[JoinResult]
        if not self._accept_joining_member(group, member_id):
            removed = group.remove(member_id)
            if removed is not None:
                self._drop_member_timers_and_waiters(group, removed)
            outcome = join_error("", E.GROUP_MAX_SIZE_REACHED)
        elif not member_id:
            outcome = self._join_new_member(
                group, instance_id, protocol_type, protocols, session_timeout_ms, rebalance_timeout_ms,
                client_id, client_host, require_known_member_id, supports_skip_assignment, reason,
            )
        else:
            outcome = self._join_current_member(
                group, member_id, instance_id, protocol_type, protocols, session_timeout_ms,
                rebalance_timeout_ms, client_id, client_host, reason,
            )
        self._maybe_complete_join_phase(group)
        if created and group.is_(GroupState.EMPTY) and not group.members and not group.pending_members:
            self._groups.pop(group_id, None)  # the join failed: keep no trace of the group
        return outcome

    def _accept_joining_member(self, group: Group, member_id: str) -> bool:
        member = group.members.get(member_id)
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.is_(GroupState.PREPARING_REBALANCE):
            return (member is not None and member.awaiting_join) or group.num_awaiting_join < self.group_max_size
        return member is not None or len(group.members) < self.group_max_size

    def _join_new_member(
        self,
        group: Group,
        instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
        supports_skip_assignment: bool,
        reason: str | None,
    ) -> JoinResult | asyncio.Future[JoinResult]:
        if group.is_(GroupState.DEAD):
            return join_error("", E.COORDINATOR_NOT_AVAILABLE)
        if not group.supports_protocols(protocol_type, [n for n, _ in protocols]):
            return join_error("", E.INCONSISTENT_GROUP_PROTOCOL)
        new_member_id = f"{instance_id if instance_id is not None else client_id}-{uuid.uuid4()}"
        if instance_id is not None:
            old_member_id = group.static_members.get(instance_id)
            if old_member_id is not None:
                return self._update_static_member(
                    group, instance_id, old_member_id, new_member_id, protocols,
                    session_timeout_ms, rebalance_timeout_ms, supports_skip_assignment, reason,
                )
        elif require_known_member_id:
            if len(group.pending_members) >= self.group_max_size:
                return join_error("", E.GROUP_MAX_SIZE_REACHED)
            group.pending_members[new_member_id] = self._call_later(
                session_timeout_ms, lambda: self._expire_pending_member(group, new_member_id)
            )
            return join_error(new_member_id, E.MEMBER_ID_REQUIRED)
        return self._add_member_and_rebalance(
            group, new_member_id, instance_id, protocol_type, protocols, session_timeout_ms,
            rebalance_timeout_ms, client_id, client_host, reason,
        )

    def _join_current_member(
        self,
        group: Group,
        member_id: str,
        instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        reason: str | None,
    ) -> JoinResult | asyncio.Future[JoinResult]:
        if group.is_(GroupState.DEAD):
            return join_error(member_id, E.COORDINATOR_NOT_AVAILABLE)
        if not group.supports_protocols(protocol_type, [n for n, _ in protocols]):
            return join_error(member_id, E.INCONSISTENT_GROUP_PROTOCOL)
        if member_id in group.pending_members:
            if instance_id is not None:  # pending members are always dynamic; Kafka calls this illegal
                return join_error(member_id, E.UNKNOWN_MEMBER_ID)
            self._cancel(group.pending_members.get(member_id))
            return self._add_member_and_rebalance(
                group, member_id, None, protocol_type, protocols, session_timeout_ms,
                rebalance_timeout_ms, client_id, client_host, reason,
            )
        error = self._validate_current_member(group, member_id, instance_id)
        if error != E.NONE:
            return join_error(member_id, error)
        member = group.members[member_id]
        if group.is_(GroupState.PREPARING_REBALANCE):
            return self._update_member_and_rebalance(group, member, protocols, session_timeout_ms, rebalance_timeout_ms)
        if group.is_(GroupState.COMPLETING_REBALANCE):
            if member.matches(protocols):
                # Lost JoinGroup response: answer again with the current generation.
                return self._current_join_result(group, member_id, with_members=group.leader_id == member_id)
            return self._update_member_and_rebalance(group, member, protocols, session_timeout_ms, rebalance_timeout_ms)
        if group.is_(GroupState.STABLE):
            if group.leader_id == member_id or not member.matches(protocols):
                # A leader JoinGroup forces a rebalance (e.g. topic metadata changed).
                return self._update_member_and_rebalance(
                    group, member, protocols, session_timeout_ms, rebalance_timeout_ms
                )
            return self._current_join_result(group, member_id, with_members=False)
        return join_error(member_id, E.UNKNOWN_MEMBER_ID)  # Empty: cannot have members

    def _current_join_result(self, group: Group, member_id: str, *, with_members: bool) -> JoinResult:
        return JoinResult(
            E.NONE,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            member_id,
            group.current_member_metadata() if with_members else [],
        )

    def _add_member_and_rebalance(
        self,
        group: Group,
        member_id: str,
        instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        reason: str | None,
    ) -> asyncio.Future[JoinResult]:
        member = Member(
            member_id, instance_id, client_id, client_host, rebalance_timeout_ms, session_timeout_ms,
            protocol_type, protocols, is_new=True,
        )
        if group.is_(GroupState.PREPARING_REBALANCE) and group.previous_state is GroupState.EMPTY:
            group.new_member_added = True
        waiter: asyncio.Future[JoinResult] = self._get_loop().create_future()
        group.add(member, waiter)
        # A new member cannot heartbeat while parked in JoinGroup: bound its wait instead.
        self._schedule_heartbeat(group, member, self.new_member_join_timeout_ms)
        log.info("group %r: adding member %s (instance %s, client %s); reason: %s",
                 group.group_id, member_id, instance_id, client_id, reason)
        self._maybe_prepare_rebalance_or_complete_join(group)
        return waiter

    def _update_member_and_rebalance(
        self,
        group: Group,
        member: Member,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
    ) -> asyncio.Future[JoinResult]:
        waiter: asyncio.Future[JoinResult] = self._get_loop().create_future()
        superseded = group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, waiter)
        if superseded is not None and not superseded.done():
            superseded.set_result(join_error(member.member_id, E.REBALANCE_IN_PROGRESS))
        self._maybe_prepare_rebalance_or_complete_join(group)
        return waiter

    def _update_static_member(
        self,
        group: Group,
        instance_id: str,
        old_member_id: str,
        new_member_id: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        supports_skip_assignment: bool,
        reason: str | None,
    ) -> JoinResult | asyncio.Future[JoinResult]:
        """KIP-345: a static member rejoined with an unknown member id; fence its old id."""
        current_leader = group.leader_id or ""
        old = group.members[old_member_id]
        group.complete_join(old, join_error(old_member_id, E.FENCED_INSTANCE_ID))
        group.complete_sync(old, sync_error(E.FENCED_INSTANCE_ID))
        member = group.replace_static_member(instance_id, old_member_id, new_member_id)
        self._schedule_heartbeat(group, member)
        log.info("group %r: static member %s replaced %s with %s in %s; reason: %s",
                 group.group_id, instance_id, old_member_id, new_member_id, group.state.value, reason)
        waiter: asyncio.Future[JoinResult] = self._get_loop().create_future()
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, waiter)
        if group.is_(GroupState.STABLE):
            if group.protocol_name == group.select_protocol():
                # No rebalance: the member keeps its assignment (it gets it from SyncGroup).
                is_leader = group.leader_id == new_member_id
                if supports_skip_assignment:
                    result = JoinResult(
                        E.NONE, group.generation_id, group.protocol_type, group.protocol_name,
                        group.leader_id or "", new_member_id,
                        group.current_member_metadata() if is_leader else [], skip_assignment=is_leader,
                    )
                else:
                    # Old clients: report the previous leader id so a restarted leader does not
                    # compute an assignment that a Stable group would ignore.
                    result = JoinResult(
                        E.NONE, group.generation_id, group.protocol_type, group.protocol_name,
                        current_leader, new_member_id,
                    )
                group.complete_join(member, result)
            else:
                self._maybe_prepare_rebalance_or_complete_join(group)
        elif group.is_(GroupState.COMPLETING_REBALANCE):
            # The leader may be assigning to the old member id: start over.
            self._prepare_rebalance(group, f"static member {instance_id} rejoined during CompletingRebalance")
        return waiter

    # ==== rebalance machinery =====================================================================

    def _maybe_prepare_rebalance_or_complete_join(self, group: Group) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, "membership changed")
        else:
            self._maybe_complete_join_phase(group)

    def _maybe_complete_join_phase(self, group: Group) -> None:
        if (
            group.is_(GroupState.PREPARING_REBALANCE)
            and group.has_all_members_joined()
            and group.previous_state is not GroupState.EMPTY  # the initial delay always runs out
        ):
            self._complete_join(group)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.is_(GroupState.COMPLETING_REBALANCE):
            self._reset_and_propagate_assignment_error(group, E.REBALANCE_IN_PROGRESS)
        self._remove_sync_expiration(group)
        self._cancel(group.join_timer)
        group.join_timer = None
        initial = group.is_(GroupState.EMPTY)
        if initial:
            delay = self.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            group.new_member_added = False
            group.join_timer = self._call_later(delay, lambda: self._initial_delay_expired(group, delay, remaining))
        log.info("group %r: preparing rebalance from %s, generation %d (%s)",
                 group.group_id, group.state.value, group.generation_id, reason)
        group.transition_to(GroupState.PREPARING_REBALANCE, self._now_ms())
        if not initial:
            self._complete_join_else_schedule(group)

    def _complete_join_else_schedule(self, group: Group) -> None:
        if group.has_all_members_joined():
            self._complete_join(group)
        else:
            group.join_timer = self._call_later(group.rebalance_timeout_ms(), lambda: self._join_timer_fired(group))

    def _initial_delay_expired(self, group: Group, delay: int, remaining: int) -> None:
        if not self._live(group) or not group.is_(GroupState.PREPARING_REBALANCE):
            return
        group.join_timer = None
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            new_delay = min(self.initial_rebalance_delay_ms, remaining)
            new_remaining = max(remaining - delay, 0)
            group.join_timer = self._call_later(
                new_delay, lambda: self._initial_delay_expired(group, new_delay, new_remaining)
            )
        else:
            self._complete_join(group)

    def _join_timer_fired(self, group: Group) -> None:
        group.join_timer = None
        if self._live(group) and group.is_(GroupState.PREPARING_REBALANCE):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """End the join phase: drop dynamic members that did not rejoin, bump the generation."""
        self._cancel(group.join_timer)
        group.join_timer = None
        gone = [m for m in group.not_yet_rejoined() if m.group_instance_id is None]
        for member in gone:
            group.remove(member.member_id)
            self._drop_member_timers_and_waiters(group, member)
        if gone:
            log.info("group %r: removed members that did not rejoin: %s",
                     group.group_id, [m.member_id for m in gone])
        if group.is_(GroupState.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Only static members that have not rejoined: wait another rebalance timeout
            # (their sessions expire meanwhile if they are really gone).
            log.warning("group %r: no member rejoined; extending the join phase", group.group_id)
            group.join_timer = self._call_later(group.rebalance_timeout_ms(), lambda: self._join_timer_fired(group))
            return
        group.init_next_generation(self._now_ms())
        if group.is_(GroupState.EMPTY):
            log.info("group %r: generation %d is empty", group.group_id, group.generation_id)
            return
        log.info("group %r: generation %d with %d members, protocol %s, leader %s",
                 group.group_id, group.generation_id, len(group.members), group.protocol_name, group.leader_id)
        for member in list(group.members.values()):
            is_leader = group.leader_id == member.member_id
            group.complete_join(member, self._current_join_result(group, member.member_id, with_members=is_leader))
            self._schedule_heartbeat(group, member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        generation = group.generation_id
        group.sync_timer = self._call_later(
            group.rebalance_timeout_ms(), lambda: self._expire_pending_sync(group, generation)
        )

    def _expire_pending_sync(self, group: Group, generation: int) -> None:
        if not self._live(group) or group.generation_id != generation:
            return
        group.sync_timer = None
        if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE) and group.pending_sync:
            late = sorted(group.pending_sync)
            for member_id in late:
                member = group.remove(member_id)
                if member is not None:
                    self._drop_member_timers_and_waiters(group, member)
            log.info("group %r: removed members that did not SyncGroup in time: %s", group.group_id, late)
            self._prepare_rebalance(group, "pending SyncGroup expired")

    def _remove_sync_expiration(self, group: Group) -> None:
        group.pending_sync.clear()
        self._cancel(group.sync_timer)
        group.sync_timer = None

    def _remove_pending_sync_member(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync or group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            self._cancel(group.sync_timer)
            group.sync_timer = None

    def _reset_and_propagate_assignment_error(self, group: Group, error: int) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: Group, error: int) -> None:
        ok = error == E.NONE
        for member in list(group.members.values()):
            result = SyncResult(
                error,
                group.protocol_type if ok else None,
                group.protocol_name if ok else None,
                member.assignment,
            )
            if group.complete_sync(member, result):
                self._schedule_heartbeat(group, member)

    # ==== member liveness ==========================================================================

    def _schedule_heartbeat(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        self._cancel(member.heartbeat_timer)
        member_id = member.member_id
        member.heartbeat_timer = self._call_later(
            member.session_timeout_ms if timeout_ms is None else timeout_ms,
            lambda: self._expire_heartbeat(group, member, member_id),
        )

    def _expire_heartbeat(self, group: Group, member: Member, member_id: str) -> None:
        if not self._live(group) or group.members.get(member_id) is not member:
            return  # removed, or replaced under a new id (static member)
        member.heartbeat_timer = None
        if member.has_satisfied_heartbeat():
            return  # parked in JoinGroup/SyncGroup; rearmed when the rebalance answers it
        log.info("group %r: member %s session expired", group.group_id, member_id)
        self._remove_member_and_update_group(group, member)

    def _expire_pending_member(self, group: Group, member_id: str) -> None:
        if not self._live(group) or member_id not in group.pending_members:
            return
        log.info("group %r: pending member %s never came back", group.group_id, member_id)
        group.remove(member_id)
        self._maybe_complete_join_phase(group)

    def _remove_member_and_update_group(self, group: Group, member: Member) -> None:
        group.complete_join(member, join_error("", E.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        self._drop_member_timers_and_waiters(group, member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(group)
        elif group.is_(GroupState.PREPARING_REBALANCE):
            self._maybe_complete_join_phase(group)

    def _drop_member_timers_and_waiters(self, group: Group, member: Member) -> None:
        """After `group.remove`: no timer may outlive a member, no parked request may hang."""
        self._cancel(member.heartbeat_timer)
        member.heartbeat_timer = None
        if member.join_waiter is not None:
            waiter, member.join_waiter = member.join_waiter, None
            if not waiter.done():
                waiter.set_result(join_error("", E.UNKNOWN_MEMBER_ID))
        group.complete_sync(member, sync_error(E.UNKNOWN_MEMBER_ID))

    @staticmethod
    def _validate_current_member(group: Group, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            current = group.static_members.get(instance_id)
            if current is None:
                return E.UNKNOWN_MEMBER_ID
            if current != member_id:
                return E.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return E.UNKNOWN_MEMBER_ID
        return E.NONE

    # ==== SyncGroup ===============================================================================

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
        """SyncGroup; followers park until the leader's SyncGroup brings the assignment.

        `protocol_type`/`protocol_name`: None when the request version lacks them (< v5).
        """
        outcome = self._sync(group_id, generation_id, member_id, group_instance_id, protocol_type,
                             protocol_name, assignments)
        if isinstance(outcome, SyncResult):
            return outcome
        return await outcome

    def _sync(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: list[tuple[str, bytes]],
    ) -> SyncResult | asyncio.Future[SyncResult]:
        if self._closed:
            return sync_error(E.COORDINATOR_NOT_AVAILABLE)
        if not group_id:
            return sync_error(E.INVALID_GROUP_ID)
        group = self._groups.get(group_id)
        if group is None or group.is_(GroupState.EMPTY):
            return sync_error(E.UNKNOWN_MEMBER_ID)
        if group.is_(GroupState.DEAD):
            return sync_error(E.COORDINATOR_NOT_AVAILABLE)
        error = self._validate_current_member(group, member_id, instance_id)
        if error != E.NONE:
            return sync_error(error)
        if generation_id != group.generation_id:
            return sync_error(E.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return sync_error(E.INCONSISTENT_GROUP_PROTOCOL)
        member = group.members[member_id]
        if group.is_(GroupState.PREPARING_REBALANCE):
            return sync_error(E.REBALANCE_IN_PROGRESS)
        if group.is_(GroupState.STABLE):
            self._remove_pending_sync_member(group, member_id)
            self._schedule_heartbeat(group, member)
            return SyncResult(E.NONE, group.protocol_type, group.protocol_name, member.assignment)
        # CompletingRebalance
        group.complete_sync(member, sync_error(E.REBALANCE_IN_PROGRESS))  # a duplicate SyncGroup supersedes
        waiter: asyncio.Future[SyncResult] = self._get_loop().create_future()
        member.sync_waiter = waiter
        self._remove_pending_sync_member(group, member_id)
        if group.leader_id == member_id:
            given = dict(assignments)  # last entry per member wins; unknown member ids are ignored
            missing = [m for m in group.members if m not in given]
            if missing:
                log.warning("group %r: leader gave no assignment to %s; sending empty ones",
                            group.group_id, missing)
            for m in group.members.values():
                m.assignment = bytes(given.get(m.member_id, b""))
            log.info("group %r: assignment received from leader %s for generation %d",
                     group.group_id, member_id, group.generation_id)
            self._propagate_assignment(group, E.NONE)
            group.transition_to(GroupState.STABLE, self._now_ms())
        return waiter

    # ==== Heartbeat / LeaveGroup ================================================================

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> int:
        if self._closed:
            return E.COORDINATOR_NOT_AVAILABLE
        if not group_id:
            return E.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        if group.is_(GroupState.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error != E.NONE:
            return error
        if generation_id != group.generation_id:
            return E.ILLEGAL_GENERATION
        if group.is_(GroupState.EMPTY):
            return E.UNKNOWN_MEMBER_ID
        self._schedule_heartbeat(group, group.members[member_id])
        if group.is_(GroupState.PREPARING_REBALANCE):
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    def leave_group(
        self, group_id: str, members: list[tuple[str, str | None]]
    ) -> tuple[int, list[tuple[str, str | None, int]]]:
        """LeaveGroup (v3+ batch form). For v0-2 the handler answers with the single member's error.

        A member id of "" with a group instance id removes that static member (admin removal).
        """
        if self._closed:
            return E.COORDINATOR_NOT_AVAILABLE, []
        if not group_id:
            return E.INVALID_GROUP_ID, []
        group = self._groups.get(group_id)
        if group is None:
            return E.NONE, [(m, i, E.UNKNOWN_MEMBER_ID) for m, i in members]
        if group.is_(GroupState.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE, []
        results: list[tuple[str, str | None, int]] = []
        for member_id, instance_id in members:
            if not member_id:
                current = group.static_members.get(instance_id) if instance_id is not None else None
                if current is None:
                    results.append((member_id, instance_id, E.UNKNOWN_MEMBER_ID))
                    continue
                self._remove_member_and_update_group(group, group.members[current])
                results.append((member_id, instance_id, E.NONE))
            elif member_id in group.pending_members:
                self._cancel(group.pending_members.get(member_id))
                group.remove(member_id)
                self._maybe_complete_join_phase(group)
                results.append((member_id, instance_id, E.NONE))
            else:
                error = self._validate_current_member(group, member_id, instance_id)
                if error == E.NONE:
                    log.info("group %r: member %s left", group.group_id, member_id)
                    self._remove_member_and_update_group(group, group.members[member_id])
                results.append((member_id, instance_id, error))
        return E.NONE, results

    # ==== offsets ================================================================================

    def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[OffsetCommitItem],
        *,
        topic_exists: Callable[[str, int], bool],
    ) -> list[tuple[str, int, int]]:
        """OffsetCommit. Returns once the accepted offsets are durable (one `store.save` per call).

        generation_id -1 with member id "" and no instance id is a simple (standalone) commit,
        allowed while the group is Empty or unknown. Blocks the loop for the save.
        """
        def all_(code: int) -> list[tuple[str, int, int]]:
            return [(t, p, code) for t, p, *_ in offsets]

        if self._closed:
            return all_(E.COORDINATOR_NOT_AVAILABLE)
        self._ensure_cleanup_timer()
        group = self._groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return all_(E.ILLEGAL_GENERATION)  # a member of a group this coordinator does not know
            if member_id or group_instance_id is not None:
                return all_(E.UNKNOWN_MEMBER_ID)
        else:
            error = self._validate_offset_commit(group, generation_id, member_id, group_instance_id)
            if error != E.NONE:
                return all_(error)
            if group.is_(GroupState.COMPLETING_REBALANCE):
                return all_(E.REBALANCE_IN_PROGRESS)
            member = group.members.get(member_id)
            if member is not None:  # Stable or PreparingRebalance: a commit proves liveness
                self._schedule_heartbeat(group, member)

        now = self._now_ms()
        results: list[tuple[str, int, int]] = []
        accepted: dict[TopicPartition, OffsetEntry] = {}
        for topic, partition, offset, leader_epoch, metadata in offsets:
            meta = metadata or ""
            if not topic_exists(topic, partition):
                results.append((topic, partition, E.UNKNOWN_TOPIC_OR_PARTITION))
            elif len(meta.encode("utf-8")) > self.offset_metadata_max_bytes:
                results.append((topic, partition, E.OFFSET_METADATA_TOO_LARGE))
            else:
                accepted[(topic, partition)] = OffsetEntry(offset, leader_epoch if leader_epoch >= 0 else -1, meta, now)
                results.append((topic, partition, E.NONE))
        if not accepted:
            return results
        if group is None:
            group = self._new_group(group_id)
            if group is None:
                return [(t, p, E.UNKNOWN_SERVER_ERROR if c == E.NONE else c) for t, p, c in results]
        new_offsets: GroupOffsets = {**group.offsets, **accepted}
        try:
            self._store.save(group_id, new_offsets)
        except Exception:
            log.exception("group %r: saving committed offsets failed", group_id)
            if not group.offsets and not group.members and not group.pending_members and group.generation_id == 0:
                self._groups.pop(group_id, None)  # do not keep a group created for nothing
            return [(t, p, E.COORDINATOR_NOT_AVAILABLE if c == E.NONE else c) for t, p, c in results]
        group.offsets = new_offsets
        return results

    @staticmethod
    def _validate_offset_commit(group: Group, generation_id: int, member_id: str, instance_id: str | None) -> int:
        if group.is_(GroupState.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE
        if generation_id >= 0 or member_id or instance_id is not None:
            error = GroupCoordinator._validate_current_member(group, member_id, instance_id)
            if error != E.NONE:
                return error
            if generation_id != group.generation_id:
                return E.ILLEGAL_GENERATION
            return E.NONE
        if not group.is_(GroupState.EMPTY):
            return E.UNKNOWN_MEMBER_ID  # only members commit into a group with members
        return E.NONE

    def fetch_offsets(
        self, group_id: str, partitions: list[tuple[str, int]] | None
    ) -> tuple[int, list[OffsetFetchItem]]:
        """OffsetFetch. `partitions=None`: every committed offset; a missing one reads offset -1."""
        if self._closed:
            return E.COORDINATOR_NOT_AVAILABLE, []
        group = self._groups.get(group_id)
        offsets: GroupOffsets = group.offsets if group is not None else {}
        if partitions is None:
            return E.NONE, [(t, p, e.offset, e.leader_epoch, e.metadata, E.NONE) for (t, p), e in sorted(offsets.items())]
        out: list[OffsetFetchItem] = []
        for topic, partition in partitions:
            entry = offsets.get((topic, partition))
            if entry is None:
                out.append((topic, partition, -1, -1, "", E.NONE))
            else:
                out.append((topic, partition, entry.offset, entry.leader_epoch, entry.metadata, E.NONE))
        return E.NONE, out

    # ==== admin ===================================================================================

    def list_groups(self, states_filter: list[str] | None = None) -> list[tuple[str, str, str]]:
        """(group_id, protocol_type or "", state); the filter is case-insensitive, empty = all."""
        if self._closed:
            return []
        wanted = {s.lower() for s in states_filter} if states_filter else None
        return [
            (g.group_id, g.protocol_type or "", g.state.value)
            for g in self._groups.values()
            if wanted is None or g.state.value.lower() in wanted
        ]

    def describe_group(self, group_id: str) -> GroupDescription:
        """DescribeGroups for one group; an unknown group is reported as state "Dead" (as Kafka < v6)."""
        if self._closed:
            return GroupDescription(E.COORDINATOR_NOT_AVAILABLE, group_id, "", "", "")
        group = self._groups.get(group_id)
        if group is None:
            return GroupDescription(E.NONE, group_id, GroupState.DEAD.value, "", "")
        stable = group.is_(GroupState.STABLE)
        protocol = (group.protocol_name or "") if stable else ""
        members = [
            MemberDescription(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.metadata(protocol) if stable else b"", m.assignment if stable else b"",
            )
            for m in group.members.values()
        ]
        return GroupDescription(E.NONE, group_id, group.state.value, group.protocol_type or "", protocol, members)

    def delete_groups(self, group_ids: Iterable[str]) -> list[tuple[str, int]]:
        """DeleteGroups: only Empty groups; their committed offsets are deleted durably."""
        out: list[tuple[str, int]] = []
        for group_id in dict.fromkeys(group_ids):
            if self._closed:
                out.append((group_id, E.COORDINATOR_NOT_AVAILABLE))
                continue
            group = self._groups.get(group_id)
            if group is None or group.is_(GroupState.DEAD):
                out.append((group_id, E.GROUP_ID_NOT_FOUND))
                continue
            if not group.is_(GroupState.EMPTY):
                out.append((group_id, E.NON_EMPTY_GROUP))
                continue
            if group.offsets:
                try:
                    self._store.save(group_id, {})
                except Exception:
                    log.exception("group %r: deleting committed offsets failed", group_id)
                    out.append((group_id, E.COORDINATOR_NOT_AVAILABLE))
                    continue
            self._kill(group)
            log.info("group %r deleted", group_id)
            out.append((group_id, E.NONE))
        return out

    def _kill(self, group: Group) -> None:
        for handle in group.pending_members.values():
            self._cancel(handle)
        group.pending_members.clear()
        self._cancel(group.join_timer)
        self._cancel(group.sync_timer)
        group.join_timer = group.sync_timer = None
        group.transition_to(GroupState.DEAD, self._now_ms())
        self._groups.pop(group.group_id, None)

    def cleanup_expired(self) -> int:
        """Offset retention (KIP-211) and removal of Empty groups without offsets; returns offsets expired.

        Offsets of an Empty group expire `offsets_retention_ms` after the later of their commit and
        the moment the group became Empty (groups loaded at startup count as Empty since then).
        Offsets of groups with members never expire here (Kafka's subscription-based expiry for
        Stable groups is not implemented). Runs every `offsets_retention_check_interval_ms`.
        """
        if self._closed:
            return 0
        expired_total = 0
        now = self._now_ms()
        for group in list(self._groups.values()):
            if not group.is_(GroupState.EMPTY):
                continue
            if self.offsets_retention_ms is not None and group.offsets:
                keep = {
                    k: e for k, e in group.offsets.items()
                    if now - max(e.commit_ts_ms, group.empty_since_ms) < self.offsets_retention_ms
                }
                if len(keep) != len(group.offsets):
                    try:
                        self._store.save(group.group_id, keep)
                    except Exception:
                        log.exception("group %r: saving after offset expiry failed", group.group_id)
                        continue
                    expired_total += len(group.offsets) - len(keep)
                    group.offsets = keep
            if not group.offsets and not group.pending_members:
                self._kill(group)
        return expired_total

    def close(self) -> None:
        """Stop: cancel every timer and answer parked JoinGroup/SyncGroup with NOT_COORDINATOR (as
        Kafka does when a coordinator unloads a group; clients rediscover the coordinator and
        rejoin). Afterwards every API answers COORDINATOR_NOT_AVAILABLE. Offsets are already durable."""
        if self._closed:
            return
        self._closed = True
        self._cancel(self._cleanup_timer)
        self._cleanup_timer = None
        for group in list(self._groups.values()):
            for member in list(group.members.values()):
                self._cancel(member.heartbeat_timer)
                member.heartbeat_timer = None
                group.complete_join(member, join_error(member.member_id, E.NOT_COORDINATOR))
                group.complete_sync(member, sync_error(E.NOT_COORDINATOR))
            self._kill(group)
        self._groups.clear()

    # ==== introspection (tests, metrics) ===========================================================

    def group_state(self, group_id: str) -> str | None:
        group = self._groups.get(group_id)
        return group.state.value if group is not None else None

    def generation(self, group_id: str) -> int | None:
        group = self._groups.get(group_id)
        return group.generation_id if group is not None else None

    def __len__(self) -> int:
        return len(self._groups)
