#!/usr/bin/env python3
"""loglake engine benchmark: machine limits, append throughput, crash recovery — in one run.

    .venv/bin/python benchmarks/engine.py            # full run (a few minutes on 2 cores)
    .venv/bin/python benchmarks/engine.py --quick    # smoke run (< 30 s)
    .venv/bin/python benchmarks/engine.py --table    # the human table on stdout instead of JSON
    .venv/bin/python benchmarks/engine.py --case b1-100B --skip-recovery   # one case (for profiling)

By default a JSON document goes to stdout and a human table to stderr; `--json-out FILE` also
writes the JSON to FILE. All files live in a temporary directory on the same filesystem as the
data (default: a temp dir next to the repository, or `--dir`), removed at the end.

What is measured (see docs/PERFORMANCE.md for how to read it):

1. Machine limits: sequential write bandwidth to a preallocated file (1 MiB pwrites, one
   fdatasync at the end / an fdatasync every 4 MiB), fdatasync latency of 4 KiB writes, cores.
2. Engine appends, topic durability `fsync`: each producer thread appends one Kafka batch and
   waits for its future before the next (acks=all); a "pipelined" row keeps up to 64 appends in
   flight from one thread. A fresh engine and data directory per case. flush() after the timed
   window is timed separately, as are the bytes the data's block device wrote (its own counter:
   the other processes' writes count too, so read it on a quiet machine).
3. Recovery: a child process writes N records (every future acknowledged) and is killed with
   SIGKILL; then Engine(...).open() is timed, on a warm page cache and on a copy whose files were
   evicted from the page cache.
4. The embedded API beside SQLite.

Sections 1, 3 and 4 live in disk_limits.py, engine_recovery.py and embedded.py; what the engine
sections share (record making, shard counters, the engine import) in engine_kit.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any

# The measurements and helpers this benchmark shares with the others (benchmarks that load this
# module as `engine_bench` use machine_limits, pct and log from here).
from disk_limits import device_write_bytes, fdatasync_latency, group_commit_ceiling, log, machine_limits, pct
from engine_kit import (
    ENGINE_ERRORS,
    PIPELINE_DEPTH,
    TOPIC,
    Engine,
    checked,
    engine_config,
    make_records,
    shard_stats,
)
from engine_recovery import run_recovery
from loglake.records.batch import build_batch

__all__ = ["fdatasync_latency", "log", "machine_limits", "pct"]


# Targets (docs/PERFORMANCE.md).
TARGET_RAW_FRACTION = 0.70  # pre-built 1 KiB x 1000 batches: MB/s vs raw disk (one fdatasync)
TARGET_RECORDS_PER_S = 1_000_000  # 100 B records in pre-built batches of 1000
TARGET_GROUP_COMMIT_RATIO = 5.0  # batch of 1: 8 threads vs 1 thread, records/s


# ==== 2. engine appends (1, machine limits: disk_limits.py) ====================================== ===========================================================================


@dataclass
class Case:
    name: str
    record_bytes: int
    batch_records: int
    threads: int
    mode: str  # "prebuilt" (append_batch, bytes built up front), "records" (append_records), "pipelined"
    depth: int = 1  # appends in flight per thread
    note: str = ""
    sustained: bool = False  # run for the sustained duration with no byte cap (sealing included)


@dataclass
class CaseResult:
    name: str
    mode: str
    record_bytes: int
    batch_records: int
    threads: int
    depth: int
    seconds: float
    appends: int
    records: int
    payload_bytes: int
    records_per_s: float
    mb_per_s: float
    ack_p50_ms: float | None
    ack_p99_ms: float | None
    fsyncs: int
    groups: int
    frames: int
    frames_per_group: float
    fsync_seconds: float
    wal_shards_used: int
    memory_waits: int
    flush_seconds: float
    close_seconds: float
    disk_write_bytes: int  # the data device's bytes written over the timed window + flush (WAL + segments)
    disk_write_bytes_timed: int  # ... over the timed window only
    segments_sealed: int
    cpu_seconds: float  # process user+sys over the timed window (all threads)
    cpu_busy: float  # cpu_seconds / seconds: 1.0 = one core saturated
    targets: list[dict[str, Any]] = field(default_factory=list)


def default_cases() -> list[Case]:
    cases: list[Case] = []
    for size in (100, 1024):
        for batch in (1, 1000):
            for threads in (1, 8):
                tag = f"{size}B" if size < 1024 else "1KiB"
                cases.append(Case(f"prebuilt-b{batch}-{tag}-t{threads}", size, batch, threads, "prebuilt"))
    cases.append(Case("records-b1000-100B-t1", 100, 1000, 1, "records", note="append_records: engine builds the batch"))
    cases.append(
        Case(f"pipelined-b1-100B-d{PIPELINE_DEPTH}", 100, 1, 1, "pipelined", PIPELINE_DEPTH, "one thread, 64 in flight")
    )
    cases.append(
        Case(f"pipelined-b1000-1KiB-d{PIPELINE_DEPTH}", 1024, 1000, 1, "pipelined", PIPELINE_DEPTH, "one thread, 64 in flight")
    )
    cases.append(
        Case(
            "sustained-b1000-1KiB-t1",
            1024,
            1000,
            1,
            "prebuilt",
            note="as prebuilt-b1000-1KiB-t1 but long, no byte cap: background sealing competes",
            sustained=True,
        )
    )
    return cases


def prebuild(case: Case, distinct: int, rng: random.Random) -> list[list[bytes]]:
    """`distinct` Kafka batches per thread, built before the clock starts."""
    per_thread: list[list[bytes]] = []
    for _t in range(case.threads):
        batches = [build_batch(make_records(case.batch_records, case.record_bytes, rng)) for _ in range(distinct)]
        per_thread.append(batches)
    return per_thread


def run_case(
    case: Case, base_dir: str, duration: float, byte_cap: int, overrides: dict[str, Any] | None = None
) -> CaseResult:
    rng = random.Random(42)
    data_dir = tempfile.mkdtemp(prefix=f"case-{case.name}-", dir=base_dir)
    engine = Engine(data_dir, engine_config(overrides or {}))
    engine.open()
    try:
        engine.create_topic(TOPIC, case.threads, {"durability": "fsync"})
        distinct = 4 if case.batch_records >= 100 else 64
        if case.mode == "records":
            inputs: list[Any] = [
                [make_records(case.batch_records, case.record_bytes, rng) for _ in range(distinct)]
                for _ in range(case.threads)
            ]
            sizes = [[len(build_batch(r)) for r in thread_in] for thread_in in inputs]
        else:
            inputs = prebuild(case, distinct, rng)
            sizes = [[len(b) for b in thread_in] for thread_in in inputs]

        stop = threading.Event()
        barrier = threading.Barrier(case.threads + 1)
        done_appends = [0] * case.threads
        done_bytes = [0] * case.threads
        latencies: list[list[float]] = [[] for _ in range(case.threads)]
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            mine = inputs[i]
            my_sizes = sizes[i]
            k = len(mine)
            lat = latencies[i]
            n = 0
            nbytes = 0
            append: Callable[..., Future[Any]] = engine.append_records if case.mode == "records" else engine.append_batch
            perf = time.perf_counter
            try:
                barrier.wait()
                if case.depth <= 1:
                    while not stop.is_set():
                        j = n % k
                        t0 = perf()
                        append(TOPIC, i, mine[j]).result()
                        lat.append(perf() - t0)
                        n += 1
                        nbytes += my_sizes[j]
                        done_appends[i] = n
                        done_bytes[i] = nbytes
                else:
                    inflight: deque[tuple[int, Future[Any]]] = deque()
                    sent = 0
                    while not stop.is_set():
                        if len(inflight) >= case.depth:
                            j, fut = inflight.popleft()
                            fut.result()
                            n += 1
                            nbytes += my_sizes[j]
                            done_appends[i] = n
                            done_bytes[i] = nbytes
                        j = sent % k
                        inflight.append((j, append(TOPIC, i, mine[j])))
                        sent += 1
                    while inflight:
                        j, fut = inflight.popleft()
                        fut.result()
                        n += 1
                        nbytes += my_sizes[j]
                    done_appends[i] = n
                    done_bytes[i] = nbytes
            except BaseException as exc:
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=worker, args=(i,), name=f"producer-{i}") for i in range(case.threads)]
        for t in threads:
            t.start()
        g0, f0, s0, fs0, _ = shard_stats(engine)
        io0 = device_write_bytes(data_dir)
        cpu0 = os.times()
        barrier.wait()
        started = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.02)
            if time.perf_counter() - started >= duration or sum(done_bytes) >= byte_cap:
                stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        cpu1 = os.times()
        g1, f1, s1, fs1, per_shard = shard_stats(engine)
        io1 = device_write_bytes(data_dir)
        if errors:
            raise RuntimeError(f"case {case.name}: producer failed: {errors[0]!r}") from errors[0]
        t0 = time.perf_counter()
        checked(f"{case.name}: flush()", engine.flush)
        flush_s = time.perf_counter() - t0
        io2 = device_write_bytes(data_dir)
        segments = sum(len(engine.segments(TOPIC, p)) for p in range(case.threads))
        memory_waits = engine.memory_pool.waits
    finally:
        t0 = time.perf_counter()
        try:
            checked(f"{case.name}: close()", engine.close, retries=0)
        except FileNotFoundError:
            pass  # recorded; close() released everything in its finally block
        close_s = time.perf_counter() - t0
        shutil.rmtree(data_dir, ignore_errors=True)

    appends = sum(done_appends)
    records = appends * case.batch_records
    payload = sum(done_bytes)
    all_lat = [x for lat in latencies for x in lat]
    groups, frames = g1 - g0, f1 - f0
    return CaseResult(
        name=case.name,
        mode=case.mode,
        record_bytes=case.record_bytes,
        batch_records=case.batch_records,
        threads=case.threads,
        depth=case.depth,
        seconds=elapsed,
        appends=appends,
        records=records,
        payload_bytes=payload,
        records_per_s=records / elapsed,
        mb_per_s=payload / elapsed / 1e6,
        ack_p50_ms=pct(all_lat, 50) * 1e3 if all_lat else None,
        ack_p99_ms=pct(all_lat, 99) * 1e3 if all_lat else None,
        fsyncs=s1 - s0,
        groups=groups,
        frames=frames,
        frames_per_group=frames / groups if groups else 0.0,
        fsync_seconds=fs1 - fs0,
        wal_shards_used=sum(1 for x in per_shard if x),
        memory_waits=memory_waits,
        flush_seconds=flush_s,
        close_seconds=close_s,
        disk_write_bytes=io2 - io0 if io0 >= 0 else -1,
        disk_write_bytes_timed=io1 - io0 if io0 >= 0 else -1,
        segments_sealed=segments,
        cpu_seconds=(cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
        cpu_busy=((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / elapsed,
    )


# ==== 3. recovery ==================================================================================


# ==== targets and output ============================================================================


def apply_targets(
    results: list[CaseResult], raw_mb_s: float, raw1_mb_s: float, ceiling: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """`ceiling`: group_commit_ceiling for the engine's WAL shard count, shown beside the 8-thread
    ratio (what a group commit with no work per append gains here)."""
    summary: list[dict[str, Any]] = []
    by = {r.name: r for r in results}
    for r in results:
        if r.mode == "prebuilt" and r.batch_records == 1000 and r.record_bytes == 1024:
            frac = r.mb_per_s / raw_mb_s
            r.targets.append(
                {
                    "what": f">= {TARGET_RAW_FRACTION:.0%} of raw disk MB/s",
                    "value": f"{frac:.0%} ({r.mb_per_s / raw1_mb_s:.0%} of 1MiB-fsync raw)",
                    "pass": frac >= TARGET_RAW_FRACTION,
                }
            )
        if r.mode == "prebuilt" and r.batch_records == 1000 and r.record_bytes == 100:
            r.targets.append(
                {
                    "what": f">= {TARGET_RECORDS_PER_S:,} records/s",
                    "value": f"{r.records_per_s:,.0f}",
                    "pass": r.records_per_s >= TARGET_RECORDS_PER_S,
                }
            )
        if r.mode == "prebuilt" and r.batch_records == 1 and r.threads == 8:
            single = by.get(r.name.replace("-t8", "-t1"))
            if single is not None and single.records_per_s > 0:
                ratio = r.records_per_s / single.records_per_s
                value = f"{ratio:.1f}x"
                if ceiling is not None:
                    value += (
                        f" (bare Python group commit, {ceiling['writers']} writer(s): "
                        f"{ceiling['ratio']:.1f}x; this is {ratio / ceiling['ratio']:.0%} of it)"
                    )
                r.targets.append(
                    {
                        "what": f"8 threads >= {TARGET_GROUP_COMMIT_RATIO:g}x 1 thread",
                        "value": value,
                        "pass": ratio >= TARGET_GROUP_COMMIT_RATIO,
                    }
                )
        for t in r.targets:
            summary.append({"case": r.name, **t})
    return summary


def fmt_table(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    m = doc["machine"]
    one = m["raw_write_one_fdatasync"]
    four = m["raw_write_fdatasync_every_4MiB"]
    lat = m["fdatasync_4KiB"]
    lines.append(
        f"machine: {m['cores']} cores ({m['cores_usable']} usable), Python {m['python']}, dir {doc['dir']}"
    )
    def spread(x: dict[str, Any]) -> str:
        if "mb_per_s_min" not in x or x["mb_per_s_min"] == x["mb_per_s_max"]:
            return ""
        return f" [{x['mb_per_s_min']:.0f}..{x['mb_per_s_max']:.0f}]"

    lines.append(
        f"raw sequential write (median{'' if doc['quick'] else ' of 3'}): {one['mb_per_s']:.0f} MB/s{spread(one)} "
        f"(1 MiB pwrites, one fdatasync), {four['mb_per_s']:.0f} MB/s{spread(four)} (fdatasync every 4 MiB)"
    )
    one_mib = m.get("raw_write_fdatasync_every_1MiB", {"mb_per_s": float("nan")})
    lines.append(f"raw sequential write, fdatasync every 1 MiB: {one_mib['mb_per_s']:.0f} MB/s{spread(one_mib)}")
    lines.append(
        f"fdatasync of 4 KiB: p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms "
        f"(~{lat['fsyncs_per_s_serial']:.0f} serial fsyncs/s)"
    )
    trip = m.get("thread_round_trip")
    if trip:
        lines.append(
            f"thread round trip (a Future resolved by another thread): {trip['us_per_round_trip']:.0f} us, "
            f"CPU {trip['cpu_user_us']:.0f} us user + {trip['cpu_system_us']:.0f} us system"
        )
    gc = doc.get("group_commit_ceiling")
    if gc:
        lines.append(
            f"bare Python group commit ({gc['writers']} writer(s), median of {len(gc['runs_ratio'])}): "
            f"{gc['one_thread_records_per_s']:,.0f} records/s on 1 thread, {gc['eight_threads_records_per_s']:,.0f} "
            f"on 8 ({gc['eight_threads_frames_per_group']:.1f} frames/group): {gc['ratio']:.1f}x"
        )
    lines.append("")
    header = (
        f"{'case':<26} {'rec/s':>11} {'MB/s':>7} {'ack p50/p99 ms':>15} {'fsyncs':>7} {'fr/grp':>7} "
        f"{'flush s':>7} {'disk MB':>8} {'cpu':>5} {'target':<32} {'result'}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for r in doc["appends"]:
        ack = "-" if r["ack_p50_ms"] is None else f"{r['ack_p50_ms']:.2f}/{r['ack_p99_ms']:.2f}"
        tgt = r["targets"][0] if r["targets"] else None
        disk = r["disk_write_bytes"] / 1e6 if r["disk_write_bytes"] >= 0 else float("nan")
        lines.append(
            f"{r['name']:<26} {r['records_per_s']:>11,.0f} {r['mb_per_s']:>7.1f} {ack:>15} {r['fsyncs']:>7} "
            f"{r['frames_per_group']:>7.1f} {r['flush_seconds']:>7.2f} {disk:>8.0f} {r['cpu_busy']:>5.2f} "
            f"{(tgt['what'] if tgt else ''):<32} "
            + ("" if tgt is None else f"{tgt['value']} {'PASS' if tgt['pass'] else 'FAIL'}")
        )
    if doc.get("recovery"):
        lines.append("")
        lines.append(
            f"{'recovery (SIGKILL)':<26} {'records':>10} {'frames':>7} {'open warm s':>11} {'open cold s':>11} "
            f"{'recovered':>10} {'target':<14} result"
        )
        for rc in doc["recovery"]:
            w, c = rc["warm"], rc["cold"]
            label = f"{rc['records']:,} x 100B, batch {rc['batch_records']}"
            lines.append(
                f"{label:<26} {rc['records']:>10,} {w['frames_replayed']:>7} "
                f"{w['open_seconds']:>11.2f} {c['open_seconds']:>11.2f} {w['records_recovered']:>10,} "
                f"{rc['target']['what']:<14} {'PASS' if rc['target']['pass'] else 'FAIL'}"
            )
    if doc.get("embedded"):
        lines.append("")
        from benchkit import load_benchmark

        lines.extend(load_benchmark("embedded").fmt(doc["embedded"]))
    lines.append("")
    lines.append("targets:")
    for t in doc["targets"]:
        lines.append(f"  {'PASS' if t['pass'] else 'FAIL'}  {t['case']}: {t['what']} (got {t['value']})")
    for e in doc.get("engine_errors", []):
        lines.append(f"  ENGINE ERROR (worked around by retrying): {e}")
    lines.append(f"total run time {doc['run_seconds']:.0f} s")
    return "\n".join(lines)


#: The machine section when it is skipped (or only the fdatasync latency is measured).
NO_MACHINE: dict[str, Any] = {
    "cores": os.cpu_count(),
    "cores_usable": os.cpu_count(),
    "python": platform.python_version(),
    "raw_write_one_fdatasync": {"mb_per_s": float("nan")},
    "raw_write_fdatasync_every_4MiB": {"mb_per_s": float("nan")},
    "raw_write_fdatasync_every_1MiB": {"mb_per_s": float("nan")},
    "fdatasync_4KiB": {"p50_ms": float("nan"), "p99_ms": float("nan"), "fsyncs_per_s_serial": float("nan")},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (< 30 s)")
    ap.add_argument("--dir", help="parent directory for temp data (default: next to the repository)")
    ap.add_argument("--table", action="store_true", help="print the human table on stdout instead of JSON")
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON document to FILE")
    ap.add_argument("--duration", type=float, help="seconds per append case (default 3, quick 0.5)")
    ap.add_argument("--cap-mb", type=float, help="stop a case after this many payload MB (default 200, quick 32)")
    ap.add_argument("--case", action="append", default=[], help="run only cases whose name contains this (repeatable)")
    ap.add_argument("--skip-machine", action="store_true", help="skip the raw disk measurements")
    ap.add_argument("--skip-recovery", action="store_true")
    ap.add_argument("--recovery-records", type=int, help="records in the recovery WAL (default 1,000,000, quick 200,000)")
    ap.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="NAME=INT",
        help="EngineConfig override for the append cases, e.g. wal_shards=1 (for experiments; repeatable)",
    )
    ap.add_argument("--skip-embedded", action="store_true", help="skip the embedded API vs SQLite section")
    ap.add_argument(
        "--only-embedded",
        action="store_true",
        help="only the fdatasync latency and the embedded API vs SQLite section (benchmarks/embedded.py)",
    )
    ap.add_argument("--profile-embedded", action="store_true", help="add cProfile tops to the embedded section")
    args = ap.parse_args(argv)

    overrides = {k: int(v) for k, v in (o.split("=", 1) for o in args.engine_option)}
    duration = args.duration if args.duration is not None else (0.5 if args.quick else 3.0)
    sustained_duration = max(duration, 2.0 if args.quick else 15.0)
    cap = int((args.cap_mb if args.cap_mb is not None else (32 if args.quick else 200)) * 1e6)
    rec_records = args.recovery_records or (200_000 if args.quick else 1_000_000)
    repo_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = args.dir or repo_parent
    base = tempfile.mkdtemp(prefix="loglake-bench-", dir=parent)
    run_started = time.perf_counter()
    doc: dict[str, Any] = {
        "benchmark": "loglake engine",
        "quick": args.quick,
        "dir": base,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "duration_per_case_s": duration,
        "cap_bytes_per_case": cap,
        "engine_config": {k: v for k, v in asdict(engine_config(overrides)).items() if k != "topic_defaults"},
    }
    try:
        if args.skip_machine:
            doc["machine"] = None
        elif args.only_embedded:
            log("machine: fdatasync latency, 300 x 4 KiB ...")
            doc["machine"] = {**NO_MACHINE, "fdatasync_4KiB": fdatasync_latency(base, 300)}
        else:
            doc["machine"] = machine_limits(base, args.quick)
        if args.only_embedded:
            args.skip_recovery = True
        cases = [
            c
            for c in default_cases()
            if not args.only_embedded and (not args.case or any(s in c.name for s in args.case))
        ]
        results: list[CaseResult] = []
        for case in cases:
            log(f"append: {case.name} ...")
            if case.sustained:
                r = run_case(case, base, sustained_duration, 1 << 62, overrides)
            else:
                r = run_case(case, base, duration, cap, overrides)
            log(
                f"  {r.records_per_s:,.0f} records/s, {r.mb_per_s:.1f} MB/s, {r.fsyncs} fsyncs, "
                f"{r.frames_per_group:.1f} frames/group, flush {r.flush_seconds:.2f}s"
            )
            results.append(r)
        # The disk baseline is the better of the two raw medians: the stricter reading of the target.
        raw = (
            max(doc["machine"]["raw_write_one_fdatasync"]["mb_per_s"], doc["machine"]["raw_write_fdatasync_every_4MiB"]["mb_per_s"])
            if doc["machine"]
            else float("inf")
        )
        doc["raw_disk_mb_per_s_for_targets"] = raw
        raw1 = doc["machine"]["raw_write_fdatasync_every_1MiB"]["mb_per_s"] if doc["machine"] else float("inf")
        ceiling = None
        if any(r.mode == "prebuilt" and r.batch_records == 1 and r.threads == 8 for r in results):
            shards = engine_config(overrides).wal_shards
            log(f"machine: bare Python group commit, 1 vs 8 threads over {shards} writer(s) ...")
            ceiling = group_commit_ceiling(base, shards, 0.5 if args.quick else 2.0, 1 if args.quick else 3)
        doc["group_commit_ceiling"] = ceiling
        doc["targets"] = apply_targets(results, raw, raw1, ceiling)
        doc["appends"] = [asdict(r) for r in results]
        doc["recovery"] = []
        if not args.skip_recovery:
            for batch in (1000, 100):
                rc = run_recovery(base, rec_records, batch)
                log(
                    f"  open {rc['warm']['open_seconds']:.2f}s warm / {rc['cold']['open_seconds']:.2f}s cold, "
                    f"{rc['warm']['frames_replayed']} frames, {rc['warm']['records_recovered']:,} records"
                )
                doc["recovery"].append(rc)
                doc["targets"].append(
                    {
                        "case": f"recovery-{rec_records}-b{batch}",
                        "what": rc["target"]["what"],
                        "value": f"{rc['warm']['open_seconds']:.2f} s",
                        "pass": rc["target"]["pass"],
                    }
                )
        if not args.skip_embedded:
            log("embedded: SQLite (WAL, synchronous=FULL) vs produce_batch / consume, both record backends ...")
            from benchkit import load_benchmark  # benchmarks/ is sys.path[0] when run as a script

            doc["embedded"] = load_benchmark("embedded").run(base, args.quick, args.profile_embedded)
            doc["targets"].extend(doc["embedded"]["targets"])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    doc["engine_errors"] = ENGINE_ERRORS
    doc["run_seconds"] = time.perf_counter() - run_started
    if doc["machine"] is None:
        doc["machine"] = NO_MACHINE

    table = fmt_table(doc)
    text = json.dumps(doc, indent=2)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    if args.table:
        print(table)
    else:
        print(text)
        log("")
        log(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
