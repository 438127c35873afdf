"""`loglake produce|consume --bootstrap-server`: lines in and records out through a running broker.

produce: one record per line through a confluent-kafka Producer (murmur2 partitioning, as the
Java client and loglake's own produce); the topic is created with 1 partition if missing, as the
data-dir produce does. consume: a Consumer that assigns the partitions itself (no group, nothing
committed), or with --group joins that consumer group and commits the offsets of the records it
has printed. Without --follow it stops once every partition it reads has reached its end.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from loglake.cli.common import CliError, format_bytes, note, plural, stderr_console, strip_newline
from loglake.cli.remote import (
    ADMIN_CALL_TIMEOUT_S,
    REMOTE_TIMEOUT_S,
    Remote,
    consumer,
    denied,
    describe_error,
    error_name,
    producer,
    result,
)
from loglake.log import ConsumerRecord, StartSpec

#: Input files above this size get a progress bar (when stderr is a terminal).
PROGRESS_MIN_BYTES = 1024 * 1024
#: How long produce waits for the last records to be acknowledged.
FLUSH_TIMEOUT_S = 60.0
#: One consumer poll; also how quickly Ctrl-C / SIGTERM is noticed while following.
POLL_S = 0.5


# ---- produce ------------------------------------------------------------------------------------


def ensure_topic(remote: Remote, topic: str) -> list[int]:
    """The topic's partitions; creates it with 1 partition when the broker does not know it."""
    from confluent_kafka.admin import NewTopic

    md = remote.metadata().topics.get(topic)
    if md is not None and md.partitions:
        return sorted(md.partitions)
    futures = remote.admin.create_topics([NewTopic(topic, num_partitions=1)], request_timeout=REMOTE_TIMEOUT_S)
    try:
        futures[topic].result(timeout=ADMIN_CALL_TIMEOUT_S)
        note(f"created topic {topic} (1 partition)")
    except Exception as exc:
        if error_name(exc) == "TOPIC_AUTHORIZATION_FAILED":
            # it may exist: a principal that may not describe a topic is told nothing of it
            raise denied(f"authorization denied on topic {topic!r}", " (not allowed to describe it, nor to create it)") from None
        if "already exists" not in describe_error(exc).lower():
            result(futures[topic], f"create topic {topic}")
    return remote.partitions(topic)


