"""The filesystem seam.

Every filesystem call the engine makes goes through a `FileSystem`, so tests can run the engine
on a fault-injecting implementation that keeps pending and durable bytes apart and can crash
after any mutating call (see `loglake.fs.faulty`).

Writes are positional (`pwrite`); callers track their own positions. Durability is explicit:
data is durable after `File.datasync()`; a directory entry (create, rename, unlink) is durable
after `FileSystem.fsync_dir()` of its parent directory.

What a filesystem creates is its user's only (`loglake.fs.modes`: files 0600, directories 0700).
"""

from __future__ import annotations

import abc
import os
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from loglake.fs.modes import Narrowed


class Buffer(Protocol):
    def __len__(self) -> int: ...


BytesLike = bytes | bytearray | memoryview

#: `write_file_atomic` writes a file larger than this in chunks of this size and starts each
#: chunk's writeback at once (write-behind), so a big publish (a 64 MiB segment at seal) never
#: leaves tens of MB dirty for its final fdatasync: that flush used to sit in the disk queue in
#: front of the WAL's fdatasyncs and stall acknowledgements for 40-60 ms (docs/DESIGN-NOTES.md).
WRITE_BEHIND_CHUNK_BYTES = 1024 * 1024
#: Chunks of one publish in writeback at once: before starting the next one the writer waits for
#: the oldest, so at most this many chunks of it are ever queued ahead of a WAL fdatasync.
WRITE_BEHIND_CHUNKS_IN_FLIGHT = 2


class File(abc.ABC):
    """An open file. Not thread-safe for concurrent writers; reads may run concurrently."""

    path: str

    @abc.abstractmethod
    def pread(self, offset: int, length: int) -> bytes:
        """Read up to `length` bytes at `offset` (fewer at end of file)."""

    @abc.abstractmethod
    def pwrite(self, offset: int, data: BytesLike) -> None:
        """Write all of `data` at `offset`."""

    def pwritev(self, offset: int, parts: Sequence[BytesLike]) -> None:
        """Write `parts` back to back starting at `offset`."""
        for part in parts:
            self.pwrite(offset, part)
            offset += len(part)

    @abc.abstractmethod
    def size(self) -> int: ...

    @abc.abstractmethod
    def truncate(self, size: int) -> None: ...

    @abc.abstractmethod
    def allocate(self, size: int) -> None:
        """Make the file at least `size` bytes long, zero-filled, with its blocks reserved."""

    @abc.abstractmethod
    def datasync(self) -> None:
        """Make written data (and the size needed to read it) durable."""

    def start_writeback(self, offset: int, length: int) -> None:
        """Hint: start writing this range to the disk now, without waiting. Never a durability
        promise (only `datasync` is); the default does nothing."""
        return None

    def wait_writeback(self, offset: int, length: int) -> None:
        """Hint: wait until this range's writeback (started or not) has reached the disk, so that
        little is left for the final `datasync`. Not a durability promise; the default does nothing."""
        return None

    def fill_zeros(self, offset: int, length: int) -> None:
        """Write `length` zeros at `offset` of a new file being filled from the start, as blocks
        that are *written*, not reserved: on ext4 a later overwrite plus fdatasync then has no
        unwritten extent to convert, so it needs no journal commit (and waits for no other
        file's metadata). Write-behind chunks; the caller datasyncs. A model filesystem may just
        extend the file (same bytes)."""
        zeros = memoryview(bytes(min(length, WRITE_BEHIND_CHUNK_BYTES)))
        full, rest = divmod(length, len(zeros)) if length else (0, 0)
        _write_behind(self, [zeros] * full + ([zeros[:rest]] if rest else []), offset)

    def sync(self) -> None:
        self.datasync()

    def fileno(self) -> int | None:
        """The OS file descriptor, or None when the file is not an OS file (sendfile needs one)."""
        return None

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> File:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FileLock(abc.ABC):
    @abc.abstractmethod
    def release(self) -> None: ...


