"""Disk full in the engine: the free-space reserve refuses produce with StorageFullError and lets
it back in by itself once space returns; a WAL write or fsync that hits ENOSPC stalls its shard,
which writes the unconfirmed frames again in a fresh file once there is room (nothing
acknowledged lost, no offset reused); EIO still fails the engine for good."""

from __future__ import annotations

import errno
import logging
import re
import time
from pathlib import Path

import pytest

import loglake
from loglake.engine import Engine
from loglake.errors import EngineFailedError, StorageError, StorageFullError
from loglake.fs.faulty import FaultyFileSystem
from loglake.kafka_errors import ErrorCode

from enginekit import DATA_DIR, abandon, read_all, small_config

MIB = 1024 * 1024
GIB = 1024 * MIB


def wait_until(cond: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_reserve_refuses_produce_and_writes_resume_by_themselves(caplog: pytest.LogCaptureFixture) -> None:
    fs = FaultyFileSystem(seed=1)
    fs.space = (500 * MIB, GIB)
    log = loglake.open(
        DATA_DIR, fs=fs, wal_shards=1, wal_file_bytes=64 * 1024,
        storage_min_free_bytes=64 * MIB, storage_min_free_percent=1.0, storage_space_check_interval_ms=10,
    )
    caplog.set_level(logging.WARNING, logger="loglake.engine.space")
    try:
        acked = [log.produce("t", b"v%d" % i).offset for i in range(3)]
        fs.space = (37 * MIB, GIB)  # below max(64 MiB, 1 % of 1 GiB)
        time.sleep(0.05)
        refusals = 0
        for _ in range(50):
            with pytest.raises(StorageFullError) as info:
                log.produce("t", b"refused")
            refusals += 1
        error = info.value
        assert isinstance(error, StorageError) and error.retriable
        assert error.kafka_code == ErrorCode.KAFKA_STORAGE_ERROR
        # what the engine owes (its WAL files ahead) counts on top of the reserve, and says so
        owed = r"( \+ [\d.]+ MiB owed to seals and new WAL files)?"
        assert re.search(rf"37\.0 MiB free on /data < reserve 64\.0 MiB{owed}; produce refused", str(error))
        assert log.engine.space.full and log.engine.space.refused == refusals
        # reads keep working
        assert [v for _o, _k, v in read_all(log.engine, "t")[0]] == [b"v0", b"v1", b"v2"]
        fs.space = (300 * MIB, GIB)
        wait_until(lambda: _produces(log, acked))
        acked.append(log.produce("t", b"after").offset)
        assert acked == [0, 1, 2, 3, 4]  # dense: nothing refused took an offset
        lines = [r.getMessage() for r in caplog.records if r.name == "loglake.engine.space"]
        assert len(lines) == 2, lines  # one line per state change, not per refusal
        assert lines[0].startswith("storage full: 37.0 MiB free on /data < reserve 64.0 MiB")
        assert lines[1].startswith("storage writable again: 300.0 MiB free on /data >= reserve 64.0 MiB")
    finally:
        log.close()


def _produces(log: loglake.Log, acked: list[int]) -> bool:
    try:
        acked.append(log.produce("t", b"probe").offset)
    except StorageFullError:
        return False
    return True


def test_percent_wins_when_larger() -> None:
    fs = FaultyFileSystem(seed=2)
    fs.space = (150 * MIB, 10 * GIB)  # 1.5 % free: above 64 MiB, below 2 % of 10 GiB
    engine = Engine(DATA_DIR, small_config(storage_min_free_bytes=64 * MIB, storage_min_free_percent=2.0), fs=fs, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1)
        with pytest.raises(StorageFullError):
            engine.append_records("t", 0, [(None, None, b"x", [])])
        assert engine.space.reserve_bytes == int(10 * GIB * 0.02)
    finally:
        abandon(engine)


def append(engine: Engine, value: bytes) -> int:
    return engine.append_records("t", 0, [(None, None, value, [])]).result(timeout=30).base_offset


@pytest.mark.parametrize("failing_call", [1, 2], ids=["write", "fsync"])
def test_wal_enospc_stalls_then_heals_without_losing_or_reusing_offsets(failing_call: int) -> None:
    """ENOSPC on the WAL's pwritev (1st call) or its fdatasync (2nd): the append is not
    acknowledged, produce is refused while the disk is full, and once space returns the shard
    writes the frame again in a fresh file; after a crash every acknowledged record is there."""
    fs = FaultyFileSystem(seed=3)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("t", 1)
    assert append(engine, b"a0") == 0  # the WAL file is rolled (preallocated) by now
    fs.set_full(True)
    fs.fail_after(failing_call)  # the WAL write or fsync of the next append
    fut = engine.append_records("t", 0, [(None, None, b"unconfirmed", [])])
    with pytest.raises(StorageFullError):
        fut.result(timeout=10)
    shard = engine.shards[0]
    assert shard.stalled and engine.space.full
    with pytest.raises(StorageFullError):
        engine.append_records("t", 0, [(None, None, b"refused", [])])
    assert engine.partition_info("t", 0).high_watermark == 1  # not visible, not acknowledged
    time.sleep(0.3)  # a few heal rounds fail: no room for a fresh file
    assert shard.stalled
    fs.set_full(False)
    wait_until(lambda: not shard.stalled)
    wait_until(lambda: not engine.space.full)
    # written again with its offset (1): visible now; the next append continues densely
    assert engine.partition_info("t", 0).high_watermark == 2
    assert append(engine, b"a2") == 2
    assert engine.failure is None and shard.stalls == 1
    abandon(engine)
    after = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs.crash(), start_background=False)
    after.open()
    try:
        assert read_all(after, "t") == {0: [(0, None, b"a0"), (1, None, b"unconfirmed"), (2, None, b"a2")]}
    finally:
        abandon(after)


