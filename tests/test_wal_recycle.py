"""Recycled WAL files (issue 12: fewer writes per byte). An obsolete WAL file becomes the shard's
next file instead of a file of fresh zeros; its old frames stay behind the new ones, and every
frame written into it carries FLAG_RECYCLED_FILE. What must hold: every acknowledged frame comes
back and nothing else does, at every crash point of rolls into recycled files and of the
recycling itself; recovery tells a recycled file's old contents from damage (a closed file must
hold every frame up to its successor's first seq; an intact later write behind the cut is still
corruption); a file written before recycling existed opens as before.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from loglake.errors import CorruptionError, EngineFailedError
from loglake.fs import OsFileSystem
from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash
from loglake.wal import WalShard, recover_wal
from loglake.wal.entry import wal_file_name
from loglake.wal.frame import FLAG_RECYCLED_FILE, encode_frame
from loglake.wal.spare import WAL_RECYCLED_NAME, WAL_SPARE_NAME
from walkit import FILE_BYTES, TID, WAIT_S, ExtentFs, append_one, recovered_offsets

SWEEP_APPENDS = 40  # rolls into recycled files at least three times
KEEP = 8  # frames below the newest `KEEP` acknowledged ones count as sealed elsewhere




def _truncate(shard: WalShard, acked: list[int]) -> None:
    """What the engine's maintenance does once segments hold the data: obsolete files go."""
    sealed_end = max(0, len(acked) - KEEP)
    shard.delete_obsolete(lambda _tid, _p, end: end <= sealed_end)


def _settle(shard: WalShard, fs: FaultyFileSystem | OsFileSystem) -> None:
    """Wait until the spare helper has nothing in hand, so that a crash sweep's call count is
    the same run after run."""
    spare = shard._spare
    assert spare is not None
    deadline = time.monotonic() + WAIT_S
    while spare._making or spare._offering or (spare._wanted and not spare.ready):
        if isinstance(fs, FaultyFileSystem) and fs.dead:
            raise SimulatedCrash("crashed while the spare was made")
        assert time.monotonic() < deadline, "the spare helper never settled"
        time.sleep(0.001)


def _run(fs: FaultyFileSystem | OsFileSystem, directory: str, count: int, crash_at: int | None = None) -> tuple[list[int], WalShard]:
    """`count` appends with truncation after each; with `crash_at`, the fs dies at that
    mutating call counted from the start. Returns what was acknowledged and the shard."""
    shard = WalShard(fs, directory, file_bytes=FILE_BYTES, spare=True)
    shard.start(0, [])
    acked: list[int] = []
    if crash_at is not None:
        assert isinstance(fs, FaultyFileSystem)
        fs.crash_after = fs.mutating_calls + crash_at
    try:
        for base in range(count):
            append_one(shard, base, acked)
            _settle(shard, fs)
            _truncate(shard, acked)
    except (SimulatedCrash, EngineFailedError):
        pass
    finally:
        try:
            shard.close()
        except BaseException:  # a dead fs raises SimulatedCrash on close
            pass
    return acked, shard


def _assert_recovered(got: list[int], acked: list[int], context: object) -> None:
    """Every acknowledged frame not yet obsolete, in order, and nothing never submitted."""
    assert got == list(range(got[0], got[0] + len(got))) if got else True, context
    needed = acked[max(0, len(acked) - KEEP) :]
    assert set(needed) <= set(got), (context, needed, got)
    assert not got or got[-1] <= (acked[-1] + 1 if acked else 0), context


def test_obsolete_files_become_the_next_files_and_everything_comes_back(tmp_path: Path) -> None:
    directory = tmp_path / "wal" / "shard-00"
    directory.mkdir(parents=True)
    acked, shard = _run(OsFileSystem(), str(directory), 60)
    assert acked == list(range(60))
    # once files go obsolete, nearly every roll is into one of them: zeros only before that
    assert shard.recycled_rolls >= 5 and shard.spare_rolls - shard.recycled_rolls <= 3, (
        shard.spare_rolls,
        shard.recycled_rolls,
    )
    assert not (directory / WAL_SPARE_NAME).exists()  # not kept past close
    _assert_recovered(recovered_offsets(OsFileSystem(), str(tmp_path / "wal")), acked, "clean close")


def test_a_crash_leaves_old_frames_behind_the_new_and_recovery_cuts_them(tmp_path: Path) -> None:
    """No clean close: the newest (recycled) file still holds its old generation's frames."""
    fs = ExtentFs()
    fs.makedirs("/wal/shard-00")
    shard = WalShard(fs, "/wal/shard-00", file_bytes=FILE_BYTES, spare=True)
    shard.start(0, [])
    acked: list[int] = []
    for base in range(40):
        append_one(shard, base, acked)
        _truncate(shard, acked)
    newest = shard.files()[-1].path
    assert shard.recycled_rolls >= 3
    fs.crash_after = fs.mutating_calls  # dies now: nothing more reaches the durable state
    try:
        shard.close()
    except SimulatedCrash:
        pass
    after = fs.crash()
    rec = recover_wal(after, "/wal")
    _assert_recovered([f.base_offset for f in rec.frames], acked, "crash")
    assert rec.recycled_bytes_cut > 0 and newest in rec.truncated_files
    assert rec.bytes_truncated == 0  # old contents are not counted as torn writes


