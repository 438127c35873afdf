#!/usr/bin/env python3
"""The recovery section of benchmarks/engine.py: a child process (this file, run with DIR RECORDS
BATCH) writes N records with every future acknowledged and is killed with SIGKILL; then
Engine(...).open() is timed, on a warm page cache and on a copy whose files were evicted from
the page cache."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

from disk_limits import log
from engine_kit import PIPELINE_DEPTH, TOPIC, Engine, EngineConfig, checked, make_records, shard_stats
from loglake.records.batch import build_batch

TARGET_RECOVERY_S = 2.0  # open() after a crash with 1M records in the WAL


def crash_writer(data_dir: str, records: int, batch: int) -> None:
    """Child process: write `records` records, wait for every ack, report, then wait to be killed.

    segment.bytes is the maximum and segment.records is off, so nothing seals: the whole log is
    in the WAL when the parent kills this process."""
    engine = Engine(data_dir, EngineConfig())
    engine.open()
    engine.create_topic(
        TOPIC, 1, {"durability": "fsync", "segment.bytes": str(1 << 30), "segment.records": "0"}
    )
    rng = random.Random(7)
    batches = [build_batch(make_records(batch, 100, rng)) for _ in range(16)]
    inflight: deque[Future[Any]] = deque()
    started = time.perf_counter()
    payload = 0
    for i in range(records // batch):
        if len(inflight) >= PIPELINE_DEPTH:
            inflight.popleft().result()
        b = batches[i % len(batches)]
        payload += len(b)
        inflight.append(engine.append_batch(TOPIC, 0, b))
    while inflight:
        inflight.popleft().result()
    elapsed = time.perf_counter() - started
    info = engine.partition_info(TOPIC, 0)
    groups, frames, fsyncs, _, _ = shard_stats(engine)
    print(
        json.dumps(
            {
                "acked_records": info.high_watermark,
                "sealed_end": info.sealed_end,
                "payload_bytes": payload,
                "write_seconds": elapsed,
                "frames": frames,
                "groups": groups,
                "fsyncs": fsyncs,
            }
        ),
        flush=True,
    )
    time.sleep(3600)  # the parent kills us with SIGKILL


def evict_from_page_cache(root: str) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)


def dir_bytes(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                pass
    return total


def timed_open(data_dir: str) -> tuple[dict[str, Any], Engine]:
    t0 = time.perf_counter()
    engine = Engine(data_dir, EngineConfig())
    report = engine.open()
    seconds = time.perf_counter() - t0
    info = engine.partition_info(TOPIC, 0)
    return (
        {
            "open_seconds": seconds,
            "recovery_seconds_reported": report.seconds,
            "frames_read": report.wal_frames_read,
            "frames_replayed": report.wal_frames_replayed,
            "records_recovered": report.records_recovered,
            "wal_bytes_read": report.wal_bytes_read,
            "wal_bytes_truncated": report.wal_bytes_truncated,
            "high_watermark": info.high_watermark,
        },
        engine,
    )


def run_recovery(base_dir: str, records: int, batch: int) -> dict[str, Any]:
    data_dir = tempfile.mkdtemp(prefix=f"recovery-b{batch}-", dir=base_dir)
    cold_dir = data_dir + "-cold"
    try:
        log(f"recovery: child writes {records:,} records in batches of {batch}, then SIGKILL ...")
        child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), data_dir, str(records), str(batch)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        line = child.stdout.readline()
        child.send_signal(signal.SIGKILL)
        child.wait()
        if not line:
            raise RuntimeError(f"crash writer exited with {child.returncode} before reporting")
        written = json.loads(line)
        on_disk = dir_bytes(data_dir)
        shutil.copytree(data_dir, cold_dir)

        warm, engine = timed_open(data_dir)
        t0 = time.perf_counter()
        checked(f"recovery b{batch}: close()", engine.close, retries=0)
        warm["close_seconds"] = time.perf_counter() - t0  # seals the whole recovered log

        evict_from_page_cache(cold_dir)
        cold, engine = timed_open(cold_dir)
        checked(f"recovery b{batch} (cold): close()", engine.close, retries=0)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(cold_dir, ignore_errors=True)
    ok = warm["records_recovered"] == written["acked_records"] == records and cold["records_recovered"] == records
    return {
        "records": records,
        "batch_records": batch,
        "writer": written,
        "data_dir_bytes_after_kill": on_disk,
        "warm": warm,
        "cold": cold,
        "all_acked_records_recovered": ok,
        "target": {
            "what": f"open() <= {TARGET_RECOVERY_S:g} s",
            "pass": warm["open_seconds"] <= TARGET_RECOVERY_S and ok,
        },
    }


if __name__ == "__main__":
    crash_writer(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
