"""Clients across broker restarts: graceful (SIGTERM) and crash (SIGKILL), same data dir and port.

A confluent-kafka idempotent producer (acks=all) keeps producing while the broker goes away and
comes back on the same address; librdkafka reconnects by itself. Afterwards everything that was
acknowledged must be in the log (exactly once for the graceful restart) with dense offsets.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from brokerkit import Broker, free_port, start_on_port

PARTITIONS = 2


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[Broker]:
    port = free_port()
    # brokerkit passes --listen 127.0.0.1:0 first; the later flag wins.
    b = Broker(tmp_path / "data", ["--listen", f"127.0.0.1:{port}", "--default-partitions", str(PARTITIONS)])
    start_on_port(b, port)
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.stop()


class Producing(threading.Thread):
    """Produces records "0", "1", ... with an idempotent acks=all producer until told to stop."""

    def __init__(self, bootstrap: str, topic: str, rate_per_s: float) -> None:
        super().__init__(daemon=True, name="producing")
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 60_000,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
                "log_level": 3,
            }
        )
        self.topic = topic
        self.interval = 1.0 / rate_per_s
        self.sent = 0
        self.acked: dict[int, tuple[int, int]] = {}  # seq -> (partition, offset)
        self.failed: dict[int, str] = {}
        self.fatal: list[str] = []
        self.stopping = threading.Event()

    def _report(self, err: Any, msg: Any) -> None:
        seq = int(msg.value())
        if err is not None:
            self.failed[seq] = str(err)
            if err.fatal():
                self.fatal.append(str(err))
        else:
            self.acked[seq] = (msg.partition(), msg.offset())

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopping.is_set():
            key = b"k%d" % (self.sent % 64)
            try:
                self.producer.produce(self.topic, key=key, value=b"%d" % self.sent, on_delivery=self._report)
                self.sent += 1
            except BufferError:
                pass
            next_at += self.interval
            self.producer.poll(max(0.0, next_at - time.monotonic()))

    def finish(self, timeout: float = 60.0) -> None:
        self.stopping.set()
        self.join(10)
        left = self.producer.flush(timeout)
        assert left == 0, f"{left} records still undelivered after {timeout} s"

    def wait_acked(self, count: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.acked) >= count, (
            f"only {len(self.acked)} acked; failures: {list(self.failed.values())[:3]}"
        )


def consume_everything(bootstrap: str, topic: str) -> dict[int, list[tuple[int, int]]]:
    """{partition: [(offset, seq), ...]} from offset 0 up to the end of every partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused-restart",  # required by the client; never joined
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 3,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    out: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
    at_end: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for msg in consumer.consume(5000, 0.5):
                if msg.error() is not None:
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    at_end.add(msg.partition())
                    continue
                out[msg.partition()].append((msg.offset(), int(msg.value())))
    finally:
        consumer.close()
    assert len(at_end) == PARTITIONS, "did not reach the end of every partition"
    return out


def check_log(
    log: dict[int, list[tuple[int, int]]], acked: dict[int, tuple[int, int]], exactly_once: bool
) -> None:
    for p, records in log.items():
        offsets = [off for off, _seq in records]
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets not dense"
    where = {seq: (p, off) for p, records in log.items() for off, seq in records}
    all_seqs = [seq for records in log.values() for _off, seq in records]
    missing = sorted(set(acked) - set(where))
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:10]}"
    for seq, pos in acked.items():
        assert where[seq] == pos, f"record {seq} acked at {pos}, found at {where[seq]}"
    if exactly_once:
        dupes = len(all_seqs) - len(set(all_seqs))
        assert dupes == 0, f"{dupes} records stored twice"


def _restart_while_producing(broker: Broker, sig: int) -> tuple[Producing, dict[int, list[tuple[int, int]]]]:
    port = broker.port
    topic = "restart"
    producing = Producing(broker.bootstrap, topic, rate_per_s=20_000)  # ~100s of records in flight
    producing.start()
    try:
        producing.wait_acked(20_000)
        code = broker.stop(sig)
        assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
        time.sleep(1.0)  # the producer notices and retries into the void for a while
        start_on_port(broker, port)
        producing.wait_acked(len(producing.acked) + 20_000)
    finally:
        producing.finish()
    assert not producing.fatal, producing.fatal
    return producing, consume_everything(broker.bootstrap, topic)


def test_graceful_restart_while_producing(broker: Broker) -> None:
    producing, log = _restart_while_producing(broker, signal.SIGTERM)
    assert not producing.failed, list(producing.failed.items())[:5]
    assert len(producing.acked) == producing.sent
    check_log(log, producing.acked, exactly_once=True)
    assert sum(len(r) for r in log.values()) == producing.sent
    assert "shutdown complete" in broker.log_text()


def test_crash_restart_while_producing(broker: Broker) -> None:
    producing, log = _restart_while_producing(broker, signal.SIGKILL)
    # Records in flight at the crash may have been stored without an ack, then retried: the
    # idempotent producer's sequence numbers (recovered with the log) must keep them single.
    check_log(log, producing.acked, exactly_once=True)
    stored = {seq for records in log.values() for _off, seq in records}
    assert stored <= set(range(producing.sent))


def test_consumer_continues_across_restart(broker: Broker) -> None:
    port = broker.port
    topic = "restart-consume"
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "unused-restart-consumer",  # required by the client; never joined
            "enable.auto.commit": False,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "fetch.wait.max.ms": 200,
            "log_level": 3,
        }
    )
    producing = Producing(broker.bootstrap, topic, rate_per_s=1000)
    producing.start()
    producing.wait_acked(100)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
    errors: list[str] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is not None:
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        errors.append(str(msg.error()))
                    continue
                got[msg.partition()].append((msg.offset(), int(msg.value())))

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        producing.wait_acked(1500)
        broker.stop(signal.SIGTERM)
        time.sleep(1.0)
        start_on_port(broker, port)
        producing.wait_acked(len(producing.acked) + 1500)
    finally:
        producing.finish()
    # The consumer catches up with everything produced, before and after the restart.
    deadline = time.monotonic() + 30
    while sum(len(r) for r in got.values()) < len(producing.acked) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    thread.join(10)
    consumer.close()
    fatal = [e for e in errors if "fatal" in e.lower()]
    assert not fatal, fatal
    for p, records in got.items():
        assert [off for off, _s in records] == list(range(len(records))), f"partition {p}: gap or repeat"
    check_log(got, producing.acked, exactly_once=True)
    assert got == consume_everything(broker.bootstrap, topic)
