"""One share-partition's in-flight records (KIP-932): a pure state machine over offsets.

`start` is the share-partition start offset (SPSO): below it every record is acknowledged or
archived. `end` is the first offset never acquired (SPEO + 1). Between them, `records` holds an
entry per offset that was acquired at least once (its state, delivery count, and while acquired
its member and lock deadline); an offset of [start, end) without an entry was not a deliverable
record (a control record, a gap left by compaction) and counts as archived. `end - start` never
exceeds `ShareLimits.partition_max_record_locks`: acquisition of new records stops there until
the start offset moves.

Transitions (Kafka's): a fetch acquires available records (delivery count + 1, locked for
`record_lock_duration_ms`); ACCEPT acknowledges, REJECT archives, RELEASE makes the record
available again; a lock that times out, or a member that leaves, releases. A record released with
its delivery count at `delivery_count_limit` is archived instead. The start offset then moves over
every leading acknowledged/archived offset and forgets them.

Clock: `now` is monotonic milliseconds, passed in (tests drive it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loglake.broker.share.states import ON_ACK, AckType, RecordState
from loglake.kafka_errors import ErrorCode

#: A batch as read from the log: (base offset, last offset, is a control batch).
LogBatch = tuple[int, int, bool]
#: An acquired range as ShareFetch returns it: (first offset, last offset, delivery count).
Acquired = tuple[int, int, int]
#: A persisted range: (first offset, last offset, RecordState value, delivery count).
StateBatch = tuple[int, int, int, int]


@dataclass(slots=True)
class InFlight:
    state: RecordState
    delivery_count: int
    member: str | None = None
    deadline_ms: int = 0


class SharePartition:
    def __init__(self, start: int, *, lock_ms: int, delivery_limit: int, max_locks: int) -> None:
        self.start = start
        self.end = start
        self.records: dict[int, InFlight] = {}
        self.lock_ms = lock_ms
        self.delivery_limit = delivery_limit
        self.max_locks = max_locks

    # ---- persistence -------------------------------------------------------------------------

    @classmethod
    def restored(cls, start: int, end: int, batches: Iterable[StateBatch], *, lock_ms: int, delivery_limit: int,
                 max_locks: int) -> SharePartition:
        """The state a `share_state` record stored; acquired records come back available (their
        locks died with the broker that held them)."""
        sp = cls(start, lock_ms=lock_ms, delivery_limit=delivery_limit, max_locks=max_locks)
        sp.end = max(start, end)
        for first, last, state, count in batches:
            st = RecordState(state)
            if st is RecordState.ACQUIRED:
                st = RecordState.AVAILABLE
            for off in range(max(first, start), min(last, sp.end - 1) + 1):
                sp.records[off] = InFlight(st, count)
        sp._advance()
        return sp

    def snapshot(self) -> list[StateBatch]:
        """Ranges of equal (state, delivery count) over [start, end), acquired written as available;
        offsets without an entry written archived."""
        out: list[StateBatch] = []
        for off in range(self.start, self.end):
            e = self.records.get(off)
            if e is None:
                st, n = RecordState.ARCHIVED, 0
            else:
                st = RecordState.AVAILABLE if e.state is RecordState.ACQUIRED else e.state
                n = e.delivery_count
            if out and out[-1][1] == off - 1 and out[-1][2] == st and out[-1][3] == n:
                out[-1] = (out[-1][0], off, st, n)
            else:
                out.append((off, off, int(st), n))
        return out

    # ---- reading -----------------------------------------------------------------------------

    def fetch_from(self) -> int:
        """Where a fetch should read: the first available in-flight record, else `end`."""
        for off in range(self.start, self.end):
            e = self.records.get(off)
            if e is not None and e.state is RecordState.AVAILABLE:
                return off
        return self.end

    def can_acquire(self) -> bool:
        return self.end - self.start < self.max_locks or any(
            e.state is RecordState.AVAILABLE for e in self.records.values()
        )

    def count(self, state: RecordState) -> int:
        return sum(1 for e in self.records.values() if e.state is state)

    # ---- transitions -------------------------------------------------------------------------

    def acquire(self, member: str, batches: Sequence[LogBatch], max_records: int, now_ms: int) -> list[Acquired]:
        """Acquire up to `max_records` available records of `batches` (ascending) for `member`."""
        got: list[Acquired] = []
        n = 0
        deadline = now_ms + self.lock_ms
        for base, last, control in batches:
            for off in range(max(base, self.start), last + 1):
                if n >= max_records:
                    return got
                if off < self.end:
                    e = self.records.get(off)
                    if e is None or e.state is not RecordState.AVAILABLE:
                        continue
                    e.state, e.delivery_count, e.member, e.deadline_ms = RecordState.ACQUIRED, e.delivery_count + 1, member, deadline
                    count = e.delivery_count
                else:
                    if off - self.start >= self.max_locks:
                        return got
                    self.end = off + 1  # offsets skipped between batches were never records
                    if control:
                        continue
                    self.records[off] = InFlight(RecordState.ACQUIRED, 1, member, deadline)
                    count = 1
                n += 1
                if got and got[-1][1] == off - 1 and got[-1][2] == count:
                    got[-1] = (got[-1][0], off, count)
                else:
                    got.append((off, off, count))
        return got

    def acknowledge(self, member: str, first: int, last: int, types: Sequence[int]) -> int:
        """Apply one acknowledgement batch: one type for the whole range or one per offset. Checked
        whole before any of it applies: INVALID_REQUEST for a malformed batch, INVALID_RECORD_STATE
        when a record is not acquired by `member` (a gap may also be a never-delivered offset)."""
        if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
            return ErrorCode.INVALID_REQUEST
        try:
            kinds = [AckType(t) for t in types]
        except ValueError:
            return ErrorCode.INVALID_REQUEST
        for i, off in enumerate(range(first, last + 1)):
            kind = kinds[0] if len(kinds) == 1 else kinds[i]
            e = self.records.get(off)
            if kind is AckType.GAP and (e is None or off < self.start):
                continue
            if e is None or e.state is not RecordState.ACQUIRED or e.member != member:
                return ErrorCode.INVALID_RECORD_STATE
        for i, off in enumerate(range(first, last + 1)):
            e = self.records.get(off)
            if e is None:
                continue
            kind = kinds[0] if len(kinds) == 1 else kinds[i]
            self._settle(e, ON_ACK[kind])
        self._advance()
        return ErrorCode.NONE

    def release_member(self, member: str) -> bool:
        """Release every record `member` holds (it left, or closed its share session)."""
        changed = False
        for e in self.records.values():
            if e.state is RecordState.ACQUIRED and e.member == member:
                self._settle(e, RecordState.AVAILABLE)
                changed = True
        if changed:
            self._advance()
        return changed

    def expire(self, now_ms: int) -> bool:
        """Release every record whose acquisition lock timed out."""
        changed = False
        for e in self.records.values():
            if e.state is RecordState.ACQUIRED and e.deadline_ms <= now_ms:
                self._settle(e, RecordState.AVAILABLE)
                changed = True
        if changed:
            self._advance()
        return changed

    def skip_to(self, offset: int) -> bool:
        """The log no longer holds offsets below `offset` (retention, DeleteRecords): they are gone
        from the share-partition too, acquired or not."""
        if offset <= self.start:
            return False
        for off in [o for o in self.records if o < offset]:
            del self.records[off]
        self.start = offset
        self.end = max(self.end, offset)
        self._advance()
        return True

    def _settle(self, e: InFlight, to: RecordState) -> None:
        if to is RecordState.AVAILABLE and e.delivery_count >= self.delivery_limit:
            to = RecordState.ARCHIVED
        e.state, e.member, e.deadline_ms = to, None, 0

    def _advance(self) -> None:
        while self.start < self.end:
            e = self.records.get(self.start)
            if e is not None and not e.state.terminal:
                break
            self.records.pop(self.start, None)
            self.start += 1


__all__ = ["Acquired", "InFlight", "LogBatch", "SharePartition", "StateBatch"]
