# Kafka v2 RecordBatch (magic 2), all integers big-endian:
#
#   offset  size  field
#   0       8     base_offset              int64   first offset of the batch (broker assigns)
#   8       4     batch_length             int32   bytes after this field: batch size = batch_length + 12
#   12      4     partition_leader_epoch   int32   (broker assigns)
#   16      1     magic                    int8    = 2
#   17      4     crc                      uint32  CRC-32C (Castagnoli) of bytes 21 .. end of batch
#   21      2     attributes               int16   bits 0-2 codec, 3 timestamp type, 4 transactional, 5 control
#   23      4     last_offset_delta        int32
#   27      8     first_timestamp          int64
#   35      8     max_timestamp            int64
#   43      8     producer_id              int64
#   51      2     producer_epoch           int16
#   53      4     base_sequence            int32
#   57      4     record_count             int32
#   61      ...   records                  (compressed as a whole when the codec bits are non-zero)
#
# What the CRC covers: attributes (byte 21) through the last byte of the batch. base_offset,
# batch_length, partition_leader_epoch, magic and the crc itself are NOT covered, so a broker can
# assign the base offset and leader epoch without recomputing it. (batch_length is protected
# indirectly: changing it moves the covered range's end.)
#
# Record (inside the records section, back to back):
#   length          varint   bytes of the record after this field
#   attributes      int8     unused, 0
#   timestamp_delta varlong  timestamp - first_timestamp
#   offset_delta    varint   offset - base_offset
#   key_length      varint   -1 = null key
#   key             bytes
#   value_length    varint   -1 = null value
#   value           bytes
#   header_count    varint
#   headers         [header_key_length varint, header_key utf-8, header_value_length varint (-1 = null),
#                    header_value bytes] * header_count
"""Kafka v2 record batches: header peek, validation, in-place patching and building (decoding: loglake.records.decode)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import crc32c

from loglake.errors import ConfigError, CorruptRecordError, InvalidRecordError, RecordTooLargeError
from loglake.records.compression import CODEC_NAMES, compress
from loglake.records.varint import (
    encode_varint_fast,
)

Buffer = bytes | bytearray | memoryview
Header = tuple[str, bytes | None]

HEADER: struct.Struct = struct.Struct(
    ">"
    "q"  # base_offset
    "i"  # batch_length
    "i"  # partition_leader_epoch
    "B"  # magic
    "I"  # crc
    "h"  # attributes
    "i"  # last_offset_delta
    "q"  # first_timestamp
    "q"  # max_timestamp
    "q"  # producer_id
    "h"  # producer_epoch
    "i"  # base_sequence
    "i"  # record_count
)


def _field_offset(index: int) -> int:
    """Byte offset of header field ``index``: the size of all the fields before it."""
    return struct.calcsize(HEADER.format[: 1 + index])


BATCH_HEADER_SIZE = HEADER.size  # 61
BASE_OFFSET_OFFSET = _field_offset(0)  # 0
BATCH_LENGTH_OFFSET = _field_offset(1)  # 8
LENGTH_FIELD_END = _field_offset(2)  # 12: batch size = batch_length + LENGTH_FIELD_END
PARTITION_LEADER_EPOCH_OFFSET = _field_offset(2)  # 12
MAGIC_OFFSET = _field_offset(3)  # 16
CRC_OFFSET = _field_offset(4)  # 17
CRC_COVERED_START = _field_offset(5)  # 21: attributes onwards
ATTRIBUTES_OFFSET = CRC_COVERED_START
LAST_OFFSET_DELTA_OFFSET = _field_offset(6)  # 23
FIRST_TIMESTAMP_OFFSET = _field_offset(7)  # 27
MAX_TIMESTAMP_OFFSET = _field_offset(8)  # 35
PRODUCER_ID_OFFSET = _field_offset(9)  # 43
RECORD_COUNT_OFFSET = _field_offset(12)  # 57
#: Smallest legal batch_length: a header with zero records.
MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LENGTH_FIELD_END  # 49

MAGIC_V2 = 2

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1

#: A record's encoded body (after its length varint) is at least 6 bytes: attributes, timestamp
#: delta, offset delta, key length, value length, header count.
MIN_RECORD_BODY = 6
#: Offset deltas are int32 on the wire, so one batch holds at most this many records.
MAX_RECORDS_PER_BATCH = (1 << 31) - 1

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_BASE_OFFSET = struct.Struct(">q")
_OFFSET_LENGTH_EPOCH = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
_TIMESTAMP = struct.Struct(">q")


def _fields(first: int, last: int) -> struct.Struct:
    """The header fields ``first``..``last`` (indexes into HEADER), unpacked from the first one's offset."""
    return struct.Struct(">" + HEADER.format[1 + first : 2 + last])


