"""Sealing: durable buffered data of a partition becomes one segment object in the hot store.

A seal builds the segment (header, batches, index, trailer with the chain hash), PUTs it, and
then — under the partition's lock — records `segment_published` in the metadata and drops the
sealed appends from the buffer. The record's durability is waited for by nobody: when it
resolves, `durable_sealed_end` moves and the WAL files behind it may be deleted (maintenance).
A crash between the PUT and the record leaves an object no metadata names; the WAL still holds
its data, so recovery replays it and the next seal overwrites the object under the same key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from loglake.engine.catalog import Catalog, TopicState, producer_entries
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import BufferedAppend, Partition, SegmentRef
from loglake.engine.stores import IndexCache, Stores
from loglake.engine.txn import segment_aborted
from loglake.logsafe import RateLimitedLog
from loglake.meta.lifecycle import Tier
from loglake.records.batch import ATTR_TRANSACTIONAL, ATTRIBUTES_LOW_BYTE
from loglake.records.committed import ABORT_MARKER, marker_of
from loglake.segment.format import SegmentWriter
from loglake.store.base import segment_key

__all__ = ["Sealer"]

log = logging.getLogger(__name__)

#: After a failed seal a partition's next seal waits this long, doubling up to the max.
SEAL_RETRY_MS = 100
SEAL_RETRY_MS_MAX = 30_000


def _transactional(item: BufferedAppend) -> bool:
    """Whether any batch of the append is transactional (its attributes' low byte, read in place)."""
    data = item.data
    return any(data[pos + ATTRIBUTES_LOW_BYTE] & ATTR_TRANSACTIONAL for pos in item.batch_positions)


class Sealer:
    def __init__(
        self,
        catalog: Catalog,
        stores: Stores,
        pool: MemoryPool,
        indexes: IndexCache,
        clock: Callable[[], float],
        *,
        threads: int,
        on_sealed: Callable[[], None],
    ) -> None:
        self.catalog = catalog
        self.stores = stores
        self.pool = pool
        self.indexes = indexes
        self._clock = clock
        self.threads = threads
        self._on_sealed = on_sealed  # wakes the maintenance thread (WAL truncation, checkpoints)
        self._executor: ThreadPoolExecutor | None = None
        #: (topic id, partition) -> (failed seals in a row, monotonic time of the next try)
        self._failing: dict[tuple[bytes, int], tuple[int, float]] = {}
        #: A disk-full episode makes seals fail and work by turns (small ones fit, large ones do
        #: not, and maintenance seals early to free WAL files): one line per kind per window, the
        #: rest summarised, not two lines per partition per turn.
        self._limited = RateLimitedLog(log)

    def start(self) -> None:
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="loglake-seal")

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    # ---- scheduling ------------------------------------------------------------------------

    def schedule(self, p: Partition, *, full: bool = False) -> None:
        """Seal `p` on a seal worker: whole segments only, or (full) everything durable."""
        if self._executor is None or p.seal_scheduled:
            return
        key = (p.topic_id, p.index)
        failing = self._failing.get(key)
        if failing is not None and time.monotonic() < failing[1]:
            return  # backing off after a failed seal
        p.seal_scheduled = True

        def job() -> None:
            try:
                while self.seal_partition(p, full=full):
                    pass
            except Exception as exc:
                self._failed(p, exc)
            else:
                self._succeeded(p)
            finally:
                p.seal_scheduled = False
            self._on_sealed()

        try:
            self._executor.submit(job)
        except RuntimeError:  # pool shut down
            p.seal_scheduled = False

    def _failed(self, p: Partition, exc: Exception) -> None:
        """A seal failed (a full disk, an unreachable store): retry with a backoff, and log once
        per state change (the first failure with its traceback, then one line when it works)."""
        key = (p.topic_id, p.index)
        count = self._failing[key][0] + 1 if key in self._failing else 1
        delay_ms = min(SEAL_RETRY_MS * 2 ** min(count - 1, 16), SEAL_RETRY_MS_MAX)
        self._failing[key] = (count, time.monotonic() + delay_ms / 1000.0)
        if count == 1:
            # One line (an ENOSPC needs no traceback); the traceback is at DEBUG.
            self._limited.error(
                ("seal_failed",),
                "sealing %s-%d failed: %s; retrying with a backoff up to %d s, logged again when it works",
                p.topic, p.index, exc, SEAL_RETRY_MS_MAX // 1000,
            )
            log.debug("sealing %s-%d failed", p.topic, p.index, exc_info=exc)
        else:
            log.debug("sealing %s-%d failed again (%d times): %s", p.topic, p.index, count, exc)

    def _succeeded(self, p: Partition) -> None:
        failing = self._failing.pop((p.topic_id, p.index), None)
        if failing is not None:
            self._limited.warning(
                ("seal_works",), "sealing %s-%d works again after %d failed attempt(s)", p.topic, p.index, failing[0]
            )

    @property
    def failing_partitions(self) -> int:
        """Partitions whose last seal failed (backing off)."""
        return len(self._failing)

    def seal_all(self) -> list[Future[int]]:
        """Seal every partition's durable data now (flush, shutdown); futures of the records."""
        futures: list[Future[int]] = []
        for _topic, p in self.catalog.partitions():
            while True:
                fut = self._seal(p, full=True)
                if fut is None:
                    break
                futures.append(fut)
        return futures

    # ---- one seal --------------------------------------------------------------------------

    def seal_partition(self, p: Partition, *, full: bool) -> bool:
        """Seal durable buffered data of `p` into one segment. Returns True if one was written.

        With full=False only a whole segment's worth (segment.bytes / segment.records) is sealed;
        full=True seals whatever is durable (flush, age, memory pressure, shutdown).
        """
        return self._seal(p, full=full) is not None

    def _seal(self, p: Partition, *, full: bool) -> Future[int] | None:
        topic = self.catalog.by_id.get(p.topic_id)
        if topic is None or p.deleted:
            return None
        with p.seal_lock:
            items = self._take(p, topic, full)
            if not items:
                return None
            base = items[0].base_offset
            batches: list[tuple[int, int, int, int, int]] = []
            aborts: list[tuple[int, int]] = []  # (producer id, offset) of ABORT markers
            # a segment with transactional batches carries its transaction index (format version
            # 3, in the header the data CRC starts with): one look at each batch's attributes first
            transactional = any(_transactional(item) for item in items)
            writer = SegmentWriter(base, p.chain_hash, int(self._clock() * 1000), txn_index=transactional)
            for item in items:
                # each append's batches as one run: header fields unpacked once, hashed at once
                headers = writer.add_batches(item.data, item.batch_positions)
                for start, h in zip(item.batch_positions, headers, strict=True):
                    if h.producer_id >= 0 and h.base_sequence >= 0:
                        batches.append((h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, h.base_offset))
                    if h.is_control and h.is_transactional:
                        marker = marker_of(memoryview(item.data), start)
                        if marker is not None and marker[1] == ABORT_MARKER:
                            aborts.append((h.producer_id, h.base_offset))
            if aborts:
                writer.aborted_txns = segment_aborted(p, aborts, base)
            parts, trailer, index = writer.finish()
            key = segment_key(self.catalog.cluster_id, topic.name, p.topic_id.hex(), p.index, base)
            self.stores.hot.put(key, parts)
            self.indexes.put(key, index)
            ref = SegmentRef.from_trailer(key, trailer, Tier.HOT, None)
            fut: Future[int] | None = None
            with p.lock:
                live = self.catalog.by_id.get(p.topic_id) is topic and not p.deleted
                if live:
                    fut = self.catalog.record_seal(p, ref, producer_entries(batches))
                    freed = sum(i.size for i in p.buffer_pop_front(len(items)))
            if fut is None:
                self.stores.delete_segment(key)
                self.indexes.forget(key)
                return None
            self.pool.release(freed)
            end = ref.end_offset
            done: Future[int] = Future()  # resolved after durable_sealed_end moved

            def durable(f: Future[int]) -> None:
                error = f.exception()
                if error is None:
                    p.durable_sealed_end = max(p.durable_sealed_end, end)
                    done.set_result(f.result())
                else:
                    done.set_exception(error)

            fut.add_done_callback(durable)
            return done

    @staticmethod
    def _take(p: Partition, topic: TopicState, full: bool) -> list[BufferedAppend]:
        """The buffered appends the next segment holds (none when not due)."""
        config = topic.config
        with p.lock:
            hw = p.high_watermark
            take = 0
            size = 0
            records = 0
            limit_hit = False  # the next item would not fit in this segment
            for item in p.buffer:
                if item.end_offset > hw:
                    break
                n = item.end_offset - item.base_offset
                if take and (
                    size + item.size > config.segment_bytes
                    or (config.segment_records and records + n > config.segment_records)
                ):
                    limit_hit = True
                    break
                take += 1
                size += item.size
                records += n
            if take == 0:
                return []
            whole = size >= config.segment_bytes or (config.segment_records > 0 and records >= config.segment_records)
            if not (full or whole or limit_hit):
                return []
            return p.buffer[:take]