def test_every_crash_point_across_recycled_rolls_keeps_every_acknowledged_frame() -> None:
    fs = ExtentFs()
    fs.makedirs("/wal/shard-00")
    start = fs.mutating_calls
    acked, shard = _run(fs, "/wal/shard-00", SWEEP_APPENDS)
    calls = fs.mutating_calls - start
    assert acked == list(range(SWEEP_APPENDS)) and shard.recycled_rolls >= 3
    assert calls > 2 * SWEEP_APPENDS  # a write and a datasync per append, plus rolls and recycling
    for k in range(1, calls + 1):
        fs = ExtentFs(seed=k)
        fs.makedirs("/wal/shard-00")
        acked, _shard = _run(fs, "/wal/shard-00", SWEEP_APPENDS, crash_at=k)
        for torn in (False, True):
            rec = recover_wal(fs.crash(torn=torn), "/wal")
            _assert_recovered([f.base_offset for f in rec.frames], acked, (k, torn))


def test_no_recycling_while_space_is_short() -> None:
    """Deleting gives the room back to seals: an obsolete file is kept as the spare only where a
    file of zeros would have been made (the free-space reserve intact)."""
    fs = ExtentFs()
    fs.makedirs("/wal/shard-00")
    reserve = 10 * FILE_BYTES
    fs.space = (reserve + FILE_BYTES - 1, 1 << 30)
    shard = WalShard(fs, "/wal/shard-00", file_bytes=FILE_BYTES, spare=True, spare_keep_free=lambda _total: reserve)
    shard.start(0, [])
    acked: list[int] = []
    try:
        for base in range(30):
            append_one(shard, base, acked)
            _truncate(shard, acked)
        assert shard.recycled_rolls == 0 and shard.spare_rolls == 0
        assert WAL_SPARE_NAME not in fs.listdir("/wal/shard-00")
    finally:
        shard.close()
    _assert_recovered(recovered_offsets(fs, "/wal"), acked, "short")


# ---- recovery of hand-made files ------------------------------------------------------------


def _frames(seqs: range, *, flags: int, group_seq: int | None = None, size: int = 100) -> bytes:
    out = bytearray()
    for seq in seqs:
        g = seq if group_seq is None else group_seq
        for part in encode_frame(seq, g, TID, 0, seq, seq + 1, bytes([seq % 251]) * size, flags):
            out += part
    return bytes(out)


def _shard_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "wal" / "shard-00"
    directory.mkdir(parents=True)
    return directory


def _recover(tmp_path: Path) -> list[int]:
    return [f.base_offset for f in recover_wal(OsFileSystem(), str(tmp_path / "wal")).frames]


def test_old_frames_on_a_frame_boundary_end_the_newest_file(tmp_path: Path) -> None:
    d = _shard_dir(tmp_path)
    old = _frames(range(0, 10), flags=0)
    new = _frames(range(10, 14), flags=FLAG_RECYCLED_FILE)
    (d / wal_file_name(10)).write_bytes(new + old[len(new) :] + bytes(1000))
    assert _recover(tmp_path) == list(range(10, 14))
    assert (d / wal_file_name(10)).stat().st_size == len(new)  # the old contents are cut


def test_old_bytes_off_a_frame_boundary_end_the_newest_file(tmp_path: Path) -> None:
    d = _shard_dir(tmp_path)
    old = _frames(range(0, 10), flags=0, size=150)
    new = _frames(range(10, 14), flags=FLAG_RECYCLED_FILE)  # 176-byte frames: off the old boundaries
    (d / wal_file_name(10)).write_bytes(new + old[len(new) :])
    rec = recover_wal(OsFileSystem(), str(tmp_path / "wal"))
    assert [f.base_offset for f in rec.frames] == list(range(10, 14))
    assert rec.bytes_truncated == 0 and rec.recycled_bytes_cut == len(old) - len(new)


def test_a_recycled_file_nothing_landed_in_is_dropped(tmp_path: Path) -> None:
    d = _shard_dir(tmp_path)
    (d / wal_file_name(10)).write_bytes(_frames(range(10, 15), flags=0))
    (d / wal_file_name(15)).write_bytes(_frames(range(0, 5), flags=0))  # was wal-0; renamed, never written
    assert _recover(tmp_path) == list(range(10, 15))
    assert not (d / wal_file_name(15)).exists()


