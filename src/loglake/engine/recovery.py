"""Opening a data directory: snapshot → store reconciliation → WAL replay.

1. Load the newest valid metadata snapshot (topics, configs, segment chains, log start offsets).
2. Reconcile each partition's chain with what the segment store really holds: a segment
   published after the snapshot was written (crash between publish and snapshot) continues the
   chain and is adopted; leftovers below the chain (retention, deleted topics) are removed.
   A segment the snapshot lists but the store lacks is an error: that data was acknowledged.
3. Replay every WAL shard: frames already sealed are skipped, the rest refill the unsealed
   buffers, densely; a torn tail is truncated and counted.
4. Start the WAL writers and write a fresh snapshot, so what recovery adopted is on record.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import defaultdict
from typing import TYPE_CHECKING

from loglake.engine.config import TopicConfig
from loglake.engine.partition import BufferedAppend, Partition, SegmentRef
from loglake.engine.producers import ProducerStates
from loglake.engine.published import read_published
from loglake.engine.types import RecoveryReport
from loglake.errors import CorruptionError, LoglakeError
from loglake.records.batch import peek_header
from loglake.segment.format import read_tail
from loglake.store.base import ObjectStore, parse_segment_key, partition_prefix, segment_key
from loglake.wal.recovery import ReplayFrame, recover_wal

if TYPE_CHECKING:
    from loglake.engine.engine import Engine, TopicState

log = logging.getLogger(__name__)


def recover(engine: Engine) -> RecoveryReport:
    from loglake.engine.engine import SNAPSHOT_VERSION, TopicState, _new_cluster_id

    started = time.perf_counter()
    report = RecoveryReport()
    loaded = engine._snapshots.load()
    restored = False
    if loaded is None and engine._cold_store is not None:
        try:
            doc = read_published(engine._cold_store)
        except CorruptionError as exc:
            if not engine._cold_store.list("loglake-"):
                doc = None  # an empty bucket: a new cluster
            else:
                raise CorruptionError(engine._cold_store.url, 0, f"cannot restore from the cold store: {exc}") from exc
        if doc is not None:
            log.warning(
                "data directory %s has no metadata: restoring from %s (published seq %s)",
                engine.data_dir,
                engine._cold_store.url,
                doc.get("seq"),
            )
            loaded = (int(doc.get("seq", 0)), doc)
            restored = True
            report.restored_from = engine._cold_store.url
    if loaded is None:
        engine._cluster_id = _new_cluster_id()
    else:
        seq, payload = loaded
        report.snapshot_seq = None if restored else seq
        version = payload.get("version")
        if version != SNAPSHOT_VERSION:
            raise CorruptionError(
                engine._snapshots.directory, 0, f"metadata snapshot version {version} is not supported (want 1)"
            )
        engine._cluster_id = str(payload["cluster_id"])
        engine._extra_meta = dict(payload.get("extra", {}))
        for name, t in payload["topics"].items():
            topic = TopicState(
                name,
                bytes.fromhex(t["id"]),
                TopicConfig.parse(t["config"], engine.config.topic_defaults),
                int(t["created_ms"]),
            )
            for i in range(int(t["partitions"])):
                p = engine._new_partition(topic, i)
                state = payload["partitions"].get(f"{t['id']}/{i}")
                if state is not None:
                    p.log_start_offset = int(state["log_start"])
                    p.sealed_end = int(state["sealed_end"])
                    p.chain_hash = bytes.fromhex(state["chain"])
                    p.producers = ProducerStates.from_json(state.get("producers", {}))
                    for raw in state["segments"]:
                        key = segment_key(engine._cluster_id, name, t["id"], i, int(raw[0]))
                        p.segments.append(SegmentRef.from_json(key, raw))
                topic.partitions.append(p)
            engine._topics[name] = topic
            engine._topics_by_id[topic.topic_id] = topic
        if restored:
            _restore_from_cold(engine, report)
    report.topics = len(engine._topics)
    report.partitions = sum(len(t.partitions) for t in engine._topics.values())

    _reconcile_store(engine, report)

    wal = recover_wal(engine.fs, os.path.join(engine.data_dir, "wal"))
    report.wal_frames_read = wal.frames_read
    report.wal_bytes_read = wal.bytes_read
    report.wal_bytes_truncated = wal.bytes_truncated
    report.wal_files_truncated = list(wal.truncated_files)
    _replay(engine, wal.frames, report)

    for topic in engine._topics.values():
        for p in topic.partitions:
            p.set_hw(p.next_offset)
            p.snapshot_sealed_end = p.sealed_end
    engine._start_shards(
        {name: s.next_seq for name, s in wal.shards.items()},
        {name: s.files for name, s in wal.shards.items()},
    )
    engine.write_snapshot()
    report.seconds = time.perf_counter() - started
    return report


def _reconcile_store(engine: Engine, report: RecoveryReport) -> None:
    store = engine.store
    cleanup = getattr(store, "delete_stale_temps", None)
    if cleanup is not None:
        cleanup()
    cluster_prefix = f"loglake-{engine._cluster_id}/"
    live_dirs: dict[str, TopicState] = {f"{t.name}-{t.topic_id.hex()}": t for t in engine._topics.values()}
    by_partition: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    for key in store.list(cluster_prefix):
        try:
            parsed = parse_segment_key(key)
        except LoglakeError:
            continue
        topic_dir = f"{parsed.topic}-{parsed.topic_id}"
        if topic_dir not in live_dirs:
            # A deleted topic whose objects were not all removed before a restart.
            store.delete(key)
            report.orphans_removed.append(key)
            continue
        by_partition[(topic_dir, parsed.partition)].append((parsed.base_offset, key))
    for topic_dir, topic in live_dirs.items():
        for p in topic.partitions:
            found = sorted(by_partition.get((topic_dir, p.index), []))
            _reconcile_partition(engine, topic, p, found, report)


def _reconcile_partition(
    engine: Engine, topic: TopicState, p: Partition, found: list[tuple[int, str]], report: RecoveryReport
) -> None:
    """Match one partition's chain with the hot store's listing (see the module docstring)."""
    hot = {s.key for s in p.segments if s.tier == "hot"}
    cold = {s.key for s in p.segments if s.tier == "cold"}
    present = {key for _, key in found}
    for seg in p.segments:
        if seg.tier == "hot" and seg.key not in present:
            raise CorruptionError(
                seg.key, 0, f"segment of {topic.name}-{p.index} listed in the metadata is missing from {engine.store.url}"
            )
    for base, key in found:
        if key in hot:
            continue
        if key in cold:
            engine.store.delete(key)  # relocated: the metadata switched to the cold copy before a crash
            report.orphans_removed.append(key)
            continue
        if base < p.sealed_end:
            engine.store.delete(key)  # superseded: retention or a re-seal left it behind
            report.orphans_removed.append(key)
            continue
        if base == p.sealed_end and _adopt(engine, engine.store, p, key, "hot"):
            report.segments_adopted += 1
            continue
        log.warning("segment %s does not continue the chain of %s-%d; left in place", key, topic.name, p.index)
    p.next_offset = p.sealed_end


def _adopt(engine: Engine, store: ObjectStore, p: Partition, key: str, tier: str) -> bool:
    """Take a published-but-unrecorded segment into the chain if it continues it."""
    trailer, index = read_tail(store, key)
    if trailer.base_offset != p.sealed_end or trailer.prev_hash != p.chain_hash:
        return False
    p.segments.append(
        SegmentRef.from_trailer(key, trailer, tier, index)
    )
    p.sealed_end = trailer.next_offset
    p.chain_hash = trailer.chain_hash
    log.info("adopted segment %s published after the last metadata record", key)
    return True


def _restore_from_cold(engine: Engine, report: RecoveryReport) -> None:
    """Disaster recovery: keep what the bucket really holds, drop what lived only on the lost disk."""
    cold = engine._cold_store
    assert cold is not None
    for topic in engine._topics.values():
        for p in topic.partitions:
            prefix = partition_prefix(engine._cluster_id, topic.name, p.topic_id.hex(), p.index)
            in_bucket = set(cold.list(prefix))
            kept: list[SegmentRef] = []
            for seg in p.segments:
                if seg.key not in in_bucket:
                    break  # this and everything after it were hot on the lost disk
                seg.tier = "cold"
                kept.append(seg)
            lost = p.segments[len(kept) :]
            for seg in lost:
                report.segments_lost.append(seg.key)
                log.warning("segment %s was only on the lost local disk: offsets %d..%d are gone", seg.key, seg.base_offset, seg.last_offset)
            p.segments = kept
            if lost:
                p.sealed_end = kept[-1].end_offset if kept else lost[0].base_offset
                p.chain_hash = kept[-1].chain_hash if kept else lost[0].prev_hash
            # Segments uploaded after the metadata was last published continue the chain.
            for key in sorted(in_bucket - {s.key for s in kept}):
                if key.endswith(".seg") and _adopt(engine, cold, p, key, "cold"):
                    report.segments_adopted += 1
            p.log_start_offset = min(p.log_start_offset, p.sealed_end)
            p.next_offset = p.sealed_end


def _replay(engine: Engine, frames: list[ReplayFrame], report: RecoveryReport) -> None:
    by_partition: dict[tuple[bytes, int], list[ReplayFrame]] = defaultdict(list)
    for frame in frames:
        by_partition[(frame.topic_id, frame.partition)].append(frame)
    now = time.monotonic()
    for (topic_id, index), items in by_partition.items():
        topic = engine._topics_by_id.get(topic_id)
        if topic is None or index >= len(topic.partitions):
            report.wal_frames_skipped += len(items)
            continue
        p = topic.partitions[index]
        items.sort(key=lambda f: f.base_offset)
        for frame in items:
            if frame.end_offset <= p.next_offset:
                report.wal_frames_skipped += 1
                continue
            if frame.base_offset != p.next_offset:
                raise CorruptionError(
                    os.path.join(engine.data_dir, "wal"),
                    0,
                    f"{topic.name}-{index}: WAL frames jump from offset {p.next_offset} to {frame.base_offset} "
                    f"(topic id {uuid.UUID(bytes=topic_id)})",
                )
            positions: list[int] = []
            max_ts = -1
            pos = 0
            payload = frame.payload
            while pos < len(payload):
                header = peek_header(payload, pos)
                positions.append(pos)
                max_ts = max(max_ts, header.max_timestamp)
                if header.producer_id >= 0 and header.base_sequence >= 0:
                    p.producers.record(
                        header.producer_id,
                        header.producer_epoch,
                        header.base_sequence,
                        header.record_count,
                        header.base_offset,
                    )
                pos += header.size
            item = BufferedAppend(frame.base_offset, frame.end_offset, payload, tuple(positions), max_ts, now)
            p.buffer_append(item, frame.end_offset - frame.base_offset)
            engine._pool.force_reserve(item.size)
            p.next_offset = frame.end_offset
            report.wal_frames_replayed += 1
            report.records_recovered += frame.end_offset - frame.base_offset
