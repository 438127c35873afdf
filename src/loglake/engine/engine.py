"""The engine facade: lifecycle, and the public API over the engine's parts.

The engine core is I/O-agnostic toward its callers: appends return
`concurrent.futures.Future`s (the broker awaits them, the embedded `Log` blocks on them).

Invariant, stated once: data acknowledged is never lost; loss of unacknowledged data is
explicit (a recovery report, a log line), never silent.

The parts, each in its own module, with dependencies pointing one way (top to bottom)::

    engine (this facade: lifecycle, wiring)
      ├─ maintenance   one thread: age/size/pressure seals, retention, relocation, checkpoints,
      │                WAL truncation, publishing metadata to the stores
      ├─ tiering       relocation of sealed segments to the cold store
      ├─ append        batches → offsets → WAL → unsealed buffers
      ├─ read          memory, hot and cold segments
      ├─ seal          buffers → segment objects + `segment_published` records
      ├─ recovery      metadata → store reconciliation → WAL replay (at open)
      ├─ stores, cold  where segments live and how cold ones are read
      └─ catalog       topics and partitions over the MetaStore (every durable change a record)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from loglake import canary
from loglake.engine.acked import AckedRecorder, fill_losses
from loglake.engine.append import Appender, PairTuple, RecordTuple
from loglake.engine.broker_meta import BrokerMetaMixin
from loglake.engine.catalog import Catalog, TopicState
from loglake.engine.cleaner import Cleaner
from loglake.engine.cold import ColdReader
from loglake.engine.config import EngineConfig
from loglake.engine.corrupt import BatchChecker, Corruption
from loglake.engine.epochs import write_clean_mark
from loglake.engine.ioerrors import ReadErrors
from loglake.engine.maintenance import Maintenance
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import SegmentRef
from loglake.engine.read import Reader
from loglake.engine.recovery import recover
from loglake.engine.scrubber import Scrubber
from loglake.engine.seal import Sealer
from loglake.engine.space import SpaceGuard
from loglake.engine.stores import IndexCache, Stores
from loglake.engine.tiering import Relocator
from loglake.engine.topics_api import TopicsMixin
from loglake.engine.txn_api import TxnEngineMixin
from loglake.engine.types import AppendResult, ReadResult, RecoveryReport
from loglake.errors import (
    ConfigError,
    EngineClosedError,
    EngineFailedError,
    StorageFullError,
)
from loglake.fs.base import FileSystem
from loglake.fs.os_fs import OsFileSystem
from loglake.meta.layout import meta_dir, segments_dir, wal_dir
from loglake.meta.lifecycle import Tier
from loglake.meta.lock import DataDirLock
from loglake.meta.log import LocalMetaStore
from loglake.meta.publish import MetaPublisher
from loglake.store.base import ObjectStore
from loglake.store.local import LocalStore
from loglake.wal.recovery import shard_dir_name
from loglake.wal.shard import WalFile, WalShard

__all__ = ["Engine", "RecordTuple", "TopicState", "open_engine"]

log = logging.getLogger(__name__)


class _UncleanClose(Exception):
    """close() could not flush (storage full): skip the clean-shutdown mark."""


class Engine(TxnEngineMixin, BrokerMetaMixin, TopicsMixin):
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
        self._given_store = store
        self._given_cold_store = cold_store
        self._start_background = start_background
        #: the free-space reserve (loglake.engine.space): produce refused while storage is full
        self.space = SpaceGuard(
            self.fs,
            self.data_dir,
            min_free_bytes=self.config.storage_min_free_bytes,
            min_free_percent=self.config.storage_min_free_percent,
            check_interval_ms=self.config.storage_space_check_interval_ms,
            also=[wal_dir(self.data_dir)],  # perhaps a device of its own (docs/OPERATIONS.md)
        )
        self._meta = LocalMetaStore(
            self.fs,
            meta_dir(self.data_dir),
            checkpoint_records=self.config.meta_checkpoint_records,
            checkpoint_bytes=self.config.meta_checkpoint_bytes,
            log_file_bytes=self.config.meta_log_file_bytes,
            on_full=self.space.wal_full,
            on_healed=self.space.wal_healed,
        )
        self.catalog = Catalog(self._meta, self.config, clock)
        self._pool = MemoryPool(self.config.memory_budget_bytes, self.config.memory_pressure_ratio, self._on_pressure)
        self._dir_lock = DataDirLock(self.fs, self.data_dir)
        self._shards: list[WalShard] = []
        self._retired_shards: list[WalShard] = []  # shard dirs beyond the current count: truncation only
        self._stores: Stores | None = None
        self._relocator: Relocator | None = None
        self._cleaner: Cleaner | None = None
        self._publisher: MetaPublisher | None = None
        self._maintenance: Maintenance | None = None
        self._sealer: Sealer | None = None
        self._appender: Appender | None = None
        self._reader: Reader | None = None
        #: corrupt sealed data found while running (read checks, scrubber): marks and counters
        self.corruption = Corruption()
        #: segments whose reads fail with an I/O error (/metrics, /readyz)
        self.read_errors = ReadErrors()
        #: the scrubber (loglake.engine.scrubber; its thread runs when scrub_bytes_per_second > 0)
        self.scrubber: Scrubber | None = None
        self._closed = True
        self.recovery_report: RecoveryReport | None = None

    # ==== lifecycle ===============================================================================

    @property
    def stores(self) -> Stores:
        assert self._stores is not None, "engine not open"
        return self._stores

    @property
    def store(self) -> ObjectStore:
        return self.stores.hot

    @property
    def cold_store(self) -> ObjectStore | None:
        return self._stores.cold if self._stores is not None else self._given_cold_store

    @property
    def cold_reader(self) -> ColdReader | None:
        return self._stores.cold_reader if self._stores is not None else None

    def store_for(self, seg: SegmentRef) -> ObjectStore:
        """The store holding `seg`'s authoritative copy."""
        return self.stores.store_for(seg)

    @property
    def cluster_id(self) -> str:
        return self.catalog.cluster_id

    @property
    def meta(self) -> LocalMetaStore:
        return self._meta

    @property
    def memory_pool(self) -> MemoryPool:
        return self._pool

    @property
    def shards(self) -> list[WalShard]:
        return list(self._shards)

    def open(self) -> RecoveryReport:
        canary.warn_if_active()  # test-only mutations must never run unnoticed
        self.fs.makedirs(self.data_dir)
        self._dir_lock.acquire()
        try:
            report = self._open_parts()
        except BaseException:
            self._meta.close()
            if self._stores is not None and self._stores.cold_reader is not None:
                self._stores.cold_reader.close()
            self._dir_lock.release()
            raise
        self._closed = False
        if report.acked_lost:
            try:
                fill_losses(self.catalog, self.appender, self._clock, report)
            except BaseException:
                self.close()
                raise
        self.drop_lost_markers()
        self.recovery_report = report
        log.info("%s", report.summary())
        return report

    def _open_parts(self) -> RecoveryReport:
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
        self._stores = stores = Stores(hot, cold, cold_reader)
        indexes = IndexCache(stores, config.segment_index_cache_entries)
        self._sealer = Sealer(
            self.catalog, stores, self._pool, indexes, self._clock, threads=config.seal_threads, on_sealed=self._wake
        )
        self._appender = Appender(
            self.catalog, self._pool, self._sealer, config, self._clock, self._check_open, admit=self.space.admit
        )
        self._reader = Reader(self.catalog, stores, indexes, BatchChecker(self.corruption), self.read_errors)
        self._maintenance = Maintenance(
            self.catalog,
            self._meta,
            self._sealer,
            stores,
            indexes,
            self._pool,
            self._clock,
            interval_ms=config.maintenance_interval_ms,
            shards=lambda: [*self._shards, *self._retired_shards],
            space=self.space,
            wal_max_bytes=config.wal_max_bytes,
        )
        if cold is not None:
            self._relocator = Relocator(self.catalog, stores, indexes, config.relocation_threads, config.relocation_retry_ms)
            self._maintenance.relocator = self._relocator
        # A cleaner worker process reopens the stores by URL: only where that gives the same store.
        reopenable = isinstance(self.fs, OsFileSystem)
        cold_url = config.cold_store_url if self._given_cold_store is None else None
        if cold_url and not reopenable and not cold_url.startswith("s3://"):
            cold_url = None
        store_urls = {Tier.HOT: hot.url if reopenable and self._given_store is None else None, Tier.COLD: cold_url}
        self._cleaner = Cleaner(self.catalog, stores, indexes, self._clock, config, store_urls)
        self._cleaner.rewriter.before_delete = self.publish_metadata
        # The publisher watches from the first record on (recovery may append some).
        publish_to = [hot] + ([cold] if cold is not None else [])
        self._publisher = MetaPublisher(self._meta, publish_to, interval_ms=config.meta_publish_interval_ms)
        report, wal = recover(
            fs=self.fs, data_dir=self.data_dir, meta=self._meta, catalog=self.catalog, stores=stores, pool=self._pool,
            accept_data_loss=config.accept_data_loss,
        )
        self._start_shards({n: s.next_seq for n, s in wal.shards.items()}, {n: s.files for n, s in wal.shards.items()})
        self._appender.shards = self._shards
        self._maintenance.acked = AckedRecorder(self.catalog, self._meta, config.acked_end_interval_ms, self._clock)
        self._publisher.start(self._meta.replayed)
        self._maintenance.publisher = self._publisher
        if self._start_background:
            self._sealer.start()
            if self._relocator is not None:
                self._relocator.start()
            self._maintenance.start()
            self._cleaner.start()
        self.corruption.alive = lambda topic, p, key: any(s.key == key for s in self.segments(topic, p))
        self.scrubber = Scrubber(self.catalog, stores, indexes, self._reader.checker, self.corruption, config)
        if self._start_background and config.scrub_bytes_per_second > 0:
            self.scrubber.start()
        return report

    def _start_shards(self, next_seqs: dict[str, int], files: dict[str, list[WalFile]]) -> None:
        """One writer per configured shard; old extra shard dirs are kept for truncation."""
        wal_root = wal_dir(self.data_dir)
        for i in range(self.config.wal_shards):
            name = shard_dir_name(i)
            directory = os.path.join(wal_root, name)
            self.fs.makedirs(directory)
            shard = self._new_shard(directory)
            shard.start(next_seqs.get(name, 0), files.get(name, []))
            self._shards.append(shard)
        for name, existing in files.items():
            suffix = name.split("-")[1]
            index = int(suffix) if suffix.isdigit() else -1
            if 0 <= index < self.config.wal_shards:
                continue
            retired = self._new_shard(os.path.join(wal_root, name))
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
            on_full=self.space.wal_full,
            on_healed=self.space.wal_healed,
            spare=self.config.wal_spare_file,
            spare_keep_free=self.space.reserve_for,
        )

    def close(self) -> None:
        """Clean shutdown: drain the WAL, seal everything, record it, release the directory."""
        if self._closed:
            return
        clean = False
        # Disk full and not healed: the stalled writes fail now, or threads waiting for them
        # (maintenance, cleaner) would never let go. Recovery replays what is durable.
        for shard in [*self._shards, self._meta.shard]:
            if shard is not None and shard.stalled:
                shard.abort_stall()
        try:
            if self._failure is None:
                try:
                    self.flush()
                except StorageFullError as exc:
                    # What was acknowledged is in the WAL; the next start replays it.
                    log.warning("closing with storage full, not sealing what the WAL holds: %s", exc)
                    raise _UncleanClose() from None
                # Upload what is due now (S3-primary topics expect their data in the bucket);
                # failures are logged and the segments stay hot for the next start.
                if self._relocator is not None and self._relocator.relocate_due():
                    self._meta.sync()
                    self.publish_metadata()
                clean = True
        except _UncleanClose:
            pass
        finally:
            self._closed = True
            if self.scrubber is not None:
                self.scrubber.close()
            if self._cleaner is not None:
                self._cleaner.close()
            if self._maintenance is not None:
                self._maintenance.close()
            if self._sealer is not None:
                self._sealer.close()
            if self._relocator is not None:
                self._relocator.close()
            if self._stores is not None and self._stores.cold_reader is not None:
                self._stores.cold_reader.close()
            for shard in self._shards:
                shard.close()
            self._meta.close()
            for _topic, p in self.catalog.partitions():
                p.wake_all()
            if self._stores is not None:
                self._stores.hot.close()
                if self._stores.cold is not None:
                    self._stores.cold.close()
            if clean and self._failure is None:
                write_clean_mark(self.fs, self.data_dir)  # the next open needs no epoch bump (engine/epochs.py)
            self._dir_lock.release()

    def __enter__(self) -> Engine:
        if self._closed:
            self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _failure(self) -> BaseException | None:
        if self._appender is not None and self._appender.failure is not None:
            return self._appender.failure
        for shard in self._shards:  # failed without a producer's entry in hand (an interval fsync)
            if shard.failure is not None:
                return shard.failure
        return self._meta.failure

    @property
    def failure(self) -> BaseException | None:
        """Why the engine stopped accepting writes for good (an I/O error other than ENOSPC on a
        WAL or metadata-log write or fsync); None while it accepts them. Reads of what is durable
        go on; produce answers KAFKA_STORAGE_ERROR until a restart."""
        return self._failure

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("engine is closed")
        failure = self._failure
        if failure is not None:
            raise EngineFailedError(f"engine stopped accepting writes: {failure}")

    def _wake(self) -> None:
        if self._maintenance is not None:
            self._maintenance.wake()

    def _on_pressure(self) -> None:
        self._wake()

    # ==== appends and reads =========================================================================

    @property
    def appender(self) -> Appender:
        assert self._appender is not None, "engine not open"
        return self._appender

    @property
    def reader(self) -> Reader:
        assert self._reader is not None, "engine not open"
        return self._reader

    def append_batch(self, topic: str, partition: int, data: bytes | bytearray) -> Future[AppendResult]:
        """Append Kafka v2 RecordBatches as a producer sent them (see loglake.engine.append)."""
        return self.appender.append_batch(topic, partition, data)

    def append_records(
        self, topic: str, partition: int, records: Iterable[RecordTuple], *, compression: int | None = None
    ) -> Future[AppendResult]:
        """Build one batch from (timestamp or None, key, value, headers) tuples and append it."""
        return self.appender.append_records(topic, partition, records, compression=compression)

    def append_pairs(
        self, topic: str, partition: int, records: Iterable[PairTuple], *, compression: int | None = None
    ) -> Future[AppendResult]:
        """Build one batch from (key, value) or (key, value, headers) tuples, stamped now, and append it."""
        return self.appender.append_pairs(topic, partition, records, compression=compression)

    def read(
        self, topic: str, partition: int, offset: int, max_bytes: int, *, file_ranges: bool = False, min_one: bool = True
    ) -> ReadResult:
        return self.reader.read(topic, partition, offset, max_bytes, file_ranges=file_ranges, min_one=min_one)

    def read_async(
        self, topic: str, partition: int, offset: int, max_bytes: int, *, file_ranges: bool = False, min_one: bool = True
    ) -> Future[ReadResult]:
        return self.reader.read_async(topic, partition, offset, max_bytes, file_ranges=file_ranges, min_one=min_one)

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        return self.reader.offset_for_timestamp(topic, partition, timestamp_ms)

    def max_timestamp(self, topic: str, partition: int) -> tuple[int, int] | None:
        return self.reader.max_timestamp(topic, partition)

    def wait_for_data(self, topic: str, partition: int, offset: int) -> Future[None]:
        return self.reader.wait_for_data(topic, partition, offset)

    # ==== sealing, flushing, metadata =================================================================

    def flush(self) -> None:
        """Make everything appended so far durable, seal it, record it, truncate the WAL."""
        self._check_open()
        assert self._sealer is not None and self._maintenance is not None
        for shard in self._shards:
            shard.sync()
        futures = self._sealer.seal_all()
        for fut in futures:
            fut.result()
        self._meta.sync()
        self._maintenance.truncate_wal()
        self.publish_metadata()

    def checkpoint_metadata(self) -> int:
        """Write a metadata checkpoint now (tools, tests); returns its seq."""
        return self._meta.checkpoint()

    def publish_metadata(self) -> bool:
        """Copy metadata changes (log pieces, new checkpoints) into the stores now."""
        return self._publisher.publish() if self._publisher is not None else False

    def apply_retention(self) -> int:
        assert self._maintenance is not None
        return self._maintenance.apply_retention()

    # ==== tiering ===================================================================================

    @property
    def cleaner(self) -> Cleaner:
        """Compaction and merging (loglake.engine.cleaner): stats, and `run_once` to clean now."""
        if self._cleaner is None:
            raise EngineClosedError("engine is not open")
        return self._cleaner

    def compact(self, topic: str | None = None, *, force: bool = True) -> int:
        """Compact (and merge) now, on the calling thread; returns how many rewrites were done."""
        self._check_open()
        return self.cleaner.run_once(force=force, topic=topic)

    def relocate_due(self) -> int:
        """Relocate every due segment now, on this thread (tests, tools). Returns how many moved."""
        return self._relocator.relocate_due() if self._relocator is not None else 0

    def wait_relocations(self, timeout_s: float = 30.0) -> bool:
        """Relocate what is due now and wait for it (tests and tools). True when nothing is left."""
        return self._relocator.wait(timeout_s) if self._relocator is not None else True


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
