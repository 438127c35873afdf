"""KIP-848 message classes (ConsumerGroupHeartbeat, api key 68; ConsumerGroupDescribe, 69).

kafka-python 3.0.12 has no schemas for them; `schemas/` holds ours, loaded the way kafka-python
loads its own (by class name).
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from loglake.broker.protocol import schemas


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=schemas):
    pass


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=schemas):
    pass


class ConsumerGroupDescribeRequest(ApiMessage, load_json=schemas):
    pass


class ConsumerGroupDescribeResponse(ApiMessage, load_json=schemas):
    pass


__all__ = [
    "ConsumerGroupDescribeRequest",
    "ConsumerGroupDescribeResponse",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse",
]
