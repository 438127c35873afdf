"""A shard's WAL is bounded (`wal_max_bytes`): an idle partition's few unsealed records in the
oldest WAL file must not keep every later file, written by busy partitions, for up to its
segment.ms (an hour by default). Past the bound the partitions the oldest file still holds are
sealed, and truncation lets the files go."""

from __future__ import annotations

import time
from pathlib import Path

from loglake.engine import Engine, EngineConfig

FILE_BYTES = 64 * 1024
WAIT_S = 20.0  # longest the test waits for the maintenance thread
BATCHES = 48  # of ~8 KB to the busy topic: ~6 WAL files


def _run(tmp_path: Path, wal_max_bytes: int) -> tuple[Engine, int, int]:
    """Returns the (open) engine, the idle partition's sealed end and the WAL file count."""
    from loglake.records.batch import build_batch

    config = EngineConfig(
        wal_shards=1, wal_file_bytes=FILE_BYTES, wal_max_bytes=wal_max_bytes, maintenance_interval_ms=20
    )
    engine = Engine(str(tmp_path / "data"), config)
    engine.open()
    engine.create_topic("idle", 1, {})
    engine.create_topic("busy", 1, {"segment.bytes": str(16 * 1024)})
    engine.append_records("idle", 0, [(None, b"k", b"a few records, then nothing", [])]).result()
    batch = bytes(build_batch([(1, None, bytes([i % 251]) * 80, []) for i in range(100)]))
    for _ in range(BATCHES):
        engine.append_batch("busy", 0, batch).result()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        files = len(engine.shards[0].files())
        if files * FILE_BYTES <= wal_max_bytes + FILE_BYTES:
            break
        time.sleep(0.05)
    time.sleep(0.3)  # a few more ticks: nothing else is going to change
    return engine, engine.partition_info("idle", 0).sealed_end, len(engine.shards[0].files())


def test_an_idle_partition_is_sealed_when_the_wal_passes_its_bound(tmp_path: Path) -> None:
    bound = 3 * FILE_BYTES
    engine, idle_sealed, files = _run(tmp_path, bound)
    try:
        assert idle_sealed == 1  # its one record went into a segment
        assert files * FILE_BYTES <= bound + FILE_BYTES, files
        assert engine.log.maintenance is not None and engine.log.maintenance.wal_bound_seals >= 1
    finally:
        engine.close()
    # everything is still there after a restart
    engine = Engine(str(tmp_path / "data"), EngineConfig(wal_shards=1, wal_file_bytes=FILE_BYTES))
    engine.open()
    try:
        assert engine.partition_info("idle", 0).high_watermark == 1
        assert engine.partition_info("busy", 0).high_watermark == BATCHES * 100
    finally:
        engine.close()


def test_without_the_bound_the_idle_partition_holds_every_file(tmp_path: Path) -> None:
    """The control: a bound the run never reaches leaves the idle partition unsealed, and the
    files behind it stay."""
    engine, idle_sealed, files = _run(tmp_path, 1 << 30)
    try:
        assert idle_sealed == 0
        assert files >= 5, files
    finally:
        engine.close()
