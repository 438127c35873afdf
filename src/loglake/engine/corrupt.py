"""Corruption of sealed data found while the broker runs: batch checks on read, and the marks.

Every sealed batch a reader is about to get is checked first (`BatchChecker.check`): magic,
its length and first offset against the segment's index entry (those header bytes are not
covered by the CRC), and the batch CRC-32C over attributes..end (hardware crc32c). A hot
segment's batches are remembered as verified in a bounded LRU (`VERIFIED_SEGMENTS_MAX` segments,
one bit per batch), so a batch read again (more consumer groups, re-reads) goes out by sendfile
without a second look; a cold read checks the bytes it already has every time.

A bad batch is reported to `Corruption` (the engine's one instance): one log line per segment
and batch (rate-limited), a counter for /metrics, and a mark on the partition that /readyz and
/metrics list until the scrubber repairs the segment or the segment is gone (retention,
compaction). The reader serves the good batches before the bad one; a read that starts at the
bad one fails with CorruptBatchError (Fetch: CORRUPT_MESSAGE).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import crc32c

from loglake import canary
from loglake.errors import CorruptBatchError, LoglakeError
from loglake.logsafe import RateLimitedLog
from loglake.records.batch import (
    BATCH_LENGTH_OFFSET,
    CRC_COVERED_START,
    CRC_OFFSET,
    LENGTH_FIELD_END,
    MAGIC_OFFSET,
    MAGIC_V2,
    UNCOVERED_HEAD,
)
from loglake.segment.index import SegmentIndex

__all__ = ["VERIFIED_SEGMENTS_MAX", "BatchChecker", "CorruptMark", "Corruption"]

log = logging.getLogger(__name__)

#: Most hot segments whose verified-batch bitmaps are kept (LRU; one bit per batch each).
VERIFIED_SEGMENTS_MAX = 4096
#: Most corrupt segments remembered at once (past it the oldest mark is dropped, still logged).
MARKS_MAX = 10_000
#: One log line per corrupt batch per this many seconds (a consumer retries the same fetch).
CORRUPTION_LOG_INTERVAL_S = 300.0


@dataclass(frozen=True, slots=True)
class CorruptMark:
    topic: str
    partition: int
    key: str  # segment object key
    offset: int  # first offset of the bad batch (-1: whole-segment problem found by the scrubber)
    path: str  # file path or store URL + key
    detail: str
    source: str  # "read" or "scrub"


class Corruption:
    """Corrupt segments found while running, by partition; counters for /metrics."""

    def __init__(self, alive: Callable[[str, int, str], bool] | None = None) -> None:
        self._lock = threading.Lock()
        self._marks: OrderedDict[str, CorruptMark] = OrderedDict()
        self._log = RateLimitedLog(log, CORRUPTION_LOG_INTERVAL_S)
        self.found_total: dict[str, int] = {"read": 0, "scrub": 0}
        self.reads_refused = 0
        self.repairs = 0
        #: (topic, partition, segment key) -> whether the segment is still part of the partition
        self.alive = alive

    def report(self, exc: CorruptBatchError, key: str, source: str) -> None:
        """Log (once per segment and batch), count and mark."""
        mark = CorruptMark(exc.topic, exc.partition, key, exc.batch_offset, exc.path, exc.reason, source)
        with self._lock:
            new = key not in self._marks
            self._marks[key] = mark
            self._marks.move_to_end(key)
            while len(self._marks) > MARKS_MAX:
                self._marks.popitem(last=False)
            if new:
                self.found_total[source] = self.found_total.get(source, 0) + 1
        self._log.error(
            ("corrupt", key, exc.batch_offset),
            "corrupt data in %s-%d at offset %d: file %s byte %d: %s (found by %s; readers of this offset get CORRUPT_MESSAGE)",
            exc.topic, exc.partition, exc.batch_offset, exc.path, exc.offset, exc.reason, source,
        )

    def refused(self) -> None:
        with self._lock:
            self.reads_refused += 1

    def clear(self, key: str, *, repaired: bool = False) -> bool:
        with self._lock:
            gone = self._marks.pop(key, None) is not None
            if repaired:
                self.repairs += 1
        return gone

    def marks(self) -> list[CorruptMark]:
        """The marks of segments that still exist (`alive`, set by the engine, says which: a
        segment retention or compaction removed takes its mark with it)."""
        with self._lock:
            marks = list(self._marks.values())
        alive = self.alive
        if alive is None:
            return marks
        kept: list[CorruptMark] = []
        for m in marks:
            try:
                ok = alive(m.topic, m.partition, m.key)
            except LoglakeError:  # the topic was deleted
                ok = False
            if ok:
                kept.append(m)
            else:
                self.clear(m.key)
        return kept

    def partitions(self) -> list[tuple[str, int]]:
        """Marked partitions, sorted."""
        return sorted({(m.topic, m.partition) for m in self.marks()})

    def is_marked(self, key: str) -> bool:
        with self._lock:
            return key in self._marks

    def readyz_lines(self) -> list[str]:
        return [f"corrupt: {m.topic}-{m.partition} offset {m.offset} segment {m.key}" for m in self.marks()]


def check_batch(buf: bytes | memoryview, at: int, base_offset: int, length: int) -> str | None:
    """What is wrong with the batch at buf[at:at+length] whose index entry says (base_offset,
    length); None when it is sound."""
    view = memoryview(buf)
    if len(view) < at + length or length < LENGTH_FIELD_END:
        return f"batch is cut short ({len(view) - at} of {length} bytes)"
    got_base = int.from_bytes(view[at : at + BATCH_LENGTH_OFFSET], "big", signed=True)
    got_len = int.from_bytes(view[at + BATCH_LENGTH_OFFSET : at + LENGTH_FIELD_END], "big", signed=True)
    if got_base != base_offset or got_len + LENGTH_FIELD_END != length:
        return f"batch header says offset {got_base} and {got_len + LENGTH_FIELD_END} bytes, the index {base_offset} and {length}"
    if view[at + MAGIC_OFFSET] != MAGIC_V2:
        return f"batch magic {view[at + MAGIC_OFFSET]}, expected {MAGIC_V2}"
    stored = int.from_bytes(view[at + CRC_OFFSET : at + CRC_COVERED_START], "big")
    crc = crc32c.crc32c(view[at + CRC_COVERED_START : at + length])
    if crc != stored and not canary.SKIP_CRC_CHECK:  # test-only mutation (loglake/canary.py)
        return f"batch CRC-32C mismatch (stored {stored:#010x}, computed {crc:#010x})"
    return None


class _Verified:
    """Which batches of one segment were verified: a prefix count (sequential readers) and bits."""

    __slots__ = ("bits", "prefix")

    def __init__(self, n: int) -> None:
        self.bits = bytearray((n + 7) // 8)
        self.prefix = 0

    def has(self, i: int) -> bool:
        return i < self.prefix or bool(self.bits[i >> 3] & (1 << (i & 7)))

    def add(self, i: int, j: int, n: int) -> None:
        bits = self.bits
        for k in range(i, j):
            bits[k >> 3] |= 1 << (k & 7)
        p = self.prefix
        while p < n and bits[p >> 3] & (1 << (p & 7)):
            p += 1
        self.prefix = p


class BatchChecker:
    """Checks sealed batches before they are served; remembers verified hot batches (bounded)."""

    def __init__(self, corruption: Corruption, segments_max: int = VERIFIED_SEGMENTS_MAX) -> None:
        self.corruption = corruption
        self.segments_max = segments_max
        self._lock = threading.Lock()
        self._verified: OrderedDict[str, _Verified] = OrderedDict()
        self.bytes_checked = 0

    def forget(self, key: str) -> None:
        with self._lock:
            self._verified.pop(key, None)

    def verified(self, key: str, first: int, end: int) -> bool:
        """Whether batches first..end-1 of segment `key` were all checked already (a read of them
        needs no I/O to check them again)."""
        with self._lock:
            state = self._verified.get(key)
            if state is None:
                return False
            if end <= state.prefix:
                return True  # the common case: everything up to there was checked in order
            return all(state.has(i) for i in range(first, end))

    def _state(self, key: str, n: int) -> _Verified:
        with self._lock:
            state = self._verified.get(key)
            if state is None or len(state.bits) != (n + 7) // 8:
                state = self._verified[key] = _Verified(n)
                while len(self._verified) > self.segments_max:
                    self._verified.popitem(last=False)
            else:
                self._verified.move_to_end(key)
            return state

    def check(
        self,
        where: tuple[str, int],
        key: str,
        path: str,
        index: SegmentIndex,
        first: int,
        count: int,
        read: Callable[[int, int], bytes | memoryview],
        *,
        data: bytes | memoryview | None = None,
        remember: bool = True,
    ) -> int:
        """How many of batches first..first+count-1 are sound, counted from `first` (== count:
        all of them). `data` holds those batches when the caller has them (cold reads);
        otherwise the ones not yet verified are read with `read(position, length)`. A bad batch
        is reported; when it is the first one, CorruptBatchError is raised."""
        n = len(index)
        end = first + count
        state = self._state(key, n) if remember else None
        if state is not None and end <= state.prefix:
            return count  # the common case of a second reader: nothing to read or check
        positions, bases, data_end = index.positions, index.base_offsets, index.data_end
        base_pos = positions[first]
        i = first
        while i < end:
            if state is not None and state.has(i):
                i += 1
                continue
            j = i + 1  # a run of unverified batches i..j-1, read in one go
            while j < end and not (state is not None and state.has(j)):
                j += 1
            start = positions[i]
            stop = positions[j] if j < n else data_end
            buf = memoryview(data)[start - base_pos : stop - base_pos] if data is not None else memoryview(read(start, stop - start))
            self.bytes_checked += stop - start
            bad = _first_bad(buf, start, positions, bases, i, j, n, data_end)
            if bad is not None:
                k, problem = bad
                if state is not None and k > i:
                    state.add(i, k, n)
                exc = CorruptBatchError(where[0], where[1], bases[k], path, positions[k], problem)
                self.corruption.report(exc, key, "read")
                if k == first:
                    self.corruption.refused()
                    raise exc
                return k - first
            if state is not None:
                state.add(i, j, n)
            i = j
        return count


#: A batch header's fields up to the CRC: base offset, length, leader epoch, magic, CRC.
_HEAD = UNCOVERED_HEAD


def _first_bad(
    buf: memoryview, start: int, positions: Sequence[int], bases: Sequence[int], i: int, j: int, n: int, data_end: int
) -> tuple[int, str] | None:
    """(batch number, what is wrong) of the first bad batch among i..j-1 held in `buf` (which
    starts at byte `start` of the segment), or None. The common path is one header unpack and one
    crc32c call per batch."""
    have = len(buf)
    for k in range(i, j):
        pos = positions[k]
        size = (positions[k + 1] if k + 1 < n else data_end) - pos
        at = pos - start
        if at + size <= have and size >= _HEAD.size:
            base, length, _epoch, magic, crc = _HEAD.unpack_from(buf, at)
            if (
                base == bases[k]
                and length + LENGTH_FIELD_END == size
                and magic == MAGIC_V2
                and (canary.SKIP_CRC_CHECK or crc32c.crc32c(buf[at + CRC_COVERED_START : at + size]) == crc)
            ):
                continue
        problem = check_batch(buf, at, bases[k], size) or "batch is unreadable"
        return k, problem
    return None
