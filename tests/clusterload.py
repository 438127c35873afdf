"""Client load for the cluster fault tests, recorded into a `logcheck.History`: real
confluent-kafka idempotent producers (acks=all) and a real consumer group committing its offsets,
each in its own thread, plus the final full read the checker compares against.

Each producer writes values unique to it (`logcheck.value_for`), at a paced rate, and records
every attempt's outcome from its delivery report: acked at (partition, offset), or unknown when
librdkafka gave up on it (a timeout after retries, a fatal idempotence error) — an unacknowledged
produce may still have landed, so the checker only forbids it from landing twice.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from logcheck import History, value_for
from txncheck import ABORTED, COMMITTED, UNKNOWN, TxnHistory, TxnOp, processed_value, txn_value

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


def read_to_end(
    bootstrap: str,
    topic: str,
    partitions: int,
    isolation: str = "read_uncommitted",
    ends: dict[int, int] | None = None,
) -> dict[int, list[tuple[int, bytes]]]:
    """(offset, value) of every record of every partition from its log start to its end: the high
    watermark, or `ends` when given. A read_committed reader reaches an end only once the last
    stable offset has (every transaction below it decided); the end is where the reader's fetch
    position stands at a partition EOF, so control records and aborted records, which it skips,
    count. Raises when a partition is not read to its end within FINAL_READ_TIMEOUT_S."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"final-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    try:
        starts: dict[int, int] = {}
        his: dict[int, int] = {}
        for p in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)
            starts[p], his[p] = lo, hi if ends is None else ends[p]
        c.assign([TopicPartition(topic, p, lo) for p, lo in starts.items()])
        got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in starts}
        todo = {p for p in starts if his[p] > starts[p]}
        deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
        while todo and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            p = m.partition()
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(m.error())
                if m.offset() >= his[p]:
                    todo.discard(p)
                continue
            got[p].append((m.offset(), m.value()))
            if m.offset() + 1 >= his[p]:
                todo.discard(p)
        if todo:
            raise AssertionError(
                f"final {isolation} read of {topic}: partitions {sorted(todo)} not read to their end "
                f"{ {p: his[p] for p in sorted(todo)} }"
            )
        return got
    finally:
        c.close()


def final_read(history: History, bootstrap: str, topic: str, partitions: int) -> None:
    """Read every partition from its start to its high watermark into `history.final`."""
    for p, records in read_to_end(bootstrap, topic, partitions).items():
        history.final_read(topic, p, records)


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



def wait_for_more(count: Callable[[], int], n: int, timeout_s: float, what: str, producers: Sequence[Any]) -> None:
    """Wait until `count()` is `n` above what it is now; past `timeout_s`, fail naming the
    producers' last errors."""
    want = count() + n
    deadline = time.monotonic() + timeout_s
    while count() < want:
        if time.monotonic() > deadline:
            errs = [e for p in producers for e in p.errors[-3:]]
            raise AssertionError(f"only {count()} of {want} {what} after {timeout_s} s; {errs}")
        time.sleep(0.1)

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
        wait_for_more(self.acked, n, timeout_s, "records acked", self.producers)

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


# ---- transactions -------------------------------------------------------------------------------

#: How long one call of librdkafka's transactional API may take before it times out (retriable):
#: a commit waits for every partition's marker, which a failover or a bucket outage delays.
TXN_CALL_TIMEOUT_S = 30.0
#: How long a transaction's commit or abort is retried before the producer gives up on it and
#: builds a new one (whose InitProducerId settles it).
TXN_END_WAIT_S = 120.0
#: The producers' transaction timeout: the coordinator aborts a transaction open longer than this.
TXN_TIMEOUT_MS = 60_000
#: Every this-many-th transaction (on average) is aborted on purpose.
TXN_ABORT_ONE_IN = 5
#: Records per transaction (at least two, on two partitions or more).
TXN_RECORDS = (2, 6)


class _Fatal(Exception):
    """The producer is unusable (librdkafka's fatal error, or a transaction it could not end):
    build a new one with the same transactional.id."""


