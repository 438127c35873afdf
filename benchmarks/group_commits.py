#!/usr/bin/env python3
"""Offset commits per second through one cluster broker (issue 30: >= 2,000 commits/s from 8
consumers): a real `loglake serve --cluster` over one etcd member and a folder (tests/clusterkit.py),
and `--consumers` confluent-kafka consumers, each in a group of its own on a partition of its own,
committing synchronously (`commit(asynchronous=False)`, the next offset each time) as fast as
they can for `--seconds`. A commit is acknowledged once its group record is committed in etcd,
guarded by the coordinator's claim (loglake.cluster.groups); how many of those one etcd
transaction carries is what this measures.

    .venv/bin/python benchmarks/group_commits.py                  # ~1 min
    .venv/bin/python benchmarks/group_commits.py --consumers 16 --seconds 5

Prints a JSON document on stdout and a table on stderr, with the load average, the CPU seconds
of the broker and etcd (from /proc) and of the consumers (this process), etcd's own counts of the
write requests (raft proposals), ranges, puts and WAL syncs the run caused (its /metrics, per
commit) and the 4 KiB fdatasync latency of the disk etcd writes to (etcd syncs once per batch of
proposals), measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

import clusterkit  # noqa: E402
from benchkit import load_benchmark  # noqa: E402

client = load_benchmark("broker_client")
disk = load_benchmark("disk_limits")
log = client.log

TARGET_COMMITS_PER_S = 2_000
TOPIC = "commits"
#: etcd's counters (its /metrics) reported per commit: what each commit costs etcd. Every write
#: request is one raft proposal (etcd's own txn counter counts a transaction's compares and its
#: writes as two); ranges are the compares and the reads.
ETCD_COUNTERS = {
    "proposals": "etcd_server_proposals_applied_total",
    "ranges": "etcd_debugging_mvcc_range_total",
    "puts": "etcd_debugging_mvcc_put_total",
    "wal_fsyncs": "etcd_disk_wal_fsync_duration_seconds_count",
}


def etcd_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    values = dict(line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))
    return {name: float(values.get(metric, "nan")) for name, metric in ETCD_COUNTERS.items()}


def committer(bootstrap: str, index: int, seconds: float, start: threading.Barrier, out: list[dict[str, Any]]) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{index}", "enable.auto.commit": False})
    tp = TopicPartition(TOPIC, index, 1)
    c.commit(offsets=[tp], asynchronous=False)  # warm up: coordinator found, group claimed
    lat: list[float] = []
    start.wait()
    end = time.perf_counter() + seconds
    n = 1
    while time.perf_counter() < end:
        n += 1
        t0 = time.perf_counter()
        c.commit(offsets=[TopicPartition(TOPIC, index, n)], asynchronous=False)
        lat.append(time.perf_counter() - t0)
    got = c.committed([TopicPartition(TOPIC, index)], timeout=30)[0].offset
    c.close()
    out.append({"commits": len(lat), "latencies": lat, "last": n, "read_back": got})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--consumers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--json-out", help="also write the JSON here")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix=f"loglake-commits-{uuid.uuid4().hex[:6]}-"))
    doc: dict[str, Any] = {"load_average_before": [round(x, 2) for x in os.getloadavg()]}
    doc["fdatasync_4KiB"] = disk.fdatasync_latency(str(work), 100)
    log(f"one cluster broker, {args.consumers} consumers committing for {args.seconds} s ...")
    with clusterkit.running_cluster(work, brokers=1, cold_store="file") as c:
        c.create_topic(TOPIC, args.consumers)
        pids = {"broker": c.brokers[0].pid}
        etcd = c.etcd.members[0].proc
        if etcd is not None:
            pids["etcd"] = etcd.pid
        start = threading.Barrier(args.consumers + 1)
        out: list[dict[str, Any]] = []
        threads = [
            threading.Thread(target=committer, args=(c.bootstrap, i, args.seconds, start, out)) for i in range(args.consumers)
        ]
        for t in threads:
            t.start()
        start.wait(120)
        cpu0 = {k: client.proc_cpu_seconds(p) for k, p in pids.items() if p is not None}
        cpu0["consumers"] = client.self_cpu_seconds()  # this process: the consumers' threads
        etcd_url = c.etcd.members[0].client_url
        counts0 = etcd_counters(etcd_url)
        t0 = time.perf_counter()
        for t in threads:
            t.join(args.seconds + 120)
        wall = time.perf_counter() - t0
        cpu = {k: round(client.proc_cpu_seconds(pids[k]) - v, 2) for k, v in cpu0.items() if k in pids}
        cpu["consumers"] = round(client.self_cpu_seconds() - cpu0["consumers"], 2)
        counts = {k: v - counts0[k] for k, v in etcd_counters(etcd_url).items()}
    shutil.rmtree(work, ignore_errors=True)
    assert len(out) == args.consumers, "a consumer failed"
    assert all(r["read_back"] == r["last"] for r in out), [(r["read_back"], r["last"]) for r in out]
    lat = sorted(x for r in out for x in r["latencies"])
    commits = sum(r["commits"] for r in out)
    doc.update(
        {
            "consumers": args.consumers,
            "seconds": round(wall, 2),
            "commits": commits,
            "commits_per_s": round(commits / wall),
            "commit_p50_ms": round(client.pct(lat, 50) * 1e3, 2),
            "commit_p99_ms": round(client.pct(lat, 99) * 1e3, 2),
            "cpu_s": cpu,
            "cpu_ms_per_commit": {k: round(v * 1e3 / max(commits, 1), 3) for k, v in cpu.items()},
            "etcd_per_commit": {k: round(v / max(commits, 1), 3) for k, v in counts.items()},
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "target_commits_per_s": TARGET_COMMITS_PER_S,
        }
    )
    print(json.dumps(doc, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n")
    log(
        f"\n| consumers | commits/s | commit p50 / p99 ms | CPU s (broker, etcd, consumers) | CPU ms per commit | etcd per commit "
        f"| fdatasync 4 KiB p50 | load before / after |\n"
        f"|---:|---:|---:|---|---|---|---:|---|\n"
        f"| {args.consumers} | {doc['commits_per_s']:,} | {doc['commit_p50_ms']} / {doc['commit_p99_ms']} | {cpu} "
        f"| {doc['cpu_ms_per_commit']} | {doc['etcd_per_commit']} "
        f"| {doc['fdatasync_4KiB']['p50_ms']:.2f} ms | {doc['load_average_before']} / {doc['load_average_after']} |\n"
        f"target >= {TARGET_COMMITS_PER_S:,} commits/s: {'MET' if doc['commits_per_s'] >= TARGET_COMMITS_PER_S else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