def test_disk_class_data_written_before_a_failed_fsync_is_written_again() -> None:
    """`disk` acknowledges after write(); when a later fsync hits ENOSPC those frames are cut
    from the file with the rest and written again once there is room."""
    fs = FaultyFileSystem(seed=4)
    engine = Engine(DATA_DIR, small_config(wal_shards=1, wal_fsync_interval_ms=60_000), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("t", 1, {"durability": "disk"})
    assert append(engine, b"d0") == 0
    engine.shards[0].sync()
    assert append(engine, b"d1") == 1  # written, acknowledged, not fsynced
    fs.set_full(True)
    fs.fail_after(1)  # the sync below: its fdatasync
    with pytest.raises(StorageFullError):
        engine.shards[0].sync()
    fs.set_full(False)
    wait_until(lambda: not engine.shards[0].stalled)
    engine.shards[0].sync()
    abandon(engine)
    after = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs.crash(), start_background=False)
    after.open()
    try:
        assert read_all(after, "t") == {0: [(0, None, b"d0"), (1, None, b"d1")]}
    finally:
        abandon(after)


def test_eio_on_fsync_still_fails_the_engine() -> None:
    fs = FaultyFileSystem(seed=5)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1)
        append(engine, b"a0")
        fs.fail_after(2, lambda: OSError(errno.EIO, "I/O error (injected)"))
        fut = engine.append_records("t", 0, [(None, None, b"x", [])])
        with pytest.raises(StorageError) as info:
            fut.result(timeout=10)
        assert not isinstance(info.value, StorageFullError)
        with pytest.raises(EngineFailedError):
            engine.append_records("t", 0, [(None, None, b"y", [])])
    finally:
        abandon(engine)


def test_resume_needs_a_margin_above_the_reserve() -> None:
    """Once full, writable again only at the reserve plus a quarter (plus what the engine owes,
    counted on top of both): no flapping at the edge."""
    fs = FaultyFileSystem(seed=6)
    fs.space = (100 * MIB, GIB)
    engine = Engine(DATA_DIR, small_config(storage_min_free_bytes=64 * MIB, storage_min_free_percent=0.0), fs=fs, start_background=False)
    engine.open()
    try:
        space = engine.space
        assert not space.check(force=True)
        owed = space.owed_bytes  # its WAL and metadata log files ahead: nothing is appended here
        assert 0 < owed < MIB
        fs.space = (63 * MIB, GIB)
        assert space.check(force=True)
        fs.space = (70 * MIB, GIB)  # above the reserve, below reserve + 16 MiB
        assert space.check(force=True) and space.full_events == 1
        fs.space = (80 * MIB, GIB)  # reserve + a quarter, but not what is owed on top
        assert space.check(force=True)
        fs.space = (80 * MIB + owed, GIB)
        assert not space.check(force=True)
    finally:
        abandon(engine)


