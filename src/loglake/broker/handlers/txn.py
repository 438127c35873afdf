"""Transaction APIs: AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26), TxnOffsetCommit
(28), DescribeTransactions (65), ListTransactions (66). The state machine is
loglake.broker.txn.TxnCoordinator; these map requests onto it and its answers onto responses.

AddPartitionsToTxn v0-3 is the client form (one transaction); v4+ is the batched form (several
transactions, `verify_only` checks membership without adding), as Kafka's brokers send it.
"""

from __future__ import annotations

import logging
import re

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.security.authorized import (
    GROUP,
    TOPIC,
    TRANSACTIONAL_ID,
    AclOperation,
    allowed,
    check,
    cluster_allowed,
    denied,
)
from loglake.broker.txn.coordinator import Txn
from loglake.engine.partition_log import FEATURE_CODES, Feature
from loglake.errors import LoglakeError
from loglake.kafka_errors import ErrorCode
from loglake.logsafe import RateLimitedLog
from loglake.meta.txn_states import KAFKA_NAMES, TxnState, by_kafka_name

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)
E = ErrorCode

#: Most transactional ids one DescribeTransactions request may name.
DESCRIBE_IDS_MAX = 10_000
#: Longest ListTransactions transactional-id pattern accepted.
PATTERN_CHARS_MAX = 1_000


def _failed(what: str, exc: BaseException) -> int:
    _limited.warning(what, "%s failed: %s", what, exc)
    return E.COORDINATOR_NOT_AVAILABLE


def _topic_results(codes: dict[tuple[str, int], int]) -> list[dict[str, object]]:
    by_topic: dict[str, list[dict[str, object]]] = {}
    for (name, index), code in codes.items():
        by_topic.setdefault(name, []).append({"partition_index": index, "partition_error_code": code})
    return [{"name": n, "results_by_partition": parts} for n, parts in by_topic.items()]


