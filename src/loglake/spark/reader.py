"""Executor-side reading: one segment slice -> pyarrow RecordBatches in Spark's Kafka schema.

Per slice: one ranged read of the segment tail (trailer + index), then ranged reads of only the
batches that hold offsets [start, end), in chunks of about CHUNK_BYTES. Every Kafka batch has its
CRC-32C checked (as Kafka consumers do with check.crcs=true) and is decompressed (any codec).

Decoding is columnar, with no Python object per record:

1. *Locate* each record's start. A batch whose records all have the same size (the common case
   of fixed-size events) is located with one `arange` and verified vectorially; otherwise a
   tight Python loop hops from length varint to length varint (the only per-record Python).
2. *Parse* every field of all records of up to MAX_BATCH_ROWS records at once with numpy
   (vectorized zigzag varints), and check every record ends exactly where the next begins.
3. *Cut* the key and value columns out of the decompressed buffer in C: an interleaved Arrow
   binary array whose even elements are the keys (values), `take`n in one call.

Control batches (transaction markers) are skipped. At read_committed (the slice names the
aborted transactions overlapping it) the batches of aborted transactions are skipped too: a
transactional batch of producer P at offset o is aborted when P's next marker after o is an
ABORT, i.e. an entry (P, first, marker) has first <= o < marker. The planner takes the entries
from the metadata, and the segment's own transaction index (format version 3) adds its own.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Iterable, Iterator
from typing import Any

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loglake.errors import CorruptRecordError
from loglake.records.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    LENGTH_FIELD_END,
    MAGIC_V2,
)
from loglake.records.committed import AbortedTxns
from loglake.records.compression import MAX_DECOMPRESSED_BATCH_BYTES, decompress
from loglake.records.varint import MAX_VARINT_BYTES, Buffer, decode_varint
from loglake.segment.format import KAFKA_CRC_START, KAFKA_HEADER, KAFKA_HEADER_SIZE, read_tail
from loglake.spark.model import FlushSlice, Slice
from loglake.spark.plan import cached_store

#: Bytes of batches fetched per ranged read.
CHUNK_BYTES = 8 * 1024 * 1024
#: A RecordBatch is emitted once it has this many rows or this many bytes of record data.
MAX_BATCH_ROWS = 128 * 1024
MAX_BATCH_DATA = 64 * 1024 * 1024
#: Batches with at least this many records try the uniform-size fast path.
UNIFORM_MIN_RECORDS = 32
#: Distinct batch record counts whose offset-delta sizes are kept, and the largest count kept
#: (64 arrays of at most 8 B * 16 Ki = 128 KiB each: 8 MiB at most).
DELTA_SIZES_CACHED = 64
DELTA_SIZES_MAX_COUNT = 16 * 1024

HEADER_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

NDArray = Any  # numpy arrays (numpy's generics add nothing here)


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


# ---- vectorized helpers ------------------------------------------------------------------------

_even_cache: list[pa.Array] = []


def _even_indices(n: int) -> pa.Array:
    """[0, 2, 4, ..., 2n-2] as int64 (a slice of a cached array)."""
    if not _even_cache or len(_even_cache[0]) < n:
        size = max(n, MAX_BATCH_ROWS + 1024)
        _even_cache[:] = [pa.array(np.arange(0, 2 * size, 2, dtype=np.int64))]
    return _even_cache[0].slice(0, n)


def varints(u: NDArray, pos: NDArray, max_bytes: int) -> tuple[NDArray, NDArray]:
    """Zigzag varints starting at u[pos], all at once: (int64 values, positions after them)."""
    if pos.size == 0:
        return np.zeros(0, np.int64), pos
    if int(pos.max()) >= u.size or int(pos.min()) < 0:
        raise CorruptRecordError("a record field runs past the end of its batch")
    # varints of up to 9 bytes (63 bits) are decoded in int64, which numpy does faster than
    # uint64 (no casts in the shifts); only varlongs (10 bytes) need the unsigned path
    wide = 7 * max_bytes > 63
    b = u.take(pos)
    val = b.astype(np.uint64 if wide else np.int64)
    nxt = pos + 1
    active = np.flatnonzero(b >= 0x80)
    if active.size == 0:  # all one byte (small lengths, deltas): no 7-bit masking needed
        return (val >> 1) ^ -(val & 1) if not wide else _unzigzag(val), nxt
    val &= 0x7F
    shift = 7
    while active.size:
        if shift >= 7 * max_bytes:
            raise CorruptRecordError(f"varint longer than {max_bytes} bytes in a record")
        q = nxt[active]
        if int(q.max()) >= u.size:
            raise CorruptRecordError("truncated varint at the end of a batch")
        bk = u.take(q)
        if wide:
            val[active] |= (bk & np.uint64(0x7F)).astype(np.uint64) << np.uint64(shift)
        else:
            val[active] |= (bk & 0x7F).astype(np.int64) << shift
        nxt[active] = q + 1
        active = active[bk >= 0x80]
        shift += 7
    return (_unzigzag(val) if wide else (val >> 1) ^ -(val & 1)), nxt


def _unzigzag(val: NDArray) -> NDArray:
    """Signed values of unsigned 64-bit zigzag codes."""
    return (val >> np.uint64(1)).view(np.int64) ^ -((val & np.uint64(1)).view(np.int64))


def _hop(data: Buffer, count: int, shift: int) -> NDArray:
    """Start positions (+ shift) of `count` records filling `data`, by hopping length varints."""
    out = array("q")
    app = out.append
    n = len(data)
    p = 0
    try:
        for _ in range(count):
            app(p + shift)
            b = data[p]
            if b < 0x80:
                p += 1 + ((b >> 1) ^ -(b & 1))
            else:
                c = data[p + 1]
                if c < 0x80:
                    z = (b & 0x7F) | (c << 7)
                    p += 2 + ((z >> 1) ^ -(z & 1))
                else:
                    length, q = decode_varint(data, p, n, MAX_VARINT_BYTES)
                    p = q + length
    except IndexError:
        raise CorruptRecordError("a record runs past the end of its batch") from None
    if p != n:
        raise CorruptRecordError(f"the {count} records of a batch end at byte {p}, the batch holds {n}")
    return np.frombuffer(out, dtype=np.int64) if count else np.zeros(0, np.int64)


def _zigzag_size(x: NDArray) -> NDArray:
    """Bytes of the zigzag varint of each non-negative x."""
    z = 2 * x
    return 1 + (z >= 1 << 7).astype(np.int64) + (z >= 1 << 14) + (z >= 1 << 21) + (z >= 1 << 28)


def _delta_sizes(count: int) -> NDArray:
    """Bytes of the offset-delta varints 0..count-1; producers use few distinct batch sizes, so
    the arrays of all but huge batches are computed once."""
    if count > DELTA_SIZES_MAX_COUNT:
        return _zigzag_size(np.arange(count, dtype=np.int64))
    return _cached_delta_sizes(count)


@functools.lru_cache(maxsize=DELTA_SIZES_CACHED)
def _cached_delta_sizes(count: int) -> NDArray:
    sizes = _zigzag_size(np.arange(count, dtype=np.int64))
    sizes.flags.writeable = False  # shared by every batch of `count` records
    return sizes


def _uniform(data: Buffer, count: int, shift: int) -> tuple[NDArray, NDArray, NDArray] | None:
    """Record starts when the records differ only by the size of their offset delta (the usual
    case: same-size keys, values, headers and timestamps), verified; else None. With the starts
    (+ shift) come the record lengths and the positions (+ shift) after the length varints,
    decoded by the verification, so that `build` need not decode them again."""
    n = len(data)
    if count < UNIFORM_MIN_RECORDS or n < count * 7:
        return None
    u = np.frombuffer(data, np.uint8)
    first_len, _ = varints(u, np.zeros(1, np.int64), MAX_VARINT_BYTES)
    body = int(first_len[0]) + _delta_sizes(count) - 1
    sizes = _zigzag_size(body) + body
    ends = np.cumsum(sizes)
    if int(ends[-1]) != n:
        return None
    starts = ends - sizes
    length, after = varints(u, starts, MAX_VARINT_BYTES)
    if not bool(np.array_equal(after + length, ends)):
        return None
    return starts + shift, length, after + shift


def _binary_column(u_buf: pa.Buffer, starts: NDArray, lengths: NDArray) -> pa.Array:
    """Elements [starts[i], starts[i] + lengths[i]) of the buffer (null where lengths < 0)."""
    n = starts.size
    valid = lengths >= 0
    nulls = n - int(np.count_nonzero(valid))
    if nulls == n:
        return pa.nulls(n, pa.binary())
    spans = np.empty(2 * n, np.int32)
    spans[0::2] = starts
    spans[1::2] = starts + np.where(valid, lengths, 0)
    inter = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(spans), u_buf])
    # the system allocator: pyarrow's default (mimalloc) page-faults afresh on every big output
    col = pc.take(inter, _even_indices(n), memory_pool=pa.system_memory_pool())
    if nulls:
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        col = pa.Array.from_buffers(pa.binary(), n, [bitmap, col.buffers()[1], col.buffers()[2]], nulls)
    return col


def _numeric(values: NDArray, typ: pa.DataType, dtype: Any) -> pa.Array:
    arr = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(typ, arr.size, [None, pa.py_buffer(arr)])


def _decode_headers(data: bytes, p: int, end: int) -> list[tuple[str, bytes | None]] | None:
    hcount, p = decode_varint(data, p, end, MAX_VARINT_BYTES)
    if hcount == 0:
        return None
    if hcount < 0 or hcount > (end - p) // 2:
        raise CorruptRecordError(f"header count {hcount} is impossible")
    out: list[tuple[str, bytes | None]] = []
    for _ in range(hcount):
        klen, p = decode_varint(data, p, end, MAX_VARINT_BYTES)
        if klen < 0 or p + klen > end:
            raise CorruptRecordError(f"header key length {klen} is invalid")
        try:
            hkey = data[p : p + klen].decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptRecordError("a header key is not UTF-8") from None
        p += klen
        vlen, p = decode_varint(data, p, end, MAX_VARINT_BYTES)
        if vlen < 0:
            out.append((hkey, None))
        else:
            if p + vlen > end:
                raise CorruptRecordError(f"header value length {vlen} overruns its record")
            out.append((hkey, data[p : p + vlen]))
            p += vlen
    if p != end:
        raise CorruptRecordError(f"a record has {end - p} stray bytes after its headers")
    return out


# ---- one output batch --------------------------------------------------------------------------


class _Pending:
    """Decompressed record sections of consecutive Kafka batches, decoded together.

    An uncompressed section is a view into the chunk read from the store: `build` copies all
    sections once into one buffer (copying each batch body out first, then joining, was two)."""

    def __init__(self) -> None:
        self.sections: list[Buffer] = []
        self.size = 0
        self.rows = 0
        self.starts: list[NDArray] = []
        self.lengths: list[NDArray] = []
        self.afters: list[NDArray] = []
        self.counts: list[int] = []
        self.bases: list[int] = []
        self.first_ts: list[int] = []
        self.max_ts: list[int] = []
        self.types: list[int] = []

    def add(self, data: Buffer, count: int, base: int, first_ts: int, max_ts: int, ts_type: int) -> None:
        located = _uniform(data, count, self.size)
        if located is None:
            starts = _hop(data, count, self.size)
            length, after = varints(np.frombuffer(data, np.uint8), starts - self.size, MAX_VARINT_BYTES)
            after += self.size
        else:
            starts, length, after = located
        self.sections.append(data)
        self.starts.append(starts)
        self.lengths.append(length)
        self.afters.append(after)
        self.size += len(data)
        self.rows += count
        self.counts.append(count)
        self.bases.append(base)
        self.first_ts.append(first_ts)
        self.max_ts.append(max_ts)
        self.types.append(ts_type)

    def build(
        self, schema: pa.Schema, topic: str, partition: int, lo: int, hi: int, headers: bool
    ) -> pa.RecordBatch | None:
        data = b"".join(self.sections)  # bytes (one copy of views; a lone bytes object is kept)
        u = np.frombuffer(data, np.uint8)
        many = len(self.starts) > 1
        starts = np.concatenate(self.starts) if many else self.starts[0]
        length = np.concatenate(self.lengths) if many else self.lengths[0]
        p = np.concatenate(self.afters) if many else self.afters[0]
        n = starts.size
        ends = p + length
        expected = np.empty(n, np.int64)
        expected[:-1] = starts[1:]
        expected[-1] = u.size
        if bool(np.any(length < 6)) or not bool(np.array_equal(ends, expected)):
            raise CorruptRecordError(f"{topic}-{partition}: records do not fill their batches exactly")
        ts_delta, p = varints(u, p + 1, 10)  # + 1: the attributes byte
        off_delta, p = varints(u, p, MAX_VARINT_BYTES)
        klen, p = varints(u, p, MAX_VARINT_BYTES)
        kstart = p
        vlen, p = varints(u, p + np.maximum(klen, 0), MAX_VARINT_BYTES)
        vstart = p
        p = p + np.maximum(vlen, 0)
        if bool(np.any(p >= ends)):
            raise CorruptRecordError(f"{topic}-{partition}: a record's key or value overruns it")
        no_headers = u[p] == 0
        if not bool(np.all(~no_headers | (p + 1 == ends))):
            raise CorruptRecordError(f"{topic}-{partition}: a record has stray bytes after its fields")
        counts = np.asarray(self.counts, np.int64)
        offsets = np.repeat(np.asarray(self.bases, np.int64), counts) + off_delta
        types = np.repeat(np.asarray(self.types, np.int32), counts)
        ts = np.repeat(np.asarray(self.first_ts, np.int64), counts) + ts_delta
        if any(self.types):
            ts = np.where(types == 1, np.repeat(np.asarray(self.max_ts, np.int64), counts), ts)
        keep = (offsets >= lo) & (offsets < hi)
        if not bool(keep.all()):
            offsets, types, ts = offsets[keep], types[keep], ts[keep]
            kstart, klen, vstart, vlen = kstart[keep], klen[keep], vstart[keep], vlen[keep]
            p, ends, no_headers = p[keep], ends[keep], no_headers[keep]
        rows = offsets.size
        if rows == 0:
            return None
        buf = pa.py_buffer(data)
        cols = [
            _binary_column(buf, kstart, klen),
            _binary_column(buf, vstart, vlen),
            pa.repeat(pa.scalar(topic, pa.string()), rows),
            pa.repeat(pa.scalar(partition, pa.int32()), rows),
            _numeric(offsets, pa.int64(), np.int64),
            _numeric(ts * 1000, TIMESTAMP_TYPE, np.int64),
            _numeric(types, pa.int32(), np.int32),
        ]
        if headers:
            hs: list[Any] = [None] * rows
            for i in np.flatnonzero(~no_headers).tolist():
                hs[i] = _decode_headers(data, int(p[i]), int(ends[i]))
            cols.append(pa.array(hs, HEADER_TYPE))
        return pa.RecordBatch.from_arrays(cols, schema=schema)


def read_slice(sl: Slice, include_headers: bool) -> Iterator[pa.RecordBatch]:
    """Records with offsets [sl.start, sl.end) of one segment (or, cluster mode, one flush
    range), as RecordBatches."""
    if sl.start >= sl.end:
        return
    store = cached_store(sl.store_url)
    if isinstance(sl, FlushSlice):
        from loglake.spark.cluster_plan import flush_bytes

        flush_aborted = None if sl.aborted is None else AbortedTxns(sl.aborted)
        yield from _decode_chunks(sl, [(flush_bytes(store, sl), sl.pos, sl.batches)], flush_aborted, include_headers)
        return
    trailer, index = read_tail(store, sl.key, sl.size)
    aborted = None if sl.aborted is None else AbortedTxns([*sl.aborted, *trailer.aborted_txns])
    first = index.find_offset(sl.start)
    last = index.find_offset(sl.end - 1)
    if first is None:
        return
    if last is None:
        last = len(index) - 1

    def chunks() -> Iterator[tuple[bytes, int, int]]:
        i = first
        while i <= last:
            pos, length, n = index.byte_range(i, CHUNK_BYTES)
            if i + n - 1 > last:
                n = last - i + 1
                length = index.entry(last).end - pos
            buf = store.get_range(sl.key, pos, length)
            if len(buf) != length:
                raise CorruptRecordError(f"{sl.key}: short read at byte {pos} ({len(buf)} of {length})")
            yield buf, pos, n
            i += n

    yield from _decode_chunks(sl, chunks(), aborted, include_headers)


def _decode_chunks(
    sl: Slice,
    chunks: Iterable[tuple[bytes, int, int]],
    aborted: AbortedTxns | None,
    include_headers: bool,
) -> Iterator[pa.RecordBatch]:
    """The records in [sl.start, sl.end) of `chunks`: (bytes, their position in the object,
    the number of whole batches in them), each batch CRC-checked."""
    schema = arrow_schema(include_headers)
    pending = _Pending()
    for buf, pos, n in chunks:
        length = len(buf)
        view = memoryview(buf)
        at = 0
        for _ in range(n):
            (base, blen, _e, magic, crc, attrs, _lod, first_ts, max_ts, pid, _pe, _seq, count) = (
                KAFKA_HEADER.unpack_from(buf, at)
            )
            size = blen + LENGTH_FIELD_END
            if magic != MAGIC_V2 or at + size > length:
                raise CorruptRecordError(f"{sl.key}: bad batch at byte {pos + at}")
            if crc32c.crc32c(view[at + KAFKA_CRC_START : at + size]) != crc:
                raise CorruptRecordError(
                    f"{sl.key}: CRC-32C mismatch in the batch at byte {pos + at} (offset {base})"
                )
            skip = aborted is not None and attrs & ATTR_TRANSACTIONAL and aborted.covers(pid, base)
            if not attrs & ATTR_CONTROL and count > 0 and not skip:
                codec = attrs & ATTR_COMPRESSION_MASK
                body = view[at + KAFKA_HEADER_SIZE : at + size]
                data = decompress(codec, body, MAX_DECOMPRESSED_BATCH_BYTES) if codec else body
                try:
                    pending.add(data, count, base, first_ts, max_ts, 1 if attrs & ATTR_TIMESTAMP_TYPE else 0)
                except CorruptRecordError as exc:
                    raise CorruptRecordError(
                        f"{sl.key}: batch at byte {pos + at} (offset {base}): {exc}"
                    ) from None
                if pending.rows >= MAX_BATCH_ROWS or pending.size >= MAX_BATCH_DATA:
                    batch = pending.build(schema, sl.topic, sl.partition, sl.start, sl.end, include_headers)
                    if batch is not None:
                        yield batch
                    pending = _Pending()
            at += size
    if pending.rows:
        batch = pending.build(schema, sl.topic, sl.partition, sl.start, sl.end, include_headers)
        if batch is not None:
            yield batch
