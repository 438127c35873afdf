"""Disk full with a real `loglake serve` on a small tmpfs and confluent-kafka producers.

The reserve is hit (a filler file takes most of the room, then an idempotent producer writes
1 KB records): produce answers KAFKA_STORAGE_ERROR at once, the log says "storage full" once,
/readyz and /metrics say it, reads go on; deleting the filler lets produce back in without a
restart; after a restart every acknowledged record is there at dense offsets.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fskit import mounted_tmpfs

from brokerkit import consume_to_end, free_port, serving_broker

MIB = 1024 * 1024
RESERVE = 16 * MIB
TOPIC = "full"


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "fs"
    target.mkdir()
    with mounted_tmpfs(target, "size=80m", "a small filesystem of its own") as mounted:
        yield mounted


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {line_start!r} on /metrics")


def produce_one(bootstrap: str, value: bytes) -> str | None:
    """One record with retries=0: None when acknowledged, else the error's name."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "retries": 0, "acks": "all", "linger.ms": 0, "message.timeout.ms": 10_000})
    errors: list[str] = []
    producer.produce(TOPIC, value, partition=0, on_delivery=lambda err, _msg: errors.append(err.name() if err else ""))
    producer.flush(15)
    assert len(errors) == 1
    return errors[0] or None


@pytest.mark.parametrize("reserve", [RESERVE, 0], ids=["reserve", "no-reserve-wal-enospc"])
def test_disk_full_refuses_then_heals_without_restart(tmpfs: Path, reserve: int) -> None:
    """With the reserve: produce is refused before the WAL. Without it (0): the WAL's own roll
    hits the real ENOSPC of the tmpfs, the shard stalls and heals once the filler is gone."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    data = tmpfs / "data"
    port = free_port()
    env = {
        "LOGLAKE_ENGINE__WAL_SHARDS": "1",
        "LOGLAKE_ENGINE__WAL_FILE_BYTES": str(1 * MIB),
        "LOGLAKE_STORAGE_MIN_FREE_BYTES": str(reserve),
        "LOGLAKE_STORAGE_MIN_FREE_PERCENT": "0",
        "LOGLAKE_STORAGE_SPACE_CHECK_INTERVAL_MS": "100",
    }
    acked: dict[int, bytes] = {}
    with serving_broker(data, ["--metrics-listen", f"127.0.0.1:{port}"], env) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, config={"segment.bytes": str(1 * MIB)})])[TOPIC].result(30)
        # Take all but ~6 MB above the reserve with a file of our own.
        filler = tmpfs / "filler"
        with open(filler, "wb") as fh:
            fh.write(b"\0" * max(0, free_bytes(tmpfs) - reserve - 6 * MIB))
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 4000}
        )
        failed: list[str] = []

        def delivered(err: object, msg: object) -> None:
            if err is None:
                acked[msg.offset()] = msg.value()  # type: ignore[attr-defined]
            else:
                failed.append(err.name())  # type: ignore[attr-defined]

        started = time.monotonic()
        i = 0
        while not failed and time.monotonic() - started < 60:
            for _ in range(500):
                try:
                    producer.produce(TOPIC, b"%08d" % i + b"x" * 1016, partition=0, on_delivery=delivered)
                except BufferError:
                    producer.poll(0.1)
                i += 1
            producer.poll(0.05)
        producer.flush(30)
        assert failed, "the reserve was never hit"
        assert len(acked) > 1000

        # Now refused at once, with KAFKA_STORAGE_ERROR.
        t0 = time.monotonic()
        assert produce_one(broker.bootstrap, b"refused") == "KAFKA_STORAGE_ERROR"
        assert time.monotonic() - t0 < 5
        log_text = broker.log_text()
        full_lines = [line for line in log_text.splitlines() if "storage full: " in line]
        # With the reserve: exactly one. Without it, a seal letting a WAL file go frees room the
        # retrying producer fills again, so the stall may heal and come back a time or two.
        # the first delivery errors and the broker's log say how it got here if this fails
        why = (full_lines, sorted(set(failed)), log_text[-6000:])
        assert len(full_lines) == 1 if reserve else 1 <= len(full_lines) <= 4, why
        if reserve:
            assert re.search(r"storage full: [\d.]+ MiB free on .*data < reserve 16\.0 MiB \+ [\d.]+ MiB owed to seals and new WAL files; produce refused", full_lines[0])
            assert "sealing " not in log_text  # the reserve gave the seals their room
        else:
            assert re.search(r"storage full: WAL write in .* failed \(.*No space left on device.*\)", full_lines[0])
            # no seal-failure flood: once failing and once working again per episode at most
            assert log_text.count("sealing ") <= 2 * len(full_lines)
            assert log_text.count("maintenance tick failed") <= 2 * len(full_lines)
        status, body = http_get(f"http://127.0.0.1:{port}/readyz")
        assert status == 200 and "storage full: " in body, body
        _status, page = http_get(f"http://127.0.0.1:{port}/metrics")
        assert metric(page, "loglake_storage_full ") == 1
        assert metric(page, "loglake_storage_reserve_bytes ") == reserve
        assert metric(page, "loglake_storage_produce_refused_total ") >= 1
        assert metric(page, 'loglake_requests_total{api="Produce",error="KAFKA_STORAGE_ERROR"}') >= 1
        # Reads keep working.
        values = consume_to_end(broker.bootstrap, TOPIC, 1, "read_uncommitted", len(acked))
        assert set(acked.values()) <= set(values)

        # Space comes back: produce works again, no restart.
        filler.unlink()
        deadline = time.monotonic() + 20
        result: str | None = "never tried"
        while time.monotonic() < deadline:
            result = produce_one(broker.bootstrap, b"after-heal")
            if result is None:
                break
            time.sleep(0.2)
        assert result is None
        assert "storage writable again: " in broker.log_text()
        if not reserve:
            assert "written again after the disk-full stall" in broker.log_text()
        _status, page = http_get(f"http://127.0.0.1:{port}/metrics")
        assert metric(page, "loglake_storage_full ") == 0
        status, body = http_get(f"http://127.0.0.1:{port}/readyz")
        assert status == 200 and "storage full" not in body

    (tmpfs.parent / "broker.log").write_text(broker.log_text())  # for a look after a failure
    # After a restart every acknowledged record is there, at dense offsets.
    with serving_broker(data, env=env) as broker:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check", "enable.partition.eof": True})
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        offsets: list[int] = []
        got: dict[int, bytes] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    break
                raise AssertionError(msg.error())
            offsets.append(msg.offset())
            got[msg.offset()] = msg.value()
        consumer.close()
        assert offsets == list(range(len(offsets)))
        for offset, value in acked.items():
            assert got.get(offset) == value, offset
        assert b"after-heal" in got.values()