async def add_partitions_to_txn(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    coord = ctx.txn
    if req.api_version <= 3:
        parts = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
        tid = body.v3_and_below_transactional_id
        if not check(ctx, conn, AclOperation.WRITE, TRANSACTIONAL_ID, tid):
            codes = dict.fromkeys(parts, int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
            return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": _topic_results(codes)}
        if refused := denied(ctx, conn, AclOperation.WRITE, TOPIC, (t for t, _ in parts)):
            # Kafka: the forbidden partitions say why, the others were not attempted.
            codes = {(t, p): int(E.TOPIC_AUTHORIZATION_FAILED if t in refused else E.OPERATION_NOT_ATTEMPTED) for t, p in parts}
            return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": _topic_results(codes)}
        try:
            codes = await coord.add_partitions(
                body.v3_and_below_transactional_id, body.v3_and_below_producer_id,
                body.v3_and_below_producer_epoch, parts, req.api_version,
            )
        except LoglakeError as exc:
            codes = dict.fromkeys(parts, _failed("AddPartitionsToTxn", exc))
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": _topic_results(codes)}
    if not cluster_allowed(ctx, conn, AclOperation.CLUSTER_ACTION):  # v4+ is the brokers' batched form
        return {"throttle_time_ms": 0, "error_code": E.CLUSTER_AUTHORIZATION_FAILED, "results_by_transaction": []}
    results: list[dict[str, object]] = []
    for t in body.transactions:
        parts = [(tp.name, p) for tp in t.topics for p in tp.partitions]
        try:
            codes = await coord.add_partitions(
                t.transactional_id, t.producer_id, t.producer_epoch, parts, req.api_version, verify_only=t.verify_only
            )
        except LoglakeError as exc:
            codes = dict.fromkeys(parts, _failed("AddPartitionsToTxn", exc))
        results.append({"transactional_id": t.transactional_id, "topic_results": _topic_results(codes)})
    return {"throttle_time_ms": 0, "error_code": E.NONE, "results_by_transaction": results}


async def add_offsets_to_txn(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    b = req.body
    if not check(ctx, conn, AclOperation.WRITE, TRANSACTIONAL_ID, b.transactional_id):
        return {"throttle_time_ms": 0, "error_code": E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    if not check(ctx, conn, AclOperation.READ, GROUP, b.group_id):
        return {"throttle_time_ms": 0, "error_code": E.GROUP_AUTHORIZATION_FAILED}
    if not ctx.engine.supports(Feature.TXN_OFFSETS):
        # the engine's refusal table (loglake.engine.partition_log): the group's coordinator may
        # be another broker than the transaction's, and nothing carries the offsets there yet
        _limited.warning("txn_offsets", "AddOffsetsToTxn refused: %s", ctx.engine.log.refused[Feature.TXN_OFFSETS])
        return {"throttle_time_ms": 0, "error_code": FEATURE_CODES[Feature.TXN_OFFSETS]}
    try:
        code = await ctx.txn.add_offsets(b.transactional_id, b.producer_id, b.producer_epoch, b.group_id, req.api_version)
    except LoglakeError as exc:
        code = _failed("AddOffsetsToTxn", exc)
    return {"throttle_time_ms": 0, "error_code": code}


async def end_txn(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    b = req.body
    if not check(ctx, conn, AclOperation.WRITE, TRANSACTIONAL_ID, b.transactional_id):
        return {"throttle_time_ms": 0, "error_code": E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    try:
        code = await ctx.txn.end_txn(b.transactional_id, b.producer_id, b.producer_epoch, bool(b.committed), req.api_version)
    except LoglakeError as exc:
        code = _failed("EndTxn", exc)
    return {"throttle_time_ms": 0, "error_code": code}


async def txn_offset_commit(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    b = req.body
    offsets = [
        (t.name, p.partition_index, p.committed_offset, getattr(p, "committed_leader_epoch", -1), p.committed_metadata)
        for t in b.topics
        for p in t.partitions
    ]
    codes: dict[tuple[str, int], int] = {}
    whole = None  # the error of the whole request: Kafka checks the transactional id, then the group
    if not check(ctx, conn, AclOperation.WRITE, TRANSACTIONAL_ID, b.transactional_id):
        whole = int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    elif not check(ctx, conn, AclOperation.READ, GROUP, b.group_id):
        whole = int(E.GROUP_AUTHORIZATION_FAILED)
    elif refused := denied(ctx, conn, AclOperation.READ, TOPIC, (t for t, *_ in offsets)):
        codes = {(t, p): int(E.TOPIC_AUTHORIZATION_FAILED) for t, p, *_ in offsets if t in refused}
        offsets = [o for o in offsets if o[0] not in refused]
    if whole is not None:
        codes = dict.fromkeys(((t, p) for t, p, *_ in offsets), whole)
    elif offsets or not codes:
        try:
            codes.update(await ctx.txn.txn_offset_commit(b.transactional_id, b.producer_id, b.producer_epoch, b.group_id, offsets))
        except LoglakeError as exc:
            codes.update(dict.fromkeys(((t, p) for t, p, *_ in offsets), _failed("TxnOffsetCommit", exc)))
    by_topic: dict[str, list[dict[str, object]]] = {}
    for (name, index), code in codes.items():
        by_topic.setdefault(name, []).append({"partition_index": index, "error_code": code})
    return {"throttle_time_ms": 0, "topics": [{"name": n, "partitions": parts} for n, parts in by_topic.items()]}


def _topics_of(ctx: BrokerContext, conn: Conn, txn: Txn) -> list[dict[str, object]]:
    """The transaction's partitions, of the topics the principal may describe (as Kafka lists them)."""
    by_topic: dict[str, list[int]] = {}
    for name, index in txn.parts:
        if not allowed(ctx, conn, AclOperation.DESCRIBE, TOPIC, name):
            continue
        by_topic.setdefault(name, []).append(index)
    return [{"topic": n, "partitions": sorted(ps)} for n, ps in by_topic.items()]


async def describe_transactions(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    states: list[dict[str, object]] = []
    tids = list(req.body.transactional_ids)[:DESCRIBE_IDS_MAX]
    refused = denied(ctx, conn, AclOperation.DESCRIBE, TRANSACTIONAL_ID, tids)
    for tid in tids:
        if tid in refused:
            states.append({"error_code": E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactional_id": tid,
                           "transaction_state": "", "transaction_timeout_ms": 0, "transaction_start_time_ms": -1,
                           "producer_id": -1, "producer_epoch": -1, "topics": []})
            continue
        txn = ctx.txn.describe(tid)
        if txn is None:
            states.append({"error_code": E.TRANSACTIONAL_ID_NOT_FOUND, "transactional_id": tid, "transaction_state": "",
                           "transaction_timeout_ms": 0, "transaction_start_time_ms": -1, "producer_id": -1,
                           "producer_epoch": -1, "topics": []})
            continue
        states.append({
            "error_code": E.NONE,
            "transactional_id": tid,
            "transaction_state": KAFKA_NAMES[txn.state],
            "transaction_timeout_ms": txn.timeout_ms,
            "transaction_start_time_ms": txn.start_ms if txn.state is not TxnState.EMPTY else -1,
            "producer_id": txn.pid,
            "producer_epoch": txn.epoch,
            "topics": _topics_of(ctx, conn, txn),
        })
    return {"throttle_time_ms": 0, "transaction_states": states}


async def list_transactions(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    b = req.body
    wanted = list(b.state_filters or [])
    unknown = [s for s in wanted if by_kafka_name(s) is None]
    states = {st for s in wanted if (st := by_kafka_name(s)) is not None}
    pids = set(b.producer_id_filters or [])
    duration = getattr(b, "duration_filter", -1)
    pattern_text = getattr(b, "transactional_id_pattern", None)
    pattern = None
    if pattern_text:
        try:
            if len(pattern_text) > PATTERN_CHARS_MAX:
                raise re.error("pattern too long")
            pattern = re.compile(pattern_text)
        except re.error:
            return {"throttle_time_ms": 0, "error_code": E.INVALID_REQUEST, "unknown_state_filters": [], "transaction_states": []}
    now = ctx.txn.now_ms()
    out = []
    for txn in ctx.txn.list():
        if states and txn.state not in states:
            continue
        if pids and txn.pid not in pids:
            continue
        if duration is not None and duration >= 0 and (txn.state is not TxnState.ONGOING or now - txn.start_ms < duration):
            continue
        if pattern is not None and not pattern.fullmatch(txn.tid):
            continue
        if not allowed(ctx, conn, AclOperation.DESCRIBE, TRANSACTIONAL_ID, txn.tid):
            continue  # Kafka lists only the ids the principal may describe
        out.append({"transactional_id": txn.tid, "producer_id": txn.pid, "transaction_state": KAFKA_NAMES[txn.state]})
    return {"throttle_time_ms": 0, "error_code": E.NONE, "unknown_state_filters": unknown, "transaction_states": out}


HANDLERS: dict[int, Handler] = {
    ApiKey.ADD_PARTITIONS_TO_TXN: add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: add_offsets_to_txn,
    ApiKey.END_TXN: end_txn,
    ApiKey.TXN_OFFSET_COMMIT: txn_offset_commit,
    ApiKey.DESCRIBE_TRANSACTIONS: describe_transactions,
    ApiKey.LIST_TRANSACTIONS: list_transactions,
}
