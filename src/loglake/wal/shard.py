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

A write or fsync error fails the shard: the group and everything queued behind it fail with
StorageError and later submits are refused. Retrying an fsync after an error is not safe (the
kernel may have dropped the dirty pages), so there is no retry; restart recovery truncates the
unacknowledged tail.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from loglake import canary
from loglake.errors import EngineFailedError, StorageError
from loglake.fs.base import BytesLike, File, FileSystem
from loglake.wal.frame import FRAME_OVERHEAD, encode_frame

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


class Durability(IntEnum):
    """Per-topic durability class (DESIGN.md §4)."""

    FSYNC = 0  # ack after the group fdatasync
    DISK = 1  # ack after write(); fsync on an interval
    MEMORY = 2  # ack at enqueue; written and fsynced on the interval
    EPHEMERAL = 3  # never written to the WAL

    @classmethod
    def parse(cls, name: str) -> Durability:
        return cls[name.upper()]


DoneCallback = Callable[["WalEntry", BaseException | None], None]


class WalEntry:
    """One append waiting for the writer. `on_done(entry, error)` runs on the writer thread."""

    __slots__ = (
        "base_offset",
        "context",
        "durability",
        "end_offset",
        "on_done",
        "partition",
        "payload",
        "seq",
        "topic_id",
    )

    def __init__(
        self,
        topic_id: bytes,
        partition: int,
        base_offset: int,
        end_offset: int,
        payload: BytesLike,
        durability: Durability,
        on_done: DoneCallback,
        context: object = None,
    ) -> None:
        self.context = context  # the submitter's own bookkeeping, handed back through on_done
        self.topic_id = topic_id
        self.partition = partition
        self.base_offset = base_offset
        self.end_offset = end_offset
        self.payload = payload
        self.durability = durability
        self.on_done = on_done
        self.seq = -1


@dataclass
class WalFile:
    """A WAL file and, per (topic id, partition), the end offset of its last frame there."""

    path: str
    first_seq: int
    partitions: dict[tuple[bytes, int], int] = field(default_factory=dict)


def wal_file_name(first_seq: int) -> str:
    return f"wal-{first_seq:020d}.log"


def parse_wal_file_name(name: str) -> int | None:
    if name.startswith("wal-") and name.endswith(".log") and len(name) == 28:
        digits = name[4:24]
        if digits.isdigit():
            return int(digits)
    return None


