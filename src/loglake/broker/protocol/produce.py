"""Produce's codecs: the request decoded without copying its records, the response encoded
without building kafka-python objects.

kafka-python decodes the ``records`` field as ``bytes(data[pos:pos+n])`` (one copy per partition);
this hand-written decoder (Produce v3-v13) returns each partition's records as a memoryview slice
of the request frame instead, and never looks inside them. The objects use kafka-python's field
names (``topic_data[].partition_data[].records``) so handlers read them like any other body.

The response (`ProduceResponseData`, what the produce handler answers) is written straight into
one buffer by `encode_produce_response`: on a one-record request, building kafka-python's
response objects from a mapping and encoding them was a third of the request's Python time.
kafka-python's ProduceResponse stays the reference the tests hold it to, byte for byte.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from struct import Struct

from loglake.broker.protocol._wire import (
    I32,
    WireError,
    put_array_len,
    put_string,
    read_array_len,
    read_i16,
    read_i32,
    read_string,
    read_uuid,
    read_uvarint,
    skip_tagged_fields,
    uuid_bytes,
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


@dataclass(slots=True)
class ProducePartitionResponse:
    index: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    #: (batch index, message) of the records that made the batch be refused (v8+).
    record_errors: list[tuple[int, str | None]] = field(default_factory=list)
    error_message: str | None = None


@dataclass(slots=True)
class ProduceTopicResponse:
    #: Topic name (v3-v12); the topic id from v13.
    name: str | None
    partition_responses: list[ProducePartitionResponse]
    topic_id: uuid.UUID | None = None


@dataclass(slots=True)
class ProduceResponseData:
    responses: list[ProduceTopicResponse] = field(default_factory=list)
    throttle_time_ms: int = 0

    def first_error(self) -> int:
        """The first partition's error code that is not NONE, in response order; 0 when none is
        (what `loglake.broker.metrics.response_error` finds, without its generic walk)."""
        for topic in self.responses:
            for part in topic.partition_responses:
                if part.error_code:
                    return part.error_code
        return 0


# index, error_code, base_offset, log_append_time_ms[, log_start_offset (v5+)]
_P4 = Struct(">ihqq")
_P5 = Struct(">ihqqq")
_HEAD = Struct(">ii")


def encode_produce_response(correlation_id: int, version: int, resp: ProduceResponseData) -> memoryview:
    """The framed ProduceResponse (size prefix and response header included), Produce v3-v13."""
    if not 3 <= version <= TOPIC_ID_FROM:
        raise ValueError(f"Produce response version {version} outside 3..{TOPIC_ID_FROM}")
    flex = version >= FLEXIBLE_FROM
    with_errors = version >= RECORD_ERRORS_FROM
    fixed = _P5 if version >= 5 else _P4
    out = bytearray(9 if flex else 8)  # size and correlation id, then header v1's empty tags
    put_array_len(out, len(resp.responses), flex)
    for topic in resp.responses:
        if version >= TOPIC_ID_FROM:
            out += uuid_bytes(topic.topic_id)
        else:
            put_string(out, topic.name, flex)
        put_array_len(out, len(topic.partition_responses), flex)
        for p in topic.partition_responses:
            if version >= 5:
                out += fixed.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms, p.log_start_offset)
            else:
                out += fixed.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms)
            if with_errors:
                put_array_len(out, len(p.record_errors), flex)
                for batch_index, message in p.record_errors:
                    out += I32.pack(batch_index)
                    put_string(out, message, flex)
                    if flex:
                        out.append(0)
                put_string(out, p.error_message, flex)
            if flex:
                out.append(0)  # no tagged fields: current_leader is not named (clients ask Metadata)
        if flex:
            out.append(0)
    out += I32.pack(resp.throttle_time_ms)
    if flex:
        out.append(0)  # no node_endpoints
    _HEAD.pack_into(out, 0, len(out) - 4, correlation_id)
    return memoryview(out)


__all__ = [
    "RECORD_ERRORS_FROM",
    "ProducePartitionData",
    "ProducePartitionResponse",
    "ProduceRequestData",
    "ProduceResponseData",
    "ProduceTopicData",
    "ProduceTopicResponse",
    "decode_produce_body",
    "encode_produce_response",
]
