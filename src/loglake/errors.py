"""Typed errors of loglake.

Every operating error (bad input, corrupt file, full disk, unknown topic) is one of these.
Each carries the Kafka error code the broker answers with, so the protocol layer never has to
guess; the numbers come from the one table of them, `loglake.kafka_errors`. `retriable` is
loglake's own answer for the call that failed (a corrupt file stays corrupt), which is not always
Kafka's classification of the code. `assert` is kept for programmer errors only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from loglake.kafka_errors import ErrorCode


class LoglakeError(Exception):
    """Base of every error loglake raises on purpose."""

    #: Kafka protocol error code (UNKNOWN_SERVER_ERROR unless a subclass knows better).
    kafka_code: int = ErrorCode.UNKNOWN_SERVER_ERROR
    #: Whether retrying the same call later can succeed.
    retriable: bool = False


class ConfigError(LoglakeError):
    """A configuration value is unknown, malformed, or contradicts another one."""

    kafka_code = ErrorCode.INVALID_CONFIG


class UnsafeListenerError(ConfigError):
    """A listener without client authentication on a non-loopback address, and no explicit
    --allow-unauthenticated-public-listener: `loglake serve` exits with the usage-error code 2."""


class InvalidTopicError(LoglakeError):
    """The topic name breaks Kafka's naming rule."""

    kafka_code = ErrorCode.INVALID_TOPIC_EXCEPTION


class TopicExistsError(LoglakeError):
    kafka_code = ErrorCode.TOPIC_ALREADY_EXISTS


class UnknownTopicError(LoglakeError):
    """The topic or partition does not exist."""

    kafka_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    retriable = True


class InvalidPartitionsError(LoglakeError):
    kafka_code = ErrorCode.INVALID_PARTITIONS


class CorruptRecordError(LoglakeError):
    """A record batch failed validation (magic, length, CRC)."""

    kafka_code = ErrorCode.CORRUPT_MESSAGE
    retriable = True


class RecordTooLargeError(LoglakeError):
    kafka_code = ErrorCode.MESSAGE_TOO_LARGE


