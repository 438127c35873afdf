"""Server-side assignors of the consumer group protocol: `uniform` and `range` (Kafka's names).

An assignor maps (members' subscribed topic ids, topic metadata, current target) to a new
target. Both are deterministic (members are ordered by member id).

* **uniform** (Kafka's default): every partition of a subscribed topic goes to one of the
  members subscribed to it; counts per member differ by at most one among members that could
  take each other's partitions; sticky: a member keeps the partitions of its current target
  unless it holds more than its share (only partitions of overloaded members move).
* **range**: per topic, the members subscribed to it (by member id) get consecutive ranges of
  partitions, the first `partitions % members` one partition more (Kafka's range rule).
  Not sticky beyond what the ranges give; members that subscribe to the same topics with the
  same partition counts get the same partition numbers of each topic (co-partitioning).
"""

from __future__ import annotations

from collections.abc import Mapping

from loglake.broker.groups.consumer_model import Assignment, TopicMetadata

#: member id -> subscribed topic ids
Subscriptions = Mapping[str, frozenset[str]]


def assign(
    name: str, subscriptions: Subscriptions, topics: TopicMetadata, current: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    if name == "range":
        return range_assign(subscriptions, topics)
    return uniform_assign(subscriptions, topics, current)


def _frozen(out: dict[str, dict[str, set[int]]]) -> dict[str, Assignment]:
    return {m: {t: frozenset(p) for t, p in a.items() if p} for m, a in out.items()}


def range_assign(subscriptions: Subscriptions, topics: TopicMetadata) -> dict[str, Assignment]:
    out: dict[str, dict[str, set[int]]] = {m: {} for m in subscriptions}
    for tid in sorted(topics):
        count = topics[tid][1]
        members = sorted(m for m, subs in subscriptions.items() if tid in subs)
        if not members or count <= 0:
            continue
        base, extra = divmod(count, len(members))
        start = 0
        for i, m in enumerate(members):
            n = base + (1 if i < extra else 0)
            if n:
                out[m][tid] = set(range(start, start + n))
            start += n
    return _frozen(out)


def uniform_assign(
    subscriptions: Subscriptions, topics: TopicMetadata, current: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    if len(set(subscriptions.values())) == 1:
        return _uniform_homogeneous(subscriptions, topics, current)
    return _uniform_general(subscriptions, topics, current)


def _uniform_homogeneous(
    subscriptions: Subscriptions, topics: TopicMetadata, current: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """Every member subscribes to the same topics: exact quotas, O(P log P + M log M)."""
    members = sorted(subscriptions)
    subscribed = next(iter(subscriptions.values()))
    every = [(tid, p) for tid in sorted(subscribed) if tid in topics for p in range(topics[tid][1])]
    base, extra = divmod(len(every), len(members))
    valid = set(every)
    kept: dict[str, list[tuple[str, int]]] = {}
    taken: set[tuple[str, int]] = set()
    for m in members:
        mine = sorted((tid, p) for tid, ps in (current.get(m) or {}).items() for p in ps)
        kept[m] = [tp for tp in mine if tp in valid and tp not in taken]
        taken.update(kept[m])
    # The members keeping the most get the `extra` larger quotas: the fewest partitions move.
    by_kept = sorted(members, key=lambda m: (-len(kept[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_kept)}
    for m in members:
        kept[m] = kept[m][: quota[m]]
    owned = {tp for m in members for tp in kept[m]}
    free = iter(tp for tp in every if tp not in owned)
    out: dict[str, dict[str, set[int]]] = {m: {} for m in members}
    for m in members:
        for tid, p in kept[m] + [next(free) for _ in range(quota[m] - len(kept[m]))]:
            out[m].setdefault(tid, set()).add(p)
    return _frozen(out)


def _uniform_general(
    subscriptions: Subscriptions, topics: TopicMetadata, current: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """Members subscribe to different topics: sticky start, then greedy moves until balanced."""
    members = sorted(subscriptions)
    out: dict[str, dict[str, set[int]]] = {m: {} for m in members}
    counts = dict.fromkeys(members, 0)
    owner: dict[tuple[str, int], str] = {}
    eligible: dict[str, list[str]] = {
        tid: [m for m in members if tid in subscriptions[m]] for tid in sorted(topics)
    }
    # 1. stickiness: keep what the current target gives, where still valid.
    for m in members:
        for tid, parts in sorted((current.get(m) or {}).items()):
            if tid not in topics or tid not in subscriptions[m]:
                continue
            for p in sorted(parts):
                if 0 <= p < topics[tid][1] and (tid, p) not in owner:
                    owner[(tid, p)] = m
                    out[m].setdefault(tid, set()).add(p)
                    counts[m] += 1
    # 2. partitions without an owner go to the least loaded member that may take them.
    for tid, candidates in eligible.items():
        if not candidates:
            continue
        for p in range(topics[tid][1]):
            if (tid, p) in owner:
                continue
            m = min(candidates, key=lambda c: (counts[c], c))
            owner[(tid, p)] = m
            out[m].setdefault(tid, set()).add(p)
            counts[m] += 1
    # 3. balance: move partitions from members with at least two more than a member that could
    #    take them; each move lowers the sum of squared counts, so this ends.
    moved = True
    while moved:
        moved = False
        for (tid, p), m in sorted(owner.items()):
            taker = min(eligible[tid], key=lambda c: (counts[c], c))
            if counts[m] - counts[taker] >= 2:
                out[m][tid].discard(p)
                out[taker].setdefault(tid, set()).add(p)
                owner[(tid, p)] = taker
                counts[m] -= 1
                counts[taker] += 1
                moved = True
    return _frozen(out)


__all__ = ["Subscriptions", "assign", "range_assign", "uniform_assign"]