class WalShard:
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
    ) -> None:
        self.fs = fs
        self.directory = directory
        self.file_bytes = file_bytes
        self.group_bytes_max = group_bytes_max
        self.queue_bytes_max = queue_bytes_max
        self.fsync_interval_s = fsync_interval_ms / 1000.0
        self._clock = clock
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # writer wake-ups and back-pressure
        self._queue: deque[WalEntry] = deque()
        self._queue_bytes = 0
        self._stopping = False
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._next_seq = 0
        self._files: list[WalFile] = []  # oldest first; the last one is active once writing starts
        self._active: File | None = None
        self._active_pos = 0
        self._active_capacity = 0
        self._dirty = False  # written but not yet fsynced
        self._last_sync = clock()
        self._idle = threading.Condition(self._lock)  # group written / sync ticket served
        self._truncate_lock = threading.Lock()
        self._last_group_frames = 0
        self._fsync_ewma_s = 0.0  # moving average of fdatasync latency
        self._in_flight = 0
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

    def close(self) -> None:
        """Write everything queued, fsync, stop the writer."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
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
    def failure(self) -> BaseException | None:
        return self._failure

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
            self._cond.notify_all()

    def wait_idle(self) -> None:
        """Block until everything submitted so far has been written (and fsynced if asked)."""
        with self._cond:
            while (self._queue or self._in_flight) and self._failure is None:
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
            while self._sync_served < ticket and self._failure is None:
                if self._thread is None:
                    return
                self._idle.wait()
            if self._failure is not None:
                raise EngineFailedError(f"WAL shard {self.directory} failed: {self._failure}")

    # ---- truncation ------------------------------------------------------------------------

    def files(self) -> list[WalFile]:
        with self._cond:
            return list(self._files)

    def has_closed_files(self) -> bool:
        """Files that are not the active one (candidates for truncation)."""
        with self._cond:
            return len(self._files) > (1 if self._active is not None else 0)

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
            self._queue_bytes -= group_bytes
            self._in_flight = len(group)
            self._last_group_frames = len(group)
            self._cond.notify_all()
            return group, ticket

    def _run(self) -> None:
        while True:
            taken = self._take_group()
            if taken is None:
                break
            group, ticket = taken
            try:
                self._write_group(group, ticket)
            except BaseException as exc:  # SimulatedCrash in tests too: fail loudly, never hang
                self._fail(group, exc)
                return
        if self._dirty and self._active is not None and self._failure is None:
            try:
                self._active.datasync()
                self._dirty = False
            except BaseException as exc:
                self._fail([], exc)

    def _fail(self, group: list[WalEntry], exc: BaseException) -> None:
        log.error("WAL shard %s failed at seq %d: %s", self.directory, self._next_seq, exc)
        error: BaseException = (
            exc
            if isinstance(exc, StorageError) or not isinstance(exc, Exception)
            else StorageError("wal-write", self.directory, exc)
        )
        with self._cond:
            self._failure = error
            pending = list(group) + list(self._queue)
            self._queue.clear()
            self._queue_bytes = 0
            self._in_flight = 0
            self._cond.notify_all()
            self._idle.notify_all()
        for entry in pending:
            try:
                entry.on_done(entry, error)
            except Exception:  # a callback must not stop the others from hearing
                log.exception("WAL completion callback failed")

    def _write_group(self, group: list[WalEntry], ticket: int) -> None:
        if group:
            group_seq = self._next_seq
            # Small frames are copied into one buffer (cheaper than an iovec each); large
            # payloads go to pwritev as their own buffers, uncopied.
            parts: list[BytesLike] = []
            small = bytearray()
            size = 0
            for entry in group:
                entry.seq = self._next_seq
                self._next_seq += 1
                frame = encode_frame(
                    entry.seq,
                    group_seq,
                    entry.topic_id,
                    entry.partition,
                    entry.base_offset,
                    entry.end_offset,
                    entry.payload,
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
                size += len(entry.payload) + FRAME_OVERHEAD
            if small:
                parts.append(small)
            if self._active is None or self._active_pos + size > self._active_capacity:
                self._roll(group_seq, size)
            assert self._active is not None
            self._active.pwritev(self._active_pos, parts)
            self._active_pos += size
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
        with self._cond:
            self._in_flight = 0
            self._sync_served = max(self._sync_served, ticket)
            self._idle.notify_all()
        for entry in group:
            try:
                entry.on_done(entry, None)
            except Exception:
                log.exception("WAL completion callback failed")

    def _roll(self, first_seq: int, needed: int) -> None:
        """Close the active file (trimmed to what it holds) and start a preallocated new one."""
        if self._active is not None:
            if self._dirty:
                self._active.datasync()
                self._dirty = False
            # Trim the unused preallocated tail; if this does not reach disk, zeros remain, which
            # recovery reads as a clean end of file.
            self._active.truncate(self._active_pos)
            self._active.close()
            self._active = None
        path = os.path.join(self.directory, wal_file_name(first_seq))
        capacity = max(self.file_bytes, needed)
        f = self.fs.open(path, write=True, create=True, exclusive=True)
        try:
            f.allocate(capacity)
            f.datasync()
            self.fs.fsync_dir(self.directory)
        except BaseException:
            f.close()
            raise
        with self._cond:
            self._files.append(WalFile(path, first_seq))
        self._active = f
        self._active_pos = 0
        self._active_capacity = capacity
