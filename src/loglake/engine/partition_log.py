"""The `PartitionLog` seam: where a partition's records are appended, kept and read.

The engine (loglake.engine.engine) is one class for both modes; it composes one partition log:

* `LocalPartitionLog` (loglake.engine.local_log): the single node's WAL, unsealed buffers and
  sealed segments in the hot and cold stores — durability classes fsync, disk, memory, ephemeral;
* cluster mode's shared log (loglake.cluster.shared_log): flush objects in the bucket whose
  ranges are committed in etcd under the leader's epoch — durability class `object`.

The rules both follow are written once, above the seam: the batch checks and the
idempotent-producer sequence rules (`ProducerStates.check_batches` / `record_batches`, called by
both logs under the partition's lock), topic changes (the catalog), transactions' last stable
offset and read_committed view (loglake.engine.txn), the size rules of a read.

What a log cannot do it says in one table, `refused`: feature -> why. The engine refuses those
calls with a `FeatureUnsupportedError` carrying the feature's Kafka error code (`FEATURE_CODES`)
before the log is asked — nothing is a silent no-op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, BinaryIO, Protocol

from loglake.engine.config import TopicConfig
from loglake.engine.corrupt import Corruption
from loglake.engine.ioerrors import ReadErrors
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.types import (
    AppendBuffer,
    AppendResult,
    FileRange,
    PartitionInfo,
    ReadResult,
    RecoveryReport,
)
from loglake.errors import FeatureUnsupportedError
from loglake.kafka_errors import ErrorCode
from loglake.records.batch import BatchHeader

if TYPE_CHECKING:
    from loglake.engine.catalog import TopicState
    from loglake.engine.cleaner import Cleaner
    from loglake.engine.cold import ColdReader
    from loglake.engine.scrubber import Scrubber
    from loglake.engine.verify import Progress, VerifyReport
    from loglake.wal.shard import WalShard

__all__ = ["FEATURE_CODES", "Batches", "Feature", "PartitionLog", "TierBytes", "refusal"]

#: A produce's batches: (byte position in the buffer, header), in order.
Batches = Sequence[tuple[int, BatchHeader]]


class Feature(StrEnum):
    """What one partition log may offer and another not (the refusal table's keys)."""

    TRANSACTIONS = "transactions"
    TXN_OFFSETS = "offsets in transactions"
    DELETE_RECORDS = "DeleteRecords"
    COMPACTION = "compaction"
    RETENTION = "retention"
    TIERING = "tiering to the cold store"
    LEADER_EPOCH_BUMP = "leader epoch bumps"
    LOCAL_SEGMENTS = "local segment files"


#: The Kafka error code a refused feature is answered with.
FEATURE_CODES: Mapping[Feature, ErrorCode] = {
    Feature.TRANSACTIONS: ErrorCode.UNSUPPORTED_VERSION,
    Feature.TXN_OFFSETS: ErrorCode.UNSUPPORTED_VERSION,
    Feature.DELETE_RECORDS: ErrorCode.UNSUPPORTED_VERSION,
    Feature.COMPACTION: ErrorCode.UNSUPPORTED_VERSION,
    Feature.RETENTION: ErrorCode.UNSUPPORTED_VERSION,
    Feature.TIERING: ErrorCode.UNSUPPORTED_VERSION,
    Feature.LEADER_EPOCH_BUMP: ErrorCode.UNSUPPORTED_VERSION,
    Feature.LOCAL_SEGMENTS: ErrorCode.UNSUPPORTED_VERSION,
}


def refusal(refused: Mapping[Feature, str], feature: Feature) -> FeatureUnsupportedError:
    """The error a log's refusal table gives for `feature` (the caller raises it)."""
    return FeatureUnsupportedError(f"{feature.value}: {refused[feature]}", FEATURE_CODES[feature])


@dataclass(frozen=True, slots=True)
class TierBytes:
    """Where a partition's bytes live (DescribeLogDirs)."""

    #: on this broker's disk: hot sealed segments and the unsealed data (WAL and memory)
    hot: int
    #: in the cold store (cluster mode: the bucket)
    cold: int
    #: log end minus high watermark (Kafka's OffsetLag of the current log)
    offset_lag: int


class PartitionLog(Protocol):
    """One mode's storage of partitions (see the module doc). Methods that take a `Partition`
    take the catalog's object; the caller looked it up (UnknownTopicError is the catalog's)."""

    #: feature -> why this log does not offer it (empty: everything)
    refused: Mapping[Feature, str]
    #: corrupt data found while running (read checks, a scrubber): /readyz and metrics
    corruption: Corruption
    #: reads failing with an I/O error: /readyz and metrics
    read_errors: ReadErrors
    #: the budget for data appended and not yet where it lives for good
    memory_pool: MemoryPool

    # ---- lifecycle ---------------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Open the metadata store and the log, recover, start background work."""
        ...

    def close(self) -> None:
        """Make what was acknowledged durable where it lives, stop background work, release."""
        ...

    @property
    def failure(self) -> BaseException | None:
        """Why the log stopped taking appends for good, else None."""
        ...

    def wake(self) -> None:
        """A topic's config changed: background work looks again now."""
        ...

    # ---- the data path -------------------------------------------------------------------------

    def append(
        self, p: Partition, config: TopicConfig, buf: AppendBuffer, batches: Batches, *, produced: bool = True
    ) -> Future[AppendResult]:
        """Append checked batches (offsets assigned here, idempotent producers' sequences checked
        here by ProducerStates' rules); the future resolves once the topic's durability is met.
        `produced`: a client's batches (a full disk refuses them); else the engine's own markers."""
        ...

    def read(self, p: Partition, offset: int, max_bytes: int, *, file_ranges: bool, min_one: bool) -> ReadResult: ...

    def read_async(
        self, p: Partition, offset: int, max_bytes: int, *, file_ranges: bool, min_one: bool
    ) -> Future[ReadResult]:
        """`read` that never does blocking I/O on the caller's thread (the broker's event loop)."""
        ...

    def wait_for_data(self, p: Partition, offset: int) -> Future[None]: ...

    def offset_for_timestamp(self, p: Partition, timestamp_ms: int) -> tuple[int, int] | None: ...

    def max_timestamp(self, p: Partition) -> tuple[int, int] | None: ...

    def info(self, p: Partition, compacted: bool) -> PartitionInfo: ...

    def tier_bytes(self, p: Partition) -> TierBytes: ...

    @property
    def cold_url(self) -> str | None:
        """Where `TierBytes.cold` lives (the cold store's or the bucket's URL), None without one."""
        ...

    def leader_epoch(self, p: Partition, offset: int | None) -> int: ...

    def epoch_end_offset(self, p: Partition, epoch: int) -> tuple[int, int]: ...

    def producer_states(self, p: Partition) -> list[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence, base offset of its newest batch) of each producer."""
        ...

    def open_file_range(self, chunk: FileRange) -> BinaryIO:
        """Open the file of a FileRange this log returned, for a zero-copy send (blocking: call
        off the event loop); the pages of the range are asked for ahead of the send."""
        ...

    def report_file_range_failure(self, path: str, exc: OSError) -> bool:
        """A zero-copy send of a FileRange this log returned failed reading the file: report it
        like a read error; True when `path` was one of this log's files."""
        ...

    # ---- changes -------------------------------------------------------------------------------

    def topic_deleted(self, topic: TopicState) -> None:
        """The topic's record is durable: free its memory and data."""
        ...

    def delete_records(self, p: Partition, offset: int) -> int: ...

    def bump_leader_epoch(self, p: Partition, reason: str) -> int: ...

    def segments(self, p: Partition) -> list[SegmentRef]: ...

    # ---- maintenance (tools, tests and the broker's admin calls) ---------------------------------

    def flush(self) -> None:
        """Make everything appended so far durable where it lives for good."""
        ...

    def compact(self, topic: str | None, force: bool) -> int: ...

    def apply_retention(self) -> int: ...

    def relocate_due(self) -> int: ...

    def wait_relocations(self, timeout_s: float) -> bool: ...

    def publish_metadata(self) -> bool:
        """Copy the metadata into the bucket now (Spark and exports plan from that copy)."""
        ...

    def checkpoint_metadata(self) -> int: ...

    def set_cleaner_io_rate(self, bytes_per_s: int) -> None: ...

    def verify(self, progress: Progress | None) -> VerifyReport:
        """Check every sealed segment's CRCs and every partition's hash chain."""
        ...

    # ---- what metrics show ---------------------------------------------------------------------

    @property
    def shards(self) -> list[WalShard]:
        """The WAL shards (none where there is no WAL)."""
        ...

    @property
    def cold_reader(self) -> ColdReader | None: ...

    @property
    def cleaner(self) -> Cleaner | None: ...

    @property
    def scrubber(self) -> Scrubber | None: ...
