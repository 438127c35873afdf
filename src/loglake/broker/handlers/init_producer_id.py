"""InitProducerId (22): a durable producer id for idempotent producers. Transactions are not
supported: a transactional id gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients report
as a fatal error instead of retrying forever."""

from __future__ import annotations

import logging
from typing import Any

from loglake.broker.handlers.errors import NONE, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error_code
from loglake.broker.protocol import DecodedRequest
from loglake.errors import LoglakeError
from loglake.logsafe import RateLimitedLog

log = logging.getLogger(__name__)
#: Per peer address: a fleet of transactional producers (or one that restarts) is not a flood.
_limited = RateLimitedLog(log)


async def handle(ctx: Any, conn: Any, req: DecodedRequest) -> Any:
    body = req.body
    if body.transactional_id:
        _limited.warning(
            ("transactional", getattr(conn, "peer_host", conn.peer)),
            "%s asked for transactional id %r: transactions are not supported", conn.peer, body.transactional_id,
        )
        return {"throttle_time_ms": 0, "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "producer_id": -1, "producer_epoch": -1}
    existing = getattr(body, "producer_id", -1)
    epoch = getattr(body, "producer_epoch", -1)
    try:
        if existing is not None and existing >= 0 and epoch is not None and epoch >= 0:
            # KIP-360: an idempotent producer bumps its epoch to reset sequences after an error.
            return {"throttle_time_ms": 0, "error_code": NONE, "producer_id": existing, "producer_epoch": epoch + 1}
        pid = await ctx.off_loop(ctx.engine.allocate_producer_id)
    except LoglakeError as exc:
        return {"throttle_time_ms": 0, "error_code": error_code(exc), "producer_id": -1, "producer_epoch": -1}
    return {"throttle_time_ms": 0, "error_code": NONE, "producer_id": pid, "producer_epoch": 0}
