"""How a member moves towards its target assignment (Kafka's CurrentAssignmentBuilder rules).

A partition is never owned by two members at once: a member gets a partition only once no other
member owns it or is still revoking it. On each heartbeat of a member:

* **stable** at an older epoch than the target's: compute the next step;
* **unrevoked_partitions**: it must first give up `revoking`; once the partitions it reports
  owning no longer include any of them, compute the next step; otherwise nothing changes;
* **unreleased_partitions**: compute the next step (partitions may have been released since).

The next step: keep the target partitions it owns; partitions it owns outside the target are
to be revoked. If there are any, the member stays at its epoch, owning only what it keeps, in
`unrevoked_partitions`. Else it moves to the target epoch and gets the target partitions that
are free now; if some are still owned by others it is `unreleased_partitions`, else `stable`.

Epoch checks (Kafka's): a heartbeat with a higher epoch than the member's is fenced; a lower
one too, except the member's previous epoch when the partitions it reports owning are all
still assigned to it (it lost the response that moved it on).
"""

from __future__ import annotations

from loglake.broker.groups import errors as E
from loglake.broker.groups.consumer_model import Assignment, ConsumerMember, MemberState


def check_epoch(member: ConsumerMember, received: int, owned: Assignment | None) -> int:
    if received == member.member_epoch:
        return E.NONE
    lost_response = received < member.member_epoch and received == member.previous_epoch and owned is not None
    if lost_response and all(parts <= member.assigned.get(t, frozenset()) for t, parts in (owned or {}).items()):
        return E.NONE
    return E.FENCED_MEMBER_EPOCH


def _still_owns_revoked(member: ConsumerMember, owned: Assignment | None) -> bool:
    if owned is None:
        return True  # not reported: assume it still owns them
    return any(parts & owned.get(tid, frozenset()) for tid, parts in member.revoking.items())


def note_partition_epochs(member: ConsumerMember) -> None:
    """KIP-1251: a partition the member owns keeps the epoch it was assigned at; one new to it
    gets the member's epoch now."""
    old = member.partition_epochs
    member.partition_epochs = {
        (tid, p): old.get((tid, p), member.member_epoch)
        for owned in (member.assigned, member.revoking)
        for tid, parts in owned.items()
        for p in parts
    }


def reconcile(
    member: ConsumerMember,
    target_epoch: int,
    target: Assignment,
    owners: dict[tuple[str, int], str],
    owned: Assignment | None,
) -> bool:
    """Move the member one step; True if its epoch, state or partitions changed."""
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if _still_owns_revoked(member, owned):
            return False
    elif member.state is MemberState.STABLE and member.member_epoch == target_epoch:
        return False
    before = (member.member_epoch, member.state, member.assigned, member.revoking)
    keep: dict[str, frozenset[int]] = {}
    revoke: dict[str, frozenset[int]] = {}
    newly: dict[str, frozenset[int]] = {}
    pending = False
    for tid in set(member.assigned) | set(target):
        want = target.get(tid, frozenset())
        have = member.assigned.get(tid, frozenset())
        if have & want:
            keep[tid] = have & want
        if have - want:
            revoke[tid] = have - want
        free = frozenset(p for p in want - have if (tid, p) not in owners)
        if free:
            newly[tid] = free
        if len(free) < len(want - have):
            pending = True
    if revoke:
        member.state = MemberState.UNREVOKED_PARTITIONS
        member.assigned = keep
        member.revoking = revoke
    else:
        if member.member_epoch != target_epoch:
            member.previous_epoch = member.member_epoch
            member.member_epoch = target_epoch
        member.assigned = {t: keep.get(t, frozenset()) | newly.get(t, frozenset()) for t in set(keep) | set(newly)}
        member.revoking = {}
        member.state = MemberState.UNRELEASED_PARTITIONS if pending else MemberState.STABLE
    note_partition_epochs(member)
    return before != (member.member_epoch, member.state, member.assigned, member.revoking)


__all__ = ["check_epoch", "note_partition_epochs", "reconcile"]
