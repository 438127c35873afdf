"""Consumer-group APIs: JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13),
OffsetCommit (8), OffsetFetch (9), ListGroups (16), DescribeGroups (15), DeleteGroups (42).
(KIP-848's ConsumerGroupHeartbeat and ConsumerGroupDescribe are in consumer_groups.py; OffsetCommit's
generation carries the member epoch and OffsetFetch v9 the member id/epoch for those groups.)

Thin translations between the wire and `loglake.broker.groups.GroupCoordinator`, which holds
the state machine; it runs on the event loop, so handlers call it directly. OffsetCommit and
DeleteGroups answer only once their change is durable (the coordinator awaits the store's
future without blocking the loop).
"""

from __future__ import annotations

import asyncio
import logging

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.handlers.errors import (
    COORDINATOR_NOT_AVAILABLE,
    GROUP_AUTHORIZATION_FAILED,
    GROUP_ID_NOT_FOUND,
    INCONSISTENT_GROUP_PROTOCOL,
    NON_EMPTY_GROUP,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNSTABLE_OFFSET_COMMIT,
    coordinator_error,
    coordinator_for,
)
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.security.authorized import (
    CLUSTER,
    GROUP,
    TOPIC,
    AclOperation,
    allowed,
    check,
    denied,
    group_operations,
)
from loglake.broker.security.authorizer import CLUSTER_NAME
from loglake.errors import LoglakeError, MetaFencedError
from loglake.logsafe import RateLimitedLog

log = logging.getLogger("loglake.broker.groups")
_limited = RateLimitedLog(log)

#: Authorized-operations value meaning "not requested / not computed".
AUTHORIZED_OPERATIONS_OMITTED = -2147483648


def _client_host(conn: Conn) -> str:
    return "/" + conn.peer.rsplit(":", 1)[0]


