"""The embedded API: `loglake.open(path)` gives a Python program the engine without a server.

    with loglake.open("./data") as log:
        log.create_topic("orders", partitions=3)
        md = log.produce("orders", b"v", key=b"k")          # returns once durable
        for rec in log.consume("orders", start="earliest"):
            ...

A `Log` is thread-safe: any number of threads may produce and consume at once.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from datetime import datetime
from itertools import repeat
from typing import Any, NamedTuple

from loglake.engine.compacted import check_keys
from loglake.engine.config import EngineConfig
from loglake.engine.engine import Engine
from loglake.engine.types import AppendResult, FileRange, PartitionInfo, RecoveryReport, TopicInfo
from loglake.errors import ConfigError, OffsetOutOfRangeError, UnknownTopicError
from loglake.fs.base import FileSystem
from loglake.records.batch import TIMESTAMP_LOG_APPEND_TIME
from loglake.records.committed import READ_COMMITTED, READ_UNCOMMITTED, check_isolation, committed_columns
from loglake.records.compression import codec_from_name
from loglake.records.partitioner import default_partition
from loglake.store.base import ObjectStore

Headers = Sequence[tuple[str, bytes | None]]
StartSpec = str | int | datetime | Mapping[int, int]

#: How much one consume() step reads from a partition before moving to the next.
CONSUME_READ_BYTES = 1024 * 1024
#: How long consume(follow=True) waits for new data before checking again.
CONSUME_WAIT_S = 0.5


# RecordMetadata and ConsumerRecord are made once per record, so they are named tuples: immutable
# like the frozen dataclasses they were, and about 6x cheaper to create (a frozen dataclass sets
# each field through object.__setattr__), which was the largest per-record cost of consume().


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    topic_id: str
    partitions: list[PartitionInfo]
    config: dict[str, str]  # effective values
    overrides: dict[str, str]  # what was set explicitly


class Log:
    def __init__(self, engine: Engine, *, auto_create_topics: bool = True, default_partitions: int = 1) -> None:
        self.engine = engine
        self.auto_create_topics = auto_create_topics
        self.default_partitions = default_partitions
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._create_lock = threading.Lock()

    # ---- lifecycle ----------------------------------------------------------------------------

    @property
    def recovery_report(self) -> RecoveryReport | None:
        return self.engine.recovery_report

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def flush(self) -> None:
        """Make everything produced so far durable and seal it into segments."""
        self.engine.flush()

    # ---- topics -------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> TopicInfo:
        return self.engine.create_topic(name, partitions, dict(config or {}))

    def delete_topic(self, name: str) -> None:
        self.engine.delete_topic(name)

    def list_topics(self) -> list[str]:
        return [t.name for t in self.engine.topics()]

    def describe_topic(self, name: str) -> TopicDescription:
        info = self.engine.topic(name)
        effective = info.config.effective(self.engine.config.topic_defaults)
        return TopicDescription(
            info.name,
            info.topic_id,
            [self.engine.partition_info(name, p) for p in range(info.partitions)],
            {k: v for k, (v, _default) in effective.items()},
            dict(info.config.overrides),
        )

    def _ensure_topic(self, topic: str) -> TopicInfo:
        if self.engine.has_topic(topic):
            return self.engine.topic(topic)
        if not self.auto_create_topics:
            raise UnknownTopicError(f"unknown topic {topic!r} (auto_create_topics is off)")
        with self._create_lock:
            if not self.engine.has_topic(topic):
                self.engine.create_topic(topic, self.default_partitions)
        return self.engine.topic(topic)

    # ---- producing ----------------------------------------------------------------------------

    def _pick_partition(self, info: TopicInfo, key: bytes | None, partition: int | None) -> int:
        if partition is not None:
            return partition
        if info.partitions == 1:
            return 0
        if key is not None:
            return default_partition(key, info.partitions)
        counter = self._round_robin.setdefault(info.name, itertools.count())
        return next(counter) % info.partitions

    def produce_async(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        *,
        partition: int | None = None,
        timestamp: int | datetime | None = None,
    ) -> Future[RecordMetadata]:
        """Append one record; the future resolves once it is durable per the topic's class.

        A compacted topic refuses a record without a key: MissingKeyError, raised here.
        """
        info = self._ensure_topic(topic)
        p = self._pick_partition(info, key, partition)
        ts = _timestamp_ms(timestamp)
        if ts is None:
            ts = int(time.time() * 1000)
        inner = self.engine.append_records(topic, p, [(ts, key, value, list(headers or ()))])
        return _chain(inner, lambda r: RecordMetadata(topic, p, r.base_offset, _record_ts(r, ts)))

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        *,
        partition: int | None = None,
        timestamp: int | datetime | None = None,
    ) -> RecordMetadata:
        return self.produce_async(topic, value, key, headers, partition=partition, timestamp=timestamp).result()

    def produce_batch(
        self,
        topic: str,
        records: Iterable[tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Headers]],
        *,
        partition: int | None = None,
        compression: str | None = None,
    ) -> list[RecordMetadata]:
        """Append many (key, value[, headers]) records as one batch per partition; blocks until durable.

        A compacted topic (cleanup.policy includes compact) refuses records without a key: then
        nothing is appended and MissingKeyError names their positions in `records`.
        """
        info = self._ensure_topic(topic)
        if info.config.compacted:
            records = list(records)
            check_keys(topic, partition, (rec[0] for rec in records))
        codec = codec_from_name(compression) if compression else None
        fixed = partition if partition is not None else (0 if info.partitions == 1 else None)
        if fixed is not None:  # one partition for all: the records go to the batch as they are
            futures = [(fixed, self.engine.append_pairs(topic, fixed, records, compression=codec))]
        else:
            by_partition: dict[int, list[Any]] = {}
            for rec in records:  # a record too short fails here, before any partition is appended to
                key, value = rec[0], rec[1]
                p = self._pick_partition(info, key, partition)
                by_partition.setdefault(p, []).append((key, value, rec[2] if len(rec) > 2 else ()))
            futures = [
                (p, self.engine.append_pairs(topic, p, recs, compression=codec)) for p, recs in by_partition.items()
            ]
        out: list[RecordMetadata] = []
        for p, fut in futures:
            r = fut.result()
            base = r.base_offset
            fields = zip(repeat(topic), repeat(p), range(base, r.last_offset + 1), repeat(r.log_append_time))
            out.extend(map(_new, repeat(RecordMetadata), fields))
        return out

    def produce_raw(self, topic: str, partition: int, batches: bytes | bytearray) -> AppendResult:
        """Append pre-built Kafka v2 RecordBatches (offsets are assigned here)."""
        return self.engine.append_batch(topic, partition, batches).result()

    # ---- consuming ----------------------------------------------------------------------------

    def read(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20) -> bytes:
        """Whole record batches from the one holding `offset` (Kafka fetch semantics)."""
        result = self.engine.read(topic, partition, offset, max_bytes)
        return b"".join(bytes(c) for c in result.chunks if not isinstance(c, FileRange))

    def offset_for_timestamp(self, topic: str, partition: int, timestamp: int | datetime) -> int | None:
        """The offset of the partition's first record whose timestamp is at or after `timestamp`
        (a datetime, or milliseconds since the epoch), or None when no record is that late: Kafka's
        ListOffsets by time (`offsetsForTimes`). Records before the log start are not looked at."""
        found = self.engine.offset_for_timestamp(topic, partition, _timestamp_ms(timestamp) or 0)
        return None if found is None else found[0]

    def last_stable_offset(self, topic: str, partition: int) -> int:
        """Where a read_committed reader stops: the first offset of the partition's earliest open
        transaction, else its high watermark."""
        return self.engine.last_stable_offset(topic, partition)

    def consume(
        self,
        topic: str,
        start: StartSpec = "earliest",
        *,
        follow: bool = False,
        partitions: Sequence[int] | None = None,
        idle_timeout: float | None = None,
        isolation: str = READ_UNCOMMITTED,
        until: int | datetime | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[ConsumerRecord]:
        """Records of `topic` from `start`: 'earliest', 'latest', an offset for every partition,
        {partition: offset}, or a datetime. Without `follow` it stops at the ends it saw when it
        started; with `follow` it waits for new data (until `idle_timeout` seconds pass with none,
        if given, or until `stop()` is true: it is asked before each read and at least every
        CONSUME_WAIT_S seconds while waiting, e.g. `stop=event.is_set`).

        `until` (a datetime, or milliseconds since the epoch) bounds a time range: each partition
        ends before its first record with a timestamp at or after `until`, found as
        `offset_for_timestamp` finds it (Kafka's ListOffsets by time; CreateTime need not grow
        with the offset, so this is the offset range between the two lookups, as a Kafka consumer
        seeking by time reads it). It ends the read, so it does not go with `follow`.

        `isolation` is Kafka's isolation.level: 'read_uncommitted' (the default) returns every
        data record up to the high watermark; 'read_committed' stops at the last stable offset
        (an open transaction holds it back; 'latest' and the end are the LSO) and leaves out the
        records of aborted transactions. Transaction markers are never returned."""
        committed = check_isolation(isolation) == READ_COMMITTED
        if until is not None and follow:
            raise ConfigError("consume: `until` ends the read at a time; it does not go with follow=True")
        info = self.engine.topic(topic)
        chosen = list(partitions) if partitions is not None else list(range(info.partitions))
        positions = {p: self._start_offset(topic, p, start, committed) for p in chosen}
        stops = {p: self._end_offset(topic, p, committed) for p in chosen}
        if until is not None:
            for p in chosen:
                found = self.offset_for_timestamp(topic, p, until)
                if found is not None:
                    stops[p] = min(stops[p], found)
        idle_since = time.monotonic()
        while True:
            if stop is not None and stop():
                return
            progressed = False
            holds: dict[int, int] = {}  # partition -> offset to wait past (an open transaction: its high watermark)
            for p in chosen:
                if not follow and positions[p] >= stops[p]:
                    continue
                try:
                    if committed:
                        result, lso, aborted = self.engine.read_committed(topic, p, positions[p], CONSUME_READ_BYTES)
                    else:
                        result = self.engine.read(topic, p, positions[p], CONSUME_READ_BYTES)
                        lso, aborted = result.high_watermark, None
                except OffsetOutOfRangeError as exc:
                    if positions[p] < exc.log_start_offset:
                        positions[p] = exc.log_start_offset  # retention moved the start: go on from there
                        continue
                    raise
                if not result.chunks:
                    if not follow:
                        stops[p] = positions[p]  # nothing more to read here (the end moved back?)
                    elif committed and positions[p] >= lso:
                        holds[p] = max(positions[p], result.high_watermark)
                    continue
                data = b"".join(bytes(c) for c in result.chunks if not isinstance(c, FileRange))
                for header, cols, keep in committed_columns(data, aborted):
                    if keep:
                        ts_type = 1 if header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME else 0
                        offs = cols.offsets
                        if offs and offs[0] >= positions[p] and (follow or offs[-1] < stops[p]):
                            # the whole batch is wanted (the usual case): no checks per record, and
                            # the records are made in one C-level zip of the decoded columns with
                            # the constant fields, not by a Python loop
                            positions[p] = offs[-1] + 1
                            progressed = True
                            fields = zip(
                                repeat(topic),
                                repeat(p),
                                offs,
                                cols.timestamps,
                                repeat(ts_type),
                                cols.keys,
                                cols.values,
                                cols.headers,
                            )
                            yield from map(_new, repeat(ConsumerRecord), fields)
                        else:
                            for off, ts, key, value, hdrs in zip(*cols, strict=True):
                                if off < positions[p]:
                                    continue
                                if not follow and off >= stops[p]:
                                    break
                                positions[p] = off + 1
                                progressed = True
                                yield ConsumerRecord(topic, p, off, ts, ts_type, key, value, hdrs)
                    positions[p] = max(positions[p], min(header.last_offset + 1, result.high_watermark))
            if not follow and all(positions[p] >= stops[p] for p in chosen):
                return
            if progressed:
                idle_since = time.monotonic()
                continue
            if follow:
                waiters = [self.engine.wait_for_data(topic, p, holds.get(p, positions[p])) for p in chosen]
                timeout = CONSUME_WAIT_S
                if idle_timeout is not None:
                    timeout = min(timeout, max(0.0, idle_since + idle_timeout - time.monotonic()))
                wait(waiters, timeout=timeout)
                for w in waiters:
                    w.cancel()
                if stop is not None and stop():
                    return
                if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                    return

    def _end_offset(self, topic: str, partition: int, committed: bool) -> int:
        """Where a reader at this isolation ends now: the LSO (read_committed) or high watermark."""
        if committed:
            return self.engine.last_stable_offset(topic, partition)
        return self.engine.partition_info(topic, partition).high_watermark

    def _start_offset(self, topic: str, partition: int, start: StartSpec, committed: bool = False) -> int:
        pinfo = self.engine.partition_info(topic, partition)
        end = self._end_offset(topic, partition, committed)
        if start == "earliest":
            return pinfo.log_start_offset
        if start == "latest":
            return end
        if isinstance(start, datetime):
            found = self.engine.offset_for_timestamp(topic, partition, _timestamp_ms(start) or 0)
            return end if found is None or found[0] >= end else found[0]
        if isinstance(start, int):
            return max(pinfo.log_start_offset, min(start, pinfo.high_watermark))
        if isinstance(start, Mapping):
            if partition in start:
                return max(pinfo.log_start_offset, min(int(start[partition]), pinfo.high_watermark))
            return pinfo.log_start_offset
        raise ConfigError(f"start must be 'earliest', 'latest', an offset, {{partition: offset}} or a datetime: {start!r}")


_new = tuple.__new__  # a named tuple from a ready tuple, without its __new__'s argument handling


def _timestamp_ms(value: int | datetime | None) -> int | None:
    if value is None or isinstance(value, int):
        return value
    return int(value.timestamp() * 1000)


def _record_ts(result: AppendResult, ts: int | None) -> int:
    if result.log_append_time >= 0:
        return result.log_append_time
    return ts if ts is not None else -1


def _chain(inner: Future[AppendResult], convert: Callable[[AppendResult], RecordMetadata]) -> Future[RecordMetadata]:
    outer: Future[RecordMetadata] = Future()

    def done(f: Future[AppendResult]) -> None:
        exc = f.exception()
        if exc is not None:
            outer.set_exception(exc)
        else:
            outer.set_result(convert(f.result()))

    inner.add_done_callback(done)
    return outer


def open(
    path: str,
    *,
    fs: FileSystem | None = None,
    store: ObjectStore | None = None,
    cold_store: str | ObjectStore | None = None,
    auto_create_topics: bool = True,
    default_partitions: int = 1,
    **config: Any,
) -> Log:
    """Open (or create) a loglake data directory and recover it. Options are EngineConfig fields.

    `cold_store` (a URL such as ``s3://bucket/prefix`` or ``file:///path``, or an ObjectStore)
    turns on tiering: sealed segments past the topic's hot.retain.* bounds move there.
    """
    if isinstance(cold_store, str):
        config["cold_store_url"] = cold_store
        cold_store = None
    engine_config = EngineConfig.from_kwargs(**config)
    engine = Engine(path, engine_config, fs=fs, store=store, cold_store=cold_store)
    engine.open()
    return Log(engine, auto_create_topics=auto_create_topics, default_partitions=default_partitions)
