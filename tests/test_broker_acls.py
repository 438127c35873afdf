"""ACLs on a real broker: every API refuses a principal without the right operation with Kafka's
error code and serves one with it; the ACL APIs round trip through confluent-kafka's AdminClient;
prefixed and deny rules, super users, Metadata filtering, the audit log, and a restart.

Principals come from mTLS client certificates (tests/tlskit.py) on an SSL listener with
ssl_client_auth=required: CN=admin is the super user, CN=bob is granted what the matrix needs,
CN=eve nothing. With client authentication on, allow.everyone.if.no.acl.found defaults to false,
so eve is refused everything that has no ACL for her.
"""

from __future__ import annotations

import socket
import ssl
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreateAclsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteAclsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeAclsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeLogDirsRequest,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    IncrementalAlterConfigsRequest,
    ListGroupsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
)

from loglake.broker.protocol.kip848 import ConsumerGroupDescribeRequest, ConsumerGroupHeartbeatRequest
from loglake.kafka_errors import ErrorCode as E
from loglake.records.batch import BatchBuilder
from tlskit import Pki, make_pki, ssl_args

from brokerkit import Broker, serving_broker

AUTH_ERRORS = {E.TOPIC_AUTHORIZATION_FAILED, E.GROUP_AUTHORIZATION_FAILED, E.CLUSTER_AUTHORIZATION_FAILED,
               E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
#: Kafka's codes (confluent_kafka's enums carry the same numbers).
TOPIC, GROUP, CLUSTER, TXN_ID = 2, 3, 4, 5
LITERAL, PREFIXED = 3, 4
ALL, READ, WRITE, DESCRIBE = 2, 3, 4, 8
DENY, ALLOW = 2, 3
MAPPING = "RULE:^CN=([^,]+),.*$/$1/,DEFAULT"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), clients=("admin", "bob", "eve"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Broker]:
    conf = tmp_path_factory.mktemp("conf") / "broker.toml"
    conf.write_text(f'ssl_principal_mapping_rules = "{MAPPING}"\n')
    args = ["--listen", "SSL://127.0.0.1:0", *ssl_args(pki, client_auth="required"), "--super-users", "User:admin",
            "--config", str(conf)]
    with serving_broker(tmp_path_factory.mktemp("acls") / "data", args) as b:
        yield b


class TlsClient:
    """One TLS socket speaking the Kafka protocol through kafka-python's protocol classes, as
    the principal of `who`'s client certificate."""

    def __init__(self, port: int, pki: Pki, who: str) -> None:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        pair = pki.clients[who]
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
        raw = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        self.proto = KafkaProtocol(client_id=f"acl-{who}")
        self._ready: deque[tuple[int, Any]] = deque()

    def request(self, request: Any) -> Any:
        corr = self.proto.send_request(request)
        self.sock.sendall(self.proto.send_bytes())
        while not self._ready:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("broker closed the connection")
            self._ready.extend(self.proto.receive_bytes(data))
        got, response = self._ready.popleft()
        assert got == corr
        return response

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def clients(broker: Broker, pki: Pki) -> Iterator[dict[str, TlsClient]]:
    out = {who: TlsClient(broker.port, pki, who) for who in ("admin", "bob", "eve")}
    yield out
    for c in out.values():
        c.close()


def create_acls(c: TlsClient, *bindings: tuple[int, str, int, str, int, int]) -> list[int]:
    C = CreateAclsRequest.AclCreation
    resp = c.request(CreateAclsRequest[3](creations=[
        C(resource_type=t, resource_name=n, resource_pattern_type=p, principal=who, host="*", operation=op, permission_type=perm)
        for t, n, p, who, op, perm in bindings
    ]))
    return [r.error_code for r in resp.results]


def create_topic(c: TlsClient, name: str, partitions: int = 1) -> int:
    T = CreateTopicsRequest.CreatableTopic
    resp = c.request(CreateTopicsRequest[5](topics=[T(name=name, num_partitions=partitions, replication_factor=1)], timeout_ms=10_000))
    return int(resp.topics[0].error_code)


