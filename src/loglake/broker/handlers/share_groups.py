"""KIP-932 share-group APIs: ShareGroupHeartbeat (76), ShareGroupDescribe (77), ShareFetch (78),
ShareAcknowledge (79).

Translations between the wire (topic ids are UUIDs) and `ctx.share` (loglake.broker.share).
ShareFetch reads through `engine.read_async` and returns whole record batches with the ranges
acquired from them (`AcquiredRecords`); the client delivers only those. Acknowledgements (in
ShareAcknowledge, or piggybacked on ShareFetch) are answered only once the share-partition's new
state is durable in the metadata store.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from concurrent.futures import Future

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.handlers.consumer_groups import ZERO_TOPIC_ID_HEX, heartbeat_response
from loglake.broker.handlers.errors import (
    GROUP_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    coordinator_error,
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
)
from loglake.broker.security.quotas import CONSUMER_BYTE_RATE
from loglake.broker.share.coordinator import Heartbeat, ShareSession
from loglake.broker.share.partition import Acquired, SharePartition
from loglake.broker.share.store import ShareKey
from loglake.errors import CorruptRecordError, MetaFencedError, UnknownTopicError
from loglake.kafka_errors import ErrorCode
from loglake.records.batch import LENGTH_FIELD_END, peek_header

#: Bytes read per share-partition and fetch when the request gives no smaller bound.
PARTITION_READ_BYTES = 1024 * 1024
#: Records acquired per fetch when the request's MaxRecords is not positive (Kafka's max.poll.records).
DEFAULT_MAX_RECORDS = 500
#: Longest a ShareFetch waits for records (ms), whatever its MaxWaitMs says.
MAX_WAIT_MS = 30_000

_NO_LEADER = {"leader_id": -1, "leader_epoch": -1}


async def share_group_heartbeat(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    refused: tuple[int, str | None] | None = None
    if not check(ctx, conn, AclOperation.READ, GROUP, body.group_id):
        refused = GROUP_AUTHORIZATION_FAILED, None
    elif body.subscribed_topic_names and (topics := denied(ctx, conn, AclOperation.DESCRIBE, TOPIC, body.subscribed_topic_names)):
        refused = TOPIC_AUTHORIZATION_FAILED, f"Unauthorized topics: {', '.join(sorted(topics))}"
    elif (code := coordinator_error(ctx, body.group_id)) != ErrorCode.NONE:
        refused = code, None
    elif ctx.coordinator is not None and ctx.coordinator.group_state(body.group_id) not in (None, "Dead"):
        # one namespace for consumer and share groups, as in Kafka
        refused = ErrorCode.GROUP_ID_NOT_FOUND, f"Group {body.group_id} is not a share group."
    if refused is not None:
        return {"throttle_time_ms": 0, "error_code": refused[0], "error_message": refused[1],
                "member_id": body.member_id, "member_epoch": body.member_epoch}
    names = body.subscribed_topic_names
    result = ctx.share.heartbeat(
        Heartbeat(
            group_id=body.group_id,
            member_id=body.member_id,
            member_epoch=body.member_epoch,
            rack_id=body.rack_id,
            subscribed=list(names) if names is not None else None,
            client_id=req.client_id or "",
            client_host=_client_host(conn),
        )
    )
    return heartbeat_response(result)


async def share_group_describe(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    out: list[dict[str, object]] = []
    refused = denied(ctx, conn, AclOperation.DESCRIBE, GROUP, req.body.group_ids)
    with_ops = bool(req.body.include_authorized_operations)
    for group_id in req.body.group_ids:
        if group_id in refused:
            out.append({"error_code": GROUP_AUTHORIZATION_FAILED, "group_id": group_id, "group_state": "",
                        "assignor_name": "", "error_message": "Group authorization failed."})
            continue
        code = coordinator_error(ctx, group_id)
        group = ctx.share.group(group_id) if code == ErrorCode.NONE else None
        if group is None:
            code = code or ErrorCode.GROUP_ID_NOT_FOUND
            out.append({"error_code": code, "group_id": group_id, "group_state": "", "assignor_name": "",
                        "error_message": f"Group {group_id} not found." if code == ErrorCode.GROUP_ID_NOT_FOUND else None})
            continue
        out.append({
            "error_code": 0,
            "group_id": group_id,
            "group_state": group.state,
            "group_epoch": group.epoch,
            "assignment_epoch": group.epoch,
            "assignor_name": "simple",
            "members": [
                {
                    "member_id": m.member_id,
                    "rack_id": m.rack_id,
                    "member_epoch": m.epoch,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "subscribed_topic_names": list(m.subscribed),
                    "assignment": {"topic_partitions": [
                        {"topic_id": uuid.UUID(hex=tid), "topic_name": ctx.engine.topic_name_of(bytes.fromhex(tid)) or "",
                         "partitions": parts}
                        for tid, parts in sorted(m.assignment.items())
                    ]},
                }
                for m in group.members.values()
            ],
            "authorized_operations": (
                operation_bits(group_operations(ctx, conn, group_id)) if with_ops else AUTHORIZED_OPERATIONS_OMITTED
            ),
        })
    return {"throttle_time_ms": 0, "groups": out}


# ---- ShareFetch / ShareAcknowledge -------------------------------------------------------------


class _Part:
    """One partition of a request: its outcome so far."""

    __slots__ = ("ack_error", "acquired", "error", "name", "p", "records", "tid")

    def __init__(self, tid: str, p: int, name: str | None) -> None:
        self.tid, self.p, self.name = tid, p, name
        self.error: int = ErrorCode.NONE
        self.ack_error: int = ErrorCode.NONE
        self.acquired: list[Acquired] = []
        self.records: bytes | None = None


def _tid_hex(topic_id: uuid.UUID | None) -> str:
    # kafka-python decodes the zero UUID as None: an unknown topic id, not a missing one
    return topic_id.hex if topic_id is not None else ZERO_TOPIC_ID_HEX


def _resolve(ctx: BrokerContext, conn: Conn, group_id: str, tid: str, p: int, parts: dict[tuple[str, int], _Part]) -> _Part:
    """The request's entry for (tid, p), with UNKNOWN_TOPIC_ID / TOPIC_AUTHORIZATION_FAILED /
    NOT_LEADER_OR_FOLLOWER when it cannot be served here."""
    part = parts.get((tid, p))
    if part is not None:
        return part
    name = ctx.engine.topic_name_of(bytes.fromhex(tid))
    try:
        count = ctx.engine.topic(name).partitions if name is not None else 0
    except UnknownTopicError:  # deleted meanwhile
        name, count = None, 0
    part = parts[(tid, p)] = _Part(tid, p, name)
    if name is None or not 0 <= p < count:
        part.error = ErrorCode.UNKNOWN_TOPIC_ID if name is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    elif not check(ctx, conn, AclOperation.READ, TOPIC, name):
        part.error = TOPIC_AUTHORIZATION_FAILED
    elif ctx.view.leader_of(bytes.fromhex(tid), p) != ctx.node_id:
        part.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
        ctx.share.drop_partition((group_id, tid, p))
    return part


#: A share-partition's state being stored, with the request's entry an acknowledgement answers on.
_Save = tuple[_Part, Future[int]]


def _acknowledge(ctx: BrokerContext, group_id: str, member_id: str, part: _Part,
                 batches: Iterable[tuple[int, int, list[int]]], saves: list[_Save]) -> None:
    if part.error != ErrorCode.NONE:
        part.ack_error = part.error
        return
    sp = _share_partition(ctx, group_id, part)
    if sp is None:
        part.ack_error = ErrorCode.INVALID_RECORD_STATE
        return
    changed = False
    for first, last, types in batches:
        code = sp.acknowledge(member_id, first, last, types)
        if code != ErrorCode.NONE:
            part.ack_error = code
        else:
            changed = True
    if changed:
        saves.append((part, ctx.share.persist((group_id, part.tid, part.p))))


def _share_partition(ctx: BrokerContext, group_id: str, part: _Part) -> SharePartition | None:
    assert part.name is not None
    key: ShareKey = (group_id, part.tid, part.p)
    sp = ctx.share.partition(key, ctx.engine.leader_epoch(part.name, part.p))
    if sp is None:
        return None
    start = ctx.engine.partition_info(part.name, part.p).log_start_offset
    if sp.skip_to(start):
        ctx.share.persist(key)
    return sp


async def _durable(saves: list[_Save]) -> None:
    """Wait until every acknowledgement's state is stored. One refused because another broker
    leads the partition now (cluster mode's fence) is answered NOT_LEADER_OR_FOLLOWER: the client
    asks the new leader, whose state wins."""
    for part, f in saves:
        try:
            await asyncio.wrap_future(f)
        except MetaFencedError:
            part.ack_error = ErrorCode.NOT_LEADER_OR_FOLLOWER


#: An admin's write of one share-partition, with the response row that answers it.
_AdminSave = tuple[dict[str, object], Future[int]]


async def _stored(saves: list[_AdminSave]) -> None:
    """Wait until every admin write is stored. One that kept losing its compare-and-swap to other
    admin writes (cluster mode, loglake.cluster.shares) is answered COORDINATOR_NOT_AVAILABLE,
    which clients retry."""
    for row, f in saves:
        try:
            await asyncio.wrap_future(f)
        except MetaFencedError as exc:
            row.update(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, error_message=str(exc))


def _batches(data: bytes) -> list[tuple[int, int, bool, int, int]]:
    """(base, last, is control, position, size) of each whole batch in `data`."""
    out: list[tuple[int, int, bool, int, int]] = []
    pos = 0
    while pos + LENGTH_FIELD_END <= len(data):
        try:
            h = peek_header(data, pos)
        except CorruptRecordError:  # the engine returns whole batches: nothing past a bad one is served
            break
        if pos + h.size > len(data):
            break
        out.append((h.base_offset, h.last_offset, h.is_control, pos, h.size))
        pos += h.size
    return out


def _aborted(data: bytes, found: list[tuple[int, int, bool, int, int]], aborted: list[tuple[int, int]]) -> set[int]:
    """Positions of the batches of aborted transactions (a read_committed consumer's rule: from an
    aborted transaction's first offset, its producer's batches up to its control marker)."""
    starts = sorted((first, pid) for pid, first in aborted)
    active: set[int] = set()
    out: set[int] = set()
    i = 0
    for base, _, control, pos, _ in found:
        while i < len(starts) and starts[i][0] <= base:
            active.add(starts[i][1])
            i += 1
        h = peek_header(data, pos)
        if h.producer_id in active:
            if control:
                active.discard(h.producer_id)
            elif h.is_transactional:
                out.add(pos)
    return out


async def _fetch_one(ctx: BrokerContext, group_id: str, member_id: str, part: _Part, max_records: int, max_bytes: int) -> int:
    """Acquire up to `max_records` records of one partition for the member; the count acquired."""
    assert part.name is not None
    sp = _share_partition(ctx, group_id, part)
    if sp is None:
        return 0
    key: ShareKey = (group_id, part.tid, part.p)
    if sp.expire(ctx.share.clock()):
        ctx.share.persist(key)
    if not sp.can_acquire():
        return 0
    offset = sp.fetch_from()
    info = ctx.engine.partition_info(part.name, part.p)
    if offset >= info.high_watermark:
        return 0
    if ctx.group_configs.share_read_committed(group_id):  # share.isolation.level
        result, lso, aborted = await asyncio.wrap_future(
            ctx.engine.read_committed_async(part.name, part.p, offset, max_bytes))
        data = b"".join(bytes(c) for c in result.chunks if isinstance(c, bytes | bytearray | memoryview))
        found = [b for b in _batches(data) if b[0] < lso]  # nothing of an open transaction yet
        skip = _aborted(data, found, aborted)
    else:
        result = await asyncio.wrap_future(ctx.engine.read_async(part.name, part.p, offset, max_bytes))
        data = b"".join(bytes(c) for c in result.chunks if isinstance(c, bytes | bytearray | memoryview))
        found = _batches(data)
        skip = set()
    # control batches and aborted transactions' batches are never delivered: archived as gaps
    got = sp.acquire(member_id, [(b, la, c or pos in skip) for b, la, c, pos, _ in found], max_records,
                     ctx.share.clock())
    if not got:
        return 0
    part.acquired.extend(got)
    keep = [data[pos : pos + size] for b, la, _, pos, size in found
            if any(first <= la and b <= last for first, last, _ in got)]
    part.records = (part.records or b"") + b"".join(keep)
    return sum(last - first + 1 for first, last, _ in got)


def _session_error(ctx: BrokerContext, conn: Conn, group_id: str | None, member_id: str | None,
                   epoch: int) -> ShareSession | int:
    if not group_id or not member_id:
        return ErrorCode.INVALID_REQUEST
    if not check(ctx, conn, AclOperation.READ, GROUP, group_id):
        return GROUP_AUTHORIZATION_FAILED
    return ctx.share.session(group_id, member_id, epoch)


def _responses(parts: Iterable[_Part], *, fetch: bool) -> list[dict[str, object]]:
    by_topic: dict[str, list[dict[str, object]]] = {}
    for part in parts:
        entry: dict[str, object] = {"partition_index": part.p, "error_code": part.error, "current_leader": _NO_LEADER}
        if fetch:
            # librdkafka 2.16 takes a null Records as a malformed response: empty bytes instead
            entry.update(acknowledge_error_code=part.ack_error, records=part.records or b"",
                         acquired_records=[{"first_offset": f, "last_offset": la, "delivery_count": n}
                                           for f, la, n in part.acquired])
        else:
            entry["error_code"] = part.error or part.ack_error
        by_topic.setdefault(part.tid, []).append(entry)
    return [{"topic_id": uuid.UUID(hex=tid), "partitions": ps} for tid, ps in by_topic.items()]


async def share_fetch(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    session = _session_error(ctx, conn, body.group_id, body.member_id, body.share_session_epoch)
    if isinstance(session, int):
        return {"throttle_time_ms": 0, "error_code": session,
                "acquisition_lock_timeout_ms": ctx.share.limits.record_lock_duration_ms, "responses": []}
    lock_ms = ctx.share.lock_ms(body.group_id)  # share.record.lock.duration.ms
    group_id, member_id, epoch = body.group_id, body.member_id, body.share_session_epoch
    parts: dict[tuple[str, int], _Part] = {}
    saves: list[_Save] = []
    acked: set[tuple[str, int]] = set()
    for topic in body.topics:
        tid = _tid_hex(topic.topic_id)
        for fp in topic.partitions:
            part = _resolve(ctx, conn, group_id, tid, fp.partition_index, parts)
            if epoch != -1 and part.error == ErrorCode.NONE:  # only partitions that exist: the session stays bounded
                session.partitions.add((tid, fp.partition_index))
            if fp.acknowledgement_batches:
                acked.add((tid, fp.partition_index))
                _acknowledge(ctx, group_id, member_id, part,
                             [(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in fp.acknowledgement_batches],
                             saves)
    for ft in body.forgotten_topics_data or []:
        for p in ft.partitions:
            session.partitions.discard((_tid_hex(ft.topic_id), p))
    if epoch == -1:
        ctx.share.close_session(group_id, member_id)
        await _durable(saves)
        return {"throttle_time_ms": 0, "error_code": 0, "acquisition_lock_timeout_ms": lock_ms,
                "responses": _responses([parts[k] for k in acked], fetch=True)}
    max_records = body.max_records if body.max_records > 0 else DEFAULT_MAX_RECORDS
    budget = body.max_bytes if body.max_bytes > 0 else PARTITION_READ_BYTES  # bytes left for the response
    quotas = ctx.quotas  # the consumer byte-rate quota holds share consumers as it holds Fetch's
    cap = quotas.fetch_cap(conn, req) if quotas.enabled(CONSUMER_BYTE_RATE) else None
    if cap is not None:
        budget = min(budget, cap)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(max(body.max_wait_ms, 0), MAX_WAIT_MS) / 1000
    fetched = 0
    while True:
        for tid, p in sorted(session.partitions):
            if fetched >= max_records:
                break
            part = _resolve(ctx, conn, group_id, tid, p, parts)
            if part.error == ErrorCode.NONE and budget > 0:
                before = len(part.records or b"")
                fetched += await _fetch_one(ctx, group_id, member_id, part, max_records - fetched,
                                            min(budget, PARTITION_READ_BYTES))
                budget -= len(part.records or b"") - before
        remaining = deadline - loop.time()
        if fetched or acked or remaining <= 0 or not session.partitions:
            break
        waits = [asyncio.wrap_future(ctx.engine.wait_for_data(parts[k].name or "", k[1], _next_offset(ctx, group_id, k)))
                 for k in sorted(session.partitions) if parts[k].error == ErrorCode.NONE]
        # a lock that times out makes records available too: look again at least every second
        if not waits:
            await asyncio.sleep(min(remaining, 1.0))
            continue
        _, pending = await asyncio.wait(waits, timeout=min(remaining, 1.0), return_when=asyncio.FIRST_COMPLETED)
        for w in pending:
            w.cancel()
    await _durable(saves)
    shown = [p for k, p in parts.items() if k in acked or p.acquired or p.error != ErrorCode.NONE]
    throttle_ms = quotas.share_fetched(conn, req, sum(len(p.records or b"") for p in shown)) if cap is not None else 0
    return {"throttle_time_ms": throttle_ms, "error_code": 0, "acquisition_lock_timeout_ms": lock_ms,
            "responses": _responses(shown, fetch=True)}


def _next_offset(ctx: BrokerContext, group_id: str, k: tuple[str, int]) -> int:
    sp = ctx.share.partitions.get((group_id, k[0], k[1]))
    return sp.end if sp is not None else 0


async def share_acknowledge(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    session = _session_error(ctx, conn, body.group_id, body.member_id, body.share_session_epoch)
    if isinstance(session, int) or body.share_session_epoch == 0:
        code = session if isinstance(session, int) else ErrorCode.INVALID_SHARE_SESSION_EPOCH
        return {"throttle_time_ms": 0, "error_code": code, "responses": []}
    group_id, member_id = body.group_id, body.member_id
    parts: dict[tuple[str, int], _Part] = {}
    saves: list[_Save] = []
    for topic in body.topics:
        tid = _tid_hex(topic.topic_id)
        for ap in topic.partitions:
            part = _resolve(ctx, conn, group_id, tid, ap.partition_index, parts)
            _acknowledge(ctx, group_id, member_id, part,
                         [(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in ap.acknowledgement_batches],
                         saves)
    if body.share_session_epoch == -1:
        ctx.share.close_session(group_id, member_id)
    await _durable(saves)
    return {"throttle_time_ms": 0, "error_code": 0, "responses": _responses(parts.values(), fetch=False)}


# ---- Describe/Alter/DeleteShareGroupOffsets ---------------------------------------------------


def _group_gate(ctx: BrokerContext, conn: Conn, group_id: str, operation: int) -> tuple[int, str | None]:
    """Why this broker cannot act on `group_id`'s share-partitions now, or (NONE, None)."""
    if not check(ctx, conn, operation, GROUP, group_id):
        return GROUP_AUTHORIZATION_FAILED, None
    code = coordinator_error(ctx, group_id)
    if code != ErrorCode.NONE:
        return code, None
    if not ctx.share.known(group_id):
        return ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a share group."
    return ErrorCode.NONE, None


def _topic_id(ctx: BrokerContext, name: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(bytes=ctx.engine.topic_id_of(name))
    except UnknownTopicError:  # the zero id, as Kafka answers
        return None


async def describe_share_group_offsets(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    out: list[dict[str, object]] = []
    for g in req.body.groups:
        code, message = _group_gate(ctx, conn, g.group_id, AclOperation.DESCRIBE)
        if code != ErrorCode.NONE:
            out.append({"group_id": g.group_id, "topics": [], "error_code": code, "error_message": message})
            continue
        wanted: dict[str, list[int]] = {}
        if g.topics is None:  # every share-partition with state
            for _, tid_hex, p in ctx.share.store.keys(g.group_id):
                name = ctx.engine.topic_name_of(bytes.fromhex(tid_hex))
                if name is not None:
                    wanted.setdefault(name, []).append(p)
        else:
            for t in g.topics:
                wanted.setdefault(t.topic_name, []).extend(t.partitions)
        topics = []
        for name, parts in sorted(wanted.items()):
            tid = _topic_id(ctx, name)
            allowed_topic = check(ctx, conn, AclOperation.DESCRIBE, TOPIC, name)
            rows = []
            for p in sorted(set(parts)):
                if not allowed_topic:
                    rows.append({"partition_index": p, "start_offset": -1, "leader_epoch": -1,
                                 "error_code": TOPIC_AUTHORIZATION_FAILED})
                elif tid is None:
                    rows.append({"partition_index": p, "start_offset": -1, "leader_epoch": -1,
                                 "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
                else:
                    rows.append({"partition_index": p, "start_offset": ctx.share.start_offset((g.group_id, tid.hex, p)),
                                 "leader_epoch": -1, "error_code": 0})
            topics.append({"topic_name": name, "topic_id": tid, "partitions": rows})
        out.append({"group_id": g.group_id, "topics": topics, "error_code": 0})
    return {"throttle_time_ms": 0, "groups": out}


async def alter_share_group_offsets(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    code, message = _group_gate(ctx, conn, body.group_id, AclOperation.READ)
    if code == ErrorCode.NONE and not ctx.share.is_empty(body.group_id):
        code, message = ErrorCode.NON_EMPTY_GROUP, "The group has active members: stop them first."
    saves: list[_AdminSave] = []
    topics = []
    for t in body.topics:
        tid = _topic_id(ctx, t.topic_name)
        rows: list[dict[str, object]] = []
        for p in t.partitions:
            err: int = code
            if err == ErrorCode.NONE and not check(ctx, conn, AclOperation.READ, TOPIC, t.topic_name):
                err = TOPIC_AUTHORIZATION_FAILED
            elif err == ErrorCode.NONE and (tid is None or not 0 <= p.partition_index < ctx.engine.topic(t.topic_name).partitions):
                err = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif err == ErrorCode.NONE and p.start_offset < 0:
                err = ErrorCode.INVALID_REQUEST
            rows.append({"partition_index": p.partition_index, "error_code": err,
                         "error_message": message if err == code else None})
            if err == ErrorCode.NONE and tid is not None:
                saves.append((rows[-1], ctx.share.reset((body.group_id, tid.hex, p.partition_index), p.start_offset)))
        topics.append({"topic_name": t.topic_name, "topic_id": tid, "partitions": rows})
    await _stored(saves)
    return {"throttle_time_ms": 0, "responses": topics}


async def delete_share_group_offsets(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    code, message = _group_gate(ctx, conn, body.group_id, AclOperation.DELETE)
    if code == ErrorCode.NONE and not ctx.share.is_empty(body.group_id):
        code, message = ErrorCode.NON_EMPTY_GROUP, "The group has active members: stop them first."
    if code != ErrorCode.NONE:
        return {"throttle_time_ms": 0, "error_code": code, "error_message": message, "responses": []}
    stored = ctx.share.store.keys(body.group_id)
    saves: list[_AdminSave] = []
    topics = []
    for t in body.topics:
        tid = _topic_id(ctx, t.topic_name)
        if tid is None or not check(ctx, conn, AclOperation.READ, TOPIC, t.topic_name):
            err = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tid is None else TOPIC_AUTHORIZATION_FAILED
            topics.append({"topic_name": t.topic_name, "topic_id": tid, "partitions": [{"partition_index": 0, "error_code": err}]})
            continue
        rows: list[dict[str, object]] = []
        for p in sorted(p for _, k, p in stored if k == tid.hex):
            rows.append({"partition_index": p, "error_code": 0})
            # uninitialised: the next fetch starts it afresh from share.auto.offset.reset
            saves.append((rows[-1], ctx.share.reset((body.group_id, tid.hex, p), -1)))
        topics.append({"topic_name": t.topic_name, "topic_id": tid, "partitions": rows})
    await _stored(saves)
    return {"throttle_time_ms": 0, "error_code": 0, "responses": topics}


HANDLERS: dict[int, Handler] = {
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: describe_share_group_offsets,
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: alter_share_group_offsets,
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: delete_share_group_offsets,
    ApiKey.SHARE_GROUP_HEARTBEAT: share_group_heartbeat,
    ApiKey.SHARE_GROUP_DESCRIBE: share_group_describe,
    ApiKey.SHARE_FETCH: share_fetch,
    ApiKey.SHARE_ACKNOWLEDGE: share_acknowledge,
}