def test_startup_space_check_counts_the_reserve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loglake.cli import startup

    monkeypatch.setattr(startup, "_space", lambda _path: (200 * MIB, 10 * GIB))
    # 2 x 64 MiB WAL + 4 MiB metadata fit in 200 MiB; with a 128 MiB reserve they do not
    assert startup.check_space(str(tmp_path / "d"), 2, 64 * MIB, 4 * MIB) is None
    failure = startup.check_space(str(tmp_path / "d"), 2, 64 * MIB, 4 * MIB, 128 * MIB, 1.0)
    assert failure is not None and failure.exit_code == startup.EXIT_NO_SPACE
    assert "free-space reserve of 128 MiB" in failure.message
    assert failure.hint is not None and "LOGLAKE_STORAGE_MIN_FREE_BYTES" in failure.hint
    # the percentage, when larger, is what counts
    failure = startup.check_space(str(tmp_path / "d"), 1, 1 * MIB, 1 * MIB, 0, 5.0)
    assert failure is not None and "reserve of 512 MiB" in failure.message


def test_failing_seals_back_off_and_log_once_per_state_change(caplog: pytest.LogCaptureFixture) -> None:
    fs = FaultyFileSystem(seed=7)
    engine = Engine(DATA_DIR, small_config(maintenance_interval_ms=10), fs=fs)
    engine.open()
    caplog.set_level(logging.DEBUG, logger="loglake.engine.seal")
    try:
        engine.create_topic("t", 1, {"segment.ms": "1"})
        assert append(engine, b"before") == 0  # the WAL file is rolled while there is room
        wait_until(lambda: engine.partition_info("t", 0).sealed_end == 1)
        fs.set_full(True)
        assert append(engine, b"while-full") == 1  # fits in the preallocated WAL file
        time.sleep(1.5)  # ~150 maintenance ticks: the seal is tried a handful of times, not 150
        failures = [r for r in caplog.records if r.getMessage().startswith("sealing t-0 failed")]
        tries = [r for r in failures if r.levelno == logging.ERROR or "failed again" in r.getMessage()]
        assert 3 <= len(tries) <= 8, len(tries)
        assert [r.levelno for r in failures].count(logging.ERROR) == 1  # the rest at DEBUG
        fs.set_full(False)
        wait_until(lambda: engine.partition_info("t", 0).sealed_end == 2, timeout=20)
        assert any("sealing t-0 works again" in r.getMessage() for r in caplog.records)
        assert [v for _o, _k, v in read_all(engine, "t")[0]] == [b"before", b"while-full"]
    finally:
        engine.close()


def test_metadata_log_enospc_stalls_then_heals() -> None:
    """The metadata log is a WAL shard too: ENOSPC on its write waits for room instead of failing
    the engine; the change is durable once written again, and shutdown while stalled does not hang."""
    import threading

    fs = FaultyFileSystem(seed=8)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("t", 1)
    fs.set_full(True)
    fs.fail_after(1)  # the metadata log's write of the next change
    done: list[object] = []
    creator = threading.Thread(target=lambda: done.append(engine.create_topic("u", 2)))
    creator.start()
    wait_until(lambda: engine.meta.shard is not None and engine.meta.shard.stalled)
    assert engine.space.full and engine.failure is None
    time.sleep(0.3)
    assert not done  # waits for room, not failed
    fs.set_full(False)
    creator.join(timeout=15)
    assert done and not engine.meta.shard.stalled  # type: ignore[union-attr]
    assert append(engine, b"x") == 0
    abandon(engine)
    after = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs.crash(), start_background=False)
    after.open()
    try:
        assert after.topic("u").partitions == 2
        assert read_all(after, "t") == {0: [(0, None, b"x")]}
    finally:
        abandon(after)


def test_close_while_stalled_does_not_hang() -> None:
    fs = FaultyFileSystem(seed=9)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs)
    engine.open()
    engine.create_topic("t", 1)
    assert append(engine, b"a0") == 0
    fs.set_full(True)
    # Bigger than what is left of the 64 KiB WAL file: the roll's preallocation hits ENOSPC.
    with pytest.raises(StorageFullError):
        engine.append_records("t", 0, [(None, None, b"l" * 70_000, [])]).result(timeout=10)
    assert engine.shards[0].stalled
    started = time.monotonic()
    engine.close()  # still full: the stalled write fails, nothing waits forever
    assert time.monotonic() - started < 10
    fs.set_full(False)
    after = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs.crash(), start_background=False)
    after.open()
    try:
        assert read_all(after, "t") == {0: [(0, None, b"a0")]}  # the unacknowledged one is not there
    finally:
        abandon(after)
