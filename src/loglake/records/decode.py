"""Decoding Kafka v2 record batches into records: the pure-Python reference decoder, and the
switch to the compiled one (loglake.records.native installs it with `set_backend`).

Headers, validation, patching and building are in loglake.records.batch; this module only reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from loglake.errors import CorruptRecordError
from loglake.records import batch as _batch
from loglake.records.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_TIMESTAMP_TYPE,
    BATCH_HEADER_SIZE,
    MIN_RECORD_BODY,
    BatchBuilder,
    BatchHeader,
    Buffer,
    Header,
    Record,
    _check_crc,
    _check_fits,
    peek_header,
)
from loglake.records.compression import MAX_DECOMPRESSED_BATCH_BYTES, decompress
from loglake.records.varint import MAX_VARINT_BYTES, MAX_VARLONG_BYTES, decode_varint

__all__ = [
    "ColumnsDecoder",
    "RecordColumns",
    "RecordsDecoder",
    "columns_of",
    "decode_batch",
    "decode_batch_columns",
    "decode_batches",
    "decode_batches_columns",
    "decode_columns_py",
    "decode_records_py",
    "iter_records",
    "set_backend",
]


class RecordColumns(NamedTuple):
    """A batch's records as one sequence per field, in record order (the i-th record is
    ``offsets[i], timestamps[i], keys[i], values[i], headers[i]``).

    Why columns: a reader that makes its own record objects (the embedded API's ConsumerRecord)
    builds them in one C-level zip over the columns and the fields it adds itself, instead of
    decoding into a Record first and unpacking each one again; the compiled backend fills the
    columns straight from aiokafka's records, one C-level pass per field."""

    offsets: Sequence[int]
    timestamps: Sequence[int]
    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]
    headers: Sequence[list[Header]]


_NO_COLUMNS = RecordColumns((), (), (), (), ())


def columns_of(records: Sequence[Record]) -> RecordColumns:
    """The columns of decoded records (the reference's way to columns)."""
    if not records:
        return _NO_COLUMNS
    offsets, timestamps, keys, values, headers = zip(*records, strict=True)
    return RecordColumns(offsets, timestamps, keys, values, headers)


def decode_columns_py(data: bytes, h: BatchHeader, where: str) -> RecordColumns:
    """:func:`decode_records_py` as columns: the same records, the same errors."""
    return columns_of(decode_records_py(data, h, where))


def _decode_headers(data: bytes, p: int, end: int, where: str) -> tuple[list[Header], int]:
    """Decode a record's header count and headers at ``data[p]`` (inside a record ending at ``end``)."""
    dv = decode_varint
    b = data[p]
    if b < 0x80:
        hcount = (b >> 1) ^ -(b & 1)
        p += 1
    else:
        hcount, p = dv(data, p, end, MAX_VARINT_BYTES)
    # each header takes at least 2 bytes (two length varints)
    if hcount < 0 or hcount > (end - p) // 2:
        raise CorruptRecordError(f"{where}: header count {hcount} before byte {p} is impossible")
    headers: list[Header] = []
    append = headers.append
    for _ in range(hcount):
        b = data[p]
        if b < 0x80:
            hklen = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            hklen, p = dv(data, p, end, MAX_VARINT_BYTES)
        q = p + hklen
        if hklen < 0 or q > end:
            raise CorruptRecordError(f"{where}: header key length {hklen} at byte {p} is invalid")
        try:
            hkey = data[p:q].decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptRecordError(f"{where}: header key at byte {p} is not UTF-8") from None
        p = q
        b = data[p]
        if b < 0x80:
            hvlen = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            hvlen, p = dv(data, p, end, MAX_VARINT_BYTES)
        if hvlen < 0:
            append((hkey, None))
        else:
            q = p + hvlen
            if q > end:
                raise CorruptRecordError(
                    f"{where}: header value length {hvlen} at byte {p} overruns its record"
                )
            append((hkey, data[p:q]))
            p = q
    return headers, p


