"""One partition's state: dense offsets, the unsealed buffer, the sealed segment chain.

Offsets:  log_start_offset <= sealed_end <= high_watermark <= next_offset

* `next_offset` — where the next append goes (assigned under `lock`).
* `high_watermark` — everything below is durable per the topic's class and visible to readers.
* `sealed_end` — everything below is in sealed segments in a store; the unsealed buffer holds
  [sealed_end, next_offset).
* `log_start_offset` — the first offset still readable (retention and DeleteRecords raise it).

Locks (ranked: loglake.locks, docs/ARCHITECTURE.md): `seal_lock` (one seal at a time) before
`lock`, which guards the buffer, the segment list and next_offset; `hw_cond` (innermost) guards
the high watermark and tail waiters. The WAL writer thread only takes `hw_cond`, so an appender
may block on the WAL queue while holding `lock` without a deadlock.
"""

from __future__ import annotations

import bisect
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from loglake.locks import CheckedLock, Rank, ranked_condition, ranked_lock
from loglake.meta.producers import ProducerStates
from loglake.meta.segments import SegmentRef, SegmentTable
from loglake.meta.state import PartitionMeta

__all__ = ["TAIL_WAITERS_MAX", "BufferedAppend", "Partition", "SegmentRef"]

#: Most tail waiters one partition keeps; past this, waiting readers are answered at once
#: (empty) rather than let the list grow without bound.
TAIL_WAITERS_MAX = 10_000


@dataclass(slots=True)
class BufferedAppend:
    """One append in the unsealed buffer: one or more Kafka batches, offsets assigned."""

    base_offset: int
    end_offset: int
    data: bytes | bytearray | memoryview
    batch_positions: tuple[int, ...]  # start of each Kafka batch in `data`
    max_timestamp: int
    appended_at: float  # clock seconds, for segment.ms

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(eq=False)
class Partition:
    topic: str
    topic_id: bytes
    index: int
    shard: int
    #: the durable part (segment chain, log start, sealed end): changed only by metadata records
    meta: PartitionMeta
    next_offset: int = 0
    #: sealed_end as recorded by durable metadata (WAL truncation uses it)
    durable_sealed_end: int = 0
    buffer: list[BufferedAppend] = field(default_factory=list)
    buffer_bases: list[int] = field(default_factory=list)
    buffer_bytes: int = 0
    buffer_records: int = 0
    #: Kafka batches in the buffer: each adds an index entry to the segment that seals it
    buffer_batches: int = 0
    seal_scheduled: bool = False
    deleted: bool = False
    lock: threading.Lock | CheckedLock = field(default_factory=lambda: ranked_lock(Rank.PARTITION, "Partition.lock"))
    seal_lock: threading.Lock | CheckedLock = field(default_factory=lambda: ranked_lock(Rank.SEAL, "Partition.seal_lock"))
    hw_cond: threading.Condition = field(default_factory=lambda: ranked_condition(Rank.HIGH_WATERMARK, "Partition.hw_cond"))
    _high_watermark: int = 0
    _waiters: list[tuple[int, Future[None]]] = field(default_factory=list)

    # ---- durable state, read through the metadata (records change it, see loglake.meta.state) ----

    @property
    def segments(self) -> SegmentTable:
        return self.meta.segments

    @property
    def log_start_offset(self) -> int:
        return self.meta.log_start

    @property
    def sealed_end(self) -> int:
        return self.meta.sealed_end

    @property
    def chain_hash(self) -> bytes:
        return self.meta.chain_hash

    @property
    def producers(self) -> ProducerStates:
        return self.meta.producers

    # ---- high watermark and tail waits (hw_cond) ---------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    def advance_hw(self, offset: int) -> None:
        ready: list[Future[None]] = []
        with self.hw_cond:
            if offset <= self._high_watermark:
                return
            self._high_watermark = offset
            if self._waiters:
                keep = []
                for want, fut in self._waiters:
                    if fut.done():
                        continue
                    if want < offset:
                        ready.append(fut)
                    else:
                        keep.append((want, fut))
                self._waiters = keep
            self.hw_cond.notify_all()
        for fut in ready:
            if not fut.done():
                try:
                    fut.set_result(None)
                except Exception:  # cancelled between the check and here
                    pass

    def set_hw(self, offset: int) -> None:
        """Set the high watermark outright (recovery, truncation)."""
        with self.hw_cond:
            self._high_watermark = offset

    def wait_for(self, offset: int) -> Future[None]:
        """A future resolved once data at `offset` is visible (high watermark > offset)."""
        fut: Future[None] = Future()
        with self.hw_cond:
            if self._high_watermark > offset or self.deleted:
                fut.set_result(None)
                return fut
            if len(self._waiters) >= TAIL_WAITERS_MAX:
                self._waiters = [(w, f) for w, f in self._waiters if not f.done()]
                if len(self._waiters) >= TAIL_WAITERS_MAX:
                    fut.set_result(None)
                    return fut
            self._waiters.append((offset, fut))
        return fut

    def wake_all(self) -> None:
        with self.hw_cond:
            waiters, self._waiters = self._waiters, []
            self.hw_cond.notify_all()
        for _, fut in waiters:
            if not fut.done():
                try:
                    fut.set_result(None)
                except Exception:
                    pass

    # ---- buffer (lock held by caller) ----------------------------------------------------------

    def buffer_append(self, item: BufferedAppend, record_count: int) -> None:
        self.buffer.append(item)
        self.buffer_bases.append(item.base_offset)
        self.buffer_bytes += item.size
        self.buffer_records += record_count
        self.buffer_batches += len(item.batch_positions)

    def buffer_pop_front(self, count: int) -> list[BufferedAppend]:
        items = self.buffer[:count]
        del self.buffer[:count]
        del self.buffer_bases[:count]
        freed = sum(item.size for item in items)
        self.buffer_bytes -= freed
        self.buffer_records -= sum(item.end_offset - item.base_offset for item in items)
        self.buffer_batches -= sum(len(item.batch_positions) for item in items)
        return items

    def buffer_find(self, offset: int) -> int | None:
        """Index of the buffered append holding `offset`, or None."""
        i = bisect.bisect_right(self.buffer_bases, offset) - 1
        if i < 0:
            return None
        return i if self.buffer[i].end_offset > offset else None

    def segment_find(self, offset: int) -> int | None:
        """Index of the sealed segment holding `offset` (in a compaction gap: the next one), or None."""
        return self.meta.segments.find(offset)
