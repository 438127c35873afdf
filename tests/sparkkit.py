"""Test kit for the Spark data source: known data produced with the embedded API, and helpers to
turn Spark rows and loglake records into comparable tuples."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import loglake
from loglake.log import Log

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
#: Explicit timestamps of topic "clock": record i has TS0 + 1000 * i.
TS0 = 1_700_000_000_000
CLOCK_RECORDS = 30

Row = tuple[Any, ...]


def populate(log: Log) -> None:
    """Topics: events (3 partitions, every codec, keys, headers, nulls), clock (1 partition,
    explicit timestamps), other-a / other-b (for subscribePattern)."""
    log.create_topic("events", 3, {"retention.ms": "-1"})
    for n, codec in enumerate(CODECS):
        for p in range(3):
            batch: list[Any] = []
            for i in range(12):
                key = None if i % 5 == 0 else f"k{codec}-{p}-{i}".encode()
                value = None if i % 7 == 3 else f"{codec}:{p}:{i}:".encode() * (1 + i % 4)
                headers = [("h", f"{i}".encode()), ("n", None), ("ü", b"\x00\xff")] if i % 3 == 0 else []
                batch.append((key, value, headers))
            log.produce_batch("events", batch, partition=p, compression=None if codec == "none" else codec)
        log.produce(
            "events",
            f"single-{n}".encode(),
            key=b"s",
            headers=[("x", b"y")],
            partition=n % 3,
            timestamp=TS0 + n,
        )
        if n == 2:
            log.flush()  # several segments per partition
    log.create_topic("clock", 1, {"retention.ms": "-1"})
    for i in range(CLOCK_RECORDS):
        log.produce("clock", f"tick-{i}".encode(), key=str(i).encode(), partition=0, timestamp=TS0 + 1000 * i)
        if i == 14:
            log.flush()
    for name in ("other-a", "other-b"):
        log.create_topic(name, 2)
        log.produce_batch(name, [(None, f"{name}-{i}".encode()) for i in range(6)], partition=0)
        log.produce_batch(name, [(b"k", f"{name}-{i}".encode()) for i in range(4)], partition=1)
    log.flush()


def make_data(data_dir: Path) -> Log:
    log = loglake.open(str(data_dir))
    populate(log)
    return log


def expected(log: Log, topics: Iterable[str], with_headers: bool = True) -> list[Row]:
    """What the Kafka source would return, from loglake's own (independent) decoder."""
    out: list[Row] = []
    for topic in topics:
        for r in log.consume(topic):
            row: tuple[Any, ...] = (
                r.key,
                r.value,
                r.topic,
                r.partition,
                r.offset,
                r.timestamp * 1000,
                r.timestamp_type,
            )
            if with_headers:
                row += ([(k, v) for k, v in r.headers] or None,)
            out.append(row)
    return sorted(out, key=lambda t: (t[2], t[3], t[4]))


def spark_rows(df: Any, with_headers: bool = True) -> list[Row]:
    """Collect a loglake DataFrame as tuples like `expected` (timestamps as epoch micros)."""
    from pyspark.sql import functions as F

    cols = [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        F.unix_micros("timestamp").alias("ts"),
        "timestampType",
    ]
    if with_headers:
        cols.append("headers")
    out: list[Row] = []
    for r in df.select(*cols).collect():
        row: tuple[Any, ...] = (
            None if r["key"] is None else bytes(r["key"]),
            None if r["value"] is None else bytes(r["value"]),
            r["topic"],
            r["partition"],
            r["offset"],
            r["ts"],
            r["timestampType"],
        )
        if with_headers:
            hs = r["headers"]
            row += (
                None
                if hs is None
                else [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in hs],
            )
        out.append(row)
    return sorted(out, key=lambda t: (t[2], t[3], t[4]))


def reader(spark: Any, data_dir: Path, **options: str) -> Any:
    r = spark.read.format("loglake").option("path", str(data_dir))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()
