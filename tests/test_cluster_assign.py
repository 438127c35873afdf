"""Leadership assignment (loglake.cluster.assign): properties over random partitions, brokers and
previous assignments, plus the cases an operator watches for (a broker dies, one joins)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.cluster.assign import assign, moves

partitions_st = st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 60)), unique=True, max_size=150)
brokers_st = st.sets(st.integers(0, 12), max_size=8)


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[tuple[str, int]], set[int], dict[tuple[str, int], int]]:
    parts = draw(partitions_st)
    brokers = draw(brokers_st)
    previous = {p: draw(st.integers(0, 12)) for p in parts if draw(st.booleans())}
    return parts, brokers, previous


@settings(max_examples=400, deadline=None)
@given(scenario())
def test_every_partition_has_a_live_leader_and_the_load_is_balanced(
    s: tuple[list[tuple[str, int]], set[int], dict[tuple[str, int], int]],
) -> None:
    parts, brokers, previous = s
    out = assign(parts, brokers, previous)
    if not brokers:
        assert out == {}
        return
    assert set(out) == set(parts) and set(out.values()) <= brokers
    load = [sum(1 for b in out.values() if b == x) for x in brokers]
    assert max(load) - min(load) <= 1


@settings(max_examples=400, deadline=None)
@given(scenario())
def test_sticky_moves_only_what_balance_forces(
    s: tuple[list[tuple[str, int]], set[int], dict[tuple[str, int], int]],
) -> None:
    parts, brokers, previous = s
    if not brokers:
        return
    out = assign(parts, brokers, previous)
    # The fewest moves any balanced assignment can make: orphans (no live previous leader) plus
    # each live broker's excess over the largest quota it could get.
    base, extra = divmod(len(parts), len(brokers))
    kept = sorted((sum(1 for p in parts if previous.get(p) == b) for b in brokers), reverse=True)
    quotas = [base + (1 if i < extra else 0) for i in range(len(brokers))]
    forced = sum(1 for p in parts if previous.get(p) not in brokers) + sum(
        max(0, k - q) for k, q in zip(kept, quotas, strict=True)
    )
    assert moves(previous, out) == forced
    assert assign(parts, brokers, out) == out  # stable: nothing moves without a change


@settings(max_examples=200, deadline=None)
@given(scenario())
def test_the_answer_is_deterministic(
    s: tuple[list[tuple[str, int]], set[int], dict[tuple[str, int], int]],
) -> None:
    parts, brokers, previous = s
    assert assign(parts, brokers, previous) == assign(
        list(parts), set(sorted(brokers, reverse=True)), dict(reversed(list(previous.items())))
    )


def test_a_dead_broker_spreads_its_partitions_and_nothing_else_moves() -> None:
    parts = list(range(12))
    before = assign(parts, {1, 2, 3}, {})
    after = assign(parts, {1, 2}, before)
    gone = [p for p, b in before.items() if b == 3]
    assert all(after[p] == before[p] for p in parts if p not in gone)
    assert sorted(list(after.values()).count(b) for b in (1, 2)) == [6, 6]


def test_a_joining_broker_takes_only_its_share() -> None:
    parts = list(range(12))
    before = assign(parts, {1, 2}, {})
    after = assign(parts, {1, 2, 3}, before)
    assert list(after.values()).count(3) == 4 and moves(before, after) == 4


@settings(max_examples=300, deadline=None)
@given(scenario(), st.data())
def test_a_refused_partition_goes_to_a_broker_that_does_not_refuse_it(
    s: tuple[list[tuple[str, int]], set[int], dict[tuple[str, int], int]], data: st.DataObject
) -> None:
    """A broker whose acquire failed hands the partition back: it neither keeps nor gets it while
    another live broker does not refuse it; with everyone refusing, it is assigned as usual."""
    parts, brokers, previous = s
    refused = {p: data.draw(st.sets(st.integers(0, 12), max_size=3)) for p in parts if data.draw(st.booleans())}
    out = assign(parts, brokers, previous, refused)
    if not brokers:
        assert out == {}
        return
    assert set(out) == set(parts) and set(out.values()) <= brokers
    for p, b in out.items():
        if not brokers <= refused.get(p, set()):
            assert b not in refused.get(p, set()), (p, b, refused[p])
    everyone = {p: set(brokers) for p in parts}
    assert assign(parts, brokers, previous, everyone) == assign(parts, brokers, previous)


def test_a_handed_back_partition_moves_and_nothing_else_does() -> None:
    parts = [("t", i) for i in range(6)]
    before = assign(parts, {1, 2, 3}, {})
    p = next(tp for tp, b in sorted(before.items()) if b == 3)
    after = assign(parts, {1, 2, 3}, before, {p: {3}})
    assert after[p] != 3
    assert {tp: b for tp, b in after.items() if tp != p} == {tp: b for tp, b in before.items() if tp != p}
