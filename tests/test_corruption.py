"""Corrupt sealed data through the real broker and real clients: an error, never a stall.

16 garbage bytes inside a stored batch (hot file, or the cold store's copy): confluent-kafka,
kcat and kafka-python get an error for that partition at that offset (CORRUPT_MESSAGE), after
every good record before it; the broker logs one line naming topic, partition, offset and file;
/metrics counts it; /readyz lists it; the other partition is served whole. The scrubber finds a
bad hot segment by itself and repairs it from a verified cold copy; `loglake verify` checks a
running broker's directory without its lock and without disturbing it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition
from kafka.errors import CorruptRecordError
from prometheus_client.parser import text_string_to_metric_families

from brokerkit import InProcessBroker, free_port

KCAT = shutil.which("kcat") or "/usr/bin/kcat"
TOPIC = "damaged"
RECORDS = 600  # per partition
VALUE = b"v" * 200
#: Where the garbage goes: inside the first batch's records (header 32 bytes, batch header 61).
GARBAGE_AT = 32 + 61 + 8
GARBAGE = bytes(range(0xF0, 0x100))  # 16 bytes
#: Generous bound on waiting for the broker to do something (not a timing assertion).
WAIT_S = 60.0
CORRUPT_MESSAGE = 2


def produce(bootstrap: str, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 2, config=config)])[TOPIC].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(RECORDS):
        for part in (0, 1):
            p.produce(TOPIC, key=b"k%d" % i, value=VALUE + b"%d" % i, partition=part)
        if i % 50 == 49:
            assert p.flush(30) == 0  # separate appends, so several segments get sealed


def segment_files(root: Path, partition: int) -> list[Path]:
    return sorted(root.rglob(f"{TOPIC}-*/{partition}/*.seg"))


def wait_for_segments(root: Path, partition: int, n: int) -> list[Path]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        files = segment_files(root, partition)
        if len(files) >= n:
            return files
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} sealed segments under {root}")


def damage(path: Path) -> int:
    """Write GARBAGE inside the segment's first batch; returns that batch's first offset."""
    with open(path, "r+b") as f:
        head = f.read(GARBAGE_AT + len(GARBAGE))
        f.seek(GARBAGE_AT)
        f.write(GARBAGE)
    assert head[GARBAGE_AT : GARBAGE_AT + 16] != GARBAGE
    return int.from_bytes(head[32:40], "big")


def metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def readyz(port: int) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as r:
        return r.status, r.read().decode()


def confluent_read(bootstrap: str, partition: int, until_error: bool) -> tuple[list[int], list[int]]:
    """(offsets read, error codes seen) from the beginning of `partition`."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False})
    c.assign([TopicPartition(TOPIC, partition, 0)])
    offsets: list[int] = []
    errors: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for m in c.consume(500, timeout=0.5):
            if m.error():
                errors.append(m.error().code())
            else:
                offsets.append(m.offset())
        if (errors if until_error else len(offsets) >= RECORDS):
            break
    c.close()
    return offsets, errors


def check_clients_see_the_error(broker: InProcessBroker, bad_offset: int, port: int, file_hint: str) -> None:
    offsets, errors = confluent_read(broker.bootstrap, 0, until_error=True)
    assert errors and errors[0] == CORRUPT_MESSAGE, errors  # an error, not a stall
    assert offsets == list(range(bad_offset))  # every good record before the bad batch

    if Path(KCAT).exists():
        try:
            proc = subprocess.run(
                [KCAT, "-b", broker.bootstrap, "-C", "-t", TOPIC, "-p", "0", "-o", "beginning", "-e", "-f", "%o\\n"],
                capture_output=True, timeout=WAIT_S, check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("kcat stalled at the corrupt batch")
        assert b"Broker: Invalid message" in proc.stderr, proc.stderr  # librdkafka's name for CORRUPT_MESSAGE
        assert proc.stdout.split() == [str(o).encode() for o in range(bad_offset)]

    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, group_id=None)
    kc.assign([KTopicPartition(TOPIC, 0)])
    kc.seek(KTopicPartition(TOPIC, 0), bad_offset)
    deadline = time.monotonic() + WAIT_S
    with pytest.raises(CorruptRecordError):
        while time.monotonic() < deadline:
            kc.poll(timeout_ms=500)
    kc.close()

    # The other partition is served whole.
    good, errs = confluent_read(broker.bootstrap, 1, until_error=False)
    assert good == list(range(RECORDS)) and not errs

    lines = [line for line in broker.log_text().splitlines() if f"corrupt data in {TOPIC}-0 at offset {bad_offset}" in line]
    assert len(lines) == 1, lines  # once, however often clients retried
    assert file_hint in lines[0]
    assert "Traceback" not in broker.log_text()

    m = metrics(port)
    assert m["loglake_corruptions_found_total{source=read}"] == 1
    assert m["loglake_corrupt_reads_total{}"] >= 3  # confluent, kcat, kafka-python
    assert m[f"loglake_partition_corrupt_segments{{partition=0,topic={TOPIC}}}"] == 1
    assert f"loglake_partition_corrupt_segments{{partition=1,topic={TOPIC}}}" not in m
    status, body = readyz(port)
    assert status == 200 and f"corrupt: {TOPIC}-0 offset {bad_offset}" in body


