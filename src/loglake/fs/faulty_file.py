"""The files and inodes of `loglake.fs.faulty`'s in-memory, fault-injecting filesystem.

An inode keeps what the running process reads (``current``), what survives a crash
(``durable``) and the mutations made since its last sync; `FaultyFile` is an open file over
one, taking the filesystem's lock for every call. The model and the fault rules are in
`loglake.fs.faulty`'s module doc.
"""

from __future__ import annotations

import errno
import posixpath
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from loglake.fs.base import BytesLike, File, FileLock


class SimulatedCrash(BaseException):
    """The simulated process died. A BaseException so `except Exception` does not swallow it."""


ExcFactory = Callable[[], BaseException]


def _enospc() -> BaseException:
    return OSError(errno.ENOSPC, "No space left on device (injected)")


def _eio() -> BaseException:
    return OSError(errno.EIO, "Input/output error (injected)")


@dataclass
class _PathFault:
    fragment: str
    op: str  # "read" | "write" | "sync"
    factory: ExcFactory
    times: int | None  # None: until cleared
    hits: int = 0


# A pending mutation: ("w", offset, data) or ("r", new_size, b"").
_Op = tuple[str, int, bytes]


def _apply(buf: bytearray, op: _Op) -> None:
    kind, pos, data = op
    if kind == "w":
        end = pos + len(data)
        if pos > len(buf):
            buf.extend(bytes(pos - len(buf)))
        if end > len(buf):
            buf.extend(bytes(end - len(buf)))
        buf[pos:end] = data
    else:
        if pos < len(buf):
            del buf[pos:]
        else:
            buf.extend(bytes(pos - len(buf)))


@dataclass(eq=False)
class _Inode:
    ino: int
    current: bytearray = field(default_factory=bytearray)
    durable: bytearray = field(default_factory=bytearray)
    pending: list[_Op] = field(default_factory=list)
    # Directory entries this inode was renamed away from, not yet made durable.
    moved_from: list[tuple[_Dir, str]] = field(default_factory=list)

    def mutate(self, op: _Op) -> None:
        _apply(self.current, op)
        self.pending.append(op)

    def sync(self) -> None:
        for op in self.pending:
            _apply(self.durable, op)
        self.pending.clear()


@dataclass(eq=False)
class _Dir:
    ino: int
    current: dict[str, _Node] = field(default_factory=dict)
    durable: dict[str, _Node] = field(default_factory=dict)
    moved_from: list[tuple[_Dir, str]] = field(default_factory=list)


_Node = _Inode | _Dir


def _split(path: str) -> list[str]:
    norm = posixpath.normpath(path)
    return [p for p in norm.split("/") if p not in ("", ".", "..")]


def _display(parts: Sequence[str]) -> str:
    return "/" + "/".join(parts)


class FaultyFileSystemCore(Protocol):
    """What a file and a lock use of their filesystem: `loglake.fs.faulty.FaultyFileSystem` (which
    imports this module): its lock, its held file locks, its disk-full flag and fault hooks."""

    @property
    def _mu(self) -> threading.RLock: ...
    @property
    def _locks(self) -> set[str]: ...
    @property
    def _full(self) -> bool: ...
    def _check_alive(self) -> None: ...
    def _mutating(self) -> None: ...
    def _path_fault(self, op: str, path: str) -> None: ...


class _Lock(FileLock):
    def __init__(self, fs: FaultyFileSystemCore, key: str) -> None:
        self._fs = fs
        self._key: str | None = key

    def release(self) -> None:
        with self._fs._mu:
            self._fs._check_alive()
            if self._key is not None:
                self._fs._locks.discard(self._key)
                self._key = None


class FaultyFile(File):
    """An open file of a `FaultyFileSystem`; shares the filesystem's lock."""

    def __init__(self, fs: FaultyFileSystemCore, path: str, inode: _Inode, writable: bool) -> None:
        self.path = path
        self._fs = fs
        self._inode = inode
        self._writable = writable
        self._closed = False

    def _usable(self, *, write: bool) -> None:
        if self._closed:
            raise ValueError(f"I/O operation on closed file {self.path}")
        if write and not self._writable:
            raise OSError(errno.EBADF, f"{self.path} is not open for writing")

    def pread(self, offset: int, length: int) -> bytes:
        with self._fs._mu:
            self._fs._check_alive()
            self._usable(write=False)
            if offset < 0:
                raise OSError(errno.EINVAL, "negative offset")
            self._fs._path_fault("read", self.path)
            if length <= 0:
                return b""
            return bytes(self._inode.current[offset : offset + length])

    def _write(self, offset: int, data: bytes) -> None:
        with self._fs._mu:
            self._fs._check_alive()
            self._usable(write=True)
            if offset < 0:
                raise OSError(errno.EINVAL, "negative offset")
            self._fs._mutating()
            self._fs._path_fault("write", self.path)
            if self._fs._full and offset + len(data) > len(self._inode.current):
                raise _enospc()
            if data:
                self._inode.mutate(("w", offset, data))

    def pwrite(self, offset: int, data: BytesLike) -> None:
        self._write(offset, bytes(data))

    def pwritev(self, offset: int, parts: Sequence[BytesLike]) -> None:
        self._write(offset, b"".join(bytes(p) for p in parts))

    def size(self) -> int:
        with self._fs._mu:
            self._fs._check_alive()
            self._usable(write=False)
            return len(self._inode.current)

    def truncate(self, size: int) -> None:
        self._resize(size, shrink=True)

    def allocate(self, size: int) -> None:
        self._resize(size, shrink=False)

    def fill_zeros(self, offset: int, length: int) -> None:
        # The model has no unwritten extents: zeros are zeros, one mutation (not one per MiB).
        self._resize(offset + length, shrink=False)

    def _resize(self, size: int, *, shrink: bool) -> None:
        with self._fs._mu:
            self._fs._check_alive()
            self._usable(write=True)
            if size < 0:
                raise OSError(errno.EINVAL, "negative size")
            self._fs._mutating()
            cur = len(self._inode.current)
            if self._fs._full and size > cur:
                raise _enospc()
            if size > cur or (shrink and size < cur):
                self._inode.mutate(("r", size, b""))

    def datasync(self) -> None:
        with self._fs._mu:
            self._fs._check_alive()
            self._usable(write=False)
            self._fs._mutating()
            self._fs._path_fault("sync", self.path)
            self._inode.sync()

    def sync(self) -> None:
        self.datasync()

    def fileno(self) -> int | None:
        return None

    def close(self) -> None:
        with self._fs._mu:
            self._fs._check_alive()
            self._closed = True
