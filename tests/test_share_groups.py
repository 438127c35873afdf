"""Share groups (KIP-932) with librdkafka's share consumer (confluent_kafka.ShareConsumer, 2.16)
against one broker and against a three-broker cluster (tests/modekit.py MODES: share-partition
state goes through `engine.meta`, etcd there): records spread over more consumers than
partitions, explicit ACCEPT/RELEASE/REJECT, redelivery after a consumer dies with records acquired
(after the lock duration, delivery count 2), and acknowledgements that survive a kill -9 of the
brokers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import (
    AcknowledgeType,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    ShareConsumer,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kafka.protocol.parser import KafkaProtocol

from loglake.broker.protocol import ApiKey, request_class
from loglake.cli.remote_raw import build
from loglake.engine.partition_log import Feature
from loglake.kafka_errors import ErrorCode
from modekit import MODES, Served, serving

from brokerkit import start_on_port

#: The broker's group.share.record.lock.duration.ms here (its smallest allowed is 1 s).
LOCK_MS = 3000
#: group.share.delivery.count.limit here (Kafka's smallest; 5 by default).
DELIVERY_LIMIT = 2

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", params=MODES)
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    env = {**os.environ, "LOGLAKE_GROUP_SHARE_RECORD_LOCK_DURATION_MS": str(LOCK_MS),
           "LOGLAKE_GROUP_SHARE_DELIVERY_COUNT_LIMIT": str(DELIVERY_LIMIT)}
    with serving(request.param, tmp_path_factory.mktemp(f"share-{request.param}"), env=env) as served:
        yield served


def _kill_and_start(served: Served) -> None:
    """kill -9 every broker, then start them again on their ports."""
    for n in served.node_ids:
        if served.cluster is not None:
            served.cluster.by_node(n).kill()
        else:
            served.broker(n).stop(signal.SIGKILL)
    for n in served.node_ids:
        if served.cluster is not None:
            served.cluster.by_node(n).start()
        else:
            start_on_port(served.broker(n), served.broker(n).port)
    if served.cluster is not None:
        assert served.agreed(served.listed) == served.node_ids


def _topic(broker: Served, name: str, partitions: int, records: int, group: str) -> None:
    """A topic with `records` values "v<i>" round-robin over its partitions, and `group` set to
    start from the earliest offset (share.auto.offset.reset)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=15)
    broker.leaders(name, partitions)
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=15)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(records):
        p.produce(name, value=f"v{i}".encode(), partition=i % partitions)
    assert p.flush(15) == 0


def _consumer(broker: Served, group: str, topic: str, *, explicit: bool = False, max_records: int | None = None,
              **extra: str) -> ShareConsumer:
    conf: dict[str, str | int] = {"bootstrap.servers": broker.bootstrap, "group.id": group, **extra}
    if explicit:
        conf["share.acknowledgement.mode"] = "explicit"
    if max_records is not None:
        conf["max.poll.records"] = max_records
    c = ShareConsumer(conf)
    c.subscribe([topic])
    return c


def _poll(c: ShareConsumer, timeout: float = 1.0) -> list[Message]:
    out = []
    for m in c.poll(timeout):
        assert m.error() is None, m.error()
        out.append(m)
    return out


def _poll_until(c: ShareConsumer, want: int, timeout_s: float = 20.0) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += _poll(c)
    return got


