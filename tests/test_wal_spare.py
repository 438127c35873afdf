"""The WAL shard's spare file (issue 12): a zero-written file made ahead of need by a helper
thread, renamed into place at a roll, so the WAL's fdatasyncs overwrite written blocks and never
wait for a journal commit. What must hold: every acknowledged frame is recovered, at every crash
point of rolls that use the spare and of the spare's own making; a leftover spare (any content)
is never read as WAL; without room for a spare the shard rolls as before; a shard that never
fills half a file makes none.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from loglake.errors import EngineFailedError
from loglake.fs import OsFileSystem
from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash
from loglake.wal import WalShard, recover_wal
from loglake.wal.spare import WAL_SPARE_NAME
from walkit import FILE_BYTES, WAIT_S, ExtentFs, append_one, recovered_offsets


def _wait_spare(shard: WalShard, fs: FaultyFileSystem | None = None) -> None:
    deadline = time.monotonic() + WAIT_S
    while shard._spare is None or not shard._spare.ready:
        if fs is not None and fs.dead:
            raise SimulatedCrash("crashed while waiting for the spare")
        assert time.monotonic() < deadline, "the helper made no spare file"
        time.sleep(0.001)



def test_rolls_use_the_spare_and_everything_comes_back(tmp_path: Path) -> None:
    directory = tmp_path / "wal" / "shard-00"
    directory.mkdir(parents=True)
    shard = WalShard(OsFileSystem(), str(directory), file_bytes=FILE_BYTES, spare=True)
    shard.start(0, [])
    acked: list[int] = []
    try:
        for base in range(40):
            if base % 6 == 5:
                _wait_spare(shard)  # the next roll finds one ready
            append_one(shard, base, acked)
        assert (directory / WAL_SPARE_NAME).exists()
        assert shard.spare_rolls >= 5
    finally:
        shard.close()
    assert not (directory / WAL_SPARE_NAME).exists()  # not kept past close
    assert recovered_offsets(OsFileSystem(), str(tmp_path / "wal")) == acked == list(range(40))


def test_without_the_capability_there_is_no_helper(tmp_path: Path) -> None:
    """A filesystem without unwritten extents (the fault model) gets no spare and no thread."""
    fs = FaultyFileSystem()
    fs.makedirs("/wal/shard-00")
    shard = WalShard(fs, "/wal/shard-00", file_bytes=FILE_BYTES, spare=True)
    shard.start(0, [])
    try:
        for base in range(8):
            append_one(shard, base, [])
        assert shard._spare is None and shard.spare_rolls == 0
        assert WAL_SPARE_NAME not in fs.listdir("/wal/shard-00")
    finally:
        shard.close()


def test_a_leftover_spare_is_never_read_as_wal_and_is_replaced(tmp_path: Path) -> None:
    directory = tmp_path / "wal" / "shard-00"
    directory.mkdir(parents=True)
    (directory / WAL_SPARE_NAME).write_bytes(b"\xff" * 5000)  # a crash while it was written
    assert recover_wal(OsFileSystem(), str(tmp_path / "wal")).frames == []
    shard = WalShard(OsFileSystem(), str(directory), file_bytes=FILE_BYTES, spare=True)
    shard.start(0, [])
    acked: list[int] = []
    try:
        for base in range(4):  # past half the first file: the spare is asked for
            append_one(shard, base, acked)
        _wait_spare(shard)
        assert (directory / WAL_SPARE_NAME).read_bytes() == bytes(FILE_BYTES)
    finally:
        shard.close()
    assert [f.base_offset for f in recover_wal(OsFileSystem(), str(tmp_path / "wal")).frames] == acked


def test_a_shard_that_never_fills_half_a_file_makes_no_spare(tmp_path: Path) -> None:
    """Short-lived engines (a CLI command, a test, a few embedded appends) write no zeros."""
    directory = tmp_path / "wal" / "shard-00"
    directory.mkdir(parents=True)
    shard = WalShard(OsFileSystem(), str(directory), file_bytes=FILE_BYTES, spare=True)
    shard.start(0, [])
    try:
        for base in range(3):  # 30 KB of a 64 KiB file
            append_one(shard, base, [])
        time.sleep(0.05)
        assert not (directory / WAL_SPARE_NAME).exists() and shard._spare is not None
        assert not shard._spare.ready
    finally:
        shard.close()


def test_no_room_for_a_spare_rolls_as_before() -> None:
    fs = ExtentFs()
    fs.makedirs("/wal/shard-00")
    fs.set_full(True)  # the helper's spare fails; the shard must not
    shard = WalShard(fs, "/wal/shard-00", file_bytes=FILE_BYTES, spare=True)
    shard.start(0, [])
    acked: list[int] = []
    try:
        time.sleep(0.05)  # let the helper try (and fail) first
        fs.set_full(False)
        for base in range(3):
            append_one(shard, base, acked)
    finally:
        shard.close()
    assert acked == [0, 1, 2]
    assert [f.base_offset for f in recover_wal(fs, "/wal").frames] == acked


def _crash_run(k: int | None) -> tuple[FaultyFileSystem, list[int], int, int]:
    """Appends across several rolls, each roll with a spare ready; crash at mutating call
    `k` counted from the first append. Returns the fs, what was acknowledged, calls made and
    rolls that used the spare."""
    fs = ExtentFs(seed=k or 0)
    fs.makedirs("/wal/shard-00")
    shard = WalShard(fs, "/wal/shard-00", file_bytes=FILE_BYTES, spare=True)
    shard.start(0, [])
    acked: list[int] = []
    start = 0
    try:
        for base in range(5):  # the first file, half full: the spare is asked for
            append_one(shard, base, acked)
        _wait_spare(shard, fs)
        start = fs.mutating_calls
        if k is not None:
            fs.crash_after = start + k
        for base in range(5, 20):
            if base % 6 == 5:
                _wait_spare(shard, fs)
            append_one(shard, base, acked)
    except (SimulatedCrash, EngineFailedError):
        pass  # the crash stopped the helper or the writer (whose entries then fail)
    finally:
        try:
            shard.close()
        except BaseException:  # a dead fs raises SimulatedCrash on close
            pass
    return fs, acked, fs.mutating_calls - start, shard.spare_rolls


def test_every_crash_point_across_spare_rolls_keeps_every_acknowledged_frame() -> None:
    _fs, acked, calls, spare_rolls = _crash_run(None)
    assert acked == list(range(20)) and spare_rolls >= 3
    for k in range(1, calls + 1):
        fs, acked, _, _ = _crash_run(k)
        for torn in (False, True):
            got = [f.base_offset for f in recover_wal(fs.crash(torn=torn), "/wal").frames]
            # every acknowledged frame, in order, and nothing that was never submitted
            assert got[: len(acked)] == acked, (k, torn)
            assert got == list(range(len(got))), (k, torn)


@pytest.mark.parametrize("k", range(1, 8))
def test_a_crash_while_the_spare_is_made_loses_nothing(k: int) -> None:
    """Crash inside the helper's own calls (open, zero fill, datasync): the WAL written before
    is intact and the half-made spare is ignored by recovery."""
    fs = ExtentFs(seed=k)
    fs.makedirs("/wal/shard-00")
    shard = WalShard(fs, "/wal/shard-00", file_bytes=FILE_BYTES, spare=False)
    shard.start(0, [])
    acked: list[int] = []
    for base in range(4):
        append_one(shard, base, acked)
    shard.close()
    # a second shard life, asked for a spare at once, crashing k calls into the helper's work
    rec0 = recover_wal(fs, "/wal")
    shard = WalShard(fs, "/wal/shard-00", file_bytes=FILE_BYTES, spare=True)
    shard.start(rec0.shards["shard-00"].next_seq, rec0.shards["shard-00"].files)
    assert shard._spare is not None
    fs.crash_after = fs.mutating_calls + k
    shard._spare.request()
    deadline = time.monotonic() + WAIT_S
    while not fs.dead and not shard._spare.ready and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        shard.close()
    except BaseException:  # SimulatedCrash from a dead fs
        pass
    after = fs.crash()
    assert [f.base_offset for f in recover_wal(after, "/wal").frames] == acked


def test_no_spare_that_would_eat_into_the_free_space_reserve() -> None:
    """A spare is skipped when it would leave less free than the reserve (the engine passes its
    SpaceGuard's): produce must never be refused for lack of space because of zeros made ahead."""
    fs = ExtentFs()
    fs.makedirs("/wal/shard-00")
    reserve = 10 * FILE_BYTES
    fs.space = (reserve + FILE_BYTES - 1, 1 << 30)  # one byte short of room for a spare
    shard = WalShard(
        fs, "/wal/shard-00", file_bytes=FILE_BYTES, spare=True, spare_keep_free=lambda total: reserve
    )
    shard.start(0, [])
    acked: list[int] = []
    try:
        for base in range(5):
            append_one(shard, base, acked)
        spare = shard._spare
        assert spare is not None
        deadline = time.monotonic() + WAIT_S
        while spare.skipped_for_space == 0:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert not spare.ready and WAL_SPARE_NAME not in fs.listdir("/wal/shard-00")
        fs.space = (reserve + FILE_BYTES, 1 << 30)  # room now: the next file's request makes one
        for base in range(5, 11):
            append_one(shard, base, acked)
        _wait_spare(shard, fs)
    finally:
        shard.close()
    assert [f.base_offset for f in recover_wal(fs, "/wal").frames] == acked == list(range(11))
