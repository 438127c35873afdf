"""The compiled record backend: aiokafka's Cython record codec behind loglake's own batch API.

Building and decoding Kafka v2 records one by one in Python costs about 1-3 µs a record (the
varint encoder and the record loop of :mod:`loglake.records.batch`); aiokafka's compiled
``DefaultRecordBatchBuilder`` and ``DefaultRecordBatch`` do the per-record part in C. Only that
part is delegated. Everything around it stays loglake's: header layout, attributes
(transactional, control, timestamp type), partition leader epoch, base offset, the CRC and every
compression codec (aiokafka would need its own codec packages, and loglake's snappy framing and
decompression bounds are its own), and the header checks, CRC check and decompression of
:func:`loglake.records.decode.decode_batch`. So a batch built here is byte for byte the batch the
reference builder makes (tests/test_records_native.py checks it with hypothesis).

Decoding: when aiokafka's reader refuses a records section (any exception) the reference decoder
runs on the same bytes, so a malformed batch fails with the same :class:`CorruptRecordError` and
message on both backends. aiokafka reads varints without looking at the buffer's end first, so it
is handed a view whose memory continues into ``_PAD`` zero bytes: an overrun reads zeros, never
memory that is not ours.

Choosing: ``LOGLAKE_RECORDS=auto`` (the default; native when the compiled module imports),
``native`` (fail at import if it does not) or ``python``; :func:`use_backend` switches at run time
(the tests run both). Only ``aiokafka.record._crecords`` is imported, never aiokafka's pure-Python
fallback classes, so "native" always means compiled code.
"""

from __future__ import annotations

import functools
import importlib.machinery
import operator
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from loglake.errors import ConfigError, InvalidRecordError
from loglake.records import decode as _decode
from loglake.records.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_TIMESTAMP_TYPE,
    BATCH_HEADER_SIZE,
    HEADER,
    MAX_RECORDS_PER_BATCH,
    NO_TIMESTAMP,
    BatchBuilder,
    BatchHeader,
    Record,
)
from loglake.records.decode import RecordColumns, decode_columns_py, decode_records_py

try:
    from aiokafka.record._crecords import default_records as _crecords
except ImportError:  # aiokafka missing, or installed without its compiled extensions
    _crecords = None

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "NativeBatchBuilder",
    "active_backend",
    "decode_columns_native",
    "decode_records_native",
    "native_available",
    "use_backend",
]

#: Environment variable choosing the backend at import: auto, native or python.
ENV_VAR = "LOGLAKE_RECORDS"
BACKENDS = ("auto", "native", "python")

#: aiokafka's builder stops taking records past this many bytes (its batch_size); a v2 batch's
#: length field is an int32, so no valid batch is bigger.
NATIVE_BATCH_BYTES_MAX = (1 << 31) - 1
#: Zero bytes after the records section handed to aiokafka's reader: its varint reads may run
#: this far past the end before its bounds checks stop them (at most two bytes; 16 is margin).
_PAD = bytes(16)

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_TIMESTAMP = struct.Struct(">q")
_MAX_TIMESTAMP_OFFSET = 35

_offset_of = operator.itemgetter(0)
_timestamp_of = operator.itemgetter(1)
_record_fields = operator.attrgetter("offset", "timestamp", "key", "value", "headers")
_offset_attr = operator.attrgetter("offset")
_timestamp_attr = operator.attrgetter("timestamp")
_key_attr = operator.attrgetter("key")
_value_attr = operator.attrgetter("value")
_headers_attr = operator.attrgetter("headers")
_new_record = functools.partial(tuple.__new__, Record)
_active = "python"


def native_available() -> bool:
    """True when aiokafka's compiled record module imported (a shared object, not Python)."""
    if _crecords is None:
        return False
    origin = getattr(_crecords, "__file__", "") or ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


