"""The group state machine's moving parts: rebalance phases, their timers, member liveness.

Everything here runs on the event loop, driven by `membership.py` (requests) and by timers;
`group.py` holds the state table and the theory of operation. The one transition that waits
for the store is CompletingRebalance -> Stable: the leader's assignment is saved with the group
state (`complete_assignment`) and only once that is durable do the members get it, as Kafka's
coordinator does, so an assignment a consumer holds always survives a coordinator restart.
"""

from __future__ import annotations

import logging

from loglake.broker.groups import errors as E
from loglake.broker.groups.changes import ChangeQueueFull
from loglake.broker.groups.group import (
    Group,
    GroupState,
    JoinResult,
    Member,
    SyncResult,
    join_error,
    sync_error,
)
from loglake.broker.groups.persistence import encode_stable
from loglake.broker.groups.registry import GroupRegistry

log = logging.getLogger(__name__)


class Rebalancer:
    def __init__(self, registry: GroupRegistry) -> None:
        self.reg = registry
        self.limits = registry.limits

    def start_restored(self, group: Group) -> None:
        """Arm a loaded group's member sessions from now: members that do not come back expire."""
        for member in group.members.values():
            self.schedule_heartbeat(group, member)

    def current_join_result(self, group: Group, member_id: str, *, with_members: bool) -> JoinResult:
        return JoinResult(
            E.NONE,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            member_id,
            group.current_member_metadata() if with_members else [],
        )

    # ==== rebalance machinery =====================================================================

    def maybe_prepare_rebalance_or_complete_join(self, group: Group) -> None:
        if group.can_rebalance():
            self.prepare_rebalance(group, "membership changed")
        else:
            self.maybe_complete_join_phase(group)

    def maybe_complete_join_phase(self, group: Group) -> None:
        if (
            group.is_(GroupState.PREPARING_REBALANCE)
            and group.has_all_members_joined()
            and group.previous_state is not GroupState.EMPTY  # the initial delay always runs out
        ):
            self.complete_join(group)

    def prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.is_(GroupState.COMPLETING_REBALANCE):
            self.reset_and_propagate_assignment_error(group, E.REBALANCE_IN_PROGRESS)
        self.remove_sync_expiration(group)
        self.reg.cancel(group.join_timer)
        group.join_timer = None
        initial = group.is_(GroupState.EMPTY)
        if initial:
            delay = self.limits.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            group.new_member_added = False
            group.join_timer = self.reg.call_later(delay, lambda: self._initial_delay_expired(group, delay, remaining))
        log.info("group %r: preparing rebalance from %s, generation %d (%s)",
                 group.group_id, group.state.value, group.generation_id, reason)
        group.transition_to(GroupState.PREPARING_REBALANCE, self.reg.now_ms())
        if not initial:
            self._complete_join_else_schedule(group)

    def _complete_join_else_schedule(self, group: Group) -> None:
        if group.has_all_members_joined():
            self.complete_join(group)
        else:
            group.join_timer = self.reg.call_later(group.rebalance_timeout_ms(), lambda: self._join_timer_fired(group))

    def _initial_delay_expired(self, group: Group, delay: int, remaining: int) -> None:
        if not self.reg.live(group) or not group.is_(GroupState.PREPARING_REBALANCE):
            return
        group.join_timer = None
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            new_delay = min(self.limits.initial_rebalance_delay_ms, remaining)
            new_remaining = max(remaining - delay, 0)
            group.join_timer = self.reg.call_later(
                new_delay, lambda: self._initial_delay_expired(group, new_delay, new_remaining)
            )
        else:
            self.complete_join(group)

    def _join_timer_fired(self, group: Group) -> None:
        group.join_timer = None
        if self.reg.live(group) and group.is_(GroupState.PREPARING_REBALANCE):
            self.complete_join(group)

    def complete_join(self, group: Group) -> None:
        """End the join phase: drop dynamic members that did not rejoin, bump the generation."""
        self.reg.cancel(group.join_timer)
        group.join_timer = None
        gone = [m for m in group.not_yet_rejoined() if m.group_instance_id is None]
        for member in gone:
            group.remove(member.member_id)
            self.drop_member_timers_and_waiters(group, member)
        if gone:
            log.info("group %r: removed members that did not rejoin: %s",
                     group.group_id, [m.member_id for m in gone])
        if group.is_(GroupState.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Only static members that have not rejoined: wait another rebalance timeout
            # (their sessions expire meanwhile if they are really gone).
            log.warning("group %r: no member rejoined; extending the join phase", group.group_id)
            group.join_timer = self.reg.call_later(group.rebalance_timeout_ms(), lambda: self._join_timer_fired(group))
            return
        group.init_next_generation(self.reg.now_ms())
        if group.is_(GroupState.EMPTY):
            log.info("group %r: generation %d is empty", group.group_id, group.generation_id)
            self.reg.save_empty_state(group)
            return
        log.info("group %r: generation %d with %d members, protocol %s, leader %s",
                 group.group_id, group.generation_id, len(group.members), group.protocol_name, group.leader_id)
        for member in list(group.members.values()):
            is_leader = group.leader_id == member.member_id
            group.complete_join(member, self.current_join_result(group, member.member_id, with_members=is_leader))
            self.schedule_heartbeat(group, member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        generation = group.generation_id
        group.sync_timer = self.reg.call_later(
            group.rebalance_timeout_ms(), lambda: self._expire_pending_sync(group, generation)
        )

    def _expire_pending_sync(self, group: Group, generation: int) -> None:
        if not self.reg.live(group) or group.generation_id != generation:
            return
        group.sync_timer = None
        if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE) and group.pending_sync:
            late = sorted(group.pending_sync)
            for member_id in late:
                member = group.remove(member_id)
                if member is not None:
                    self.drop_member_timers_and_waiters(group, member)
            log.info("group %r: removed members that did not SyncGroup in time: %s", group.group_id, late)
            self.prepare_rebalance(group, "pending SyncGroup expired")

    def remove_sync_expiration(self, group: Group) -> None:
        group.pending_sync.clear()
        self.reg.cancel(group.sync_timer)
        group.sync_timer = None

    def remove_pending_sync_member(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync or group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            self.reg.cancel(group.sync_timer)
            group.sync_timer = None

    def reset_and_propagate_assignment_error(self, group: Group, error: int) -> None:
        for member in group.members.values():
            member.assignment = b""
        self.propagate_assignment(group, error)

    def propagate_assignment(self, group: Group, error: int) -> None:
        ok = error == E.NONE
        for member in list(group.members.values()):
            result = SyncResult(
                error,
                group.protocol_type if ok else None,
                group.protocol_name if ok else None,
                member.assignment,
            )
            if group.complete_sync(member, result):
                self.schedule_heartbeat(group, member)


    # ==== the leader's assignment: saved, then distributed ==========================================

    def complete_assignment(self, group: Group, leader_id: str, assignments: list[tuple[str, bytes]]) -> None:
        """The leader's SyncGroup in CompletingRebalance: save the Stable state with the assignment;
        once durable, hand it out and go Stable. Parked SyncGroups are answered then."""
        given = dict(assignments)  # last entry per member wins; unknown member ids are ignored
        missing = [m for m in group.members if m not in given]
        if missing:
            log.warning("group %r: leader gave no assignment to %s; sending empty ones", group.group_id, missing)
        plan = {m: bytes(given.get(m, b"")) for m in group.members}
        generation = group.generation_id
        try:
            saved = self.reg.record(
                group, f"generation {generation} state",
                lambda: self.reg.store.save_state(group.group_id, encode_stable(group, plan)),
            )
        except ChangeQueueFull:
            self._assignment_saved(group, generation, plan, leader_id, ok=False)
            return
        saved.add_done_callback(
            lambda done: self._assignment_saved(group, generation, plan, leader_id, ok=done.result())
        )

    def _assignment_saved(
        self, group: Group, generation: int, plan: dict[str, bytes], leader_id: str, *, ok: bool
    ) -> None:
        if not self.reg.live(group) or group.generation_id != generation or not group.is_(GroupState.COMPLETING_REBALANCE):
            return  # a rebalance started meanwhile and answered the parked SyncGroups
        if not ok:
            self.reset_and_propagate_assignment_error(group, E.COORDINATOR_NOT_AVAILABLE)
            self.prepare_rebalance(group, "saving the assignment failed")
            return
        for member in group.members.values():
            member.assignment = plan.get(member.member_id, b"")
        log.info("group %r: assignment received from leader %s for generation %d",
                 group.group_id, leader_id, generation)
        self.propagate_assignment(group, E.NONE)
        group.transition_to(GroupState.STABLE, self.reg.now_ms())

    # ==== member liveness ==========================================================================

    def schedule_heartbeat(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        self.reg.cancel(member.heartbeat_timer)
        member_id = member.member_id
        member.heartbeat_timer = self.reg.call_later(
            member.session_timeout_ms if timeout_ms is None else timeout_ms,
            lambda: self._expire_heartbeat(group, member, member_id),
        )

    def _expire_heartbeat(self, group: Group, member: Member, member_id: str) -> None:
        if not self.reg.live(group) or group.members.get(member_id) is not member:
            return  # removed, or replaced under a new id (static member)
        member.heartbeat_timer = None
        if member.has_satisfied_heartbeat():
            return  # parked in JoinGroup/SyncGroup; rearmed when the rebalance answers it
        log.info("group %r: member %s session expired", group.group_id, member_id)
        self.remove_member_and_update_group(group, member)

    def expire_pending_member(self, group: Group, member_id: str) -> None:
        if not self.reg.live(group) or member_id not in group.pending_members:
            return
        log.info("group %r: pending member %s never came back", group.group_id, member_id)
        group.remove(member_id)
        self.maybe_complete_join_phase(group)

    def remove_member_and_update_group(self, group: Group, member: Member) -> None:
        group.complete_join(member, join_error("", E.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        self.drop_member_timers_and_waiters(group, member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self.maybe_prepare_rebalance_or_complete_join(group)
        elif group.is_(GroupState.PREPARING_REBALANCE):
            self.maybe_complete_join_phase(group)

    def drop_member_timers_and_waiters(self, group: Group, member: Member) -> None:
        """After `group.remove`: no timer may outlive a member, no parked request may hang."""
        self.reg.cancel(member.heartbeat_timer)
        member.heartbeat_timer = None
        if member.join_waiter is not None:
            waiter, member.join_waiter = member.join_waiter, None
            if not waiter.done():
                waiter.set_result(join_error("", E.UNKNOWN_MEMBER_ID))
        group.complete_sync(member, sync_error(E.UNKNOWN_MEMBER_ID))

    @staticmethod
    def validate_current_member(group: Group, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            current = group.static_members.get(instance_id)
            if current is None:
                return E.UNKNOWN_MEMBER_ID
            if current != member_id:
                return E.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return E.UNKNOWN_MEMBER_ID
        return E.NONE
