"""One consumer group of Kafka's classic protocol: states, transition table, members, bookkeeping.

Theory of operation (mirrors Apache Kafka's GroupCoordinator / ClassicGroup):

* **Empty** - no members (possibly committed offsets, possibly MEMBER_ID_REQUIRED members that
  still have to come back). A JoinGroup adds a member and starts a rebalance.
* **PreparingRebalance** - the join phase. Every known member must send JoinGroup again; their
  responses are held. The phase ends when every member has rejoined (and no pending member is
  outstanding) or when the rebalance timeout (max over members) fires; dynamic members that did
  not rejoin are then dropped. A rebalance that starts from Empty first waits
  `initial_rebalance_delay_ms` (extended while new members keep arriving, bounded by the
  rebalance timeout) so that a starting fleet lands in one generation.
* **CompletingRebalance** - the join phase completed: the generation was bumped, a protocol
  chosen, a leader elected, and all held JoinGroup responses answered (only the leader gets the
  member list). Members now send SyncGroup; followers' responses are held until the leader's
  SyncGroup brings the assignment. Members that do not sync within the rebalance timeout are
  removed and a new rebalance starts.
* **Stable** - assignment distributed. Heartbeats keep members alive; a new member, a changed
  subscription, a leader JoinGroup, a LeaveGroup or an expired session starts a new rebalance.
* **Dead** - the group was deleted (or the coordinator closed); it no longer exists.

A group loaded from the store at start-up is not a transition: it starts Stable (at its saved
generation, members and assignments) or Empty, as `persistence.py` saved it, and
`resume_stable` sets that state directly. While a deletion waits for durability the group is
Empty with `deleting` set, and every request on it answers a retriable error.

Session timeouts only evict members that are not parked in a JoinGroup/SyncGroup (those are
"satisfied"); brand-new members parked in a JoinGroup are evicted after the new-member join
timeout instead (5 minutes in Kafka) because they cannot heartbeat yet.
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from dataclasses import dataclass, field

from loglake.broker.groups.changes import ChangeQueue
from loglake.broker.groups.consumer_model import ConsumerGroupData
from loglake.broker.groups.store import GroupOffsets


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = GroupState

#: target state -> the states it may be entered from (Kafka's validPreviousStates).
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),
    S.PREPARING_REBALANCE: frozenset({S.EMPTY, S.STABLE, S.COMPLETING_REBALANCE}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.DEAD: frozenset(GroupState),
}


class IllegalStateTransition(RuntimeError):
    """A coordinator bug: a transition the table does not allow."""


@dataclass
class JoinResult:
    error_code: int
    generation_id: int
    protocol_type: str | None  # None: nullable on the wire (v7+); older versions send ""
    protocol_name: str | None
    leader_id: str
    member_id: str
    #: (member_id, group_instance_id, metadata of the chosen protocol); only for the leader
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)
    skip_assignment: bool = False


@dataclass
class SyncResult:
    error_code: int
    protocol_type: str | None
    protocol_name: str | None
    assignment: bytes


def join_error(member_id: str, error_code: int) -> JoinResult:
    return JoinResult(error_code, -1, None, None, "", member_id)


def sync_error(error_code: int) -> SyncResult:
    return SyncResult(error_code, None, None, b"")


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    is_new: bool = False
    join_waiter: asyncio.Future[JoinResult] | None = None
    sync_waiter: asyncio.Future[SyncResult] | None = None
    heartbeat_timer: asyncio.TimerHandle | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_waiter is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise IllegalStateTransition(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        """Asked when its session timer fired (no heartbeat since it was armed)."""
        if self.is_new:
            return False
        return self.awaiting_join or self.awaiting_sync


class Group:
    """A group's state. The coordinator drives it; this class keeps the counters consistent."""

    def __init__(self, group_id: str, now_ms: int) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.previous_state = GroupState.EMPTY
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_members: dict[str, asyncio.TimerHandle | None] = {}  # MEMBER_ID_REQUIRED, not yet back
        self.pending_sync: set[str] = set()
        self.num_awaiting_join = 0
        self.protocol_counts: Counter[str] = Counter()
        self.new_member_added = False
        self.join_timer: asyncio.TimerHandle | None = None
        self.sync_timer: asyncio.TimerHandle | None = None
        self.offsets: GroupOffsets = {}  # only what is durable (see changes.py)
        self.changes = ChangeQueue(group_id)  # store changes waiting for durability
        self.deleting = False  # a DeleteGroups (or retention) deletion waits for durability
        self.empty_since_ms = now_ms
        #: Set for a group of the consumer protocol (KIP-848, consumer.py); its classic state stays Empty.
        self.consumer: ConsumerGroupData | None = None

    def has_no_members(self) -> bool:
        """Empty in either protocol: no classic member (or pending one) and no consumer-protocol member."""
        return (
            self.state is GroupState.EMPTY
            and not self.members
            and not self.pending_members
            and (self.consumer is None or not self.consumer.members)
        )

    # ---- state -------------------------------------------------------------------------------

    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise IllegalStateTransition(f"group {self.group_id!r}: {self.state.value} -> {target.value}")
        self.previous_state = self.state
        self.state = target
        if target is GroupState.EMPTY:
            self.empty_since_ms = now_ms

    def resume_stable(self, protocol_name: str, leader_id: str) -> None:
        """Start a loaded group Stable (its members were added with `add`); not a transition."""
        if self.state is not GroupState.EMPTY or leader_id not in self.members:
            raise IllegalStateTransition(f"group {self.group_id!r}: cannot resume Stable from {self.state.value}")
        self.protocol_name = protocol_name
        self.leader_id = leader_id
        self.previous_state = GroupState.COMPLETING_REBALANCE
        self.state = GroupState.STABLE

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]

    # ---- membership --------------------------------------------------------------------------

    def add(self, member: Member, waiter: asyncio.Future[JoinResult] | None) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        self.protocol_counts.update(set(member.protocol_names()))
        if self.leader_id is None:
            self.leader_id = member.member_id
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        member.join_waiter = waiter
        if waiter is not None:
            self.num_awaiting_join += 1
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> Member | None:
        """Drop a member (or pending member); its parked responses must be completed by the caller."""
        self.pending_members.pop(member_id, None)
        self.pending_sync.discard(member_id)
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        self.protocol_counts.subtract(set(member.protocol_names()))
        self.protocol_counts = +self.protocol_counts  # drop zero counts
        if member.awaiting_join:
            self.num_awaiting_join -= 1
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def update_member(
        self,
        member: Member,
        protocols: list[tuple[str, bytes]],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        waiter: asyncio.Future[JoinResult] | None,
    ) -> asyncio.Future[JoinResult] | None:
        """Replace a member's protocols, timeouts and parked JoinGroup; returns the superseded waiter."""
        self.protocol_counts.subtract(set(member.protocol_names()))
        member.protocols = protocols
        self.protocol_counts.update(set(member.protocol_names()))
        self.protocol_counts = +self.protocol_counts
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        old = member.join_waiter
        if waiter is not None and old is None:
            self.num_awaiting_join += 1
        elif waiter is None and old is not None:
            self.num_awaiting_join -= 1
        member.join_waiter = waiter
        return old

    def replace_static_member(self, instance_id: str, old_member_id: str, new_member_id: str) -> Member:
        """KIP-345: the instance came back under a new member id; the caller fences the old id's waiters."""
        member = self.members.pop(old_member_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        self.static_members[instance_id] = new_member_id
        if old_member_id in self.pending_sync:
            self.pending_sync.discard(old_member_id)
            self.pending_sync.add(new_member_id)
        return member

    def complete_join(self, member: Member, result: JoinResult) -> bool:
        waiter = member.join_waiter
        if waiter is None:
            return False
        member.join_waiter = None
        self.num_awaiting_join -= 1
        if not waiter.done():
            waiter.set_result(result)
        return True

    @staticmethod
    def complete_sync(member: Member, result: SyncResult) -> bool:
        waiter = member.sync_waiter
        if waiter is None:
            return False
        member.sync_waiter = None
        if not waiter.done():
            waiter.set_result(result)
        return True

    # ---- protocol selection ------------------------------------------------------------------

    def supports_protocols(self, protocol_type: str, names: list[str]) -> bool:
        if self.is_(GroupState.EMPTY) and not self.members:
            return bool(protocol_type) and bool(names)
        return self.protocol_type == protocol_type and any(
            self.protocol_counts.get(n, 0) == len(self.members) for n in names
        )

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol that every member supports; most votes
        win (Kafka). Ties go to the one the leader prefers (Kafka leaves ties to map order)."""
        candidates = {n for n, c in self.protocol_counts.items() if c == len(self.members)}
        if not self.members or not candidates:
            raise IllegalStateTransition(f"group {self.group_id!r}: no protocol common to all members")
        votes = Counter(m.vote(candidates) for m in self.members.values())
        best = max(votes.values())
        leader = self.members.get(self.leader_id or "")
        order = leader.protocol_names() if leader is not None else []
        tied = [p for p, v in votes.items() if v == best]
        tied.sort(key=lambda p: order.index(p) if p in order else len(order))
        return tied[0]

    # ---- rebalance helpers -------------------------------------------------------------------

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_members

    def not_yet_rejoined(self) -> list[Member]:
        return [m for m in self.members.values() if not m.awaiting_join]

    def maybe_elect_new_joined_leader(self) -> bool:
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for member_id, member in self.members.items():
            if member.awaiting_join:
                self.leader_id = member_id
                return True
        return False

    def current_member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        protocol = self.protocol_name or ""
        return [(m.member_id, m.group_instance_id, m.metadata(protocol)) for m in self.members.values()]

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync.clear()