class NativeBatchBuilder(BatchBuilder):
    """:class:`BatchBuilder` whose records are encoded by aiokafka's compiled builder.

    The records section comes from aiokafka; loglake's :meth:`BatchBuilder._finish` writes the
    header, compresses and computes the CRC, so the attributes and codecs are loglake's own.
    aiokafka takes a first timestamp of -1 (Kafka's "no timestamp") as "no record yet" and would
    encode the next records' deltas wrongly, so a batch starting so is built by the reference.
    """

    __slots__ = ("_native",)

    def __init__(self, **builder_kwargs: Any) -> None:
        super().__init__(**builder_kwargs)
        assert _crecords is not None
        self._native: Any = _crecords.DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, NATIVE_BATCH_BYTES_MAX)

    def estimated_size(self) -> int:
        if self._native is None:
            return super().estimated_size()
        return int(self._native.size())

    def append(
        self,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> int:
        """Add a record; return its offset delta (the reference's checks, aiokafka's encoding)."""
        native = self._native
        if native is None:
            return super().append(timestamp, key, value, headers)
        delta = self._count
        if type(timestamp) is not int:
            raise TypeError(f"timestamp must be int, not {type(timestamp).__name__}")
        if not _INT64_MIN <= timestamp <= _INT64_MAX:
            raise InvalidRecordError(f"timestamp {timestamp} is out of the int64 range")
        if delta == 0:
            if timestamp == NO_TIMESTAMP:
                self._native = None
                return super().append(timestamp, key, value, headers)
            self._first_timestamp = timestamp
        elif not _INT64_MIN <= timestamp - self._first_timestamp <= _INT64_MAX:
            raise InvalidRecordError(f"timestamp {timestamp} too far from the batch's first timestamp")
        elif delta >= MAX_RECORDS_PER_BATCH:
            raise InvalidRecordError(f"a batch holds at most {MAX_RECORDS_PER_BATCH} records")
        try:
            done = native.append(
                delta, timestamp, key, value, headers if type(headers) is list else list(headers)
            )
        except TypeError:
            # aiokafka takes headers only as (str, bytes) tuples; the reference takes any pair and
            # any buffer. Normalise and retry (aiokafka checks every type before writing a byte);
            # what still fails (a key that is not bytes-like, a header key that is not str) is the
            # caller's TypeError, as from the reference.
            norm = [(k, None if v is None else bytes(v)) for k, v in headers]
            done = native.append(delta, timestamp, key, value, norm)
        if done is None:
            raise InvalidRecordError(f"batch larger than {NATIVE_BATCH_BYTES_MAX} bytes")
        self._count = delta + 1
        return delta

    def append_all(
        self,
        records: Iterable[tuple[int | None, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
        now: int,
    ) -> None:
        """`append` for each record, without its per-record method call and checks where a record
        is what producers send (an int timestamp near the first, headers a list or empty): the
        embedded produce path's loop (issue 12). Anything else goes through `append`, so the
        records built and the errors raised are the same."""
        if self._native is None:
            return super().append_all(records, now)
        it = iter(records)
        if self._count == 0:
            for ts, key, value, headers in it:  # the first record sets the batch's base timestamp
                self.append(now if ts is None else ts, key, value, headers)
                break
            if self._native is None:  # it had no timestamp: the reference builds this batch
                return super().append_all(it, now)
            if self._count == 0:
                return None
        native_append = self._native.append
        # in int64 itself and within an int64 delta of the first record's
        lo = max(_INT64_MIN, self._first_timestamp + _INT64_MIN)
        hi = min(_INT64_MAX, self._first_timestamp + _INT64_MAX)
        no_headers: list[tuple[str, bytes | None]] = []  # read only by aiokafka
        delta = self._count
        try:
            for ts, key, value, headers in it:
                if ts is None:
                    ts = now
                if type(ts) is not int or not lo <= ts <= hi or delta >= MAX_RECORDS_PER_BATCH:
                    self._count = delta
                    self.append(ts, key, value, headers)  # raises what the reference raises
                    delta = self._count
                    continue
                hs = headers if type(headers) is list else (list(headers) if headers else no_headers)
                try:
                    done = native_append(delta, ts, key, value, hs)
                except TypeError:  # nothing written: `append` normalises, or raises the caller's error
                    self._count = delta
                    self.append(ts, key, value, headers)
                    delta = self._count
                    continue
                if done is None:
                    raise InvalidRecordError(f"batch larger than {NATIVE_BATCH_BYTES_MAX} bytes")
                delta += 1
        finally:
            self._count = delta
        return None

    def append_pairs(
        self,
        records: Iterable[tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
        now: int,
    ) -> None:
        """`append_pairs` without a method call or a timestamp check per record: one timestamp
        for all. Records that are not 2- or 3-tuples, headers aiokafka refuses and a full batch
        go through `append`, so the records built and the errors raised are the reference's."""
        if self._native is None:
            return super().append_pairs(records, now)
        it: Iterator[Any] = iter(records)  # any shape: the loop checks each
        if self._count == 0:
            for rec in it:  # the first record sets the batch's base timestamp
                self.append(now, rec[0], rec[1], rec[2] if len(rec) > 2 else ())
                break
            if self._native is None:  # `now` is -1, "no timestamp": the reference builds this batch
                return super().append_pairs(it, now)
            if self._count == 0:
                return None
        first = self._first_timestamp
        if type(now) is not int or not max(_INT64_MIN, first + _INT64_MIN) <= now <= min(_INT64_MAX, first + _INT64_MAX):
            for rec in it:  # `append` raises what the reference raises
                self.append(now, rec[0], rec[1], rec[2] if len(rec) > 2 else ())
            return None
        native_append = self._native.append
        no_headers: list[tuple[str, bytes | None]] = []  # read only by aiokafka
        delta = self._count
        try:
            for rec in it:
                n = len(rec) if type(rec) is tuple else 0
                if n >= 2 and delta < MAX_RECORDS_PER_BATCH:
                    if n == 2:
                        key, value = rec
                        hs = no_headers
                    else:
                        key, value, headers = rec[0], rec[1], rec[2]
                        hs = headers if type(headers) is list else (list(headers) if headers else no_headers)
                    try:
                        done = native_append(delta, now, key, value, hs)
                    except TypeError:  # nothing written: `append` below normalises, or raises the caller's error
                        done = False
                    if done is None:
                        raise InvalidRecordError(f"batch larger than {NATIVE_BATCH_BYTES_MAX} bytes")
                    if done is not False:
                        delta += 1
                        continue
                self._count = delta
                self.append(now, rec[0], rec[1], rec[2] if len(rec) > 2 else ())  # normalises or raises
                delta = self._count
        finally:
            self._count = delta
        return None

    def build(self) -> bytes:
        if self._native is None:
            return super().build()
        if self._count == 0:
            raise InvalidRecordError("cannot build a batch without records")
        built = self._native.build()
        self._max_timestamp = _TIMESTAMP.unpack_from(built, _MAX_TIMESTAMP_OFFSET)[0]
        with memoryview(built) as view:
            return self._finish(view[BATCH_HEADER_SIZE:])


def _native_reader(data: bytes, h: BatchHeader) -> Any:
    """aiokafka's reader over ``data`` (an uncompressed records section) behind ``h``, its memory
    padded with ``_PAD`` (see the module docstring)."""
    assert _crecords is not None
    plain = h._replace(attributes=h.attributes & ~ATTR_COMPRESSION_MASK)
    padded = b"".join((HEADER.pack(*plain), data, _PAD))
    return _crecords.DefaultRecordBatch(memoryview(padded)[: len(padded) - len(_PAD)])


def decode_records_native(data: bytes, h: BatchHeader, where: str) -> list[Record]:
    """:func:`loglake.records.decode.decode_records_py` in compiled code; on any refusal the
    reference decodes (and raises) instead, so errors are the same on both backends."""
    try:
        # map over C callables: no Python frame per record
        out: list[Record] = list(map(_new_record, map(_record_fields, _native_reader(data, h))))
    except Exception:
        return decode_records_py(data, h, where)
    if None in map(_timestamp_of, out):
        # aiokafka reports a timestamp of -1 as None; loglake's records keep -1
        out = [r if r.timestamp is not None else r._replace(timestamp=NO_TIMESTAMP) for r in out]
    if not _as_produced(list(map(_offset_of, out)), list(map(_timestamp_of, out)), h):
        return decode_records_py(data, h, where)
    return out


def decode_columns_native(data: bytes, h: BatchHeader, where: str) -> RecordColumns:
    """:func:`loglake.records.decode.decode_columns_py` in compiled code: the columns are read
    straight off aiokafka's records, one C-level pass per field, with no loglake ``Record`` in
    between (the embedded API's consume builds its ConsumerRecords from them). The same trust
    check and the same fallback to the reference as :func:`decode_records_native`."""
    try:
        recs = list(_native_reader(data, h))
        offsets = list(map(_offset_attr, recs))
        timestamps = list(map(_timestamp_attr, recs))
    except Exception:
        return decode_columns_py(data, h, where)
    if None in timestamps:  # aiokafka reports a timestamp of -1 as None; loglake keeps -1
        timestamps = [NO_TIMESTAMP if t is None else t for t in timestamps]
    if not _as_produced(offsets, timestamps, h):
        return decode_columns_py(data, h, where)
    return RecordColumns(
        offsets,
        timestamps,
        list(map(_key_attr, recs)),
        list(map(_value_attr, recs)),
        list(map(_headers_attr, recs)),
    )


def _as_produced(offsets: list[int], timestamps: list[int], h: BatchHeader) -> bool:
    """Whether the records read are what a producer writes: offsets base .. base + last delta one
    by one, and (CreateTime) the largest timestamp the header's. Anything else goes to the
    reference. Why: aiokafka reads a record's attributes byte as a varint, so one with its high
    bit set (the field is unused; Kafka reads one byte and ignores it) shifts every later field
    of that record, and the shifted read can still add up to the record's length. A shift cannot
    also keep the offset sequence and the maximum timestamp right except by coincidence. C-level
    comparisons only; compacted batches (offset gaps) are decoded by the reference."""
    n = len(offsets)
    base = h.base_offset
    if n != h.last_offset_delta + 1 or offsets != list(range(base, base + n)):
        return False
    if h.attributes & ATTR_TIMESTAMP_TYPE:
        return True
    return max(timestamps, default=h.max_timestamp) == h.max_timestamp


def active_backend() -> str:
    """The backend in use: "native" or "python"."""
    return _active


def use_backend(name: str) -> str:
    """Select the record backend: "native", "python" or "auto" (native if available). Returns the
    one now in use. "native" without the compiled module is a ConfigError."""
    global _active
    if name not in BACKENDS:
        raise ConfigError(f"{ENV_VAR}={name!r}: expected one of {', '.join(BACKENDS)}")
    if name == "native" and not native_available():
        raise ConfigError(
            f"{ENV_VAR}=native but aiokafka's compiled record module is not importable "
            "(pip install aiokafka with its binary wheel)"
        )
    if name == "python" or (name == "auto" and not native_available()):
        _decode.set_backend(BatchBuilder, decode_records_py, decode_columns_py)
        _active = "python"
    else:
        _decode.set_backend(NativeBatchBuilder, decode_records_native, decode_columns_native)
        _active = "native"
    return _active


use_backend(os.environ.get(ENV_VAR, "auto").strip().lower() or "auto")
