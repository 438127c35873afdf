"""Key compaction of cluster partitions (`cleanup.policy=compact`), done by the leader alone.

The rules are the single node's (loglake.engine.compaction: the plan, the key map, the record
filter; loglake.engine.rewrite: reading, verifying and rewriting segments), applied to the
partition's **merged** segments — the committed flush ranges not merged yet are its head, never
compacted, as a single node never touches unsealed data. A pass:

  1. plans over the merged segments with `plan_segments` (min.compaction.lag.ms by each
     segment's newest record time, which the metadata records; the dirty ratio against the
     partition's `clean_end`); the dirty bytes it maps are bounded by COMPACT_PASS_BYTES_MAX
     (the rest is the next pass's);
  2. reads each segment's trailer for its hashes, then builds the rewritten segments with
     `run_job` (every input verified against its CRCs and chain before anything is written):
     offsets kept, batches keep their base and last offsets, control batches kept, tombstones
     kept for delete.retention.ms after the pass that first passed them;
  3. switches the metadata with a `plog_compacted` record guarded by the leader's epoch key
     (loglake.meta.cluster): a deposed leader's switch is fenced and never applies, and its
     objects — under its own epoch's generations, never its successor's keys — are deleted;
  4. the replaced segments are dropped at the switch and deleted by the sweep after its grace
     (loglake.cluster.plog_maint.sweep), for readers that looked them up just before.

The new segments continue the partition's hash chain: each one's provenance names the
segments it replaced, and the last one ends on the link hash the next segment's prev hash names
(docs/FORMAT.md, "Rewritten segments"), so `loglake verify --cold-store` proves a compacted
cluster bucket as it proves a single node's.

Generations: an output's key and trailer carry generation `epoch * GENERATIONS_PER_EPOCH + n`
(n >= 1, one more than the epoch's last pass), so two leaders' outputs never share a key — on S3
a create is a HEAD then a PUT, which two writers of one key could both pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from loglake.cluster.etcd import Guard
from loglake.cluster.merge import MERGE_SEGMENT_BYTES
from loglake.cluster.plog import COMMIT_WAIT_S, ClusterPartitionLog, NotLeaderError
from loglake.engine.cleaner_job import CompactJob, JobResult, run_job
from loglake.engine.compaction import plan_segments
from loglake.engine.config import TopicConfig
from loglake.engine.rewrite import REWRITE_SEGMENTS_MAX
from loglake.errors import CorruptionError, LoglakeError, MetaFencedError, MetaRecordRejectedError
from loglake.meta.cluster import PlogSegment, epoch_key
from loglake.meta.lifecycle import Tier
from loglake.meta.records import PlogCompacted
from loglake.meta.segments import SegmentRef
from loglake.meta.state import MetaState
from loglake.segment.format import read_tail
from loglake.store.base import ObjectStore, partition_prefix, segment_file_name

__all__ = ["COMPACT_PASS_BYTES_MAX", "GENERATIONS_PER_EPOCH", "CompactReport", "compact"]

log = logging.getLogger(__name__)

#: Dirty bytes (merged segments past the clean end) one pass maps; the rest waits for the next
#: pass. The rewrite reads the cleaned head before them too, as Kafka's cleaner does: after a
#: pass that is about one record per key.
COMPACT_PASS_BYTES_MAX = 256 * 1024 * 1024
#: Rewrite generations each leader epoch owns: epoch e writes e * this + 1 ... e * this + this - 1.
GENERATIONS_PER_EPOCH = 1000
#: The segment trailer's generation is a u32 (docs/FORMAT.md).
_GENERATION_MAX = 2**32 - 1


@dataclass
class CompactReport:
    """What one pass did (None from `compact` when no pass was due)."""

    segments_in: int
    segments_out: int
    map_end: int
    records_in: int
    records_out: int
    tombstones_dropped: int
    bytes_read: int
    bytes_written: int


@dataclass
class _View:
    epoch: int
    log_start: int
    segments: list[PlogSegment]
    clean_end: int
    clean_marks: list[list[int]]
    tombstone_ms: int
    #: first offset of the earliest open transaction (None: none open), and the aborted ones as
    #: [producer id, first offset, marker offset]: the partition's metadata, as on a single node
    stable_end: int | None
    aborted: list[list[int]]


def compact(
    plog: ClusterPartitionLog,
    topic_id: str,
    partition: int,
    topic: str,
    config: TopicConfig,
    *,
    dedupe_bytes: int,
    retain_empty: set[tuple[int, int]],
    force: bool = False,
    pass_bytes: int = COMPACT_PASS_BYTES_MAX,
    io_bytes_per_s: int = 0,
    execute: Callable[[CompactJob], JobResult] | None = None,
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> CompactReport | None:
    """One compaction pass of the partition if one is due (or `force`d: whatever is dirty);
    None when none is. NotLeaderError when this broker does not lead it or lost its epoch (its
    switch is fenced then, and nothing it wrote is referenced). `retain_empty`: the (producer
    id, base offset) of each idempotent producer's newest batch, kept as an empty header when
    all its records go (its sequence state). `io_bytes_per_s` bounds the pass's reads and writes
    (0: unbounded; the broker passes `cleaner_io_max_bytes_per_second`). `execute` builds the
    rewritten segments of a job (the broker: in a cleaner worker process, as a single node does,
    loglake.engine.cleaner_job); without it they are built on this thread."""
    if not plog.leads(topic_id, partition):
        raise NotLeaderError(f"node {plog.node_id} does not lead {topic_id}-{partition}; only the leader compacts")
    with plog.rewrite_lock(topic_id, partition):
        run = execute or (lambda job: run_job(job, {Tier.COLD: plog.store}))
        return _compact(
            plog, topic_id, partition, topic, config, dedupe_bytes, retain_empty, force, pass_bytes, io_bytes_per_s, run,
            wall_ms,
        )  # fmt: skip


def _compact(
    plog: ClusterPartitionLog,
    topic_id: str,
    partition: int,
    topic: str,
    config: TopicConfig,
    dedupe_bytes: int,
    retain_empty: set[tuple[int, int]],
    force: bool,
    pass_bytes: int,
    io_bytes_per_s: int,
    execute: Callable[[CompactJob], JobResult],
    wall_ms: Callable[[], int],
) -> CompactReport | None:
    tid = bytes.fromhex(topic_id)

    def read(s: MetaState) -> _View:
        pl = s.plogs.part(tid, partition)
        pm = s.partitions.get((tid, partition))
        marks = [list(m) for m in pm.clean_marks] if pm is not None else []
        clean_end, tomb_ms = (pm.clean_end, pm.tombstone_ms) if pm is not None else (0, -1)
        stable_end = min(pm.txn_open.values(), default=None) if pm is not None else None
        aborted = [list(a) for a in pm.aborted_txns] if pm is not None else []
        return _View(pl.epoch, pl.log_start, list(pl.segments), clean_end, marks, tomb_ms, stable_end, aborted)

    view = plog.meta.read(read)
    epoch = plog.epoch_of(topic_id, partition)
    if epoch is None or epoch != view.epoch:
        raise NotLeaderError(f"{topic_id}-{partition}: epoch {view.epoch} is not this leader's {epoch}")
    now_ms = wall_ms()
    # an open transaction bounds the plan (its records are never cleaned) and aborted ones never
    # enter the key map nor supersede committed records: the single node's rules
    plan = plan_segments(
        [_plan_ref(s) for s in view.segments], view.clean_end, view.stable_end, view.tombstone_ms, config, now_ms,
        force=force,
    )
    if plan is None:
        return None
    dirty: list[SegmentRef] = []
    size = 0
    for seg in plan.dirty:  # bounded: at least one segment, then while within pass_bytes
        if dirty and size + seg.size > pass_bytes:
            break
        dirty.append(seg)
        size += seg.size
    run = [s for s in plan.run if not dirty or s.base_offset <= dirty[-1].last_offset][:REWRITE_SEGMENTS_MAX]
    dirty = [s for s in dirty if s.last_offset <= run[-1].last_offset]
    store = plog.store
    by_key = {s.key: s for s in view.segments}
    full = {s.key: _full_ref(store, by_key[s.key]) for s in run}
    key_prefix = partition_prefix(plog.cluster_id, topic, topic_id, partition, plog.prefix)
    generation = _generation(plog, key_prefix, epoch, view.segments, run)
    job = CompactJob(
        store_urls={},
        key_prefix=key_prefix,
        run=[full[s.key] for s in run],
        dirty=[full[s.key] for s in dirty],
        start=max(view.clean_end, view.log_start),
        bytes_max=dedupe_bytes,
        clean_marks=view.clean_marks,
        delete_retention_ms=config.delete_retention_ms,
        now_ms=now_ms,
        retain_empty=retain_empty,
        log_last_offset=view.segments[-1].last,
        target_bytes=min(config.segment_bytes, MERGE_SEGMENT_BYTES),
        io_bytes_per_s=io_bytes_per_s,
        config_params={
            "delete_retention_ms": config.delete_retention_ms,
            "min_compaction_lag_ms": config.min_compaction_lag_ms,
        },
        chunk_segments=REWRITE_SEGMENTS_MAX,
        generation=generation,
        aborted=view.aborted,
    )
    result = execute(job)
    _switch(plog, topic_id, partition, epoch, view, result, now_ms)
    counts, stats = result.counts, result.stats
    report = CompactReport(
        stats.segments_in, stats.segments_out, result.map_end, counts.get("records_in", 0),
        counts.get("records_out", 0), counts.get("tombstones_dropped", 0), stats.bytes_read, stats.bytes_written,
    )  # fmt: skip
    log.info(
        "compacted %s-%d: %d merged segments into %d, %d keys mapped up to offset %d, %d of %d records kept",
        topic, partition, report.segments_in, report.segments_out, result.keys_mapped, result.map_end,
        report.records_out, report.records_in,
    )  # fmt: skip
    return report


def _switch(
    plog: ClusterPartitionLog,
    topic_id: str,
    partition: int,
    epoch: int,
    view: _View,
    result: JobResult,
    now_ms: int,
) -> None:
    """Commit each chunk's `plog_compacted` in order (the last carries the pass's clean end);
    outputs that can never be referenced (fenced, refused) are deleted again."""
    guard = Guard(epoch_key(topic_id, partition), value=str(epoch).encode())
    tomb_ms = result.counts.get("tomb_ms", -1)
    chunks = result.chunks
    for i, (run, outputs) in enumerate(chunks):
        last = i == len(chunks) - 1
        segs = [_plog_segment(plog, ref) for ref, _index in outputs]
        clean = (result.map_end, now_ms, tomb_ms) if last else (view.clean_end, now_ms, view.tombstone_ms)
        record = PlogCompacted(topic_id, partition, epoch, now_ms, [s.key for s in run], segs, clean)
        try:
            plog.meta.append_if(record, [guard]).result(COMMIT_WAIT_S)
        except MetaFencedError:
            _delete(plog, [ref.key for _run, outs in chunks[i:] for ref, _ in outs])
            error = NotLeaderError(f"{topic_id}-{partition}: fenced during a compaction")
            plog._stop((topic_id, partition), error)
            raise error from None
        except MetaRecordRejectedError:
            # in the log but applied nowhere (the segments moved: a deleted topic): never referenced
            _delete(plog, [ref.key for _run, outs in chunks[i:] for ref, _ in outs])
            raise
        except LoglakeError:
            # unanswered: this chunk's outputs are referenced if the switch landed; the later
            # chunks' never are
            _delete(plog, [ref.key for _run, outs in chunks[i + 1 :] for ref, _ in outs])
            raise


def _plan_ref(s: PlogSegment) -> SegmentRef:
    """A merged segment as the planner sees it. The metadata records no creation time: its newest
    record's time stands in (a segment is merged after its last record was written)."""
    link = bytes.fromhex(s.link)
    return SegmentRef(s.base, s.last, s.key, s.size, s.max_ts, s.count, b"", link, s.max_ts, Tier.COLD, None, s.gen, link)


