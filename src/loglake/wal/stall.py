"""A WAL shard's disk-full handling: stall, keep the unconfirmed frames, heal into a fresh file.

The rules are in `loglake.wal.shard`'s module doc ("Disk full is the exception"); this mixin is
the code, kept apart from the writer's ordinary path. It works on the shard's own state, declared
below for the type checker.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable

from loglake.errors import StorageError, StorageFullError
from loglake.fs.base import BytesLike, File, FileSystem
from loglake.wal.entry import WalEntry, WalFile

log = logging.getLogger("loglake.wal.shard")

#: A stalled shard (disk full) tries a fresh file after this long, doubling up to the max.
WAL_STALL_RETRY_MS = 100
WAL_STALL_RETRY_MS_MAX = 5_000


class StallMixin:
    fs: FileSystem
    directory: str
    stalls: int
    _cond: threading.Condition
    _idle: threading.Condition
    _active: File | None
    _active_pos: int
    _files: list[WalFile]
    _dirty: bool
    _synced_pos: int
    _unsynced: list[WalEntry]
    _next_seq: int
    _stalled: list[tuple[WalEntry, bool]] | None
    _stall_ticket: int
    _in_flight: int
    _in_flight_bytes: int
    _tries: int
    _stopping: bool
    _aborting: bool
    _sync_served: int
    _on_full: Callable[[str, BaseException], None] | None
    _on_healed: Callable[[str], None] | None

    def _fail(self, group: list[WalEntry], exc: BaseException) -> None:
        raise NotImplementedError

    def _number(self, group: list[WalEntry]) -> int:
        raise NotImplementedError

    def _encode(self, group: list[WalEntry]) -> list[BytesLike]:
        raise NotImplementedError

    def _roll(self, first_seq: int, needed: int) -> None:
        raise NotImplementedError

    def _disk_full(self, exc: BaseException) -> bool:
        return (
            self._on_full is not None
            and isinstance(exc, OSError)
            and exc.errno in (errno.ENOSPC, errno.EDQUOT)
        )

    def _abandon_active(self) -> None:
        """Cut the active file back to what its last fsync covered and sync that (remove it when
        that is nothing): recovery must never find an unconfirmed frame in a closed file."""
        with self._cond:
            f = self._active
            if f is None:
                return
            wal_file = self._files[-1]  # the active file is the newest
            self._active = None
        self._dirty = False
        try:
            if self._synced_pos == 0:
                f.close()
                try:
                    self.fs.unlink(wal_file.path)
                except FileNotFoundError:
                    pass  # truncation took it (it named no partition)
                self.fs.fsync_dir(self.directory)
                with self._cond:
                    self._files = [w for w in self._files if w is not wal_file]
            else:
                f.truncate(self._synced_pos)
                f.datasync()
                f.close()
        except BaseException:
            try:
                f.close()
            except OSError:
                pass  # closed already
            raise

    def _stall(self, group: list[WalEntry], ticket: int, exc: BaseException) -> bool:
        """Disk full during `group`: keep what must be written again, tell the entries and the
        hook. False when the active file cannot be cut back (then the shard fails)."""
        pending = [(e, True) for e in self._unsynced] + [(e, False) for e in group]
        try:
            self._abandon_active()
        except BaseException as cut:
            log.error("WAL shard %s: disk full, and cutting back the active file failed: %s", self.directory, cut)
            return False
        self._unsynced = []
        if pending:
            self._next_seq = pending[0][0].seq
        self.stalls += 1
        log.error(
            "WAL shard %s: %s; %d unconfirmed frame(s) from seq %d kept to write again in a fresh file once there is room",
            self.directory, exc, len(pending), self._next_seq,
        )
        error = StorageFullError(
            self.directory, -1, -1, f"WAL write failed ({exc}); written again once there is room"
        )
        with self._cond:
            self._stalled = pending
            self._stall_ticket = ticket
            self._in_flight = 0
            self._in_flight_bytes = 0  # the failed group is among `_stalled` now
            self._idle.notify_all()
        assert self._on_full is not None
        self._on_full(self.directory, exc)
        for entry, acked in pending:
            if not acked:
                try:
                    entry.on_done(entry, error)
                except Exception:
                    log.exception("WAL completion callback failed")
        return True

    def _heal(self) -> bool:
        """One stalled round: wait, then try a fresh file. False when the shard is stopping."""
        delay = min(WAL_STALL_RETRY_MS * 2 ** min(self._tries, 10), WAL_STALL_RETRY_MS_MAX) / 1000.0
        with self._cond:
            if not (self._stopping or self._aborting):
                self._cond.wait(delay)
            stop = self._stopping or self._aborting
        if stop:
            # Nobody may wait forever for a write that will not happen now: what was never
            # acknowledged, and everything queued, fails (the next open replays what is durable).
            waiting = self._stalled or []
            self._fail([e for e, acked in waiting if not acked], StorageError("wal-write", self.directory, "stopped while the disk was full"))
            return False
        pending = self._stalled
        assert pending is not None
        entries = [e for e, _acked in pending]
        try:
            if entries:
                size = self._number(entries)  # the same seqs again: _next_seq is entries[0].seq
                self._roll(entries[0].seq, size)
                assert self._active is not None
                parts = self._encode(entries)  # after the roll: the new file sets the frame flags
                self._active.pwritev(0, parts)
                self._active_pos = size
                self._active.datasync()
                self._synced_pos = size
                active_map = self._files[-1].partitions
                for entry in entries:
                    active_map[(entry.topic_id, entry.partition)] = entry.end_offset
        except BaseException as exc:
            if not self._disk_full(exc):
                raise
            self._next_seq = entries[0].seq if entries else self._next_seq
            self._abandon_active()
            self._tries += 1
            return True
        self._tries = 0
        # Healed first, then unstalled: whoever sees the shard unstalled also sees the free-space
        # gate lifted (a producer admitted right after `stalled` turns False is not refused).
        if self._on_healed is not None:
            self._on_healed(self.directory)
        with self._cond:
            self._stalled = None
            self._sync_served = max(self._sync_served, self._stall_ticket)
            self._idle.notify_all()
        log.warning("WAL shard %s: written again after the disk-full stall (%d frame(s)); writes resume", self.directory, len(entries))
        for entry, acked in pending:
            if not acked:
                try:
                    entry.on_done(entry, None)
                except Exception:
                    log.exception("WAL completion callback failed")
        return True
