"""Values the engine hands to its callers."""

from __future__ import annotations

from dataclasses import dataclass, field

from loglake.engine.config import TopicConfig

#: Record batches a log takes over and patches in place (offsets, epochs): a bytearray, or a
#: writable view of one (a Produce request's frame buffer, loglake.broker.receive), never copied.
AppendBuffer = bytearray | memoryview


@dataclass(frozen=True, slots=True)
class AppendResult:
    topic: str
    partition: int
    base_offset: int
    last_offset: int
    #: broker time stamped on the batches when the topic uses LogAppendTime, else -1
    log_append_time: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class FileRange:
    """Bytes of a local file, for zero-copy sends (sendfile): whole batches, the first of them
    `first_batch` bytes long (from the segment's index, so nobody reads the file to learn it).
    Open it with `Engine.open_file_range`: callers never open segment files themselves."""

    path: str
    position: int
    length: int
    first_batch: int


Chunk = bytes | bytearray | memoryview | FileRange


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole record batches starting with the one that holds the requested offset."""

    chunks: list[Chunk]
    high_watermark: int
    log_start_offset: int

    @property
    def size(self) -> int:
        return sum(c.length if isinstance(c, FileRange) else len(c) for c in self.chunks)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    next_offset: int
    sealed_end: int
    segments: int
    sealed_bytes: int
    unsealed_bytes: int
    #: compaction: offsets below this are cleaned; the share of sealed bytes at or above it
    clean_end: int = 0
    dirty_ratio: float = 0.0
    #: the partition's current leader epoch (engine/epochs.py)
    leader_epoch: int = 0
    #: first offset of the earliest open transaction, else the high watermark (engine/txn.py)
    last_stable_offset: int = -1


@dataclass(frozen=True, slots=True)
class ProducerDescription:
    """One idempotent producer of a partition (DescribeProducers)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    #: max timestamp of the producer's newest batch (-1: not read or no longer held)
    last_timestamp: int
    #: first offset of its open transaction in this partition (-1: none)
    txn_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: str  # 32 hex digits
    partitions: int
    config: TopicConfig
    created_ms: int
    #: the replication factor it was created with: 1 on a single node; in a cluster, how many
    #: brokers Metadata reports as each partition's replicas (every live broker can serve a read)
    replication_factor: int = 1


@dataclass(slots=True)
class RecoveryReport:
    """What opening the data directory did."""

    #: seq of the metadata checkpoint recovery started from (None: none)
    snapshot_seq: int | None = None
    meta_records_replayed: int = 0  # metadata log records after that checkpoint
    meta_bytes_truncated: int = 0  # torn tail of the metadata log (an unacknowledged change)
    meta_checkpoints_damaged: list[str] = field(default_factory=list)  # skipped for an older one
    meta_migrated_from: str | None = None  # a version-1 snapshot converted on this open
    topics: int = 0
    partitions: int = 0
    wal_frames_read: int = 0
    wal_frames_replayed: int = 0
    wal_frames_skipped: int = 0  # already sealed, or of deleted topics
    wal_bytes_read: int = 0
    wal_bytes_truncated: int = 0
    wal_files_truncated: list[str] = field(default_factory=list)
    segments_adopted: int = 0  # PUT but not yet recorded in the metadata: taken into the chain
    orphans_removed: list[str] = field(default_factory=list)
    records_recovered: int = 0
    #: set when an empty data directory was rebuilt from the cold store's published metadata
    restored_from: str | None = None
    #: segments named by that metadata that never reached the cold store (lost with the disk)
    segments_lost: list[str] = field(default_factory=list)
    #: whether the previous stop was a clean close (engine/epochs.py: the clean-shutdown mark)
    clean_shutdown: bool = False
    #: partitions ("topic-p") whose leader epoch recovery moved (engine/epochs.py says when)
    leader_epochs_bumped: list[str] = field(default_factory=list)
    #: acknowledged records found missing and accepted (engine/acked.py), one line per partition
    acked_lost: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"recovered {self.topics} topics / {self.partitions} partitions in {self.seconds:.3f}s: "
            f"{self.wal_frames_replayed} WAL frames replayed ({self.wal_frames_skipped} already sealed), "
            f"{self.wal_bytes_truncated} torn bytes truncated, {self.segments_adopted} segments adopted, "
            f"{len(self.orphans_removed)} orphans removed; metadata: {self.meta_records_replayed} records replayed"
            + (f" after checkpoint {self.snapshot_seq}" if self.snapshot_seq is not None else "")
            + (f", {self.meta_bytes_truncated} torn bytes truncated" if self.meta_bytes_truncated else "")
            + (f", damaged checkpoints skipped: {', '.join(self.meta_checkpoints_damaged)}" if self.meta_checkpoints_damaged else "")
            + (f", migrated from {self.meta_migrated_from}" if self.meta_migrated_from else "")
            + (f"; leader epoch bumped on {len(self.leader_epochs_bumped)} partitions" if self.leader_epochs_bumped else "")
            + (f"; ACKNOWLEDGED DATA LOST (accepted): {'; '.join(self.acked_lost)}" if self.acked_lost else "")
            + (f"; restored from {self.restored_from} ({len(self.segments_lost)} segments lost)" if self.restored_from else "")
        )
