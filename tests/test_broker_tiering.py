"""Tiering through the real broker: cold history consumed byte-identical, and disaster recovery."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import InProcessBroker

TOPIC_CONFIG = {"segment.bytes": "65536", "hot.retain.segments": "0", "retention.ms": "-1"}


def cold_segments(bucket: Path) -> list[Path]:
    return sorted(bucket.rglob("*.seg"))


def consume_all(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes | None, bytes | None]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + 60
    while len(out) < count and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=1.0):
            if not m.error():
                out.append((m.offset(), m.key(), m.value()))
    c.close()
    return out


def test_cold_history_through_the_broker_and_disaster_recovery(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    url = f"file://{bucket}"
    broker = InProcessBroker(tmp_path / "a", ["--cold-store", url]).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("t", 1, config=TOPIC_CONFIG)])["t"].result(10)
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "compression.type": "zstd", "linger.ms": 5})
        # Incompressible values, so zstd leaves several 64 KiB segments' worth.
        sent = [(b"k%d" % i, b"".join(hashlib.sha256(b"%d-%d" % (i, j)).digest() for j in range(6))) for i in range(5000)]
        for i, (k, v) in enumerate(sent):
            p.produce("t", key=k, value=v)
            if i % 500 == 499:
                assert p.flush(30) == 0  # ten separate appends: a segment holds whole appends
        local_dir = tmp_path / "a" / "segments"
        deadline = time.monotonic() + 30  # sealed segments go to the bucket within a few ticks
        while time.monotonic() < deadline and (len(cold_segments(bucket)) < 5 or list(local_dir.rglob("*.seg"))):
            time.sleep(0.1)
        # hot.retain.segments=0: relocated copies were deleted (the broker's log says why not)
        assert len(cold_segments(bucket)) >= 5, broker.log_text()[-6000:]
        assert not list(local_dir.rglob("*.seg")), broker.log_text()[-6000:]
        got = consume_all(broker.bootstrap, "t", len(sent))
        assert [(k, v) for _o, k, v in got] == sent
        assert [o for o, _k, _v in got] == list(range(len(sent)))
    finally:
        assert broker.stop() == 0  # clean shutdown seals and uploads the rest
    assert list((bucket / next(bucket.iterdir()).name / "meta").glob("checkpoint-*.bin"))
    # The data disk is lost: a new broker on an empty directory, same bucket.
    restored = InProcessBroker(tmp_path / "b", ["--cold-store", url]).start()
    try:
        assert "restored from" in restored.log_text()
        got = consume_all(restored.bootstrap, "t", len(sent))
        in_bucket = len(got)
        assert [(k, v) for _o, k, v in got] == sent[:in_bucket]
        assert in_bucket > 0
    finally:
        restored.stop()
