"""AlterShareGroupOffsets through one cluster broker while the share-partition's leader, the other
broker, is answering acknowledgements (two real brokers over etcd and a shared folder,
tests/clusterkit.py, `cold_store="file"`).

The group's coordinator (where membership and the admin APIs are answered) is chosen to be the
broker that does not lead the partition, so the admin's write and the leader's writes come from
two processes. What is asserted:

* while the member is in the group, the admin op is NON_EMPTY_GROUP at the coordinator and
  NOT_COORDINATOR at the leader, and a member cannot join through the leader (NOT_COORDINATOR):
  membership and the emptiness check are on one broker;
* after the member left (its share session on the leader stays open, as a leaving consumer's
  does for its last acknowledgements), acknowledgements of one record each run against the leader
  while the admin sets the start offset to `ALTERED`: every acknowledgement answered NONE comes
  before every one refused (NOT_LEADER_OR_FOLLOWER: the leader's write lost its compare on the
  share-partition's gen; then INVALID_RECORD_STATE: the records are no longer acquired), none
  is lost silently;
* the admin's change is not lost: the stored start offset is `ALTERED` once every acknowledgement
  was answered, and a new member is delivered exactly the records from `ALTERED` on, each for
  the first time (delivery count 1). Records before `ALTERED` are not delivered again; those from
  `ALTERED` on are, acknowledged before the reset or not — that is what AlterShareGroupOffsets
  asks for (it forgets every in-flight and acknowledged state past the new start).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kafka.protocol.parser import KafkaProtocol

from clusterkit import Cluster, running_cluster
from etcdkit import needs_etcd
from loglake.broker.protocol import ApiKey, request_class
from loglake.broker.share.states import AckType
from loglake.cli.remote_raw import build
from loglake.cluster.coordinators import coordinator_of
from loglake.kafka_errors import ErrorCode as E
from modekit import CLUSTER_ARGS

pytestmark = needs_etcd

RECORDS = 300
#: The start offset the admin sets, in the middle of the acknowledged range.
ALTERED = 150
#: Acknowledgements answered before the admin's request is sent.
ACKED_FIRST = 10
WAIT_S = 30.0


class Raw:
    """One connection to one broker, requests of exactly the given version."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.proto = KafkaProtocol(client_id="share-admin-test")

    def call(self, api_key: int, version: int, **fields: object) -> Any:
        cls = request_class(api_key)
        self.proto.send_request(cls[version](**build(cls._struct, version, fields)))
        self.sock.sendall(self.proto.send_bytes())
        while True:
            data = self.sock.recv(65536)
            assert data, "broker closed the connection"
            responses = self.proto.receive_bytes(data)
            if responses:
                return responses[0][1]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = Path(tmp_path_factory.mktemp("cluster-share-admin"))
    with running_cluster(tmp, brokers=2, cold_store="file", broker_args=list(CLUSTER_ARGS)) as c:
        yield c


def _heartbeat(at: Raw, group: str, member: str, epoch: int, topic: str) -> Any:
    return at.call(ApiKey.SHARE_GROUP_HEARTBEAT, 1, group_id=group, member_id=member, member_epoch=epoch,
                   rack_id=None, subscribed_topic_names=[topic] if epoch == 0 else None)


def _alter(at: Raw, group: str, topic: str, start: int) -> int:
    resp = at.call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, group_id=group,
                   topics=[{"topic_name": topic, "partitions": [{"partition_index": 0, "start_offset": start}]}])
    return int(resp.responses[0].partitions[0].error_code)


def _start_offset(at: Raw, group: str) -> int:
    resp = at.call(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, groups=[{"group_id": group, "topics": None}])
    (g,) = resp.groups
    assert g.error_code == E.NONE, g
    [(p,)] = [t.partitions for t in g.topics]
    return int(p.start_offset)


