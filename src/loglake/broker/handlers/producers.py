"""DescribeProducers (61, KIP-664): each partition's idempotent producers.

Per producer: id, epoch, the last sequence appended, the max timestamp of its newest batch still
held (-1 once retention or compaction removed it), coordinator_epoch -1 and
current_txn_start_offset the first offset of its open transaction here (-1: none). Unknown topics or partitions:
UNKNOWN_TOPIC_OR_PARTITION with a message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from loglake.broker.handlers.errors import (
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    error_code,
)
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.security.authorized import TOPIC, AclOperation, denied
from loglake.errors import LoglakeError, UnknownTopicError


def _partition(engine: Any, topic: str, index: int, refused: set[str]) -> dict[str, Any]:
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


def _describe(engine: Any, topics: Any, refused: set[str]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "partitions": [_partition(engine, t.name, p, refused) for p in t.partition_indexes]}
        for t in topics
    ]


async def describe_producers(ctx: Any, conn: Any, req: DecodedRequest) -> dict[str, Any]:
    refused = denied(ctx, conn, AclOperation.READ, TOPIC, (t.name for t in req.body.topics))
    return {"throttle_time_ms": 0, "topics": await ctx.off_loop(_describe, ctx.engine, req.body.topics, refused)}


HANDLERS: dict[int, Callable[[Any, Any, DecodedRequest], Awaitable[Any]]] = {ApiKey.DESCRIBE_PRODUCERS: describe_producers}
