"""Hot/cold tiering: relocating sealed segments to the cold store, and reading them back.

Segment life: sealed → hot (local folder) → relocating → cold (bucket or folder) → deleted.
Only "hot" and "cold" are recorded in metadata; "relocating" is the window in which both copies
exist, and the metadata decides which one is authoritative:

    1. upload the hot object to the cold store under the same key
    2. verify: the cold object's size, and its trailer (one ranged read) against the hot one's
       CRCs and chain hash
    3. record tier=cold durably (metadata snapshot)            ← the authoritative switch
    4. delete the hot copy

A crash before 3 leaves the segment hot (a stray cold copy is overwritten by the next upload); a
crash after 3 leaves it cold, and recovery deletes the leftover hot copy. A segment is never
without an authoritative copy.

Cold reads cost at most two ranged GETs — the object's tail (trailer + index, then cached in the
footer cache) and exactly the batches asked for — and run on their own small thread pool, so a
slow bucket slows only readers of cold history, never appends or tail reads. A byte-bounded LRU
range cache sits in front; after serving a range, the next range of the same segment (or the
next segment's footer and first range, at its end) is read ahead for sequential consumers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from loglake.errors import CorruptionError, LoglakeError
from loglake.segment.format import HEADER_SIZE, SegmentIndex, SegmentTrailer, read_tail
from loglake.store.base import ObjectStore

if TYPE_CHECKING:
    from loglake.engine.config import TopicConfig
    from loglake.engine.engine import Engine
    from loglake.engine.partition import Partition, SegmentRef

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


class Relocator:
    """Moves hot segments that are due to the cold store (steps 1-4 of the module docstring)."""

    def __init__(self, engine: Engine, threads: int, retry_ms: int) -> None:
        self.engine = engine
        self.threads = threads
        self.retry_s = retry_ms / 1000.0
        self._pool: ThreadPoolExecutor | None = None
        self._attempts: dict[str, float] = {}  # key -> monotonic time of the last failure (in flight: inf)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="loglake-upload")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def due(config: TopicConfig, p: Partition) -> list[SegmentRef]:
        """Hot segments past hot.retain.segments / hot.retain.bytes, oldest first (stricter wins)."""
        with p.lock:
            hot = [s for s in p.segments if s.tier == "hot"]
        move = hot[: max(0, len(hot) - config.hot_retain_segments)]
        if config.hot_retain_bytes > 0:
            total = sum(s.size for s in hot[len(move) :])
            for seg in hot[len(move) :]:
                if total <= config.hot_retain_bytes:
                    break
                move.append(seg)
                total -= seg.size
        return move

    def _all_due(self) -> list[tuple[Partition, SegmentRef]]:
        return [
            (p, seg)
            for topic in list(self.engine._topics.values())
            for p in topic.partitions
            for seg in self.due(topic.config, p)
        ]

    def schedule(self) -> None:
        """Queue uploads of what is due (maintenance tick); failed ones wait `retry_s`."""
        if self._pool is None:
            return
        now = time.monotonic()
        for p, seg in self._all_due():
            with self._lock:
                last = self._attempts.get(seg.key)
                if last is not None and now - last < self.retry_s:
                    continue  # in flight (inf) or failed recently
                self._attempts[seg.key] = float("inf")
            try:
                self._pool.submit(self.relocate, p, seg)
            except RuntimeError:  # shutting down
                return

    def relocate(self, p: Partition, seg: SegmentRef) -> None:
        engine = self.engine
        cold = engine.cold_store
        assert cold is not None
        try:
            data = engine.store.get(seg.key)
            cold.put(seg.key, [data])  # 1. upload
            size = cold.head(seg.key)  # 2. verify
            if size != seg.size:
                raise CorruptionError(seg.key, 0, f"cold copy has {size} bytes, hot copy {seg.size}")
            trailer, _index = read_tail(cold, seg.key, size)
            if trailer.chain_hash != seg.chain_hash or trailer.base_offset != seg.base_offset:
                raise CorruptionError(seg.key, 0, "cold copy's trailer does not match the hot copy")
            with p.lock:
                live = any(s is seg for s in p.segments) and not p.deleted
                if live:
                    seg.tier = "cold"
            if not live:
                cold.delete(seg.key)  # retention or a topic delete won the race
                return
            engine.write_snapshot()  # 3. the authoritative switch
            engine.store.delete(seg.key)  # 4. the hot copy goes
            engine._forget_index(seg.key)
            log.info("relocated %s (%d bytes) to %s", seg.key, seg.size, cold.url)
            with self._lock:
                self._attempts.pop(seg.key, None)
        except Exception as exc:
            # A failure after the switch (deleting the hot copy) leaves the segment cold and
            # recovery removes the leftover; before it, the segment simply stays hot.
            log.warning("relocating %s to %s failed (will retry): %s", seg.key, cold.url, exc)
            with self._lock:
                self._attempts[seg.key] = time.monotonic()

    def relocate_due(self) -> int:
        """Relocate everything due now, on the calling thread. Returns how many moved."""
        moved = 0
        for p, seg in self._all_due():
            self.relocate(p, seg)
            moved += seg.tier == "cold"
        return moved

    def wait(self, timeout_s: float) -> bool:
        """Schedule what is due and wait until nothing is (failed uploads are retried at once)."""
        if self._pool is None:
            return True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                self._attempts = {k: v for k, v in self._attempts.items() if v == float("inf")}
                busy = bool(self._attempts)
            if not busy and not self._all_due():
                return True
            self.schedule()
            time.sleep(0.02)
        return False
