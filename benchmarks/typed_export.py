"""Typed Iceberg export (`--value-format registry`) against the binary-value export, same run.

    .venv/bin/python benchmarks/typed_export.py                      # 1M Avro records
    .venv/bin/python benchmarks/typed_export.py --records 200000 --json-out out.json

A broker with the schema registry (`loglake serve --schema-registry-listen`) registers two
versions of an Avro record (v2 adds an optional field); the topic's records (half of each
version, Confluent's wire format, ~100 bytes) are produced with the embedded API and sealed, then
both exports run in one Spark session (local[2]) into fresh tables after one untimed warm-up
export, each timed --repeat times, interleaved (best run): the binary export (value bytes as they are) and the typed one (decoded on the
executors with the latest version as reader schema, the fields as columns). Reported: rows/s of
each and the typed export's share of the binary one's rate (issue 33's target: >= 70 %).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit
import loglake
from loglake.records.batch import build_batch

TOPIC = "typed"
BATCH_RECORDS = 2000
ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.70


def schema(version: int) -> dict[str, Any]:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["BUY", "SELL"]}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ]
    if version >= 2:
        fields.append({"name": "region", "type": ["null", "string"], "default": None})
    return {"type": "record", "name": "Order", "namespace": "bench", "fields": fields}


def register(registry: str) -> list[int]:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry})
    return [client.register_schema(f"{TOPIC}-value", Schema(json.dumps(schema(v)), "AVRO")) for v in (1, 2)]


def produce(data_dir: Path, ids: list[int], records: int, partitions: int) -> tuple[float, float]:
    """(seconds, mean value bytes) of producing the records, sealed."""
    import fastavro

    parsed = [fastavro.parse_schema(schema(v)) for v in (1, 2)]
    t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    started = time.perf_counter()
    total = 0
    with loglake.open(str(data_dir)) as log:
        log.create_topic(TOPIC, partitions, {"retention.ms": "-1"})
        ts = int(time.time() * 1000)
        for start in range(0, records, BATCH_RECORDS):
            n = min(BATCH_RECORDS, records - start)
            recs = []
            for i in range(start, start + n):
                v = 0 if i < records // 2 else 1
                doc = {
                    "id": i, "user": f"user-{i % 1000:04d}", "amount": i * 0.25,
                    "at": t0 + datetime.timedelta(milliseconds=i), "kind": "BUY" if i % 3 else "SELL",
                    "note": None if i % 5 else f"note {i}",
                }  # fmt: skip
                if v:
                    doc["region"] = f"r{i % 7}"
                buf = io.BytesIO()
                buf.write(struct.pack(">bI", 0, ids[v]))
                fastavro.schemaless_writer(buf, parsed[v], doc)
                total += buf.tell()
                recs.append((ts, f"{i}".encode(), buf.getvalue(), ()))
            log.produce_raw(TOPIC, (start // BATCH_RECORDS) % partitions, build_batch(recs))
        log.flush()
    return time.perf_counter() - started, total / max(records, 1)


def timed(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def table(doc: dict[str, Any]) -> str:
    return (
        f"{doc['records']:,} records, Avro values of {doc['value_bytes']} bytes, {doc['partitions']} partitions, "
        f"{doc['master']}\n"
        f"  binary export: {doc['binary_rows_per_s']:>10,} rows/s ({doc['binary_s']} s)\n"
        f"  typed export:  {doc['typed_rows_per_s']:>10,} rows/s ({doc['typed_s']} s)\n"
        f"  typed / binary: {doc['ratio_typed_to_binary']:.0%} (target {TARGET:.0%})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--json-out", help="also write the JSON report here")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "tests"))
    from brokerkit import Broker, free_port

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="loglake-typed-bench-"))
    data_dir = work / "data"
    port = free_port()
    registry = f"http://127.0.0.1:{port}"
    registry_args = ["--schema-registry-listen", f"127.0.0.1:{port}"]
    try:
        broker = Broker(data_dir, registry_args).start()
        try:
            ids = register(registry)
        finally:
            assert broker.stop() == 0
        print(f"producing {args.records:,} Avro records into {data_dir} ...", file=sys.stderr)
        produce_s, value_bytes = produce(data_dir, ids, args.records, args.partitions)
        broker = Broker(data_dir, registry_args).start()  # the registry, for the typed export
        try:
            doc = run(args, work, data_dir, registry)
        finally:
            assert broker.stop() == 0
        doc["produce_s"] = round(produce_s, 3)
        doc["value_bytes"] = round(value_bytes)
        benchkit.emit(doc, args.json_out, table)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path, data_dir: Path, registry: str) -> dict[str, Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import loglake.spark
    from loglake.spark.iceberg import REGISTRY_FORMAT, export_iceberg, open_catalog

    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    loglake.spark.register(spark)

    def export(typed: bool) -> None:
        target = work / ("typed" if typed else "binary")
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        result = export_iceberg(
            spark, str(data_dir), TOPIC, catalog_uri=f"sqlite:///{target}/catalog.db", table_name="bench.t",
            warehouse=str(target / "warehouse"), value_format=REGISTRY_FORMAT if typed else None,
            registry_url=registry if typed else None,
        )  # fmt: skip
        assert result.rows == args.records and result.dead_letters == 0, result

    try:
        export(False)  # warm-up: the JVM's code and the Python workers, so the first timed run is not charged for them
        binary_s = typed_s = float("inf")
        for _ in range(args.repeat):  # interleaved: the machine's other load falls on both
            binary_s = min(binary_s, timed(lambda: export(False), 1))
            typed_s = min(typed_s, timed(lambda: export(True), 1))
        t = open_catalog(f"sqlite:///{work}/typed/catalog.db", None, {}).load_table("bench.t")
        columns = [f.name for f in t.schema().fields]
    finally:
        spark.stop()
    return {
        "records": args.records,
        "partitions": args.partitions,
        "master": args.master,
        "cpus": os.cpu_count(),
        "typed_columns": columns,
        "binary_s": round(binary_s, 3),
        "binary_rows_per_s": round(args.records / binary_s),
        "typed_s": round(typed_s, 3),
        "typed_rows_per_s": round(args.records / typed_s),
        "ratio_typed_to_binary": round(binary_s / typed_s, 3),
        "targets": {"ratio_typed_to_binary": TARGET},
    }


if __name__ == "__main__":
    main()
