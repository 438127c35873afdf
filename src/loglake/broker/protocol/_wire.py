"""Bounds-checked primitive readers and writers shared by the hand-written codec paths.

Readers take ``(data, pos)`` and return ``(value, new_pos)``; every overrun raises `WireError`
(a ValueError), which the public entry points turn into `MalformedRequestError`.
"""

from __future__ import annotations

import uuid
from struct import Struct

from loglake.records.varint import encode_unsigned_varint

I8 = Struct(">b")
I16 = Struct(">h")
I32 = Struct(">i")
I64 = Struct(">q")

Readable = bytes | bytearray | memoryview


class WireError(ValueError):
    """Bytes do not decode; the message says where."""


def read_i16(data: Readable, pos: int) -> tuple[int, int]:
    if pos + 2 > len(data):
        raise WireError(f"int16 past end at {pos}")
    return I16.unpack_from(data, pos)[0], pos + 2


def read_i32(data: Readable, pos: int) -> tuple[int, int]:
    if pos + 4 > len(data):
        raise WireError(f"int32 past end at {pos}")
    return I32.unpack_from(data, pos)[0], pos + 4


def read_uvarint(data: Readable, pos: int) -> tuple[int, int]:
    """Unsigned varint of at most 5 bytes (Kafka's UNSIGNED_VARINT is 32 bits)."""
    value = 0
    shift = 0
    n = len(data)
    while True:
        if pos >= n:
            raise WireError(f"varint past end at {pos}")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise WireError(f"varint longer than 5 bytes at {pos}")


def _span(data: Readable, pos: int, length: int, what: str) -> int:
    end = pos + length
    if end > len(data):
        raise WireError(f"{what} of {length} bytes past end at {pos}")
    return end


def read_string(data: Readable, pos: int, compact: bool) -> tuple[str | None, int]:
    if compact:
        length, pos = read_uvarint(data, pos)
        length -= 1
    else:
        length, pos = read_i16(data, pos)
    if length < 0:
        if length != -1:
            raise WireError(f"negative string length {length}")
        return None, pos
    end = _span(data, pos, length, "string")
    try:
        return str(data[pos:end], "utf-8"), end
    except UnicodeDecodeError as e:
        raise WireError(f"string is not UTF-8 at {pos}") from e


def read_bytes_view(data: memoryview, pos: int, compact: bool) -> tuple[memoryview | None, int]:
    """A nullable BYTES/RECORDS field as a slice of `data` (no copy)."""
    if compact:
        length, pos = read_uvarint(data, pos)
        length -= 1
    else:
        length, pos = read_i32(data, pos)
    if length < 0:
        if length != -1:
            raise WireError(f"negative bytes length {length}")
        return None, pos
    end = _span(data, pos, length, "bytes")
    return data[pos:end], end


def read_uuid(data: Readable, pos: int) -> tuple[uuid.UUID | None, int]:
    end = _span(data, pos, 16, "uuid")
    value = uuid.UUID(bytes=bytes(data[pos:end]))
    return (None if value.int == 0 else value), end


def read_array_len(data: Readable, pos: int, compact: bool, min_item_size: int) -> tuple[int, int]:
    """Array count (-1 = null), checked against the bytes left so a huge count cannot spin."""
    if compact:
        n, pos = read_uvarint(data, pos)
        n -= 1
    else:
        n, pos = read_i32(data, pos)
    if n < -1:
        raise WireError(f"negative array length {n}")
    if n > 0 and n * min_item_size > len(data) - pos:
        raise WireError(f"array of {n} items cannot fit in {len(data) - pos} bytes")
    return n, pos


def skip_tagged_fields(data: Readable, pos: int) -> int:
    count, pos = read_uvarint(data, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        pos = _span(data, pos, size, "tagged field")
    return pos


# --- writers (into a bytearray) ------------------------------------------------------------


#: Kafka's flexible versions use the same unsigned varints as record batches.
uvarint = encode_unsigned_varint


def put_string(out: bytearray, value: str | None, compact: bool) -> None:
    if value is None:
        out += b"\x00" if compact else b"\xff\xff"
        return
    raw = value.encode()
    if compact:
        out += uvarint(len(raw) + 1)
    else:
        out += I16.pack(len(raw))
    out += raw


def put_array_len(out: bytearray, n: int | None, compact: bool) -> None:
    if compact:
        out += uvarint(0 if n is None else n + 1)
    else:
        out += I32.pack(-1 if n is None else n)


ZERO_UUID_BYTES = bytes(16)


def uuid_bytes(value: uuid.UUID | str | bytes | None) -> bytes:
    if value is None:
        return ZERO_UUID_BYTES
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, bytes):
        if len(value) != 16:
            raise ValueError("uuid bytes must be 16 long")
        return value
    return uuid.UUID(value).bytes
