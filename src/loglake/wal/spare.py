"""A WAL shard's spare file: the next WAL file, zeros actually written, made off the writer's path.

Why (issue 12, docs/DESIGN-NOTES.md): on ext4 a file made with fallocate has *unwritten*
extents; the first write into each block must convert it, so every WAL fdatasync after such a
write is a journal commit, and a journal commit waits behind whatever metadata other files have
pending (a seal's segment, a truncation's unlink). Measured on the development VM while 64 MiB
files were written beside it: fdatasync of 64 KiB appends p50 1.9-2.3 ms, p99 17-22 ms into a
fallocated file; p50 0.3-0.75 ms, p99 7.5-8.3 ms into a zero-written one.

A helper thread writes `spare.wal` full of zeros (write-behind chunks, then one datasync) when the
shard asks, which it does once its active file is half full (SPARE_REQUEST_FILL): an engine opened
for a few appends, a CLI command, a test, never pays for 64 MiB of zeros. At a roll the writer
renames the spare to `wal-<seq>.log` and fsyncs the directory —
no allocation and no data sync on the writer thread. Recovery never reads the name (it is not
`wal-*.log`), a leftover one (a crash while it was made) is removed before the next is made, and
close removes it: its contents are only trusted while this process made them. The cost is one
more `file_bytes` of disk per shard, and each WAL byte written twice to disk (zeros, then frames)
but the zeros off the acknowledgement path. Where the helper cannot make one (a full disk) the
writer allocates its own file as before; nor does it make one that would take the filesystem below
the free-space reserve (`keep_free`, the engine's SpaceGuard), so a spare never is the reason
produce is refused for lack of space.

Recycling (issue 12: fewer writes per byte). Zeros are a second full write of every WAL byte, and
they compete with the WAL's fdatasyncs for the disk. So when the shard deletes obsolete WAL files
it offers one of them first (`offer`, which never waits): it is renamed to `recycled.wal`, kept
beside a ready zero spare (or one being made) if there is one (at most one of each: two files of
disk per shard at most), and used as a next file as it is — blocks already written, no zeros, no
data sync. Files are not trimmed at their roll when the shard keeps spares, so they are recycled
at their full size (`file_bytes`; others are deleted). The helper writes zeros only when a roll
comes near and neither is ready. The old frames stay behind the new ones; every frame written
into a recycled file carries FLAG_RECYCLED_FILE, which tells recovery where that file's frames
end (loglake.wal.recovery, docs/FORMAT.md). Only files of the shard's own sequence are offered
(its files since recovery, never a leftover), so every old frame has a lower seq than anything
written into the file now.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from loglake.fs.base import File, FileSystem

__all__ = ["WAL_RECYCLED_NAME", "WAL_SPARE_NAME", "SpareFile"]

log = logging.getLogger(__name__)

#: The spare's name in the shard directory: never read by recovery.
WAL_SPARE_NAME = "spare.wal"
#: A recycled WAL file's name while it waits to be the next file: never read by recovery.
WAL_RECYCLED_NAME = "recycled.wal"
#: The shard asks for a spare once its active file is this full: late enough that short-lived
#: engines make none, early enough that the zeros are written before the roll at any rate the
#: disk can take (the other half of the file is written meanwhile).
SPARE_REQUEST_FILL = 0.5
#: Zeros are written in steps of this size, checking between steps whether the shard is closing,
#: so close() never waits for a whole file of zeros.
SPARE_STEP_BYTES = 8 * 1024 * 1024


class SpareFile:
    """At most two spares per shard (the bound): one of zeros, made by one helper thread on
    request, and one recycled WAL file, offered by truncation."""

    def __init__(
        self, fs: FileSystem, directory: str, file_bytes: int, keep_free: Callable[[int], int] | None = None
    ) -> None:
        self.fs = fs
        #: bytes to leave free given the filesystem's total (None: only a full disk stops a spare)
        self._keep_free = keep_free
        self.skipped_for_space = 0
        self.directory = directory
        self.file_bytes = file_bytes
        self.path = os.path.join(directory, WAL_SPARE_NAME)
        self.recycled_path = os.path.join(directory, WAL_RECYCLED_NAME)
        self._cond = threading.Condition()
        self._zeros: File | None = None  # zero-written and datasynced, at `path`
        self._recycled: File | None = None  # an obsolete WAL file, at `recycled_path`
        self._making = False  # the helper is writing zeros
        self._offering = False  # an offer is making a recycled one
        self._wanted = False  # the shard asked for one (request())
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.used = 0  # rolls that renamed a spare into place
        self.recycled = 0  # of those, rolls into a recycled WAL file

    def start(self) -> None:
        if self.fs.exists(self.recycled_path):
            self.fs.unlink(self.recycled_path)  # left by a crash: contents unknown
        self._thread = threading.Thread(
            target=self._run, name=f"wal-spare-{os.path.basename(self.directory)}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cond:
            zeros, recycled = self._zeros, self._recycled
            self._zeros = self._recycled = None
        self._discard(zeros, self.path)
        self._discard(recycled, self.recycled_path)

    @property
    def ready(self) -> bool:
        return self._zeros is not None or self._recycled is not None

    def request(self) -> None:
        """Make a spare if none is ready (the writer calls this once per active file)."""
        with self._cond:
            self._wanted = True
            self._cond.notify_all()

    def take(self, path: str) -> tuple[File, bool] | None:
        """The writer, rolling: rename a ready spare to `path` and make the name durable. Zeros
        go first (a recycled file kept for the next roll spares the helper its zeros). Returns
        it and whether it is a recycled WAL file (its frames must then be flagged); None when
        none is ready. The helper removes whatever has the spare's name before it writes zeros,
        so never while this rename is pending."""
        with self._cond:
            f = self._zeros
            recycled = f is None
            if recycled:
                f = self._recycled
                self._recycled = None
            else:
                self._zeros = None
            self._wanted = False
        if f is None:
            return None
        try:
            self.fs.rename(f.path, path)
            self.fs.fsync_dir(self.directory)
        except BaseException:
            f.close()
            raise
        f.path = path
        self.used += 1
        self.recycled += recycled
        return f, recycled

    def offer(self, path: str) -> bool:
        """Keep the obsolete WAL file at `path` as a spare. False (the caller deletes it) when a
        recycled one is kept already, the file is not `file_bytes` long,
        space is short, or the shard is closing; True when the file was taken (kept, or removed
        if it could not be made a spare). The caller fsyncs the directory."""
        with self._cond:
            if self._stopping or self._recycled is not None or self._offering:
                return False
            self._offering = True
        f: File | None = None
        try:
            if not self._room():
                # short of space (the same test as for zeros): deleting it gives the room back
                self._done(None, recycled=True)
                return False
            try:
                if self.fs.file_size(path) != self.file_bytes:
                    # trimmed (a previous process's file) or grown for a big group: not as is
                    self._done(None, recycled=True)
                    return False
                self.fs.rename(path, self.recycled_path)
            except OSError as exc:
                log.debug("WAL %s: %s not recycled (%s)", self.directory, path, exc)
                self._done(None, recycled=True)
                return False
            f = self.fs.open(self.recycled_path, write=True)
        except BaseException as exc:  # no spare; the writer allocates its next file
            log.debug("WAL %s: recycling %s failed (%s); the next roll allocates its own", self.directory, path, exc)
            self._discard(f, self.recycled_path)
            self._done(None, recycled=True)
            return True
        self._done(f, recycled=True)
        return True

    def _done(self, f: File | None, *, recycled: bool) -> None:
        """The end of making one: it is kept as a spare unless the shard is closing."""
        with self._cond:
            if recycled:
                self._offering = False
            else:
                self._making = False
            self._cond.notify_all()
            keep = f is not None and not self._stopping
            if keep and recycled:
                self._recycled = f
            elif keep:
                self._zeros = f
        if f is not None and not keep:
            self._discard(f, self.recycled_path if recycled else self.path)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (not self._wanted or self.ready or self._offering):
                    self._cond.wait()
                if self._stopping:
                    return
                self._wanted = False
                self._making = True
            f: File | None = None
            try:
                if not self._room():
                    self.skipped_for_space += 1
                    self._done(None, recycled=False)
                    continue
                if self.fs.exists(self.path):
                    self.fs.unlink(self.path)  # left by a crash or a failed try: contents unknown
                f = self.fs.open(self.path, write=True, create=True, exclusive=True)
                for offset in range(0, self.file_bytes, SPARE_STEP_BYTES):
                    if self._is_stopping():
                        raise InterruptedError("the shard is closing")
                    f.fill_zeros(offset, min(SPARE_STEP_BYTES, self.file_bytes - offset))
                f.datasync()
            except BaseException as exc:  # a full disk (or a simulated crash in tests): no spare
                # The writer allocates its next file itself; the roll after that asks again.
                log.debug("WAL %s: no spare file (%s); the next roll allocates its own", self.directory, exc)
                self._discard(f, self.path)
                self._done(None, recycled=False)
                continue
            self._done(f, recycled=False)
            if self._is_stopping():
                return

    def _room(self) -> bool:
        """Free space for a spare that leaves the reserve intact (True when it cannot be told)."""
        if self._keep_free is None:
            return True
        space = self.fs.disk_space(self.directory)
        if space is None:
            return True
        available, total = space
        return available - self.file_bytes >= self._keep_free(total)

    def _is_stopping(self) -> bool:
        return self._stopping

    def _discard(self, f: File | None, path: str) -> None:
        try:
            if f is not None:
                f.close()
            if self.fs.exists(path):
                self.fs.unlink(path)
        except BaseException as exc:  # best effort: the next spare removes a leftover one too
            log.debug("WAL %s: removing the spare file %s failed: %s", self.directory, path, exc)
