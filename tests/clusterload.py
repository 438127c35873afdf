"""Client load for the cluster fault tests, recorded into a `logcheck.History`: real
confluent-kafka idempotent producers (acks=all) and a real consumer group committing its offsets,
each in its own thread, plus the final full read the checker compares against.

Each producer writes values unique to it (`logcheck.value_for`), at a paced rate, and records
every attempt's outcome from its delivery report: acked at (partition, offset), or unknown when
librdkafka gave up on it (a timeout after retries, a fatal idempotence error) — an unacknowledged
produce may still have landed, so the checker only forbids it from landing twice.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from logcheck import History, value_for

#: How long librdkafka keeps retrying one record before it gives up (a failover takes seconds;
#: a 30 s bucket outage must not turn every record in flight into an unknown outcome).
MESSAGE_TIMEOUT_MS = 90_000
#: Records a producer may have waiting for a delivery report before it stops to poll.
PRODUCER_QUEUE_MAX = 20_000
#: How often consumers commit what they consumed (synchronously; only acknowledged commits are
#: recorded).
COMMIT_INTERVAL_S = 0.5
#: The final read gives up on a partition it cannot read to its end after this long.
FINAL_READ_TIMEOUT_S = 120.0


class LoadProducer(threading.Thread):
    """One idempotent producer sending `rate` records/s of `size` bytes until `stop()`."""

    def __init__(
        self,
        history: History,
        bootstrap: str,
        topic: str,
        name: str,
        rate: float = 300.0,
        size: int = 100,
        partitions: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name=f"producer-{name}", daemon=True)
        self.history = history
        self.topic = topic
        self.rate = rate
        self.size = size
        self.partitions = partitions
        self.producer_name = name
        self.config = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            "linger.ms": 5,
            "queue.buffering.max.messages": PRODUCER_QUEUE_MAX,
            "topic.metadata.refresh.interval.ms": 1000,
            **(extra or {}),
        }
        self._halt = threading.Event()
        self.sent = 0
        self.acked = 0
        self.errors: list[str] = []
        #: monotonic time of every ack, for "clients carry on" (acks after a fault).
        self.ack_times: list[float] = []
        self.ack_partitions: list[int] = []  # the partition of each ack in ack_times
        self.exc: BaseException | None = None

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the test through `exc`
            self.exc = exc

    def _run(self) -> None:
        p = Producer(self.config)
        seq = 0
        started = time.monotonic()
        while not self._halt.is_set():
            due = started + seq / self.rate
            now = time.monotonic()
            if due > now:
                p.poll(min(due - now, 0.05))
                continue
            value = value_for(self.producer_name, seq, self.size)
            op = self.history.attempt(self.topic, value)
            kwargs: dict[str, Any] = {}
            if self.partitions is not None:
                kwargs["partition"] = seq % self.partitions

            def report(err: Any, msg: Any, op: Any = op) -> None:
                if err is None:
                    self.history.acked(op, msg.partition(), msg.offset())
                    self.acked += 1
                    self.ack_partitions.append(msg.partition())
                    self.ack_times.append(time.monotonic())
                else:
                    self.history.unknown(op, str(err))
                    if len(self.errors) < 100:
                        self.errors.append(str(err))

            while True:
                try:
                    p.produce(self.topic, value, on_delivery=report, **kwargs)
                    break
                except BufferError:
                    p.poll(0.1)
            seq += 1
            self.sent = seq
            p.poll(0)
        remaining = p.flush(MESSAGE_TIMEOUT_MS / 1000 + 10)
        if remaining:
            self.errors.append(f"{remaining} records without a delivery report at the end")


class GroupConsumer(threading.Thread):
    """One member of `group`: consumes `topic`, commits what it consumed every
    `COMMIT_INTERVAL_S` and before giving partitions up; records both."""

    def __init__(self, history: History, bootstrap: str, topic: str, group: str, name: str) -> None:
        super().__init__(name=f"consumer-{name}", daemon=True)
        self.history = history
        self.topic = topic
        self.group = group
        self.config = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": name,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 1000,
            "topic.metadata.refresh.interval.ms": 1000,
        }
        self._halt = threading.Event()
        self.consumed = 0
        self.commit_errors: list[str] = []
        self.exc: BaseException | None = None
        self._pending: dict[int, int] = {}  # partition -> next offset to commit
        #: (time, partitions) of every assignment this member got (rebalances are few).
        self.assignments: list[tuple[str, list[int]]] = []

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.exc = exc

    def _commit(self, c: Consumer) -> None:
        if not self._pending:
            return
        offsets = [TopicPartition(self.topic, p, o) for p, o in sorted(self._pending.items())]
        try:
            done = c.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            if len(self.commit_errors) < 100:
                self.commit_errors.append(str(exc))
            return
        for tp in done or []:
            if tp.error is None:
                self.history.commit(self.group, self.topic, tp.partition, tp.offset, self.config["client.id"])
                if self._pending.get(tp.partition) == tp.offset:
                    del self._pending[tp.partition]

    def _run(self) -> None:
        c = Consumer(self.config)

        def on_revoke(consumer: Any, partitions: list[Any]) -> None:
            self._commit(consumer)
            self._pending.clear()

        def on_assign(consumer: Any, partitions: list[Any]) -> None:
            self.assignments.append((time.strftime("%H:%M:%S"), sorted(tp.partition for tp in partitions)))

        c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
        last_commit = time.monotonic()
        try:
            while not self._halt.is_set():
                m = c.poll(0.2)
                if m is not None:
                    err = m.error()
                    if err is None:
                        self.history.consume(self.group, m.topic(), m.partition(), m.offset(), m.value())
                        self._pending[m.partition()] = m.offset() + 1
                        self.consumed += 1
                    elif err.code() != KafkaError._PARTITION_EOF and len(self.commit_errors) < 100:
                        self.commit_errors.append(f"poll: {err}")
                if time.monotonic() - last_commit >= COMMIT_INTERVAL_S:
                    self._commit(c)
                    last_commit = time.monotonic()
            self._commit(c)
        finally:
            c.close()


def final_read(history: History, bootstrap: str, topic: str, partitions: int) -> None:
    """Read every partition from its start to its high watermark into `history.final`."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"final-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        ends: dict[int, tuple[int, int]] = {}
        for p in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)
            ends[p] = (lo, hi)
        c.assign([TopicPartition(topic, p, lo) for p, (lo, _hi) in ends.items()])
        got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
        todo = {p for p, (lo, hi) in ends.items() if hi > lo}
        deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
        while todo and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(m.error())
                continue
            p = m.partition()
            got[p].append((m.offset(), m.value()))
            if m.offset() + 1 >= ends[p][1]:
                todo.discard(p)
        if todo:
            raise AssertionError(f"final read of {topic}: partitions {sorted(todo)} not read to their end")
        for p, records in got.items():
            history.final_read(topic, p, records)
    finally:
        c.close()


