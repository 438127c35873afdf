"""DescribeProducers (61, KIP-664): each partition's idempotent producers.

Per producer: id, epoch, the last sequence appended, the max timestamp of its newest batch still
held (-1 once retention or compaction removed it), coordinator_epoch -1 and
current_txn_start_offset the first offset of its open transaction here (-1: none). Unknown topics or partitions:
UNKNOWN_TOPIC_OR_PARTITION with a message.
"""

from __future__ import annotations

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.handlers.errors import (
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    error_code,
)
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.security.authorized import TOPIC, AclOperation, denied
from loglake.engine import Engine
from loglake.errors import LoglakeError, UnknownTopicError


def _partition(engine: Engine, topic: str, index: int, refused: set[str]) -> dict[str, object]:
    if topic in refused:
        return {"partition_index": index, "error_code": TOPIC_AUTHORIZATION_FAILED, "error_message": "Authorization failed."}
    try:
        states = engine.producers(topic, index)
    except UnknownTopicError as exc:
        return {"partition_index": index, "error_code": UNKNOWN_TOPIC_OR_PARTITION, "error_message": str(exc)}
    except LoglakeError as exc:
        return {"partition_index": index, "error_code": error_code(exc), "error_message": str(exc)}
    return {
        "partition_index": index,
        "error_code": NONE,
        "error_message": None,
        "active_producers": [
            {
                "producer_id": s.producer_id,
                "producer_epoch": s.producer_epoch,
                "last_sequence": s.last_sequence,
                "last_timestamp": s.last_timestamp,
                "coordinator_epoch": 0 if s.txn_start_offset >= 0 else -1,
                "current_txn_start_offset": s.txn_start_offset,
            }
            for s in states
        ],
    }


def _describe(engine: Engine, topics: list[KafkaStruct], refused: set[str]) -> list[dict[str, object]]:
    return [
        {"name": t.name, "partitions": [_partition(engine, t.name, p, refused) for p in t.partition_indexes]}
        for t in topics
    ]


async def describe_producers(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    refused = denied(ctx, conn, AclOperation.READ, TOPIC, (t.name for t in req.body.topics))
    return {"throttle_time_ms": 0, "topics": await ctx.off_loop(_describe, ctx.engine, req.body.topics, refused)}


HANDLERS: dict[int, Handler] = {ApiKey.DESCRIBE_PRODUCERS: describe_producers}