@pytest.fixture(scope="module")
def granted(clients: dict[str, TlsClient]) -> None:
    """bob: everything on topics prefixed pub-, but no WRITE on pub-denied; his group and
    transactional ids; DESCRIBE on the cluster. eve: nothing."""
    admin = clients["admin"]
    assert create_acls(
        admin,
        (TOPIC, "pub-", PREFIXED, "User:bob", ALL, ALLOW),
        (TOPIC, "pub-denied", LITERAL, "User:bob", WRITE, DENY),
        (GROUP, "g-bob", LITERAL, "User:bob", ALL, ALLOW),
        (TXN_ID, "tx-bob", PREFIXED, "User:bob", ALL, ALLOW),
        (CLUSTER, "kafka-cluster", LITERAL, "User:bob", DESCRIBE, ALLOW),
    ) == [0] * 5
    for name in ("pub-t", "pub-denied"):
        assert create_topic(admin, name) in (0, E.TOPIC_ALREADY_EXISTS)


def batch(pid: int = -1, epoch: int = -1, seq: int = -1, transactional: bool = False) -> bytes:
    b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional)
    b.append(int(time.time() * 1000), None, b"v", [])
    return bytes(b.build())


def produce(c: TlsClient, topic: str, records: bytes, tid: str | None = None, partitions: tuple[int, ...] = (0,)) -> list[int]:
    P = ProduceRequest.TopicProduceData
    resp = c.request(ProduceRequest[9](
        transactional_id=tid, acks=-1, timeout_ms=10_000,
        topic_data=[P(name=topic, partition_data=[P.PartitionProduceData(index=i, records=records) for i in partitions])],
    ))
    return [p.error_code for t in resp.responses for p in t.partition_responses]


# ---- the matrix: (API, request, the error code of the answer) ---------------------------------------


def _fetch(c: TlsClient) -> int:
    F = FetchRequest.FetchTopic
    resp = c.request(FetchRequest[12](max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0, topics=[
        F(topic="pub-t", partitions=[F.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])]))
    return int(resp.responses[0].partitions[0].error_code)


def _list_offsets(c: TlsClient) -> int:
    T = ListOffsetsRequest.ListOffsetsTopic
    resp = c.request(ListOffsetsRequest[7](replica_id=-1, isolation_level=0, topics=[
        T(name="pub-t", partitions=[T.ListOffsetsPartition(partition_index=0, timestamp=-1)])]))
    return int(resp.topics[0].partitions[0].error_code)


def _metadata(c: TlsClient) -> int:
    resp = c.request(MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name="pub-t")], allow_auto_topic_creation=False))
    return int(resp.topics[0].error_code)


def _epoch(c: TlsClient) -> int:
    T = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    resp = c.request(OffsetForLeaderEpochRequest[4](replica_id=-1, topics=[
        T(topic="pub-t", partitions=[T.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=0)])]))
    return int(resp.topics[0].partitions[0].error_code)


def _offset_commit(c: TlsClient) -> int:
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    resp = c.request(OffsetCommitRequest[8](group_id="g-bob", generation_id_or_member_epoch=-1, member_id="", topics=[
        T(name="pub-t", partitions=[T.OffsetCommitRequestPartition(partition_index=0, committed_offset=0)])]))
    return int(resp.topics[0].partitions[0].error_code)


def _offset_fetch(c: TlsClient) -> int:
    return int(c.request(OffsetFetchRequest[7](group_id="g-bob", topics=None)).error_code)


def _find_group(c: TlsClient) -> int:
    return int(c.request(FindCoordinatorRequest[3](key="g-bob", key_type=0)).error_code)


def _find_txn(c: TlsClient) -> int:
    return int(c.request(FindCoordinatorRequest[3](key="tx-bob-1", key_type=1)).error_code)


def _join(c: TlsClient) -> int:
    P = JoinGroupRequest.JoinGroupRequestProtocol
    return int(c.request(JoinGroupRequest[5](
        group_id="g-bob", session_timeout_ms=10_000, rebalance_timeout_ms=10_000, member_id="", protocol_type="consumer",
        protocols=[P(name="range", metadata=b"")])).error_code)


