"""Every API a cluster broker advertises answers there (issue 29).

Three `loglake serve --cluster` brokers over etcd and moto (tests/modekit.py's "cluster"). For every API
key and every version ApiVersions advertises, a schema-valid sample request
(tests/test_protocol_samples.py) goes to each broker on a connection of its own: the answer must
come back with the request's correlation id within `ANSWER_S`, and the connection must stay open
(ApiVersions answers on it afterwards). A closed connection or no answer is a broker bug; the
failure names the API, the version, the broker and that connection's lines of its log.

The samples' strings are "", "a", "topic-é" and runs of "x"; the module makes topic "a" (three
partitions, leaders spread over the brokers, idempotent records in each) so that partition
requests reach leaders and non-leaders, and group requests coordinators and non-coordinators,
alike. Then DescribeProducers with a real idempotent producer: its leader describes it, every
other broker answers NOT_LEADER_OR_FOLLOWER for that partition.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka.protocol.metadata import ApiVersionsRequest

from etcdkit import needs_etcd
from loglake.broker.handlers import ADVERTISED
from loglake.broker.protocol import ApiKey, request_class
from loglake.cli.remote_raw import build
from loglake.kafka_errors import ErrorCode
from loglake.records import build_batch
from modekit import Served, serving
from test_broker_malformed import RawClient
from test_protocol_samples import sample

from brokerkit import Broker

pytestmark = needs_etcd

#: An answer later than this is a hang (every request here is answered at once: a Fetch's wait
#: is cut to FETCH_WAIT_MS, group timeouts to GROUP_TIMEOUT_MS).
ANSWER_S = 20.0
FETCH_WAIT_MS = 100
GROUP_TIMEOUT_MS = 10_000
PRODUCE_TIMEOUT_MS = 5_000
#: The samples' topic name that the module makes real.
TOPIC = "a"
PARTITIONS = 3
#: A JoinGroup of a new member is answered without the initial rebalance delay.
BROKER_ENV = {"LOGLAKE_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}


def advertised_versions() -> list[Any]:
    """(api key, version) of everything ApiVersions advertises that a request can be sent for.

    Left out, by the table itself: versions below an API's `min_version` that are advertised for
    clients' sake only (Produce v0-2, KAFKA-18659) — the broker rejects them on receipt, as Kafka
    4.0 does, and kafka-python has no schema to build them with."""
    return [
        pytest.param(r.api_key, v, id=f"{r.name}-v{v}")
        for r in ADVERTISED
        for v in range(r.min_version, r.max_version + 1)
    ]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Three brokers; at the end each must still run, stop cleanly and have logged no traceback."""
    with serving("cluster", tmp_path_factory.mktemp("api-walk"), env=BROKER_ENV) as served:
        assert served.cluster is not None
        served.cluster.create_topic(TOPIC, PARTITIONS)
        produce_idempotent(served, TOPIC, PARTITIONS, 5)
        yield served


