"""FindCoordinator (10): this broker coordinates every group (and would every transaction)."""

from __future__ import annotations

from typing import Any

from loglake.broker.handlers.errors import NONE
from loglake.broker.protocol import DecodedRequest


async def handle(ctx: Any, conn: Any, req: DecodedRequest) -> Any:
    body = req.body
    if req.api_version >= 4:
        return {
            "throttle_time_ms": 0,
            "coordinators": [
                {
                    "key": key,
                    "node_id": ctx.node_id,
                    "host": ctx.advertised_host,
                    "port": ctx.advertised_port,
                    "error_code": NONE,
                    "error_message": None,
                }
                for key in body.coordinator_keys
            ],
        }
    return {
        "throttle_time_ms": 0,
        "error_code": NONE,
        "error_message": None,
        "node_id": ctx.node_id,
        "host": ctx.advertised_host,
        "port": ctx.advertised_port,
    }