def _heartbeat(c: TlsClient) -> int:
    return int(c.request(HeartbeatRequest[4](group_id="g-bob", generation_id=1, member_id="nobody")).error_code)


def _sync(c: TlsClient) -> int:
    return int(c.request(SyncGroupRequest[4](group_id="g-bob", generation_id=1, member_id="nobody", assignments=[])).error_code)


def _leave(c: TlsClient) -> int:
    M = LeaveGroupRequest.MemberIdentity
    return int(c.request(LeaveGroupRequest[4](group_id="g-bob", members=[M(member_id="nobody")])).error_code)


def _describe_groups(c: TlsClient) -> int:
    return int(c.request(DescribeGroupsRequest[5](groups=["g-bob"])).groups[0].error_code)


def _cg_heartbeat(c: TlsClient) -> int:
    return int(c.request(ConsumerGroupHeartbeatRequest[0](
        group_id="g-bob", member_id="", member_epoch=-1, rebalance_timeout_ms=30_000, subscribed_topic_names=["pub-t"],
        topic_partitions=[])).error_code)


def _cg_describe(c: TlsClient) -> int:
    return int(c.request(ConsumerGroupDescribeRequest[0](group_ids=["g-bob"])).groups[0].error_code)


def _offset_delete(c: TlsClient) -> int:
    T = OffsetDeleteRequest.OffsetDeleteRequestTopic
    resp = c.request(OffsetDeleteRequest[0](group_id="g-bob", topics=[
        T(name="pub-t", partitions=[T.OffsetDeleteRequestPartition(partition_index=0)])]))
    return int(resp.error_code or (resp.topics[0].partitions[0].error_code if resp.topics else 0))


def _create_topics(c: TlsClient) -> int:
    return create_topic(c, "pub-new")


def _create_partitions(c: TlsClient) -> int:
    T = CreatePartitionsRequest.CreatePartitionsTopic
    resp = c.request(CreatePartitionsRequest[3](topics=[T(name="pub-new", count=2, assignments=None)], timeout_ms=10_000, validate_only=True))
    return int(resp.results[0].error_code)


def _delete_records(c: TlsClient) -> int:
    T = DeleteRecordsRequest.DeleteRecordsTopic
    resp = c.request(DeleteRecordsRequest[2](timeout_ms=10_000, topics=[
        T(name="pub-new", partitions=[T.DeleteRecordsPartition(partition_index=0, offset=0)])]))
    return int(resp.topics[0].partitions[0].error_code)


def _delete_topics(c: TlsClient) -> int:
    return int(c.request(DeleteTopicsRequest[4](topic_names=["pub-new"], timeout_ms=10_000)).responses[0].error_code)


def _describe_configs(c: TlsClient) -> int:
    R = DescribeConfigsRequest.DescribeConfigsResource
    return int(c.request(DescribeConfigsRequest[4](resources=[R(resource_type=2, resource_name="pub-t", configuration_keys=None)])).results[0].error_code)


def _describe_broker_configs(c: TlsClient) -> int:
    R = DescribeConfigsRequest.DescribeConfigsResource
    return int(c.request(DescribeConfigsRequest[4](resources=[R(resource_type=4, resource_name="0", configuration_keys=None)])).results[0].error_code)


def _alter_configs(c: TlsClient) -> int:
    R = AlterConfigsRequest.AlterConfigsResource
    resp = c.request(AlterConfigsRequest[2](validate_only=True, resources=[R(resource_type=2, resource_name="pub-t", configs=[
        R.AlterableConfig(name="retention.ms", value="3600000")])]))
    return int(resp.responses[0].error_code)


def _incremental_alter(c: TlsClient) -> int:
    R = IncrementalAlterConfigsRequest.AlterConfigsResource
    resp = c.request(IncrementalAlterConfigsRequest[1](validate_only=True, resources=[R(resource_type=2, resource_name="pub-t", configs=[
        R.AlterableConfig(name="retention.ms", config_operation=0, value="3600000")])]))
    return int(resp.responses[0].error_code)


def _log_dirs(c: TlsClient) -> int:
    return int(c.request(DescribeLogDirsRequest[4](topics=None)).error_code)


