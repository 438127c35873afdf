"""RecordBatch v2 codec: layout, patching, builder/reader, interop with kafka-python, varints
(bad input: test_records_corrupt.py; shared helpers: recordkit.py)."""

from __future__ import annotations

import contextlib
import random
import struct
from collections.abc import Iterator, Sequence
from typing import Any
from unittest import mock

import cramjam
import kafka.codec
import kafka.record.default_records as kdr
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder
from kafka.record.util import decode_varint as kp_decode_varint
from kafka.record.util import encode_varint as kp_encode_varint

from loglake.errors import ConfigError, CorruptRecordError, InvalidRecordError, RecordTooLargeError
from loglake.records import (
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    BATCH_HEADER_SIZE,
    CRC_COVERED_START,
    HEADER,
    LENGTH_FIELD_END,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    BatchBuilder,
    Record,
    build_batch,
    decode_batches,
    iter_records,
    peek_header,
    set_base_offset,
    set_log_append_time,
    split_batches,
    validate_batch,
)
from loglake.records import batch as batch_mod
from loglake.records.varint import (
    MAX_VARINT_BYTES,
    decode_unsigned_varint,
    decode_varint,
    encode_unsigned_varint,
    encode_varint,
    encode_varint_fast,
    size_of_varint,
)
from recordkit import CODECS, RecordTuple, recrc, sample_records, small_batch

# --------------------------------------------------------------------------- helpers


class _SnappyShim:
    """Stands in for python-snappy inside kafka-python (not installed here); raw blocks via cramjam.

    kafka-python's own xerial framing code then runs unchanged on top of it.
    """

    @staticmethod
    def compress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(data))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(bytes(data)))


def _kp_lz4_encode(data: Any) -> bytes:
    # what kafka-python does with python-lz4: a frame with independent blocks
    c = cramjam.lz4.Compressor(block_linked=False)
    c.compress(bytes(data))
    return bytes(c.finish())


