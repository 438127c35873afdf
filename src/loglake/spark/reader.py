"""Executor-side reading: one segment slice -> pyarrow RecordBatches in Spark's Kafka schema.

Per slice: one ranged read of the segment tail (trailer + index), then ranged reads of only the
batches that hold offsets [start, end), in chunks of about CHUNK_BYTES. Each Kafka batch has its
CRC-32C checked (as Kafka consumers do with check.crcs=true), is decompressed (any codec), and its
records are scanned by one tight Python loop that only records *positions*: no bytes object
and no tuple is made per record. The key and value columns are then cut out of the decompressed
buffer by Arrow in C (an interleaved binary array whose even elements are the keys, `take`n
in one call), offsets and timestamps go through `array('q')` buffers zero-copy.

Control batches (transaction markers) are skipped. loglake has no transactions yet, so there is
no aborted data to filter; when transactions land, read_committed filtering belongs here.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

import crc32c
import pyarrow as pa

from loglake.errors import CorruptRecordError
from loglake.records.compression import MAX_DECOMPRESSED_BATCH_BYTES, decompress
from loglake.records.varint import MAX_VARINT_BYTES, MAX_VARLONG_BYTES, decode_varint
from loglake.segment.format import KAFKA_CRC_START, KAFKA_HEADER, KAFKA_HEADER_SIZE, read_tail
from loglake.spark.plan import Slice, cached_store

#: Bytes of batches fetched per ranged read.
CHUNK_BYTES = 8 * 1024 * 1024
#: A RecordBatch is emitted once it has this many rows or this many bytes of record data.
MAX_BATCH_ROWS = 128 * 1024
MAX_BATCH_DATA = 64 * 1024 * 1024

ATTR_CODEC = 0x07
ATTR_LOG_APPEND = 0x08
ATTR_CONTROL = 0x20

HEADER_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


def arrow_schema(include_headers: bool) -> pa.Schema:
    """Exactly what Spark derives (to_arrow_schema(..., timezone="UTC")) from the source's schema."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


_even_cache: list[pa.Array] = []


def _even_indices(n: int) -> pa.Array:
    """[0, 2, 4, ..., 2n-2] as int32 (a slice of a cached array)."""
    if not _even_cache or len(_even_cache[0]) < n:
        size = max(n, MAX_BATCH_ROWS * 2)
        _even_cache[:] = [pa.array(range(0, 2 * size, 2), pa.int32())]
    return _even_cache[0].slice(0, n)


def _validity(nulls: list[int], n: int) -> pa.Buffer:
    valid = [True] * n
    for i in nulls:
        valid[i] = False
    buf = pa.array(valid, pa.bool_()).buffers()[1]
    assert buf is not None
    return buf


def _binary_column(spans: array[int], data: pa.Buffer, n: int, nulls: list[int]) -> pa.Array:
    """The n elements [spans[2i], spans[2i+1]) of `data` as a binary array (null where listed)."""
    if n == 0:
        return pa.array([], pa.binary())
    inter = pa.Array.from_buffers(pa.binary(), len(spans) - 1, [None, pa.py_buffer(spans), data])
    col = inter.take(_even_indices(n))
    if nulls:
        offsets, values = col.buffers()[1], col.buffers()[2]
        col = pa.Array.from_buffers(pa.binary(), n, [_validity(nulls, n), offsets, values], len(nulls))
    return col


def _int64_column(values: array[int], typ: pa.DataType) -> pa.Array:
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


class _Columns:
    """Positions and numbers of the records of one output RecordBatch."""

    def __init__(self, include_headers: bool) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0  # bytes in parts
        self.keys: array[int] = array("i")
        self.values: array[int] = array("i")
        self.key_nulls: list[int] = []
        self.value_nulls: list[int] = []
        self.offsets: array[int] = array("q")
        self.timestamps: array[int] = array("q")
        self.ts_types: list[tuple[int, int]] = []  # (row where a run starts, type)
        self.headers: list[Any] | None = [] if include_headers else None

    @property
    def rows(self) -> int:
        return len(self.offsets)

    def add_type(self, ts_type: int) -> None:
        if not self.ts_types or self.ts_types[-1][1] != ts_type:
            self.ts_types.append((self.rows, ts_type))

    def to_batch(self, schema: pa.Schema, topic: str, partition: int) -> pa.RecordBatch:
        n = self.rows
        data = pa.py_buffer(b"".join(self.parts))
        types = []
        for k, (row, t) in enumerate(self.ts_types):
            stop = self.ts_types[k + 1][0] if k + 1 < len(self.ts_types) else n
            types.append(pa.repeat(pa.scalar(t, pa.int32()), stop - row))
        ts_type_col = types[0] if len(types) == 1 else pa.concat_arrays(types)
        cols = [
            _binary_column(self.keys, data, n, self.key_nulls),
            _binary_column(self.values, data, n, self.value_nulls),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            _int64_column(self.offsets, pa.int64()),
            _int64_column(self.timestamps, TIMESTAMP_TYPE),
            ts_type_col,
        ]
        if self.headers is not None:
            cols.append(pa.array(self.headers, HEADER_TYPE))
        return pa.RecordBatch.from_arrays(cols, schema=schema)