def produce(
    bootstrap: str,
    topic: str,
    src: BinaryIO,
    total: int,
    sep: bytes | None,
    partition: int | None,
    headers: list[tuple[str, bytes | None]],
    interactive: bool,
    file: Path | None,
) -> None:
    started = time.perf_counter()
    remote = Remote(bootstrap)
    parts = ensure_topic(remote, topic)
    if partition is not None and partition not in parts:
        raise CliError(f"topic {topic!r} has no partition {partition} (it has {len(parts)})")
    p = producer(
        bootstrap,
        **{"partitioner": "murmur2_random", "linger.ms": 5, "message.timeout.ms": int(FLUSH_TIMEOUT_S * 1000)},
    )
    failures: list[str] = []
    refused = False  # the broker refused the principal WRITE on the topic
    acked = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal acked, refused
        if err is not None:
            failures.append(err.str() if hasattr(err, "str") else str(err))
            refused = refused or (hasattr(err, "name") and err.name() == "TOPIC_AUTHORIZATION_FAILED")
        else:
            acked += 1

    extra: dict[str, Any] = {"on_delivery": on_delivery}
    if partition is not None:
        extra["partition"] = partition
    if headers:
        extra["headers"] = headers
    bytes_in = 0
    with contextlib.ExitStack() as stack:
        progress: Progress | None = None
        task = None
        if file is not None and total > PROGRESS_MIN_BYTES and stderr_console().is_terminal:
            progress = stack.enter_context(
                Progress(
                    TextColumn("producing"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=stderr_console(), transient=True,
                )
            )
            task = progress.add_task("produce", total=total)
        for lineno, raw in enumerate(src, 1):
            line = strip_newline(raw)
            key: bytes | None = None
            value = line
            if sep is not None:
                k, found, v = line.partition(sep)
                if not found:
                    p.flush(FLUSH_TIMEOUT_S)
                    raise CliError(
                        f"line {lineno} has no key separator {sep.decode(errors='replace')!r} "
                        f"({plural(acked, 'record')} before it were produced)"
                    )
                key, value = k, v
            while True:
                try:
                    p.produce(topic, value=value, key=key, **extra)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    p.poll(0.1)
            bytes_in += len(raw)
            if progress is not None and task is not None:
                progress.advance(task, len(raw))
            p.poll(0)
            if interactive:
                p.flush(FLUSH_TIMEOUT_S)
            if failures:
                break
        left = p.flush(FLUSH_TIMEOUT_S)
    if refused:
        raise denied(f"produce to {topic}: authorization denied on topic {topic!r}", f" (not allowed to write to it; {plural(acked, 'record')} were produced)")
    if failures:
        raise CliError(f"produce to {topic} failed: {failures[0]} ({plural(acked, 'record')} were produced)")
    if left:
        raise CliError(f"{plural(left, 'record')} to {topic} were not acknowledged by {bootstrap} within {FLUSH_TIMEOUT_S:g}s")
    seconds = time.perf_counter() - started
    rate = acked / seconds if seconds > 0 else 0.0
    stderr_console().print(
        f"produced {plural(acked, 'record')} ({format_bytes(bytes_in)}) to {topic} in {seconds:.2f}s ({rate:,.0f} records/s)",
        markup=False,
    )


# ---- consume ------------------------------------------------------------------------------------


def _record(msg: Any) -> ConsumerRecord:
    ts_type, ts = msg.timestamp()
    return ConsumerRecord(
        topic=msg.topic(),
        partition=msg.partition(),
        offset=msg.offset(),
        timestamp=ts,
        timestamp_type=1 if ts_type == 2 else 0,  # librdkafka: 1 CreateTime, 2 LogAppendTime
        key=msg.key(),
        value=msg.value(),
        headers=list(msg.headers() or []),
    )


class RemoteRecords:
    """The records of `topic` from a running broker; iterate, and call `done` for each printed one."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        spec: StartSpec,
        partitions: list[int] | None,
        follow: bool,
        group: str | None,
        isolation: str = "read_uncommitted",
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

        self.topic = topic
        self.stop = stop
        self.follow = follow
        self.group = group
        remote = Remote(bootstrap)
        parts = remote.partitions(topic)
        for p in partitions or []:
            if p not in parts:
                raise CliError(f"topic {topic!r} has no partition {p} (it has {len(parts)})")
        reset = spec if spec in ("earliest", "latest") else "earliest"
        # read_committed: librdkafka stops at the last stable offset (its end and partition EOF are
        # the LSO there) and drops aborted transactions' records; markers are never delivered
        conf: dict[str, Any] = {"enable.partition.eof": True, "auto.offset.reset": reset, "isolation.level": isolation}
        if group is not None:
            conf |= {"group.id": group, "enable.auto.commit": True, "enable.auto.offset.store": False}
        else:
            conf |= {"group.id": f"loglake-cli-{time.time_ns()}", "enable.auto.commit": False}
        self.consumer = consumer(bootstrap, **conf)
        self.pending: set[int] = set()  # partitions not yet read to their end
        self.assigned = False
        if group is not None:
            self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
            return
        wanted = sorted(set(partitions)) if partitions else parts
        if isinstance(spec, datetime):
            found = remote.offsets(topic, wanted, int(spec.timestamp() * 1000))
            starts = {p: (o if o >= 0 else OFFSET_END) for p, o in found.items()}
        elif isinstance(spec, int):  # clamped to the log, as the data-dir consume
            lows, highs = remote.offsets(topic, wanted, "earliest"), remote.offsets(topic, wanted, "latest")
            starts = {p: min(max(spec, lows[p]), highs[p]) for p in wanted}
        else:
            starts = dict.fromkeys(wanted, OFFSET_BEGINNING if spec == "earliest" else OFFSET_END)
        self.consumer.assign([TopicPartition(topic, p, starts[p]) for p in wanted])
        self.pending = set(wanted)
        self.assigned = True

    def _on_assign(self, consumer: Any, tps: list[Any]) -> None:
        self.pending |= {tp.partition for tp in tps}
        self.assigned = True

    def _on_revoke(self, consumer: Any, tps: list[Any]) -> None:
        self.pending -= {tp.partition for tp in tps}

    def __iter__(self) -> Iterator[ConsumerRecord]:
        from confluent_kafka import KafkaError

        waited = 0.0
        while True:
            if self.stop() or (not self.follow and self.assigned and not self.pending):
                return
            msg = self.consumer.poll(POLL_S)
            if msg is None:
                if not self.assigned:
                    waited += POLL_S
                    if waited > ADMIN_CALL_TIMEOUT_S:
                        raise CliError(f"group {self.group}: no partitions of {self.topic} were assigned")
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.pending.discard(msg.partition())
                    continue
                if err.fatal() or err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    raise CliError(f"consume {self.topic}: {err.str()}")
                continue  # transient (a broker restart while following): librdkafka retries
            yield _record(msg)

    def done(self, rec: ConsumerRecord) -> None:
        """`rec` was printed: in a group, its offset is committed (periodically and at close)."""
        if self.group is not None:
            from confluent_kafka import TopicPartition

            self.consumer.store_offsets(offsets=[TopicPartition(rec.topic, rec.partition, rec.offset + 1)])

    def shutdown(self) -> None:
        """Commit what was printed (in a group), leave the group, close the connections."""
        with contextlib.suppress(Exception):
            if self.group is not None:
                self.consumer.commit(asynchronous=False)
        with contextlib.suppress(Exception):
            self.consumer.close()


@contextlib.contextmanager
def records(
    bootstrap: str,
    topic: str,
    spec: StartSpec,
    partitions: list[int] | None,
    follow: bool,
    group: str | None,
    isolation: str = "read_uncommitted",
    stop: Callable[[], bool] = lambda: False,
) -> Iterator[RemoteRecords]:
    """The records, read until the end (or for ever with `follow`) or until `stop()` is true
    (asked before each poll of POLL_S)."""
    recs = RemoteRecords(bootstrap, topic, spec, partitions, follow, group, isolation, stop)
    try:
        yield recs
    finally:
        recs.shutdown()
