"""KIP-848 consumer group APIs: ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69).

Thin translations between the wire (topic ids are UUIDs there, 32-hex strings in the
coordinator) and `GroupCoordinator.consumer_heartbeat` / `consumer_describe`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Protocol

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.groups.consumer import HeartbeatRequest
from loglake.broker.handlers.errors import (
    GROUP_AUTHORIZATION_FAILED,
    GROUP_ID_NOT_FOUND,
    TOPIC_AUTHORIZATION_FAILED,
    coordinator_for,
)
from loglake.broker.handlers.groups import AUTHORIZED_OPERATIONS_OMITTED, _client_host
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.security.authorized import (
    GROUP,
    TOPIC,
    AclOperation,
    check,
    denied,
    group_operations,
    operation_bits,
    who,
)

ZERO_TOPIC_ID_HEX = "0" * 32
MEMBER_TYPE_CONSUMER = 1  # ConsumerGroupDescribe v1 MemberType: a member of the consumer protocol


class HeartbeatAnswer(Protocol):
    """What a consumer or share group's heartbeat answers with (both coordinators' results)."""

    @property
    def error_code(self) -> int: ...
    @property
    def error_message(self) -> str | None: ...
    @property
    def member_id(self) -> str | None: ...
    @property
    def member_epoch(self) -> int: ...
    @property
    def heartbeat_interval_ms(self) -> int: ...
    @property
    def assignment(self) -> Mapping[str, Iterable[int]] | None: ...


def heartbeat_response(result: HeartbeatAnswer) -> dict[str, object]:
    """The ConsumerGroupHeartbeat / ShareGroupHeartbeat response body (same fields in both APIs):
    the assignment by topic id only when the member must be told."""
    assignment: dict[str, object] | None = None
    if result.assignment is not None:
        assignment = {
            "topic_partitions": [
                {"topic_id": uuid.UUID(hex=tid), "partitions": sorted(parts)}
                for tid, parts in sorted(result.assignment.items())
            ]
        }
    return {
        "throttle_time_ms": 0,
        "error_code": result.error_code,
        "error_message": result.error_message,
        "member_id": result.member_id,
        "member_epoch": result.member_epoch,
        "heartbeat_interval_ms": result.heartbeat_interval_ms,
        "assignment": assignment,
    }


async def consumer_group_heartbeat(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    refused: tuple[int, str | None] | None = None
    if not check(ctx, conn, AclOperation.READ, GROUP, body.group_id):
        refused = GROUP_AUTHORIZATION_FAILED, None
    elif body.subscribed_topic_names and (topics := denied(ctx, conn, AclOperation.DESCRIBE, TOPIC, body.subscribed_topic_names)):
        refused = TOPIC_AUTHORIZATION_FAILED, f"Unauthorized topics: {', '.join(sorted(topics))}"
    if refused is not None:
        return {"throttle_time_ms": 0, "error_code": refused[0], "error_message": refused[1],
                "member_id": body.member_id, "member_epoch": body.member_epoch}
    coordinator = coordinator_for(ctx, body.group_id)
    if isinstance(coordinator, int):
        return {"throttle_time_ms": 0, "error_code": coordinator, "member_id": body.member_id,
                "member_epoch": body.member_epoch}
    # One namespace for consumer and share groups, as in Kafka (GroupMetadataManager's "is not a
    # consumer group"). Looked at when a member joins: a group with consumer members is never
    # a share group (ShareGroupHeartbeat refuses its id).
    if body.member_epoch == 0 and ctx.share.known(body.group_id):
        return {"throttle_time_ms": 0, "error_code": GROUP_ID_NOT_FOUND,
                "error_message": f"Group {body.group_id} is not a consumer group.",
                "member_id": body.member_id, "member_epoch": body.member_epoch}
    owned = None
    if body.topic_partitions is not None:
        # kafka-python decodes the zero UUID as None: an unknown topic id, not a missing one
        owned = [(t.topic_id.hex if t.topic_id is not None else ZERO_TOPIC_ID_HEX, list(t.partitions))
                 for t in body.topic_partitions]
    names = body.subscribed_topic_names
    result = await coordinator.consumer_heartbeat(
        HeartbeatRequest(
            group_id=body.group_id,
            member_id=body.member_id,
            member_epoch=body.member_epoch,
            instance_id=body.instance_id,
            rack_id=body.rack_id,
            rebalance_timeout_ms=body.rebalance_timeout_ms,
            subscribed_names=list(names) if names is not None else None,
            subscribed_regex=getattr(body, "subscribed_topic_regex", None) if req.api_version >= 1 else None,
            server_assignor=body.server_assignor,
            owned=owned,
            client_id=req.client_id or "",
            client_host=_client_host(conn),
            version=req.api_version,
            principal=who(conn),
        )
    )
    return heartbeat_response(result)


def _topics(described: list[tuple[str, str, list[int]]]) -> dict[str, object]:
    return {
        "topic_partitions": [
            {"topic_id": uuid.UUID(hex=tid), "topic_name": name, "partitions": parts} for tid, name, parts in described
        ]
    }


async def consumer_group_describe(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    out: list[dict[str, object]] = []
    refused = denied(ctx, conn, AclOperation.DESCRIBE, GROUP, req.body.group_ids)
    with_ops = bool(getattr(req.body, "include_authorized_operations", False))
    for group_id in req.body.group_ids:
        if group_id in refused:
            out.append({"error_code": GROUP_AUTHORIZATION_FAILED, "group_id": group_id,
                        "error_message": "Group authorization failed."})
            continue
        coordinator = coordinator_for(ctx, group_id)
        if isinstance(coordinator, int):
            out.append({"error_code": coordinator, "group_id": group_id})
            continue
        d = coordinator.consumer_describe(group_id)
        out.append(
            {
                "error_code": d.error_code,
                "error_message": d.error_message,
                "group_id": d.group_id,
                "group_state": d.state,
                "group_epoch": d.group_epoch,
                "assignment_epoch": d.assignment_epoch,
                "assignor_name": d.assignor,
                "members": [
                    {
                        "member_id": m.member_id,
                        "instance_id": m.instance_id,
                        "rack_id": m.rack_id,
                        "member_epoch": m.member_epoch,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "subscribed_topic_names": m.subscribed_names,
                        "subscribed_topic_regex": m.subscribed_regex,
                        "assignment": _topics(m.assignment),
                        "target_assignment": _topics(m.target),
                        "member_type": MEMBER_TYPE_CONSUMER,
                    }
                    for m in d.members
                ],
                "authorized_operations": (
                    operation_bits(group_operations(ctx, conn, group_id)) if with_ops else AUTHORIZED_OPERATIONS_OMITTED
                ),
            }
        )
    return {"throttle_time_ms": 0, "groups": out}


HANDLERS: dict[int, Handler] = {
    ApiKey.CONSUMER_GROUP_HEARTBEAT: consumer_group_heartbeat,
    ApiKey.CONSUMER_GROUP_DESCRIBE: consumer_group_describe,
}
