"""Appends: validate Kafka batches, assign offsets, queue them to the WAL, buffer them.

The broker's Produce path: `append_batch` checks each batch's header and CRC without decoding
records, patches base offsets under the partition's lock, queues one WAL entry and returns a
future resolved when the topic's durability class is met (group commit on the WAL shard). The
append goes into the partition's unsealed buffer at once; readers see it once the high
watermark passes it. Idempotent producers' retries are answered with their first offsets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from loglake import canary
from loglake.engine.catalog import Catalog
from loglake.engine.compacted import check_batches, check_keys
from loglake.engine.config import EngineConfig, TopicConfig
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import BufferedAppend, Partition
from loglake.engine.seal import Sealer
from loglake.engine.types import AppendResult
from loglake.errors import (
    CorruptRecordError,
    EngineFailedError,
    RecordTooLargeError,
    StorageFullError,
    UnknownTopicError,
)
from loglake.records.batch import (
    new_builder,
    peek_header,
    set_log_append_time,
    set_offset_and_epoch,
    split_batches,
)
from loglake.records.compression import codec_from_name
from loglake.records.decode import iter_records
from loglake.wal.shard import Durability, WalEntry, WalShard

__all__ = ["Appender", "PairTuple", "RecordTuple"]

log = logging.getLogger(__name__)

RecordTuple = tuple[int | None, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]
#: produce_batch's records: (key, value) or (key, value, headers), stamped with the append's time.
PairTuple = tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]


class Appender:
    def __init__(
        self,
        catalog: Catalog,
        pool: MemoryPool,
        sealer: Sealer,
        config: EngineConfig,
        clock: Callable[[], float],
        check_open: Callable[[], None],
        *,
        admit: Callable[[int], None] = lambda size: None,
    ) -> None:
        self.catalog = catalog
        self.pool = pool
        self.sealer = sealer
        self.config = config
        self._clock = clock
        self._check_open = check_open
        #: the free-space reserve's gate (SpaceGuard.admit): StorageFullError while storage is full
        self._admit = admit
        self.shards: list[WalShard] = []  # set once recovery started them
        #: the first WAL failure: the engine stops accepting writes
        self.failure: BaseException | None = None

    def append_batch(self, topic: str, partition: int, data: bytes | bytearray) -> Future[AppendResult]:
        """Append one or more Kafka v2 RecordBatches as sent by a producer.

        The batches are validated (header, size, CRC) but their records are not decoded; offsets
        are assigned by patching each batch's base offset. A bytearray argument is taken over
        and patched in place. The future resolves once the topic's durability class is met.
        A compacted topic refuses batches holding a record without a key (MissingKeyError).
        """
        self._check_open()
        p = self.catalog.partition(topic, partition)
        config = self.catalog.topic(topic).config
        if config.durability != Durability.EPHEMERAL:
            self._admit(len(data))  # before anything is assigned or queued: nothing half-written
        batches = split_batches(data, max_batch_bytes=config.max_message_bytes)
        if not batches:
            raise CorruptRecordError(f"append to {topic}-{partition}: no record batch in {len(data)} bytes")
        if config.compacted:
            check_batches(topic, partition, data, batches)
        buf = data if isinstance(data, bytearray) else bytearray(data)
        if config.compression_type not in ("producer",) and any(
            h.compression != self._codec_of(config) for _, h in batches
        ):
            buf, batches = self._recompress(buf, batches, self._codec_of(config))
        return self._append(p, config, buf, batches)

    def append_control(self, p: Partition, data: bytearray) -> Future[AppendResult]:
        """Append a control batch the engine built (a transaction marker; engine/txn.py)."""
        self._check_open()
        return self._append(p, self.catalog.topic(p.topic).config, data, split_batches(data))

    def append_gap(self, p: Partition, data: bytearray) -> Future[AppendResult]:
        """Append an empty batch the engine built to keep lost offsets reserved (engine/acked.py):
        no records, so it bypasses the produce path's record-count check."""
        self._check_open()
        return self._append(p, self.catalog.topic(p.topic).config, data, [(0, peek_header(data))])

    @staticmethod
    def _codec_of(config: TopicConfig) -> int:
        return 0 if config.compression_type == "uncompressed" else codec_from_name(config.compression_type)

    def _recompress(self, buf: bytearray, batches: list[Any], codec: int) -> tuple[bytearray, list[Any]]:
        """compression.type set on the topic: rewrite batches in that codec, as Kafka's broker does."""
        out: list[bytes] = []
        for pos, h in batches:
            if h.is_control:
                out.append(bytes(buf[pos : pos + h.size]))
                continue
            builder = new_builder(
                compression=codec,
                producer_id=h.producer_id,
                producer_epoch=h.producer_epoch,
                base_sequence=h.base_sequence,
                is_transactional=h.is_transactional,
                timestamp_type=h.timestamp_type,
            )
            for rec in iter_records(buf, pos):
                builder.append(rec.timestamp, rec.key, rec.value, rec.headers)
            out.append(builder.build())
        new = bytearray(b"".join(out))
        return new, split_batches(new)

    def append_records(
        self,
        topic: str,
        partition: int,
        records: Iterable[RecordTuple],
        *,
        compression: int | None = None,
    ) -> Future[AppendResult]:
        """Build one batch from (timestamp or None, key, value, headers) tuples and append it."""
        return self._build_and_append(topic, partition, records, compression, "append_records")

    def append_pairs(
        self,
        topic: str,
        partition: int,
        records: Iterable[PairTuple],
        *,
        compression: int | None = None,
    ) -> Future[AppendResult]:
        """Build one batch from (key, value) or (key, value, headers) tuples, all stamped now,
        and append it: the embedded produce_batch, with no tuple rebuilt per record."""
        return self._build_and_append(topic, partition, records, compression, "append_pairs")

    def _build_and_append(
        self, topic: str, partition: int, records: Iterable[Any], compression: int | None, what: str
    ) -> Future[AppendResult]:
        """`what` is append_records (RecordTuple: the builder's append_all) or append_pairs
        (PairTuple: its append_pairs)."""
        self._check_open()
        config = self.catalog.topic(topic).config
        if config.durability != Durability.EPHEMERAL:
            self._admit(0)
        pairs = what == "append_pairs"
        if config.compacted:
            records = list(records)
            check_keys(topic, partition, (rec[0 if pairs else 1] for rec in records))
        if compression is None:
            compression = 0 if config.compression_type == "producer" else self._codec_of(config)
        builder = new_builder(compression=compression)
        now = int(self._clock() * 1000)
        if pairs:
            builder.append_pairs(records, now)
        else:
            builder.append_all(records, now)
        if len(builder) == 0:
            raise CorruptRecordError(f"{what}: no records")
        data = bytearray(builder.build())
        if len(data) > config.max_message_bytes:
            raise RecordTooLargeError(
                f"batch of {len(data)} bytes exceeds max.message.bytes={config.max_message_bytes} of {topic}"
            )
        # One batch, built here: its header is read back, its CRC not checked again.
        return self._append(self.catalog.partition(topic, partition), config, data, [(0, peek_header(data))])

    def _append(self, p: Partition, config: TopicConfig, buf: bytearray, batches: list[Any]) -> Future[AppendResult]:
        size = len(buf)
        self.pool.reserve(size, self.config.memory_wait_ms / 1000.0)
        fut: Future[AppendResult] = Future()
        durability = config.durability
        shard = self.shards[p.shard]
        log_append_time = -1
        try:
            with p.lock:
                if p.deleted:
                    raise UnknownTopicError(f"topic {p.topic!r} was deleted")
                duplicate = self._check_producers(p, batches)
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
                    if header.producer_id >= 0 and header.base_sequence >= 0:
                        p.producers.record(
                            header.producer_id, header.producer_epoch, header.base_sequence, header.record_count, offset
                        )
                    elif header.producer_id >= 0 and header.is_control:
                        p.producers.fence(header.producer_id, header.producer_epoch)
                    offset += header.last_offset_delta + 1
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

    @staticmethod
    def _check_producers(p: Partition, batches: list[Any]) -> tuple[int, int] | None:
        """Idempotent producers: (base, last) of the original append if this is a retry."""
        for _pos, header in batches:
            if header.producer_id >= 0 and header.base_sequence >= 0:
                duplicate = p.producers.check(
                    header.producer_id, header.producer_epoch, header.base_sequence, header.record_count
                )
                if duplicate is not None:
                    return duplicate
        return None

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