def run_threads(threads: list[Any]) -> None:
    for t in threads:
        t.start()


def stop_threads(threads: list[Any], timeout: float = 150.0) -> None:
    for t in threads:
        t.stop()
    for t in threads:
        if t.is_alive():
            t.join(timeout)
        assert not t.is_alive(), f"{t.name} did not stop within {timeout} s"
        assert t.exc is None, f"{t.name} raised {t.exc!r}"


class Load:
    """Producers and a consumer group on one topic, stopped whatever happens (`with Load(...)`)."""

    def __init__(
        self,
        history: History,
        bootstrap: str,
        topic: str,
        producers: int = 2,
        consumers: int = 3,
        rate: float = 300.0,
        group: str = "g",
        size: int = 100,
    ) -> None:
        self.producers = [
            LoadProducer(history, bootstrap, topic, f"w{i}", rate, size) for i in range(producers)
        ]
        self.consumers = [GroupConsumer(history, bootstrap, topic, group, f"c{i}") for i in range(consumers)]

    def __enter__(self) -> Load:
        run_threads([*self.producers, *self.consumers])
        return self

    def __exit__(self, *exc: object) -> None:
        for t in [*self.producers, *self.consumers]:
            t.stop()
        self.stop_producers()
        self.stop_consumers()

    def acked(self) -> int:
        return sum(p.acked for p in self.producers)

    def consumed(self) -> int:
        return sum(c.consumed for c in self.consumers)

    def partitions_acked(self, since: float, until: float) -> set[int]:
        """Partitions with an ack between the two `time.monotonic()` instants."""
        return {
            part
            for p in self.producers
            for at, part in zip(list(p.ack_times), list(p.ack_partitions), strict=False)
            if since <= at <= until
        }

    def last_ack(self) -> float:
        return max((p.ack_times[-1] for p in self.producers if p.ack_times), default=0.0)

    def wait_acked(self, n: int, timeout_s: float) -> None:
        """Wait until `n` more records than now are acked (clients carry on)."""
        want = self.acked() + n
        deadline = time.monotonic() + timeout_s
        while self.acked() < want:
            if time.monotonic() > deadline:
                errs = [e for p in self.producers for e in p.errors[-3:]]
                raise AssertionError(
                    f"only {self.acked()} of {want} records acked after {timeout_s} s; {errs}"
                )
            time.sleep(0.1)

    def stop_producers(self) -> None:
        stop_threads(self.producers)

    def drain_consumers(self, timeout_s: float) -> None:
        """Let the group catch up with everything acked, then stop it."""
        deadline = time.monotonic() + timeout_s
        while self.consumers and time.monotonic() < deadline and self.consumed() < self.acked():
            time.sleep(0.2)
        self.stop_consumers()

    def stop_consumers(self) -> None:
        stop_threads(self.consumers)
