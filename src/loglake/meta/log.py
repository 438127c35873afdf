"""The local metadata store: an append-only metadata log plus checkpoints (DESIGN.md §3).

Layout under ``<data_dir>/meta/``::

    log/shard-00/wal-<first seq>.log    metadata records, one WAL frame each (wal/frame.py)
    checkpoint-<seq 20 digits>.bin      the whole state after record <seq> (state.py)
    snapshot-<seq>.bin                  version-1 snapshots: read once, migrated, removed

Theory of operation
-------------------
`append(record)` gives the record the next sequence number, applies it to the in-memory
`MetaState` and queues it to the log's writer thread, all under one lock, so the order records
are applied in is the order they are written in. It returns a future resolved once the record
is durable (group commit: one fdatasync for every record queued meanwhile, the WAL's own writer,
framing and torn-tail rules). Callers may hold their own locks while appending — this lock is
always the innermost one and nothing is called out of it — and wait for the future after
letting them go.

When the records since the last checkpoint pass `checkpoint_records` or `checkpoint_bytes`,
`maybe_checkpoint()` (the engine's maintenance thread) copies the state under the lock, writes
it atomically (temp, fsync, rename, directory fsync) outside it, then drops log files older than
the checkpoint *before* it: the newest two checkpoints and the log after the older one are kept,
so a damaged newest checkpoint falls back to the previous one and loses nothing.

Recovery: the newest checkpoint that verifies, then every record after it in the log. A torn
tail of the log (an unacknowledged write) is truncated and reported; damage to a record that
was durable is a CorruptionError naming the file and byte.
"""

from __future__ import annotations

import logging
import posixpath
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from loglake.errors import CorruptionError, EngineFailedError, MetaRecordRejectedError, StorageFullError
from loglake.fs.base import FileSystem
from loglake.locks import Rank, ranked_lock
from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.records import Cluster, MetaRecord, decode_record, encode_record
from loglake.meta.snapshot import SnapshotStore
from loglake.meta.state import MetaState
from loglake.meta.state_v1 import state_from_snapshot
from loglake.meta.store import Watcher as StoreWatcher
from loglake.wal.recovery import recover_wal, shard_dir_name
from loglake.wal.shard import Durability, WalEntry, WalShard

__all__ = [
    "META_CHECKPOINT_BYTES_DEFAULT",
    "META_CHECKPOINT_RECORDS_DEFAULT",
    "META_LOG_FILE_BYTES_DEFAULT",
    "LocalMetaStore",
    "MetaOpenReport",
    "Watcher",
]

log = logging.getLogger(__name__)

#: Checkpoint once this many records were appended since the last one...
META_CHECKPOINT_RECORDS_DEFAULT = 100_000
#: ...or this many bytes of records, whichever comes first.
META_CHECKPOINT_BYTES_DEFAULT = 64 * 1024 * 1024
#: Preallocated size of one metadata log file (records are small; keep start-up disk needs low).
META_LOG_FILE_BYTES_DEFAULT = 4 * 1024 * 1024
#: Bytes of metadata records queued for the writer before `append` waits.
META_LOG_QUEUE_BYTES_MAX = 64 * 1024 * 1024
#: Checkpoints kept on disk (the newest and one to fall back to).
CHECKPOINTS_KEPT = 2
#: Log files found at open beyond which a checkpoint is taken at once. Every start begins a new
#: preallocated file, and a process killed before a clean close leaves it untrimmed, so without
#: this a broker restarted often but changing little would read more files at every open.
META_LOG_FILES_AT_OPEN_MAX = 8

T = TypeVar("T")

_LOG_TOPIC = bytes(16)  # frames of the metadata log carry no topic
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d{20})\.bin$")

#: Called with (seq, kind, body, encoded record) after each append, under the store's lock.
Watcher = StoreWatcher


def checkpoint_name(seq: int) -> str:
    return f"checkpoint-{seq + 1:020d}.bin"  # named by the first record *not* in it (never negative)


@dataclass
class MetaOpenReport:
    checkpoint_seq: int | None = None  # seq of the checkpoint loaded (None: none)
    checkpoints_damaged: list[str] = field(default_factory=list)
    records_replayed: int = 0
    log_bytes_truncated: int = 0
    log_files_truncated: list[str] = field(default_factory=list)
    migrated_from: str | None = None  # a version-1 snapshot that was converted
    seconds: float = 0.0