class FileSystem(abc.ABC):
    #: `File.allocate` reserves blocks that a later write must convert (unwritten extents on
    #: ext4/xfs), which makes each fdatasync after such a write a journal commit. The WAL keeps a
    #: zero-written spare file only where this is true (wal/spare.py); a model filesystem has
    #: nothing to gain, and its call-counting tests see no second thread's calls.
    has_unwritten_extents: bool = False

    @abc.abstractmethod
    def open(self, path: str, *, write: bool = False, create: bool = False, exclusive: bool = False) -> File:
        """Open `path`. `create` makes it if missing (`FILE_MODE`); `exclusive` fails if it exists."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def is_dir(self, path: str) -> bool: ...

    @abc.abstractmethod
    def listdir(self, path: str) -> list[str]:
        """Names in a directory, sorted. Missing directory: FileNotFoundError."""

    @abc.abstractmethod
    def makedirs(self, path: str) -> None:
        """Create a directory and its parents (`DIR_MODE`; no error if it exists); durable on return."""

    @abc.abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Atomically replace `dst` with `src`; durable after fsync_dir of dst's directory."""

    @abc.abstractmethod
    def rename_noreplace(self, src: str, dst: str) -> None:
        """Move `src` to `dst` only if `dst` does not exist, atomically against any other writer
        of `dst` (FileExistsError, and `src` stays, when it does); durable after fsync_dir of
        dst's directory. Of several callers racing for one `dst`, exactly one succeeds."""

    @abc.abstractmethod
    def unlink(self, path: str) -> None: ...

    @abc.abstractmethod
    def rmdir(self, path: str) -> None: ...

    @abc.abstractmethod
    def fsync_dir(self, path: str) -> None: ...

    @abc.abstractmethod
    def lock(self, path: str) -> FileLock:
        """Take an exclusive advisory lock on `path` (created if missing) without waiting.

        Raises BlockingIOError when another holder has it.
        """

    def make_private(self, path: str) -> Narrowed:
        """Take the group's and others' permission bits off `path` and everything under it
        (`loglake.fs.modes.narrow_tree`); what was changed. A filesystem without permissions
        (a model) has nothing to do."""
        return Narrowed()

    def disk_space(self, path: str) -> tuple[int, int] | None:
        """(bytes an unprivileged writer may still use, total bytes) of the filesystem holding
        `path`, or None when that cannot be told. Cheap (one statvfs); the engine's free-space
        reserve (loglake.engine.space) reads it on an interval, never per record."""
        return None

    # ---- conveniences built on the primitives -------------------------------------------------

    def read_file(self, path: str) -> bytes:
        with self.open(path) as f:
            return f.pread(0, f.size())

    def file_size(self, path: str) -> int:
        with self.open(path) as f:
            return f.size()

    def write_file_atomic(
        self, path: str, parts: Sequence[BytesLike], *, tmp: str | None = None, replace: bool = True
    ) -> None:
        """Publish `parts` at `path` crash-atomically: temp → datasync → rename → directory fsync.

        `tmp` (default `<path>.tmp`, removed first if a crash left it) is the temp file's path;
        a caller with concurrent writers of one path gives each its own, which must not exist.
        `replace=False` publishes only if `path` does not exist yet (`rename_noreplace`): else
        FileExistsError, the temp file is left for the caller to remove.
        """
        directory = os.path.dirname(path) or "."
        if tmp is None:
            tmp = f"{path}.tmp"
            if self.exists(tmp):
                self.unlink(tmp)
        with self.open(tmp, write=True, create=True, exclusive=True) as f:
            if sum(len(p) for p in parts) <= WRITE_BEHIND_CHUNK_BYTES:
                f.pwritev(0, parts)
            else:
                _write_behind(f, parts)
            f.datasync()
        if replace:
            self.rename(tmp, path)
        else:
            self.rename_noreplace(tmp, path)
        self.fsync_dir(directory)

    def rmtree(self, path: str) -> None:
        if not self.exists(path):
            return
        for name in self.listdir(path):
            child = os.path.join(path, name)
            if self.is_dir(child):
                self.rmtree(child)
            else:
                self.unlink(child)
        self.rmdir(path)


def _write_behind(f: File, parts: Sequence[BytesLike], start: int = 0) -> None:
    """Write `parts` from offset `start` in chunks of WRITE_BEHIND_CHUNK_BYTES, each chunk's writeback
    started as soon as it is written, with at most WRITE_BEHIND_CHUNKS_IN_FLIGHT chunks in
    writeback: the disk sees a steady stream of small writes instead of one flush of the whole
    file at the end, and the datasync that follows has (almost) nothing left to write."""
    in_flight: deque[tuple[int, int]] = deque()
    offset = start
    chunk: list[BytesLike] = []
    filled = 0

    def flush() -> None:
        nonlocal offset, chunk, filled
        f.pwritev(offset, chunk)
        f.start_writeback(offset, filled)
        in_flight.append((offset, filled))
        if len(in_flight) > WRITE_BEHIND_CHUNKS_IN_FLIGHT:
            f.wait_writeback(*in_flight.popleft())
        offset += filled
        chunk = []
        filled = 0

    for part in parts:
        view = memoryview(part).cast("B")
        while len(view):
            take = min(len(view), WRITE_BEHIND_CHUNK_BYTES - filled)
            chunk.append(view[:take])
            filled += take
            view = view[take:]
            if filled == WRITE_BEHIND_CHUNK_BYTES:
                flush()
    if filled:
        flush()
