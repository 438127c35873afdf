"""decode_request / encode_response against kafka-python's client-side encoder and parser."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.producer import ProduceRequest

from loglake.broker.protocol import (
    DEFAULT_TABLE,
    DecodedRequest,
    MalformedRequestError,
    ProduceRequestData,
    ResponseEncodingError,
    UnknownApiError,
    UnsupportedVersionError,
    decode_request,
    encode_response,
    encode_unsupported_api_versions,
    join,
    make_response,
    request_class,
)
from loglake.broker.protocol._wire import uvarint
from loglake.broker.protocol.codec import api_versions_body
from test_protocol_samples import all_versions, client_bytes, sample_request, sample_response

SEEDS = (0, 1, 2)


def _decode_framed(data: bytes) -> DecodedRequest:
    (size,) = struct.unpack_from(">i", data, 0)
    assert size == len(data) - 4
    return decode_request(data[4:])


def _body_bytes(data: bytes) -> bytes:
    """The request body kafka-python sent (after its header), via kafka-python's own header codec."""
    import io

    cls = request_class(struct.unpack_from(">h", data, 4)[0])
    version = struct.unpack_from(">h", data, 6)[0]
    bio = io.BytesIO(data[4:])
    cls.parse_header(bio, version=version)
    return data[4 + bio.tell() :]


def _assert_produce_equal(body: ProduceRequestData, req: Any, version: int) -> None:
    assert body.version == version
    assert (body.transactional_id, body.acks, body.timeout_ms) == (req.transactional_id, req.acks, req.timeout_ms)
    assert len(body.topic_data) == len(req.topic_data)
    for got, want in zip(body.topic_data, req.topic_data, strict=True):
        if version >= 13:
            assert got.topic_id == want.topic_id
        else:
            assert got.name == want.name
        assert len(got.partition_data) == len(want.partition_data)
        for gp, wp in zip(got.partition_data, want.partition_data, strict=True):
            assert gp.index == wp.index
            if wp.records is None:
                assert gp.records is None
            else:
                assert gp.records is not None and bytes(gp.records) == bytes(wp.records)


@pytest.mark.parametrize(("api_key", "version"), all_versions())
def test_requests_decode_as_kafka_python_sent_them(api_key: int, version: int) -> None:
    for seed in SEEDS:
        req = sample_request(api_key, version, seed)
        data = client_bytes(req, correlation_id=1000 + seed, client_id=f"cli-{seed}")
        d = _decode_framed(data)
        assert (d.api_key, d.api_version, d.correlation_id, d.client_id) == (
            api_key,
            version,
            1000 + seed,
            f"cli-{seed}",
        )
        flexible = bool(request_class(api_key).flexible_version_q(version))
        assert d.header_version == (2 if flexible else 1)
        if api_key == 0:
            _assert_produce_equal(d.body, req, version)
            continue
        # Same fields as kafka-python's own decoder, and re-encodes to the bytes that were sent.
        want = request_class(api_key).decode(_body_bytes(data), version=version)
        assert d.body.to_dict() == want.to_dict()
        assert bytes(d.body.encode(version=version)) == bytes(req.encode(version=version))


@pytest.mark.parametrize(("api_key", "version"), all_versions())
def test_responses_parse_in_kafka_python_client(api_key: int, version: int) -> None:
    for seed in SEEDS:
        req = sample_request(api_key, version, seed)
        if api_key == 0:
            req.acks = 1  # acks=0 expects no response
        d = _decode_framed(client_bytes(req, correlation_id=77))
        resp = sample_response(api_key, version, seed)
        if api_key == 18:
            resp.error_code = 0  # kafka-python decodes any error as v0 (KIP-511)
        out = encode_response(d, resp)
        wire = join(out)
        proto = KafkaProtocol(client_id="c")
        proto.send_request(req, correlation_id=77)
        ((corr, got),) = proto.receive_bytes(wire)
        assert corr == 77
        got._header = None  # kafka-python's parser leaves this slot unset (encode() needs it)
        assert bytes(got.encode(version=version)) == bytes(resp.encode(version=version))