class TxnProducer(threading.Thread):
    """One transactional producer running `rate` transactions/s of a few records over two or more
    of `partitions` until `stop()`: most committed, one in TXN_ABORT_ONE_IN aborted on purpose,
    each recorded in a `txncheck.TxnHistory` with the outcome the client saw.

    Kafka's rules for errors (librdkafka's KafkaError flags): a retriable error of commit or abort
    retries the same call; an error that `txn_requires_abort()` aborts the transaction and goes on;
    a `fatal()` one (fenced, ...) ends this producer: a new one with the same transactional.id
    (its InitProducerId settles the previous transaction) carries on."""

    def __init__(
        self,
        history: TxnHistory,
        bootstrap: str,
        topic: str,
        name: str,
        partitions: int,
        rate: float = 2.0,
        seed: int = 0,
        size: int = 100,
    ) -> None:
        super().__init__(name=f"txn-producer-{name}", daemon=True)
        assert partitions >= 2
        self.history = history
        self.topic = topic
        self.producer_name = name
        self.partitions = partitions
        self.rate = rate
        self.size = size
        self.rng = random.Random(seed)
        self.config = {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{name}-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": TXN_TIMEOUT_MS,
            "message.timeout.ms": TXN_TIMEOUT_MS - 5_000,  # librdkafka: no longer than the transaction's
            "linger.ms": 5,
            "topic.metadata.refresh.interval.ms": 1000,
        }
        self._halt = threading.Event()
        self.committed = 0
        self.errors: list[str] = []
        self.exc: BaseException | None = None

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the test through `exc`
            self.exc = exc

    def _note(self, what: str) -> None:
        if len(self.errors) < 100:
            self.errors.append(f"{time.strftime('%H:%M:%S')} {what}")

    def _new_producer(self) -> Producer | None:
        """A producer whose init_transactions succeeded (retried until it does), or None once
        stopped."""
        while not self._halt.is_set():
            p = Producer(self.config)
            while not self._halt.is_set():
                try:
                    p.init_transactions(TXN_CALL_TIMEOUT_S)
                    return p
                except KafkaException as exc:
                    err = exc.args[0]
                    self._note(f"init_transactions: {err}")
                    if err.fatal() or not err.retriable():
                        break
                    time.sleep(0.5)
            time.sleep(0.5)
        return None

    def _run(self) -> None:
        p = self._new_producer()
        txn = 0
        started = time.monotonic()
        while p is not None and not self._halt.is_set():
            due = started + txn / self.rate
            if due > time.monotonic():
                p.poll(min(due - time.monotonic(), 0.05))
                continue
            op = self.history.begin(self.producer_name, txn)
            txn += 1
            try:
                self._transaction(p, op, abort=self.rng.randrange(TXN_ABORT_ONE_IN) == 0)
            except _Fatal:
                self.history.rebuilt += 1
                p = self._new_producer()

    def _transaction(self, p: Producer, op: TxnOp, abort: bool) -> None:
        """Run transaction `op` to its end; raises _Fatal (with `op`'s outcome recorded) when `p`
        is unusable."""
        n = self.rng.randint(*TXN_RECORDS)
        first = self.rng.sample(range(self.partitions), 2)
        parts = first + [self.rng.randrange(self.partitions) for _ in range(n - 2)]
        try:
            p.begin_transaction()
            for i, part in enumerate(parts):
                self._send(p, op, part, txn_value(self.producer_name, op.txn, i, self.size))
        except KafkaException as exc:
            err = exc.args[0]
            self._note(f"txn {op.txn} produce: {err}")
            if err.fatal():
                self.history.end(op, ABORTED, f"never committed: fatal {err}")
                raise _Fatal from exc
            self._abort(p, op, f"produce failed: {err}")
            return
        self._end(p, op, abort)

    def _send(self, p: Producer, op: TxnOp, part: int, value: bytes) -> None:
        """Produce `value` in `op` to partition `part`, recording it and its delivery."""
        self.history.produced(op, part, value)

        def report(err: Any, msg: Any) -> None:
            if err is None:
                self.history.delivered(op, value, msg.offset())

        while True:
            try:
                p.produce(self.topic, value, partition=part, on_delivery=report)
                return
            except BufferError:
                p.poll(0.1)

    def _end(self, p: Producer, op: TxnOp, abort: bool) -> None:
        """Commit `op`, or abort it once its records landed."""
        if abort:
            # abort_transaction purges records still queued: deliver them first, so that the
            # aborted records are in the log and read_committed readers have something to skip.
            p.flush(TXN_CALL_TIMEOUT_S)
            self._abort(p, op, "aborted on purpose")
        else:
            self._commit(p, op)

    def _commit(self, p: Producer, op: TxnOp) -> None:
        self.history.commit_asked(op)
        deadline = time.monotonic() + TXN_END_WAIT_S
        while True:
            try:
                p.commit_transaction(TXN_CALL_TIMEOUT_S)
            except KafkaException as exc:
                err = exc.args[0]
                self._note(f"txn {op.txn} commit: {err}")
                if err.txn_requires_abort():
                    # Kafka refuses to abort a transaction once its commit is prepared: an abort
                    # that succeeds means the commit did not happen.
                    self._abort(p, op, f"commit failed ({err}), then aborted")
                    return
                if err.retriable() and not err.fatal() and time.monotonic() < deadline:
                    continue
                self.history.end(op, UNKNOWN, f"commit: {err}")
                raise _Fatal from exc
            self.history.end(op, COMMITTED)
            self.committed += 1
            return

    def _abort(self, p: Producer, op: TxnOp, why: str) -> None:
        deadline = time.monotonic() + TXN_END_WAIT_S
        while True:
            try:
                p.abort_transaction(TXN_CALL_TIMEOUT_S)
            except KafkaException as exc:
                err = exc.args[0]
                self._note(f"txn {op.txn} abort: {err}")
                if err.retriable() and not err.fatal() and time.monotonic() < deadline:
                    continue
                # Not aborted for sure; committed only if a commit was asked for.
                outcome = UNKNOWN if op.commit_asked else ABORTED
                self.history.end(op, outcome, f"{why}; abort: {err}")
                raise _Fatal from exc
            self.history.end(op, ABORTED, why)
            return


