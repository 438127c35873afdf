"""Spark pipelines over loglake: `export` (topic -> partitioned Parquet, exactly once) and
`verify` (CRC + hash-chain check of every segment, one Spark task per segment; on a cluster
bucket also one task per flush range not merged yet, checked against its commit's CRC-32C)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loglake.errors import LoglakeError
from loglake.meta.lifecycle import Tier
from loglake.spark.model import PartitionMeta, TopicPartition
from loglake.spark.options import Mode, ReadOptions, parse_read_options, store_url_from
from loglake.spark.plan import (
    Metadata,
    cached_store,
    from_offset_dict,
    load_metadata,
    select_partitions,
)


def spark_session(
    master: str = "local[*]", app_name: str = "loglake", conf: dict[str, str] | None = None
) -> Any:
    """A SparkSession for the pipelines: UTC session time zone (dates come from timestamps),
    executors run this interpreter unless PYSPARK_PYTHON says otherwise."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    from pyspark.errors import PySparkRuntimeError

    try:
        spark = builder.getOrCreate()
    except PySparkRuntimeError as exc:
        if exc.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        # pyspark's own message says only that the gateway exited; the usual cause is no Java
        raise LoglakeError(
            "Spark could not start its JVM: pipelines need Java 17 or newer (java on PATH, or JAVA_HOME)"
        ) from None
    spark.sparkContext.setLogLevel("WARN")
    from loglake.spark.source import register

    register(spark)
    return spark


