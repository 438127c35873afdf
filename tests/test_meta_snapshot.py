"""SnapshotStore: format, round trip, retention, corruption fallback, crash-point sweep."""

from __future__ import annotations

import logging
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from loglake.errors import CorruptionError
from loglake.fs import FileSystem, OsFileSystem
from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash
from loglake.meta.snapshot import (
    HEADER,
    MAX_PAYLOAD_BYTES,
    SnapshotStore,
    decode_snapshot,
    encode_snapshot,
    snapshot_name,
)

D = "/data/meta"


def snapshots(fs: FileSystem, d: str = D) -> list[str]:
    return [n for n in fs.listdir(d) if n.startswith("snapshot-")]


def flip_bit(fs: FileSystem, path: str, bit: int) -> None:
    with fs.open(path, write=True) as f:
        byte = f.pread(bit // 8, 1)[0]
        f.pwrite(bit // 8, bytes([byte ^ (1 << (bit % 8))]))


# ---- format ---------------------------------------------------------------------------------


def test_encode_layout() -> None:
    data = encode_snapshot(7, {"b": 1, "a": "é"})
    magic, version, flags, seq, length, _crc = HEADER.unpack_from(data)
    assert (magic, version, flags, seq) == (b"LLMS", 1, 0, 7)
    assert HEADER.size == 24
    assert data[24:] == '{"a":"é","b":1}'.encode()
    assert length == len(data) - 24
    assert decode_snapshot(data, path="x", expected_seq=7) == (7, {"a": "é", "b": 1})
    assert snapshot_name(7) == "snapshot-00000000000000000007.bin"


def test_every_single_bit_flip_is_detected() -> None:
    data = encode_snapshot(3, {"topics": {"t": {"partitions": 3, "id": "abc"}}, "epoch": 9})
    for bit in range(len(data) * 8):
        bad = bytearray(data)
        bad[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptionError):
            decode_snapshot(bytes(bad), path="f", expected_seq=3)


def test_truncations_and_bad_lengths_are_detected() -> None:
    data = encode_snapshot(1, {"k": "v"})
    for n in range(len(data)):
        with pytest.raises(CorruptionError):
            decode_snapshot(data[:n], path="f")
    with pytest.raises(CorruptionError):
        decode_snapshot(data + b"\x00", path="f")
    huge = data[:16] + struct.pack(">I", 0xFFFFFFFF) + data[20:]
    with pytest.raises(CorruptionError) as ei:
        decode_snapshot(huge, path="f")
    assert ei.value.offset == 16 and str(MAX_PAYLOAD_BYTES) in ei.value.detail


def test_seq_must_match_file_name() -> None:
    with pytest.raises(CorruptionError, match="does not match"):
        decode_snapshot(encode_snapshot(4, {}), path="f", expected_seq=5)


def test_non_object_payload_rejected_by_crc_valid_file() -> None:
    body = b"[1,2]"
    covered = HEADER.pack(b"LLMS", 1, 0, 1, len(body), 0)[:20]
    import crc32c

    data = covered + struct.pack(">I", crc32c.crc32c(body, crc32c.crc32c(covered))) + body
    with pytest.raises(CorruptionError, match="not an object"):
        decode_snapshot(data, path="f")


# ---- store ----------------------------------------------------------------------------------


def test_round_trip_and_retention_faulty() -> None:
    fs = FaultyFileSystem()
    store = SnapshotStore(fs, D)
    assert store.load() is None
    for i in range(1, 6):
        assert store.write({"n": i, "nested": {"x": [i]}}) == i
        assert snapshots(fs) == [snapshot_name(s) for s in range(max(1, i - 1), i + 1)]
    assert store.load() == (5, {"n": 5, "nested": {"x": [5]}})
    fresh = SnapshotStore(fs, D)
    assert fresh.load() == (5, {"n": 5, "nested": {"x": [5]}})
    assert fresh.write({"n": 6}) == 6
    assert snapshots(fs) == [snapshot_name(5), snapshot_name(6)]
    # A store that writes without loading first continues the numbering too.
    blind = SnapshotStore(fs, D)
    assert blind.write({"n": 7}) == 7
    assert snapshots(fs) == [snapshot_name(6), snapshot_name(7)]


def test_round_trip_os(tmp_path: Path) -> None:
    fs = OsFileSystem()
    d = str(tmp_path / "meta")
    store = SnapshotStore(fs, d)
    assert store.load() is None
    store.write({"a": 1})
    store.write({"a": 2})
    store.write({"a": 3})
    assert SnapshotStore(fs, d).load() == (3, {"a": 3})
    assert sorted(p.name for p in (tmp_path / "meta").iterdir()) == [snapshot_name(2), snapshot_name(3)]


def test_leftover_tmp_files_are_deleted() -> None:
    fs = FaultyFileSystem()
    store = SnapshotStore(fs, D)
    store.write({"a": 1})
    fs.write_file_atomic(f"{D}/junk", [b"x"])
    fs.rename(f"{D}/junk", f"{D}/{snapshot_name(2)}.tmp")
    assert store.load() == (1, {"a": 1})
    assert fs.listdir(D) == [snapshot_name(1)]


def test_corrupt_newest_falls_back_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    fs = FaultyFileSystem()
    store = SnapshotStore(fs, D)
    store.write({"v": 1})
    store.write({"v": 2})
    newest = f"{D}/{snapshot_name(2)}"
    flip_bit(fs, newest, 8 * 30 + 3)
    with caplog.at_level(logging.WARNING, logger="loglake.meta.snapshot"):
        assert SnapshotStore(fs, D).load() == (1, {"v": 1})
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert newest in msg and "byte 20" in msg
    # The next write supersedes the corrupt one and keeps the good previous snapshot.
    store2 = SnapshotStore(fs, D)
    store2.load()
    assert store2.write({"v": 3}) == 3
    assert snapshots(fs) == [snapshot_name(1), snapshot_name(3)]
    assert SnapshotStore(fs, D).load() == (3, {"v": 3})


def test_all_corrupt_raises() -> None:
    fs = FaultyFileSystem()
    store = SnapshotStore(fs, D)
    store.write({"v": 1})
    store.write({"v": 2})
    flip_bit(fs, f"{D}/{snapshot_name(1)}", 0)
    with fs.open(f"{D}/{snapshot_name(2)}", write=True) as f:
        f.truncate(10)
    with pytest.raises(CorruptionError) as ei:
        SnapshotStore(fs, D).load()
    assert ei.value.path == f"{D}/{snapshot_name(2)}"
    assert "all 2 snapshots" in str(ei.value)


def test_every_bit_flip_of_newest_file_falls_back() -> None:
    fs = FaultyFileSystem()
    store = SnapshotStore(fs, D)
    store.write({"v": 1})
    store.write({"v": 2, "s": "abc"})
    path = f"{D}/{snapshot_name(2)}"
    size = fs.file_size(path)
    for bit in range(size * 8):
        flip_bit(fs, path, bit)
        assert SnapshotStore(fs, D).load() == (1, {"v": 1}), bit
        flip_bit(fs, path, bit)
    assert SnapshotStore(fs, D).load() == (2, {"v": 2, "s": "abc"})


def test_concurrent_writers_get_distinct_seqs() -> None:
    fs = FaultyFileSystem()
    store = SnapshotStore(fs, D)
    got: list[int] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        for j in range(10):
            seq = store.write({"w": i, "j": j})
            with lock:
                got.append(seq)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 41))
    assert snapshots(fs) == [snapshot_name(39), snapshot_name(40)]
    loaded = SnapshotStore(fs, D).load()
    assert loaded is not None and loaded[0] == 40