#: Input records one read-process-write transaction takes at most.
PROCESS_BATCH = 8
#: The group whose offsets the read-process-write transactions commit.
PROCESS_GROUP = "rpw"
#: A send_offsets_to_transaction(timeout TXN_CALL_TIMEOUT_S) still blocked after this is hung.
SEND_OFFSETS_HUNG_S = 2 * TXN_CALL_TIMEOUT_S + 15


class TxnProcessor(TxnProducer):
    """Consume-transform-produce, exactly once: reads `source` under read_committed (assigned,
    at the committed offsets of `group`) and, per batch of up to PROCESS_BATCH records, runs one
    transaction that writes one output per input to `topic` (the input's partition) and commits
    the batch's offsets with it (send_offsets_to_transaction). One in TXN_ABORT_ONE_IN is aborted
    on purpose; after any transaction that did not commit, and after a new producer, the
    consumer goes back to the group's committed offsets, as a Kafka Streams task does."""

    def __init__(
        self, history: TxnHistory, bootstrap: str, source: str, topic: str, partitions: int,
        group: str, name: str = "rpw", seed: int = 0,
    ) -> None:  # fmt: skip
        super().__init__(history, bootstrap, topic, name, partitions, seed=seed)
        self.source = source
        self.group = group
        self.consumer_config = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
        }
        self.rewinds = 0
        #: send_offsets_to_transaction calls that blocked past SEND_OFFSETS_HUNG_S.
        self.hung = 0

    def _rewind(self, c: Consumer) -> None:
        """Assign every source partition at the group's committed offset (stable: librdkafka asks
        with require_stable under read_committed)."""
        tps = [TopicPartition(self.source, q) for q in range(self.partitions)]
        while not self._halt.is_set():
            try:
                got = c.committed(tps, timeout=TXN_CALL_TIMEOUT_S)
            except KafkaException as exc:
                self._note(f"committed: {exc.args[0]}")
                time.sleep(0.5)
                continue
            c.assign(
                [
                    TopicPartition(
                        self.source, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                    )
                    for tp in got
                ]
            )
            self.rewinds += 1
            return

    def _run(self) -> None:
        c = Consumer(self.consumer_config)
        try:
            p = self._new_producer()
            self._rewind(c)
            txn = 0
            while p is not None and not self._halt.is_set():
                msgs = [m for m in c.consume(PROCESS_BATCH, 0.5) if m.error() is None]
                if not msgs:
                    continue
                op = self.history.begin(self.producer_name, txn)
                txn += 1
                try:
                    self._process(p, c, op, msgs, abort=self.rng.randrange(TXN_ABORT_ONE_IN) == 0)
                except _Fatal:
                    self.history.rebuilt += 1
                    p = self._new_producer()
                if op.outcome != COMMITTED:
                    self._rewind(c)
        finally:
            c.close()

    def _send_offsets(self, p: Producer, c: Consumer, op: TxnOp, offsets: list[TopicPartition]) -> None:
        """send_offsets_to_transaction, watched: librdkafka (2.16) can block in it for ever, past
        its timeout, once the group's coordinator it cached is gone (its issues #5456 and #5511;
        a killed broker leaves Metadata). Then the producer is given up: `op` was never asked to
        commit, and the next producer's InitProducerId fences this one and aborts it."""
        done = threading.Event()
        failed: list[KafkaException] = []

        def call() -> None:
            try:
                p.send_offsets_to_transaction(offsets, c.consumer_group_metadata(), TXN_CALL_TIMEOUT_S)
            except KafkaException as exc:
                failed.append(exc)
            finally:
                done.set()

        threading.Thread(target=call, name=f"{self.name}-send-offsets", daemon=True).start()
        if not done.wait(SEND_OFFSETS_HUNG_S):
            self.hung += 1
            self._note(f"txn {op.txn}: send_offsets_to_transaction blocked past {SEND_OFFSETS_HUNG_S} s")
            self.history.end(
                op, ABORTED, "never committed: send_offsets_to_transaction hung; producer replaced"
            )
            raise _Fatal
        if failed:
            raise failed[0]

    def _process(self, p: Producer, c: Consumer, op: TxnOp, msgs: list[Any], abort: bool) -> None:
        positions: dict[int, int] = {}
        try:
            p.begin_transaction()
            for i, m in enumerate(msgs):
                value = processed_value(self.producer_name, op.txn, i, m.partition(), m.offset(), m.value())
                self._send(p, op, m.partition(), value)
                positions[m.partition()] = m.offset() + 1
            offsets = [TopicPartition(self.source, q, o) for q, o in sorted(positions.items())]
            self._send_offsets(p, c, op, offsets)
        except KafkaException as exc:
            err = exc.args[0]
            self._note(f"txn {op.txn} produce/offsets: {err}")
            if err.fatal():
                self.history.end(op, ABORTED, f"never committed: fatal {err}")
                raise _Fatal from exc
            self._abort(p, op, f"produce or offsets failed: {err}")
            return
        self._end(p, op, abort)


