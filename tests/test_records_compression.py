"""Batch compression codecs: wire formats real clients use, and bounded decompression."""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from unittest import mock

import cramjam
import kafka.codec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.errors import ConfigError, CorruptRecordError
from loglake.records import compression as comp
from loglake.records.compression import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NAMES,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    codec_from_name,
    compress,
    decompress,
)

ALL = [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD]
PAYLOADS = [b"", b"x", b"hello world " * 1000, os.urandom(5000), bytes(100_000)]


class _SnappyShim:
    """python-snappy is not installed; kafka-python's xerial framing runs on cramjam raw blocks."""

    @staticmethod
    def compress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(data))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(bytes(data)))


def test_codec_names() -> None:
    assert CODEC_NAMES == {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
    for name, codec in CODEC_NAMES.items():
        assert codec_from_name(name) == codec
        assert codec_from_name(name.upper()) == codec
    with pytest.raises(ConfigError, match="brotli"):
        codec_from_name("brotli")
    with pytest.raises(ConfigError):
        compress(9, b"x")
    with pytest.raises(CorruptRecordError, match="codec 5"):
        decompress(5, b"x")


@pytest.mark.parametrize("codec", ALL)
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: str(len(p)))
def test_round_trip(codec: int, payload: bytes) -> None:
    data = compress(codec, payload)
    assert decompress(codec, data) == payload
    assert decompress(codec, memoryview(data)) == payload


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=3000), codec=st.sampled_from(ALL))
def test_round_trip_property(payload: bytes, codec: int) -> None:
    assert decompress(codec, compress(codec, payload)) == payload


def test_gzip_is_a_standard_stream() -> None:
    payload = b"abc" * 1000
    assert gzip.decompress(compress(CODEC_GZIP, payload)) == payload
    assert decompress(CODEC_GZIP, gzip.compress(payload)) == payload
    assert decompress(CODEC_GZIP, kafka.codec.gzip_encode(payload)) == payload
    # concatenated members (what a stream of GZIPOutputStream.finish() calls can produce)
    assert decompress(CODEC_GZIP, gzip.compress(b"ab") + gzip.compress(b"cd")) == b"abcd"


