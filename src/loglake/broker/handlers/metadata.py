"""Metadata (3): the live brokers and each partition's leader, as the cluster view answers
(loglake.engine.view); auto-create on demand.

A single node is the only broker and leads every partition. In cluster mode the brokers are the
live ones registered in etcd and a partition's leader is the one its last `plog_leader` record
named; a partition whose leader is not live (it died and the others have not taken over yet) is
answered LEADER_NOT_AVAILABLE with leader -1, which clients retry after a metadata refresh. Each
broker is given at its listener of the request's protocol.

A partition's replicas and in-sync replicas are the brokers that can serve it, as the view
reports them for the topic's replication factor (`ClusterView.replicas_of`): this broker alone on a
single node; in a cluster `rf` live brokers, the leader first."""

from __future__ import annotations

import logging
import uuid
from typing import TypedDict

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext
from loglake.broker.handlers.errors import (
    INVALID_TOPIC_EXCEPTION,
    LEADER_NOT_AVAILABLE,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    error_code,
)
from loglake.broker.protocol import DecodedRequest
from loglake.broker.security.authorized import (
    CLUSTER,
    TOPIC,
    AclOperation,
    allowed,
    cluster_operations,
    denied,
    topic_operations,
)
from loglake.broker.security.authorizer import CLUSTER_NAME
from loglake.engine.view import endpoint_of
from loglake.errors import InvalidTopicError, LoglakeError, TopicExistsError, UnknownTopicError

log = logging.getLogger(__name__)


class BrokerEntry(TypedDict):
    """One broker as Metadata lists it (DescribeCluster renames node_id)."""

    node_id: int
    host: str
    port: int
    rack: str | None


def _partition_entry(ctx: BrokerContext, name: str, topic_id: bytes, p: int, factor: int) -> dict[str, object]:
    leader = ctx.view.leader_of(topic_id, p)
    nodes = ctx.view.replicas_of(topic_id, p, factor)
    return {
        "error_code": NONE if leader >= 0 else LEADER_NOT_AVAILABLE,
        "partition_index": p,
        "leader_id": leader,
        "leader_epoch": ctx.engine.leader_epoch(name, p),
        "replica_nodes": nodes,
        "isr_nodes": nodes,
        "offline_replicas": [],
    }


def _topic_entry(ctx: BrokerContext, conn: Conn, name: str, with_operations: bool = False) -> dict[str, object]:
    info = ctx.engine.topic(name)
    topic_id = bytes.fromhex(info.topic_id)
    return {
        # v8+: the caller's operations on the topic when asked; None encodes "not requested"
        "authorized_operations": topic_operations(ctx, conn, name) if with_operations else None,
        "error_code": NONE,
        "name": name,
        "topic_id": uuid.UUID(hex=info.topic_id),
        "is_internal": False,
        "partitions": [
            _partition_entry(ctx, name, topic_id, p, info.replication_factor) for p in range(info.partitions)
        ],
    }


def _entry_if_exists(ctx: BrokerContext, conn: Conn, name: str, with_operations: bool) -> dict[str, object] | None:
    """The topic's entry, or None when it is gone since it was listed."""
    try:
        return _topic_entry(ctx, conn, name, with_operations)
    except UnknownTopicError:
        return None


async def ensure_topic(ctx: BrokerContext, name: str) -> int:
    """Create `name` with the default partition count if auto-creation is on; an error code."""
    if ctx.engine.has_topic(name):
        return NONE
    if not ctx.config.auto_create_topics:
        return UNKNOWN_TOPIC_OR_PARTITION
    try:
        await ctx.off_loop(ctx.engine.create_topic, name, ctx.config.default_partitions, {})
        log.info("auto-created topic %s", name)
    except TopicExistsError:
        pass
    except InvalidTopicError:
        return INVALID_TOPIC_EXCEPTION
    except LoglakeError as exc:
        return error_code(exc)
    return NONE


def _id_to_name(ctx: BrokerContext) -> dict[uuid.UUID, str]:
    return {uuid.UUID(hex=t.topic_id): t.name for t in ctx.engine.topics()}


