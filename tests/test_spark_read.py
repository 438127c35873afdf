"""Batch reads through the `loglake` Spark data source, against loglake's own decoder."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import sparkkit
from loglake.log import Log
from loglake.spark.options import LoglakeOptionError, parse_read_options
from sparkkit import CLOCK_RECORDS, TS0, expected, reader, spark_rows


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[tuple[Path, Log]]:
    import loglake.spark

    loglake.spark.register(spark)
    data_dir = tmp_path_factory.mktemp("spark-read") / "data"
    log = sparkkit.make_data(data_dir)
    yield data_dir, log
    log.close()


def test_batch_read_equals_produced(spark: Any, data: tuple[Path, Log]) -> None:
    data_dir, log = data
    df = reader(spark, data_dir, subscribe="events,clock", includeHeaders="true")
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        "timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )
    got = spark_rows(df)
    want = expected(log, ["events", "clock"])
    assert len(want) == 5 * 3 * 12 + 5 + CLOCK_RECORDS
    assert got == want
    # the data really has what we meant to test
    assert any(r[0] is None for r in got) and any(r[1] is None for r in got)
    assert any(r[7] and ("n", None) in r[7] for r in got)
    assert any(r[5] == (TS0 + 1000 * 7) * 1000 for r in got)


def test_without_headers_and_from_store_url(spark: Any, data: tuple[Path, Log]) -> None:
    data_dir, log = data
    df = reader(spark, data_dir / "segments", subscribe="events")  # the store itself, not the data dir
    assert "headers" not in df.columns
    assert spark_rows(df, with_headers=False) == expected(log, ["events"], with_headers=False)


def test_offsets_json(spark: Any, data: tuple[Path, Log]) -> None:
    data_dir, log = data
    starting = json.dumps({"events": {"0": 5, "1": -2, "2": 20}})
    ending = json.dumps({"events": {"0": 30, "1": 3, "2": -1}})
    got = spark_rows(
        reader(
            spark,
            data_dir,
            subscribe="events",
            startingOffsets=starting,
            endingOffsets=ending,
            includeHeaders="true",
        )
    )
    ranges = {0: (5, 30), 1: (0, 3), 2: (20, 10**9)}
    want = [r for r in expected(log, ["events"]) if ranges[r[3]][0] <= r[4] < ranges[r[3]][1]]
    assert got == want and len(got) == 25 + 3 + (61 - 20)


def test_assign(spark: Any, data: tuple[Path, Log]) -> None:
    data_dir, log = data
    got = spark_rows(reader(spark, data_dir, assign='{"events": [1], "other-b": [0]}'), with_headers=False)
    want = [
        r
        for r in expected(log, ["events", "other-b"], with_headers=False)
        if (r[2], r[3]) in {("events", 1), ("other-b", 0)}
    ]
    assert got == want


def test_timestamps(spark: Any, data: tuple[Path, Log]) -> None:
    data_dir, _log = data
    df = reader(
        spark,
        data_dir,
        subscribe="clock",
        startingTimestamp=str(TS0 + 3500),
        endingTimestamp=str(TS0 + 20_000),
    )
    assert sorted(r["offset"] for r in df.select("offset").collect()) == list(range(4, 20))
    by_partition = json.dumps({"clock": {"0": TS0 + 10_000}})
    df = reader(spark, data_dir, subscribe="clock", startingOffsetsByTimestamp=by_partition)
    assert sorted(r["offset"] for r in df.select("offset").collect()) == list(range(10, CLOCK_RECORDS))
    with pytest.raises(Exception, match="no record at or after timestamp"):
        reader(spark, data_dir, subscribe="clock", startingTimestamp=str(TS0 + 10**9)).collect()
    df = reader(
        spark,
        data_dir,
        subscribe="clock",
        startingTimestamp=str(TS0 + 10**9),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert df.count() == 0


def test_subscribe_pattern(spark: Any, data: tuple[Path, Log]) -> None:
    data_dir, log = data
    got = spark_rows(reader(spark, data_dir, subscribePattern="other-.*"), with_headers=False)
    assert got == expected(log, ["other-a", "other-b"], with_headers=False)
    assert {r[2] for r in got} == {"other-a", "other-b"}


def test_min_partitions_splits_segments(spark: Any, data: tuple[Path, Log]) -> None:
    data_dir, log = data
    plain = reader(spark, data_dir, subscribe="events")
    split = reader(spark, data_dir, subscribe="events", minPartitions="40")
    assert split.rdd.getNumPartitions() > plain.rdd.getNumPartitions()
    assert spark_rows(split, with_headers=False) == expected(log, ["events"], with_headers=False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of the options subscribe, subscribePattern, assign"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "exactly one of"),
        ({"subscribe": "a", "bogus": "1"}, "unknown option 'bogus'"),
        ({"subscribe": "a", "startingOffsets": "earliest", "startingTimestamp": "5"}, "contradict"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "startingOffsets=latest is not allowed in a batch"),
        (
            {"subscribe": "a", "endingOffsets": "{bad"},
            "endingOffsets must be latest or a JSON object of per-partition offsets like",
        ),
        (
            {"subscribe": "a", "startingOffsets": "bogus"},
            'startingOffsets must be earliest or a JSON object of per-partition offsets like {"topic": {"0": 23',
        ),
        ({"subscribe": "a", "startingOffsets": "[1]"}, "startingOffsets must be earliest or a JSON object"),
        (
            {"subscribe": "a", "startingOffsetsByTimestamp": "soon"},
            "startingOffsetsByTimestamp must be a JSON object of per-partition timestamps",
        ),
        ({"assign": "t0"}, 'assign must be a JSON object of topics to partition lists like {"t": [0, 1]}'),
        ({"subscribe": "a", "minPartitions": "0"}, "minPartitions must be a positive integer"),
        ({"subscribe": "a", "includeHeaders": "maybe"}, "includeHeaders must be true or false"),
        ({"subscribe": "a", "kafka.security.protocol": "SSL"}, "only with kafka.bootstrap.servers"),
        ({"assign": '{"a": ["x"]}'}, "list of partition numbers"),
    ],
)
def test_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(LoglakeOptionError, match=re.escape(message)):
        parse_read_options({"path": "/nowhere", **options}, "batch")


def test_option_errors_surface_in_spark(spark: Any, data: tuple[Path, Log], tmp_path: Path) -> None:
    data_dir, _log = data
    with pytest.raises(Exception, match="unknown option 'subscrbe'"):
        reader(spark, data_dir, subscrbe="events").collect()
    # a path with no loglake data names the path and what it should have been
    with pytest.raises(Exception, match=f"no loglake data at '{tmp_path}': it holds no loglake metadata"):
        reader(spark, tmp_path, subscribe="events").collect()
    with pytest.raises(Exception, match="topic 'nope' does not exist"):
        reader(spark, data_dir, assign='{"nope": [0]}').collect()
    with pytest.raises(Exception, match="not allowed in a streaming query"):
        spark.readStream.format("loglake").option("path", str(data_dir)).option("subscribe", "events").option(
            "endingOffsets", "latest"
        ).load().writeStream.format("noop").start().awaitTermination(30)


def test_stream_starting_offsets_error_names_latest_too() -> None:
    with pytest.raises(LoglakeOptionError, match="startingOffsets must be earliest, latest or a JSON object"):
        parse_read_options({"path": "/x", "subscribe": "t", "startingOffsets": "bogus"}, "stream")


def test_stream_options_need_no_ending() -> None:
    opts = parse_read_options(
        {"path": "/x", "subscribe": "t", "startingOffsets": "latest", "maxOffsetsPerTrigger": "10"}, "stream"
    )
    assert opts.starting.kind == "latest" and opts.max_offsets_per_trigger == 10


def test_data_loss_handling() -> None:
    from loglake.spark.model import PartitionMeta
    from loglake.spark.plan import DataLossError, check_range

    pm = PartitionMeta("t", "0" * 32, 0, 100, 250, ())
    with pytest.raises(DataLossError, match=r"offsets 40\.\.99 are gone"):
        check_range(pm, 40, 200, fail_on_data_loss=True)
    assert check_range(pm, 40, 200, fail_on_data_loss=False) == (100, 200)
    with pytest.raises(DataLossError, match="past the sealed end"):
        check_range(pm, 120, 300, fail_on_data_loss=True)
    assert check_range(pm, 120, 300, fail_on_data_loss=False) == (120, 250)
    assert check_range(pm, 120, 130, fail_on_data_loss=True) == (120, 130)


def test_read_tiered_topic_from_the_cold_store_and_with_cold_path(spark: Any, tmp_path: Path) -> None:
    """Segments the broker moved to its cold store are read from there: either the cold store is
    the path itself, or the data directory is the path and coldPath names the cold store."""
    import loglake
    import loglake.spark

    loglake.spark.register(spark)
    bucket = tmp_path / "bucket"
    with loglake.open(str(tmp_path / "d"), cold_store=f"file://{bucket}") as log:
        log.create_topic("tiered", 1, {"segment.bytes": "4096", "hot.retain.segments": "1", "retention.ms": "-1"})
        values = [f"v{i:04d}".encode() * 30 for i in range(120)]
        for v in values:
            log.produce("tiered", v, timestamp=TS0)
        log.flush()
        assert log.engine.wait_relocations()
        log.flush()
        tiers = [s.tier for s in log.engine.segments("tiered", 0)]
        assert "cold" in tiers and tiers[-1] == "hot"
        cold_end = [s for s in log.engine.segments("tiered", 0) if s.tier == "cold"][-1].end_offset
    # The bucket alone holds the cold segments; its meta.json also names the hot one, which is
    # only on the broker's disk, so read up to the last cold offset.
    df = reader(spark, bucket, subscribe="tiered", endingOffsets=json.dumps({"tiered": {"0": cold_end}}))
    assert [r.value for r in df.orderBy("offset").collect()] == values[:cold_end]
    df = reader(spark, tmp_path / "d", subscribe="tiered", coldPath=f"file://{bucket}")
    assert [r.value for r in df.orderBy("offset").collect()] == values
