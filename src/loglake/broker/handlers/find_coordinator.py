"""FindCoordinator (10): the coordinator of groups (key type 0) and transactional ids (key type
1) is the broker the cluster view names (loglake.engine.view): a single node coordinates every
key; in cluster mode the live broker rendezvous hashing over the live node ids picks, so every
broker answers the same and a key moves when its broker dies. v4+ asks for several keys at once
(KIP-699). Another key type (2, share groups, is not served) gets INVALID_REQUEST. No live broker
known (this one is registering again): COORDINATOR_NOT_AVAILABLE, which clients retry."""

from __future__ import annotations

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext
from loglake.broker.handlers.errors import (
    COORDINATOR_NOT_AVAILABLE,
    GROUP_AUTHORIZATION_FAILED,
    INVALID_REQUEST,
    NONE,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)
from loglake.broker.protocol import DecodedRequest
from loglake.broker.security.authorized import GROUP, TRANSACTIONAL_ID, AclOperation, denied
from loglake.engine.view import endpoint_of

GROUP_KEY, TRANSACTION_KEY = 0, 1


async def handle(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    key_type = getattr(body, "key_type", GROUP_KEY) if req.api_version >= 1 else GROUP_KEY
    served = key_type in (GROUP_KEY, TRANSACTION_KEY)
    keys = list(body.coordinator_keys) if req.api_version >= 4 else [body.key]
    refused: set[str] = set()
    if served:  # DESCRIBE on the group or transactional id (Kafka's KafkaApis)
        refused = denied(ctx, conn, AclOperation.DESCRIBE, GROUP if key_type == GROUP_KEY else TRANSACTIONAL_ID, keys)
    denial = GROUP_AUTHORIZATION_FAILED if key_type == GROUP_KEY else TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    def entry(key: str) -> dict[str, object]:
        if key in refused:
            return {"node_id": -1, "host": "", "port": -1, "error_code": denial, "error_message": None}
        if not served:
            return {"node_id": -1, "host": "", "port": -1, "error_code": INVALID_REQUEST,
                    "error_message": f"key type {key_type} is not served"}
        return _entry(ctx, conn, key)

    if req.api_version >= 4:
        return {"throttle_time_ms": 0, "coordinators": [{"key": key, **entry(key)} for key in keys]}
    return {"throttle_time_ms": 0, **entry(keys[0])}


def _entry(ctx: BrokerContext, conn: Conn, key: str) -> dict[str, object]:
    chosen = ctx.view.coordinator_of(key)
    if chosen == ctx.node_id:
        host, port = conn.security.advertised  # this broker: at the request's listener
        return {"node_id": chosen, "host": host, "port": port, "error_code": NONE, "error_message": None}
    info = next((b for b in ctx.view.brokers() if b.node_id == chosen), None)
    where = endpoint_of(info, conn.security.listener.protocol) if info else None
    if where is None:
        return {"node_id": -1, "host": "", "port": -1, "error_code": COORDINATOR_NOT_AVAILABLE,
                "error_message": "no live broker coordinates this group yet"}
    return {"node_id": chosen, "host": where[0], "port": where[1], "error_code": NONE, "error_message": None}