def _cluster_operations(c: TlsClient) -> set[int]:
    resp = c.request(DescribeClusterRequest[1](include_cluster_authorized_operations=True))
    assert resp.error_code == 0  # DescribeCluster is open to everyone, as in Kafka
    return set(resp.authorized_operations)


def _describe_producers(c: TlsClient) -> int:
    T = DescribeProducersRequest.TopicRequest
    return int(c.request(DescribeProducersRequest[0](topics=[T(name="pub-t", partition_indexes=[0])])).topics[0].partitions[0].error_code)


def _describe_acls(c: TlsClient) -> int:
    return int(c.request(DescribeAclsRequest[3](
        resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None, host_filter=None,
        operation=1, permission_type=1)).error_code)


def _create_acls(c: TlsClient) -> int:
    return create_acls(c, (TOPIC, "x", LITERAL, "User:x", READ, ALLOW))[0]


def _delete_acls(c: TlsClient) -> int:
    F = DeleteAclsRequest.DeleteAclsFilter
    resp = c.request(DeleteAclsRequest[3](filters=[F(
        resource_type_filter=TOPIC, resource_name_filter="x", pattern_type_filter=LITERAL, principal_filter="User:x",
        host_filter=None, operation=1, permission_type=1)]))
    return int(resp.filter_results[0].error_code)


def _produce(c: TlsClient) -> int:
    return produce(c, "pub-t", batch())[0]


def _delete_groups(c: TlsClient) -> int:
    return int(c.request(DeleteGroupsRequest[2](groups_names=["g-bob"])).results[0].error_code)


