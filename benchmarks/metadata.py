"""Metadata benchmark (issue: metadata that scales): commits, seals and opens at catalog sizes.

For each catalog size (sealed segments held: 0, 10 k, 100 k, 1 M by default) the catalog is
built synthetically through the metadata API (`segment_published` records of cold segments
appended to the metadata log of an embedded engine, then a checkpoint), and then:

* open / recovery time of the data directory, and the RSS the catalog costs per segment
  (a fresh child process: RSS after `Engine.open()` minus RSS of the same open on an empty
  catalog, divided by the segment count);
* the metadata part of a seal: one `segment_published` record appended and made durable,
  p50/p99 of 2,000 in a row;
* OffsetCommit from 8 concurrent confluent-kafka consumers (processes, synchronous commits of
  explicit offsets, one group each) against `loglake serve` on that data directory:
  commits/s and latency percentiles;
* (largest size only, and at 0) produce throughput of one acks=all producer alone and during
  the commit storm.

The machine's limits (sequential write bandwidth, fdatasync latency) are measured in the same
run. JSON on stdout, a table on stderr.

    .venv/bin/python benchmarks/metadata.py                       # full run (~10 min)
    .venv/bin/python benchmarks/metadata.py --sizes 0,10000 --seconds 3 --quick   # smoke
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from benchkit import load_benchmark  # noqa: E402
from loglake.broker.groups.meta_store import MetaGroupLog  # noqa: E402
from loglake.engine import Engine, EngineConfig  # noqa: E402
from loglake.engine.partition import SegmentRef  # noqa: E402

from brokerkit import Broker  # noqa: E402

engine_bench = load_benchmark("engine")
pct = engine_bench.pct

# Targets (issue "Metadata that scales"; docs/PERFORMANCE.md, "Metadata").
TARGET_COMMITS_PER_S = 5_000
TARGET_COMMIT_P99_MS = 5.0
TARGET_LARGEST_VS_EMPTY = 0.80  # the 1 M row within 20 % of the 0 row
TARGET_PRODUCE_DURING_STORM = 0.90
TARGET_OPEN_S = 2.0
TARGET_RSS_PER_SEGMENT = 300

HISTORY_TOPIC = "history"
HISTORY_PARTITIONS = 8
COMMIT_TOPIC = "commits"
CONSUMERS = 8


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ==== building the catalog =======================================================================


def build_catalog(data_dir: Path, cold_url: str, segments: int) -> dict[str, Any]:
    """Append `segments` segment_published records (cold segments) through the engine's catalog."""
    config = EngineConfig(cold_store_url=cold_url, wal_shards=1)
    engine = Engine(str(data_dir), config, start_background=False)
    engine.open()
    started = time.perf_counter()
    engine.create_topic(HISTORY_TOPIC, HISTORY_PARTITIONS, {"retention.ms": "-1", "hot.retain.segments": "0"})
    parts = [engine.catalog.partition(HISTORY_TOPIC, p) for p in range(HISTORY_PARTITIONS)]
    last = None
    for i in range(segments):
        p = parts[i % HISTORY_PARTITIONS]
        base = (i // HISTORY_PARTITIONS) * 1000
        nxt = i.to_bytes(32, "little")
        ref = SegmentRef(base, base + 999, "", 64 << 20, 1_700_000_000_000 + i, 1000, p.chain_hash, nxt, 1_700_000_000_000, "cold")
        with p.lock:
            last = engine.catalog.record_seal(p, ref, [])
    if last is not None:
        last.result()
    build_s = time.perf_counter() - started
    engine.checkpoint_metadata()
    # The seal's metadata part at this size: append one record and wait for it to be durable.
    p = parts[0]
    seal_ms: list[float] = []
    apply_us: list[float] = []
    for _ in range(2000):
        base = p.sealed_end
        ref = SegmentRef(base, base + 999, "", 64 << 20, 1, 1000, p.chain_hash, os.urandom(32), 1, "cold")
        t0 = time.perf_counter()
        with p.lock:
            fut = engine.catalog.record_seal(p, ref, [])
        t1 = time.perf_counter()
        fut.result()
        seal_ms.append((time.perf_counter() - t0) * 1000)
        apply_us.append((t1 - t0) * 1e6)
    inproc = inproc_commits(engine, seconds=3.0)
    engine.checkpoint_metadata()
    engine.close()
    return {
        "inproc_commits": inproc,
        "build_s": round(build_s, 2),
        "records_per_s": round(segments / build_s) if segments else None,
        "seal_meta_p50_ms": round(pct(seal_ms, 50), 3),
        "seal_meta_p99_ms": round(pct(seal_ms, 99), 3),
        "seal_apply_p50_us": round(pct(apply_us, 50), 1),
    }


def inproc_commits(engine: Engine, seconds: float) -> dict[str, Any]:
    """The metadata layer alone: CONSUMERS threads each recording offset commits and waiting for
    durability, no network and no client (what the broker's OffsetCommit costs below the wire)."""
    import threading

    engine.create_topic(COMMIT_TOPIC, CONSUMERS)
    lats: list[list[float]] = [[] for _ in range(CONSUMERS)]
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            MetaGroupLog(engine.meta).commit_group_offsets(f"inproc-{i}", [(COMMIT_TOPIC, i, n, -1, "", 1)]).result()
            lats[i].append((time.perf_counter() - t0) * 1000)
            n += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CONSUMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [v for per in lats for v in per]
    return {"commits_per_s": round(len(flat) / seconds), "p50_ms": round(pct(flat, 50), 3), "p99_ms": round(pct(flat, 99), 3)}


def child_open(data_dir: str, cold_url: str) -> None:
    """In a fresh process: time Engine.open() and report the RSS it added."""
    import gc

    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    engine = Engine(data_dir, EngineConfig(cold_store_url=cold_url, wal_shards=1), start_background=False)
    report = engine.open()
    open_s = time.perf_counter() - t0
    gc.collect()
    after = rss_bytes()
    segments = sum(len(pm.segments) for pm in engine.meta.state.partitions.values())
    print(json.dumps({"open_s": open_s, "rss_delta": after - before, "segments": segments, "replayed": report.meta_records_replayed}))
    engine.close()


def measure_open(data_dir: Path, cold_url: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child-open", str(data_dir), "--cold", cold_url],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# ==== the commit storm ===========================================================================


def committer(bootstrap: str, index: int, seconds: float, out: Any, fetch_only: bool = False) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{index}", "enable.auto.commit": False, "log_level": 3}
    )
    tp = [TopicPartition(COMMIT_TOPIC, index % CONSUMERS, 0)]
    consumer.commit(offsets=tp, asynchronous=False)  # coordinator lookup, connection warm-up
    lat: list[float] = []
    n = 1
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        tp[0].offset = n
        t0 = time.perf_counter()
        if fetch_only:  # the control: an OffsetFetch round trip, no metadata write
            consumer.committed(tp, timeout=10)
        else:
            consumer.commit(offsets=tp, asynchronous=False)
        lat.append((time.perf_counter() - t0) * 1000)
        n += 1
    consumer.close()
    out.put(lat)


def commit_storm(bootstrap: str, seconds: float, *, fetch_only: bool = False) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=committer, args=(bootstrap, i, seconds, queue, fetch_only)) for i in range(CONSUMERS)]
    for proc in procs:
        proc.start()
    lats: list[float] = []
    for _ in procs:
        lats.extend(queue.get(timeout=seconds + 120))
    for proc in procs:
        proc.join()
    return {
        "commits": len(lats),
        "commits_per_s": round(len(lats) / seconds),
        "p50_ms": round(pct(lats, 50), 2),
        "p99_ms": round(pct(lats, 99), 2),
        "max_ms": round(max(lats), 1) if lats else None,
    }


