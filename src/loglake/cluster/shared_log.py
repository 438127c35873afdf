"""Cluster mode's partition log: flush objects in the bucket, their ranges committed in etcd.

The `PartitionLog` (loglake.engine.partition_log) of `loglake serve --cluster`:

  * appends go to `ClusterPartitionLog` (durability class `object`: acknowledged once the flush
    object is in the bucket and its range committed in etcd under the leader's epoch), after the
    idempotent-producer rules every log applies (`ProducerStates.check_batches` /
    `record_batches`), only on the partition's leader (NotLeaderError elsewhere);
  * reads come from the committed data (memory, flush-object ranges, merged segments) on any
    broker, on a bounded pool, never on the caller's thread; the high watermark is the committed
    end in this broker's view;
  * there is no WAL, no sealer, no local segment: the data directory holds nothing that matters
    (a wiped one rejoins with nothing lost).

Leadership (which partitions this broker leads) is the cluster view's (loglake.cluster.view); it
calls `acquire` and `release` here. Idempotent producers' state is rebuilt at `acquire` from the
committed tail (loglake.cluster.producers) — Kafka's own approach after a leader change.
What this log does not offer yet is in `REFUSED`, the one table the engine refuses from.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import BinaryIO

from loglake.broker.settings import CLUSTER_UNREACHABLE_RELEASE_MS
from loglake.cluster.compact import compact as compact_partition
from loglake.cluster.etcd import EtcdMetaStore, Guard
from loglake.cluster.flusher import FlushSettings
from loglake.cluster.health import probe_prefix
from loglake.cluster.plog import AppendAck, ClusterPartitionLog, NotLeaderError
from loglake.cluster.plog_maint import advance_start, retention_start
from loglake.cluster.producers import rebuild_producers
from loglake.cluster.publish import ClusterMetaPublisher
from loglake.engine.catalog import Catalog, TopicState, new_cluster_id
from loglake.engine.cleaner import Cleaner
from loglake.engine.cleaner_job import CompactJob, JobResult, WorkerProcess, run_job
from loglake.engine.cold import ColdReader
from loglake.engine.config import EngineConfig, TopicConfig
from loglake.engine.corrupt import Corruption
from loglake.engine.epochs import end_offset_in, epoch_at
from loglake.engine.ioerrors import ReadErrors
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.partition_log import Batches, Feature, TierBytes, refusal
from loglake.engine.scrubber import Scrubber
from loglake.engine.txn import last_stable_offset
from loglake.engine.types import (
    AppendBuffer,
    AppendResult,
    FileRange,
    PartitionInfo,
    ReadResult,
    RecoveryReport,
)
from loglake.engine.verify import Progress, VerifyReport
from loglake.errors import (
    BackPressureTimeoutError,
    ConfigError,
    EngineClosedError,
    LoglakeError,
    MetaFencedError,
    OffsetOutOfRangeError,
)
from loglake.locks import Rank, ranked_lock
from loglake.meta.cluster import Plog, PlogRange, PlogSegment
from loglake.meta.lifecycle import Tier
from loglake.meta.producers import ProducerStates
from loglake.meta.records import Cluster, RecordKind
from loglake.meta.state import MetaState
from loglake.records.batch import BatchHeader, peek_header
from loglake.records.decode import iter_records
from loglake.store.base import ObjectStore
from loglake.wal.shard import WalShard

__all__ = ["INFLIGHT_PER_PARTITION_MAX", "READ_THREADS", "REFUSED", "SharedPartitionLog"]

log = logging.getLogger(__name__)

#: Threads reading the bucket for fetches (each read is one or a few ranged GETs).
READ_THREADS = 8
#: Key (under the cluster prefix) set by the broker that wrote the cluster id, so two brokers
#: starting together agree on one.
CLUSTER_ID_KEY = "cluster_id"
#: Idempotent batches remembered while in flight, per partition (a retry of one waits for it);
#: Kafka's clients keep at most 5 requests in flight per producer, so this covers 2,000 producers.
#: Past it an idempotent append is refused (REQUEST_TIMED_OUT, retriable), never taken untracked.
INFLIGHT_PER_PARTITION_MAX = 10_000
#: How long a cluster-id bootstrap waits for etcd.
COMMIT_WAIT_S = 60.0

#: What cluster mode does not offer yet, and why (docs/CLUSTER.md): the engine refuses these
#: with the feature's Kafka error code before this log is asked.
REFUSED: Mapping[Feature, str] = {
    Feature.TIERING: "cluster mode keeps every partition in the bucket: there is no tier to relocate to",
    Feature.LEADER_EPOCH_BUMP: "leader epochs move with leadership in cluster mode",
    Feature.LOCAL_SEGMENTS: "cluster mode keeps no segment files on a broker (they are in the bucket)",
}

TP = tuple[str, int]


@dataclass(frozen=True)
class ClusterSettings:
    """What a cluster broker needs beyond the single-node engine's settings."""

    url: str
    node_id: int
    rack: str | None = None
    lease_ttl_s: int = 3
    flush: FlushSettings = field(default_factory=FlushSettings)
    maintenance_interval_ms: int = 10_000
    #: etcd or the bucket unanswered this long: lead nothing (loglake.cluster.health)
    unreachable_release_ms: int = CLUSTER_UNREACHABLE_RELEASE_MS


