"""KIP-848 wire messages (loglake's own schemas): encode and decode with known field values."""

from __future__ import annotations

import uuid

from loglake.broker.protocol import make_response
from loglake.broker.protocol.kip848 import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)
from loglake.broker.protocol.messages import is_flexible, schema_versions

TID = uuid.UUID(hex="0123456789abcdef0123456789abcdef")


def test_versions_and_flexibility() -> None:
    assert schema_versions(68) == (0, 1) and schema_versions(69) == (0, 1)
    assert all(is_flexible(k, v) for k in (68, 69) for v in (0, 1))


def test_heartbeat_request_round_trip() -> None:
    for version in (0, 1):
        req = ConsumerGroupHeartbeatRequest[version](
            group_id="g", member_id="m", member_epoch=3, instance_id=None, rack_id="r1",
            rebalance_timeout_ms=300000, subscribed_topic_names=["a", "b"], server_assignor="range",
            topic_partitions=[ConsumerGroupHeartbeatRequest.TopicPartitions(topic_id=TID, partitions=[0, 2])],
            **({"subscribed_topic_regex": "^x.*"} if version >= 1 else {}),
        )
        got = ConsumerGroupHeartbeatRequest.decode(req.encode(version=version), version=version)
        assert (got.group_id, got.member_id, got.member_epoch, got.instance_id, got.rack_id) == ("g", "m", 3, None, "r1")
        assert list(got.subscribed_topic_names) == ["a", "b"] and got.server_assignor == "range"
        assert [(t.topic_id, list(t.partitions)) for t in got.topic_partitions] == [(TID, [0, 2])]
        assert getattr(got, "subscribed_topic_regex", None) == ("^x.*" if version >= 1 else None)


def test_heartbeat_request_nulls_mean_unchanged() -> None:
    req = ConsumerGroupHeartbeatRequest[1](group_id="g", member_id="m", member_epoch=5)
    got = ConsumerGroupHeartbeatRequest.decode(req.encode(version=1), version=1)
    assert got.subscribed_topic_names is None and got.topic_partitions is None and got.subscribed_topic_regex is None
    assert got.rebalance_timeout_ms == -1 and got.server_assignor is None


def test_heartbeat_response_with_and_without_assignment() -> None:
    for assignment in (None, {"topic_partitions": [{"topic_id": TID, "partitions": [1]}]}):
        resp = make_response(68, 1, error_code=0, member_id="m", member_epoch=4, heartbeat_interval_ms=5000,
                             assignment=assignment)
        got = ConsumerGroupHeartbeatResponse.decode(resp.encode(version=1), version=1)
        assert (got.member_id, got.member_epoch, got.heartbeat_interval_ms) == ("m", 4, 5000)
        if assignment is None:
            assert got.assignment is None
        else:
            assert [(t.topic_id, list(t.partitions)) for t in got.assignment.topic_partitions] == [(TID, [1])]


def test_describe_round_trip() -> None:
    req = ConsumerGroupDescribeRequest[1](group_ids=["g1", "g2"], include_authorized_operations=True)
    got = ConsumerGroupDescribeRequest.decode(req.encode(version=1), version=1)
    assert list(got.group_ids) == ["g1", "g2"] and got.include_authorized_operations
    topics = {"topic_partitions": [{"topic_id": TID, "topic_name": "t", "partitions": [0, 1]}]}
    member = {"member_id": "m", "instance_id": "i", "member_epoch": 2, "client_id": "c", "client_host": "/h",
              "subscribed_topic_names": ["t"], "assignment": topics, "target_assignment": topics, "member_type": 1}
    for version in (0, 1):
        resp = make_response(69, version, groups=[{"group_id": "g1", "group_state": "Stable", "group_epoch": 2,
                                                   "assignment_epoch": 2, "assignor_name": "uniform",
                                                   "members": [member]}])
        out = ConsumerGroupDescribeResponse.decode(resp.encode(version=version), version=version)
        (g,) = out.groups
        (m,) = g.members
        assert (g.group_state, g.group_epoch, g.assignor_name, g.authorized_operations) == (
            "Stable", 2, "uniform", -2147483648)
        assert [(t.topic_name, list(t.partitions)) for t in m.assignment.topic_partitions] == [("t", [0, 1])]
        assert m.member_type == (1 if version >= 1 else -1)
