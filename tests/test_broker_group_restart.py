"""A consumer group survives a broker restart without rebalancing (Kafka's behaviour: the
coordinator reloads the group from its log and the members keep their assignment).

Two confluent-kafka consumers share a topic and commit synchronously; the broker is stopped
(SIGTERM, then kill -9 in a second case) and restarted on the same port. The consumers keep
polling: they must get no further revoke/assign/lost callback, they must keep consuming what is
produced after the restart, and `committed()` after the restart must return at least every
commit that was acknowledged before the stop.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

import loglake

from brokerkit import Broker, free_port, start_on_port

TOPIC = "grp-restart"
GROUP = "survivors"
PARTITIONS = 4
ENV = {"LOGLAKE_GROUP_INITIAL_REBALANCE_DELAY_MS": "0", "LOGLAKE_GROUP_MIN_SESSION_TIMEOUT_MS": "1000"}
#: Long enough that the restart (process start + engine recovery) fits well inside one session.
SESSION_TIMEOUT_MS = 30_000


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[Broker]:
    data = tmp_path / "data"
    with loglake.open(str(data)) as log:
        log.create_topic(TOPIC, PARTITIONS)
    port = free_port()
    b = Broker(data, ["--listen", f"127.0.0.1:{port}"], env=ENV)
    start_on_port(b, port)
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.stop()


def produce(bootstrap: str, start: int, count: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(start, start + count):
        p.produce(TOPIC, value=b"%d" % i, partition=i % PARTITIONS)
    assert p.flush(30) == 0


class Member(threading.Thread):
    """One group member: polls, commits every record synchronously, records every callback."""

    def __init__(self, name: str, bootstrap: str) -> None:
        super().__init__(daemon=True, name=name)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": GROUP,
                "client.id": name,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": 500,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
                "log_level": 3,
            }
        )
        self.lock = threading.Lock()
        self.events: list[tuple[str, list[int]]] = []
        self.assignment: set[int] = set()
        self.values: list[bytes] = []
        self.acked: dict[int, int] = {}  # partition -> last offset whose commit was acknowledged
        self.commit_errors = 0
        self.stopping = threading.Event()

    def _on_assign(self, _c: Any, parts: list[TopicPartition]) -> None:
        with self.lock:
            self.events.append(("assign", sorted(tp.partition for tp in parts)))
            self.assignment = {tp.partition for tp in parts}

    def _on_revoke(self, _c: Any, parts: list[TopicPartition]) -> None:
        with self.lock:
            self.events.append(("revoke", sorted(tp.partition for tp in parts)))
            self.assignment = set()

    def _on_lost(self, _c: Any, parts: list[TopicPartition]) -> None:
        with self.lock:
            self.events.append(("lost", sorted(tp.partition for tp in parts)))
            self.assignment = set()

    def run(self) -> None:
        self.consumer.subscribe([TOPIC], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        while not self.stopping.is_set():
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
            with self.lock:
                self.values.append(msg.value() or b"")
            try:
                self.consumer.commit(message=msg, asynchronous=False)
            except KafkaException:
                with self.lock:
                    self.commit_errors += 1  # not acknowledged: promises nothing
                continue
            with self.lock:
                self.acked[partition] = offset + 1

    def snapshot(self) -> tuple[int, set[int], int, dict[int, int]]:
        with self.lock:
            return len(self.events), set(self.assignment), len(self.values), dict(self.acked)


def wait_until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def committed(bootstrap: str) -> dict[int, int]:
    """The group's committed offsets, read by a client that never joins the group."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False, "log_level": 3})
    try:
        parts = reader.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=15)
    finally:
        reader.close()
    return {tp.partition: tp.offset for tp in parts}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_group_keeps_its_assignment_across_a_broker_restart(broker: Broker, sig: int) -> None:
    port = broker.port
    produce(broker.bootstrap, 0, 400)
    members = [Member(f"m{i}", broker.bootstrap) for i in range(2)]
    for m in members:
        m.start()
    try:
        def acked(snaps: list[tuple[int, set[int], int, dict[int, int]]]) -> dict[int, int]:
            # A partition may have been committed by the member that owned it in an earlier generation.
            return {p: max(s[3].get(p, 0) for s in snaps) for p in range(PARTITIONS)}

        # One generation holding both members: the partitions split between them, all committed.
        def settled() -> bool:
            snaps = [m.snapshot() for m in members]
            parts = [s[1] for s in snaps]
            return (
                all(parts)
                and not parts[0] & parts[1]
                and parts[0] | parts[1] == set(range(PARTITIONS))
                and acked(snaps) == {p: 100 for p in range(PARTITIONS)}
            )

        wait_until(settled, 60, "both members assigned and all 400 records consumed and committed")
        before = [m.snapshot() for m in members]
        acked_before = acked(before)

        code = broker.stop(sig)
        assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
        start_on_port(broker, port)
        assert "resumed Stable with 2 members" in broker.log_text()

        # Every commit acknowledged before the stop is there after it.
        after = committed(broker.bootstrap)
        assert all(after[p] >= acked_before[p] for p in range(PARTITIONS)), (after, acked_before)

        # The members keep consuming, in the same generation: no callback of any kind.
        produce(broker.bootstrap, 400, 400)
        wait_until(lambda: sum(m.snapshot()[2] for m in members) >= 800, 60, "the 400 records produced after restart")
        wait_until(
            lambda: committed(broker.bootstrap) == {p: 200 for p in range(PARTITIONS)}, 30, "commits of the new records"
        )
        for m, (events_before, parts_before, _n, _acked) in zip(members, before, strict=True):
            events, parts, _n, _acked = m.snapshot()
            assert events == events_before, f"{m.name} got callbacks after the restart: {m.events[events_before:]}"
            assert parts == parts_before
        after_restart = sorted(int(v) for m, b in zip(members, before, strict=True) for v in m.values[b[2]:])
        assert after_restart == list(range(400, 800)), "a record was lost or read twice after the restart"
    finally:
        for m in members:
            m.stopping.set()
        for m in members:
            m.join(15)
            m.consumer.close()
