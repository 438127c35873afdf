"""Background merge: shared flush objects' ranges of one partition -> ordinary sealed segments.

Flush objects keep foreground PUTs independent of the partition count, but they interleave
partitions. The merge rewrites one partition's consecutive ranges into segments written by
the same SegmentWriter single-node sealing uses, under the same keys, so `loglake verify`, the
cold reader and Spark read them unchanged, and their hash chain continues the partition's.
Each range costs one ranged GET (checked against its CRC); each segment one PUT, counted as a
merge PUT, apart from the flusher's foreground PUTs. After each segment's PUT the `commit`
hook runs: switching the metadata from the ranges to the segment is the caller's.

When may a flush object go? Once no range in it is still referenced: every partition range it
holds has been merged and its metadata switch committed (`FlushObjectRefs`), and a grace
period has passed for readers that looked the range up just before the switch. An object no
committed metadata ever named (its commit failed) is garbage as soon as it is older than the
longest commit could take; sweeping those is the caller's, who can list `flush_prefix`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loglake.cluster.flushobj import FlushIndex, FlushIndexEntry, iter_batches, read_range
from loglake.errors import CorruptionError, MergeConflictError
from loglake.records.batch import ATTR_TRANSACTIONAL, peek_header
from loglake.records.committed import ABORT_MARKER, marker_of
from loglake.segment.format import SegmentTrailer, SegmentWriter, read_tail
from loglake.store.base import ObjectStore, segment_key

#: Bound on one merged segment (and on the bytes a merge holds in memory): ranges are grouped
#: until the next would pass it (a single bigger range makes a segment of its own).
MERGE_SEGMENT_BYTES = 64 * 1024 * 1024
#: Seconds a fully merged flush object is kept before it may be deleted, for readers that
#: looked a range up just before the metadata switched to the segment.
DELETE_GRACE_S = 60.0


@dataclass(frozen=True, slots=True)
class MergedSegment:
    """One segment a merge wrote, and the flush-object ranges it replaces."""

    key: str
    trailer: SegmentTrailer
    sources: tuple[tuple[str, FlushIndexEntry], ...]


@dataclass
class MergeStats:
    merge_puts: int = 0  # segment PUTs (background), never counted with the flusher's
    range_gets: int = 0
    segments: int = 0
    bytes_merged: int = 0


def plan_segments(
    ranges: Sequence[tuple[str, FlushIndexEntry]], segment_bytes: int = MERGE_SEGMENT_BYTES
) -> list[list[tuple[str, FlushIndexEntry]]]:
    """Group consecutive ranges into segments of at most `segment_bytes` (one range at least)."""
    groups: list[list[tuple[str, FlushIndexEntry]]] = []
    size = 0
    for r in ranges:
        if not groups or size + r[1].length > segment_bytes:
            groups.append([])
            size = 0
        groups[-1].append(r)
        size += r[1].length
    return groups


def merge_partition(
    store: ObjectStore,
    ranges: Sequence[tuple[str, FlushIndexEntry]],
    *,
    cluster_id: str,
    topic: str,
    prev_hash: bytes,
    prefix: str = "",
    commit: Callable[[MergedSegment], None] | None = None,
    segment_bytes: int = MERGE_SEGMENT_BYTES,
    stats: MergeStats | None = None,
    generation: int = 0,
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> list[MergedSegment]:
    """Rewrite `ranges` — (flush object key, index entry) of one partition, consecutive in
    offsets — into sealed segments chained after `prev_hash` (the partition's last segment's
    link hash, ZERO_HASH for its first). A corrupt range raises CorruptionError before any
    segment holding it is written; `commit` runs after each segment's PUT, in order. A segment
    already at the key with the same offsets and chain (an earlier attempt) is kept, not written
    again; a different one is a MergeConflictError. `generation` goes into the key
    (`<base>-g<n>.seg`): cluster mode passes the leader epoch, so a merger that lost leadership
    never writes the key its successor's merge writes."""
    if not ranges:
        return []
    stats = stats if stats is not None else MergeStats()
    topic_id, partition = ranges[0][1].topic_id, ranges[0][1].partition
    for (_k, a), (_k2, b) in itertools.pairwise(ranges):
        if (b.topic_id, b.partition) != (topic_id, partition) or b.base_offset != a.last_offset + 1:
            raise ValueError(f"ranges to merge must be one partition's, consecutive: {a} then {b}")
    out: list[MergedSegment] = []
    for group in plan_segments(ranges, segment_bytes):
        datas = []
        for key, entry in group:
            datas.append(read_range(store, key, entry))
            stats.range_gets += 1
        views = [v for d in datas for v in iter_batches(d)]
        headers = [peek_header(v) for v in views]
        transactional = any(h.attributes & ATTR_TRANSACTIONAL for h in headers)
        base = group[0][1].base_offset
        writer = SegmentWriter(base, prev_hash, wall_ms(), txn_index=transactional)
        aborts: list[tuple[int, int, int]] = []
        # A producer's first transactional batch in this segment since its last marker: where the
        # transaction its next marker ends begins here (one open transaction per producer and
        # partition). One that began before the segment begins, for this segment, at its base;
        # the base for every aborted transaction would cover a committed transaction of the same
        # producer earlier in the segment.
        open_first: dict[int, int] = {}
        for v, h in zip(views, headers, strict=True):
            writer.add_batch(v)
            if not h.is_transactional:
                continue
            if not h.is_control:
                open_first.setdefault(h.producer_id, h.base_offset)
                continue
            first = open_first.pop(h.producer_id, base)
            marker = marker_of(v)
            if marker is not None and marker[1] == ABORT_MARKER:
                aborts.append((h.producer_id, min(first, h.base_offset), h.base_offset))
        writer.aborted_txns = aborts
        parts, trailer, _index = writer.finish()
        key = segment_key(cluster_id, topic, topic_id, partition, base, prefix, generation)
        # create-only: of two mergers writing one key, one publishes and the other compares
        existing = None if store.put_if_absent(key, parts) else _existing(store, key)
        if existing is None:
            stats.merge_puts += 1
        elif (existing.last_offset, existing.chain_hash) == (trailer.last_offset, trailer.chain_hash):
            trailer = existing  # a retried merge: the same batches are there already, keep them
        else:
            raise MergeConflictError(
                key,
                f"holds offsets {existing.base_offset}..{existing.last_offset} with another hash chain "
                f"than the merge of {base}..{trailer.last_offset}; nothing written",
            )
        stats.segments += 1
        stats.bytes_merged += trailer.size
        seg = MergedSegment(key, trailer, tuple(group))
        if commit is not None:
            commit(seg)
        out.append(seg)
        prev_hash = trailer.link_hash
    return out


