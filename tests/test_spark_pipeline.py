"""The Spark pipelines: export to partitioned Parquet (exactly once) and distributed verify."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import loglake

DAY_MS = 86_400_000
#: 2026-01-01T00:00:00Z
T0 = 1_767_225_600_000


def _produce(log: loglake.Log, start: int, count: int) -> None:
    for i in range(start, start + count):
        value = json.dumps({"user": f"u{i % 4}", "n": i}).encode()
        log.produce("j", value, key=f"{i}".encode(), partition=i % 2, timestamp=T0 + (i % 2) * DAY_MS + i)
    log.flush()


def test_export_parquet_exactly_once(spark: Any, tmp_path: Path) -> None:
    from loglake.spark.pipeline import export_query, watch

    data_dir, out = tmp_path / "data", tmp_path / "table"
    log = loglake.open(str(data_dir))
    try:
        log.create_topic("j", 2, {"retention.ms": "-1"})
        _produce(log, 0, 20)
        seen: list[dict[str, Any]] = []
        q = export_query(spark, str(data_dir), "j", str(out), value_format="json")
        result = watch(q, seen.append)
        assert result.rows == 20 and seen
        _produce(log, 20, 10)
        q = export_query(spark, str(data_dir), "j", str(out), value_schema="n bigint, user string")
        assert watch(q, seen.append).rows == 10
        q = export_query(spark, str(data_dir), "j", str(out), value_schema="n bigint, user string")
        assert watch(q, seen.append).rows == 0
    finally:
        log.close()
    table = spark.read.parquet(str(out))
    rows = sorted(
        (r["partition"], r["offset"], bytes(r["value"]), r["n"], r["user"], str(r["date"]))
        for r in table.collect()
    )
    want = sorted(
        (
            i % 2,
            i // 2,
            json.dumps({"user": f"u{i % 4}", "n": i}).encode(),
            i,
            f"u{i % 4}",
            "2026-01-0" + str(1 + i % 2),
        )
        for i in range(30)
    )
    assert rows == want
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("date=")) == [
        "date=2026-01-01",
        "date=2026-01-02",
    ]
    assert (out / "date=2026-01-02" / "partition=1").is_dir()


def test_verify_distributed(spark: Any, tmp_path: Path) -> None:
    from loglake.spark.pipeline import verify_store

    data_dir = tmp_path / "data"
    with loglake.open(str(data_dir)) as log:
        log.create_topic("j", 2, {"retention.ms": "-1"})
        for start in (0, 10, 20):
            _produce(log, start, 10)
    ok = verify_store(spark, str(data_dir))
    assert ok.ok and ok.segments == 6 and ok.partitions == 2
    segs = sorted((data_dir / "segments").rglob("*.seg"))
    victim = [s for s in segs if s.parent.name == "1"][1]
    raw = bytearray(victim.read_bytes())
    raw[100] ^= 0x01
    victim.write_bytes(bytes(raw))
    bad = verify_store(spark, str(data_dir))
    assert not bad.ok
    assert bad.errors[0][0].endswith(str(victim.relative_to(data_dir / "segments")))
