#!/usr/bin/env python3
"""One compaction run of benchmarks/compaction.py, in a process of its own so that its peak RSS is
the run's: `engine.compact(force=True)` on a copy of the data set until nothing is dirty, with
map building and rewriting timed apart. Prints one JSON object.

    .venv/bin/python benchmarks/compaction_child.py DATA_DIR --dedupe BYTES --rate BYTES_PER_S --max-passes N
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import loglake.engine.cleaner_job as cleaner_job
from benchkit import load_benchmark
from loglake.engine import open_engine
from loglake.engine.compaction import KEY_ENTRY_BYTES

bench = load_benchmark("compaction")  # the data set's topic, key size and counting helpers


def rss_now() -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    rss = hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child_compact(data_dir: str, dedupe: int, rate: int, max_passes: int) -> dict[str, Any]:
    # The job runs in this process (cleaner_process=False): what one worker process does, timed
    # phase by phase; its memory is this process's peak.
    engine = open_engine(
        data_dir,
        cleaner_threads=0,
        merge_min_segments=0,
        cleaner_dedupe_buffer_bytes=dedupe,
        cleaner_io_max_bytes_per_second=rate,
        cleaner_process=False,
    )
    try:
        cleaner = engine.cleaner
        before = bench.segment_refs(engine)
        sealed_before = sum(s.size for s in before)
        phases: dict[str, float] = {"map_s": 0.0, "rewrite_s": 0.0, "map_bytes": 0, "rewrite_bytes_read": 0, "rewrite_bytes_written": 0}
        namespace = vars(cleaner_job)  # the job calls the names it imported
        real_build_map = namespace["build_key_map"]
        real_build = namespace["build"]
        map_read = [0]

        def timed_build_map(read: Any, *args: Any, **kwargs: Any) -> Any:
            def counting(seg: Any) -> Any:
                for chunk in read(seg):
                    map_read[0] += len(chunk)
                    yield chunk

            t0 = time.perf_counter()
            try:
                return real_build_map(counting, *args, **kwargs)
            finally:
                phases["map_s"] += time.perf_counter() - t0
                phases["map_bytes"] = map_read[0]

        def timed_build(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                outputs, stats = real_build(*args, **kwargs)
            finally:
                phases["rewrite_s"] += time.perf_counter() - t0
            phases["rewrite_bytes_read"] += stats.bytes_read
            phases["rewrite_bytes_written"] += stats.bytes_written
            return outputs, stats

        namespace["build_key_map"] = timed_build_map
        namespace["build"] = timed_build
        rss0, hwm0 = rss_now()
        reset = reset_peak()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        passes = 0
        while passes < max_passes and engine.compact(bench.TOPIC, force=True):
            passes += 1
        seconds = time.perf_counter() - started
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        rss1, hwm1 = rss_now()
        after = bench.segment_refs(engine)
        kept = bench.count_records(engine)
        stats = cleaner.stats
        pass_s = phases["map_s"] + phases["rewrite_s"]
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        return {
            "dedupe_buffer_bytes": dedupe,
            "keys_fit": dedupe // (KEY_ENTRY_BYTES + bench.KEY_BYTES),
            "rate_limit_bytes_per_s": rate,
            "passes": stats.passes,
            "compact_calls": passes,
            "sealed_bytes_before": sealed_before,
            "segments_before": len(before),
            "sealed_bytes_after": sum(s.size for s in after),
            "segments_after": len(after),
            "records_in": stats.records_in,
            "records_out": stats.records_out,
            "records_kept": kept,
            "bytes_read": stats.bytes_read,
            "bytes_written": stats.bytes_written,
            "seconds": round(seconds, 3),
            "map_seconds": round(phases["map_s"], 3),
            "rewrite_seconds": round(phases["rewrite_s"], 3),
            "map_bytes_read": int(phases["map_bytes"]),
            "rewrite_bytes_read": int(phases["rewrite_bytes_read"]),
            "map_mb_per_s": round(phases["map_bytes"] / max(phases["map_s"], 1e-9) / 1e6, 1),
            "rewrite_mb_per_s": round(phases["rewrite_bytes_read"] / max(phases["rewrite_s"], 1e-9) / 1e6, 1),
            # the target's measure: log bytes (each counted once) per second of pass
            "input_mb_per_s": round(sealed_before / max(pass_s, 1e-9) / 1e6, 1),
            "read_mb_per_s": round(stats.bytes_read / max(pass_s, 1e-9) / 1e6, 1),
            "io_mb_per_s": round((stats.bytes_read + stats.bytes_written) / max(seconds, 1e-9) / 1e6, 1),
            "cpu_seconds": round(cpu, 3),
            "cpu_busy": round(cpu / max(seconds, 1e-9), 2),
            "rss_before_mb": bench.mb(rss0),
            "peak_before_mb": bench.mb(hwm0),
            "peak_reset": reset,
            "peak_during_mb": bench.mb(hwm1),
            "rss_after_mb": bench.mb(rss1),
            "peak_delta_mb": bench.mb(hwm1 - rss0) if reset else bench.mb(max(hwm1, hwm0) - rss0),
        }
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_dir")
    parser.add_argument("--dedupe", type=int, default=bench.DEFAULT_DEDUPE, help="key map bytes")
    parser.add_argument("--rate", type=int, default=0, help="cleaner I/O limit, bytes/s (0: off)")
    parser.add_argument("--max-passes", type=int, default=1000)
    args = parser.parse_args()
    print(json.dumps(child_compact(args.data_dir, args.dedupe, args.rate, args.max_passes)))


if __name__ == "__main__":
    main()