def test_a_closed_recycled_file_keeps_old_contents_only_when_every_frame_is_there(tmp_path: Path) -> None:
    d = _shard_dir(tmp_path)
    old = _frames(range(0, 20), flags=0)
    first = _frames(range(20, 25), flags=FLAG_RECYCLED_FILE)
    (d / wal_file_name(20)).write_bytes(first + old[len(first) :])  # its trim never reached the disk
    (d / wal_file_name(25)).write_bytes(_frames(range(25, 28), flags=0))
    assert _recover(tmp_path) == list(range(20, 28))
    # one frame short of its successor: a durable frame is missing, so that is corruption
    (d / wal_file_name(25)).rename(d / wal_file_name(26))
    with pytest.raises(CorruptionError):
        recover_wal(OsFileSystem(), str(tmp_path / "wal"))


def test_damage_before_an_intact_later_write_is_still_corruption_behind_old_frames(tmp_path: Path) -> None:
    """A bad frame in a recycled newest file, then old frames, then an intact frame of a later
    group of this generation: that later group was fsynced, so the bad one was durable once."""
    d = _shard_dir(tmp_path)
    good = _frames(range(10, 12), flags=FLAG_RECYCLED_FILE)
    bad = bytearray(_frames(range(12, 13), flags=FLAG_RECYCLED_FILE))
    bad[70] ^= 0xFF  # a payload byte: data CRC mismatch
    stale = _frames(range(0, 3), flags=0)
    later = _frames(range(13, 14), flags=FLAG_RECYCLED_FILE, group_seq=13)
    (d / wal_file_name(10)).write_bytes(good + bytes(bad) + stale + later)
    with pytest.raises(CorruptionError, match="intact later write"):
        recover_wal(OsFileSystem(), str(tmp_path / "wal"))


def test_an_unflagged_file_with_an_older_frame_is_still_corruption(tmp_path: Path) -> None:
    """Files written without recycling keep the strict rule: a frame out of sequence is damage."""
    d = _shard_dir(tmp_path)
    (d / wal_file_name(10)).write_bytes(_frames(range(10, 14), flags=0) + _frames(range(3, 5), flags=0))
    with pytest.raises(CorruptionError, match="expected 14"):
        recover_wal(OsFileSystem(), str(tmp_path / "wal"))


def test_the_helper_makes_zeros_when_no_obsolete_file_is_offered(tmp_path: Path) -> None:
    """Nothing sealed (nothing obsolete): the spare is zeros, as before recycling."""
    directory = _shard_dir(tmp_path)
    shard = WalShard(OsFileSystem(), str(directory), file_bytes=FILE_BYTES, spare=True)
    shard.start(0, [])
    acked: list[int] = []
    try:
        for base in range(20):
            if base % 6 == 5:
                deadline = time.monotonic() + WAIT_S
                while shard._spare is not None and not shard._spare.ready:
                    assert time.monotonic() < deadline
                    time.sleep(0.001)
            append_one(shard, base, acked)
        assert shard.spare_rolls >= 2 and shard.recycled_rolls == 0
    finally:
        shard.close()
    assert _recover(tmp_path) == acked == list(range(20))


def test_a_leftover_recycled_file_is_never_read_and_is_removed_at_start(tmp_path: Path) -> None:
    directory = _shard_dir(tmp_path)
    (directory / WAL_RECYCLED_NAME).write_bytes(_frames(range(0, 5), flags=0))  # a crash while kept
    assert recover_wal(OsFileSystem(), str(tmp_path / "wal")).frames == []
    shard = WalShard(OsFileSystem(), str(directory), file_bytes=FILE_BYTES, spare=True)
    shard.start(0, [])
    try:
        assert not (directory / WAL_RECYCLED_NAME).exists()
    finally:
        shard.close()


def test_a_later_group_behind_an_intact_frame_of_the_torn_group_is_still_found(tmp_path: Path) -> None:
    """Version 1 files too: after a bad frame, an intact frame of the same group may come first;
    the scan goes on past it, and a frame of a later group behind it is corruption (only the
    first intact frame was looked at before)."""
    d = _shard_dir(tmp_path)
    good = _frames(range(10, 12), flags=0)
    bad = bytearray(_frames(range(12, 13), flags=0, group_seq=12))
    bad[70] ^= 0xFF
    same_group = _frames(range(13, 14), flags=0, group_seq=12)
    later = _frames(range(14, 15), flags=0, group_seq=14)
    (d / wal_file_name(10)).write_bytes(good + bytes(bad) + same_group + later)
    with pytest.raises(CorruptionError, match="intact later write"):
        recover_wal(OsFileSystem(), str(tmp_path / "wal"))
    # without the later group it is a torn write of the newest group: cut, nothing lost
    (d / wal_file_name(10)).write_bytes(good + bytes(bad) + same_group)
    assert _recover(tmp_path) == [10, 11]
