"""KIP-848 consumer groups (group.protocol=consumer) through real confluent-kafka clients and a real broker.

Members join and leave a group sharing a 6-partition topic and every record is consumed once
with committed offsets; a broker restart in the middle keeps the group; classic and
consumer-protocol groups read the same topic at once; a regex subscription picks up a topic
created later; AdminClient describes and lists consumer groups.

The consumers commit each record synchronously before polling again (rebalance callbacks run
inside poll, so a record is committed before its partition can move): with that discipline
every record must be seen exactly once across the members.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupType, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import loglake

from brokerkit import InProcessBroker, free_port, start_on_port

PARTITIONS = 6
ENV = {
    "LOGLAKE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "300",
    "LOGLAKE_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS": "100",
    "LOGLAKE_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "10000",
    "LOGLAKE_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS": "1000",
    "LOGLAKE_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    "LOGLAKE_GROUP_MIN_SESSION_TIMEOUT_MS": "1000",
}
WAIT_S = 60  # upper bound on waits for progress; no assertion depends on timing


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    data = tmp_path / "data"
    with loglake.open(str(data)) as log:
        for name in ("k", "rx-a"):
            log.create_topic(name, PARTITIONS)
    port = free_port()
    b = InProcessBroker(data, ["--listen", f"127.0.0.1:{port}"], env=ENV)
    start_on_port(b, port)
    yield b
    if b.running:
        b.stop()
    assert "Traceback" not in b.log_text()


def produce(bootstrap: str, topic: str, start: int, count: int, partitions: int = PARTITIONS) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(start, start + count):
        p.produce(topic, value=b"%d" % i, partition=i % partitions)
    assert p.flush(30) == 0


def new_consumer(bootstrap: str, group: str, **extra: object) -> Consumer:
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "reconnect.backoff.max.ms": 500,
    }
    conf.update(extra)
    return Consumer(conf)


def classic_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})


class Reader:
    """Polls several consumers in turn, commits every record synchronously, records what it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.commit_errors: list[str] = []

    def poll_until(self, consumers: list[Consumer], want: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while len(self.seen) < want and time.monotonic() < deadline:
            for c in consumers:
                self.poll_one(c)

    def poll_one(self, c: Consumer) -> None:
        m = c.poll(0.05)
        if m is None or m.error():
            return
        self.seen.append((m.topic(), int(m.value())))
        try:
            c.commit(m, asynchronous=False)
        except Exception as exc:
            self.commit_errors.append(str(exc))

    def keep_polling(self, consumers: list[Consumer], seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for c in consumers:
                self.poll_one(c)


def committed(bootstrap: str, group: str, topic: str) -> list[int]:
    c = new_consumer(bootstrap, group)
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=15)
    finally:
        c.close()
    return [tp.offset for tp in got]


def describe(bootstrap: str, group: str) -> object:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(timeout=15)


def test_members_join_and_leave_every_record_once(broker: InProcessBroker) -> None:
    boot = broker.bootstrap
    produce(boot, "k", 0, 60)
    r = Reader()
    c1, c2 = new_consumer(boot, "eo"), new_consumer(boot, "eo")
    for c in (c1, c2):
        c.subscribe(["k"])
    r.poll_until([c1, c2], 60)
    c3 = new_consumer(boot, "eo")
    c3.subscribe(["k"])
    produce(boot, "k", 60, 60)
    r.poll_until([c1, c2, c3], 120)
    # All three members share the partitions (keep polling: revocations happen inside poll).
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and sorted(len(c.assignment()) for c in (c1, c2, c3)) != [2, 2, 2]:
        r.keep_polling([c1, c2, c3], 0.2)
    assert sorted(len(c.assignment()) for c in (c1, c2, c3)) == [2, 2, 2]
    c1.close()  # leaves the group: the others take its partitions over
    produce(boot, "k", 120, 60)
    r.poll_until([c2, c3], 180)
    for c in (c2, c3):
        c.close()
    assert r.commit_errors == []
    assert sorted(v for _, v in r.seen) == list(range(180))  # none missed, none twice
    assert committed(boot, "eo", "k") == [30] * PARTITIONS


def test_broker_restart_keeps_the_group(broker: InProcessBroker) -> None:
    boot = broker.bootstrap
    produce(boot, "k", 0, 60)
    r = Reader()
    consumers = [new_consumer(boot, "rs"), new_consumer(boot, "rs")]
    for c in consumers:
        c.subscribe(["k"])
    r.poll_until(consumers, 60)
    while sorted(len(c.assignment()) for c in consumers) != [3, 3]:
        r.keep_polling(consumers, 0.2)
    before = describe(boot, "rs")
    broker.stop()
    start_on_port(broker, broker.port)
    produce(boot, "k", 60, 60)
    r.poll_until(consumers, 120)
    after = describe(boot, "rs")
    for c in consumers:
        c.close()
    assert sorted(v for _, v in r.seen) == list(range(120))
    assert committed(boot, "rs", "k") == [20] * PARTITIONS
    # The same members carried on: the group came back from the metadata log, not rebuilt.
    assert {m.member_id for m in after.members} == {m.member_id for m in before.members}  # type: ignore[attr-defined]


def test_classic_and_consumer_groups_share_a_topic(broker: InProcessBroker) -> None:
    boot = broker.bootstrap
    produce(boot, "k", 0, 60)
    r_new, r_old = Reader(), Reader()
    new = new_consumer(boot, "new-proto")
    old = classic_consumer(boot, "old-proto")
    new.subscribe(["k"])
    old.subscribe(["k"])
    deadline = time.monotonic() + WAIT_S
    while (len(r_new.seen) < 60 or len(r_old.seen) < 60) and time.monotonic() < deadline:
        r_new.poll_one(new)
        r_old.poll_one(old)
    admin = AdminClient({"bootstrap.servers": boot})
    listed = admin.list_consumer_groups().result(timeout=15)
    types = {g.group_id: g.type for g in listed.valid}
    only_new = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(timeout=15)
    new.close()
    old.close()
    assert sorted(v for _, v in r_new.seen) == list(range(60))
    assert sorted(v for _, v in r_old.seen) == list(range(60))
    assert types["new-proto"] == ConsumerGroupType.CONSUMER and types["old-proto"] == ConsumerGroupType.CLASSIC
    assert [g.group_id for g in only_new.valid] == ["new-proto"]


def test_regex_subscription_takes_topics_created_later(broker: InProcessBroker) -> None:
    boot = broker.bootstrap
    produce(boot, "rx-a", 0, 30)
    produce(boot, "k", 0, 30)  # does not match
    r = Reader()
    c = new_consumer(boot, "rx", **{"topic.metadata.refresh.interval.ms": 1000})
    c.subscribe(["^rx-.*"])
    r.poll_until([c], 30)
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic("rx-b", 2)])["rx-b"].result(timeout=15)
    produce(boot, "rx-b", 100, 10, partitions=2)
    r.poll_until([c], 40)
    c.close()
    assert {t for t, _ in r.seen} == {"rx-a", "rx-b"}
    assert sorted(v for t, v in r.seen if t == "rx-b") == list(range(100, 110))
    assert len(r.seen) == 40


