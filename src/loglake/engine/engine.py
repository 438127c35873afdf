"""The engine facade: topics, appends, reads, sealing, snapshots, WAL truncation.

The engine core is I/O-agnostic toward its callers: appends return
`concurrent.futures.Future`s (the broker awaits them, the embedded `Log` blocks on them).

Invariant, stated once: data acknowledged is never lost; loss of unacknowledged data is
explicit (a recovery report, a log line), never silent.

Background work runs on a maintenance thread (age seals, memory pressure, snapshots, WAL
truncation, retention) and a small pool of seal workers that build and publish segments.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from loglake.engine.config import (
    PARTITIONS_PER_TOPIC_MAX,
    EngineConfig,
    TopicConfig,
    validate_topic_name,
)
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import BufferedAppend, Partition, SegmentRef
from loglake.engine.published import encode_published, meta_key
from loglake.engine.tiering import ColdReader, Relocator
from loglake.engine.types import (
    AppendResult,
    Chunk,
    FileRange,
    PartitionInfo,
    ReadResult,
    RecoveryReport,
    TopicInfo,
)
from loglake.errors import (
    ConfigError,
    CorruptRecordError,
    EngineClosedError,
    EngineFailedError,
    InvalidPartitionsError,
    LoglakeError,
    OffsetOutOfRangeError,
    StorageError,
    TopicExistsError,
    UnknownTopicError,
)
from loglake.fs.base import FileSystem
from loglake.fs.os_fs import OsFileSystem
from loglake.meta.lock import DataDirLock
from loglake.meta.snapshot import SnapshotStore
from loglake.records.batch import (
    BatchBuilder,
    iter_records,
    set_base_offset,
    set_log_append_time,
    split_batches,
)
from loglake.records.compression import codec_from_name
from loglake.segment.format import SegmentIndex, SegmentWriter, read_tail
from loglake.store.base import ObjectNotFoundError, ObjectStore, segment_key
from loglake.store.local import LocalStore
from loglake.wal.recovery import shard_dir_name
from loglake.wal.shard import Durability, WalEntry, WalShard

log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 1

RecordTuple = tuple[int | None, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]


def _new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=").replace("-", "x").replace("_", "y")


class TopicState:
    __slots__ = ("config", "created_ms", "name", "partitions", "topic_id")

    def __init__(self, name: str, topic_id: bytes, config: TopicConfig, created_ms: int) -> None:
        self.name = name
        self.topic_id = topic_id
        self.config = config
        self.created_ms = created_ms
        self.partitions: list[Partition] = []

    def info(self) -> TopicInfo:
        return TopicInfo(self.name, self.topic_id.hex(), len(self.partitions), self.config, self.created_ms)


class Engine:
    def __init__(
        self,
        data_dir: str,
        config: EngineConfig | None = None,
        *,
        fs: FileSystem | None = None,
        store: ObjectStore | None = None,
        cold_store: ObjectStore | None = None,
        clock: Callable[[], float] = time.time,
        start_background: bool = True,
    ) -> None:
        self.data_dir = os.path.abspath(data_dir) if fs is None else data_dir
        self.config = config or EngineConfig()
        self.config.validate()
        self.fs = fs or OsFileSystem()
        self._clock = clock
        self._store = store
        self._cold_store = cold_store
        self._cold: ColdReader | None = None
        self._relocator: Relocator | None = None
        self._start_background = start_background
        self._lock = threading.RLock()  # topics map and metadata
        self._topics: dict[str, TopicState] = {}
        self._topics_by_id: dict[bytes, TopicState] = {}
        self._shards: list[WalShard] = []
        self._retired_shards: list[WalShard] = []  # shard dirs beyond the current count: truncation only
        self._pool = MemoryPool(
            self.config.memory_budget_bytes, self.config.memory_pressure_ratio, self._on_memory_pressure
        )
        self._snapshots = SnapshotStore(self.fs, os.path.join(self.data_dir, "meta"))
        self._dir_lock = DataDirLock(self.fs, self.data_dir)
        self._cluster_id = ""
        self._extra_meta: dict[str, Any] = {}  # owned by upper layers (consumer groups)
        self._meta_dirty = threading.Event()
        self._unpublished: tuple[dict[str, Any], int] | None = None  # snapshot not yet in the store
        self._publish_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()
        self._seal_pool: ThreadPoolExecutor | None = None
        self._maintenance: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._closed = True
        self._failure: BaseException | None = None
        self._index_cache: OrderedDict[str, SegmentIndex] = OrderedDict()
        self._index_cache_lock = threading.Lock()
        self.recovery_report: RecoveryReport | None = None

    # ==== lifecycle ===============================================================================

    @property
    def store(self) -> ObjectStore:
        assert self._store is not None, "engine not open"
        return self._store

    @property
    def cold_store(self) -> ObjectStore | None:
        return self._cold_store

    @property
    def cold_reader(self) -> ColdReader | None:
        return self._cold

    def store_for(self, seg: SegmentRef) -> ObjectStore:
        """The store holding `seg`'s authoritative copy."""
        if seg.tier == "cold":
            if self._cold_store is None:
                raise StorageError("read", seg.key, "segment is in the cold tier but no cold store is configured")
            return self._cold_store
        return self.store

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def memory_pool(self) -> MemoryPool:
        return self._pool

    @property
    def shards(self) -> list[WalShard]:
        return list(self._shards)

    def open(self) -> RecoveryReport:
        from loglake.engine.recovery import recover

        self.fs.makedirs(self.data_dir)
        self._dir_lock.acquire()
        try:
            if self._store is None:
                root = os.path.join(self.data_dir, "segments")
                self.fs.makedirs(root)
                self._store = LocalStore(root, self.fs)
            if self._cold_store is None and self.config.cold_store_url:
                from loglake.store import open_store

                self._cold_store = open_store(self.config.cold_store_url, self.fs)
            if self._cold_store is not None:
                self._cold = ColdReader(
                    self._cold_store,
                    range_cache_bytes=self.config.cold_range_cache_bytes,
                    footer_cache_entries=self.config.cold_footer_cache_entries,
                    read_ahead_segments=self.config.cold_read_ahead_segments,
                    threads=self.config.cold_read_threads,
                )
                self._relocator = Relocator(self, self.config.relocation_threads, self.config.relocation_retry_ms)
            report = recover(self)
        except BaseException:
            self._dir_lock.release()
            raise
        self._closed = False
        self.recovery_report = report
        if self._start_background:
            self._seal_pool = ThreadPoolExecutor(self.config.seal_threads, thread_name_prefix="loglake-seal")
            if self._relocator is not None:
                self._relocator.start()
            self._maintenance = threading.Thread(target=self._maintenance_loop, name="loglake-maint", daemon=True)
            self._maintenance.start()
        log.info("%s", report.summary())
        return report

    def _start_shards(self, next_seqs: dict[str, int], files: dict[str, list[Any]]) -> None:
        """Called by recovery: one writer per configured shard, old extra shards kept for truncation."""
        wal_dir = os.path.join(self.data_dir, "wal")
        for i in range(self.config.wal_shards):
            name = shard_dir_name(i)
            directory = os.path.join(wal_dir, name)
            self.fs.makedirs(directory)
            shard = self._new_shard(directory)
            shard.start(next_seqs.get(name, 0), files.get(name, []))
            self._shards.append(shard)
        for name, existing in files.items():
            index = int(name.split("-")[1]) if name.split("-")[1].isdigit() else -1
            if 0 <= index < self.config.wal_shards:
                continue
            retired = self._new_shard(os.path.join(wal_dir, name))
            retired._files = list(existing)
            self._retired_shards.append(retired)

    def _new_shard(self, directory: str) -> WalShard:
        return WalShard(
            self.fs,
            directory,
            file_bytes=self.config.wal_file_bytes,
            group_bytes_max=self.config.wal_group_bytes_max,
            queue_bytes_max=self.config.wal_queue_bytes_max,
            fsync_interval_ms=self.config.wal_fsync_interval_ms,
        )

    def close(self) -> None:
        """Clean shutdown: drain the WAL, seal everything, snapshot, release the directory."""
        if self._closed:
            return
        try:
            if self._failure is None:
                self.flush()
                # Upload what is due now (S3-primary topics expect their data in the bucket);
                # failures are logged and the segments stay hot for the next start.
                if self._cold_store is not None and self.relocate_due():
                    self.write_snapshot()
                    self.publish_metadata()
        finally:
            self._closed = True
            self._stop.set()
            self._wake.set()
            if self._maintenance is not None:
                self._maintenance.join()
            if self._seal_pool is not None:
                self._seal_pool.shutdown(wait=True)
            if self._relocator is not None:
                self._relocator.close()
            if self._cold is not None:
                self._cold.close()
            for shard in self._shards:
                shard.close()
            for topic in list(self._topics.values()):
                for p in topic.partitions:
                    p.wake_all()
            if self._store is not None:
                self._store.close()
            if self._cold_store is not None:
                self._cold_store.close()
            self._dir_lock.release()

    def __enter__(self) -> Engine:
        if self._closed:
            self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("engine is closed")
        if self._failure is not None:
            raise EngineFailedError(f"engine stopped accepting writes: {self._failure}")

    # ==== topics ==================================================================================

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None, *, validate_only: bool = False
    ) -> TopicInfo:
        self._check_open()
        validate_topic_name(name)
        if not 1 <= partitions <= PARTITIONS_PER_TOPIC_MAX:
            raise InvalidPartitionsError(f"partitions must be in [1, {PARTITIONS_PER_TOPIC_MAX}], got {partitions}")
        topic_config = TopicConfig.parse(config, self.config.topic_defaults)
        with self._lock:
            if name in self._topics:
                raise TopicExistsError(f"topic {name!r} already exists")
            topic = TopicState(name, uuid.uuid4().bytes, topic_config, int(self._clock() * 1000))
            if validate_only:
                return topic.info()
            for i in range(partitions):
                topic.partitions.append(self._new_partition(topic, i))
            self._topics[name] = topic
            self._topics_by_id[topic.topic_id] = topic
            try:
                self.write_snapshot()
            except BaseException:
                del self._topics[name]
                del self._topics_by_id[topic.topic_id]
                raise
        log.info("created topic %s (%d partitions, id %s)", name, partitions, topic.topic_id.hex())
        return topic.info()

    def _new_partition(self, topic: TopicState, index: int) -> Partition:
        shard = int.from_bytes(topic.topic_id[:4], "little") + index
        return Partition(topic.name, topic.topic_id, index, shard % self.config.wal_shards)

    def delete_topic(self, name: str) -> None:
        self._check_open()
        with self._lock:
            topic = self._topic(name)
            del self._topics[name]
            del self._topics_by_id[topic.topic_id]
            for p in topic.partitions:
                with p.lock:
                    p.deleted = True
            self.write_snapshot()
        # The snapshot no longer names the topic: its data can go. Segments first, then memory.
        for p in topic.partitions:
            with p.lock:
                freed = p.buffer_bytes
                p.buffer_pop_front(len(p.buffer))
                segments, p.segments = p.segments, []
            self._pool.release(freed)
            p.wake_all()
            for seg in segments:
                self._delete_segment_object(seg.key, seg.tier)
        log.info("deleted topic %s", name)

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None:
        self._check_open()
        with self._lock:
            topic = self._topic(name)
            if total <= len(topic.partitions):
                raise InvalidPartitionsError(
                    f"topic {name!r} has {len(topic.partitions)} partitions; the new count must be larger, got {total}"
                )
            if total > PARTITIONS_PER_TOPIC_MAX:
                raise InvalidPartitionsError(f"at most {PARTITIONS_PER_TOPIC_MAX} partitions per topic")
            if validate_only:
                return
            for i in range(len(topic.partitions), total):
                topic.partitions.append(self._new_partition(topic, i))
            self.write_snapshot()

    def alter_topic_config(self, name: str, overrides: dict[str, str], *, validate_only: bool = False) -> TopicConfig:
        """Replace the topic's overrides with `overrides` (callers merge for incremental alters)."""
        self._check_open()
        with self._lock:
            topic = self._topic(name)
            new = TopicConfig.parse(overrides, self.config.topic_defaults)
            if validate_only:
                return new
            topic.config = new
            self.write_snapshot()
            self._wake.set()
            return new

    def topics(self) -> list[TopicInfo]:
        with self._lock:
            return [t.info() for t in sorted(self._topics.values(), key=lambda t: t.name)]

    def topic(self, name: str) -> TopicInfo:
        return self._topic(name).info()

    def has_topic(self, name: str) -> bool:
        return name in self._topics

    def partition_info(self, name: str, partition: int) -> PartitionInfo:
        p = self._partition(name, partition)
        with p.lock:
            return PartitionInfo(
                name,
                partition,
                p.log_start_offset,
                p.high_watermark,
                p.next_offset,
                p.sealed_end,
                len(p.segments),
                sum(s.size for s in p.segments),
                p.buffer_bytes,
            )

    def delete_records(self, name: str, partition: int, offset: int) -> int:
        """Kafka DeleteRecords: raise the log start offset to `offset` (-1 = high watermark).

        Durable (snapshot) before it returns; whole segments below the new start are deleted.
        Returns the new log start offset (the "low watermark").
        """
        self._check_open()
        p = self._partition(name, partition)
        with p.lock:
            hw = p.high_watermark
            target = hw if offset == -1 else offset
            if not 0 <= target <= hw:
                raise OffsetOutOfRangeError(
                    f"cannot delete records of {name}-{partition} below {offset}: high watermark is {hw}",
                    log_start_offset=p.log_start_offset,
                    high_watermark=hw,
                )
            if target <= p.log_start_offset:
                return p.log_start_offset
            p.log_start_offset = target
            doomed = [s for s in p.segments if s.end_offset <= target]
            p.segments = [s for s in p.segments if s.end_offset > target]
        self.write_snapshot()
        for seg in doomed:
            self._forget_index(seg.key)
            self._delete_segment_object(seg.key, seg.tier)
        return target

    def segments(self, name: str, partition: int) -> list[SegmentRef]:
        p = self._partition(name, partition)
        with p.lock:
            return list(p.segments)

    def _topic(self, name: str) -> TopicState:
        topic = self._topics.get(name)
        if topic is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        return topic

    def _partition(self, name: str, partition: int) -> Partition:
        topic = self._topic(name)
        if not 0 <= partition < len(topic.partitions):
            raise UnknownTopicError(f"topic {name!r} has no partition {partition}")
        return topic.partitions[partition]

    # ==== metadata owned by upper layers (consumer group offsets) ================================

    def get_extra_meta(self, key: str) -> Any:
        with self._lock:
            return self._extra_meta.get(key)

    def set_extra_meta(self, key: str, value: Any, *, durable: bool = True) -> None:
        """Store a JSON-able value in the metadata snapshot; durable on return unless told not to."""
        with self._lock:
            self._extra_meta[key] = value
        if durable:
            self.write_snapshot()
        else:
            self._meta_dirty.set()

    # ==== appends ===================================================================================

    def append_batch(self, topic: str, partition: int, data: bytes | bytearray) -> Future[AppendResult]:
        """Append one or more Kafka v2 RecordBatches as sent by a producer.

        The batches are validated (header, size, CRC) but their records are not decoded; offsets
        are assigned by patching each batch's base offset. A bytearray argument is taken over
        and patched in place. The future resolves once the topic's durability class is met.
        """
        self._check_open()
        p = self._partition(topic, partition)
        config = self._topic(topic).config
        batches = split_batches(data, max_batch_bytes=config.max_message_bytes)
        if not batches:
            raise CorruptRecordError(f"append to {topic}-{partition}: no record batch in {len(data)} bytes")
        buf = data if isinstance(data, bytearray) else bytearray(data)
        if config.compression_type not in ("producer",) and any(
            h.compression != self._codec_of(config) for _, h in batches
        ):
            buf, batches = self._recompress(buf, batches, self._codec_of(config))
        return self._append(p, config, buf, batches)

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
            builder = BatchBuilder(
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
        self._check_open()
        config = self._topic(topic).config
        codec = compression if compression is not None else (
            0 if config.compression_type == "producer" else self._codec_of(config)
        )
        now = int(self._clock() * 1000)
        builder = BatchBuilder(compression=codec)
        for ts, key, value, headers in records:
            builder.append(now if ts is None else ts, key, value, headers)
        if len(builder) == 0:
            raise CorruptRecordError("append_records: no records")
        data = bytearray(builder.build())
        if len(data) > config.max_message_bytes:
            from loglake.errors import RecordTooLargeError

            raise RecordTooLargeError(
                f"batch of {len(data)} bytes exceeds max.message.bytes={config.max_message_bytes} of {topic}"
            )
        return self._append(self._partition(topic, partition), config, data, split_batches(data))

    def _append(self, p: Partition, config: TopicConfig, buf: bytearray, batches: list[Any]) -> Future[AppendResult]:
        size = len(buf)
        self._pool.reserve(size, self.config.memory_wait_ms / 1000.0)
        fut: Future[AppendResult] = Future()
        durability = config.durability
        shard = self._shards[p.shard]
        log_append_time = -1
        try:
            with p.lock:
                if p.deleted:
                    raise UnknownTopicError(f"topic {p.topic!r} was deleted")
                duplicate = self._check_producers(p, batches)
                if duplicate is not None:
                    self._pool.release(size)
                    return self._answer_duplicate(p, duplicate)
                base = p.next_offset
                offset = base
                max_ts = -1
                if config.log_append_time:
                    log_append_time = int(self._clock() * 1000)
                for pos, header in batches:
                    set_base_offset(buf, pos, offset)
                    if config.log_append_time:
                        set_log_append_time(buf, pos, log_append_time)
                        max_ts = max(max_ts, log_append_time)
                    else:
                        max_ts = max(max_ts, header.max_timestamp)
                    if header.producer_id >= 0 and header.base_sequence >= 0:
                        p.producers.record(
                            header.producer_id, header.producer_epoch, header.base_sequence, header.record_count, offset
                        )
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
            self._pool.release(size)
            raise
        if not p.seal_scheduled and (
            p.buffer_bytes >= config.segment_bytes
            or (config.segment_records and p.buffer_records >= config.segment_records)
        ):
            self._schedule_seal(p)
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

    def allocate_producer_id(self) -> int:
        """A new producer id for InitProducerId, durable before it is handed out."""
        with self._lock:
            pid = int(self._extra_meta.get("next_producer_id", 1000))
            self._extra_meta["next_producer_id"] = pid + 1
            self.write_snapshot()
            return pid

    def _on_wal_done(self, entry: WalEntry, error: BaseException | None) -> None:
        """WAL writer thread: the entry is durable per its class (or failed)."""
        context: tuple[Partition, Future[AppendResult] | None, AppendResult] = entry.context  # type: ignore[assignment]
        p, fut, result = context
        if error is not None:
            if self._failure is None:
                self._failure = error
                log.error("engine stops accepting writes: WAL failure: %s", error)
            if fut is not None and not fut.done():
                fut.set_exception(
                    error if isinstance(error, Exception) else EngineFailedError(f"WAL writer stopped: {error!r}")
                )
            return
        p.advance_hw(entry.end_offset)
        if fut is not None:
            fut.set_result(result)

    # ==== reads =====================================================================================

    def read(
        self, topic: str, partition: int, offset: int, max_bytes: int, *, file_ranges: bool = False
    ) -> ReadResult:
        """Whole batches from the one holding `offset`, up to `max_bytes` (at least one batch).

        Only data below the high watermark is returned. `file_ranges=True` lets hot segment data
        come back as FileRange (for sendfile) instead of bytes.
        """
        p = self._partition(topic, partition)
        for _attempt in range(3):  # a segment may be deleted by retention between lookup and read
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
                    return ReadResult(chunks, hw, start)
                seg_i = p.segment_find(offset)
                if seg_i is None:
                    raise OffsetOutOfRangeError(
                        f"offset {offset} of {topic}-{partition} is in no segment",
                        log_start_offset=start,
                        high_watermark=hw,
                    )
                seg = p.segments[seg_i]
                next_key = p.segments[seg_i + 1].key if seg_i + 1 < len(p.segments) else None
            try:
                chunks = self._read_segment(seg, offset, max_bytes, file_ranges, next_key)
            except ObjectNotFoundError:
                self._forget_index(seg.key)
                continue
            return ReadResult(chunks, hw, start)
        raise OffsetOutOfRangeError(f"offset {offset} of {topic}-{partition} moved away while reading")

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

    def _segment_index(self, seg: SegmentRef) -> SegmentIndex:
        if seg.index is not None:
            return seg.index
        if seg.tier == "cold" and self._cold is not None:
            return self._cold.footer(seg.key, seg.size)[1]
        with self._index_cache_lock:
            cached = self._index_cache.get(seg.key)
            if cached is not None:
                self._index_cache.move_to_end(seg.key)
                return cached
        _trailer, index = read_tail(self.store, seg.key, seg.size)
        with self._index_cache_lock:
            self._index_cache[seg.key] = index
            while len(self._index_cache) > self.config.segment_index_cache_entries:
                self._index_cache.popitem(last=False)
        return index

    def _forget_index(self, key: str) -> None:
        with self._index_cache_lock:
            self._index_cache.pop(key, None)
        if self._cold is not None:
            self._cold.forget(key)

    def _get_range(self, seg: SegmentRef, position: int, length: int) -> bytes:
        if seg.tier == "cold" and self._cold is not None:
            return self._cold.read_range(seg.key, position, length)
        return self.store_for(seg).get_range(seg.key, position, length)

    def _read_segment(
        self, seg: SegmentRef, offset: int, max_bytes: int, file_ranges: bool, next_key: str | None = None
    ) -> list[Chunk]:
        index = self._segment_index(seg)
        first = index.find_offset(offset)
        if first is None:
            return []
        position, length, _count = index.byte_range(first, max_bytes)
        if seg.tier == "cold" and self._cold is not None:
            data = self._cold.read_range(seg.key, position, length)
            self._cold.read_ahead(seg.key, position, length, index.data_end, next_key, max_bytes)
            return [data]
        if file_ranges:
            path = self.store.local_path(seg.key)
            if path is not None:
                return [FileRange(path, position, length)]
        return [self.store.get_range(seg.key, position, length)]

    def read_async(
        self, topic: str, partition: int, offset: int, max_bytes: int, *, file_ranges: bool = False
    ) -> Future[ReadResult]:
        """`read` that never does cold-store I/O on the caller's thread.

        Memory and hot reads are done at once (a completed future); a read of a cold segment runs
        on the cold-read pool, so a slow bucket never stalls an event loop.
        """
        if self._cold is not None:
            p = self._partition(topic, partition)
            with p.lock:
                cold = (
                    offset < p.high_watermark
                    and not (p.buffer and offset >= p.buffer[0].base_offset)
                    and (i := p.segment_find(offset)) is not None
                    and p.segments[i].tier == "cold"
                )
            if cold:
                return self._cold.submit(  # type: ignore[return-value]
                    lambda: self.read(topic, partition, offset, max_bytes, file_ranges=file_ranges)
                )
        fut: Future[ReadResult] = Future()
        try:
            fut.set_result(self.read(topic, partition, offset, max_bytes, file_ranges=file_ranges))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp_ms`, or None."""
        p = self._partition(topic, partition)
        with p.lock:
            segments = list(p.segments)
            buffered = [item for item in p.buffer if item.end_offset <= p.high_watermark]
            start = p.log_start_offset
        for seg in segments:
            if seg.max_timestamp < timestamp_ms or seg.end_offset <= start:
                continue
            index = self._segment_index(seg)
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
    def _first_at_or_after(data: bytes | bytearray, ts: int, start: int, pos: int = 0) -> tuple[int, int] | None:
        for rec in iter_records(data, pos):
            if rec.timestamp >= ts and rec.offset >= start:
                return rec.offset, rec.timestamp
        return None

    def max_timestamp(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets MAX_TIMESTAMP)."""
        p = self._partition(topic, partition)
        with p.lock:
            segments = list(p.segments)
            buffered = [item for item in p.buffer if item.end_offset <= p.high_watermark]
        best: tuple[int, int] | None = None
        candidates: list[tuple[bytes | bytearray, int]] = []
        top = max([s.max_timestamp for s in segments] + [b.max_timestamp for b in buffered], default=-1)
        if top < 0:
            return None
        for item in buffered:
            if item.max_timestamp == top:
                candidates.extend((item.data, pos) for pos in item.batch_positions)
        if not candidates:
            for seg in segments:
                if seg.max_timestamp == top:
                    index = self._segment_index(seg)
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

    def wait_for_data(self, topic: str, partition: int, offset: int) -> Future[None]:
        """A future resolved when data at `offset` is visible (or the partition goes away)."""
        return self._partition(topic, partition).wait_for(offset)

    # ==== sealing ===================================================================================

    def _schedule_seal(self, p: Partition) -> None:
        if self._seal_pool is None or p.seal_scheduled:
            return
        p.seal_scheduled = True
        try:
            self._seal_pool.submit(self._seal_job, p)
        except RuntimeError:  # pool shut down
            p.seal_scheduled = False

    def _seal_job(self, p: Partition) -> None:
        try:
            while self._seal_partition(p, full=False):
                pass
        except Exception:
            log.exception("sealing %s-%d failed; will retry", p.topic, p.index)
        finally:
            p.seal_scheduled = False
        self._wake.set()

    def _seal_partition(self, p: Partition, *, full: bool) -> bool:
        """Seal durable buffered data of `p` into one segment. Returns True if one was written.

        With full=False only a whole segment's worth (segment.bytes / segment.records) is sealed;
        full=True seals whatever is durable (flush, age, memory pressure, shutdown).
        """
        topic = self._topics_by_id.get(p.topic_id)
        if topic is None or p.deleted:
            return False
        config = topic.config
        with p.seal_lock:
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
                    return False
                whole = size >= config.segment_bytes or (
                    config.segment_records > 0 and records >= config.segment_records
                )
                if not (full or whole or limit_hit):
                    return False
                items = p.buffer[:take]
                prev_hash = p.chain_hash
                base = items[0].base_offset
            writer = SegmentWriter(base, prev_hash, int(self._clock() * 1000))
            for item in items:
                view = memoryview(item.data)
                ends = [*item.batch_positions[1:], len(view)]
                for start, end in zip(item.batch_positions, ends, strict=True):
                    writer.add_batch(view[start:end])
            parts, trailer, index = writer.finish()
            key = segment_key(self._cluster_id, topic.name, p.topic_id.hex(), p.index, base)
            self.store.put(key, parts)
            ref = SegmentRef.from_trailer(key, trailer, "hot", index)
            with p.lock:
                deleted_meanwhile = self._topics_by_id.get(p.topic_id) is not topic
                if not deleted_meanwhile:
                    p.segments.append(ref)
                    p.sealed_end = ref.end_offset
                    p.chain_hash = ref.chain_hash
                    freed = sum(i.size for i in p.buffer_pop_front(take))
            if deleted_meanwhile:
                self._delete_segment_object(key)
                return False
            self._pool.release(freed)
            self._meta_dirty.set()
            return True

    def flush(self) -> None:
        """Make everything appended so far durable, seal it, snapshot, truncate the WAL."""
        self._check_open()
        for shard in self._shards:
            shard.sync()
        for topic in list(self._topics.values()):
            for p in topic.partitions:
                while self._seal_partition(p, full=True):
                    pass
        self.write_snapshot()
        self._truncate_wal()
        self.publish_metadata()

    # ==== snapshots and WAL truncation ==============================================================

    def snapshot_payload(self) -> tuple[dict[str, Any], list[tuple[Partition, int]]]:
        with self._lock:
            topics: dict[str, Any] = {}
            partitions: dict[str, Any] = {}
            captured: list[tuple[Partition, int]] = []
            for topic in self._topics.values():
                topics[topic.name] = {
                    "id": topic.topic_id.hex(),
                    "partitions": len(topic.partitions),
                    "config": dict(topic.config.overrides),
                    "created_ms": topic.created_ms,
                }
                for p in topic.partitions:
                    with p.lock:
                        partitions[f"{topic.topic_id.hex()}/{p.index}"] = {
                            "log_start": p.log_start_offset,
                            "sealed_end": p.sealed_end,
                            "chain": p.chain_hash.hex(),
                            "segments": [s.to_json() for s in p.segments],
                            "producers": p.producers.to_json(),
                        }
                        captured.append((p, p.sealed_end))
            payload = {
                "version": SNAPSHOT_VERSION,
                "cluster_id": self._cluster_id,
                "topics": topics,
                "partitions": partitions,
                "extra": dict(self._extra_meta),
            }
        return payload, captured

    def write_snapshot(self) -> int:
        with self._snapshot_lock:
            self._meta_dirty.clear()
            payload, captured = self.snapshot_payload()
            seq = self._snapshots.write(payload)
            for p, sealed_end in captured:
                p.snapshot_sealed_end = max(p.snapshot_sealed_end, sealed_end)
            self._unpublished = (payload, seq)
            return seq

    def publish_metadata(self) -> bool:
        """Copy the newest snapshot's metadata into the segment store (meta.json), if changed."""
        with self._publish_lock:
            pending = self._unpublished
            if pending is None:
                return False
            payload, seq = pending
            data = encode_published(payload, seq, int(self._clock() * 1000))
            # Best effort: the local snapshot is what makes metadata durable; a store that is
            # down gets the newest copy on a later tick.
            try:
                self.store.put(meta_key(self._cluster_id), [data])
                if self._cold_store is not None:
                    self._cold_store.put(meta_key(self._cluster_id), [data])
            except LoglakeError as exc:
                log.warning("publishing metadata (seq %d) failed, will retry: %s", seq, exc)
                return False
            if self._unpublished is pending:
                self._unpublished = None
            return True

    def _truncate_wal(self) -> int:
        """Delete WAL files whose frames are all in segments named by a durable snapshot."""
        def obsolete(topic_id: bytes, partition: int, end: int) -> bool:
            topic = self._topics_by_id.get(topic_id)
            if topic is None or partition >= len(topic.partitions):
                return True  # topic deleted (and that deletion is in a durable snapshot)
            return topic.partitions[partition].snapshot_sealed_end >= end

        deleted = 0
        for shard in [*self._shards, *self._retired_shards]:
            deleted += shard.delete_obsolete(obsolete)
        return deleted

    # ==== background ================================================================================

    def _on_memory_pressure(self) -> None:
        self._wake.set()

    def _maintenance_loop(self) -> None:
        interval = self.config.maintenance_interval_ms / 1000.0
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self._maintenance_tick()
            except Exception:
                log.exception("maintenance tick failed; retrying next tick")

    def _maintenance_tick(self) -> None:
        now = time.monotonic()
        pressure = self._pool.used_bytes >= self._pool.pressure_bytes
        candidates: list[tuple[int, Partition]] = []
        for topic in list(self._topics.values()):
            for p in topic.partitions:
                if not p.buffer or p.seal_scheduled:
                    continue
                config = topic.config
                oldest = p.buffer[0].appended_at if p.buffer else now
                if (now - oldest) * 1000 >= config.segment_ms:
                    self._schedule_full_seal(p)
                elif p.buffer_bytes >= config.segment_bytes or (
                    config.segment_records and p.buffer_records >= config.segment_records
                ):
                    self._schedule_seal(p)  # a size trigger whose seal found the tail not yet durable
                elif pressure:
                    candidates.append((p.buffer_bytes, p))
        if pressure and candidates:
            # Emergency seal: biggest buffers first until half the budget would be free.
            candidates.sort(key=lambda c: -c[0])
            target = self._pool.used_bytes - self._pool.budget_bytes // 2
            for size, p in candidates:
                if target <= 0:
                    break
                self._schedule_full_seal(p)
                target -= size
        self._apply_retention()
        if self._relocator is not None:
            self._relocator.schedule()
        if self._meta_dirty.is_set():
            self.write_snapshot()
            self._truncate_wal()
        if self._unpublished is not None:
            self.publish_metadata()

    def _schedule_full_seal(self, p: Partition) -> None:
        if self._seal_pool is None or p.seal_scheduled:
            return
        p.seal_scheduled = True

        def job() -> None:
            try:
                while self._seal_partition(p, full=True):
                    pass
            except Exception:
                log.exception("sealing %s-%d failed; will retry", p.topic, p.index)
            finally:
                p.seal_scheduled = False
            self._wake.set()

        try:
            self._seal_pool.submit(job)
        except RuntimeError:
            p.seal_scheduled = False

    def _apply_retention(self) -> None:
        """Drop whole sealed segments past retention.ms / retention.bytes (log start first, durably)."""
        now_ms = int(self._clock() * 1000)
        doomed: list[SegmentRef] = []
        changed = False
        for topic in list(self._topics.values()):
            config = topic.config
            if "delete" not in config.cleanup_policy:
                continue
            for p in topic.partitions:
                with p.lock:
                    drop = 0
                    total = sum(s.size for s in p.segments)
                    for seg in p.segments:
                        expired = config.retention_ms >= 0 and seg.max_timestamp < now_ms - config.retention_ms
                        oversize = config.retention_bytes >= 0 and total > config.retention_bytes
                        if not (expired or oversize):
                            break
                        drop += 1
                        total -= seg.size
                    if drop:
                        gone = p.segments[:drop]
                        del p.segments[:drop]
                        p.log_start_offset = max(p.log_start_offset, gone[-1].end_offset)
                        doomed.extend(gone)
                        changed = True
        if changed:
            self.write_snapshot()  # log start offsets durable before any object goes
            for seg in doomed:
                self._forget_index(seg.key)
                self._delete_segment_object(seg.key, seg.tier)

    # ==== tiering (loglake.engine.tiering.Relocator does the work) ================================

    def relocate_due(self) -> int:
        """Relocate every due segment now, on this thread (tests, tools). Returns how many moved."""
        return self._relocator.relocate_due() if self._relocator is not None else 0

    def wait_relocations(self, timeout_s: float = 30.0) -> bool:
        """Relocate what is due now and wait for it (tests and tools). True when nothing is left."""
        return self._relocator.wait(timeout_s) if self._relocator is not None else True

    def _delete_segment_object(self, key: str, tier: str = "hot") -> None:
        store = self._cold_store if tier == "cold" and self._cold_store is not None else self.store
        try:
            store.delete(key)
        except Exception:
            log.exception("could not delete segment object %s from %s; recovery removes orphans", key, store.url)


def open_engine(data_dir: str, **kwargs: Any) -> Engine:
    """Open an engine on `data_dir` with EngineConfig options as keyword arguments."""
    fs = kwargs.pop("fs", None)
    store = kwargs.pop("store", None)
    try:
        config = EngineConfig.from_kwargs(**kwargs)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None
    engine = Engine(data_dir, config, fs=fs, store=store)
    engine.open()
    return engine
