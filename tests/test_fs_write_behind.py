"""`write_file_atomic` of files larger than one write-behind chunk (issue 12: a seal's segment
write must not leave tens of MB for its final fdatasync, in front of the WAL's fdatasyncs).

The chunked path must publish the same bytes as one big write, keep the crash-atomic promise at
every crash point, and on the real filesystem actually start and wait for writeback chunk by
chunk (never more than WRITE_BEHIND_CHUNKS_IN_FLIGHT chunks in writeback at once).
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from loglake.fs import base
from loglake.fs.base import WRITE_BEHIND_CHUNK_BYTES, WRITE_BEHIND_CHUNKS_IN_FLIGHT, BytesLike, File
from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash
from loglake.fs.os_fs import OsFile, OsFileSystem

CHUNK = WRITE_BEHIND_CHUNK_BYTES


def _parts(total: int, seed: int) -> list[BytesLike]:
    """Random data cut at random places (parts cross chunk bounds, some are empty), of mixed types."""
    rng = random.Random(seed)
    data = rng.randbytes(total)
    cuts = sorted({0, total, *(rng.randrange(total) for _ in range(7))})
    parts: list[BytesLike] = []
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        piece = data[a:b]
        parts.append((bytes, bytearray, memoryview)[i % 3](piece))
    parts.insert(1, b"")
    return parts


@pytest.mark.parametrize(
    "total", [CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 5 * CHUNK + 12_345], ids=lambda n: f"{n}B"
)
def test_chunked_publish_writes_the_same_bytes(tmp_path: Path, total: int) -> None:
    parts = _parts(total, total)
    path = str(tmp_path / "obj")
    OsFileSystem().write_file_atomic(path, parts)
    assert Path(path).read_bytes() == b"".join(bytes(p) for p in parts)
    assert sorted(os.listdir(tmp_path)) == ["obj"]  # no temp file left


class _Recording(OsFile):
    """A real OS file that notes the writeback calls (and still makes them)."""

    calls: list[tuple[str, int, int]]

    def start_writeback(self, offset: int, length: int) -> None:
        self.calls.append(("start", offset, length))
        super().start_writeback(offset, length)

    def wait_writeback(self, offset: int, length: int) -> None:
        self.calls.append(("wait", offset, length))
        super().wait_writeback(offset, length)


class _RecordingFs(OsFileSystem):
    def __init__(self) -> None:
        self.files: list[_Recording] = []

    def open(self, path: str, *, write: bool = False, create: bool = False, exclusive: bool = False) -> File:
        with super().open(path, write=write, create=create, exclusive=exclusive) as f:
            fd = f.fileno()
            assert fd is not None
            rec = _Recording(f.path, os.dup(fd))
        rec.calls = []
        self.files.append(rec)
        return rec


def test_writeback_is_started_per_chunk_with_a_bounded_window(tmp_path: Path) -> None:
    total = 6 * CHUNK + 100
    fs = _RecordingFs()
    fs.write_file_atomic(str(tmp_path / "seg"), _parts(total, 1))
    (f,) = fs.files
    starts = [(off, n) for what, off, n in f.calls if what == "start"]
    # every byte's writeback is started once, in order, a chunk at a time
    assert starts == [(i * CHUNK, min(CHUNK, total - i * CHUNK)) for i in range(7)]
    # the oldest chunk is waited for whenever more than the window is in writeback
    in_flight = 0
    for what, _off, _n in f.calls:
        in_flight += 1 if what == "start" else -1
        assert in_flight <= WRITE_BEHIND_CHUNKS_IN_FLIGHT + 1
        if what == "wait":
            assert in_flight == WRITE_BEHIND_CHUNKS_IN_FLIGHT
    waits = [(off, n) for what, off, n in f.calls if what == "wait"]
    assert waits == starts[: len(starts) - WRITE_BEHIND_CHUNKS_IN_FLIGHT]
    assert (tmp_path / "seg").read_bytes() == b"".join(bytes(p) for p in _parts(total, 1))


def test_small_publish_is_one_write(tmp_path: Path) -> None:
    fs = _RecordingFs()
    fs.write_file_atomic(str(tmp_path / "small"), [b"x" * 100, b"y"])
    (f,) = fs.files
    assert f.calls == []
    assert (tmp_path / "small").read_bytes() == b"x" * 100 + b"y"


def test_writeback_hints_on_a_real_file(tmp_path: Path) -> None:
    """The hints work on the OS (sync_file_range) and are harmless on odd ranges."""
    with OsFileSystem().open(str(tmp_path / "f"), write=True, create=True) as f:
        f.pwrite(0, b"z" * 10_000)
        f.start_writeback(0, 10_000)
        f.wait_writeback(0, 10_000)
        f.start_writeback(5_000, 0)  # nothing to do
        f.wait_writeback(50_000, 4096)  # past the end
        f.datasync()
        assert f.pread(0, 10) == b"z" * 10


def _publish_sweep_case(k: int, total: int, torn: bool) -> None:
    fs = FaultyFileSystem(crash_after=k, seed=k)
    fs.makedirs("/store/t")
    fs.write_file_atomic("/store/t/obj", [b"old"])
    parts = _parts(total, 7)
    try:
        fs.write_file_atomic("/store/t/obj", parts)
    except SimulatedCrash:
        pass
    after = fs.crash(torn=torn)
    got = after.read_file("/store/t/obj")
    # crash-atomic at every point: the old object or the whole new one, never a mix
    assert got in (b"old", b"".join(bytes(p) for p in parts))


def test_chunked_publish_is_crash_atomic_at_every_point() -> None:
    total = 3 * CHUNK + 17
    probe = FaultyFileSystem()
    probe.makedirs("/store/t")
    probe.write_file_atomic("/store/t/obj", [b"old"])
    before = probe.mutating_calls
    probe.write_file_atomic("/store/t/obj", _parts(total, 7))
    calls = probe.mutating_calls - before
    assert calls >= 4 + 3  # create, 4 chunk writes, datasync, rename, dir fsync
    for k in range(before + 1, probe.mutating_calls + 2):
        for torn in (False, True):
            _publish_sweep_case(k, total, torn)


def test_hints_default_to_nothing() -> None:
    """A File that knows no writeback (the fault-injecting one, other platforms) still publishes:
    the hints do nothing and the final datasync carries the durability."""

    class Plain(base.File):
        path = "p"

        def __init__(self) -> None:
            self.data = bytearray()

        def pread(self, offset: int, length: int) -> bytes:
            return bytes(self.data[offset : offset + length])

        def pwrite(self, offset: int, data: BytesLike) -> None:
            self.data[offset : offset + len(data)] = bytes(data)

        def size(self) -> int:
            return len(self.data)

        def truncate(self, size: int) -> None:
            del self.data[size:]

        def allocate(self, size: int) -> None:
            self.data.extend(bytes(max(0, size - len(self.data))))

        def datasync(self) -> None:
            pass

        def close(self) -> None:
            pass

    f = Plain()
    parts: Sequence[BytesLike] = _parts(2 * CHUNK + 5, 3)
    base._write_behind(f, parts)
    assert bytes(f.data) == b"".join(bytes(p) for p in parts)