def spark_error(exc: BaseException) -> str:
    """The line of a Spark error that says what went wrong (its last `...Error: ...` line):
    Spark's errors (Py4J, Python worker) carry whole traces."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error" in ln.split(":", 1)[0] or "Exception:" in ln]
    return (named[-1] if named else lines[0] if lines else type(exc).__name__)[:500]


# ---- export ------------------------------------------------------------------------------------


def export_options(source_options: dict[str, str] | None) -> dict[str, str]:
    """The source options an export reads with: read_committed unless kafka.isolation.level is
    given (exports land committed data only)."""
    options = dict(source_options or {})
    if not any(k.lower() == "kafka.isolation.level" for k in options):
        options["kafka.isolation.level"] = "read_committed"
    return options


@dataclass(frozen=True)
class ExportSource:
    """What an export of a topic would read, found without Spark."""

    opts: ReadOptions
    meta: Metadata
    #: the topic's partitions, with their ends (the sealed ends, or the broker's with hybrid reads)
    parts: list[PartitionMeta]


def export_source(path: str, topic: str, source_options: dict[str, str] | None, mode: Mode) -> ExportSource:
    """The partitions of `topic` an export of `path` would read, found without Spark: a bad
    option fails here with LoglakeOptionError, a `path` with no loglake data with
    NoLoglakeDataError (message and hint), before anyone waits for a JVM to start."""
    from loglake.spark.broker import metadata

    opts = parse_read_options({"path": path, "subscribe": topic, **export_options(source_options)}, mode)
    meta = metadata(opts)
    return ExportSource(opts, meta, select_partitions(opts, meta))


def to_land(
    parts: list[PartitionMeta], landed: dict[TopicPartition, int]
) -> dict[TopicPartition, tuple[int, int]]:
    """Per partition with something new: (next offset to land, end) given the offsets `landed`
    (a partition not in it starts at its log start, as the export does)."""
    out: dict[TopicPartition, tuple[int, int]] = {}
    for pm in parts:
        start = landed.get(pm.tp, pm.log_start)
        if pm.end > start:
            out[pm.tp] = (start, pm.end)
    return out


def checkpoint_offsets(checkpoint: str) -> dict[TopicPartition, int] | None:
    """The source offsets of the last committed micro-batch in a local Spark checkpoint
    directory (`offsets/N` is "v1", the batch's metadata, then one line per source; `commits/N`
    says batch N was committed). None when that cannot be told: no checkpoint, a remote one, a
    batch planned but not committed (the next run redoes it), or a layout not understood."""
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        return None
    local = checkpoint[len("file://") :] if checkpoint.startswith("file://") else checkpoint

    def batches(sub: str) -> list[int]:
        try:
            return sorted(int(n) for n in os.listdir(os.path.join(local, sub)) if n.isdigit())
        except OSError:
            return []

    offsets, commits = batches("offsets"), batches("commits")
    if not offsets or not commits or offsets[-1] != commits[-1]:
        return None
    try:
        with open(os.path.join(local, "offsets", str(offsets[-1])), encoding="utf-8") as f:
            lines = f.read().splitlines()
        if len(lines) != 3 or lines[0] != "v1":
            return None
        return from_offset_dict(json.loads(lines[2]))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


@dataclass
class ExportResult:
    batches: int
    rows: int
    seconds: float


def infer_json_schema(
    spark: Any, path: str, topic: str, source_options: dict[str, str], sample: int = 1000
) -> Any:
    """A StructType inferred from the first `sample` values of the topic (batch read)."""
    from pyspark.sql import functions as F

    from loglake.spark.source import register

    register(spark)
    reader = spark.read.format("loglake").option("path", path).option("subscribe", topic)
    for k, v in source_options.items():
        reader = reader.option(k, v)
    values = [
        r[0]
        for r in reader.load()
        .select(F.col("value").cast("string"))
        .where("value IS NOT NULL")
        .limit(sample)
        .collect()
    ]
    if not values:
        raise LoglakeError(f"topic {topic!r} has no values to infer a JSON schema from; give --value-schema")
    return spark.read.json(spark.sparkContext.parallelize(values, 1)).schema


def with_value_columns(df: Any, value_schema: Any) -> Any:
    """`df` plus one column per field of `value_schema` (DDL or StructType), parsed from the JSON
    value (null where the value is not JSON or lacks the field)."""
    if not value_schema:
        return df
    from pyspark.sql import functions as F

    parsed = F.from_json(F.col("value").cast("string"), value_schema)
    return df.withColumn("__value", parsed).select("*", "__value.*").drop("__value")


def export_query(
    spark: Any,
    path: str,
    topic: str,
    to: str,
    *,
    fmt: str = "parquet",
    checkpoint: str | None = None,
    value_schema: Any = None,
    value_format: str | None = None,
    continuous: float | None = None,
    source_options: dict[str, str] | None = None,
) -> Any:
    """Start the export streaming query (Trigger.AvailableNow, or every `continuous` seconds).

    Reads at read_committed unless `source_options` set kafka.isolation.level."""
    from pyspark.sql import functions as F

    from loglake.spark.source import register

    register(spark)
    source_options = export_options(source_options)
    if value_format not in (None, "json", "binary"):
        raise LoglakeError(f"--value-format must be json or binary, not {value_format!r}")
    if value_format == "json" and value_schema is None:
        value_schema = infer_json_schema(spark, path, topic, source_options)
    reader = (
        spark.readStream.format("loglake")
        .option("path", path)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
    )
    for k, v in source_options.items():
        reader = reader.option(k, v)
    df = with_value_columns(reader.load().withColumn("date", F.to_date("timestamp")), value_schema)
    writer = (
        df.writeStream.format(fmt)
        .option("path", to)
        .option("checkpointLocation", checkpoint or to.rstrip("/") + "/_checkpoint")
        .partitionBy("date", "partition")
        .queryName(f"loglake-export-{topic}")
    )
    writer = (
        writer.trigger(processingTime=f"{continuous} seconds")
        if continuous
        else writer.trigger(availableNow=True)
    )
    return writer.start()


def watch(query: Any, on_progress: Callable[[dict[str, Any]], None], poll_s: float = 0.5) -> ExportResult:
    """Wait for the query to end, calling on_progress with each new micro-batch's progress."""
    started = time.monotonic()
    last_batch = -1
    rows = batches = 0

    def report() -> None:
        nonlocal last_batch, rows, batches
        for prog in query.recentProgress:
            if prog["batchId"] > last_batch:
                last_batch = prog["batchId"]
                rows += int(prog.get("numInputRows") or 0)
                batches += 1
                on_progress(prog)

    try:
        while query.isActive:
            report()
            query.awaitTermination(poll_s)
    except KeyboardInterrupt:
        query.stop()
    except Exception as exc:  # the query failed: awaitTermination raises its error
        raise LoglakeError(f"export failed: {spark_error(exc)}") from None
    report()
    failure = query.exception()
    if failure is not None:
        raise LoglakeError(f"export failed: {spark_error(failure)}")
    return ExportResult(batches, rows, time.monotonic() - started)