#: (API, call, what a principal without the operation gets). The one with it gets no
#: authorization error (the answer may still be an ordinary one, e.g. UNKNOWN_MEMBER_ID).
MATRIX: list[tuple[str, Callable[[TlsClient], int], int]] = [
    ("Produce", _produce, E.TOPIC_AUTHORIZATION_FAILED),
    ("Fetch", _fetch, E.TOPIC_AUTHORIZATION_FAILED),
    ("ListOffsets", _list_offsets, E.TOPIC_AUTHORIZATION_FAILED),
    ("Metadata", _metadata, E.TOPIC_AUTHORIZATION_FAILED),
    ("OffsetForLeaderEpoch", _epoch, E.TOPIC_AUTHORIZATION_FAILED),
    ("OffsetCommit", _offset_commit, E.GROUP_AUTHORIZATION_FAILED),
    ("OffsetFetch", _offset_fetch, E.GROUP_AUTHORIZATION_FAILED),
    ("FindCoordinator(group)", _find_group, E.GROUP_AUTHORIZATION_FAILED),
    ("FindCoordinator(txn)", _find_txn, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    ("JoinGroup", _join, E.GROUP_AUTHORIZATION_FAILED),
    ("Heartbeat", _heartbeat, E.GROUP_AUTHORIZATION_FAILED),
    ("SyncGroup", _sync, E.GROUP_AUTHORIZATION_FAILED),
    ("LeaveGroup", _leave, E.GROUP_AUTHORIZATION_FAILED),
    ("DescribeGroups", _describe_groups, E.GROUP_AUTHORIZATION_FAILED),
    ("ConsumerGroupHeartbeat", _cg_heartbeat, E.GROUP_AUTHORIZATION_FAILED),
    ("ConsumerGroupDescribe", _cg_describe, E.GROUP_AUTHORIZATION_FAILED),
    ("OffsetDelete", _offset_delete, E.GROUP_AUTHORIZATION_FAILED),
    ("CreateTopics", _create_topics, E.TOPIC_AUTHORIZATION_FAILED),
    ("CreatePartitions", _create_partitions, E.TOPIC_AUTHORIZATION_FAILED),
    ("DeleteRecords", _delete_records, E.TOPIC_AUTHORIZATION_FAILED),
    ("DeleteTopics", _delete_topics, E.TOPIC_AUTHORIZATION_FAILED),
    ("DescribeConfigs", _describe_configs, E.TOPIC_AUTHORIZATION_FAILED),
    ("AlterConfigs", _alter_configs, E.TOPIC_AUTHORIZATION_FAILED),
    ("IncrementalAlterConfigs", _incremental_alter, E.TOPIC_AUTHORIZATION_FAILED),
    ("DescribeLogDirs", _log_dirs, E.CLUSTER_AUTHORIZATION_FAILED),
    ("DescribeProducers", _describe_producers, E.TOPIC_AUTHORIZATION_FAILED),
    ("DescribeAcls", _describe_acls, E.CLUSTER_AUTHORIZATION_FAILED),
    ("DeleteGroups", _delete_groups, E.GROUP_AUTHORIZATION_FAILED),
]


@pytest.mark.parametrize(("api", "call", "refused"), MATRIX, ids=[m[0] for m in MATRIX])
def test_matrix_refused_without_the_operation_served_with_it(
    clients: dict[str, TlsClient], granted: None, api: str, call: Callable[[TlsClient], int], refused: int
) -> None:
    assert call(clients["eve"]) == refused, f"{api} as eve"
    assert call(clients["bob"]) not in AUTH_ERRORS, f"{api} as bob"


def test_broker_resource_and_acl_administration_need_the_cluster(clients: dict[str, TlsClient], granted: None) -> None:
    bob, eve, admin = clients["bob"], clients["eve"], clients["admin"]
    assert _cluster_operations(eve) == set()
    assert _cluster_operations(bob) == {DESCRIBE}
    assert {DESCRIBE, 7, 9, 12} <= _cluster_operations(admin)  # ALTER, CLUSTER_ACTION, IDEMPOTENT_WRITE
    assert _describe_broker_configs(eve) == E.CLUSTER_AUTHORIZATION_FAILED
    assert _describe_broker_configs(bob) == E.CLUSTER_AUTHORIZATION_FAILED  # DESCRIBE does not imply DESCRIBE_CONFIGS
    assert _describe_broker_configs(admin) == 0
    for call in (_create_acls, _delete_acls):  # bob may DESCRIBE the cluster, not ALTER it
        assert call(eve) == E.CLUSTER_AUTHORIZATION_FAILED
        assert call(bob) == E.CLUSTER_AUTHORIZATION_FAILED
        assert call(admin) == 0


def test_transactions(clients: dict[str, TlsClient], granted: None) -> None:
    bob, eve = clients["bob"], clients["eve"]
    tid = "tx-bob-1"

    def init(c: TlsClient, transactional_id: str | None) -> Any:
        return c.request(InitProducerIdRequest[4](transactional_id=transactional_id, transaction_timeout_ms=60_000,
                                                  producer_id=-1, producer_epoch=-1))

    assert init(eve, tid).error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # Idempotent producers (Kafka 3+): IDEMPOTENT_WRITE on the cluster or WRITE on some topic.
    assert init(eve, None).error_code == E.CLUSTER_AUTHORIZATION_FAILED
    assert init(bob, None).error_code == 0
    ok = init(bob, tid)
    assert ok.error_code == 0
    pid, epoch = ok.producer_id, ok.producer_epoch
    A = AddPartitionsToTxnRequest

    def add(c: TlsClient, topic: str) -> list[int]:
        resp = c.request(A[3](v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                              v3_and_below_topics=[A.AddPartitionsToTxnTopic(name=topic, partitions=[0])]))
        return [p.partition_error_code for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition]

    assert add(eve, "pub-t") == [E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED]
    assert add(bob, "pub-denied") == [E.TOPIC_AUTHORIZATION_FAILED]
    assert add(bob, "pub-t") == [0]
    assert produce(eve, "pub-t", batch(pid, epoch, 0, True), tid) == [E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED]
    assert produce(bob, "pub-t", batch(pid, epoch, 0, True), tid) == [0]

    def add_offsets(c: TlsClient, group: str) -> int:
        return int(c.request(AddOffsetsToTxnRequest[3](transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group)).error_code)

    assert add_offsets(eve, "g-bob") == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert add_offsets(bob, "g-other") == E.GROUP_AUTHORIZATION_FAILED
    assert add_offsets(bob, "g-bob") == 0
    T = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic

    def txn_commit(c: TlsClient) -> int:
        resp = c.request(TxnOffsetCommitRequest[3](
            transactional_id=tid, group_id="g-bob", producer_id=pid, producer_epoch=epoch, generation_id=-1, member_id="",
            group_instance_id=None, topics=[T(name="pub-t", partitions=[T.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=1)])]))
        return int(resp.topics[0].partitions[0].error_code)

    assert txn_commit(eve) == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert txn_commit(bob) == 0
    D = DescribeTransactionsRequest
    assert eve.request(D[0](transactional_ids=[tid])).transaction_states[0].error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert bob.request(D[0](transactional_ids=[tid])).transaction_states[0].error_code == 0
    listed = {who: [s.transactional_id for s in c.request(ListTransactionsRequest[1](state_filters=[], producer_id_filters=[])).transaction_states]
              for who, c in (("bob", bob), ("eve", eve))}
    assert tid in listed["bob"] and tid not in listed["eve"]  # listed only where DESCRIBE is allowed

    def end(c: TlsClient) -> int:
        return int(c.request(EndTxnRequest[3](transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=True)).error_code)

    assert end(eve) == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert end(bob) == 0


