"""Produce request decoding that keeps record data opaque and uncopied.

kafka-python decodes the ``records`` field as ``bytes(data[pos:pos+n])`` (one copy per partition);
this hand-written decoder (Produce v3-v13) returns each partition's records as a memoryview slice
of the request frame instead, and never looks inside them. The objects use kafka-python's field
names (``topic_data[].partition_data[].records``) so handlers read them like any other body.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from struct import Struct

from loglake.broker.protocol._wire import (
    I32,
    WireError,
    read_array_len,
    read_i16,
    read_i32,
    read_string,
    read_uuid,
    read_uvarint,
    skip_tagged_fields,
)

#: ProduceResponse's record_errors and error_message (KIP-467) exist from this version.
RECORD_ERRORS_FROM = 8
FLEXIBLE_FROM = 9
TOPIC_ID_FROM = 13


@dataclass(slots=True)
class ProducePartitionData:
    index: int
    #: The partition's record batches exactly as sent (None if the client sent null).
    records: memoryview | None


@dataclass(slots=True)
class ProduceTopicData:
    #: Topic name (v3-v12); None from v13.
    name: str | None
    #: Topic id (v13+); None before.
    topic_id: uuid.UUID | None
    partition_data: list[ProducePartitionData]


@dataclass(slots=True)
class ProduceRequestData:
    version: int
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[ProduceTopicData]

    @property
    def record_bytes(self) -> int:
        return sum(len(p.records) for t in self.topic_data for p in t.partition_data if p.records is not None)


_II = Struct(">ii")


def _partitions(data: memoryview, pos: int, count: int, compact: bool) -> tuple[list[ProducePartitionData], int]:
    """The partition loop, inlined: it runs once per partition of every Produce request."""
    n = len(data)
    parts: list[ProducePartitionData] = []
    append = parts.append
    unpack_ii = _II.unpack_from
    for _ in range(count):
        if compact:
            if pos + 5 > n:
                raise WireError(f"partition past end at {pos}")
            index = I32.unpack_from(data, pos)[0]
            b = data[pos + 4]
            if b < 0x80:
                length = b - 1
                pos += 5
            else:
                length, pos = read_uvarint(data, pos + 4)
                length -= 1
        else:
            if pos + 8 > n:
                raise WireError(f"partition past end at {pos}")
            index, length = unpack_ii(data, pos)
            pos += 8
        if length < 0:
            if length != -1:
                raise WireError(f"negative records length {length}")
            records = None
        else:
            end = pos + length
            if end > n:
                raise WireError(f"records of {length} bytes past end at {pos}")
            records = data[pos:end]
            pos = end
        if compact:
            if pos < n and data[pos] == 0:
                pos += 1
            else:
                pos = skip_tagged_fields(data, pos)
        append(ProducePartitionData(index, records))
    return parts, pos


def decode_produce_body(data: memoryview, pos: int, version: int) -> ProduceRequestData:
    """Decode a Produce body starting at `pos`; it must end exactly at the end of `data`.

    Raises `WireError` on anything that does not decode.
    """
    compact = version >= FLEXIBLE_FROM
    transactional_id, pos = read_string(data, pos, compact)
    acks, pos = read_i16(data, pos)
    timeout_ms, pos = read_i32(data, pos)
    n_topics, pos = read_array_len(data, pos, compact, 3)
    topics: list[ProduceTopicData] = []
    for _ in range(max(n_topics, 0)):
        name: str | None = None
        topic_id: uuid.UUID | None = None
        if version >= TOPIC_ID_FROM:
            topic_id, pos = read_uuid(data, pos)
        else:
            name, pos = read_string(data, pos, compact)
        n_parts, pos = read_array_len(data, pos, compact, 5)
        parts, pos = _partitions(data, pos, max(n_parts, 0), compact)
        if compact:
            pos = skip_tagged_fields(data, pos)
        topics.append(ProduceTopicData(name, topic_id, parts))
    if compact:
        pos = skip_tagged_fields(data, pos)
    if pos != len(data):
        raise WireError(f"{len(data) - pos} trailing bytes after Produce body")
    return ProduceRequestData(version, transactional_id, acks, timeout_ms, topics)


__all__ = [
    "RECORD_ERRORS_FROM",
    "ProducePartitionData",
    "ProduceRequestData",
    "ProduceTopicData",
    "decode_produce_body",
]
