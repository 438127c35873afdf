"""Restart time is bounded by design (issue 31, item 10): all WAL shards together keep at most
`wal_replay_bytes_max` of WAL files, so a restart after a crash reads and replays at most that
much, however much was produced and however big the memory budget and the segments are.

Partitions that would never seal on their own (segment.bytes 1 GiB, segment.ms a day, a memory
budget far above what is written) take many times the bound; past it, maintenance seals the
partitions holding the oldest files of the shards with the most, and truncation lets the files
go. Then the engine is abandoned as a crash would leave it and opened again: the recovery reads
at most the bound, and every acknowledged record is there. (The real broker with 1 GiB:
`test_long_restart.py` and benchmarks/restart.py.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from loglake.engine import Engine, EngineConfig
from loglake.engine.seal import Sealer
from loglake.errors import ConfigError
from loglake.records.batch import build_batch

from enginekit import abandon

KIB = 1024
MIB = 1024 * KIB
FILE_BYTES = 256 * KIB
BOUND = 2 * MIB
PARTITIONS = 4
SHARDS = 2
WRITTEN = 24 * MIB  # twelve times the bound
NEVER = {"segment.bytes": str(1 << 30), "segment.ms": str(24 * 3600 * 1000), "segment.records": "0"}


def config() -> EngineConfig:
    return EngineConfig(
        wal_shards=SHARDS,
        wal_file_bytes=FILE_BYTES,
        wal_replay_bytes_max=BOUND,
        memory_budget_bytes=256 * MIB,
        maintenance_interval_ms=20,
    )


def wal_bytes(data: Path) -> int:
    """Bytes of the WAL files a restart would read (`wal-*.log`: not the spare files)."""
    total = 0
    for f in (data / "wal").rglob("wal-*.log"):
        try:
            total += f.stat().st_size
        except FileNotFoundError:
            pass  # truncated (or recycled) while we looked
    return total


def test_a_restart_reads_at_most_the_bound(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = Engine(str(data), config())
    engine.open()
    engine.create_topic("t", PARTITIONS, NEVER)
    batch = bytes(build_batch([(1, None, bytes([i % 251]) * 1000, []) for i in range(16)]))  # ~16 KB
    records = 0
    most = 0
    pending = []
    for i in range(WRITTEN // len(batch)):
        pending.append(engine.append_batch("t", i % PARTITIONS, batch))
        records += 16
        if len(pending) >= 32:
            for fut in pending:
                fut.result(timeout=30)
            pending.clear()
            most = max(most, wal_bytes(data))
            time.sleep(0.03)  # ~16 MB/s: a producer, not a flood (maintenance ticks every 20 ms)
    for fut in pending:
        fut.result(timeout=30)
    deadline = time.monotonic() + 20
    while wal_bytes(data) > BOUND and time.monotonic() < deadline:
        time.sleep(0.05)
    held = wal_bytes(data)
    unsealed = sum(engine.partition_info("t", p).unsealed_bytes for p in range(PARTITIONS))
    seals = engine.log.maintenance.wal_bound_seals
    abandon(engine)  # a crash: nothing sealed or trimmed on the way out
    engine._dir_lock.release()  # what the dead process's exit would do

    print(f"WAL files: at most {most}, at the end {held}; bound {BOUND}")
    assert held <= BOUND, f"{held} bytes of WAL files kept, bound {BOUND}"
    # While writing it may pass the bound by the gate's slack (loglake.engine.wal_gate), and by
    # one file more per other shard rolling at the same moment.
    gate = engine.log.roll_gate
    assert gate is not None
    assert most <= gate.limit + (SHARDS - 1) * FILE_BYTES, (most, held, gate.limit)
    assert 0 < unsealed <= BOUND
    assert seals > 0

    engine = Engine(str(data), config())
    report = engine.open()
    try:
        assert report.wal_bytes_read <= BOUND, report.summary()
        assert sum(engine.partition_info("t", p).high_watermark for p in range(PARTITIONS)) == records
    finally:
        engine.close()


def test_slow_seals_hold_the_producers_back_not_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A starved machine: every seal takes a quarter of a second more, and the producer writes as
    fast as it can. The WAL writers wait to roll until the seals let files go, so the WAL stays
    within the gate's limit all along — a crash at any moment replays no more than that — and
    every append is still acknowledged."""
    real = Sealer.seal_partition

    def slow(self: Sealer, p: object, *, full: bool) -> bool:
        time.sleep(0.25)
        return real(self, p, full=full)  # type: ignore[arg-type]

    monkeypatch.setattr(Sealer, "seal_partition", slow)
    data = tmp_path / "data"
    engine = Engine(str(data), config())
    engine.open()
    try:
        engine.create_topic("t", PARTITIONS, NEVER)
        batch = bytes(build_batch([(1, None, bytes([i % 251]) * 1000, []) for i in range(16)]))
        most = 0
        pending = []
        for i in range((WRITTEN // 2) // len(batch)):
            pending.append(engine.append_batch("t", i % PARTITIONS, batch))
            if len(pending) >= 32:
                for fut in pending:
                    fut.result(timeout=60)
                pending.clear()
                most = max(most, wal_bytes(data))
        for fut in pending:
            fut.result(timeout=60)
        gate = engine.log.roll_gate
        assert gate is not None
        print(f"WAL files: at most {most}; gate limit {gate.limit}; waits {gate.waits} ({gate.waited_s:.1f} s)")
        assert gate.waits > 0, "the seals kept up: the test did not starve them"
        assert gate.overruns == 0
        assert most <= gate.limit + (SHARDS - 1) * FILE_BYTES, (most, gate.limit)
    finally:
        engine.close()


def test_the_bound_in_effect_keeps_a_file_per_shard_and_one_more() -> None:
    """Each shard's active file stays, so a bound below that would seal every partition at every
    roll: the bound in effect is at least (wal_shards + 1) files."""
    assert EngineConfig(wal_shards=4, wal_file_bytes=64 * MIB, wal_replay_bytes_max=128 * MIB).wal_replay_bound == 320 * MIB
    assert EngineConfig(wal_shards=2, wal_file_bytes=64 * MIB).wal_replay_bound == 256 * MIB
    with pytest.raises(ConfigError, match="wal_replay_bytes_max"):
        EngineConfig.from_kwargs(wal_file_bytes=MIB, wal_replay_bytes_max=MIB)
