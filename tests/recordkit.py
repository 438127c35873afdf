"""What the record codec's tests share: sample records, a batch to corrupt, and batches
re-framed or re-checksummed by hand (test_records_codec.py, test_records_corrupt.py)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c
import kafka.record.default_records as kdr

from loglake.records import BATCH_HEADER_SIZE, CRC_COVERED_START, HEADER, LENGTH_FIELD_END, build_batch

CODECS = [0, 1, 2, 3, 4]
RecordTuple = tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]


def sample_records(n: int = 6) -> list[RecordTuple]:
    # compressible values so that kafka-python keeps the codec (it falls back to none otherwise)
    out: list[RecordTuple] = []
    for i in range(n):
        key = None if i % 3 == 2 else f"key-{i}".encode()
        value = None if i % 4 == 3 else (b"value-%d " % i) * (i + 5)
        headers: list[tuple[str, bytes | None]] = []
        if i % 2 == 0:
            headers = [("trace-id", b"abc%d" % i), ("empty", b""), ("nullhdr", None), ("ünï", b"\x00\xff")]
        out.append((1_700_000_000_000 + i * 7 - (3 if i == 2 else 0), key, value, headers))
    return out


def small_batch(codec: int = 0) -> bytes:
    return build_batch(
        [(1_700_000_000_000, b"k", b"hello", [("h", b"1")]), (1_700_000_000_005, None, b"world", [])],
        compression=codec,
        base_offset=1000,
        partition_leader_epoch=3,
    )


def recrc(buf: bytearray, pos: int = 0) -> None:
    """Recompute the CRC of the batch at pos with an independent implementation (kafka-python's)."""
    size = struct.unpack_from(">i", buf, pos + 8)[0] + 12
    crc = kdr.calc_crc32c(memoryview(buf)[pos + 21 : pos + size])
    struct.pack_into(">I", buf, pos + 17, crc)


def reframe(
    template: bytes, records_section: bytes, *, attributes: int | None = None, count: int | None = None
) -> bytes:
    """A batch with template's header but the given records section, valid length and CRC."""
    fields = list(HEADER.unpack_from(template, 0))
    fields[1] = BATCH_HEADER_SIZE + len(records_section) - LENGTH_FIELD_END
    if attributes is not None:
        fields[5] = attributes
    if count is not None:
        fields[12] = count
    fields[4] = 0
    head = HEADER.pack(*fields)
    fields[4] = crc32c.crc32c(head[CRC_COVERED_START:] + records_section)
    return HEADER.pack(*fields) + records_section
