"""FindCoordinator (10): this broker coordinates every group (key type 0) and every transactional
id (key type 1); v4+ asks for several keys at once (KIP-699). Another key type (2, share groups,
is not served) gets INVALID_REQUEST."""

from __future__ import annotations

from typing import Any

from loglake.broker.context import advertised_endpoint
from loglake.broker.handlers.errors import INVALID_REQUEST, NONE
from loglake.broker.protocol import DecodedRequest

GROUP_KEY, TRANSACTION_KEY = 0, 1


async def handle(ctx: Any, conn: Any, req: DecodedRequest) -> Any:
    body = req.body
    key_type = getattr(body, "key_type", GROUP_KEY) if req.api_version >= 1 else GROUP_KEY
    served = key_type in (GROUP_KEY, TRANSACTION_KEY)
    code = NONE if served else INVALID_REQUEST
    message = None if served else f"key type {key_type} is not served"
    node, host, port = (ctx.node_id, *advertised_endpoint(ctx, conn)) if served else (-1, "", -1)
    if req.api_version >= 4:
        return {
            "throttle_time_ms": 0,
            "coordinators": [
                {"key": key, "node_id": node, "host": host, "port": port, "error_code": code, "error_message": message}
                for key in body.coordinator_keys
            ],
        }
    return {"throttle_time_ms": 0, "error_code": code, "error_message": message, "node_id": node, "host": host, "port": port}
