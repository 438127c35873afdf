"""KIP-932 share-group message classes: ShareGroupHeartbeat (76), ShareGroupDescribe (77),
ShareFetch (78), ShareAcknowledge (79), and the admin APIs DescribeShareGroupOffsets (90),
AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92) at v0 (Kafka 4.1's).

kafka-python 3.0.12 has no schemas for them; `schemas/` holds ours, written from Kafka 4.1's field
lists at the versions Kafka serves as stable (v1: v0 was Kafka 4.0's early access, removed in 4.1;
librdkafka 2.16's share consumer sends v1 of each). Made as `kip848.py` makes its classes.
"""

from __future__ import annotations

from loglake.broker.protocol.kafka_types import KafkaClass
from loglake.broker.protocol.kip848 import _message

ShareGroupHeartbeatRequest: KafkaClass = _message("ShareGroupHeartbeatRequest")
ShareGroupHeartbeatResponse: KafkaClass = _message("ShareGroupHeartbeatResponse")
ShareGroupDescribeRequest: KafkaClass = _message("ShareGroupDescribeRequest")
ShareGroupDescribeResponse: KafkaClass = _message("ShareGroupDescribeResponse")
ShareFetchRequest: KafkaClass = _message("ShareFetchRequest")
ShareFetchResponse: KafkaClass = _message("ShareFetchResponse")
ShareAcknowledgeRequest: KafkaClass = _message("ShareAcknowledgeRequest")
ShareAcknowledgeResponse: KafkaClass = _message("ShareAcknowledgeResponse")
DescribeShareGroupOffsetsRequest: KafkaClass = _message("DescribeShareGroupOffsetsRequest")
DescribeShareGroupOffsetsResponse: KafkaClass = _message("DescribeShareGroupOffsetsResponse")
AlterShareGroupOffsetsRequest: KafkaClass = _message("AlterShareGroupOffsetsRequest")
AlterShareGroupOffsetsResponse: KafkaClass = _message("AlterShareGroupOffsetsResponse")
DeleteShareGroupOffsetsRequest: KafkaClass = _message("DeleteShareGroupOffsetsRequest")
DeleteShareGroupOffsetsResponse: KafkaClass = _message("DeleteShareGroupOffsetsResponse")

__all__ = [
    "AlterShareGroupOffsetsRequest",
    "AlterShareGroupOffsetsResponse",
    "DeleteShareGroupOffsetsRequest",
    "DeleteShareGroupOffsetsResponse",
    "DescribeShareGroupOffsetsRequest",
    "DescribeShareGroupOffsetsResponse",
    "ShareAcknowledgeRequest",
    "ShareAcknowledgeResponse",
    "ShareFetchRequest",
    "ShareFetchResponse",
    "ShareGroupDescribeRequest",
    "ShareGroupDescribeResponse",
    "ShareGroupHeartbeatRequest",
    "ShareGroupHeartbeatResponse",
]