class SharedPartitionLog:
    """The partitions of a cluster, over etcd and the bucket (see the module doc)."""

    refused: Mapping[Feature, str] = REFUSED

    def __init__(
        self,
        config: EngineConfig,
        settings: ClusterSettings,
        *,
        etcd: EtcdMetaStore,
        catalog: Catalog,
        bucket: Callable[[], ObjectStore],
        publishes: Callable[[], bool],
        bucket_url: str | None = None,
    ) -> None:
        """`bucket` opens the bucket (at `open`); `publishes` says whether this broker is the one
        that copies the metadata into the bucket now (the cluster view knows); `bucket_url`
        reopens the same bucket in a cleaner worker process (None: compaction's record work runs
        on the maintenance thread)."""
        self.config = config
        self.settings = settings
        self.etcd = etcd
        self.catalog = catalog
        self._open_bucket = bucket
        self._publishes = publishes
        self.corruption = Corruption()
        self.read_errors = ReadErrors()
        #: no unsealed buffers here: the flush buffer (what waits for the bucket) is the pool, so the
        #: broker routes an append that may wait for room off the event loop as in local mode
        self.memory_pool = MemoryPool(settings.flush.buffer_bytes_max, config.memory_pressure_ratio, lambda: None)
        self.bucket: ObjectStore | None = None
        self._plog: ClusterPartitionLog | None = None
        self.publisher: ClusterMetaPublisher | None = None
        self._reads = concurrent.futures.ThreadPoolExecutor(READ_THREADS, thread_name_prefix="loglake-cluster-read")
        #: partitions whose producer state is rebuilt after acquire: appends are taken
        self._ready: set[TP] = set()
        self._producers: dict[TP, ProducerStates] = {}
        #: (producer id, epoch, first sequence) -> the append in flight, per partition
        self._inflight: dict[TP, dict[tuple[int, int, int], Future[AppendAck]]] = {}
        self._ready_lock = ranked_lock(Rank.LEADERSHIP, "SharedPartitionLog._ready_lock")
        #: compaction's record work, off this process's interpreter lock (one pass at a time: the
        #: maintenance thread's); None until the first pass, and without a URL to reopen by
        self._bucket_url = bucket_url if config.cleaner_process else None
        self._cleaner_worker: WorkerProcess | None = None

    @property
    def plog(self) -> ClusterPartitionLog:
        if self._plog is None:
            raise EngineClosedError("engine is not open")
        return self._plog

    # ==== lifecycle ===============================================================================

    def open(self) -> RecoveryReport:
        try:
            self._open()
        except BaseException:
            self.etcd.close()
            if self.bucket is not None:
                self.bucket.close()
            raise
        report = RecoveryReport()
        report.topics = len(self.catalog.all_topics())
        log.info(
            "cluster %s (node %d): %d topics in etcd %s, metadata seq %d",
            self.catalog.cluster_id,
            self.settings.node_id,
            report.topics,
            self.settings.url,
            self.etcd.last_seq,
        )
        return report

    def _open(self) -> None:
        self.etcd.open()
        if not self.etcd.read(lambda s: s.cluster_id):
            cid = new_cluster_id()
            try:
                self.etcd.append_if(
                    Cluster(cid),
                    [Guard(CLUSTER_ID_KEY, mod_revision=0)],
                    {CLUSTER_ID_KEY: cid.encode()},
                ).result(COMMIT_WAIT_S)
            except MetaFencedError:
                self.etcd.sync()  # another broker wrote it first: take theirs
        self.bucket = bucket = self._open_bucket()
        _probe_bucket(bucket, self.catalog.cluster_id)
        self._plog = ClusterPartitionLog(
            self.etcd,
            bucket,
            cluster_id=self.catalog.cluster_id,
            node_id=self.settings.node_id,
            settings=self.settings.flush,
            pool=self.memory_pool,
        )
        self.etcd.watch(self._on_record)
        self.catalog.refresh(force=True)
        for _topic, p in self.catalog.partitions():
            p.set_hw(self.plog_of(p.topic_id.hex(), p.index).end)
        # the bucket's copy of the metadata, for Spark (the lowest live node id publishes)
        self.publisher = ClusterMetaPublisher(self.etcd, bucket, self._publishes)
        self.publisher.start()

    def close(self) -> None:
        try:
            if self.publisher is not None:
                self.publisher.stop()
            if self._plog is not None:
                self._plog.close()
            if self._cleaner_worker is not None:
                self._cleaner_worker.close()
        finally:
            self._reads.shutdown(wait=False, cancel_futures=True)
            self.etcd.close()
            self.etcd.client.close()
            for _topic, p in self.catalog.partitions():
                p.wake_all()
            if self.bucket is not None:
                self.bucket.close()

    @property
    def failure(self) -> BaseException | None:
        return self.etcd.failure

    def wake(self) -> None:
        return None  # merges and sweeps run on their own interval (loglake.cluster.view)

    # ==== record watcher (runs under the store's lock: no I/O, no other lock but hw_cond) ==========

    def _on_record(self, seq: int, kind: RecordKind, body: dict[str, object], raw: bytes) -> None:
        if kind != RecordKind.PLOG_COMMIT:
            return
        rows = body["ranges"]
        assert isinstance(rows, list)
        for row in rows:
            tid, p, last = bytes.fromhex(str(row[0])), int(row[1]), int(row[4])
            topic = self.catalog.by_id.get(tid)  # the map as it is: a rebuild would take the store's lock
            if topic is not None and 0 <= p < len(topic.partitions):
                topic.partitions[p].advance_hw(last + 1)

    # ==== leadership (called by the cluster view, on its thread) ====================================

    def acquire(self, topic_id: str, partition: int) -> int:
        """Lead the partition: bump its epoch (MetaFencedError when another broker won), rebuild
        its producers' state from the committed tail, then take appends."""
        tp = (topic_id, partition)
        with self._ready_lock:
            self._ready.discard(tp)
        plog = self.plog
        epoch = plog.acquire(topic_id, partition)
        states = rebuild_producers(
            lambda off, n: plog.read(topic_id, partition, off, n), self.plog_of(topic_id, partition)
        )
        with self._ready_lock:
            self._producers[tp] = states
            self._inflight[tp] = {}
            self._ready.add(tp)
        return epoch

    def release(self, topic_id: str, partition: int) -> None:
        tp = (topic_id, partition)
        with self._ready_lock:
            self._ready.discard(tp)
            self._producers.pop(tp, None)
            self._inflight.pop(tp, None)
        self.plog.release(topic_id, partition)

    def abandon(self, topic_id: str, partition: int) -> int:
        """Stop leading the partition at once: appends are refused and those not committed yet fail
        now (NOT_LEADER_OR_FOLLOWER, so clients go to the next leader) instead of when their flush
        settles; `release` still follows. Returns how many appends failed."""
        with self._ready_lock:
            self._ready.discard((topic_id, partition))
        plog = self._plog
        return 0 if plog is None else plog.abandon(topic_id, partition)

    def leads(self, topic_id: str, partition: int) -> bool:
        """Whether this broker leads the partition: acquired, not stopped, and its epoch is still
        the partition's in the shared state — another broker's later acquire (its view of the live
        set differed for a moment) shows there first, before any commit of ours is fenced."""
        with self._ready_lock:
            ready = (topic_id, partition) in self._ready
        plog = self._plog
        if not ready or plog is None or not plog.leads(topic_id, partition):
            return False
        tid = bytes.fromhex(topic_id)

        def epoch(s: MetaState) -> int:
            pl = s.plogs.parts.get((tid, partition))
            return pl.epoch if pl is not None else 0

        return plog.epoch_of(topic_id, partition) == self.etcd.read(epoch)

    def plog_of(self, topic_id: str, partition: int) -> Plog:
        """A copy of the partition's committed state (epoch, leader, end, segments, ranges, start)."""
        tid = bytes.fromhex(topic_id)

        def copy(s: MetaState) -> Plog:
            pl = s.plogs.parts.get((tid, partition))
            if pl is None:
                return Plog()
            return Plog(pl.epoch, pl.leader, pl.end, list(pl.segments), list(pl.ranges), pl.start)

        return self.etcd.read(copy)

    def _log_start(self, topic_id: str, partition: int) -> int:
        tid = bytes.fromhex(topic_id)

        def start(s: MetaState) -> int:
            pl = s.plogs.parts.get((tid, partition))
            return pl.log_start if pl is not None else 0

        return self.etcd.read(start)

    # ==== appends ==================================================================================

    def append(
        self, p: Partition, config: TopicConfig, buf: AppendBuffer, batches: Batches, *, produced: bool = True
    ) -> Future[AppendResult]:
        """Produce in durability class `object`: NotLeaderError unless this broker leads the
        partition; the future resolves once the batches' range is committed (module doc)."""
        plog = self.plog
        tid = p.topic_id.hex()
        tp = (tid, p.index)
        heads = [h for _, h in batches]
        # p.lock orders the partition's appends (offsets, producer state); the in-flight map is
        # under _ready_lock alone, because `done` runs on the flusher's thread, which must never
        # wait for p.lock: an append holding it may be waiting for the room that thread frees.
        with p.lock:
            with self._ready_lock:
                states = self._producers.get(tp) if tp in self._ready else None
                inflight = self._inflight.setdefault(tp, {})
            if states is None or not self.leads(tid, p.index):
                raise NotLeaderError(f"node {self.settings.node_id} does not lead {p.topic}-{p.index}")
            dup = states.check_batches(heads)
            keys = _idempotent_keys(heads)
            if dup is not None:
                with self._ready_lock:
                    original = next((inflight[k] for k in keys if k in inflight), None)
                return self._answer_duplicate(original, p, tid, dup)
            with self._ready_lock:
                crowded = len(inflight) + len(keys) > INFLIGHT_PER_PARTITION_MAX
            if keys and crowded:
                # Untracked, a retry of this batch arriving while it is in flight would be
                # answered as a duplicate at once, before the original is durable: refused
                # instead, before any offset is assigned, so the producer's retry appends it.
                raise BackPressureTimeoutError(
                    f"{p.topic}-{p.index}: {INFLIGHT_PER_PARTITION_MAX} idempotent batches in flight "
                    "(INFLIGHT_PER_PARTITION_MAX); retry"
                )
            stamp = int(time.time() * 1000) if config.log_append_time else -1
            base, inner = plog.append_assigned(tid, p.index, buf, stamp)
            # Recorded at once (as the local log does), so that a retry arriving while this
            # append is in flight is answered as a duplicate rather than appended again. Only
            # appends (under p.lock) add keys, so the room checked above is still there.
            states.record_batches(heads, base)
            with self._ready_lock:
                for key in keys:
                    inflight[key] = inner
        out: Future[AppendResult] = Future()

        def done(f: Future[AppendAck]) -> None:
            with self._ready_lock:
                for key in keys:
                    if inflight.get(key) is f:
                        del inflight[key]
            error = f.exception()
            if error is not None:
                out.set_exception(error)
                return
            ack = f.result()
            out.set_result(
                AppendResult(p.topic, p.index, ack.base_offset, ack.last_offset, stamp, self._log_start(tid, p.index))
            )

        inner.add_done_callback(done)
        return out

    def _answer_duplicate(
        self, original: Future[AppendAck] | None, p: Partition, tid: str, dup: tuple[int, int]
    ) -> Future[AppendResult]:
        """A retried batch: answered with its first offsets. Still in flight: once the original
        settles (its failure is the retry's too). Settled: it was committed — a failed one would
        have stopped the partition, and `leads` refused this append before the check."""
        result = AppendResult(p.topic, p.index, dup[0], dup[1], -1, self._log_start(tid, p.index))
        out: Future[AppendResult] = Future()
        if original is None:
            out.set_result(result)
            return out

        def done(f: Future[AppendAck]) -> None:
            error = f.exception()
            if error is not None:
                out.set_exception(error)
            else:
                out.set_result(result)

        original.add_done_callback(done)
        return out

    # ==== reads (committed data only, on any broker) ==================================================

    def read(self, p: Partition, offset: int, max_bytes: int, *, file_ranges: bool, min_one: bool) -> ReadResult:
        tid = p.topic_id.hex()
        pl = self.plog_of(tid, p.index)
        start = self._log_start(tid, p.index)
        try:
            data = self.plog.read(tid, p.index, offset, max_bytes)
        except OffsetOutOfRangeError as exc:
            raise OffsetOutOfRangeError(str(exc), log_start_offset=start, high_watermark=pl.end) from None
        if data and not min_one and len(data) > max_bytes:
            data = b""
        p.advance_hw(pl.end)  # a partition created after a commit this broker applied catches up here
        return ReadResult([data] if data else [], max(pl.end, offset if data else 0), start)

    def read_async(
        self, p: Partition, offset: int, max_bytes: int, *, file_ranges: bool, min_one: bool
    ) -> Future[ReadResult]:
        try:
            return self._reads.submit(self.read, p, offset, max_bytes, file_ranges=False, min_one=min_one)
        except RuntimeError:  # the pool is shut down: the engine closes while a Fetch is handled
            raise EngineClosedError(f"node closing: read of {p.topic}-{p.index} refused") from None

    def wait_for_data(self, p: Partition, offset: int) -> Future[None]:
        p.advance_hw(self.plog_of(p.topic_id.hex(), p.index).end)
        return p.wait_for(offset)

    def _scan(self, p: Partition, start: int) -> Iterator[tuple[BatchHeader, memoryview]]:
        """(header, batch view) of committed batches from `start` on."""
        tid = p.topic_id.hex()
        offset = start
        while True:
            data = self.plog.read(tid, p.index, offset, 1 << 20)
            if not data:
                return
            view = memoryview(data)
            pos = 0
            while pos < len(view):
                h = peek_header(view, pos)
                yield h, view[pos : pos + h.size]
                pos += h.size
                offset = h.last_offset + 1

    def offset_for_timestamp(self, p: Partition, timestamp_ms: int) -> tuple[int, int] | None:
        """ListOffsets by time: the first record at or after `timestamp_ms` from the log start
        on; the metadata's per-range and per-segment max timestamps skip what cannot hold it."""
        pl = self.plog_of(p.topic_id.hex(), p.index)
        start = pl.log_start
        sources: list[PlogSegment | PlogRange] = [*pl.segments, *pl.ranges]
        first = next((s for s in sources if s.max_ts >= timestamp_ms and s.last >= start), None)
        if first is None:
            return None
        for h, view in self._scan(p, max(first.base, start)):
            if h.max_timestamp < timestamp_ms or h.is_control:
                continue
            for rec in iter_records(view):
                if rec.timestamp >= timestamp_ms and rec.offset >= start:
                    return rec.offset, rec.timestamp
        return None

    def max_timestamp(self, p: Partition) -> tuple[int, int] | None:
        pl = self.plog_of(p.topic_id.hex(), p.index)
        start = pl.log_start
        every: list[PlogSegment | PlogRange] = [*pl.segments, *pl.ranges]
        sources = [s for s in every if s.last >= start]
        if not sources:
            return None
        best = max(sources, key=lambda s: s.max_ts)
        found: tuple[int, int] | None = None
        for h, view in self._scan(p, max(best.base, start)):
            if h.base_offset > best.last:
                break
            for rec in iter_records(view):
                if rec.offset >= start and (found is None or rec.timestamp > found[1]):
                    found = (rec.offset, rec.timestamp)
        return found

    def info(self, p: Partition, compacted: bool) -> PartitionInfo:
        tid = p.topic_id.hex()
        pl = self.plog_of(tid, p.index)
        start = self._log_start(tid, p.index)
        sealed = sum(s.size for s in pl.segments)
        key = (p.topic_id, p.index)
        clean_end = self.etcd.read(lambda s: pm.clean_end if (pm := s.partitions.get(key)) is not None else 0)
        # as a single node's: the share of the merged (sealed) bytes past the compaction's clean end
        dirty = sum(s.size for s in pl.segments if s.last >= clean_end) / sealed if compacted and sealed else 0.0
        lso = last_stable_offset(p, pl.end)  # open transactions: the metadata's, as on every broker
        return PartitionInfo(
            p.topic, p.index, start, pl.end, pl.end, pl.end, len(pl.segments), sealed, 0, clean_end, dirty, pl.epoch, lso
        )

    def tier_bytes(self, p: Partition) -> TierBytes:
        """Everything is in the bucket; nothing of it is on this broker's disk."""
        pl = self.plog_of(p.topic_id.hex(), p.index)
        return TierBytes(0, sum(s.size for s in pl.segments) + sum(r.length for r in pl.ranges), 0)

    @property
    def cold_url(self) -> str | None:
        return self.bucket.url if self.bucket is not None else None

    def _epochs(self, p: Partition) -> tuple[int, int, list[list[int]] | None]:
        """(current epoch, committed end, epoch history) at one moment of this broker's view; the
        history is None when it does not reach the current epoch (a checkpoint of a release that
        kept none for cluster partitions, until the next leadership change)."""
        key = (p.topic_id, p.index)

        def read(s: MetaState) -> tuple[int, int, list[list[int]] | None]:
            pl = s.plogs.parts.get(key)
            pm = s.partitions.get(key)
            epoch, end = (pl.epoch, pl.end) if pl is not None else (0, 0)
            history = [list(e) for e in pm.epoch_history()] if pm is not None else [[0, 0]]
            return epoch, end, history if history[-1][0] == epoch else None

        return self.etcd.read(read)

    def leader_epoch(self, p: Partition, offset: int | None) -> int:
        """The partition's current leader epoch, or the epoch that wrote `offset` (by the epoch
        history each `plog_leader` extends)."""
        epoch, _end, history = self._epochs(p)
        return epoch if offset is None or history is None else epoch_at(history, offset)

    def epoch_end_offset(self, p: Partition, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch by Kafka's rule over the partition's epoch history: the current
        epoch ends at the committed end, an older one where the next epoch that wrote data began.
        Without a history (see `_epochs`) any epoch up to the current one ends at the committed end:
        committed data is never truncated in cluster mode, so that is never below a consumer's
        position."""
        current, end, history = self._epochs(p)
        if history is None:
            return (-1, -1) if epoch > current else (epoch, end)
        return end_offset_in(history, end, epoch)

    def producer_states(self, p: Partition) -> list[tuple[int, int, int, int]]:
        """The partition's idempotent producers as its leader knows them (rebuilt from the
        committed tail at acquire); NotLeaderError on another broker, whose clients ask the leader."""
        tp = (p.topic_id.hex(), p.index)
        with p.lock:
            with self._ready_lock:
                states = self._producers.get(tp) if tp in self._ready else None
            if states is None:
                raise NotLeaderError(f"node {self.settings.node_id} does not lead {p.topic}-{p.index}")
            return states.describe()

    def open_file_range(self, chunk: FileRange) -> BinaryIO:
        raise refusal(REFUSED, Feature.LOCAL_SEGMENTS)  # this log never hands out file ranges

    def report_file_range_failure(self, path: str, exc: OSError) -> bool:
        return False  # this log never hands out file ranges

    # ==== changes =======================================================================================

    def topic_deleted(self, topic: TopicState) -> None:
        log.info("topic %s: its flush objects and merged segments are swept after the grace", topic.name)

    def delete_records(self, p: Partition, offset: int) -> int:
        """Kafka DeleteRecords on the partition's leader (NotLeaderError elsewhere): its log
        start is raised by a `plog_start` record fenced by the leader's epoch, durable in etcd
        on return; every broker's reads below it fail from then on (plog_maint.advance_start)."""
        tid = p.topic_id.hex()
        if not self.leads(tid, p.index):
            raise NotLeaderError(f"node {self.settings.node_id} does not lead {p.topic}-{p.index}")
        start = advance_start(self.plog, tid, p.index, offset)
        p.wake_all()  # long-polling fetches below the new start answer now
        return start

    def bump_leader_epoch(self, p: Partition, reason: str) -> int:
        raise refusal(REFUSED, Feature.LEADER_EPOCH_BUMP)

    def segments(self, p: Partition) -> list[SegmentRef]:
        raise refusal(REFUSED, Feature.LOCAL_SEGMENTS)

    # ==== maintenance ===================================================================================

    def flush(self) -> None:
        self.plog.flusher.flush(60)

    def compact(self, topic: str | None, force: bool) -> int:
        """One compaction pass of each compacted partition this broker leads (of `topic`, or of
        every topic) that is due, or has anything dirty when `force`d (loglake.cluster.compact:
        the leader rewrites merged segments, fenced by its epoch). Returns the passes done; a
        partition that fails is logged and retried at the next round."""
        with self._ready_lock:
            led = sorted(self._ready)
        done = 0
        for tid, index in led:
            t = self.catalog.topic_by_id(bytes.fromhex(tid))
            if t is None or not t.config.compacted or (topic is not None and t.name != topic):
                continue
            with t.partitions[index].lock, self._ready_lock:  # appends change the producers under both
                states = self._producers.get((tid, index))
                retain = states.last_batches() if states is not None else set()
            try:
                if compact_partition(
                    self.plog, tid, index, t.name, t.config, dedupe_bytes=self.config.cleaner_dedupe_buffer_bytes,
                    retain_empty=retain, force=force, io_bytes_per_s=self.config.cleaner_io_max_bytes_per_second,
                    execute=self._compaction_job,
                ) is not None:  # fmt: skip
                    done += 1
            except LoglakeError as exc:
                log.warning("compaction of %s-%d: %s (next round)", t.name, index, exc)
        return done

    def _compaction_job(self, job: CompactJob) -> JobResult:
        """A compaction job's rewrite in a cleaner worker process, which reopens the bucket by
        its URL; on the calling thread when there is none to reopen it by."""
        if self._bucket_url is None:
            assert self.bucket is not None
            return run_job(job, {Tier.COLD: self.bucket})
        job.store_urls = {Tier.COLD: self._bucket_url}
        if self._cleaner_worker is None:
            self._cleaner_worker = WorkerProcess()
        return self._cleaner_worker.call(job)

    def apply_retention(self) -> int:
        """Retention of the partitions this broker leads: each one's log start is raised past
        the whole merged segments and flush ranges beyond retention.ms / retention.bytes
        (plog_maint.retention_start), fenced as DeleteRecords is; the sweep deletes them after
        its grace. Returns how many merged segments and flush ranges went (the leader's
        maintenance round runs this; a partition that fails is retried at the next round)."""
        now_ms = int(time.time() * 1000)
        with self._ready_lock:
            led = sorted(self._ready)
        dropped = 0
        for tid, index in led:
            topic = self.catalog.topic_by_id(bytes.fromhex(tid))
            if topic is None or not self.leads(tid, index):
                continue
            current = self.plog_of(tid, index)
            target = retention_start(current, topic.config, now_ms)
            if target is None:
                continue
            try:
                advance_start(self.plog, tid, index, target)
            except LoglakeError as exc:
                log.info("retention of %s-%d: %s (next round)", topic.name, index, exc)
                continue
            dropped += sum(1 for seg in current.segments if seg.last < target)
            dropped += sum(1 for r in current.ranges if r.last < target)
        return dropped

    def relocate_due(self) -> int:
        raise refusal(REFUSED, Feature.TIERING)

    def wait_relocations(self, timeout_s: float) -> bool:
        raise refusal(REFUSED, Feature.TIERING)

    def publish_metadata(self) -> bool:
        """Copy the state into the bucket now, when this broker is the one that publishes."""
        return self.publisher.publish_once() if self.publisher is not None else False

    def checkpoint_metadata(self) -> int:
        seq = self.etcd.checkpoint()
        return -1 if seq is None else seq

    def set_cleaner_io_rate(self, bytes_per_s: int) -> None:
        self.config.cleaner_io_max_bytes_per_second = bytes_per_s  # kept for DescribeConfigs; no cleaner here

    def verify(self, progress: Progress | None) -> VerifyReport:
        raise refusal(REFUSED, Feature.LOCAL_SEGMENTS)

    # ==== what metrics show =============================================================================

    @property
    def shards(self) -> list[WalShard]:
        return []

    @property
    def cold_reader(self) -> ColdReader | None:
        return None

    @property
    def cleaner(self) -> Cleaner | None:
        return None

    @property
    def scrubber(self) -> Scrubber | None:
        return None  # merged segments are checked against their CRC at every read


def _idempotent_keys(heads: list[BatchHeader]) -> list[tuple[int, int, int]]:
    return [
        (h.producer_id, h.producer_epoch, h.base_sequence) for h in heads if h.producer_id >= 0 and h.base_sequence >= 0
    ]


def _probe_bucket(bucket: ObjectStore, cluster_id: str) -> None:
    """One LIST of a prefix nothing uses: a bucket that does not exist stops the start with one
    line (every flush would fail otherwise, and nothing could be acknowledged); a bucket that does
    not answer now is only a warning (an outage heals): the broker does not stand for leadership
    until it answers (loglake.cluster.health)."""
    try:
        bucket.list(probe_prefix(cluster_id))
    except LoglakeError as exc:
        if getattr(exc, "code", None) == "NoSuchBucket":
            raise ConfigError(
                f"cluster mode: the cold store {bucket.url} has no bucket (NoSuchBucket); create it first"
            ) from exc
        log.warning(
            "cluster mode: the cold store %s did not answer at start (%s); this broker leads no partition until it does",
            bucket.url,
            exc,
        )
