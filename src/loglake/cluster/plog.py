"""The partition log of durability class `object`: offsets in memory, truth in etcd.

A `ClusterPartitionLog` is one broker's view of the partitions it leads. `acquire` bumps a
partition's leader epoch with a guarded etcd transaction (a racing broker loses cleanly with
MetaFencedError) and loads the committed end offset. `append` assigns offsets in memory —
rewriting the Kafka batches' base offsets and leader epoch exactly as the single-node appender
does — and hands the batches to the Flusher; the append's future resolves only after the flush
object is in the bucket **and** the metadata record committing its range is in etcd.

The commit (`_commit`, the Flusher's callback) is one `append_if` per chunk of at most
COMMIT_PARTITIONS_MAX partitions of the object: a `plog_commit` record with the ranges, guarded
by each partition's epoch key *and* committed-end key, setting each end key to the range's end.
So a commit lands only while its broker still holds the epoch and its range continues exactly
where the committed log ends: no gap, no overlap, whatever happened to earlier flushes.

Offsets are never ambiguous because the etcd commit is the single point of truth, and every
failure of a partition's range — a PUT that failed, a commit fenced, refused, or unanswered —
stops the partition: its later appends in flight fail too (their ranges no longer continue the
committed end, and the commit skips them), new appends are refused with the failure's retriable
error, and only `acquire` starts it again. `acquire` waits until the partition's appends in
flight are settled, bumps the epoch (which fences any late-landing commit of the old epoch) and
reads the committed end from the log: offsets of failed appends are reused from there. A commit
whose answer was lost may have landed; then its records are in the log (once, at the offsets
assigned) though the producer was told to retry — Kafka's own ambiguity on a timeout.
Idempotent producers' sequence checks are not done here (the next step's broker does them).

Reads (`read`) serve committed offsets only: recent batches this broker committed from memory,
then flush-object ranges through a bounded cache, then merged segments (loglake.cluster.plog_read).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from loglake.broker.metrics import LATENCY_BUCKETS_S
from loglake.cluster.etcd import EtcdMetaStore, Guard
from loglake.cluster.flusher import FlushAck, Flusher, FlushSettings
from loglake.cluster.flushobj import FlushIndex, FlushIndexEntry, topic_id_bytes
from loglake.cluster.plog_read import PlogReader
from loglake.engine.memory import MemoryPool
from loglake.engine.telemetry import LatencyHistogram
from loglake.errors import (
    CorruptRecordError,
    EngineFailedError,
    FlushFailedError,
    LoglakeError,
    MetaFencedError,
)
from loglake.kafka_errors import ErrorCode
from loglake.logsafe import RateLimitedLog
from loglake.meta.cluster import Plog, end_key, epoch_key
from loglake.meta.records import PlogCommit, PlogCommitRow, PlogLeader
from loglake.records.batch import set_log_append_time, set_offset_and_epoch, split_batches
from loglake.store.base import ObjectStore

__all__ = ["COMMIT_PARTITIONS_MAX", "AppendAck", "ClusterPartitionLog", "NotLeaderError"]

log = logging.getLogger(__name__)
#: A bucket or etcd outage fails every flush until it ends: one line per kind of failure per window.
_limited = RateLimitedLog(log)

#: Partitions committed by one etcd transaction: each costs two compares (epoch, end) and one
#: put, and etcd refuses more than 128 compares or operations per transaction (--max-txn-ops).
COMMIT_PARTITIONS_MAX = 60
#: How long the commit waits for etcd to answer one transaction before it counts as failed (the
#: store itself gives up after its `unavailable_s`; this bounds a store that hangs).
COMMIT_WAIT_S = 120.0
#: How long `acquire` waits for the partition's appends in flight to settle.
ACQUIRE_DRAIN_S = 60.0
#: Biggest append (one produce request's batches for one partition), Kafka's message.max.bytes scale.
APPEND_BYTES_MAX = 8 * 1024 * 1024

TP = tuple[str, int]


class NotLeaderError(LoglakeError):
    """This broker does not lead the partition (never acquired, released, or fenced): the client
    refreshes metadata and goes to the leader."""

    kafka_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
    retriable = True


@dataclass(frozen=True, slots=True)
class AppendAck:
    """An acknowledged append: its offsets, the epoch it was written in, the flush object."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    key: str