def group_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The committed offsets of `group` (stable ones: asked under read_committed); -1 for none."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"})
    try:
        got = c.committed([TopicPartition(topic, q) for q in range(partitions)], timeout=60)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


class CommittedReader(threading.Thread):
    """Reads every partition of `topic` under read_committed from the start while the schedule
    runs (assigned, no group), recording every record into `history.read_committed`."""

    def __init__(self, history: TxnHistory, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(name=f"committed-reader-{topic}", daemon=True)
        self.history = history
        self.topic = topic
        self.partitions = partitions
        self.config = {
            "bootstrap.servers": bootstrap,
            "group.id": f"rc-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
        }
        self._halt = threading.Event()
        self.read = 0
        self.errors: list[str] = []
        self.exc: BaseException | None = None

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            c = Consumer(self.config)
            try:
                c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)])
                while not self._halt.is_set():
                    m = c.poll(0.2)
                    if m is None:
                        continue
                    if m.error() is not None:
                        if len(self.errors) < 100:
                            self.errors.append(str(m.error()))
                        continue
                    self.history.read_committed(m.partition(), m.offset(), m.value())
                    self.read += 1
            finally:
                c.close()
        except BaseException as exc:
            self.exc = exc


class TxnLoad:
    """Transactional producers and a read_committed reader on one topic and, given a `sink`
    history, a read-process-write processor from that topic to the sink's (same partitions,
    offsets of group PROCESS_GROUP); `with TxnLoad(...)`."""

    def __init__(
        self, history: TxnHistory, bootstrap: str, topic: str, partitions: int, producers: int = 2,
        rate: float = 2.0, seed: int = 0, sink: TxnHistory | None = None,
    ) -> None:  # fmt: skip
        self.producers = [
            TxnProducer(history, bootstrap, topic, f"tx{i}", partitions, rate, seed + i)
            for i in range(producers)
        ]
        self.processors = (
            []
            if sink is None
            else [
                TxnProcessor(
                    sink, bootstrap, topic, sink.topic, partitions, PROCESS_GROUP, seed=seed + producers
                )
            ]
        )
        self.reader = CommittedReader(history, bootstrap, topic, partitions)

    def threads(self) -> list[Any]:
        return [*self.producers, *self.processors, self.reader]

    def __enter__(self) -> TxnLoad:
        run_threads(self.threads())
        return self

    def __exit__(self, *exc: object) -> None:
        for t in self.threads():
            t.stop()
        self.stop()

    def committed(self) -> int:
        return sum(p.committed for p in self.producers)

    def wait_committed(self, n: int, timeout_s: float) -> None:
        """Wait until `n` more transactions than now are committed (transactions carry on)."""
        wait_for_more(self.committed, n, timeout_s, "transactions committed", self.producers)

    def stop(self) -> None:
        """Stop the producers (each ends the transaction it is in), the processor, the reader."""
        stop_threads(self.producers, TXN_END_WAIT_S + 60)
        stop_threads(self.processors, TXN_END_WAIT_S + 60)
        stop_threads([self.reader])


def final_txn_read(history: TxnHistory, bootstrap: str, partitions: int) -> None:
    """Read `history.topic` to its high watermark read_uncommitted, then read_committed once the
    last stable offset reached it, into the history's final reads."""
    for p, records in read_to_end(bootstrap, history.topic, partitions).items():
        history.final_uncommitted(p, records)
    ends = {p: max(records, default=-1) + 1 for p, records in history.uncommitted_final.items()}
    # The high watermark may be past the last data record (a marker): ask for it again.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hw-{uuid.uuid4().hex}"})
    try:
        for p in range(partitions):
            _lo, hi = c.get_watermark_offsets(TopicPartition(history.topic, p), timeout=30, cached=False)
            ends[p] = max(ends.get(p, 0), hi)
    finally:
        c.close()
    for p, records in read_to_end(bootstrap, history.topic, partitions, "read_committed", ends).items():
        history.final_committed(p, records)
