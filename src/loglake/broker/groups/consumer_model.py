"""A consumer group of KIP-848's protocol: members, epochs, target assignment (no logic of requests).

Kafka's model (ConsumerGroup / ConsumerGroupMember), kept on the classic `Group` object as
`group.consumer`, so offsets, the change queue, deletion and retention are shared with classic
groups:

* the **group epoch** goes up whenever what the assignment depends on changes: a member joins or
  leaves or changes its subscription, or a subscribed topic appears or changes partitions;
* the **target assignment** is computed by the server-side assignor for one group epoch (its
  **assignment epoch**);
* each member moves towards its target on its own heartbeats (reconcile.py); its **member
  epoch** becomes the assignment epoch once it has nothing left to revoke.

Topics are keyed by topic id (32 hex characters), as on the wire; `subscription` keeps the
name and partition count of each subscribed topic the target was computed for.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

#: topic id (hex) -> partitions
Assignment = dict[str, frozenset[int]]
#: topic id (hex) -> (name, partition count)
TopicMetadata = dict[str, tuple[str, int]]
#: What a member's resolved topics depend on: its subscribed names, its regex and, for a regex
#: that ACLs narrow, (principal, host).
SubscriptionKey = tuple[tuple[str, ...], str | None, tuple[str, str] | None]

LEAVE_EPOCH = -1  # MemberEpoch of a member that leaves for good
STATIC_LEAVE_EPOCH = -2  # MemberEpoch of a static member that leaves and will come back


class MemberState(enum.Enum):
    STABLE = "stable"  # at its target for its epoch
    UNREVOKED_PARTITIONS = "unrevoked_partitions"  # must revoke partitions before it moves on
    UNRELEASED_PARTITIONS = "unreleased_partitions"  # waits for partitions others still own


@dataclass(eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    subscribed_names: tuple[str, ...] = ()
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    #: (principal, host) of the member's last heartbeat, which its regex matches are narrowed to
    #: (topics it may DESCRIBE); None until a heartbeat since this broker started (not saved)
    principal: tuple[str, str] | None = None
    member_epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)
    #: KIP-1251: the member epoch at which each partition it owns was assigned to it (not
    #: saved: after a restart a partition counts as assigned at the member's epoch then)
    partition_epochs: dict[tuple[str, int], int] = field(default_factory=dict)
    session_timer: asyncio.TimerHandle | None = None
    revocation_timer: asyncio.TimerHandle | None = None


class ConsumerGroupData:
    """The consumer-protocol part of a group (`Group.consumer`)."""

    def __init__(self) -> None:
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerMember] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.target: dict[str, Assignment] = {}  # member id -> its target assignment
        self.subscription: TopicMetadata = {}  # what the target was computed for
        self.assignor = ""  # the assignor of the current target
        self.resolved_key: object = None  # what `subscription` was last resolved from (consumer.py; not saved)
        #: each distinct subscription's resolved topic names at `resolved_key` (not saved)
        self.resolved_sets: dict[SubscriptionKey, frozenset[str]] | None = None
        #: regexes a member brought in the heartbeat being handled: as Kafka resolves a new regex
        #: asynchronously, its topics count from the group's next heartbeat on, after the
        #: literal topics were assigned (consumer.py; not saved: a loaded group's are resolved)
        self.unresolved_regexes: set[str] = set()

    def state(self) -> str:
        """Kafka's consumer group states: Empty, Assigning, Reconciling, Stable."""
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return "Reconciling"
        return "Stable"

    def add(self, member: ConsumerMember) -> None:
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id

    def remove(self, member_id: str) -> ConsumerMember | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.instance_id is not None and self.static_members.get(member.instance_id) == member_id:
            del self.static_members[member.instance_id]
        self.target.pop(member_id, None)
        return member

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        member_id = self.static_members.get(instance_id)
        return self.members.get(member_id) if member_id is not None else None

    def owners(self, exclude: str) -> dict[tuple[str, int], str]:
        """(topic id, partition) -> member id, for partitions other members own or still revoke."""
        out: dict[tuple[str, int], str] = {}
        for m in self.members.values():
            if m.member_id == exclude:
                continue
            for owned in (m.assigned, m.revoking):
                for tid, parts in owned.items():
                    for p in parts:
                        out[(tid, p)] = m.member_id
        return out


def assignment_of(pairs: list[tuple[str, list[int]]] | None) -> Assignment | None:
    """An assignment from wire pairs (topic id hex, partitions); None stays None."""
    if pairs is None:
        return None
    out: dict[str, set[int]] = {}
    for tid, parts in pairs:
        out.setdefault(tid, set()).update(parts)
    return {t: frozenset(p) for t, p in out.items() if p}


def normalized(assignment: Assignment) -> Assignment:
    return {t: frozenset(p) for t, p in assignment.items() if p}


def partition_count(assignment: Assignment) -> int:
    return sum(len(p) for p in assignment.values())


__all__ = [
    "LEAVE_EPOCH",
    "STATIC_LEAVE_EPOCH",
    "Assignment",
    "ConsumerGroupData",
    "ConsumerMember",
    "MemberState",
    "TopicMetadata",
    "assignment_of",
    "normalized",
    "partition_count",
]
