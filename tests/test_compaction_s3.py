"""Compaction and merging of cold segments in S3 (moto's server on 127.0.0.1).

- compaction rewrites segments where they live: the bucket afterwards holds only the new
  `<base>-g1.seg` objects of the partition, the replaced ones are deleted, the data dir verifies;
- merging turns many small cold objects into a few;
- a cold fetch from a rewritten segment still costs at most two GETs (one once its footer is
  cached), and a reopened engine reads the same data.

The engines run without cleaner threads (`cleaner_threads=0`): `engine.compact` runs the
cleaner's round on the test's thread, so nothing races the assertions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

s3kit = pytest.importorskip("s3kit", reason="boto3 and moto[server] are test dependencies (pip install -e .[test])")
from loglake.engine import Engine, EngineConfig  # noqa: E402
from loglake.engine.verify import verify_data_dir  # noqa: E402
from loglake.store.base import parse_segment_key  # noqa: E402
from s3kit import make_store  # noqa: E402

from enginekit import read_all  # noqa: E402

moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket

PREFIX = "cluster"
COMPACT_CONFIG = {
    "cleanup.policy": "compact",
    "segment.records": "50",
    "hot.retain.segments": "0",
    "retention.ms": "-1",
    "min.cleanable.dirty.ratio": "0.01",
}
MERGE_CONFIG = {"segment.records": "10", "segment.bytes": "15000", "hot.retain.segments": "0", "retention.ms": "-1"}

Record = tuple[int, bytes | None, bytes | None]


def open_engine(data_dir: Path, endpoint: str, bucket: str, **config: Any) -> tuple[Engine, Any]:
    cold = make_store(endpoint, bucket, PREFIX)
    engine = Engine(str(data_dir), EngineConfig(cleaner_threads=0, cold_read_ahead_segments=0, **config), cold_store=cold)
    engine.open()
    return engine, cold


def segment_objects(s3_client: Any, bucket: str, topic: str, partition: int = 0) -> list[str]:
    """The partition's segment objects in the bucket (keys relative to the store's prefix)."""
    keys: list[str] = []
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=PREFIX + "/"):
        for obj in page.get("Contents", []):
            key = obj["Key"].removeprefix(PREFIX + "/")
            if not key.endswith(".seg"):
                continue
            parsed = parse_segment_key(key)
            if parsed.topic == topic and parsed.partition == partition:
                keys.append(key)
    return sorted(keys)


def append(engine: Engine, topic: str, records: Sequence[tuple[bytes | None, bytes | None]]) -> None:
    """One append per record, so segments seal every segment.records records."""
    for key, value in records:
        engine.append_records(topic, 0, [(1_000, key, value, [])]).result()


def all_cold(engine: Engine, topic: str) -> bool:
    return all(s.tier == "cold" for s in engine.segments(topic, 0))


def get_requests(cold: Any) -> int:
    return int(cold.requests["GetObject"])


def updates(keys: int, count: int) -> list[tuple[bytes | None, bytes | None]]:
    out: list[tuple[bytes | None, bytes | None]] = [
        (b"key-%02d" % (i % keys), b"value-%05d-" % i + b"p" * 100) for i in range(count)
    ]
    out += [(b"key-%02d" % i, None) for i in range(0, keys, 5)]  # tombstones (kept a day)
    return out


def newest(records: Sequence[tuple[bytes | None, bytes | None]]) -> list[Record]:
    last: dict[bytes | None, int] = {}
    for i, (k, _v) in enumerate(records):
        last[k] = i
    return sorted((o, records[o][0], records[o][1]) for o in last.values())


def test_compaction_of_cold_segments_rewrites_them_in_the_bucket(
    tmp_path: Path, moto_endpoint: str, bucket: str, s3_client: Any
) -> None:
    records = updates(keys=20, count=600)
    engine, _cold = open_engine(tmp_path / "d", moto_endpoint, bucket)
    try:
        engine.create_topic("t", 1, COMPACT_CONFIG)
        append(engine, "t", records)
        engine.flush()
        assert engine.wait_relocations()
        assert all_cold(engine, "t")
        before = segment_objects(s3_client, bucket, "t")
        # (by the parsed key: "-g" is also in a key whose random cluster id starts with g)
        assert len(before) >= 12 and all(parse_segment_key(k).generation == 0 for k in before), before

        assert engine.compact("t") >= 1
        after_segments = engine.segments("t", 0)
        assert all_cold(engine, "t")
        after = segment_objects(s3_client, bucket, "t")
        assert after == sorted(s.key for s in after_segments)
        assert after and all(parse_segment_key(k).generation == 1 for k in after), after
        assert not set(before) & set(after)  # the replaced objects were deleted
        assert not any(engine.log.stores.hot.head(k) is not None for k in after)  # nothing rewritten on local disk
        assert engine.cleaner.stats.passes == 1 and engine.cleaner.stats.segments_replaced >= len(before)
        report = verify_data_dir(engine)
        assert report.ok, report.errors
        got = read_all(engine, "t")[0]
        assert got == newest(records)
        assert engine.partition_info("t", 0).high_watermark == len(records)
        # a second pass with nothing new to clean changes nothing
        assert engine.compact("t") == 0
        assert segment_objects(s3_client, bucket, "t") == after
    finally:
        engine.close()

    engine, _cold = open_engine(tmp_path / "d", moto_endpoint, bucket)
    try:
        assert read_all(engine, "t")[0] == got
        assert verify_data_dir(engine).ok
    finally:
        engine.close()


def test_merging_many_small_cold_segments(tmp_path: Path, moto_endpoint: str, bucket: str, s3_client: Any) -> None:
    values = [b"v%04d-" % i + b"m" * 40 for i in range(320)]  # 32 segments of ~1.7 KB
    engine, _cold = open_engine(tmp_path / "d", moto_endpoint, bucket, merge_min_segments=4, merge_min_age_ms=0)
    try:
        engine.create_topic("t", 1, MERGE_CONFIG)
        append(engine, "t", [(None, v) for v in values])
        engine.flush()
        assert engine.wait_relocations()
        assert all_cold(engine, "t")
        before = segment_objects(s3_client, bucket, "t")
        assert len(before) == 32

        assert engine.compact("t") >= 1  # cleanup.policy=delete: merging only
        after = segment_objects(s3_client, bucket, "t")
        segments = engine.segments("t", 0)
        assert after == sorted(s.key for s in segments)
        assert all_cold(engine, "t")
        assert len(after) == 4, after  # eight fit in segment.bytes
        assert all(parse_segment_key(k).generation == 1 for k in after)
        assert engine.cleaner.stats.merges >= 1 and engine.cleaner.stats.passes == 0
        # the merged segments cover the offsets without a gap
        assert [s.base_offset for s in segments[1:]] == [s.last_offset + 1 for s in segments[:-1]]
        assert [(o, v) for o, _k, v in read_all(engine, "t")[0]] == list(enumerate(values))
        assert verify_data_dir(engine).ok
    finally:
        engine.close()


def test_cold_fetch_after_compaction_costs_at_most_two_gets(
    tmp_path: Path, moto_endpoint: str, bucket: str, s3_client: Any
) -> None:
    # Large enough that a segment is fetched by ranges, not whole.
    records = [(b"key-%03d" % (i % 150), b"value-%05d-" % i + b"q" * 400) for i in range(1500)]
    config = {**COMPACT_CONFIG, "segment.records": "100", "segment.bytes": "40000"}
    engine, _cold = open_engine(tmp_path / "d", moto_endpoint, bucket, merge_min_segments=0)
    try:
        engine.create_topic("t", 1, config)
        append(engine, "t", records)
        engine.flush()
        assert engine.wait_relocations()
        assert engine.compact("t") == 1
        expected = read_all(engine, "t")[0]
        assert expected == newest(records)
        segments = engine.segments("t", 0)
        assert len(segments) >= 2 and all(s.generation == 1 and s.tier == "cold" for s in segments)
    finally:
        engine.close()

    # A fresh process: no footer cached. Count S3 GETs per cold fetch of a rewritten segment.
    engine, cold = open_engine(tmp_path / "d", moto_endpoint, bucket)
    try:
        seg = engine.segments("t", 0)[1]
        first_kept = next(o for o, _k, _v in expected if o >= seg.base_offset)
        cold.requests.clear()
        result = engine.read("t", 0, seg.base_offset, 4096)
        assert result.chunks
        assert get_requests(cold) <= 2, cold.requests
        cold.requests.clear()
        engine.read("t", 0, first_kept + 1, 4096)
        assert get_requests(cold) <= 1, cold.requests
        assert read_all(engine, "t")[0] == expected
        assert verify_data_dir(engine).ok
    finally:
        engine.close()