def test_corrupt_hot_batch_is_an_error_for_every_client(tmp_path: Path) -> None:
    port = free_port()
    broker = InProcessBroker(tmp_path / "d", ["--metrics-listen", f"127.0.0.1:{port}"]).start()
    try:
        produce(broker.bootstrap, {"segment.bytes": "16384"})
        root = tmp_path / "d" / "segments"
        second = wait_for_segments(root, 0, 3)[1]
        bad = damage(second)  # with the broker running
        assert bad > 0
        check_clients_see_the_error(broker, bad, port, str(second))
        assert broker.running
    finally:
        assert broker.stop() == 0


def test_corrupt_cold_copy_is_an_error_for_every_client(tmp_path: Path) -> None:
    port = free_port()
    bucket = tmp_path / "bucket"
    args = ["--cold-store", f"file://{bucket}", "--metrics-listen", f"127.0.0.1:{port}"]
    broker = InProcessBroker(tmp_path / "d", args).start()
    try:
        produce(broker.bootstrap, {"segment.bytes": "16384", "hot.retain.segments": "0", "retention.ms": "-1"})
        second = wait_for_segments(bucket, 0, 3)[1]
        deadline = time.monotonic() + WAIT_S  # relocated: the hot copy is gone
        hot = tmp_path / "d" / "segments" / second.relative_to(bucket)
        while hot.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not hot.exists()
    finally:
        assert broker.stop() == 0
    bad = damage(second)  # stopped, damaged, restarted
    broker.start()
    try:
        check_clients_see_the_error(broker, bad, port, second.name)
    finally:
        assert broker.stop() == 0


def test_scrubber_repairs_a_hot_segment_from_its_cold_copy(tmp_path: Path) -> None:
    port = free_port()
    bucket = tmp_path / "bucket"
    env = {"LOGLAKE_ENGINE__SCRUB_BYTES_PER_SECOND": "50000000", "LOGLAKE_ENGINE__SCRUB_INTERVAL_MS": "100"}
    args = ["--cold-store", f"file://{bucket}", "--metrics-listen", f"127.0.0.1:{port}"]
    broker = InProcessBroker(tmp_path / "d", args, env=env).start()
    try:
        produce(broker.bootstrap, {"segment.bytes": "16384", "hot.retain.segments": "1000"})
        root = tmp_path / "d" / "segments"
        second = wait_for_segments(root, 0, 3)[1]
        # A good copy in the cold store under the same key (as an upload that stopped before the
        # tier switch leaves one), then damage to the hot copy.
        copy = bucket / second.relative_to(root)
        copy.parent.mkdir(parents=True)
        shutil.copyfile(second, copy)
        bad = damage(second)
        deadline = time.monotonic() + WAIT_S
        while "repaired" not in broker.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        log = broker.log_text()
        assert f"corrupt data in {TOPIC}-0 at offset {bad}" in log and "found by scrub" in log
        assert "repaired" in log and second.name in log
        assert second.read_bytes() == copy.read_bytes()
        m = metrics(port)
        assert m["loglake_scrub_repairs_total{}"] == 1
        assert m["loglake_corruptions_found_total{source=scrub}"] == 1
        assert m["loglake_scrub_bytes_total{}"] > 0 and m["loglake_scrub_segments_verified_total{}"] > 0
        # Consumers read everything, correctly.
        offsets, errors = confluent_read(broker.bootstrap, 0, until_error=False)
        assert offsets == list(range(RECORDS)) and not errors
        status, body = readyz(port)
        assert status == 200 and "corrupt" not in body
    finally:
        assert broker.stop() == 0
    assert "Traceback" not in broker.log_text()


def verify(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loglake.cli.main", "verify", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=120, check=False,
    )


def test_verify_on_a_running_brokers_data_dir(tmp_path: Path) -> None:
    broker = InProcessBroker(tmp_path / "d").start()
    try:
        produce(broker.bootstrap, {"segment.bytes": "16384"})
        root = tmp_path / "d" / "segments"
        second = wait_for_segments(root, 0, 3)[1]
        good = verify(tmp_path / "d")
        assert good.returncode == 0, good.stderr
        assert "verify ok" in good.stdout and "in use" not in good.stderr
        damage(second)
        bad = verify(tmp_path / "d")
        assert bad.returncode == 1 and "in use" not in bad.stderr
        assert second.name in bad.stderr and "CRC" in bad.stderr
        # The broker is unaffected: it still takes writes and serves the healthy partition.
        assert broker.running
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        p.produce(TOPIC, value=b"after", partition=1)
        assert p.flush(30) == 0
        offsets, errors = confluent_read(broker.bootstrap, 1, until_error=False)
        assert offsets[:RECORDS] == list(range(RECORDS)) and not errors
    finally:
        assert broker.stop() == 0
