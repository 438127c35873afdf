"""`loglake verify` on a data directory a broker may be running on: read-only, without its lock.

Only sealed data is checked (segments and their hash chains; the WAL belongs to the running
broker). The segment list comes from the metadata as it is on disk: the newest checkpoint that
decodes, then the metadata log's intact records after it, read with plain reads — no torn tail
is truncated, no file created, renamed or removed. A record being written at that moment is
simply not seen yet (the log's tail is where a verify stops reading).

The broker keeps working meanwhile: retention and compaction delete segment files, relocation
moves them to the cold store, checkpoints prune old log files. A file that disappears under the
walk is looked up again in freshly read metadata (`refresh`): gone from it, it is skipped; still
listed, it is an error. Reading the metadata retries when a file it listed was pruned between
listing and reading (`LIVE_META_ATTEMPTS`).
"""

from __future__ import annotations

import posixpath

from loglake.engine.partition import SegmentRef
from loglake.errors import CorruptionError, StorageError, UnknownTopicError
from loglake.fs.base import FileSystem
from loglake.fs.os_fs import OsFileSystem
from loglake.meta.checkpoint import decode_checkpoint
from loglake.meta.layout import meta_dir, segments_dir
from loglake.meta.lifecycle import Tier
from loglake.meta.log import _CHECKPOINT_RE, checkpoint_name
from loglake.meta.records import decode_record
from loglake.meta.snapshot import SnapshotStore
from loglake.meta.state import MetaState, PartitionMeta
from loglake.meta.state_v1 import state_from_snapshot
from loglake.store.base import ObjectStore
from loglake.store.local import LocalStore
from loglake.wal.recovery import _scan, shard_dir_name
from loglake.wal.shard import parse_wal_file_name

__all__ = ["LIVE_META_ATTEMPTS", "LiveSource", "read_meta_state"]

#: How often reading the metadata is retried when the broker pruned a file under it.
LIVE_META_ATTEMPTS = 5


def read_meta_state(fs: FileSystem, data_dir: str) -> MetaState:
    """The metadata state as on disk now, read without writing anything (see the module doc)."""
    last: Exception | None = None
    for _ in range(LIVE_META_ATTEMPTS):
        try:
            return _read_once(fs, meta_dir(data_dir))
        except (FileNotFoundError, CorruptionError) as exc:  # pruned or rewritten while read
            last = exc
    if isinstance(last, CorruptionError):
        raise last
    raise CorruptionError(meta_dir(data_dir), 0, f"metadata kept changing while it was read: {last}")


def _read_once(fs: FileSystem, directory: str) -> MetaState:
    state: MetaState | None = None
    names = fs.listdir(directory) if fs.exists(directory) else []
    seqs = sorted(int(m.group(1)) - 1 for n in names if (m := _CHECKPOINT_RE.match(n)))
    for seq in reversed(seqs):
        path = posixpath.join(directory, checkpoint_name(seq))
        try:
            state = decode_checkpoint(fs.read_file(path), path=path)
            break
        except (FileNotFoundError, CorruptionError):
            continue
    log_dir = posixpath.join(directory, "log", shard_dir_name(0))
    files = sorted(
        (first, name) for name in (fs.listdir(log_dir) if fs.exists(log_dir) else []) if (first := parse_wal_file_name(name)) is not None
    )
    if state is None:
        if not files:
            loaded = SnapshotStore(fs, directory).load()  # a version-1 directory not migrated yet
            return state_from_snapshot(loaded[1]) if loaded is not None else MetaState()
        state = MetaState()
    state.replaying = True
    expected = state.seq + 1
    for first, name in files:
        path = posixpath.join(log_dir, name)
        frames, bad_at = _scan(fs.read_file(path), path, first)
        for frame in frames:
            seq = frame.base_offset
            if seq < expected:
                continue
            if seq != expected:
                raise CorruptionError(log_dir, 0, f"metadata log jumps from record {expected} to {seq}")
            kind, body = decode_record(frame.payload, where=log_dir, position=seq)
            state.apply(kind, body)
            state.seq = seq
            expected = seq + 1
        if bad_at is not None:
            break  # the tail being written now (or torn): what follows is not durable yet
    state.replaying = False
    return state


class LiveSource:
    """A `VerifySource` (loglake.engine.verify) over a data directory, read-only."""

    def __init__(self, data_dir: str, cold: ObjectStore | None = None, fs: FileSystem | None = None) -> None:
        self.data_dir = data_dir
        self.fs = fs or OsFileSystem()
        self.hot = LocalStore(segments_dir(data_dir), self.fs)
        self.cold = cold
        self._state = read_meta_state(self.fs, data_dir)

    def refresh(self) -> None:
        self._state = read_meta_state(self.fs, self.data_dir)

    @property
    def cluster_id(self) -> str:
        return self._state.cluster_id

    @property
    def store(self) -> ObjectStore:
        return self.hot

    def partitions(self) -> list[tuple[str, int]]:
        topics = sorted(self._state.topics.values(), key=lambda t: t.name)
        return [(t.name, p) for t in topics for p in range(t.partitions)]

    def _meta(self, topic: str, partition: int) -> PartitionMeta:
        t = self._state.topic_by_name(topic)
        if t is None or (t.topic_id, partition) not in self._state.partitions:
            raise UnknownTopicError(f"{topic}-{partition} is not in the metadata (deleted meanwhile?)")
        return self._state.partition(t.topic_id, partition)

    def segments(self, topic: str, partition: int) -> list[SegmentRef]:
        return self._meta(topic, partition).segments.slice(0)

    def store_for(self, seg: SegmentRef) -> ObjectStore:
        if seg.tier == Tier.COLD:
            if self.cold is None:
                raise StorageError("read", seg.key, "segment is in the cold tier: give --cold-store to verify it")
            return self.cold
        return self.hot

    def clean_end(self, topic: str, partition: int) -> int:
        return int(self._meta(topic, partition).clean_end)

    def unsealed_records(self) -> int:
        """Records acknowledged but not sealed yet, summed over the partitions: in the running
        broker's WAL, which verify does not read. A lower bound: the metadata records each
        partition's acknowledged end only every `acked_end_interval_ms`."""
        return sum(max(0, pm.acked_end - pm.sealed_end) for pm in self._state.partitions.values())

    def chain_heads(self) -> dict[tuple[str, int], bytes]:
        out: dict[tuple[str, int], bytes] = {}
        for (tid, index), pm in self._state.partitions.items():
            t = self._state.topics.get(tid)
            if t is not None:
                out[(t.name, index)] = pm.chain_hash
        return out