def produce_idempotent(c: Served, topic: str, partitions: int, per_partition: int) -> None:
    p = Producer(
        {"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    for i in range(partitions * per_partition):
        p.produce(topic, value=b"v%d" % i, partition=i % partitions)
    assert p.flush(60) == 0


class NamedRandom(random.Random):
    """A sample generator whose every string is `TOPIC`: topic names, group ids, member ids,
    transactional ids alike, so the walk's requests reach real topics and groups."""

    def choice(self, seq: Any) -> Any:
        if seq and all(isinstance(s, str) for s in seq):
            return TOPIC
        return super().choice(seq)


#: The walk's variants of each request: two random samples and one naming `TOPIC` throughout.
VARIANTS = ("random-0", "random-1", "named")


def walk_request(api_key: int, version: int, variant: str) -> Any:
    """The `variant` sample of (api_key, version), with the fields that would make it wait long,
    or not be answered at all, set to what keeps the walk quick."""
    seed = f"walk/{api_key}/{version}/{variant}"
    rng = NamedRandom(seed) if variant == "named" else random.Random(seed)
    req = sample(request_class(api_key), version, rng)
    if api_key == ApiKey.PRODUCE:
        req.acks = -1 if req.acks not in (1, -1) else req.acks  # acks=0 is never answered
        req.timeout_ms = PRODUCE_TIMEOUT_MS
        if variant == "named":  # real batches, not transactional: the leader appends them
            req.transactional_id = None
            now = int(time.time() * 1000)
            for t in req.topic_data:
                for p in t.partition_data:
                    p.records = build_batch([(now, None, b"walk", [])])
    elif api_key in (ApiKey.FETCH, ApiKey.SHARE_FETCH):
        req.max_wait_ms = FETCH_WAIT_MS
    elif api_key == ApiKey.JOIN_GROUP:
        req.session_timeout_ms = GROUP_TIMEOUT_MS
        if version >= 1:
            req.rebalance_timeout_ms = GROUP_TIMEOUT_MS
    elif api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
        req.rebalance_timeout_ms = GROUP_TIMEOUT_MS
    return req


def connection_log(broker: Broker, local_port: int, wait_s: float = 0.0) -> str:
    """The broker's log lines about the connection from `local_port`, waiting up to `wait_s` for
    one (a broker logs why it closed a connection just after closing it)."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = [line for line in broker.log_text().splitlines() if f"127.0.0.1:{local_port}" in line]
        if lines or time.monotonic() >= deadline:
            return "\n".join(lines) or "(no log line names the connection)"
        time.sleep(0.05)


def answered(node: int, broker: Broker, api_key: int, version: int, variant: str) -> str | None:
    """None when `broker` (node `node`) answered the walk's request with its correlation id and
    then answered ApiVersions on the same connection; else what went wrong."""
    req = walk_request(api_key, version, variant)
    what = f"node {node}: {ApiKey(api_key).kafka_name} v{version} ({variant} sample)"
    with RawClient(broker.bootstrap, timeout=ANSWER_S) as raw:
        try:
            sent = raw.send(req, correlation_id=1000 + version)
            got, _resp = raw.receive()
            if got != sent:
                return f"{what}: answered with correlation id {got}, sent {sent}"
            after = raw.request(
                ApiVersionsRequest[3](client_software_name="walk", client_software_version="1")
            )
            if after.error_code != 0:
                return f"{what}: ApiVersions after it answered {after.error_code}"
        except TimeoutError:
            return f"{what}: no answer within {ANSWER_S} s\n{connection_log(broker, raw.local_port)}"
        except ConnectionError:
            return f"{what}: connection closed\n{connection_log(broker, raw.local_port, wait_s=2.0)}"
    return None


def test_api_versions_advertises_the_same_table_on_every_broker(cluster: Served) -> None:
    """What the walk covers is what the brokers advertise: the table it is built from."""
    want = sorted(ADVERTISED.api_versions_entries())
    for b in cluster.brokers.values():
        with RawClient(b.bootstrap) as raw:
            resp = raw.request(
                ApiVersionsRequest[3](client_software_name="walk", client_software_version="1")
            )
        assert resp.error_code == 0
        assert sorted((k.api_key, k.min_version, k.max_version) for k in resp.api_keys) == want


@pytest.mark.parametrize(("api_key", "version"), advertised_versions())
def test_every_advertised_version_is_answered(cluster: Served, api_key: int, version: int) -> None:
    failures = [
        f
        for n, b in sorted(cluster.brokers.items())
        for v in VARIANTS
        if (f := answered(n, b, api_key, version, v)) is not None
    ]
    assert not failures, "\n\n".join(failures)


# ---- DescribeProducers: the partition's leader describes a real idempotent producer ------------------


def describe_producers(broker: Broker, topic: str, partitions: list[int]) -> dict[int, Any]:
    cls = request_class(ApiKey.DESCRIBE_PRODUCERS)
    req = cls[0](**build(cls._struct, 0, {"topics": [{"name": topic, "partition_indexes": partitions}]}))
    with RawClient(broker.bootstrap) as raw:
        resp = raw.request(req)
    [t] = resp.topics
    return {p.partition_index: p for p in t.partitions}


def test_describe_producers_is_answered_by_the_leader(cluster: Served) -> None:
    topic = "described"
    assert cluster.cluster is not None
    cluster.cluster.create_topic(topic, PARTITIONS)
    leaders = cluster.leaders(topic, PARTITIONS)
    produce_idempotent(cluster, topic, PARTITIONS, 4)  # sequences 0..3 in each partition
    assert len(set(leaders.values())) > 1, f"leaders not spread: {leaders}"
    for n, b in sorted(cluster.brokers.items()):
        got = describe_producers(b, topic, list(range(PARTITIONS)))
        for p, leader in leaders.items():
            part = got[p]
            if n == leader:
                assert part.error_code == ErrorCode.NONE, (n, p, part)
                [active] = part.active_producers
                assert active.producer_id >= 0 and active.producer_epoch == 0
                assert active.last_sequence == 3 and active.last_timestamp > 0
                assert active.current_txn_start_offset == -1
            else:
                assert part.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER, (n, p, part)
                assert part.error_message and not part.active_producers