def producer(bootstrap: str, seconds: float, out: Any) -> None:
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 3})
    acked = [0]

    def done(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    payload = b"x" * 100
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            prod.produce("produce", payload, on_delivery=done)
        except BufferError:
            prod.poll(0.01)
        prod.poll(0)
    prod.flush(30)
    out.put(acked[0] / seconds)


def produce_rate(bootstrap: str, seconds: float, with_storm: bool, *, fetch_only: bool = False) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=producer, args=(bootstrap, seconds, queue))
    proc.start()
    storm = commit_storm(bootstrap, seconds, fetch_only=fetch_only) if with_storm else None
    rate = queue.get(timeout=seconds + 120)
    proc.join()
    return {"records_per_s": round(rate), "storm": storm}


def admin_topics(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(COMMIT_TOPIC, CONSUMERS, 1), NewTopic("produce", 1, 1)])
    for fut in futures.values():
        try:
            fut.result(30)
        except Exception as exc:  # already there from an earlier size
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


# ==== driver =====================================================================================


def run_size(base: Path, segments: int, seconds: float, produce: bool) -> dict[str, Any]:
    data_dir = base / f"data-{segments}"
    cold = base / f"cold-{segments}"
    cold.mkdir(parents=True, exist_ok=True)
    cold_url = f"file://{cold}"
    log(f"[{segments} segments] building the catalog ...")
    built = build_catalog(data_dir, cold_url, segments)
    log(f"[{segments} segments] open in a fresh process ...")
    opened = measure_open(data_dir, cold_url)
    log(f"[{segments} segments] commit storm, {CONSUMERS} consumers x {seconds:.0f}s ...")
    broker = Broker(data_dir, ["--cold-store", cold_url]).start()
    try:
        admin_topics(broker.bootstrap)
        storm = commit_storm(broker.bootstrap, seconds)
        log(f"[{segments} segments] control: the same clients doing OffsetFetch (no metadata write) ...")
        control = commit_storm(broker.bootstrap, seconds, fetch_only=True)
        produce_alone = produce_during = produce_control = None
        if produce:
            log(f"[{segments} segments] produce alone, during the commit storm, during the control ...")
            produce_alone = produce_rate(broker.bootstrap, seconds, with_storm=False)
            produce_during = produce_rate(broker.bootstrap, seconds, with_storm=True)
            produce_control = produce_rate(broker.bootstrap, seconds, with_storm=True, fetch_only=True)
    finally:
        broker.stop()
    row = {
        "segments": segments,
        **built,
        "open_s": round(opened["open_s"], 3),
        "rss_delta_mb": round(opened["rss_delta"] / 2**20, 1),
        "commits": storm,
        "control_offset_fetch": control,
    }
    if produce_alone is not None and produce_during is not None and produce_control is not None:
        row["produce_alone_rps"] = produce_alone["records_per_s"]
        row["produce_during_storm_rps"] = produce_during["records_per_s"]
        row["storm_during_produce"] = produce_during["storm"]
        row["produce_during_control_rps"] = produce_control["records_per_s"]
    shutil.rmtree(data_dir, ignore_errors=True)
    shutil.rmtree(cold, ignore_errors=True)
    return row