def test_describe_shows_members_and_assignments(broker: InProcessBroker) -> None:
    boot = broker.bootstrap
    produce(boot, "k", 0, 12)
    r = Reader()
    consumers = [new_consumer(boot, "desc", **{"client.id": f"cli-{i}"}) for i in range(2)]
    for c in consumers:
        c.subscribe(["k"])
    r.poll_until(consumers, 12)
    while sorted(len(c.assignment()) for c in consumers) != [3, 3]:
        r.keep_polling(consumers, 0.2)
    d = describe(boot, "desc")
    for c in consumers:
        c.close()
    assert d.type == ConsumerGroupType.CONSUMER  # type: ignore[attr-defined]
    assert {m.client_id for m in d.members} == {"cli-0", "cli-1"}  # type: ignore[attr-defined]
    parts = sorted(tp.partition for m in d.members for tp in m.assignment.topic_partitions)  # type: ignore[attr-defined]
    assert parts == list(range(PARTITIONS))


def test_static_member_comes_back_without_a_rebalance(broker: InProcessBroker) -> None:
    boot = broker.bootstrap
    produce(boot, "k", 0, 12)
    r = Reader()
    a = new_consumer(boot, "st", **{"group.instance.id": "inst-a"})
    b = new_consumer(boot, "st", **{"group.instance.id": "inst-b"})
    for c in (a, b):
        c.subscribe(["k"])
    r.poll_until([a, b], 12)
    while sorted(len(c.assignment()) for c in (a, b)) != [3, 3]:
        r.keep_polling([a, b], 0.2)
    mine = {tp.partition for tp in a.assignment()}
    theirs = {tp.partition for tp in b.assignment()}
    a.close()  # a static member leaves with epoch -2: its partitions stay reserved for it
    largest = 0
    for _ in range(10):  # several heartbeat intervals of b while a is away
        r.keep_polling([b], 0.2)
        largest = max(largest, len(b.assignment()))
    a2 = new_consumer(boot, "st", **{"group.instance.id": "inst-a"})
    a2.subscribe(["k"])
    deadline = time.monotonic() + WAIT_S
    while not a2.assignment() and time.monotonic() < deadline:
        r.keep_polling([a2, b], 0.2)
    back = {tp.partition for tp in a2.assignment()}
    still = {tp.partition for tp in b.assignment()}
    d = describe(boot, "st")
    for c in (a2, b):
        c.close()
    assert largest == 3 and still == theirs  # b was never given a's partitions
    assert back == mine
    assert sorted(m.group_instance_id for m in d.members) == ["inst-a", "inst-b"]  # type: ignore[attr-defined]


