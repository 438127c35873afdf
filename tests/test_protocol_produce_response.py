"""Produce's response encoder against kafka-python's ProduceResponse, byte for byte.

`encode_produce_response` writes the response the produce handler answers with straight into
one buffer (the hot path of one-record requests); kafka-python's schema-generated encoder is the
reference it must equal for every version the broker serves, and kafka-python's client must
parse what it writes.
"""

from __future__ import annotations

import random
import uuid

import pytest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from loglake.broker.protocol import decode_request, encode_response
from loglake.broker.protocol.api_keys import ApiKey
from loglake.broker.protocol.codec import join
from loglake.broker.protocol.errors import ResponseEncodingError
from loglake.broker.protocol.messages import make_response
from loglake.broker.protocol.produce import (
    FLEXIBLE_FROM,
    RECORD_ERRORS_FROM,
    TOPIC_ID_FROM,
    ProducePartitionResponse,
    ProduceResponseData,
    ProduceTopicResponse,
    encode_produce_response,
)
from loglake.broker.protocol.versions import DEFAULT_TABLE
from test_protocol_samples import client_bytes

#: Every Produce version the broker serves (from its version table, the one owner).
_RANGE = DEFAULT_TABLE.get(ApiKey.PRODUCE)
assert _RANGE is not None
SERVED = range(_RANGE.min_version, _RANGE.max_version + 1)


def _random_response(rng: random.Random, version: int) -> ProduceResponseData:
    topics = []
    for t in range(rng.randint(0, 3)):
        parts = []
        for i in range(rng.randint(0, 4)):
            errors = [(rng.randint(0, 9), rng.choice([None, "", "bad record é"])) for _ in range(rng.randint(0, 2))]
            parts.append(
                ProducePartitionResponse(
                    index=rng.randint(0, 2**31 - 1) if i else 0,
                    error_code=rng.choice([0, 3, 87, 7]),
                    base_offset=rng.choice([-1, 0, rng.randint(0, 2**63 - 1)]),
                    log_append_time_ms=rng.choice([-1, 1_790_000_000_000]),
                    log_start_offset=rng.choice([-1, 0, 12345]),
                    record_errors=errors if version >= RECORD_ERRORS_FROM else [],
                    error_message=rng.choice([None, "not durable within timeout_ms"]) if version >= RECORD_ERRORS_FROM else None,
                )
            )
        topics.append(ProduceTopicResponse(f"topic-{t}-{'ü' * t}", parts, uuid.UUID(int=rng.getrandbits(128))))
    return ProduceResponseData(topics, rng.choice([0, 250, 2**31 - 1]))


def _kafka_python(resp: ProduceResponseData, version: int) -> bytes:
    topics = []
    for t in resp.responses:
        parts = []
        for p in t.partition_responses:
            fields: dict[str, object] = {
                "index": p.index,
                "error_code": p.error_code,
                "base_offset": p.base_offset,
                "log_append_time_ms": p.log_append_time_ms,
                "log_start_offset": p.log_start_offset,
            }
            if version >= RECORD_ERRORS_FROM:
                fields["record_errors"] = [
                    {"batch_index": i, "batch_index_error_message": m} for i, m in p.record_errors
                ]
                fields["error_message"] = p.error_message
            parts.append(fields)
        name = {"topic_id": t.topic_id} if version >= TOPIC_ID_FROM else {"name": t.name}
        topics.append({**name, "partition_responses": parts})
    obj = make_response(ApiKey.PRODUCE, version, {"responses": topics, "throttle_time_ms": resp.throttle_time_ms})
    assert isinstance(obj, ProduceResponse) and obj.version == version
    return bytes(obj.encode(version=version))


@pytest.mark.parametrize("version", [*SERVED, TOPIC_ID_FROM])
def test_produce_encoder_matches_kafka_python(version: int) -> None:
    rng = random.Random(version)
    for _ in range(40):
        resp = _random_response(rng, version)
        wire = bytes(encode_produce_response(321, version, resp))
        header = (321).to_bytes(4, "big") + (b"\x00" if version >= FLEXIBLE_FROM else b"")
        body = _kafka_python(resp, version)
        assert wire == (len(header) + len(body)).to_bytes(4, "big") + header + body


@pytest.mark.parametrize("version", SERVED)
def test_kafka_python_client_parses_it(version: int) -> None:
    resp = ProduceResponseData(
        [ProduceTopicResponse("t", [ProducePartitionResponse(2, 0, 41, -1, 0), ProducePartitionResponse(5, 87, record_errors=[(3, "no key")] if version >= RECORD_ERRORS_FROM else [], error_message="compacted" if version >= RECORD_ERRORS_FROM else None)])],
        17,
    )
    proto = KafkaProtocol(client_id="c")
    request = ProduceRequest[version](transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[])
    proto.send_request(request, correlation_id=9)
    ((corr, got),) = proto.receive_bytes(bytes(encode_produce_response(9, version, resp)))
    assert corr == 9 and got.throttle_time_ms == 17
    (topic,) = got.responses
    assert topic.name == "t"
    ok, refused = topic.partition_responses
    assert (ok.index, ok.error_code, ok.base_offset) == (2, 0, 41)
    if version >= 5:  # log_start_offset
        assert ok.log_start_offset == 0
    assert (refused.index, refused.error_code) == (5, 87)
    if version >= RECORD_ERRORS_FROM:
        assert [(e.batch_index, e.batch_index_error_message) for e in refused.record_errors] == [(3, "no key")]
        assert refused.error_message == "compacted"


def test_encode_response_dispatches_produce_and_refuses_it_elsewhere() -> None:
    version = SERVED[-1]
    request = ProduceRequest[version](transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[])
    d = decode_request(client_bytes(request, correlation_id=5)[4:])
    resp = ProduceResponseData([ProduceTopicResponse("t", [ProducePartitionResponse(0, 0, 7)])])
    assert join(encode_response(d, resp)) == bytes(encode_produce_response(5, version, resp))
    # A mapping still takes kafka-python's path, and encodes the same bytes.
    mapping = {"responses": [{"name": "t", "partition_responses": [{"index": 0, "error_code": 0, "base_offset": 7}]}]}
    assert join(encode_response(d, mapping)) == join(encode_response(d, resp))
    fetch = decode_request(client_bytes(ProduceRequest[3](transactional_id=None, acks=1, timeout_ms=1, topic_data=[]), correlation_id=1)[4:])
    object.__setattr__(fetch, "api_key", ApiKey.FETCH)
    with pytest.raises(ResponseEncodingError):
        encode_response(fetch, resp)
    with pytest.raises(ValueError):
        encode_produce_response(1, 2, resp)
