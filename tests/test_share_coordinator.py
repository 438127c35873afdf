"""The share coordinator (loglake.broker.share.coordinator) over an in-memory store: membership
by heartbeat, non-exclusive assignment, share-session epochs and limits, members timing out,
share-partitions initialised, stored, reloaded after a leader change, evicted at the limit."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from loglake.broker.share.coordinator import REAP_INTERVAL_MS, Heartbeat, ShareCoordinator
from loglake.broker.share.limits import ShareLimits
from loglake.broker.share.partition import StateBatch
from loglake.broker.share.states import AckType
from loglake.broker.share.store import ShareKey, StoredShare
from loglake.kafka_errors import ErrorCode

TID = "ab" * 16


class MemStore:
    def __init__(self) -> None:
        self.saved: dict[ShareKey, StoredShare] = {}

    def load(self, key: ShareKey) -> StoredShare | None:
        return self.saved.get(key)

    def keys(self, group_id: str) -> list[ShareKey]:
        return sorted(k for k in self.saved if k[0] == group_id)

    def generation(self, key: ShareKey) -> int | None:
        stored = self.saved.get(key)
        return None if stored is None else stored.gen

    def save(self, key: ShareKey, start: int, end: int, batches: Sequence[StateBatch], gen: int = 0, *,
             leader_epoch: int | None = None) -> Future[int]:
        self.saved[key] = StoredShare(start, end, list(batches), gen)
        f: Future[int] = Future()
        f.set_result(len(self.saved))
        return f

    def reset(self, key: ShareKey, start: int) -> Future[int]:
        return self.save(key, start, start, [], (self.generation(key) or 0) + 1)

    def forget(self, key: ShareKey) -> Future[int]:
        self.saved.pop(key, None)
        f: Future[int] = Future()
        f.set_result(0)
        return f


class Clock:
    def __init__(self) -> None:
        self.ms = 10_000

    def __call__(self) -> int:
        return self.ms


def _coordinator(limits: ShareLimits | None = None) -> tuple[ShareCoordinator, MemStore, Clock]:
    store, clock = MemStore(), Clock()
    c = ShareCoordinator(
        store, limits or ShareLimits(), clock=clock,
        topic_partitions=lambda name: (TID, 3) if name == "t" else None,
        initial_offset=lambda tid, p, reset: 0 if reset == "earliest" else 100,
        auto_offset_reset=lambda g: "earliest" if g == "early" else "latest",
    )
    return c, store, clock


def _hb(member: str, epoch: int, topics: list[str] | None = None, group: str = "g") -> Heartbeat:
    return Heartbeat(group, member, epoch, None, topics, "client", "/127.0.0.1")


def test_every_member_gets_every_partition() -> None:
    c, _, _ = _coordinator()
    a = c.heartbeat(_hb("a", 0, ["t", "missing"]))
    b = c.heartbeat(_hb("b", 0, ["t"]))
    assert a.error_code == b.error_code == ErrorCode.NONE
    assert a.assignment == b.assignment == {TID: [0, 1, 2]}
    again = c.heartbeat(_hb("a", a.member_epoch))
    assert (again.error_code, again.assignment) == (ErrorCode.NONE, None)  # nothing changed: not repeated
    assert c.heartbeat(_hb("a", a.member_epoch + 5)).error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert c.heartbeat(_hb("zz", 3)).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert c.heartbeat(_hb("c", 0)).error_code == ErrorCode.INVALID_REQUEST  # joins without a subscription
    left = c.heartbeat(_hb("a", a.member_epoch))
    assert left.error_code == ErrorCode.NONE
    assert c.heartbeat(_hb("a", -1)).member_epoch == -1
    group = c.group("g")
    assert group is not None and list(group.members) == ["b"] and group.state == "Stable"


def test_group_max_size() -> None:
    c, _, _ = _coordinator(ShareLimits(max_size=2))
    assert c.heartbeat(_hb("a", 0, ["t"])).error_code == ErrorCode.NONE
    assert c.heartbeat(_hb("b", 0, ["t"])).error_code == ErrorCode.NONE
    assert c.heartbeat(_hb("c", 0, ["t"])).error_code == ErrorCode.GROUP_MAX_SIZE_REACHED


def test_groups_bounded_and_empty_ones_forgotten_first() -> None:
    c, _, _ = _coordinator(ShareLimits(max_groups=2))
    assert c.heartbeat(_hb("a", 0, ["t"], group="g1")).error_code == ErrorCode.NONE
    assert c.heartbeat(_hb("a", 0, ["t"], group="g2")).error_code == ErrorCode.NONE
    assert c.heartbeat(_hb("a", 0, ["t"], group="g3")).error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
    c.heartbeat(_hb("a", -1, group="g1"))
    assert c.heartbeat(_hb("a", 0, ["t"], group="g3")).error_code == ErrorCode.NONE
    assert sorted(c.groups) == ["g2", "g3"]


def test_session_epochs_and_limit() -> None:
    c, _, _ = _coordinator(ShareLimits(max_share_sessions=1))
    assert c.session("g", "a", 3) == ErrorCode.SHARE_SESSION_NOT_FOUND
    s = c.session("g", "a", 0)
    assert not isinstance(s, int) and s.epoch == 1
    assert c.session("g", "a", 1) is s and s.epoch == 2
    assert c.session("g", "a", 1) == ErrorCode.INVALID_SHARE_SESSION_EPOCH
    assert c.session("g", "b", 0) == ErrorCode.SHARE_SESSION_LIMIT_REACHED
    c.close_session("g", "a")
    assert not isinstance(c.session("g", "b", 0), int)


def test_a_silent_member_is_removed_and_its_records_released() -> None:
    c, store, clock = _coordinator()
    c.heartbeat(_hb("a", 0, ["t"], group="early"))
    c.session("early", "a", 0)
    sp = c.partition(("early", TID, 0))
    assert sp is not None and sp.start == 0  # share.auto.offset.reset=earliest
    assert sp.acquire("a", [(0, 4, False)], 10, clock()) == [(0, 4, 1)]
    clock.ms += ShareLimits().session_timeout_ms + 1
    c.reap()
    group = c.group("early")
    assert group is not None and group.members == {}
    assert ("early", "a") not in c.sessions
    assert sp.acquire("b", [(0, 4, False)], 10, clock()) == [(0, 4, 2)]
    assert store.saved[("early", TID, 0)].batches == [(0, 4, 0, 1)]  # stored when released


def test_new_share_partitions_start_latest_and_reload_after_a_leader_change() -> None:
    c, store, clock = _coordinator()
    sp = c.partition(("g", TID, 1), leader_epoch=3)
    assert sp is not None and (sp.start, sp.end) == (100, 100)
    assert store.saved[("g", TID, 1)] == StoredShare(100, 100, [])
    sp.acquire("a", [(100, 101, False)], 10, clock())
    assert sp.acknowledge("a", 100, 101, [AckType.ACCEPT]) == ErrorCode.NONE
    c.persist(("g", TID, 1))
    assert c.partition(("g", TID, 1), leader_epoch=3) is sp
    store.saved[("g", TID, 1)] = StoredShare(150, 150, [])  # another leader moved it on meanwhile
    again = c.partition(("g", TID, 1), leader_epoch=5)
    assert again is not sp and again is not None and again.start == 150


def test_share_partitions_evicted_at_the_limit_unless_they_hold_records() -> None:
    c, _, clock = _coordinator(ShareLimits(max_partitions=2))
    one, two = c.partition(("g", TID, 0)), c.partition(("g", TID, 1))
    assert one is not None and two is not None
    one.acquire("a", [(100, 100, False)], 1, clock())
    two.acquire("a", [(100, 100, False)], 1, clock())
    assert c.partition(("g", TID, 2)) is None  # both hold acquired records
    two.release_member("a")
    assert c.partition(("g", TID, 2)) is not None
    assert set(c.partitions) == {("g", TID, 0), ("g", TID, 2)}


def test_an_admin_reset_is_seen_by_the_leader_holding_the_state() -> None:
    c, store, clock = _coordinator()
    key = ("early", TID, 0)
    sp = c.partition(key)
    assert sp is not None and sp.acquire("a", [(0, 9, False)], 10, clock()) == [(0, 9, 1)]
    c.reset(key, 7)
    assert store.saved[key] == StoredShare(7, 7, [], 1)
    c.partitions[key] = sp  # as a leader elsewhere still holds it
    c._gens[key] = 0
    again = c.partition(key)
    assert again is not sp and again is not None and again.start == 7
    c.reset(key, -1)  # DeleteShareGroupOffsets: uninitialised, started afresh from auto.offset.reset
    fresh = c.partition(key)
    assert fresh is not None and fresh.start == 0 and store.saved[key].gen == 2
    assert c.start_offset(key) == 0 and c.start_offset(("early", TID, 2)) == -1


def test_a_groups_lock_duration_and_delivery_limit_apply_to_its_share_partitions() -> None:
    store, clock = MemStore(), Clock()
    # share.record.lock.duration.ms, share.delivery.count.limit, share.partition.max.record.locks of g
    limits = ShareLimits(record_lock_duration_ms=30_000, delivery_count_limit=5)
    own = {"g": limits.of_group()._replace(lock_ms=2_000, delivery_limit=3, max_locks=2_000)}
    c = ShareCoordinator(
        store, limits, clock=clock,
        topic_partitions=lambda name: (TID, 1), initial_offset=lambda tid, p, reset: 0,
        group_limits=lambda group: own.get(group, limits.of_group()),
    )
    assert (c.lock_ms("g"), c.lock_ms("other")) == (2_000, 30_000)
    sp = c.partition(("g", TID, 0))
    assert sp is not None
    for delivery in (1, 2, 3):
        assert sp.acquire("m", [(0, 0, False)], 1, clock.ms) == [(0, 0, delivery)]
        clock.ms += 1_999
        assert not sp.expire(clock.ms)  # still locked: the group's 2 s, not the broker's 30 s
        clock.ms += 1
        assert sp.expire(clock.ms)
    assert sp.start == 1  # released at the group's limit of 3 (the broker's is 5): archived
    # a change of the group's configs applies to the share-partition held (KIP-1240)
    own["g"] = limits.of_group()._replace(lock_ms=5_000, delivery_limit=2, max_locks=1)
    again = c.partition(("g", TID, 0))
    assert again is sp and (sp.lock_ms, sp.delivery_limit, sp.max_locks) == (5_000, 2, 1)
    assert sp.acquire("m", [(1, 1, False), (2, 2, False)], 5, clock.ms) == [(1, 1, 1)]  # one record in flight
    other = c.partition(("other", TID, 0))
    assert other is not None and (other.lock_ms, other.delivery_limit, other.max_locks) == (30_000, 5, 2000)


def test_a_groups_session_timeout_and_heartbeat_interval_apply_to_its_members() -> None:
    store, clock = MemStore(), Clock()
    limits = ShareLimits()
    # share.session.timeout.ms and share.heartbeat.interval.ms of g; "other" takes the broker's
    own = {"g": limits.of_group()._replace(session_timeout_ms=3_000, heartbeat_interval_ms=1_000)}
    c = ShareCoordinator(
        store, limits, clock=clock,
        topic_partitions=lambda name: (TID, 1), initial_offset=lambda tid, p, reset: 0,
        group_limits=lambda group: own.get(group, limits.of_group()),
    )
    joined = c.heartbeat(_hb("m1", 0, ["t"]))
    assert (joined.error_code, joined.heartbeat_interval_ms) == (ErrorCode.NONE, 1_000)
    assert c.heartbeat(_hb("o1", 0, ["t"], group="other")).heartbeat_interval_ms == limits.heartbeat_interval_ms
    assert c.session("g", "m1", 0) != ErrorCode.SHARE_SESSION_LIMIT_REACHED
    clock.ms += 3_000
    assert c.group("g") is not None and "m1" in c.groups["g"].members  # silent for exactly the timeout: kept
    clock.ms += REAP_INTERVAL_MS  # silent members are looked for at most once a second
    assert c.is_empty("g")  # past the group's 3 s: removed, and its share session closed
    assert ("g", "m1") not in c.sessions
    assert "o1" in c.groups["other"].members  # the broker's 45 s for the other group
    assert c.heartbeat(_hb("m1", 1)).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    own["g"] = own["g"]._replace(heartbeat_interval_ms=2_000)  # a config change holds at the next heartbeat
    assert c.heartbeat(_hb("m2", 0, ["t"])).heartbeat_interval_ms == 2_000
