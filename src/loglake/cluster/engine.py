"""The cluster engine: the broker's `Engine` seam over etcd, the bucket and the partition log.

`loglake serve --cluster` runs the same broker, handlers and group coordinator as the single-node
mode; only the engine differs. `ClusterEngine` keeps the single-node engine's topic, group,
config, ACL and quota calls (the mixins over `Catalog`) — they all go through metadata records,
which here live in etcd (`EtcdMetaStore`, via `ClusterCatalog`) — and replaces the data path:

  * appends go to `ClusterPartitionLog` (durability class `object`: acknowledged once the flush
    object is in the bucket and its range committed in etcd under the leader's epoch), after the
    idempotent-producer checks of loglake.cluster.producers;
  * reads come from the partition log's committed data (memory, flush-object ranges, merged
    segments) on any broker; the high watermark is the committed end in this broker's view;
  * there is no WAL, no sealer, no local segment and no maintenance thread: the data directory
    holds nothing that matters (a wiped one rejoins with nothing lost).

Leadership (which partitions this broker leads) is `loglake.cluster.leadership.Leadership`,
started by `join` once the listeners are bound (they are what the registration advertises).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

from loglake import canary
from loglake.cluster.engine_read import ClusterReadsMixin
from loglake.cluster.flusher import FlushSettings
from loglake.cluster.plog import AppendAck, ClusterPartitionLog, NotLeaderError
from loglake.cluster.producers import rebuild_producers
from loglake.engine.catalog import Catalog
from loglake.engine.compacted import check_batches
from loglake.engine.config import EngineConfig
from loglake.engine.corrupt import Corruption
from loglake.engine.engine import Engine
from loglake.engine.ioerrors import ReadErrors
from loglake.engine.memory import MemoryPool
from loglake.engine.space import SpaceGuard
from loglake.engine.types import AppendResult, RecoveryReport
from loglake.errors import (
    ClusterUnsupportedError,
    ConfigError,
    CorruptRecordError,
    EngineClosedError,
    LoglakeError,
    MetaFencedError,
    UnknownTopicError,
)
from loglake.fs.os_fs import OsFileSystem
from loglake.meta.etcd import EtcdMetaStore, Guard
from loglake.meta.etcd_client import EtcdClient, parse_cluster_url
from loglake.meta.lock import DataDirLock
from loglake.meta.log import LocalMetaStore
from loglake.meta.producers import ProducerStates
from loglake.meta.state import MetaState
from loglake.records.batch import split_batches
from loglake.store.base import ObjectStore

if TYPE_CHECKING:
    from loglake.broker.config import BrokerConfig

__all__ = ["READ_THREADS", "ClusterEngine", "ClusterSettings"]

log = logging.getLogger(__name__)

#: Threads reading the bucket for fetches (each read is one or a few ranged GETs).
READ_THREADS = 8
#: Key (under the cluster prefix) set by the broker that wrote the cluster id, so two brokers
#: starting together agree on one.
CLUSTER_ID_KEY = "cluster_id"
#: Idempotent batches remembered while in flight, per partition (a retry of one waits for it);
#: Kafka's clients keep at most 5 requests in flight per producer, so this covers 2,000 producers.
INFLIGHT_PER_PARTITION_MAX = 10_000


class ClusterSettings:
    """What a cluster broker needs beyond the single-node engine's settings."""

    def __init__(
        self,
        url: str,
        node_id: int,
        *,
        rack: str | None = None,
        lease_ttl_s: int = 3,
        object_flush_bytes: int = 4 * 1024 * 1024,
        object_flush_ms: int = 500,
        maintenance_interval_ms: int = 10_000,
    ) -> None:
        self.url = url
        self.endpoints, self.prefix = parse_cluster_url(url)
        self.node_id = node_id
        self.rack = rack
        self.lease_ttl_s = lease_ttl_s
        self.flush = FlushSettings(object_flush_bytes=object_flush_bytes, object_flush_ms=object_flush_ms)
        self.maintenance_interval_ms = maintenance_interval_ms


