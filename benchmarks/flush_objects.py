#!/usr/bin/env python3
"""Durability class `object` against moto (docs/CLUSTER.md): foreground PUTs/s and bytes per PUT
at 1, 100 and 1,000 partitions under the same load, with the background merge's PUTs counted
apart.

One moto S3 server (in-process, on 127.0.0.1) for the run. Per partition count, one Flusher with
its default triggers (object_flush_bytes 4 MB, object_flush_ms 500 ms) takes the same paced load
— `--rate` records/s of 100 B in batches of `--batch` records, round-robin over the partitions —
for `--seconds`; every append's future is waited on (the commit callback only records the index,
as etcd will in the next step). Reported: foreground PUT requests/s and bytes per PUT, ack latency
(append -> future resolved) p50/p99, what one object per partition per flush would have cost,
then the merge of everything flushed into per-partition segments: merge PUTs, whole-object GETs
(the merge reads each flush object once through a cache) and the merge's duration.

    .venv/bin/python benchmarks/flush_objects.py                 # ~2 min
    .venv/bin/python benchmarks/flush_objects.py --partitions 1,1000 --seconds 5 --rate 50000

Prints a JSON document (and a Markdown table to stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from moto.server import ThreadedMotoServer  # noqa: E402

import s3kit  # noqa: E402 - the tests' moto helpers (dummy credentials, client, store)
from loglake.cluster.flusher import Flusher, FlushSettings  # noqa: E402
from loglake.cluster.flushobj import FlushIndex, ranges_by_partition, read_index  # noqa: E402
from loglake.cluster.merge import MergeStats, merge_partition  # noqa: E402
from loglake.records.batch import build_batch, set_base_offset  # noqa: E402
from loglake.segment import ZERO_HASH  # noqa: E402
from loglake.store import MemoryStore, ObjectStore  # noqa: E402
from loglake.store.base import BytesLike  # noqa: E402

RECORD_BYTES = 100
#: Merge workers (the merge is background work; a few run at once).
MERGE_THREADS = 4


class ObjectCache(MemoryStore):
    """Reads through: the first read of an object GETs it whole from `backing`, later ranged reads
    are served from memory, so merging 1,000 partitions of one object costs one GET, not 1,000.
    Writes go to `backing`."""

    def __init__(self, backing: ObjectStore) -> None:
        super().__init__("merge-cache")
        self.backing = backing
        self.gets = 0
        self._guard = threading.Lock()

    def _load(self, key: str) -> None:
        with self._guard:
            if super().head(key) is None:
                data = self.backing.get(key)
                self.gets += 1
                super().put(key, [data])

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self._load(key)
        return super().get_range(key, start, length)

    def put(self, key: str, parts: Sequence[BytesLike]) -> None:
        self.backing.put(key, parts)


def run_case(
    store: ObjectStore, partitions: int, rate: int, batch_records: int, seconds: float
) -> dict[str, Any]:
    tid = uuid.uuid4().hex
    template = bytearray(
        build_batch(
            (1_700_000_000_000 + i, None, os.urandom(RECORD_BYTES // 2).hex().encode(), ())
            for i in range(batch_records)
        )
    )
    committed: list[FlushIndex] = []
    f = Flusher(store, committed.append, cluster_id="bench", node_id=1, settings=FlushSettings())
    next_offset = [0] * partitions
    latencies: list[float] = []
    lock = threading.Lock()
    futures: list[Future[Any]] = []
    appends_per_s = rate / batch_records
    started = time.monotonic()
    done_appends = 0
    p = 0
    while True:
        now = time.monotonic() - started
        if now >= seconds:
            break
        due = int(now * appends_per_s) - done_appends
        for _ in range(due):
            buf = bytearray(template)
            set_base_offset(buf, 0, next_offset[p])
            next_offset[p] += batch_records
            t0 = time.monotonic()
            fut = f.append(tid, p, buf)

            def record(_f: Future[Any], t0: float = t0) -> None:
                with lock:
                    latencies.append(time.monotonic() - t0)

            fut.add_done_callback(record)
            futures.append(fut)
            p = (p + 1) % partitions
        done_appends += max(due, 0)
        time.sleep(0.002)
    for fut in futures:
        fut.result()
    elapsed = time.monotonic() - started
    f.close()
    latencies.sort()
    s = f.stats
    per_partition_puts = sum(len(ix.entries) for ix in committed)
    result: dict[str, Any] = {
        "partitions": partitions,
        "records": done_appends * batch_records,
        "records_per_s": round(done_appends * batch_records / elapsed),
        "seconds": round(elapsed, 2),
        "foreground_puts": s.puts,
        "foreground_puts_per_s": round(s.puts / elapsed, 2),
        "bytes_per_put": round(s.bytes_put / max(s.objects, 1)),
        "partitions_per_object_mean": round(per_partition_puts / max(len(committed), 1), 1),
        "puts_if_one_object_per_partition_per_flush": per_partition_puts,
        "puts_per_s_if_one_object_per_partition": round(per_partition_puts / elapsed, 1),
        "ack_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "ack_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1),
    }
    result.update(merge_all(store, committed))
    return result


def merge_all(store: ObjectStore, committed: list[FlushIndex]) -> dict[str, Any]:
    cache = ObjectCache(store)
    started = time.monotonic()
    indexes = [read_index(cache, ix.key, size=ix.size) for ix in committed]
    stats = MergeStats()
    lock = threading.Lock()

    def one(ranges: list[Any]) -> None:
        local = MergeStats()
        merge_partition(cache, ranges, cluster_id="bench", topic="bench", prev_hash=ZERO_HASH, stats=local)
        with lock:
            stats.merge_puts += local.merge_puts
            stats.range_gets += local.range_gets

    with ThreadPoolExecutor(MERGE_THREADS) as pool:
        list(pool.map(one, ranges_by_partition(indexes).values()))
    return {
        "merge_puts": stats.merge_puts,
        "merge_object_gets": cache.gets,
        "merge_ranges": stats.range_gets,
        "merge_seconds": round(time.monotonic() - started, 2),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| partitions | records/s | foreground PUTs/s | bytes per PUT | ack p50 / p99 | "
        "PUTs/s if one object per partition | merge PUTs | merge GETs | merge time |"
    )
    lines = [head, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['partitions']:,} | {r['records_per_s']:,} | {r['foreground_puts_per_s']} | "
            f"{r['bytes_per_put']:,} | {r['ack_p50_ms']} / {r['ack_p99_ms']} ms | "
            f"{r['puts_per_s_if_one_object_per_partition']:,} | {r['merge_puts']:,} | {r['merge_object_gets']:,} | {r['merge_seconds']} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="1,100,1000")
    parser.add_argument("--rate", type=int, default=20_000, help="records/s (100 B each)")
    parser.add_argument("--batch", type=int, default=10, help="records per batch")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    os.environ.update(s3kit.DUMMY_ENV)
    for k in s3kit.UNSET_ENV:
        os.environ.pop(k, None)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = s3kit.raw_client(endpoint)
        rows = []
        for n in (int(x) for x in args.partitions.split(",")):
            bucket = f"bench-{uuid.uuid4().hex[:12]}"
            client.create_bucket(Bucket=bucket)
            store = s3kit.make_store(endpoint, bucket)
            rows.append(run_case(store, n, args.rate, args.batch, args.seconds))
            store.close()
            print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        server.stop()
    print(table(rows), file=sys.stderr)
    print(
        json.dumps({"rate": args.rate, "batch": args.batch, "seconds": args.seconds, "cases": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
