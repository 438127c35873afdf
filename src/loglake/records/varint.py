"""Variable-length integers as Kafka writes them (protobuf base-128 varints).

Kafka uses two flavours:

* unsigned varint: 7 bits per byte, least significant group first, high bit = "more follows";
* signed varint / varlong: the same, applied to the zigzag transform of the value
  (0 -> 0, -1 -> 1, 1 -> 2, -2 -> 3, ...) so small negative numbers stay short.

``varint`` fields are 32-bit (at most 5 bytes), ``varlong`` fields are 64-bit (at most 10 bytes).
Decoders take ``(buf, pos)`` and return ``(value, next_pos)``; they never read past ``end`` and raise
:class:`CorruptRecordError` naming the byte position on truncation or overlong input.

The record decoder in :mod:`loglake.records.batch` inlines the one-byte case of these functions for
speed and falls back to :func:`decode_varint` for longer encodings.
"""

from __future__ import annotations

from loglake.errors import CorruptRecordError

#: Longest encoding of a 32-bit varint (ceil(32 / 7)).
MAX_VARINT_BYTES = 5
#: Longest encoding of a 64-bit varlong (ceil(64 / 7)).
MAX_VARLONG_BYTES = 10

_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1

Buffer = bytes | bytearray | memoryview


def zigzag_encode(value: int) -> int:
    """Map a signed 64-bit int onto an unsigned one (Kafka/protobuf zigzag)."""
    return (value << 1) ^ (value >> 63)


def zigzag_decode(value: int) -> int:
    """Inverse of :func:`zigzag_encode`."""
    return (value >> 1) ^ -(value & 1)


def encode_unsigned_varint(value: int) -> bytes:
    """Encode a non-negative int (< 2**64) as an unsigned varint."""
    if value < 0 or value > _UINT64_MAX:
        raise ValueError(f"unsigned varint out of range: {value}")
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Encode a signed 64-bit int as a zigzag varint (used for both varint and varlong fields)."""
    if value < _INT64_MIN or value > _INT64_MAX:
        raise ValueError(f"varlong out of range: {value}")
    z = (value << 1) ^ (value >> 63)
    if z < 0x80:
        return bytes((z,))
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _make_small_table() -> tuple[bytes, ...]:
    return tuple(encode_varint(v) for v in range(-64, 64))


# Pre-encoded zigzag varints for -64..63 (all one byte): lengths, deltas and counts are usually tiny.
_SMALL: tuple[bytes, ...] = _make_small_table()


def encode_varint_fast(value: int, _small: tuple[bytes, ...] = _SMALL) -> bytes:
    """:func:`encode_varint` with a table lookup for one-byte values; no range check."""
    if -64 <= value < 64:
        return _small[value + 64]
    z = (value << 1) ^ (value >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def size_of_unsigned_varint(value: int) -> int:
    """Number of bytes :func:`encode_unsigned_varint` produces."""
    n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


def size_of_varint(value: int) -> int:
    """Number of bytes :func:`encode_varint` produces."""
    return size_of_unsigned_varint((value << 1) ^ (value >> 63))


def decode_unsigned_varint(
    buf: Buffer, pos: int = 0, end: int | None = None, max_bytes: int = MAX_VARLONG_BYTES
) -> tuple[int, int]:
    """Decode an unsigned varint at ``buf[pos]``; return ``(value, next_pos)``.

    Raises CorruptRecordError if the varint runs past ``end`` (default: end of buffer) or is longer
    than ``max_bytes``.
    """
    if end is None:
        end = len(buf)
    if pos < 0 or pos >= end:
        raise CorruptRecordError(f"truncated varint at byte {pos}")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    p = pos + 1
    limit = min(end, pos + max_bytes)
    while p < limit:
        b = buf[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, p
        shift += 7
    if p >= end and p < pos + max_bytes:
        raise CorruptRecordError(f"truncated varint at byte {pos}")
    raise CorruptRecordError(f"varint longer than {max_bytes} bytes at byte {pos}")


def decode_varint(
    buf: Buffer, pos: int = 0, end: int | None = None, max_bytes: int = MAX_VARLONG_BYTES
) -> tuple[int, int]:
    """Decode a zigzag (signed) varint at ``buf[pos]``; return ``(value, next_pos)``.

    With the default ``max_bytes`` this reads a varlong; pass ``MAX_VARINT_BYTES`` for a varint field.
    """
    if end is None:
        end = len(buf)
    if 0 <= pos < end:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
    z, p = decode_unsigned_varint(buf, pos, end, max_bytes)
    if z > _UINT64_MAX:
        raise CorruptRecordError(f"varint out of 64-bit range at byte {pos}")
    value = (z >> 1) ^ -(z & 1)
    if max_bytes <= MAX_VARINT_BYTES and not (_INT32_MIN <= value <= _INT32_MAX):
        raise CorruptRecordError(f"varint out of 32-bit range at byte {pos}")
    return value, p
