"""The scrubber: a background thread that re-verifies sealed segments while the broker runs.

Each pass walks every partition's sealed segments in offset order, both tiers, and fully checks
each one (header, every batch CRC-32C, the index, data CRC, chain hash, trailer; the segment
against what the metadata records) and the hash chain between neighbours, reading at most
`scrub_bytes_per_second` (EngineConfig; 0 = off) in chunks of `SCRUB_CHUNK_BYTES`. A pass ends,
the thread waits `scrub_interval_ms`, and the next pass starts.

A bad segment gets the same mark a failed read gives (loglake.engine.corrupt: one log line,
/metrics, /readyz). A bad hot segment is repaired when the cold store holds a copy under the
same key that verifies completely and has the chain hash the metadata records (a relocation
that stopped between upload and switch leaves one; so does an operator restoring a copy): the
hot file is replaced atomically by the cold bytes, the caches forget it, and the mark goes.
Segments removed while a pass runs (retention, compaction, relocation) are skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from loglake.engine.catalog import Catalog
from loglake.engine.config import EngineConfig
from loglake.engine.corrupt import BatchChecker, Corruption
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.stores import IndexCache, Stores
from loglake.errors import CorruptBatchError, CorruptionError, LoglakeError
from loglake.logsafe import RateLimitedLog
from loglake.meta.lifecycle import Tier
from loglake.segment.format import SegmentTrailer
from loglake.segment.index import SegmentIndex
from loglake.segment.verify import SegmentReader, verify_chain, verify_segment_in_store
from loglake.store.base import ObjectNotFoundError

__all__ = ["SCRUB_CHUNK_BYTES", "ScrubStats", "Scrubber"]

log = logging.getLogger(__name__)

#: Bytes read per step of a scrub; the rate limit is applied between steps.
SCRUB_CHUNK_BYTES = 1024 * 1024


@dataclass
class ScrubStats:
    bytes_scrubbed: int = 0
    segments_verified: int = 0
    corruptions_found: int = 0
    repairs: int = 0
    passes: int = 0
    last_pass_ms: int = 0


def _offset_at(index: SegmentIndex, byte: int) -> int:
    """First offset of the batch holding byte `byte` (the segment's first when none does)."""
    for entry in index:
        if entry.position <= byte < entry.end:
            return entry.base_offset
    return index.base_offset if len(index) else -1


class Scrubber:
    def __init__(
        self,
        catalog: Catalog,
        stores: Stores,
        indexes: IndexCache,
        checker: BatchChecker | None,
        corruption: Corruption,
        config: EngineConfig,
    ) -> None:
        self.catalog = catalog
        self.stores = stores
        self.indexes = indexes
        self.checker = checker
        self.corruption = corruption
        self.rate = config.scrub_bytes_per_second
        self.interval_s = config.scrub_interval_ms / 1000.0
        self.stats = ScrubStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._window_start = time.monotonic()
        self._window_bytes = 0
        #: "could not read" lines: one per tier and minute (an S3 outage would log every segment)
        self._unreadable = RateLimitedLog(log, 60.0)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="loglake-scrub", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_pass()
            except Exception:  # a bug must not end scrubbing silently; the next pass retries
                log.exception("scrub pass failed")
            self._stop.wait(self.interval_s)

    def _throttle(self, n: int) -> None:
        self.stats.bytes_scrubbed += n
        if self.rate <= 0:
            return
        self._window_bytes += n
        now = time.monotonic()
        due = self._window_start + self._window_bytes / self.rate
        if due > now:
            self._stop.wait(due - now)
        if now - self._window_start > 10.0:  # a fresh window now and then: no burst after an idle spell
            self._window_start, self._window_bytes = time.monotonic(), 0

    def run_pass(self) -> int:
        """One pass over every sealed segment; returns how many corrupt segments it found."""
        found = 0
        self._window_start, self._window_bytes = time.monotonic(), 0
        for topic, p in self.catalog.partitions():
            if self._stop.is_set():
                break
            with p.lock:
                segments = [] if p.deleted else p.segments.slice(0)
            found += self._scrub_partition(topic.name, p, segments)
        self.stats.passes += 1
        self.stats.last_pass_ms = int(time.time() * 1000)
        return found

    def _scrub_partition(self, topic: str, p: Partition, segments: list[SegmentRef]) -> int:
        found = 0
        prev: tuple[SegmentTrailer, str] | None = None
        for seg in segments:
            if self._stop.is_set():
                break
            trailer = self._scrub_segment(topic, p, seg)
            if trailer is None:
                found += self.corruption.is_marked(seg.key) and not self._gone(p, seg)
                prev = None
                continue
            if prev is not None:
                try:
                    verify_chain([prev[0], trailer], [prev[1], seg.key])
                except CorruptionError as exc:
                    if not self._gone(p, seg):
                        self._report(topic, p.index, seg, exc, seg.base_offset)
                        found += 1
            prev = (trailer, seg.key)
        return found

    @staticmethod
    def _gone(p: Partition, seg: SegmentRef) -> bool:
        with p.lock:
            i = p.segments.find_base(seg.base_offset)
            return p.deleted or i is None or p.segments[i].key != seg.key

    def _report(self, topic: str, partition: int, seg: SegmentRef, exc: CorruptionError, offset: int) -> None:
        self.stats.corruptions_found += 1
        err = CorruptBatchError(topic, partition, offset, exc.path, exc.offset, exc.detail)
        self.corruption.report(err, seg.key, "scrub")

    def _scrub_segment(self, topic: str, p: Partition, seg: SegmentRef) -> SegmentTrailer | None:
        """The segment's trailer when it verifies; None when it is gone or corrupt (reported,
        and repaired when a good copy exists)."""
        store = self.stores.store_for(seg)
        reader: SegmentReader | None = None
        try:
            reader = SegmentReader(store, seg.key, seg.size, SCRUB_CHUNK_BYTES)
            self._throttle(reader.bytes_read)
            for chunk in reader.chunks():
                self._throttle(len(chunk))
                if self._stop.is_set():
                    return None
            trailer = reader.finish(None)
            if trailer.chain_hash != seg.chain_hash or trailer.base_offset != seg.base_offset:
                raise CorruptionError(seg.key, trailer.field_position("chain_hash"), "segment does not match what the metadata records")
        except ObjectNotFoundError:
            self.corruption.clear(seg.key)
            return None
        except CorruptionError as exc:
            if self._gone(p, seg):
                return None
            offset = _offset_at(reader.index, exc.offset) if reader is not None else seg.base_offset
            where = store.local_path(seg.key) or f"{store.url}/{seg.key}"
            self._report(topic, p.index, seg, CorruptionError(where, exc.offset, exc.detail), offset)
            if seg.tier == Tier.HOT:
                self.repair(topic, p, seg)
            return None
        except LoglakeError as exc:  # unreadable now (storage error): not known to be corrupt
            self._unreadable.warning(("scrub-read", seg.tier), "scrub could not read %s: %s", seg.key, exc)
            return None
        self.stats.segments_verified += 1
        if self.corruption.is_marked(seg.key):
            self.corruption.clear(seg.key)  # replaced by a good copy meanwhile
        return trailer

    def repair(self, topic: str, p: Partition, seg: SegmentRef) -> bool:
        """Replace a bad hot copy by the cold store's copy of the same key if that one verifies."""
        cold = self.stores.cold
        if cold is None:
            return False
        try:
            if cold.head(seg.key) != seg.size:
                return False
            seen = [0]

            def progress(done: int) -> None:
                self._throttle(done - seen[0])
                seen[0] = done

            trailer = verify_segment_in_store(cold, seg.key, None, progress, chunk_bytes=SCRUB_CHUNK_BYTES)
            if trailer.chain_hash != seg.chain_hash or trailer.base_offset != seg.base_offset:
                log.warning("cold copy of %s is sound but not the segment the metadata records; not used", seg.key)
                return False
            data = cold.get(seg.key)
            if self._gone(p, seg):
                return False
            self.stores.hot.put(seg.key, [data])
        except CorruptionError as exc:
            log.error("cold copy of corrupt %s is corrupt too (%s): no good copy to repair from", seg.key, exc)
            return False
        except LoglakeError as exc:
            log.warning("repairing %s from %s failed: %s", seg.key, cold.url, exc)
            return False
        if self._gone(p, seg):  # retention won the race: the file is an orphan recovery removes
            self.stores.delete_segment(seg.key)
            return False
        self.indexes.forget(seg.key)
        if self.checker is not None:
            self.checker.forget(seg.key)
        self.corruption.clear(seg.key, repaired=True)
        self.stats.repairs += 1
        log.warning("repaired %s-%d segment %s from its verified copy in %s", topic, p.index, seg.key, cold.url)
        return True
