#!/usr/bin/env python3
"""Produce cost of validated topics (issue 33): the same records produced to a topic with
`confluent.value.schema.validation=true`, to one with `full`, and to one without validation, on
one real `loglake serve --schema-registry-listen` (docs/SCHEMA_REGISTRY.md, "Performance").

    .venv/bin/python benchmarks/validation.py                        # 200,000 records x 3 cases x 5 runs, ~2 min
    .venv/bin/python benchmarks/validation.py --runs 3 --records 100000 --json-out /tmp/v.json

What is measured: three topics of `--partitions` partitions each — `plain` (no validation),
`validated` (`confluent.value.schema.validation=true`: each record's 5-byte header read and its
schema id looked up under `<topic>-value`) and `full` (`=full`: the Avro datum decoded too) — and
one Avro schema registered under each topic's `<topic>-value` subject through confluent-kafka's
SchemaRegistryClient. The values (`--distinct` of them, ~`--value-bytes` each) are built once in
Confluent's wire format (magic 0, the 4-byte schema id, the datum written by fastavro): the
producer's serializer is not what is measured. Each run is one fresh confluent-kafka producer
(acks=all, linger.ms 5, batch.size 1,000,000, no compression) producing `--records` values to
one topic, timed from the first produce() until every delivery report is in; the broker is idle
(its seals done) before each run starts. The runs interleave the cases, each round in a rotated
order (plain, validated, full; validated, full, plain; ...), so the machine's other load falls on
all of them alike.

Figures per case: records/s (wall) and the broker's CPU seconds (utime + stime of
/proc/<pid>/stat, until the last acknowledgement) per million records, min and median over the
runs; and validated/plain, full/plain of both, from the medians (throughput: issue 33's target is
≥ 95 % for `true`; `full` is reported without one). The load average before and after is
reported beside them. JSON on stdout, the table on stderr.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fastavro  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient  # noqa: E402

from benchkit import emit, load_benchmark  # noqa: E402

from brokerkit import Broker, free_port  # noqa: E402

client = load_benchmark("broker_client")
cost = load_benchmark("cost")
log = client.log

#: The cases, by topic name: the value of `confluent.value.schema.validation` (None: not set).
CASES: dict[str, str | None] = {"plain": None, "validated": "true", "full": "full"}
#: Issue 33's target: validated (`true`) produce throughput at least this share of plain.
TARGET_RATIO = 0.95
#: The Avro schema of the values: an event of a few typed fields and a text of its own length.
SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "bench.loglake",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "ts", "type": "long"},
        {"name": "kind", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "text", "type": "string"},
    ],
}
#: The 1 MB batches the brief asks for; the rest of the producer is broker_client.producer_config
#: (acks=all, linger.ms 5, no compression).
PRODUCER = {"batch.size": 1_000_000}


def wire_values(schema_id: int, count: int, size: int) -> list[bytes]:
    """`count` distinct values of ~`size` bytes in Confluent's wire format: magic 0, the schema id
    (4 bytes, big-endian), then an Avro datum of SCHEMA."""
    parsed = fastavro.parse_schema(SCHEMA)
    rng = random.Random(size)
    header = b"\x00" + schema_id.to_bytes(4, "big")
    out = []
    for i in range(count):
        datum = {"id": i, "ts": 1_700_000_000_000 + i, "kind": rng.choice(("click", "view", "buy")),
                 "amount": rng.random() * 100, "text": ""}  # fmt: skip
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, datum)
        pad = max(0, size - len(header) - buf.tell() - 1)  # the text's 1-byte length for < 64 chars
        datum["text"] = "".join(rng.choices(string.ascii_letters, k=pad))
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, datum)
        out.append(header + buf.getvalue())
    return out


def produce(bootstrap: str, topic: str, values: list[bytes], count: int, pid: int) -> dict[str, float]:
    """One fresh producer's `count` records to `topic`: wall seconds from the first produce()
    until every delivery report is in, and the broker's CPU seconds over them."""
    errors: list[str] = []

    def on_error(err: Any, msg: Any) -> None:
        errors.append(str(err))

    producer = Producer(
        client.producer_config(bootstrap, **{"delivery.report.only.error": True, "on_delivery": on_error, **PRODUCER})
    )
    producer.produce(topic, values[0])  # warm-up: metadata, connection (a valid value: validated topics take it)
    assert producer.flush(30) == 0 and not errors, errors
    n = len(values)
    send, poll = producer.produce, producer.poll
    cpu0 = client.proc_cpu_seconds(pid)
    started = time.perf_counter()
    i = 0
    while i < count:
        try:
            send(topic, values[i % n])
            i += 1
        except BufferError:
            poll(0.001)
    left = producer.flush(120)
    wall = time.perf_counter() - started
    cpu = client.proc_cpu_seconds(pid) - cpu0
    if left or errors:
        raise RuntimeError(f"produce to {topic} failed: {left} undelivered, errors {errors[:3]}")
    return {"records_per_s": count / wall, "cpu_s_per_m_records": cpu / count * 1e6, "seconds": wall, "cpu_s": cpu}


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def spread(values: list[float]) -> dict[str, Any]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "runs": values}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    registry_port = free_port()
    with tempfile.TemporaryDirectory(prefix="loglake-validation-", dir=args.dir or str(ROOT.parent)) as tmp:
        broker_args = ["--schema-registry-listen", f"127.0.0.1:{registry_port}", *args.broker_arg]
        broker = Broker(Path(tmp) / "data", broker_args).start()
        assert broker.proc is not None
        pid = broker.proc.pid
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            topics = [
                NewTopic(name, args.partitions, 1, config={} if level is None else {"confluent.value.schema.validation": level})
                for name, level in CASES.items()
            ]
            for fut in admin.create_topics(topics).values():
                fut.result(60)
            registry = SchemaRegistryClient({"url": f"http://127.0.0.1:{registry_port}"})
            schema = Schema(json.dumps(SCHEMA), "AVRO")
            # one schema, one id: registered under every case's subject (plain's too, so the
            # topics differ in their validation alone)
            ids = {registry.register_schema(f"{name}-value", schema) for name in CASES}
            assert len(ids) == 1, ids
            schema_id = ids.pop()
            values = wire_values(schema_id, args.distinct, args.value_bytes)
            names = [name for name in CASES if name in args.cases]
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
            load_before = load_average()
            for r in range(args.runs):
                order = names[r % len(names):] + names[: r % len(names)]
                for name in order:
                    cost.settle(pid)
                    row = produce(broker.bootstrap, name, values, args.records, pid)
                    runs[name].append(row)
                    log(f"run {r + 1} {name:<9} {row['records_per_s']:>9,.0f} records/s, "
                        f"{row['cpu_s_per_m_records']:.2f} broker CPU-s per M records")  # fmt: skip
            load_after = load_average()
            exit_code = broker.stop()
        finally:
            if broker.running:
                broker.stop()
    cases = {
        name: {
            "validation": CASES[name] or "false",
            "records_per_s": spread([row["records_per_s"] for row in rows]),
            "cpu_s_per_m_records": spread([row["cpu_s_per_m_records"] for row in rows]),
        }
        for name, rows in runs.items()
    }
    plain = cases.get("plain")
    ratios = {
        name: {
            "throughput": cases[name]["records_per_s"]["median"] / plain["records_per_s"]["median"],
            "cpu": cases[name]["cpu_s_per_m_records"]["median"] / plain["cpu_s_per_m_records"]["median"],
        }
        for name in ("validated", "full")
        if name in cases and plain is not None
    }
    return {
        "settings": {
            "records": args.records, "runs": args.runs, "partitions": args.partitions, "value_bytes": len(values[0]),
            "distinct_values": args.distinct, "producer": {**client.producer_config("-"), **PRODUCER},
            "broker_args": broker_args,
        },
        "schema_id": schema_id,
        "cases": cases,
        "ratios_of_medians": ratios,
        "target_throughput_ratio": TARGET_RATIO,
        "validated_meets_target": ratios["validated"]["throughput"] >= TARGET_RATIO if "validated" in ratios else None,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "cpus": os.cpu_count(),
        "broker_exit_code": exit_code,
        "runs": runs,
    }


