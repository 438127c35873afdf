#!/usr/bin/env python3
"""Compaction benchmark (issue: key compaction and segment merging): cleaner throughput, memory,
and what a running cleaner costs producers.

    .venv/bin/python benchmarks/compaction.py                 # full run: 10 M records, 1 M keys
    .venv/bin/python benchmarks/compaction.py --quick         # smoke run (< 30 s)
    .venv/bin/python benchmarks/compaction.py --records 2000000 --keys 200000 --json-out r.json

What is measured (docs/PERFORMANCE.md, "Compaction", says how to read it):

1. Machine limits, same run: sequential write bandwidth and fdatasync latency (as
   benchmarks/engine.py measures them), the rate at which the data set's sealed segments read
   back (page cache), and a CPU ceiling: aiokafka's compiled decoder alone over one segment.
2. Data set: `--records` records (16-byte key, 100-byte value) over `--keys` keys in a compacted
   topic of one partition, in Kafka batches of 1,000 (built with aiokafka's compiled builder),
   flushed so that every segment is sealed. Keys are drawn uniformly at random, from a key range
   that moves on every tenth of the log: each tenth of the log writes its own tenth of the keys
   (about ten versions of each). A whole-log pass is indifferent to this; the multi-pass run
   needs it, since a map holding a tenth of the keys can only ever cover as many records as
   hold that many distinct keys (with keys drawn from the whole range, ~1 % of the log a pass).
3. Compaction runs, each in a child process on its own copy of the data set (segment files
   hard-linked: rewrites write new files and unlink the old): one `engine.compact(force=True)`
   after another until nothing is dirty. Map building and rewriting are timed apart (wrappers
   around the cleaner's `build_key_map` and `Rewriter.rewrite`). Input MB/s = the sealed bytes
   of the log before the run / the pass time (every byte counted once, although a pass reads
   it twice: once for the map, once for the rewrite); map and rewrite rates are bytes each
   phase read / its time. Peak RSS: the kernel's high-water mark (VmHWM) reset right before
   the first pass (/proc/self/clear_refs), minus VmRSS at that moment.
     * single pass, rate limit off, key map at max(128 MiB default, what the keys need);
     * multi-pass, rate limit off, key map bounded to a tenth of the keys;
     * single pass at the default rate limit (cleaner_io_max_bytes_per_second = 50 MiB/s).
4. Produce during a cleaner pass: one thread appends pre-built batches (100 x 100 B records)
   to a `durability=fsync` topic and waits for each future (acks=all), for `--seconds` alone,
   then as long again while a background thread runs a compaction pass (default rate limit) on
   a copy of the data set in the same engine, then (once the pass has ended) alone again. Throughput and p50/p99/max ack
   latency; "alone" = the mean of the two alone windows.

JSON goes to stdout, the table and progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "compaction_child.py"  # one compaction run, in its own process
sys.path.insert(0, str(ROOT / "src"))

from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder  # noqa: E402

from benchkit import load_benchmark  # noqa: E402
from loglake.engine import Engine, open_engine  # noqa: E402
from loglake.engine.compaction import KEY_ENTRY_BYTES  # noqa: E402
from loglake.records.batch import build_batch  # noqa: E402
from loglake.segment.format import HEADER_SIZE, parse_tail  # noqa: E402

engine_bench = load_benchmark("engine")
pct = engine_bench.pct
log = engine_bench.log

MiB = 1024 * 1024
TOPIC = "compacted"
PRODUCE_TOPIC = "produce"
KEY_BYTES = 16
VALUE_BYTES = 100
BATCH_RECORDS = 1000
WINDOWS = 10  # the key range moves on every tenth of the log
DEFAULT_DEDUPE = 128 * MiB  # EngineConfig.cleaner_dedupe_buffer_bytes
DEFAULT_RATE = 50 * MiB  # EngineConfig.cleaner_io_max_bytes_per_second

# Targets (issue "Key compaction and segment merging"; docs/PERFORMANCE.md, "Compaction").
TARGET_INPUT_MB_S = 50.0
TARGET_RSS_SLACK_MB = 100.0
TARGET_PRODUCE_SLOWDOWN = 0.10


def key_of(k: int) -> bytes:
    return b"key-%012d" % k


def mb(n: float) -> float:
    return round(n / 1e6, 1)


# ==== data set =====================================================================================


def ingest(data_dir: str, records: int, keys: int, seed: int = 7) -> dict[str, Any]:
    """The compacted topic: `records` records over `keys` keys (see the module docstring)."""
    engine = open_engine(data_dir, cleaner_threads=0, merge_min_segments=0)
    try:
        engine.create_topic(TOPIC, 1, {"cleanup.policy": "compact", "durability": "disk"})
        rng = random.Random(seed)
        rand = rng.random
        blob = rng.randbytes(VALUE_BYTES * 2)
        values = [blob[i : i + VALUE_BYTES] for i in range(VALUE_BYTES)]
        seen = bytearray(keys)
        window_records = max(1, records // WINDOWS)
        window_keys = max(1, keys // WINDOWS)
        ts = int(time.time() * 1000)
        inflight: list[Any] = []
        started = time.perf_counter()
        build_s = 0.0
        payload = 0
        i = 0
        while i < records:
            t0 = time.perf_counter()
            builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
            append = builder.append
            n = min(BATCH_RECORDS, records - i)
            for j in range(n):
                w = min((i + j) // window_records, WINDOWS - 1)
                k = w * window_keys + int(rand() * window_keys)
                if k >= keys:
                    k = keys - 1
                seen[k] = 1
                append(j, ts, key_of(k), values[(i + j) % VALUE_BYTES], [])
            batch = builder.build()
            build_s += time.perf_counter() - t0
            payload += len(batch)
            inflight.append(engine.append_batch(TOPIC, 0, batch))
            if len(inflight) >= 32:
                for f in inflight:
                    f.result()
                inflight = []
            i += n
        for f in inflight:
            f.result()
        engine.flush()
        seconds = time.perf_counter() - started
        segments = segment_refs(engine)
    finally:
        engine.close()
    return {
        "records": records,
        "keys": keys,
        "distinct_keys_written": sum(seen),
        "key_bytes": KEY_BYTES,
        "value_bytes": VALUE_BYTES,
        "batch_records": BATCH_RECORDS,
        "batch_bytes_total": payload,
        "seconds": round(seconds, 2),
        "build_seconds": round(build_s, 2),
        "records_per_s": round(records / seconds),
        "segments": len(segments),
        "sealed_bytes": sum(s.size for s in segments),
    }


def segment_refs(engine: Engine, topic: str = TOPIC) -> list[Any]:
    p = engine.catalog.partition(topic, 0)
    with p.lock:
        return list(p.segments.slice(0))


def count_records(engine: Engine, topic: str = TOPIC) -> int:
    """Records in the sealed segments (batch headers only)."""
    total = 0
    for seg in segment_refs(engine, topic):
        data = memoryview(engine.cleaner.stores.store_for(seg).get(seg.key))
        parsed = parse_tail(data, len(data), seg.key)
        assert not isinstance(parsed, int)
        trailer, _index = parsed
        pos = HEADER_SIZE
        while pos < trailer.index_position:
            size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
            total += int.from_bytes(data[pos + 57 : pos + 61], "big")
            pos += size
    return total


def link_copy(src: str, dst: str) -> None:
    """A copy of a closed data directory: segment files hard-linked (never written in place),
    everything else copied."""

    def copy(s: str, d: str) -> Any:
        if s.endswith(".seg"):
            os.link(s, d)
            return d
        return shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=copy)


# ==== machine limits ===============================================================================


def read_rate(data_dir: str) -> dict[str, Any]:
    """Sequential read of the data set's segment files in 1 MiB reads (page cache as it is)."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(data_dir) for f in fs if f.endswith(".seg")]
    total = 0
    started = time.perf_counter()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            while True:
                chunk = os.read(fd, MiB)
                if not chunk:
                    break
                total += len(chunk)
        finally:
            os.close(fd)
    seconds = time.perf_counter() - started
    return {"bytes": total, "files": len(files), "seconds": round(seconds, 3), "mb_per_s": round(total / seconds / 1e6)}


