"""DescribeClientQuotas (48) and AlterClientQuotas (49): Kafka's client quota administration (KIP-546).

Semantics, checks and messages are those of Kafka's controller (ClientQuotaControlManager and
ClientQuotasImage.describe); loglake.broker.security.quotas has the rules and enforcement.

* Describe: the filter's components (entity type, match type 0 exact / 1 default / 2 any, match
  string) select the entities; `strict` leaves out entities that have parts the filter does not
  name. A bad filter is a top-level error (INVALID_REQUEST, or UNSUPPORTED_VERSION for an unknown
  entity or match type) with entries null. Needs DESCRIBE_CONFIGS on the cluster.
* Alter: each entry is checked and applied on its own (an error in one leaves the others), with
  its error code and message: INVALID_REQUEST for an empty or repeated entity part, an unknown
  entity type, an empty name, an unknown key, a value not above 0, a fractional byte rate;
  POLICY_VIOLATION past CLIENT_QUOTA_ENTITIES_MAX entities. `validate_only` checks without
  storing. A removal (`remove` true) of a key that is not set is no error. Needs ALTER_CONFIGS on
  the cluster; otherwise every entry is CLUSTER_AUTHORIZATION_FAILED.

Changes are durable (a ``client_quota`` metadata record) before the answer and take effect on
open connections at once.
"""

from __future__ import annotations

import asyncio
import logging

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.handlers.errors import NONE
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.security.authorized import AclOperation, cluster_allowed
from loglake.broker.security.quotas import (
    CLIENT_QUOTA_ENTITIES_MAX,
    QuotaRequestError,
    entity_text,
    parse_filter,
    validate_entity,
    validate_value,
)
from loglake.kafka_errors import ErrorCode
from loglake.logsafe import RateLimitedLog
from loglake.meta.quotas import EntityKey

log = logging.getLogger("loglake.broker.quotas")
#: A client can send refused alterations at will: one line per peer address and window.
_limited = RateLimitedLog(log)
#: How much of a refusal the log line shows (an unknown key may be long).
ERROR_SHOWN_CHARS = 300

#: One alteration at a time, so two requests that change the same entity do not lose each other's keys.
QUOTA_ALTER_LOCK = asyncio.Lock()


def _entity_out(key: EntityKey) -> list[dict[str, object]]:
    return [{"entity_type": t, "entity_name": n} for t, n in key]


async def describe_client_quotas(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    response: dict[str, object] = {
        "throttle_time_ms": 0,
        "error_code": NONE,
        "error_message": None,
        "entries": None,
    }
    if not cluster_allowed(ctx, conn, AclOperation.DESCRIBE_CONFIGS):
        response["error_code"] = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        response["error_message"] = "Cluster authorization failed."
        return response
    try:
        quota_filter = parse_filter(
            [(c.entity_type, int(c.match_type), c.match) for c in body.components], bool(body.strict)
        )
    except QuotaRequestError as exc:
        response["error_code"], response["error_message"] = exc.code, str(exc)
        return response
    response["entries"] = [
        {"entity": _entity_out(key), "values": [{"key": k, "value": v} for k, v in sorted(values.items())]}
        for key, values in sorted(ctx.quotas.configs.items(), key=lambda kv: entity_text(kv[0]))
        if quota_filter.matches(key)
    ]
    return response


async def alter_client_quotas(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    validate_only = bool(body.validate_only)
    allowed = cluster_allowed(ctx, conn, AclOperation.ALTER_CONFIGS)
    out: list[dict[str, object]] = []
    async with QUOTA_ALTER_LOCK:
        for entry in body.entries:
            parts = [(e.entity_type, e.entity_name) for e in entry.entity]
            result: dict[str, object] = {
                "error_code": NONE,
                "error_message": None,
                "entity": [{"entity_type": t, "entity_name": n} for t, n in parts],
            }
            out.append(result)
            if not allowed:
                result["error_code"], result["error_message"] = (
                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    "Cluster authorization failed.",
                )
                continue
            try:
                key, values = _altered(ctx, parts, entry.ops)
                if validate_only or values == ctx.quotas.configs.get(key, {}):
                    continue
                await ctx.off_loop(ctx.quota_store.save, key, values)
            except QuotaRequestError as exc:
                result["error_code"], result["error_message"] = exc.code, str(exc)
                _limited.info(
                    ("refused", conn.peer_host),
                    "AlterClientQuotas from %s refused: %s",
                    conn.peer,
                    str(exc)[:ERROR_SHOWN_CHARS],
                )
                continue
            ctx.quotas.set(key, values)
            log.info("client quotas of %s now %s", entity_text(key), values or "none")
    return {"throttle_time_ms": 0, "entries": out}


def _altered(
    ctx: BrokerContext, parts: list[tuple[str, str | None]], ops: list[KafkaStruct]
) -> tuple[EntityKey, dict[str, float]]:
    """The entity and its quotas after `ops`; QuotaRequestError if Kafka would refuse them."""
    key = validate_entity(parts)
    values = dict(ctx.quotas.configs.get(key, {}))
    for op in ops:
        if op.remove:
            values.pop(op.key, None)
        else:
            values[op.key] = validate_value(op.key, float(op.value))
    if values and key not in ctx.quotas.configs and len(ctx.quotas.configs) >= CLIENT_QUOTA_ENTITIES_MAX:
        raise QuotaRequestError(
            f"at most {CLIENT_QUOTA_ENTITIES_MAX} client quota entities (CLIENT_QUOTA_ENTITIES_MAX); "
            "remove the quotas of an entity that no longer needs them",
            ErrorCode.POLICY_VIOLATION,
        )
    return key, values


HANDLERS: dict[int, Handler] = {
    ApiKey.DESCRIBE_CLIENT_QUOTAS: describe_client_quotas,
    ApiKey.ALTER_CLIENT_QUOTAS: alter_client_quotas,
}
