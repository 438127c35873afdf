"""KIP-848 message classes (ConsumerGroupHeartbeat, api key 68; ConsumerGroupDescribe, 69).

kafka-python 3.0.12 has no schemas for them; `schemas/` holds ours. The classes are made as
kafka-python makes its own (``class X(ApiMessage, load_json=package)``: the metaclass loads
``X.json`` from that package), through the metaclass call so the untyped base stays out of mypy.
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from loglake.broker.protocol import schemas
from loglake.broker.protocol.kafka_types import KafkaClass


def _message(name: str) -> KafkaClass:
    return type(ApiMessage)(name, (ApiMessage,), {"__module__": __name__, "__qualname__": name}, load_json=schemas)


ConsumerGroupHeartbeatRequest: KafkaClass = _message("ConsumerGroupHeartbeatRequest")
ConsumerGroupHeartbeatResponse: KafkaClass = _message("ConsumerGroupHeartbeatResponse")
ConsumerGroupDescribeRequest: KafkaClass = _message("ConsumerGroupDescribeRequest")
ConsumerGroupDescribeResponse: KafkaClass = _message("ConsumerGroupDescribeResponse")

__all__ = [
    "ConsumerGroupDescribeRequest",
    "ConsumerGroupDescribeResponse",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse",
]
