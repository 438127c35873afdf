"""The data-directory lock: one loglake process per data directory.

The lock is an exclusive advisory lock (`FileSystem.lock`, flock on a real filesystem) on
``<data_dir>/.loglake.lock``. The holder writes its pid (ASCII decimal and a newline) into the
file so a second process can name it in its error; the pid is informational only, the flock is
what excludes. The file is never deleted (deleting a flocked file would let two processes lock
two different inodes under the same name); on release its content is cleared.
"""

from __future__ import annotations

import os
import posixpath
from types import TracebackType

from loglake.errors import DataDirLockedError
from loglake.fs.base import FileLock, FileSystem

__all__ = ["LOCK_FILE_NAME", "DataDirLock"]

LOCK_FILE_NAME = ".loglake.lock"
#: The pid line is tiny; never read more than this from a lock file.
_MAX_PID_BYTES = 64


class DataDirLock:
    """Exclusive ownership of a data directory. Use as a context manager or acquire/release."""

    def __init__(self, fs: FileSystem, data_dir: str) -> None:
        self._fs = fs
        self._data_dir = data_dir
        self.path = posixpath.join(data_dir, LOCK_FILE_NAME)
        self._lock: FileLock | None = None

    @property
    def held(self) -> bool:
        return self._lock is not None

    def acquire(self) -> None:
        """Take the lock without waiting; DataDirLockedError if another process holds it."""
        if self._lock is not None:
            return
        self._fs.makedirs(self._data_dir)
        try:
            lock = self._fs.lock(self.path)
        except BlockingIOError:
            holder = self._read_holder()
            who = f"pid {holder}" if holder is not None else "pid unknown"
            raise DataDirLockedError(
                f"data directory {self._data_dir} is in use by another loglake process ({who}); "
                "stop it or pick another --data-dir"
            ) from None
        self._lock = lock
        self._write_pid(f"{os.getpid()}\n".encode("ascii"))

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is None:
            return
        try:
            self._write_pid(b"")
        finally:
            lock.release()

    def _write_pid(self, content: bytes) -> None:
        """Best effort: the pid only improves the error message of a competing process."""
        try:
            with self._fs.open(self.path, write=True, create=True) as f:
                f.truncate(0)
                if content:
                    f.pwrite(0, content)
        except OSError:
            pass

    def _read_holder(self) -> int | None:
        try:
            with self._fs.open(self.path) as f:
                raw = f.pread(0, _MAX_PID_BYTES)
        except OSError:
            return None
        text = raw.decode("ascii", errors="replace").strip()
        return int(text) if text.isdigit() else None

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
