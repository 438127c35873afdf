"""OffsetCommit and OffsetFetch.

A commit is validated against the group (member, generation, state), then recorded through the
store with only this request's entries and awaited without blocking the loop; the entries are
applied to the group's in-memory offsets when that record is durable, in the order commits were
made (changes.py), and only then is the commit answered. A failed record answers
COORDINATOR_NOT_AVAILABLE for the accepted partitions (clients retry) and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from loglake.broker.groups import errors as E
from loglake.broker.groups.changes import ChangeQueueFull
from loglake.broker.groups.group import Group, GroupState
from loglake.broker.groups.rebalance import Rebalancer
from loglake.broker.groups.registry import GroupRegistry
from loglake.broker.groups.store import GroupOffsets, OffsetEntry, TopicPartition

log = logging.getLogger(__name__)

OffsetCommitItem = tuple[str, int, int, int, str | None]  # topic, partition, offset, leader_epoch, metadata
OffsetFetchItem = tuple[str, int, int, int, str, int]  # topic, partition, offset, leader_epoch, metadata, error


class Offsets:
    def __init__(self, registry: GroupRegistry, rebalancer: Rebalancer) -> None:
        self.reg = registry
        self.rb = rebalancer
        self.limits = registry.limits

    async def commit(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[OffsetCommitItem],
        *,
        topic_exists: Callable[[str, int], bool],
        trusted: bool = False,
    ) -> list[tuple[str, int, int]]:
        """OffsetCommit; answers once the accepted offsets are durable (one store record per call).

        A negative generation_id is a simple (standalone) commit, allowed while the group is Empty
        or unknown whatever member id comes with it (Kafka 4.0: a KIP-848 consumer that assign()s
        sends its client-generated member id with -1). `trusted`: offsets of a committed
        transaction (validated when TxnOffsetCommit took them), written whatever the group's state.
        """

        def all_(code: int) -> list[tuple[str, int, int]]:
            return [(t, p, code) for t, p, *_ in offsets]

        if self.reg.closed:
            return all_(E.COORDINATOR_NOT_AVAILABLE)
        group = self.reg.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return all_(E.ILLEGAL_GENERATION)  # a member of a group this coordinator does not know
        elif not trusted:
            if group.deleting:
                return all_(E.COORDINATOR_NOT_AVAILABLE)  # retried: by then the group is gone
            error = self._validate(group, generation_id, member_id, group_instance_id)
            if error != E.NONE:
                return all_(error)
            if group.is_(GroupState.COMPLETING_REBALANCE):
                return all_(E.REBALANCE_IN_PROGRESS)
            member = group.members.get(member_id)
            if member is not None:  # Stable or PreparingRebalance: a commit proves liveness
                self.rb.schedule_heartbeat(group, member)

        now = self.reg.now_ms()
        results: list[tuple[str, int, int]] = []
        accepted: GroupOffsets = {}
        for topic, partition, offset, leader_epoch, metadata in offsets:
            meta = metadata or ""
            if not topic_exists(topic, partition):
                results.append((topic, partition, E.UNKNOWN_TOPIC_OR_PARTITION))
            elif len(meta.encode("utf-8")) > self.limits.offset_metadata_max_bytes:
                results.append((topic, partition, E.OFFSET_METADATA_TOO_LARGE))
            else:
                accepted[(topic, partition)] = OffsetEntry(offset, leader_epoch if leader_epoch >= 0 else -1, meta, now)
                results.append((topic, partition, E.NONE))
        if not accepted:
            return results
        if group is None:
            group = self.reg.new_group(group_id)
            if group is None:
                return [(t, p, E.UNKNOWN_SERVER_ERROR if c == E.NONE else c) for t, p, c in results]
        target = group

        def apply() -> None:
            target.offsets.update(accepted)

        try:
            applied = self.reg.record(
                group, f"commit of {len(accepted)} offsets", lambda: self.reg.store.commit(group_id, accepted), apply
            )
            ok = await applied
        except ChangeQueueFull:
            ok = False
        if not ok:
            self.reg.forget_if_unused(group)  # do not keep a group created for nothing
            return [(t, p, E.COORDINATOR_NOT_AVAILABLE if c == E.NONE else c) for t, p, c in results]
        return results

    def _validate(self, group: Group, generation_id: int, member_id: str, instance_id: str | None) -> int:
        if group.is_(GroupState.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.is_(GroupState.EMPTY):
            return E.NONE  # a simple commit (Kafka's ClassicGroup.validateOffsetCommit)
        if generation_id >= 0 or member_id or instance_id is not None:
            error = self.rb.validate_current_member(group, member_id, instance_id)
            if error != E.NONE:
                return error
            if generation_id != group.generation_id:
                return E.ILLEGAL_GENERATION
            return E.NONE
        if not group.is_(GroupState.EMPTY):
            return E.UNKNOWN_MEMBER_ID  # only members commit into a group with members
        return E.NONE

    def fetch(self, group_id: str, partitions: list[TopicPartition] | None) -> tuple[int, list[OffsetFetchItem]]:
        """OffsetFetch. `partitions=None`: every committed offset; a missing one reads offset -1."""
        if self.reg.closed:
            return E.COORDINATOR_NOT_AVAILABLE, []
        group = self.reg.groups.get(group_id)
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
