"""Which brokers a partition reports as replicas, and where KIP-392 sends a consumer in a rack
(loglake.engine.view): pure functions every broker computes alike from the same live set."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from loglake.engine.view import BrokerInfo, SingleNodeView, read_replica_among, replicas_among


@given(
    live=st.sets(st.integers(0, 20), min_size=1, max_size=8),
    factor=st.integers(1, 10),
    partition=st.integers(0, 1000),
    data=st.data(),
)
def test_replicas_are_live_distinct_leader_first_and_at_most_the_factor(
    live: set[int], factor: int, partition: int, data: st.DataObject
) -> None:
    leader = data.draw(st.sampled_from([*sorted(live), -1]))
    got = replicas_among(leader, live, factor, partition)
    assert len(got) == min(factor, len(live)) and len(set(got)) == len(got) and set(got) <= live
    if leader >= 0:
        assert got[0] == leader
    assert got == replicas_among(leader, list(reversed(sorted(live))), factor, partition)  # order-free


def test_followers_rotate_with_the_partition() -> None:
    """One leader's partitions do not all put their followers on the same broker."""
    assert replicas_among(1, {1, 2, 3, 4}, 2, 0) == [1, 2]
    assert replicas_among(1, {1, 2, 3, 4}, 2, 1) == [1, 3]
    assert replicas_among(1, {1, 2, 3, 4}, 2, 2) == [1, 4]
    assert replicas_among(1, {1, 2, 3}, 5, 0) == [1, 2, 3]  # no more than are live


def test_a_consumer_is_sent_to_a_replica_in_its_rack() -> None:
    brokers = [BrokerInfo(1, (), "a"), BrokerInfo(2, (), "b"), BrokerInfo(3, (), "c"), BrokerInfo(4, (), "b")]
    assert read_replica_among([1, 2, 3], 1, brokers, "b", 0) == 2
    assert read_replica_among([1, 2, 3], 1, brokers, "a", 0) == -1  # the leader is in its rack
    assert read_replica_among([1, 2, 3], 1, brokers, "d", 0) == -1  # no replica is
    assert read_replica_among([1, 2, 3], 1, brokers, "", 0) == -1  # no rack named
    assert read_replica_among([1, 3], 1, brokers, "b", 0) == -1  # broker 2 is not a replica
    assert {read_replica_among([1, 2, 3, 4], 1, brokers, "b", p) for p in range(4)} == {2, 4}  # spread


def test_a_single_node_is_the_one_replica() -> None:
    view = SingleNodeView(7, "a")
    assert view.replicas_of(b"t" * 16, 0, 1) == [7]
    assert view.read_replica_for(b"t" * 16, 0, 1, "b") == -1