def table(result: dict[str, Any]) -> str:
    rows = result["sizes"]
    lines = [
        "| segments | commits/s | p50 ms | p99 ms | control fetches/s (p50) | in-process commits/s (p99) "
        "| seal meta p50/p99 ms | open s | RSS/segment B | produce alone / commit storm / control rps |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        per_seg = r.get("rss_per_segment")
        prod = (
            f"{r['produce_alone_rps']:,} / {r['produce_during_storm_rps']:,} / {r['produce_during_control_rps']:,}"
            if "produce_alone_rps" in r
            else ""
        )
        ctl = r["control_offset_fetch"]
        lines.append(
            f"| {r['segments']:,} | {r['commits']['commits_per_s']:,} | {r['commits']['p50_ms']} | {r['commits']['p99_ms']} "
            f"| {ctl['commits_per_s']:,} ({ctl['p50_ms']}) | {r['inproc_commits']['commits_per_s']:,} ({r['inproc_commits']['p99_ms']}) "
            f"| {r['seal_meta_p50_ms']} / {r['seal_meta_p99_ms']} | {r['open_s']} | {per_seg if per_seg is not None else ''} | {prod} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0,10000,100000,1000000")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each commit storm")
    parser.add_argument("--dir", default=None, help="where data lives (default: a temp dir next to the repo)")
    parser.add_argument("--quick", action="store_true", help="shorter machine-limit measurement")
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--child-open", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cold", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_open:
        child_open(args.child_open, args.cold)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    base = Path(tempfile.mkdtemp(prefix="loglake-meta-bench-", dir=args.dir or str(ROOT.parent)))
    try:
        machine = engine_bench.machine_limits(str(base), args.quick)
        rows = []
        for i, size in enumerate(sizes):
            rows.append(run_size(base, size, args.seconds, produce=i in (0, len(sizes) - 1)))
        empty = rows[0]
        for r in rows:
            if r["segments"] and empty["segments"] == 0:
                r["rss_per_segment"] = round((r["rss_delta_mb"] - empty["rss_delta_mb"]) * 2**20 / r["segments"])
        largest = rows[-1]
        result: dict[str, Any] = {"machine": machine, "sizes": rows}
        result["targets"] = {
            "commits_per_s_min": min(r["commits"]["commits_per_s"] for r in rows),
            "commit_p99_ms_max": max(r["commits"]["p99_ms"] for r in rows),
            "largest_vs_empty_commits": round(largest["commits"]["commits_per_s"] / max(1, empty["commits"]["commits_per_s"]), 3),
            "produce_during_storm_vs_alone": round(
                largest.get("produce_during_storm_rps", 0) / max(1, largest.get("produce_alone_rps", 1)), 3
            ),
            "produce_during_control_vs_alone": round(
                largest.get("produce_during_control_rps", 0) / max(1, largest.get("produce_alone_rps", 1)), 3
            ),
            "open_s_largest": largest["open_s"],
            "rss_per_segment_largest": largest.get("rss_per_segment"),
            "want": {
                "commits_per_s": TARGET_COMMITS_PER_S,
                "commit_p99_ms": TARGET_COMMIT_P99_MS,
                "largest_vs_empty": TARGET_LARGEST_VS_EMPTY,
                "produce_during_storm": TARGET_PRODUCE_DURING_STORM,
                "open_s": TARGET_OPEN_S,
                "rss_per_segment": TARGET_RSS_PER_SEGMENT,
            },
        }
        text = json.dumps(result, indent=2)
        print(text)
        if args.json_out:
            Path(args.json_out).write_text(text)
        log(table(result))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
