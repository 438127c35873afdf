"""Transactions in cluster mode under faults: three real brokers (tests/clusterkit.py), real
confluent-kafka transactional producers and read_committed consumers.

* The coordinator of a transactional id is killed (-9) while its EndTxn(commit) waits for the
  markers of partitions other brokers lead (paused meanwhile, so it cannot finish): the broker
  that coordinates the id next loads its prepare_commit state from etcd and completes it, the
  client's retried commit succeeds, and read_committed consumers see every committed record
  exactly once and no aborted one — as after a single node's crash.
* A transaction left open by its producer is aborted at its timeout by the coordinator, even one
  that took it over after the first was killed; read_committed reading moves on past it.
* Offsets a transaction staged at a group's coordinator (TxnOffsetCommit) count as pending
  (KIP-447: OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT) at the broker that
  coordinates the group after that one was killed, until the transaction ends; then it answers
  the committed offset, or the previous one after an abort.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)

from clusterkit import Cluster, running_cluster
from etcdkit import needs_etcd
from loglake.cluster.coordinators import coordinator_of
from loglake.kafka_errors import ErrorCode as E
from modekit import CLUSTER_ARGS
from test_broker_malformed import RawClient

pytestmark = needs_etcd

PARTITIONS = 3
#: The coordinators' timeout sweep runs this often (the default, 10 s, would only slow the test).
ENV = {"LOGLAKE_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS": "300"}
WAIT_S = 120.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path, brokers=3, broker_args=list(CLUSTER_ARGS), broker_env=ENV) as c:
        yield c


def tid_coordinated_by(node: int, live: list[int]) -> str:
    """A transactional id the given node coordinates while `live` are the live brokers."""
    return next(t for t in (f"tx-{uuid.uuid4().hex[:8]}" for _ in range(10_000)) if coordinator_of(t, live) == node)


def produce_txn(p: Producer, topic: str, tag: str, *, commit: bool) -> list[str]:
    p.begin_transaction()
    values = [f"{tag}-{i}" for i in range(3 * PARTITIONS)]
    for i, v in enumerate(values):
        p.produce(topic, value=v.encode(), partition=i % PARTITIONS)
    p.flush(60)
    if commit:
        p.commit_transaction(60)
    else:
        p.abort_transaction(60)
    return values


def read_committed(bootstrap: str, topic: str) -> list[str]:
    """Every value a read_committed consumer reads from the start to the end of each partition."""
    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "isolation.level": "read_committed",
        "enable.auto.commit": False, "enable.partition.eof": True,
    })  # fmt: skip
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: list[str] = []
    ended: set[int] = set()
    deadline = time.monotonic() + WAIT_S
    try:
        while len(ended) < PARTITIONS:
            assert time.monotonic() < deadline, f"partitions {sorted(set(range(PARTITIONS)) - ended)} never ended"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                ended.add(m.partition())
                continue
            got.append(m.value().decode())
    finally:
        c.close()
    return got


def test_coordinator_killed_mid_commit_completes_it(cluster: Cluster) -> None:
    topic = "tx-kill"
    cluster.create_topic(topic, PARTITIONS)
    leaders = cluster.wait_leaders(topic, PARTITIONS)
    live = sorted(b.node_id for b in cluster.brokers)
    # The coordinator leads at most some of the partitions: the others' markers need other brokers.
    coord = next(n for n in live if list(leaders.values()).count(n) < PARTITIONS)
    tid = tid_coordinated_by(coord, live)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "transaction.timeout.ms": 60_000})
    p.init_transactions(60)
    committed = produce_txn(p, topic, "a", commit=True)
    aborted = produce_txn(p, topic, "b", commit=False)

    p.begin_transaction()
    middle = [f"c-{i}" for i in range(3 * PARTITIONS)]
    for i, v in enumerate(middle):
        p.produce(topic, value=v.encode(), partition=i % PARTITIONS)
    p.flush(60)
    others = [b for b in cluster.brokers if b.node_id != coord]
    outcome: dict[str, object] = {}

    def commit() -> None:
        try:
            p.commit_transaction(WAIT_S)
            outcome["ok"] = True
        except Exception as exc:
            outcome["error"] = exc

    for b in others:  # the partitions they lead get no marker while they sleep
        b.pause()
    committing = threading.Thread(target=commit)
    try:
        committing.start()
        time.sleep(0.5)  # EndTxn reached the coordinator: prepare_commit is in etcd, markers wait
        assert committing.is_alive(), f"the commit finished with the other leaders paused: {outcome}"
        cluster.by_node(coord).kill()
    finally:
        for b in others:
            b.resume()
    committing.join(WAIT_S)
    assert not committing.is_alive(), "commit_transaction still waiting after the coordinator moved"
    assert outcome == {"ok": True}, outcome
    committed += middle
    # the producer goes on with the next coordinator
    aborted += produce_txn(p, topic, "d", commit=False)
    committed += produce_txn(p, topic, "e", commit=True)
    p.flush(10)

    bootstrap = ",".join(b.bootstrap for b in others)
    got = read_committed(bootstrap, topic)
    assert sorted(got) == sorted(committed)  # each committed record exactly once
    assert not set(got) & set(aborted)


def test_open_transaction_times_out_after_its_coordinator_dies(cluster: Cluster) -> None:
    topic = "tx-timeout"
    cluster.create_topic(topic, PARTITIONS)
    live = sorted(b.node_id for b in cluster.brokers)
    coord = live[0]
    tid = tid_coordinated_by(coord, live)
    hung = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "transaction.timeout.ms": 4_000})
    hung.init_transactions(60)
    hung.begin_transaction()
    for i in range(PARTITIONS):
        hung.produce(topic, value=f"hung-{i}".encode(), partition=i)
    hung.flush(60)  # in the log, open: the last stable offset holds at it
    cluster.by_node(coord).kill()

    others = [b for b in cluster.brokers if b.node_id != coord]
    bootstrap = ",".join(b.bootstrap for b in others)
    cluster.wait_leaders(topic, PARTITIONS, WAIT_S, avoid=coord)
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    after = [f"after-{i}" for i in range(PARTITIONS)]
    for i, v in enumerate(after):
        plain.produce(topic, value=v.encode(), partition=i)
    assert plain.flush(60) == 0
    # Readable at read_committed only once the open transaction is aborted (its timeout, by
    # the coordinator that took the id over from etcd).
    deadline = time.monotonic() + WAIT_S
    while sorted(got := read_committed(bootstrap, topic)) != sorted(after):
        assert not [v for v in got if v.startswith("hung-")], got
        assert time.monotonic() < deadline, f"read_committed still stops at the open transaction: {got}"
        time.sleep(1.0)
    log = "\n".join(b.log_text() for b in others)
    assert f"transaction of {tid!r} timed out" in log, log[-3000:]


def group_moving(node: int, to: int, live: list[int]) -> str:
    """A group id `node` coordinates while `live` are live, and `to` once `node` is gone."""
    rest = [n for n in live if n != node]
    return next(g for g in (f"g-{uuid.uuid4().hex[:8]}" for _ in range(10_000))
                if coordinator_of(g, live) == node and coordinator_of(g, rest) == to)


def test_require_stable_sees_offsets_staged_at_the_groups_previous_coordinator(cluster: Cluster) -> None:
    topic = "tx-stable"
    cluster.create_topic(topic, 1)
    live = sorted(b.node_id for b in cluster.brokers)
    old, new, txn_coord = live
    group, tid = group_moving(old, new, live), tid_coordinated_by(txn_coord, live)
    OT = OffsetFetchRequest.OffsetFetchRequestTopic
    TT = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic

    def fetched(at: str, stable: bool) -> tuple[int, int]:
        """(offset, partition error) of the group's partition 0 from broker `at`, once it
        coordinates the group (it answers NOT_COORDINATOR until it sees the old one gone)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            with RawClient(at) as c:
                resp = c.request(OffsetFetchRequest[7](
                    group_id=group, topics=[OT(name=topic, partition_indexes=[0])], require_stable=stable))  # fmt: skip
            if resp.error_code == E.NONE:
                part = resp.topics[0].partitions[0]
                return int(part.committed_offset), int(part.error_code)
            assert time.monotonic() < deadline, f"{at} still answers {E(resp.error_code).name} for {group}"
            time.sleep(0.2)

    def stage(pid: int, epoch: int, offset: int) -> None:
        with RawClient(cluster.by_node(txn_coord).bootstrap) as c:
            add = AddOffsetsToTxnRequest[3](transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group)
            assert c.request(add).error_code == E.NONE
        with RawClient(cluster.by_node(coordinator_of(group, [b.node_id for b in cluster.brokers if b.alive()])).bootstrap) as c:
            resp = c.request(TxnOffsetCommitRequest[3](
                transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
                member_id="", group_instance_id=None, topics=[TT(name=topic, partitions=[TT.TxnOffsetCommitRequestPartition(
                    partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="m")])],
            ))  # fmt: skip
            assert resp.topics[0].partitions[0].error_code == E.NONE

    def end(pid: int, epoch: int, commit: bool) -> None:
        with RawClient(cluster.by_node(txn_coord).bootstrap, timeout=WAIT_S) as c:
            resp = c.request(EndTxnRequest[3](transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit))
            assert resp.error_code == E.NONE

    with RawClient(cluster.by_node(txn_coord).bootstrap) as c:
        r = c.request(InitProducerIdRequest[4](transactional_id=tid, transaction_timeout_ms=120_000, producer_id=-1, producer_epoch=-1))
        assert r.error_code == E.NONE
        pid, epoch = r.producer_id, r.producer_epoch
    stage(pid, epoch, 7)  # at `old`, the group's coordinator
    assert fetched(cluster.by_node(old).bootstrap, True) == (-1, E.UNSTABLE_OFFSET_COMMIT)
    cluster.by_node(old).kill()
    at = cluster.by_node(new).bootstrap
    assert fetched(at, False) == (-1, E.NONE)  # not committed before the transaction is
    assert fetched(at, True) == (-1, E.UNSTABLE_OFFSET_COMMIT)  # staged by `old`, still pending
    end(pid, epoch, True)
    assert fetched(at, True) == (7, E.NONE)
    stage(pid, epoch, 9)  # now at `new`
    assert fetched(at, True) == (-1, E.UNSTABLE_OFFSET_COMMIT)
    assert fetched(at, False) == (7, E.NONE)
    end(pid, epoch, False)
    assert fetched(at, True) == (7, E.NONE)  # the aborted 9 never reached the group
