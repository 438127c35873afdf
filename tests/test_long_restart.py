"""Restart time after kill -9 with 1 GiB produced (issue 31, item 10; make test-long).

benchmarks/restart.py's run against the real `loglake serve`: 1 GiB from one confluent-kafka
producer into 8 partitions that would never seal on their own (segment.bytes 1 GiB, segment.ms a
day, a 3 GiB memory budget), SIGKILL right after the last acknowledgement, then a start on the
same data directory. Asserted: the WAL files a restart reads stay within the replay bound
(`wal_replay_bound`, 256 MiB here) plus a file per shard that rolls while the seals run (and one
more for a slow seal), and every acknowledged record is there. The restart's seconds are
printed, not asserted (a wall-clock figure on a shared machine is the benchmark's). Before the
bound (issue 31) the whole GiB stayed in the WAL: 1.1 GiB read, 3.9 s to listening on the
development VM (docs/RELIABILITY.md, "Restart time").
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

from loglake.engine.config import EngineConfig

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
SHARDS = 2
#: WAL files that may roll past the bound while the seals that let files go run: one per shard,
#: one more for a slow seal (measured: one per shard)
SLACK_FILES = SHARDS + 1


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("loglake_restart_bench", ROOT / "benchmarks" / "restart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_restart_after_kill_with_a_gib_produced(tmp_path: Path) -> None:
    bench = _benchmark()
    args = argparse.Namespace(
        produce_mib=1024, value_bytes=1024, partitions=8, batch_bytes=16384, linger_ms=5.0, engine=[f"wal_shards={SHARDS}"]
    )
    base = Path(tempfile.mkdtemp(prefix="restart-", dir=tmp_path))
    try:
        run = bench.one_run(base, args, 0)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    config = EngineConfig(wal_shards=SHARDS)
    print(bench.fmt_table({"runs": [run]}))
    assert run["all_acked_records_there"], run
    assert run["wal_file_bytes_at_kill"] <= config.wal_replay_bound + SLACK_FILES * config.wal_file_bytes, run
