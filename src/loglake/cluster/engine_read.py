"""Reads of a cluster broker (a mixin of `ClusterEngine`): Fetch, ListOffsets, partition info.

Any broker serves them, from committed data only: the partition log's reader (memory, flush
object ranges through a cache, merged segments) on a bounded thread pool, never on the event
loop. The high watermark is the committed end as this broker's etcd store has applied it; the
log start is the first merged segment's or range's base. Leader epochs: committed data is never
truncated in cluster mode, so the current epoch is the only one clients need.
"""

from __future__ import annotations

import concurrent.futures
from concurrent.futures import Future
from typing import Any

from loglake.cluster.plog import ClusterPartitionLog
from loglake.engine.catalog import Catalog
from loglake.engine.types import PartitionInfo, ReadResult
from loglake.errors import EngineClosedError, OffsetOutOfRangeError
from loglake.meta.cluster import Plog
from loglake.meta.etcd import EtcdMetaStore
from loglake.meta.state import MetaState
from loglake.records.batch import peek_header
from loglake.records.decode import iter_records

__all__ = ["ClusterReadsMixin"]


class ClusterReadsMixin:
    plog: ClusterPartitionLog | None
    etcd: EtcdMetaStore
    catalog: Catalog
    _reads: concurrent.futures.ThreadPoolExecutor

    def _plog_of(self, topic_id: str, partition: int) -> Plog:
        tid = bytes.fromhex(topic_id)

        def copy(s: MetaState) -> Plog:
            pl = s.plogs.parts.get((tid, partition))
            if pl is None:
                return Plog()
            return Plog(pl.epoch, pl.leader, pl.end, list(pl.segments), list(pl.ranges))

        return self.etcd.read(copy)

    def _log_start(self, topic_id: str, partition: int) -> int:
        tid = bytes.fromhex(topic_id)

        def start(s: MetaState) -> int:
            pl = s.plogs.parts.get((tid, partition))
            if pl is None:
                return 0
            if pl.segments:
                return int(pl.segments[0].base)
            return int(pl.ranges[0].base) if pl.ranges else int(pl.end)

        return int(self.etcd.read(start))

    def _tid(self, topic: str, partition: int) -> str:
        return self.catalog.partition(topic, partition).topic_id.hex()

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        *,
        file_ranges: bool = False,
        min_one: bool = True,
    ) -> ReadResult:
        assert self.plog is not None
        tid = self._tid(topic, partition)
        pl = self._plog_of(tid, partition)
        start = self._log_start(tid, partition)
        try:
            data = self.plog.read(tid, partition, offset, max_bytes)
        except OffsetOutOfRangeError as exc:
            raise OffsetOutOfRangeError(str(exc), log_start_offset=start, high_watermark=pl.end) from None
        if data and not min_one and len(data) > max_bytes:
            data = b""
        return ReadResult([data] if data else [], max(pl.end, offset if data else 0), start)

    def read_async(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        *,
        file_ranges: bool = False,
        min_one: bool = True,
    ) -> Future[ReadResult]:
        self._tid(topic, partition)  # UnknownTopicError at once, not from the pool
        try:
            return self._reads.submit(self.read, topic, partition, offset, max_bytes, min_one=min_one)
        except RuntimeError:  # the pool is shut down: the engine closes while a Fetch is handled
            raise EngineClosedError(f"node closing: read of {topic}-{partition} refused") from None

    def read_committed_async(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        *,
        file_ranges: bool = False,
        min_one: bool = True,
    ) -> Future[tuple[ReadResult, int, list[tuple[int, int]]]]:
        """read_committed: no transactions in cluster mode, so the same as read_uncommitted."""
        out: Future[tuple[ReadResult, int, list[tuple[int, int]]]] = Future()
        inner = self.read_async(topic, partition, offset, max_bytes, min_one=min_one)

        def done(f: Future[ReadResult]) -> None:
            error = f.exception()
            if error is not None:
                out.set_exception(error)
            else:
                r = f.result()
                out.set_result((r, r.high_watermark, []))

        inner.add_done_callback(done)
        return out

    def wait_for_data(self, topic: str, partition: int, offset: int) -> Future[None]:
        p = self.catalog.partition(topic, partition)
        p.advance_hw(self._plog_of(p.topic_id.hex(), partition).end)
        return p.wait_for(offset)

    def partition_info(self, name: str, partition: int) -> PartitionInfo:
        tid = self._tid(name, partition)
        pl = self._plog_of(tid, partition)
        start = self._log_start(tid, partition)
        sealed = sum(s.size for s in pl.segments)
        return PartitionInfo(
            name,
            partition,
            start,
            pl.end,
            pl.end,
            pl.end,
            len(pl.segments),
            sealed,
            0,
            0,
            0.0,
            pl.epoch,
            pl.end,
        )

    def leader_epoch(self, name: str, partition: int, offset: int | None = None) -> int:
        """The partition's current leader epoch (cluster mode keeps no per-offset epoch history:
        committed data is never truncated, so the current epoch is what clients validate with)."""
        return self._plog_of(self._tid(name, partition), partition).epoch

    def epoch_end_offset(self, name: str, partition: int, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: committed data is never truncated in cluster mode, so any epoch
        up to the current one ends at the committed end (a consumer never sees a truncation)."""
        pl = self._plog_of(self._tid(name, partition), partition)
        if epoch > pl.epoch:
            return -1, -1
        return epoch, pl.end

    def _scan(self, name: str, partition: int, start: int) -> Any:
        """(base offset, batch view) of committed batches from `start` on."""
        assert self.plog is not None
        tid = self._tid(name, partition)
        offset = start
        while True:
            data = self.plog.read(tid, partition, offset, 1 << 20)
            if not data:
                return
            view = memoryview(data)
            pos = 0
            while pos < len(view):
                h = peek_header(view, pos)
                yield h, view[pos : pos + h.size]
                pos += h.size
                offset = h.last_offset + 1

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        """ListOffsets by time: the first record at or after `timestamp_ms`; the metadata's
        per-range and per-segment max timestamps skip what cannot hold it."""
        tid = self._tid(topic, partition)
        pl = self._plog_of(tid, partition)
        sources: list[Any] = [*pl.segments, *pl.ranges]
        first = next((s for s in sources if s.max_ts >= timestamp_ms), None)
        if first is None:
            return None
        for h, view in self._scan(topic, partition, first.base):
            if h.max_timestamp < timestamp_ms or h.is_control:
                continue
            for rec in iter_records(view):
                if rec.timestamp >= timestamp_ms:
                    return rec.offset, rec.timestamp
        return None

    def max_timestamp(self, topic: str, partition: int) -> tuple[int, int] | None:
        tid = self._tid(topic, partition)
        pl = self._plog_of(tid, partition)
        sources: list[Any] = [*pl.segments, *pl.ranges]
        if not sources:
            return None
        best = max(sources, key=lambda s: s.max_ts)
        found: tuple[int, int] | None = None
        for h, view in self._scan(topic, partition, best.base):
            if h.base_offset > best.last:
                break
            for rec in iter_records(view):
                if found is None or rec.timestamp > found[1]:
                    found = (rec.offset, rec.timestamp)
        return found
