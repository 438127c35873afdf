"""Planning reads of cluster-mode partitions (docs/CLUSTER.md, "Spark and exports").

A cluster partition (durability class `object`) is, in the metadata a broker publishes into
the bucket (loglake.cluster.publish), its merged segments followed by the committed
flush-object ranges the background merge has not rewritten yet (`MetaState.plogs`). Both are
committed contiguously (plog_commit: each range starts at the partition's committed end;
plog_merged: a segment replaces exactly the first ranges), so the two lists together cover
offsets first-source-base..end once each, in order, whichever leader wrote them. A topic
deleted in the cluster is gone from the published topics and is not planned.

Merged segments are ordinary sealed segments and are read as single-node ones (their key is
taken from the metadata: it carries the leader epoch as `-g<epoch>`, while the trailer says
generation 0). A flush range is one ranged GET, checked against its CRC-32C
(loglake.cluster.flushobj.read_range) before any record in it is decoded.
"""

from __future__ import annotations

from loglake.cluster.flushobj import FlushIndexEntry, iter_batches, read_range
from loglake.meta.cluster import Plog
from loglake.records.decode import decode_batch
from loglake.spark.model import FlushSlice, PartitionMeta, SegmentInfo
from loglake.store import ObjectStore

__all__ = ["cluster_partition", "flush_bytes", "flush_offset_for_timestamp"]


def cluster_partition(store_url: str, topic: str, topic_id: str, partition: int, plog: Plog) -> PartitionMeta:
    """A cluster partition's committed data as the planner sees it."""
    segments = tuple(SegmentInfo(s.key, s.base, s.last, s.size, s.max_ts, s.count) for s in plog.segments)
    flush = tuple(
        FlushSlice(
            store_url, topic, partition, r.key, r.length, r.base, r.last + 1, None,
            topic_id=topic_id, base=r.base, last=r.last, pos=r.pos, length=r.length,
            records=r.count, max_ts=r.max_ts, crc=r.crc, batches=r.batches,
        )
        for r in plog.ranges
    )  # fmt: skip
    return PartitionMeta(topic, topic_id, partition, plog.log_start, plog.end, segments, flush=flush)


def flush_bytes(store: ObjectStore, sl: FlushSlice) -> bytes:
    """The batches of a flush range, read with one ranged GET and checked (CorruptionError)."""
    entry = FlushIndexEntry(
        sl.topic_id,
        sl.partition,
        sl.base,
        sl.last,
        sl.pos,
        sl.length,
        sl.records,
        sl.max_ts,
        sl.batches,
        sl.crc,
    )
    return read_range(store, sl.key, entry)


def flush_offset_for_timestamp(store: ObjectStore, pm: PartitionMeta, ts: int) -> int | None:
    """The first offset in the partition's unmerged ranges whose record timestamp is >= ts."""
    for fr in pm.flush:
        if fr.max_ts < ts:
            continue
        for view in iter_batches(flush_bytes(store, fr)):
            header, records = decode_batch(bytes(view))
            if header.is_control:
                continue
            for r in records:
                if r.timestamp >= ts and r.offset >= pm.log_start:
                    return r.offset
    return None
