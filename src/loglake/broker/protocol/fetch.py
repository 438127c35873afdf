"""Zero-copy Fetch response encoder (Fetch v4-v18, hand-written: it is the hot path).

The response is produced as a list of buffers: small bytearrays holding the protocol fields,
with each partition's record chunks spliced in as given (bytes/memoryview, or file ranges the
server sends with ``sendfile``). Record data is never copied or decoded, except that bytes-like
chunks shorter than ``inline_threshold`` are copied into the surrounding field buffer, which is
cheaper than an extra buffer in the writev/sendfile sequence.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from struct import Struct
from typing import NamedTuple, Protocol, runtime_checkable

from loglake.broker.protocol._wire import I32, put_array_len, put_string, uuid_bytes, uvarint
from loglake.records.batch import BASE_AND_LENGTH, batch_size

FLEXIBLE_FROM = 12
TOPIC_ID_FROM = 13
NODE_ENDPOINTS_FROM = 16
MIN_VERSION = 4
MAX_VERSION = 18


@runtime_checkable
class FileRangeLike(Protocol):
    """Bytes of a local file; `loglake.engine.types.FileRange` is one."""

    @property
    def path(self) -> str: ...

    @property
    def position(self) -> int: ...

    @property
    def length(self) -> int: ...

    @property
    def first_batch(self) -> int:
        """Bytes of the first batch in the range (the size rule needs it; no file is read)."""
        ...


class FileSlice(NamedTuple):
    """A minimal `FileRangeLike`."""

    path: str
    position: int
    length: int
    first_batch: int = 0


#: What a partition's records may be made of.
Chunk = bytes | bytearray | memoryview | FileRangeLike
#: What the encoders emit: write the items in order (sendfile the file ranges).
OutBuffer = bytes | bytearray | memoryview | FileRangeLike


def chunk_len(chunk: Chunk) -> int:
    if isinstance(chunk, memoryview):
        return chunk.nbytes
    if isinstance(chunk, bytes | bytearray):
        return len(chunk)
    return chunk.length


def buffers_len(buffers: Sequence[OutBuffer]) -> int:
    return sum(chunk_len(b) for b in buffers)


class AbortedTransaction(NamedTuple):
    producer_id: int
    first_offset: int


class EpochEndOffset(NamedTuple):
    epoch: int = -1
    end_offset: int = -1


class LeaderIdAndEpoch(NamedTuple):
    leader_id: int = -1
    leader_epoch: int = -1


class SnapshotId(NamedTuple):
    end_offset: int = -1
    epoch: int = -1


class NodeEndpoint(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(slots=True)
class FetchPartition:
    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    #: None encodes as a null array (what Kafka sends for READ_UNCOMMITTED).
    aborted_transactions: Sequence[AbortedTransaction] | None = None
    preferred_read_replica: int = -1
    #: Record batches as chunks, concatenated on the wire; None encodes a null records field.
    records: Sequence[Chunk] | None = ()
    # Tagged fields (v12+), written only when set.
    diverging_epoch: EpochEndOffset | None = None
    current_leader: LeaderIdAndEpoch | None = None
    snapshot_id: SnapshotId | None = None


@dataclass(slots=True)
class FetchTopic:
    #: Topic name (v4-v12).
    topic: str | None = None
    #: Topic id (v13+).
    topic_id: uuid.UUID | None = None
    partitions: list[FetchPartition] = field(default_factory=list)


@dataclass(slots=True)
class FetchResponseData:
    responses: list[FetchTopic] = field(default_factory=list)
    throttle_time_ms: int = 0
    error_code: int = 0
    session_id: int = 0
    #: Tagged (v16+): endpoints of leaders named in NOT_LEADER_OR_FOLLOWER errors.
    node_endpoints: list[NodeEndpoint] = field(default_factory=list)


# partition_index, error_code, high_watermark, last_stable_offset[, log_start_offset (v5+)]
_P4 = Struct(">ihqq")
_P5 = Struct(">ihqqq")
_QQ = Struct(">qq")
_IQ = Struct(">iq")
_II = Struct(">ii")
_QI = Struct(">qi")
_HI = Struct(">hi")
#: The head of a record batch: base offset, batch length (the bytes after these 12).
BATCH_HEAD = BASE_AND_LENGTH
#: The whole size of the record batch whose first BATCH_HEAD.size bytes are `head`.
batch_bytes = batch_size


def fetch_limit_violations(
    resp: FetchResponseData,
    max_bytes: int,
    partition_limits: Sequence[Sequence[int]],
    first_batch: Callable[[Chunk], int],
) -> list[tuple[int, int, str]]:
    """Where `resp` breaks Kafka's Fetch size rule (KIP-74), as (topic index, partition index, why).

    The rule: partitions are filled in request order; the response holds at most `max_bytes` of
    records and each partition at most its `partition_max_bytes` (``partition_limits`` parallel to
    ``resp.responses``), except that the first partition with records may return one whole batch
    however large, so that a consumer always progresses. `first_batch(chunk)` tells the size of the
    batch a chunk starts with (only asked when a partition oversteps).
    """
    bad: list[tuple[int, int, str]] = []
    total = 0
    seen_data = False
    for t_i, topic in enumerate(resp.responses):
        for p_i, p in enumerate(topic.partitions):
            records = p.records or ()
            size = sum(chunk_len(c) for c in records)
            if size == 0:
                continue
            limit = min(partition_limits[t_i][p_i], max(max_bytes - total, 0))
            if size > limit:
                if seen_data:
                    bad.append((t_i, p_i, f"{size} record bytes where {limit} fit"))
                elif size != first_batch(records[0]):
                    bad.append((t_i, p_i, f"{size} record bytes over the {limit} limit, more than its first batch"))
            seen_data = True
            total += size
    return bad


def _put_tag(out: bytearray, tag: int, payload: bytes) -> None:
    out += uvarint(tag)
    out += uvarint(len(payload))
    out += payload


def encode_fetch_response(
    correlation_id: int,
    version: int,
    resp: FetchResponseData,
    *,
    inline_threshold: int = 1024,
) -> list[OutBuffer]:
    """The framed response (size prefix and response header included) as buffers to write in order."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Fetch response version {version} outside {MIN_VERSION}..{MAX_VERSION}")
    flex = version >= FLEXIBLE_FROM
    out: list[OutBuffer] = []
    head = bytearray(8)
    I32.pack_into(head, 4, correlation_id)
    if flex:
        head.append(0)  # response header v1: empty tagged fields
    head += I32.pack(resp.throttle_time_ms)
    if version >= 7:
        head += _HI.pack(resp.error_code, resp.session_id)
    put_array_len(head, len(resp.responses), flex)
    null_array = b"\x00" if flex else b"\xff\xff\xff\xff"
    fixed = _P5 if version >= 5 else _P4
    with_replica = version >= 11
    total = 0  # bytes in buffers already moved to `out`
    for topic in resp.responses:
        if version >= TOPIC_ID_FROM:
            head += uuid_bytes(topic.topic_id)
        else:
            put_string(head, topic.topic, flex)
        put_array_len(head, len(topic.partitions), flex)
        for p in topic.partitions:
            if version >= 5:
                head += fixed.pack(
                    p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset
                )
            else:
                head += fixed.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset)
            aborted = p.aborted_transactions
            if aborted is None:
                head += null_array
            else:
                put_array_len(head, len(aborted), flex)
                for a in aborted:
                    head += _QQ.pack(a[0], a[1])
                    if flex:
                        head.append(0)
            if with_replica:
                head += I32.pack(p.preferred_read_replica)
            records = p.records
            if records is None:
                head += null_array
            else:
                sizes = [chunk_len(c) for c in records]
                size = sum(sizes)
                head += uvarint(size + 1) if flex else I32.pack(size)
                for c, n in zip(records, sizes, strict=True):
                    if n == 0:
                        continue
                    if n < inline_threshold and isinstance(c, bytes | bytearray | memoryview):
                        head += c
                        continue
                    out.append(head)
                    out.append(c)
                    total += len(head) + n
                    head = bytearray()
            if flex:
                if p.diverging_epoch is None and p.current_leader is None and p.snapshot_id is None:
                    head.append(0)
                else:
                    tags = []
                    if p.diverging_epoch is not None:
                        tags.append((0, _IQ.pack(*p.diverging_epoch) + b"\x00"))
                    if p.current_leader is not None:
                        tags.append((1, _II.pack(*p.current_leader) + b"\x00"))
                    if p.snapshot_id is not None:
                        tags.append((2, _QI.pack(*p.snapshot_id) + b"\x00"))
                    head += uvarint(len(tags))
                    for tag, payload in tags:
                        _put_tag(head, tag, payload)
        if flex:
            head.append(0)
    if flex:
        if version >= NODE_ENDPOINTS_FROM and resp.node_endpoints:
            eps = bytearray()
            put_array_len(eps, len(resp.node_endpoints), True)
            for ep in resp.node_endpoints:
                eps += I32.pack(ep.node_id)
                put_string(eps, ep.host, True)
                eps += I32.pack(ep.port)
                put_string(eps, ep.rack, True)
                eps.append(0)
            head.append(1)
            _put_tag(head, 0, bytes(eps))
        else:
            head.append(0)
    out.append(head)
    total += len(head)
    first = out[0]
    assert isinstance(first, bytearray)
    I32.pack_into(first, 0, total - 4)
    return out


__all__ = [
    "BATCH_HEAD",
    "AbortedTransaction",
    "Chunk",
    "EpochEndOffset",
    "FetchPartition",
    "FetchResponseData",
    "FetchTopic",
    "FileRangeLike",
    "FileSlice",
    "LeaderIdAndEpoch",
    "NodeEndpoint",
    "OutBuffer",
    "SnapshotId",
    "batch_bytes",
    "buffers_len",
    "chunk_len",
    "encode_fetch_response",
    "fetch_limit_violations",
]
