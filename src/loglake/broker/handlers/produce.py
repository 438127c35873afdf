"""Produce (0): batches are validated (header, size, CRC) and appended without decoding records.

acks=0 gets no response; acks=1 and acks=-1 both wait for the topic's durability class (there
are no followers, so "all in-sync replicas" is this broker's WAL). Appends of one connection
happen in arrival order (the connection's append lock); durability waits overlap.

A partition whose batch is refused (INVALID_RECORD, e.g. a keyless record in a compacted topic)
gets the offending records' batch indexes in `record_errors` and a summary in `error_message`
(both sent from v8); the request's other partitions are appended as usual.

A transactional batch (attribute bit 0x10) is appended only while its producer id and epoch own
an ongoing transaction that holds the partition (KIP-890 part 1): an older epoch gets
INVALID_PRODUCER_EPOCH, anything else INVALID_TXN_STATE (loglake.broker.txn).

While memory is short (the pool under pressure, an append that waited for memory, request bytes
spent) the response asks the client to back off with `throttle_time_ms` (loglake.broker.overload);
over its producer_byte_rate quota (loglake.broker.security.quotas) it does too and the connection is muted.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext
from loglake.broker.handlers.errors import (
    INVALID_REQUIRED_ACKS,
    NONE,
    REQUEST_TIMED_OUT,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    error_code,
)
from loglake.broker.overload import produce_throttle_ms
from loglake.broker.protocol import DecodedRequest
from loglake.broker.protocol.produce import (
    RECORD_ERRORS_FROM,
    ProducePartitionResponse,
    ProduceRequestData,
    ProduceResponseData,
    ProduceTopicResponse,
)
from loglake.broker.security.authorized import TOPIC, TRANSACTIONAL_ID, AclOperation, check, denied
from loglake.engine.types import AppendResult
from loglake.errors import InvalidRecordError, LoglakeError
from loglake.records.batch import peek_txn_producer


async def _txn_check(ctx: BrokerContext, name: str, index: int, records: memoryview) -> int:
    """NONE, or why a transactional batch may not be appended (KIP-890 part 1)."""
    producer = peek_txn_producer(records)
    if producer is None:
        return NONE
    pid, epoch = producer
    return await ctx.txn.check_produce_synced(pid, epoch, name, index)


#: (topic, partition, append future or None, error code, error message, record errors)
Pending = tuple[str | None, int, Future[AppendResult] | None, int, str | None, tuple[tuple[int, str], ...]]


def _error_fields(exc: BaseException) -> tuple[int, str, tuple[tuple[int, str], ...]]:
    """Error code, message and record errors (batch index, message) of a refused append."""
    record_errors = exc.record_errors if isinstance(exc, InvalidRecordError) else ()
    return error_code(exc), str(exc), record_errors


def _partition_response(
    version: int,
    index: int,
    code: int,
    result: AppendResult | None,
    message: str | None = None,
    record_errors: tuple[tuple[int, str], ...] = (),
) -> ProducePartitionResponse:
    if result is None:
        base_offset = log_append_time = log_start_offset = -1
    else:
        base_offset, log_append_time, log_start_offset = result.base_offset, result.log_append_time, result.log_start_offset
    return ProducePartitionResponse(
        index,
        code,
        base_offset,
        log_append_time,
        log_start_offset,
        # no such fields before v8 (the encoder leaves them out)
        list(record_errors) if version >= RECORD_ERRORS_FROM else [],
        message,
    )


async def handle(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> ProduceResponseData | None:
    body: ProduceRequestData = req.body
    engine = ctx.engine
    pending: list[Pending] = []
    refuse = NONE
    if body.acks not in (-1, 0, 1):
        refuse = INVALID_REQUIRED_ACKS
    pool = engine.memory_pool
    waited_s = 0.0
    forbidden: set[str] = set()
    tid = body.transactional_id
    if refuse == NONE and tid is not None and not check(ctx, conn, AclOperation.WRITE, TRANSACTIONAL_ID, tid):
        refuse = TRANSACTIONAL_ID_AUTHORIZATION_FAILED  # Kafka refuses the whole request
    elif refuse == NONE:
        forbidden = denied(ctx, conn, AclOperation.WRITE, TOPIC, (t.name for t in body.topic_data if t.name is not None))
    async with conn.append_lock:
        for topic in body.topic_data:
            name = topic.name
            for part in topic.partition_data:
                if refuse != NONE or name in forbidden:
                    pending.append((name, part.index, None, refuse or TOPIC_AUTHORIZATION_FAILED, None, ()))
                    continue
                if name is None or part.records is None or not engine.has_topic(name):
                    # a null topic name (the wire allows none before v13, which is not served) names no topic
                    code = UNKNOWN_TOPIC_OR_PARTITION if name is None or not engine.has_topic(name) else NONE
                    pending.append((name, part.index, None, code, None, ()))
                    continue
                refused = await _txn_check(ctx, name, part.index, part.records)
                if refused != NONE:
                    pending.append((name, part.index, None, refused, None, ()))
                    continue
                try:
                    ctx.schemas.check(name, part.records)  # a validated topic's records (schema ids)
                    # Never blocks the loop: the engine appends at once, or (memory short) on its
                    # own thread; this connection's next append waits until this one has offsets.
                    # The records as received: a view of the frame's own buffer (loglake.broker.receive
                    # gives Produce frames one), which the engine takes over uncopied; a read-only
                    # view (a frame in bytes) it copies once.
                    if engine.appends_at_once(len(part.records)):
                        fut = engine.append_batch(name, part.index, part.records)
                    else:
                        started = time.monotonic()
                        fut = await asyncio.wrap_future(engine.submit_batch(name, part.index, part.records))
                        waited_s += time.monotonic() - started
                    pending.append((name, part.index, fut, NONE, None, ()))
                except LoglakeError as exc:
                    pending.append((name, part.index, None, *_error_fields(exc)))
    throttle_ms = produce_throttle_ms(pool, waited_s, ctx.metrics.request_bytes)
    if throttle_ms:
        ctx.metrics.produce_throttled += 1
        ctx.metrics.produce_throttle_ms += throttle_ms
    # The producer byte-rate quota counts the request as it came (acks=0 too: the connection is
    # muted without an answer); the response carries the larger of the two throttles.
    throttle_ms = max(throttle_ms, ctx.quotas.produce(conn, req))
    if body.acks == 0:
        return None
    appends = [entry[2] for entry in pending if entry[2] is not None]
    if appends:
        # One asyncio future for the request and one deadline entry; the WAL thread's completions reach
        # the loop batched (loglake.broker.completions), not one wakeup per partition.
        countdown = ctx.completions.countdown(len(appends))
        for durable in appends:
            ctx.completions.watch(durable, countdown.one_done)
        await countdown.wait(max(body.timeout_ms, 1) / 1000.0)
    responses: dict[str | None, list[ProducePartitionResponse]] = {}
    for name, index, appended, code, message, record_errors in pending:
        result = None
        if appended is not None:
            if not appended.done():
                code, message = REQUEST_TIMED_OUT, "not durable within timeout_ms"
            elif (failure := appended.exception()) is not None:
                code, message, record_errors = _error_fields(failure)
            else:
                result = appended.result()
        responses.setdefault(name, []).append(_partition_response(req.api_version, index, code, result, message, record_errors))
    return ProduceResponseData([ProduceTopicResponse(n, parts) for n, parts in responses.items()], throttle_ms)
