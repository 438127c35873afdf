"""Kafka's default key partitioner: murmur2 as in ``org.apache.kafka.common.utils.Utils.murmur2``.

A key must land on the same partition whichever client produced it, so this reproduces the Java
function bit for bit: 32-bit wrap-around arithmetic, little-endian 4-byte blocks, the fixed seed,
and a signed 32-bit result.
"""

from __future__ import annotations

import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes | bytearray | memoryview) -> int:
    """MurmurHash2 of ``data``, identical to Java's ``Utils.murmur2`` (signed 32-bit result)."""
    view = memoryview(data).cast("B")
    length = len(view)
    m = _M
    h = (_SEED ^ length) & _MASK32
    n4 = length >> 2
    if n4:
        for k in struct.unpack_from(f"<{n4}I", view):
            k = (k * m) & _MASK32
            k ^= k >> _R
            k = (k * m) & _MASK32
            h = ((h * m) & _MASK32) ^ k
    tail = length & 3
    base = length & ~3
    if tail == 3:
        h ^= view[base + 2] << 16
    if tail >= 2:
        h ^= view[base + 1] << 8
    if tail >= 1:
        h ^= view[base]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(value: int) -> int:
    """Java's ``Utils.toPositive``: clear the sign bit (not ``abs``, which differs for MIN_VALUE)."""
    return value & 0x7FFFFFFF


def default_partition(key: bytes | bytearray | memoryview, num_partitions: int) -> int:
    """Partition of a non-null key under Kafka's default partitioner."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