def test_empty_classic_group_is_taken_over_by_the_consumer_protocol(broker: InProcessBroker) -> None:
    boot = broker.bootstrap
    produce(boot, "k", 0, 30)
    r = Reader()
    old = classic_consumer(boot, "mig")
    old.subscribe(["k"])
    r.poll_until([old], 30)
    old.close()  # the classic group is Empty now, with its committed offsets
    produce(boot, "k", 30, 30)
    new = new_consumer(boot, "mig")
    new.subscribe(["k"])
    r.poll_until([new], 60)
    d = describe(boot, "mig")
    new.close()
    assert sorted(v for _, v in r.seen) == list(range(60))  # resumed from the classic group's offsets
    assert d.type == ConsumerGroupType.CONSUMER  # type: ignore[attr-defined]
    assert committed(boot, "mig", "k") == [10] * PARTITIONS


CHILD = """
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": "crash", "group.protocol": "consumer",
              "auto.offset.reset": "earliest", "enable.auto.commit": False})
c.subscribe(["k"])
said = False
while True:
    m = c.poll(0.1)
    if m is not None and not m.error():
        c.commit(m, asynchronous=False)
    if c.assignment() and not said:
        print("assigned", flush=True)
        said = True
"""


def test_a_member_that_dies_is_fenced_after_its_session(broker: InProcessBroker) -> None:
    boot = broker.bootstrap
    produce(boot, "k", 0, 60)
    child = subprocess.Popen([sys.executable, "-c", CHILD, boot], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "assigned"
        r = Reader()
        survivor = new_consumer(boot, "crash")
        survivor.subscribe(["k"])
        deadline = time.monotonic() + WAIT_S
        while len(survivor.assignment()) != 3 and time.monotonic() < deadline:
            r.keep_polling([survivor], 0.2)  # the partitions split between the two members
        assert len(survivor.assignment()) == 3
    finally:
        child.kill()  # no leave: only the session timeout can free its partitions
        child.wait()
    produce(boot, "k", 60, 60)

    def done() -> bool:
        if len(survivor.assignment()) != PARTITIONS:
            return False
        return [tp.offset for tp in survivor.position(survivor.assignment())] == [20] * PARTITIONS

    deadline = time.monotonic() + WAIT_S
    while not done() and time.monotonic() < deadline:
        r.keep_polling([survivor], 0.2)  # the dead member's partitions come once its session expires
    survivor.close()
    assert r.commit_errors == []
    assert committed(boot, "crash", "k") == [20] * PARTITIONS  # every partition read to its end


def test_group_config_overrides_reach_the_heartbeat(broker: InProcessBroker) -> None:
    """Kafka 4.0's GROUP config resource: `consumer.heartbeat.interval.ms` set on one group is the
    interval its members are told; another group keeps the broker's setting (300 ms in ENV)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from loglake.broker.protocol.kip848 import ConsumerGroupHeartbeatRequest
    from test_broker_malformed import RawClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("cfg-t", 2)])["cfg-t"].result(10)
    resource = ConfigResource(
        ResourceType.GROUP, "tuned", incremental_configs=[ConfigEntry("consumer.heartbeat.interval.ms", "7000", incremental_operation=AlterConfigOpType.SET)]
    )
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(10)

    def join(group: str) -> object:
        with RawClient(broker.bootstrap) as client:
            return client.request(
                ConsumerGroupHeartbeatRequest[0](group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=["cfg-t"], topic_partitions=[])
            )

    tuned, plain = join("tuned"), join("plain")
    assert tuned.error_code == 0 and tuned.heartbeat_interval_ms == 7000  # type: ignore[attr-defined]
    assert plain.error_code == 0 and plain.heartbeat_interval_ms == int(ENV["LOGLAKE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS"])  # type: ignore[attr-defined]


def test_assigned_consumer_commits_standalone(broker: InProcessBroker) -> None:
    """A consumer-protocol consumer that assign()s sends OffsetCommit with its own member id and
    epoch -1; Kafka 4.0 takes that as a simple commit into an empty or missing group, and a topic
    that does not exist is answered UNKNOWN_TOPIC_OR_PARTITION, not UNKNOWN_MEMBER_ID."""
    boot = broker.bootstrap
    produce(boot, "k", 0, 12)
    c = new_consumer(boot, "standalone")
    c.assign([TopicPartition("k", p, 0) for p in range(PARTITIONS)])
    got = 0
    deadline = time.monotonic() + WAIT_S
    while got < 12 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got += 1
    assert got == 12
    done = c.commit(asynchronous=False)
    assert done is not None and all(tp.error is None for tp in done)
    with pytest.raises(KafkaException) as refused:
        c.commit(offsets=[TopicPartition("no-such-topic", 0, 5)], asynchronous=False)
    c.close()
    assert refused.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert committed(boot, "standalone", "k") == [2] * PARTITIONS


def test_literal_topics_are_assigned_before_regex_matches(broker: InProcessBroker) -> None:
    """Kafka resolves a new subscription regex asynchronously: the literal topics come in the first
    assignment, the regex's matches in a later one."""
    boot = broker.bootstrap
    admin = AdminClient({"bootstrap.servers": boot})
    for fut in admin.create_topics([NewTopic("re-a", 2), NewTopic("literal", 2)]).values():
        fut.result(timeout=15)
    produce(boot, "re-a", 0, 4, partitions=2)
    produce(boot, "literal", 100, 4, partitions=2)
    assigned: list[set[str]] = []
    c = new_consumer(boot, "lit-then-rx")
    c.subscribe(["^re-.*", "literal"], on_assign=lambda _c, parts: assigned.append({tp.topic for tp in parts}))
    r = Reader()
    r.poll_until([c], 8)
    c.close()
    assert {t for t, _ in r.seen} == {"re-a", "literal"}
    got = [topics for topics in assigned if topics]
    assert got[0] == {"literal"}, assigned
    assert "re-a" in set().union(*got[1:]), assigned