def _fetch_all(leader: Raw, group: str, member: str, tid: uuid.UUID, want: int) -> tuple[list[tuple[int, int]], int]:
    """ShareFetch (a new session) until `want` records are acquired or none come for a while:
    [(offset, delivery count)] and the session's next epoch."""
    got: list[tuple[int, int]] = []
    epoch = 0
    deadline = time.monotonic() + WAIT_S
    while len(got) < want and time.monotonic() < deadline:
        resp = leader.call(ApiKey.SHARE_FETCH, 1, group_id=group, member_id=member, share_session_epoch=epoch,
                           max_wait_ms=500, min_bytes=1, max_bytes=8 << 20, max_records=RECORDS, batch_size=RECORDS,
                           topics=[{"topic_id": tid, "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}],
                           forgotten_topics_data=[])
        assert resp.error_code == E.NONE, resp
        epoch += 1
        for t in resp.responses:
            for p in t.partitions:
                assert p.error_code == E.NONE, p
                got += [(o, a.delivery_count) for a in p.acquired_records for o in range(a.first_offset, a.last_offset + 1)]
    return got, epoch


def test_an_admins_alter_from_the_other_broker_is_not_lost_to_the_leaders_acknowledgements(cluster: Cluster) -> None:
    topic = f"sa-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 1)
    leader_id = cluster.leaders(topic)[0]
    live = sorted(b.node_id for b in cluster.brokers)
    (other_id,) = [n for n in live if n != leader_id]
    group = next(g for g in (f"g-{uuid.uuid4().hex[:8]}" for _ in range(10_000)) if coordinator_of(g, live) == other_id)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for fut in admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])]).values():
        fut.result(WAIT_S)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 50})
    for i in range(RECORDS):
        producer.produce(topic, value=b"v%d" % i)
    assert producer.flush(WAIT_S) == 0

    coordinator, leader = Raw(cluster.by_node(other_id).port), Raw(cluster.by_node(leader_id).port)
    try:
        member = str(uuid.uuid4())
        assert _heartbeat(leader, group, member, 0, topic).error_code == E.NOT_COORDINATOR
        joined = _heartbeat(coordinator, group, member, 0, topic)
        assert joined.error_code == E.NONE, joined
        tid = joined.assignment.topic_partitions[0].topic_id
        got, epoch = _fetch_all(leader, group, member, tid, RECORDS)
        assert got == [(o, 1) for o in range(RECORDS)]
        assert _alter(coordinator, group, topic, ALTERED) == E.NON_EMPTY_GROUP
        assert _alter(leader, group, topic, ALTERED) == E.NOT_COORDINATOR
        assert _heartbeat(coordinator, group, member, -1, topic).error_code == E.NONE  # leaves; its session stays

        codes: list[int] = []
        acked_first = threading.Event()

        def acknowledge() -> None:
            nonlocal epoch
            for o in range(RECORDS):
                resp = leader.call(ApiKey.SHARE_ACKNOWLEDGE, 1, group_id=group, member_id=member,
                                   share_session_epoch=epoch, topics=[{"topic_id": tid, "partitions": [{
                                       "partition_index": 0, "acknowledgement_batches": [
                                           {"first_offset": o, "last_offset": o, "acknowledge_types": [int(AckType.ACCEPT)]}]}]}])
                epoch += 1
                assert resp.error_code == E.NONE, resp
                codes.append(int(resp.responses[0].partitions[0].error_code))
                if len(codes) == ACKED_FIRST:
                    acked_first.set()

        acker = threading.Thread(target=acknowledge, name="acker")
        acker.start()
        assert acked_first.wait(WAIT_S)
        assert _alter(coordinator, group, topic, ALTERED) == E.NONE
        acker.join(WAIT_S * 2)
        assert not acker.is_alive() and len(codes) == RECORDS
        answered = codes.count(E.NONE)
        assert ACKED_FIRST <= answered < RECORDS, codes  # the admin's write landed among them
        assert codes[:answered] == [E.NONE] * answered, codes  # nothing answered NONE after a refusal
        assert set(codes[answered:]) <= {E.NOT_LEADER_OR_FOLLOWER, E.INVALID_RECORD_STATE}, codes
        assert _start_offset(coordinator, group) == ALTERED

        again = str(uuid.uuid4())
        assert _heartbeat(coordinator, group, again, 0, topic).error_code == E.NONE
        redelivered, _ = _fetch_all(leader, group, again, tid, RECORDS - ALTERED)
        assert redelivered == [(o, 1) for o in range(ALTERED, RECORDS)]
        assert _start_offset(coordinator, group) == ALTERED
    finally:
        coordinator.close()
        leader.close()