def test_response_header_versions() -> None:
    # Flexible Metadata: header v1 (correlation id + empty tagged fields).
    d = _decode_framed(client_bytes(MetadataRequest[12](topics=None), correlation_id=5))
    assert d.response_header_version == 1
    wire = join(encode_response(d, {"cluster_id": "c", "controller_id": 1}))
    assert wire[4:9] == b"\x00\x00\x00\x05\x00"
    # Non-flexible Metadata: header v0.
    d = _decode_framed(client_bytes(MetadataRequest[8](topics=None), correlation_id=6))
    assert d.response_header_version == 0
    # ApiVersions v3 is flexible but its response header is always v0.
    d = _decode_framed(client_bytes(ApiVersionsRequest[3](client_software_name="x", client_software_version="1")))
    assert d.header_version == 2 and d.response_header_version == 0
    wire = join(encode_response(d, api_versions_body(DEFAULT_TABLE, 3)))
    assert struct.unpack_from(">ih", wire, 4) == (1, 0)  # correlation id, then error_code directly


def test_api_versions_response_lists_table() -> None:
    req = ApiVersionsRequest[3](client_software_name="x", client_software_version="1")
    d = _decode_framed(client_bytes(req, correlation_id=3))
    proto = KafkaProtocol(client_id="c")
    proto.send_request(req, correlation_id=3)
    ((_, got),) = proto.receive_bytes(join(encode_response(d, api_versions_body(DEFAULT_TABLE, 3))))
    listed = {k.api_key: (k.min_version, k.max_version) for k in got.api_keys}
    assert listed == {k: (lo, hi) for k, lo, hi in DEFAULT_TABLE.api_versions_entries()}
    assert listed[0] == (0, 12)  # Produce advertised from 0 (KAFKA-18659)


def test_response_from_mapping_and_make_response() -> None:
    d = _decode_framed(client_bytes(MetadataRequest[12](topics=None), correlation_id=9))
    fields = {
        "brokers": [{"node_id": 1, "host": "localhost", "port": 9092, "rack": None}],
        "cluster_id": "lake",
        "controller_id": 1,
        "topics": [
            {
                "name": "orders",
                "partitions": [{"partition_index": 0, "leader_id": 1, "replica_nodes": [1], "isr_nodes": [1]}],
            }
        ],
    }
    a = join(encode_response(d, fields))
    b = join(encode_response(d, make_response(3, 12, fields)))
    assert a == b
    proto = KafkaProtocol(client_id="c")
    proto.send_request(MetadataRequest[12](topics=None), correlation_id=9)
    ((_, got),) = proto.receive_bytes(a)
    assert got.brokers[0].host == "localhost"
    assert got.topics[0].partitions[0].isr_nodes == [1]
    assert got.topics[0].partitions[0].leader_epoch == -1  # schema default


def test_bad_responses_raise_typed_errors() -> None:
    d = _decode_framed(client_bytes(MetadataRequest[12](topics=None)))
    with pytest.raises(ResponseEncodingError):
        make_response(3, 12, no_such_field=1)
    with pytest.raises(ResponseEncodingError):
        encode_response(d, make_response(12, 4))  # a HeartbeatResponse answering Metadata
    with pytest.raises(ResponseEncodingError):
        encode_response(d, {"controller_id": "not an int"})


def test_produce_records_are_views_of_the_frame() -> None:
    P = ProduceRequest.TopicProduceData
    req = ProduceRequest[9](
        acks=-1,
        timeout_ms=1000,
        topic_data=[P(name="t", partition_data=[P.PartitionProduceData(index=i, records=bytes([i]) * 1000) for i in range(3)])],
    )
    frame = client_bytes(req)[4:]
    d = decode_request(frame)
    assert d.expects_response
    for i, p in enumerate(d.body.topic_data[0].partition_data):
        assert isinstance(p.records, memoryview)
        assert p.records.obj is frame  # no copy
        assert bytes(p.records) == bytes([i]) * 1000
    assert d.body.record_bytes == 3000


def test_produce_acks_zero_expects_no_response() -> None:
    req = ProduceRequest[7](acks=0, timeout_ms=1, topic_data=[])
    assert not _decode_framed(client_bytes(req)).expects_response


def _header(api_key: int, version: int, corr: int, client_id: bytes = b"c") -> bytes:
    return struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id


def test_unknown_api_and_unsupported_versions() -> None:
    with pytest.raises(UnknownApiError) as ei:
        decode_request(_header(4, 1, 4))  # LeaderAndIsr: between brokers, never served
    assert (ei.value.api_key, ei.value.correlation_id) == (4, 4)
    with pytest.raises(UnknownApiError):
        decode_request(_header(-3, 0, 4))
    with pytest.raises(UnsupportedVersionError) as eu:
        decode_request(_header(1, 3, 8))  # Fetch v3: removed by KIP-896
    assert (eu.value.api_key, eu.value.api_version, eu.value.correlation_id) == (1, 3, 8)
    # Produce v0-v2 are advertised (KAFKA-18659) but still rejected.
    with pytest.raises(UnsupportedVersionError):
        decode_request(_header(0, 2, 9))
    with pytest.raises(UnsupportedVersionError):
        decode_request(_header(0, 13, 9))  # above our cap


