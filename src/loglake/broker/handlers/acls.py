"""CreateAcls (30), DescribeAcls (29) and DeleteAcls (31): the ACL bindings, as Kafka serves them.

Create and Delete need ALTER on the cluster, Describe DESCRIBE on it (else
CLUSTER_AUTHORIZATION_FAILED). A creation or filter that is not valid (an UNKNOWN or ANY where a
binding needs a value, a principal without ``Type:``, a CLUSTER binding not named
``kafka-cluster``) gets INVALID_REQUEST with a message; the rest of the request goes on. Each
Create or Delete request that changes something writes one durable `acls` metadata record
(loglake.meta.acls) before it answers, then updates the authorizer, so a binding acknowledged
is a binding enforced, after a restart too. Creations and deletions are serialized (`_LOCK`),
so the bound `ACL_BINDINGS_MAX` holds.
"""

from __future__ import annotations

import logging

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.handlers.admin_common import _LoopLock
from loglake.broker.handlers.errors import CLUSTER_AUTHORIZATION_FAILED, INVALID_REQUEST, NONE, error_code
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.security.authorized import AclOperation, cluster_allowed
from loglake.broker.security.authorizer import AclFilter, Binding, check_binding
from loglake.errors import LoglakeError
from loglake.kafka_errors import ErrorCode
from loglake.meta.acls import ACL_BINDINGS_MAX

log = logging.getLogger("loglake.broker.acls")

POLICY_VIOLATION: int = ErrorCode.POLICY_VIOLATION
#: Most filters one DeleteAcls request may carry; each is matched against every binding, so this
#: bounds one request's work (filters past it answer INVALID_REQUEST). Kafka has no such limit;
#: a tool deletes a handful at a time.
DELETE_FILTERS_MAX = 1_000
_LOCK = _LoopLock()
_DENIED = "Cluster authorization failed."


def _filter(f: KafkaStruct) -> AclFilter:
    return AclFilter(
        int(f.resource_type_filter), f.resource_name_filter, int(f.pattern_type_filter), f.principal_filter,
        f.host_filter, int(f.operation), int(f.permission_type),
    )


async def _store(ctx: BrokerContext, created: list[Binding], deleted: list[Binding]) -> None:
    await ctx.off_loop(ctx.acl_store.save, [b.row() for b in created], [b.row() for b in deleted])


async def create_acls(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    creations = list(req.body.creations)
    if not cluster_allowed(ctx, conn, AclOperation.ALTER):
        return {"throttle_time_ms": 0,
                "results": [{"error_code": CLUSTER_AUTHORIZATION_FAILED, "error_message": _DENIED} for _ in creations]}
    authz = ctx.authorizer
    results: list[dict[str, object]] = []
    async with _LOCK.get():
        new: list[Binding] = []
        for c in creations:
            b = Binding(int(c.resource_type), c.resource_name, int(c.resource_pattern_type), c.principal, c.host,
                        int(c.operation), int(c.permission_type))
            problem = check_binding(b)
            if problem is not None:
                results.append({"error_code": INVALID_REQUEST, "error_message": problem})
                continue
            if b not in authz and b not in new:
                count = len(authz) + len(new)
                if count >= ACL_BINDINGS_MAX:
                    results.append({"error_code": POLICY_VIOLATION,
                                    "error_message": f"at most {ACL_BINDINGS_MAX} ACL bindings (ACL_BINDINGS_MAX); delete unused ones first"})
                    continue
                new.append(b)
            results.append({"error_code": NONE, "error_message": None})
        if new:
            try:
                await _store(ctx, new, [])
            except LoglakeError as exc:
                code = error_code(exc)
                return {"throttle_time_ms": 0,
                        "results": [r if r["error_code"] else {"error_code": code, "error_message": str(exc)} for r in results]}
            authz.add(new)
            log.info("ACLs created: %s", "; ".join(b.describe() for b in new))
    return {"throttle_time_ms": 0, "results": results}


def _grouped(bindings: list[Binding]) -> list[dict[str, object]]:
    """DescribeAcls' resources: bindings grouped by resource pattern, in creation order."""
    out: dict[tuple[int, str, int], list[dict[str, object]]] = {}
    for b in bindings:
        out.setdefault((b.resource_type, b.name, b.pattern_type), []).append(
            {"principal": b.principal, "host": b.host, "operation": b.operation, "permission_type": b.permission}
        )
    return [{"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls} for (t, n, p), acls in out.items()]


async def describe_acls(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    if not cluster_allowed(ctx, conn, AclOperation.DESCRIBE):
        return {"throttle_time_ms": 0, "error_code": CLUSTER_AUTHORIZATION_FAILED, "error_message": _DENIED, "resources": []}
    f = _filter(req.body)
    problem = f.problem()
    if problem is not None:
        return {"throttle_time_ms": 0, "error_code": INVALID_REQUEST, "error_message": problem, "resources": []}
    bindings = ctx.authorizer.bindings()
    return {"throttle_time_ms": 0, "error_code": NONE, "error_message": None,
            "resources": _grouped([b for b in bindings if f.matches(b)])}


def _matching_acl(b: Binding, code: int = NONE, message: str | None = None) -> dict[str, object]:
    return {"error_code": code, "error_message": message, "resource_type": b.resource_type, "resource_name": b.name,
            "pattern_type": b.pattern_type, "principal": b.principal, "host": b.host, "operation": b.operation,
            "permission_type": b.permission}


async def delete_acls(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    filters = list(req.body.filters)
    if not cluster_allowed(ctx, conn, AclOperation.ALTER):
        return {"throttle_time_ms": 0, "filter_results": [
            {"error_code": CLUSTER_AUTHORIZATION_FAILED, "error_message": _DENIED, "matching_acls": []} for _ in filters]}
    authz = ctx.authorizer
    results: list[dict[str, object]] = []
    async with _LOCK.get():
        bindings = authz.bindings()
        gone: dict[Binding, None] = {}
        matched: list[list[Binding] | str] = []
        for i, raw in enumerate(filters):
            f = _filter(raw)
            problem = f.problem() if i < DELETE_FILTERS_MAX else f"more than {DELETE_FILTERS_MAX} filters in one request"
            if problem is not None:
                matched.append(problem)
                continue
            hits = [b for b in bindings if f.matches(b)]
            gone.update(dict.fromkeys(hits))
            matched.append(hits)
        code, message = NONE, None
        if gone:
            try:
                await _store(ctx, [], list(gone))
            except LoglakeError as exc:
                code, message = error_code(exc), str(exc)
            else:
                authz.remove(gone)
                log.info("ACLs deleted: %s", "; ".join(b.describe() for b in gone))
        for outcome in matched:
            if isinstance(outcome, str):
                results.append({"error_code": INVALID_REQUEST, "error_message": outcome, "matching_acls": []})
            else:
                hits = outcome
                results.append({"error_code": code, "error_message": message,
                                "matching_acls": [_matching_acl(b) for b in hits] if code == NONE else []})
    return {"throttle_time_ms": 0, "filter_results": results}


HANDLERS: dict[int, Handler] = {
    ApiKey.DESCRIBE_ACLS: describe_acls,
    ApiKey.CREATE_ACLS: create_acls,
    ApiKey.DELETE_ACLS: delete_acls,
}
