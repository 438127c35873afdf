"""Fetch from a follower (KIP-392) and leader-epoch history on a three-broker cluster.

Three `loglake serve --cluster` brokers over etcd and moto (tests/clusterkit.py) in racks a, b and
c. A topic of replication factor 3 lists every broker as each partition's replica. A consumer
(confluent-kafka) with `client.rack` set to a follower's rack is sent there by the leader
(PreferredReadReplica) and reads every record from that broker, which serves the committed data
from the bucket; its statistics name the broker it fetches from and that broker counts the
fetches. Raw requests check the two halves alone: the leader's redirect (no records, the
replica named) and the follower's read (the records, its committed end as high watermark).

Leader epochs move with leadership: after the leader of a partition stops, OffsetForLeaderEpoch
answers its epoch with the offset where the next leader's epoch began (Kafka's rule), not the
committed end.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # re-exported without __all__
from prometheus_client.parser import text_string_to_metric_families

from clusterkit import Cluster, running_cluster
from etcdkit import needs_etcd
from loglake.kafka_errors import ErrorCode
from modekit import AGREE_WAIT_S, CLUSTER_ARGS
from test_broker_admin import raw_call

from brokerkit import Broker, free_port

pytestmark = needs_etcd

RACKS = {1: "a", 2: "b", 3: "c"}
TIMEOUT = 30.0


class Racked:
    def __init__(self, cluster: Cluster, metrics: dict[int, str]) -> None:
        self.cluster = cluster
        self.metrics = metrics

    def broker(self, node_id: int) -> Broker:
        return self.cluster.by_node(node_id).broker

    def fetches(self, node_id: int) -> int:
        """Fetch requests the broker answered (its /metrics)."""
        with urllib.request.urlopen(self.metrics[node_id], timeout=10) as resp:
            text = resp.read().decode()
        return int(sum(
            s.value for f in text_string_to_metric_families(text) if f.name == "loglake_requests"
            for s in f.samples if s.name == "loglake_requests_total" and s.labels.get("api") == "Fetch"
        ))  # fmt: skip


@pytest.fixture(scope="module")
def racked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Racked]:
    with running_cluster(tmp_path_factory.mktemp("racks"), brokers=0, broker_args=CLUSTER_ARGS) as c:
        metrics = {}
        for node, rack in RACKS.items():
            port = free_port()
            c.add_broker(node, ["--rack", rack, "--metrics-listen", f"127.0.0.1:{port}"])
            metrics[node] = f"http://127.0.0.1:{port}/metrics"
        yield Racked(c, metrics)


def create(c: Cluster, name: str, partitions: int, rf: int) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(name, partitions, rf)])[name].result(TIMEOUT)
    return c.wait_leaders(name, partitions, TIMEOUT)


def produce(c: Cluster, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for v in values:
        producer.produce(topic, v, partition=0)
    assert producer.flush(TIMEOUT) == 0


def raw_fetch(b: Broker, topic: str, offset: int, rack: str) -> Any:
    """One Fetch v11 of partition 0 from `offset`, naming the client's rack; the partition's answer."""
    resp = raw_call(
        b, 1, 11, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id=rack,
        topics=[{"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                                                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
    )  # fmt: skip
    [t] = resp.responses
    [p] = t.partitions
    return p


def until(what: str, check: Any, timeout_s: float = AGREE_WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_s} s")
        time.sleep(0.1)


def test_a_consumer_fetches_from_the_replica_in_its_rack(racked: Racked) -> None:
    c = racked.cluster
    topic = "ffr"
    leader = create(c, topic, 1, 3)[0]
    follower = min(n for n in RACKS if n != leader)
    rack = RACKS[follower]
    produce(c, topic, [f"v{i}".encode() for i in range(50)])

    # The leader sends a consumer of the follower's rack there, without records; a consumer of
    # the leader's own rack (or naming none) is served by the leader.
    redirect = raw_fetch(racked.broker(leader), topic, 0, rack)
    assert (redirect.error_code, redirect.preferred_read_replica) == (0, follower)
    assert not redirect.records
    served = raw_fetch(racked.broker(leader), topic, 0, RACKS[leader])
    assert served.preferred_read_replica == -1 and served.records
    # The follower serves the committed range from the bucket, with its view of the committed end
    # as high watermark (it learns of each commit from etcd's watch).
    read = until("the follower serves 50 records",
                 lambda: (lambda p: p if p.high_watermark == 50 else None)(raw_fetch(racked.broker(follower), topic, 0, rack)))
    assert read.error_code == 0 and read.preferred_read_replica == -1 and read.records
    # Past its view of the end: retriable OFFSET_NOT_AVAILABLE, never OUT_OF_RANGE (a reset).
    ahead = raw_fetch(racked.broker(follower), topic, 1000, rack)
    assert ahead.error_code == ErrorCode.OFFSET_NOT_AVAILABLE

    stats: list[dict[str, Any]] = []
    before = racked.fetches(follower)
    consumer = Consumer({
        "bootstrap.servers": c.bootstrap, "group.id": "ffr-g", "client.rack": rack,
        "enable.auto.commit": False, "statistics.interval.ms": 200,
        "stats_cb": lambda s: stats.append(json.loads(s)),
    })  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 50 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        produce(c, topic, [f"w{i}".encode() for i in range(10)])  # read while it fetches from the follower
        while len(got) < 60 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        assert got == [f"v{i}".encode() for i in range(50)] + [f"w{i}".encode() for i in range(10)]
        stats.clear()
        while not stats and time.monotonic() < deadline + TIMEOUT:
            consumer.poll(0.2)  # statistics are delivered by poll, every statistics.interval.ms
        part = stats[-1]["topics"][topic]["partitions"]["0"]
        assert (part["leader"], part["broker"], part["hi_offset"]) == (leader, follower, 60), part
    finally:
        consumer.close()
    assert racked.fetches(follower) > before


def metadata_epoch(b: Broker, topic: str) -> tuple[int, int]:
    resp = raw_call(b, 3, 12, topics=[{"name": topic}], allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False)
    [p] = resp.topics[0].partitions
    return int(p.leader_id), int(p.leader_epoch)


def epoch_ends(b: Broker, topic: str, epochs: list[int]) -> list[tuple[int, int, int]]:
    parts = [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": e} for e in epochs]
    resp = raw_call(b, 23, 4, replica_id=-1, topics=[{"topic": topic, "partitions": parts}])
    return [(p.error_code, p.leader_epoch, p.end_offset) for p in resp.topics[0].partitions]


def test_offset_for_leader_epoch_after_a_leadership_change(racked: Racked) -> None:
    c = racked.cluster
    topic = "epochs"
    first = create(c, topic, 1, 1)[0]
    produce(c, topic, [b"x"] * 10)
    _, old = metadata_epoch(racked.broker(first), topic)
    c.by_node(first).stop()
    try:
        second = c.wait_leaders(topic, 1, TIMEOUT, avoid=first)[0]
        produce(c, topic, [b"y"] * 5)
        live = [n for n in RACKS if n != first]
        new = until("the new epoch everywhere", lambda: (lambda es: es.pop() if len(es) == 1 else None)(
            {metadata_epoch(racked.broker(n), topic) for n in live}))[1]
        assert new > old
        # every live broker answers alike once it has applied the commits: the old epoch ends
        # where the new leader's began (10), the current one at the committed end (15), a newer
        # one is unknown
        want = [(0, old, 10), (0, new, 15), (0, -1, -1)]
        for n in live:
            until(f"node {n} answers {want}", lambda n=n: epoch_ends(racked.broker(n), topic, [old, new, new + 1]) == want)
        assert second != first
    finally:
        c.by_node(first).start()
