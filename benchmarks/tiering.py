"""Tiering benchmark: cold reads through the broker against raw S3 reads, and producer impact.

In one run, against a moto S3 server on 127.0.0.1 and a `loglake serve` child process with
`--cold-store s3://...` (durability fsync, hot.retain.segments=0 so everything goes cold):

1. raw `get_object` throughput of the bucket's segment objects (the limit of this bucket);
2. cold sequential read throughput through the broker (confluent-kafka consumer from offset 0,
   fresh broker so no cache is warm), as a share of (1) — target >= 70 %;
3. ranged GETs per Fetch request during (2), from the broker's /metrics;
4. produce throughput to a hot topic alone, and while a consumer scans the cold topic —
   target <= 10 % slowdown.

    .venv/bin/python benchmarks/tiering.py            # JSON on stdout, table on stderr
    .venv/bin/python benchmarks/tiering.py --mb 32    # smaller

Everything runs on this machine (moto, broker and clients share its cores), so read the
numbers as relative: moto is a Python server and usually the slowest part.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import botocore.config
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
RECORD_BYTES = 1024


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_broker(data_dir: Path, cold_url: str, metrics_port: int) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable,
        "-m",
        "loglake.cli.main",
        "serve",
        "--data-dir",
        str(data_dir),
        "--listen",
        "127.0.0.1:0",
        "--cold-store",
        cold_url,
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, **ENV}
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("loglake listening on "):
        raise RuntimeError(f"broker did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1].strip()


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def fetch_count(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(
        float(row.rsplit(" ", 1)[1])
        for row in text.splitlines()
        if row.startswith('loglake_requests_total{api="Fetch"')
    )


def produce(bootstrap: str, topic: str, total_bytes: int | None, seconds: float | None) -> tuple[int, float]:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "enable.idempotence": True,
            "queue.buffering.max.kbytes": 65536,
        }
    )
    value = os.urandom(RECORD_BYTES)
    sent = 0
    start = time.perf_counter()
    while True:
        try:
            p.produce(topic, value=value)
            sent += 1
        except BufferError:
            p.poll(0.01)
        if sent % 1000 == 0:
            p.poll(0)
            if total_bytes is not None and sent * RECORD_BYTES >= total_bytes:
                break
            if seconds is not None and time.perf_counter() - start >= seconds:
                break
    p.flush(120)
    return sent, time.perf_counter() - start


def consume_all(
    bootstrap: str, topic: str, stop_event: threading.Event | None = None
) -> tuple[int, int, float]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s) once queued.min.messages
            # (100,000) are queued locally; raise both so the broker is what gets measured.
            "queued.min.messages": 2_000_000,
            "queued.max.messages.kbytes": 512 * 1024,
            "fetch.queue.backoff.ms": 5,
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 16 << 20,
        }
    )
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    c.assign([TopicPartition(topic, 0, lo)])
    records = size = 0
    start = None  # the clock starts at the first record: librdkafka waits ~0.5-1 s before its
    # first fetch of a freshly assigned partition, which says nothing about the broker
    while records < hi - lo and not (stop_event and stop_event.is_set()):
        for m in c.consume(10000, timeout=1.0):
            if not m.error():
                if start is None:
                    start = time.perf_counter()
                records += 1
                size += len(m.value() or b"")
    c.close()
    return records, size, time.perf_counter() - (start or time.perf_counter())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=128, help="MB of 1 KiB records in the cold topic")
    ap.add_argument("--produce-seconds", type=float, default=8.0)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    os.environ.update(ENV)
    work = Path(tempfile.mkdtemp(prefix="loglake-tiering-", dir=args.dir))
    # moto in its own process: in this one its threads would compete with the clients for the GIL.
    moto_port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{moto_port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            break
        except Exception:
            time.sleep(0.1)
    s3 = boto3.client(
        "s3", endpoint_url=endpoint, config=botocore.config.Config(s3={"addressing_style": "path"})
    )
    s3.create_bucket(Bucket="bench")
    cold_url = f"s3://bench/tier?endpoint_url={endpoint}&region=us-east-1&path_style=true"
    results: dict[str, Any] = {"record_bytes": RECORD_BYTES, "cold_topic_mb": args.mb}
    mport = free_port()
    try:
        proc, bootstrap = start_broker(work / "data", cold_url, mport)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        cfg = {"segment.bytes": str(8 << 20), "hot.retain.segments": "0", "retention.ms": "-1"}
        admin.create_topics(
            [NewTopic("cold", 1, config=cfg), NewTopic("hot", 1, config={"retention.ms": "-1"})]
        )["cold"].result(30)
        print("filling the cold topic ...", file=sys.stderr)
        produce(bootstrap, "cold", args.mb << 20, None)
        stop(proc)  # clean shutdown seals and uploads the rest
        objects = [
            o
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench")
            for o in page.get("Contents", [])
            if o["Key"].endswith(".seg")
        ]
        results["cold_segments"] = len(objects)
        # 1. raw S3 reads
        start = time.perf_counter()
        raw_bytes = 0
        for o in objects:
            raw_bytes += len(s3.get_object(Bucket="bench", Key=o["Key"])["Body"].read())
        raw_s = time.perf_counter() - start
        results["raw_get_object_MBps"] = raw_bytes / raw_s / 1e6
        # 2+3. cold reads through a fresh broker (nothing cached)
        proc, bootstrap = start_broker(work / "data", cold_url, mport)
        gets0, fetch0 = metric(mport, "loglake_cold_range_gets_total"), fetch_count(mport)
        records, size, took = consume_all(bootstrap, "cold")
        gets1, fetch1 = metric(mport, "loglake_cold_range_gets_total"), fetch_count(mport)
        results["cold_read_records"] = records
        results["cold_read_MBps"] = size / took / 1e6
        results["cold_vs_raw"] = results["cold_read_MBps"] / results["raw_get_object_MBps"]
        results["gets_per_fetch"] = (gets1 - gets0) / max(1.0, fetch1 - fetch0)
        # The same scan again: the range cache now holds the topic, so this is the broker and
        # client path without S3 — the ceiling a cold read could reach on this machine.
        _records2, size2, took2 = consume_all(bootstrap, "cold")
        results["warm_cache_read_MBps"] = size2 / took2 / 1e6
        results["cold_vs_warm_cache"] = results["cold_read_MBps"] / results["warm_cache_read_MBps"]
        # 4. produce alone, then with a cold scan running
        n, s = produce(bootstrap, "hot", None, args.produce_seconds)
        results["produce_alone_rps"] = n / s
        stop_scan = threading.Event()

        def scan() -> None:
            while not stop_scan.is_set():
                consume_all(bootstrap, "cold", stop_scan)

        t = threading.Thread(target=scan, daemon=True)
        t.start()
        time.sleep(1.0)
        n, s = produce(bootstrap, "hot", None, args.produce_seconds)
        stop_scan.set()
        t.join(60)
        results["produce_with_cold_scan_rps"] = n / s
        results["produce_slowdown"] = 1 - results["produce_with_cold_scan_rps"] / results["produce_alone_rps"]
        # Control: the same scan again; the range cache holds the topic by now, so no bucket
        # I/O happens — what is left is CPU shared with the scan on this box.
        stop_scan.clear()
        t = threading.Thread(target=scan, daemon=True)
        t.start()
        time.sleep(1.0)
        n, s = produce(bootstrap, "hot", None, args.produce_seconds)
        stop_scan.set()
        t.join(60)
        results["produce_with_cached_scan_rps"] = n / s
        results["produce_slowdown_cached_scan"] = 1 - n / s / results["produce_alone_rps"]
        stop(proc)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    results["targets"] = {
        "cold_vs_raw>=0.70": results.get("cold_vs_raw", 0) >= 0.70,
        "gets_per_fetch<=2": results.get("gets_per_fetch", 99) <= 2,
        "produce_slowdown<=0.10": results.get("produce_slowdown", 1) <= 0.10,
    }
    print(json.dumps(results, indent=2))
    rows = [
        ("raw get_object", f"{results['raw_get_object_MBps']:.1f} MB/s", ""),
        (
            "cold read via broker",
            f"{results['cold_read_MBps']:.1f} MB/s",
            f"{results['cold_vs_raw']:.0%} of raw (target 70 %)",
        ),
        (
            "same scan, cache warm",
            f"{results['warm_cache_read_MBps']:.1f} MB/s",
            f"broker+client ceiling; cold = {results['cold_vs_warm_cache']:.0%} of it",
        ),
        ("ranged GETs per Fetch", f"{results['gets_per_fetch']:.2f}", "target <= 2"),
        ("produce alone", f"{results['produce_alone_rps']:,.0f} rec/s", ""),
        (
            "produce + cold scan",
            f"{results['produce_with_cold_scan_rps']:,.0f} rec/s",
            f"{results['produce_slowdown']:.0%} slower (target <= 10 %)",
        ),
        (
            "produce + cached scan",
            f"{results['produce_with_cached_scan_rps']:,.0f} rec/s",
            f"{results['produce_slowdown_cached_scan']:.0%} slower: same scan, no bucket I/O",
        ),
    ]
    for name, value, note in rows:
        print(f"{name:24s} {value:>18s}  {note}", file=sys.stderr)


if __name__ == "__main__":
    main()