#: base_offset and batch_length: the fields before the bytes batch_length counts, all a scan
#: needs to step from batch to batch.
BASE_AND_LENGTH = _fields(0, 1)
#: base_offset, batch_length, partition_leader_epoch, magic and crc: the bytes the CRC does not cover.
UNCOVERED_HEAD = _fields(0, 4)
# batch_length read unsigned (batch_size): a corrupt negative length then points past the data
# instead of backwards, so a scan that trusts it still moves on.
_BATCH_LENGTH_UNSIGNED = struct.Struct(">I")
_LAST_OFFSET_DELTA = _fields(6, 6)
_PRODUCER = _fields(9, 10)  # producer_id, producer_epoch
# Attributes are a big-endian int16 and every bit Kafka defines is in its low byte.
ATTRIBUTES_LOW_BYTE = ATTRIBUTES_OFFSET + _ATTRIBUTES.size - 1


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LENGTH_FIELD_END

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return TIMESTAMP_LOG_APPEND_TIME if self.attributes & ATTR_TIMESTAMP_TYPE else TIMESTAMP_CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


# --------------------------------------------------------------------------- header / validation


def peek_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Parse the 61-byte header at ``buf[pos]`` without checking the CRC or decoding records.

    Raises CorruptRecordError if fewer than 61 bytes remain, magic != 2, batch_length < 49 or
    record_count < 0. Bytes after the batch are ignored.
    """
    if pos < 0:
        raise CorruptRecordError(f"negative batch position {pos}")
    avail = len(buf) - pos
    if avail > MAGIC_OFFSET and buf[pos + MAGIC_OFFSET] != MAGIC_V2:
        raise CorruptRecordError(
            f"unsupported magic {buf[pos + MAGIC_OFFSET]} at byte {pos + MAGIC_OFFSET} (only v2 batches)"
        )
    if avail < BATCH_HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch header at byte {pos}: need {BATCH_HEADER_SIZE} bytes, {max(avail, 0)} left"
        )
    h = BatchHeader._make(HEADER.unpack_from(buf, pos))
    if h.batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch_length {h.batch_length} at byte {pos + BATCH_LENGTH_OFFSET} is below the minimum "
            f"{MIN_BATCH_LENGTH}"
        )
    if h.record_count < 0:
        raise CorruptRecordError(
            f"negative record_count {h.record_count} at byte {pos + RECORD_COUNT_OFFSET}"
        )
    return h


def batch_size(buf: Buffer, pos: int = 0) -> int:
    """Total bytes of the batch at ``buf[pos]``, from its batch_length alone (nothing else checked).

    For scans over batches already validated, and for a batch's first LENGTH_FIELD_END bytes read
    on their own. Raises CorruptRecordError if fewer than LENGTH_FIELD_END bytes remain.
    """
    if len(buf) - pos < LENGTH_FIELD_END:
        raise CorruptRecordError(f"truncated batch at byte {pos}: no batch_length")
    return LENGTH_FIELD_END + int(_BATCH_LENGTH_UNSIGNED.unpack_from(buf, pos + BATCH_LENGTH_OFFSET)[0])


def peek_last_offset(buf: Buffer, pos: int = 0) -> int:
    """The last offset of the batch at ``buf[pos]``, from its base_offset and last_offset_delta alone
    (nothing checked: for batches already validated)."""
    base_offset = _BASE_OFFSET.unpack_from(buf, pos + BASE_OFFSET_OFFSET)[0]
    return int(base_offset + _LAST_OFFSET_DELTA.unpack_from(buf, pos + LAST_OFFSET_DELTA_OFFSET)[0])


def peek_txn_producer(buf: Buffer, pos: int = 0) -> tuple[int, int] | None:
    """``(producer_id, producer_epoch)`` of the batch at ``buf[pos]`` if it is transactional; None if it
    is not, or if its header is not all there (validation then says what is wrong with it).

    One byte test for a non-transactional batch, one small unpack for a transactional one: cheap
    enough to run on every produced batch before it is validated.
    """
    if len(buf) - pos < BATCH_HEADER_SIZE or not buf[pos + ATTRIBUTES_LOW_BYTE] & ATTR_TRANSACTIONAL:
        return None
    producer_id, producer_epoch = _PRODUCER.unpack_from(buf, pos + PRODUCER_ID_OFFSET)
    return producer_id, producer_epoch


def _check_fits(buf: Buffer, pos: int, h: BatchHeader) -> None:
    left = len(buf) - pos
    if h.size > left:
        raise CorruptRecordError(f"batch at byte {pos} declares {h.size} bytes but only {left} are present")


def _compute_crc(buf: Buffer, pos: int, size: int) -> int:
    with memoryview(buf) as view:
        return int(crc32c.crc32c(view[pos + CRC_COVERED_START : pos + size]))


def _check_crc(buf: Buffer, pos: int, h: BatchHeader) -> None:
    actual = _compute_crc(buf, pos, h.size)
    if actual != h.crc:
        raise CorruptRecordError(
            f"CRC mismatch in batch at byte {pos} (base offset {h.base_offset}): stored {h.crc:#010x}, "
            f"computed {actual:#010x} over bytes {pos + CRC_COVERED_START}..{pos + h.size}"
        )


def validate_batch(buf: Buffer, pos: int = 0) -> BatchHeader:
    """:func:`peek_header`, plus: the whole batch is present and its CRC-32C matches."""
    h = peek_header(buf, pos)
    _check_fits(buf, pos, h)
    _check_crc(buf, pos, h)
    return h


def split_batches(buf: Buffer, max_batch_bytes: int | None = None) -> list[tuple[int, BatchHeader]]:
    """Validate every batch of a payload holding batches back to back; return ``(pos, header)`` pairs.

    Any trailing partial batch makes the whole payload corrupt (as Kafka rejects the whole set). A
    batch bigger than ``max_batch_bytes`` raises RecordTooLargeError. An empty payload gives ``[]``.
    As Kafka's broker does for produced batches, a batch whose offset range disagrees with its record
    count (``last_offset_delta + 1 != record_count``, or no records) raises InvalidRecordError: the
    caller assigns offsets from ``last_offset_delta``.
    """
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    end = len(buf)
    while pos < end:
        h = peek_header(buf, pos)
        _check_fits(buf, pos, h)
        if max_batch_bytes is not None and h.size > max_batch_bytes:
            raise RecordTooLargeError(
                f"batch at byte {pos} is {h.size} bytes, larger than the limit of {max_batch_bytes}"
            )
        _check_crc(buf, pos, h)
        if h.record_count <= 0 or h.last_offset_delta != h.record_count - 1:
            raise InvalidRecordError(
                f"batch at byte {pos}: inconsistent offset range (last_offset_delta {h.last_offset_delta}, "
                f"record_count {h.record_count})"
            )
        out.append((pos, h))
        pos += h.size
    return out


# --------------------------------------------------------------------------- in-place patching


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Overwrite the base offset of the batch at ``buf[pos]``. The CRC does not cover it."""
    if pos < 0 or len(buf) - pos < BATCH_HEADER_SIZE:
        raise CorruptRecordError(f"no batch header at byte {pos} (buffer has {len(buf)} bytes)")
    if not _INT64_MIN <= base_offset <= _INT64_MAX:
        raise ValueError(f"base offset out of int64 range: {base_offset}")
    _BASE_OFFSET.pack_into(buf, pos + BASE_OFFSET_OFFSET, base_offset)


