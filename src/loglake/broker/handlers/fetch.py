"""Fetch (1): long poll with max_wait_ms / min_bytes, max_bytes and partition_max_bytes.

Size rules follow KIP-74: partitions are filled in request order; the first partition with data
returns at least one whole batch even when it is larger than the limits, later partitions only
what still fits. Hot segment data goes out as file ranges (sendfile); unsealed data from memory
buffers without copies. Before a response leaves, `fetch_limit_violations` checks it against the
rule; a partition that breaks it (a bug) is sent without records and logged, so that a client's
`receive.message.max.bytes` is never exceeded.

Fetch sessions (KIP-227) live in `loglake.broker.fetch_sessions`: `handle` asks the session cache
for a plan, reads the plan's partitions (an incremental fetch's are the session's, in its order)
exactly as a full fetch, and lets the plan trim the response and stamp the session id. A
sessionless fetch (session_id 0, epoch -1) skips all of that.

A partition whose `current_leader_epoch` (v9+; -1: no check) differs from the partition's epoch
is answered FENCED_LEADER_EPOCH (older) or UNKNOWN_LEADER_EPOCH (newer), with the current leader
and epoch on v12+, so the client refreshes its metadata and validates its position
(OffsetForLeaderEpoch).

Isolation (v4+): read_uncommitted returns everything below the high watermark; read_committed
(isolation_level 1) only batches below the last stable offset, with the aborted transactions the
client must filter out (engine/txn.py). Every response carries the LSO as `last_stable_offset`.

Consumer byte-rate quotas (loglake.broker.security.quotas): a fetch's max_bytes is capped at what the
quota allows in one window; a response that would go over the quota goes out empty with
`throttle_time_ms`, its bytes not counted, and the connection is muted for that time (Kafka's rule).

Long polling: a response is held until it has `min_bytes` of records (0: answered at once, as in
Kafka) or `max_wait_ms` has passed
(capped at FETCH_WAIT_MS_MAX), waking whenever any requested partition grows.

Fetch from follower (KIP-392, v11+): a consumer that names its rack (`rack_id`, librdkafka's and
Java's `client.rack`) and fetches from a partition's leader is sent to a replica in its rack when
the leader is not in it: the partition is answered without records, with that replica as
`preferred_read_replica`, and the response is not held. The choice is the cluster view's
(`ClusterView.read_replica_for`: a single node has no other replica), made only while the fetch
offset is inside the leader's committed log (Kafka's rule: a replica is chosen only if it holds the
offset). Any broker serves the read: a non-leader answers from the committed data its view of the
shared log has applied, with that view's high watermark. Its view may trail the leader's by an
etcd watch event: a fetch offset past its high watermark there is OFFSET_NOT_AVAILABLE (retriable,
as a Kafka follower answers a consumer ahead of its high watermark), not OFFSET_OUT_OF_RANGE, which
would make the consumer reset its position.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Set

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext
from loglake.broker.handlers.errors import (
    NONE,
    OFFSET_NOT_AVAILABLE,
    OFFSET_OUT_OF_RANGE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    epoch_check,
    error_code,
)
from loglake.broker.protocol import (
    AbortedTransaction,
    Chunk,
    DecodedRequest,
    FetchPartition,
    FetchResponseData,
    FetchTopic,
    LeaderIdAndEpoch,
    batch_bytes,
    fetch_limit_violations,
)
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.security.authorized import TOPIC, AclOperation, denied
from loglake.broker.security.quotas import CONSUMER_BYTE_RATE
from loglake.errors import LoglakeError, OffsetOutOfRangeError, UnknownTopicError
from loglake.logsafe import RateLimitedLog

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

READ_COMMITTED = 1
#: Longest a fetch may wait, whatever the client asks (Kafka has no cap; a bound keeps shutdown prompt).
FETCH_WAIT_MS_MAX = 30_000
#: At most one log line per this many seconds about responses that broke the size rule.
LIMIT_LOG_INTERVAL_S = 60.0
_size_rule_log = RateLimitedLog(log, LIMIT_LOG_INTERVAL_S)


def _resolve(
    ctx: BrokerContext, topic: KafkaStruct, version: int, by_id: dict[uuid.UUID, str] | None
) -> tuple[str | None, dict[uuid.UUID, str] | None]:
    if version >= 13:
        by_id = by_id or {uuid.UUID(hex=t.topic_id): t.name for t in ctx.engine.topics()}
        return by_id.get(topic.topic_id), by_id
    return topic.topic, by_id


async def _read_all(
    ctx: BrokerContext, body: KafkaStruct, version: int, refused: Set[str] = frozenset()
) -> tuple[FetchResponseData, int, list[tuple[str, int, int]]]:
    """The response, its record bytes, and where to wait for more: (topic, partition, offset) of
    every partition read up to its high watermark. Topics in `refused` (no READ) are answered
    TOPIC_AUTHORIZATION_FAILED."""
    engine = ctx.engine
    total = 0
    max_bytes = _max_bytes(body)
    waits: list[tuple[str, int, int]] = []
    out = FetchResponseData(session_id=0)
    by_id: dict[uuid.UUID, str] | None = None
    committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
    rack = getattr(body, "rack_id", None) if version >= 11 else None
    for topic in body.topics:
        name, by_id = _resolve(ctx, topic, version, by_id)
        ftopic = FetchTopic(topic=topic.topic if version < 13 else None, topic_id=topic.topic_id if version >= 13 else None)
        out.responses.append(ftopic)
        for part in topic.partitions:
            fp = FetchPartition(partition_index=part.partition)
            ftopic.partitions.append(fp)
            if name is None:
                fp.error_code = UNKNOWN_TOPIC_ID if version >= 13 else UNKNOWN_TOPIC_OR_PARTITION
                continue
            if name in refused:
                fp.error_code = TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                info = engine.partition_info(name, part.partition)
                fp.high_watermark, fp.last_stable_offset = info.high_watermark, info.last_stable_offset
                fp.log_start_offset = info.log_start_offset
                fenced = epoch_check(info.leader_epoch, getattr(part, "current_leader_epoch", -1))
                if fenced != NONE:
                    fp.error_code = fenced
                    if version >= 12:
                        fp.current_leader = LeaderIdAndEpoch(_leader(ctx, name, part.partition), info.leader_epoch)
                    continue
                if rack and _redirect(ctx, fp, name, part.fetch_offset, info.log_start_offset, info.high_watermark, rack):
                    continue  # the client fetches it from the replica in its rack
                if total and total >= max_bytes:
                    continue  # KIP-74: nothing more fits; the client fetches it next time
                limit = max(min(part.partition_max_bytes, max_bytes - total), 0)
                # Kafka's rule: only the first partition that returns data may overstep the limits,
                # by its first batch, so a consumer always progresses; any later partition returns
                # nothing when its first batch does not fit in what is left (KIP-74).
                if committed:
                    txn_read = engine.read_committed_async(
                        name, part.partition, part.fetch_offset, max(limit, 1), file_ranges=True, min_one=total == 0
                    )
                    result, lso, aborted = txn_read.result() if txn_read.done() else await asyncio.wrap_future(txn_read)
                    fp.aborted_transactions = [AbortedTransaction(pid, first) for pid, first in aborted]
                else:
                    pending = engine.read_async(
                        name, part.partition, part.fetch_offset, max(limit, 1), file_ranges=True, min_one=total == 0
                    )
                    # Cold segments are read on the engine's cold pool; never block the event loop.
                    result = pending.result() if pending.done() else await asyncio.wrap_future(pending)
                    lso = result.high_watermark if info.last_stable_offset == info.high_watermark else info.last_stable_offset
            except OffsetOutOfRangeError as exc:
                fp.error_code = OFFSET_OUT_OF_RANGE
                if part.fetch_offset > exc.high_watermark and _leader(ctx, name, part.partition) != ctx.node_id:
                    fp.error_code = OFFSET_NOT_AVAILABLE  # this replica's view trails the leader's
                fp.high_watermark = fp.last_stable_offset = exc.high_watermark
                fp.log_start_offset = exc.log_start_offset
                continue
            except UnknownTopicError:
                fp.error_code = UNKNOWN_TOPIC_OR_PARTITION
                continue
            except LoglakeError as exc:
                fp.error_code = error_code(exc)
                continue
            fp.error_code = NONE
            fp.high_watermark, fp.last_stable_offset = result.high_watermark, lso
            fp.log_start_offset = result.log_start_offset
            fp.records = result.chunks
            if result.chunks:
                total += result.size
            if part.fetch_offset >= result.high_watermark or result.chunks:
                waits.append((name, part.partition, result.high_watermark))  # long-poll on its growth
            elif committed and part.fetch_offset >= lso:
                waits.append((name, part.partition, result.high_watermark))  # held back by an open transaction
    return out, total, waits


def _redirect(ctx: BrokerContext, fp: FetchPartition, name: str, offset: int, start: int, hw: int, rack: str) -> bool:
    """KIP-392 on the partition's leader: whether to send a consumer in `rack` to another replica
    (then `fp` names it as the preferred read replica, without records)."""
    topic_id = ctx.engine.topic_id_of(name)
    if not start <= offset <= hw or ctx.view.leader_of(topic_id, fp.partition_index) != ctx.node_id:
        return False
    factor = ctx.engine.topic(name).replication_factor
    replica = ctx.view.read_replica_for(topic_id, fp.partition_index, factor, rack)
    if replica < 0 or replica == ctx.node_id:
        return False
    fp.error_code = NONE
    fp.preferred_read_replica = replica
    return True


def _redirects(response: FetchResponseData) -> bool:
    return any(p.preferred_read_replica >= 0 for t in response.responses for p in t.partitions)


def _leader(ctx: BrokerContext, name: str, partition: int) -> int:
    """The partition's leader as the cluster view names it (-1: none live)."""
    return ctx.view.leader_of(ctx.engine.topic_id_of(name), partition)


