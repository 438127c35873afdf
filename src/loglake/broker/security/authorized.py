"""The seam between the handlers and the authorizer: who asks, may they, and the audit line.

Every handler asks through these functions (never the `Authorizer` directly), so that the
principal and host come from the connection (`conn.security`), denials are written to the audit
log in one place. The per-API rules (which operation on which resource, which
error code) are in `loglake.broker.security.acl_rules`.

Audit: every request refused in whole or in part writes one line on the logger
``loglake.audit`` (principal, host, API, operation, resource type and names). A handler checks a
request's resources of one kind in one call (`denied`), so a Produce to 100 partitions of three
forbidden topics is one line naming the three topics. `CURRENT_API` (set per request by the
server) names the API in the line.

Operations are Kafka's AclOperation codes. They go to the codec as sets of bit numbers: the
codec (kafka-python's bitfield type) packs a set into the 32-bit field with bit n for code n,
and None into Kafka's "not requested" value, -2147483648 (bit 31 alone).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterable

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext
from loglake.broker.security.authorizer import CLUSTER_NAME, AclOperation, ResourceType, resource_type_name

__all__ = [
    "CLUSTER",
    "CURRENT_API",
    "GROUP",
    "TOPIC",
    "TRANSACTIONAL_ID",
    "AclOperation",
    "allowed",
    "audit",
    "audit_denied",
    "check",
    "cluster_allowed",
    "cluster_operations",
    "denied",
    "group_operations",
    "idempotent_write_allowed",
    "operation_bits",
    "operations",
    "topic_operations",
    "who",
]

audit_log = logging.getLogger("loglake.audit")

#: The name of the API whose request is being handled (set by the server in each request's task).
CURRENT_API: contextvars.ContextVar[str] = contextvars.ContextVar("loglake_current_api", default="?")
#: Most resource names one audit line lists; the rest are counted ("and 12 more").
AUDIT_NAMES_MAX = 20
#: Longest resource name written to an audit line; longer ones are cut (names come from clients).
AUDIT_NAME_CHARS_MAX = 256


_OP = AclOperation
#: What can be done to a topic (Kafka's operations valid for the TOPIC resource).
TOPIC_OPERATIONS = frozenset({_OP.READ, _OP.WRITE, _OP.CREATE, _OP.DELETE, _OP.ALTER, _OP.DESCRIBE,
                              _OP.DESCRIBE_CONFIGS, _OP.ALTER_CONFIGS})
#: What can be done to the cluster (Kafka's operations valid for the CLUSTER resource).
CLUSTER_OPERATIONS = frozenset({_OP.CREATE, _OP.ALTER, _OP.DESCRIBE, _OP.CLUSTER_ACTION, _OP.DESCRIBE_CONFIGS,
                                _OP.ALTER_CONFIGS, _OP.IDEMPOTENT_WRITE})
#: What can be done to a group (Kafka's operations valid for the GROUP resource).
GROUP_OPERATIONS = frozenset({_OP.READ, _OP.DESCRIBE, _OP.DELETE, _OP.DESCRIBE_CONFIGS, _OP.ALTER_CONFIGS})

#: The resource types handlers name, as plain ints (loglake.broker.security.authorizer.ResourceType).
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = (int(t) for t in (ResourceType.TOPIC, ResourceType.GROUP,
                                                            ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID))


def who(conn: Conn) -> tuple[str, str]:
    """(principal, host) of the connection."""
    return conn.security.principal, conn.security.peer_host


def allowed(ctx: BrokerContext, conn: Conn, operation: int, resource_type: int, name: str) -> bool:
    """Whether the connection's principal may perform `operation` on the resource (no audit line)."""
    principal, host = who(conn)
    return ctx.authorizer.authorize(principal, host, operation, resource_type, name)


