"""DataDirLock: fail fast across processes, name the holder, release."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loglake.errors import DataDirLockedError
from loglake.fs import OsFileSystem
from loglake.fs.faulty import FaultyFileSystem
from loglake.meta.lock import LOCK_FILE_NAME, DataDirLock

CHILD = textwrap.dedent(
    """
    import sys
    from loglake.errors import DataDirLockedError
    from loglake.fs import OsFileSystem
    from loglake.meta.lock import DataDirLock

    lock = DataDirLock(OsFileSystem(), sys.argv[1])
    try:
        lock.acquire()
    except DataDirLockedError as exc:
        print(exc)
        sys.exit(3)
    lock.release()
    print("acquired")
    """
)


def run_child(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(data_dir)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_second_process_fails_fast_then_succeeds_after_release(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    lock = DataDirLock(OsFileSystem(), str(data_dir))
    lock.acquire()
    try:
        assert (data_dir / LOCK_FILE_NAME).read_text() == f"{os.getpid()}\n"
        busy = run_child(data_dir)
        assert busy.returncode == 3, busy.stderr
        assert busy.stdout.strip() == (
            f"data directory {data_dir} is in use by another loglake process "
            f"(pid {os.getpid()}); stop it or pick another --data-dir"
        )
    finally:
        lock.release()
    assert (data_dir / LOCK_FILE_NAME).read_text() == ""
    free = run_child(data_dir)
    assert free.returncode == 0, free.stderr
    assert free.stdout.strip() == "acquired"


def test_context_manager_os(tmp_path: Path) -> None:
    fs = OsFileSystem()
    with DataDirLock(fs, str(tmp_path)) as held:
        assert held.held
        with pytest.raises(DataDirLockedError, match=f"pid {os.getpid()}"):
            DataDirLock(fs, str(tmp_path)).acquire()
    assert not bool(held.held)
    with DataDirLock(fs, str(tmp_path)):
        pass


def test_in_process_on_faulty_fs() -> None:
    fs = FaultyFileSystem()
    first = DataDirLock(fs, "/data")
    first.acquire()
    first.acquire()  # idempotent for the holder
    assert fs.read_file("/data/.loglake.lock") == f"{os.getpid()}\n".encode()
    second = DataDirLock(fs, "/data")
    with pytest.raises(DataDirLockedError) as ei:
        second.acquire()
    assert str(ei.value) == (
        f"data directory /data is in use by another loglake process (pid {os.getpid()}); "
        "stop it or pick another --data-dir"
    )
    first.release()
    first.release()  # idempotent
    with second:
        assert second.held
    # Another data directory is independent.
    with DataDirLock(fs, "/data"), DataDirLock(fs, "/other"):
        pass


def test_unknown_holder_pid() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/data")
    held = fs.lock("/data/.loglake.lock")  # a holder that never wrote its pid
    try:
        with pytest.raises(DataDirLockedError, match=r"\(pid unknown\)"):
            DataDirLock(fs, "/data").acquire()
    finally:
        held.release()


def test_pid_write_failure_is_best_effort() -> None:
    fs = FaultyFileSystem()
    fs.makedirs("/data")
    fs.set_full(True)
    with DataDirLock(fs, "/data") as lock:
        assert lock.held
    fs.set_full(False)


def test_crash_releases_lock() -> None:
    fs = FaultyFileSystem()
    DataDirLock(fs, "/data").acquire()
    after = fs.crash()
    with DataDirLock(after, "/data"):
        pass
