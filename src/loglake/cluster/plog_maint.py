"""Merge and sweep for cluster partitions, wired to the metadata records (loglake.meta.cluster).

**Merge.** Only the partition's leader merges: `merge` rewrites the partition's committed ranges
into sealed segments (loglake.cluster.merge) keyed `<base>-g<epoch>.seg`, and switches the
metadata with a `plog_merged` record guarded by the leader's epoch key. A merger that lost
leadership may still finish a PUT, but under its own epoch's key — never the key its successor
writes — and its switch is fenced, so its segment is never referenced.

**Log start.** Only the partition's leader raises its log start offset (DeleteRecords,
retention): `advance_start` commits a `plog_start` record guarded by the leader's epoch key,
so a deposed leader's raise never applies. Merged segments and flush ranges wholly below the
new start leave the partition with it; the sweep deletes them after DELETE_GRACE_S, the grace
a reader that looked them up just before is given. `retention_start` says how far retention
(retention.ms, retention.bytes) moves it: past whole merged segments and ranges only, as a
single node drops whole segments. A merge and a raise of one partition take turns
(`ClusterPartitionLog.rewrite_lock`): a merge switches exactly the ranges it read.

**Sweep.** Two kinds of flush objects go, and the merged segments of deleted topics:
  * unreferenced: every range in it was switched to a merged segment; it is deleted once
    DELETE_GRACE_S has passed since the switch, for readers that looked a range up just before;
  * orphaned: listed under `flush/` but named by no committed range — its commit failed, was
    fenced, or its answer was lost — and older than ORPHAN_GRACE_S (its header's time), which is
    far longer than any commit may take;
  * a deleted topic's merged segments (and flush objects only its ranges referenced, which are
    unreferenced from the deletion on), once DELETE_GRACE_S has passed since the deletion;
  * merged segments wholly below a raised log start (and flush objects only such ranges
    referenced), once DELETE_GRACE_S has passed since the raise.
Either way a `plog_swept` record naming the keys is committed *before* anything is deleted: it
refuses to apply if a key became referenced meanwhile (nothing is deleted then), and it
condemns orphans, so a commit of one landing later still is refused by every broker. A delete
that fails leaves an orphan the next sweep finds again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from loglake.cluster.etcd import Guard
from loglake.cluster.flushobj import FlushIndexEntry, check_header, flush_prefix
from loglake.cluster.merge import DELETE_GRACE_S, MergedSegment, MergeStats, merge_partition
from loglake.cluster.plog import COMMIT_WAIT_S, ClusterPartitionLog, NotLeaderError
from loglake.engine.config import TopicConfig
from loglake.errors import CorruptionError, MetaFencedError, OffsetOutOfRangeError
from loglake.meta.cluster import Plog, PlogRange, PlogSegment, epoch_key
from loglake.meta.records import PlogMerged, PlogStart, PlogSwept
from loglake.meta.state import MetaState
from loglake.segment.format import HEADER_SIZE, ZERO_HASH
from loglake.store.base import ObjectNotFoundError, cluster_prefix

__all__ = [
    "ORPHAN_GRACE_S",
    "SWEEP_KEYS_PER_RECORD",
    "SweepReport",
    "advance_start",
    "merge",
    "retention_start",
    "sweep",
]

log = logging.getLogger(__name__)

#: Age (by the object's header time) past which a flush object no committed range names is
#: swept: a commit is answered or failed within the store's `unavailable_s` (15 s) plus the
#: commit wait, so ten minutes leaves ample room for clock skew between brokers.
ORPHAN_GRACE_S = 600.0
#: Keys named by one `plog_swept` record (a record stays far below etcd's request limit).
SWEEP_KEYS_PER_RECORD = 1000
#: Flush objects looked at by one sweep (the rest wait for the next).
SWEEP_LIST_MAX = 100_000


def merge(
    plog: ClusterPartitionLog,
    topic_id: str,
    partition: int,
    topic: str,
    *,
    stats: MergeStats | None = None,
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> list[MergedSegment]:
    """Merge the partition's committed ranges into segments and switch the metadata to them.
    NotLeaderError when this broker does not lead it; MetaFencedError when it lost the epoch."""
    if not plog.leads(topic_id, partition):
        raise NotLeaderError(
            f"node {plog.node_id} does not lead {topic_id}-{partition}; only the leader merges"
        )
    with plog.rewrite_lock(topic_id, partition):
        return _merge(plog, topic_id, partition, topic, stats, wall_ms)


def _merge(
    plog: ClusterPartitionLog,
    topic_id: str,
    partition: int,
    topic: str,
    stats: MergeStats | None,
    wall_ms: Callable[[], int],
) -> list[MergedSegment]:
    tid = bytes.fromhex(topic_id)
    current: Plog = plog.meta.read(lambda s: s.plogs.part(tid, partition))
    epoch, ranges = current.epoch, list(current.ranges)
    prev = bytes.fromhex(current.segments[-1].link) if current.segments else ZERO_HASH
    inputs = [
        (
            r.key,
            FlushIndexEntry(
                topic_id, partition, r.base, r.last, r.pos, r.length, r.count, r.max_ts, r.batches, r.crc
            ),
        )
        for r in ranges
    ]

    def switch(seg: MergedSegment) -> None:
        t = seg.trailer
        merged = PlogSegment(seg.key, t.base_offset, t.last_offset, t.size, t.index_position, t.data_crc,
                             t.link_hash.hex(), t.record_count, t.max_timestamp)  # fmt: skip
        record = PlogMerged(topic_id, partition, epoch, wall_ms(), len(seg.sources), merged)
        guard = Guard(epoch_key(topic_id, partition), value=str(epoch).encode())
        try:
            plog.meta.append_if(record, [guard]).result(COMMIT_WAIT_S)
        except MetaFencedError:
            plog._stop(
                (topic_id, partition), NotLeaderError(f"{topic_id}-{partition}: fenced during a merge")
            )
            raise

    return merge_partition(
        plog.store,
        inputs,
        cluster_id=plog.cluster_id,
        topic=topic,
        prev_hash=prev,
        prefix=plog.prefix,
        commit=switch,
        stats=stats,
        generation=epoch,
        wall_ms=wall_ms,
    )


def advance_start(
    plog: ClusterPartitionLog,
    topic_id: str,
    partition: int,
    offset: int,
    *,
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> int:
    """Raise the partition's log start offset to `offset` (-1: the committed end), as Kafka's
    DeleteRecords does; returns the log start after it (the "low watermark"). A start at or
    below the current one changes nothing. NotLeaderError when this broker does not lead the
    partition or lost its epoch meanwhile (the record is fenced then and nothing applies);
    OffsetOutOfRangeError when `offset` is past the committed end."""
    if not plog.leads(topic_id, partition):
        raise NotLeaderError(f"node {plog.node_id} does not lead {topic_id}-{partition}")
    tid = bytes.fromhex(topic_id)
    with plog.rewrite_lock(topic_id, partition):
        epoch = plog.epoch_of(topic_id, partition)
        current: Plog = plog.meta.read(lambda s: s.plogs.part(tid, partition))
        if epoch is None or epoch != current.epoch:
            raise NotLeaderError(f"{topic_id}-{partition}: epoch {current.epoch} is not this leader's {epoch}")
        target = current.end if offset == -1 else offset
        if not 0 <= target <= current.end:
            raise OffsetOutOfRangeError(
                f"cannot delete records of {topic_id}-{partition} below {offset}: high watermark is {current.end}",
                log_start_offset=current.log_start,
                high_watermark=current.end,
            )
        if target <= current.log_start:
            return current.log_start
        record = PlogStart(topic_id, partition, epoch, wall_ms(), target)
        guard = Guard(epoch_key(topic_id, partition), value=str(epoch).encode())
        try:
            plog.meta.append_if(record, [guard]).result(COMMIT_WAIT_S)
        except MetaFencedError:
            error = NotLeaderError(f"{topic_id}-{partition}: fenced while raising the log start")
            plog._stop((topic_id, partition), error)
            raise error from None
        return target


def retention_start(current: Plog, config: TopicConfig, now_ms: int) -> int | None:
    """Where retention moves the partition's log start: past the whole merged segments and flush
    ranges from the front that are older than retention.ms (their newest record) or that keep
    the partition over retention.bytes, as a single node drops whole segments; None when
    nothing is due (or the topic's cleanup.policy has no `delete`)."""
    if "delete" not in config.cleanup_policy:
        return None
    sources: list[PlogSegment | PlogRange] = [*current.segments, *current.ranges]
    total = sum(_size(s) for s in sources) if config.retention_bytes >= 0 else 0
    start: int | None = None
    for src in sources:  # stops at the first one kept: O(dropped)
        expired = config.retention_ms >= 0 and src.max_ts < now_ms - config.retention_ms
        oversize = config.retention_bytes >= 0 and total > config.retention_bytes
        if not (expired or oversize):
            break
        start = src.last + 1
        total -= _size(src)
    return start if start is not None and start > current.log_start else None


def _size(src: PlogSegment | PlogRange) -> int:
    return src.size if isinstance(src, PlogSegment) else src.length


@dataclass
class SweepReport:
    unreferenced: list[str]
    orphans: list[str]
    refused: int = 0  # keys whose sweep record did not apply (they became referenced)
    abandoned: int = 0  # leftovers of uploads a crashed broker never finished (a shared folder's)


def sweep(
    plog: ClusterPartitionLog,
    *,
    delete_grace_s: float = DELETE_GRACE_S,
    orphan_grace_s: float = ORPHAN_GRACE_S,
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> SweepReport:
    """Delete unreferenced flush objects past their grace, orphans past theirs, and what crashed
    writers left of their uploads (a shared folder's temp files) after the orphans' grace."""
    now = wall_ms()
    plog.meta.sync()  # see every commit and switch made so far

    def view(state: MetaState) -> tuple[list[str], set[str]]:
        t = state.plogs
        free = [k for k, ms in t.free.items() if now - ms >= delete_grace_s * 1000]
        free += [k for k, ms in t.dropped.items() if now - ms >= delete_grace_s * 1000]
        return free, set(t.objects) | set(t.free) | set(t.condemned)

    free, known = plog.meta.read(view)
    orphans = []
    for key in plog.store.list(flush_prefix(plog.cluster_id, plog.prefix))[:SWEEP_LIST_MAX]:
        if key in known:
            continue
        try:
            _node, _seq, created_ms = check_header(plog.store.get_range(key, 0, HEADER_SIZE), key)
        except CorruptionError as exc:
            log.warning("flush object %s has no readable header (%s); left for an operator", key, exc.detail)
            continue
        except ObjectNotFoundError:
            continue  # deleted since it was listed (an earlier sweep's delete landing late)
        if now - created_ms >= orphan_grace_s * 1000:
            orphans.append(key)
    report = SweepReport([], [])
    # A broker killed mid-PUT leaves a temp file in a shared folder (none in S3): gone after the
    # orphans' grace, which no PUT outlasts. No record needed: no metadata ever names one.
    report.abandoned = plog.store.delete_abandoned_uploads(
        cluster_prefix(plog.cluster_id, plog.prefix), now - int(orphan_grace_s * 1000)
    )
    keys = free + orphans
    for i in range(0, len(keys), SWEEP_KEYS_PER_RECORD):
        part = keys[i : i + SWEEP_KEYS_PER_RECORD]
        try:
            plog.meta.append(PlogSwept(part)).result(COMMIT_WAIT_S)
        except Exception as exc:  # became referenced (refused) or etcd away: delete nothing of these
            log.info(
                "sweep of %d flush objects not committed (%s); retried at the next sweep", len(part), exc
            )
            report.refused += len(part)
            continue
        for key in part:
            plog.store.delete(key)
            (report.orphans if key in orphans else report.unreferenced).append(key)
    return report