# ---- verify ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentCheck:
    topic: str
    partition: int
    base: int
    key: str
    error: str | None
    prev_hash: str
    chain_hash: str
    last: int
    #: what the next segment's prev_hash names: the chain hash, or a rewritten segment's link hash
    link_hash: str = ""


def _verify_one(task: tuple[str, str, str, int, int]) -> SegmentCheck:
    """Runs on an executor: full check of one segment (header, every batch CRC, data CRC,
    index, trailer, chain hash recomputed)."""
    from loglake.segment.verify import verify_segment_in_store

    url, key, topic, partition, base = task
    try:
        t = verify_segment_in_store(cached_store(url), key)
    except LoglakeError as exc:
        return SegmentCheck(topic, partition, base, key, str(exc), "", "", -1)
    return SegmentCheck(
        topic, partition, base, key, None, t.prev_hash.hex(), t.chain_hash.hex(), t.last_offset, t.link_hash.hex()
    )


@dataclass(frozen=True)
class RangeTask:
    """One committed flush range of a cluster partition, as its `plog_commit` recorded it."""

    url: str
    key: str
    topic: str
    topic_id: str
    partition: int
    base: int
    last: int
    pos: int
    length: int
    count: int
    max_ts: int
    batches: int
    crc: int


def _verify_range(task: RangeTask) -> tuple[str, int, int, str, str | None]:
    """Runs on an executor: one ranged GET of a flush range, checked against the CRC-32C its
    commit recorded (loglake.cluster.flushobj.read_range). (topic, partition, base, key, error)."""
    from loglake.cluster.flushobj import FlushIndexEntry, read_range

    t = task
    entry = FlushIndexEntry(t.topic_id, t.partition, t.base, t.last, t.pos, t.length, t.count, t.max_ts, t.batches, t.crc)
    try:
        read_range(cached_store(t.url), t.key, entry)
    except LoglakeError as exc:
        return t.topic, t.partition, t.base, t.key, str(exc)
    return t.topic, t.partition, t.base, t.key, None


@dataclass
class VerifyOutcome:
    segments: int
    partitions: int
    errors: list[tuple[str, str]]  # (segment key, problem), first bad segment first
    seconds: float
    ranges: int = 0  # a cluster bucket's flush ranges not merged yet, checked too

    @property
    def ok(self) -> bool:
        return not self.errors


def verify_store(
    spark: Any, path: str, cold_path: str | None = None, extra: dict[str, str] | None = None
) -> VerifyOutcome:
    started = time.monotonic()
    opts = {"path": path, **(extra or {})}
    url = store_url_from(opts)
    cold = store_url_from({**opts, "path": cold_path}, data_dir=False) if cold_path else None
    meta = load_metadata(cached_store(url), path=path)
    if meta.cluster_mode:
        return _verify_cluster(spark, url, started)
    tasks: list[tuple[str, str, str, int, int]] = []
    recorded: dict[str, tuple[str, str]] = {}
    for (topic, p), pm in sorted(meta.partitions.items()):
        for seg in pm.segments:
            if seg.tier == Tier.COLD and not cold:
                raise LoglakeError(f"segment {seg.key} is in the cold tier: give --cold-path")
            tasks.append((cold if seg.tier == Tier.COLD and cold else url, seg.key, topic, p, seg.base))
            recorded[seg.key] = (seg.prev_hash, seg.chain_hash)
    checks: list[SegmentCheck] = []
    if tasks:
        checks = spark.sparkContext.parallelize(tasks, len(tasks)).map(_verify_one).collect()
    errors: list[tuple[str, str]] = []
    by_partition: dict[tuple[str, int], list[SegmentCheck]] = {}
    for c in checks:
        by_partition.setdefault((c.topic, c.partition), []).append(c)
    for tp in sorted(by_partition):
        segs = sorted(by_partition[tp], key=lambda c: c.base)
        prev: SegmentCheck | None = None
        for c in segs:
            if c.error:
                errors.append((c.key, c.error))
            else:
                rec_prev, rec_chain = recorded.get(c.key, ("", ""))
                if rec_chain and rec_chain != c.chain_hash:
                    errors.append(
                        (c.key, f"chain hash {c.chain_hash} differs from the metadata's {rec_chain}")
                    )
                elif rec_prev and rec_prev != c.prev_hash:
                    errors.append((c.key, f"prev_hash {c.prev_hash} differs from the metadata's {rec_prev}"))
                elif prev is not None and not prev.error:
                    if c.prev_hash != (prev.link_hash or prev.chain_hash):
                        errors.append(
                            (c.key, f"hash chain broken: prev_hash {c.prev_hash} != link hash of {prev.key}")
                        )
                    elif c.base != prev.last + 1:
                        errors.append(
                            (c.key, f"base offset {c.base} does not follow {prev.last} of {prev.key}")
                        )
            prev = c
    return VerifyOutcome(len(checks), len(by_partition), errors, time.monotonic() - started)


