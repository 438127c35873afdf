"""Hot/cold tiering: relocating sealed segments to the cold store.

Segment life (loglake.meta.lifecycle): sealed → hot (local folder) → relocating → cold (bucket
or folder) → deleted. Only the tier is recorded in metadata; "relocating" is the window in which
both copies exist, and the metadata decides which one is authoritative:

    0. verify the hot copy whole (every batch CRC, data CRC, chain hash): a damaged hot copy is
       never uploaded to become the only one (it stays hot, reported as corrupt)
    1. upload the hot object to the cold store under the same key
    2. verify: the cold object's size, and its trailer (one ranged read) against the hot one's
       CRCs and chain hash
    3. record tier=cold durably (a `segment_tier` metadata record)   ← the authoritative switch
    4. delete the hot copy

A crash before 3 leaves the segment hot (a stray cold copy is overwritten by the next upload); a
crash after 3 leaves it cold, and recovery deletes the leftover hot copy. A segment is never
without an authoritative copy. Reading cold segments back is loglake.engine.cold's job.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from loglake import canary
from loglake.engine.catalog import Catalog
from loglake.engine.config import TopicConfig
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.stores import IndexCache, Stores
from loglake.errors import CorruptionError
from loglake.logsafe import RateLimitedLog
from loglake.meta.lifecycle import Tier
from loglake.segment.format import read_tail
from loglake.segment.verify import verify_segment

__all__ = ["Relocator"]

log = logging.getLogger(__name__)
#: A cold store that is down fails every due segment on every retry: one line per store, summarised.
_failures = RateLimitedLog(log)


class Relocator:
    """Moves hot segments that are due to the cold store (steps 1-4 of the module docstring)."""

    def __init__(self, catalog: Catalog, stores: Stores, indexes: IndexCache, threads: int, retry_ms: int) -> None:
        self.catalog = catalog
        self.stores = stores
        self.indexes = indexes
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
            table = p.segments
            if table.count_in_tier(Tier.HOT) <= config.hot_retain_segments and config.hot_retain_bytes <= 0:
                return []  # the common case, without building a single SegmentRef
            hot = [table[i] for i in table.indexes_in_tier(Tier.HOT)]
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
            for topic, p in self.catalog.partitions()
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
        cold = self.stores.cold
        assert cold is not None
        try:
            data = self.stores.hot.get(seg.key)
            trailer = verify_segment(data, seg.key)  # 0. never upload a damaged copy
            if trailer.chain_hash != seg.chain_hash:
                raise CorruptionError(seg.key, trailer.field_position("chain_hash"), "hot copy is not the segment the metadata records")
            cold.put(seg.key, [data])  # 1. upload
            if canary.DELETE_HOT_BEFORE_COLD_VERIFIED:  # test-only mutation (loglake/canary.py)
                self.stores.hot.delete(seg.key)
            size = cold.head(seg.key)  # 2. verify
            if size != seg.size:
                raise CorruptionError(seg.key, 0, f"cold copy has {size} bytes, hot copy {seg.size}")
            trailer, _index = read_tail(cold, seg.key, size)
            if trailer.chain_hash != seg.chain_hash or trailer.base_offset != seg.base_offset:
                raise CorruptionError(seg.key, 0, "cold copy's trailer does not match the hot copy")
            with p.lock:
                i = p.segments.find_base(seg.base_offset)
                same = (
                    i is not None
                    and p.segments.generation_at(i) == seg.generation  # not rewritten meanwhile
                    and not p.deleted
                )
                tier = p.segments[i].tier if same and i is not None else None
                fut = self.catalog.record_tier(p, seg.base_offset, Tier.COLD) if tier == Tier.HOT else None
            if fut is None:
                if tier != Tier.COLD:  # retention or a topic delete won the race
                    cold.delete(seg.key)
                # else another relocation of this segment switched it first: the cold object
                # (same key, same bytes) is now the authoritative copy and must stay
                with self._lock:
                    self._attempts.pop(seg.key, None)  # not in flight any more: the map stays bounded
                return
            fut.result()  # 3. the authoritative switch
            seg.tier = Tier.COLD
            self.stores.hot.delete(seg.key)  # 4. the hot copy goes
            self.indexes.forget(seg.key)
            log.info("relocated %s (%d bytes) to %s", seg.key, seg.size, cold.url)
            with self._lock:
                self._attempts.pop(seg.key, None)
        except Exception as exc:
            # A failure after the switch (deleting the hot copy) leaves the segment cold and
            # recovery removes the leftover; before it, the segment simply stays hot.
            _failures.warning(("relocate", cold.url), "relocating %s to %s failed (will retry): %s", seg.key, cold.url, exc)
            with self._lock:
                self._attempts[seg.key] = time.monotonic()

    def relocate_due(self) -> int:
        """Relocate everything due now, on the calling thread. Returns how many moved."""
        moved = 0
        for p, seg in self._all_due():
            with self._lock:
                if self._attempts.get(seg.key) == float("inf"):
                    continue  # in flight on the pool (close() waits for it): never two at once
                self._attempts[seg.key] = float("inf")
            self.relocate(p, seg)
            moved += seg.tier == Tier.COLD
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
