"""What the planner knows of a partition and the slices of it Spark reads.

A partition's visible offsets and sealed segments (`PartitionMeta`, `SegmentInfo`; in cluster
mode also its committed flush ranges), and one Spark input partition over one object (`Slice`;
`FlushSlice` for a flush range). `loglake.spark.plan` builds them from the published metadata,
`loglake.spark.cluster_plan` for cluster partitions; both import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from loglake.meta.lifecycle import Tier

__all__ = ["FlushSlice", "PartitionMeta", "SegmentInfo", "Slice", "TopicPartition"]

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    key: str
    base: int
    last: int
    size: int
    max_ts: int
    record_count: int
    tier: Tier = Tier.HOT
    prev_hash: str = ""
    chain_hash: str = ""


@dataclass(frozen=True, slots=True)
class PartitionMeta:
    topic: str
    topic_id: str
    partition: int
    log_start: int
    end: int  # the next offset after the last visible record: the sealed end (read_committed: its LSO)
    segments: tuple[SegmentInfo, ...]
    #: (producer id, first offset, ABORT marker offset) of aborted transactions, marker order
    aborted: tuple[tuple[int, int, int], ...] = ()
    #: the metadata dropped its oldest aborted entries (loglake.meta.txn.ABORTED_TXNS_MAX): older ones are only
    #: in the segments' transaction indexes
    aborted_trimmed: bool = False
    #: hybrid reads: `end` is the broker's high watermark (read_committed: its last stable
    #: offset) and offsets from `seam` on are read through the broker; None: segments only
    seam: int | None = None
    #: cluster mode: the committed flush-object ranges after the merged `segments` (offsets
    #: base..last each; start and end span the whole range)
    flush: tuple[FlushSlice, ...] = ()

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class Slice:
    """One Spark input partition: offsets [start, end) of one segment object."""

    store_url: str
    topic: str
    partition: int
    key: str
    size: int
    start: int
    end: int
    #: read_committed: aborted transactions overlapping [start, end) (producer id, first,
    #: marker); None at read_uncommitted
    aborted: tuple[tuple[int, int, int], ...] | None = None

    @property
    def count(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class FlushSlice(Slice):
    """A Slice of one committed flush-object range of a cluster partition (docs/CLUSTER.md,
    "Spark and exports"): offsets [start, end) of the range's batches at byte `pos` of the
    object `key`, `length` bytes with CRC-32C `crc` (read with one ranged GET, checked).
    `base`..`last` and the counts are the range's own, as the metadata committed them."""

    topic_id: str = ""
    base: int = 0
    last: int = -1
    pos: int = 0
    length: int = 0
    records: int = 0
    max_ts: int = -1
    crc: int = 0
    batches: int = 0
