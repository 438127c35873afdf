"""Fuzz targets for the wire protocol: requests of every API and version, frames, record batches.

Structured mutations start from valid requests (kafka-python's own encoding of schema-driven
samples, one per API and version and sample seed) and change what a decoder trusts: integer field
values, string/array lengths and counts (fixed-width and compact varints), tagged-field sections
(unknown, known with garbage, duplicated, huge sizes), the version in the header (the bytes read
with a neighbouring version's schema), spans cut, repeated or spliced from another request, and
invalid UTF-8. Produce record batches are built with each codec, corrupted inside the compressed
payload, and given a correct CRC again so the decompressor and record decoder see the damage.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from functools import cache

from fuzzkit import Target
from loglake.broker.protocol import SUPPORTED, FrameDecoder, ProtocolError, decode_request, request_class
from loglake.broker.protocol.errors import FrameTooLargeError
from loglake.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from loglake.records.batch import CRC_COVERED_START, CRC_OFFSET, BatchBuilder, split_batches
from loglake.records.compression import CODEC_NAMES
from loglake.records.decode import decode_batch
from loglake.records.varint import encode_unsigned_varint
from test_protocol_samples import all_versions, client_bytes, sample_request

#: Valid sample requests per API version in the seed pool.
SAMPLES_PER_VERSION = 3
#: Decompressed bytes a fuzzed batch may expand to (the decoder's named limit in these targets).
FUZZ_DECOMPRESS_LIMIT = 1 << 20
#: Frame limit of the FrameDecoder target.
FUZZ_FRAME_LIMIT = 1 << 16

_INT_VALUES = {
    1: [0, 1, 0x7F, 0x80, 0xFF],
    2: [0, 1, 0x7FFF, 0x8000, 0xFFFF, 0xFFFE],
    4: [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 0x00010000],
    8: [0, 1, 2**63 - 1, 2**63, 2**64 - 1],
}
_UVARINTS = [0, 1, 2, 0x7F, 0x80, 0x3FFF, 0x4000, 2**31 - 1, 2**31, 2**32 - 1, 2**35]


@cache
def seed_frames() -> tuple[tuple[int, int, bytes], ...]:
    """(api_key, version, frame without size prefix) for every supported API version."""
    out = []
    for api_key, version in all_versions():
        for s in range(SAMPLES_PER_VERSION):
            frame = client_bytes(sample_request(api_key, version, seed=s), correlation_id=7 + s)[4:]
            out.append((api_key, version, frame))
    return tuple(out)


@cache
def _by_api() -> dict[int, list[bytes]]:
    groups: dict[int, list[bytes]] = {}
    for api_key, _v, frame in seed_frames():
        groups.setdefault(api_key, []).append(frame)
    return groups


def _uvarint(n: int) -> bytes:
    return encode_unsigned_varint(n) if n < 2**32 else bytes([0xFF] * 5 + [0x7F])


def _tagged_section(rng: random.Random) -> bytes:
    """A tagged-fields section that is wrong in one of the ways a decoder must survive."""
    kind = rng.randrange(6)
    if kind == 0:  # count far larger than the bytes that follow
        return _uvarint(rng.choice(_UVARINTS[4:]))
    if kind == 1:  # one field whose size runs past the end
        return b"\x01" + _uvarint(rng.randrange(8)) + _uvarint(rng.choice(_UVARINTS[3:]))
    if kind == 2:  # a known low tag number carrying garbage of a plausible size
        data = rng.randbytes(rng.randint(0, 24))
        return b"\x01" + _uvarint(rng.randrange(4)) + _uvarint(len(data)) + data
    if kind == 3:  # duplicated or descending tags
        tags = [rng.randrange(4)] * 2 if rng.random() < 0.5 else [3, 1]
        return _uvarint(len(tags)) + b"".join(_uvarint(t) + b"\x01" + rng.randbytes(1) for t in tags)
    if kind == 4:  # unknown tag, legal size: must be skipped
        data = rng.randbytes(rng.randint(0, 16))
        return b"\x01" + _uvarint(rng.choice([50, 1000, 2**31 - 1])) + _uvarint(len(data)) + data
    return b"\x02" + b"\x00\x00" + b"\x05\x01x"  # zero-size field then another one


def _header_tags_pos(frame: bytes) -> int | None:
    if len(frame) < 10:
        return None
    (n,) = struct.unpack_from(">h", frame, 8)
    pos = 10 + max(n, 0)
    return pos if pos < len(frame) else None


def mutate_request(rng: random.Random, api_key: int, frame: bytes) -> bytes:
    b = bytearray(frame)
    version = struct.unpack_from(">h", b, 2)[0]
    flexible = bool(request_class(api_key).flexible_version_q(version))
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        op = rng.randrange(12)
        n = len(b)
        pos = rng.randrange(8, n) if n > 8 else n
        if op == 0 and n > 8:  # an integer field value: boundary values at any width
            width = rng.choice([1, 2, 4, 8])
            b[pos : pos + width] = rng.choice(_INT_VALUES[width]).to_bytes(width, "big")
        elif op == 1:  # a compact length / count / tag as a varint
            b[pos : pos + rng.randint(0, 2)] = _uvarint(rng.choice(_UVARINTS))
        elif op == 2 and flexible:  # the body's final tagged-field section
            del b[-1:]
            b += _tagged_section(rng)
        elif op == 3 and flexible:  # the header's tagged-field section
            at = _header_tags_pos(bytes(b))
            if at is not None:
                b[at : at + 1] = _tagged_section(rng)
        elif op == 4:  # a zero byte (empty array / tags / null) turned into a section or count
            zeros = [i for i in range(8, n) if b[i] == 0]
            if zeros:
                at = rng.choice(zeros)
                b[at : at + 1] = _tagged_section(rng) if flexible else rng.randbytes(rng.randint(1, 4))
        elif op == 5:  # the same bytes read with another version's schema
            r = SUPPORTED[api_key]
            struct.pack_into(">h", b, 2, rng.randint(r.min_version, r.max_version))
        elif op == 6 and n > 8:  # truncate
            del b[rng.randrange(8, n) :]
        elif op == 7 and n > 8:  # repeat a span (counts no longer match)
            end = min(n, pos + rng.randint(1, 32))
            b[pos:pos] = b[pos:end] * rng.randint(1, 4)
        elif op == 8 and n > 8:  # delete a span
            del b[pos : pos + rng.randint(1, 16)]
        elif op == 9:  # splice the tail of another request of the same API
            other = rng.choice(_by_api()[api_key])
            cut = rng.randrange(8, len(other)) if len(other) > 8 else len(other)
            b[pos:] = other[cut:]
        elif op == 10 and n > 8:  # invalid UTF-8 inside a string
            b[pos : pos + 2] = rng.choice([b"\xc3\x28", b"\xff\xfe", b"\xed\xa0\x80"])
        elif n > 8:  # flip bits
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(8, n)] ^= 1 << rng.randrange(8)
    return bytes(b)


def make_mutated_request(rng: random.Random) -> bytes:
    api_key, _version, frame = rng.choice(seed_frames())
    return mutate_request(rng, api_key, frame)


def make_fresh_request(rng: random.Random) -> bytes:
    """A valid request with freshly drawn field values (decodes, or raises only typed errors)."""
    api_key, version = rng.choice(all_versions())
    return client_bytes(sample_request(api_key, version, seed=rng.randrange(1 << 30)), rng.randrange(1 << 31))[4:]


def make_random_frame(rng: random.Random) -> bytes:
    n = rng.choice([0, 1, 4, 7, 8, 9, 10, 12, 20, 64, 300, 2000])
    frame = rng.randbytes(n)
    if n >= 8 and rng.random() < 0.8:  # a served api key and version so the body decoders run
        api_key, version = rng.choice(all_versions())
        frame = struct.pack(">hh", api_key, version) + frame[4:]
    return frame


def run_decode(frame: bytes) -> None:
    decode_request(frame)


def make_stream(rng: random.Random) -> bytes:
    """A byte stream of framed requests, bad size prefixes and junk."""
    parts = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.randrange(4)
        if kind == 0:
            body = rng.choice(seed_frames())[2]
            parts.append(struct.pack(">i", len(body)) + body)
        elif kind == 1:
            parts.append(struct.pack(">i", rng.choice([-1, -(2**31), FUZZ_FRAME_LIMIT + 1, 2**31 - 1, 0])))
        else:
            parts.append(rng.randbytes(rng.randint(0, 64)))
    return b"".join(parts)


def run_stream(data: bytes) -> None:
    dec = FrameDecoder(FUZZ_FRAME_LIMIT)
    rng = random.Random(len(data))
    i = 0
    while i < len(data):
        step = rng.randint(1, 97)
        for frame in dec.feed(data[i : i + step]):
            assert len(frame) <= FUZZ_FRAME_LIMIT
        assert dec.buffered <= 4 + FUZZ_FRAME_LIMIT
        i += step


def _records(rng: random.Random) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    out = []
    for i in range(rng.randint(1, 8)):
        key = None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 12))
        value = None if rng.random() < 0.1 else bytes([i]) * rng.randint(0, 300)
        headers = [("h", rng.randbytes(3))] if rng.random() < 0.3 else []
        out.append((1_700_000_000_000 + i, key, value, headers))
    return out


def make_batch(rng: random.Random) -> bytes:
    """One or two produce batches (random codec), corrupted, with the CRC made right again
    most of the time so the damage reaches the decompressor and the record decoder."""
    out = bytearray()
    for _ in range(rng.choice([1, 1, 2])):
        builder = BatchBuilder(compression=rng.choice(list(CODEC_NAMES.values())))
        for rec in _records(rng):
            builder.append(*rec)
        out += builder.build()
    n = len(out)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(5)
        pos = rng.randrange(n)
        if op == 0:  # payload byte (the compressed stream, or record varints)
            out[rng.randrange(min(61, n - 1), n)] = rng.randrange(256)
        elif op == 1:  # a header field: length, magic, attributes (codec), offsets, count
            at = rng.choice([8, 16, 21, 23, 57])
            width = {8: 4, 16: 1, 21: 2, 23: 4, 57: 4}[at]
            out[at : at + width] = rng.choice(_INT_VALUES[width]).to_bytes(width, "big")
        elif op == 2:
            del out[pos:]
        elif op == 3:
            del out[pos : pos + rng.randint(1, 20)]
        else:
            out[pos:pos] = rng.randbytes(rng.randint(1, 20))
        n = len(out)
        if n < 62:
            break
    if len(out) >= CRC_COVERED_START and rng.random() < 0.8:
        import crc32c

        length = struct.unpack_from(">i", out, 8)[0] + 12
        end = min(len(out), length) if length > CRC_COVERED_START else len(out)
        struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(bytes(out[CRC_COVERED_START:end])))
    return bytes(out)


def run_batch(data: bytes) -> None:
    for pos, _h in split_batches(data, max_batch_bytes=FUZZ_DECOMPRESS_LIMIT):
        decode_batch(data, pos, max_decompressed_bytes=FUZZ_DECOMPRESS_LIMIT)
    decode_batch(data, 0, check_crc=False, max_decompressed_bytes=FUZZ_DECOMPRESS_LIMIT)


def _t(name: str, make: Callable[[random.Random], bytes], run: Callable[[bytes], None], allowed: tuple[type[BaseException], ...], extra: int = 0) -> Target:
    return Target(name, make, run, allowed, extra)


_RECORD_ERRORS = (CorruptRecordError, InvalidRecordError, RecordTooLargeError)

TARGETS = [
    _t("request_mutated", make_mutated_request, run_decode, (ProtocolError,)),
    _t("request_fresh", make_fresh_request, run_decode, (ProtocolError,)),
    _t("request_random", make_random_frame, run_decode, (ProtocolError,)),
    _t("frame_stream", make_stream, run_stream, (FrameTooLargeError,), FUZZ_FRAME_LIMIT),
    _t("produce_batches", make_batch, run_batch, _RECORD_ERRORS, 4 * FUZZ_DECOMPRESS_LIMIT),
]
