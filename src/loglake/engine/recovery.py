"""Opening a data directory: metadata → store reconciliation → WAL replay.

1. Recover the metadata (loglake.meta.log: newest valid checkpoint + the log after it; a
   version-1 snapshot is migrated). An empty data directory with a cold store holding a
   cluster's metadata is rebuilt from the bucket (disaster recovery).
2. Reconcile each partition's chain with what the hot store holds: a segment PUT after the last
   durable `segment_published` record (crash between the two) continues the chain and is
   adopted with a new record; objects below the chain (retention, deleted topics, superseded
   seals) are removed. A segment the metadata lists but the store lacks is an error: that data
   was acknowledged.
3. Replay every WAL shard: frames already sealed are skipped, the rest refill the unsealed
   buffers, densely; a torn tail is truncated and counted.
4. Move the leader epoch of partitions that may have lost records consumers saw (a restore from
   the cold store; an unclean stop of a topic that is not durability=fsync): engine/epochs.py.

The caller (the engine) then starts the WAL writers.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict

from loglake.engine.acked import check_losses, find_losses
from loglake.engine.catalog import Catalog, TopicState, new_cluster_id
from loglake.engine.epochs import bump_after_recovery, take_clean_mark
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import BufferedAppend, Partition, SegmentRef
from loglake.engine.stores import Stores
from loglake.engine.types import RecoveryReport
from loglake.errors import ConfigError, CorruptionError, LoglakeError, MetadataDamagedError
from loglake.fs.base import FileSystem
from loglake.meta.layout import wal_dir
from loglake.meta.lifecycle import Tier
from loglake.meta.log import LocalMetaStore
from loglake.meta.publish import find_clusters, meta_prefix, read_remote_state
from loglake.meta.records import Cluster
from loglake.meta.state import MetaState, PartitionMeta
from loglake.records.batch import peek_header
from loglake.segment.format import read_tail
from loglake.store.base import ObjectStore, parse_segment_key, partition_prefix
from loglake.wal.recovery import ReplayFrame, WalRecovery, recover_wal

__all__ = ["recover"]

log = logging.getLogger(__name__)


def recover(
    *,
    fs: FileSystem,
    data_dir: str,
    meta: LocalMetaStore,
    catalog: Catalog,
    stores: Stores,
    pool: MemoryPool,
    accept_data_loss: bool = False,
) -> tuple[RecoveryReport, WalRecovery]:
    started = time.perf_counter()
    report = RecoveryReport()
    report.clean_shutdown = take_clean_mark(fs, data_dir)
    remote_state: MetaState | None = None
    if stores.cold is not None and meta.is_empty():
        remote_state = _read_cold(stores.cold, data_dir)
    try:
        meta.open()
    except CorruptionError as exc:
        cold = stores.cold
        raise MetadataDamagedError(
            exc, meta.directory, cold.url if cold is not None else None, _copy_in(cold, stores.hot) if cold is not None else None
        ) from exc
    mr = meta.report
    report.snapshot_seq = mr.checkpoint_seq
    report.meta_records_replayed = mr.records_replayed
    report.meta_bytes_truncated = mr.log_bytes_truncated
    report.meta_checkpoints_damaged = list(mr.checkpoints_damaged)
    report.meta_migrated_from = mr.migrated_from
    if remote_state is not None:
        assert stores.cold is not None
        _restore_from_cold(remote_state, stores.cold, stores.hot, report)
        meta.replace_state(remote_state)
        report.restored_from = stores.cold.url
    if not meta.state.cluster_id:
        meta.append(Cluster(new_cluster_id())).result()
    if not meta.checkpoints:
        meta.checkpoint()  # every data directory has one: the stores' copy starts from it
    catalog.load()
    report.topics = len(catalog.topics)
    report.partitions = sum(len(t.partitions) for t in catalog.topics.values())

    _reconcile_store(catalog, stores.hot, report)

    wal = recover_wal(fs, wal_dir(data_dir), accept_data_loss=accept_data_loss)
    report.wal_frames_read = wal.frames_read
    report.wal_bytes_read = wal.bytes_read
    report.wal_bytes_truncated = wal.bytes_truncated
    report.wal_files_truncated = list(wal.truncated_files)
    _replay(catalog, pool, wal.frames, report, data_dir)

    for _topic, p in catalog.partitions():
        p.set_hw(p.next_offset)
        p.durable_sealed_end = p.sealed_end
    losses = find_losses(catalog)
    check_losses(losses, accept_data_loss, data_dir)  # refuses, unless the loss is accepted
    if not losses:  # only now is a torn tail known to be a write that was never acknowledged
        for path, at, torn in wal.torn_tails:
            log.warning("WAL %s: torn tail at byte %d, %d bytes of an unacknowledged write truncated", path, at, torn)
    report.acked_lost = [str(x) for x in losses]
    bump_after_recovery(catalog, clean=report.clean_shutdown, restored=remote_state is not None, report=report)
    meta.sync()  # adoptions are durable before any WAL file behind them may go
    report.seconds = time.perf_counter() - started
    return report, wal


def _copy_in(cold: ObjectStore, hot: ObjectStore) -> bool | None:
    """Does the cold store hold a copy of this data directory's metadata (to restore it from)?
    Its cluster id is read from the hot store (which holds the segments and a copy of the metadata
    under ``loglake-<cluster id>/``), so the bucket costs one short LIST, not a listing of every
    segment. None: it cannot be told (no cluster id here, or a store failed)."""
    try:
        ids = find_clusters(hot)
        if not ids:
            return None
        return any(cold.list(meta_prefix(cluster_id)) for cluster_id in ids)
    except LoglakeError:
        return None


def _read_cold(cold: ObjectStore, data_dir: str) -> MetaState | None:
    """The bucket's metadata for a disaster recovery, or None for an empty bucket (a new cluster)."""
    if not find_clusters(cold):
        if cold.list("loglake-"):
            raise CorruptionError(cold.url, 0, "cannot restore from the cold store: it holds segments but no metadata")
        return None
    try:
        remote = read_remote_state(cold)
    except CorruptionError as exc:
        raise CorruptionError(cold.url, 0, f"cannot restore from the cold store: {exc}") from exc
    if remote.state.plogs.parts:  # published by loglake.cluster.publish
        raise ConfigError(
            f"{cold.url} belongs to a cluster-mode cluster (loglake serve --cluster): not restorable here"
        )
    log.warning(
        "data directory %s has no metadata: restoring from %s (%s, %d objects read)",
        data_dir,
        cold.url,
        remote.key,
        remote.gets,
    )
    return remote.state


