"""ACLs on a real broker, API by API: a principal without the right operation is refused with
Kafka's error code, one with it is served (raw requests through kafka-python's protocol classes,
so every API and version is expressible); prefixed and deny rules, super users, transactions.
Broker and principals: tests/aclkit.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteAclsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeLogDirsRequest,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    IncrementalAlterConfigsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)

from aclkit import (
    ALLOW,
    AUTH_ERRORS,
    DESCRIBE,
    LITERAL,
    PREFIXED,
    READ,
    TOPIC,
    TlsClient,
    acl_broker,
    acl_pki,
    batch,
    create_acls,
    create_topic,
    describe_acls,
    grant,
    metadata_names,
    offset_commit,
    open_clients,
    produce,
)
from loglake.broker.protocol.kip848 import ConsumerGroupDescribeRequest, ConsumerGroupHeartbeatRequest
from loglake.kafka_errors import ErrorCode as E
from tlskit import Pki

from brokerkit import InProcessBroker


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return acl_pki(tmp_path_factory)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[InProcessBroker]:
    yield from acl_broker(tmp_path_factory, pki)


@pytest.fixture(scope="module")
def clients(broker: InProcessBroker, pki: Pki) -> Iterator[dict[str, TlsClient]]:
    yield from open_clients(broker, pki)


@pytest.fixture(scope="module")
def granted(clients: dict[str, TlsClient]) -> None:
    grant(clients)


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
    ("OffsetCommit", offset_commit, E.GROUP_AUTHORIZATION_FAILED),
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
    ("DescribeAcls", describe_acls, E.CLUSTER_AUTHORIZATION_FAILED),
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
    assert metadata_names(bob, ["pub-denied"]) == {"pub-denied": 0}  # ...but DESCRIBE is still allowed
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




def test_a_long_poll_that_times_out_keeps_the_read_refusals(clients: dict[str, TlsClient], granted: None) -> None:
    """A fetch of a topic bob may read (at its end: it waits) and one he may not (with records):
    the answer after the wait times out still refuses the second (the re-read once dropped it)."""
    bob, admin = clients["bob"], clients["admin"]
    assert create_topic(admin, "secret-t") in (0, E.TOPIC_ALREADY_EXISTS)
    assert produce(admin, "secret-t", batch()) == [0]
    F = FetchRequest.FetchTopic
    end = _list_end(bob, "pub-t")
    resp = bob.request(FetchRequest[12](max_wait_ms=300, min_bytes=1, max_bytes=1 << 20, isolation_level=0, topics=[
        F(topic="pub-t", partitions=[F.FetchPartition(partition=0, fetch_offset=end, partition_max_bytes=1 << 20)]),
        F(topic="secret-t", partitions=[F.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)]),
    ]))
    got = {t.topic: (t.partitions[0].error_code, bool(t.partitions[0].records)) for t in resp.responses}
    assert got == {"pub-t": (0, False), "secret-t": (E.TOPIC_AUTHORIZATION_FAILED, False)}


def _list_end(c: TlsClient, topic: str) -> int:
    T = ListOffsetsRequest.ListOffsetsTopic
    resp = c.request(ListOffsetsRequest[5](replica_id=-1, isolation_level=0, topics=[
        T(name=topic, partitions=[T.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)])]))
    return int(resp.topics[0].partitions[0].offset)