def denied(ctx: BrokerContext, conn: Conn, operation: int, resource_type: int, names: Iterable[str]) -> set[str]:
    """The names of `names` the principal may not `operation`; one audit line when any."""
    authz = ctx.authorizer
    principal, host = who(conn)
    refused: set[str] = set()
    decided: set[str] = set()
    for name in names:
        if name in decided:
            continue
        decided.add(name)
        if not authz.authorize(principal, host, operation, resource_type, name):
            refused.add(name)
    if refused:
        audit(conn, operation, resource_type, sorted(refused))
    return refused


def check(ctx: BrokerContext, conn: Conn, operation: int, resource_type: int, name: str) -> bool:
    """`allowed`, with an audit line when not."""
    return not denied(ctx, conn, operation, resource_type, (name,))


def cluster_allowed(ctx: BrokerContext, conn: Conn, operation: AclOperation) -> bool:
    """Whether the connection's principal may perform `operation` on the cluster resource.

    The one call every cluster-level API (ACL, SCRAM credential and quota administration) makes
    before acting; it answers CLUSTER_AUTHORIZATION_FAILED when this is False. A denial is
    written to the audit log.
    """
    return check(ctx, conn, int(operation), CLUSTER, CLUSTER_NAME)


def idempotent_write_allowed(ctx: BrokerContext, conn: Conn) -> bool:
    """Kafka 3+ (KIP-679): an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE
    on some topic. Audited when refused."""
    authz = ctx.authorizer
    principal, host = who(conn)
    if authz.authorize(principal, host, _OP.IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME):
        return True
    if authz.authorize_any(principal, host, _OP.WRITE, TOPIC):
        return True
    audit(conn, _OP.IDEMPOTENT_WRITE, CLUSTER, [CLUSTER_NAME])
    return False


def audit(conn: Conn, operation: int, resource_type: int, names: list[str]) -> None:
    principal, host = who(conn)
    audit_denied(principal, host, CURRENT_API.get(), operation, resource_type, names)


def audit_denied(principal: str, host: str, api: str, operation: int, resource_type: int, names: list[str]) -> None:
    """The audit line of a refusal (`api`: what was asked; the schema registry's requests too)."""
    shown = [n if len(n) <= AUDIT_NAME_CHARS_MAX else n[:AUDIT_NAME_CHARS_MAX] + "..." for n in names[:AUDIT_NAMES_MAX]]
    more = f" and {len(names) - AUDIT_NAMES_MAX} more" if len(names) > AUDIT_NAMES_MAX else ""
    try:
        op = AclOperation(operation).name
    except ValueError:
        op = str(operation)
    audit_log.warning(
        "DENIED principal=%s host=%s api=%s operation=%s resource_type=%s resources=%s%s",
        principal, host, api, op, resource_type_name(resource_type),
        ",".join(repr(n) for n in shown), more,
    )


def operations(ctx: BrokerContext, conn: Conn, resource_type: int, name: str, valid: Iterable[int]) -> set[int]:
    """The operations of `valid` the principal may perform on the resource (no audit lines)."""
    return {int(op) for op in valid if allowed(ctx, conn, int(op), resource_type, name)}


def topic_operations(ctx: BrokerContext, conn: Conn, topic: str) -> set[int]:
    """The operations on `topic` the caller may perform (Metadata's topic_authorized_operations)."""
    return operations(ctx, conn, TOPIC, topic, TOPIC_OPERATIONS)


def cluster_operations(ctx: BrokerContext, conn: Conn) -> set[int]:
    """The operations on the cluster the caller may perform (cluster_authorized_operations)."""
    return operations(ctx, conn, CLUSTER, CLUSTER_NAME, CLUSTER_OPERATIONS)


def operation_bits(ops: set[int]) -> int:
    """`ops` as a signed 32-bit bitfield, for schemas (loglake's own) that type the field int32."""
    value = sum(1 << op for op in ops)
    return value - (1 << 32) if value >= 1 << 31 else value


def group_operations(ctx: BrokerContext, conn: Conn, group: str) -> set[int]:
    """The operations on `group` the caller may perform (DescribeGroups' authorized_operations)."""
    return operations(ctx, conn, GROUP, group, GROUP_OPERATIONS)