def _reconcile_store(catalog: Catalog, store: ObjectStore, report: RecoveryReport) -> None:
    cleanup = getattr(store, "delete_stale_temps", None)
    if cleanup is not None:
        cleanup()
    cluster_prefix = f"loglake-{catalog.cluster_id}/"
    live_dirs: dict[str, TopicState] = {f"{t.name}-{t.topic_id.hex()}": t for t in catalog.topics.values()}
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
            _reconcile_partition(catalog, store, topic, p, found, report)


def _reconcile_partition(
    catalog: Catalog, store: ObjectStore, topic: TopicState, p: Partition, found: list[tuple[int, str]], report: RecoveryReport
) -> None:
    """Match one partition's chain with the hot store's listing (see the module docstring)."""
    table = p.segments
    hot_keys = {table.key_at(i) for i in table.indexes_in_tier(Tier.HOT)}
    listed = set(table.keys())
    missing = sorted(hot_keys - {key for _base, key in found})
    if missing:
        raise CorruptionError(
            missing[0], 0, f"segment of {topic.name}-{p.index} listed in the metadata is missing from {store.url}"
        )
    for base, key in found:
        if key in hot_keys:
            continue
        if key in listed:
            store.delete(key)  # relocated: the metadata switched to the cold copy before a crash
            report.orphans_removed.append(key)
            continue
        if base < p.sealed_end:
            # superseded: retention, a re-seal, or a rewrite (compaction, merging) left it behind
            # — either a replaced segment or an output the crash kept from being recorded
            store.delete(key)
            report.orphans_removed.append(key)
            continue
        if base == p.sealed_end and _adopt(catalog, store, p, key):
            report.segments_adopted += 1
            continue
        log.warning("segment %s does not continue the chain of %s-%d; left in place", key, topic.name, p.index)
    p.next_offset = p.sealed_end