def test_snappy_writes_xerial_framing() -> None:
    payload = os.urandom(40_000) + bytes(50_000)  # > 32 KiB: several blocks
    data = compress(CODEC_SNAPPY, payload)
    assert data[:8] == b"\x82SNAPPY\x00"
    assert struct.unpack(">ii", data[8:16]) == (1, 1)
    # walk the blocks by hand
    pos, out = 16, b""
    while pos < len(data):
        (n,) = struct.unpack_from(">i", data, pos)
        out += bytes(cramjam.snappy.decompress_raw(data[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    assert out == payload
    assert pos == len(data)
    # and kafka-python's reader agrees
    with mock.patch.object(kafka.codec, "snappy", _SnappyShim):
        assert kafka.codec.snappy_decode(data) == payload


def test_snappy_reads_raw_and_kafka_python_xerial() -> None:
    payload = b"librdkafka writes raw blocks " * 500
    assert decompress(CODEC_SNAPPY, bytes(cramjam.snappy.compress_raw(payload))) == payload
    with mock.patch.object(kafka.codec, "snappy", _SnappyShim):
        xerial = kafka.codec.snappy_encode(payload, xerial_compatible=True, xerial_blocksize=1000)
        raw = kafka.codec.snappy_encode(payload, xerial_compatible=False)
    assert xerial[:8] == comp.XERIAL_MAGIC
    assert decompress(CODEC_SNAPPY, xerial) == payload
    assert decompress(CODEC_SNAPPY, raw) == payload
    # xerial with an empty body (header only) is an empty payload
    assert decompress(CODEC_SNAPPY, comp.XERIAL_HEADER) == b""


def test_snappy_xerial_errors() -> None:
    good = compress(CODEC_SNAPPY, b"q" * 100_000)
    for bad in (
        good[:18],
        good[:-1],
        comp.XERIAL_HEADER + struct.pack(">i", -1) + b"xx",
        comp.XERIAL_HEADER + struct.pack(">i", 1000) + b"xx",
        comp.XERIAL_HEADER + b"\x00\x00\x00\x03abc",
    ):
        with pytest.raises(CorruptRecordError):
            decompress(CODEC_SNAPPY, bad)


def test_lz4_frames() -> None:
    payload = b"lz4 frame " * 20_000
    ours = compress(CODEC_LZ4, payload)
    assert ours[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
    flg = ours[4]
    assert flg >> 6 == 1  # frame version 01
    assert flg & 0x20  # block independence: Kafka's Java reader rejects linked blocks
    assert bytes(cramjam.lz4.decompress(ours)) == payload
    # frames from cramjam's defaults (linked blocks, checksums) decode too
    assert decompress(CODEC_LZ4, bytes(cramjam.lz4.compress(payload))) == payload
    # a raw lz4 block is not a frame
    with pytest.raises(CorruptRecordError, match="lz4"):
        decompress(CODEC_LZ4, bytes(cramjam.lz4.compress_block(payload)))


def test_zstd_frames() -> None:
    payload = b"zstd frame " * 20_000
    ours = compress(CODEC_ZSTD, payload)
    assert ours[:4] == b"\x28\xb5\x2f\xfd"
    assert bytes(cramjam.zstd.decompress(ours)) == payload
    assert decompress(CODEC_ZSTD, bytes(cramjam.zstd.compress(payload, level=19))) == payload


@pytest.mark.parametrize("codec", ALL)
def test_decompression_is_bounded(codec: int) -> None:
    payload = bytes(4 << 20)  # 4 MiB of zeros: compresses ~1000x, so the output buffer must grow
    data = compress(codec, payload)
    assert decompress(codec, data, max_output_bytes=len(payload)) == payload  # exactly at the limit
    with pytest.raises(CorruptRecordError, match="exceeds"):
        decompress(codec, data, max_output_bytes=len(payload) - 1)
    with pytest.raises(CorruptRecordError, match="exceeds"):
        decompress(codec, data, max_output_bytes=1000)


def test_bounded_snappy_raw_checks_declared_length_first() -> None:
    # a raw block whose preamble claims 2**31 bytes: rejected before any allocation
    bomb = b"\x80\x80\x80\x80\x08" + b"\x00" * 10
    with pytest.raises(CorruptRecordError, match="exceeds"):
        decompress(CODEC_SNAPPY, bomb)


@pytest.mark.parametrize("codec", [CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD])
def test_garbage_and_truncation(codec: int) -> None:
    data = compress(codec, b"some payload that is long enough " * 50)
    # (b"\x00" alone is a valid raw snappy block of length 0, so it is not in the list)
    for bad in (b"", b"\x01", b"garbage" * 20, data[: len(data) // 2], data[:-1]):
        with pytest.raises(CorruptRecordError):
            decompress(codec, bad)
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    try:
        decompress(codec, bytes(flipped))  # may decode to different bytes; must not raise anything else
    except CorruptRecordError:
        pass


@settings(max_examples=200, deadline=None)
@given(garbage=st.binary(max_size=200), codec=st.sampled_from(ALL[1:]))
def test_fuzz_only_corrupt_record_error(garbage: bytes, codec: int) -> None:
    try:
        decompress(codec, garbage, max_output_bytes=1 << 20)
    except CorruptRecordError:
        pass


def test_gzip_member_errors_name_position() -> None:
    with pytest.raises(CorruptRecordError, match="compressed byte"):
        decompress(CODEC_GZIP, gzip.compress(b"ab") + b"\x1f\x8b\x08garbage")
    assert zlib  # stdlib zlib backs gzip decoding (bounded via max_length)