# ---- crash-point sweep ----------------------------------------------------------------------

PAYLOADS: list[dict[str, Any]] = [{"gen": i, "data": "x" * (10 * i)} for i in (1, 2, 3)]


def _workload(fs: FaultyFileSystem, returned: list[int]) -> None:
    store = SnapshotStore(fs, D)
    for i, p in enumerate(PAYLOADS):
        store.write(p)
        returned.append(i)


def test_crash_sweep() -> None:
    probe = FaultyFileSystem()
    _workload(probe, [])
    total = probe.mutating_calls
    assert total > 10
    for k in range(1, total + 2):
        for torn in (False, True):
            for seed in (0, 1, 2):
                fs = FaultyFileSystem(seed=seed, crash_after=k)
                returned: list[int] = []
                try:
                    _workload(fs, returned)
                except SimulatedCrash:
                    pass
                after = fs.crash(torn=torn)
                loaded = SnapshotStore(after, D).load()
                floor = returned[-1] if returned else -1
                allowed: list[tuple[int, dict[str, Any]] | None] = [None] if floor < 0 else []
                allowed += [(i + 1, PAYLOADS[i]) for i in range(max(floor, 0), len(PAYLOADS))]
                assert loaded in allowed, (k, torn, seed, loaded, returned)
                # Recovery can continue: the next write wins.
                store = SnapshotStore(after, D)
                store.load()
                seq = store.write({"after": k})
                assert SnapshotStore(after, D).load() == (seq, {"after": k})
                assert len(snapshots(after)) <= 2