@contextlib.contextmanager
def kafka_python_codecs() -> Iterator[None]:
    """Give kafka-python snappy/lz4/zstd support (its optional codec packages are not installed)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(kafka.codec, "snappy", _SnappyShim))
        stack.enter_context(mock.patch.object(kafka.codec, "has_lz4", lambda: True))
        stack.enter_context(mock.patch.object(kafka.codec, "has_zstd", lambda: True))
        stack.enter_context(mock.patch.object(kdr, "lz4_encode", _kp_lz4_encode))
        stack.enter_context(
            mock.patch.object(kdr, "lz4_decode", lambda d: bytes(cramjam.lz4.decompress(bytes(d))))
        )
        stack.enter_context(
            mock.patch.object(kdr, "zstd_encode", lambda d: bytes(cramjam.zstd.compress(bytes(d))))
        )
        stack.enter_context(
            mock.patch.object(kdr, "zstd_decode", lambda d: bytes(cramjam.zstd.decompress(bytes(d))))
        )
        yield


def kp_build(records: Sequence[RecordTuple], codec: int = 0, *, transactional: bool = False) -> bytearray:
    pid, epoch, seq = (4242, 3, 17) if transactional else (-1, -1, -1)
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 20,
    )
    for i, (ts, key, value, headers) in enumerate(records):
        assert builder.append(i, ts, key, value, list(headers)) is not None
    out: bytearray = builder.build()
    return out


def kp_read(buf: bytes | bytearray) -> list[tuple[int, int, bytes | None, bytes | None, list[Any]]]:
    batch = DefaultRecordBatch(bytes(buf))
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]


def expected(records: Sequence[RecordTuple], base_offset: int = 0) -> list[Record]:
    return [Record(base_offset + i, ts, k, v, list(h)) for i, (ts, k, v, h) in enumerate(records)]


def set_attr_bits(buf: bytearray, bits: int) -> None:
    attrs = struct.unpack_from(">h", buf, 21)[0]
    struct.pack_into(">h", buf, 21, attrs | bits)
    recrc(buf)


# --------------------------------------------------------------------------- layout


def test_header_layout_constants() -> None:
    assert HEADER.format == ">qiiBIhiqqqhii"
    assert HEADER.size == BATCH_HEADER_SIZE == 61
    assert LENGTH_FIELD_END == 12
    assert CRC_COVERED_START == 21
    assert batch_mod.CRC_OFFSET == 17
    assert batch_mod.MAGIC_OFFSET == 16
    assert batch_mod.MAX_TIMESTAMP_OFFSET == 35
    assert batch_mod.FIRST_TIMESTAMP_OFFSET == 27
    assert batch_mod.RECORD_COUNT_OFFSET == 57
    assert batch_mod.MIN_BATCH_LENGTH == 49
    # the same offsets kafka-python uses
    assert kdr.DefaultRecordBase.ATTRIBUTES_OFFSET == CRC_COVERED_START
    assert kdr.DefaultRecordBase.CRC_OFFSET == batch_mod.CRC_OFFSET
    assert kdr.DefaultRecordBase.AFTER_LEN_OFFSET == LENGTH_FIELD_END


def test_header_properties() -> None:
    b = build_batch(
        sample_records(3),
        base_offset=100,
        producer_id=7,
        producer_epoch=2,
        base_sequence=5,
        is_transactional=True,
        partition_leader_epoch=9,
        compression=1,
    )
    h = validate_batch(b)
    assert h.size == len(b)
    assert h.base_offset == 100
    assert h.last_offset == 102
    assert h.last_offset_delta == 2
    assert h.record_count == 3
    assert h.compression == 1
    assert h.timestamp_type == TIMESTAMP_CREATE_TIME
    assert h.is_transactional and not h.is_control
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.partition_leader_epoch) == (7, 2, 5, 9)
    assert h.magic == 2
    assert h.first_timestamp == sample_records(3)[0][0]
    assert h.max_timestamp == max(r[0] for r in sample_records(3))
    c = build_batch(sample_records(1), is_control=True, timestamp_type=TIMESTAMP_LOG_APPEND_TIME)
    hc = peek_header(c)
    assert hc.is_control and not hc.is_transactional
    assert hc.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    assert hc.attributes == ATTR_CONTROL | ATTR_TIMESTAMP_TYPE


# --------------------------------------------------------------------------- interop with kafka-python


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_read_exactly(codec: int) -> None:
    recs = sample_records()
    with kafka_python_codecs():
        buf = kp_build(recs, codec)
    h = validate_batch(buf)
    assert h.compression == codec  # kafka-python really compressed it
    assert list(iter_records(buf)) == expected(recs)
    assert list(iter_records(memoryview(buf))) == expected(recs)
    assert list(iter_records(bytes(buf))) == expected(recs)


@pytest.mark.parametrize("codec", CODECS)
def test_our_batches_read_exactly_by_kafka_python(codec: int) -> None:
    recs = sample_records()
    ours = build_batch(recs, compression=codec)
    with kafka_python_codecs():
        got = kp_read(ours)
    assert got == [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in expected(recs)]
    kb = DefaultRecordBatch(ours)
    assert kb.compression_type == codec
    assert kb.records_count == len(recs)
    assert kb.last_offset_delta == len(recs) - 1


@pytest.mark.parametrize("codec", [0, 1, 4])
def test_transactional_batches_both_ways(codec: int) -> None:
    recs = sample_records(4)
    with kafka_python_codecs():
        kp = kp_build(recs, codec, transactional=True)
        h = validate_batch(kp)
        assert h.is_transactional and (h.producer_id, h.producer_epoch, h.base_sequence) == (4242, 3, 17)
        assert list(iter_records(kp)) == expected(recs)
        ours = build_batch(
            recs,
            compression=codec,
            is_transactional=True,
            producer_id=4242,
            producer_epoch=3,
            base_sequence=17,
        )
        kb = DefaultRecordBatch(ours)
        assert kb.validate_crc()
        assert kb.is_transactional and kb.producer_id == 4242 and kb.producer_epoch == 3
        assert kb.base_sequence == 17
        assert kp_read(ours) == [tuple(r) for r in expected(recs)]


def test_control_batches_both_ways() -> None:
    # a commit marker: key = version(int16) + type(int16 1 = commit), value = version + coordinator epoch
    marker: list[RecordTuple] = [(1_700_000_000_000, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05", [])]
    kp = kp_build(marker, transactional=True)
    set_attr_bits(kp, ATTR_CONTROL)
    h = validate_batch(kp)
    assert h.is_control and h.is_transactional
    assert list(iter_records(kp)) == expected(marker)  # still decoded; callers skip control batches
    ours = build_batch(marker, is_control=True, is_transactional=True, producer_id=1, producer_epoch=0)
    kb = DefaultRecordBatch(ours)
    assert kb.validate_crc() and kb.is_control_batch and kb.is_transactional
    (rec,) = list(kb)
    assert rec.commit and rec.offset == 0 and rec.value == marker[0][2]


@pytest.mark.parametrize("codec", [0, 1, 2])
def test_log_append_time_both_ways(codec: int) -> None:
    recs = sample_records(5)
    with kafka_python_codecs():
        kp = kp_build(recs, codec)
        set_attr_bits(kp, ATTR_TIMESTAMP_TYPE)
        h = validate_batch(kp)
        assert h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
        assert [r.timestamp for r in iter_records(kp)] == [h.max_timestamp] * 5

        ours = bytearray(build_batch(recs, compression=codec, base_offset=10))
        set_log_append_time(ours, 0, 1_800_000_000_123)
        h = validate_batch(ours)
        assert h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
        assert h.max_timestamp == h.first_timestamp == 1_800_000_000_123
        assert h.compression == codec and h.base_offset == 10
        got = list(iter_records(ours))
        assert [r.timestamp for r in got] == [1_800_000_000_123] * 5
        assert [(r.key, r.value, r.headers) for r in got] == [(k, v, list(hs)) for _, k, v, hs in recs]
        assert [r[1] for r in kp_read(ours)] == [1_800_000_000_123] * 5


def test_set_log_append_time_refuses_corrupt_batch() -> None:
    buf = bytearray(build_batch(sample_records(2)))
    buf[-1] ^= 0x01
    before = bytes(buf)
    with pytest.raises(CorruptRecordError, match="CRC"):
        set_log_append_time(buf, 0, 5)
    assert bytes(buf) == before


def test_builder_log_append_time_type() -> None:
    recs = sample_records(3)
    b = build_batch(recs, timestamp_type=TIMESTAMP_LOG_APPEND_TIME)
    mx = max(r[0] for r in recs)
    assert [r.timestamp for r in iter_records(b)] == [mx] * 3
    assert [r[1] for r in kp_read(b)] == [mx] * 3


def test_multiple_batches_read_by_kafka_python_memory_records() -> None:
    a = build_batch(sample_records(3), base_offset=0)
    b = build_batch(sample_records(2), base_offset=3, compression=1)
    mr = MemoryRecords(a + b)
    offsets: list[int] = []
    while mr.has_next():
        batch = mr.next_batch()
        assert batch.validate_crc()
        offsets.extend(r.offset for r in batch)
    assert offsets == [0, 1, 2, 3, 4]


def test_memory_records_builder_output_read_exactly() -> None:
    mrb = MemoryRecordsBuilder(magic=2, compression_type=1, batch_size=1 << 20, offset=0)
    recs = sample_records(8)
    for ts, k, v, hs in recs:
        mrb.append(ts, k, v, list(hs))
    mrb.close()
    buf = bytes(mrb.buffer())
    ((h, got),) = list(decode_batches(buf))
    assert h.record_count == 8
    assert got == expected(recs)


# --------------------------------------------------------------------------- builder


def test_builder_basics() -> None:
    b = BatchBuilder(base_offset=5)
    assert len(b) == 0
    assert b.estimated_size() == BATCH_HEADER_SIZE
    assert b.append(1, b"k", b"v") == 0
    assert b.append(2, None, None, [("h", None)]) == 1
    assert len(b) == 2
    out = b.build()
    assert b.estimated_size() == len(out)  # uncompressed: the estimate is exact
    assert [r.offset for r in iter_records(out)] == [5, 6]
    assert b.build() == out  # build is repeatable


def test_builder_rejects_bad_input() -> None:
    with pytest.raises(InvalidRecordError):
        BatchBuilder().build()
    with pytest.raises(ConfigError):
        BatchBuilder(compression=7)
    with pytest.raises(ConfigError):
        BatchBuilder(timestamp_type=2)
    with pytest.raises(TypeError):
        BatchBuilder().append(1.5, None, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        BatchBuilder().append(1, None, None, [(b"k", b"v")])  # type: ignore[list-item]
    b = BatchBuilder(producer_epoch=1 << 20)  # int16 field
    b.append(1, None, None)
    with pytest.raises(InvalidRecordError):
        b.build()


def test_timestamps_out_of_order_and_negative_deltas() -> None:
    recs: list[RecordTuple] = [
        (1000, None, b"a", []),
        (10, None, b"b", []),
        (5000, None, b"c", []),
        (-1, None, b"d", []),
    ]
    b = build_batch(recs)
    h = peek_header(b)
    assert h.first_timestamp == 1000 and h.max_timestamp == 5000
    assert [r.timestamp for r in iter_records(b)] == [1000, 10, 5000, -1]
    assert [r[1] for r in kp_read(b)] == [1000, 10, 5000, -1]


def test_large_values_and_many_records() -> None:
    recs: list[RecordTuple] = [
        (i, b"k" * (i % 300), bytes([i % 256]) * (i * 37 % 70000), []) for i in range(300)
    ]
    for codec in CODECS:
        b = build_batch(recs, compression=codec)
        assert list(iter_records(b)) == expected(recs)


def test_split_batches() -> None:
    a = small_batch(0)
    b = small_batch(2)
    got = split_batches(a + b + a)
    assert [pos for pos, _ in got] == [0, len(a), len(a) + len(b)]
    assert [h.compression for _, h in got] == [0, 2, 0]
    assert split_batches(memoryview(a + b)) == got[:2]
    with pytest.raises(RecordTooLargeError):
        split_batches(a + b, max_batch_bytes=len(a) - 1)
    assert len(split_batches(a, max_batch_bytes=len(a))) == 1
    bad = bytearray(a + b)
    bad[-1] ^= 1
    with pytest.raises(CorruptRecordError, match=f"batch at byte {len(a)}"):
        split_batches(bad)


def test_set_base_offset_in_place() -> None:
    buf = bytearray(small_batch(1) * 2)
    n = len(buf) // 2
    crc_before = peek_header(buf, n).crc
    set_base_offset(buf, n, 1 << 40)
    set_base_offset(memoryview(buf), 0, 7)
    h = validate_batch(buf, n)
    assert h.base_offset == 1 << 40 and h.crc == crc_before
    assert [r.offset for r in iter_records(buf, n)] == [(1 << 40), (1 << 40) + 1]
    assert [r.offset for r in iter_records(buf)] == [7, 8]
    with pytest.raises(CorruptRecordError):
        set_base_offset(buf, len(buf) - 10, 1)


# --------------------------------------------------------------------------- property round trip

_keys = st.none() | st.binary(max_size=40)
_headers = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=12)), max_size=3)
_records = st.lists(
    st.tuples(st.integers(-1, 1 << 45), _keys, st.none() | st.binary(max_size=300), _headers),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(recs=_records, codec=st.sampled_from(CODECS), base=st.integers(0, 1 << 50), tx=st.booleans())
def test_property_round_trip(recs: list[RecordTuple], codec: int, base: int, tx: bool) -> None:
    b = build_batch(
        recs, compression=codec, base_offset=base, is_transactional=tx, producer_id=1, producer_epoch=0
    )
    h = validate_batch(b)
    assert h.compression == codec and h.record_count == len(recs) and h.size == len(b)
    assert h.is_transactional == tx
    assert list(iter_records(b)) == expected(recs, base)
    with kafka_python_codecs():
        assert kp_read(b) == [tuple(r) for r in expected(recs, base)]
        kp = kp_build(recs, codec)
    assert list(iter_records(kp)) == expected(recs)


# --------------------------------------------------------------------------- varints


def test_varints_match_kafka_python() -> None:
    values = [0, 1, -1, 63, -64, 64, -65, 8191, 8192, (1 << 31) - 1, -(1 << 31), (1 << 63) - 1, -(1 << 63)]
    values += [random.Random(i).randint(-(1 << 63), (1 << 63) - 1) for i in range(200)]
    for v in values:
        kp = bytearray()
        kp_encode_varint(v, kp.append)
        enc = encode_varint(v)
        assert enc == bytes(kp), v
        assert size_of_varint(v) == len(enc)
        assert decode_varint(enc) == (v, len(enc))
        assert kp_decode_varint(enc, 0) == (v, len(enc))
        assert encode_varint_fast(v) == enc
    for u in (0, 1, 127, 128, 300, (1 << 64) - 1):
        e = encode_unsigned_varint(u)
        assert decode_unsigned_varint(e) == (u, len(e))


def test_varint_errors() -> None:
    with pytest.raises(CorruptRecordError, match="truncated varint at byte 0"):
        decode_varint(b"")
    with pytest.raises(CorruptRecordError, match="truncated varint at byte 1"):
        decode_varint(b"\x00\x80\x80", 1)
    with pytest.raises(CorruptRecordError, match="longer than 10"):
        decode_varint(b"\xff" * 11)
    with pytest.raises(CorruptRecordError, match="longer than 5"):
        decode_varint(b"\xff" * 6, 0, None, MAX_VARINT_BYTES)
    with pytest.raises(CorruptRecordError, match="32-bit"):
        decode_varint(encode_varint(1 << 33), 0, None, MAX_VARINT_BYTES)
    with pytest.raises(CorruptRecordError, match="truncated"):
        decode_varint(encode_varint(1 << 20), 0, 2)  # end bound respected
    with pytest.raises(ValueError):
        encode_varint(1 << 63)
    with pytest.raises(ValueError):
        encode_unsigned_varint(-1)
