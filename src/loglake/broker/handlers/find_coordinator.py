"""FindCoordinator (10): this broker coordinates every group (key type 0) and every transactional
id (key type 1); v4+ asks for several keys at once (KIP-699). Another key type (2, share groups,
is not served) gets INVALID_REQUEST."""

from __future__ import annotations

from typing import Any

from loglake.broker.authorized import GROUP, TRANSACTIONAL_ID, AclOperation, denied
from loglake.broker.context import advertised_endpoint
from loglake.broker.handlers.errors import (
    GROUP_AUTHORIZATION_FAILED,
    INVALID_REQUEST,
    NONE,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)
from loglake.broker.protocol import DecodedRequest

GROUP_KEY, TRANSACTION_KEY = 0, 1


async def handle(ctx: Any, conn: Any, req: DecodedRequest) -> Any:
    body = req.body
    key_type = getattr(body, "key_type", GROUP_KEY) if req.api_version >= 1 else GROUP_KEY
    served = key_type in (GROUP_KEY, TRANSACTION_KEY)
    code = NONE if served else INVALID_REQUEST
    message = None if served else f"key type {key_type} is not served"
    node, host, port = (ctx.node_id, *advertised_endpoint(ctx, conn)) if served else (-1, "", -1)
    keys = list(body.coordinator_keys) if req.api_version >= 4 else [body.key]
    refused: set[str] = set()
    if served:  # DESCRIBE on the group or transactional id (Kafka's KafkaApis)
        refused = denied(ctx, conn, AclOperation.DESCRIBE, GROUP if key_type == GROUP_KEY else TRANSACTIONAL_ID, keys)
    denial = GROUP_AUTHORIZATION_FAILED if key_type == GROUP_KEY else TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    def entry(key: str) -> dict[str, Any]:
        if key in refused:
            return {"node_id": -1, "host": "", "port": -1, "error_code": denial, "error_message": None}
        return {"node_id": node, "host": host, "port": port, "error_code": code, "error_message": message}

    if req.api_version >= 4:
        return {"throttle_time_ms": 0, "coordinators": [{"key": key, **entry(key)} for key in keys]}
    return {"throttle_time_ms": 0, **entry(keys[0])}