def decode_records_py(data: bytes, h: BatchHeader, where: str) -> list[Record]:
    """Decode ``h.record_count`` records filling ``data`` exactly.

    Hot path: one-byte varints are decoded inline; longer ones go to :func:`decode_varint`. Any
    IndexError (a varint or field running off the end of ``data``) is turned into CorruptRecordError.
    """
    n = len(data)
    count = h.record_count
    # Every record takes at least 1 + MIN_RECORD_BODY bytes; checked before looping so a garbled
    # count cannot make us spin.
    if count > n // (1 + MIN_RECORD_BODY):
        raise CorruptRecordError(f"{where}: record_count {count} cannot fit in {n} bytes of records")
    base_offset = h.base_offset
    first_ts = h.first_timestamp
    log_append = h.attributes & ATTR_TIMESTAMP_TYPE
    max_ts = h.max_timestamp
    dv = decode_varint
    new = tuple.__new__
    rec_cls = Record
    out: list[Record] = []
    append = out.append
    p = 0
    rec_start = 0
    try:
        for _ in range(count):
            rec_start = p
            # length (varint)
            b = data[p]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                c = data[p + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    length = (z >> 1) ^ -(z & 1)
                    p += 2
                else:
                    length, p = dv(data, p, n, MAX_VARINT_BYTES)
            end = p + length
            if length < MIN_RECORD_BODY or end > n:
                raise CorruptRecordError(
                    f"{where}: record at byte {rec_start} of the records section has length {length}, "
                    f"{n - p} bytes left"
                )
            p += 1  # attributes (int8, unused)
            # timestamp delta (varlong)
            b = data[p]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                c = data[p + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    ts_delta = (z >> 1) ^ -(z & 1)
                    p += 2
                else:
                    ts_delta, p = dv(data, p, end, MAX_VARLONG_BYTES)
            # offset delta (varint)
            b = data[p]
            if b < 0x80:
                off_delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                c = data[p + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    off_delta = (z >> 1) ^ -(z & 1)
                    p += 2
                else:
                    off_delta, p = dv(data, p, end, MAX_VARINT_BYTES)
            # key
            b = data[p]
            if b < 0x80:
                klen = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                c = data[p + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    klen = (z >> 1) ^ -(z & 1)
                    p += 2
                else:
                    klen, p = dv(data, p, end, MAX_VARINT_BYTES)
            if klen < 0:
                key = None
            else:
                q = p + klen
                if q > end:
                    raise CorruptRecordError(
                        f"{where}: key length {klen} at byte {p} overruns its record (ends at {end})"
                    )
                key = data[p:q]
                p = q
            # value
            b = data[p]
            if b < 0x80:
                vlen = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                c = data[p + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    vlen = (z >> 1) ^ -(z & 1)
                    p += 2
                else:
                    vlen, p = dv(data, p, end, MAX_VARINT_BYTES)
            if vlen < 0:
                value = None
            else:
                q = p + vlen
                if q > end:
                    raise CorruptRecordError(
                        f"{where}: value length {vlen} at byte {p} overruns its record (ends at {end})"
                    )
                value = data[p:q]
                p = q
            # headers
            b = data[p]
            if b == 0:
                headers: list[Header] = []
                p += 1
            else:
                headers, p = _decode_headers(data, p, end, where)
            if p != end:
                raise CorruptRecordError(
                    f"{where}: record at byte {rec_start} of the records section declares length {length} "
                    f"but its fields take {p - (end - length)}"
                )
            append(
                new(
                    rec_cls,
                    (
                        base_offset + off_delta,
                        max_ts if log_append else first_ts + ts_delta,
                        key,
                        value,
                        headers,
                    ),
                )
            )
    except IndexError:
        raise CorruptRecordError(
            f"{where}: record at byte {rec_start} of the records section is truncated"
        ) from None
    if p != n:
        raise CorruptRecordError(f"{where}: {n - p} bytes left after the last of {count} records")
    return out


def _records_section(
    buf: Buffer, pos: int, check_crc: bool, max_decompressed_bytes: int
) -> tuple[BatchHeader, bytes]:
    """Header of the batch at ``buf[pos]`` and its records section (decompressed), checked."""
    h = peek_header(buf, pos)
    _check_fits(buf, pos, h)
    if check_crc:
        _check_crc(buf, pos, h)
    start = pos + BATCH_HEADER_SIZE
    stop = pos + h.size
    codec = h.attributes & ATTR_COMPRESSION_MASK
    if codec:
        with memoryview(buf) as view:
            return h, decompress(codec, view[start:stop], max_decompressed_bytes)
    with memoryview(buf) as view:
        return h, view[start:stop].tobytes()


def decode_batch(
    buf: Buffer,
    pos: int = 0,
    *,
    check_crc: bool = True,
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BATCH_BYTES,
) -> tuple[BatchHeader, list[Record]]:
    """Validate the batch at ``buf[pos]`` (CRC unless ``check_crc=False``) and decode all its records."""
    h, data = _records_section(buf, pos, check_crc, max_decompressed_bytes)
    return h, _DECODE_RECORDS(data, h, f"batch at byte {pos}")


def decode_batch_columns(
    buf: Buffer,
    pos: int = 0,
    *,
    check_crc: bool = True,
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BATCH_BYTES,
) -> tuple[BatchHeader, RecordColumns]:
    """:func:`decode_batch` with the records as :class:`RecordColumns` (same checks, same errors)."""
    h, data = _records_section(buf, pos, check_crc, max_decompressed_bytes)
    return h, _DECODE_COLUMNS(data, h, f"batch at byte {pos}")


def iter_records(batch: Buffer, pos: int = 0, *, check_crc: bool = True) -> Iterator[Record]:
    """Records of the batch at ``batch[pos]`` with absolute offsets and timestamps.

    Decompresses any codec; for LogAppendTime batches every record's timestamp is the batch's
    max_timestamp. Control batches are decoded like any other (callers skip them). The whole batch is
    decoded before the first record is returned, so a corrupt batch yields nothing.
    """
    return iter(decode_batch(batch, pos, check_crc=check_crc)[1])


def _batch_positions(buf: Buffer, allow_partial_tail: bool) -> Iterator[int]:
    """Where each whole batch in ``buf`` starts (a partial tail ends the walk when allowed; else
    it is left to the decoder, which raises CorruptRecordError on it)."""
    pos = 0
    end = len(buf)
    while pos < end:
        if allow_partial_tail:
            left = end - pos
            if left < BATCH_HEADER_SIZE:
                return
            if peek_header(buf, pos).size > left:
                return
        yield pos
        pos += peek_header(buf, pos).size


def decode_batches(
    buf: Buffer, *, check_crc: bool = True, allow_partial_tail: bool = False
) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """Decode several batches back to back.

    A trailing partial batch raises CorruptRecordError, unless ``allow_partial_tail`` (as in a Fetch
    response, which a broker may cut in the middle of a batch), when it is skipped.
    """
    for pos in _batch_positions(buf, allow_partial_tail):
        yield decode_batch(buf, pos, check_crc=check_crc)


def decode_batches_columns(
    buf: Buffer, *, check_crc: bool = True, allow_partial_tail: bool = False
) -> Iterator[tuple[BatchHeader, RecordColumns]]:
    """:func:`decode_batches` with each batch's records as :class:`RecordColumns`."""
    for pos in _batch_positions(buf, allow_partial_tail):
        yield decode_batch_columns(buf, pos, check_crc=check_crc)


RecordsDecoder = Callable[[bytes, BatchHeader, str], list[Record]]
ColumnsDecoder = Callable[[bytes, BatchHeader, str], RecordColumns]

# The records decoder in use: the pure-Python reference until loglake.records.native installs the
# compiled one. A module global so that every caller of decode_batch and iter_records follows the
# choice without importing the native module itself.
_DECODE_RECORDS: RecordsDecoder = decode_records_py
_DECODE_COLUMNS: ColumnsDecoder = decode_columns_py


def set_backend(
    builder: Callable[..., BatchBuilder], decoder: RecordsDecoder, columns_decoder: ColumnsDecoder
) -> None:
    """Install a record backend, builder and decoders together (loglake.records.native.use_backend)."""
    global _DECODE_RECORDS, _DECODE_COLUMNS
    _batch.set_builder(builder)
    _DECODE_RECORDS = decoder
    _DECODE_COLUMNS = columns_decoder