class LocalMetaStore:
    """The single-node `MetaStore` (see loglake.meta.store for the interface)."""

    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        *,
        checkpoint_records: int = META_CHECKPOINT_RECORDS_DEFAULT,
        checkpoint_bytes: int = META_CHECKPOINT_BYTES_DEFAULT,
        log_file_bytes: int = META_LOG_FILE_BYTES_DEFAULT,
        on_full: Callable[[str, BaseException], None] | None = None,
        on_healed: Callable[[str], None] | None = None,
    ) -> None:
        if checkpoint_records < 1 or checkpoint_bytes < 1:
            raise ValueError("checkpoint_records and checkpoint_bytes must be at least 1")
        self.fs = fs
        self.directory = directory
        self.log_dir = posixpath.join(directory, "log")
        self.checkpoint_records = checkpoint_records
        self.checkpoint_bytes = checkpoint_bytes
        self.log_file_bytes = log_file_bytes
        #: disk full (loglake.engine.space): the log's shard stalls and heals instead of failing
        self._on_full = on_full
        self._on_healed = on_healed
        self._lock = ranked_lock(Rank.META, "LocalMetaStore._lock")
        self._checkpoint_lock = threading.Lock()  # one checkpoint at a time (never held with _lock waiting)
        self._state = MetaState()
        self._shard: WalShard | None = None
        self._next_seq = 0
        self._since_records = 0
        self._since_bytes = 0
        #: checkpoints that failed in a row (backoff before the next try; see checkpoint_due)
        self.checkpoint_failures = 0
        self._checkpoint_retry_at = 0.0
        self._checkpoint_failed_before = False
        self._checkpoints: list[int] = []  # seqs of checkpoints on disk, oldest first
        self._watchers: list[Watcher] = []
        self._failure: BaseException | None = None
        self.report = MetaOpenReport()
        #: (seq, record) replayed at open, for the publisher (bounded by the checkpoint thresholds)
        self.replayed: list[tuple[int, bytes]] = []

    # ---- opening ---------------------------------------------------------------------------

    @property
    def state(self) -> MetaState:
        return self._state

    def is_empty(self) -> bool:
        """No checkpoint, log or old snapshot on disk (a new data directory)."""
        return not self._list_checkpoints() and not self._log_files_exist() and SnapshotStore(self.fs, self.directory).load() is None

    def open(self) -> MetaState:
        """Load the newest valid checkpoint and replay the log after it; start the log writer."""
        started = time.perf_counter()
        self.fs.makedirs(self.directory)
        state: MetaState | None = None
        seqs = self._list_checkpoints()
        for i, seq in reversed(list(enumerate(seqs))):
            path = posixpath.join(self.directory, checkpoint_name(seq))
            try:
                state = decode_checkpoint(self.fs.read_file(path), path=path)
            except CorruptionError as exc:
                then = "trying the previous one" if i else "there is no other"
                log.error("metadata checkpoint %s is damaged at byte %d (%s); %s", path, exc.offset, exc.detail, then)
                self.report.checkpoints_damaged.append(path)
                continue
            if state.seq != seq:
                raise CorruptionError(path, 8, f"checkpoint holds seq {state.seq}, its name says {seq}")
            self.report.checkpoint_seq = seq
            break
        if state is None and seqs:
            raise CorruptionError(self.directory, 0, f"all {len(seqs)} metadata checkpoints are damaged")
        self._checkpoints = [s for s in seqs if state is not None and s <= state.seq]
        wal = recover_wal(self.fs, self.log_dir)
        self.report.log_bytes_truncated = wal.bytes_truncated
        self.report.log_files_truncated = list(wal.truncated_files)
        if state is None:
            if wal.frames:
                first = wal.frames[0].base_offset
                if first != 0:
                    raise CorruptionError(self.log_dir, 0, f"metadata log starts at record {first} and no checkpoint covers the ones before")
                state = MetaState()
            else:
                state = self._migrate_or_new()
        state.replaying = True
        expected = state.seq + 1
        for frame in wal.frames:
            seq = frame.base_offset
            if seq < expected:
                continue
            if seq != expected:
                raise CorruptionError(self.log_dir, 0, f"metadata log jumps from record {expected} to {seq}: records are missing")
            kind, body = decode_record(frame.payload, where=self.log_dir, position=seq)
            try:
                state.apply(kind, body)
            except (KeyError, ValueError, TypeError) as exc:
                raise CorruptionError(self.log_dir, 0, f"metadata record {seq} ({kind}) does not apply: {exc!r}") from None
            state.seq = seq
            expected = seq + 1
            self.replayed.append((seq, bytes(frame.payload)))
            self.report.records_replayed += 1
            self._since_records += 1
            self._since_bytes += len(frame.payload)
        state.replaying = False
        self._state = state
        self._next_seq = state.seq + 1
        shard_name = shard_dir_name(0)
        self.fs.makedirs(posixpath.join(self.log_dir, shard_name))
        shard = WalShard(
            self.fs,
            posixpath.join(self.log_dir, shard_name),
            file_bytes=self.log_file_bytes,
            queue_bytes_max=META_LOG_QUEUE_BYTES_MAX,
            group_bytes_max=min(META_LOG_QUEUE_BYTES_MAX, 16 * 1024 * 1024),
            on_full=self._on_full,
            on_healed=self._on_healed,
        )
        recovered = wal.shards.get(shard_name)
        # Frame seqs continue the record seqs (a log whose files were all dropped restarts at the checkpoint).
        files = recovered.files if recovered is not None else []
        shard.start(self._next_seq, files)
        self._shard = shard
        if len(files) > META_LOG_FILES_AT_OPEN_MAX and state.cluster_id:
            self._compact()
        self.report.seconds = time.perf_counter() - started
        return state

    def _compact(self) -> None:
        """Two checkpoints in a row, one record apart (a restatement of the cluster id, which
        changes nothing): every log file before the older one goes, and the newer one still
        has a checkpoint and the log after it to fall back to."""
        for _ in range(CHECKPOINTS_KEPT):
            self.append(Cluster(self._state.cluster_id)).result()
            self.checkpoint()
        log.info("metadata log compacted at open (it held more than %d files)", META_LOG_FILES_AT_OPEN_MAX)

    def _log_files_exist(self) -> bool:
        directory = posixpath.join(self.log_dir, shard_dir_name(0))
        return self.fs.exists(directory) and any(n.startswith("wal-") for n in self.fs.listdir(directory))

    def _migrate_or_new(self) -> MetaState:
        """No checkpoint and no log: convert a version-1 snapshot if there is one."""
        old = SnapshotStore(self.fs, self.directory)
        loaded = old.load()
        if loaded is None:
            return MetaState()
        seq, payload = loaded
        if payload.get("version") != 1:
            raise CorruptionError(self.directory, 0, f"metadata snapshot version {payload.get('version')} is not supported (want 1)")
        try:
            state = state_from_snapshot(payload)
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptionError(self.directory, 0, f"metadata snapshot {seq} does not parse: {exc!r}") from None
        self._write_checkpoint_file(capture(state))
        self._checkpoints = [state.seq]
        for name in self.fs.listdir(self.directory):
            if name.startswith("snapshot-"):
                self.fs.unlink(posixpath.join(self.directory, name))
        self.fs.fsync_dir(self.directory)
        self.report.migrated_from = f"snapshot {seq}"
        log.warning("metadata migrated from version-1 snapshot %d to the metadata log (docs/FORMAT.md)", seq)
        return state

    # ---- appending -------------------------------------------------------------------------

    def read(self, fn: Callable[[MetaState], T]) -> T:
        """Run `fn` on the state under the store's lock (a consistent read; keep it short)."""
        with self._lock:
            return fn(self._state)

    def watch(self, watcher: Watcher) -> None:
        with self._lock:
            self._watchers.append(watcher)

    def append(self, record: MetaRecord) -> Future[int]:
        """Apply one change and log it; the future resolves (with its seq) once durable."""
        kind, body = record.kind, record.body()
        raw = encode_record(kind, body)
        fut: Future[int] = Future()
        with self._lock:
            if self._failure is not None:
                raise EngineFailedError(f"metadata log failed: {self._failure}")
            shard = self._shard
            if shard is None:
                raise EngineFailedError("metadata store is not open")
            seq = self._next_seq
            try:  # refused before anything is logged when it does not fit
                self._state.apply(kind, body)
            except (KeyError, ValueError, TypeError) as exc:
                raise MetaRecordRejectedError(f"metadata record {kind} does not apply: {exc!r}") from None
            self._state.seq = seq
            self._next_seq = seq + 1
            self._since_records += 1
            self._since_bytes += len(raw)
            shard.submit(WalEntry(_LOG_TOPIC, 0, seq, seq + 1, raw, Durability.FSYNC, self._on_durable, fut))
            for watcher in self._watchers:
                watcher(seq, kind, body, raw)
        return fut

    def _on_durable(self, entry: WalEntry, error: BaseException | None) -> None:
        fut: Future[int] = entry.context  # type: ignore[assignment]
        if isinstance(error, StorageFullError):
            return  # disk full: the shard writes the record again once there is room, then calls back
        if error is not None:
            if self._failure is None:
                self._failure = error
                log.debug("metadata log failed; metadata changes are refused until restart: %s", error)  # the shard logged it
            if not fut.done():
                fut.set_exception(error if isinstance(error, Exception) else EngineFailedError(repr(error)))
            return
        if not fut.done():
            fut.set_result(entry.base_offset)

    def sync(self) -> None:
        """Wait until every record appended so far is durable."""
        if self._shard is not None:
            self._shard.sync()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    # ---- checkpoints -----------------------------------------------------------------------

    def checkpoint_due(self) -> bool:
        if self.checkpoint_failures and time.monotonic() < self._checkpoint_retry_at:
            return False  # the last one failed (EIO, ENOSPC): back off, the log still holds it all
        return self._since_records >= self.checkpoint_records or self._since_bytes >= self.checkpoint_bytes

    def maybe_checkpoint(self) -> int | None:
        """Checkpoint when due. A failure (EIO, ENOSPC) is logged here, once when checkpoints
        start failing and once when one works again, and not raised: the maintenance tick goes on
        with WAL truncation and publishing, and the checkpoint is retried after its backoff."""
        if not self.checkpoint_due():
            return None
        try:
            seq = self.checkpoint()
        except Exception as exc:
            if self.checkpoint_failures == 1:
                log.error(
                    "metadata checkpoint in %s failed: %s; the metadata log still holds every change, "
                    "retrying with backoff", self.directory, exc,
                )
            else:
                log.debug("metadata checkpoint failed again (%d): %s", self.checkpoint_failures, exc)
            return None
        if self._checkpoint_failed_before:
            log.warning("metadata checkpoint in %s works again", self.directory)
            self._checkpoint_failed_before = False
        return seq

    def checkpoint(self) -> int:
        """Write the state as a checkpoint now; returns its seq."""
        with self._checkpoint_lock:
            with self._lock:
                image = capture(self._state)
                self._since_records = 0
                self._since_bytes = 0
            if image.seq in self._checkpoints:
                return image.seq
            try:
                self._write_checkpoint_file(image)
            except BaseException:
                # Not written (EIO, ENOSPC): still due, tried again after a backoff (0.1 s doubling
                # to 30 s) so that a lasting error does not fail every maintenance tick.
                with self._lock:
                    self._since_records = max(self._since_records, self.checkpoint_records)
                    self.checkpoint_failures += 1
                    delay = min(0.1 * 2 ** (self.checkpoint_failures - 1), 30.0)
                    self._checkpoint_retry_at = time.monotonic() + delay
                    self._checkpoint_failed_before = True
                raise
            self.checkpoint_failures = 0
            self._checkpoints.append(image.seq)
            self._prune(keep=self._checkpoints[-CHECKPOINTS_KEPT:])
            return image.seq

    def replace_state(self, state: MetaState) -> None:
        """Adopt a state built elsewhere (restore from a bucket) and checkpoint it at once."""
        with self._lock:
            state.seq = self._next_seq - 1
            self._state = state
        self.checkpoint()

    def _write_checkpoint_file(self, image: Any) -> None:
        path = posixpath.join(self.directory, checkpoint_name(image.seq))
        self.fs.write_file_atomic(path, encode_checkpoint(image))

    def checkpoint_bytes_of(self, seq: int) -> bytes:
        return self.fs.read_file(posixpath.join(self.directory, checkpoint_name(seq)))

    @property
    def checkpoints(self) -> list[int]:
        return list(self._checkpoints)

    def _prune(self, keep: list[int]) -> None:
        """Drop checkpoints not kept and log files wholly before the oldest kept one."""
        oldest = keep[0]
        removed = False
        for seq in self._list_checkpoints():
            if seq not in keep:
                try:
                    self.fs.unlink(posixpath.join(self.directory, checkpoint_name(seq)))
                    removed = True
                except FileNotFoundError:
                    pass
        if removed:
            self.fs.fsync_dir(self.directory)
        self._checkpoints = [s for s in self._checkpoints if s in keep]
        if self._shard is not None:
            self._shard.delete_obsolete(lambda _tid, _p, end: end <= oldest + 1)

    def _list_checkpoints(self) -> list[int]:
        if not self.fs.exists(self.directory):
            return []
        seqs = []
        for name in self.fs.listdir(self.directory):
            m = _CHECKPOINT_RE.match(name)
            if m:
                seqs.append(int(m.group(1)) - 1)
            elif name.startswith("checkpoint-") and name.endswith(".tmp"):
                try:
                    self.fs.unlink(posixpath.join(self.directory, name))
                except FileNotFoundError:
                    pass
        return sorted(seqs)

    @property
    def shard(self) -> WalShard | None:
        """The log's WAL shard (None when closed)."""
        return self._shard

    def close(self) -> None:
        """Write what is queued and stop the writer (the next open replays the log)."""
        shard, self._shard = self._shard, None
        if shard is not None:
            shard.close()