class ClusterEngine(ClusterReadsMixin, Engine):
    """The Engine of a cluster broker (see the module doc). Calls the single-node engine makes on
    local segments, the WAL or transactions are refused with ClusterUnsupportedError."""

    def __init__(
        self,
        data_dir: str,
        config: EngineConfig,
        cluster: ClusterSettings,
        *,
        store: ObjectStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # Deliberately not Engine.__init__: no local metadata log, WAL or segment store is made.
        self.data_dir = os.path.abspath(data_dir)
        self.config = config
        self.config.validate()
        self.fs = OsFileSystem()
        self._clock = clock
        self._given_store = store
        self._given_cold_store = store
        self._start_background = True
        self.cluster = cluster
        self.space = SpaceGuard(
            self.fs,
            self.data_dir,
            min_free_bytes=0,
            min_free_percent=0.0,
            check_interval_ms=self.config.storage_space_check_interval_ms,
        )
        self.client = EtcdClient(",".join(f"{h}:{p}" for h, p in cluster.endpoints))
        self.etcd = EtcdMetaStore(self.client, cluster.prefix)
        # The inherited mixins reach the store as `_meta` / `catalog.meta`; it is the etcd one.
        self._meta = cast(LocalMetaStore, self.etcd)
        self.catalog = Catalog(self.etcd, self.config, clock)
        self._pool = MemoryPool(
            self.config.memory_budget_bytes, self.config.memory_pressure_ratio, lambda: None
        )
        self._dir_lock = DataDirLock(self.fs, self.data_dir)
        self._shards = []
        self._retired_shards = []
        self._stores = None
        self._relocator = None
        self._cleaner = None
        self._publisher = None
        self._maintenance = None
        self._sealer = None
        self._appender = None
        self._reader = None
        self.corruption = Corruption()
        self.read_errors = ReadErrors()
        self.scrubber = None
        self._closed = True
        self.recovery_report = None
        self.bucket: ObjectStore | None = None
        self.plog: ClusterPartitionLog | None = None
        self.leadership: Any = None  # loglake.cluster.leadership.Leadership, made by join()
        self.publisher: Any = None  # loglake.cluster.publish.ClusterMetaPublisher, made by join()
        self._reads = concurrent.futures.ThreadPoolExecutor(
            READ_THREADS, thread_name_prefix="loglake-cluster-read"
        )
        #: partitions whose producer state is rebuilt after acquire: appends are taken
        self._ready: set[tuple[str, int]] = set()
        self._producers: dict[tuple[str, int], ProducerStates] = {}
        #: (producer id, epoch, first sequence) -> the append in flight, per partition
        self._inflight: dict[tuple[str, int], dict[tuple[int, int, int], Future[AppendAck]]] = {}
        self._ready_lock = threading.Lock()

    @classmethod
    def from_config(cls, c: BrokerConfig) -> ClusterEngine:
        """The engine of `serve --cluster` from the broker's settings (cluster, node_id, ...)."""
        assert c.cluster is not None
        settings = ClusterSettings(
            c.cluster,
            c.node_id,
            rack=c.rack,
            lease_ttl_s=c.cluster_lease_ttl_s,
            object_flush_bytes=c.object_flush_bytes,
            object_flush_ms=c.object_flush_ms,
            maintenance_interval_ms=c.cluster_maintenance_interval_ms,
        )
        return cls(c.data_dir, c.engine_config(), settings)

    # ==== lifecycle ==============================================================================

    @property
    def cold_store(self) -> ObjectStore | None:
        return self.bucket

    def open(self) -> RecoveryReport:
        canary.warn_if_active()
        self.fs.makedirs(self.data_dir)
        self._dir_lock.acquire()
        try:
            self._open_parts_cluster()
        except BaseException:
            self.etcd.close()
            if self.bucket is not None:
                self.bucket.close()
            self._dir_lock.release()
            raise
        self._closed = False
        report = RecoveryReport()
        report.topics = len(self.catalog.topics)
        self.recovery_report = report
        log.info(
            "cluster %s (node %d): %d topics in etcd %s, metadata seq %d",
            self.cluster_id,
            self.cluster.node_id,
            report.topics,
            self.cluster.url,
            self.etcd.last_seq,
        )
        return report

    def _open_parts_cluster(self) -> None:
        from loglake.store import open_store

        self.etcd.open()
        if not self.etcd.read(lambda s: s.cluster_id):
            from loglake.engine.catalog import new_cluster_id

            cid = new_cluster_id()
            try:
                self.etcd.append_if(
                    "cluster",
                    {"cluster_id": cid},
                    [Guard(CLUSTER_ID_KEY, mod_revision=0)],
                    {CLUSTER_ID_KEY: cid.encode()},
                ).result(60)
            except MetaFencedError:
                self.etcd.sync()  # another broker wrote it first: take theirs
        url = self.config.cold_store_url
        if self._given_store is None and not url:
            raise ConfigError(
                "cluster mode needs a cold store (--cold-store): the bucket holds every partition"
            )
        self.bucket = self._given_store or open_store(str(url), self.fs)
        _probe_bucket(self.bucket, self.cluster_id)
        self.plog = ClusterPartitionLog(
            self.etcd,
            self.bucket,
            cluster_id=self.cluster_id,
            node_id=self.cluster.node_id,
            settings=self.cluster.flush,
        )
        self.etcd.watch(self._on_record)
        self.catalog.refresh(force=True)
        for _topic, p in self.catalog.partitions():
            p.set_hw(self._plog_of(p.topic_id.hex(), p.index).end)

    def join(self, listeners: list[str]) -> None:
        """Register in the cluster under a lease, advertising `listeners` (PROTOCOL://HOST:PORT),
        and start leading what the assignment gives this broker."""
        from loglake.cluster.leadership import Leadership

        assert self.plog is not None
        self.leadership = Leadership(self, listeners)
        self.leadership.start()
        from loglake.cluster.publish import start_publisher

        self.publisher = start_publisher(self)  # the bucket's copy of the metadata, for Spark

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.publisher is not None:
                self.publisher.stop()
            if self.leadership is not None:
                self.leadership.stop()
            if self.plog is not None:
                self.plog.close()
        finally:
            self._reads.shutdown(wait=False, cancel_futures=True)
            self.etcd.close()
            self.client.close()
            for _topic, p in self.catalog.partitions():
                p.wake_all()
            if self.bucket is not None:
                self.bucket.close()
            self._dir_lock.release()

    @property
    def _failure(self) -> BaseException | None:
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("engine is closed")

    # ==== record watcher (runs under the store's lock: no I/O, no other lock but hw_cond) ==========

    def _on_record(self, seq: int, kind: str, body: dict[str, Any], raw: bytes) -> None:
        if kind != "plog_commit":
            return
        for row in body["ranges"]:
            tid, p, last = bytes.fromhex(str(row[0])), int(row[1]), int(row[4])
            topic = self.catalog.by_id.get(tid)  # under the store's lock: the map as it is, no rebuild
            if topic is not None and 0 <= p < len(topic.partitions):
                topic.partitions[p].advance_hw(last + 1)

    # ==== leadership hooks (called by Leadership, on its thread) ====================================

    def acquire(self, topic_id: str, partition: int) -> int:
        """Lead the partition: bump its epoch (MetaFencedError when another broker won), rebuild
        its producers' state from the committed tail, then take appends."""
        assert self.plog is not None
        tp = (topic_id, partition)
        with self._ready_lock:
            self._ready.discard(tp)
        epoch = self.plog.acquire(topic_id, partition)
        plog = self._plog_of(topic_id, partition)
        states = rebuild_producers(
            lambda off, n: self.plog.read(topic_id, partition, off, n) if self.plog else b"", plog
        )
        with self._ready_lock:
            self._producers[tp] = states
            self._inflight[tp] = {}
            self._ready.add(tp)
        return epoch

    def release(self, topic_id: str, partition: int) -> None:
        assert self.plog is not None
        tp = (topic_id, partition)
        with self._ready_lock:
            self._ready.discard(tp)
            self._producers.pop(tp, None)
            self._inflight.pop(tp, None)
        self.plog.release(topic_id, partition)

    def leads(self, topic_id: str, partition: int) -> bool:
        """Whether this broker leads the partition: acquired, not stopped, and its epoch is still
        the partition's in the shared state — another broker's later acquire (its view of the live
        set differed for a moment) shows there first, before any commit of ours is fenced."""
        with self._ready_lock:
            ready = (topic_id, partition) in self._ready
        if not ready or self.plog is None or not self.plog.leads(topic_id, partition):
            return False
        tid = bytes.fromhex(topic_id)

        def epoch(s: MetaState) -> int:
            pl = s.plogs.parts.get((tid, partition))
            return pl.epoch if pl is not None else 0

        return bool(self.plog.epoch_of(topic_id, partition) == self.etcd.read(epoch))

    # ==== appends ==================================================================================

    def append_batch(self, topic: str, partition: int, data: bytes | bytearray) -> Future[AppendResult]:
        """Produce in durability class `object`: NotLeaderError unless this broker leads the
        partition; the future resolves once the batches' range is committed (module doc)."""
        self._check_open()
        assert self.plog is not None
        p = self.catalog.partition(topic, partition)
        config = self.catalog.topic(topic).config
        tid = p.topic_id.hex()
        tp = (tid, partition)
        batches = split_batches(data, max_batch_bytes=config.max_message_bytes)
        if not batches:
            raise CorruptRecordError(f"append to {topic}-{partition}: no record batch in {len(data)} bytes")
        if config.compacted:
            check_batches(topic, partition, data, batches)
        with p.lock:
            with self._ready_lock:
                states = self._producers.get(tp) if tp in self._ready else None
                inflight = self._inflight.setdefault(tp, {})
            if states is None or not self.leads(tid, partition):
                raise NotLeaderError(f"node {self.cluster.node_id} does not lead {topic}-{partition}")
            for _pos, h in batches:
                if h.producer_id >= 0 and h.base_sequence >= 0:
                    dup = states.check(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count)
                    if dup is not None:
                        return self._answer_duplicate(
                            inflight.get((h.producer_id, h.producer_epoch, h.base_sequence)),
                            topic,
                            partition,
                            tid,
                            dup,
                        )
            base, inner = self.plog.append_assigned(tid, partition, data)
            # Recorded at once (as the single-node appender does), so that a retry arriving while
            # this append is in flight is answered as a duplicate rather than appended again.
            offset = base
            keys = []
            for _pos, h in batches:
                if h.producer_id >= 0 and h.base_sequence >= 0:
                    states.record(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, offset)
                    key = (h.producer_id, h.producer_epoch, h.base_sequence)
                    if len(inflight) < INFLIGHT_PER_PARTITION_MAX:
                        inflight[key] = inner
                        keys.append(key)
                offset += h.last_offset_delta + 1
        out: Future[AppendResult] = Future()

        def done(f: Future[AppendAck]) -> None:
            with p.lock:
                for key in keys:
                    if inflight.get(key) is f:
                        del inflight[key]
            error = f.exception()
            if error is not None:
                out.set_exception(error)
                return
            ack = f.result()
            out.set_result(
                AppendResult(
                    topic, partition, ack.base_offset, ack.last_offset, -1, self._log_start(tid, partition)
                )
            )

        inner.add_done_callback(done)
        return out

    def _answer_duplicate(
        self, original: Future[AppendAck] | None, topic: str, partition: int, tid: str, dup: tuple[int, int]
    ) -> Future[AppendResult]:
        """A retried batch: answered with its first offsets. Still in flight: once the original
        settles (its failure is the retry's too). Settled: it was committed — a failed one would
        have stopped the partition, and `leads` refused this append before the check."""
        result = AppendResult(topic, partition, dup[0], dup[1], -1, self._log_start(tid, partition))
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

    # ==== refused in cluster mode ======================================================================

    def delete_topic(self, name: str) -> None:
        self._check_open()
        self.catalog.delete_topic(name)
        log.info("deleted topic %s (its flush objects and segments stay in the bucket)", name)

    def delete_records(self, name: str, partition: int, offset: int) -> int:
        raise ClusterUnsupportedError("DeleteRecords is not supported in cluster mode yet")

    def bump_leader_epoch(self, name: str, partition: int, reason: str) -> int:
        raise ClusterUnsupportedError("leader epochs move with leadership in cluster mode")

    def flush(self) -> None:
        if self.plog is not None:
            self.plog.flusher.flush(60)

    def checkpoint_metadata(self) -> int:
        return int(self.etcd.checkpoint() or -1)

    def publish_metadata(self) -> bool:
        return False

    def apply_retention(self) -> int:
        return 0

    def compact(self, topic: str | None = None, *, force: bool = True) -> int:
        raise ClusterUnsupportedError("compaction is not supported in cluster mode yet")

    def relocate_due(self) -> int:
        return 0

    def wait_relocations(self, timeout_s: float = 30.0) -> bool:
        return True

    def segments(self, name: str, partition: int) -> list[Any]:
        return []

    def unknown(self, topic: str) -> UnknownTopicError:
        return UnknownTopicError(f"unknown topic {topic!r}")


def _probe_bucket(bucket: ObjectStore, cluster_id: str) -> None:
    """One LIST of a prefix nothing uses: a bucket that does not exist stops the start with one
    line (every flush would fail otherwise, and nothing could be acknowledged); a bucket that does
    not answer now is only a warning (an outage heals, and produces wait or fail retriably)."""
    try:
        bucket.list(f"loglake-{cluster_id}/start-probe/")
    except LoglakeError as exc:
        if getattr(exc, "code", None) == "NoSuchBucket":
            raise ConfigError(
                f"cluster mode: the cold store {bucket.url} has no bucket (NoSuchBucket); create it first"
            ) from exc
        log.warning(
            "cluster mode: the cold store %s did not answer at start (%s); produces wait for it",
            bucket.url,
            exc,
        )
