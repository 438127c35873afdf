"""Reads: whole record batches from memory, hot segments (page cache, sendfile) or cold ones.

Only data below a partition's high watermark is returned. Cold reads never run on the caller's
thread when it uses `read_async` (the broker's event loop): they go to the cold reader's pool.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from loglake.engine.catalog import Catalog
from loglake.engine.corrupt import BatchChecker
from loglake.engine.ioerrors import ReadErrors
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.stores import IndexCache, Stores
from loglake.engine.types import Chunk, FileRange, ReadResult
from loglake.errors import CorruptBatchError, CorruptionError, OffsetOutOfRangeError, StorageError
from loglake.meta.lifecycle import Tier
from loglake.records.decode import iter_records
from loglake.store.base import ObjectNotFoundError

__all__ = ["HOT_READ_THREADS", "Reader"]

#: Threads reading hot segments whose index or batches are not in memory yet (the first read of
#: a segment after a restart or an eviction): disk reads never run on a broker's event loop.
HOT_READ_THREADS = 4


class Reader:
    def __init__(
        self,
        catalog: Catalog,
        stores: Stores,
        indexes: IndexCache,
        checker: BatchChecker | None = None,
        read_errors: ReadErrors | None = None,
    ) -> None:
        self.catalog = catalog
        self.stores = stores
        self.indexes = indexes
        #: checks sealed batches before they are served (loglake.engine.corrupt); None: unchecked
        self.checker = checker
        #: segments whose reads fail with an I/O error (loglake.engine.ioerrors)
        self.read_errors = read_errors if read_errors is not None else ReadErrors()
        self._pool = ThreadPoolExecutor(HOT_READ_THREADS, thread_name_prefix="loglake-hot-read")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def read(
        self, p: Partition, offset: int, max_bytes: int, *, file_ranges: bool = False, min_one: bool = True
    ) -> ReadResult:
        """Whole batches from the one holding `offset`, up to `max_bytes`: with `min_one` at least
        one batch however large (Kafka's first-batch exception, so a reader always progresses);
        without it nothing when the first batch does not fit.

        Only data below the high watermark is returned. `file_ranges=True` lets hot segment data
        come back as FileRange (for sendfile) instead of bytes.
        """
        topic, partition = p.topic, p.index
        attempts = 0
        while attempts < 3:  # a segment may be deleted (retention, a rewrite) between lookup and read
            with p.lock:
                hw = p.high_watermark
                start = p.log_start_offset
                if offset < start or offset > hw:
                    raise OffsetOutOfRangeError(
                        f"offset {offset} of {topic}-{partition} is outside [{start}, {hw}]",
                        log_start_offset=start,
                        high_watermark=hw,
                    )
                if offset == hw:
                    return ReadResult([], hw, start)
                chunks: list[Chunk] = []
                if p.buffer and offset >= p.buffer[0].base_offset:
                    self._read_buffer(p, offset, hw, max_bytes, chunks)
                    if not min_one and chunks and len(chunks[0]) > max_bytes:  # type: ignore[arg-type]
                        chunks = []
                    return ReadResult(chunks, hw, start)
                seg_i = p.segment_find(offset)
                if seg_i is None:
                    raise OffsetOutOfRangeError(
                        f"offset {offset} of {topic}-{partition} is in no segment",
                        log_start_offset=start,
                        high_watermark=hw,
                    )
                seg = p.segments[seg_i]
                next_key = p.segments.key_at(seg_i + 1) if seg_i + 1 < len(p.segments) else None
            try:
                got = self._read_segment(seg, offset, max_bytes, file_ranges, next_key, min_one, where=(topic, partition))
            except ObjectNotFoundError:
                self.indexes.forget(seg.key)
                attempts += 1
                if attempts == 3 and self._still_listed(p, seg):
                    raise self._missing(topic, partition, offset, seg) from None
                continue
            except StorageError as exc:
                # EIO on a hot file, a cold store still failing after its retries: an error for
                # this segment's readers only (SegmentReadError), nothing marked corrupt.
                self.indexes.forget(seg.key)
                raise self.read_errors.failed(topic, partition, offset, seg.key, self._where(seg), seg.tier, exc) from exc
            self.read_errors.succeeded(seg.key)
            if got is None:
                return ReadResult([], hw, start)  # the first batch does not fit and min_one is off
            if not got and seg.rewritten:
                offset = seg.end_offset  # compaction left nothing at or after `offset` here: the next one
                continue
            return ReadResult(got, hw, start)
        raise OffsetOutOfRangeError(f"offset {offset} of {topic}-{partition} moved away while reading")

    def file_range_failed(self, path: str, exc: OSError) -> bool:
        """The broker's sendfile of a hot segment's FileRange failed with an I/O error (EIO while
        reading the file, not the socket). Those batches were verified earlier, so later fetches
        would be served from the file without the engine reading it, and the client would only
        see its connection drop, again and again. Forget the verification (the next fetch reads
        through `get_range`, whose error is a SegmentReadError: CORRUPT_MESSAGE) and report it
        like any read error. True when `path` is a segment of a partition."""
        for topic, p in self.catalog.partitions():
            with p.lock:
                found = next((s for s in p.segments.slice(0) if s.tier == Tier.HOT and self.stores.hot.local_path(s.key) == path), None)
            if found is not None:
                if self.checker is not None:
                    self.checker.forget(found.key)
                self.indexes.forget(found.key)
                error = StorageError("sendfile", path, exc)
                self.read_errors.failed(topic.name, p.index, found.base_offset, found.key, path, Tier.HOT, error)
                return True
        return False

    def _where(self, seg: SegmentRef) -> str:
        """The file or object a segment is read from, for log lines and errors."""
        try:
            store = self.stores.store_for(seg)
        except StorageError:
            return seg.key
        path = store.local_path(seg.key) if seg.tier == Tier.HOT else None
        return path or f"{store.url.rstrip('/')}/{seg.key}"

    @staticmethod
    def _still_listed(p: Partition, seg: SegmentRef) -> bool:
        with p.lock:
            i = p.segments.find_base(seg.base_offset)
            return not p.deleted and i is not None and p.segments[i].key == seg.key

    def _missing(self, topic: str, partition: int, offset: int, seg: SegmentRef) -> CorruptBatchError:
        """The metadata lists a segment whose object is gone: an error for readers (not an
        OFFSET_OUT_OF_RANGE, which clients answer by silently resetting their position)."""
        store = self.stores.store_for(seg)
        exc = CorruptBatchError(topic, partition, offset, f"{store.url}/{seg.key}", 0, "segment object is missing")
        if self.checker is not None:
            self.checker.corruption.report(exc, seg.key, "read")
            self.checker.corruption.refused()
        return exc

    @staticmethod
    def _read_buffer(p: Partition, offset: int, hw: int, max_bytes: int, chunks: list[Chunk]) -> None:
        i = p.buffer_find(offset)
        if i is None:
            i = 0 if offset < p.buffer[0].base_offset else len(p.buffer)
        total = 0
        while i < len(p.buffer):
            item = p.buffer[i]
            if item.end_offset > hw:
                break
            view = memoryview(item.data)
            if len(item.batch_positions) == 1:
                if chunks and total + len(view) > max_bytes:
                    break
                chunks.append(view)
                total += len(view)
            else:
                ends = [*item.batch_positions[1:], len(view)]
                for start, end in zip(item.batch_positions, ends, strict=True):
                    # skip batches wholly below the requested offset
                    if chunks and total + (end - start) > max_bytes:
                        return
                    chunks.append(view[start:end])
                    total += end - start
            if total >= max_bytes:
                break
            i += 1

    def _get_range(self, seg: SegmentRef, position: int, length: int) -> bytes:
        if seg.tier == Tier.COLD and self.stores.cold_reader is not None:
            return self.stores.cold_reader.read_range(seg.key, position, length)
        return self.stores.store_for(seg).get_range(seg.key, position, length)

    def _read_segment(
        self,
        seg: SegmentRef,
        offset: int,
        max_bytes: int,
        file_ranges: bool,
        next_key: str | None = None,
        min_one: bool = True,
        *,
        where: tuple[str, int] = ("", -1),
    ) -> list[Chunk] | None:
        """Whole batches of `seg` from the one holding `offset`; [] when the segment holds none at
        or after it (compaction); None when the first does not fit and `min_one` is off.
        Batches are checked first (`checker`): the good ones before a bad batch are returned, a
        bad first batch raises CorruptBatchError."""
        index = self.indexes.get(seg)
        first = index.find_offset(offset)
        if first is None:
            return []
        position, length, count = index.byte_range(first, max_bytes)
        if length > max_bytes and not min_one:
            return None
        if seg.tier == Tier.COLD and self.stores.cold_reader is not None:
            cold = self.stores.cold_reader
            data = cold.read_range(seg.key, position, length)
            cold.read_ahead(seg.key, position, length, index.data_end, next_key, max_bytes)
            if self.checker is not None:
                url = f"{cold.store.url}/{seg.key}"
                try:
                    good = self.checker.check(
                        where, seg.key, url, index, first, count, lambda pos, n: cold.read_range(seg.key, pos, n), data=data, remember=False
                    )
                except CorruptionError:
                    cold.forget(seg.key)  # a repaired object is fetched again, not served from the cache
                    raise
                if good < count:
                    cold.forget(seg.key)
                    data = data[: index.entry(first + good).position - position]
            return [data]
        hot = self.stores.hot
        path = hot.local_path(seg.key)
        if self.checker is not None:
            good = self.checker.check(
                where, seg.key, path or f"{hot.url}/{seg.key}", index, first, count, lambda pos, n: hot.get_range(seg.key, pos, n)
            )
            if good < count:
                length = index.entry(first + good).position - position
        if file_ranges and path is not None:
            return [FileRange(path, position, length, index.entry(first).length)]
        return [hot.get_range(seg.key, position, length)]

    def _needs_io(self, seg: SegmentRef, offset: int, max_bytes: int, file_ranges: bool) -> bool:
        """Whether reading `seg` from `offset` touches a disk or a bucket: a cold segment; a hot
        one whose index is not in memory, whose batches are not all checked yet, or whose bytes
        must be read (no file range). Only an answer made of memory goes out on the caller's thread."""
        if seg.tier == Tier.COLD or not file_ranges:
            return True
        index = self.indexes.cached(seg)
        if index is None:
            return True
        first = index.find_offset(offset)
        if first is None:
            return False
        _position, _length, count = index.byte_range(first, max_bytes)
        return self.checker is not None and not self.checker.verified(seg.key, first, first + count)

    def read_async(
        self, p: Partition, offset: int, max_bytes: int, *, file_ranges: bool = False, min_one: bool = True
    ) -> Future[ReadResult]:
        """`read` that never does disk or bucket I/O on the caller's thread (the broker's event loop).

        Reads answered from memory — the unsealed buffer, or a hot segment whose index is cached
        and whose batches were checked, sent as a file range — are done at once (a completed
        future). A cold segment's read runs on the cold-read pool, so a slow bucket never stalls
        an event loop; any other hot read (an index or batches to load from disk) on the hot-read
        pool, HOT_READ_THREADS threads.
        """
        with p.lock:
            seg = None
            if offset < p.high_watermark and not (p.buffer and offset >= p.buffer[0].base_offset):
                i = p.segment_find(offset)
                seg = p.segments[i] if i is not None else None
        if seg is not None and self._needs_io(seg, offset, max_bytes, file_ranges):
            cold = self.stores.cold_reader
            pool = cold.pool if seg.tier == Tier.COLD and cold is not None else self._pool
            return pool.submit(self.read, p, offset, max_bytes, file_ranges=file_ranges, min_one=min_one)
        fut: Future[ReadResult] = Future()
        try:
            fut.set_result(self.read(p, offset, max_bytes, file_ranges=file_ranges, min_one=min_one))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut

    def offset_for_timestamp(self, p: Partition, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp_ms`, or None."""
        with p.lock:
            segments = p.segments.slice(0)
            buffered = [item for item in p.buffer if item.end_offset <= p.high_watermark]
            start = p.log_start_offset
        for seg in segments:
            if seg.max_timestamp < timestamp_ms or seg.end_offset <= start:
                continue
            index = self.indexes.get(seg)
            i = index.find_timestamp(timestamp_ms)
            while i is not None and i < len(index):
                entry = index.entry(i)
                data = self._get_range(seg, entry.position, entry.length)
                found = self._first_at_or_after(data, timestamp_ms, start)
                if found is not None:
                    return found
                i += 1
        for item in buffered:
            if item.max_timestamp < timestamp_ms:
                continue
            for pos in item.batch_positions:
                found = self._first_at_or_after(item.data, timestamp_ms, start, pos)
                if found is not None:
                    return found
        return None

    @staticmethod
    def _first_at_or_after(data: bytes | bytearray | memoryview, ts: int, start: int, pos: int = 0) -> tuple[int, int] | None:
        for rec in iter_records(data, pos):
            if rec.timestamp >= ts and rec.offset >= start:
                return rec.offset, rec.timestamp
        return None

    def max_timestamp(self, p: Partition) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets MAX_TIMESTAMP)."""
        with p.lock:
            segments = p.segments.slice(0)
            buffered = [item for item in p.buffer if item.end_offset <= p.high_watermark]
        best: tuple[int, int] | None = None
        candidates: list[tuple[bytes | bytearray | memoryview, int]] = []
        top = max([s.max_timestamp for s in segments] + [b.max_timestamp for b in buffered], default=-1)
        if top < 0:
            return None
        for item in buffered:
            if item.max_timestamp == top:
                candidates.extend((item.data, pos) for pos in item.batch_positions)
        if not candidates:
            for seg in segments:
                if seg.max_timestamp == top:
                    index = self.indexes.get(seg)
                    for i in range(len(index)):
                        entry = index.entry(i)
                        if entry.max_timestamp == top:
                            candidates.append((self._get_range(seg, entry.position, entry.length), 0))
                            break
                    break
        for data, pos in candidates:
            for rec in iter_records(data, pos):
                if rec.timestamp == top and (best is None or rec.offset < best[0]):
                    best = (rec.offset, rec.timestamp)
            if best is not None:
                break
        return best
