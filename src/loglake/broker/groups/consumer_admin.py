"""ConsumerGroupDescribe, and the consumer-group rules of OffsetCommit / OffsetFetch (KIP-848).

OffsetCommit: the request's generation field carries the member epoch. A commit with epoch < 0
and no member id is an admin commit, accepted only while the group has no members; otherwise
the member must exist (UNKNOWN_MEMBER_ID) and the epoch must be its current one
(STALE_MEMBER_EPOCH). OffsetFetch v9 carries the member id and epoch: when the epoch is given
(>= 0) the same rules apply; without them (admin clients, older versions) any fetch is served.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from loglake.broker.groups import errors as E
from loglake.broker.groups.consumer_model import Assignment, ConsumerGroupData
from loglake.broker.groups.group import Group

#: (topic id hex, topic name, partitions)
DescribedTopics = list[tuple[str, str, list[int]]]


@dataclass
class ConsumerMemberDescription:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_names: list[str]
    subscribed_regex: str | None
    assignment: DescribedTopics
    target: DescribedTopics


@dataclass
class ConsumerGroupDescription:
    error_code: int
    error_message: str | None
    group_id: str
    state: str = "Dead"
    group_epoch: int = -1
    assignment_epoch: int = -1
    assignor: str = ""
    members: list[ConsumerMemberDescription] = field(default_factory=list)


def describe(group_id: str, group: Group | None, names: Mapping[str, str]) -> ConsumerGroupDescription:
    """`names`: topic id -> name for topics not in the group's subscription (renamed, or new)."""
    if group is None or group.deleting:
        return ConsumerGroupDescription(E.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.", group_id)
    cg = group.consumer
    if cg is None:
        return ConsumerGroupDescription(E.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.", group_id)

    def topics(a: Assignment) -> DescribedTopics:
        out = []
        for tid, parts in sorted(a.items()):
            name = cg.subscription[tid][0] if tid in cg.subscription else names.get(tid, "")
            out.append((tid, name, sorted(parts)))
        return out

    members = [
        ConsumerMemberDescription(
            m.member_id, m.instance_id, m.rack_id, m.member_epoch, m.client_id, m.client_host,
            list(m.subscribed_names), m.subscribed_regex, topics(m.assigned), topics(cg.target.get(m.member_id, {})),
        )
        for m in cg.members.values()
    ]
    return ConsumerGroupDescription(E.NONE, None, group_id, cg.state(), cg.group_epoch, cg.assignment_epoch,
                                    cg.assignor, members)


def validate_commit(
    cg: ConsumerGroupData, member_id: str, member_epoch: int, partitions: list[tuple[str, int]] | None = None
) -> int:
    """Kafka's member-epoch check of OffsetCommit, with KIP-1251's assignment epochs: a commit at
    an older epoch than the member's is still taken when every partition in it is owned by the
    member since an epoch at or below the one sent (the commit raced the heartbeat that moved
    the member on, and fences nobody: no other member owns those partitions)."""
    if member_epoch < 0 and not cg.members:
        return E.NONE  # a simple commit into an empty group, whatever member id it carries
    member = cg.members.get(member_id)
    if member is None:
        return E.UNKNOWN_MEMBER_ID
    if member_epoch == member.member_epoch:
        return E.NONE
    if member_epoch > member.member_epoch or not partitions:
        return E.STALE_MEMBER_EPOCH
    ids = {names[0]: tid for tid, names in cg.subscription.items() if names}
    for topic, p in partitions:
        tid = ids.get(topic, "")
        owned = p in member.assigned.get(tid, frozenset()) or p in member.revoking.get(tid, frozenset())
        assigned_at = member.partition_epochs.get((tid, p))
        if not owned or assigned_at is None or assigned_at > member_epoch:
            return E.STALE_MEMBER_EPOCH
    return E.NONE


def validate_fetch(cg: ConsumerGroupData, member_id: str | None, member_epoch: int) -> int:
    if member_epoch < 0 and not member_id:
        return E.NONE
    member = cg.members.get(member_id or "")
    if member is None:
        return E.UNKNOWN_MEMBER_ID
    if member_epoch != member.member_epoch:
        return E.STALE_MEMBER_EPOCH
    return E.NONE


__all__ = [
    "ConsumerGroupDescription",
    "ConsumerMemberDescription",
    "describe",
    "validate_commit",
    "validate_fetch",
]
