"""Cold reads: footer cache, range cache and read-ahead over the cold store.

Cold reads cost at most two ranged GETs — the object's tail (trailer + index, then cached in the
footer cache) and exactly the batches asked for — and run on their own small thread pool, so a
slow bucket slows only readers of cold history, never appends or tail reads. A byte-bounded LRU
range cache sits in front; after serving a range, the next range of the same segment (or the
next segment's footer and first range, at its end) is read ahead for sequential consumers.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from loglake.errors import CorruptionError, LoglakeError
from loglake.segment.format import HEADER_SIZE, SegmentTrailer, read_tail
from loglake.segment.index import SegmentIndex
from loglake.store.base import ObjectStore

log = logging.getLogger(__name__)

#: Default bytes of cold segment ranges kept in memory.
COLD_RANGE_CACHE_BYTES_DEFAULT = 256 * 1024 * 1024
#: Default number of cold segment footers (trailer + index) kept parsed.
COLD_FOOTER_CACHE_ENTRIES_DEFAULT = 10_000
#: Most read-aheads in flight at once (each is one ranged GET).
READ_AHEAD_INFLIGHT_MAX = 8
#: How long a read waits for a read-ahead of the same bytes before fetching them itself.
READ_AHEAD_WAIT_S = 30.0


class RangeCache:
    """Byte-bounded LRU of (key, start) → bytes; a lookup is served by any cached range that covers it."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._by_key: dict[str, set[int]] = {}
        self.size_bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: str, start: int, length: int) -> bytes | None:
        with self._lock:
            for begin in self._by_key.get(key, ()):
                data = self._entries[(key, begin)]
                if begin <= start and start + length <= begin + len(data):
                    self._entries.move_to_end((key, begin))
                    self.hits += 1
                    return data[start - begin : start - begin + length]
            self.misses += 1
            return None

    def put(self, key: str, start: int, data: bytes) -> None:
        if len(data) > self.capacity_bytes:
            return
        with self._lock:
            old = self._entries.pop((key, start), None)
            if old is not None:
                self.size_bytes -= len(old)
            self._entries[(key, start)] = data
            self._by_key.setdefault(key, set()).add(start)
            self.size_bytes += len(data)
            while self.size_bytes > self.capacity_bytes and self._entries:
                (k, s), evicted = self._entries.popitem(last=False)
                self.size_bytes -= len(evicted)
                starts = self._by_key.get(k)
                if starts is not None:
                    starts.discard(s)
                    if not starts:
                        del self._by_key[k]

    def forget(self, key: str) -> None:
        with self._lock:
            for s in self._by_key.pop(key, ()):
                data = self._entries.pop((key, s), None)
                if data is not None:
                    self.size_bytes -= len(data)


class ColdReader:
    """Footer cache, range cache and read-ahead over the cold store."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        range_cache_bytes: int = COLD_RANGE_CACHE_BYTES_DEFAULT,
        footer_cache_entries: int = COLD_FOOTER_CACHE_ENTRIES_DEFAULT,
        read_ahead_segments: int = 1,
        threads: int = 4,
    ) -> None:
        self.store = store
        self.ranges = RangeCache(range_cache_bytes)
        self.footer_cache_entries = footer_cache_entries
        self.read_ahead_segments = read_ahead_segments
        self._footers: OrderedDict[str, tuple[SegmentTrailer, SegmentIndex]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="loglake-cold")
        # (key, start) -> (end, future) of read-aheads in flight
        self._ahead: dict[tuple[str, int], tuple[int, Future[None]]] = {}
        self.gets = 0  # ranged GETs issued for reads (not read-ahead)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def submit(self, fn: Callable[[], object]) -> Future[object]:
        """Run cold I/O on the cold pool (never on the caller's event loop)."""
        return self._pool.submit(fn)

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The cold-read threads (`cold_read_threads`): reads of cold segments run there."""
        return self._pool

    def footer(self, key: str, size: int | None = None) -> tuple[SegmentTrailer, SegmentIndex]:
        with self._lock:
            hit = self._footers.get(key)
            if hit is not None:
                self._footers.move_to_end(key)
                return hit
        footer = read_tail(self.store, key, size)
        with self._lock:
            self._footers[key] = footer
            while len(self._footers) > self.footer_cache_entries:
                self._footers.popitem(last=False)
        return footer

    def read_range(self, key: str, start: int, length: int) -> bytes:
        cached = self.ranges.get(key, start, length)
        if cached is not None:
            return cached
        # A read-ahead already fetching these bytes: wait for it rather than fetch them twice.
        with self._lock:
            pending = [
                fut
                for (k, begin), (end, fut) in self._ahead.items()
                if k == key and begin <= start and start + length <= end
            ]
        for fut in pending:
            try:
                fut.result(timeout=READ_AHEAD_WAIT_S)
            except Exception:  # the read-ahead failed or is slow: read it ourselves
                break
            cached = self.ranges.get(key, start, length)
            if cached is not None:
                return cached
        self.gets += 1
        data = self.store.get_range(key, start, length)
        if len(data) != length:
            raise CorruptionError(key, start, f"cold read returned {len(data)} of {length} bytes")
        self.ranges.put(key, start, data)
        return data

    def read_ahead(
        self, key: str, start: int, length: int, data_end: int, next_key: str | None, max_bytes: int
    ) -> None:
        """After a read of [start, start+length): fetch what a sequential reader asking for up to
        `max_bytes` at a time wants next."""
        if self.read_ahead_segments <= 0:
            return
        nxt = start + length
        if nxt < data_end:
            self._prefetch(key, nxt, min(max_bytes, data_end - nxt))
        elif next_key is not None:
            # The next segment's footer, and its first batches: they start right after the
            # header, so no footer is needed to know where (a short read at the end is fine).
            self._prefetch_footer(next_key)
            self._prefetch(next_key, HEADER_SIZE, max_bytes)

    def _prefetch(self, key: str, start: int, length: int) -> None:
        token = (key, start)
        with self._lock:
            if token in self._ahead or len(self._ahead) >= READ_AHEAD_INFLIGHT_MAX:
                return
        if self.ranges.get(key, start, length) is not None:
            return

        def job() -> None:
            try:
                data = self.store.get_range(key, start, length)  # short at the object's end: fine
                self.ranges.put(key, start, data)
            except LoglakeError as exc:
                log.debug("read-ahead of %s@%d failed: %s", key, start, exc)
            finally:
                with self._lock:
                    self._ahead.pop(token, None)

        with self._lock:
            if token in self._ahead:
                return
            try:
                self._ahead[token] = (start + length, self._pool.submit(job))
            except RuntimeError:  # shut down
                return

    def _prefetch_footer(self, key: str) -> None:
        def job() -> None:
            try:
                self.footer(key)
            except LoglakeError as exc:
                log.debug("read-ahead of %s footer failed: %s", key, exc)

        try:
            self._pool.submit(job)
        except RuntimeError:
            pass

    def forget(self, key: str) -> None:
        self.ranges.forget(key)
        with self._lock:
            self._footers.pop(key, None)


