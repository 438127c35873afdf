"""ListOffsets (2): earliest (-2), latest (-1), max timestamp (-3), or by timestamp.

Latest is the high watermark at read_uncommitted and the last stable offset at read_committed
(isolation_level 1, v2+).
`leader_epoch` is the epoch that wrote the returned offset (for latest: the current epoch), -1
when no offset is found.
"""

from __future__ import annotations

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext
from loglake.broker.handlers.errors import NONE, TOPIC_AUTHORIZATION_FAILED, error_code
from loglake.broker.protocol import DecodedRequest
from loglake.broker.security.authorized import TOPIC, AclOperation, denied
from loglake.errors import LoglakeError

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4  # KIP-405: first offset on local storage
LATEST_TIERED = -5  # KIP-1005: highest offset in tiered storage


def _lookup(ctx: BrokerContext, name: str, partition: int, ts: int, committed: bool = False) -> tuple[int, int]:
    engine = ctx.engine
    info = engine.partition_info(name, partition)
    if ts == LATEST:
        return (info.last_stable_offset if committed else info.high_watermark), -1
    if ts in (EARLIEST, EARLIEST_LOCAL):
        return info.log_start_offset, -1
    if ts == LATEST_TIERED:
        return info.sealed_end - 1, -1
    if ts == MAX_TIMESTAMP:
        found = engine.max_timestamp(name, partition)
    else:
        found = engine.offset_for_timestamp(name, partition, ts)
    return found if found is not None else (-1, -1)


async def handle(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    topics: list[dict[str, object]] = []
    committed = getattr(req.body, "isolation_level", 0) == 1
    refused = denied(ctx, conn, AclOperation.DESCRIBE, TOPIC, (t.name for t in req.body.topics))
    for topic in req.body.topics:
        parts: list[dict[str, object]] = []
        for p in topic.partitions:
            entry: dict[str, object] = {"partition_index": p.partition_index, "leader_epoch": -1}
            if topic.name in refused:
                entry.update(error_code=TOPIC_AUTHORIZATION_FAILED, offset=-1, timestamp=-1)
                parts.append(entry)
                continue
            try:
                if p.timestamp in (LATEST, EARLIEST, EARLIEST_LOCAL, LATEST_TIERED):
                    offset, ts = _lookup(ctx, topic.name, p.partition_index, p.timestamp, committed)
                else:  # may read segments: off the event loop
                    offset, ts = await ctx.off_loop(_lookup, ctx, topic.name, p.partition_index, p.timestamp)
                epoch = ctx.engine.leader_epoch(topic.name, p.partition_index, offset) if offset >= 0 else -1
                entry.update(error_code=NONE, offset=offset, timestamp=ts, leader_epoch=epoch)
            except LoglakeError as exc:
                entry.update(error_code=error_code(exc), offset=-1, timestamp=-1)
            parts.append(entry)
        topics.append({"name": topic.name, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
