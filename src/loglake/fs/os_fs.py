"""The real filesystem, through os.* calls on file descriptors."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
from collections.abc import Callable, Sequence

from loglake.fs.base import BytesLike, File, FileLock, FileSystem
from loglake.fs.modes import DIR_MODE, FILE_MODE, Narrowed, narrow_tree

#: os.writev accepts at most IOV_MAX buffers per call (1024 on Linux).
IOV_MAX = 1024

# sync_file_range(2) flags (linux/fs.h); the os module does not expose the call.
_SFR_WAIT_BEFORE = 1
_SFR_WRITE = 2
_SFR_WAIT_AFTER = 4


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range through ctypes (which releases the GIL around the call), or None
    where there is none (not Linux): write-behind is then a no-op and datasync does all."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    result: Callable[[int, int, int, int], int] = fn
    return result


_sync_file_range = _load_sync_file_range()


def _writeback(fd: int, offset: int, length: int, flags: int) -> None:
    if _sync_file_range is None or length <= 0:
        return
    if _sync_file_range(fd, offset, length, flags) != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.ESPIPE, errno.EINVAL):
            return  # not supported for this file: the final datasync still does the work
        raise OSError(code, f"sync_file_range: {os.strerror(code)}")


class OsFile(File):
    __slots__ = ("_fd", "path")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd

    def pread(self, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        data = os.pread(self._fd, length, offset)
        if len(data) == length:
            return data
        # Short read: keep reading until EOF or `length` bytes.
        chunks = [data]
        got = len(data)
        while got < length and data:
            data = os.pread(self._fd, length - got, offset + got)
            chunks.append(data)
            got += len(data)
        return b"".join(chunks)

    def pwrite(self, offset: int, data: BytesLike) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, offset)
            view = view[n:]
            offset += n

    def pwritev(self, offset: int, parts: Sequence[BytesLike]) -> None:
        total = sum(len(p) for p in parts)
        if len(parts) <= IOV_MAX and os.pwritev(self._fd, parts, offset) == total:
            return  # the common case: one call wrote everything
        # Short write (or too many buffers): finish what is left, buffer by buffer.
        pending = [memoryview(p) for p in parts if len(p)]
        while pending:
            chunk = pending[:IOV_MAX]
            n = os.pwritev(self._fd, chunk, offset)
            offset += n
            # Drop fully written buffers, trim a partially written one.
            i = 0
            while i < len(chunk) and n >= len(chunk[i]):
                n -= len(chunk[i])
                i += 1
            pending = pending[i:]
            if n:
                pending[0] = pending[0][n:]

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def allocate(self, size: int) -> None:
        current = self.size()
        if size <= current:
            return
        try:
            os.posix_fallocate(self._fd, current, size - current)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.ftruncate(self._fd, size)

    def datasync(self) -> None:
        os.fdatasync(self._fd)

    def start_writeback(self, offset: int, length: int) -> None:
        _writeback(self._fd, offset, length, _SFR_WRITE)

    def wait_writeback(self, offset: int, length: int) -> None:
        _writeback(self._fd, offset, length, _SFR_WAIT_BEFORE | _SFR_WRITE | _SFR_WAIT_AFTER)

    def sync(self) -> None:
        os.fsync(self._fd)

    def fileno(self) -> int | None:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _OsLock(FileLock):
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


class OsFileSystem(FileSystem):
    has_unwritten_extents = True

    def open(self, path: str, *, write: bool = False, create: bool = False, exclusive: bool = False) -> File:
        flags = os.O_CLOEXEC
        flags |= os.O_RDWR if write else os.O_RDONLY
        if create:
            flags |= os.O_CREAT
        if exclusive:
            flags |= os.O_EXCL
        fd = os.open(path, flags, FILE_MODE)
        return OsFile(path, fd)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def makedirs(self, path: str) -> None:
        path = os.path.abspath(path)
        missing: list[str] = []
        probe = path
        while not os.path.isdir(probe):
            missing.append(probe)
            probe = os.path.dirname(probe)
        for d in reversed(missing):
            try:
                os.mkdir(d, DIR_MODE)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise
            self.fsync_dir(os.path.dirname(d))

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def rename_noreplace(self, src: str, dst: str) -> None:
        # link(2) fails with EEXIST when dst exists, atomically, on every local filesystem (and
        # NFS); renameat2's RENAME_NOREPLACE is not in the os module and not on every filesystem.
        # A crash between the two calls leaves src as a second name: a stale temp file.
        os.link(src, dst)
        os.unlink(src)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def make_private(self, path: str) -> Narrowed:
        return narrow_tree(path)

    def disk_space(self, path: str) -> tuple[int, int] | None:
        try:
            st = os.statvfs(path)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    def lock(self, path: str) -> FileLock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise BlockingIOError(errno.EWOULDBLOCK, f"{path} is locked by another process") from None
        return _OsLock(fd)
