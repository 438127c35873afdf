"""JoinGroup, SyncGroup, Heartbeat and LeaveGroup: validating requests and driving the group.

The state machine's phases and timers live in `rebalance.py`; this module decides what each
request does to a group in each state (Kafka's GroupCoordinator request paths). Results carry
Kafka error codes; nothing here raises for bad input.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

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
from loglake.broker.groups.rebalance import Rebalancer
from loglake.broker.groups.registry import GroupRegistry

log = logging.getLogger(__name__)


class Membership:
    def __init__(self, registry: GroupRegistry, rebalancer: Rebalancer) -> None:
        self.reg = registry
        self.rb = rebalancer
        self.limits = registry.limits

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
        if self.reg.closed:
            return join_error(member_id, E.COORDINATOR_NOT_AVAILABLE)
        if not group_id:
            return join_error(member_id, E.INVALID_GROUP_ID)
        if not self.limits.min_session_timeout_ms <= session_timeout_ms <= self.limits.max_session_timeout_ms:
            return join_error(member_id, E.INVALID_SESSION_TIMEOUT)
        # First occurrence of each protocol name wins (the wire collection is keyed by name).
        unique: dict[str, bytes] = {}
        for name, data in protocols:
            unique.setdefault(name, bytes(data))
        protocols = list(unique.items())
        if sum(len(m) for _, m in protocols) > self.limits.member_metadata_max_bytes:
            return join_error(member_id, E.INVALID_REQUEST)
        rebalance_timeout_ms = max(rebalance_timeout_ms, 0)

        group = self.reg.groups.get(group_id)
        created = group is None
        if group is not None and group.deleting:
            return join_error(member_id, E.COORDINATOR_NOT_AVAILABLE)  # retried: by then it is gone
        if group is None:
            if member_id:
                return join_error(member_id, E.UNKNOWN_MEMBER_ID)
            group = self.reg.new_group(group_id)
            if group is None:
                return join_error(member_id, E.UNKNOWN_SERVER_ERROR)

        outcome: JoinResult | asyncio.Future[JoinResult]
        if not self._accept_joining_member(group, member_id):
            removed = group.remove(member_id)
            if removed is not None:
                self.rb.drop_member_timers_and_waiters(group, removed)
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
        self.rb.maybe_complete_join_phase(group)
        if created and group.is_(GroupState.EMPTY) and not group.members and not group.pending_members:
            self.reg.groups.pop(group_id, None)  # the join failed: keep no trace of the group
        return outcome

    def _accept_joining_member(self, group: Group, member_id: str) -> bool:
        member = group.members.get(member_id)
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.is_(GroupState.PREPARING_REBALANCE):
            return (member is not None and member.awaiting_join) or group.num_awaiting_join < self.limits.group_max_size
        return member is not None or len(group.members) < self.limits.group_max_size

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
            if len(group.pending_members) >= self.limits.group_max_size:
                return join_error("", E.GROUP_MAX_SIZE_REACHED)
            group.pending_members[new_member_id] = self.reg.call_later(
                session_timeout_ms, lambda: self.rb.expire_pending_member(group, new_member_id)
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
            self.reg.cancel(group.pending_members.get(member_id))
            return self._add_member_and_rebalance(
                group, member_id, None, protocol_type, protocols, session_timeout_ms,
                rebalance_timeout_ms, client_id, client_host, reason,
            )
        error = self.rb.validate_current_member(group, member_id, instance_id)
        if error != E.NONE:
            return join_error(member_id, error)
        member = group.members[member_id]
        if group.is_(GroupState.PREPARING_REBALANCE):
            return self._update_member_and_rebalance(group, member, protocols, session_timeout_ms, rebalance_timeout_ms)
        if group.is_(GroupState.COMPLETING_REBALANCE):
            if member.matches(protocols):
                # Lost JoinGroup response: answer again with the current generation.
                return self.rb.current_join_result(group, member_id, with_members=group.leader_id == member_id)
            return self._update_member_and_rebalance(group, member, protocols, session_timeout_ms, rebalance_timeout_ms)
        if group.is_(GroupState.STABLE):
            if group.leader_id == member_id or not member.matches(protocols):
                # A leader JoinGroup forces a rebalance (e.g. topic metadata changed).
                return self._update_member_and_rebalance(
                    group, member, protocols, session_timeout_ms, rebalance_timeout_ms
                )
            return self.rb.current_join_result(group, member_id, with_members=False)
        return join_error(member_id, E.UNKNOWN_MEMBER_ID)  # Empty: cannot have members

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
        waiter: asyncio.Future[JoinResult] = self.reg.get_loop().create_future()
        group.add(member, waiter)
        # A new member cannot heartbeat while parked in JoinGroup: bound its wait instead.
        self.rb.schedule_heartbeat(group, member, self.limits.new_member_join_timeout_ms)
        log.info("group %r: adding member %s (instance %s, client %s); reason: %s",
                 group.group_id, member_id, instance_id, client_id, reason)
        self.rb.maybe_prepare_rebalance_or_complete_join(group)
        return waiter

    def _update_member_and_rebalance(
        self,
        group: Group,
        member: Member,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
    ) -> asyncio.Future[JoinResult]:
        waiter: asyncio.Future[JoinResult] = self.reg.get_loop().create_future()
        superseded = group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, waiter)
        if superseded is not None and not superseded.done():
            superseded.set_result(join_error(member.member_id, E.REBALANCE_IN_PROGRESS))
        self.rb.maybe_prepare_rebalance_or_complete_join(group)
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
        self.rb.schedule_heartbeat(group, member)
        log.info("group %r: static member %s replaced %s with %s in %s; reason: %s",
                 group.group_id, instance_id, old_member_id, new_member_id, group.state.value, reason)
        waiter: asyncio.Future[JoinResult] = self.reg.get_loop().create_future()
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
                self._answer_once_saved(group, member, waiter, result)
            else:
                self.rb.maybe_prepare_rebalance_or_complete_join(group)
        elif group.is_(GroupState.COMPLETING_REBALANCE):
            # The leader may be assigning to the old member id: start over.
            self.rb.prepare_rebalance(group, f"static member {instance_id} rejoined during CompletingRebalance")
        return waiter

    def _answer_once_saved(
        self, group: Group, member: Member, waiter: asyncio.Future[JoinResult], result: JoinResult
    ) -> None:
        """The new member id of a static member is part of the Stable state: save it before the
        member learns it (as Kafka does), so that a restart never resumes the fenced id."""
        failed = join_error(member.member_id, E.COORDINATOR_NOT_AVAILABLE)
        try:
            saved = self.reg.record(
                group, f"state with static member {member.group_instance_id}",
                lambda: self.reg.store.save_state(group.group_id, encode_stable(group)),
            )
        except ChangeQueueFull:
            group.complete_join(member, failed)
            return

        def answer(done: asyncio.Future[bool]) -> None:
            if member.join_waiter is waiter:  # else a rebalance, a fence or close() answered it
                group.complete_join(member, result if done.result() else failed)

        saved.add_done_callback(answer)

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
        if self.reg.closed:
            return sync_error(E.COORDINATOR_NOT_AVAILABLE)
        if not group_id:
            return sync_error(E.INVALID_GROUP_ID)
        group = self.reg.groups.get(group_id)
        if group is None or group.is_(GroupState.EMPTY):
            return sync_error(E.UNKNOWN_MEMBER_ID)
        if group.is_(GroupState.DEAD):
            return sync_error(E.COORDINATOR_NOT_AVAILABLE)
        error = self.rb.validate_current_member(group, member_id, instance_id)
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
            self.rb.remove_pending_sync_member(group, member_id)
            self.rb.schedule_heartbeat(group, member)
            return SyncResult(E.NONE, group.protocol_type, group.protocol_name, member.assignment)
        # CompletingRebalance
        group.complete_sync(member, sync_error(E.REBALANCE_IN_PROGRESS))  # a duplicate SyncGroup supersedes
        waiter: asyncio.Future[SyncResult] = self.reg.get_loop().create_future()
        member.sync_waiter = waiter
        self.rb.remove_pending_sync_member(group, member_id)
        if group.leader_id == member_id:
            self.rb.complete_assignment(group, member_id, assignments)
        return waiter

    # ==== Heartbeat / LeaveGroup ================================================================

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> int:
        if self.reg.closed:
            return E.COORDINATOR_NOT_AVAILABLE
        if not group_id:
            return E.INVALID_GROUP_ID
        group = self.reg.groups.get(group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        if group.is_(GroupState.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE
        error = self.rb.validate_current_member(group, member_id, group_instance_id)
        if error != E.NONE:
            return error
        if generation_id != group.generation_id:
            return E.ILLEGAL_GENERATION
        if group.is_(GroupState.EMPTY):
            return E.UNKNOWN_MEMBER_ID
        self.rb.schedule_heartbeat(group, group.members[member_id])
        if group.is_(GroupState.PREPARING_REBALANCE):
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    def leave_group(
        self, group_id: str, members: list[tuple[str, str | None]]
    ) -> tuple[int, list[tuple[str, str | None, int]]]:
        """LeaveGroup (v3+ batch form). For v0-2 the handler answers with the single member's error.

        A member id of "" with a group instance id removes that static member (admin removal).
        """
        if self.reg.closed:
            return E.COORDINATOR_NOT_AVAILABLE, []
        if not group_id:
            return E.INVALID_GROUP_ID, []
        group = self.reg.groups.get(group_id)
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
                self.rb.remove_member_and_update_group(group, group.members[current])
                results.append((member_id, instance_id, E.NONE))
            elif member_id in group.pending_members:
                self.reg.cancel(group.pending_members.get(member_id))
                group.remove(member_id)
                self.rb.maybe_complete_join_phase(group)
                results.append((member_id, instance_id, E.NONE))
            else:
                error = self.rb.validate_current_member(group, member_id, instance_id)
                if error == E.NONE:
                    log.info("group %r: member %s left", group.group_id, member_id)
                    self.rb.remove_member_and_update_group(group, group.members[member_id])
                results.append((member_id, instance_id, error))
        return E.NONE, results