def test_more_consumers_than_partitions_each_get_distinct_records(broker: Served) -> None:
    _topic(broker, "spread", 2, 400, "g-spread")
    consumers = [_consumer(broker, "g-spread", "spread", max_records=10) for _ in range(4)]
    seen: dict[int, list[tuple[int, int]]] = {i: [] for i in range(4)}
    deadline = time.monotonic() + 60
    try:
        while sum(len(v) for v in seen.values()) < 400 and time.monotonic() < deadline:
            for i, c in enumerate(consumers):
                got = _poll(c, 0.3)
                # delivered the first time: no response lost to the client (its records would come
                # back after the lock duration, counted twice)
                assert [m.delivery_count() for m in got] == [1] * len(got)
                seen[i] += [(m.partition(), m.offset()) for m in got]
    finally:
        for c in consumers:
            c.close()
    every = [tp for v in seen.values() for tp in v]
    assert sorted(every) == sorted((i % 2, i // 2) for i in range(400))  # each record once, none lost
    assert all(seen[i] for i in range(4)), {i: len(v) for i, v in seen.items()}  # all four consumers got some


def test_one_consumer_reads_both_partitions_without_a_lost_response(broker: Served) -> None:
    _topic(broker, "bulk", 2, 6000, "g-bulk")
    c = _consumer(broker, "g-bulk", "bulk")
    try:
        t0 = time.monotonic()
        got = _poll_until(c, 6000, timeout_s=LOCK_MS / 1000 - 0.5)  # before any lock could time out
        assert len(got) == 6000, f"{len(got)} records in {time.monotonic() - t0:.1f} s"
        assert {m.delivery_count() for m in got} == {1}
    finally:
        c.close()


def test_explicit_accept_release_reject(broker: Served) -> None:
    _topic(broker, "acks", 1, 3, "g-acks")
    c = _consumer(broker, "g-acks", "acks", explicit=True)
    try:
        first = _poll_until(c, 3)
        assert [(m.offset(), m.delivery_count()) for m in first] == [(0, 1), (1, 1), (2, 1)]
        c.acknowledge(first[0], AcknowledgeType.ACCEPT)
        c.acknowledge(first[1], AcknowledgeType.RELEASE)
        c.acknowledge(first[2], AcknowledgeType.REJECT)
        results = c.commit_sync(15)
        assert all(err is None for err in results.values()), results
        again = _poll_until(c, 1)
        assert [(m.offset(), m.value(), m.delivery_count()) for m in again] == [(1, b"v1", 2)]  # released: once more
        c.acknowledge(again[0], AcknowledgeType.ACCEPT)
        c.commit_sync(15)
        assert _poll_until(c, 1, timeout_s=LOCK_MS / 1000 + 2) == []  # accepted and rejected: never again
    finally:
        c.close()


def test_the_delivery_limit_archives(broker: Served) -> None:
    _topic(broker, "limit", 1, 2, "g-limit")
    c = _consumer(broker, "g-limit", "limit", explicit=True)
    try:
        for delivery in range(1, DELIVERY_LIMIT + 1):
            got = _poll_until(c, 2)
            assert [(m.offset(), m.delivery_count()) for m in got] == [(0, delivery), (1, delivery)]
            c.acknowledge(got[0], AcknowledgeType.RELEASE)
            c.acknowledge(got[1], AcknowledgeType.RELEASE if delivery < DELIVERY_LIMIT else AcknowledgeType.ACCEPT)
            assert all(err is None for err in c.commit_sync(15).values())
        assert _poll_until(c, 1, timeout_s=LOCK_MS / 1000 + 2) == []  # released at the limit: archived
    finally:
        c.close()


def test_a_groups_own_delivery_limit_and_lock_duration(broker: Served) -> None:
    _topic(broker, "limit3", 1, 1, "g-limit3")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource(ResourceType.GROUP, "g-limit3", incremental_configs=[
        ConfigEntry("share.delivery.count.limit", str(DELIVERY_LIMIT + 1), incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("share.record.lock.duration.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=15)
    described = admin.describe_configs([ConfigResource(ResourceType.GROUP, "g-limit3")])
    entries = next(iter(described.values())).result(timeout=15)
    assert (entries["share.delivery.count.limit"].value, entries["share.record.lock.duration.ms"].value) == (
        str(DELIVERY_LIMIT + 1), "1000")
    c = _consumer(broker, "g-limit3", "limit3", explicit=True)
    try:
        for delivery in range(1, DELIVERY_LIMIT + 2):  # one more delivery than the broker's limit allows
            got = _poll_until(c, 1)
            assert [(m.offset(), m.delivery_count()) for m in got] == [(0, delivery)]
            c.acknowledge(got[0], AcknowledgeType.RELEASE)
            assert all(err is None for err in c.commit_sync(15).values())
        assert _poll_until(c, 1, timeout_s=LOCK_MS / 1000 + 2) == []  # released at the group's limit: archived
    finally:
        c.close()
    # the group's 1 s lock, not the broker's LOCK_MS: a consumer that dies holding the record
    # gives it back within about a second
    _produce(broker, "limit3", 1)
    child = subprocess.Popen([sys.executable, "-c", _DYING.replace("g-die", "g-limit3").replace('"die"', '"limit3"')
                              .replace("len(got) < 5", "len(got) < 1"), broker.bootstrap],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["1"]
        acquired_at = time.monotonic()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    c = _consumer(broker, "g-limit3", "limit3")
    try:
        again = _poll_until(c, 1, timeout_s=LOCK_MS / 1000)
        assert [(m.offset(), m.delivery_count()) for m in again] == [(1, 2)]
        assert time.monotonic() - acquired_at < LOCK_MS / 1000
    finally:
        c.close()


def _produce(broker: Served, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(n):
        p.produce(topic, value=f"more{i}".encode())
    assert p.flush(15) == 0


_DYING = """
import sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": "g-die", "share.acknowledgement.mode": "explicit"})
c.subscribe(["die"])
got = []
deadline = time.monotonic() + 30
while len(got) < 5 and time.monotonic() < deadline:
    got += [m.offset() for m in c.poll(1.0) if m.error() is None]
print(" ".join(map(str, sorted(got))), flush=True)
time.sleep(60)
"""


def test_a_dead_consumers_records_come_back_after_the_lock_duration(broker: Served) -> None:
    _topic(broker, "die", 1, 5, "g-die")
    child = subprocess.Popen([sys.executable, "-c", _DYING, broker.bootstrap], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        acquired_at = time.monotonic()
        assert line.split() == ["0", "1", "2", "3", "4"]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    c = _consumer(broker, "g-die", "die")
    try:
        again = _poll_until(c, 5, timeout_s=LOCK_MS / 1000 + 15)
        waited = time.monotonic() - acquired_at
        assert sorted((m.offset(), m.delivery_count()) for m in again) == [(i, 2) for i in range(5)]
        assert waited >= LOCK_MS / 1000 - 0.5  # not before the acquisition lock timed out
    finally:
        c.close()


def test_acknowledgements_survive_a_broker_kill(broker: Served) -> None:
    _topic(broker, "crash", 1, 10, "g-crash")
    c = _consumer(broker, "g-crash", "crash", explicit=True)
    try:
        got = _poll_until(c, 10)
        assert [m.offset() for m in got] == list(range(10))
        for m in got[:6]:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        results = c.commit_sync(15)
        assert all(err is None for err in results.values()), results
    finally:
        _kill_and_start(broker)  # offsets 6..9 stay acquired by a consumer that never hears back
        c.close()
    c = _consumer(broker, "g-crash", "crash")
    try:
        again = _poll_until(c, 4)
        assert [m.offset() for m in again] == [6, 7, 8, 9]  # acknowledged ones are not redelivered
        assert _poll_until(c, 1, timeout_s=2) == []
    finally:
        c.close()


def _call(broker: Served, group: str, api_key: int, version: int, *, node: int | None = None, **fields: object) -> Any:
    """One request of this version to the group's coordinator (or broker `node`), its decoded response."""
    proto = KafkaProtocol(client_id="share-test")
    cls = request_class(api_key)
    proto.send_request(cls[version](**build(cls._struct, version, fields)))
    to = broker.coordinator_id(group) if node is None else node
    with socket.create_connection(("127.0.0.1", broker.broker(to).port), timeout=15) as sock:
        sock.sendall(proto.send_bytes())
        while True:
            data = sock.recv(65536)
            assert data, "broker closed the connection"
            responses = proto.receive_bytes(data)
            if responses:
                return responses[0][1]


def test_share_group_listed_and_described(broker: Served) -> None:
    _topic(broker, "listed", 2, 1, "g-listed")
    c = _consumer(broker, "g-listed", "listed")
    try:
        assert len(_poll_until(c, 1)) == 1
        listed = _call(broker, "g-listed", ApiKey.LIST_GROUPS, 5, states_filter=[], types_filter=["share"])
        assert ("g-listed", "share", "Stable") in [(g.group_id, g.group_type, g.group_state) for g in listed.groups]
        consumers = _call(broker, "g-listed", ApiKey.LIST_GROUPS, 5, states_filter=[], types_filter=["consumer"])
        assert "g-listed" not in [g.group_id for g in consumers.groups]
        d = _call(broker, "g-listed", ApiKey.SHARE_GROUP_DESCRIBE, 1, group_ids=["g-listed", "nope"], include_authorized_operations=False)
        found, missing = d.groups
        assert (found.error_code, found.group_state, len(found.members)) == (0, "Stable", 1)
        member = found.members[0]
        assert member.subscribed_topic_names == ["listed"]
        assert [(t.topic_name, sorted(t.partitions)) for t in member.assignment.topic_partitions] == [("listed", [0, 1])]
        here = broker.coordinator_id("nope") == broker.coordinator_id("g-listed")
        assert missing.error_code == (ErrorCode.GROUP_ID_NOT_FOUND if here else ErrorCode.NOT_COORDINATOR)
    finally:
        c.close()


def test_a_consumer_groups_id_is_refused_to_share_members(broker: Served) -> None:
    _topic(broker, "ns", 1, 1, "g-ns")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-ns", "auto.offset.reset": "earliest"})
    consumer.subscribe(["ns"])
    try:
        deadline = time.monotonic() + 30
        msg = None
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
        assert msg is not None and msg.error() is None
        consumer.commit(msg, asynchronous=False)
        share = _consumer(broker, "g-ns", "ns")
        try:
            with pytest.raises(KafkaException) as refused:
                for _ in range(20):
                    share.poll(0.5)
            assert refused.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND  # fatal for the share consumer
        finally:
            share.close()
    finally:
        consumer.close()


def _consumer_error(broker: Served, group: str, topic: str, protocol: str) -> KafkaError:
    """The first error a consumer of `group.protocol` gets joining `group`."""
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "group.protocol": protocol,
                  "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                msg = c.poll(0.5)
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                return err
            assert msg is None or msg.error() is not None, "a consumer got a record of a share group's id"
            if msg is not None:
                return msg.error()
        raise AssertionError("the consumer was not refused")
    finally:
        c.close()


def test_a_share_groups_id_is_refused_to_consumers(broker: Served) -> None:
    _topic(broker, "sq", 1, 1, "g-sq")
    share = _consumer(broker, "g-sq", "sq")
    try:
        assert len(_poll_until(share, 1)) == 1  # g-sq is a share group now
        # Kafka's GroupMetadataManager: a classic JoinGroup to a share group's id is
        # INCONSISTENT_GROUP_PROTOCOL, a KIP-848 ConsumerGroupHeartbeat "is not a consumer group"
        joined = _call(broker, "g-sq", ApiKey.JOIN_GROUP, 5, group_id="g-sq", session_timeout_ms=30_000,
                       rebalance_timeout_ms=30_000, member_id="", group_instance_id=None, protocol_type="consumer",
                       protocols=[{"name": "range", "metadata": b""}])
        assert (joined.error_code, joined.member_id) == (ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "")
        hb = _call(broker, "g-sq", ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, group_id="g-sq", member_id="m-consumer",
                   member_epoch=0, instance_id=None, rack_id=None, rebalance_timeout_ms=30_000,
                   subscribed_topic_names=["sq"], server_assignor=None, topic_partitions=[])
        assert (hb.error_code, hb.error_message) == (ErrorCode.GROUP_ID_NOT_FOUND, "Group g-sq is not a consumer group.")
        # nor do the consumer groups' offset APIs touch it (Kafka's ShareGroup.validateOffset*)
        committed = _call(broker, "g-sq", ApiKey.OFFSET_COMMIT, 8, group_id="g-sq", generation_id_or_member_epoch=-1,
                          member_id="", group_instance_id=None,
                          topics=[{"name": "sq", "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                                 "committed_leader_epoch": -1, "committed_metadata": None}]}])
        assert [p.error_code for t in committed.topics for p in t.partitions] == [ErrorCode.GROUP_ID_NOT_FOUND]
        fetched = _call(broker, "g-sq", ApiKey.OFFSET_FETCH, 8, groups=[{"group_id": "g-sq", "topics": None}],
                        require_stable=False)
        assert [g.error_code for g in fetched.groups] == [ErrorCode.GROUP_ID_NOT_FOUND]
        deleted = _call(broker, "g-sq", ApiKey.OFFSET_DELETE, 0, group_id="g-sq",
                        topics=[{"name": "sq", "partitions": [{"partition_index": 0}]}])
        assert deleted.error_code == ErrorCode.GROUP_ID_NOT_FOUND
        # real consumers of either protocol are refused, and the share group keeps its records
        assert _consumer_error(broker, "g-sq", "sq", "classic").code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL
        fatal = _consumer_error(broker, "g-sq", "sq", "consumer")  # librdkafka: a fatal GROUP_ID_NOT_FOUND
        assert fatal.code() == KafkaError._FATAL and "ConsumerGroupHeartbeat fatal error: Broker: The group id does not exist" in fatal.str()
        p = Producer({"bootstrap.servers": broker.bootstrap})
        p.produce("sq", value=b"v1")
        assert p.flush(15) == 0
        assert [m.value() for m in _poll_until(share, 1)] == [b"v1"]
    finally:
        share.close()


def test_share_group_offsets_described_altered_and_deleted(broker: Served) -> None:
    _topic(broker, "adm", 1, 5, "g-adm")
    c = _consumer(broker, "g-adm", "adm", explicit=True)
    try:
        got = _poll_until(c, 5)
        assert [m.offset() for m in got] == [0, 1, 2, 3, 4]
        for m in got[:3]:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        for m in got[3:]:
            c.acknowledge(m, AcknowledgeType.RELEASE)
        assert all(err is None for err in c.commit_sync(15).values())
        busy = _call(broker, "g-adm", ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, group_id="g-adm",
                     topics=[{"topic_name": "adm", "partitions": [{"partition_index": 0, "start_offset": 1}]}])
        assert busy.responses[0].partitions[0].error_code == ErrorCode.NON_EMPTY_GROUP
    finally:
        c.close()

    def start_offset() -> int:
        d = _call(broker, "g-adm", ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, groups=[{"group_id": "g-adm", "topics": None}])
        (group,) = d.groups
        assert group.error_code == 0
        return [(t.topic_name, p.partition_index, p.start_offset) for t in group.topics for p in t.partitions]

    assert start_offset() == [("adm", 0, 3)]
    deadline = time.monotonic() + 60  # the member leaves with its last heartbeat: wait for the group to be empty
    while True:
        altered = _call(broker, "g-adm", ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, group_id="g-adm",
                        topics=[{"topic_name": "adm", "partitions": [{"partition_index": 0, "start_offset": 1}]}])
        code = altered.responses[0].partitions[0].error_code
        if code != ErrorCode.NON_EMPTY_GROUP or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert code == 0
    assert start_offset() == [("adm", 0, 1)]
    c = _consumer(broker, "g-adm", "adm")
    try:
        assert [m.offset() for m in _poll_until(c, 4)] == [1, 2, 3, 4]  # from the altered start, counts forgotten
    finally:
        c.close()
    deadline = time.monotonic() + 60
    while True:
        deleted = _call(broker, "g-adm", ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, group_id="g-adm", topics=[{"topic_name": "adm"}])
        if deleted.error_code != ErrorCode.NON_EMPTY_GROUP or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert deleted.error_code == 0 and [p.partition_index for p in deleted.responses[0].partitions] == [0]
    assert start_offset() == [("adm", 0, -1)]
    c = _consumer(broker, "g-adm", "adm")
    try:
        assert [m.offset() for m in _poll_until(c, 5)] == [0, 1, 2, 3, 4]  # afresh from share.auto.offset.reset
    finally:
        c.close()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    deadline = time.monotonic() + 60
    while True:  # DeleteGroups: an empty share group goes with its share-partition states
        err = admin.delete_consumer_groups(["g-adm"])["g-adm"].exception(timeout=15)
        if err is None or err.args[0].code() != KafkaError.NON_EMPTY_GROUP or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert err is None, err
    d = _call(broker, "g-adm", ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, groups=[{"group_id": "g-adm", "topics": None}])
    assert d.groups[0].error_code == ErrorCode.GROUP_ID_NOT_FOUND


@pytest.mark.parametrize("broker", ["single"], indirect=True)  # cluster mode refuses transactions
def test_read_committed_share_group_skips_aborted_transactions(broker: Served) -> None:
    assert not broker.refuses(Feature.TRANSACTIONS)
    _topic(broker, "txq", 1, 0, "g-txq")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource(ResourceType.GROUP, "g-txq", incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("share.isolation.level", "read_committed", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "share-tx"})
    p.init_transactions(30)
    p.begin_transaction()
    for v in (b"a1", b"a2", b"a3"):  # offsets 0-2, the abort marker 3
        p.produce("txq", value=v, partition=0)
    assert p.flush(15) == 0  # written, then aborted (abort_transaction drops what was not sent yet)
    p.abort_transaction(30)
    p.begin_transaction()
    for v in (b"c1", b"c2"):  # offsets 4-5, the commit marker 6
        p.produce("txq", value=v, partition=0)
    p.commit_transaction(30)
    c = _consumer(broker, "g-txq", "txq")
    try:
        got = _poll_until(c, 2)
        assert [(m.offset(), m.value()) for m in got] == [(4, b"c1"), (5, b"c2")]
        assert c.commit_sync(15)  # implicit mode: what the last poll returned is accepted
    finally:
        c.close()
    d = _call(broker, "g-txq", ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, groups=[{"group_id": "g-txq", "topics": None}])
    # the aborted records were archived, not acquired (the client would drop them unacknowledged):
    # nothing is left in flight below the end of the log
    assert [p.start_offset for t in d.groups[0].topics for p in t.partitions] == [7]


def test_a_share_consumer_is_held_to_its_consumer_byte_rate_quota(broker: Served) -> None:
    """consumer_byte_rate holds ShareFetch as it holds Fetch: each response is capped at what one
    quota window pays back and the connection is throttled past the rate, so a capped share
    consumer gets a fraction of a backlog in the time another client id takes all of it."""
    topic, record = "share-quota", b"q" * 1000
    _topic(broker, topic, 1, 0, "share-quota-free")
    capped_group = ConfigResource(ResourceType.GROUP, "share-quota-capped", incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.incremental_alter_configs([capped_group])[capped_group].result(15)
    # one record a batch: a batch goes out whole, however small the response's allowance
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for _ in range(300):
        p.produce(topic, value=record, partition=0)
    assert p.flush(15) == 0
    quota = {"entity": [{"entity_type": "client-id", "entity_name": "capped-share"}],
             "ops": [{"key": "consumer_byte_rate", "value": 4000.0, "remove": False}]}
    # altered through a broker that does not lead the partition: a quota is every broker's
    leader = broker.leaders(topic, 1)[0]
    other = next((n for n in broker.node_ids if n != leader), leader)
    sent = _call(broker, "share-quota-capped", 49, 1, node=other, entries=[quota], validate_only=False)
    assert [e.error_code for e in sent.entries] == [0]
    free = _consumer(broker, "share-quota-free", topic, **{"client.id": "free-share"})
    capped = _consumer(broker, "share-quota-capped", topic, **{"client.id": "capped-share"})
    try:
        assert len(_poll_until(free, 300, timeout_s=60)) == 300
        got: list[Message] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            got += _poll(capped, 0.5)
        # 5 s at 4 kB/s, plus the window's allowance the first responses may take (11 windows of
        # a second): well under the 300 kB backlog, and something arrives
        assert 0 < len(got) * len(record) <= 100_000, len(got)
    finally:
        free.close()
        capped.close()
