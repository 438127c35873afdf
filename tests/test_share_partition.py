"""A share-partition's in-flight records (loglake.broker.share.partition): the KIP-932
transitions one by one, and a hypothesis state machine against a model of every offset."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from loglake.broker.share.partition import SharePartition
from loglake.broker.share.states import AckType, RecordState
from loglake.kafka_errors import ErrorCode

LOCK = 1000
LIMIT = 3


def _sp(start: int = 0, max_locks: int = 100) -> SharePartition:
    return SharePartition(start, lock_ms=LOCK, delivery_limit=LIMIT, max_locks=max_locks)


def test_acquire_accept_release_reject() -> None:
    sp = _sp()
    assert sp.acquire("a", [(0, 4, False)], 10, now_ms=0) == [(0, 4, 1)]
    assert sp.acquire("b", [(0, 4, False)], 10, now_ms=0) == []  # all acquired by a
    assert sp.acknowledge("a", 0, 1, [AckType.ACCEPT]) == ErrorCode.NONE
    assert sp.acknowledge("a", 2, 4, [AckType.RELEASE, AckType.REJECT, AckType.ACCEPT]) == ErrorCode.NONE
    assert sp.start == 2  # 2 is available again
    assert sp.acquire("b", [(0, 4, False)], 10, now_ms=0) == [(2, 2, 2)]
    assert sp.acknowledge("b", 2, 2, [AckType.ACCEPT]) == ErrorCode.NONE
    assert (sp.start, sp.end, sp.records) == (5, 5, {})


def test_acknowledging_what_another_member_holds_is_refused_whole() -> None:
    sp = _sp()
    sp.acquire("a", [(0, 1, False)], 1, now_ms=0)
    sp.acquire("b", [(0, 1, False)], 1, now_ms=0)
    assert sp.acknowledge("a", 0, 1, [AckType.ACCEPT]) == ErrorCode.INVALID_RECORD_STATE
    assert sp.records[0].state is RecordState.ACQUIRED  # nothing of the batch applied
    assert sp.acknowledge("a", 0, 1, [1, 1, 1]) == ErrorCode.INVALID_REQUEST  # three types for two offsets
    assert sp.acknowledge("a", 0, 0, [9]) == ErrorCode.INVALID_REQUEST


def test_lock_timeout_and_delivery_limit_archive() -> None:
    sp = _sp()
    now = 0
    for delivery in range(1, LIMIT + 1):
        assert sp.acquire("a", [(0, 0, False)], 1, now_ms=now) == [(0, 0, delivery)]
        assert not sp.expire(now + LOCK - 1)
        now += LOCK
        assert sp.expire(now)
    assert sp.acquire("a", [(0, 0, False)], 1, now_ms=now) == []  # archived after LIMIT deliveries
    assert sp.start == 1


def test_in_flight_window_is_bounded_and_control_batches_are_skipped() -> None:
    sp = _sp(max_locks=4)
    assert sp.acquire("a", [(0, 0, True), (1, 9, False)], 100, now_ms=0) == [(1, 3, 1)]
    assert sp.end == 4 and not sp.can_acquire()
    sp.acknowledge("a", 1, 3, [AckType.ACCEPT])
    assert sp.start == 4 and sp.can_acquire()


def test_snapshot_round_trip_makes_acquired_records_available() -> None:
    sp = _sp(start=10)
    sp.acquire("a", [(10, 15, False)], 10, now_ms=0)
    sp.acknowledge("a", 11, 11, [AckType.ACCEPT])
    sp.acknowledge("a", 12, 12, [AckType.REJECT])
    snap = sp.snapshot()
    assert snap == [(10, 10, 0, 1), (11, 11, 2, 1), (12, 12, 4, 1), (13, 15, 0, 1)]
    back = SharePartition.restored(sp.start, sp.end, snap, lock_ms=LOCK, delivery_limit=LIMIT, max_locks=100)
    assert back.acquire("b", [(10, 15, False)], 10, now_ms=0) == [(10, 10, 2), (13, 15, 2)]


def test_skip_to_drops_what_the_log_no_longer_holds() -> None:
    sp = _sp()
    sp.acquire("a", [(0, 5, False)], 10, now_ms=0)
    assert sp.skip_to(3)
    assert sp.start == 3 and min(sp.records) == 3


class Model(RuleBasedStateMachine):
    """Every offset of a 30-record log: its state, delivery count and owner, kept plainly."""

    LOG = 30

    def __init__(self) -> None:
        super().__init__()
        self.sp = SharePartition(0, lock_ms=LOCK, delivery_limit=LIMIT, max_locks=12)
        self.now = 0
        self.state = ["new"] * self.LOG  # new | available | acquired | acked | archived
        self.count = [0] * self.LOG
        self.owner: list[str | None] = [None] * self.LOG
        self.deadline = [0] * self.LOG

    def _settle(self, off: int, to: str) -> None:
        if to == "available" and self.count[off] >= LIMIT:
            to = "archived"
        self.state[off], self.owner[off] = to, None

    def _start(self) -> int:
        s = 0
        while s < self.LOG and self.state[s] in ("acked", "archived"):
            s += 1
        return s

    @rule(member=st.sampled_from("ab"), n=st.integers(1, 8))
    def acquire(self, member: str, n: int) -> None:
        got = self.sp.acquire(member, [(0, self.LOG - 1, False)], n, self.now)
        offsets = [o for f, la, _ in got for o in range(f, la + 1)]
        expected = []
        start = self._start()
        for off in range(start, self.LOG):
            if len(expected) == n:
                break
            if self.state[off] == "available" or (self.state[off] == "new" and off - start < 12):
                expected.append(off)
            elif self.state[off] == "new":
                break
        assert offsets == expected
        for f, la, count in got:
            for off in range(f, la + 1):
                self.count[off] += 1
                assert count == self.count[off]
                self.state[off], self.owner[off], self.deadline[off] = "acquired", member, self.now + LOCK

    @rule(member=st.sampled_from("ab"), first=st.integers(0, 29), span=st.integers(0, 3), kind=st.sampled_from(list(AckType)[1:]))
    def acknowledge(self, member: str, first: int, span: int, kind: AckType) -> None:
        last = min(first + span, self.LOG - 1)
        ok = all(self.state[o] == "acquired" and self.owner[o] == member for o in range(first, last + 1))
        code = self.sp.acknowledge(member, first, last, [kind])
        assert code == (ErrorCode.NONE if ok else ErrorCode.INVALID_RECORD_STATE)
        if ok:
            to = {AckType.ACCEPT: "acked", AckType.RELEASE: "available", AckType.REJECT: "archived"}[kind]
            for o in range(first, last + 1):
                self._settle(o, to)

    @rule(ms=st.integers(1, 1500))
    def tick(self, ms: int) -> None:
        self.now += ms
        self.sp.expire(self.now)
        for o in range(self.LOG):
            if self.state[o] == "acquired" and self.deadline[o] <= self.now:
                self._settle(o, "available")

    @rule(member=st.sampled_from("ab"))
    def leave(self, member: str) -> None:
        self.sp.release_member(member)
        for o in range(self.LOG):
            if self.state[o] == "acquired" and self.owner[o] == member:
                self._settle(o, "available")

    @rule()
    def restart(self) -> None:
        self.sp = SharePartition.restored(self.sp.start, self.sp.end, self.sp.snapshot(), lock_ms=LOCK,
                                          delivery_limit=LIMIT, max_locks=12)
        for o in range(self.LOG):
            if self.state[o] == "acquired":
                self.state[o], self.owner[o] = "available", None

    @invariant()
    def agrees(self) -> None:
        assert self.sp.start == self._start()
        assert self.sp.end - self.sp.start <= 12
        names = {RecordState.AVAILABLE: "available", RecordState.ACQUIRED: "acquired",
                 RecordState.ACKNOWLEDGED: "acked", RecordState.ARCHIVED: "archived"}
        for o in range(self.sp.start, self.LOG):
            e = self.sp.records.get(o)
            assert (names[e.state] if e is not None else "new") == self.state[o], o
            if e is not None:
                assert e.delivery_count == self.count[o]


TestShareModel = Model.TestCase
TestShareModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
