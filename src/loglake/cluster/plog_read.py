"""Reads of cluster partitions: memory, then flush-object ranges, then merged segments.

Only committed offsets are served: the metadata (`MetaState.plogs`) says where each committed
offset lies — a merged segment or a flush-object range — and nothing past the committed end or
below the log start (`Plog.log_start`, raised by DeleteRecords and retention) is ever returned. Three tiers, cheapest first:

  * memory: the batches this broker's own appends committed lately (`remember`), bounded by
    MEMORY_BYTES_MAX over all partitions, oldest dropped first;
  * flush-object ranges: one ranged GET per range, checked against its CRC, kept in a cache
    bounded by CACHE_BYTES_MAX (several fetches of one range cost one GET);
  * merged segments: the data part of the segment with one ranged GET, checked against the
    segment's data CRC-32C, through the same cache. A compacted segment (loglake.cluster.compact)
    is always read from the bucket: memory holds the batches as appended, before compaction.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict, deque
from typing import Any

import crc32c

from loglake.cluster.flushobj import FlushIndexEntry, iter_batches, read_range
from loglake.errors import CorruptionError, OffsetOutOfRangeError
from loglake.meta.cluster import Plog, PlogRange, PlogSegment
from loglake.records.batch import peek_header
from loglake.segment.format import HEADER_SIZE
from loglake.store.base import ObjectStore

__all__ = ["CACHE_BYTES_MAX", "MEMORY_BYTES_MAX", "PlogReader"]

#: Recent committed batches kept in memory for reads (all partitions together).
MEMORY_BYTES_MAX = 64 * 1024 * 1024
#: Ranges and segment data fetched from the bucket, kept for the next reads.
CACHE_BYTES_MAX = 128 * 1024 * 1024


class _Lru:
    """A byte-bounded LRU map."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.size = 0
        self._items: OrderedDict[Any, bytes] = OrderedDict()

    def get(self, key: Any) -> bytes | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
        return data

    def put(self, key: Any, data: bytes) -> None:
        if len(data) > self.bytes_max or key in self._items:
            return
        self._items[key] = data
        self.size += len(data)
        while self.size > self.bytes_max:
            _, old = self._items.popitem(last=False)
            self.size -= len(old)


class PlogReader:
    def __init__(
        self,
        meta: Any,
        store: ObjectStore,
        *,
        memory_bytes: int = MEMORY_BYTES_MAX,
        cache_bytes: int = CACHE_BYTES_MAX,
    ) -> None:
        self.meta = meta
        self.store = store
        self._lock = threading.Lock()
        self._cache = _Lru(cache_bytes)
        self._memory_bytes_max = memory_bytes
        self._memory_size = 0
        #: (topic id, partition) -> sorted [(base, last, bytes)]; bounded by memory_bytes in all
        self._memory: dict[tuple[str, int], list[tuple[int, int, bytes]]] = {}
        self._memory_order: deque[tuple[str, int, int]] = deque()  # insertion order, for dropping the oldest
        self.gets = 0  # ranged GETs this reader made (tests and benchmarks count them)

    def remember(self, topic_id: str, partition: int, base: int, last: int, data: bytes) -> None:
        """Keep an acknowledged append's batches for reads from memory."""
        if len(data) > self._memory_bytes_max:
            return
        with self._lock:
            rows = self._memory.setdefault((topic_id, partition), [])
            bisect.insort(rows, (base, last, data), key=lambda r: r[0])
            self._memory_order.append((topic_id, partition, base))
            self._memory_size += len(data)
            while self._memory_size > self._memory_bytes_max and self._memory_order:
                tid, p, b = self._memory_order.popleft()
                rows = self._memory.get((tid, p), [])
                i = bisect.bisect_left(rows, b, key=lambda r: r[0])
                if i < len(rows) and rows[i][0] == b:
                    self._memory_size -= len(rows[i][2])
                    del rows[i]
                if not rows:
                    self._memory.pop((tid, p), None)

    def _from_memory(self, topic_id: str, partition: int, offset: int) -> bytes | None:
        with self._lock:
            rows = self._memory.get((topic_id, partition))
            if not rows:
                return None
            i = bisect.bisect_right(rows, offset, key=lambda r: r[0]) - 1
            if i >= 0 and rows[i][0] <= offset <= rows[i][1]:
                return rows[i][2]
        return None

    def read(self, topic_id: str, partition: int, offset: int, max_bytes: int) -> bytes:
        tid = bytes.fromhex(topic_id)

        def snapshot(state: Any) -> tuple[int, int, list[PlogSegment | PlogRange]]:
            plog: Plog | None = state.plogs.parts.get((tid, partition))
            if plog is None:
                return 0, 0, []
            return plog.log_start, plog.end, [*plog.segments, *plog.ranges]

        start, end, sources = self.meta.read(snapshot)
        if offset == end:
            return b""
        if not start <= offset < end:
            raise OffsetOutOfRangeError(f"{topic_id}-{partition}: offset {offset} is outside {start}..{end}")
        i = bisect.bisect_right(sources, offset, key=lambda s: s.base) - 1
        out: list[bytes] = []
        size = 0
        for src in sources[max(i, 0) :]:
            while offset <= src.last:
                # a compacted segment holds other bytes than those appended: never from memory
                rewritten = isinstance(src, PlogSegment) and src.gen > 0
                data = None if rewritten else self._from_memory(topic_id, partition, offset)
                from_bucket = data is None
                views = self._batches(topic_id, partition, src) if data is None else iter_batches(data)
                for view in views:
                    h = peek_header(view)
                    if h.last_offset < offset:
                        continue
                    if out and size + len(view) > max_bytes:
                        return b"".join(out)
                    out.append(bytes(view))
                    size += len(view)
                    offset = h.last_offset + 1
                if from_bucket:
                    break
            if size >= max_bytes or offset >= end:
                break
        return b"".join(out)

    def _batches(self, topic_id: str, partition: int, src: PlogSegment | PlogRange) -> Any:
        if isinstance(src, PlogRange):
            key = (src.key, src.pos, src.length)
            with self._lock:
                data = self._cache.get(key)
            if data is None:
                entry = FlushIndexEntry(
                    topic_id,
                    partition,
                    src.base,
                    src.last,
                    src.pos,
                    src.length,
                    src.count,
                    src.max_ts,
                    src.batches,
                    src.crc,
                )
                data = read_range(self.store, src.key, entry)
                with self._lock:
                    self.gets += 1
                    self._cache.put(key, data)
            return iter_batches(data)
        skey = (src.key, 0, src.index_pos)
        with self._lock:
            data = self._cache.get(skey)
        if data is None:
            data = self.store.get_range(src.key, 0, src.index_pos)
            crc = crc32c.crc32c(data)
            if len(data) != src.index_pos or crc != src.data_crc:
                raise CorruptionError(
                    src.key, 0, f"merged segment data CRC-32C {crc:#010x}, metadata says {src.data_crc:#010x}"
                )
            with self._lock:
                self.gets += 1
                self._cache.put(skey, data)
        return iter_batches(memoryview(data)[HEADER_SIZE:])
