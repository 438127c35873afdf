"""Verifying a cluster's bucket (`loglake verify --cold-store URL` on a cluster-mode bucket).

A cluster partition is its merged segments followed by the committed flush ranges not merged
yet (loglake.cluster.merge; docs/CLUSTER.md). The bucket holds both and, published by one broker
(loglake.cluster.publish), the metadata that lists them — so the bucket alone is enough to prove
what a cluster has acknowledged, without etcd:

* merged segments are ordinary sealed segments chained like a single node's: `PlogSource` hands
  them to the same walk (loglake.engine.verify.verify_source), which checks each object's CRCs,
  index and trailer and that each segment's prev hash is the link hash of the one before it;
  a compacted one (loglake.cluster.compact) is a rewritten segment whose provenance names what it
  replaced, and below the partition's clean end no key appears twice, as on a single node.
  The metadata records each segment's link hash (what the next one's prev hash must be), not its
  chain hash, so that field is compared through the chain rather than one by one;
* each flush range is read with one ranged GET and checked against the CRC-32C its commit
  recorded (loglake.cluster.flushobj.check_range), and the ranges must cover the partition's
  offsets contiguously from the last merged segment to the committed end.

The published metadata is a snapshot (at most `meta_publish_interval_ms` old): a segment the sweep
removes while the walk runs is re-looked up in a fresh snapshot and skipped if it went.
"""

from __future__ import annotations

from loglake.cluster.flushobj import FlushIndexEntry, read_range
from loglake.engine.verify import Progress, VerifyError, VerifyReport, verify_source
from loglake.errors import CorruptionError, LoglakeError
from loglake.meta.cluster import Plog
from loglake.meta.publish import find_clusters, read_remote_state
from loglake.meta.segments import SegmentRef
from loglake.meta.state import MetaState
from loglake.segment.format import ZERO_HASH
from loglake.store.base import ObjectNotFoundError, ObjectStore

__all__ = ["PlogSource", "is_cluster_bucket", "verify_cluster_bucket"]


def is_cluster_bucket(store: ObjectStore) -> bool:
    """Whether `store` holds a cluster-mode cluster's data (its published metadata has cluster
    partitions). False for an empty store or a single node's."""
    if not find_clusters(store):
        return False
    return bool(read_remote_state(store).state.plogs.parts)


class PlogSource:
    """A `loglake.engine.verify.VerifySource` over a cluster's published metadata and its bucket."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self.state: MetaState = read_remote_state(store).state

    @property
    def cluster_id(self) -> str:
        return self.state.cluster_id

    @property
    def store(self) -> ObjectStore:
        return self._store

    def plogs(self) -> list[tuple[str, str, int, Plog]]:
        """(topic, topic id in hex, partition, its cluster log) of every live topic's partition."""
        out = []
        for tm in self.state.topics.values():
            for p in range(tm.partitions):
                plog = self.state.plogs.parts.get((tm.topic_id, p))
                if plog is not None:
                    out.append((tm.name, tm.topic_id.hex(), p, plog))
        return out

    def partitions(self) -> list[tuple[str, int]]:
        return [(topic, p) for topic, _, p, _ in self.plogs()]

    def _plog(self, topic: str, partition: int) -> Plog:
        for name, _, p, plog in self.plogs():
            if (name, p) == (topic, partition):
                return plog
        raise LoglakeError(f"{topic}-{partition} is not in {self._store.url}'s metadata")

    def segments(self, topic: str, partition: int) -> list[SegmentRef]:
        segs = self._plog(topic, partition).segments
        refs: list[SegmentRef] = []
        for i, s in enumerate(segs):
            # The first merged segment chains after ZERO_HASH when it starts the partition; after
            # DeleteRecords or retention its predecessor is gone and its prev hash is not recorded.
            prev = bytes.fromhex(segs[i - 1].link) if i else (ZERO_HASH if s.base == 0 else b"")
            link = bytes.fromhex(s.link)
            refs.append(
                SegmentRef(s.base, s.last, s.key, s.size, s.max_ts, s.count, prev, b"", 0, generation=s.gen, link_hash=link)
            )
        return refs

    def store_for(self, seg: SegmentRef) -> ObjectStore:
        return self._store

    def clean_end(self, topic: str, partition: int) -> int:
        """Where the partition's compaction got to (loglake.cluster.compact; 0: never compacted)."""
        for name, topic_id, p, _plog in self.plogs():
            if (name, p) == (topic, partition):
                pm = self.state.partitions.get((bytes.fromhex(topic_id), p))
                return pm.clean_end if pm is not None else 0
        raise LoglakeError(f"{topic}-{partition} is not in {self._store.url}'s metadata")

    def chain_heads(self) -> dict[tuple[str, int], bytes]:
        return {}  # the last merged segment's link hash is the head: nothing more is recorded

    def refresh(self) -> None:
        self.state = read_remote_state(self._store).state


def verify_cluster_bucket(store: ObjectStore, progress: Progress | None = None) -> VerifyReport:
    """Every merged segment and every committed flush range of a cluster's bucket, checked."""
    source = PlogSource(store)
    report = verify_source(source, progress)
    for topic, topic_id, partition, plog in source.plogs():
        expected = plog.segments[-1].last + 1 if plog.segments else None
        for r in plog.ranges:
            if expected is not None and r.base != expected:
                report.errors.append(
                    VerifyError(r.key, r.pos, f"{topic}-{partition}: range {r.base}..{r.last} does not continue at {expected}")
                )
            expected = r.last + 1
            entry = FlushIndexEntry(topic_id, partition, r.base, r.last, r.pos, r.length, r.count, r.max_ts, r.batches, r.crc)
            try:
                read_range(store, r.key, entry)
            except ObjectNotFoundError:
                report.errors.append(VerifyError(r.key, r.pos, f"{topic}-{partition}: flush object of {r.base}..{r.last} is missing"))
            except CorruptionError as exc:
                report.errors.append(VerifyError(exc.path, exc.offset, f"{topic}-{partition}: {exc.detail}"))
            report.bytes_checked += r.length
        if expected is not None and expected != plog.end:
            report.errors.append(
                VerifyError("", 0, f"{topic}-{partition}: data ends at {expected}, the committed end is {plog.end}")
            )
    return report
