"""Group coordinators in cluster mode (loglake.cluster.coordinators): every broker picks the same
live broker for a group, groups spread over the brokers, and a dead broker's groups are the only
ones that move."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from loglake.cluster.coordinators import coordinator_of

GROUPS = [f"group-{i}" for i in range(3000)]


def test_no_live_broker_means_no_coordinator() -> None:
    assert coordinator_of("g", set()) == -1


def test_the_same_answer_whatever_the_order_of_the_live_set() -> None:
    for g in GROUPS[:200]:
        assert coordinator_of(g, [1, 2, 3]) == coordinator_of(g, (3, 1, 2)) == coordinator_of(g, {2, 3, 1})


def test_groups_spread_over_the_brokers() -> None:
    counts = {n: 0 for n in (1, 2, 3, 4)}
    for g in GROUPS:
        counts[coordinator_of(g, counts.keys())] += 1
    assert min(counts.values()) > len(GROUPS) / 4 * 0.8, counts


@given(st.sets(st.integers(0, 50), min_size=2, max_size=8), st.data())
def test_only_the_dead_brokers_groups_move(live: set[int], data: st.DataObject) -> None:
    dead = data.draw(st.sampled_from(sorted(live)))
    rest = live - {dead}
    for g in GROUPS[:300]:
        before = coordinator_of(g, live)
        after = coordinator_of(g, rest)
        assert after in rest
        if before != dead:
            assert after == before


@given(st.sets(st.integers(0, 50), min_size=1, max_size=8), st.integers(51, 60))
def test_a_joining_broker_takes_groups_only_for_itself(live: set[int], joined: int) -> None:
    for g in GROUPS[:300]:
        before, after = coordinator_of(g, live), coordinator_of(g, live | {joined})
        assert after in (before, joined)
