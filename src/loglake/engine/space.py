"""The free-space reserve: produce stops while the data directory's filesystem is nearly full
(or the WAL's, when `<data-dir>/wal` is a filesystem of its own: both are read, each against
its own reserve).

Like Redpanda's ``storage_min_free_bytes``: the reserve is the larger of `storage_min_free_bytes`
and `storage_min_free_percent` of the filesystem. Below it, producer appends are refused at once
with `StorageFullError` (KAFKA_STORAGE_ERROR on the wire) before any byte reaches the WAL, so
nothing is half-written. Everything else goes on — reads, seals of data already in the WAL,
metadata records and checkpoints, retention, relocation to the cold store, compaction — and the
reserve is the room they need. Writes resume by themselves once free space is back above it.

Free space is one statvfs per watched path (`FileSystem.disk_space`), read

* every `storage_space_check_interval_ms` (the maintenance tick and appends call `check`),
* at once when the bytes appended since the last reading exceed the headroom it showed, and
* while full, on a refused append at most every `FULL_RECHECK_MS`,

never per record. Once full, produce resumes only at the reserve plus a quarter of it
(`RESUME_MARGIN_DIVISOR`): a seal that lets a WAL file go frees a little, and without the margin
the state (and the log) would flip back and forth at the edge. A WAL shard whose write or fsync hit ENOSPC reports it here too (`wal_full`);
appends are refused until that shard has healed (`wal_healed`), whatever statvfs says.

Each state change is logged once, with the numbers: ``storage full: 37.1 MiB free on /data <
reserve 64.0 MiB; produce refused``, then ``storage writable again: ...``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from loglake.errors import StorageFullError
from loglake.fs.base import FileSystem

__all__ = ["FULL_RECHECK_MS", "RESUME_MARGIN_DIVISOR", "SpaceGuard", "mib"]

log = logging.getLogger(__name__)

#: While full, a refused append reads free space again at most this often.
FULL_RECHECK_MS = 100
#: Once full, produce resumes at the reserve plus reserve / this (a quarter more).
RESUME_MARGIN_DIVISOR = 4


def mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


class SpaceGuard:
    def __init__(
        self,
        fs: FileSystem,
        path: str,
        *,
        min_free_bytes: int,
        min_free_percent: float,
        check_interval_ms: int,
        clock: Callable[[], float] = time.monotonic,
        also: Sequence[str] = (),
    ) -> None:
        """`path`: the data directory; `also`: more paths whose filesystems must keep the reserve
        too (the WAL directory, which may be a mount point of its own). A path that cannot be
        read (not made yet, or no statvfs) is left out of that reading."""
        self.fs = fs
        #: the path of the last reading that decides (the first full one, else the least headroom)
        self.path = path
        self.paths = [path, *(p for p in also if p != path)]
        self.min_free_bytes = min_free_bytes
        self.min_free_percent = min_free_percent
        self.check_interval_s = check_interval_ms / 1000.0
        self._clock = clock
        self._lock = threading.Lock()
        self._last_check = float("-inf")
        self._headroom = 0  # free - reserve at the last reading, minus bytes appended since
        self._space_full = False
        self._wal_full: dict[str, str] = {}  # shard directory -> the error it hit
        #: the last reading: free and total bytes of the filesystem (-1 when unknown), the reserve
        self.free_bytes = -1
        self.total_bytes = -1
        self.reserve_bytes = min_free_bytes
        #: producer appends refused because storage was full
        self.refused = 0
        #: times storage went from writable to full
        self.full_events = 0

    @property
    def full(self) -> bool:
        return self._space_full or bool(self._wal_full)

    def reserve_for(self, total: int) -> int:
        return max(self.min_free_bytes, int(total * self.min_free_percent / 100.0))

    def check(self, *, force: bool = False) -> bool:
        """Read free space if the interval is over (or `force`); True while storage is full."""
        now = self._clock()
        with self._lock:
            if not force and now - self._last_check < self.check_interval_s:
                return self.full
            self._last_check = now
        readings = [(p, space) for p in self.paths if (space := self.fs.disk_space(p)) is not None]
        with self._lock:
            was = self.full
            if not readings:
                self._space_full = False
                self._headroom = 1 << 62
            else:
                # Hysteresis: once full, writable again only with a margin above the reserve, so
                # a seal that frees a WAL file does not flip the state (and the log) back and forth.
                # The reading that decides: a full filesystem first, else the least headroom.
                def reading(i: int, path: str, free: int, total: int) -> tuple[bool, int, int, str, int, int, int]:
                    reserve = self.reserve_for(total)
                    margin = reserve // RESUME_MARGIN_DIVISOR if self._space_full else 0
                    return free >= reserve + margin, free - reserve, i, path, free, total, reserve

                writable, self._headroom, _, self.path, self.free_bytes, self.total_bytes, self.reserve_bytes = min(
                    reading(i, p, free, total) for i, (p, (free, total)) in enumerate(readings)
                )
                self._space_full = not writable
            now_full = self.full
        self._changed(was, now_full)
        return now_full

    def admit(self, size: int) -> None:
        """Before a producer append of `size` bytes: StorageFullError while storage is full."""
        now = self._clock()
        with self._lock:
            self._headroom -= size
            if self.full:
                due = now - self._last_check >= FULL_RECHECK_MS / 1000.0
            else:
                due = self._headroom < 0 or now - self._last_check >= self.check_interval_s
        if due:
            self.check(force=True)
        if self.full:
            with self._lock:
                self.refused += 1
            raise StorageFullError(self.path, self.free_bytes, self.reserve_bytes, self.describe())

    def describe(self) -> str:
        """One line: why produce is refused (or that it is not)."""
        if self._wal_full:
            shard, error = next(iter(self._wal_full.items()))
            return f"storage full: WAL write in {shard} failed ({error}); produce refused until it succeeds again"
        numbers = f"{mib(self.free_bytes)} free on {self.path}"
        if self._space_full:
            return f"storage full: {numbers} < reserve {mib(self.reserve_bytes)}; produce refused"
        return f"storage writable: {numbers} >= reserve {mib(self.reserve_bytes)}"

    # ---- the WAL's reports -------------------------------------------------------------------

    def wal_full(self, shard: str, error: BaseException) -> None:
        """A WAL shard's write or fsync hit ENOSPC: refuse appends until `wal_healed(shard)`."""
        with self._lock:
            was = self.full
            self._wal_full[shard] = str(error)
        self._changed(was, True)

    def wal_healed(self, shard: str) -> None:
        with self._lock:
            was = self.full
            self._wal_full.pop(shard, None)
        self.check(force=True)
        if not self.full:
            self._changed(was, False)

    def _changed(self, was: bool, now: bool) -> None:
        if was == now:
            return
        if now:
            with self._lock:
                self.full_events += 1
            log.error("%s", self.describe())
        else:
            log.warning(
                "storage writable again: %s free on %s >= reserve %s; produce accepted",
                mib(self.free_bytes), self.path, mib(self.reserve_bytes),
            )