def test_kip511_api_versions_above_max() -> None:
    frame = _header(18, 99, 42) + b"\x00\x00garbage in a future format"
    with pytest.raises(UnsupportedVersionError) as ei:
        decode_request(frame)
    err = ei.value
    assert (err.api_key, err.api_version, err.correlation_id) == (18, 99, 42)
    wire = encode_unsupported_api_versions(err.correlation_id)
    assert struct.unpack_from(">iih", wire) == (len(wire) - 4, 42, 35)
    resp = ApiVersionsResponse.decode(wire[8:], version=0)
    assert resp.error_code == 35
    assert {(k.api_key, k.min_version, k.max_version) for k in resp.api_keys} == set(
        DEFAULT_TABLE.api_versions_entries()
    )


def test_kip511_with_kafka_python_client() -> None:
    """A client whose ApiVersions version we do not support gets a v0 answer it can parse."""
    table = DEFAULT_TABLE.capped({18: 2})
    req = ApiVersionsRequest[3](client_software_name="kafka-python", client_software_version="3")
    data = client_bytes(req, correlation_id=11)
    with pytest.raises(UnsupportedVersionError) as ei:
        decode_request(data[4:], table)
    proto = KafkaProtocol(client_id="c")
    proto.send_request(req, correlation_id=11)
    ((corr, got),) = proto.receive_bytes(encode_unsupported_api_versions(ei.value.correlation_id, table))
    assert corr == 11 and got.error_code == 35
    assert {k.api_key: k.max_version for k in got.api_keys}[18] == 2


def test_malformed_requests() -> None:
    data = client_bytes(MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name="abc")]))[4:]
    with pytest.raises(MalformedRequestError) as ei:
        decode_request(data[:5])
    assert ei.value.correlation_id is None
    # Trailing bytes after a complete body are ignored, as Kafka does (librdkafka#5049).
    assert decode_request(data + b"\x00\x00\x00").body.topics[0].name == "abc"
    for cut in range(8, len(data)):
        with pytest.raises(MalformedRequestError):
            decode_request(data[:cut])
    with pytest.raises(MalformedRequestError):
        decode_request(_header(3, 12, 1, b"\xff\xfe"))  # client id not UTF-8


def test_unknown_tagged_fields_are_kept() -> None:
    data = bytearray(client_bytes(MetadataRequest[12](topics=None))[4:])
    assert data[-1] == 0
    data[-1:] = b"\x01\x07\x02hi"  # one unknown tag 7 of 2 bytes
    d = decode_request(bytes(data))
    assert d.body.unknown_tags == {"_7": b"hi"}


def test_many_tagged_sections_decode_in_linear_time() -> None:
    """kafka-python copies the rest of the frame per non-empty tag section; we must not."""
    n = 40_000
    topic = b"\x00" * 16 + b"\x02t" + b"\x01\x09\x00"  # uuid, name "t", one empty unknown tag
    body = uvarint(n + 1) + topic * n + b"\x00\x00\x00"  # topics, two bools, empty tags
    frame = _header(3, 12, 1) + b"\x00" + body  # header v2: empty tagged fields
    t0 = time.thread_time()  # CPU time: a loaded machine's waits do not count (quadratic is ~30 GB of copies)
    d = decode_request(frame)
    elapsed = time.thread_time() - t0
    assert len(d.body.topics) == n
    assert d.body.topics[-1].unknown_tags == {"_9": b""}
    assert elapsed < 2.0


def test_fetch_request_fields() -> None:
    T = FetchRequest.FetchTopic
    req = FetchRequest[12](
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=1,
        session_id=0,
        session_epoch=-1,
        topics=[T(topic="t", partitions=[T.FetchPartition(partition=0, fetch_offset=42, partition_max_bytes=1024)])],
        forgotten_topics_data=[],
        rack_id="",
    )
    d = _decode_framed(client_bytes(req))
    p = d.body.topics[0].partitions[0]
    assert (d.body.topics[0].topic, p.partition, p.fetch_offset, p.partition_max_bytes) == ("t", 0, 42, 1024)
    assert d.body.max_wait_ms == 500 and d.body.isolation_level == 1
