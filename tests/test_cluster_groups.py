"""One coordinator per group in cluster mode (issue 18's rolling-restart finding), over real etcd
(tests/etcdkit.py): `FencedGroupStore`s in one process stand for two brokers' coordinators.

* a coordinator that takes a group over loads what the previous one committed (offsets and the
  saved state with its generation), because it claims the group before loading it;
* the previous coordinator's later writes are fenced: nothing it commits lands, so a committed
  offset never goes backwards; it marks the group lost and asks for a reload;
* a group neither loaded is claimed at its first write; the loser of that race is fenced too;
* the broker's handlers answer NOT_COORDINATOR for a lost group and
  COORDINATOR_LOAD_IN_PROGRESS while the coordinator is older than the live set.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

import etcdkit
from etcdkit import EtcdCluster, needs_etcd
from loglake.broker.group_reload import GroupCoordination
from loglake.broker.groups.meta_store import MetaGroupLog
from loglake.broker.groups.store import OffsetEntry
from loglake.broker.handlers.errors import coordinator_error
from loglake.cluster.coordinators import coordinator_of
from loglake.cluster.etcd import EtcdMetaStore
from loglake.cluster.etcd_client import EtcdClient
from loglake.cluster.groups import FencedGroupStore
from loglake.errors import MetaFencedError
from loglake.kafka_errors import ErrorCode

pytestmark = needs_etcd
etcd1 = etcdkit.etcd1

WAIT = 30


@dataclass
class View:
    """The part of a broker's cluster view the store and the handlers read: its node id and the
    live set it sees (the etcd cluster view keeps it; here the test sets it)."""

    node_id: int
    live: set[int] = field(default_factory=set)

    def live_ids(self) -> set[int]:
        return set(self.live)

    def coordinator_of(self, group: str) -> int:
        return coordinator_of(group, self.live)


class Broker:
    def __init__(self, etcd: EtcdCluster, prefix: str, node_id: int) -> None:
        self.meta = EtcdMetaStore(EtcdClient(",".join(etcd.endpoints)), prefix)
        self.meta.open()
        self.records = MetaGroupLog(self.meta)
        self.view = View(node_id)
        self.lost: list[str] = []  # groups whose loss a store reported

    def store(self, live: set[int]) -> FencedGroupStore:
        self.view.live = set(live)
        s = FencedGroupStore(self.meta, self.view, lambda group, _store: self.lost.append(group))
        s.prepare()
        return s


@pytest.fixture
def brokers(etcd1: EtcdCluster) -> Iterator[tuple[Broker, Broker]]:
    prefix = f"/groups-test/{uuid.uuid4().hex[:8]}"
    a, b = Broker(etcd1, prefix, 1), Broker(etcd1, prefix, 2)
    yield a, b
    a.meta.close()
    b.meta.close()


def group_for(node: int, live: set[int], taken_by: int, after: set[int]) -> str:
    """A group id `node` coordinates over `live` and `taken_by` over `after`."""
    for i in range(10_000):
        g = f"g{i}"
        if coordinator_of(g, live) == node and coordinator_of(g, after) == taken_by:
            return g
    raise AssertionError("no such group id")


def entry(offset: int) -> OffsetEntry:
    return OffsetEntry(offset, -1, "", 1_700_000_000_000)


def committed(broker: Broker, group: str) -> int:
    broker.meta.sync()
    offsets = broker.records.group_metadata()[group]["offsets"]
    return int(offsets[("t", 0)][0])


def test_a_new_coordinator_loads_the_group_and_the_old_ones_writes_are_fenced(
    brokers: tuple[Broker, Broker],
) -> None:
    a, b = brokers
    group = group_for(1, {1, 2}, 2, {2})
    old = a.store({1, 2})
    old.save_state(group, {"version": 1, "generation": 7, "state": "Stable"}).result(WAIT)
    old.commit(group, {("t", 0): entry(2042)}).result(WAIT)
    # broker 1 looks gone to broker 2 (a restart, a lagging watch): 2 takes the group over
    new = b.store({2})
    loaded = new.load()
    assert loaded[group].offsets[("t", 0)].offset == 2042
    assert loaded[group].state is not None and loaded[group].state["generation"] == 7
    # the old coordinator still answers its members: none of their commits lands
    with pytest.raises(MetaFencedError):
        old.commit(group, {("t", 0): entry(1277)}).result(WAIT)
    assert group in old.lost and a.lost == [group]
    with pytest.raises(MetaFencedError):  # lost: refused without trying etcd
        old.save_state(group, None).result(WAIT)
    assert committed(b, group) == 2042
    new.commit(group, {("t", 0): entry(2100)}).result(WAIT)
    assert committed(a, group) == 2100
    # the handlers' gate: the old broker answers NOT_COORDINATOR for the lost group
    groups = GroupCoordination(a.view, lambda _on_lost: old, lambda _store: None, None)  # type: ignore[arg-type]
    groups.coordinator, groups.store, groups.loaded_for = object(), old, frozenset({1, 2})  # type: ignore[assignment]
    assert coordinator_error(SimpleNamespace(groups=groups), group) == ErrorCode.NOT_COORDINATOR


def test_a_group_neither_loaded_is_claimed_by_its_first_write_once(brokers: tuple[Broker, Broker]) -> None:
    a, b = brokers
    group = group_for(1, {1}, 2, {2})
    sa, sb = a.store({1}), b.store({2})  # both believe they coordinate it; neither has it yet
    sb.commit(group, {("t", 0): entry(10)}).result(WAIT)
    with pytest.raises(MetaFencedError):  # a's claim finds the key moved since it loaded
        sa.commit(group, {("t", 0): entry(5)}).result(WAIT)
    assert group in sa.lost
    assert committed(a, group) == 10
    sb.commit(group, {("t", 0): entry(11)}).result(WAIT)  # the winner carries on
    assert committed(a, group) == 11


def test_group_requests_wait_while_the_coordinator_is_older_than_the_live_set(
    brokers: tuple[Broker, Broker],
) -> None:
    a, _b = brokers
    group = group_for(1, {1}, 1, {1, 2})
    groups = GroupCoordination(a.view, lambda _on_lost: a.store(a.view.live), lambda _store: None, None)  # type: ignore[arg-type]
    groups.coordinator, groups.store, groups.loaded_for = object(), a.store({1}), frozenset({1})  # type: ignore[assignment]
    ctx = SimpleNamespace(groups=groups)
    assert coordinator_error(ctx, group) == ErrorCode.NONE
    asked: list[int] = []
    groups.moved = lambda: asked.append(1)  # type: ignore[method-assign]
    a.view.live = {1, 2}  # the live set moved; the reload has not finished
    assert coordinator_error(ctx, group) == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert asked  # the gate asks for the reload itself (a change seen before the first coordinator)
    groups.store, groups.loaded_for = a.store({1, 2}), frozenset({1, 2})
    assert coordinator_error(ctx, group) == ErrorCode.NONE
