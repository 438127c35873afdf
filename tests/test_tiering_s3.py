"""Tiering against a real S3 endpoint (moto's server on 127.0.0.1), with injected S3 faults.

- every segment relocated, local copies gone, everything read back byte-identical; a cold
  fetch costs at most two ranged GETs, one once the footer is cached;
- through the fault proxy: 500s, slow responses and a bucket that disappears for a while —
  producers keep producing to the WAL and the hot tier, nothing is lost, uploads resume, and
  the failures are logged with the object key;
- disaster recovery from the bucket.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

s3kit = pytest.importorskip("s3kit", reason="boto3 and moto[server] are test dependencies (pip install -e .[test])")
import loglake  # noqa: E402
from loglake.engine import Engine, EngineConfig  # noqa: E402
from loglake.engine.verify import verify_data_dir  # noqa: E402
from loglake.errors import StorageError  # noqa: E402
from s3kit import FaultProxy, make_store, store_url  # noqa: E402

moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket
fault_proxy = s3kit.fault_proxy
_proxy_server = s3kit._proxy_server

CONFIG = {"segment.bytes": "8192", "hot.retain.segments": "1", "retention.ms": "-1"}


def produce(engine: Engine, count: int, start: int = 0) -> list[bytes]:
    values = [f"r{i:06d}-".encode() * 40 for i in range(start, start + count)]
    for v in values:
        engine.append_records("t", 0, [(1_000, None, v, [])]).result()
    return values


def all_values(engine: Engine) -> list[bytes | None]:
    from enginekit import read_all

    return [v for _o, _k, v in read_all(engine, "t")[0]]


def test_relocate_to_s3_and_read_back(tmp_path: Path, moto_endpoint: str, bucket: str) -> None:
    cold = make_store(moto_endpoint, bucket, "cluster")
    engine = Engine(str(tmp_path / "d"), EngineConfig(cold_read_ahead_segments=0), cold_store=cold)
    engine.open()
    try:
        engine.create_topic("t", 1, CONFIG)
        values = produce(engine, 200)
        engine.flush()
        assert engine.wait_relocations()
        segments = engine.segments("t", 0)
        assert [s.tier for s in segments] == ["cold"] * (len(segments) - 1) + ["hot"]
        assert all(engine.log.stores.hot.head(s.key) is None for s in segments[:-1])
        assert all_values(engine) == values
        assert not verify_data_dir(engine).errors
    finally:
        engine.close()
    # A fresh process: footers not cached. Count S3 requests per cold fetch.
    cold = make_store(moto_endpoint, bucket, "cluster")
    engine = Engine(str(tmp_path / "d"), EngineConfig(cold_read_ahead_segments=0), cold_store=cold)
    engine.open()
    try:
        seg = engine.segments("t", 0)[1]
        cold.calls.clear()
        engine.read("t", 0, seg.base_offset, 4096)
        assert sum(cold.calls[op] for op in ("get", "get_range", "get_tail")) <= 2, cold.calls
        cold.calls.clear()
        engine.read("t", 0, seg.base_offset + 3, 4096)
        assert sum(cold.calls[op] for op in ("get", "get_range", "get_tail")) <= 1, cold.calls
    finally:
        engine.close()


def test_s3_faults_never_stop_producers_and_lose_nothing(
    tmp_path: Path, fault_proxy: FaultProxy, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    cold = make_store(fault_proxy.endpoint, bucket, "cluster")
    config = EngineConfig(relocation_retry_ms=100, maintenance_interval_ms=50)
    engine = Engine(str(tmp_path / "d"), config, cold_store=cold)
    engine.open()
    try:
        engine.create_topic("t", 1, CONFIG)
        values = produce(engine, 60)
        fault_proxy.fail(status=500, times=3)
        fault_proxy.delay(0.2, times=5)
        values += produce(engine, 60, 60)
        fault_proxy.bucket_gone(bucket)
        values += produce(engine, 100, 120)  # the bucket is gone: appends still succeed
        engine.flush()
        time.sleep(0.5)
        segments = engine.segments("t", 0)
        assert any(s.tier == "hot" for s in segments[:-1])  # uploads are failing...
        assert any("relocating" in r.getMessage() and ".seg" in r.getMessage() for r in caplog.records)
        # ...hot data still reads; cold history answers with a typed error a retry can fix.
        newest = segments[-1]
        assert engine.read("t", 0, newest.base_offset, 1 << 20).chunks
        first_cold = next((s for s in segments if s.tier == "cold"), None)
        if first_cold is not None:
            with pytest.raises(StorageError) as info:
                engine.read("t", 0, first_cold.base_offset, 1 << 20)
            assert info.value.retriable
        fault_proxy.bucket_back(bucket)
        assert engine.wait_relocations(60)  # uploads resume
        assert all(s.tier == "cold" for s in engine.segments("t", 0)[:-1])
        assert all_values(engine) == values
    finally:
        engine.close()


def test_disaster_recovery_from_s3(tmp_path: Path, moto_endpoint: str, bucket: str) -> None:
    url = store_url(moto_endpoint, bucket, "dr")
    with loglake.open(str(tmp_path / "a"), cold_store=url) as log:
        log.create_topic("t", 1, {**CONFIG, "hot.retain.segments": "0"})
        for i in range(100):
            log.produce("t", f"{i}".encode() * 50, timestamp=1_000)
        log.flush()
        assert log.engine.wait_relocations()
    with loglake.open(str(tmp_path / "b"), cold_store=url) as log:
        report = log.recovery_report
        assert report is not None and report.restored_from is not None
        assert [r.value for r in log.consume("t")] == [f"{i}".encode() * 50 for i in range(100)]