def _decode_headers(data: bytes, p: int, end: int) -> tuple[list[tuple[str, bytes | None]] | None, int]:
    hcount, p = decode_varint(data, p, end, MAX_VARINT_BYTES)
    if hcount == 0:
        return None, p
    if hcount < 0 or hcount > (end - p) // 2:
        raise CorruptRecordError(f"header count {hcount} is impossible")
    out: list[tuple[str, bytes | None]] = []
    for _ in range(hcount):
        klen, p = decode_varint(data, p, end, MAX_VARINT_BYTES)
        if klen < 0 or p + klen > end:
            raise CorruptRecordError(f"header key length {klen} is invalid")
        hkey = data[p : p + klen].decode("utf-8")
        p += klen
        vlen, p = decode_varint(data, p, end, MAX_VARINT_BYTES)
        if vlen < 0:
            out.append((hkey, None))
        else:
            if p + vlen > end:
                raise CorruptRecordError(f"header value length {vlen} overruns its record")
            out.append((hkey, data[p : p + vlen]))
            p += vlen
    return out, p


def scan_records(
    data: bytes,
    count: int,
    shift: int,
    base_offset: int,
    first_ts: int,
    log_append_ts: int | None,
    lo: int,
    hi: int,
    cols: _Columns,
) -> None:
    """Scan `count` records filling `data`; record positions (+ `shift`) of those with offsets in
    [lo, hi) into `cols`. The hot loop: single- and two-byte varints inline."""
    n = len(data)
    dv = decode_varint
    keys_append = cols.keys.append
    values_append = cols.values.append
    offsets_append = cols.offsets.append
    ts_append = cols.timestamps.append
    key_nulls = cols.key_nulls
    value_nulls = cols.value_nulls
    headers = cols.headers
    row = cols.rows
    p = 0
    try:
        for _ in range(count):
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
            if length < 6 or end > n:
                raise CorruptRecordError(f"record at byte {p} has impossible length {length}")
            p += 1  # attributes
            b = data[p]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                ts_delta, p = dv(data, p, end, MAX_VARLONG_BYTES)
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
            offset = base_offset + off_delta
            if offset < lo or offset >= hi:
                p = end
                continue
            b = data[p]
            if b < 0x80:
                klen = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                klen, p = dv(data, p, end, MAX_VARINT_BYTES)
            if klen < 0:
                key_nulls.append(row)
                keys_append(p + shift)
                keys_append(p + shift)
            else:
                keys_append(p + shift)
                p += klen
                keys_append(p + shift)
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
                value_nulls.append(row)
                values_append(p + shift)
                values_append(p + shift)
            else:
                values_append(p + shift)
                p += vlen
                values_append(p + shift)
            if p > end:
                raise CorruptRecordError(f"key/value of the record at offset {offset} overrun it")
            offsets_append(offset)
            ts_append((log_append_ts if log_append_ts is not None else first_ts + ts_delta) * 1000)
            if headers is not None:
                if data[p] == 0:
                    headers.append(None)
                    p += 1
                else:
                    hs, p = _decode_headers(data, p, end)
                    headers.append(hs)
                if p != end:
                    raise CorruptRecordError(f"record at offset {offset} has {end - p} stray bytes")
            p = end
            row += 1
    except IndexError:
        raise CorruptRecordError(f"record at byte {p} of a batch at offset {base_offset} is truncated") from None
    if p != n:
        raise CorruptRecordError(f"{n - p} bytes left after the {count} records of the batch at offset {base_offset}")


def read_slice(sl: Slice, include_headers: bool) -> Iterator[pa.RecordBatch]:
    """Records with offsets [sl.start, sl.end) of one segment, as RecordBatches."""
    schema = arrow_schema(include_headers)
    if sl.start >= sl.end:
        return
    store = cached_store(sl.store_url)
    _trailer, index = read_tail(store, sl.key, sl.size)
    first = index.find_offset(sl.start)
    last = index.find_offset(sl.end - 1)
    if first is None:
        return
    if last is None:
        last = len(index) - 1
    cols = _Columns(include_headers)
    i = first
    while i <= last:
        pos, length, n = index.byte_range(i, CHUNK_BYTES)
        if i + n - 1 > last:
            n = last - i + 1
            length = index.entry(last).end - pos
        buf = store.get_range(sl.key, pos, length)
        if len(buf) != length:
            raise CorruptRecordError(f"{sl.key}: short read at byte {pos} ({len(buf)} of {length})")
        view = memoryview(buf)
        at = 0
        for _ in range(n):
            (base, blen, _e, magic, crc, attrs, _lod, first_ts, max_ts, _pid, _pe, _seq, count) = KAFKA_HEADER.unpack_from(buf, at)
            size = blen + 12
            if magic != 2 or at + size > length:
                raise CorruptRecordError(f"{sl.key}: bad batch at byte {pos + at}")
            if crc32c.crc32c(view[at + KAFKA_CRC_START : at + size]) != crc:
                raise CorruptRecordError(f"{sl.key}: CRC-32C mismatch in the batch at byte {pos + at} (offset {base})")
            if not attrs & ATTR_CONTROL:
                codec = attrs & ATTR_CODEC
                body = view[at + KAFKA_HEADER_SIZE : at + size]
                data = decompress(codec, body, MAX_DECOMPRESSED_BATCH_BYTES) if codec else body.tobytes()
                cols.add_type(1 if attrs & ATTR_LOG_APPEND else 0)
                scan_records(
                    data,
                    count,
                    cols.size,
                    base,
                    first_ts,
                    max_ts if attrs & ATTR_LOG_APPEND else None,
                    sl.start,
                    sl.end,
                    cols,
                )
                cols.parts.append(data)
                cols.size += len(data)
                if cols.rows >= MAX_BATCH_ROWS or cols.size >= MAX_BATCH_DATA:
                    if cols.rows:
                        yield cols.to_batch(schema, sl.topic, sl.partition)
                    cols = _Columns(include_headers)
            at += size
        i += n
    if cols.rows:
        yield cols.to_batch(schema, sl.topic, sl.partition)
