"""Batch-read benchmark of the `loglake` Spark data source, anchored on Spark's Parquet reader.

    .venv/bin/python benchmarks/spark.py                 # 10M records of 100-byte values
    .venv/bin/python benchmarks/spark.py --records 1000000 --json out.json --profile
    .venv/bin/python benchmarks/spark.py --records 1000000 --export
    .venv/bin/python benchmarks/spark.py --handoff       # also Spark's Python-to-JVM hand-off alone

Both reads run on local[2] in the same session and are forced to materialize every column
(`write.format("noop")`); each is timed --repeat times and the best run is reported.
`--profile` also runs cProfile on one segment slice's `read_slice` in this process.
`--handoff` also times a source whose tasks yield one prebuilt RecordBatch (the reader's first
batch of the topic) over and over: Spark's hand-off of Arrow batches into the JVM and rows there,
with no decoding; the loglake read's time beyond it is `read()`'s.
`--export` also times `pipeline export` of the whole topic both ways in the same session: the
Parquet file sink (a streaming query with a checkpoint) and an Iceberg table (SQL catalog on
SQLite, a warehouse directory), each into a fresh target, headers included in both; reported as
rows/s and the Iceberg export's share of the Parquet export's rate (issue 17's target: 80 %).

    .venv/bin/python benchmarks/spark.py --hybrid --records 2000000

`--hybrid` measures hybrid reads instead (kafka.bootstrap.servers): 90 % of the records are
produced with the embedded API and sealed, a real `loglake serve` is started on the data directory
and the last 10 % are produced through it (left unsealed: under segment.bytes, segment.records
and segment.ms); the hybrid read of everything is timed against a store-only read of the same
records once the broker's clean shutdown has sealed them (issue 17 target: >= 70 %).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import loglake
from loglake.records.batch import build_batch

TOPIC = "bench"
BATCH_RECORDS = 2000
ROOT = Path(__file__).resolve().parent.parent
#: The unsealed tail of the --hybrid run, as a fraction of the records.
TAIL_FRACTION = 0.10


def produce(data_dir: Path, records: int, value_bytes: int, partitions: int, codec: str) -> float:
    started = time.perf_counter()
    with loglake.open(str(data_dir)) as log:
        log.create_topic(TOPIC, partitions, {"retention.ms": "-1"})
        ts = int(time.time() * 1000)
        codec_id = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codec]
        for start in range(0, records, BATCH_RECORDS):
            n = min(BATCH_RECORDS, records - start)
            recs = [(ts, None, f"{start + i:020d}".encode().ljust(value_bytes, b"x"), ()) for i in range(n)]
            log.produce_raw(
                TOPIC, (start // BATCH_RECORDS) % partitions, build_batch(recs, compression=codec_id)
            )
        log.flush()
    return time.perf_counter() - started


def timed(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def profile_read(data_dir: Path) -> str:
    from loglake.spark.options import parse_read_options
    from loglake.spark.plan import cached_store, load_metadata, select_partitions, slices_for
    from loglake.spark.reader import read_slice

    opts = parse_read_options({"path": str(data_dir), "subscribe": TOPIC}, "batch")
    meta = load_metadata(cached_store(opts.store_url))
    pm = select_partitions(opts, meta)[0]
    sl = slices_for(opts.store_url, pm, pm.log_start, pm.end)[0]
    for _ in read_slice(sl, False):  # warm up (imports, caches)
        pass
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    rows = sum(b.num_rows for b in read_slice(sl, False))
    prof.disable()
    dt = time.perf_counter() - t
    out = io.StringIO()
    out.write(
        f"read_slice of one segment: {rows} records in {dt:.3f}s under cProfile ({rows / dt:,.0f} records/s)\n"
    )
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    return out.getvalue()


def handoff_rate(spark: Any, data_dir: Path, records: int, repeat: int) -> tuple[float, int]:
    """(seconds, rows): how long Spark takes to move about `records` rows from Python workers into the JVM with no decoding:
    a data source whose tasks yield one prebuilt RecordBatch (the loglake reader's own first
    batch of the topic, so the same schema, sizes and batch length) over and over. What a loglake
    read costs beyond this is `read()`'s decoding."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from loglake.spark.source import source_schema

    path, tasks = str(data_dir), 2

    class PrebuiltReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(tasks)]

        def read(self, partition: InputPartition) -> Any:
            from loglake.spark.options import parse_read_options
            from loglake.spark.plan import cached_store, load_metadata, select_partitions, slices_for
            from loglake.spark.reader import read_slice

            opts = parse_read_options({"path": path, "subscribe": TOPIC}, "batch")
            pm = select_partitions(opts, load_metadata(cached_store(opts.store_url)))[0]
            batch = next(read_slice(slices_for(opts.store_url, pm, pm.log_start, pm.end)[0], False))
            for _ in range(records // tasks // batch.num_rows):
                yield batch

    class Prebuilt(DataSource):
        @classmethod
        def name(cls) -> str:
            return "loglake_bench_prebuilt"

        def schema(self) -> Any:
            return source_schema(False)

        def reader(self, schema: Any) -> DataSourceReader:
            return PrebuiltReader()

    spark.dataSource.register(Prebuilt)
    df = spark.read.format("loglake_bench_prebuilt").load()
    rows = df.count()
    return timed(lambda: df.write.format("noop").mode("overwrite").save(), repeat), rows


def produce_tail(bootstrap: str, first: int, records: int, value_bytes: int, partitions: int) -> float:
    """Records [first, first + records) through the broker (confluent-kafka, acks=all)."""
    from confluent_kafka import Producer

    started = time.perf_counter()
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000, "log_level": 0})
    for i in range(first, first + records):
        while True:
            try:
                p.produce(
                    TOPIC, value=f"{i:020d}".encode().ljust(value_bytes, b"x"), partition=i % partitions
                )
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0
    return time.perf_counter() - started


