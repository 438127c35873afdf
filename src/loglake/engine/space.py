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

What loglake still owes counts against free space (issue 31). An admitted append is written
twice: as a WAL frame, into a preallocated WAL file (a roll allocates a whole `wal_file_bytes` file
at once), and later as part of a segment with an index entry per batch; its WAL file goes only
once everything in it is sealed. So a reading is `free - owed`, where `owed` (`Owed`, from the
partition log) is

* the segments of all unsealed data (`sealed_size` of each partition's buffer),
* the new WAL files each shard — and the metadata log — may still allocate for what it holds, and
  one more (`WalShard.allocation_ahead`), and
* what was admitted and not yet in a buffer or a WAL queue when the reading was taken,

and produce is admitted only while `free - owed` is at or above the reserve; until the next
reading each admission subtracts its own WAL frame and segment (`append_writes`) from the room
the last one showed. So WAL rolls and seals never take the filesystem below the reserve: it is
left for what no admission pays for — metadata records and checkpoints, compaction's output,
other processes. Readings take `owed` before statvfs, so a seal finishing in between is counted
twice (its buffer, then its segment), never not at all. A spare WAL file (loglake.wal.spare) is
made only where it leaves the reserve and everything owed free (`keep_free`). While the room
left is smaller than the unsealed data's segments (`tight`), maintenance seals the partitions
that hold closed WAL files, so that those files can go before produce must be refused. With the
reserve off (both settings 0) nothing is counted.

Each state change is logged once, with the numbers: ``storage full: 37.1 MiB free on /data <
reserve 64.0 MiB + 20.3 MiB owed to seals and new WAL files; produce refused``, then
``storage writable again: ...``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from loglake.errors import StorageFullError
from loglake.fs.base import FileSystem
from loglake.segment.format import sealed_size
from loglake.wal.frame import FRAME_OVERHEAD

__all__ = ["FULL_RECHECK_MS", "RESUME_MARGIN_DIVISOR", "Owed", "SpaceGuard", "append_writes", "mib"]

log = logging.getLogger(__name__)

#: While full, a refused append reads free space again at most this often.
FULL_RECHECK_MS = 100
#: Once full, produce resumes at the reserve plus reserve / this (a quarter more).
RESUME_MARGIN_DIVISOR = 4


def mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


class Owed(NamedTuple):
    """Bytes loglake will still write for what it holds now, by where they land."""

    #: on the data directory's filesystem: segments of the unsealed data, metadata log files
    data: int
    #: on the WAL directory's (perhaps the same one): new WAL files
    wal: int


NOTHING_OWED = Owed(0, 0)


def append_writes(size: int, batches: int) -> int:
    """Bytes an append of `size` bytes in `batches` Kafka batches makes loglake write: its WAL
    frame, then its part of a segment (one more segment's header and trailer at most)."""
    return size + FRAME_OVERHEAD + sealed_size(size, batches)


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
        self._headroom = 0  # free - owed - reserve at the last reading, minus writes admitted since
        self._owed: Callable[[], Owed] = lambda: NOTHING_OWED
        self._owed_data = 0  # `Owed.data` at the last reading
        self._admitting = 0  # writes admitted and not settled: in no buffer or WAL queue yet
        self._admitted = 0  # writes ever admitted (a reading counts those admitted while it ran)
        self._space_full = False
        self._wal_full: dict[str, str] = {}  # shard directory -> the error it hit
        #: the last reading: free and total bytes of the filesystem (-1 when unknown), the reserve
        self.free_bytes = -1
        self.total_bytes = -1
        self.reserve_bytes = min_free_bytes
        #: what loglake owed at the last reading, counted against free space (on `path`)
        self.owed_bytes = 0
        #: producer appends refused because storage was full
        self.refused = 0
        #: times storage went from writable to full
        self.full_events = 0

    @property
    def full(self) -> bool:
        return self._space_full or bool(self._wal_full)

    @property
    def reserving(self) -> bool:
        """The reserve is on (either setting above 0): only then is anything owed counted."""
        return self.min_free_bytes > 0 or self.min_free_percent > 0

    @property
    def tight(self) -> bool:
        """Full, or the room left above the reserve and everything owed is smaller than the
        unsealed data's segments: sealing now lets WAL files go before produce must be refused."""
        return self.full or (self.reserving and self._headroom < self._owed_data)

    def reserve_for(self, total: int) -> int:
        return max(self.min_free_bytes, int(total * self.min_free_percent / 100.0))

    def count_owed(self, owed: Callable[[], Owed]) -> None:
        """What the partition log still owes (LocalPartitionLog): counted from the next reading on."""
        self._owed = owed

    def keep_free(self, total: int) -> int:
        """Bytes a WAL spare file must leave free on a filesystem of `total` bytes: the reserve
        and everything owed (a spare is a WAL roll made early; it never takes room an admitted
        append counted on)."""
        reserve = self.reserve_for(total)
        if not self.reserving:
            return reserve
        owed = self._owed()
        return reserve + owed.data + owed.wal + self._admitting

    def check(self, *, force: bool = False) -> bool:
        """Read free space if the interval is over (or `force`); True while storage is full."""
        now = self._clock()
        with self._lock:
            if not force and now - self._last_check < self.check_interval_s:
                return self.full
            self._last_check = now
            admitted, admitting = self._admitted, self._admitting
        # What is owed first, free space second: a seal or a WAL roll in between is counted twice,
        # never not at all (a buffer is dropped only after its segment is written).
        owed = self._owed() if self.reserving else NOTHING_OWED
        readings = [(p, space) for p in self.paths if (space := self.fs.disk_space(p)) is not None]
        with self._lock:
            was = self.full
            # admitted before the reading and still in no buffer or queue, or admitted since
            pending = admitting + self._admitted - admitted if self.reserving else 0
            self._owed_data = owed.data
            if not readings:
                self._space_full = False
                self._headroom = 1 << 62
            else:
                # Hysteresis: once full, writable again only with a margin above the reserve, so
                # a seal that frees a WAL file does not flip the state (and the log) back and forth.
                # The reading that decides: a full filesystem first, else the least headroom. The
                # data directory's (the first) owes everything: the WAL may share its filesystem.
                def reading(i: int, path: str, free: int, total: int) -> tuple[bool, int, int, str, int, int, int, int]:
                    reserve = self.reserve_for(total)
                    margin = reserve // RESUME_MARGIN_DIVISOR if self._space_full else 0
                    owes = (owed.data if i == 0 else 0) + owed.wal + pending
                    left = free - owes - reserve
                    return left >= margin, left, i, path, free, total, reserve, owes

                (
                    writable, self._headroom, _, self.path, self.free_bytes, self.total_bytes, self.reserve_bytes,
                    self.owed_bytes,
                ) = min(reading(i, p, free, total) for i, (p, (free, total)) in enumerate(readings))
                self._space_full = not writable
            now_full = self.full
        self._changed(was, now_full)
        return now_full

    def admit(self, writes: int) -> None:
        """Before a producer append that makes loglake write `writes` bytes (`append_writes`):
        StorageFullError while storage is full. Admitted, the bytes count as owed until
        `settle(writes)`, when the append is in a buffer and a WAL queue (where readings find it)."""
        now = self._clock()
        with self._lock:
            self._headroom -= writes
            self._admitting += writes
            self._admitted += writes
            if self.full:
                due = now - self._last_check >= FULL_RECHECK_MS / 1000.0
            else:
                due = self._headroom < 0 or now - self._last_check >= self.check_interval_s
        try:
            if due:
                self.check(force=True)
            if self.full:
                with self._lock:
                    self.refused += 1
                raise StorageFullError(self.path, self.free_bytes, self.reserve_bytes, self.describe())
        except BaseException:
            with self._lock:  # not admitted: nothing owed for it
                self._headroom += writes
                self._admitting -= writes
            raise

    def settle(self, writes: int) -> None:
        """An admitted append is in its partition's buffer and its WAL queue (or failed): the
        next reading finds what it owes there."""
        with self._lock:
            self._admitting -= writes

    def describe(self) -> str:
        """One line: why produce is refused (or that it is not)."""
        if self._wal_full:
            shard, error = next(iter(self._wal_full.items()))
            return f"storage full: WAL write in {shard} failed ({error}); produce refused until it succeeds again"
        numbers = f"{mib(self.free_bytes)} free on {self.path}"
        if self._space_full:
            return f"storage full: {numbers} < reserve {mib(self.reserve_bytes)}{self._owed_text()}; produce refused"
        return f"storage writable: {numbers} >= reserve {mib(self.reserve_bytes)}{self._owed_text()}"

    def _owed_text(self) -> str:
        owed = mib(self.owed_bytes)
        return "" if owed == mib(0) else f" + {owed} owed to seals and new WAL files"

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
                "storage writable again: %s free on %s >= reserve %s%s; produce accepted",
                mib(self.free_bytes), self.path, mib(self.reserve_bytes), self._owed_text(),
            )
