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
from loglake.engine.types import RecoveryReport
from loglake.errors import CorruptionError, LoglakeError
from loglake.records.batch import peek_header
from loglake.segment.format import read_tail
from loglake.store.base import parse_segment_key, segment_key
from loglake.wal.recovery import ReplayFrame, recover_wal

if TYPE_CHECKING:
    from loglake.engine.engine import Engine, TopicState

log = logging.getLogger(__name__)


def recover(engine: Engine) -> RecoveryReport:
    from loglake.engine.engine import SNAPSHOT_VERSION, TopicState, _new_cluster_id

    started = time.perf_counter()
    report = RecoveryReport()
    loaded = engine._snapshots.load()
    if loaded is None:
        engine._cluster_id = _new_cluster_id()
    else:
        seq, payload = loaded
        report.snapshot_seq = seq
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
    known = {s.key for s in p.segments}
    present = {key for _, key in found}
    for seg in p.segments:
        if seg.key not in present:
            raise CorruptionError(
                seg.key, 0, f"segment of {topic.name}-{p.index} listed in the metadata is missing from {engine.store.url}"
            )
    for base, key in found:
        if key in known:
            continue
        if base < p.sealed_end:
            engine.store.delete(key)  # superseded: retention or a re-seal left it behind
            report.orphans_removed.append(key)
            continue
        if base == p.sealed_end:
            trailer, index = read_tail(engine.store, key)
            if trailer.base_offset == base and trailer.prev_hash == p.chain_hash:
                p.segments.append(
                    SegmentRef(
                        trailer.base_offset,
                        trailer.last_offset,
                        key,
                        trailer.size,
                        trailer.max_timestamp,
                        trailer.record_count,
                        trailer.prev_hash,
                        trailer.chain_hash,
                        trailer.created_ms,
                        "hot",
                        index,
                    )
                )
                p.sealed_end = trailer.next_offset
                p.chain_hash = trailer.chain_hash
                report.segments_adopted += 1
                log.info("adopted segment %s published after the last snapshot", key)
                continue
        log.warning("segment %s does not continue the chain of %s-%d; left in place", key, topic.name, p.index)
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
