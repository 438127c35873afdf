"""ListGroups, DescribeGroups, DeleteGroups, and the periodic offset cleanup (retention, KIP-211).

Deletions and expiries are store changes like commits: recorded, awaited without blocking the
loop, applied to memory when durable (changes.py). While a deletion is in flight the group is
marked `deleting` and answers retriable errors, so nothing new can slip in behind it.

Cleanup, every `offsets_retention_check_interval_ms`:
* offsets of partitions that no longer exist (`topic_exists`) expire in every group, as Kafka
  drops the offsets of a deleted topic;
* an Empty group's offsets expire `offsets_retention_ms` (offsets.retention.minutes) after the
  later of their commit and the moment the group became Empty (saved with the group's Empty
  state, so a restart does not reset it);
* an Empty group left with no offsets (and no pending member) is deleted from the store.
Groups with changes still in flight are skipped until the next round, so an expiry can never
overtake a commit that is not applied yet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from loglake.broker.groups import errors as E
from loglake.broker.groups.changes import ChangeQueueFull
from loglake.broker.groups.group import Group, GroupState
from loglake.broker.groups.registry import GroupRegistry
from loglake.broker.groups.store import TopicPartition

log = logging.getLogger(__name__)


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


class GroupAdmin:
    def __init__(self, registry: GroupRegistry) -> None:
        self.reg = registry
        self.limits = registry.limits
        self._cleanup_timer: asyncio.TimerHandle | None = None
        self._cleanup_task: asyncio.Task[None] | None = None

    # ==== ListGroups / DescribeGroups =============================================================

    def list_groups(
        self, states_filter: list[str] | None = None, types_filter: list[str] | None = None
    ) -> list[tuple[str, str, str, str]]:
        """(group_id, protocol_type or "", state, "classic" | "consumer"); filters are
        case-insensitive, empty = all. A consumer-protocol group shows its KIP-848 state."""
        if self.reg.closed:
            return []
        wanted = {s.lower() for s in states_filter} if states_filter else None
        types = {t.lower() for t in types_filter} if types_filter else None
        out = []
        for g in self.reg.groups.values():
            if g.consumer is not None:
                row = (g.group_id, "consumer", g.consumer.state(), "consumer")
            else:
                row = (g.group_id, g.protocol_type or "", g.state.value, "classic")
            if (wanted is None or row[2].lower() in wanted) and (types is None or row[3] in types):
                out.append(row)
        return out

    def describe_group(self, group_id: str) -> GroupDescription:
        """DescribeGroups for one group; an unknown group is reported as state "Dead" (as Kafka < v6)."""
        if self.reg.closed:
            return GroupDescription(E.COORDINATOR_NOT_AVAILABLE, group_id, "", "", "")
        group = self.reg.groups.get(group_id)
        if group is None:
            return GroupDescription(E.NONE, group_id, GroupState.DEAD.value, "", "")
        if group.consumer is not None:  # Kafka: not a classic group (the handler words it per version)
            return GroupDescription(E.GROUP_ID_NOT_FOUND, group_id, GroupState.DEAD.value, "", "")
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

    # ==== DeleteGroups ============================================================================

    async def delete_groups(self, group_ids: Iterable[str]) -> list[tuple[str, int]]:
        """DeleteGroups: only Empty groups; answered once the deletion (offsets and state) is durable."""
        codes: dict[str, int] = {}
        pending: list[tuple[str, asyncio.Future[bool]]] = []
        for group_id in dict.fromkeys(group_ids):
            group = self.reg.groups.get(group_id)
            if self.reg.closed:
                codes[group_id] = E.COORDINATOR_NOT_AVAILABLE
            elif group is None or group.is_(GroupState.DEAD):
                codes[group_id] = E.GROUP_ID_NOT_FOUND
            elif group.deleting:
                codes[group_id] = E.COORDINATOR_NOT_AVAILABLE  # retried: then GROUP_ID_NOT_FOUND
            elif not group.has_no_members():
                codes[group_id] = E.NON_EMPTY_GROUP
            else:
                try:
                    pending.append((group_id, self._delete(group, "DeleteGroups")))
                except ChangeQueueFull:
                    codes[group_id] = E.COORDINATOR_NOT_AVAILABLE
                    continue
                codes[group_id] = E.NONE
        for group_id, done in pending:
            if not await done:
                codes[group_id] = E.COORDINATOR_NOT_AVAILABLE
        return list(codes.items())

    def _delete(self, group: Group, why: str) -> asyncio.Future[bool]:
        """Record the group's deletion; it leaves memory once that is durable. Raises ChangeQueueFull."""

        def apply() -> None:
            if self.reg.live(group):
                self.reg.kill(group)
                log.info("group %r deleted (%s)", group.group_id, why)

        def settled(done: asyncio.Future[bool]) -> None:
            if not done.result():
                group.deleting = False  # still there: it may be deleted again later

        done = self.reg.record(group, "deletion", lambda: self.reg.store.delete_group(group.group_id), apply)
        group.deleting = True
        done.add_done_callback(settled)
        return done

    # ==== offset cleanup ==========================================================================

    def ensure_cleanup_timer(self) -> None:
        """Arm the periodic cleanup (lazily: the loop may not run yet at construction)."""
        if self._cleanup_timer is not None or self.reg.closed:
            return
        if self.limits.offsets_retention_ms is None and self.reg.topic_exists is None:
            return
        if self.reg.running_loop() is None:
            return  # embedded use outside a loop: cleanup only via cleanup_expired()
        self._cleanup_timer = self.reg.call_later(self.limits.offsets_retention_check_interval_ms, self._on_timer)

    def _on_timer(self) -> None:
        self._cleanup_timer = None
        if self.reg.closed or self._cleanup_task is not None:
            return
        self._cleanup_task = self.reg.get_loop().create_task(self._run_cleanup())

    async def _run_cleanup(self) -> None:
        try:
            await self.cleanup_expired()
        except Exception:
            log.exception("consumer-group offset cleanup failed")
        finally:
            self._cleanup_task = None
            self.ensure_cleanup_timer()

    def stop(self) -> None:
        self.reg.cancel(self._cleanup_timer)
        self._cleanup_timer = None
        if self._cleanup_task is not None:
            self._cleanup_task.cancel()
            self._cleanup_task = None

    async def cleanup_expired(self) -> int:
        """One cleanup round (see the module docstring); returns how many offsets expired durably."""
        if self.reg.closed:
            return 0
        now = self.reg.now_ms()
        retention = self.limits.offsets_retention_ms
        exists = self.reg.topic_exists
        pending: list[tuple[int, asyncio.Future[bool]]] = []
        for group in list(self.reg.groups.values()):
            if group.deleting or group.changes:
                continue  # changes in flight: look again next round
            gone = [
                tp for tp, e in group.offsets.items()
                if (exists is not None and not exists(*tp))
                or (retention is not None and group.has_no_members()
                    and now - max(e.commit_ts_ms, group.empty_since_ms) >= retention)
            ]
            try:
                if group.has_no_members() and len(gone) == len(group.offsets):
                    pending.append((len(gone), self._delete(group, f"retention: {len(gone)} offsets expired")))
                elif gone:
                    pending.append((len(gone), self._expire(group, gone)))
            except ChangeQueueFull:
                continue
        expired = 0
        for count, done in pending:
            if await done:
                expired += count
        return expired

    def _expire(self, group: Group, partitions: list[TopicPartition]) -> asyncio.Future[bool]:
        def apply() -> None:
            for tp in partitions:
                group.offsets.pop(tp, None)
            log.info("group %r: %d committed offsets expired", group.group_id, len(partitions))

        return self.reg.record(
            group, f"expiry of {len(partitions)} offsets",
            lambda: self.reg.store.expire(group.group_id, partitions), apply,
        )
