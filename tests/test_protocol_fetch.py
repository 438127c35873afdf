"""The zero-copy Fetch response encoder against kafka-python's encoder and client parser."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.parser import KafkaProtocol

from loglake.broker.protocol import (
    AbortedTransaction,
    EpochEndOffset,
    FetchPartition,
    FetchResponseData,
    FetchTopic,
    FileSlice,
    LeaderIdAndEpoch,
    NodeEndpoint,
    OutBuffer,
    SnapshotId,
    decode_request,
    encode_fetch_response,
    encode_response,
    join,
)
from loglake.engine.types import FileRange
from test_protocol_samples import client_bytes

VERSIONS = range(4, 19)


def _resolve(buffers: list[OutBuffer]) -> bytes:
    """Join the buffers, reading file ranges like sendfile would."""
    out = bytearray()
    for b in buffers:
        if isinstance(b, bytes | bytearray | memoryview):
            out += b
        else:
            with open(b.path, "rb") as f:
                f.seek(b.position)
                data = f.read(b.length)
            assert len(data) == b.length
            out += data
    return bytes(out)


@pytest.fixture
def log_file(tmp_path: Path) -> tuple[str, bytes]:
    data = random.Random(1).randbytes(200_000)
    path = tmp_path / "segment.log"
    path.write_bytes(data)
    return str(path), data


def _response(version: int, file: tuple[str, bytes]) -> tuple[FetchResponseData, list[bytes]]:
    """A response with partitions whose records are bytes, memoryviews, file slices, mixes, empty, null."""
    path, content = file
    rng = random.Random(version)
    blob = rng.randbytes(50_000)
    chunks_per_partition = [
        [blob[:100]],  # small: inlined
        [memoryview(blob)[100:30_100]],  # large view: passed through
        [FileSlice(path, 1_000, 20_000)],
        [FileRange(path, 50_000, 5, 5), blob[200:5_000], FileSlice(path, 0, 0), memoryview(blob)[:2_000]],
        [],
        None,
    ]
    partitions = []
    expected: list[bytes] = []
    for i, chunks in enumerate(chunks_per_partition):
        partitions.append(
            FetchPartition(
                partition_index=i,
                error_code=i % 2,
                high_watermark=1000 + i,
                last_stable_offset=900 + i,
                log_start_offset=10 * i,
                aborted_transactions=None if i % 3 == 0 else [AbortedTransaction(7, 8), AbortedTransaction(9, 10)][: i % 3],
                preferred_read_replica=-1 if i % 2 else 2,
                records=chunks,
                diverging_epoch=EpochEndOffset(3, 300) if i == 1 else None,
                current_leader=LeaderIdAndEpoch(1, 5) if i in (1, 2) else None,
                snapshot_id=SnapshotId(400, 4) if i == 3 else None,
            )
        )
        if chunks is None:
            expected.append(b"")
        else:
            parts = []
            for c in chunks:
                if isinstance(c, bytes | memoryview):
                    parts.append(bytes(c))
                else:
                    parts.append(content[c.position : c.position + c.length])
            expected.append(b"".join(parts))
    topics = [
        FetchTopic(topic="orders", topic_id=uuid.UUID(int=5), partitions=partitions[:4]),
        FetchTopic(topic="é-events", topic_id=uuid.UUID(int=6), partitions=partitions[4:]),
        FetchTopic(topic="empty", topic_id=None, partitions=[]),
    ]
    resp = FetchResponseData(
        responses=topics,
        throttle_time_ms=3,
        error_code=0,
        session_id=77,
        node_endpoints=[NodeEndpoint(1, "host-1", 9092, "rack-a"), NodeEndpoint(2, "h2", 9093, None)],
    )
    return resp, expected


def _kafka_python_equivalent(resp: FetchResponseData, version: int, records: list[bytes]) -> FetchResponse:
    T = FetchResponse.FetchableTopicResponse
    P = T.PartitionData
    it = iter(records)
    topics = []
    for t in resp.responses:
        parts = []
        for p in t.partitions:
            rec = next(it)
            kw = {
                "partition_index": p.partition_index,
                "error_code": p.error_code,
                "high_watermark": p.high_watermark,
                "last_stable_offset": p.last_stable_offset,
                "log_start_offset": p.log_start_offset,
                "aborted_transactions": None
                if p.aborted_transactions is None
                else [P.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset) for a in p.aborted_transactions],
                "preferred_read_replica": p.preferred_read_replica,
                "records": None if p.records is None else rec,
            }
            if version >= 12:
                if p.diverging_epoch is not None:
                    kw["diverging_epoch"] = P.EpochEndOffset(epoch=p.diverging_epoch.epoch, end_offset=p.diverging_epoch.end_offset)
                if p.current_leader is not None:
                    kw["current_leader"] = P.LeaderIdAndEpoch(leader_id=p.current_leader.leader_id, leader_epoch=p.current_leader.leader_epoch)
                if p.snapshot_id is not None:
                    kw["snapshot_id"] = P.SnapshotId(end_offset=p.snapshot_id.end_offset, epoch=p.snapshot_id.epoch)
            parts.append(P(**kw))
        topics.append(T(topic=t.topic, topic_id=t.topic_id, partitions=parts))
    kw2 = {}
    if version >= 16:
        kw2["node_endpoints"] = [
            FetchResponse.NodeEndpoint(node_id=e.node_id, host=e.host, port=e.port, rack=e.rack) for e in resp.node_endpoints
        ]
    return FetchResponse[version](
        throttle_time_ms=resp.throttle_time_ms, error_code=resp.error_code, session_id=resp.session_id, responses=topics, **kw2
    )


def _request(version: int) -> FetchRequest:
    return FetchRequest[version](max_wait_ms=100, min_bytes=1, max_bytes=1 << 20, topics=[], forgotten_topics_data=[])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("inline_threshold", [0, 1024, 1 << 30])
def test_fetch_encoder_matches_kafka_python(version: int, inline_threshold: int, log_file: tuple[str, bytes]) -> None:
    resp, records = _response(version, log_file)
    buffers = encode_fetch_response(123, version, resp, inline_threshold=inline_threshold)
    wire = _resolve(buffers)
    # Byte-identical to kafka-python encoding the same response with the records copied in.
    want = _kafka_python_equivalent(resp, version, records)
    body = bytes(want.encode(version=version))
    header = (123).to_bytes(4, "big") + (b"\x00" if version >= 12 else b"")
    assert wire == (len(header) + len(body)).to_bytes(4, "big") + header + body
    # And kafka-python's client parses it.
    proto = KafkaProtocol(client_id="c")
    proto.send_request(_request(version), correlation_id=123)
    ((corr, got),) = proto.receive_bytes(wire)
    assert corr == 123
    got_records = [p.records for t in got.responses for p in t.partitions]
    assert [r or b"" for r in got_records] == records
    assert got.session_id == (77 if version >= 7 else 0)


def test_large_chunks_are_passed_through(log_file: tuple[str, bytes]) -> None:
    resp, _ = _response(12, log_file)
    buffers = encode_fetch_response(1, 12, resp)
    ids = {id(b) for b in buffers}
    p = resp.responses[0].partitions
    assert p[1].records is not None and id(p[1].records[0]) in ids  # the 30 KB memoryview itself
    assert p[2].records is not None and id(p[2].records[0]) in ids  # the FileSlice itself
    assert p[0].records is not None and id(p[0].records[0]) not in ids  # 100 bytes: copied inline
    assert not any(isinstance(b, FileSlice) and b.length == 0 for b in buffers)


def test_encode_response_dispatches_fetch(log_file: tuple[str, bytes]) -> None:
    d = decode_request(client_bytes(_request(16), correlation_id=9)[4:])
    resp, _ = _response(16, log_file)
    assert _resolve(encode_response(d, resp)) == _resolve(encode_fetch_response(9, 16, resp))
    # kafka-python FetchResponse objects still take the generic path.
    got = encode_response(d, FetchResponse[16](responses=[]))
    assert join(got)[4:9] == b"\x00\x00\x00\x09\x00"


def test_fetch_version_bounds() -> None:
    with pytest.raises(ValueError):
        encode_fetch_response(1, 3, FetchResponseData())
    with pytest.raises(ValueError):
        encode_fetch_response(1, 19, FetchResponseData())