class InvalidRecordError(LoglakeError):
    """A batch breaks a rule for its records; none of it is appended (Kafka's INVALID_RECORD).

    `record_errors` lists (batch_index, message) of each offending record, batch_index counting
    from 0 within its batch; Produce v8+ returns them as `record_errors` (KIP-467).
    """

    kafka_code = ErrorCode.INVALID_RECORD

    def __init__(self, message: str, *, record_errors: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(message)
        self.record_errors: tuple[tuple[int, str], ...] = tuple(record_errors)


class MissingKeyError(InvalidRecordError):
    """Records without a key sent to a topic whose cleanup.policy includes compact.

    `batch_indexes` are the keyless records' positions in the batch (or, from
    `Log.produce_batch`, in the records given); `partition` is None when they span several.
    """

    #: How many indexes the summary message names (all are in `record_errors`).
    NAMED = 3

    def __init__(self, topic: str, partition: int | None, batch_indexes: Sequence[int]) -> None:
        where = topic if partition is None else f"{topic}-{partition}"
        named = ", ".join(str(i) for i in batch_indexes[: self.NAMED])
        more = f" and {len(batch_indexes) - self.NAMED} more" if len(batch_indexes) > self.NAMED else ""
        super().__init__(
            f"compacted topic {where} refused a batch with {len(batch_indexes)} record(s) without a key "
            f"(batch index {named}{more}); none of the batch was appended",
            record_errors=[(i, f"compacted topic {where} only accepts records with a key") for i in batch_indexes],
        )
        self.topic = topic
        self.partition = partition
        self.batch_indexes = tuple(batch_indexes)


class OffsetOutOfRangeError(LoglakeError):
    kafka_code = ErrorCode.OFFSET_OUT_OF_RANGE

    def __init__(self, message: str, *, log_start_offset: int = -1, high_watermark: int = -1) -> None:
        super().__init__(message)
        self.log_start_offset = log_start_offset
        self.high_watermark = high_watermark


class CorruptionError(LoglakeError):
    """Stored data (WAL frame, segment, metadata record or checkpoint) failed a checksum or structural check.

    Names the file (or object key) and the byte offset so an operator can look at it.
    """

    kafka_code = ErrorCode.CORRUPT_MESSAGE

    def __init__(self, path: str, offset: int, detail: str) -> None:
        super().__init__(f"{path} @ byte {offset}: {detail}")
        self.path = path
        self.offset = offset
        self.detail = detail


class CorruptBatchError(CorruptionError):
    """A sealed batch failed its check when read (CRC-32C, magic, or its index entry): the read
    stops before it. Names the partition, the batch's first offset, and the segment.

    Fetch answers CORRUPT_MESSAGE, not KAFKA_STORAGE_ERROR: librdkafka and kafka-python treat
    KAFKA_STORAGE_ERROR as "leader moved" and silently refresh metadata and retry forever (a
    stall), while CORRUPT_MESSAGE reaches the application as a consumer error.
    """

    kafka_code = ErrorCode.CORRUPT_MESSAGE

    def __init__(self, topic: str, partition: int, offset: int, path: str, position: int, detail: str) -> None:
        super().__init__(path, position, f"{topic}-{partition} batch at offset {offset}: {detail}")
        self.topic = topic
        self.partition = partition
        self.batch_offset = offset
        self.reason = detail


class MetadataDamagedError(CorruptionError):
    """The data directory's metadata does not load: every checkpoint is damaged, or a metadata
    log record that was durable is (names the file and byte, as CorruptionError does). Nothing
    opens without it. `meta_dir` is the damaged directory; `cold_store` the configured cold store
    (None: none) and `copy_found` whether it holds a copy of this metadata to restore from (None:
    it could not be told)."""

    def __init__(self, cause: CorruptionError, meta_dir: str, cold_store: str | None, copy_found: bool | None) -> None:
        super().__init__(cause.path, cause.offset, cause.detail)
        self.args = (f"the metadata is damaged: {cause}",)
        self.meta_dir = meta_dir
        self.cold_store = cold_store
        self.copy_found = copy_found


class AcknowledgedDataLossError(LoglakeError):
    """Recovery found acknowledged records missing (engine/acked.py): the data directory was
    damaged, not torn by a crash. `losses` names each partition and offset range. Opening with
    EngineConfig.accept_data_loss (`loglake serve --accept-data-loss`) accepts the loss."""

    def __init__(self, data_dir: str, losses: list[str]) -> None:
        shown = "; ".join(losses[:20]) + (f"; and {len(losses) - 20} more partitions" if len(losses) > 20 else "")
        super().__init__(f"acknowledged records are missing in {data_dir}: {shown}")
        self.data_dir = data_dir
        self.losses = losses


class StorageError(LoglakeError):
    """An I/O operation failed (disk full, permission, unreachable store)."""

    kafka_code = ErrorCode.KAFKA_STORAGE_ERROR

    def __init__(self, op: str, path: str, cause: BaseException | str, *, retriable: bool = False) -> None:
        super().__init__(f"{op} {path}: {cause}")
        self.op = op
        self.path = path
        self.cause = cause
        self.retriable = retriable


class StorageFullError(StorageError):
    """Free space on the data directory's filesystem is below the reserve (`storage_min_free_bytes`
    / `storage_min_free_percent`), or a WAL write hit ENOSPC: the produce is refused before any of
    it reaches the WAL. Retriable: writes resume by themselves once space returns (no restart)."""

    def __init__(self, path: str, free_bytes: int, reserve_bytes: int, detail: str = "") -> None:
        super().__init__("produce", path, detail or f"storage full: {free_bytes} bytes free < reserve {reserve_bytes}", retriable=True)
        self.free_bytes = free_bytes
        self.reserve_bytes = reserve_bytes


class SegmentReadError(StorageError):
    """Reading a stored segment failed (EIO from the disk, the cold store still failing after its
    retries). Only readers of that segment get it; the data is not known to be bad, so it is not
    marked corrupt and the next read tries again.

    Answered as CORRUPT_MESSAGE rather than KAFKA_STORAGE_ERROR: librdkafka and kafka-python
    answer KAFKA_STORAGE_ERROR on a fetch by refreshing metadata and retrying silently, so the
    consumer would stall without a word; CORRUPT_MESSAGE reaches the application (and the client
    fetches the same offset again, so it resumes once the segment reads again)."""

    kafka_code = ErrorCode.CORRUPT_MESSAGE

    def __init__(self, topic: str, partition: int, offset: int, path: str, cause: BaseException | str) -> None:
        super().__init__("read", path, cause, retriable=True)
        self.topic = topic
        self.partition = partition
        self.read_offset = offset


class DataDirLockedError(LoglakeError):
    """Another process holds the data directory."""


class ListenError(LoglakeError):
    """A listener (`--listen`, `--metrics-listen`) could not be opened: the address is in use, is not
    an address of this machine, or its host name does not resolve. `cause` is the OSError."""

    def __init__(self, setting: str, address: str, cause: OSError) -> None:
        reason = os.strerror(cause.errno) if isinstance(cause.errno, int) and cause.errno > 0 else str(cause)
        super().__init__(f"{setting} {address}: {reason.lower()}")
        self.setting = setting
        self.address = address
        self.cause = cause


class EngineClosedError(LoglakeError):
    kafka_code = ErrorCode.NOT_LEADER_OR_FOLLOWER  # the client will refresh metadata and retry
    retriable = True


class EngineFailedError(LoglakeError):
    """The engine stopped accepting writes after an unrecoverable storage failure."""

    kafka_code = ErrorCode.KAFKA_STORAGE_ERROR


class BackPressureTimeoutError(LoglakeError):
    """An append waited too long for room in the memory budget; retry later."""

    kafka_code = ErrorCode.REQUEST_TIMED_OUT
    retriable = True


class OutOfOrderSequenceError(LoglakeError):
    """An idempotent producer's batch does not continue its sequence."""

    kafka_code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(LoglakeError):
    """A batch from an older epoch of a producer id that has since moved on (fenced)."""

    kafka_code = ErrorCode.INVALID_PRODUCER_EPOCH


class EtcdUnavailableError(LoglakeError):
    """No etcd endpoint answered within the deadline (cluster mode's metadata store). The call may
    work once etcd is back; what it was doing was not committed."""

    kafka_code = ErrorCode.REQUEST_TIMED_OUT
    retriable = True


class MetaFencedError(LoglakeError):
    """A conditional metadata append whose guard no longer holds (a newer leader epoch took the
    partition): nothing was committed. Clients refresh metadata and go to the new leader."""

    kafka_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
    retriable = True


class MetaRecordRejectedError(LoglakeError, ValueError):
    """A metadata record that does not apply to the state when its turn comes (written from a
    stale view: a topic created meanwhile, a producer id taken by another writer). The local
    store raises it from `append` and logs nothing; the etcd store commits it, every broker skips
    it alike, and its writer's append future fails with it."""


class FeatureUnsupportedError(LoglakeError):
    """What this engine's partition log does not offer (cluster mode: transactions, DeleteRecords,
    compaction runs, ...): refused with a clear message and the feature's Kafka error code, from
    one table (loglake.engine.partition_log), instead of half working or doing nothing."""

    kafka_code: int = ErrorCode.UNSUPPORTED_VERSION

    def __init__(self, message: str, kafka_code: int = ErrorCode.UNSUPPORTED_VERSION) -> None:
        super().__init__(message)
        self.kafka_code = kafka_code


class NodeIdInUseError(LoglakeError):
    """Another live broker holds this node id's lease in the cluster (cluster mode)."""


class FlushFailedError(LoglakeError):
    """A flush of cluster mode's shared object failed (its PUT after the retries, or the commit of
    its index): every append of that flush fails with this, none is acknowledged, and the appends
    of other flushes are untouched. Retriable; the code is the commit's own when it had one (a
    fenced leader's NOT_LEADER_OR_FOLLOWER), else REQUEST_TIMED_OUT, which every client retries."""

    kafka_code: int = ErrorCode.REQUEST_TIMED_OUT
    retriable = True

    def __init__(self, key: str, stage: str, cause: BaseException) -> None:
        super().__init__(f"flush object {key}: {stage} failed: {cause}")
        self.key = key
        self.stage = stage
        self.cause = cause
        if isinstance(cause, LoglakeError) and cause.retriable:
            self.kafka_code = cause.kafka_code


class MergeConflictError(LoglakeError):
    """A merge found a different segment already at the key it was about to write (another merger
    of the same partition got there first, or a stale one is still running): it writes nothing,
    and the metadata decides which segment counts. Not retried: the caller re-reads the metadata."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"merged segment {key}: {detail}")
        self.key = key
