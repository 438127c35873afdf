"""FaultyFileSystem: durability model, crash points, torn writes, error injection, threads."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash


def write(fs: FaultyFileSystem, path: str, data: bytes, *, sync: bool = True) -> None:
    with fs.open(path, write=True, create=True) as f:
        f.pwrite(0, data)
        if sync:
            f.datasync()


# ---- basic file-system behaviour --------------------------------------------------------------


def test_basic_operations() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/data/a")
    assert fs.is_dir("/data") and fs.is_dir("/data/a/")
    with fs.open("/data/a/f", write=True, create=True) as f:
        assert f.fileno() is None
        f.pwrite(0, b"hello")
        f.pwritev(5, [b" ", bytearray(b"wor"), memoryview(b"ld")])
        assert f.size() == 11
        assert f.pread(0, 100) == b"hello world"
        assert f.pread(6, 3) == b"wor"
        assert f.pread(50, 3) == b""
        f.pwrite(13, b"!")
        assert f.pread(0, 100) == b"hello world\x00\x00!"
        f.truncate(5)
        assert f.pread(0, 100) == b"hello"
        f.allocate(8)
        assert f.pread(0, 100) == b"hello\x00\x00\x00"
        f.allocate(2)  # never shrinks
        assert f.size() == 8
    assert fs.exists("/data/a/f") and not fs.is_dir("/data/a/f")
    assert fs.listdir("/data") == ["a"]
    assert fs.read_file("/data/a/f") == b"hello\x00\x00\x00"
    fs.write_file_atomic("/data/a/g", [b"x", b"y"])
    assert fs.listdir("/data/a") == ["f", "g"]
    fs.rename("/data/a/g", "/data/a/f")
    assert fs.snapshot_tree() == {"/data/a/f": b"xy"}
    fs.unlink("/data/a/f")
    fs.rmdir("/data/a")
    assert fs.listdir("/data") == []
    fs.rmtree("/data")
    assert not fs.exists("/data")


def test_posix_errors() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    with pytest.raises(FileNotFoundError):
        fs.open("/d/missing")
    with pytest.raises(FileNotFoundError):
        fs.open("/nodir/f", write=True, create=True)
    write(fs, "/d/f", b"x")
    with pytest.raises(FileExistsError):
        fs.open("/d/f", write=True, create=True, exclusive=True)
    with pytest.raises(FileNotFoundError):
        fs.listdir("/nope")
    with pytest.raises(NotADirectoryError):
        fs.listdir("/d/f")
    with pytest.raises(FileNotFoundError):
        fs.unlink("/d/missing")
    with pytest.raises(FileNotFoundError):
        fs.rename("/d/missing", "/d/x")
    with pytest.raises(FileNotFoundError):
        fs.rename("/d/f", "/nodir/x")
    with pytest.raises(IsADirectoryError):
        fs.open("/d")
    with pytest.raises(OSError) as ei:
        fs.rmdir("/d")
    assert ei.value.errno == errno.ENOTEMPTY
    with fs.open("/d/f") as ro, pytest.raises(OSError) as ei:
        ro.pwrite(0, b"y")
    assert ei.value.errno == errno.EBADF
    with pytest.raises(FileExistsError):
        fs.makedirs("/d/f/sub")


def test_lock_in_memory() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    lk = fs.lock("/d/.lock")
    assert fs.exists("/d/.lock")
    with pytest.raises(BlockingIOError):
        fs.lock("/d//.lock")
    lk.release()
    lk.release()  # idempotent
    fs.lock("/d/.lock").release()


# ---- durability model -------------------------------------------------------------------------


def test_unsynced_data_lost_synced_kept() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    with fs.open("/d/f", write=True, create=True) as f:
        fs.fsync_dir("/d")
        f.pwrite(0, b"durable")
        f.datasync()
        f.pwrite(7, b"-lost")
        f.truncate(3)
    assert fs.read_file("/d/f") == b"dur"
    assert fs.durable_tree() == {"/d/f": b"durable"}
    after = fs.crash()
    assert after.snapshot_tree() == {"/d/f": b"durable"}
    assert after.crash_after is None and not after.dead


def test_created_file_without_dir_fsync_vanishes() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    write(fs, "/d/f", b"synced data")  # data synced, directory entry never fsynced
    assert fs.crash().snapshot_tree() == {}
    fs2 = FaultyFileSystem()
    fs2.makedirs("/d")
    write(fs2, "/d/f", b"synced data")
    fs2.fsync_dir("/d")
    assert fs2.crash().snapshot_tree() == {"/d/f": b"synced data"}


def test_makedirs_is_durable() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/a/b/c")
    after = fs.crash()
    assert after.is_dir("/a/b/c")


def test_rename_without_dir_fsync_reverts() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    write(fs, "/d/old", b"old")
    write(fs, "/d/tmp", b"new")
    fs.fsync_dir("/d")
    fs.rename("/d/tmp", "/d/old")
    assert fs.snapshot_tree() == {"/d/old": b"new"}
    assert fs.crash().snapshot_tree() == {"/d/old": b"old", "/d/tmp": b"new"}

    fs = FaultyFileSystem()
    fs.makedirs("/d")
    write(fs, "/d/old", b"old")
    write(fs, "/d/tmp", b"new")
    fs.fsync_dir("/d")
    fs.rename("/d/tmp", "/d/old")
    fs.fsync_dir("/d")
    assert fs.crash().snapshot_tree() == {"/d/old": b"new"}


def test_cross_directory_rename_durable_after_dst_fsync() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/a")
    fs.makedirs("/b")
    write(fs, "/a/f", b"x")
    fs.fsync_dir("/a")
    fs.rename("/a/f", "/b/f")
    assert fs.crash().snapshot_tree() == {"/a/f": b"x"}

    fs = FaultyFileSystem()
    fs.makedirs("/a")
    fs.makedirs("/b")
    write(fs, "/a/f", b"x")
    fs.fsync_dir("/a")
    fs.rename("/a/f", "/b/f")
    fs.fsync_dir("/b")
    assert fs.crash().snapshot_tree() == {"/b/f": b"x"}


def test_directory_rename_and_rmdir() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/t/p0")
    write(fs, "/t/p0/seg", b"s")
    fs.fsync_dir("/t/p0")
    fs.rename("/t/p0", "/t/p0.deleted")
    assert fs.snapshot_tree() == {"/t/p0.deleted/seg": b"s"}
    assert fs.crash().snapshot_tree() == {"/t/p0/seg": b"s"}
    fs = FaultyFileSystem()
    fs.makedirs("/t/p0")
    fs.rmdir("/t/p0")
    assert fs.crash().is_dir("/t/p0")


def test_unlink_without_dir_fsync_comes_back() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    write(fs, "/d/f", b"x")
    fs.fsync_dir("/d")
    fs.unlink("/d/f")
    assert fs.crash().snapshot_tree() == {"/d/f": b"x"}
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    write(fs, "/d/f", b"x")
    fs.fsync_dir("/d")
    fs.unlink("/d/f")
    fs.fsync_dir("/d")
    assert fs.crash().snapshot_tree() == {}


def test_open_handle_survives_unlink() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    write(fs, "/d/f", b"abc")
    with fs.open("/d/f") as f:
        fs.unlink("/d/f")
        assert f.pread(0, 3) == b"abc"


# ---- torn writes ------------------------------------------------------------------------------


def _torn_case(seed: int) -> tuple[bytes, list[bytes], bytes]:
    fs = FaultyFileSystem(seed=seed)
    fs.makedirs("/d")
    base = b"B" * 10
    writes = [bytes([65 + i]) * (5 + i) for i in range(6)]
    with fs.open("/d/f", write=True, create=True) as f:
        fs.fsync_dir("/d")
        f.pwrite(0, base)
        f.datasync()
        off = len(base)
        for w in writes:
            f.pwrite(off, w)
            off += len(w)
    return base, writes, fs.crash(torn=True).read_file("/d/f")


def test_torn_write_is_a_prefix_of_pending_writes() -> None:
    seen_lengths: set[int] = set()
    for seed in range(200):
        base, writes, got = _torn_case(seed)
        full = base + b"".join(writes)
        assert got.startswith(base), "synced data must never change"
        assert full.startswith(got), f"seed {seed}: {got!r} is not a prefix"
        seen_lengths.add(len(got))
    # Seeds explore both "nothing landed", "everything landed" and cuts inside a write.
    assert 10 in seen_lengths and 10 + sum(5 + i for i in range(6)) in seen_lengths
    assert len(seen_lengths) > 10


def test_torn_is_reproducible_per_seed() -> None:
    assert _torn_case(7) == _torn_case(7)


def test_torn_does_not_touch_synced_inodes() -> None:
    for seed in range(30):
        fs = FaultyFileSystem(seed=seed)
        fs.makedirs("/d")
        write(fs, "/d/a", b"synced")
        write(fs, "/d/b", b"pending", sync=False)
        fs.fsync_dir("/d")
        after = fs.crash(torn=True).snapshot_tree()
        assert after["/d/a"] == b"synced"
        assert b"pending".startswith(after["/d/b"])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    ops=st.lists(
        st.tuples(st.sampled_from(["w", "t", "s"]), st.integers(0, 40), st.binary(max_size=12)),
        max_size=25,
    ),
)
def test_model_current_and_durable_match_reference(seed: int, ops: list[tuple[str, int, bytes]]) -> None:
    """Against a plain bytearray reference: reads see every op, crash keeps up to the last sync."""
    fs = FaultyFileSystem(seed=seed)
    fs.makedirs("/d")
    ref = bytearray()
    synced = b""
    with fs.open("/d/f", write=True, create=True) as f:
        fs.fsync_dir("/d")
        for kind, pos, data in ops:
            if kind == "w":
                f.pwrite(pos, data)
                if data:
                    ref.extend(bytes(max(0, pos + len(data) - len(ref))))
                    ref[pos : pos + len(data)] = data
            elif kind == "t":
                f.truncate(pos)
                del ref[pos:]
                ref.extend(bytes(pos - len(ref)))
            else:
                f.datasync()
                synced = bytes(ref)
            assert f.pread(0, 1000) == bytes(ref)
    assert fs.crash().read_file("/d/f") == synced


# ---- crash points -----------------------------------------------------------------------------


def _workload(fs: FaultyFileSystem) -> None:
    fs.makedirs("/d")  # 1
    with fs.open("/d/f", write=True, create=True) as f:  # 2
        f.pwrite(0, b"a")  # 3
        f.pwritev(1, [b"b", b"c"])  # 4
        f.truncate(2)  # 5
        f.allocate(8)  # 6
        f.datasync()  # 7
        f.sync()  # 8
    fs.fsync_dir("/d")  # 9
    fs.rename("/d/f", "/d/g")  # 10
    fs.unlink("/d/g")  # 11
    fs.rmdir("/d")  # 12


def test_mutating_call_count() -> None:
    fs = FaultyFileSystem()
    fs.exists("/x")
    _workload(fs)
    assert fs.mutating_calls == 12


@pytest.mark.parametrize("k", range(1, 13))
def test_crash_after_k(k: int) -> None:
    fs = FaultyFileSystem(crash_after=k)
    with pytest.raises(SimulatedCrash):
        _workload(fs)
    assert fs.mutating_calls == k - 1
    assert fs.dead
    # Everything afterwards raises, mutating or not.
    for call in (
        lambda: fs.exists("/d"),
        lambda: fs.listdir("/"),
        lambda: fs.makedirs("/z"),
        lambda: fs.snapshot_tree(),
        lambda: fs.lock("/l"),
    ):
        with pytest.raises(SimulatedCrash):
            call()
    # SimulatedCrash is not an Exception.
    assert not issubclass(SimulatedCrash, Exception)


def test_crash_call_does_not_happen() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    f = fs.open("/d/f", write=True, create=True)
    fs.fsync_dir("/d")
    f.pwrite(0, b"x")
    fs.crash_after = fs.mutating_calls + 1
    with pytest.raises(SimulatedCrash):
        f.datasync()
    with pytest.raises(SimulatedCrash):
        f.pread(0, 1)
    assert fs.durable_tree() == {"/d/f": b""}
    assert fs.crash().read_file("/d/f") == b""


def test_crash_kills_other_threads() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    f = fs.open("/d/f", write=True, create=True)
    fs.crash()
    caught: list[BaseException] = []

    def worker() -> None:
        try:
            f.pwrite(0, b"x")
        except BaseException as exc:
            caught.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert len(caught) == 1 and isinstance(caught[0], SimulatedCrash)


def test_thread_safety_smoke() -> None:
    fs = FaultyFileSystem(seed=1)
    fs.makedirs("/d")
    n_threads, n_writes = 8, 200

    def worker(i: int) -> None:
        with fs.open(f"/d/f{i}", write=True, create=True) as f:
            for j in range(n_writes):
                f.pwrite(j * 4, j.to_bytes(4, "big"))
                if j % 50 == 0:
                    f.datasync()
                    fs.fsync_dir("/d")
            f.datasync()
        fs.fsync_dir("/d")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = b"".join(j.to_bytes(4, "big") for j in range(n_writes))
    after = fs.crash()
    assert after.snapshot_tree() == {f"/d/f{i}": expected for i in range(n_threads)}
    assert fs.mutating_calls == 1 + n_threads * (1 + n_writes + 2 * 4 + 1 + 1)


def test_concurrent_crash_point_stops_all_threads() -> None:
    fs = FaultyFileSystem(crash_after=300)
    fs.makedirs("/d")
    outcomes: list[str] = []

    def worker(i: int) -> None:
        try:
            with fs.open(f"/d/f{i}", write=True, create=True) as f:
                for j in range(1000):
                    f.pwrite(j, b"x")
            outcomes.append("done")
        except SimulatedCrash:
            outcomes.append("crash")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes == ["crash"] * 4
    assert fs.mutating_calls == 299


# ---- error injection --------------------------------------------------------------------------


def test_fail_after_injects_once_without_doing_the_call() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    with fs.open("/d/f", write=True, create=True) as f:
        f.pwrite(0, b"ab")
        fs.fail_after(1)
        with pytest.raises(OSError) as ei:
            f.pwrite(2, b"cd")
        assert ei.value.errno == errno.ENOSPC
        assert f.pread(0, 10) == b"ab"
        f.pwrite(2, b"cd")  # later calls work
        fs.fail_after(2, lambda: OSError(errno.EIO, "injected EIO"))
        f.pwrite(4, b"e")
        with pytest.raises(OSError) as ei:
            f.datasync()
        assert ei.value.errno == errno.EIO
        f.datasync()
        assert f.pread(0, 10) == b"abcde"


def test_fail_after_constructor() -> None:
    fs = FaultyFileSystem(fail_after=2, fail_with=lambda: PermissionError(errno.EACCES, "no"))
    fs.makedirs("/d")
    with pytest.raises(PermissionError):
        fs.open("/d/f", write=True, create=True)
    assert not fs.exists("/d/f")
    fs.open("/d/f", write=True, create=True).close()
    assert fs.exists("/d/f")


def test_set_full() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/d")
    with fs.open("/d/f", write=True, create=True) as f:
        f.pwrite(0, b"abcd")
        fs.set_full(True)
        grows: list[Callable[[], None]] = [
            lambda: f.pwrite(3, b"xy"),
            lambda: f.allocate(10),
            lambda: f.pwritev(4, [b"z"]),
        ]
        for grow in grows:
            with pytest.raises(OSError) as ei:
                grow()
            assert ei.value.errno == errno.ENOSPC
        f.pwrite(0, b"AB")  # overwrite in place does not grow
        f.truncate(2)
        f.datasync()
        fs.set_full(False)
        f.pwrite(2, b"cd")
        assert f.pread(0, 10) == b"ABcd"
