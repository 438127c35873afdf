"""InitProducerId (22): a durable producer id for idempotent producers; with a transactional id,
the transaction coordinator's id and epoch (a new instance fences the old one and aborts its open
transaction: loglake.broker.txn)."""

from __future__ import annotations

import logging

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext
from loglake.broker.handlers.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    COORDINATOR_NOT_AVAILABLE,
    NONE,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    error_code,
)
from loglake.broker.protocol import DecodedRequest
from loglake.broker.security.authorized import TRANSACTIONAL_ID, AclOperation, check, idempotent_write_allowed
from loglake.engine.partition_log import FEATURE_CODES, Feature
from loglake.errors import LoglakeError
from loglake.logsafe import RateLimitedLog

log = logging.getLogger(__name__)
#: Per peer address: a fleet of transactional producers (or one that restarts) is not a flood.
_limited = RateLimitedLog(log)


async def handle(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    if body.transactional_id and not check(ctx, conn, AclOperation.WRITE, TRANSACTIONAL_ID, body.transactional_id):
        return {"throttle_time_ms": 0, "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "producer_id": -1, "producer_epoch": -1}
    if not body.transactional_id and not idempotent_write_allowed(ctx, conn):
        return {"throttle_time_ms": 0, "error_code": CLUSTER_AUTHORIZATION_FAILED, "producer_id": -1, "producer_epoch": -1}
    if body.transactional_id and not ctx.engine.supports(Feature.TRANSACTIONS):
        # Refused up front (the engine's refusal table, loglake.engine.partition_log) with a code
        # clients treat as fatal and name (librdkafka: "Broker: Unsupported version").
        _limited.warning(("txn_refused", conn.peer_host),
                         "InitProducerId for %r refused: %s", body.transactional_id,
                         ctx.engine.log.refused[Feature.TRANSACTIONS])
        return {"throttle_time_ms": 0, "error_code": FEATURE_CODES[Feature.TRANSACTIONS], "producer_id": -1, "producer_epoch": -1}
    if body.transactional_id:
        try:
            code, pid, epoch = await ctx.txn.init_producer_id(
                body.transactional_id,
                body.transaction_timeout_ms,
                getattr(body, "producer_id", -1),
                getattr(body, "producer_epoch", -1),
                req.api_version,
            )
        except LoglakeError as exc:
            _limited.warning(("init_txn", conn.peer_host), "InitProducerId for %r failed: %s", body.transactional_id, exc)
            code, pid, epoch = COORDINATOR_NOT_AVAILABLE, -1, -1
        return {"throttle_time_ms": 0, "error_code": code, "producer_id": pid, "producer_epoch": epoch}
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
