"""The flush buffer of durability class `object`: many partitions' batches, one PUT per flush.

A leader appends `(topic id, partition, batch)` with offsets already assigned and gets a future.
The Flusher acknowledges nothing itself: when the buffer holds `object_flush_bytes` or its
oldest batch is `object_flush_ms` old, one thread writes everything buffered (up to
`object_flush_bytes` plus one batch) as one flush object with one PUT — whatever the number of
partitions in it — then hands the object's index to the commit callback. The next step's
callback commits the ranges to etcd with `append_if`, guarded by the partitions' leader epochs;
only when it returns do the futures resolve. A PUT that still fails after its bounded retries,
or a commit that raises, fails exactly the appends of that flush with FlushFailedError
(retriable): nothing of a flush is half-acknowledged, and the next flush starts clean.

Flushes run one at a time, in append order, so a partition's ranges are committed in offset
order. The Flusher does not check offsets across flushes: after a failed flush the caller (who
assigned the offsets) must not commit later ranges of the same partition past the hole — the
metadata commit's guard on each partition's end offset is where that is enforced.

Memory is bounded: buffered bytes plus the flush in flight are reserved from a MemoryPool whose
budget is `buffer_bytes_max` (the engine's memory pool in cluster mode: the broker sees the flush
buffer's pressure as it sees the local log's); `append` waits for room (back-pressure) up to
`append_wait_s`, then BackPressureTimeoutError. Room frees once a flush has settled its appends'
futures — so a caller that waits for room must not hold a lock those futures' callbacks take.
An object whose commit failed is left in the bucket (the commit may have landed with its answer
lost); sweeping unreferenced flush objects is the caller's, by the rule in loglake.cluster.merge.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from loglake.broker.metrics import LATENCY_BUCKETS_S
from loglake.broker.settings import FLUSH_BUFFER_BYTES_MAX, OBJECT_FLUSH_BYTES, OBJECT_FLUSH_MS
from loglake.cluster.flushobj import (
    FlushIndex,
    FlushIndexEntry,
    FlushObjectWriter,
    check_batch,
    check_partition,
    flush_object_key,
    new_session,
    topic_id_bytes,
)
from loglake.engine.memory import MemoryPool
from loglake.engine.telemetry import LatencyHistogram
from loglake.errors import (
    BackPressureTimeoutError,
    EngineClosedError,
    FlushFailedError,
    RecordTooLargeError,
)
from loglake.records.batch import BatchHeader
from loglake.store.base import BytesLike, ObjectStore
from loglake.store.retry import RetryPolicy

log = logging.getLogger(__name__)

# The flush thresholds and the buffer's bound are broker settings (`--object-flush-bytes`,
# `--object-flush-ms`): their defaults and bounds live in the settings table.
#: How long `append` waits for room under the bound before it fails (back-pressure).
APPEND_WAIT_S = 30.0
#: Attempts of one flush's PUT, the first included; each is itself retried by the store (S3's
#: own bounded retries), so a bucket outage fails a flush after both rounds, not never.
FLUSH_PUT_ATTEMPTS = 3
#: Backoff between those attempts.
FLUSH_PUT_RETRY = RetryPolicy(max_attempts=FLUSH_PUT_ATTEMPTS, base_delay=0.1, max_delay=1.0)


@dataclass(frozen=True)
class FlushSettings:
    """The named settings of the flush buffer (docs/CLUSTER.md)."""

    object_flush_bytes: int = OBJECT_FLUSH_BYTES
    object_flush_ms: int = OBJECT_FLUSH_MS
    buffer_bytes_max: int = FLUSH_BUFFER_BYTES_MAX
    append_wait_s: float = APPEND_WAIT_S
    put_retry: RetryPolicy = field(default_factory=lambda: FLUSH_PUT_RETRY)

    def __post_init__(self) -> None:
        if self.object_flush_bytes < 1 or self.object_flush_ms < 1:
            raise ValueError(f"object_flush_bytes and object_flush_ms must be positive, got {self}")
        if self.buffer_bytes_max < self.object_flush_bytes:
            raise ValueError(
                f"buffer_bytes_max {self.buffer_bytes_max} is below object_flush_bytes {self.object_flush_bytes}"
            )


@dataclass(frozen=True, slots=True)
class FlushAck:
    """What an append's future resolves to: the object its batch is in and its partition's range."""

    key: str
    entry: FlushIndexEntry


@dataclass
class FlushStats:
    """Counters; `puts` is every foreground PUT request issued (retries included)."""

    puts: int = 0
    objects: int = 0  # flush objects written and committed
    failed_flushes: int = 0
    bytes_put: int = 0
    appends: int = 0
    max_partitions: int = 0  # most partitions one object held


@dataclass(slots=True)
class _Pending:
    topic_id: str
    partition: int
    view: memoryview
    header: BatchHeader
    future: Future[FlushAck]
    at: float  # when it was appended (the time trigger counts from the oldest)


#: The commit callback: given the index of a flush object that is in the bucket, make it
#: visible (loglake.cluster.plog: etcd transactions guarded by leader epochs); raise to fail
#: the whole flush, or return {(topic id, partition): error} for the partitions whose ranges
#: were not committed (their appends fail; the others are acknowledged).
CommitFn = Callable[[FlushIndex], Mapping[tuple[str, int], BaseException] | None]


class Flusher:
    def __init__(
        self,
        store: ObjectStore,
        commit: CommitFn,
        *,
        cluster_id: str,
        node_id: int,
        prefix: str = "",
        settings: FlushSettings | None = None,
        session: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        pool: MemoryPool | None = None,
    ) -> None:
        """`pool`: where the held bytes are reserved (default: a pool of its own); its budget must
        be `settings.buffer_bytes_max`."""
        self.store = store
        self.settings = settings or FlushSettings()
        if pool is None:
            pool = MemoryPool(self.settings.buffer_bytes_max, 1.0, lambda: None)
        elif pool.budget_bytes != self.settings.buffer_bytes_max:
            raise ValueError(
                f"flush pool budget {pool.budget_bytes} is not buffer_bytes_max {self.settings.buffer_bytes_max}"
            )
        self.pool = pool
        self.cluster_id = cluster_id
        self.node_id = node_id
        self.prefix = prefix
        self.session = session or new_session()
        self.stats = FlushStats()
        self._commit = commit
        self._clock = clock
        self._wall_ms = wall_ms
        self._cond = threading.Condition()
        # both bounded by the pool (buffer_bytes_max): an entry per buffered batch, per partition buffered
        self._pending: list[_Pending] = []
        self._last: dict[tuple[str, int], int] = {}  # last offset buffered per partition
        self._buffered = 0
        self._inflight = 0
        self._first_at = 0.0
        self._force = 0  # appends at the head of the buffer a flush() asked to go now
        self._seq = 0
        self._closing = False
        self._failing = False  # a flush failed and none has succeeded since (one log line each way)
        #: seconds from a flush's first PUT attempt to its object being in the bucket (/metrics)
        self.put_seconds = LatencyHistogram(LATENCY_BUCKETS_S)
        #: told each flush PUT's outcome (None: in the bucket) after its retries: cluster health
        self.on_put: Callable[[BaseException | None], None] | None = None
        # check the key parts now, not at the first flush
        flush_object_key(cluster_id, node_id, self.session, 0, prefix)
        self._thread = threading.Thread(target=self._run, name=f"loglake-flusher-{node_id}", daemon=True)
        self._thread.start()

    # ---- appending ---------------------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Bytes held: buffered and in flight."""
        with self._cond:
            return self._buffered + self._inflight

    def append(self, topic_id: str, partition: int, batch: BytesLike) -> Future[FlushAck]:
        """Buffer one batch (offsets assigned by the caller); the future resolves once the flush
        holding it is in the bucket and committed. Bad batch: CorruptRecordError /
        InvalidRecordError; no room within `append_wait_s`: BackPressureTimeoutError."""
        topic_id_bytes(topic_id)
        check_partition(partition)
        view, h = check_batch(batch)
        n = len(view)
        s = self.settings
        if n > s.buffer_bytes_max:
            raise RecordTooLargeError(
                f"batch of {n} bytes is larger than the flush buffer ({s.buffer_bytes_max})"
            )
        if self._closing:
            raise EngineClosedError(f"flusher of node {self.node_id} is closed")
        fut: Future[FlushAck] = Future()
        try:
            self.pool.reserve(n, s.append_wait_s)
        except BackPressureTimeoutError:
            raise BackPressureTimeoutError(
                f"flush buffer full ({self.pool.used_bytes} of {s.buffer_bytes_max} bytes) "
                f"for {s.append_wait_s} s: the bucket is slower than the produce rate"
            ) from None
        try:
            self._buffer(topic_id, partition, view, h, fut)
        except BaseException:
            self.pool.release(n)
            raise
        return fut

    def _buffer(
        self, topic_id: str, partition: int, view: memoryview, h: BatchHeader, fut: Future[FlushAck]
    ) -> None:
        """Queue one batch whose bytes are reserved."""
        s = self.settings
        n = len(view)
        with self._cond:
            if self._closing:
                raise EngineClosedError(f"flusher of node {self.node_id} is closed")
            k = (topic_id, partition)
            last = self._last.get(k)
            if last is not None and h.base_offset != last + 1:
                raise ValueError(f"{topic_id}-{partition}: batch at {h.base_offset} does not continue {last}")
            self._last[k] = h.last_offset
            if not self._pending:
                self._first_at = self._clock()
                self._cond.notify_all()
            self._pending.append(_Pending(topic_id, partition, view, h, fut, self._clock()))
            self._buffered += n
            self.stats.appends += 1
            if self._buffered >= s.object_flush_bytes:
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> None:
        """Flush everything buffered now and wait for it (outcomes are on the futures)."""
        with self._cond:
            futures = [p.future for p in self._pending]
            self._force = len(self._pending)
            self._cond.notify_all()
        end = None if timeout is None else self._clock() + timeout
        for f in futures:
            f.exception(None if end is None else max(0.0, end - self._clock()))

    def close(self, timeout: float | None = None) -> None:
        """Flush what is buffered, then stop; appends after this raise EngineClosedError."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def __enter__(self) -> Flusher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- flushing ----------------------------------------------------------------------------

    def _take(self) -> list[_Pending] | None:
        """Wait for a trigger, then take one object's worth of appends (None: closed and empty)."""
        s = self.settings
        with self._cond:
            while True:
                if self._pending:
                    due = self._first_at + s.object_flush_ms / 1000
                    now = self._clock()
                    if self._closing or self._force or self._buffered >= s.object_flush_bytes or now >= due:
                        break
                    self._cond.wait(due - now)
                elif self._closing:
                    return None
                else:
                    self._cond.wait()
            taken: list[_Pending] = []
            size = 0
            for p in self._pending:
                if taken and size + len(p.view) > s.object_flush_bytes:
                    break
                taken.append(p)
                size += len(p.view)
            del self._pending[: len(taken)]
            self._force = max(0, self._force - len(taken))
            self._buffered -= size
            self._inflight += size
            if self._pending:
                self._first_at = self._pending[0].at
                # a partition with nothing buffered may start again at another offset (its
                # leader reused offsets after a failed flush)
                left = {(p.topic_id, p.partition) for p in self._pending}
                self._last = {k: v for k, v in self._last.items() if k in left}
            else:
                self._last.clear()
            self._seq += 1
            return taken

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            try:
                self._flush(taken)
            except Exception as exc:  # pragma: no cover - building a checked object does not fail
                log.exception("flush of node %d failed while building its object", self.node_id)
                self._fail(
                    [p for p in taken if not p.future.done()], FlushFailedError("(unnamed)", "build", exc)
                )
            finally:
                size = sum(len(p.view) for p in taken)
                with self._cond:
                    self._inflight -= size
                    self._cond.notify_all()
                self.pool.release(size)

    def _flush(self, taken: list[_Pending]) -> None:
        key = flush_object_key(self.cluster_id, self.node_id, self.session, self._seq, self.prefix)
        writer = FlushObjectWriter(self.node_id, self._seq, self._wall_ms())
        for p in taken:
            writer.add_checked(p.topic_id, p.partition, p.view, p.header)
        parts, index = writer.finish()
        index = dataclasses.replace(index, key=key)
        stage = "PUT"
        try:
            self._put(key, parts)
            stage = "commit"
            refused = self._commit(index) or {}
        except Exception as exc:  # any failure of the store or the callback fails this flush only
            self._fail(taken, FlushFailedError(key, stage, exc))
            return
        self.stats.objects += 1
        self.stats.bytes_put += index.size
        self.stats.max_partitions = max(self.stats.max_partitions, len(index.entries))
        if self._failing:
            self._failing = False
            log.info("flush objects of node %d are written and committed again (%s)", self.node_id, key)
        by_partition = {(e.topic_id, e.partition): e for e in index.entries}
        for p in taken:
            cause = refused.get((p.topic_id, p.partition))
            if cause is not None:
                p.future.set_exception(FlushFailedError(key, "commit", cause))
            else:
                p.future.set_result(FlushAck(key, by_partition[(p.topic_id, p.partition)]))

    def _put(self, key: str, parts: list[bytes | memoryview]) -> None:
        policy = self.settings.put_retry
        started = time.monotonic()
        for attempt in range(1, policy.max_attempts + 1):
            self.stats.puts += 1
            try:
                self.store.put(key, parts)
            except Exception as exc:
                if attempt == policy.max_attempts:
                    if self.on_put is not None:
                        self.on_put(exc)
                    raise
                log.debug(
                    "flush object %s: PUT attempt %d/%d failed: %s", key, attempt, policy.max_attempts, exc
                )
                time.sleep(policy.delay(attempt))
                continue
            self.put_seconds.observe(time.monotonic() - started)
            if self.on_put is not None:
                self.on_put(None)
            return

    def _fail(self, taken: list[_Pending], error: FlushFailedError) -> None:
        self.stats.failed_flushes += 1
        if not self._failing:
            self._failing = True
            log.warning("%s; its %d appends fail (retriable), later flushes go on", error, len(taken))
        else:
            log.debug("%s", error)
        for p in taken:
            p.future.set_exception(error)
