"""`loglake serve --cluster`: three real brokers (tests/brokerkit.py) over one real etcd
(tests/etcdkit.py) and moto's S3 server (tests/s3kit.py), driven by real clients.

Metadata lists every live broker and spreads the leaders; produce (confluent-kafka, idempotent,
acks=all) and consume back with confluent-kafka, kafka-python and aiokafka; a produce to a broker
that does not lead the partition is NOT_LEADER_OR_FOLLOWER; topics created or deleted on one
broker are seen by all (transactions: tests/test_broker_txn_clients.py and tests/test_cluster_txn.py).
Then the faults the serving path must take:
`kill -9` of a broker while an idempotent producer and a group of three consumers run (the
partitions and the group coordinator move; every acknowledged record is in the log exactly once at
its acknowledged offset; the group resumes from its commits), and a broker whose data directory
was wiped rejoins with nothing lost. One cluster serves the whole module, in file order.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka.protocol.producer import ProduceRequest

import s3kit
from etcdkit import EtcdCluster, needs_etcd
from loglake.cluster.coordinators import coordinator_of
from loglake.kafka_errors import ErrorCode
from loglake.records import build_batch
from test_broker_malformed import RawClient

from brokerkit import Broker, cluster_args

pytestmark = needs_etcd
moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client

KCAT = shutil.which("kcat") or "/usr/bin/kcat"
NODES = (1, 2, 3)
#: Generous bound for anything that waits on a lease expiry or a client's retries.
WAIT_S = 60.0


class Cluster:
    def __init__(self, tmp: Path, etcd: EtcdCluster, store_url: str) -> None:
        self.tmp = tmp
        self.etcd = etcd
        self.store_url = store_url
        self.prefix = f"serve-{uuid.uuid4().hex[:8]}"
        self.brokers: dict[int, Broker] = {}
        self.retired: list[Broker] = []

    def start(self, node: int) -> Broker:
        # Merge and sweep every second (default 10 s), so reads here also come from merged segments.
        env = {"LOGLAKE_CLUSTER_MAINTENANCE_INTERVAL_MS": "1000"}
        b = Broker(
            self.tmp / f"node{node}",
            cluster_args(self.etcd.endpoints, self.prefix, self.store_url, node),
            env,
        )
        self.brokers[node] = b.start()
        return b

    def kill(self, node: int) -> None:
        b = self.brokers.pop(node)
        b.stop(signal.SIGKILL)
        self.retired.append(b)

    def bootstrap(self, *nodes: int) -> str:
        return ",".join(self.brokers[n].bootstrap for n in (nodes or sorted(self.brokers)))

    def leaders(self, topic: str, via: int | None = None) -> dict[int, int]:
        node = via if via is not None else min(self.brokers)
        md = AdminClient({"bootstrap.servers": self.bootstrap(node)}).list_topics(topic, timeout=10)
        return {p: pm.leader for p, pm in md.topics[topic].partitions.items()}

    def wait_leaders(self, topic: str, among: set[int], partitions: int) -> dict[int, int]:
        """Leaders of every partition, once each is one of `among`."""
        deadline = time.monotonic() + WAIT_S
        got: dict[int, int] = {}
        while time.monotonic() < deadline:
            got = self.leaders(topic)
            if len(got) == partitions and set(got.values()) <= among:
                return got
            time.sleep(0.2)
        raise AssertionError(f"leaders of {topic} not among {among}: {got}")


@contextmanager
def serving_cluster(tmp: Path, s3_client: Any, moto_endpoint: str) -> Iterator[Cluster]:
    """Brokers 1-3 over a fresh one-member etcd and a fresh bucket; stopped cleanly at the end,
    and no broker log (killed ones included) may hold a traceback."""
    bucket = f"c-{uuid.uuid4().hex[:20]}"
    s3_client.create_bucket(Bucket=bucket)
    etcd = EtcdCluster(tmp, 1).start()
    c = Cluster(tmp, etcd, s3kit.store_url(moto_endpoint, bucket, "lake"))
    try:
        for n in NODES:
            c.start(n)
        yield c
    finally:
        for b in c.brokers.values():
            if b.proc is not None and b.proc.poll() is None:
                assert b.stop() == 0
        etcd.stop()
    for b in [*c.brokers.values(), *c.retired]:
        assert "Traceback" not in b.log_text(), b.log_text()[-5000:]


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, s3_client: Any
) -> Iterator[Cluster]:
    with serving_cluster(tmp_path_factory.mktemp("cluster"), s3_client, moto_endpoint) as c:
        yield c
        for b in c.brokers.values():
            assert b.proc is not None and b.proc.poll() is None, "a broker died"


def create_topic(c: Cluster, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": c.bootstrap()})  # kept: its futures die with it
    # No retention by time: some tests produce records stamped in 2023, which the leaders'
    # retention (7 days by default) would remove at their next maintenance round, as Kafka's does.
    admin.create_topics([NewTopic(name, partitions, 1, config={"retention.ms": "-1"})])[name].result(30)


def produce(c: Cluster, topic: str, values: list[bytes], partitions: int) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every acknowledged record (idempotent producer, acks=all)."""
    p = Producer(
        {"bootstrap.servers": c.bootstrap(), "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    acked: list[tuple[int, int, bytes]] = []
    errors: list[Any] = []

    def done(err: Any, m: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.append((m.partition(), m.offset(), m.value()))

    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=i % partitions, on_delivery=done)
        p.poll(0)
    assert p.flush(WAIT_S) == 0
    assert not errors, errors
    return acked


def read_log(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, int], bytes]:
    """Every record of the topic from offset 0, by (partition, offset) (confluent-kafka, assign)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: dict[tuple[int, int], bytes] = {}
    eof: set[int] = set()
    deadline = time.monotonic() + WAIT_S
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                raise KafkaException(m.error())
            eof.discard(m.partition())
            assert (m.partition(), m.offset()) not in out, "an offset delivered twice"
            out[(m.partition(), m.offset())] = m.value()
    finally:
        c.close()
    return out


# ---- serving --------------------------------------------------------------------------------


def test_metadata_lists_every_broker_and_spreads_leaders(cluster: Cluster) -> None:
    create_topic(cluster, "spread", 12)
    leaders = cluster.wait_leaders("spread", set(NODES), 12)
    assert sorted(leaders.values()).count(1) == sorted(leaders.values()).count(2) == 4  # balanced
    for n in NODES:
        md = AdminClient({"bootstrap.servers": cluster.bootstrap(n)}).list_topics(timeout=10)
        assert {b.id: b.port for b in md.brokers.values()} == {m: cluster.brokers[m].port for m in NODES}
    a3 = AdminClient({"bootstrap.servers": cluster.bootstrap(3)})  # kept: its futures die with it
    described = a3.describe_cluster().result(30)
    assert sorted(n.id for n in described.nodes) == list(NODES)
    if Path(KCAT).exists():
        out = subprocess.run(
            [KCAT, "-b", cluster.bootstrap(2), "-L"], capture_output=True, text=True, timeout=30
        )
        assert "3 brokers:" in out.stdout, out.stdout + out.stderr
        for n in NODES:
            assert f"broker {n} at 127.0.0.1:{cluster.brokers[n].port}" in out.stdout


def test_a_node_id_held_by_a_live_broker_is_refused(cluster: Cluster) -> None:
    args = cluster_args(cluster.etcd.endpoints, cluster.prefix, cluster.store_url, 2)
    twin = Broker(cluster.tmp / "twin-of-2", args)
    with pytest.raises(RuntimeError, match="did not start"):
        twin.start()
    assert twin.proc is not None and twin.proc.wait(30) == 1
    assert "node id 2 is held by a live broker" in twin.log_text() + (
        twin.proc.stdout.read() if twin.proc.stdout else ""
    )
    assert "Traceback" not in twin.log_text()
    assert cluster.leaders("spread", via=2)  # the live node 2 serves on


def test_a_bucket_that_does_not_exist_stops_the_start(cluster: Cluster, moto_endpoint: str) -> None:
    """Every flush would fail, so nothing could be acknowledged: exit 3 (a config error) with one
    line naming the store, instead of serving and failing each produce."""
    missing = s3kit.store_url(moto_endpoint, f"nope-{uuid.uuid4().hex[:12]}", "lake")
    args = cluster_args(cluster.etcd.endpoints, cluster.prefix, missing, 7)
    lost = Broker(cluster.tmp / "no-bucket", args)
    with pytest.raises(RuntimeError, match="did not start"):
        lost.start()
    assert lost.proc is not None and lost.proc.wait(30) == 3
    out = lost.log_text() + (lost.proc.stdout.read() if lost.proc.stdout else "")
    assert "has no bucket (NoSuchBucket); create it first" in out
    assert "Traceback" not in out


def test_produce_and_consume_with_three_clients(cluster: Cluster) -> None:
    create_topic(cluster, "rw", 12)
    cluster.wait_leaders("rw", set(NODES), 12)
    values = [f"rw-{i}".encode() for i in range(1200)]
    acked = produce(cluster, "rw", values, 12)
    assert len(acked) == len(values)
    for n in NODES:  # bootstrapped from each broker in turn
        log = read_log(cluster.bootstrap(n), "rw", 12)
        assert log == {(p, o): v for p, o, v in acked}

    from kafka import KafkaConsumer

    kc = KafkaConsumer(
        "rw",
        bootstrap_servers=cluster.bootstrap(3),
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
        group_id=None,
    )
    got = {m.value for m in kc}
    kc.close()
    assert got == set(values)

    async def aio() -> set[bytes]:
        from aiokafka import AIOKafkaConsumer

        ac = AIOKafkaConsumer("rw", bootstrap_servers=cluster.bootstrap(2), auto_offset_reset="earliest")
        await ac.start()
        seen: set[bytes] = set()
        try:
            while len(seen) < len(values):
                batch = await ac.getmany(timeout_ms=1000)
                if not batch:
                    break
                seen |= {m.value for msgs in batch.values() for m in msgs}
        finally:
            await ac.stop()
        return seen

    assert asyncio.run(aio()) == set(values)


def test_produce_to_a_broker_that_does_not_lead_is_not_leader(cluster: Cluster) -> None:
    leaders = cluster.wait_leaders("rw", set(NODES), 12)
    partition, leader = next((p, b) for p, b in sorted(leaders.items()))
    other = next(n for n in NODES if n != leader)
    batch = build_batch([(int(time.time() * 1000), None, b"stray", [])])
    P = ProduceRequest.TopicProduceData
    req = ProduceRequest[8](
        transactional_id=None,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[P(name="rw", partition_data=[P.PartitionProduceData(index=partition, records=batch)])],
    )
    with RawClient(cluster.bootstrap(other)) as raw:
        resp = raw.request(req)
    assert resp.responses[0].partition_responses[0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    with RawClient(cluster.bootstrap(leader)) as raw:
        resp = raw.request(req)
    assert resp.responses[0].partition_responses[0].error_code == 0


def test_topic_changes_are_seen_by_every_broker(cluster: Cluster) -> None:
    """Each broker applies the etcd log as its watch reports it (a poll every second covers a
    missed event), so another broker sees a change a moment later, never never."""

    def seen_everywhere(check: Any) -> bool:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            views = [
                AdminClient({"bootstrap.servers": cluster.bootstrap(n)}).list_topics(timeout=10).topics
                for n in NODES
            ]
            if all(check(v) for v in views):
                return True
            time.sleep(0.1)
        return False

    a1 = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
    a1.create_topics([NewTopic("made-on-1", 3, 1)])["made-on-1"].result(30)
    assert seen_everywhere(lambda t: "made-on-1" in t and len(t["made-on-1"].partitions) == 3)
    a2 = AdminClient({"bootstrap.servers": cluster.bootstrap(2)})
    a2.create_partitions([NewPartitions("made-on-1", 5)])["made-on-1"].result(30)
    # (.get: one run saw a broker's Metadata leave the topic out for a moment right after
    # CreatePartitions; the check waits for every view to show 5 partitions either way)
    assert seen_everywhere(lambda t: "made-on-1" in t and len(t["made-on-1"].partitions) == 5)
    assert set(cluster.wait_leaders("made-on-1", set(NODES), 5)) == set(range(5))
    a3 = AdminClient({"bootstrap.servers": cluster.bootstrap(3)})
    a3.delete_topics(["made-on-1"])["made-on-1"].result(30)
    assert seen_everywhere(lambda t: "made-on-1" not in t)


def test_list_offsets_earliest_latest_and_by_time(cluster: Cluster) -> None:
    create_topic(cluster, "times", 2)
    cluster.wait_leaders("times", set(NODES), 2)
    p = Producer({"bootstrap.servers": cluster.bootstrap(), "enable.idempotence": True, "acks": "all"})
    for i in range(20):
        p.produce("times", value=f"t{i}".encode(), partition=0, timestamp=1_700_000_000_000 + i * 1000)
        p.flush(30)  # one batch per record: the lookup must find the record, not just its batch
    c = Consumer({"bootstrap.servers": cluster.bootstrap(3), "group.id": uuid.uuid4().hex})
    try:
        assert c.get_watermark_offsets(TopicPartition("times", 0), timeout=30) == (0, 20)
        assert c.get_watermark_offsets(TopicPartition("times", 1), timeout=30) == (0, 0)
        found = c.offsets_for_times([TopicPartition("times", 0, 1_700_000_007_500)], timeout=30)
        assert found[0].offset == 8
        late = c.offsets_for_times([TopicPartition("times", 0, 1_800_000_000_000)], timeout=30)
        assert late[0].offset == -1  # after the last record: the end (Kafka answers -1)
    finally:
        c.close()


# ---- faults ---------------------------------------------------------------------------------


class GroupMember(threading.Thread):
    """A confluent-kafka consumer of group `group` that commits what it consumed every 50 records."""

    def __init__(
        self, bootstrap: str, group: str, topic: str, seen: dict[tuple[int, int], bytes], lock: threading.Lock
    ) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
        })  # fmt: skip
        self.consumer.subscribe([topic])
        self.seen = seen
        self.lock = lock
        self.stop = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        count = 0
        while not self.stop.is_set():
            m = self.consumer.poll(0.2)
            if m is None:
                continue
            if m.error():
                self.errors.append(str(m.error()))
                continue
            with self.lock:
                self.seen[(m.partition(), m.offset())] = m.value()
            count += 1
            if count % 50 == 0:
                try:
                    self.consumer.commit(asynchronous=False)
                except KafkaException as exc:  # a coordinator moving: the next commit goes through
                    self.errors.append(str(exc))
        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException as exc:
            self.errors.append(str(exc))
        self.consumer.close()


def test_kill_9_moves_partitions_and_the_group_coordinator(cluster: Cluster) -> None:
    create_topic(cluster, "work", 6)
    cluster.wait_leaders("work", set(NODES), 6)
    group = "workers"
    coordinator = coordinator_of(group, set(NODES))
    seen: dict[tuple[int, int], bytes] = {}
    lock = threading.Lock()
    members = [GroupMember(cluster.bootstrap(), group, "work", seen, lock) for _ in range(3)]
    for m in members:
        m.start()
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap(),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
        }
    )
    acked: dict[tuple[int, int], bytes] = {}
    failed: list[Any] = []

    def done(err: Any, m: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            assert (m.partition(), m.offset()) not in acked
            acked[(m.partition(), m.offset())] = m.value()

    for i in range(3000):
        producer.produce("work", value=f"w-{i}".encode(), partition=i % 6, on_delivery=done)
        producer.poll(0)
        if i == 1000:
            producer.flush(WAIT_S)
            cluster.kill(coordinator)  # the group's coordinator, leading a third of the partitions
        time.sleep(0.001)
    assert producer.flush(120) == 0
    assert not failed, failed[:3]
    assert len(acked) == 3000
    survivors = set(NODES) - {coordinator}
    cluster.wait_leaders("work", survivors, 6)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        with lock:
            if set(acked) <= set(seen):
                break
        time.sleep(0.2)
    for m in members:
        m.stop.set()
    for m in members:
        m.join(30)
    with lock:
        assert set(acked) <= set(seen), f"{len(set(acked) - set(seen))} acknowledged records never consumed"
    # The log holds every acknowledged record exactly once, at its acknowledged offset.
    log = read_log(cluster.bootstrap(), "work", 6)
    assert {k: log.get(k) for k in acked} == acked
    assert len(set(log.values())) == len(log), "a record written twice"
    # The group resumes from its commits: a new member starts at the end, nothing re-read.
    c = Consumer(
        {"bootstrap.servers": cluster.bootstrap(), "group.id": group, "auto.offset.reset": "earliest"}
    )
    committed = c.committed([TopicPartition("work", p) for p in range(6)], timeout=30)
    c.close()
    ends = {p: 1 + max(o for (q, o) in log if q == p) for p in range(6)}
    assert {tp.partition: tp.offset for tp in committed} == ends


def test_a_wiped_broker_rejoins_with_nothing_lost(cluster: Cluster) -> None:
    before = read_log(cluster.bootstrap(), "work", 6)
    gone = next(n for n in NODES if n not in cluster.brokers)
    data = cluster.tmp / f"node{gone}"
    shutil.rmtree(data, ignore_errors=True)  # its cache and spill area: nothing that matters
    cluster.start(gone)
    cluster.wait_leaders("work", set(NODES), 6)

    def led_by_it() -> int:
        """Partitions (of any topic: leaders are balanced over all of them) the rejoined broker leads."""
        md = AdminClient({"bootstrap.servers": cluster.bootstrap(gone)}).list_topics(timeout=10)
        return sum(1 for t in md.topics.values() for pm in t.partitions.values() if pm.leader == gone)

    deadline = time.monotonic() + WAIT_S
    while led_by_it() < 10 and time.monotonic() < deadline:  # its share: 30 partitions over 3 brokers
        time.sleep(0.2)
    assert led_by_it() == 10
    acked = produce(cluster, "work", [f"after-{i}".encode() for i in range(600)], 6)
    log = read_log(cluster.bootstrap(gone), "work", 6)
    assert {k: log[k] for k in before} == before
    assert {(p, o): v for p, o, v in acked} == {k: log[k] for k in ((p, o) for p, o, _ in acked)}
