"""One WAL shard: an ordered, append-only file sequence with a single writer thread.

Theory of operation
-------------------
Appenders call `submit()`, which queues a `WalEntry` and returns at once. The writer thread
takes everything queued (up to `group_bytes_max`), gives the frames consecutive sequence
numbers, writes them with ONE vectored write, and — when any entry's durability class asks for
it — issues ONE fdatasync. Only then does it call each entry's `on_done` callback, in order.
That is group commit: many producers share one fsync, and per partition the callbacks arrive in
offset order, because a partition always maps to the same shard.

Files are preallocated (`file_bytes`) and named by the sequence number of their first frame,
`wal-<seq 20 digits>.log`, so appends never grow the inode and fdatasync has no metadata to
write. A group that does not fit in the rest of the active file rolls to a new file first.

With `spare=True` (the engine's data shards) and a filesystem whose `allocate` leaves unwritten
extents (`FileSystem.has_unwritten_extents`), a roll renames a zero-written spare file into
place instead (loglake.wal.spare): the WAL's fdatasyncs then overwrite written blocks and need
no journal commit, and the roll does no allocation or data sync on the writer thread. The spare
is an obsolete WAL file of this shard when truncation has one to offer (recycled: its frames are
then flagged FLAG_RECYCLED_FILE, and no zeros are written for it), else a file of fresh zeros.

A write or fsync error fails the shard: the group and everything queued behind it fail with
StorageError and later submits are refused. Retrying an fsync after an error is not safe (the
kernel may have dropped the dirty pages), so there is no retry; restart recovery truncates the
unacknowledged tail.

Disk full is the exception, when the shard has an `on_full` hook (the engine's WAL shards do;
see loglake.engine.space). On ENOSPC/EDQUOT from a write, an fsync or a roll the shard *stalls*
instead of failing: the active file is cut back to what its last successful fsync covered (or
removed when that is nothing) and synced, so no byte of an unconfirmed write stays in a file that
recovery reads; the frames written since that fsync plus the failed group are kept in memory.
The failed group's entries hear `StorageFullError` at once (not acknowledged; an idempotent
producer's retry is answered once they are durable). Then, with a backoff, the writer rolls to a
fresh file and writes those frames again with the same sequence numbers, fsyncs, and only then
acknowledges them (`on_done(entry, None)`) and resumes; `on_healed` says so. The failed fsync is
never retried on the old file. A stall that does not heal before close loses only what was
never acknowledged plus, for the `disk` and `memory` classes, their last fsync interval (their
contract). Any other error (EIO) still fails the shard for good.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable

from loglake import canary
from loglake.errors import EngineFailedError, StorageError, StorageFullError
from loglake.fs.base import BytesLike, File, FileSystem
from loglake.locks import Rank, ranked_lock
from loglake.wal.entry import Durability, WalEntry, WalFile, parse_wal_file_name, wal_file_name
from loglake.wal.frame import FLAG_RECYCLED_FILE, FRAME_OVERHEAD, encode_frame
from loglake.wal.spare import SPARE_REQUEST_FILL, SpareFile
from loglake.wal.stall import StallMixin

__all__ = [
    "Durability",
    "WalEntry",
    "WalFile",
    "WalShard",
    "parse_wal_file_name",
    "wal_file_name",
]

log = logging.getLogger(__name__)

#: Default size of a preallocated WAL file (the seeds use 16 to 64 MiB).
WAL_FILE_BYTES_DEFAULT = 64 * 1024 * 1024
#: Most bytes one group commit writes: bounds the torn region a crash can leave.
WAL_GROUP_BYTES_MAX_DEFAULT = 16 * 1024 * 1024
#: Most bytes queued for a shard before submit() blocks (back-pressure).
WAL_QUEUE_BYTES_MAX_DEFAULT = 128 * 1024 * 1024
#: How often the `disk` and `memory` classes get an fsync.
WAL_FSYNC_INTERVAL_MS_DEFAULT = 1000
#: Payloads up to this size are copied into the group's write buffer instead of getting an iovec.
WAL_COPY_PAYLOAD_BYTES_MAX = 16 * 1024
#: Longest a group waits for producers that were in the previous group to come back (like
#: PostgreSQL's commit_delay). The real wait is at most half the recent fsync latency.
WAL_COMMIT_DELAY_US_MAX = 500


class WalShard(StallMixin):
    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        *,
        file_bytes: int = WAL_FILE_BYTES_DEFAULT,
        group_bytes_max: int = WAL_GROUP_BYTES_MAX_DEFAULT,
        queue_bytes_max: int = WAL_QUEUE_BYTES_MAX_DEFAULT,
        fsync_interval_ms: int = WAL_FSYNC_INTERVAL_MS_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
        on_full: Callable[[str, BaseException], None] | None = None,
        on_healed: Callable[[str], None] | None = None,
        spare: bool = False,
        spare_keep_free: Callable[[int], int] | None = None,
        files: list[WalFile] | None = None,
        roll_gate: Callable[[Callable[[], bool]], None] | None = None,
    ) -> None:
        """`files`: a retired shard's files (a shard directory beyond the configured count), kept
        for truncation only; such a shard is never started. `roll_gate(stopping)`: called on the
        writer's thread before a new file is started (not the first); it may wait, until
        `stopping()`, for older files to go (the engine's WAL replay bound)."""
        self.fs = fs
        self._roll_gate = roll_gate
        self._spare = (
            SpareFile(fs, directory, file_bytes, spare_keep_free) if spare and fs.has_unwritten_extents else None
        )
        self._spare_asked = False  # for the active file (SPARE_REQUEST_FILL)
        self._on_full = on_full
        self._on_healed = on_healed
        self._synced_pos = 0  # bytes of the active file its last fsync covered
        self._unsynced: list[WalEntry] = []  # entries written (and acknowledged) since that fsync
        #: while stalled (disk full): (entry, acknowledged already) to write again, oldest first
        self._stalled: list[tuple[WalEntry, bool]] | None = None
        self._stall_ticket = 0
        self._tries = 0  # failed heal rounds of the current stall (the backoff doubles)
        self._aborting = False
        self.stalls = 0
        self.directory = directory
        self.file_bytes = file_bytes
        self.group_bytes_max = group_bytes_max
        self.queue_bytes_max = queue_bytes_max
        self.fsync_interval_s = fsync_interval_ms / 1000.0
        self._clock = clock
        self._lock = ranked_lock(Rank.WAL_QUEUE, "WalShard._lock")
        self._cond = threading.Condition(self._lock)  # type: ignore[arg-type]  # writer wake-ups and back-pressure
        self._queue: deque[WalEntry] = deque()
        self._queue_bytes = 0
        self._stopping = False
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._next_seq = 0
        self._files: list[WalFile] = list(files or [])  # oldest first; the last one is active once writing starts
        self._active: File | None = None
        self._active_pos = 0
        self._active_capacity = 0
        self._active_flags = 0  # frame flags for the active file (FLAG_RECYCLED_FILE)
        self._dirty = False  # written but not yet fsynced
        self._last_sync = clock()
        self._idle = threading.Condition(self._lock)  # type: ignore[arg-type]  # group written / sync ticket served
        self._truncate_lock = threading.Lock()
        self._last_group_frames = 0
        self._fsync_ewma_s = 0.0  # moving average of fdatasync latency
        self._in_flight = 0
        self._in_flight_bytes = 0  # of the group being written (frames included)
        self._sync_requests = 0  # tickets handed out by sync()
        self._sync_served = 0  # tickets whose data the writer has fsynced
        # stats
        self.groups_written = 0
        self.frames_written = 0
        self.fsyncs = 0
        self.fsync_seconds_total = 0.0

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, next_seq: int, existing: list[WalFile]) -> None:
        """Start after recovery: frames continue at `next_seq`, in a new file."""
        self._next_seq = next_seq
        self._files = list(existing)
        self._thread = threading.Thread(
            target=self._run, name=f"wal-{os.path.basename(self.directory)}", daemon=True
        )
        self._thread.start()
        if self._spare is not None:
            self._spare.start()

    def close(self) -> None:
        """Write everything queued, fsync, stop the writer."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._spare is not None:
            self._spare.close()
        if self._active is not None:
            try:
                if self._failure is None:
                    # Clean stop: trim the preallocated tail so the next start reads only frames.
                    self._active.truncate(self._active_pos)
                    self._active.datasync()
                self._active.close()
            except OSError as exc:
                log.warning("closing WAL file in %s: %s", self.directory, exc)
            self._active = None

    @property
    def spare_rolls(self) -> int:
        """Rolls that renamed a ready spare file into place."""
        return self._spare.used if self._spare is not None else 0

    @property
    def recycled_rolls(self) -> int:
        """Of those, rolls into a recycled WAL file (no zeros written for it)."""
        return self._spare.recycled if self._spare is not None else 0

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def stalled(self) -> bool:
        """Disk full: waiting for room to write the frames of a failed write again."""
        return self._stalled is not None

    def abort_stall(self) -> None:
        """Shutting down while stalled: fail the frames waiting to be written again (and what is
        queued) so that no thread waits on them forever; the shard is failed afterwards."""
        with self._cond:
            if self._stalled is None:
                return
            self._aborting = True
            self._cond.notify_all()
            while self._stalled is not None and self._failure is None and self._thread is not None:
                self._idle.wait(0.1)

    # ---- appending -------------------------------------------------------------------------

    def submit(self, entry: WalEntry) -> None:
        """Queue an entry; blocks while the queue holds more than `queue_bytes_max`."""
        size = len(entry.payload) + FRAME_OVERHEAD
        with self._cond:
            while (
                self._queue_bytes > 0
                and self._queue_bytes + size > self.queue_bytes_max
                and self._failure is None
                and not self._stopping
            ):
                self._cond.wait()
            if self._failure is not None:
                raise EngineFailedError(f"WAL shard {self.directory} failed: {self._failure}")
            if self._stopping:
                raise EngineFailedError(f"WAL shard {self.directory} is closed")
            self._queue.append(entry)
            self._queue_bytes += size
            # Wake the writer only when it waits for this: an empty queue, the group it holds the
            # commit open for, or a stall's retry. Waking it for every frame costs a futex and a
            # GIL switch per append while it would only go back to waiting.
            n = len(self._queue)
            if n == 1 or n >= self._last_group_frames or self._stalled is not None:
                self._cond.notify_all()

    def wait_idle(self) -> None:
        """Block until everything submitted so far has been written (and fsynced if asked)."""
        with self._cond:
            while (self._queue or self._in_flight) and self._failure is None and self._stalled is None:
                self._idle.wait()

    def sync(self) -> None:
        """Write everything queued and fsync it, whatever the durability classes asked.

        The fsync itself runs on the writer thread (only it touches the active file); this
        takes a ticket and waits until the writer has served it.
        """
        with self._cond:
            self._sync_requests += 1
            ticket = self._sync_requests
            self._cond.notify_all()
            while self._sync_served < ticket and self._failure is None and self._stalled is None:
                if self._thread is None:
                    return
                self._idle.wait()
            if self._failure is not None:
                raise EngineFailedError(f"WAL shard {self.directory} failed: {self._failure}")
            if self._stalled is not None and self._sync_served < ticket:
                raise StorageFullError(self.directory, -1, -1, f"WAL shard {self.directory} is stalled: no space left")

    # ---- truncation ------------------------------------------------------------------------

    def files(self) -> list[WalFile]:
        with self._cond:
            return list(self._files)

    def allocation_ahead(self) -> int:
        """Bytes of new WAL files this shard may still allocate for what it holds (queued, being
        written, or kept by a disk-full stall) and for what comes next: the free-space reserve
        counts them before it admits more (loglake.engine.space).

        What does not fit in the active file's preallocated rest takes new files of
        `file_bytes` (or one as large as a group); one file more is counted until the rest holds
        a whole file, as a write admitted before the next reading may need it. A bound, not an
        exact figure: a ready spare (made or recycled earlier, on disk already) is not
        subtracted."""
        with self._cond:
            unwritten = self._queue_bytes + self._in_flight_bytes
            stalled = self._stalled
            room = self._active_capacity - self._active_pos if self._active is not None else 0
        if stalled is not None:
            unwritten += sum(len(entry.payload) + FRAME_OVERHEAD for entry, _acked in stalled)
        return max(0, unwritten - room + self.file_bytes)

    def has_closed_files(self) -> bool:
        """Files that are not the active one (candidates for truncation)."""
        with self._cond:
            return len(self._files) > (1 if self._active is not None else 0)

    def closed_files(self) -> list[WalFile]:
        """The files that are not the active one, oldest first (truncation can take only these)."""
        with self._cond:
            return self._files[:-1] if self._active is not None else list(self._files)

    def delete_obsolete(self, is_obsolete: Callable[[bytes, int, int], bool]) -> int:
        """Delete closed WAL files all of whose frames are durable elsewhere. Returns how many.

        Files go oldest first and stop at the first one still needed, so the files left always
        form one unbroken sequence (recovery checks that). One truncation at a time.
        """
        with self._truncate_lock:
            with self._cond:
                candidates = self._files[:-1] if self._active is not None else list(self._files)
            doomed: list[WalFile] = []
            for wal_file in candidates:
                if not all(is_obsolete(tid, p, end) for (tid, p), end in wal_file.partitions.items()):
                    break
                doomed.append(wal_file)
            if not doomed:
                return 0
            for wal_file in doomed:
                if self._spare is not None and self._stalled is None and self._spare.offer(wal_file.path):
                    continue  # recycled as the next file: no zeros written for it
                try:
                    self.fs.unlink(wal_file.path)
                except FileNotFoundError:
                    log.warning("WAL file %s was already gone", wal_file.path)
            self.fs.fsync_dir(self.directory)
            with self._cond:
                gone = {id(f) for f in doomed}
                self._files = [f for f in self._files if id(f) not in gone]
            return len(doomed)

    # ---- the writer thread -----------------------------------------------------------------

    def _take_group(self) -> tuple[list[WalEntry], int] | None:
        """The next group to write and the sync ticket it serves; None when stopped and drained."""
        with self._cond:
            while not self._queue and not self._stopping and self._sync_requests == self._sync_served:
                timeout = None
                if self._dirty:
                    timeout = max(0.0, self._last_sync + self.fsync_interval_s - self._clock())
                    if timeout == 0.0:
                        break  # time for the interval fsync
                self._cond.wait(timeout)
            if self._queue and self._last_group_frames > 1 and len(self._queue) < self._last_group_frames:
                # Producers acked by the last group are likely appending again: give them a
                # moment so they share the next fsync instead of each paying for one.
                delay = min(WAL_COMMIT_DELAY_US_MAX / 1e6, self._fsync_ewma_s / 2)
                deadline = self._clock() + delay
                while len(self._queue) < self._last_group_frames and not self._stopping:
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            ticket = self._sync_requests
            if not self._queue:
                if self._stopping and ticket == self._sync_served:
                    return None
                return [], ticket
            group: list[WalEntry] = []
            group_bytes = 0
            while self._queue:
                entry = self._queue[0]
                size = len(entry.payload) + FRAME_OVERHEAD
                if group and group_bytes + size > self.group_bytes_max:
                    break
                self._queue.popleft()
                group.append(entry)
                group_bytes += size
            # in flight before it leaves the queue: `allocation_ahead` never misses it in between
            self._in_flight_bytes = group_bytes
            self._queue_bytes -= group_bytes
            self._in_flight = len(group)
            self._last_group_frames = len(group)
            self._cond.notify_all()
            return group, ticket

    def _run(self) -> None:
        while True:
            if self._stalled is not None:
                try:
                    if not self._heal():
                        return  # stopping while stalled
                except BaseException as exc:
                    self._fail([e for e, acked in self._stalled or [] if not acked], exc)
                    return
                continue
            taken = self._take_group()
            if taken is None:
                break
            group, ticket = taken
            try:
                self._write_group(group, ticket)
            except BaseException as exc:  # SimulatedCrash in tests too: fail loudly, never hang
                if not (self._disk_full(exc) and self._stall(group, ticket, exc)):
                    self._fail(group, exc)
                    return
        if self._dirty and self._active is not None and self._failure is None:
            try:
                self._active.datasync()
                self._dirty = False
            except BaseException as exc:
                self._fail([], exc)

    def _fail(self, group: list[WalEntry], exc: BaseException) -> None:
        # The one line for it (the engine and the metadata log only note it at DEBUG).
        log.error(
            "WAL shard %s failed at seq %d: %s; the engine refuses writes until a restart (reads go on)",
            self.directory, self._next_seq, exc,
        )
        error: BaseException = (
            exc
            if isinstance(exc, StorageError) or not isinstance(exc, Exception)
            else StorageError("wal-write", self.directory, exc)
        )
        with self._cond:
            self._failure = error
            self._stalled = None
            pending = list(group) + list(self._queue)
            self._queue.clear()
            self._queue_bytes = 0
            self._in_flight = 0
            self._in_flight_bytes = 0
            self._cond.notify_all()
            self._idle.notify_all()
        for entry in pending:
            try:
                entry.on_done(entry, error)
            except Exception:  # a callback must not stop the others from hearing
                log.exception("WAL completion callback failed")

    def _write_group(self, group: list[WalEntry], ticket: int) -> None:
        if group:
            size = self._number(group)
            if self._active is None or self._active_pos + size > self._active_capacity:
                if self._roll_gate is not None and self._active is not None:
                    self._roll_gate(lambda: self._stopping)
                self._roll(group[0].seq, size)
            assert self._active is not None
            parts = self._encode(group)  # after the roll: the file sets the frames' flags
            self._active.pwritev(self._active_pos, parts)
            self._active_pos += size
            if (
                self._spare is not None
                and not self._spare_asked
                and self._active_pos >= self._active_capacity * SPARE_REQUEST_FILL
            ):
                self._spare_asked = True
                self._spare.request()
            active_map = self._files[-1].partitions
            for entry in group:
                active_map[(entry.topic_id, entry.partition)] = entry.end_offset
            self.groups_written += 1
            self.frames_written += len(group)
            self._dirty = True
        need_sync = (
            any(e.durability == Durability.FSYNC for e in group)
            or ticket > self._sync_served
            or (self._dirty and self._clock() - self._last_sync >= self.fsync_interval_s)
        )
        if need_sync and self._active is not None and self._dirty:
            started = time.perf_counter()
            if not canary.SKIP_WAL_FSYNC:  # test-only mutation (loglake/canary.py)
                self._active.datasync()
            elapsed = time.perf_counter() - started
            self.fsync_seconds_total += elapsed
            self._fsync_ewma_s = elapsed if not self._fsync_ewma_s else 0.8 * self._fsync_ewma_s + 0.2 * elapsed
            self.fsyncs += 1
            self._dirty = False
            self._last_sync = self._clock()
            self._synced_pos = self._active_pos
            self._unsynced.clear()
        elif group:
            self._unsynced.extend(group)
        with self._cond:
            self._in_flight = 0
            self._in_flight_bytes = 0
            self._sync_served = max(self._sync_served, ticket)
            self._idle.notify_all()
        for entry in group:
            try:
                entry.on_done(entry, None)
            except Exception:
                log.exception("WAL completion callback failed")

    def _number(self, group: list[WalEntry]) -> int:
        """Give the group's entries their seqs, from `_next_seq` on; returns the frames' size."""
        size = 0
        for entry in group:
            entry.seq = self._next_seq
            self._next_seq += 1
            size += len(entry.payload)
        return size + FRAME_OVERHEAD * len(group)

    def _encode(self, group: list[WalEntry]) -> list[BytesLike]:
        """The group's frames (numbered by `_number`) as pwritev buffers."""
        group_seq = group[0].seq
        flags = self._active_flags
        # Small frames are copied into one buffer (cheaper than an iovec each); large
        # payloads go to pwritev as their own buffers, uncopied.
        parts: list[BytesLike] = []
        small = bytearray()
        for entry in group:
            frame = encode_frame(
                entry.seq,
                group_seq,
                entry.topic_id,
                entry.partition,
                entry.base_offset,
                entry.end_offset,
                entry.payload,
                flags,
            )
            if len(entry.payload) <= WAL_COPY_PAYLOAD_BYTES_MAX:
                small += frame[0]
                small += frame[1]
                small += frame[2]
                small += frame[3]
            else:
                small += frame[0]
                small += frame[1]
                parts.append(small)
                parts.append(frame[2])
                small = bytearray(frame[3])
        if small:
            parts.append(small)
        return parts

    def _roll(self, first_seq: int, needed: int) -> None:
        """Close the active file (trimmed to what it holds where the shard keeps no spares) and
        start a preallocated new one: a spare (recycled or zeros) when one is ready."""
        if self._active is not None:
            if self._dirty:
                self._active.datasync()
                self._dirty = False
            self._unsynced.clear()
            self._synced_pos = self._active_pos
            if self._spare is None:
                # Trim the unused preallocated tail; if this does not reach disk, zeros remain,
                # which recovery reads as a clean end of file.
                self._active.truncate(self._active_pos)
            # With spares the file keeps its size, so that it can be recycled as it is (a trim
            # and a top-up would be two size changes, each a journal commit); what follows its
            # last frame is zeros or, in a recycled file, its old contents: recovery reads both.
            self._active.close()
            self._active = None
        path = os.path.join(self.directory, wal_file_name(first_seq))
        capacity = max(self.file_bytes, needed)
        taken = self._spare.take(path) if self._spare is not None and needed <= self.file_bytes else None
        self._spare_asked = False
        f, recycled = taken if taken is not None else (None, False)
        if f is None:
            f = self.fs.open(path, write=True, create=True, exclusive=True)
            try:
                f.allocate(capacity)
                f.datasync()
                self.fs.fsync_dir(self.directory)
            except BaseException as exc:
                f.close()
                if self._disk_full(exc):
                    self.fs.unlink(path)  # a retry creates it again; recovery never sees it half-made
                raise
        with self._cond:  # both at once: truncation never takes the new file for a closed one
            self._files.append(WalFile(path, first_seq))
            self._active = f
        self._active_flags = FLAG_RECYCLED_FILE if recycled else 0
        self._active_pos = 0
        self._active_capacity = capacity
        self._synced_pos = 0
