"""The broker process starts, serves a real client, and shuts down cleanly on SIGTERM."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer

from brokerkit import Broker, free_port, running_broker


def test_serve_produce_consume_and_graceful_shutdown(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "data", ["--metrics-listen", "127.0.0.1:0"]).start()
    try:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)  # idempotent by default in 3.x
        sent = [producer.send("smoke", key=b"k%d" % i, value=b"v%d" % i) for i in range(50)]
        producer.flush()
        assert [f.get().offset for f in sent] == list(range(50))
        producer.close()
        consumer = KafkaConsumer(
            "smoke", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000
        )
        assert [m.value for m in consumer] == [b"v%d" % i for i in range(50)]
        consumer.close()
    finally:
        assert broker.stop(signal.SIGTERM) == 0
    assert "shutdown complete" in broker.log_text()
    # Everything was sealed on the way out: nothing left to replay.
    with running_broker(tmp_path / "data") as again:
        assert "0 WAL frames replayed" in again.log_text()


def test_port_file_and_listening_line(tmp_path: Path) -> None:
    with running_broker(tmp_path / "d") as broker:
        assert (tmp_path / "d.port").read_text().strip() == str(broker.port)


def test_health_endpoints(tmp_path: Path) -> None:
    port = free_port()
    with running_broker(tmp_path / "d", ["--metrics-listen", f"127.0.0.1:{port}"]):
        base = f"http://127.0.0.1:{port}"
        assert urllib.request.urlopen(f"{base}/healthz", timeout=5).read() == b"ok\n"
        assert urllib.request.urlopen(f"{base}/readyz", timeout=5).read() == b"ready\n"
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert "loglake_memory_pool_budget_bytes" in metrics and "loglake_ready 1" in metrics
