"""The single node's partition log: a sharded WAL, unsealed buffers, sealed segments in stores.

The `PartitionLog` of `loglake serve` without `--cluster` and of the embedded API. Its parts,
each in its own module, with dependencies pointing one way (top to bottom)::

    local log (this module: open/recover, wiring, close)
      ├─ maintenance   one thread: age/size/pressure seals, retention, relocation, checkpoints,
      │                WAL truncation, publishing metadata to the stores
      ├─ tiering       relocation of sealed segments to the cold store
      ├─ cleaner       compaction and merging of sealed segments
      ├─ append        batches → offsets → WAL → unsealed buffers
      ├─ read          memory, hot and cold segments
      ├─ seal          buffers → segment objects + `segment_published` records
      ├─ recovery      metadata → store reconciliation → WAL replay (at open)
      └─ stores, cold  where segments live and how cold ones are read

Each part is built once everything it needs exists (most after recovery, which tells the WAL
shards where to continue) and gets all of it in its constructor.

Invariant, stated once: data acknowledged is never lost; loss of unacknowledged data is
explicit (a recovery report, a log line), never silent.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import BinaryIO

from loglake.engine.acked import AckedRecorder, fill_losses
from loglake.engine.append import Appender
from loglake.engine.catalog import Catalog, TopicState
from loglake.engine.cleaner import Cleaner
from loglake.engine.cold import ColdReader
from loglake.engine.compaction import dirty_ratio_locked
from loglake.engine.config import EngineConfig, TopicConfig
from loglake.engine.corrupt import BatchChecker, Corruption
from loglake.engine.epochs import end_offset_for, epoch_of, record_bump, write_clean_mark
from loglake.engine.ioerrors import ReadErrors
from loglake.engine.maintenance import Maintenance
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.partition_log import Batches, Feature, TierBytes
from loglake.engine.read import Reader
from loglake.engine.recovery import recover
from loglake.engine.scrubber import Scrubber
from loglake.engine.seal import Sealer
from loglake.engine.space import Owed, SpaceGuard
from loglake.engine.stores import IndexCache, Stores
from loglake.engine.tiering import Relocator
from loglake.engine.txn import last_stable_offset
from loglake.engine.types import (
    AppendBuffer,
    AppendResult,
    FileRange,
    PartitionInfo,
    ReadResult,
    RecoveryReport,
)
from loglake.engine.verify import CatalogSource, Progress, VerifyReport, verify_source
from loglake.engine.wal_gate import WalRollGate
from loglake.errors import (
    EngineClosedError,
    EngineFailedError,
    OffsetOutOfRangeError,
    StorageFullError,
    UnknownTopicError,
)
from loglake.fs.base import FileSystem
from loglake.fs.os_fs import OsFileSystem
from loglake.meta.layout import segments_dir, wal_dir
from loglake.meta.lifecycle import Tier
from loglake.meta.log import LocalMetaStore
from loglake.meta.publish import MetaPublisher
from loglake.segment.format import sealed_size
from loglake.store.base import ObjectStore
from loglake.store.local import LocalStore
from loglake.wal.recovery import shard_dir_name
from loglake.wal.shard import WalFile, WalShard

__all__ = ["LocalPartitionLog"]

log = logging.getLogger("loglake.engine.engine")


class _UncleanClose(Exception):
    """close() could not flush (storage full): skip the clean-shutdown mark."""


class _Parts:
    """What `open` builds; present exactly while the log is open."""

    def __init__(
        self,
        stores: Stores,
        indexes: IndexCache,
        shards: list[WalShard],
        retired: list[WalShard],
        sealer: Sealer,
        appender: Appender,
        reader: Reader,
        relocator: Relocator | None,
        cleaner: Cleaner,
        publisher: MetaPublisher,
        maintenance: Maintenance,
        scrubber: Scrubber,
    ) -> None:
        self.stores = stores
        self.indexes = indexes
        self.shards = shards
        self.retired = retired
        self.sealer = sealer
        self.appender = appender
        self.reader = reader
        self.relocator = relocator
        self.cleaner = cleaner
        self.publisher = publisher
        self.maintenance = maintenance
        self.scrubber = scrubber


class LocalPartitionLog:
    #: the single node offers every feature
    refused: Mapping[Feature, str] = {}

    def __init__(
        self,
        data_dir: str,
        config: EngineConfig,
        *,
        fs: FileSystem,
        meta: LocalMetaStore,
        catalog: Catalog,
        space: SpaceGuard,
        clock: Callable[[], float],
        store: ObjectStore | None = None,
        cold_store: ObjectStore | None = None,
        start_background: bool = True,
    ) -> None:
        self.data_dir = data_dir
        self.config = config
        self.fs = fs
        self.meta = meta
        self.catalog = catalog
        self.space = space
        #: unsealed data's budget: at its pressure ratio maintenance seals early (DESIGN.md §5)
        self.memory_pool = self.pool = MemoryPool(config.memory_budget_bytes, config.memory_pressure_ratio, self.wake)
        self._clock = clock
        self._given_store = store
        self._given_cold_store = cold_store
        self._start_background = start_background
        #: corrupt sealed data found while running (read checks, scrubber): marks and counters
        self.corruption = Corruption(alive=self._alive)
        #: segments whose reads fail with an I/O error (/metrics, /readyz)
        self.read_errors = ReadErrors()
        self._parts: _Parts | None = None
        self.recovery_report: RecoveryReport | None = None
        #: the WAL writers' wait for the replay bound (set when the shards start)
        self.roll_gate: WalRollGate | None = None
        space.count_owed(self._owed)

    # ==== lifecycle =================================================================================

    @property
    def parts(self) -> _Parts:
        if self._parts is None:
            raise EngineClosedError("engine is not open")
        return self._parts

    @property
    def stores(self) -> Stores:
        return self.parts.stores

    def open(self) -> RecoveryReport:
        config = self.config
        hot = self._given_store
        if hot is None:
            root = segments_dir(self.data_dir)
            self.fs.makedirs(root)
            hot = LocalStore(root, self.fs)
        cold = self._given_cold_store
        if cold is None and config.cold_store_url:
            from loglake.store import open_store

            cold = open_store(config.cold_store_url, self.fs)
        cold_reader = None
        if cold is not None:
            cold_reader = ColdReader(
                cold,
                range_cache_bytes=config.cold_range_cache_bytes,
                footer_cache_entries=config.cold_footer_cache_entries,
                read_ahead_segments=config.cold_read_ahead_segments,
                threads=config.cold_read_threads,
            )
        stores = Stores(hot, cold, cold_reader)
        try:
            return self._open(stores)
        except BaseException:
            self.meta.close()
            if cold_reader is not None:
                cold_reader.close()
            raise

    def _open(self, stores: Stores) -> RecoveryReport:
        config = self.config
        hot, cold = stores.hot, stores.cold
        indexes = IndexCache(stores, config.segment_index_cache_entries)
        # The publisher watches from the first record on (recovery may append some).
        publisher = MetaPublisher(
            self.meta, [hot] + ([cold] if cold is not None else []), interval_ms=config.meta_publish_interval_ms
        )
        report, wal = recover(
            fs=self.fs, data_dir=self.data_dir, meta=self.meta, catalog=self.catalog, stores=stores, pool=self.pool,
            accept_data_loss=config.accept_data_loss,
        )
        shards, retired = self._start_shards(
            {n: s.next_seq for n, s in wal.shards.items()}, {n: s.files for n, s in wal.shards.items()}
        )
        sealer = Sealer(
            self.catalog, stores, self.pool, indexes, self._clock, threads=config.seal_threads, on_sealed=self.wake
        )
        appender = Appender(
            self.catalog, self.pool, sealer, shards, config, self._clock, self._check_open, space=self.space
        )
        reader = Reader(self.catalog, stores, indexes, BatchChecker(self.corruption), self.read_errors)
        relocator = (
            Relocator(self.catalog, stores, indexes, config.relocation_threads, config.relocation_retry_ms)
            if cold is not None
            else None
        )
        # A cleaner worker process reopens the stores by URL: only where that gives the same store.
        reopenable = isinstance(self.fs, OsFileSystem)
        cold_url = config.cold_store_url if self._given_cold_store is None else None
        if cold_url and not reopenable and not cold_url.startswith("s3://"):
            cold_url = None
        store_urls = {Tier.HOT: hot.url if reopenable and self._given_store is None else None, Tier.COLD: cold_url}
        cleaner = Cleaner(
            self.catalog, stores, indexes, self._clock, config, store_urls, before_delete=self.publish_metadata
        )
        maintenance = Maintenance(
            self.catalog,
            self.meta,
            sealer,
            stores,
            indexes,
            self.pool,
            self._clock,
            interval_ms=config.maintenance_interval_ms,
            shards=lambda: [*shards, *retired],
            space=self.space,
            wal_max_bytes=config.wal_max_bytes,
            wal_replay_bytes=config.wal_replay_bound,
            relocator=relocator,
            publisher=publisher,
            acked=AckedRecorder(self.catalog, self.meta, config.acked_end_interval_ms, self._clock),
        )
        publisher.start(self.meta.replayed)
        scrubber = Scrubber(self.catalog, stores, indexes, reader.checker, self.corruption, config)
        self._parts = _Parts(
            stores, indexes, shards, retired, sealer, appender, reader, relocator, cleaner, publisher, maintenance, scrubber
        )
        if self._start_background:
            sealer.start()
            if relocator is not None:
                relocator.start()
            maintenance.start()
            cleaner.start()
            if config.scrub_bytes_per_second > 0:
                scrubber.start()
        if report.acked_lost:
            fill_losses(self.catalog, appender, self._clock, report)
        self._drop_lost_markers()
        self.recovery_report = report
        log.info("%s", report.summary())
        return report

    def _start_shards(
        self, next_seqs: dict[str, int], files: dict[str, list[WalFile]]
    ) -> tuple[list[WalShard], list[WalShard]]:
        """One writer per configured shard; old extra shard dirs are kept for truncation only."""
        wal_root = wal_dir(self.data_dir)
        shards: list[WalShard] = []
        retired: list[WalShard] = []
        config = self.config
        # the replay bound held while writing (loglake.engine.wal_gate): what every WAL
        # directory holds, counted as maintenance and a restart count it
        self.roll_gate = WalRollGate(
            lambda: sum(len(s.files()) * s.file_bytes for s in (*shards, *retired)),
            config.wal_replay_bound,
            config.wal_file_bytes,
            config.wal_shards,
        )
        for i in range(config.wal_shards):
            name = shard_dir_name(i)
            directory = os.path.join(wal_root, name)
            self.fs.makedirs(directory)
            shard = self._new_shard(directory, roll_gate=self.roll_gate)
            shard.start(next_seqs.get(name, 0), files.get(name, []))
            shards.append(shard)
        for name, existing in files.items():
            suffix = name.split("-")[1]
            index = int(suffix) if suffix.isdigit() else -1
            if 0 <= index < self.config.wal_shards:
                continue
            retired.append(self._new_shard(os.path.join(wal_root, name), existing))
        return shards, retired

    def _new_shard(
        self, directory: str, files: list[WalFile] | None = None, roll_gate: WalRollGate | None = None
    ) -> WalShard:
        return WalShard(
            self.fs,
            directory,
            file_bytes=self.config.wal_file_bytes,
            group_bytes_max=self.config.wal_group_bytes_max,
            queue_bytes_max=self.config.wal_queue_bytes_max,
            fsync_interval_ms=self.config.wal_fsync_interval_ms,
            on_full=self.space.wal_full,
            on_healed=self.space.wal_healed,
            spare=self.config.wal_spare_file,
            spare_keep_free=self.space.keep_free,
            files=files,
            roll_gate=roll_gate,
        )

    def _owed(self) -> Owed:
        """What this log will still write for what it holds (loglake.engine.space): the segments
        of every partition's unsealed data, the WAL files the shards and the metadata log may
        still allocate. Read without locks (a snapshot of counters); the catalog as last built,
        which names every partition an append reached."""
        parts = self._parts
        if parts is None:
            return Owed(0, 0)
        segments = 0
        for topic in list(self.catalog.topics.values()):
            segment_bytes = topic.config.segment_bytes
            for p in list(topic.partitions):
                size = p.buffer_bytes
                if size > 0:
                    # sealed as segments of at most segment.bytes, each with its header and trailer
                    segments += sealed_size(size, p.buffer_batches) + size // segment_bytes * sealed_size(0, 0)
        meta_shard = self.meta.shard
        meta_files = meta_shard.allocation_ahead() if meta_shard is not None else 0
        return Owed(segments + meta_files, sum(shard.allocation_ahead() for shard in parts.shards))

    def _alive(self, topic: str, partition: int, key: str) -> bool:
        """Whether a segment is still in its partition's chain (a corruption mark is dropped once
        retention or a rewrite removed it)."""
        try:
            p = self.catalog.partition(topic, partition)
        except UnknownTopicError:
            return False
        with p.lock:
            return any(s.key == key for s in p.segments.slice(0))

    def _drop_lost_markers(self) -> None:
        """After recovery: aborted entries whose marker lies past the recovered log end were lost
        with it (a durability class that does not fsync); their offsets will be written again."""
        for _topic, p in self.catalog.partitions():
            entries = p.meta.aborted_txns
            if entries and entries[-1][2] >= p.next_offset:
                p.meta.aborted_txns = [e for e in entries if e[2] < p.next_offset]

    def close(self) -> None:
        """Clean shutdown: drain the WAL, seal everything, record it, upload what is due."""
        parts = self._parts
        if parts is None:
            self.meta.close()
            return
        clean = False
        # Disk full and not healed: the stalled writes fail now, or threads waiting for them
        # (maintenance, cleaner) would never let go. Recovery replays what is durable.
        for shard in [*parts.shards, self.meta.shard]:
            if shard is not None and shard.stalled:
                shard.abort_stall()
        try:
            if self.failure is None:
                try:
                    self.flush()
                except StorageFullError as exc:
                    # What was acknowledged is in the WAL; the next start replays it.
                    log.warning("closing with storage full, not sealing what the WAL holds: %s", exc)
                    raise _UncleanClose() from None
                # Upload what is due now (S3-primary topics expect their data in the bucket);
                # failures are logged and the segments stay hot for the next start.
                if parts.relocator is not None and parts.relocator.relocate_due():
                    self.meta.sync()
                    self.publish_metadata()
                clean = True
        except _UncleanClose:
            pass
        finally:
            failed = self.failure is not None
            self._parts = None
            parts.scrubber.close()
            parts.cleaner.close()
            parts.maintenance.close()
            parts.sealer.close()
            parts.reader.close()
            if parts.relocator is not None:
                parts.relocator.close()
            if parts.stores.cold_reader is not None:
                parts.stores.cold_reader.close()
            for shard in parts.shards:
                shard.close()
            self.meta.close()
            for _topic, p in self.catalog.partitions():
                p.wake_all()
            parts.stores.hot.close()
            if parts.stores.cold is not None:
                parts.stores.cold.close()
            if clean and not failed:
                write_clean_mark(self.fs, self.data_dir)  # the next open needs no epoch bump (engine/epochs.py)

    @property
    def failure(self) -> BaseException | None:
        parts = self._parts
        if parts is not None:
            if parts.appender.failure is not None:
                return parts.appender.failure
            for shard in parts.shards:  # failed without a producer's entry in hand (an interval fsync)
                if shard.failure is not None:
                    return shard.failure
        return self.meta.failure

    def _check_open(self) -> None:
        if self._parts is None:
            raise EngineClosedError("engine is closed")
        failure = self.failure
        if failure is not None:
            raise EngineFailedError(f"engine stopped accepting writes: {failure}")

    def wake(self) -> None:
        if self._parts is not None:
            self._parts.maintenance.wake()

    # ==== the data path ================================================================================

    def append(
        self, p: Partition, config: TopicConfig, buf: AppendBuffer, batches: Batches, *, produced: bool = True
    ) -> Future[AppendResult]:
        self._check_open()
        return self.parts.appender.append(p, config, buf, batches, produced=produced)

    def read(self, p: Partition, offset: int, max_bytes: int, *, file_ranges: bool, min_one: bool) -> ReadResult:
        return self.parts.reader.read(p, offset, max_bytes, file_ranges=file_ranges, min_one=min_one)

    def read_async(
        self, p: Partition, offset: int, max_bytes: int, *, file_ranges: bool, min_one: bool
    ) -> Future[ReadResult]:
        return self.parts.reader.read_async(p, offset, max_bytes, file_ranges=file_ranges, min_one=min_one)

    def wait_for_data(self, p: Partition, offset: int) -> Future[None]:
        return p.wait_for(offset)

    def offset_for_timestamp(self, p: Partition, timestamp_ms: int) -> tuple[int, int] | None:
        return self.parts.reader.offset_for_timestamp(p, timestamp_ms)

    def max_timestamp(self, p: Partition) -> tuple[int, int] | None:
        return self.parts.reader.max_timestamp(p)

    def info(self, p: Partition, compacted: bool) -> PartitionInfo:
        with p.lock:
            return PartitionInfo(
                p.topic,
                p.index,
                p.log_start_offset,
                p.high_watermark,
                p.next_offset,
                p.sealed_end,
                len(p.segments),
                p.segments.total_bytes(),
                p.buffer_bytes,
                p.meta.clean_end,
                dirty_ratio_locked(p) if compacted else 0.0,  # only compacted topics have one
                p.meta.leader_epoch,
                last_stable_offset(p),
            )

    def tier_bytes(self, p: Partition) -> TierBytes:
        with p.lock:
            table = p.segments
            cold = sum(table[i].size for i in table.indexes_in_tier(Tier.COLD))
            hot = table.total_bytes() - cold + p.buffer_bytes
            lag = max(0, p.next_offset - p.high_watermark)
        return TierBytes(hot, cold, lag)

    @property
    def cold_url(self) -> str | None:
        cold = self.stores.cold
        return cold.url if cold is not None else None

    def leader_epoch(self, p: Partition, offset: int | None) -> int:
        return p.meta.leader_epoch if offset is None else epoch_of(p.meta, offset)

    def epoch_end_offset(self, p: Partition, epoch: int) -> tuple[int, int]:
        with p.lock:
            return end_offset_for(p.meta, p.next_offset, epoch)

    def producer_states(self, p: Partition) -> list[tuple[int, int, int, int]]:
        with p.lock:
            return p.producers.describe()

    def open_file_range(self, chunk: FileRange) -> BinaryIO:
        fh = open(chunk.path, "rb")  # noqa: SIM115 - the caller closes it after the send
        try:
            # start reading the range into the page cache now, off the caller's event loop
            os.posix_fadvise(fh.fileno(), chunk.position, chunk.length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # advice only
        return fh

    def report_file_range_failure(self, path: str, exc: OSError) -> bool:
        return self.parts.reader.file_range_failed(path, exc)

    # ==== changes =======================================================================================

    def topic_deleted(self, topic: TopicState) -> None:
        """The metadata no longer names the topic: its data can go. Segments first, then memory."""
        stores = self.parts.stores
        for p in topic.partitions:
            with p.lock:
                freed = p.buffer_bytes
                p.buffer_pop_front(len(p.buffer))
                segments = p.segments.slice(0)
            self.pool.release(freed)
            p.wake_all()
            for seg in segments:
                stores.delete_segment(seg.key, seg.tier)

    def delete_records(self, p: Partition, offset: int) -> int:
        """Kafka DeleteRecords: raise the log start offset to `offset` (-1 = high watermark).

        Durable before it returns; whole segments below the new start are deleted.
        Returns the new log start offset (the "low watermark").
        """
        self._check_open()
        with p.lock:
            if p.deleted:
                raise UnknownTopicError(f"topic {p.topic!r} was deleted")
            hw = p.high_watermark
            target = hw if offset == -1 else offset
            if not 0 <= target <= hw:
                raise OffsetOutOfRangeError(
                    f"cannot delete records of {p.topic}-{p.index} below {offset}: high watermark is {hw}",
                    log_start_offset=p.log_start_offset,
                    high_watermark=hw,
                )
            if target <= p.log_start_offset:
                return p.log_start_offset
            table = p.segments
            n = 0
            while n < len(table) and table[n].last_offset < target:
                n += 1
            doomed = table.slice(0, n)
            fut = self.catalog.record_log_start(p, target)
        fut.result()
        parts = self.parts
        for seg in doomed:
            parts.indexes.forget(seg.key)
            parts.stores.delete_segment(seg.key, seg.tier)
        return target

    def bump_leader_epoch(self, p: Partition, reason: str) -> int:
        self._check_open()
        with p.lock:  # appends after it carry the new epoch and offsets >= its start
            record_bump(self.catalog, p, reason).result()
            return p.meta.leader_epoch

    def segments(self, p: Partition) -> list[SegmentRef]:
        with p.lock:
            return p.segments.slice(0)

    # ==== maintenance ====================================================================================

    def flush(self) -> None:
        """Make everything appended so far durable, seal it, record it, truncate the WAL."""
        self._check_open()
        parts = self.parts
        for shard in parts.shards:
            shard.sync()
        for fut in parts.sealer.seal_all():
            fut.result()
        self.meta.sync()
        parts.maintenance.truncate_wal()
        self.publish_metadata()

    def compact(self, topic: str | None, force: bool) -> int:
        self._check_open()
        return self.parts.cleaner.run_once(force=force, topic=topic)

    def apply_retention(self) -> int:
        return self.parts.maintenance.apply_retention()

    def relocate_due(self) -> int:
        relocator = self.parts.relocator
        return relocator.relocate_due() if relocator is not None else 0

    def wait_relocations(self, timeout_s: float) -> bool:
        relocator = self.parts.relocator
        return relocator.wait(timeout_s) if relocator is not None else True

    def publish_metadata(self) -> bool:
        """Copy metadata changes (log pieces, new checkpoints) into the stores now."""
        parts = self._parts
        return parts.publisher.publish() if parts is not None else False

    def checkpoint_metadata(self) -> int:
        return self.meta.checkpoint()

    def set_cleaner_io_rate(self, bytes_per_s: int) -> None:
        self.config.cleaner_io_max_bytes_per_second = bytes_per_s
        if self._parts is not None:
            self._parts.cleaner.limiter.set_rate(bytes_per_s)

    def verify(self, progress: Progress | None = None) -> VerifyReport:
        """Every sealed segment's CRCs and every partition's hash chain (loglake.engine.verify)."""
        return verify_source(CatalogSource(self.catalog, self.stores), progress)

    # ==== what metrics show =============================================================================

    @property
    def shards(self) -> list[WalShard]:
        return list(self._parts.shards) if self._parts is not None else []

    @property
    def cold_reader(self) -> ColdReader | None:
        return self._parts.stores.cold_reader if self._parts is not None else None

    @property
    def cleaner(self) -> Cleaner | None:
        return self._parts.cleaner if self._parts is not None else None

    @property
    def scrubber(self) -> Scrubber | None:
        return self._parts.scrubber if self._parts is not None else None

    @property
    def sealer(self) -> Sealer:
        return self.parts.sealer

    @property
    def maintenance(self) -> Maintenance:
        return self.parts.maintenance

    @property
    def reader(self) -> Reader:
        return self.parts.reader

    @property
    def appender(self) -> Appender:
        return self.parts.appender