def test_prefixed_and_deny_rules_and_super_users(clients: dict[str, TlsClient], granted: None) -> None:
    bob, admin = clients["bob"], clients["admin"]
    assert create_topic(admin, "other-t") in (0, E.TOPIC_ALREADY_EXISTS)
    assert produce(bob, "pub-t", batch()) == [0]  # the prefixed ALLOW ALL
    assert produce(bob, "other-t", batch()) == [E.TOPIC_AUTHORIZATION_FAILED]  # outside the prefix
    assert produce(bob, "pub-denied", batch()) == [E.TOPIC_AUTHORIZATION_FAILED]  # DENY WRITE wins over ALLOW ALL
    assert _metadata_names(bob, ["pub-denied"]) == {"pub-denied": 0}  # ...but DESCRIBE is still allowed
    assert produce(admin, "pub-denied", batch()) == [0]  # a super user is never refused
    assert produce(admin, "other-t", batch()) == [0]


def test_create_topics_returns_configs_only_with_describe_configs(clients: dict[str, TlsClient], granted: None) -> None:
    bob, eve, admin = clients["bob"], clients["eve"], clients["admin"]
    assert create_acls(admin, (TOPIC, "eve-", PREFIXED, "User:eve", 5, ALLOW)) == [0]  # CREATE only
    T = CreateTopicsRequest.CreatableTopic

    def create(c: TlsClient, name: str) -> Any:
        resp = c.request(CreateTopicsRequest[5](topics=[T(name=name, num_partitions=1, replication_factor=1)], timeout_ms=10_000))
        return resp.topics[0]

    mine = create(eve, "eve-t")
    assert (mine.error_code, mine.topic_config_error_code, mine.configs) == (0, E.TOPIC_AUTHORIZATION_FAILED, [])
    assert create(eve, "pub-by-eve").error_code == E.TOPIC_AUTHORIZATION_FAILED
    theirs = create(bob, "pub-cfg")
    assert theirs.error_code == 0 and theirs.topic_config_error_code == 0 and theirs.configs


def _metadata_names(c: TlsClient, names: list[str] | None, create: bool = False) -> dict[str, int]:
    topics = None if names is None else [MetadataRequest.MetadataRequestTopic(name=n) for n in names]
    resp = c.request(MetadataRequest[12](topics=topics, allow_auto_topic_creation=create, include_topic_authorized_operations=True))
    return {t.name: t.error_code for t in resp.topics}