def _max_bytes(body: KafkaStruct) -> int:
    # As Kafka: 0 (or less) still returns the first batch of the first partition with data.
    return max(int(body.max_bytes), 0)


def _first_batch(chunk: Chunk) -> int:
    """Size of a chunk's first batch: from its bytes, or as the engine's index gave it."""
    if isinstance(chunk, bytes | bytearray | memoryview):
        return batch_bytes(chunk)
    return chunk.first_batch


def _enforce_limits(body: KafkaStruct, response: FetchResponseData) -> FetchResponseData:
    """Kafka's size rule, checked on what is about to be sent; records that break it are dropped
    (the client fetches them again) and logged at most once a minute."""
    limits = [[p.partition_max_bytes for p in t.partitions] for t in body.topics]
    try:
        bad = fetch_limit_violations(response, _max_bytes(body), limits, _first_batch)
    except ValueError as exc:  # a batch head that does not parse: drop nothing, say so
        _limited.warning("batch_head", "fetch size check could not read a batch head: %s", exc)
        return response
    if not bad:
        return response
    for t_i, p_i, _why in bad:
        response.responses[t_i].partitions[p_i].records = ()
    t_i, p_i, why = bad[0]
    topic = response.responses[t_i]
    name = topic.topic if topic.topic is not None else topic.topic_id
    _size_rule_log.error(
        "size_rule",
        "fetch response broke Kafka's size rule (max_bytes %d) at %s-%d: %s; records withheld "
        "(%d partition(s) this response)",
        _max_bytes(body), name, topic.partitions[p_i].partition_index, why, len(bad),
    )
    return response