def hybrid(args: argparse.Namespace, work: Path, spark_session: Any) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from loglake.spark.options import parse_read_options
    from loglake.spark.plan import BrokerRange
    from loglake.spark.source import LoglakeBatchReader

    from brokerkit import Broker

    data_dir = work / "hybrid-data"
    tail = int(args.records * TAIL_FRACTION)
    print(f"producing {args.records - tail:,} sealed records into {data_dir} ...", file=sys.stderr)
    produce(data_dir, args.records - tail, args.value_bytes, args.partitions, args.codec)
    broker = Broker(data_dir).start()
    try:
        print(f"producing {tail:,} more through {broker.bootstrap} (left unsealed) ...", file=sys.stderr)
        produce_tail(broker.bootstrap, args.records - tail, tail, args.value_bytes, args.partitions)
        spark = spark_session()
        options = {"path": str(data_dir), "subscribe": TOPIC, "kafka.bootstrap.servers": broker.bootstrap}
        planned = LoglakeBatchReader(parse_read_options(options, "batch")).partitions()
        through_broker = sum(
            p.value.count
            for p in planned
            if isinstance(p.value, BrokerRange)  # type: ignore[attr-defined]
        )
        assert through_broker == tail, f"{through_broker} offsets planned through the broker, {tail} unsealed"

        def df(opts: dict[str, str]) -> Any:
            return spark.read.format("loglake").options(**opts).load()

        n = df(options).count()
        assert n == args.records, f"hybrid read {n} records, produced {args.records}"
        hybrid_s = timed(lambda: df(options).write.format("noop").mode("overwrite").save(), args.repeat)
    finally:
        assert broker.stop() == 0  # a clean shutdown seals the tail
    sealed = {"path": str(data_dir), "subscribe": TOPIC}
    n = df(sealed).count()
    assert n == args.records, f"sealed read {n} records, produced {args.records}"
    sealed_s = timed(lambda: df(sealed).write.format("noop").mode("overwrite").save(), args.repeat)
    spark.stop()
    return {
        "records": args.records,
        "tail_records": tail,
        "value_bytes": args.value_bytes,
        "partitions": args.partitions,
        "master": args.master,
        "cpus": os.cpu_count(),
        "hybrid_s": round(hybrid_s, 3),
        "hybrid_records_per_s": round(args.records / hybrid_s),
        "sealed_s": round(sealed_s, 3),
        "sealed_records_per_s": round(args.records / sealed_s),
        "ratio_to_sealed": round(sealed_s / hybrid_s, 3),
        "targets": {"ratio_to_sealed": 0.70},
    }


