"""Hybrid reads: the live tail of a partition read through the broker (kafka.bootstrap.servers).

Driver side, `BrokerView` asks the broker (ListOffsets, Metadata) where each partition ends: its
high watermark, or at read_committed its last stable offset. The planner (plan.ranges_for) fixes
per partition [start, seam) from the sealed segments and [seam, end) from the broker, where the
seam is the sealed end the store's metadata listed at plan time.

Executor side, `read_range` reads one BrokerRange with a confluent-kafka Consumer: assign() at
the range's start, no consumer group, nothing committed, isolation.level as the query's. The
range ends when the consumer's position reaches its end, which is not always a record: the last
offsets may be transaction markers, aborted records (read_committed) or compacted away. So the
reader also takes partition-EOF events (the broker's end is at or past the range's end) and the
consumer's position as proof of completion, and gives up with a clear error after
STALL_TIMEOUT_S without progress.

A seal during the read changes nothing here: the broker serves sealed offsets too.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import replace
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from loglake.errors import LoglakeError
from loglake.spark.model import PartitionMeta, TopicPartition
from loglake.spark.options import LoglakeOptionError, ReadOptions
from loglake.spark.plan import BrokerRange, DataLossError, Metadata, cached_store, load_metadata
from loglake.spark.reader import MAX_BATCH_ROWS, TIMESTAMP_TYPE, arrow_schema

log = logging.getLogger("loglake.spark")

#: How long one driver request (Metadata, ListOffsets) may take before the query fails.
REQUEST_TIMEOUT_S = 30.0
#: A task that makes no progress for this long (no record, no end of partition, no position
#: change) fails: the broker is unreachable, or the range's end is no longer there.
STALL_TIMEOUT_S = 120.0
#: Messages taken from the consumer per consume() call.
CONSUME_BATCH = 10_000
#: librdkafka pauses fetching for fetch.queue.backoff.ms (1 s by default) whenever its local
#: queue is full (queued.min.messages); a task drains that queue as fast as it can, so a 1 s
#: pause is pure stall (it cost ~0.9 s per 200,000 records). A kafka.* option overrides it.
FETCH_QUEUE_BACKOFF_MS = 10
#: How long the reader waits for the next message when none is queued.
POLL_S = 0.5


class BrokerReadError(LoglakeError):
    """A hybrid read could not get its offsets from the broker."""


def client_config(opts: ReadOptions) -> dict[str, Any]:
    """librdkafka settings shared by the driver's admin client and the tasks' consumers."""
    assert opts.bootstrap_servers is not None
    return {**dict(opts.kafka_config), "bootstrap.servers": opts.bootstrap_servers}


def consumer_config(opts: ReadOptions) -> dict[str, Any]:
    return {
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        **client_config(opts),
        # librdkafka wants a group.id even for assign(); it never joins or commits to it
        "group.id": f"loglake-spark-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
        "isolation.level": opts.isolation,
    }


def _config_error(exc: Exception) -> LoglakeOptionError:
    return LoglakeOptionError(f"the kafka.* options are not valid librdkafka settings: {exc}")


class BrokerView:
    """The driver's view of the broker: partitions and where they start and end."""

    def __init__(self, opts: ReadOptions) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        self.opts = opts
        try:
            self.admin = AdminClient(client_config(opts))
        except (KafkaException, ValueError, TypeError) as exc:
            raise _config_error(exc) from None

    def partitions(self) -> tuple[str, dict[str, int]]:
        """(the broker's cluster id, {topic: partition count}) of the topics it has."""
        from confluent_kafka import KafkaException

        try:
            md = self.admin.list_topics(timeout=REQUEST_TIMEOUT_S)
        except KafkaException as exc:
            raise BrokerReadError(f"metadata from {self.opts.bootstrap_servers}: {exc}") from None
        counts = {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}
        return str(md.cluster_id or ""), counts

    def _list(self, tps: Iterable[TopicPartition], spec: Any) -> dict[TopicPartition, int]:
        from confluent_kafka import IsolationLevel, KafkaException
        from confluent_kafka import TopicPartition as KTP

        tps = list(tps)
        if not tps:
            return {}
        level = IsolationLevel.READ_COMMITTED if self.opts.read_committed else IsolationLevel.READ_UNCOMMITTED
        futures = self.admin.list_offsets(
            {KTP(t, p): spec for t, p in tps}, isolation_level=level, request_timeout=REQUEST_TIMEOUT_S
        )
        out: dict[TopicPartition, int] = {}
        for ktp, fut in futures.items():
            try:
                out[(ktp.topic, ktp.partition)] = int(fut.result(REQUEST_TIMEOUT_S).offset)
            except KafkaException as exc:
                raise BrokerReadError(
                    f"ListOffsets of {ktp.topic}-{ktp.partition} from {self.opts.bootstrap_servers}: {exc}"
                ) from None
        return out

    def ends(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition; at read_committed its last stable offset."""
        from confluent_kafka.admin import OffsetSpec

        return self._list(tps, OffsetSpec.latest())  # type: ignore[no-untyped-call]

    def starts(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        from confluent_kafka.admin import OffsetSpec

        return self._list(tps, OffsetSpec.earliest())  # type: ignore[no-untyped-call]

    def offset_for_timestamp(self, tp: TopicPartition, ts: int) -> int | None:
        """The first offset whose timestamp is >= ts (ListOffsets by time), None if none is."""
        from confluent_kafka.admin import OffsetSpec

        off = self._list([tp], OffsetSpec.for_timestamp(ts))[tp]
        return None if off < 0 else off


# ---- executor side -----------------------------------------------------------------------------


class _Columns:
    """Messages of one output batch; columns are cut from them all at once in build() (one list
    comprehension per column costs a third of a per-message loop with appends)."""

    def __init__(self) -> None:
        self.msgs: list[Any] = []

    def build(
        self, schema: pa.Schema, topic: str, partition: int, headers: bool, log_append: int
    ) -> pa.RecordBatch:
        msgs = self.msgs
        rows = len(msgs)
        stamps = np.array([m.timestamp() for m in msgs], np.int64).reshape(rows, 2)
        cols = [
            pa.array([m.key() for m in msgs], pa.binary()),
            pa.array([m.value() for m in msgs], pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), rows),
            pa.repeat(pa.scalar(partition, pa.int32()), rows),
            pa.array(np.fromiter((m.offset() for m in msgs), np.int64, rows)),
            pa.array(stamps[:, 1] * 1000, TIMESTAMP_TYPE),
            pa.array((stamps[:, 0] == log_append).astype(np.int32)),
        ]
        if headers:
            cols.append(pa.array([m.headers() or None for m in msgs], schema.field("headers").type))
        return pa.RecordBatch.from_arrays(cols, schema=schema)


def read_range(rng: BrokerRange, opts: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Records with offsets [rng.start, rng.end) of one partition, through the broker."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaError, KafkaException
    from confluent_kafka import TopicPartition as KTP

    if rng.start >= rng.end:
        return
    schema = arrow_schema(opts.include_headers)
    where = f"{rng.topic}-{rng.partition} offsets {rng.start}..{rng.end - 1}"
    try:
        consumer = Consumer(consumer_config(opts))
    except (KafkaException, ValueError, TypeError) as exc:
        raise _config_error(exc) from None
    try:
        consumer.assign([KTP(rng.topic, rng.partition, rng.start)])
        cols = _Columns()
        position = rng.start
        progress_at = time.monotonic()
        done = False
        while not done:
            # what is queued now, else wait for the next one (a batch call would wait out its
            # timeout for a full batch)
            msgs = consumer.consume(CONSUME_BATCH, 0) or consumer.consume(1, POLL_S)
            moved = False
            if (
                msgs
                and (msgs[0].offset() or 0) >= rng.start
                and (msgs[-1].offset() or 0) < rng.end
                and all(m.error() is None for m in msgs)
            ):  # the common case: records only, all inside the range
                cols.msgs.extend(msgs)
                position, moved = int(msgs[-1].offset() or 0) + 1, True
                msgs = []
            for m in msgs:
                err = m.error()
                if err is not None:
                    code = err.code()
                    if code == KafkaError._PARTITION_EOF:
                        # everything below the broker's end (m.offset()) was delivered
                        done = (m.offset() or 0) >= rng.end
                        if done:
                            break
                        continue
                    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        restart = _lost(consumer, rng, position, opts, str(err))
                        if restart is None:
                            done = True
                            break
                        position, moved = restart, True
                        continue
                    if err.retriable() or code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                        continue  # librdkafka reconnects; the stall timeout bounds the wait
                    raise BrokerReadError(f"{where}: {err}")
                off = int(m.offset() or 0)
                if off >= rng.end:
                    done = True
                    break
                moved = True
                position = off + 1
                if off < rng.start:
                    continue
                cols.msgs.append(m)
            if len(cols.msgs) >= MAX_BATCH_ROWS:
                yield cols.build(
                    schema, rng.topic, rng.partition, opts.include_headers, TIMESTAMP_LOG_APPEND_TIME
                )
                cols = _Columns()
            if not done:
                # markers, aborted and compacted-away offsets move the position without a message
                now_at = consumer.position([KTP(rng.topic, rng.partition)])[0].offset
                if now_at >= 0 and now_at > position:
                    position, moved = now_at, True
                done = position >= rng.end
            now = time.monotonic()
            if moved:
                progress_at = now
            elif not done and now - progress_at > STALL_TIMEOUT_S:
                raise BrokerReadError(
                    f"{where}: no progress for {STALL_TIMEOUT_S:.0f}s at offset {position} "
                    f"(from {opts.bootstrap_servers}; is the broker reachable, and is offset {rng.end - 1} still there?)"
                )
        if cols.msgs:
            yield cols.build(
                schema, rng.topic, rng.partition, opts.include_headers, TIMESTAMP_LOG_APPEND_TIME
            )
    finally:
        consumer.close()


def _lost(consumer: Any, rng: BrokerRange, position: int, opts: ReadOptions, why: str) -> int | None:
    """Offsets from `position` are gone from the broker (retention): fail (failOnDataLoss), or
    go on from its log start; None when nothing of the range is left."""
    from confluent_kafka import TopicPartition as KTP

    low, _high = consumer.get_watermark_offsets(
        KTP(rng.topic, rng.partition), REQUEST_TIMEOUT_S, cached=False
    )
    msg = f"{rng.topic}-{rng.partition}: offsets {position}..{min(low, rng.end) - 1} are gone (log start is now {low}: {why})"
    if opts.fail_on_data_loss:
        raise DataLossError(msg + "; set failOnDataLoss=false to skip ahead instead")
    log.warning("loglake: %s; skipping ahead (failOnDataLoss=false)", msg)
    if low >= rng.end:
        return None
    consumer.assign([KTP(rng.topic, rng.partition, low)])
    return int(low)


# ---- driver side: the plan's view of the tail --------------------------------------------------

#: Admin clients kept per (servers, settings, isolation) in the driver: a streaming query asks
#: the broker at every trigger.
VIEWS_MAX = 4


@lru_cache(maxsize=VIEWS_MAX)
def _view(servers: str, config: tuple[tuple[str, str], ...], isolation: str) -> BrokerView:
    return BrokerView(
        ReadOptions(
            store_url="", path="", bootstrap_servers=servers, kafka_config=config, isolation=isolation
        )
    )


def broker_view(opts: ReadOptions) -> BrokerView:
    assert opts.bootstrap_servers is not None
    return _view(opts.bootstrap_servers, opts.kafka_config, opts.isolation)


def metadata(opts: ReadOptions) -> Metadata:
    """What a query with `opts` can see: the store's metadata (NoLoglakeDataError if `path` has
    none), and with kafka.bootstrap.servers the broker's ends (hybrid reads) on top of it."""
    from loglake.meta.publish import find_clusters

    store = cached_store(opts.store_url)
    if not opts.hybrid:
        return load_metadata(store, opts.isolation, path=opts.path)
    # a new broker may have published nothing yet: then everything is tail
    meta = (
        load_metadata(store, opts.isolation, path=opts.path)
        if find_clusters(store)
        else Metadata("", 0, {}, {})
    )
    return with_broker(meta, opts)


