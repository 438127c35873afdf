"""Who takes a partition's log after a bucket outage every broker saw (loglake.cluster.view,
loglake.cluster.assign.taken_from_waiting).

Every broker withdraws while the bucket is away and stands again when its own probe sees it back,
within a probe interval of the others. The first one back must not take the partitions of the
others (each move is a leader epoch and a leader change its producers follow; librdkafka can stay
on the wrong broker after a few quick ones, confluentinc/librdkafka#4976, and its records then
time out): it leaves them to their live leaders for a probe interval and a membership poll, and
reads the live set again before it takes a partition from a live broker at all.
"""

from __future__ import annotations

import threading
from typing import Any

from loglake.cluster.assign import assign, moves, taken_from_waiting
from loglake.cluster.view import EtcdClusterView

TP = tuple[str, int]
PARTS: list[TP] = [("t", p) for p in range(6)]
#: the assignment before the outage (assign's own answer for three brokers)
BEFORE: dict[TP, int] = {("t", 0): 1, ("t", 3): 1, ("t", 1): 2, ("t", 4): 2, ("t", 2): 3, ("t", 5): 3}


def test_the_first_broker_back_would_take_every_partition_of_the_brokers_still_away() -> None:
    assert assign(PARTS, [1, 2, 3], {}) == BEFORE
    alone = assign(PARTS, [1], BEFORE)
    mine = {tp for tp, b in alone.items() if b == 1}
    assert mine == set(PARTS)
    waiting = taken_from_waiting(mine, BEFORE, live=[1, 2, 3], standing=[1], me=1)
    assert waiting == {tp for tp, b in BEFORE.items() if b != 1}
    # left to them, the partitions stay where they were once everyone stands: no move at all
    assert moves(BEFORE, assign(PARTS, [1, 2, 3], BEFORE)) == 0
    # a dead broker's partitions (not live) and those of standing brokers are not waited for
    assert taken_from_waiting(mine, BEFORE, live=[1, 2], standing=[1], me=1) == {("t", 1), ("t", 4)}
    assert taken_from_waiting(mine, BEFORE, live=[1, 2, 3], standing=[1, 2, 3], me=1) == set()


class _Membership:
    """What the view reads of its membership; `refresh` reads `etcd_leaders` (the registrations as
    etcd has them now), the properties answer from the last read."""

    def __init__(self, leaders: set[int], etcd_leaders: set[int]) -> None:
        self._leaders = leaders
        self.etcd_leaders = etcd_leaders
        self.known = {1: object(), 2: object(), 3: object()}
        self.lost = threading.Event()
        self.leads = False
        self.refuses: list[str] = []
        self.refusals: dict[int, list[str]] = {}
        self.refreshes = 0

    @property
    def leaders(self) -> set[int]:
        return set(self._leaders)

    def refresh(self) -> None:
        self.refreshes += 1
        self._leaders = set(self.etcd_leaders)

    def set_leads(self, leads: bool, refuses: list[str]) -> None:
        self.leads, self.refuses = leads, refuses
        self.etcd_leaders.add(1) if leads else self.etcd_leaders.discard(1)


class _Health:
    probe_interval_s = 1.25
    standing = False

    def check(self) -> tuple[bool, bool]:
        return True, True


class _Log:
    def __init__(self) -> None:
        self.acquired: list[TP] = []
        self.led: set[TP] = set()

    def acquire(self, topic_id: str, partition: int) -> int:
        self.acquired.append((topic_id, partition))
        self.led.add((topic_id, partition))
        return 1

    def leads(self, topic_id: str, partition: int) -> bool:
        return (topic_id, partition) in self.led

    def release(self, topic_id: str, partition: int) -> None:
        self.led.discard((topic_id, partition))


def _view(membership: _Membership) -> tuple[EtcdClusterView, _Log]:
    """Node 1's view, withdrawn (the bucket was away), over fakes of what a round reads."""
    view: Any = EtcdClusterView.__new__(EtcdClusterView)
    log = _Log()
    view.log = log
    view._node_id = 1
    view.membership = membership
    view.health = _Health()
    view.held = set()
    view._refusing = {}
    view._stop = threading.Event()
    view._wake = threading.Event()
    view._back_until = 0.0
    view.changes = {"acquired": 0, "released": 0, "acquire_failed": 0}
    view._last_error = ""
    view.rounds = 0
    view._inputs = lambda live: (PARTS, sorted(live), dict(BEFORE), {})
    return view, log


def test_back_first_it_takes_only_its_own_partitions_until_the_others_stand() -> None:
    # etcd: nobody else stands yet (their probes have not seen the bucket back)
    view, log = _view(_Membership(leaders=set(), etcd_leaders=set()))
    view.rebalance()
    assert sorted(log.acquired) == [("t", 0), ("t", 3)]
    # a probe interval later the others stand; node 1 keeps its own and takes nothing of theirs
    view.membership.etcd_leaders.update({2, 3})
    view.membership.refresh()
    view.rebalance()
    assert sorted(log.acquired) == [("t", 0), ("t", 3)]


def test_a_stale_live_set_is_read_again_before_a_partition_is_taken_from_a_live_broker() -> None:
    # node 1 stood long ago; its last read of the live set says 2 and 3 do not stand, etcd says they do
    view, log = _view(_Membership(leaders={1}, etcd_leaders={1, 2, 3}))
    view.membership.leads = True
    view.rebalance()
    assert view.membership.refreshes == 1
    assert sorted(log.acquired) == [("t", 0), ("t", 3)]


def test_partitions_of_brokers_still_away_are_taken_once_the_wait_is_over() -> None:
    view, log = _view(_Membership(leaders={1}, etcd_leaders={1}))
    view.membership.leads = True  # standing for a while: no wait
    view.rebalance()
    assert sorted(log.acquired) == PARTS
