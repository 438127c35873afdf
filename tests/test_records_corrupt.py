"""RecordBatch v2 codec against bad input: every flipped bit and every prefix of a batch, trailing
bytes, inconsistent offset ranges, garbled record data behind a valid CRC, and fuzzed batches.
Each is a CorruptRecordError (or InvalidRecordError), never another exception."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loglake.errors import CorruptRecordError, InvalidRecordError
from loglake.records import (
    ATTR_COMPRESSION_MASK,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_SIZE,
    build_batch,
    decode_batch,
    decode_batches,
    iter_records,
    peek_header,
    split_batches,
    validate_batch,
)
from loglake.records import batch as batch_mod
from loglake.records.compression import compress
from loglake.records.varint import encode_varint
from recordkit import recrc, reframe, sample_records, small_batch


@pytest.mark.parametrize("codec", [0, 1])
def test_every_single_bit_flip_is_detected(codec: int) -> None:
    """Every bit CRC-32C covers (attributes..end) plus length/magic/crc is checked.

    base_offset (bytes 0-7) and partition_leader_epoch (bytes 12-15) are deliberately outside the CRC:
    the broker rewrites both on append without recomputing it. A flipped bit there is *not* detected
    by validate_batch: the batch validates and decodes with the flipped value. (In loglake's segment
    format another checksum covers the whole stored batch, these fields included.)
    """
    orig = small_batch(codec)
    good = list(iter_records(orig))
    uncovered = set(range(0, 8)) | set(range(12, 16))
    for byte in range(len(orig)):
        for bit in range(8):
            buf = bytearray(orig)
            buf[byte] ^= 1 << bit
            if byte in uncovered:
                h = validate_batch(buf)
                if byte < 8:
                    delta = h.base_offset - 1000
                    assert abs(delta) == 1 << (8 * (7 - byte) + bit)
                    assert [r.offset - delta for r in iter_records(buf)] == [r.offset for r in good]
                else:
                    assert h.partition_leader_epoch != 3
                    assert list(iter_records(buf)) == good
            else:
                with pytest.raises(CorruptRecordError):
                    validate_batch(buf)
                with pytest.raises(CorruptRecordError):
                    list(iter_records(buf))


def test_peek_header_checks() -> None:
    b = bytearray(small_batch())
    peek_header(b)
    bad = bytearray(b)
    bad[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1 at byte 16"):
        peek_header(bad)
    bad = bytearray(b)
    struct.pack_into(">i", bad, 8, 48)
    with pytest.raises(CorruptRecordError, match="batch_length 48 at byte 8"):
        peek_header(bad)
    bad = bytearray(b)
    struct.pack_into(">i", bad, 57, -1)
    with pytest.raises(CorruptRecordError, match="record_count -1 at byte 57"):
        peek_header(bad)
    with pytest.raises(CorruptRecordError, match="truncated batch header at byte 0"):
        peek_header(b[:60])
    # peek does not check CRC or the batch body
    bad = bytearray(b)
    bad[-1] ^= 0xFF
    assert peek_header(bad[:61]) == peek_header(b)
    # with an offset
    assert peek_header(b"xx" + bytes(b), 2) == peek_header(b)
    assert validate_batch(b"xx" + bytes(b), 2) == peek_header(b)


@pytest.mark.parametrize("codec", [0, 3])
def test_every_prefix_is_corrupt(codec: int) -> None:
    b = small_batch(codec)
    for k in range(len(b)):
        prefix = b[:k]
        for fn in (validate_batch, lambda x: list(iter_records(x)), lambda x: list(decode_batches(x))):
            if k == 0 and fn is not validate_batch:
                continue
            with pytest.raises(CorruptRecordError):
                fn(prefix)
        if k:
            with pytest.raises(CorruptRecordError):
                split_batches(prefix)
            with pytest.raises(CorruptRecordError):
                split_batches(b + prefix)  # a good batch then a partial one: the whole set is rejected
        if k < BATCH_HEADER_SIZE:
            with pytest.raises(CorruptRecordError):
                peek_header(prefix)
        else:
            assert peek_header(prefix) == peek_header(b)
    assert split_batches(b"") == []
    assert list(decode_batches(b"")) == []


def test_trailing_bytes() -> None:
    b = small_batch()
    junk = b + b"\x00garbage"
    assert validate_batch(junk) == peek_header(b)
    assert peek_header(junk) == peek_header(b)
    assert list(iter_records(junk)) == list(iter_records(b))
    with pytest.raises(CorruptRecordError):
        split_batches(junk)
    with pytest.raises(CorruptRecordError):
        list(decode_batches(junk))
    # a Fetch response cut mid-batch: the partial tail is dropped on request
    two = b + small_batch(1)
    assert [h.compression for h, _ in decode_batches(two + two[: len(b) + 30], allow_partial_tail=True)] == [
        0,
        1,
        0,
    ]
    assert len(list(decode_batches(two + b[:5], allow_partial_tail=True))) == 2


def test_split_batches_rejects_inconsistent_offset_range() -> None:
    template, section = _records_section()
    assert len(split_batches(reframe(template, section))) == 1
    bad = bytearray(reframe(template, section))
    struct.pack_into(">i", bad, batch_mod.LAST_OFFSET_DELTA_OFFSET, 5)
    recrc(bad)
    with pytest.raises(InvalidRecordError, match="inconsistent offset range"):
        split_batches(bad)
    with pytest.raises(InvalidRecordError):
        split_batches(reframe(template, b"", count=0))
    validate_batch(bad)  # not a CRC/framing problem: validate_batch alone accepts it


# --------------------------------------------------------------------------- garbled record data behind a valid CRC


def _records_section() -> tuple[bytes, bytes]:
    b = small_batch(0)
    return b, b[BATCH_HEADER_SIZE:]


def test_truncated_record_data_with_valid_crc() -> None:
    template, section = _records_section()
    for k in range(len(section)):
        with pytest.raises(CorruptRecordError):
            list(iter_records(reframe(template, section[:k])))
    # extra bytes after the last record
    with pytest.raises(CorruptRecordError, match="left after the last"):
        list(iter_records(reframe(template, section + b"\x00")))
    # count says more records than present, or fewer
    with pytest.raises(CorruptRecordError):
        list(iter_records(reframe(template, section, count=3)))
    with pytest.raises(CorruptRecordError):
        list(iter_records(reframe(template, section, count=1)))
    assert len(list(iter_records(reframe(template, section)))) == 2


@pytest.mark.parametrize("codec", [1, 2, 3, 4, 5, 6, 7])
def test_garbage_compressed_section(codec: int) -> None:
    template, section = _records_section()
    with pytest.raises(CorruptRecordError):
        list(iter_records(reframe(template, section, attributes=codec)))


def test_compressed_truncated_records() -> None:
    template, section = _records_section()
    for codec in (1, 2, 3, 4):
        for k in range(0, len(section), 3):
            data = compress(codec, section[:k])
            with pytest.raises(CorruptRecordError):
                list(iter_records(reframe(template, data, attributes=codec)))


def test_invalid_header_key_utf8() -> None:
    template, _ = _records_section()
    body = b"\x00" + encode_varint(0) + encode_varint(0) + b"\x01\x01" + encode_varint(1)
    body += encode_varint(2) + b"\xff\xfe" + b"\x01"
    section = encode_varint(len(body)) + body
    with pytest.raises(CorruptRecordError, match="UTF-8"):
        list(iter_records(reframe(template, section, count=1)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    garbage=st.binary(max_size=300), codec=st.sampled_from([0, 0, 0, 1, 2, 3, 4]), count=st.integers(-2, 40)
)
def test_fuzz_garbage_records_behind_valid_header(garbage: bytes, codec: int, count: int) -> None:
    template, _ = _records_section()
    buf = reframe(template, garbage, attributes=codec, count=count)
    try:
        list(iter_records(buf))
    except CorruptRecordError:
        pass


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=200))
def test_fuzz_raw_garbage(garbage: bytes) -> None:
    for fn in (
        lambda: list(iter_records(garbage)),
        lambda: split_batches(garbage),
        lambda: list(decode_batches(garbage)),
        lambda: validate_batch(garbage),
    ):
        try:
            fn()
        except CorruptRecordError:
            pass


def test_fuzz_mutated_batches() -> None:
    """Random byte mutations of real batches, CRC fixed up so the record decoder sees them."""
    rng = random.Random(1234)
    bases = [small_batch(0), build_batch(sample_records(5)), build_batch(sample_records(5), compression=2)]
    for _ in range(1500):
        buf = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(BATCH_HEADER_SIZE - 4, len(buf))
            buf[i] = rng.randrange(256)
        recrc(buf)
        try:
            list(iter_records(buf))
        except CorruptRecordError:
            pass


def test_decode_batch_without_crc_check() -> None:
    buf = bytearray(small_batch())
    buf[17] ^= 0xFF  # break only the stored CRC
    with pytest.raises(CorruptRecordError):
        decode_batch(buf)
    h, recs = decode_batch(buf, check_crc=False)
    assert len(recs) == 2 and h.record_count == 2
    assert ATTR_COMPRESSION_MASK & h.attributes == 0 and not h.attributes & ATTR_TRANSACTIONAL
