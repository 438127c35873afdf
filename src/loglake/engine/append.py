"""The local log's appends: assign offsets, queue to the WAL, buffer for readers and the sealer.

`Appender.append` takes batches the engine already checked (loglake.engine.produce: header,
size, CRC, compacted keys, re-compression), patches base offsets and leader epochs under the
partition's lock, queues one WAL entry and returns a future resolved when the topic's durability
class is met (group commit on the WAL shard). The append goes into the partition's unsealed
buffer at once; readers see it once the high watermark passes it. Idempotent producers' retries
are answered with their first offsets (the rules: `ProducerStates.check_batches` / `record_batches`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

from loglake import canary
from loglake.engine.catalog import Catalog
from loglake.engine.config import EngineConfig, TopicConfig
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import BufferedAppend, Partition
from loglake.engine.partition_log import Batches
from loglake.engine.seal import Sealer
from loglake.engine.space import SpaceGuard, append_writes
from loglake.engine.types import AppendBuffer, AppendResult
from loglake.errors import EngineFailedError, StorageFullError, UnknownTopicError
from loglake.records.batch import peek_header, set_log_append_time, set_offset_and_epoch
from loglake.wal.shard import Durability, WalEntry, WalShard

__all__ = ["Appender"]

log = logging.getLogger(__name__)


class Appender:
    def __init__(
        self,
        catalog: Catalog,
        pool: MemoryPool,
        sealer: Sealer,
        shards: list[WalShard],
        config: EngineConfig,
        clock: Callable[[], float],
        check_open: Callable[[], None],
        *,
        space: SpaceGuard | None = None,
    ) -> None:
        self.catalog = catalog
        self.pool = pool
        self.sealer = sealer
        self.shards = shards
        self.config = config
        self._clock = clock
        self._check_open = check_open
        #: the free-space reserve (SpaceGuard.admit): StorageFullError while storage is full
        self._space = space
        #: the first WAL failure: the engine stops accepting writes
        self.failure: BaseException | None = None

    def append_gap(self, p: Partition, data: bytearray) -> Future[AppendResult]:
        """Append an empty batch the engine built to keep lost offsets reserved (engine/acked.py):
        no records, so it bypasses the produce path's record-count check."""
        self._check_open()
        return self.append(p, self.catalog.topic(p.topic).config, data, [(0, peek_header(data))], produced=False)

    def append(
        self, p: Partition, config: TopicConfig, buf: AppendBuffer, batches: Batches, *, produced: bool = True
    ) -> Future[AppendResult]:
        """Append checked batches; `buf` is taken over (patched in place). `produced`: a client's
        batches, refused while storage is full; the engine's own (markers, gaps) are always taken."""
        size = len(buf)
        space = self._space if produced and config.durability != Durability.EPHEMERAL else None
        writes = append_writes(size, len(batches))
        if space is not None:
            space.admit(writes)  # before anything is assigned or queued: nothing half-written
        try:
            return self._append(p, config, buf, batches, size)
        finally:
            if space is not None:
                space.settle(writes)  # in the buffer and the WAL queue now, or failed

    def _append(
        self, p: Partition, config: TopicConfig, buf: AppendBuffer, batches: Batches, size: int
    ) -> Future[AppendResult]:
        self.pool.reserve(size, self.config.memory_wait_ms / 1000.0)
        fut: Future[AppendResult] = Future()
        durability = config.durability
        shard = self.shards[p.shard]
        log_append_time = -1
        try:
            with p.lock:
                if p.deleted:
                    raise UnknownTopicError(f"topic {p.topic!r} was deleted")
                duplicate = p.producers.check_batches(h for _, h in batches)
                if duplicate is not None:
                    self.pool.release(size)
                    return self._answer_duplicate(p, duplicate)
                base = p.next_offset
                offset = base
                max_ts = -1
                epoch = p.meta.leader_epoch
                if config.log_append_time:
                    log_append_time = int(self._clock() * 1000)
                for pos, header in batches:
                    set_offset_and_epoch(buf, pos, offset, header.batch_length, epoch)
                    if config.log_append_time:
                        set_log_append_time(buf, pos, log_append_time)
                        max_ts = max(max_ts, log_append_time)
                    else:
                        max_ts = max(max_ts, header.max_timestamp)
                    offset += header.last_offset_delta + 1
                p.producers.record_batches((h for _, h in batches), base)
                end = offset
                item = BufferedAppend(base, end, buf, tuple(pos for pos, _ in batches), max_ts, time.monotonic())
                result = AppendResult(p.topic, p.index, base, end - 1, log_append_time, p.log_start_offset)
                if durability == Durability.EPHEMERAL:
                    p.next_offset = end
                    p.buffer_append(item, end - base)
                    p.advance_hw(end)
                    fut.set_result(result)
                else:
                    # For `memory` the producer is answered here, not by the WAL writer.
                    waiter = None if durability == Durability.MEMORY else fut
                    if canary.ACK_BEFORE_WAL_WRITE:  # test-only mutation (loglake/canary.py)
                        waiter = None
                    entry = WalEntry(
                        p.topic_id, p.index, base, end, buf, durability, self._on_wal_done, (p, waiter, result)
                    )
                    shard.submit(entry)
                    p.next_offset = end
                    p.buffer_append(item, end - base)
                    if waiter is None:
                        p.advance_hw(end)
                        fut.set_result(result)
        except BaseException:
            self.pool.release(size)
            raise
        if not p.seal_scheduled and (
            p.buffer_bytes >= config.segment_bytes
            or (config.segment_records and p.buffer_records >= config.segment_records)
        ):
            self.sealer.schedule(p)
        return fut

    def _answer_duplicate(self, p: Partition, offsets: tuple[int, int]) -> Future[AppendResult]:
        """A retried batch: answer with its first offsets once they are durable, append nothing."""
        result = AppendResult(p.topic, p.index, offsets[0], offsets[1], -1, p.log_start_offset)
        fut: Future[AppendResult] = Future()
        visible = p.wait_for(offsets[1])

        def done(_f: Future[None]) -> None:
            if not fut.done():
                fut.set_result(result)

        visible.add_done_callback(done)
        return fut

    def _on_wal_done(self, entry: WalEntry, error: BaseException | None) -> None:
        """WAL writer thread: the entry is durable per its class (or failed)."""
        context: tuple[Partition, Future[AppendResult] | None, AppendResult] = entry.context  # type: ignore[assignment]
        p, fut, result = context
        if isinstance(error, StorageFullError):
            # Disk full (wal/shard.py): the shard writes this entry again once there is room and
            # then calls back with no error. Not acknowledged now; not a failure of the engine.
            if fut is not None and not fut.done():
                fut.set_exception(error)
            return
        if error is not None:
            if self.failure is None:
                self.failure = error
                log.debug("engine stops accepting writes: WAL failure: %s", error)  # wal/shard.py logged it
            if fut is not None and not fut.done():
                fut.set_exception(
                    error if isinstance(error, Exception) else EngineFailedError(f"WAL writer stopped: {error!r}")
                )
            return
        p.advance_hw(entry.end_offset)
        if fut is not None and not fut.done():
            fut.set_result(result)

