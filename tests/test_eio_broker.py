"""An S3 5xx storm under a real `loglake serve` with real clients (confluent-kafka), the cold
store being moto behind the fault proxy (tests/s3kit.py) answering 503 to everything:

- during relocation: producers never notice, uploads retry with backoff and the segments stay
  hot (their only copy) and readable, the log gets a bounded number of lines; once S3 answers
  again the segments move to the bucket by themselves;
- during a cold read: the consumer of the cold history gets an error (CORRUPT_MESSAGE, which
  reaches the application, not KAFKA_STORAGE_ERROR, which librdkafka retries silently), the
  broker lists the segment on /readyz, consumers of hot data and producers are unaffected, and
  the consumer resumes where it was once S3 recovers;
- after a restart every acknowledged record is there at dense offsets.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

s3kit = pytest.importorskip("s3kit", reason="boto3 and moto[server] are test dependencies (pip install -e .[test])")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from s3kit import FaultProxy, store_url  # noqa: E402

from brokerkit import Broker, free_port  # noqa: E402

moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket
fault_proxy = s3kit.fault_proxy
_proxy_server = s3kit._proxy_server

CORRUPT_MESSAGE = 2
WAIT_S = 60.0
COLD = {"segment.bytes": "4096", "hot.retain.segments": "0", "retention.ms": "-1"}
ENV = {
    "LOGLAKE_ENGINE__RELOCATION_RETRY_MS": "200",
    "LOGLAKE_ENGINE__MAINTENANCE_INTERVAL_MS": "50",
    "LOGLAKE_ENGINE__COLD_READ_AHEAD_SEGMENTS": "0",
    "LOGLAKE_ENGINE__COLD_RANGE_CACHE_BYTES": "0",
}


def wait_until(cond: Any, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def produce(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    """Acknowledged offsets, in order (an idempotent producer; appends of 20 so that several
    segments get sealed)."""
    acked: list[int] = []

    def report(err: Any, msg: Any) -> None:
        if err is None:
            acked.append(msg.offset())

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=0, on_delivery=report)
        if i % 20 == 19:
            assert p.flush(30) == 0
    assert p.flush(30) == 0
    return acked


def consumer(bootstrap: str, topic: str) -> Any:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    return c


def poll(c: Any, want: int, got: list[tuple[int, bytes]], errors: list[int], *, stop_on_error: bool = False) -> None:
    """Add (offset, value) and error codes to `got`/`errors` until `want` records arrived, or the
    first error with `stop_on_error`."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and len(got) < want:
        for m in c.consume(500, timeout=0.3):
            if m.error():
                if m.error().code() != KafkaError._PARTITION_EOF:
                    errors.append(m.error().code())
            else:
                got.append((m.offset(), m.value()))
        if stop_on_error and errors:
            return


def consume(bootstrap: str, topic: str, want: int) -> tuple[list[tuple[int, bytes]], list[int]]:
    """((offset, value) read from the beginning, error codes seen) until `want` records arrived."""
    c = consumer(bootstrap, topic)
    got: list[tuple[int, bytes]] = []
    errors: list[int] = []
    try:
        poll(c, want, got, errors)
    finally:
        c.close()
    return got, errors


def cold_objects(s3_client: Any, bucket: str) -> list[str]:
    listed = s3_client.list_objects_v2(Bucket=bucket)
    return [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".seg")]


def hot_files(data: Path, topic: str) -> list[Path]:
    return sorted((data / "segments").rglob(f"{topic}-*/0/*.seg"))


def readyz(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as r:
        return str(r.read().decode())


def test_s3_5xx_storm_during_relocation_and_cold_reads(
    tmp_path: Path, fault_proxy: FaultProxy, bucket: str, s3_client: Any
) -> None:
    url = store_url(fault_proxy.endpoint, bucket, "c", max_attempts=3, retry_base_delay=0.01, retry_max_delay=0.05)
    port = free_port()
    data = tmp_path / "d"
    broker = Broker(data, ["--cold-store", url, "--metrics-listen", f"127.0.0.1:{port}"], ENV).start()
    values = [b"cold-%04d-" % i + b"x" * 300 for i in range(200)]
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for name, config in (("t", COLD), ("h", {"retention.ms": "-1"})):
            admin.create_topics([NewTopic(name, 1, config=config)])[name].result(30)

        # ---- the storm during relocation -------------------------------------------------
        fault_proxy.storm()
        acked = produce(broker.bootstrap, "t", values)
        assert acked == list(range(len(values)))  # producers never noticed
        wait_until(lambda: len(hot_files(data, "t")) >= 5)
        time.sleep(2.0)  # ~10 relocation rounds, each retried 3 times, all answered 503
        assert cold_objects(s3_client, bucket) == [] and len(hot_files(data, "t")) >= 5  # still hot
        got, errors = consume(broker.bootstrap, "t", len(values))
        assert errors == [] and got == list(enumerate(values))  # read from the hot copies
        storm_lines = [line for line in broker.log_text().splitlines() if "relocating" in line or "s3 put" in line]
        assert 1 <= len(storm_lines) <= 12, storm_lines[:20]  # rate-limited, not one per retry
        fault_proxy.clear()
        wait_until(lambda: hot_files(data, "t") == [] and len(cold_objects(s3_client, bucket)) >= 5)

        # ---- the storm during cold reads -------------------------------------------------
        acked_h = produce(broker.bootstrap, "h", [b"hot-%d" % i for i in range(10)])
        fault_proxy.storm()
        cold_reader = consumer(broker.bootstrap, "t")
        got, errors = [], []
        poll(cold_reader, len(values), got, errors, stop_on_error=True)
        assert got == [] and errors and errors[0] == CORRUPT_MESSAGE, errors  # an error, not a stall
        assert "read errors: t-0 segment" in readyz(port)
        # hot data and producers are not affected
        got_h, errors_h = consume(broker.bootstrap, "h", len(acked_h))
        assert errors_h == [] and [o for o, _v in got_h] == acked_h
        more = produce(broker.bootstrap, "t", [b"during-storm-%d" % i for i in range(5)])
        assert more == list(range(len(values), len(values) + 5))
        fault_proxy.clear()
        # the same consumer goes on by itself from where it was (it fetches that offset again)
        poll(cold_reader, len(values) + 5, got, errors)
        cold_reader.close()
        assert set(errors) == {CORRUPT_MESSAGE}
        assert [v for _o, v in got[: len(values)]] == values and [o for o, _v in got] == list(range(len(values) + 5))
        read_lines = [line for line in broker.log_text().splitlines() if "reading t-0" in line]
        assert 1 <= len(read_lines) <= 5, read_lines  # once per segment, not per fetch
    finally:
        assert broker.stop() == 0
    assert "Traceback" not in broker.log_text()

    # ---- after a restart: acked ⊆ recovered, dense offsets --------------------------------
    broker = Broker(data, ["--cold-store", url], ENV).start()
    try:
        got, errors = consume(broker.bootstrap, "t", len(values) + 5)
        assert errors == []
        assert [o for o, _v in got] == list(range(len(values) + 5))
        assert [v for _o, v in got[: len(values)]] == values
    finally:
        assert broker.stop() == 0