async def join_group(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    if not check(ctx, conn, AclOperation.READ, GROUP, body.group_id):
        return {"error_code": GROUP_AUTHORIZATION_FAILED, "generation_id": -1, "member_id": body.member_id}
    coordinator = coordinator_for(ctx, body.group_id)
    if isinstance(coordinator, int):
        return {"error_code": coordinator, "generation_id": -1, "member_id": body.member_id}
    if ctx.share.known(body.group_id):  # a share group's id: Kafka's classicGroupJoin answers so
        return {"error_code": INCONSISTENT_GROUP_PROTOCOL, "generation_id": -1, "member_id": ""}
    version = req.api_version
    result = await coordinator.join_group(
        body.group_id,
        body.member_id,
        getattr(body, "group_instance_id", None) if version >= 5 else None,
        body.protocol_type,
        [(p.name, bytes(p.metadata)) for p in body.protocols],
        body.session_timeout_ms,
        body.rebalance_timeout_ms if version >= 1 else body.session_timeout_ms,
        req.client_id or "",
        _client_host(conn),
        require_known_member_id=version >= 4,
        supports_skip_assignment=version >= 9,
        reason=getattr(body, "reason", None) if version >= 8 else None,
    )
    protocol_type = result.protocol_type
    return {
        "throttle_time_ms": 0,
        "error_code": result.error_code,
        "generation_id": result.generation_id,
        "protocol_type": protocol_type,
        "protocol_name": result.protocol_name if (result.protocol_name is not None or version >= 7) else "",
        "leader": result.leader_id,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [
            {"member_id": m, "group_instance_id": instance, "metadata": metadata}
            for m, instance, metadata in result.members
        ],
    }


async def sync_group(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    if not check(ctx, conn, AclOperation.READ, GROUP, body.group_id):
        return {"error_code": GROUP_AUTHORIZATION_FAILED, "assignment": b""}
    coordinator = coordinator_for(ctx, body.group_id)
    if isinstance(coordinator, int):
        return {"error_code": coordinator, "assignment": b""}
    version = req.api_version
    result = await coordinator.sync_group(
        body.group_id,
        body.generation_id,
        body.member_id,
        body.group_instance_id if version >= 3 else None,
        body.protocol_type if version >= 5 else None,
        body.protocol_name if version >= 5 else None,
        [(a.member_id, bytes(a.assignment)) for a in body.assignments],
    )
    return {
        "throttle_time_ms": 0,
        "error_code": result.error_code,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "assignment": result.assignment,
    }


async def heartbeat(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    if not check(ctx, conn, AclOperation.READ, GROUP, body.group_id):
        return {"throttle_time_ms": 0, "error_code": GROUP_AUTHORIZATION_FAILED}
    coordinator = coordinator_for(ctx, body.group_id)
    if isinstance(coordinator, int):
        return {"throttle_time_ms": 0, "error_code": coordinator}
    code = coordinator.heartbeat(
        body.group_id,
        body.generation_id,
        body.member_id,
        body.group_instance_id if req.api_version >= 3 else None,
    )
    return {"throttle_time_ms": 0, "error_code": code}


async def leave_group(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    if not check(ctx, conn, AclOperation.READ, GROUP, body.group_id):
        return {"throttle_time_ms": 0, "error_code": GROUP_AUTHORIZATION_FAILED, "members": []}
    coordinator = coordinator_for(ctx, body.group_id)
    if isinstance(coordinator, int):
        return {"throttle_time_ms": 0, "error_code": coordinator, "members": []}
    if req.api_version >= 3:
        members = [(m.member_id, m.group_instance_id) for m in body.members]
    else:
        members = [(body.member_id, None)]
    code, results = coordinator.leave_group(body.group_id, members)
    if req.api_version < 3:
        if code == NONE and results:
            code = results[0][2]  # v0-2 answer with the one member's error
        return {"throttle_time_ms": 0, "error_code": code}
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "members": [
            {"member_id": m, "group_instance_id": instance, "error_code": err} for m, instance, err in results
        ],
    }


async def offset_commit(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    version = req.api_version
    items: list[tuple[str, int, int, int, str | None]] = []
    for topic in body.topics:
        for p in topic.partitions:
            epoch = p.committed_leader_epoch if version >= 6 else -1
            items.append((topic.name, p.partition_index, p.committed_offset, epoch, p.committed_metadata))
    results: list[tuple[str, int, int]] = []
    if not check(ctx, conn, AclOperation.READ, GROUP, body.group_id):
        results, items = [(t, p, GROUP_AUTHORIZATION_FAILED) for t, p, *_ in items], []
    elif refused := denied(ctx, conn, AclOperation.READ, TOPIC, (t for t, *_ in items)):
        # Kafka commits the authorized partitions and refuses the others.
        results = [(t, p, TOPIC_AUTHORIZATION_FAILED) for t, p, *_ in items if t in refused]
        items = [item for item in items if item[0] not in refused]
    coordinator = coordinator_for(ctx, body.group_id) if items else COORDINATOR_NOT_AVAILABLE
    if not items:
        pass
    elif isinstance(coordinator, int):
        results += [(t, p, coordinator) for t, p, *_ in items]
    elif ctx.share.known(body.group_id):  # one group namespace: Kafka's ShareGroup.validateOffsetCommit
        results += [(t, p, GROUP_ID_NOT_FOUND) for t, p, *_ in items]
    else:
        engine = ctx.engine

        def topic_exists(name: str, partition: int) -> bool:
            return bool(engine.has_topic(name) and 0 <= partition < engine.topic(name).partitions)

        generation = getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
        results += await coordinator.commit_offsets(
            body.group_id,
            generation,
            body.member_id,
            body.group_instance_id if version >= 7 else None,
            items,
            topic_exists=topic_exists,
        )
    by_topic: dict[str, list[dict[str, object]]] = {}
    for name, partition, code in results:
        by_topic.setdefault(name, []).append({"partition_index": partition, "error_code": code})
    return {
        "throttle_time_ms": 0,
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
    }


async def _fetch_group(
    ctx: BrokerContext, conn: Conn, group_id: str, topics: list[KafkaStruct] | None, member_id: str | None = None,
    member_epoch: int = -1,
    require_stable: bool = False, refused_groups: set[str] | None = None,
) -> tuple[int, list[tuple[str, int, int, int, str, int]]]:
    # v8+ asks for several groups: the caller checks them together (one audit line).
    if refused_groups is None:
        refused_groups = set() if check(ctx, conn, AclOperation.DESCRIBE, GROUP, group_id) else {group_id}
    if group_id in refused_groups:
        return GROUP_AUTHORIZATION_FAILED, []
    # What is pending is asked before the offsets are read (and the coordinator that reads them
    # is looked up): a transaction's offsets are committed before they stop counting as pending,
    # so none is read stale and answered as stable. None: nobody can tell now; all are unstable.
    pending: set[tuple[str, int]] | None = set()
    if require_stable:
        try:
            pending = await ctx.txn.pending_offsets(group_id)
        except LoglakeError as exc:
            _limited.warning(("require_stable", group_id), "OffsetFetch of group %s with require_stable: %s; "
                             "every partition answered unstable", group_id, exc)
            pending = None
    coordinator = coordinator_for(ctx, group_id)
    if isinstance(coordinator, int):
        return coordinator, []
    if ctx.share.known(group_id):  # a share group's offsets are DescribeShareGroupOffsets' (Kafka's validateOffsetFetch)
        return GROUP_ID_NOT_FOUND, []
    wanted = None
    refused: set[str] = set()
    if topics is not None:
        refused = denied(ctx, conn, AclOperation.DESCRIBE, TOPIC, (t.name for t in topics))
        wanted = [(t.name, p) for t in topics for p in t.partition_indexes if t.name not in refused]
    code, items = coordinator.fetch_offsets(group_id, wanted, member_id, member_epoch)
    if topics is None:  # every committed offset: only those of topics the principal may describe
        items = [i for i in items if allowed(ctx, conn, AclOperation.DESCRIBE, TOPIC, i[0])]
    elif refused:
        items = list(items) + [(t.name, p, -1, -1, "", TOPIC_AUTHORIZATION_FAILED)
                               for t in topics if t.name in refused for p in t.partition_indexes]
    if pending is None or pending:
        items = [(t, p, -1, -1, "", UNSTABLE_OFFSET_COMMIT) if pending is None or (t, p) in pending
                 else (t, p, o, e, m, c) for t, p, o, e, m, c in items]
    return int(code), list(items)


def _group_topics(items: list[tuple[str, int, int, int, str, int]], version: int) -> list[dict[str, object]]:
    by_topic: dict[str, list[dict[str, object]]] = {}
    for name, partition, offset, epoch, metadata, code in items:
        by_topic.setdefault(name, []).append(
            {
                "partition_index": partition,
                "committed_offset": offset,
                "committed_leader_epoch": epoch,
                "metadata": metadata,
                "error_code": code,
            }
        )
    return [{"name": name, "partitions": parts} for name, parts in by_topic.items()]


async def offset_fetch(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    version = req.api_version
    if version >= 8:
        groups = []
        refused = denied(ctx, conn, AclOperation.DESCRIBE, GROUP, [g.group_id for g in body.groups])
        for group in body.groups:
            member = (group.member_id, group.member_epoch) if version >= 9 else (None, -1)
            code, items = await _fetch_group(
                ctx, conn, group.group_id, group.topics, member[0], member[1], require_stable=bool(body.require_stable),
                refused_groups=refused,
            )
            groups.append({"group_id": group.group_id, "topics": _group_topics(items, version), "error_code": code})
        return {"throttle_time_ms": 0, "groups": groups}
    stable = bool(getattr(body, "require_stable", False)) if version >= 7 else False
    code, items = await _fetch_group(ctx, conn, body.group_id, body.topics, require_stable=stable)
    return {"throttle_time_ms": 0, "topics": _group_topics(items, version), "error_code": code}


#: ListGroups' group type (and protocol type) of a share group.
SHARE_GROUP_TYPE = "share"


async def list_groups(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    coordinator = ctx.coordinator
    if coordinator is None:
        return {"throttle_time_ms": 0, "error_code": COORDINATOR_NOT_AVAILABLE, "groups": []}
    states = list(req.body.states_filter or []) if req.api_version >= 4 else None
    types = list(req.body.types_filter or []) if req.api_version >= 5 else []
    # DESCRIBE on the cluster lists every group, else only those the principal may describe (Kafka).
    every = allowed(ctx, conn, AclOperation.DESCRIBE, CLUSTER, CLUSTER_NAME)
    groups = [
        {"group_id": group_id, "protocol_type": protocol_type, "group_state": state, "group_type": group_type}
        for group_id, protocol_type, state, group_type in coordinator.list_groups_typed(states or None, types or None)
        if every or allowed(ctx, conn, AclOperation.DESCRIBE, GROUP, group_id)
    ]
    # Share groups (KIP-932) share the namespace and the listing: type and protocol type "share".
    wanted_states = {s.lower() for s in states or []}
    if not types or SHARE_GROUP_TYPE in {t.lower() for t in types}:
        groups += [
            {"group_id": g.group_id, "protocol_type": SHARE_GROUP_TYPE, "group_state": g.state, "group_type": SHARE_GROUP_TYPE}
            for g in ctx.share.listed()
            if (not wanted_states or g.state.lower() in wanted_states)
            and (every or allowed(ctx, conn, AclOperation.DESCRIBE, GROUP, g.group_id))
        ]
    return {"throttle_time_ms": 0, "error_code": NONE, "groups": groups}


async def describe_groups(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    out: list[dict[str, object]] = []
    refused = denied(ctx, conn, AclOperation.DESCRIBE, GROUP, req.body.groups)
    with_ops = req.api_version >= 3 and bool(getattr(req.body, "include_authorized_operations", False))
    for group_id in req.body.groups:
        if group_id in refused:
            out.append({"error_code": GROUP_AUTHORIZATION_FAILED, "group_id": group_id, "members": []})
            continue
        coordinator = coordinator_for(ctx, group_id)
        if isinstance(coordinator, int):
            out.append({"error_code": coordinator, "group_id": group_id, "members": []})
            continue
        d = coordinator.describe_group(group_id)
        if d.error_code == GROUP_ID_NOT_FOUND:  # a consumer-protocol group (Kafka: v6+ says so, older: Dead)
            if req.api_version >= 6:
                out.append({"error_code": GROUP_ID_NOT_FOUND, "group_id": group_id, "group_state": "Dead",
                            "error_message": f"Group {group_id} is not a classic group.", "members": []})
            else:
                out.append({"error_code": NONE, "group_id": group_id, "group_state": "Dead", "members": []})
            continue
        out.append(
            {
                "error_code": d.error_code,
                "error_message": None,
                "authorized_operations": group_operations(ctx, conn, group_id) if with_ops else None,
                "group_id": d.group_id,
                "group_state": d.state,
                "protocol_type": d.protocol_type,
                "protocol_data": d.protocol,
                "members": [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.group_instance_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "member_metadata": m.metadata,
                        "member_assignment": m.assignment,
                    }
                    for m in d.members
                ],
            }
        )
    return {"throttle_time_ms": 0, "groups": out}


async def delete_groups(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    names = list(req.body.groups_names)
    refused = denied(ctx, conn, AclOperation.DELETE, GROUP, names)
    results = [(g, GROUP_AUTHORIZATION_FAILED) for g in names if g in refused]
    names = [g for g in names if g not in refused]
    coordinator = ctx.coordinator
    if coordinator is None:
        results += [(g, COORDINATOR_NOT_AVAILABLE) for g in names]
    elif names:
        elsewhere = [g for g in names if coordinator_error(ctx, g)]
        results += [(g, coordinator_error(ctx, g)) for g in elsewhere]
        names = [g for g in names if g not in elsewhere]
        # share groups (KIP-932): deleted with their share-partition states, only when empty
        shares = [g for g in names if coordinator.group_state(g) is None and ctx.share.known(g)]
        names = [g for g in names if g not in shares]
        for g in shares:
            if not ctx.share.is_empty(g):
                results.append((g, NON_EMPTY_GROUP))
                continue
            try:
                for f in ctx.share.delete_group(g):
                    await asyncio.wrap_future(f)
            except MetaFencedError:  # other admin writes kept winning (cluster mode): retried
                results.append((g, COORDINATOR_NOT_AVAILABLE))
                continue
            results.append((g, NONE))
        results += await coordinator.delete_groups(names) if names else []
    return {"throttle_time_ms": 0, "results": [{"group_id": g, "error_code": code} for g, code in results]}


HANDLERS: dict[int, Handler] = {
    ApiKey.OFFSET_COMMIT: offset_commit,
    ApiKey.OFFSET_FETCH: offset_fetch,
    ApiKey.JOIN_GROUP: join_group,
    ApiKey.HEARTBEAT: heartbeat,
    ApiKey.LEAVE_GROUP: leave_group,
    ApiKey.SYNC_GROUP: sync_group,
    ApiKey.DESCRIBE_GROUPS: describe_groups,
    ApiKey.LIST_GROUPS: list_groups,
    ApiKey.DELETE_GROUPS: delete_groups,
}
