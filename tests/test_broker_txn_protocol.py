"""The transaction APIs' error codes per version, on the wire (raw requests, real broker):
INVALID_TRANSACTION_TIMEOUT, PRODUCER_FENCED against INVALID_PRODUCER_EPOCH by version (KIP-588),
INVALID_PRODUCER_ID_MAPPING, KIP-890 part 1 (a transactional batch into a partition not in the
transaction is INVALID_TXN_STATE), the batched AddPartitionsToTxn v4 with verify_only, and
Fetch/ListOffsets at read_committed (last_stable_offset, aborted_transactions)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DescribeProducersRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, OffsetFetchRequest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
)

from loglake.kafka_errors import ErrorCode as E
from loglake.records.batch import BatchBuilder, split_batches
from test_broker_malformed import RawClient

from brokerkit import InProcessBroker, serving_in_process

A = AddPartitionsToTxnRequest


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data = Path(tmp_path_factory.mktemp("txnproto")) / "data"
    with serving_in_process(data, ["--default-partitions", "2"]) as b:
        yield b


def init(c: RawClient, tid: str, version: int = 4, timeout_ms: int = 60_000, pid: int = -1, epoch: int = -1) -> Any:
    return c.request(
        InitProducerIdRequest[version](
            transactional_id=tid, transaction_timeout_ms=timeout_ms, producer_id=pid, producer_epoch=epoch
        )
    )


def add(c: RawClient, version: int, tid: str, pid: int, epoch: int, topic: str, partitions: list[int]) -> dict[int, int]:
    resp = c.request(
        A[version](
            v3_and_below_transactional_id=tid,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[A.AddPartitionsToTxnTopic(name=topic, partitions=partitions)],
        )
    )
    (t,) = resp.results_by_topic_v3_and_below
    return {r.partition_index: r.partition_error_code for r in t.results_by_partition}


def produce(c: RawClient, tid: str, topic: str, partition: int, pid: int, epoch: int, seq: int) -> int:
    b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)
    b.append(int(time.time() * 1000), None, b"v%d" % seq, [])
    P = ProduceRequest.TopicProduceData
    resp = c.request(
        ProduceRequest[9](
            transactional_id=tid,
            acks=-1,
            timeout_ms=10_000,
            topic_data=[P(name=topic, partition_data=[P.PartitionProduceData(index=partition, records=b.build())])],
        )
    )
    return int(resp.responses[0].partition_responses[0].error_code)


def fetch(c: RawClient, topic: str, partition: int, isolation: int) -> Any:
    F = FetchRequest.FetchTopic
    resp = c.request(
        FetchRequest[12](
            max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=isolation,
            topics=[F(topic=topic, partitions=[F.FetchPartition(partition=partition, fetch_offset=0, partition_max_bytes=1 << 20)])],
        )
    )
    return resp.responses[0].partitions[0]


def latest(c: RawClient, topic: str, isolation: int) -> int:
    T = ListOffsetsRequest.ListOffsetsTopic
    resp = c.request(
        ListOffsetsRequest[7](
            replica_id=-1, isolation_level=isolation,
            topics=[T(name=topic, partitions=[T.ListOffsetsPartition(partition_index=0, timestamp=-1)])],
        )
    )
    return int(resp.topics[0].partitions[0].offset)


def test_transaction_error_codes_and_isolation(broker: InProcessBroker) -> None:
    topic, tid = f"proto-{uuid.uuid4().hex[:8]}", f"tid-{uuid.uuid4().hex[:8]}"
    with RawClient(broker.bootstrap) as c:
        T = MetadataRequest.MetadataRequestTopic
        assert c.request(MetadataRequest[12](topics=[T(name=topic)], allow_auto_topic_creation=True)).topics[0].error_code == 0
        assert init(c, tid, timeout_ms=900_001).error_code == E.INVALID_TRANSACTION_TIMEOUT
        first = init(c, tid)
        assert first.error_code == E.NONE and first.producer_epoch == 0
        pid = first.producer_id
        second = init(c, tid)
        assert (second.error_code, second.producer_id, second.producer_epoch) == (E.NONE, pid, 1)
        # KIP-360 resume with a stale epoch: PRODUCER_FENCED from v4, INVALID_PRODUCER_EPOCH before
        assert init(c, tid, version=4, pid=pid, epoch=0).error_code == E.PRODUCER_FENCED
        assert init(c, tid, version=3, pid=pid, epoch=0).error_code == E.INVALID_PRODUCER_EPOCH
        assert init(c, tid, version=3, pid=pid + 1, epoch=1).error_code == E.INVALID_PRODUCER_ID_MAPPING
        epoch = 1
        # fenced epochs on AddPartitionsToTxn: PRODUCER_FENCED from v2
        assert add(c, 3, tid, pid, 0, topic, [0]) == {0: E.PRODUCER_FENCED}
        assert add(c, 1, tid, pid, 0, topic, [0]) == {0: E.INVALID_PRODUCER_EPOCH}
        assert add(c, 3, tid, pid, epoch, topic, [0, 9]) == {0: E.OPERATION_NOT_ATTEMPTED, 9: E.UNKNOWN_TOPIC_OR_PARTITION}
        # KIP-890 part 1: a transactional batch into a partition not in the transaction is refused
        assert produce(c, tid, topic, 0, pid, epoch, 0) == E.INVALID_TXN_STATE
        assert add(c, 3, tid, pid, epoch, topic, [0]) == {0: E.NONE}
        assert produce(c, tid, topic, 0, pid, epoch, 0) == E.NONE
        assert produce(c, tid, topic, 1, pid, epoch, 0) == E.INVALID_TXN_STATE
        assert produce(c, tid, topic, 0, pid, 0, 1) == E.INVALID_PRODUCER_EPOCH
        # DescribeProducers: the open transaction's first offset in the partition
        dp = c.request(DescribeProducersRequest[0](topics=[DescribeProducersRequest.TopicRequest(name=topic, partition_indexes=[0])]))
        (prod,) = dp.topics[0].partitions[0].active_producers
        assert (prod.producer_id, prod.current_txn_start_offset) == (pid, 0)
        # v4+: the batched form; verify_only checks membership without adding
        resp = c.request(
            A[4](transactions=[A.AddPartitionsToTxnTransaction(
                transactional_id=tid, producer_id=pid, producer_epoch=epoch, verify_only=True,
                topics=[A.AddPartitionsToTxnTopic(name=topic, partitions=[0, 1])],
            )])
        )
        (result,) = resp.results_by_transaction
        codes = {r.partition_index: r.partition_error_code for r in result.topic_results[0].results_by_partition}
        assert codes == {0: E.NONE, 1: E.INVALID_TXN_STATE}
        # read_committed stops at the open transaction's start; read_uncommitted sees the record
        held = fetch(c, topic, 0, 1)
        assert (held.high_watermark, held.last_stable_offset, bytes(held.records or b"")) == (1, 0, b"")
        assert fetch(c, topic, 0, 0).last_stable_offset == 0
        assert (latest(c, topic, 1), latest(c, topic, 0)) == (0, 1)
        # EndTxn: abort, a retry of the abort is answered NONE, a commit now is INVALID_TXN_STATE
        end = EndTxnRequest[3]
        assert c.request(end(transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=False)).error_code == E.NONE
        assert c.request(end(transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=False)).error_code == E.NONE
        assert c.request(end(transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=True)).error_code == E.INVALID_TXN_STATE
        assert c.request(end(transactional_id=tid, producer_id=pid, producer_epoch=0, committed=True)).error_code == E.PRODUCER_FENCED
        done = fetch(c, topic, 0, 1)
        assert (done.high_watermark, done.last_stable_offset) == (2, 2)
        assert [(a.producer_id, a.first_offset) for a in done.aborted_transactions] == [(pid, 0)]
        batches = [h for _pos, h in split_batches(bytes(done.records))]
        assert [(h.base_offset, h.is_transactional, h.is_control) for h in batches] == [(0, True, False), (1, True, True)]
        assert latest(c, topic, 1) == 2


def test_txn_offsets_visible_on_commit_only(broker: InProcessBroker) -> None:
    """TxnOffsetCommit offsets reach the group at commit; until then OffsetFetch answers the old
    offset, or UNSTABLE_OFFSET_COMMIT with require_stable (KIP-447); an abort discards them."""
    topic, tid, group = f"off-{uuid.uuid4().hex[:8]}", f"tid-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    OT = OffsetFetchRequest.OffsetFetchRequestTopic
    TT = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic

    def fetched(c: RawClient, stable: bool) -> tuple[int, int]:
        resp = c.request(OffsetFetchRequest[7](group_id=group, topics=[OT(name=topic, partition_indexes=[0])], require_stable=stable))
        part = resp.topics[0].partitions[0]
        return int(part.committed_offset), int(part.error_code)

    with RawClient(broker.bootstrap) as c:
        T = MetadataRequest.MetadataRequestTopic
        assert c.request(MetadataRequest[12](topics=[T(name=topic)], allow_auto_topic_creation=True)).topics[0].error_code == 0
        r = init(c, tid)
        pid, epoch = r.producer_id, r.producer_epoch
        for commit, offset in ((False, 7), (True, 9)):
            add_offsets = AddOffsetsToTxnRequest[3](transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group)
            assert c.request(add_offsets).error_code == E.NONE
            resp = c.request(
                TxnOffsetCommitRequest[3](
                    transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch,
                    generation_id=-1, member_id="", group_instance_id=None,
                    topics=[TT(name=topic, partitions=[TT.TxnOffsetCommitRequestPartition(
                        partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="m")])],
                )
            )
            assert resp.topics[0].partitions[0].error_code == E.NONE
            assert fetched(c, False) == (-1, E.NONE)
            assert fetched(c, True) == (-1, E.UNSTABLE_OFFSET_COMMIT)
            end = EndTxnRequest[3](transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit)
            assert c.request(end).error_code == E.NONE
        assert fetched(c, True) == (9, E.NONE)  # the aborted 7 never reached the group


def test_find_coordinator_for_transactions(broker: InProcessBroker) -> None:
    with RawClient(broker.bootstrap) as c:
        one = c.request(FindCoordinatorRequest[3](key="some-tid", key_type=1))
        assert (one.error_code, one.node_id, one.port) == (E.NONE, 0, broker.port)
        batched = c.request(FindCoordinatorRequest[4](key_type=1, coordinator_keys=["a", "b"]))
        assert [(k.key, k.error_code, k.port) for k in batched.coordinators] == [("a", 0, broker.port), ("b", 0, broker.port)]
        share = c.request(FindCoordinatorRequest[4](key_type=2, coordinator_keys=["s"]))
        assert share.coordinators[0].error_code == E.INVALID_REQUEST
