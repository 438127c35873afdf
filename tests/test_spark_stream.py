"""Streaming reads: rate limits, exactly-once across restarts, data arriving while a query runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import loglake
from loglake.spark.plan import rate_limit

Seen = list[tuple[int, list[tuple[int, int, bytes]]]]


def _query(spark: Any, data_dir: Path, checkpoint: Path, seen: Seen, **options: str) -> Any:
    import loglake.spark

    loglake.spark.register(spark)
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        rows = [
            (r["partition"], r["offset"], bytes(r["value"]))
            for r in df.select("partition", "offset", "value").collect()
        ]
        with lock:
            seen.append((batch_id, rows))

    reader = spark.readStream.format("loglake").option("path", str(data_dir)).option("subscribe", "s")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))


def _produce(log: loglake.Log, start: int, count: int) -> None:
    for i in range(start, start + count):
        log.produce("s", f"v{i}".encode(), partition=i % 3)
    log.flush()


def _values(seen: Seen) -> list[bytes]:
    return [v for _b, rows in seen for (_p, _o, v) in rows]


def test_rate_limit_spreads_like_kafka() -> None:
    start = {("t", 0): 0, ("t", 1): 10, ("t", 2): 5}
    latest = {("t", 0): 100, ("t", 1): 20, ("t", 2): 5, ("t", 3): 1}
    out = rate_limit(start | {("t", 3): 0}, latest, 20)
    assert sum(out[tp] - (start | {("t", 3): 0})[tp] for tp in out) <= 20 + len(out)
    assert out[("t", 2)] == 5 and out[("t", 0)] > out[("t", 1)] - 10
    assert rate_limit(start, {("t", 0): 3}, 100) == {("t", 0): 3}


def test_max_offsets_per_trigger_and_restart(spark: Any, tmp_path: Path) -> None:
    data_dir, checkpoint = tmp_path / "data", tmp_path / "ckpt"
    log = loglake.open(str(data_dir))
    try:
        log.create_topic("s", 3)
        _produce(log, 0, 40)
        seen: Seen = []
        q = (
            _query(spark, data_dir, checkpoint, seen, maxOffsetsPerTrigger="15")
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        batches = [rows for _b, rows in seen if rows]
        assert len(batches) >= 3 and all(len(rows) <= 15 + 3 for rows in batches)
        assert sorted(_values(seen)) == sorted(f"v{i}".encode() for i in range(40))
        # restart from the checkpoint: only what came after
        _produce(log, 40, 11)
        seen2: Seen = []
        q = (
            _query(spark, data_dir, checkpoint, seen2, maxOffsetsPerTrigger="15")
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        assert sorted(_values(seen2)) == sorted(f"v{i}".encode() for i in range(40, 51))
        # and with nothing new, nothing at all
        seen3: Seen = []
        q = _query(spark, data_dir, checkpoint, seen3).trigger(availableNow=True).start()
        assert q.awaitTermination(120)
        assert _values(seen3) == []
    finally:
        log.close()


def test_data_arriving_while_running(spark: Any, tmp_path: Path) -> None:
    data_dir, checkpoint = tmp_path / "data", tmp_path / "ckpt"
    log = loglake.open(str(data_dir))
    try:
        log.create_topic("s", 3)
        _produce(log, 0, 9)
        seen: Seen = []
        q = (
            _query(spark, data_dir, checkpoint, seen, startingOffsets="earliest")
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        try:
            deadline = time.monotonic() + 90
            while len(_values(seen)) < 9 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert len(_values(seen)) == 9
            first_batches = len(seen)
            _produce(log, 9, 6)
            while len(_values(seen)) < 15 and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            q.stop()
        assert sorted(_values(seen)) == sorted(f"v{i}".encode() for i in range(15))
        assert any(b >= first_batches and rows for b, rows in enumerate(r for _b, r in seen))
    finally:
        log.close()


def test_starting_latest_skips_existing(spark: Any, tmp_path: Path) -> None:
    data_dir, checkpoint = tmp_path / "data", tmp_path / "ckpt"
    log = loglake.open(str(data_dir))
    try:
        log.create_topic("s", 3)
        _produce(log, 0, 6)
        seen: Seen = []
        q = (
            _query(spark, data_dir, checkpoint, seen, startingOffsets="latest")
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        assert _values(seen) == []
        _produce(log, 6, 3)
        q = (
            _query(spark, data_dir, checkpoint, seen, startingOffsets="latest")
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        assert sorted(_values(seen)) == [b"v6", b"v7", b"v8"]
    finally:
        log.close()
