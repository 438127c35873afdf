#!/usr/bin/env python3
"""Transactions in cluster mode (issue 30): commits/s of 10-record transactions through three
`loglake serve --cluster` brokers (real etcd and moto, tests/clusterkit.py via tests/modekit.py)
against one single-node broker, in the same run.

    .venv/bin/python benchmarks/cluster_txn.py            # 30 s per mode
    .venv/bin/python benchmarks/cluster_txn.py --quick    # 10 s per mode

`--producers` confluent-kafka transactional producers (one thread each, their own transactional
ids, so the ids spread over the cluster's coordinators) loop: begin_transaction, 10 records of
100 B over the topic's partitions, commit_transaction. Measured per mode: commits/s over the run
and the commit latency (commit_transaction's time: its flush and EndTxn, which in cluster mode
waits for every partition's leader to append and commit its marker) p50/p99. The brokers run
their test settings (cluster: `--object-flush-ms` 50, lease 2 s; modekit.CLUSTER_ARGS): a
marker is acknowledged after one flush like any record. The machine is shared and small (2
cores for the brokers, etcd, moto and the clients): the load average before and after is in the
JSON. Prints a JSON document on stdout and a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from confluent_kafka import Producer  # noqa: E402

from modekit import serving  # noqa: E402 - the tests' harness: one broker, or three over etcd and moto

PARTITIONS = 3
RECORDS_PER_TXN = 10
RECORD_BYTES = 100


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_producer(bootstrap: str, topic: str, until: float, out: list[float], errors: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:12]}", "linger.ms": 0})
    value = b"x" * RECORD_BYTES
    try:
        p.init_transactions(60)
        while time.monotonic() < until:
            p.begin_transaction()
            for i in range(RECORDS_PER_TXN):
                p.produce(topic, value=value, partition=i % PARTITIONS)
            started = time.monotonic()
            p.commit_transaction(60)
            out.append(time.monotonic() - started)
    except Exception as exc:  # reported in the JSON; the run's other producers go on
        errors.append(repr(exc))
    finally:
        p.flush(10)


def measure(mode: str, tmp: Path, producers: int, seconds: float) -> dict[str, Any]:
    with serving(mode, tmp, ["--default-partitions", str(PARTITIONS)]) as served:
        topic = f"txn-bench-{uuid.uuid4().hex[:6]}"
        warm: list[float] = []
        run_producer(served.bootstrap, topic, time.monotonic() + 2.0, warm, [])  # creates the topic, finds leaders
        latencies: list[list[float]] = [[] for _ in range(producers)]
        errors: list[str] = []
        until = time.monotonic() + seconds
        started = time.monotonic()
        threads = [
            threading.Thread(target=run_producer, args=(served.bootstrap, topic, until, latencies[i], errors))
            for i in range(producers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
    every = [x for lat in latencies for x in lat]
    return {
        "mode": mode,
        "brokers": 3 if mode == "cluster" else 1,
        "producers": producers,
        "seconds": round(elapsed, 2),
        "commits": len(every),
        "commits_per_s": round(len(every) / elapsed, 1) if elapsed else 0.0,
        "records_per_s": round(len(every) * RECORDS_PER_TXN / elapsed, 1) if elapsed else 0.0,
        "commit_p50_ms": round(pct(every, 0.50) * 1000, 1),
        "commit_p99_ms": round(pct(every, 0.99) * 1000, 1),
        "errors": errors,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 s per mode instead of 30")
    ap.add_argument("--producers", type=int, default=4, help="transactional producers, one thread each")
    ap.add_argument("--seconds", type=float, default=None, help="seconds of load per mode")
    ap.add_argument("--json-out", help="also write the JSON here")
    args = ap.parse_args()
    seconds = args.seconds if args.seconds is not None else (10.0 if args.quick else 30.0)
    load_before = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory(prefix="cluster-txn-bench-") as tmp:
        for mode in ("single", "cluster"):
            log(f"{mode}: {args.producers} transactional producers for {seconds:.0f} s ...")
            (Path(tmp) / mode).mkdir()
            results[mode] = measure(mode, Path(tmp) / mode, args.producers, seconds)
    ratio = results["cluster"]["commits_per_s"] / results["single"]["commits_per_s"] if results["single"]["commits_per_s"] else 0.0
    doc = {
        "benchmark": "cluster_txn",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "records_per_transaction": RECORDS_PER_TXN,
        "record_bytes": RECORD_BYTES,
        "partitions": PARTITIONS,
        "results": results,
        "cluster_over_single": round(ratio, 3),
    }  # fmt: skip
    print(json.dumps(doc, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2))
    log("")
    log(f"{'mode':<8} {'brokers':>7} {'commits/s':>10} {'records/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for r in results.values():
        log(
            f"{r['mode']:<8} {r['brokers']:>7} {r['commits_per_s']:>10} {r['records_per_s']:>10} "
            f"{r['commit_p50_ms']:>8} {r['commit_p99_ms']:>8} {len(r['errors']):>6}"
        )
    log(f"cluster / single commits/s: {ratio:.2f}")
    return 0 if not any(r["errors"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