@dataclass(eq=False)
class _Lead:
    epoch: int
    next: int  # the next offset to assign
    end: int  # committed end (as this broker's own commits moved it)
    failed: LoglakeError | None = None
    inflight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # offsets and the flusher, in order
    #: appends whose range is not committed yet, by last offset (`abandon` may fail them before
    #: their flush settles)
    outstanding: dict[Future[AppendAck], int] = field(default_factory=dict)
    #: chunks of this partition's ranges being committed now (their outcome is etcd's, not ours)
    committing: int = 0


class ClusterPartitionLog:
    """Appends and reads of the partitions this broker leads (see the module doc)."""

    def __init__(
        self,
        meta: EtcdMetaStore,
        store: ObjectStore,
        *,
        cluster_id: str,
        node_id: int,
        prefix: str = "",
        settings: FlushSettings | None = None,
        reader: PlogReader | None = None,
        pool: MemoryPool | None = None,
    ) -> None:
        """`pool`: where the flush buffer reserves its bytes (see Flusher)."""
        self.meta = meta
        self.store = store
        self.cluster_id = cluster_id
        self.node_id = node_id
        self.prefix = prefix
        self._lock = threading.Condition()  # _leads and every _Lead's counters
        self._leads: dict[TP, _Lead] = {}  # bounded by the partitions this broker leads
        #: one rewrite of a partition's metadata at a time (a merge, a log start raise): a merge
        #: switches exactly the ranges it read, which a start raised meanwhile would have moved
        self._rewrites: dict[TP, threading.Lock] = {}
        self.reader = reader or PlogReader(meta, store)
        #: seconds from a range commit's submission to etcd's answer (/metrics)
        self.commit_seconds = LatencyHistogram(LATENCY_BUCKETS_S)
        self.flusher = Flusher(
            store, self._commit, cluster_id=cluster_id, node_id=node_id, prefix=prefix, settings=settings, pool=pool
        )

    # ---- leadership ------------------------------------------------------------------------------

    def acquire(self, topic_id: str, partition: int) -> int:
        """Lead the partition: bump its epoch in etcd (MetaFencedError when another broker's bump
        came first) and start at the committed end; returns the new epoch."""
        topic_id_bytes(topic_id)
        tp = (topic_id, partition)
        self._stop(tp, NotLeaderError(f"{topic_id}-{partition}: leadership is being re-acquired"))
        self._drain(tp)
        ek, nk = epoch_key(topic_id, partition), end_key(topic_id, partition)
        raw, _mod = self.meta.get_key(ek)
        old = int(raw) if raw is not None else 0
        guards = [Guard(ek, value=raw) if raw is not None else Guard(ek, mod_revision=0)]
        sets = {ek: str(old + 1).encode()}
        end_raw, _ = self.meta.get_key(nk)
        if end_raw is None:
            guards.append(Guard(nk, mod_revision=0))
            sets[nk] = b"0"
        record = PlogLeader(topic_id, partition, old + 1, self.node_id)
        self.meta.append_if(record, guards, sets).result(COMMIT_WAIT_S)
        plog: Plog = self.meta.read(lambda s: s.plogs.part(bytes.fromhex(topic_id), partition))
        if plog.epoch != old + 1:
            # Another broker's bump committed right after this one's and is applied here already:
            # it leads now (an assignment two brokers computed from different live sets for a
            # moment). Fenced, as if its bump had come first — not a failure to hand back for a while.
            raise MetaFencedError(f"{topic_id}-{partition}: epoch {plog.epoch} after bumping to {old + 1}: "
                                  "another broker acquired it since")
        with self._lock:
            self._leads[tp] = _Lead(plog.epoch, plog.end, plog.end)
        log.debug(
            "node %d leads %s-%d at epoch %d from offset %d",
            self.node_id,
            topic_id,
            partition,
            plog.epoch,
            plog.end,
        )
        return plog.epoch

    def release(self, topic_id: str, partition: int) -> None:
        """Stop leading the partition: appends in flight fail, new ones are refused."""
        tp = (topic_id, partition)
        self._stop(tp, NotLeaderError(f"{topic_id}-{partition}: node {self.node_id} released it"))
        self._drain(tp)
        with self._lock:
            self._leads.pop(tp, None)
            self._rewrites.pop(tp, None)

    def abandon(self, topic_id: str, partition: int) -> int:
        """Stop appending to the partition and fail its appends not committed yet now, rather than
        when their flush settles (a PUT to a bucket that does not answer may take minutes): safe
        because a stopped partition's later commits are refused (`_commit` checks under the lock),
        and done only while no commit of it is in flight (whose outcome etcd decides). Returns how
        many appends were failed; the partition is still to be `release`d (which drains them)."""
        tp = (topic_id, partition)
        error = NotLeaderError(f"{topic_id}-{partition}: node {self.node_id} stopped leading it (etcd or the bucket unreachable)")
        with self._lock:
            lead = self._leads.get(tp)
            if lead is None:
                return 0
            if lead.failed is None:
                lead.failed = error
            if lead.committing:
                return 0
            victims, lead.outstanding = list(lead.outstanding), {}
        failed = 0
        for f in victims:
            if _settle(f, error=error):
                failed += 1
        return failed

    def leads(self, topic_id: str, partition: int) -> bool:
        with self._lock:
            lead = self._leads.get((topic_id, partition))
            return lead is not None and lead.failed is None

    def epoch_of(self, topic_id: str, partition: int) -> int | None:
        """The epoch this broker acquired the partition at (None when it does not lead it)."""
        with self._lock:
            lead = self._leads.get((topic_id, partition))
            return lead.epoch if lead is not None else None

    def rewrite_lock(self, topic_id: str, partition: int) -> threading.Lock:
        """The lock a merge or a log start raise of the partition holds (plog_maint)."""
        with self._lock:
            return self._rewrites.setdefault((topic_id, partition), threading.Lock())

    def committed_end(self, topic_id: str, partition: int) -> int:
        """The partition's committed end in this broker's view of the metadata."""
        return int(self.meta.read(lambda s: s.plogs.part(bytes.fromhex(topic_id), partition).end))

    def _stop(self, tp: TP, error: LoglakeError) -> None:
        with self._lock:
            lead = self._leads.get(tp)
            if lead is not None and lead.failed is None:
                lead.failed = error

    def _drain(self, tp: TP) -> None:
        """Wait until the partition's appends in flight are settled (they fail: it is stopped);
        buffered ones are flushed now rather than at the next trigger."""
        deadline = time.monotonic() + ACQUIRE_DRAIN_S
        with self._lock:
            lead = self._leads.get(tp)
            busy = lead is not None and lead.inflight > 0
        if busy:
            self.flusher.flush(ACQUIRE_DRAIN_S)
        with self._lock:
            while (lead := self._leads.get(tp)) is not None and lead.inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineFailedError(
                        f"{tp[0]}-{tp[1]}: appends in flight did not settle in {ACQUIRE_DRAIN_S} s"
                    )
                self._lock.wait(left)

    # ---- appending -------------------------------------------------------------------------------

    def append(self, topic_id: str, partition: int, data: bytes | bytearray) -> Future[AppendAck]:
        """Assign offsets to one produce's batches and flush them; the future resolves once they
        are in a flush object whose range is committed in etcd. NotLeaderError (or the error that
        stopped the partition) when this broker may not append to it."""
        return self.append_assigned(topic_id, partition, data)[1]

    def append_assigned(
        self, topic_id: str, partition: int, data: bytes | bytearray | memoryview, log_append_time: int = -1
    ) -> tuple[int, Future[AppendAck]]:
        """`append`, also returning the base offset it assigned (the broker records idempotent
        producers' batches at once, so that a retry still in flight is known as a duplicate).
        `log_append_time` >= 0: the batches are stamped with it (a LogAppendTime topic)."""
        if len(data) > APPEND_BYTES_MAX:
            raise CorruptRecordError(f"append of {len(data)} bytes is over {APPEND_BYTES_MAX}")
        batches = split_batches(data)
        if not batches:
            raise CorruptRecordError(
                f"append to {topic_id}-{partition}: no record batch in {len(data)} bytes"
            )
        buf = bytearray(data)
        tp = (topic_id, partition)
        with self._lock:
            lead = self._leads.get(tp)
            if lead is None:
                raise NotLeaderError(f"node {self.node_id} does not lead {topic_id}-{partition}")
        with lead.lock:
            with self._lock:
                if lead.failed is not None:
                    raise lead.failed
                base = offset = lead.next
                epoch = lead.epoch
            for pos, h in batches:
                set_offset_and_epoch(buf, pos, offset, h.batch_length, epoch)
                if log_append_time >= 0:
                    set_log_append_time(buf, pos, log_append_time)
                offset += h.last_offset_delta + 1
            inner = self.flusher.append(topic_id, partition, buf)  # raises: nothing was assigned
            out: Future[AppendAck] = Future()
            with self._lock:
                lead.next = offset
                lead.inflight += 1
                lead.outstanding[out] = offset - 1
        last = offset - 1
        inner.add_done_callback(lambda f: self._settled(tp, lead, f, out, base, last, buf))
        return base, out

    def _settled(
        self,
        tp: TP,
        lead: _Lead,
        inner: Future[FlushAck],
        out: Future[AppendAck],
        base: int,
        last: int,
        buf: bytearray,
    ) -> None:
        error = inner.exception()
        with self._lock:
            lead.inflight -= 1
            lead.outstanding.pop(out, None)
            if error is not None and lead.failed is None:
                lead.failed = _as_loglake(error)
            self._lock.notify_all()
        if error is not None:
            _settle(out, error=error)  # unless `abandon` failed it already
            return
        ack = inner.result()
        self.reader.remember(tp[0], tp[1], base, last, bytes(buf))
        if not _settle(out, result=AppendAck(base, last, lead.epoch, ack.key)):  # pragma: no cover - see `abandon`
            log.error("node %d: an append to %s-%d at %d was abandoned although committed", self.node_id, *tp, base)

    # ---- committing (the Flusher's callback) -----------------------------------------------------

    def _commit(self, index: FlushIndex) -> Mapping[TP, BaseException]:
        refused: dict[TP, BaseException] = {}
        todo: list[tuple[FlushIndexEntry, _Lead, int]] = []
        with self._lock:
            for e in index.entries:
                tp = (e.topic_id, e.partition)
                lead = self._leads.get(tp)
                if lead is None or lead.failed is not None:
                    refused[tp] = (
                        lead.failed if lead is not None and lead.failed else NotLeaderError(f"{tp} not led")
                    )
                elif e.base_offset != lead.end:  # an earlier range failed: this one would leave a gap
                    lead.failed = NotLeaderError(
                        f"{tp[0]}-{tp[1]}: range at {e.base_offset} after a failed flush"
                    )
                    refused[tp] = lead.failed
                else:
                    todo.append((e, lead, lead.epoch))
                    lead.committing += 1
        chunks = [todo[i : i + COMMIT_PARTITIONS_MAX] for i in range(0, len(todo), COMMIT_PARTITIONS_MAX)]
        stopped: list[tuple[TP, BaseException]] = []
        for chunk in chunks:
            try:
                self._commit_chunk(index, chunk, refused, stopped)
            finally:
                with self._lock:
                    for _e, lead, _epoch in chunk:
                        lead.committing -= 1
        if stopped:  # one line per flush, however many partitions it stopped; repeats summarised
            (t, p), error = stopped[0]
            _limited.warning(
                ("stopped", type(error).__name__),
                "node %d stops appending to %d partition(s) of flush %s (first %s-%d: %s); they wait for acquire",
                self.node_id,
                len(stopped),
                index.key,
                t,
                p,
                error,
            )
        return refused

    def _commit_chunk(
        self,
        index: FlushIndex,
        chunk: list[tuple[FlushIndexEntry, _Lead, int]],
        refused: dict[TP, BaseException],
        stopped: list[tuple[TP, BaseException]],
    ) -> None:
        while chunk:
            guards: list[Guard] = []
            sets: dict[str, bytes] = {}
            rows: list[PlogCommitRow] = []
            for e, _lead, epoch in chunk:
                guards.append(Guard(epoch_key(e.topic_id, e.partition), value=str(epoch).encode()))
                guards.append(Guard(end_key(e.topic_id, e.partition), value=str(e.base_offset).encode()))
                sets[end_key(e.topic_id, e.partition)] = str(e.last_offset + 1).encode()
                rows.append((
                    e.topic_id, e.partition, epoch, e.base_offset, e.last_offset, e.position, e.length,
                    e.record_count, e.max_timestamp, e.crc, e.batch_count,
                ))  # fmt: skip
            started = time.monotonic()
            try:
                self.meta.append_if(PlogCommit(index.key, rows), guards, sets).result(COMMIT_WAIT_S)
                self.commit_seconds.observe(time.monotonic() - started)
            except MetaFencedError as exc:
                # which guards broke? those partitions are fenced; the others commit on their own
                held = [(e, lead, epoch) for e, lead, epoch in chunk if self._guards_hold(e, epoch)]
                for e, lead, _epoch in chunk:
                    if (e, lead, _epoch) not in held:
                        self._refuse(e, lead, exc, refused, stopped)
                if len(held) == len(chunk):  # raced with nothing we can see: fail them all
                    for e, lead, _epoch in chunk:
                        self._refuse(e, lead, exc, refused, stopped)
                    return
                chunk = held
                continue
            except (FutureTimeout, Exception) as exc:  # unanswered, refused, etcd away: all stop
                error = (
                    exc if isinstance(exc, LoglakeError) else EngineFailedError(f"commit unanswered: {exc!r}")
                )
                for e, lead, _epoch in chunk:
                    self._refuse(e, lead, error, refused, stopped)
                return
            with self._lock:
                for e, lead, _epoch in chunk:
                    lead.end = e.last_offset + 1
                    # committed: no longer abandonable (their futures resolve as the flush settles)
                    for f in [f for f, last in lead.outstanding.items() if last < lead.end]:
                        del lead.outstanding[f]
            return

    def _guards_hold(self, e: FlushIndexEntry, epoch: int) -> bool:
        raw_epoch, _ = self.meta.get_key(epoch_key(e.topic_id, e.partition))
        raw_end, _ = self.meta.get_key(end_key(e.topic_id, e.partition))
        return raw_epoch == str(epoch).encode() and raw_end == str(e.base_offset).encode()

    def _refuse(
        self,
        e: FlushIndexEntry,
        lead: _Lead,
        error: BaseException,
        refused: dict[TP, BaseException],
        stopped: list[tuple[TP, BaseException]],
    ) -> None:
        tp = (e.topic_id, e.partition)
        refused[tp] = error
        with self._lock:
            if lead.failed is None:
                lead.failed = _as_loglake(error)
                stopped.append((tp, error))

    # ---- reading ---------------------------------------------------------------------------------

    def read(self, topic_id: str, partition: int, offset: int, max_bytes: int) -> bytes:
        """Committed batches from the one holding `offset` on, up to `max_bytes` (at least one
        batch); b"" at the committed end. OffsetOutOfRangeError outside the log."""
        return self.reader.read(topic_id, partition, offset, max_bytes)

    def close(self) -> None:
        self.flusher.close()


def _settle(f: Future[AppendAck], *, result: AppendAck | None = None, error: BaseException | None = None) -> bool:
    """Resolve `f` unless it is resolved already (`abandon` failed it first); True if this did."""
    try:
        if error is not None:
            f.set_exception(error)
        else:
            assert result is not None
            f.set_result(result)
    except InvalidStateError:
        return False
    return True


def _as_loglake(error: BaseException) -> LoglakeError:
    if isinstance(error, FlushFailedError):
        cause = error.cause
        if isinstance(cause, LoglakeError) and cause.retriable:
            return cause
        return error
    return error if isinstance(error, LoglakeError) else EngineFailedError(repr(error))