def test_metadata_lists_only_what_the_principal_may_describe(clients: dict[str, TlsClient], granted: None) -> None:
    bob, eve, admin = clients["bob"], clients["eve"], clients["admin"]
    assert create_topic(admin, "other-t") in (0, E.TOPIC_ALREADY_EXISTS)
    every = _metadata_names(admin, None)
    assert {"pub-t", "other-t"} <= set(every)
    assert set(_metadata_names(bob, None)) == {n for n in every if n.startswith("pub-")}
    assert _metadata_names(eve, None) == {}
    assert _metadata_names(eve, ["pub-t"]) == {"pub-t": E.TOPIC_AUTHORIZATION_FAILED}
    # Auto-creation needs CREATE: eve may not (whether or not the topic exists, the same answer).
    assert _metadata_names(eve, ["pub-auto-eve"], create=True) == {"pub-auto-eve": E.TOPIC_AUTHORIZATION_FAILED}
    assert _metadata_names(bob, ["pub-auto-bob"], create=True) == {"pub-auto-bob": 0}
    # Authorized operations come from the ACLs: bob may do everything to pub-t but not WRITE pub-denied.
    resp = bob.request(MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name="pub-denied")],
                                           allow_auto_topic_creation=False, include_topic_authorized_operations=True))
    ops = resp.topics[0].authorized_operations
    assert READ in ops and DESCRIBE in ops and WRITE not in ops


def test_list_groups_filtered(clients: dict[str, TlsClient], granted: None) -> None:
    bob, eve = clients["bob"], clients["eve"]
    assert _offset_commit(bob) == 0
    for who, c in (("bob", bob), ("eve", eve)):
        groups = [g.group_id for g in c.request(ListGroupsRequest[4](states_filter=[])).groups]
        assert ("g-bob" in groups) == (who == "bob")


def audit_lines(b: Broker) -> list[str]:
    return [line for line in b.log_text().splitlines() if "DENIED principal=" in line]


def test_audit_line_once_per_denied_request(broker: Broker, clients: dict[str, TlsClient], granted: None) -> None:
    eve = clients["eve"]
    before = len(audit_lines(broker))
    # One Produce naming two forbidden topics, three partitions: one line.
    P = ProduceRequest.TopicProduceData
    records = batch()
    eve.request(ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
        P(name="pub-t", partition_data=[P.PartitionProduceData(index=i, records=records) for i in (0, 1)]),
        P(name="other-t", partition_data=[P.PartitionProduceData(index=0, records=records)]),
    ]))
    deadline = time.monotonic() + 10
    while len(audit_lines(broker)) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a second line, if any, would come right after the first
    new = audit_lines(broker)[before:]
    assert len(new) == 1, new
    line = new[0]
    for part in ("principal=User:eve", "host=127.0.0.1", "api=Produce", "operation=WRITE", "resource_type=TOPIC",
                 "'other-t'", "'pub-t'"):
        assert part in line, line
    # OffsetFetch v8 naming two groups eve may not describe: both refused, one line.
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    before = len(audit_lines(broker))
    resp = eve.request(OffsetFetchRequest[8](groups=[G(group_id="g-bob", topics=None), G(group_id="g-x", topics=None)],
                                             require_stable=False))
    assert [g.error_code for g in resp.groups] == [E.GROUP_AUTHORIZATION_FAILED] * 2
    time.sleep(0.3)
    new = audit_lines(broker)[before:]
    assert len(new) == 1 and "api=OffsetFetch" in new[0] and "'g-bob','g-x'" in new[0], new


def _admin(broker: Broker, pki: Pki, who: str) -> AdminClient:
    pair = pki.clients[who]
    return AdminClient({"bootstrap.servers": broker.bootstrap, "security.protocol": "SSL", "ssl.ca.location": str(pki.ca),
                        "ssl.certificate.location": str(pair.cert), "ssl.key.location": str(pair.key), "log_level": 0})


