"""The embedded API beside SQLite (issue 12): a section of benchmarks/engine.py.

    .venv/bin/python benchmarks/engine.py --only-embedded --table          # this section alone
    .venv/bin/python benchmarks/engine.py --only-embedded --profile-embedded   # + cProfile tops

The anchor is what SQLite does durably on the same disk in the same run: WAL journal mode,
``synchronous=FULL``, one transaction of 1,000 rows of 100 B at a time. Against it, loglake's
``Log.produce_batch`` of 1,000 records of 100 B into a ``durability=fsync`` topic (each call
returns once its batch is fdatasynced), and ``Log.consume`` of the records written, from one
thread. Each loglake measurement runs under both record backends (loglake.records.native): the
pure-Python reference ("python", what the embedded API did before) and the compiled one
("native"). The disk's fdatasync latency is measured by engine.py's machine section in the same run.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import loglake

try:
    from loglake.records import active_backend, native_available, use_backend
except ImportError:  # a loglake from before the native backend (to measure "before" with this script)

    def active_backend() -> str:
        return "before"

    def native_available() -> bool:
        return False

    def use_backend(name: str) -> str:
        return "before"


ROWS_PER_TXN = 1000
ROW_BYTES = 100
TOPIC = "embedded"
#: Targets (issue 12): produce_batch at least this multiple of SQLite's rows/s; consume at least
#: this many records/s from one thread.
TARGET_VS_SQLITE = 1.5
TARGET_CONSUME_PER_S = 1_000_000
#: Timed passes over the log by consume (after a warm-up pass); the median is reported.
CONSUME_PASSES = 3
#: cProfile rows printed per profiled call.
PROFILE_TOP = 14


def _payload(i: int) -> bytes:
    return i.to_bytes(8, "big") * (ROW_BYTES // 8) + bytes(ROW_BYTES % 8)


def sqlite_rows_per_s(directory: str, seconds: float) -> dict[str, Any]:
    """Rows/s of transactions of ROWS_PER_TXN 100 B rows, WAL mode, synchronous=FULL."""
    path = os.path.join(directory, "anchor.sqlite")
    db = sqlite3.connect(path, isolation_level=None)
    try:
        assert db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, key BLOB, value BLOB)")
        rows = [(None, _payload(i)) for i in range(ROWS_PER_TXN)]
        txns = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            db.execute("BEGIN")
            db.executemany("INSERT INTO events (key, value) VALUES (?, ?)", rows)
            db.execute("COMMIT")
            txns += 1
        elapsed = time.perf_counter() - started
    finally:
        db.close()
    return {
        "transactions": txns,
        "rows": txns * ROWS_PER_TXN,
        "seconds": elapsed,
        "rows_per_s": txns * ROWS_PER_TXN / elapsed,
    }


def _profile(fn: Callable[[], Any]) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(PROFILE_TOP)
    text = out.getvalue()
    start = text.find("   ncalls")
    return text[start:] if start >= 0 else text


def loglake_rates(directory: str, backend: str, seconds: float, profile: bool) -> dict[str, Any]:
    """produce_batch records/s (durable per call) and consume records/s under one record backend."""
    use_backend(backend)
    data = tempfile.mkdtemp(prefix=f"embedded-{backend}-", dir=directory)
    rows = [(None, _payload(i)) for i in range(ROWS_PER_TXN)]
    out: dict[str, Any] = {"backend": active_backend()}
    try:
        with loglake.open(data) as log:
            log.create_topic(TOPIC, 1, {"durability": "fsync"})
            calls = 0
            started = time.perf_counter()
            while time.perf_counter() - started < seconds:
                log.produce_batch(TOPIC, rows)
                calls += 1
            elapsed = time.perf_counter() - started
            out["produce_records"] = calls * ROWS_PER_TXN
            out["produce_seconds"] = elapsed
            out["produce_records_per_s"] = calls * ROWS_PER_TXN / elapsed
            log.flush()

            def consume_all() -> int:
                n = 0
                for _rec in log.consume(TOPIC, "earliest"):
                    n += 1
                return n

            consume_all()  # warm: segment files into the page cache, index loaded
            rates = []
            cpu_rates = []
            for _ in range(CONSUME_PASSES):
                started, cpu_started = time.perf_counter(), time.process_time()
                n = consume_all()
                rates.append(n / (time.perf_counter() - started))
                # records per second of CPU this process got: on a shared, loaded machine the
                # wall-clock rate also measures how much of a core the scheduler gave us
                cpu_rates.append(n / max(time.process_time() - cpu_started, 1e-9))
                assert n == out["produce_records"], (n, out["produce_records"])
            out["consume_records"] = n
            out["consume_passes_records_per_s"] = rates
            out["consume_records_per_s"] = statistics.median(rates)
            out["consume_records_per_cpu_s"] = statistics.median(cpu_rates)
            if profile:
                out["produce_profile"] = _profile(lambda: [log.produce_batch(TOPIC, rows) for _ in range(20)])
                out["consume_profile"] = _profile(consume_all)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return out


def run(directory: str, quick: bool, profile: bool = False) -> dict[str, Any]:
    """SQLite, then loglake under each backend, each for the same time; targets applied."""
    seconds = 1.0 if quick else 5.0
    before = active_backend()
    backends = ["python", "native"] if native_available() else [active_backend()]
    try:
        anchor = sqlite_rows_per_s(directory, seconds)
        runs = {b: loglake_rates(directory, b, seconds, profile) for b in backends}
    finally:
        use_backend(before)
    best = runs[backends[-1]]
    ratio = best["produce_records_per_s"] / anchor["rows_per_s"]
    targets = [
        {
            "case": f"embedded-produce_batch-{best['backend']}",
            "what": f">= {TARGET_VS_SQLITE}x SQLite rows/s",
            "value": f"{ratio:.2f}x ({best['produce_records_per_s']:,.0f} vs {anchor['rows_per_s']:,.0f})",
            "pass": ratio >= TARGET_VS_SQLITE,
        },
        {
            "case": f"embedded-consume-{best['backend']}",
            "what": f">= {TARGET_CONSUME_PER_S:,} records/s",
            "value": f"{best['consume_records_per_s']:,.0f}",
            "pass": best["consume_records_per_s"] >= TARGET_CONSUME_PER_S,
        },
    ]
    return {"seconds_each": seconds, "sqlite": anchor, "loglake": runs, "targets": targets}


def fmt(section: dict[str, Any]) -> list[str]:
    """Lines of engine.py's human table for this section."""
    a = section["sqlite"]
    lines = [
        f"{'embedded vs SQLite':<26} {'produce rec/s':>14} {'x SQLite':>9} {'consume rec/s':>14} "
        f"{'per CPU-s':>10}  (consume: median of {CONSUME_PASSES} passes; all passes)",
        f"{'sqlite WAL, sync=FULL':<26} {a['rows_per_s']:>14,.0f} {1.0:>9.2f} {'-':>14}",
    ]
    for name, r in section["loglake"].items():
        lines.append(
            f"{'loglake, ' + name + ' records':<26} {r['produce_records_per_s']:>14,.0f} "
            f"{r['produce_records_per_s'] / a['rows_per_s']:>9.2f} {r['consume_records_per_s']:>14,.0f} "
            f"{r['consume_records_per_cpu_s']:>10,.0f}  "
            + " ".join(f"{x:,.0f}" for x in r["consume_passes_records_per_s"])
        )
    for name, r in section["loglake"].items():
        for what in ("produce_profile", "consume_profile"):
            if what in r:
                lines.append(f"\n{what} ({name} records), top {PROFILE_TOP} by own time:\n{r[what]}")
    return lines
