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
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from loglake.fs.base import File, FileSystem

__all__ = ["WAL_SPARE_NAME", "SpareFile"]

log = logging.getLogger(__name__)

#: The spare's name in the shard directory: never read by recovery.
WAL_SPARE_NAME = "spare.wal"
#: The shard asks for a spare once its active file is this full: late enough that short-lived
#: engines make none, early enough that the zeros are written before the roll at any rate the
#: disk can take (the other half of the file is written meanwhile).
SPARE_REQUEST_FILL = 0.5
#: Zeros are written in steps of this size, checking between steps whether the shard is closing,
#: so close() never waits for a whole file of zeros.
SPARE_STEP_BYTES = 8 * 1024 * 1024


class SpareFile:
    """At most one ready spare per shard (the bound), made by one helper thread on request."""

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
        self._cond = threading.Condition()
        self._ready: File | None = None  # zero-written and datasynced
        self._wanted = False  # the shard asked for one (request())
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.used = 0  # rolls that renamed a spare into place

    def start(self) -> None:
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
            f = self._ready
            self._ready = None
        self._discard(f)

    @property
    def ready(self) -> bool:
        return self._ready is not None

    def request(self) -> None:
        """Make a spare if none is ready (the writer calls this once per active file)."""
        with self._cond:
            self._wanted = True
            self._cond.notify_all()

    def take(self, path: str) -> File | None:
        """The writer, rolling: rename the ready spare to `path` and make the name durable.
        None when none is ready. The next one is made when the new file is half full: the helper
        starts by removing whatever has the spare's name, so never while the rename is pending."""
        with self._cond:
            f = self._ready
            self._ready = None
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
        return f

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (not self._wanted or self._ready is not None):
                    self._cond.wait()
                if self._stopping:
                    return
                self._wanted = False
            f: File | None = None
            try:
                if not self._room():
                    self.skipped_for_space += 1
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
                self._discard(f)
                continue
            with self._cond:
                stopped = self._is_stopping()
                if not stopped:
                    self._ready = f
            if stopped:
                self._discard(f)
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

    def _discard(self, f: File | None) -> None:
        try:
            if f is not None:
                f.close()
            if self.fs.exists(self.path):
                self.fs.unlink(self.path)
        except BaseException as exc:  # best effort: the next spare removes a leftover one too
            log.debug("WAL %s: removing the spare file failed: %s", self.directory, exc)