def test_admin_client_create_describe_delete_round_trip(broker: Broker, pki: Pki, granted: None) -> None:
    admin = _admin(broker, pki, "admin")
    name = f"rt-{uuid.uuid4().hex[:6]}"
    bindings = [
        AclBinding(ResourceType.TOPIC, name, ResourcePatternType.LITERAL, "User:carol", "*", AclOperation.READ, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, name, ResourcePatternType.PREFIXED, "User:carol", "10.0.0.1", AclOperation.WRITE, AclPermissionType.DENY),
        AclBinding(ResourceType.GROUP, name, ResourcePatternType.LITERAL, "User:*", "*", AclOperation.ALL, AclPermissionType.ALLOW),
    ]
    for fut in admin.create_acls(bindings, request_timeout=15).values():
        assert fut.result() is None
    match = AclBindingFilter(ResourceType.ANY, name, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY)
    described = admin.describe_acls(match, request_timeout=15).result()
    assert sorted(map(str, described)) == sorted(map(str, bindings))
    # MATCH: the bindings that apply to a topic named name + "-x" (the prefixed one).
    applies = AclBindingFilter(ResourceType.TOPIC, name + "-x", ResourcePatternType.MATCH, None, None, AclOperation.ANY, AclPermissionType.ANY)
    assert [b.host for b in admin.describe_acls(applies, request_timeout=15).result()] == ["10.0.0.1"]
    bad = AclBinding(ResourceType.BROKER, "not-the-cluster", ResourcePatternType.LITERAL, "User:carol", "*", AclOperation.ALTER, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as err:
        admin.create_acls([bad], request_timeout=15)[bad].result()
    assert err.value.args[0].code() == E.INVALID_REQUEST
    only_topic = AclBindingFilter(ResourceType.TOPIC, name, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY)
    deleted = admin.delete_acls([only_topic], request_timeout=15)[only_topic].result()
    assert sorted(map(str, deleted)) == sorted(map(str, bindings[:2]))
    assert [str(b) for b in admin.describe_acls(match, request_timeout=15).result()] == [str(bindings[2])]
    # Not a super user and no ALTER on the cluster: refused.
    eve = _admin(broker, pki, "eve")  # held: a dropped client cancels its futures
    with pytest.raises(KafkaException) as err:
        eve.create_acls(bindings[:1], request_timeout=15)[bindings[0]].result()
    assert err.value.args[0].code() == E.CLUSTER_AUTHORIZATION_FAILED


def _client_conf(broker: Broker, pki: Pki, who: str) -> dict[str, Any]:
    pair = pki.clients[who]
    return {"bootstrap.servers": broker.bootstrap, "security.protocol": "SSL", "ssl.ca.location": str(pki.ca),
            "ssl.certificate.location": str(pair.cert), "ssl.key.location": str(pair.key), "log_level": 0}


def test_confluent_idempotent_producer_and_group_consumer(broker: Broker, pki: Pki, granted: None) -> None:
    """Real clients: bob's idempotent producer (InitProducerId by WRITE on a topic, Kafka 3+) and
    subscribing consumer (group g-bob) work; eve's consumer is told GROUP_AUTHORIZATION_FAILED."""
    topic = f"pub-cg-{uuid.uuid4().hex[:6]}"
    producer = Producer({**_client_conf(broker, pki, "bob"), "enable.idempotence": True})
    for i in range(20):
        producer.produce(topic, value=b"m%d" % i)
    assert producer.flush(30) == 0
    consumer = Consumer({**_client_conf(broker, pki, "bob"), "group.id": "g-bob", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < 20 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert got == [b"m%d" % i for i in range(20)]
    eve = Consumer({**_client_conf(broker, pki, "eve"), "group.id": "g-bob", "auto.offset.reset": "earliest"})
    eve.subscribe([topic])
    error = None
    deadline = time.monotonic() + 30
    while error is None and time.monotonic() < deadline:
        msg = eve.poll(0.5)
        if msg is not None and msg.error():
            error = msg.error()
    eve.close()
    assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error


def test_acls_survive_a_restart(broker: Broker, pki: Pki, clients: dict[str, TlsClient], granted: None) -> None:
    """Last in the module: the clients' connections close with the restart."""
    for c in clients.values():
        c.close()
    broker.restart()
    bob, eve = TlsClient(broker.port, pki, "bob"), TlsClient(broker.port, pki, "eve")
    try:
        assert produce(bob, "pub-t", batch()) == [0]
        assert produce(bob, "pub-denied", batch()) == [E.TOPIC_AUTHORIZATION_FAILED]
        assert produce(eve, "pub-t", batch()) == [E.TOPIC_AUTHORIZATION_FAILED]
        assert _describe_acls(TlsClient(broker.port, pki, "admin")) == 0
    finally:
        bob.close()
        eve.close()
