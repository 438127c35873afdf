"""WAL frames, group commit, torn tails versus corruption, failure handling."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from loglake.errors import CorruptionError, EngineFailedError, StorageError
from loglake.fs import OsFileSystem
from loglake.fs.faulty import FaultyFileSystem
from loglake.wal import Durability, WalEntry, WalShard, decode_frame, encode_frame, recover_wal
from loglake.wal.frame import FRAME_OVERHEAD, FrameError

TID = bytes(range(16))


def frame_bytes(seq: int = 7, payload: bytes = b"payload-bytes") -> bytes:
    return b"".join(bytes(p) for p in encode_frame(seq, seq, TID, 3, 100, 105, payload))


def test_frame_round_trip() -> None:
    raw = frame_bytes()
    frame = decode_frame(memoryview(raw), 0)
    assert frame is not None
    assert (frame.seq, frame.topic_id, frame.partition, frame.base_offset, frame.end_offset) == (7, TID, 3, 100, 105)
    assert bytes(frame.payload) == b"payload-bytes"
    assert frame.size == len(raw) == FRAME_OVERHEAD + len(b"payload-bytes")


def test_every_bit_flip_of_a_frame_is_detected() -> None:
    raw = frame_bytes()
    for bit in range(len(raw) * 8):
        damaged = bytearray(raw)
        damaged[bit // 8] ^= 1 << (bit % 8)
        try:
            frame = decode_frame(memoryview(bytes(damaged)), 0)
        except FrameError:
            continue
        # A flip that zeroes the whole length prefix reads as the clean end; nothing else may pass.
        assert frame is None and damaged[:8] == bytes(8), f"bit {bit} not detected"


def test_every_prefix_of_a_frame_is_incomplete() -> None:
    raw = frame_bytes()
    for n in range(8, len(raw)):
        with pytest.raises(FrameError):
            decode_frame(memoryview(raw[:n]), 0)
    assert decode_frame(memoryview(raw[:7]), 0) is None  # fewer bytes than a prefix: end of data


def _shard(tmp_path: Path, **kw: int) -> tuple[WalShard, str]:
    directory = str(tmp_path / "wal" / "shard-00")
    os.makedirs(directory)
    shard = WalShard(OsFileSystem(), directory, **kw)
    shard.start(0, [])
    return shard, str(tmp_path / "wal")


def test_group_commit_shares_fsyncs_between_threads(tmp_path: Path) -> None:
    shard, _ = _shard(tmp_path)
    done = threading.Semaphore(0)
    lock = threading.Lock()
    next_offset = [0]

    def producer() -> None:
        for _ in range(200):
            event = threading.Event()
            with lock:
                base = next_offset[0]
                next_offset[0] += 1
                shard.submit(
                    WalEntry(TID, 0, base, base + 1, b"x" * 100, Durability.FSYNC, lambda e, err, ev=event: ev.set())
                )
            event.wait()
        done.release()

    threads = [threading.Thread(target=producer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shard.close()
    assert shard.frames_written == 1600
    # Eight producers waiting on their own acks must have shared fsyncs.
    assert shard.fsyncs < 1600 * 0.8, (shard.fsyncs, shard.groups_written)


def test_torn_tail_is_truncated_and_reported(tmp_path: Path) -> None:
    shard, wal_dir = _shard(tmp_path)
    for i in range(10):
        shard.submit(WalEntry(TID, 0, i, i + 1, b"y" * 1000, Durability.FSYNC, lambda e, err: None))
        shard.sync()
    shard.close()
    path = shard.files()[-1].path
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # the last frame's trailer never reached the disk: a torn write
        f.seek(size - 10)  # (zeros, as the preallocated file had; a file cut short is damage
        f.write(bytes(10))  # instead: test_acked_end.py)
    result = recover_wal(OsFileSystem(), wal_dir)
    assert result.frames_read == 9
    assert result.bytes_truncated > 0
    assert result.truncated_files == [path]
    # Recovering again finds a clean log.
    again = recover_wal(OsFileSystem(), wal_dir)
    assert again.frames_read == 9 and again.bytes_truncated == 0


def test_corruption_in_a_closed_file_is_an_error_naming_file_and_offset(tmp_path: Path) -> None:
    shard, wal_dir = _shard(tmp_path, file_bytes=64 * 1024)
    for i in range(200):  # ~200 KiB: several files
        shard.submit(WalEntry(TID, 0, i, i + 1, b"z" * 1000, Durability.FSYNC, lambda e, err: None))
        shard.sync()
    shard.close()
    files = shard.files()
    assert len(files) >= 3
    with open(files[0].path, "r+b") as f:
        f.seek(3000)
        byte = f.read(1)
        f.seek(3000)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(CorruptionError) as info:
        recover_wal(OsFileSystem(), wal_dir)
    assert info.value.path == files[0].path
    assert 0 < info.value.offset <= 3000


def test_bad_frame_followed_by_a_later_group_is_corruption(tmp_path: Path) -> None:
    shard, wal_dir = _shard(tmp_path)
    for i in range(20):  # one frame per group: sync after each
        shard.submit(WalEntry(TID, 0, i, i + 1, b"w" * 500, Durability.FSYNC, lambda e, err: None))
        shard.sync()
    shard.close()
    path = shard.files()[-1].path
    with open(path, "r+b") as f:
        f.seek(FRAME_OVERHEAD + 500 + 100)  # inside the second frame, in the newest file
        f.write(b"\xff\xff")
    with pytest.raises(CorruptionError, match="intact later write"):
        recover_wal(OsFileSystem(), wal_dir)


def test_write_failure_fails_the_shard_with_a_typed_error() -> None:
    fs = FaultyFileSystem(seed=3)
    fs.makedirs("/wal/shard-00")
    shard = WalShard(fs, "/wal/shard-00", file_bytes=64 * 1024)
    shard.start(0, [])
    errors: list[BaseException | None] = []
    done = threading.Event()

    def cb(entry: WalEntry, err: BaseException | None) -> None:
        errors.append(err)
        done.set()

    fs.fail_after(1, lambda: OSError(errno.ENOSPC, "No space left on device"))
    shard.submit(WalEntry(TID, 0, 0, 1, b"a" * 10, Durability.FSYNC, cb))
    assert done.wait(5)
    assert isinstance(errors[0], StorageError)
    assert "No space left" in str(errors[0])
    with pytest.raises(EngineFailedError):
        shard.submit(WalEntry(TID, 0, 1, 2, b"b", Durability.FSYNC, cb))
    shard.close()
