"""CreateTopics (19), DeleteTopics (20), DeleteRecords (21), CreatePartitions (37).

A replication factor is accepted up to the number of live brokers the cluster view counts (one on
a single node; -1 means 1, Kafka's default.replication.factor), anything else is
INVALID_REPLICATION_FACTOR with Kafka's message naming that count. The factor is remembered with
the topic: Metadata reports that many brokers as each partition's replicas (in a cluster any live
broker can serve a partition from the bucket; the leader is the cluster view's choice, not the
request's). A manual replica assignment is accepted when every partition names the same number of
distinct live brokers (that number is the factor); which of them leads is still the view's.
Every engine call that changes topics waits for its metadata record to be durable, so it runs on
the executor, and a success is durable.
"""

from __future__ import annotations

import uuid

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext
from loglake.broker.handlers.admin_common import (
    INVALID_CONFIG,
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    TOPIC_ALREADY_EXISTS,
    AdminError,
    duplicates,
    engine_call,
    failure,
)
from loglake.broker.handlers.admin_configs import topic_config_entries
from loglake.broker.handlers.errors import (
    INVALID_REQUEST,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from loglake.broker.protocol import DecodedRequest
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.security.authorized import CLUSTER, TOPIC, AclOperation, allowed, denied
from loglake.broker.security.authorizer import CLUSTER_NAME
from loglake.broker.security.mutation_quota import MutationGate
from loglake.engine.config import validate_topic_name
from loglake.engine.types import TopicInfo
from loglake.kafka_errors import ErrorCode

ZERO_UUID = uuid.UUID(int=0)
THROTTLING_QUOTA_EXCEEDED: int = ErrorCode.THROTTLING_QUOTA_EXCEEDED
_THROTTLED = "The throttling quota has been exceeded."
#: CreateTopics v5+ echoes these fields of each config entry.
_CREATE_CONFIG_FIELDS = ("name", "value", "read_only", "config_source", "is_sensitive")


# ---- CreateTopics ---------------------------------------------------------------------------------


def replication_factor_problem(factor: int, live: int = 1) -> str | None:
    """Why a topic cannot be created with `factor` replicas per partition when `live` brokers are
    registered (Kafka's wording, with INVALID_REPLICATION_FACTOR), or None: -1 (the default) and
    1 to `live` are served. `loglake topics create --replication-factor` on a data directory (one
    broker) says the same."""
    if factor == 0 or factor < -1:
        return "Replication factor must be larger than 0, or -1 to use the default value."
    if factor > live:
        return (
            f"Unable to replicate the partition {factor} time(s): The target replication factor of {factor} "
            f"cannot be reached because only {live} broker(s) are registered."
        )
    return None


def _check_assigned(live: set[int], what: str, broker_ids: list[int], factor: int | None) -> int:
    """A manual assignment's replica list: distinct live brokers, as many as the first list's."""
    if len(set(broker_ids)) != len(broker_ids) or not broker_ids or not set(broker_ids) <= live:
        raise AdminError(
            INVALID_REQUEST,
            f"{what} assigned to brokers {broker_ids}: a replica list names distinct live brokers "
            f"(live: {sorted(live)})",
        )
    if factor is not None and len(broker_ids) != factor:
        raise AdminError(
            INVALID_REQUEST, f"{what} assigned to {len(broker_ids)} broker(s), the others to {factor}"
        )
    return len(broker_ids)


def _partitions_and_factor(ctx: BrokerContext, topic: KafkaStruct) -> tuple[int, int]:
    """The partition count and replication factor a CreatableTopic asks for, after checking
    replication and assignments against the live brokers the cluster view counts."""
    count, factor = topic.num_partitions, topic.replication_factor
    assignments = list(topic.assignments or [])
    live = ctx.view.live_ids() | {ctx.node_id}  # registering again: this broker still answers
    if assignments:
        if count != -1 or factor != -1:
            raise AdminError(
                INVALID_REQUEST,
                "Both numPartitions or replicationFactor and replicasAssignments were set. "
                "Both cannot be used at the same time.",
            )
        indexes = sorted(a.partition_index for a in assignments)
        if indexes != list(range(len(assignments))):
            raise AdminError(INVALID_REQUEST, f"Partitions of a manual assignment must be 0..n-1, got {indexes}")
        assigned: int | None = None
        for a in assignments:
            assigned = _check_assigned(live, f"Partition {a.partition_index}", list(a.broker_ids), assigned)
        return len(assignments), assigned or 1
    problem = replication_factor_problem(factor, len(live))
    if problem is not None:
        raise AdminError(INVALID_REPLICATION_FACTOR, problem)
    factor = 1 if factor == -1 else int(factor)
    if count == -1:
        return int(ctx.config.default_partitions), factor
    if count <= 0:
        raise AdminError(INVALID_PARTITIONS, "Number of partitions must be larger than 0, or -1 to use the default value.")
    return int(count), factor


def _topic_configs(topic: KafkaStruct) -> dict[str, str]:
    configs: dict[str, str] = {}
    for c in topic.configs or []:
        if c.value is None:
            raise AdminError(INVALID_CONFIG, f"Null value not supported for topic configs: {c.name}")
        configs[c.name] = c.value
    return configs


async def _create_one(ctx: BrokerContext, topic: KafkaStruct, validate_only: bool, quota: MutationGate | None) -> TopicInfo:
    name = topic.name
    validate_topic_name(name)
    if ctx.engine.has_topic(name):
        raise AdminError(TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
    partitions, factor = _partitions_and_factor(ctx, topic)
    configs = _topic_configs(topic)
    if quota is not None and not quota.admit(partitions, validate_only):
        raise AdminError(THROTTLING_QUOTA_EXCEEDED, _THROTTLED)
    return await engine_call(
        ctx, ctx.engine.create_topic, name, partitions, configs, validate_only=validate_only, replication_factor=factor
    )


async def create_topics(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    validate_only = bool(getattr(body, "validate_only", False))
    dup = duplicates([t.name for t in body.topics])
    results: list[dict[str, object]] = []
    # CREATE on the cluster allows every topic, else CREATE on each topic (Kafka's KafkaApis).
    refused: set[str] = set()
    quota = ctx.mutation_quotas.gate(conn, req)
    if not allowed(ctx, conn, AclOperation.CREATE, CLUSTER, CLUSTER_NAME):
        refused = denied(ctx, conn, AclOperation.CREATE, TOPIC, [t.name for t in body.topics if t.name not in dup])
    for topic in body.topics:
        result: dict[str, object] = {"name": topic.name, "topic_id": ZERO_UUID, "error_code": NONE, "error_message": None}
        try:
            if topic.name in refused:
                raise AdminError(TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            if topic.name in dup:
                raise AdminError(
                    INVALID_REQUEST,
                    f"Create topics request from client contains multiple entries for the following topics: {topic.name}",
                )
            info = await _create_one(ctx, topic, validate_only, quota)
            if not validate_only:
                result["topic_id"] = uuid.UUID(hex=info.topic_id)
            if req.api_version >= 5:  # the topic's partitions and configs come back
                result.update(num_partitions=info.partitions, replication_factor=info.replication_factor)
                # Kafka: the configs only to a principal that may DESCRIBE_CONFIGS the topic.
                if allowed(ctx, conn, AclOperation.DESCRIBE_CONFIGS, TOPIC, topic.name):
                    entries = topic_config_entries(ctx, info.config)
                    result["configs"] = [{k: e[k] for k in _CREATE_CONFIG_FIELDS} for e in entries]
                else:
                    result["topic_config_error_code"] = TOPIC_AUTHORIZATION_FAILED
        except Exception as exc:
            result["error_code"], result["error_message"] = failure(exc, f"CreateTopics {topic.name}")
        results.append(result)
    response: dict[str, object] = {"throttle_time_ms": 0, "topics": results}
    return quota.finish(response) if quota is not None else response


# ---- DeleteTopics ---------------------------------------------------------------------------------


async def delete_topics(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    if req.api_version >= 6:
        wanted = [(t.name, t.topic_id or ZERO_UUID) for t in body.topics]
    else:
        wanted = [(name, ZERO_UUID) for name in body.topic_names]
    dup = duplicates([name if name is not None else topic_id for name, topic_id in wanted])
    by_id: dict[uuid.UUID, str] | None = None
    if any(name is None for name, _ in wanted):
        by_id = {uuid.UUID(hex=t.topic_id): t.name for t in ctx.engine.topics()}
    named = [n if n is not None else (by_id or {}).get(i) for n, i in wanted]
    refused = denied(ctx, conn, AclOperation.DELETE, TOPIC, [n for n in named if n is not None])
    quota = ctx.mutation_quotas.gate(conn, req)
    responses: list[dict[str, object]] = []
    for name, topic_id in wanted:
        result: dict[str, object] = {"name": name, "topic_id": topic_id, "error_code": NONE, "error_message": None}
        try:
            if name is not None and topic_id != ZERO_UUID:
                raise AdminError(INVALID_REQUEST, "You may not specify both topic name and topic id.")
            if name is None and topic_id == ZERO_UUID:
                raise AdminError(INVALID_REQUEST, "Neither topic name nor id were specified.")
            if (name if name is not None else topic_id) in dup:
                raise AdminError(INVALID_REQUEST, f"Duplicate topic {'name' if name is not None else 'id'} in request")
            if name is None:
                if by_id is None:
                    by_id = {uuid.UUID(hex=t.topic_id): t.name for t in ctx.engine.topics()}
                name = by_id.get(topic_id)
                if name is None:
                    raise AdminError(UNKNOWN_TOPIC_ID, f"Topic id {topic_id} not found.")
                result["name"] = name
            if name in refused:
                raise AdminError(TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            info = ctx.engine.topic(name)
            result["topic_id"] = uuid.UUID(hex=info.topic_id)
            if quota is not None and not quota.admit(info.partitions):
                raise AdminError(THROTTLING_QUOTA_EXCEEDED, _THROTTLED)
            await engine_call(ctx, ctx.engine.delete_topic, name)
        except Exception as exc:
            result["error_code"], result["error_message"] = failure(exc, f"DeleteTopics {name or topic_id}")
        responses.append(result)
    response: dict[str, object] = {"throttle_time_ms": 0, "responses": responses}
    return quota.finish(response) if quota is not None else response


# ---- CreatePartitions -----------------------------------------------------------------------------


def _check_assignments(ctx: BrokerContext, name: str, count: int, assignments: list[KafkaStruct] | None) -> None:
    if not assignments:  # null (or empty): the broker places the new partitions
        return
    info = ctx.engine.topic(name)
    current = info.partitions
    if count <= current:
        return  # the engine answers INVALID_PARTITIONS
    if len(assignments) != count - current:
        raise AdminError(
            INVALID_REPLICA_ASSIGNMENT,
            f"Increasing the number of partitions by {count - current} but {len(assignments)} assignments provided.",
        )
    live = ctx.view.live_ids() | {ctx.node_id}
    for i, a in enumerate(assignments):
        ids = list(a.broker_ids)
        if len(set(ids)) != len(ids) or not set(ids) <= live or len(ids) != info.replication_factor:
            raise AdminError(
                INVALID_REPLICA_ASSIGNMENT,
                f"New partition {current + i} assigned to brokers {ids}: the topic's partitions have "
                f"{info.replication_factor} replica(s), distinct live brokers (live: {sorted(live)})",
            )


async def create_partitions(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    validate_only = bool(body.validate_only)
    dup = duplicates([t.name for t in body.topics])
    results: list[dict[str, object]] = []
    refused = denied(ctx, conn, AclOperation.ALTER, TOPIC, [t.name for t in body.topics if t.name not in dup])
    quota = ctx.mutation_quotas.gate(conn, req)
    for topic in body.topics:
        code, message = NONE, None
        try:
            if topic.name in refused:
                raise AdminError(TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            if topic.name in dup:
                raise AdminError(INVALID_REQUEST, f"Duplicate topic in request: {topic.name}")
            current = ctx.engine.topic(topic.name).partitions  # UNKNOWN_TOPIC_OR_PARTITION before anything else
            _check_assignments(ctx, topic.name, topic.count, topic.assignments)
            added = topic.count - current
            if quota is not None and added > 0 and not quota.admit(added, validate_only):
                raise AdminError(THROTTLING_QUOTA_EXCEEDED, _THROTTLED)
            await engine_call(
                ctx, ctx.engine.create_partitions, topic.name, topic.count, validate_only=validate_only
            )
        except Exception as exc:
            code, message = failure(exc, f"CreatePartitions {topic.name}")
        results.append({"name": topic.name, "error_code": code, "error_message": message})
    response: dict[str, object] = {"throttle_time_ms": 0, "results": results}
    return quota.finish(response) if quota is not None else response


# ---- DeleteRecords --------------------------------------------------------------------------------


async def delete_records(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    """Raise log start offsets; durable on return, so `timeout_ms` has nothing to wait for."""
    topics: list[dict[str, object]] = []
    refused = denied(ctx, conn, AclOperation.DELETE, TOPIC, (t.name for t in req.body.topics))
    for topic in req.body.topics:
        partitions: list[dict[str, object]] = []
        for part in topic.partitions:
            low, code = -1, NONE
            if topic.name in refused:
                partitions.append({"partition_index": part.partition_index, "low_watermark": -1,
                                   "error_code": TOPIC_AUTHORIZATION_FAILED})
                continue
            try:
                if not ctx.engine.has_topic(topic.name):
                    raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic.name!r}")
                low = await engine_call(ctx, ctx.engine.delete_records, topic.name, part.partition_index, part.offset)
            except Exception as exc:
                code, _message = failure(exc, f"DeleteRecords {topic.name}-{part.partition_index}")
            partitions.append({"partition_index": part.partition_index, "low_watermark": low, "error_code": code})
        topics.append({"name": topic.name, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics}