def set_offset_and_epoch(buf: bytearray | memoryview, pos: int, base_offset: int, batch_length: int, epoch: int) -> None:
    """Assign the batch at ``buf[pos]`` its base offset and the partition's leader epoch, as
    Kafka's leader does: one write of the first 16 bytes (`batch_length` is rewritten as it is).
    Neither field is covered by the CRC. For the append path: the caller has checked the header
    (split_batches) and the offset range."""
    _OFFSET_LENGTH_EPOCH.pack_into(buf, pos, base_offset, batch_length, epoch)


def set_log_append_time(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Stamp the batch at ``buf[pos]`` with the broker's time (message.timestamp.type=LogAppendTime).

    Sets the timestamp-type attribute bit, sets max_timestamp and first_timestamp to ``timestamp_ms``
    and recomputes the CRC in place. The batch is validated (CRC included) first, so corruption is
    never hidden behind a fresh CRC.
    """
    h = validate_batch(buf, pos)
    if not _INT64_MIN <= timestamp_ms <= _INT64_MAX:
        raise ValueError(f"timestamp out of int64 range: {timestamp_ms}")
    _ATTRIBUTES.pack_into(buf, pos + ATTRIBUTES_OFFSET, h.attributes | ATTR_TIMESTAMP_TYPE)
    _TIMESTAMP.pack_into(buf, pos + FIRST_TIMESTAMP_OFFSET, timestamp_ms)
    _TIMESTAMP.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    _CRC.pack_into(buf, pos + CRC_OFFSET, _compute_crc(buf, pos, h.size))


# --------------------------------------------------------------------------- building


class BatchBuilder:
    """Accumulates records and serializes them as one v2 batch.

    Record bytes are kept as a list of parts and joined once in :meth:`build`.
    """

    __slots__ = (
        "_attributes",
        "_base_offset",
        "_base_sequence",
        "_codec",
        "_count",
        "_first_timestamp",
        "_max_timestamp",
        "_partition_leader_epoch",
        "_parts",
        "_producer_epoch",
        "_producer_id",
        "_size",
    )

    def __init__(
        self,
        *,
        compression: int = 0,
        base_offset: int = 0,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = -1,
        base_sequence: int = NO_SEQUENCE,
        is_transactional: bool = False,
        is_control: bool = False,
        timestamp_type: int = TIMESTAMP_CREATE_TIME,
        partition_leader_epoch: int = -1,
    ) -> None:
        if compression not in CODEC_NAMES.values():
            raise ConfigError(f"unknown compression codec {compression}")
        if timestamp_type not in (TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME):
            raise ConfigError(
                f"timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime), not {timestamp_type}"
            )
        self._codec = compression
        self._attributes = (
            compression
            | (ATTR_TIMESTAMP_TYPE if timestamp_type == TIMESTAMP_LOG_APPEND_TIME else 0)
            | (ATTR_TRANSACTIONAL if is_transactional else 0)
            | (ATTR_CONTROL if is_control else 0)
        )
        self._base_offset = base_offset
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        self._partition_leader_epoch = partition_leader_epoch
        self._parts: list[bytes] = []
        self._count = 0
        self._size = 0
        self._first_timestamp = NO_TIMESTAMP
        self._max_timestamp = NO_TIMESTAMP

    def __len__(self) -> int:
        return self._count

    def estimated_size(self) -> int:
        """Uncompressed size of the batch built so far, header included."""
        return BATCH_HEADER_SIZE + self._size

    def append(
        self,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> int:
        """Add a record; return its offset delta."""
        delta = self._count
        if delta >= MAX_RECORDS_PER_BATCH:
            raise InvalidRecordError(f"a batch holds at most {MAX_RECORDS_PER_BATCH} records")
        if type(timestamp) is not int:
            raise TypeError(f"timestamp must be int, not {type(timestamp).__name__}")
        if not _INT64_MIN <= timestamp <= _INT64_MAX:
            raise InvalidRecordError(f"timestamp {timestamp} is out of the int64 range")
        if delta == 0:
            self._first_timestamp = timestamp
            self._max_timestamp = timestamp
        elif timestamp > self._max_timestamp:
            self._max_timestamp = timestamp
        ts_delta = timestamp - self._first_timestamp
        if not _INT64_MIN <= ts_delta <= _INT64_MAX:
            raise InvalidRecordError(f"timestamp {timestamp} too far from the batch's first timestamp")
        enc = encode_varint_fast
        parts: list[bytes] = [b"\x00" + enc(ts_delta) + enc(delta)]
        if key is None:
            parts.append(b"\x01")  # zigzag(-1)
        else:
            key = bytes(key)
            parts.append(enc(len(key)))
            parts.append(key)
        if value is None:
            parts.append(b"\x01")
        else:
            value = bytes(value)
            parts.append(enc(len(value)))
            parts.append(value)
        parts.append(enc(len(headers)))
        for h_key, h_value in headers:
            if type(h_key) is not str:
                raise TypeError(f"header key must be str, not {type(h_key).__name__}")
            raw_key = h_key.encode("utf-8")
            parts.append(enc(len(raw_key)))
            parts.append(raw_key)
            if h_value is None:
                parts.append(b"\x01")
            else:
                h_value = bytes(h_value)
                parts.append(enc(len(h_value)))
                parts.append(h_value)
        body_len = 0
        for part in parts:
            body_len += len(part)
        length_prefix = enc(body_len)
        self._parts.append(length_prefix)
        self._parts.extend(parts)
        self._size += len(length_prefix) + body_len
        self._count = delta + 1
        return delta

    def append_all(
        self,
        records: Iterable[tuple[int | None, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
        now: int,
    ) -> None:
        """Add (timestamp or None, key, value, headers) records in order; None takes `now`.

        The same records and errors as `append` one at a time (a backend may do it faster)."""
        append = self.append
        for ts, key, value, headers in records:
            append(now if ts is None else ts, key, value, headers)

    def append_pairs(
        self,
        records: Iterable[tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
        now: int,
    ) -> None:
        """Add (key, value) or (key, value, headers) records in order, each stamped `now`: the
        embedded API's produce_batch records as the caller gives them, with no tuple rebuilt
        per record. The same records and errors as `append` one at a time."""
        append = self.append
        for rec in records:
            append(now, rec[0], rec[1], rec[2] if len(rec) > 2 else ())

    def build(self) -> bytes:
        """Serialize the batch (compressing the record section if configured) with its CRC."""
        if self._count == 0:
            raise InvalidRecordError("cannot build a batch without records")
        return self._finish(b"".join(self._parts))

    def _finish(self, records: Buffer) -> bytes:
        """Header, CRC and (if configured) compression around an encoded records section; shared
        with the native builder (loglake.records.native), which encodes the records differently."""
        count = self._count
        if self._codec:
            records = compress(self._codec, bytes(records))
        fields: list[Any] = [
            self._base_offset,
            BATCH_HEADER_SIZE + len(records) - LENGTH_FIELD_END,
            self._partition_leader_epoch,
            MAGIC_V2,
            0,
            self._attributes,
            count - 1,
            self._first_timestamp,
            self._max_timestamp,
            self._producer_id,
            self._producer_epoch,
            self._base_sequence,
            count,
        ]
        try:
            header = HEADER.pack(*fields)
            crc = crc32c.crc32c(records, crc32c.crc32c(header[CRC_COVERED_START:]))
            fields[4] = crc
            header = HEADER.pack(*fields)
        except struct.error as e:
            raise InvalidRecordError(f"batch header field out of range: {e}") from None
        return header + records


def new_builder(**builder_kwargs: Any) -> BatchBuilder:
    """A :class:`BatchBuilder` of the record backend in use (loglake.records.native chooses it):
    where records are built one by one, build them through this rather than the class."""
    return _BUILDER(**builder_kwargs)


def build_batch(
    records: Iterable[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    **builder_kwargs: Any,
) -> bytes:
    """Build one batch from ``(timestamp, key, value, headers)`` tuples."""
    builder = new_builder(**builder_kwargs)
    append = builder.append
    for timestamp, key, value, headers in records:
        append(timestamp, key, value, headers)
    return builder.build()


# The builder in use: the pure-Python reference here until loglake.records.native installs the
# compiled one (set_builder). A module global so that every caller of build_batch and new_builder
# follows the choice without importing the native module itself.
_BUILDER: Callable[..., BatchBuilder] = BatchBuilder


def set_builder(builder: Callable[..., BatchBuilder]) -> None:
    """Install a batch builder (loglake.records.native.use_backend calls this)."""
    global _BUILDER
    _BUILDER = builder


__all__ = [
    "ATTR_COMPRESSION_MASK",
    "ATTR_CONTROL",
    "ATTR_TIMESTAMP_TYPE",
    "ATTR_TRANSACTIONAL",
    "BASE_AND_LENGTH",
    "BATCH_HEADER_SIZE",
    "CRC_COVERED_START",
    "HEADER",
    "LENGTH_FIELD_END",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "UNCOVERED_HEAD",
    "BatchBuilder",
    "BatchHeader",
    "Record",
    "batch_size",
    "build_batch",
    "new_builder",
    "peek_header",
    "peek_last_offset",
    "peek_txn_producer",
    "set_base_offset",
    "set_builder",
    "set_log_append_time",
    "set_offset_and_epoch",
    "split_batches",
    "validate_batch",
]
