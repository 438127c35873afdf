"""The engine: one class for both modes, composed of a metadata store, a partition log and a
cluster view (DESIGN.md §8)::

                 Engine (this module: lifecycle, topics, produce checks, transactions)
        ┌──────────────┬─────────────────┬────────────────┬──────────────┐
     Catalog       PartitionLog       ClusterView       MetaStore
   (topics over    local: WAL +       single: "me"      local log +
    the MetaStore)   segments         etcd: leases,     checkpoints;
                   shared: flush        leaders,        etcd
                    objects + etcd      coordinators
                    ranges

The single node's parts (`local_parts`) are what `Engine(data_dir, config)` builds; cluster mode
builds its own (loglake.cluster.node) and passes them as `parts`. The engine never asks which
mode it runs in: what one partition log cannot do it refuses through its table (`require`,
loglake.engine.partition_log), with a Kafka error code.

The engine core is I/O-agnostic toward its callers: appends return `concurrent.futures.Future`s
(the broker awaits them, the embedded `Log` blocks on them). Methods called before `open` or
after `close` raise EngineClosedError.

Invariant, stated once: data acknowledged is never lost; loss of unacknowledged data is
explicit (a recovery report, a log line), never silent.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

from loglake import canary
from loglake.engine import txn
from loglake.engine.catalog import Catalog, TopicState
from loglake.engine.cleaner import Cleaner
from loglake.engine.cold import ColdReader
from loglake.engine.config import EngineConfig, TopicConfig
from loglake.engine.corrupt import Corruption
from loglake.engine.ioerrors import ReadErrors
from loglake.engine.local_log import LocalPartitionLog
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.partition_log import Feature, PartitionLog, TierBytes, refusal
from loglake.engine.produce import (
    PairTuple,
    RecordTuple,
    built_from_pairs,
    built_from_records,
    checked_batches,
)
from loglake.engine.scrubber import Scrubber
from loglake.engine.space import SpaceGuard
from loglake.engine.telemetry import NO_TELEMETRY, Telemetry
from loglake.engine.types import (
    AppendResult,
    FileRange,
    PartitionInfo,
    ProducerDescription,
    ReadResult,
    RecoveryReport,
    TopicInfo,
)
from loglake.engine.verify import Progress, VerifyReport
from loglake.engine.view import ClusterView, SingleNodeView
from loglake.errors import ConfigError, EngineClosedError, EngineFailedError, LoglakeError, UnknownTopicError
from loglake.fs.base import FileSystem
from loglake.fs.modes import DIR_MODE, FILE_MODE
from loglake.fs.os_fs import OsFileSystem
from loglake.meta.layout import meta_dir, wal_dir
from loglake.meta.lock import DataDirLock
from loglake.meta.log import LocalMetaStore
from loglake.meta.store import MetaStore
from loglake.records.batch import peek_header, split_batches
from loglake.store.base import ObjectStore
from loglake.wal.shard import WalShard

__all__ = ["Engine", "EngineParts", "RecordTuple", "TopicState", "local_parts", "open_engine"]

log = logging.getLogger(__name__)

#: (result, last stable offset, aborted transactions [(producer id, first offset), ...])
CommittedRead = tuple[ReadResult, int, list[tuple[int, int]]]
#: Threads running appends that wait for memory (`Engine.submit_batch`): one, so that they are
#: given offsets in the order they came.
APPEND_WAIT_THREADS = 1
#: Most batches one DescribeProducers call reads for last timestamps; producers past it report -1.
PRODUCER_TIMESTAMP_READS_MAX = 1000


@dataclass(frozen=True)
class EngineParts:
    """Everything an engine is composed of, built by one function per mode."""

    fs: FileSystem
    meta: MetaStore
    catalog: Catalog
    log: PartitionLog
    view: ClusterView
    space: SpaceGuard
    #: what the parts add to /metrics and /readyz (cluster mode: leadership and health)
    telemetry: Telemetry = NO_TELEMETRY


def local_parts(
    data_dir: str,
    config: EngineConfig,
    *,
    fs: FileSystem,
    store: ObjectStore | None = None,
    cold_store: ObjectStore | None = None,
    clock: Callable[[], float] = time.time,
    start_background: bool = True,
    node_id: int = 0,
    rack: str | None = None,
) -> EngineParts:
    """The single node's parts: the local metadata log, the WAL + segments log, "me, always"."""
    #: the free-space reserve (loglake.engine.space): produce refused while storage is full
    space = SpaceGuard(
        fs,
        data_dir,
        min_free_bytes=config.storage_min_free_bytes,
        min_free_percent=config.storage_min_free_percent,
        check_interval_ms=config.storage_space_check_interval_ms,
        also=[wal_dir(data_dir)],  # perhaps a device of its own (docs/OPERATIONS.md)
    )
    meta = LocalMetaStore(
        fs,
        meta_dir(data_dir),
        checkpoint_records=config.meta_checkpoint_records,
        checkpoint_bytes=config.meta_checkpoint_bytes,
        log_file_bytes=config.meta_log_file_bytes,
        on_full=space.wal_full,
        on_healed=space.wal_healed,
    )
    catalog = Catalog(meta, config, clock)
    partition_log = LocalPartitionLog(
        data_dir,
        config,
        fs=fs,
        meta=meta,
        catalog=catalog,
        space=space,
        clock=clock,
        store=store,
        cold_store=cold_store,
        start_background=start_background,
    )
    return EngineParts(fs, meta, catalog, partition_log, SingleNodeView(node_id, rack), space)


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
        parts: EngineParts | None = None,
    ) -> None:
        """`parts`: cluster mode's (loglake.cluster.node); without them the single node's are
        built over `data_dir` (`fs`, `store`, `cold_store`: a test's filesystem and stores)."""
        self.data_dir = os.path.abspath(data_dir) if fs is None and parts is None else data_dir
        self.config = config or EngineConfig()
        self.config.validate()
        self._clock = clock
        if parts is None:
            parts = local_parts(
                self.data_dir,
                self.config,
                fs=fs or OsFileSystem(),
                store=store,
                cold_store=cold_store,
                clock=clock,
                start_background=start_background,
            )
        self.fs = parts.fs
        #: the metadata store (broker-side stores keep their facts there too)
        self.meta = parts.meta
        self.catalog = parts.catalog
        #: where partitions' records live (loglake.engine.partition_log)
        self.log = parts.log
        #: who is alive, who leads what (loglake.engine.view)
        self.view = parts.view
        #: the free-space reserve (loglake.engine.space)
        self.space = parts.space
        #: what the parts add to /metrics and /readyz (loglake.engine.telemetry)
        self.telemetry = parts.telemetry
        self._dir_lock = DataDirLock(self.fs, self.data_dir)
        #: appends that wait for memory (`submit_batch`): APPEND_WAIT_THREADS, so they keep their order
        self._append_waits = ThreadPoolExecutor(APPEND_WAIT_THREADS, thread_name_prefix="loglake-append-wait")
        self._closed = True
        self.recovery_report: RecoveryReport | None = None

    # ==== lifecycle ===============================================================================

    def open(self) -> RecoveryReport:
        canary.warn_if_active()  # test-only mutations must never run unnoticed
        self.fs.makedirs(self.data_dir)
        self._dir_lock.acquire()
        try:
            _make_private(self.fs, self.data_dir)
            report = self.log.open()
        except BaseException:
            self._dir_lock.release()
            raise
        self._closed = False
        self.recovery_report = report
        return report

    def join(self, listeners: list[str]) -> None:
        """Take part in the cluster, advertising `listeners` (PROTOCOL://HOST:PORT), once the
        broker's listeners are bound; blocking (cluster mode registers in etcd)."""
        self._check_open()
        self.view.join(listeners)

    def close(self) -> None:
        """Clean shutdown: hand partitions and groups over, make what was acknowledged durable
        where it lives for good, release the data directory."""
        if self._closed:
            return
        self._closed = True
        self._append_waits.shutdown(wait=True)
        # a fresh one (it starts no thread until used) for an engine opened again
        self._append_waits = ThreadPoolExecutor(APPEND_WAIT_THREADS, thread_name_prefix="loglake-append-wait")
        try:
            self.view.leave()
        finally:
            try:
                self.log.close()
            finally:
                self._dir_lock.release()

    def __enter__(self) -> Engine:
        if self._closed:
            self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failure(self) -> BaseException | None:
        """Why the engine stopped accepting writes for good (an I/O error other than ENOSPC on a
        WAL or metadata-log write or fsync); None while it accepts them. Reads of what is durable
        go on; produce answers KAFKA_STORAGE_ERROR until a restart."""
        return self.log.failure

    def check_writable(self) -> None:
        """What a store over this engine's metadata (the schema registry) asks before a change:
        EngineClosedError when not open, EngineFailedError once the log stopped taking writes."""
        self._check_open()

    def _check_open(self) -> None:
        """Before a change: EngineClosedError when not open, EngineFailedError once the log
        stopped taking writes (reads of what is durable go on)."""
        if self._closed:
            raise EngineClosedError("engine is closed")
        failure = self.log.failure
        if failure is not None:
            raise EngineFailedError(f"engine stopped accepting writes: {failure}")

    @property
    def cluster_id(self) -> str:
        return self.catalog.cluster_id

    @property
    def node_id(self) -> int:
        return self.view.node_id

    def require(self, feature: Feature) -> None:
        """Raise FeatureUnsupportedError (with the feature's Kafka code) when this engine's
        partition log does not offer `feature`."""
        if feature in self.log.refused:
            raise refusal(self.log.refused, feature)

    def supports(self, feature: Feature) -> bool:
        return feature not in self.log.refused

    # ==== topics ====================================================================================

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: dict[str, str] | None = None,
        *,
        validate_only: bool = False,
        replication_factor: int = 1,
    ) -> TopicInfo:
        """`replication_factor`: remembered with the topic (Metadata reports that many replicas
        per partition where the cluster view has that many live brokers); the broker checks it."""
        self._check_open()
        self._check_topic_config(config)
        return self.catalog.create_topic(
            name, partitions, config, validate_only=validate_only, replication_factor=replication_factor
        )

    def delete_topic(self, name: str) -> None:
        self._check_open()
        topic = self.catalog.delete_topic(name)
        self.log.topic_deleted(topic)
        log.info("deleted topic %s", name)

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None:
        self._check_open()
        self.catalog.create_partitions(name, total, validate_only=validate_only)

    def alter_topic_config(self, name: str, overrides: dict[str, str], *, validate_only: bool = False) -> TopicConfig:
        """Replace the topic's overrides with `overrides` (callers merge for incremental alters)."""
        self._check_open()
        self._check_topic_config(overrides)
        new = self.catalog.alter_topic_config(name, overrides, validate_only=validate_only)
        if not validate_only:
            self.log.wake()
        return new

    def _check_topic_config(self, overrides: dict[str, str] | None) -> None:
        """A topic config this log cannot honour is refused, not silently ignored."""
        if overrides and "compact" in str(overrides.get("cleanup.policy", "")):
            self.require(Feature.COMPACTION)

    def topics(self) -> list[TopicInfo]:
        return [t.info() for t in self.catalog.all_topics()]

    def topic(self, name: str) -> TopicInfo:
        return self.catalog.topic(name).info()

    def has_topic(self, name: str) -> bool:
        return self.catalog.has_topic(name)

    def topic_id_of(self, name: str) -> bytes:
        return self.catalog.topic(name).topic_id

    def topic_name_of(self, topic_id: bytes) -> str | None:
        topic = self.catalog.topic_by_id(topic_id)
        return topic.name if topic is not None else None

    def allocate_producer_id(self) -> int:
        """A new producer id for InitProducerId, durable (committed) before it is handed out."""
        self._check_open()
        return self.catalog.allocate_producer_id()

    def set_topic_defaults(self, defaults: dict[str, str]) -> None:
        """Topic config defaults changed at runtime: every topic without an override follows."""
        self.config.check_topic_defaults(defaults)
        self.catalog.set_topic_defaults(defaults)
        self.log.wake()

    def _partition(self, topic: str, partition: int) -> Partition:
        """The partition every data call works on; EngineClosedError before `open` and after
        `close` (never a lookup in a catalog that is not loaded)."""
        if self._closed:
            raise EngineClosedError("engine is closed")
        return self.catalog.partition(topic, partition)

    # ==== appends =====================================================================================

    def append_batch(self, topic: str, partition: int, data: bytes | bytearray | memoryview) -> Future[AppendResult]:
        """Append Kafka v2 RecordBatches as a producer sent them: checked (loglake.engine.produce),
        then offsets assigned by the partition log; a bytearray (or a writable view of one) is taken over. The
        future resolves once the topic's durability class is met."""
        self._check_open()
        p = self._partition(topic, partition)
        config = self.catalog.topic(topic).config
        buf, batches = checked_batches(topic, partition, config, data)
        return self.log.append(p, config, buf, batches)

    def appends_at_once(self, nbytes: int) -> bool:
        """Whether an append of `nbytes` finds memory plentiful (below the pool's pressure ratio),
        so that `append_batch` takes no memory wait and the event loop may call it itself; else
        `submit_batch` runs it on the engine's append thread."""
        pool = self.memory_pool
        return pool.used_bytes + nbytes < pool.pressure_bytes

    def submit_batch(self, topic: str, partition: int, data: bytes | bytearray | memoryview) -> Future[Future[AppendResult]]:
        """`append_batch` that never blocks its caller (the broker's event loop). The outer
        future resolves once the batches have offsets, with the future of their durability. While
        memory is plentiful that is at once; when these bytes would take the memory pool (the
        unsealed buffers, or the flush buffer in cluster mode) past its pressure ratio the append
        (which may wait for room, `memory_wait_ms`) runs on the engine's append thread, one at a
        time in arrival order — the caller's thread never waits for room."""
        assigned: Future[Future[AppendResult]] = Future()

        def run() -> None:
            try:
                assigned.set_result(self.append_batch(topic, partition, data))
            except BaseException as exc:
                assigned.set_exception(exc)

        if self.appends_at_once(len(data)):
            run()
        else:
            try:
                self._append_waits.submit(run)
            except RuntimeError:  # shut down: the engine is closing
                assigned.set_exception(EngineClosedError("engine is closed"))
        return assigned

    def append_records(
        self, topic: str, partition: int, records: Iterable[RecordTuple], *, compression: int | None = None
    ) -> Future[AppendResult]:
        """Build one batch from (timestamp or None, key, value, headers) tuples and append it."""
        self._check_open()
        p = self._partition(topic, partition)
        config = self.catalog.topic(topic).config
        buf, batches = built_from_records(topic, partition, config, records, compression, int(self._clock() * 1000))
        return self.log.append(p, config, buf, batches)

    def append_pairs(
        self, topic: str, partition: int, records: Iterable[PairTuple], *, compression: int | None = None
    ) -> Future[AppendResult]:
        """Build one batch from (key, value) or (key, value, headers) tuples, stamped now, and append it."""
        self._check_open()
        p = self._partition(topic, partition)
        config = self.catalog.topic(topic).config
        buf, batches = built_from_pairs(topic, partition, config, records, compression, int(self._clock() * 1000))
        return self.log.append(p, config, buf, batches)

    def write_txn_marker(
        self, topic_id: bytes, partition: int, producer_id: int, producer_epoch: int, commit: bool
    ) -> Future[AppendResult] | None:
        """Append a COMMIT or ABORT marker (a control batch, through the normal append path);
        None when the topic is gone."""
        self._check_open()
        self.require(Feature.TRANSACTIONS)
        topic = self.catalog.topic_by_id(topic_id)
        if topic is None or not 0 <= partition < len(topic.partitions):
            return None
        data = txn.control_batch(producer_id, producer_epoch, commit, 0, int(self._clock() * 1000))
        try:
            return self.log.append(topic.partitions[partition], topic.config, data, split_batches(data), produced=False)
        except UnknownTopicError:
            return None

    # ==== reads =======================================================================================

    def read(
        self, topic: str, partition: int, offset: int, max_bytes: int, *, file_ranges: bool = False, min_one: bool = True
    ) -> ReadResult:
        """Whole batches from the one holding `offset`, below the high watermark, up to
        `max_bytes` (with `min_one`, at least one batch however large: Kafka's rule)."""
        return self.log.read(self._partition(topic, partition), offset, max_bytes, file_ranges=file_ranges, min_one=min_one)

    def read_async(
        self, topic: str, partition: int, offset: int, max_bytes: int, *, file_ranges: bool = False, min_one: bool = True
    ) -> Future[ReadResult]:
        """`read` that never does blocking I/O on the caller's thread (the broker's event loop)."""
        return self.log.read_async(
            self._partition(topic, partition), offset, max_bytes, file_ranges=file_ranges, min_one=min_one
        )

    def read_committed(self, topic: str, partition: int, offset: int, max_bytes: int, *, min_one: bool = True) -> CommittedRead:
        """`read` at isolation read_committed: batches below the LSO, with the aborted transactions
        a reader must filter out (records of those producer ids from their first offset on, up to
        each one's ABORT marker)."""
        p = self._partition(topic, partition)
        result = self.log.read(p, offset, max_bytes, file_ranges=False, min_one=min_one)
        return txn.committed_view(p, offset, result, lambda: result)

    def read_committed_async(
        self, topic: str, partition: int, offset: int, max_bytes: int, *, file_ranges: bool = False, min_one: bool = True
    ) -> Future[CommittedRead]:
        """`read_async` at read_committed (the broker's Fetch with isolation_level 1)."""
        p = self._partition(topic, partition)
        out: Future[CommittedRead] = Future()
        pending = self.log.read_async(p, offset, max_bytes, file_ranges=file_ranges, min_one=min_one)

        def reread() -> ReadResult:
            return self.log.read(p, offset, max_bytes, file_ranges=False, min_one=min_one)

        def done(f: Future[ReadResult]) -> None:
            try:
                out.set_result(txn.committed_view(p, offset, f.result(), reread))
            except BaseException as exc:
                out.set_exception(exc)

        pending.add_done_callback(done)
        return out

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp_ms`, or None."""
        return self.log.offset_for_timestamp(self._partition(topic, partition), timestamp_ms)

    def max_timestamp(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets MAX_TIMESTAMP)."""
        return self.log.max_timestamp(self._partition(topic, partition))

    def wait_for_data(self, topic: str, partition: int, offset: int) -> Future[None]:
        """A future resolved when data at `offset` is visible (or the partition goes away)."""
        return self.log.wait_for_data(self._partition(topic, partition), offset)

    def wake_readers(self, topic_id: bytes, partition: int) -> None:
        """Readers waiting on the partition look again (its last stable offset moved)."""
        topic = self.catalog.topic_by_id(topic_id)
        if topic is not None and 0 <= partition < len(topic.partitions):
            topic.partitions[partition].wake_all()

    def last_stable_offset(self, topic: str, partition: int) -> int:
        """The first offset of the partition's earliest open transaction, else its high watermark."""
        return txn.last_stable_offset(self._partition(topic, partition))

    def aborted_transactions(self, topic: str, partition: int, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping [start, end)."""
        return txn.aborted_transactions(self._partition(topic, partition), start, end)

    def log_end(self, topic_id: bytes, partition: int) -> int | None:
        """The partition's next offset (by topic id), None when the topic is gone; on a broker
        that does not lead it (cluster mode) its end as this broker's metadata has it."""
        topic = self.catalog.topic_by_id(topic_id)
        if topic is None or not 0 <= partition < len(topic.partitions):
            return None
        p = topic.partitions[partition]
        return max(p.next_offset, p.high_watermark)

    # ==== partition facts ===============================================================================

    def partition_info(self, name: str, partition: int) -> PartitionInfo:
        return self.log.info(self._partition(name, partition), self.catalog.topic(name).config.compacted)

    def tier_bytes(self, name: str, partition: int) -> TierBytes:
        """Where the partition's bytes live (DescribeLogDirs)."""
        return self.log.tier_bytes(self._partition(name, partition))

    @property
    def cold_url(self) -> str | None:
        """Where the cold tier lives (DescribeLogDirs names it), None without one."""
        return self.log.cold_url

    def leader_epoch(self, name: str, partition: int, offset: int | None = None) -> int:
        """The partition's current leader epoch, or the epoch that wrote `offset`."""
        return self.log.leader_epoch(self._partition(name, partition), offset)

    def epoch_end_offset(self, name: str, partition: int, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest epoch <= `epoch`, where it ends); engine/epochs.py."""
        return self.log.epoch_end_offset(self._partition(name, partition), epoch)

    def producers(self, name: str, partition: int) -> list[ProducerDescription]:
        """The partition's idempotent producers (DescribeProducers); each last timestamp is read
        from its newest batch (blocking: call off the event loop)."""
        p = self._partition(name, partition)
        states = self.log.producer_states(p)
        with p.lock:
            txn_open = dict(p.meta.txn_open)
        out = []
        for i, (pid, epoch, last_seq, base) in enumerate(states):
            ts = self._batch_max_timestamp(p, base) if base >= 0 and i < PRODUCER_TIMESTAMP_READS_MAX else -1
            out.append(ProducerDescription(pid, epoch, last_seq, ts, txn_open.get(pid, -1)))
        return out

    def _batch_max_timestamp(self, p: Partition, offset: int) -> int:
        try:
            result = self.log.read(p, offset, 1, file_ranges=False, min_one=True)
        except LoglakeError:
            return -1  # retention or compaction removed it
        data = b"".join(bytes(c) for c in result.chunks if isinstance(c, bytes | bytearray | memoryview))
        if not data:
            return -1
        return peek_header(data, 0).max_timestamp

    def segments(self, name: str, partition: int) -> list[SegmentRef]:
        self.require(Feature.LOCAL_SEGMENTS)
        return self.log.segments(self._partition(name, partition))

    def verify(self, progress: Progress | None = None) -> VerifyReport:
        """Check every sealed segment's CRCs and every partition's hash chain (`loglake verify`)."""
        self._check_open()
        self.require(Feature.LOCAL_SEGMENTS)
        return self.log.verify(progress)

    def open_file_range(self, chunk: FileRange) -> BinaryIO:
        """Open the segment file of a FileRange a read returned, for a zero-copy send (blocking:
        call off the event loop). The caller closes it."""
        return self.log.open_file_range(chunk)

    def report_file_range_failure(self, path: str, exc: OSError) -> bool:
        """The broker's zero-copy send of a FileRange failed reading the file (EIO): the next
        fetches read through the engine and get CORRUPT_MESSAGE instead of a dropped connection."""
        return self.log.report_file_range_failure(path, exc)

    # ==== admin changes ================================================================================

    def delete_records(self, name: str, partition: int, offset: int) -> int:
        """Kafka DeleteRecords: raise the log start offset to `offset` (-1 = high watermark),
        durably; returns the new log start offset (the "low watermark")."""
        self._check_open()
        self.require(Feature.DELETE_RECORDS)
        return self.log.delete_records(self._partition(name, partition), offset)

    def bump_leader_epoch(self, name: str, partition: int, reason: str) -> int:
        """Start a new leader epoch at the partition's log end, durably (an operator accepted a
        loss; engine/epochs.py). Consumers past the log end then see a truncation. Returns it."""
        self._check_open()
        self.require(Feature.LEADER_EPOCH_BUMP)
        return self.log.bump_leader_epoch(self._partition(name, partition), reason)

    # ==== maintenance ===================================================================================

    def flush(self) -> None:
        """Make everything appended so far durable where it lives for good (single node: sealed
        into segments and recorded; cluster mode: in the bucket and committed)."""
        self._check_open()
        self.log.flush()

    def compact(self, topic: str | None = None, *, force: bool = True) -> int:
        """Compact (and merge) now, on the calling thread; returns how many rewrites were done."""
        self._check_open()
        self.require(Feature.COMPACTION)
        return self.log.compact(topic, force)

    def apply_retention(self) -> int:
        """Apply retention now (tools, tests); returns how many segments went."""
        self._check_open()
        self.require(Feature.RETENTION)
        return self.log.apply_retention()

    def relocate_due(self) -> int:
        """Relocate every due segment now, on this thread (tests, tools). Returns how many moved."""
        self._check_open()
        self.require(Feature.TIERING)
        return self.log.relocate_due()

    def wait_relocations(self, timeout_s: float = 30.0) -> bool:
        """Relocate what is due now and wait for it (tests and tools). True when nothing is left."""
        self._check_open()
        self.require(Feature.TIERING)
        return self.log.wait_relocations(timeout_s)

    def publish_metadata(self) -> bool:
        """Copy metadata changes into the stores now (Spark plans from that copy)."""
        return self.log.publish_metadata()

    def checkpoint_metadata(self) -> int:
        """Write a metadata checkpoint now (tools, tests); returns its seq."""
        self._check_open()
        return self.log.checkpoint_metadata()

    def set_cleaner_io_rate(self, bytes_per_s: int) -> None:
        """Change the cleaner's I/O bound (log.cleaner.io.max.bytes.per.second) at runtime."""
        self.log.set_cleaner_io_rate(bytes_per_s)

    @property
    def cleaner(self) -> Cleaner:
        """Compaction and merging (loglake.engine.cleaner): stats, and `run_once` to clean now."""
        self.require(Feature.COMPACTION)
        cleaner = self.log.cleaner
        if cleaner is None:
            raise EngineClosedError("engine is not open")
        return cleaner

    # ==== what metrics and /readyz show ==================================================================

    @property
    def memory_pool(self) -> MemoryPool:
        """The budget for unsealed data (producers wait for room; the broker throttles them)."""
        return self.log.memory_pool

    @property
    def shards(self) -> list[WalShard]:
        return self.log.shards

    @property
    def cold_reader(self) -> ColdReader | None:
        return self.log.cold_reader

    @property
    def scrubber(self) -> Scrubber | None:
        return self.log.scrubber

    @property
    def corruption(self) -> Corruption:
        return self.log.corruption

    @property
    def read_errors(self) -> ReadErrors:
        return self.log.read_errors


def _make_private(fs: FileSystem, data_dir: str) -> None:
    """The data directory and everything in it for the broker's user only (loglake.fs.modes).
    What loglake creates already is; this narrows what an earlier release left readable (0644
    files, 0755 directories), saying so in one line. Narrowing, not refusing as PostgreSQL does:
    an upgrade opens the previous release's data without a manual chmod, and taking bits away
    never keeps loglake from its own files."""
    narrowed = fs.make_private(data_dir)
    if narrowed.shared_root:
        log.warning(
            "data directory %s is a shared directory (sticky bit, as /tmp): file modes in it are left as they are, "
            "and other users may read what they allow; give loglake a directory of its own (docs/SECURITY.md, "
            "\"Files on disk\")",
            data_dir,
        )
    if narrowed.changed:
        path, mode = narrowed.changed[0]
        log.warning(
            "data directory %s was readable by other users: %d files and directories (e.g. %s, mode %03o) are now "
            "the broker's user's only (directories %03o, files %03o; docs/SECURITY.md, \"Files on disk\")",
            data_dir, len(narrowed.changed), path, mode, DIR_MODE, FILE_MODE,
        )
    if narrowed.left:
        log.warning(
            "data directory %s: %d entries other users may read could not be narrowed (another user's, e.g. %s): "
            "chmod go= them",
            data_dir, len(narrowed.left), narrowed.left[0],
        )


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
