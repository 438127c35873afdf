"""Read-time CRC check cost: what checking sealed batches before a Fetch serves them costs.

In one run, on a segment file in a temporary folder store (page cache warm, as for a tailing
or catching-up consumer of hot data):

1. raw `crc32c.crc32c` throughput over one 64 MiB buffer (the hardware limit);
2. `pread` of a 1 MiB fetch range alone (what the check's extra read costs);
3. `BatchChecker.check` of a 1 MiB fetch range not verified yet (pread + per-batch checks),
   for 16 KiB and 1 KiB batches (the per-batch Python work shows at small batches);
4. the same range again (verified bitmap hit: what a second consumer group pays).

    .venv/bin/python benchmarks/read_crc.py           # JSON on stdout, table on stderr
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable

import crc32c

from loglake.engine.corrupt import BatchChecker, Corruption
from loglake.fs.os_fs import OsFileSystem
from loglake.records.batch import build_batch
from loglake.segment.format import SegmentWriter, read_tail
from loglake.store.local import LocalStore

MIB = 1024 * 1024
#: Bytes of a segment per case, and of one fetch range.
SEGMENT_BYTES = 64 * MIB
FETCH_BYTES = MIB


def _segment(store: LocalStore, key: str, batch_bytes: int) -> None:
    writer = SegmentWriter(0, bytes(32), 0)
    value = os.urandom(max(batch_bytes - 100, 1))
    offset = 0
    batches = []
    while sum(len(b) for b in batches) < SEGMENT_BYTES:
        batch = build_batch([(0, b"k", value, [])], base_offset=offset)
        batches.append(batch)
        writer.add_batch(batch)
        offset += 1
    parts, _trailer, _index = writer.finish()
    store.put(key, parts)


def _best(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _case(store: LocalStore, batch_bytes: int) -> dict[str, float]:
    key = f"loglake-bench/t-0/0/{batch_bytes:020d}.seg"
    _segment(store, key, batch_bytes)
    _t, index = read_tail(store, key)
    ranges = []
    i = 0
    while i < len(index):
        _pos, _length, count = index.byte_range(i, FETCH_BYTES)
        ranges.append((i, count))
        i += count
    pos, length, _ = index.byte_range(0, FETCH_BYTES)
    pread = _best(lambda: store.get_range(key, pos, length))

    def read(position: int, size: int) -> bytes:
        return store.get_range(key, position, size)

    def check_all(checker: BatchChecker) -> None:
        for first, count in ranges:
            checker.check(("t", 0), key, key, index, first, count, read)

    fresh = _best(lambda: check_all(BatchChecker(Corruption())))
    warm_checker = BatchChecker(Corruption())
    check_all(warm_checker)
    warm = _best(lambda: check_all(warm_checker))
    fetches = len(ranges)
    return {
        "batches_per_fetch": round(len(index) / fetches),
        "pread_1mib_us": round(pread * 1e6),
        "check_first_read_mb_s": round(index.data_end / fresh / 1e6),
        "check_first_read_us_per_fetch": round(fresh / fetches * 1e6),
        "check_verified_us_per_fetch": round(warm / fetches * 1e6, 1),
    }


def main() -> dict[str, object]:
    out: dict[str, object] = {}
    buf = os.urandom(SEGMENT_BYTES)
    raw = _best(lambda: crc32c.crc32c(buf))
    out["crc32c_mb_s"] = round(SEGMENT_BYTES / raw / 1e6)
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(tmp, OsFileSystem())
        for batch_bytes in (16 * 1024, 1024):
            out[f"batch_{batch_bytes}"] = _case(store, batch_bytes)
    return out


if __name__ == "__main__":
    result = main()
    json.dump(result, sys.stdout, indent=2)
    print(file=sys.stdout)
    print(f"crc32c raw: {result['crc32c_mb_s']} MB/s", file=sys.stderr)
    for key, row in result.items():
        if isinstance(row, dict):
            print(f"{key}: {row}", file=sys.stderr)