async def handle(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> FetchResponseData:
    plan = ctx.fetch_sessions.begin(req.body, req.api_version)
    if plan is not None and plan.body is None:
        return plan.error_response()
    body = req.body if plan is None else plan.body
    quotas = ctx.quotas
    cap = quotas.fetch_cap(conn, req) if quotas.enabled(CONSUMER_BYTE_RATE) else None
    if cap is not None and cap < _max_bytes(body):
        body = _QuotaCapped(body, cap)
    response = await _fetch(ctx, conn, req, body)
    if cap is not None:
        throttle_ms = quotas.fetched(conn, req, response_bytes(response))
        if throttle_ms:
            # Kafka's throttled fetch: no partitions, nothing counted; the session (if any) stays as it was.
            return FetchResponseData(throttle_time_ms=throttle_ms, session_id=plan.throttled_session_id() if plan else 0)
    return response if plan is None else plan.finish(response)


class _QuotaCapped:
    """A fetch whose max_bytes is lowered to what the consumer quota allows in one window (Kafka's
    getMaxValueInQuotaWindow), so that one response never takes more than the quota can pay back."""

    def __init__(self, body: KafkaStruct, cap: int) -> None:
        self._body = body
        self.max_bytes = cap
        self.min_bytes = min(int(body.min_bytes), cap)

    def __getattr__(self, name: str) -> KafkaStruct:
        return getattr(self._body, name)


def response_bytes(response: FetchResponseData) -> int:
    """Record bytes of a fetch response (what the consumer byte-rate quota counts)."""
    total = 0
    for topic in response.responses:
        for part in topic.partitions:
            for chunk in part.records or ():
                if isinstance(chunk, bytes | bytearray | memoryview):
                    total += memoryview(chunk).nbytes
                else:
                    total += chunk.length
    return total


async def _fetch(ctx: BrokerContext, conn: Conn, req: DecodedRequest, body: KafkaStruct) -> FetchResponseData:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(max(body.max_wait_ms, 0), FETCH_WAIT_MS_MAX) / 1000.0
    # Checked once per request (not per long-poll round), so a refusal is one audit line.
    by_id: dict[uuid.UUID, str] | None = None
    names = []
    for topic in body.topics:
        name, by_id = _resolve(ctx, topic, req.api_version, by_id)
        if name is not None:
            names.append(name)
    refused = denied(ctx, conn, AclOperation.READ, TOPIC, names)
    while True:
        response, total, waits = await _read_all(ctx, body, req.api_version, refused)
        remaining = deadline - loop.time()
        # min_bytes <= 0: answer at once, whatever there is (Kafka's rule); so is a response that
        # sends the client to another replica (Kafka's hasPreferredReadReplica)
        if (
            body.min_bytes <= 0 or total >= body.min_bytes or remaining <= 0 or not waits or conn.closing
            or _redirects(response)
        ):  # fmt: skip
            return _enforce_limits(body, response)
        waiters = []
        for name, partition, offset in waits:
            try:
                waiters.append(asyncio.wrap_future(ctx.engine.wait_for_data(name, partition, offset)))
            except LoglakeError:
                continue
        if not waiters:
            return _enforce_limits(body, response)
        done, not_done = await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        for w in not_done:
            w.cancel()
        if not done:
            return _enforce_limits(body, (await _read_all(ctx, body, req.api_version, refused))[0])
