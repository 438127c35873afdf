"""Leadership assignment: partitions -> live brokers, balanced and sticky (a pure function).

Balanced: every live broker leads ⌊n/b⌋ or ⌈n/b⌉ of the n partitions. Sticky: a partition keeps
its leader whenever balance allows, so a change of the live set moves as few partitions as
possible — each move is a leader-epoch bump and a client round trip to new Metadata:

1. every live broker keeps its previous partitions, up to its quota; the ⌈n/b⌉ quotas go to the
   brokers that kept the most (fewest moves), ties to the lower node id;
2. partitions of dead brokers, unknown ones and those over a quota go, in partition order, to
   the broker with the most room left, ties to the lower node id.

The moves are then exactly the partitions whose previous leader is gone plus each broker's
excess over its quota, which no balanced assignment can beat. Deterministic: every broker that
computes it from the same inputs gets the same answer.

`refused` names, per partition, brokers that handed it back (their acquire failed): such a broker
neither keeps it nor is given it, unless every live broker refuses it (then the rules above
apply as if nobody did). A refused partition may leave a broker one over its quota.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence, Set
from typing import TypeVar

__all__ = ["assign", "moves", "taken_from_waiting"]

P = TypeVar("P", bound=Hashable)


def assign(
    partitions: Sequence[P],
    brokers: Collection[int],
    previous: Mapping[P, int],
    refused: Mapping[P, Set[int]] | None = None,
) -> dict[P, int]:
    """The leader of each partition among `brokers` (empty when no broker is live)."""
    live = sorted(set(brokers))
    if not live or not partitions:
        return {}
    refused = {p: r for p, r in (refused or {}).items() if not set(live) <= r}  # all refuse: as if none did
    base, extra = divmod(len(partitions), len(live))
    kept: dict[int, list[P]] = {b: [] for b in live}
    for p in partitions:
        owner = previous.get(p)
        if owner in kept and owner not in refused.get(p, ()):
            kept[owner].append(p)
    by_kept = sorted(live, key=lambda b: (-len(kept[b]), b))
    quota = {b: base + (1 if i < extra else 0) for i, b in enumerate(by_kept)}
    out: dict[P, int] = {}
    for b in live:
        for p in kept[b][: quota[b]]:
            out[p] = b
    count = {b: min(len(kept[b]), quota[b]) for b in live}
    for p in partitions:
        if p in out:
            continue
        no = refused.get(p, ())
        b = max((x for x in live if x not in no), key=lambda x: (quota[x] - count[x], -x))
        out[p] = b
        count[b] += 1
    return out


def moves(before: Mapping[P, int], after: Mapping[P, int]) -> int:
    """Partitions whose leader differs (a partition new in `after` counts as one)."""
    return sum(1 for p, b in after.items() if before.get(p) != b)


def taken_from_waiting(
    mine: Collection[P], previous: Mapping[P, int], live: Collection[int], standing: Collection[int], me: int
) -> set[P]:
    """Of the partitions `mine` (assigned to broker `me`), those whose previous leader is another
    live broker that does not stand for leadership: the ones a broker that has just come back
    would take from a broker that may be about to come back too (loglake.cluster.view)."""
    return {p for p in mine if (b := previous.get(p)) is not None and b != me and b in live and b not in standing}