def decode_ceiling(data_dir: str) -> dict[str, Any]:
    """aiokafka's compiled decoder alone over the largest segment: every record's key and
    offset touched, nothing else. A pass decodes every record twice (map, then rewrite)."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(data_dir) for f in fs if f.endswith(".seg")]
    path = max(files, key=os.path.getsize)
    data = Path(path).read_bytes()
    parsed = parse_tail(memoryview(data), len(data), path)
    assert not isinstance(parsed, int)
    trailer, _index = parsed
    started = time.perf_counter()
    records = 0
    pos = HEADER_SIZE
    while pos < trailer.index_position:
        size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        for r in DefaultRecordBatch(data[pos : pos + size]):
            _ = r.key, r.offset
            records += 1
        pos += size
    seconds = time.perf_counter() - started
    return {
        "bytes": trailer.index_position,
        "records": records,
        "seconds": round(seconds, 3),
        "mb_per_s": round(trailer.index_position / seconds / 1e6),
        "records_per_s": round(records / seconds),
    }


# ==== compaction runs (each in a child process: compaction_child.py) ======================================


def run_compaction(base: str, pristine: str, name: str, dedupe: int, rate: int, max_passes: int) -> dict[str, Any]:
    data_dir = os.path.join(base, f"run-{name}")
    link_copy(pristine, data_dir)
    log(f"compaction: {name} (key map {dedupe / MiB:.1f} MiB, rate {'off' if rate <= 0 else f'{rate / MiB:.0f} MiB/s'}) ...")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, str(CHILD), data_dir, "--dedupe", str(dedupe), "--rate", str(rate), "--max-passes", str(max_passes)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    shutil.rmtree(data_dir, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compaction child {name} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    result["name"] = name
    bound_mb = dedupe / 1e6 + TARGET_RSS_SLACK_MB
    result["rss_bound_mb"] = round(bound_mb, 1)
    result["rss_ok"] = result["peak_delta_mb"] <= bound_mb
    log(
        f"  {result['passes']} passes, {result['seconds']:.1f} s, input {result['input_mb_per_s']} MB/s "
        f"(map {result['map_mb_per_s']}, rewrite {result['rewrite_mb_per_s']}), peak RSS +{result['peak_delta_mb']} MB, "
        f"kept {result['records_kept']:,}"
    )
    return result


# ==== produce during a cleaner pass =================================================================


def produce_window(engine: Engine, batches: list[bytes], seconds: float) -> dict[str, Any]:
    lat: list[float] = []
    n = 0
    nbytes = 0
    perf = time.perf_counter
    started = perf()
    deadline = started + seconds
    while True:
        t0 = perf()
        if t0 >= deadline:
            break
        b = batches[n % len(batches)]
        engine.append_batch(PRODUCE_TOPIC, 0, b).result()
        lat.append(perf() - t0)
        n += 1
        nbytes += len(b)
    elapsed = perf() - started
    records = n * 100
    return {
        "seconds": round(elapsed, 2),
        "appends": n,
        "records_per_s": round(records / elapsed),
        "mb_per_s": round(nbytes / elapsed / 1e6, 2),
        "p50_ms": round(pct(lat, 50) * 1e3, 3),
        "p99_ms": round(pct(lat, 99) * 1e3, 3),
        "max_ms": round(max(lat) * 1e3, 3),
    }


def produce_during_clean(base: str, pristine: str, seconds: float) -> dict[str, Any]:
    data_dir = os.path.join(base, "run-produce")
    link_copy(pristine, data_dir)
    # defaults: rate limit, key map, and the pass in a worker process (cleaner_process=True)
    engine = open_engine(data_dir, cleaner_threads=0, merge_min_segments=0)
    try:
        engine.create_topic(PRODUCE_TOPIC, 1, {"durability": "fsync"})
        rng = random.Random(3)
        now = int(time.time() * 1000)
        batches = [build_batch([(now, None, rng.randbytes(100), []) for _ in range(100)]) for _ in range(8)]
        log(f"produce: alone {seconds:.0f} s ...")
        alone1 = produce_window(engine, batches, seconds)
        done = threading.Event()
        clean: dict[str, Any] = {}

        def clean_pass() -> None:
            t0 = time.perf_counter()
            try:
                clean["rewrites"] = engine.compact(TOPIC, force=True)
            except BaseException as exc:  # reported, not hidden
                clean["error"] = repr(exc)
            clean["seconds"] = round(time.perf_counter() - t0, 2)
            done.set()

        log(f"produce: during a cleaner pass {seconds:.0f} s ...")
        cleaner_thread = threading.Thread(target=clean_pass, name="bench-cleaner", daemon=True)
        cleaner_thread.start()
        time.sleep(0.2)
        during = produce_window(engine, batches, seconds)
        during["cleaner_still_running_at_end"] = not done.is_set()
        log("produce: waiting for the cleaner pass to end ...")
        cleaner_thread.join()
        log(f"produce: alone again {seconds:.0f} s ...")
        alone2 = produce_window(engine, batches, seconds)
        stats = engine.cleaner.stats
        clean.update(bytes_read=stats.bytes_read, bytes_written=stats.bytes_written, records_out=stats.records_out)
    finally:
        engine.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    alone_rps = statistics.fmean([alone1["records_per_s"], alone2["records_per_s"]])
    alone_p99 = statistics.fmean([alone1["p99_ms"], alone2["p99_ms"]])
    return {
        "batch": "100 records x 100 B, pre-built, append_batch + result() (durability fsync), one thread",
        "alone_before": alone1,
        "during_clean": during,
        "alone_after": alone2,
        "clean_pass": clean,
        "throughput_vs_alone": round(during["records_per_s"] / alone_rps, 3),
        "p99_vs_alone": round(during["p99_ms"] / alone_p99, 3),
    }


# ==== report =======================================================================================


def table(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = ["", "machine limits (same run)"]
    lines.append(f"  cores {m['cores']}, load before {result['load_before']}, after {result['load_after']}")
    lines.append(f"  raw write one fdatasync {m['raw_write_one_fdatasync']['mb_per_s']:.0f} MB/s, "
                 f"fdatasync every 4 MiB {m['raw_write_fdatasync_every_4MiB']['mb_per_s']:.0f} MB/s, "
                 f"4 KiB fdatasync p50 {m['fdatasync_4KiB']['p50_ms']:.2f} ms p99 {m['fdatasync_4KiB']['p99_ms']:.2f} ms")
    lines.append(f"  segment read-back {m['segment_read']['mb_per_s']} MB/s, aiokafka decode alone {m['decode_ceiling']['mb_per_s']} MB/s "
                 f"({m['decode_ceiling']['records_per_s']:,} records/s)")
    d = result["data"]
    lines.append(f"data: {d['records']:,} records over {d['keys']:,} keys ({d['distinct_keys_written']:,} written), "
                 f"{d['sealed_bytes'] / 1e6:.0f} MB sealed in {d['segments']} segments, ingest {d['seconds']} s")
    lines.append("")
    hdr = f"{'run':<22}{'passes':>7}{'sec':>8}{'input MB/s':>11}{'map MB/s':>10}{'rewr MB/s':>10}{'cpu':>6}{'peak RSS MB':>12}{'bound':>8}{'out MB':>8}{'kept':>11}"
    lines.append(hdr)
    for r in result["compaction"]:
        lines.append(
            f"{r['name']:<22}{r['passes']:>7}{r['seconds']:>8.1f}{r['input_mb_per_s']:>11.1f}{r['map_mb_per_s']:>10.1f}"
            f"{r['rewrite_mb_per_s']:>10.1f}{r['cpu_busy']:>6.2f}{r['peak_delta_mb']:>12.1f}{r['rss_bound_mb']:>8.0f}"
            f"{r['sealed_bytes_after'] / 1e6:>8.1f}{r['records_kept']:>11,}"
        )
    p = result.get("produce")
    if p:
        lines.append("")
        lines.append(f"{'produce':<22}{'records/s':>11}{'MB/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
        for name in ("alone_before", "during_clean", "alone_after"):
            w = p[name]
            lines.append(f"{name:<22}{w['records_per_s']:>11,}{w['mb_per_s']:>8.2f}{w['p50_ms']:>9.2f}{w['p99_ms']:>9.2f}{w['max_ms']:>9.2f}")
    lines.append("")
    for t in result["targets"]:
        lines.append(f"  [{'MET' if t['met'] else 'MISSED'}] {t['target']}: {t['measured']}")
    return "\n".join(lines)


def targets(runs: list[dict[str, Any]], produce: dict[str, Any] | None) -> list[dict[str, Any]]:
    out = []
    unlimited = [r for r in runs if r["rate_limit_bytes_per_s"] <= 0]
    for r in unlimited:
        out.append({
            "target": f"input >= {TARGET_INPUT_MB_S:.0f} MB/s, rate limit off ({r['name']})",
            "measured": f"{r['input_mb_per_s']} MB/s (cpu {r['cpu_busy']})",
            "met": r["input_mb_per_s"] >= TARGET_INPUT_MB_S,
        })
    for r in runs:
        out.append({
            "target": f"peak RSS <= key map bound + {TARGET_RSS_SLACK_MB:.0f} MB ({r['name']})",
            "measured": f"+{r['peak_delta_mb']} MB vs {r['rss_bound_mb']} MB",
            "met": r["rss_ok"],
        })
    if produce:
        out.append({
            "target": "produce throughput during a cleaner pass >= 90 % of alone",
            "measured": f"{produce['throughput_vs_alone']:.3f}",
            "met": produce["throughput_vs_alone"] >= 1 - TARGET_PRODUCE_SLOWDOWN,
        })
        out.append({
            "target": "produce p99 during a cleaner pass <= 110 % of alone",
            "measured": f"{produce['p99_vs_alone']:.3f} ({produce['during_clean']['p99_ms']} ms)",
            "met": produce["p99_vs_alone"] <= 1 + TARGET_PRODUCE_SLOWDOWN,
        })
    return out


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=None, help="records in the compacted topic (default 10,000,000)")
    parser.add_argument("--keys", type=int, default=None, help="distinct keys (default 1,000,000)")
    parser.add_argument("--seconds", type=float, default=None, help="each produce window (default 15)")
    parser.add_argument("--quick", action="store_true", help="small sizes, smoke run (< 30 s)")
    parser.add_argument("--skip-produce", action="store_true")
    parser.add_argument("--skip-rate-limited", action="store_true", help="no run at the default rate limit")
    parser.add_argument("--skip-compaction", action="store_true", help="only the produce measurement")
    parser.add_argument(
        "--switch-interval", type=float, default=None, help="sys.setswitchinterval for the produce measurement (experiment)"
    )
    parser.add_argument("--dir", default=None, help="where data lives (default: a temp dir next to the repo)")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    records = args.records or (300_000 if args.quick else 10_000_000)
    keys = args.keys or (max(1, records // 10))
    seconds = args.seconds or (2.0 if args.quick else 15.0)
    base = tempfile.mkdtemp(prefix="loglake-compaction-bench-", dir=args.dir or str(ROOT.parent))
    try:
        load_before = load()
        machine = engine_bench.machine_limits(base, args.quick)
        pristine = os.path.join(base, "pristine")
        log(f"data: {records:,} records over {keys:,} keys ...")
        data = ingest(pristine, records, keys)
        log(f"  {data['seconds']} s ({data['records_per_s']:,} records/s), {data['sealed_bytes'] / 1e6:.0f} MB in {data['segments']} segments")
        machine["segment_read"] = read_rate(pristine)
        machine["decode_ceiling"] = decode_ceiling(pristine)
        need = int(keys * (KEY_ENTRY_BYTES + KEY_BYTES) * 1.05)
        full_map = max(DEFAULT_DEDUPE, need)
        tenth_map = max(MiB, keys // WINDOWS * (KEY_ENTRY_BYTES + KEY_BYTES))
        runs = []
        if not args.skip_compaction:
            runs.append(run_compaction(base, pristine, "single-pass", full_map, 0, 1000))
            runs.append(run_compaction(base, pristine, "multi-pass-tenth-keys", tenth_map, 0, 1000))
            if not args.skip_rate_limited:
                runs.append(run_compaction(base, pristine, "single-pass-50MiB/s", full_map, DEFAULT_RATE, 1000))
        if args.switch_interval is not None:
            sys.setswitchinterval(args.switch_interval)
        produce = None if args.skip_produce else produce_during_clean(base, pristine, seconds)
        if produce is not None:
            produce["switch_interval_s"] = sys.getswitchinterval()
        result: dict[str, Any] = {
            "load_before": load_before,
            "load_after": load(),
            "machine": machine,
            "data": data,
            "compaction": runs,
            "produce": produce,
        }
        result["targets"] = targets(runs, produce)
        text = json.dumps(result, indent=2)
        print(text)
        if args.json_out:
            Path(args.json_out).write_text(text)
        log(table(result))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