def export_rates(spark: Any, data_dir: Path, work: Path, records: int, repeat: int) -> dict[str, Any]:
    """Seconds of the best of `repeat` exports of the topic: the Parquet sink (headers always),
    an Iceberg table without headers (its default) and with them (includeHeaders=true: Spark's
    JVM-to-Arrow conversion of the array<struct> column for the writers is slow)."""
    from loglake.spark.iceberg import export_iceberg
    from loglake.spark.pipeline import export_query, watch

    def parquet() -> None:
        out = work / "export-parquet"
        shutil.rmtree(out, ignore_errors=True)
        q = export_query(spark, str(data_dir), TOPIC, str(out), source_options={})
        assert watch(q, lambda _p: None).rows == records

    def iceberg(headers: bool) -> None:
        shutil.rmtree(work / "iceberg", ignore_errors=True)
        (work / "iceberg").mkdir()
        result = export_iceberg(
            spark,
            str(data_dir),
            TOPIC,
            catalog_uri=f"sqlite:///{work}/iceberg/catalog.db",
            table_name="bench.t",
            warehouse=str(work / "iceberg" / "warehouse"),
            source_options={"includeHeaders": str(headers).lower()},
        )
        assert result.rows == records

    parquet_s = timed(parquet, repeat)
    iceberg_s = timed(lambda: iceberg(False), repeat)
    headers_s = timed(lambda: iceberg(True), repeat)
    return {
        "export_parquet_s": round(parquet_s, 3),
        "export_parquet_rows_per_s": round(records / parquet_s),
        "export_iceberg_s": round(iceberg_s, 3),
        "export_iceberg_rows_per_s": round(records / iceberg_s),
        "export_iceberg_ratio_to_parquet": round(parquet_s / iceberg_s, 3),
        "export_iceberg_headers_s": round(headers_s, 3),
        "export_iceberg_headers_rows_per_s": round(records / headers_s),
        "export_iceberg_headers_ratio_to_parquet": round(parquet_s / headers_s, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--codec", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    ap.add_argument(
        "--profile", action="store_true", help="cProfile one segment's read_slice in this process"
    )
    ap.add_argument(
        "--hybrid", action="store_true", help="hybrid read with a 10 %% unsealed tail vs the same data sealed"
    )
    ap.add_argument(
        "--export", action="store_true", help="also time pipeline export: Parquet sink vs Iceberg table"
    )
    ap.add_argument(
        "--handoff",
        action="store_true",
        help="also time Spark's Python-to-JVM hand-off alone (a source yielding a prebuilt batch)",
    )
    args = ap.parse_args()

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="loglake-spark-bench-"))
    data_dir, parquet_dir = work / "data", work / "parquet"

    def spark_session() -> Any:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        import loglake.spark

        spark = (
            SparkSession.builder.master(args.master)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "4g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        loglake.spark.register(spark)
        return spark

    if args.hybrid:
        try:
            result = hybrid(args, work, spark_session)
            print(json.dumps(result, indent=2))
            print(
                f"hybrid read (10 % tail through the broker): {result['hybrid_records_per_s']:,} records/s; "
                f"sealed: {result['sealed_records_per_s']:,} records/s; "
                f"hybrid reads at {result['ratio_to_sealed']:.0%} of the sealed rate"
            )
            if args.json:
                Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        finally:
            if not args.dir:
                shutil.rmtree(work, ignore_errors=True)
        return
    try:
        if not (data_dir / "segments").exists():
            print(f"producing {args.records:,} records into {data_dir} ...", file=sys.stderr)
            produce_s = produce(data_dir, args.records, args.value_bytes, args.partitions, args.codec)
        else:
            produce_s = 0.0
        spark = spark_session()

        def loglake_df() -> Any:
            return (
                spark.read.format("loglake").option("path", str(data_dir)).option("subscribe", TOPIC).load()
            )

        n = loglake_df().count()
        assert n == args.records, f"read {n} records, produced {args.records}"
        if not parquet_dir.exists():
            loglake_df().write.parquet(str(parquet_dir))
        loglake_s = timed(lambda: loglake_df().write.format("noop").mode("overwrite").save(), args.repeat)
        parquet_s = timed(
            lambda: spark.read.parquet(str(parquet_dir)).write.format("noop").mode("overwrite").save(),
            args.repeat,
        )
        exports = export_rates(spark, data_dir, work, args.records, args.repeat) if args.export else {}
        if args.handoff:
            handoff_s, handoff_rows = handoff_rate(spark, data_dir, args.records, args.repeat)
            exports["handoff_s"] = round(handoff_s, 3)
            exports["handoff_rows_per_s"] = round(handoff_rows / handoff_s)
        spark.stop()
        result = {
            "records": args.records,
            "value_bytes": args.value_bytes,
            "partitions": args.partitions,
            "codec": args.codec,
            "master": args.master,
            "cpus": os.cpu_count(),
            "produce_s": round(produce_s, 2),
            "loglake_s": round(loglake_s, 3),
            "loglake_records_per_s": round(args.records / loglake_s),
            "parquet_s": round(parquet_s, 3),
            "parquet_records_per_s": round(args.records / parquet_s),
            "ratio_to_parquet": round(parquet_s / loglake_s, 3),
            **exports,
            "targets": {
                "records_per_s": 2_000_000,
                "ratio_to_parquet": 0.25,
                "export_iceberg_ratio_to_parquet": 0.8,
            },
        }
        print(json.dumps(result, indent=2))
        print()
        print(f"{'read':<10} {'seconds':>9} {'records/s':>14}")
        print(f"{'loglake':<10} {loglake_s:>9.3f} {result['loglake_records_per_s']:>14,}")
        print(f"{'parquet':<10} {parquet_s:>9.3f} {result['parquet_records_per_s']:>14,}")
        print(f"loglake reads at {result['ratio_to_parquet']:.0%} of the Parquet rate")
        if "handoff_s" in exports:
            print(
                f"hand-off alone (prebuilt batches, no decoding): {exports['handoff_s']:.3f} s, "
                f"{exports['handoff_rows_per_s']:,} rows/s"
            )
        if "export_parquet_s" in exports:
            print()
            print(f"{'export':<10} {'seconds':>9} {'rows/s':>14}")
            for name in ("parquet", "iceberg", "iceberg_headers"):
                secs, rate = exports[f"export_{name}_s"], exports[f"export_{name}_rows_per_s"]
                print(f"{name:<10} {secs:>9.3f} {rate:>14,}")
            print(
                f"the Iceberg export runs at {exports['export_iceberg_ratio_to_parquet']:.0%} of the Parquet export's rate"
            )
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        if args.profile:
            print()
            print(profile_read(data_dir))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