def _adopt(catalog: Catalog, store: ObjectStore, p: Partition, key: str) -> bool:
    """Take a published-but-unrecorded segment into the chain if it continues it."""
    trailer, _index = read_tail(store, key)
    if trailer.base_offset != p.sealed_end or trailer.prev_hash != p.chain_hash or trailer.rewritten:
        return False
    catalog.record_seal(p, SegmentRef.from_trailer(key, trailer, Tier.HOT, None), [])
    log.info("adopted segment %s published after the last metadata record", key)
    return True


def _restore_from_cold(state: MetaState, cold: ObjectStore, hot: ObjectStore, report: RecoveryReport) -> None:
    """Disaster recovery: keep what the bucket really holds, drop what lived only on the lost disk.
    A segment the bucket lacks that the hot store still holds (only the metadata was lost: a
    damaged `meta/` moved aside) is not reported lost here: the hot store's reconciliation that
    follows adopts it when it continues the chain, and warns when it does not."""
    for tm in state.topics.values():
        for i in range(tm.partitions):
            pm = state.partition(tm.topic_id, i)
            prefix = partition_prefix(state.cluster_id, tm.name, tm.topic_id.hex(), i)
            in_bucket = set(cold.list(prefix))
            table = pm.segments
            kept = 0
            while kept < len(table) and table.key_at(kept) in in_bucket:
                kept += 1
            lost = table.truncate(kept)
            for k in range(kept):
                table.set_tier(table.base_at(k), Tier.COLD)
            for seg in lost:
                if hot.head(seg.key) is not None:
                    continue
                report.segments_lost.append(seg.key)
                log.warning(
                    "segment %s was only on the lost local disk: offsets %d..%d are gone", seg.key, seg.base_offset, seg.last_offset
                )
            if lost:
                last = table.last()
                pm.sealed_end = last.end_offset if last is not None else lost[0].base_offset
                pm.chain_hash = last.link_hash if last is not None else lost[0].prev_hash
            # Segments uploaded after the metadata was last published continue the chain.
            known = set(table.keys())
            for key in sorted(in_bucket - known):
                if key.endswith(".seg") and _adopt_cold(pm, cold, key):
                    report.segments_adopted += 1
            pm.log_start = min(pm.log_start, pm.sealed_end)


def _adopt_cold(pm: PartitionMeta, cold: ObjectStore, key: str) -> bool:
    trailer, _index = read_tail(cold, key)
    if trailer.base_offset != pm.sealed_end or trailer.prev_hash != pm.chain_hash or trailer.rewritten:
        return False
    pm.segments.append(SegmentRef.from_trailer(key, trailer, Tier.COLD, None))
    pm.sealed_end = trailer.next_offset
    pm.chain_hash = trailer.chain_hash
    log.info("adopted segment %s uploaded after the metadata was last published", key)
    return True


def _replay(catalog: Catalog, pool: MemoryPool, frames: list[ReplayFrame], report: RecoveryReport, data_dir: str) -> None:
    by_partition: dict[tuple[bytes, int], list[ReplayFrame]] = defaultdict(list)
    for frame in frames:
        by_partition[(frame.topic_id, frame.partition)].append(frame)
    now = time.monotonic()
    for (topic_id, index), items in by_partition.items():
        topic = catalog.by_id.get(topic_id)
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
                    wal_dir(data_dir),
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
            pool.force_reserve(item.size)
            p.next_offset = frame.end_offset
            report.wal_frames_replayed += 1
            report.records_recovered += frame.end_offset - frame.base_offset