def brokers_of(ctx: BrokerContext, conn: Conn) -> list[BrokerEntry]:
    """Every live broker, at its listener of the request's protocol (this one: the endpoint the
    listener the request came in on advertises, as Kafka answers)."""
    host, port = conn.security.advertised
    protocol = conn.security.listener.protocol
    out: list[BrokerEntry] = []
    for info in ctx.view.brokers():
        where = (host, port) if info.node_id == ctx.node_id else endpoint_of(info, protocol)
        if where is not None:
            out.append({"node_id": info.node_id, "host": where[0], "port": where[1], "rack": info.rack})
    if not any(b["node_id"] == ctx.node_id for b in out):  # registering again: still answer for itself
        out.append({"node_id": ctx.node_id, "host": host, "port": port, "rack": ctx.config.rack})
    return out


async def handle(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    version = req.api_version
    allow_create = bool(getattr(body, "allow_auto_topic_creation", True))
    topic_ops = version >= 8 and bool(getattr(body, "include_topic_authorized_operations", False))
    cluster_ops = 8 <= version <= 10 and bool(getattr(body, "include_cluster_authorized_operations", False))
    topics: list[dict[str, object]] = []
    if body.topics is None or (version == 0 and not body.topics):
        # Every topic: only those the principal may describe, silently (as Kafka lists them).
        names = [t.name for t in ctx.engine.topics()]
        listed = (_entry_if_exists(ctx, conn, n, topic_ops) for n in names if allowed(ctx, conn, AclOperation.DESCRIBE, TOPIC, n))
        topics = [entry for entry in listed if entry is not None]
    else:
        by_id = None
        requested_names = [t.name for t in body.topics if t.name]
        refused = denied(ctx, conn, AclOperation.DESCRIBE, TOPIC, requested_names)
        check_create = allow_create and ctx.config.auto_create_topics and not allowed(
            ctx, conn, AclOperation.CREATE, CLUSTER, CLUSTER_NAME
        )
        cannot_create = (
            denied(ctx, conn, AclOperation.CREATE, TOPIC,
                   [n for n in requested_names if n not in refused and not ctx.engine.has_topic(n)])
            if check_create else set()
        )
        for requested in body.topics:
            name = requested.name
            topic_id = getattr(requested, "topic_id", None)
            if not name and topic_id is not None and topic_id.int != 0:
                by_id = by_id or _id_to_name(ctx)
                name = by_id.get(topic_id)
                if name is None:
                    topics.append({"error_code": UNKNOWN_TOPIC_ID, "name": None, "topic_id": topic_id, "partitions": []})
                    continue
            code = NONE
            if not requested.name and not allowed(ctx, conn, AclOperation.DESCRIBE, TOPIC, name):
                refused |= denied(ctx, conn, AclOperation.DESCRIBE, TOPIC, [name])
            if name in refused or name in cannot_create:
                # Kafka: no DESCRIBE (or no CREATE for a topic to auto-create) is
                # TOPIC_AUTHORIZATION_FAILED, whether or not the topic exists.
                topics.append({"error_code": TOPIC_AUTHORIZATION_FAILED, "name": name, "partitions": []})
                continue
            if not ctx.engine.has_topic(name):
                code = await ensure_topic(ctx, name) if allow_create else UNKNOWN_TOPIC_OR_PARTITION
            entry = _entry_if_exists(ctx, conn, name, topic_ops) if code == NONE else None
            if entry is None:  # or deleted meanwhile (cluster mode: by another broker)
                topics.append({"error_code": code or UNKNOWN_TOPIC_OR_PARTITION, "name": name, "partitions": []})
            else:
                topics.append(entry)
    brokers = brokers_of(ctx, conn)
    return {
        "throttle_time_ms": 0,
        "brokers": brokers,
        "cluster_id": ctx.engine.cluster_id,
        "controller_id": min((b["node_id"] for b in brokers), default=ctx.node_id),
        "topics": topics,
        "error_code": NONE,
        # v8-v10: the caller's operations on the cluster when asked (v11 dropped the field)
        "authorized_operations": (
            (cluster_operations(ctx, conn) if allowed(ctx, conn, AclOperation.DESCRIBE, CLUSTER, CLUSTER_NAME) else set())
            if cluster_ops else None
        ),
    }