def _verify_cluster(spark: Any, url: str, started: float) -> VerifyOutcome:
    """`verify_store` of a cluster-mode bucket: what its published metadata lists
    (loglake.cluster.verify.PlogSource) checked on the executors — every merged (or compacted)
    segment in full, every flush range not merged yet against its commit's CRC-32C — then on the
    driver each partition's hash chain from segment to segment (a segment's prev hash is the
    link hash of the one before) and its offsets: segments, then ranges, contiguous up to the
    committed end. `segments` counts both."""
    from loglake.cluster.verify import PlogSource

    source = PlogSource(cached_store(url))
    seg_tasks: list[tuple[str, str, str, int, int]] = []
    range_tasks: list[RangeTask] = []
    recorded: dict[str, tuple[int, str]] = {}  # segment key -> (last offset, link hash) as recorded
    plogs = source.plogs()
    for topic, topic_id, p, plog in plogs:
        for seg in plog.segments:
            seg_tasks.append((url, seg.key, topic, p, seg.base))
            recorded[seg.key] = (seg.last, seg.link)
        for r in plog.ranges:
            range_tasks.append(
                RangeTask(url, r.key, topic, topic_id, p, r.base, r.last, r.pos, r.length, r.count, r.max_ts, r.batches, r.crc)
            )
    sc = spark.sparkContext
    checks: list[SegmentCheck] = sc.parallelize(seg_tasks, len(seg_tasks)).map(_verify_one).collect() if seg_tasks else []
    ranges: list[tuple[str, int, int, str, str | None]] = (
        sc.parallelize(range_tasks, len(range_tasks)).map(_verify_range).collect() if range_tasks else []
    )
    by_seg = {c.key: c for c in checks}
    by_range = {(t, p, base): error for t, p, base, _key, error in ranges}
    errors: list[tuple[str, str]] = []
    for topic, _topic_id, p, plog in sorted(plogs, key=lambda x: (x[0], x[2])):
        prev: SegmentCheck | None = None
        expected: int | None = None
        for seg in plog.segments:
            c = by_seg[seg.key]
            if c.error:
                errors.append((c.key, c.error))
            elif (c.last, c.link_hash) != recorded[c.key]:
                errors.append((c.key, f"ends at {c.last} with link hash {c.link_hash}; the metadata records {recorded[c.key]}"))
            elif prev is not None and not prev.error and c.prev_hash != prev.link_hash:
                errors.append((c.key, f"hash chain broken: prev_hash {c.prev_hash} != link hash of {prev.key}"))
            elif expected is not None and seg.base != expected:
                errors.append((c.key, f"base offset {seg.base} does not follow {expected - 1}"))
            prev, expected = c, seg.last + 1
        for r in plog.ranges:
            error = by_range[(topic, p, r.base)]
            if error:
                errors.append((r.key, f"{topic}-{p} range {r.base}..{r.last}: {error}"))
            elif expected is not None and r.base != expected:
                errors.append((r.key, f"{topic}-{p}: range {r.base}..{r.last} does not continue at {expected}"))
            expected = r.last + 1
        if expected is not None and expected != plog.end:
            errors.append(("", f"{topic}-{p}: data ends at {expected}, the committed end is {plog.end}"))
    return VerifyOutcome(len(checks), len(plogs), errors, time.monotonic() - started, len(ranges))
