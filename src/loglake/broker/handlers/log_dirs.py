"""DescribeLogDirs (35): the data directory (hot) and, when configured, the cold store (its URL)
as two log directories, with each partition's bytes in each.

In the data directory: hot sealed segments plus unsealed data (in the WAL and memory); in the cold
store: the segments relocated there. `offset_lag` is the log end minus the high watermark on the
data directory, 0 in the cold store. `total_bytes`/`usable_bytes` (v4+) come from statvfs of the
data directory and are -1 for the cold store (an object store has no volume size). `topics` null
lists every partition; partitions that do not exist are left out, as Kafka does. The request-level
error is always NONE (no authorization); a data directory whose volume cannot be read (statvfs
fails) answers KAFKA_STORAGE_ERROR for it, as Kafka does for an offline log directory.
"""

from __future__ import annotations

import logging
import os

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.handlers.errors import CLUSTER_AUTHORIZATION_FAILED, KAFKA_STORAGE_ERROR, NONE
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.security.authorized import AclOperation, cluster_allowed
from loglake.engine import Engine
from loglake.engine.partition_log import TierBytes
from loglake.errors import LoglakeError

log = logging.getLogger(__name__)


def _wanted(engine: Engine, topics: list[KafkaStruct] | None) -> list[tuple[str, list[int]]]:
    if topics is None:
        return [(t.name, list(range(t.partitions))) for t in engine.topics()]
    out = []
    for t in topics:
        if not engine.has_topic(t.topic):
            continue
        count = engine.topic(t.topic).partitions
        out.append((t.topic, [p for p in dict.fromkeys(t.partitions) if 0 <= p < count]))
    return out


def _volume(path: str) -> tuple[int, int] | None:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        log.warning("DescribeLogDirs: statvfs of %s failed: %s", path, exc)
        return None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def _describe(ctx: BrokerContext, topics: list[KafkaStruct] | None) -> list[dict[str, object]]:
    engine = ctx.engine
    sizes: dict[str, list[tuple[int, TierBytes]]] = {}
    for name, partitions in _wanted(engine, topics):
        rows = sizes.setdefault(name, [])
        for p in partitions:
            try:
                rows.append((p, engine.tier_bytes(name, p)))
            except LoglakeError:
                continue  # deleted meanwhile
    volume = _volume(engine.data_dir)
    hot_error = NONE if volume is not None else KAFKA_STORAGE_ERROR
    total, usable = volume if volume is not None else (-1, -1)
    dirs: list[dict[str, object]] = [
        {
            "error_code": hot_error,
            "log_dir": engine.data_dir,
            "topics": [
                {
                    "name": name,
                    "partitions": [
                        {"partition_index": p, "partition_size": b.hot, "offset_lag": b.offset_lag, "is_future_key": False}
                        for p, b in rows
                    ],
                }
                for name, rows in sizes.items()
            ],
            "total_bytes": total,
            "usable_bytes": usable,
        }
    ]
    cold = engine.cold_url
    if cold is not None:
        dirs.append(
            {
                "error_code": NONE,
                "log_dir": cold,
                "topics": [
                    {
                        "name": name,
                        "partitions": [
                            {"partition_index": p, "partition_size": b.cold, "offset_lag": 0, "is_future_key": False}
                            for p, b in rows
                        ],
                    }
                    for name, rows in sizes.items()
                ],
                "total_bytes": -1,
                "usable_bytes": -1,
            }
        )
    return dirs


async def describe_log_dirs(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    if not cluster_allowed(ctx, conn, AclOperation.DESCRIBE):  # Kafka: v3+ say so, older answer nothing
        return {"throttle_time_ms": 0, "error_code": CLUSTER_AUTHORIZATION_FAILED, "results": []}
    results = await ctx.off_loop(_describe, ctx, req.body.topics)
    return {"throttle_time_ms": 0, "error_code": NONE, "results": results}


HANDLERS: dict[int, Handler] = {ApiKey.DESCRIBE_LOG_DIRS: describe_log_dirs}