def table(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [
        f"{s['records']:,} records of {s['value_bytes']} B x {s['runs']} runs per case, {s['partitions']} partition(s); "
        f"load average {doc['load_average_before'][0]:.2f} before, {doc['load_average_after'][0]:.2f} after "
        f"({doc['cpus']} CPUs)",
        "",
        "| case | records/s min / median | broker CPU-s per M records min / median | throughput vs plain | CPU vs plain |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, case in doc["cases"].items():
        rps, cpu = case["records_per_s"], case["cpu_s_per_m_records"]
        ratio = doc["ratios_of_medians"].get(name)
        through = "-" if ratio is None else f"{ratio['throughput']:.1%}" + (
            f" (target ≥ {doc['target_throughput_ratio']:.0%})" if name == "validated" else ""
        )
        lines.append(
            f"| {name} (`{case['validation']}`) | {rps['min']:,.0f} / {rps['median']:,.0f} | "
            f"{cpu['min']:.2f} / {cpu['median']:.2f} | {through} | {'-' if ratio is None else format(ratio['cpu'], '.2f') + 'x'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000, help="records per run (default 200,000)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each case, interleaved (default 5)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)} (default all)")
    ap.add_argument("--partitions", type=int, default=3, help="partitions of each topic (default 3)")
    ap.add_argument("--value-bytes", type=int, default=100, help="bytes of a value, header included (default 100)")
    ap.add_argument("--distinct", type=int, default=1024, help="distinct values cycled through (default 1024)")
    ap.add_argument("--broker-arg", action="append", default=[], help="extra `loglake serve` argument (repeatable)")
    ap.add_argument("--dir", default=None, help="where the broker's data dir lives (default: the system's temporary directory)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    if unknown := set(args.cases) - set(CASES):
        ap.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    emit(measure(args), args.json_out, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