def _existing(store: ObjectStore, key: str) -> SegmentTrailer:
    """The trailer of the segment `put_if_absent` found at `key` (a retried merge, or another
    merger). The create is atomic on a local folder; on S3 it is a HEAD then a PUT, which two
    mergers of one partition can both pass: only the partition's leader merges, and its metadata
    switch is guarded by its leader epoch, so a stale merger's segment is never referenced."""
    size = store.head(key)
    if size is None:  # gone again: only a sweep of a deleted topic removes segments
        raise MergeConflictError(key, "an object was there at the create and is gone now; nothing written")
    try:
        return read_tail(store, key, size)[0]
    except CorruptionError as exc:
        raise MergeConflictError(key, f"an unreadable object is in the way ({exc.detail})") from None


@dataclass
class FlushObjectRefs:
    """Which ranges of each flush object the metadata still points at, and so which objects may
    be deleted: `add` an object once its commit succeeded, `release` a range once the metadata
    switch to its merged segment is committed (or its partition was deleted or truncated past
    it); `deletable` lists the objects with no range left, released at least `grace_s` ago."""

    grace_s: float = DELETE_GRACE_S
    clock: Callable[[], float] = time.monotonic
    # one entry per committed object not yet merged: bounded by the flusher's PUT rate times the
    # merge's lag, which the caller watches (a merge that falls behind is an operator's alarm)
    _live: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    _released: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, index: FlushIndex) -> None:
        with self._lock:
            self._live[index.key] = {(e.topic_id, e.partition) for e in index.entries}

    def release(self, key: str, topic_id: str, partition: int) -> bool:
        """Mark one range unreferenced; True when the object has none left."""
        with self._lock:
            live = self._live.get(key)
            if live is None:
                return key in self._released
            live.discard((topic_id, partition))
            if live:
                return False
            del self._live[key]
            self._released[key] = self.clock()
            return True

    def referenced(self, key: str) -> bool:
        with self._lock:
            return key in self._live

    def deletable(self) -> list[str]:
        now = self.clock()
        with self._lock:
            return sorted(k for k, t in self._released.items() if now - t >= self.grace_s)

    def sweep(self, store: ObjectStore) -> list[str]:
        """Delete every deletable object; returns their keys."""
        done = []
        for key in self.deletable():
            store.delete(key)
            with self._lock:
                self._released.pop(key, None)
            done.append(key)
        return done