def _full_ref(store: ObjectStore, s: PlogSegment) -> SegmentRef:
    """The segment with its hashes, from its trailer (one ranged GET), checked against the metadata."""
    trailer, _index = read_tail(store, s.key, s.size)
    if (trailer.base_offset, trailer.last_offset, trailer.link_hash.hex(), trailer.generation) != (s.base, s.last, s.link, s.gen):
        raise CorruptionError(s.key, 0, "merged segment's trailer does not match the metadata")
    return SegmentRef.from_trailer(s.key, trailer, Tier.COLD, None)


def _generation(
    plog: ClusterPartitionLog, key_prefix: str, epoch: int, segments: list[PlogSegment], run: list[SegmentRef]
) -> int:
    """The outputs' generation: in this epoch's range, above its earlier passes', and free at
    every base the outputs may start at (an earlier attempt's unreferenced objects are skipped)."""
    floor = epoch * GENERATIONS_PER_EPOCH
    n = 1 + max((s.gen - floor for s in segments if floor < s.gen < floor + GENERATIONS_PER_EPOCH), default=0)
    while n < GENERATIONS_PER_EPOCH and floor + n <= _GENERATION_MAX:
        gen = floor + n
        if all(plog.store.head(key_prefix + segment_file_name(s.base_offset, gen)) is None for s in run):
            return gen
        n += 1
    raise LoglakeError(
        f"epoch {epoch} has no rewrite generation left (at most {GENERATIONS_PER_EPOCH - 1} passes per epoch "
        f"and generation {_GENERATION_MAX}); the partition's next leader compacts it"
    )


def _plog_segment(plog: ClusterPartitionLog, ref: SegmentRef) -> PlogSegment:
    trailer, _index = read_tail(plog.store, ref.key, ref.size)
    return PlogSegment(
        ref.key, trailer.base_offset, trailer.last_offset, trailer.size, trailer.index_position,
        trailer.data_crc, trailer.link_hash.hex(), trailer.record_count, trailer.max_timestamp, trailer.generation,
    )  # fmt: skip


def _delete(plog: ClusterPartitionLog, keys: list[str]) -> None:
    for key in keys:
        try:
            plog.store.delete(key)
        except Exception as exc:  # an unreferenced leftover: harmless, and rare
            log.warning("could not delete %s, written by a compaction that was not switched to: %s", key, exc)