def with_broker(meta: Metadata, opts: ReadOptions) -> Metadata:
    """`meta` (the store's metadata, read before this call) with each subscribed partition ending
    at the broker's end and its seam at the sealed end; partitions the store's metadata does not
    list yet (a topic created since the last publish) come from the broker, all tail.

    The order matters: the store's sealed end was read first, so it is at or below the broker's
    end asked for now (the seam is the smaller of the two, whatever happens)."""
    view = broker_view(opts)
    cluster, counts = view.partitions()
    if meta.cluster_id and cluster and cluster != meta.cluster_id:
        raise LoglakeOptionError(
            f"kafka.bootstrap.servers {opts.bootstrap_servers} serves cluster {cluster}, but path "
            f"{opts.path} holds cluster {meta.cluster_id}: give the broker that writes that store"
        )
    parts = dict(meta.partitions)
    topics = dict(meta.topics)
    for topic, n in counts.items():
        if not opts.matches(topic):
            continue
        topics.setdefault(topic, {"id": "", "partitions": n, "config": {}, "created_ms": 0})
        for p in range(n):
            parts.setdefault((topic, p), PartitionMeta(topic, "", p, 0, 0, ()))
    # a partition the broker no longer has (topic deleted) is read from its segments only
    mine = [tp for tp in parts if opts.matches(tp[0]) and tp[1] < counts.get(tp[0], 0)]
    ends = view.ends(mine)
    starts = view.starts([tp for tp in mine if tp not in meta.partitions])
    for tp in mine:
        if tp not in ends:
            continue
        pm = parts[tp]
        log_start = starts.get(tp, pm.log_start)
        end = max(ends[tp], log_start)
        parts[tp] = replace(pm, log_start=log_start, end=end, seam=min(pm.end, end))
    return Metadata(meta.cluster_id, meta.seq, topics, parts)
