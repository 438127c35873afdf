#!/usr/bin/env python3
"""Cluster mode's metadata pieces over real etcd (docs/CLUSTER.md): how fast the metadata log in
etcd appends, and how long a dead broker takes to disappear from the live set at a given lease TTL.

One etcd member (tests/etcdkit.py) in a temporary folder, started and stopped by the run:

- appends pipelined from one store (batched transactions) and from two stores contending for the
  head; one append waited on at a time (p50/p99 latency: etcd's fsync per commit);
- broker expiry: a broker's keep-alives stop (as a kill -9 stops them) and a second broker's
  membership reports it gone; the delay per TTL.

    .venv/bin/python benchmarks/meta_etcd.py                     # ~1 min
    .venv/bin/python benchmarks/meta_etcd.py --ttls 2,3,5 --expiry-runs 5 --records 5000

Prints a JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from etcdkit import EtcdCluster  # noqa: E402 - the tests' etcd launcher
from loglake.cluster.etcd import EtcdMetaStore  # noqa: E402
from loglake.cluster.etcd_client import EtcdClient  # noqa: E402
from loglake.cluster.membership import Membership  # noqa: E402
from loglake.engine.view import BrokerInfo  # noqa: E402
from loglake.meta.records import Cluster, OffsetCommit  # noqa: E402


def commit(group: str, i: int) -> OffsetCommit:
    return OffsetCommit(group, [("t", 0, i, -1, "", i)])


def appends(endpoints: str, records: int) -> dict[str, Any]:
    one = EtcdMetaStore(EtcdClient(endpoints), "/bench")
    one.open()
    one.append(Cluster("bench")).result()
    started = time.monotonic()
    for f in [one.append(commit("a", i)) for i in range(records)]:
        f.result()
    pipelined = records / (time.monotonic() - started)
    latencies = []
    for i in range(200):
        t = time.monotonic()
        one.append(commit("a", i)).result()
        latencies.append(time.monotonic() - t)
    latencies.sort()
    two = EtcdMetaStore(EtcdClient(endpoints), "/bench")
    two.open()
    futures: list[Future[int]] = []
    lock = threading.Lock()

    def writer(store: EtcdMetaStore, group: str) -> None:
        mine = [store.append(commit(group, i)) for i in range(records)]
        with lock:
            futures.extend(mine)

    started = time.monotonic()
    threads = [threading.Thread(target=writer, args=(s, g)) for s, g in ((one, "a"), (two, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = [f.result() for f in futures]
    contended = 2 * records / (time.monotonic() - started)
    assert len(set(seqs)) == len(seqs)
    one.close()
    two.close()
    return {
        "pipelined_one_store_records_per_s": round(pipelined),
        "pipelined_two_stores_records_per_s": round(contended),
        "one_at_a_time_p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "one_at_a_time_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1),
    }


def expiry(endpoints: str, ttl: int, runs: int) -> list[float]:
    delays = []
    for run in range(runs):
        watcher = Membership(
            EtcdClient(endpoints), "/bench", BrokerInfo(1000, ("PLAINTEXT://127.0.0.1:1",)), ttl_s=ttl
        )
        doomed = Membership(
            EtcdClient(endpoints), "/bench", BrokerInfo(run, ("PLAINTEXT://127.0.0.1:2",)), ttl_s=ttl
        )
        watcher.start()
        doomed.start()
        watcher.refresh()
        gone = threading.Event()
        watcher.subscribe(lambda live, run=run, gone=gone: gone.set() if run not in live else None)
        started = time.monotonic()
        doomed.stop(revoke=False)  # keep-alives stop, the lease is left to lapse
        gone.wait(ttl * 10)
        delays.append(round(time.monotonic() - started, 2))
        watcher.stop()
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--ttls", default="2,3,4")
    parser.add_argument("--expiry-runs", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loglake-bench-etcd-") as tmp:
        cluster = EtcdCluster(Path(tmp), 1).start()
        try:
            endpoints = ",".join(cluster.endpoints)
            result: dict[str, Any] = {"appends": appends(endpoints, args.records), "expiry_s": {}}
            for ttl in (int(x) for x in args.ttls.split(",")):
                delays = expiry(endpoints, ttl, args.expiry_runs)
                result["expiry_s"][str(ttl)] = {"runs": delays, "median": statistics.median(delays)}
        finally:
            cluster.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
