"""OffsetForLeaderEpoch (23): where a leader epoch ends, from each partition's epoch history.

Consumers (replica_id -1; v2's request has no replica id) ask it after the leader epoch in
Metadata moved, with the epoch of the last record they read: an end offset below their position
means the log was truncated under them (KIP-320). Per partition, by Kafka's rule
(`loglake.engine.epochs.end_offset_for`): the current epoch ends at the log end offset, an older
one at the start offset of the next epoch, answered with the largest epoch <= the one asked;
an epoch newer than the current one is (-1, -1). `current_leader_epoch` fences as in Fetch:
FENCED_LEADER_EPOCH when older than the partition's, UNKNOWN_LEADER_EPOCH when newer, -1 skips
the check. Unknown topics and partitions: UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.handlers.errors import (
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    epoch_check,
    error_code,
)
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.security.authorized import TOPIC, AclOperation, denied
from loglake.errors import LoglakeError, UnknownTopicError


def _partition(ctx: BrokerContext, topic: str, part: KafkaStruct, refused: set[str]) -> dict[str, object]:
    out: dict[str, object] = {"partition": part.partition, "error_code": NONE, "leader_epoch": -1, "end_offset": -1}
    if topic in refused:
        out["error_code"] = TOPIC_AUTHORIZATION_FAILED
        return out
    engine = ctx.engine
    try:
        current = engine.leader_epoch(topic, part.partition)
        fenced = epoch_check(current, part.current_leader_epoch)
        if fenced != NONE:
            out["error_code"] = fenced
            return out
        out["leader_epoch"], out["end_offset"] = engine.epoch_end_offset(topic, part.partition, part.leader_epoch)
    except UnknownTopicError:
        out["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
    except LoglakeError as exc:
        out["error_code"] = error_code(exc)
    return out


async def offset_for_leader_epoch(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    refused = denied(ctx, conn, AclOperation.DESCRIBE, TOPIC, (t.topic for t in req.body.topics))
    topics = [
        {"topic": t.topic, "partitions": [_partition(ctx, t.topic, p, refused) for p in t.partitions]}
        for t in req.body.topics
    ]
    return {"throttle_time_ms": 0, "topics": topics}


HANDLERS: dict[int, Handler] = {
    ApiKey.OFFSET_FOR_LEADER_EPOCH: offset_for_leader_epoch,
}
