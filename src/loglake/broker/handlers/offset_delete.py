"""OffsetDelete (47): a thin translation to `GroupCoordinator.delete_offsets`
(loglake.broker.groups.offset_delete has the rules).

As Kafka's KafkaApis: partitions of unknown topics answer UNKNOWN_TOPIC_OR_PARTITION and are not
passed on; a group-level error (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, COORDINATOR_NOT_AVAILABLE)
is the top-level error code with no topics.
"""

from __future__ import annotations

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.handlers.errors import (
    GROUP_AUTHORIZATION_FAILED,
    GROUP_ID_NOT_FOUND,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    coordinator_for,
)
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.security.authorized import GROUP, TOPIC, AclOperation, check, denied
from loglake.errors import UnknownTopicError


def _exists(ctx: BrokerContext, topic: str, partition: int) -> bool:
    try:
        ctx.engine.leader_epoch(topic, partition)
    except UnknownTopicError:
        return False
    return True


async def offset_delete(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    if not check(ctx, conn, AclOperation.DELETE, GROUP, body.group_id):
        return {"error_code": GROUP_AUTHORIZATION_FAILED, "throttle_time_ms": 0, "topics": []}
    coordinator = coordinator_for(ctx, body.group_id)
    if isinstance(coordinator, int):
        return {"error_code": coordinator, "throttle_time_ms": 0, "topics": []}
    if ctx.share.known(body.group_id):  # one group namespace: Kafka's ShareGroup.validateOffsetDelete
        return {"error_code": GROUP_ID_NOT_FOUND, "throttle_time_ms": 0, "topics": []}
    codes: dict[tuple[str, int], int] = {}
    wanted: list[tuple[str, int]] = []
    refused = denied(ctx, conn, AclOperation.READ, TOPIC, (t.name for t in body.topics))
    for topic in body.topics:
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if topic.name in refused:
                codes[tp] = TOPIC_AUTHORIZATION_FAILED
            elif _exists(ctx, *tp):
                wanted.append(tp)
            else:
                codes[tp] = UNKNOWN_TOPIC_OR_PARTITION
    group_error, results = await coordinator.delete_offsets(body.group_id, wanted)
    if group_error != NONE:
        return {"error_code": group_error, "throttle_time_ms": 0, "topics": []}
    for topic, partition, code in results:
        codes[(topic, partition)] = code
    topics: dict[str, list[dict[str, int]]] = {}
    for (topic, partition), code in codes.items():
        topics.setdefault(topic, []).append({"partition_index": partition, "error_code": code})
    return {
        "error_code": NONE,
        "throttle_time_ms": 0,
        "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()],
    }


HANDLERS: dict[int, Handler] = {ApiKey.OFFSET_DELETE: offset_delete}
