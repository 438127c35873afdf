"""The `loglake` CLI against a running broker (`--bootstrap-server`), as real processes.

One broker (`loglake serve`) for the module; every command runs as `python -m loglake.cli.main`,
and the checks cross-examine the broker with confluent-kafka clients and its /metrics.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from loglake.cli.remote import REMOTE_TIMEOUT_S

from brokerkit import Broker, free_port, serving_broker

#: Longest a test waits for a line from a following consumer or a group to settle.
WAIT_S = 60.0
#: Records' CreateTime in the --to-datetime test: 2025-01-01T00:00:00Z plus i seconds.
BASE_TS_MS = 1_735_689_600_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = Path(tmp_path_factory.mktemp("cliremote"))
    metrics_port = free_port()
    with serving_broker(root / "data", ["--metrics-listen", f"127.0.0.1:{metrics_port}"]) as b:
        b.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"  # type: ignore[attr-defined]
        yield b


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOGLAKE_BOOTSTRAP_SERVER", "LOGLAKE_DATA_DIR")}
    return {**env, **(extra or {})}


def cli(
    args: Sequence[str], *, input: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loglake.cli.main", *args],
        input=input.decode() if input is not None else None,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(env),
        cwd=os.path.dirname(__file__),
    )


def ok(args: Sequence[str], broker: Broker, **kw: Any) -> subprocess.CompletedProcess[str]:
    result = cli([*args, "--bootstrap-server", broker.bootstrap], **kw)
    assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
    return result


def fails(args: Sequence[str], code: int = 1, **kw: Any) -> str:
    """Run a command that must fail: exit `code`, exactly one line on stderr; returns that line."""
    result = cli(args, **kw)
    assert result.returncode == code, (args, result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, (args, result.stderr)
    assert lines[0].startswith("error: "), lines
    return lines[0]


def new_topic(broker: Broker, partitions: int = 1) -> str:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)
    return topic


def produce(broker: Broker, topic: str, per_partition: dict[int, int], *, timestamps: bool = False) -> None:
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for partition, n in per_partition.items():
        for i in range(n):
            extra = {"timestamp": BASE_TS_MS + i * 1000} if timestamps else {}
            p.produce(topic, f"{partition}-{i}".encode(), partition=partition, **extra)
    assert p.flush(30) == 0


def group_consumer(broker: Broker, group: str, **extra: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **extra,
        }
    )


class Deadline:
    """A bounded wait: `check()` fails the test once WAIT_S have passed (it asserts nothing about speed)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.end = time.monotonic() + WAIT_S

    def check(self) -> None:
        assert time.monotonic() < self.end, f"gave up waiting for {self.what} after {WAIT_S}s"


def wait_inactive(broker: Broker, group: str) -> None:
    """After a member closed: wait until the broker reports the group without members."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    deadline = Deadline(f"group {group} to become empty")
    while admin.describe_consumer_groups([group])[group].result(30).members:
        deadline.check()
        time.sleep(0.1)


def consume_part(broker: Broker, topic: str, group: str, count: int) -> dict[int, int]:
    """A group member reads `count` records and commits them; returns partition -> committed offset."""
    c = group_consumer(broker, group)
    c.subscribe([topic])
    committed: dict[int, int] = {}
    got = 0
    deadline = Deadline(f"{count} records of {topic}")
    try:
        while got < count:
            deadline.check()
            msg = c.poll(1.0)
            if msg is None or msg.error():
                continue
            committed[msg.partition()] = msg.offset() + 1
            got += 1
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in committed.items()], asynchronous=False)
    finally:
        c.close()
    wait_inactive(broker, group)
    return committed


def first_offset_in_group(broker: Broker, topic: str, group: str, partition: int) -> int:
    """Where a confluent-kafka consumer in `group` resumes on `partition`."""
    c = group_consumer(broker, group)
    c.subscribe([topic])
    deadline = Deadline(f"a record of {topic}:{partition}")
    try:
        while True:
            deadline.check()
            msg = c.poll(1.0)
            if msg is not None and not msg.error() and msg.partition() == partition:
                return int(msg.offset())
    finally:
        c.close()
        wait_inactive(broker, group)


def describe_group(broker: Broker, group: str) -> dict[str, Any]:
    return json.loads(ok(["groups", "describe", "--group", group, "--json"], broker).stdout)  # type: ignore[no-any-return]


def committed_of(doc: dict[str, Any], topic: str) -> dict[int, int | None]:
    return {p["partition"]: p["committed_offset"] for p in doc["partitions"] if p["topic"] == topic}


# ---- topics ---------------------------------------------------------------------------------------


def test_topics_lifecycle(broker: Broker) -> None:
    name = f"life-{uuid.uuid4().hex[:8]}"
    out = ok(["topics", "create", name, "--partitions", "2", "--config", "retention.ms=60000"], broker).stdout
    assert f"created topic {name} (2 partitions) with retention.ms=60000" in out
    assert name in ok(["topics", "list"], broker).stdout.split()
    doc = json.loads(ok(["topics", "describe", name, "--json"], broker).stdout)
    assert [p["partition"] for p in doc["partitions"]] == [0, 1]
    assert doc["overrides"] == {"retention.ms": "60000"}
    assert "retention.ms" in ok(["topics", "describe", name], broker).stdout

    ok(["topics", "alter", name, "--config", "retention.bytes=1048576", "--delete-config", "retention.ms"], broker)
    doc = json.loads(ok(["topics", "describe", name, "--json"], broker).stdout)
    assert doc["overrides"] == {"retention.bytes": "1048576"}

    assert "2 -> 3 partitions" in ok(["topics", "add-partitions", name, "--partitions", "3"], broker).stdout
    doc = json.loads(ok(["topics", "describe", name, "--json"], broker).stdout)
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2]

    ok(["topics", "delete", name], broker)
    assert name not in ok(["topics", "list"], broker).stdout.split()


def test_bootstrap_server_from_the_environment(broker: Broker) -> None:
    topic = new_topic(broker)
    result = cli(["topics", "list"], env={"LOGLAKE_BOOTSTRAP_SERVER": broker.bootstrap})
    assert result.returncode == 0, result.stderr
    assert topic in result.stdout.split()


# ---- produce / consume ----------------------------------------------------------------------------


def test_produce_then_consume(broker: Broker, tmp_path: Path) -> None:
    topic = new_topic(broker, partitions=2)
    lines = "".join(f"k{i}:v{i}\n" for i in range(20)).encode()
    result = ok(["produce", topic, "--key-separator", ":", "--header", "src=test"], broker, input=lines)
    assert "produced 20 records" in result.stderr
    records = [json.loads(line) for line in ok(["consume", topic, "--format", "json"], broker).stdout.splitlines()]
    assert sorted(r["value"] for r in records) == sorted(f"v{i}" for i in range(20))
    assert all(r["key"] == "k" + r["value"][1:] and r["headers"] == [["src", "test"]] for r in records)
    # The same key goes to the same partition (murmur2, like the Java client and the data-dir produce).
    by_key = {r["key"]: r["partition"] for r in records}
    again = ok(["produce", topic, "-k", ":"], broker, input=b"k3:again\n")
    assert again.returncode == 0
    one = [json.loads(x) for x in ok(["consume", topic, "--format", "json"], broker).stdout.splitlines()]
    assert next(r for r in one if r["value"] == "again")["partition"] == by_key["k3"]

    path = tmp_path / "lines.txt"
    path.write_text("f1\nf2\n")
    ok(["produce", topic, "--file", str(path), "--partition", "1"], broker)
    assert ok(["consume", topic, "--partition", "1"], broker).stdout.splitlines()[-2:] == ["f1", "f2"]

    p0 = ok(["consume", topic, "--partition", "0", "--format", "json"], broker).stdout.splitlines()
    assert {json.loads(x)["partition"] for x in p0} == {0}
    tail = ok(["consume", topic, "--partition", "0", "--from", "2", "-n", "1", "--format", "json"], broker).stdout
    assert json.loads(tail)["offset"] == 2
    assert ok(["consume", topic, "--from", "1000"], broker).stdout == ""  # clamped to the end, as on a data dir
    assert ok(["consume", topic, "--from", "latest"], broker).stdout == ""


def test_produce_creates_a_missing_topic(broker: Broker) -> None:
    topic = f"auto-{uuid.uuid4().hex[:8]}"
    result = ok(["produce", topic], broker, input=b"a\nb\n")
    assert f"created topic {topic}" in result.stderr
    assert ok(["consume", topic], broker).stdout.splitlines() == ["a", "b"]


def _lines(stream: Any) -> queue.Queue[str]:
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return q


def test_consume_follow_sees_a_record_produced_after_it_started(broker: Broker) -> None:
    topic = new_topic(broker)
    ok(["produce", topic], broker, input=b"before\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "loglake.cli.main", "consume", topic, "--follow",
         "--bootstrap-server", broker.bootstrap],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        lines = _lines(proc.stdout)
        assert lines.get(timeout=WAIT_S) == "before\n"  # it is reading: what comes now is new
        ok(["produce", topic], broker, input=b"after\n")
        assert lines.get(timeout=WAIT_S) == "after\n"
    finally:
        proc.terminate()
        assert proc.wait(timeout=WAIT_S) == 0
        assert proc.stderr is not None
        assert proc.stderr.read() == ""


def test_follow_in_a_group_commits_when_stopped(broker: Broker) -> None:
    topic = new_topic(broker)
    group = f"fg-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loglake.cli.main", "consume", topic, "--follow", "--group", group,
         "--bootstrap-server", broker.bootstrap],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        lines = _lines(proc.stdout)
        ok(["produce", topic], broker, input=b"one\ntwo\n")
        assert [lines.get(timeout=WAIT_S), lines.get(timeout=WAIT_S)] == ["one\n", "two\n"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=WAIT_S) == 0
    wait_inactive(broker, group)
    doc = describe_group(broker, group)
    assert committed_of(doc, topic) == {0: 2} and doc["partitions"][0]["lag"] == 0


def test_consume_in_a_group_commits_what_it_printed(broker: Broker) -> None:
    topic = new_topic(broker)
    ok(["produce", topic], broker, input=b"".join(b"r%d\n" % i for i in range(5)))
    group = f"cg-{uuid.uuid4().hex[:8]}"
    assert ok(["consume", topic, "--group", group, "-n", "3"], broker).stdout.splitlines() == ["r0", "r1", "r2"]
    assert committed_of(describe_group(broker, group), topic) == {0: 3}
    assert ok(["consume", topic, "--group", group], broker).stdout.splitlines() == ["r3", "r4"]
    doc = describe_group(broker, group)
    assert committed_of(doc, topic) == {0: 5}
    assert doc["partitions"][0]["lag"] == 0


# ---- groups ---------------------------------------------------------------------------------------


def _metrics_lag(broker: Broker, group: str, topic: str) -> dict[int, int]:
    text = urllib.request.urlopen(broker.metrics_url, timeout=30).read().decode()  # type: ignore[attr-defined]
    out: dict[int, int] = {}
    for line in text.splitlines():
        if line.startswith("loglake_consumer_group_lag{") and f'group="{group}"' in line and f'topic="{topic}"' in line:
            labels, value = line.rsplit(" ", 1)
            partition = int(labels.split('partition="', 1)[1].split('"', 1)[0])
            out[partition] = int(float(value))
    return out


def test_groups_describe_lag_matches_reality(broker: Broker) -> None:
    topic = new_topic(broker, partitions=2)
    produce(broker, topic, {0: 6, 1: 4})
    group = f"lag-{uuid.uuid4().hex[:8]}"
    committed = consume_part(broker, topic, group, 7)
    assert group in ok(["groups", "list"], broker).stdout.split()
    assert f"{group} EMPTY" in ok(["groups", "list", "--state"], broker).stdout.splitlines()
    doc = describe_group(broker, group)
    assert doc["state"] == "EMPTY" and doc["members"] == []
    ends = {0: 6, 1: 4}
    rows = {p["partition"]: p for p in doc["partitions"] if p["topic"] == topic}
    assert set(rows) == {0, 1}  # every partition of the topic, committed in or not
    for partition, row in rows.items():
        assert row["committed_offset"] == committed.get(partition)
        assert row["log_end_offset"] == ends[partition]
        assert row["lag"] == (ends[partition] - committed[partition] if partition in committed else None)
    assert doc["total_lag"] == 10 - sum(committed.values())
    assert _metrics_lag(broker, group, topic) == {p: r["lag"] for p, r in rows.items() if r["lag"] is not None}
    table = ok(["groups", "describe", "--group", group], broker).stdout
    assert f"group {group}  state EMPTY" in table and f"total lag {10 - sum(committed.values())}" in table


def test_groups_total_lag_counts_partitions_without_a_commit(broker: Broker) -> None:
    """A partition the group never committed in shows lag "-", and the total counts all it holds
    (the undercount of a total made of committed partitions only)."""
    topic = new_topic(broker, partitions=2)
    produce(broker, topic, {0: 5, 1: 3})
    group = f"half-{uuid.uuid4().hex[:8]}"
    ok(["groups", "reset-offsets", "--group", group, "--topic", f"{topic}:0", "--to-offset", "2", "--execute"], broker)
    doc = describe_group(broker, group)
    assert [(p["partition"], p["lag"]) for p in doc["partitions"]] == [(0, 3), (1, None)]
    assert doc["total_lag"] == 3 + 3 and doc["partitions_without_commit"] == 1
    table = ok(["groups", "describe", "--group", group], broker).stdout
    assert "total lag 6 (1 partition without a committed offset counted from the log start)" in " ".join(table.split())


def test_reset_offsets_warns_when_it_clamps(broker: Broker) -> None:
    topic = new_topic(broker)
    produce(broker, topic, {0: 4})
    group = f"clamp-{uuid.uuid4().hex[:8]}"
    low = ok(["groups", "reset-offsets", "--group", group, "--topic", topic, "--to-offset", "-5", "--execute"], broker)
    assert f"warning: new offset (-5) is lower than the earliest offset for {topic}:0; it will be set to 0" in (
        low.stderr.splitlines()
    )
    assert committed_of(describe_group(broker, group), topic) == {0: 0}
    high = ok(["groups", "reset-offsets", "--group", group, "--topic", topic, "--shift-by", "10", "--dry-run"], broker)
    assert f"warning: new offset (10) is higher than the latest offset for {topic}:0; it will be set to 4" in (
        high.stderr.splitlines()
    )
    inside = ok(["groups", "reset-offsets", "--group", group, "--topic", topic, "--to-offset", "3"], broker)
    assert "warning" not in inside.stderr


def test_verify_on_the_running_brokers_dir_counts_what_is_unsealed(broker: Broker) -> None:
    topic = new_topic(broker)
    produce(broker, topic, {0: 500})
    deadline = Deadline("the broker to record the acknowledged end of the records")
    while True:
        result = cli(["verify", "--json", "--data-dir", str(broker.data_dir)])
        assert result.returncode == 0, result.stderr
        if json.loads(result.stdout)["unsealed_records_not_checked"] >= 500:
            break
        deadline.check()
        time.sleep(0.5)
    text = cli(["verify", "--data-dir", str(broker.data_dir)])
    assert text.returncode == 0 and "verify ok" in text.stdout
    assert "not sealed yet and not checked" in " ".join(text.stderr.split())


def test_reset_offsets_dry_run_then_execute(broker: Broker) -> None:
    topic = new_topic(broker, partitions=2)
    produce(broker, topic, {0: 8, 1: 8}, timestamps=True)
    group = f"reset-{uuid.uuid4().hex[:8]}"
    consume_part(broker, topic, group, 16)
    before = committed_of(describe_group(broker, group), topic)
    assert before == {0: 8, 1: 8}

    plan = ok(["groups", "reset-offsets", "--group", group, "--topic", f"{topic}:0", "--to-offset", "2", "--dry-run"],
              broker)
    assert "planned offsets" in plan.stdout and "nothing changed" in plan.stderr
    assert committed_of(describe_group(broker, group), topic) == before
    # Without --execute it is a dry run too, as Kafka's tool.
    ok(["groups", "reset-offsets", "--group", group, "--topic", topic, "--to-earliest"], broker)
    assert committed_of(describe_group(broker, group), topic) == before

    ok(["groups", "reset-offsets", "--group", group, "--topic", f"{topic}:0", "--to-offset", "2", "--execute"], broker)
    assert committed_of(describe_group(broker, group), topic) == {0: 2, 1: 8}
    assert first_offset_in_group(broker, topic, group, 0) == 2

    # The consumer above committed nothing; shift p1 back by 3 and p0 forward by 1.
    ok(["groups", "reset-offsets", "--group", group, "--topic", f"{topic}:1", "--shift-by", "-3", "--execute"], broker)
    ok(["groups", "reset-offsets", "--group", group, "--topic", f"{topic}:0", "--shift-by", "1", "--execute"], broker)
    assert committed_of(describe_group(broker, group), topic) == {0: 3, 1: 5}
    # --to-datetime: the first record at or after record 4's CreateTime.
    at = datetime.fromtimestamp((BASE_TS_MS + 4000) / 1000, tz=UTC).isoformat()
    ok(["groups", "reset-offsets", "--group", group, "--topic", topic, "--to-datetime", at, "--execute"], broker)
    from_time = ok(["consume", topic, "--partition", "1", "--from", at, "-n", "1", "--format", "json"], broker)
    assert json.loads(from_time.stdout)["offset"] == 4
    assert committed_of(describe_group(broker, group), topic) == {0: 4, 1: 4}
    ok(["groups", "reset-offsets", "--group", group, "--all-topics", "--to-latest", "--execute"], broker)
    assert committed_of(describe_group(broker, group), topic) == {0: 8, 1: 8}
    ok(["groups", "reset-offsets", "--group", group, "--topic", topic, "--to-offset", "1000", "--execute"], broker)
    assert committed_of(describe_group(broker, group), topic) == {0: 8, 1: 8}  # clamped to the log end


def test_active_group_is_described_and_not_reset_or_deleted(broker: Broker) -> None:
    topic = new_topic(broker, partitions=2)
    produce(broker, topic, {0: 3, 1: 3})
    group = f"live-{uuid.uuid4().hex[:8]}"
    c = group_consumer(broker, group, **{"client.id": "live-client"})
    c.subscribe([topic])
    try:
        deadline = Deadline(f"group {group} to assign both partitions")
        while len(c.assignment()) < 2:
            deadline.check()
            c.poll(0.5)
        doc = describe_group(broker, group)
        assert doc["state"] == "STABLE"
        [member] = doc["members"]
        assert member["client_id"] == "live-client" and member["host"]
        assert sorted(member["assignment"]) == [[topic, 0], [topic, 1]]
        line = fails(["groups", "reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute",
                      "--bootstrap-server", broker.bootstrap])
        assert "inactive" in line and "STABLE" in line
        line = fails(["groups", "delete", "--group", group, "--bootstrap-server", broker.bootstrap])
        assert "active members" in line
    finally:
        c.close()


def _share_consumer(broker: Broker, group: str, topic: str) -> Any:
    from confluent_kafka import ShareConsumer
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(30)
    c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "client.id": "share-cli-test",
                       "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    return c


def test_groups_list_and_describe_share_groups(broker: Broker) -> None:
    from confluent_kafka import AcknowledgeType

    topic = new_topic(broker, partitions=2)
    produce(broker, topic, {0: 4, 1: 3})
    classic = f"cg-{uuid.uuid4().hex[:8]}"
    consume_part(broker, topic, classic, 1)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    c = _share_consumer(broker, group, topic)
    try:
        got: list[Any] = []
        deadline = Deadline(f"7 records of {topic} in share group {group}")
        while len(got) < 7:
            deadline.check()
            got += [m for m in c.poll(1.0) if m.error() is None]
        accepted = {0: 0, 1: 0}
        for m in got:  # accept partition 0's first three and partition 1's first one; release the rest
            take = m.offset() < (3 if m.partition() == 0 else 1)
            c.acknowledge(m, AcknowledgeType.ACCEPT if take else AcknowledgeType.RELEASE)
            accepted[m.partition()] += take
        assert all(err is None for err in c.commit_sync(30).values())
        listed = ok(["groups", "list", "--state", "--type"], broker).stdout.splitlines()
        assert f"{group} STABLE share" in listed and f"{classic} EMPTY classic" in listed
        assert group in ok(["groups", "list"], broker).stdout.split()
        doc = describe_group(broker, group)
        assert (doc["type"], doc["state"]) == ("share", "STABLE")
        (member,) = doc["members"]
        assert member["client_id"] == "share-cli-test" and member["assignment"] == [[topic, 0], [topic, 1]]
        rows = {p["partition"]: p for p in doc["partitions"] if p["topic"] == topic}
        assert {p: (r["start_offset"], r["log_end_offset"]) for p, r in rows.items()} == {0: (3, 4), 1: (1, 3)}
        table = ok(["groups", "describe", "--group", group], broker).stdout
        assert f"group {group}  type share  state STABLE  members 1" in table and "start offset" in table
    finally:
        c.close()
    # without members the group is described from its stored share-partition states
    deadline = Deadline(f"share group {group} to become empty")
    while (doc := describe_group(broker, group))["members"]:
        deadline.check()
        time.sleep(0.2)
    assert doc["state"] == "EMPTY" and [r["start_offset"] for r in doc["partitions"]] == [3, 1]
    assert "does not exist" in fails(["groups", "describe", "--group", "no-such-share-group",
                                      "--bootstrap-server", broker.bootstrap])


def test_groups_delete(broker: Broker) -> None:
    topic = new_topic(broker)
    produce(broker, topic, {0: 2})
    group = f"del-{uuid.uuid4().hex[:8]}"
    consume_part(broker, topic, group, 2)
    assert f"deleted group {group}" in ok(["groups", "delete", "--group", group], broker).stdout
    assert group not in ok(["groups", "list"], broker).stdout.split()
    line = fails(["groups", "describe", "--group", group, "--bootstrap-server", broker.bootstrap])
    assert "does not exist" in line


# ---- configs --------------------------------------------------------------------------------------


def test_configs_describe_and_alter_a_topic(broker: Broker) -> None:
    topic = new_topic(broker)
    entity = ["--entity-type", "topics", "--entity-name", topic]
    assert "none" in ok(["configs", "describe", *entity], broker).stdout
    ok(["configs", "alter", *entity, "--add-config", "retention.ms=5000,cleanup.policy=[compact,delete]"], broker)
    doc = json.loads(ok(["configs", "describe", *entity, "--json"], broker).stdout)
    assert doc == {
        "cleanup.policy": {"value": "compact,delete", "source": "DYNAMIC_TOPIC_CONFIG"},
        "retention.ms": {"value": "5000", "source": "DYNAMIC_TOPIC_CONFIG"},
    }
    ok(["configs", "alter", *entity, "--delete-config", "cleanup.policy"], broker)
    doc = json.loads(ok(["configs", "describe", *entity, "--json"], broker).stdout)
    assert set(doc) == {"retention.ms"}
    every = json.loads(ok(["configs", "describe", *entity, "--all", "--json"], broker).stdout)
    assert every["segment.bytes"]["source"] == "DEFAULT_CONFIG"
    # The topics view agrees.
    assert json.loads(ok(["topics", "describe", topic, "--json"], broker).stdout)["overrides"] == {"retention.ms": "5000"}


def test_configs_describe_the_broker(broker: Broker) -> None:
    every = json.loads(ok(["configs", "describe", "--entity-type", "brokers", "--all", "--json"], broker).stdout)
    assert every["broker.id"]["value"] == "0"
    named = json.loads(ok(["configs", "describe", "--entity-type", "brokers", "--entity-name", "0", "--all",
                           "--json"], broker).stdout)
    assert named == every


# ---- errors: one line on stderr, exit 1 -------------------------------------------------------------


def test_unreachable_bootstrap_server() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens: refused at once
    for args in (["topics", "list"], ["groups", "describe", "--group", "g"], ["consume", "t"]):
        line = fails([*args, "--bootstrap-server", address])
        assert f"cannot reach a broker at {address}: Connection refused" in line


def test_silent_bootstrap_server_is_given_up_on() -> None:
    """A socket that accepts connections but never answers a Kafka request: the command ends within
    REMOTE_TIMEOUT_S, saying the connection was made (a TLS or SASL listener is the usual cause)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        result = cli(["topics", "list", "--bootstrap-server", address])
        took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    first, hint = result.stderr.strip().splitlines()
    assert first.startswith(f"error: connected to {address} but it did not answer a plaintext Kafka request"), first
    assert hint.startswith("hint: ") and "--command-config" in hint, hint
    # the process's own start and exit are in `took` too (seconds under a loaded machine); a
    # command that waited for the socket would run until the test's own timeout
    assert took < 2 * REMOTE_TIMEOUT_S


def test_unknown_topic_and_group(broker: Broker) -> None:
    b = ["--bootstrap-server", broker.bootstrap]
    assert "unknown topic" in fails(["topics", "describe", "no-such-topic", *b])
    assert "unknown topic" in fails(["topics", "delete", "no-such-topic", *b])
    assert "unknown topic" in fails(["consume", "no-such-topic", *b])
    assert "unknown topic" in fails(["configs", "describe", "--entity-type", "topics", "--entity-name", "nope", *b])
    assert "unknown topic" in fails(["groups", "reset-offsets", "--group", "g", "--topic", "nope", "--to-earliest", *b])
    assert "does not exist" in fails(["groups", "describe", "--group", "no-such-group", *b])
    assert "does not exist" in fails(["groups", "delete", "--group", "no-such-group", *b])
    assert "already exists" in fails(["topics", "create", new_topic(broker), *b])
    one = new_topic(broker)
    assert "has no partition 3" in fails(["produce", one, "--partition", "3", *b], input=b"x\n")
    assert "has no partition 3" in fails(["consume", one, "--partition", "3", *b])


def test_data_dir_locked_by_the_running_broker_hints_at_bootstrap_server(broker: Broker) -> None:
    for args in (["topics", "list"], ["consume", "t"], ["produce", "t"]):
        line = fails([*args, "--data-dir", str(broker.data_dir)], input=b"x\n")
        assert "in use by another loglake process" in line and "--bootstrap-server" in line


def test_neither_a_data_dir_nor_a_bootstrap_server(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    line = fails(["topics", "list", "--data-dir", missing])
    assert "does not exist" in line and "--bootstrap-server" in line
    for args in (["groups", "list"], ["groups", "describe", "--group", "g"], ["configs", "describe",
                                                                              "--entity-type", "brokers"]):
        line = fails(args)
        assert "needs a running broker" in line and "--bootstrap-server" in line
    assert cli(["consume", "t", "--group", "g", "--data-dir", missing]).returncode == 2  # usage error


def test_follow_through_a_broker_stops_on_ctrl_c_and_commits(broker: Broker) -> None:
    """Ctrl-C ends `consume --follow --group` within 2 s (asked between polls, not raised inside
    librdkafka's poll), exit 0, and the group has committed what was printed."""
    topic = new_topic(broker)
    produce(broker, topic, {0: 3})
    group = f"ctrlc-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loglake.cli.main", "consume", topic, "--follow", "--group", group,
         "--bootstrap-server", broker.bootstrap],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=os.path.dirname(__file__),
    )
    try:
        assert proc.stdout is not None
        assert [proc.stdout.readline() for _ in range(3)] == [b"0-0\n", b"0-1\n", b"0-2\n"]
        time.sleep(0.3)  # polling for more
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert b"Traceback" not in err
    assert took < 2.0, f"exited {took:.2f}s after Ctrl-C"
    assert committed_of(describe_group(broker, group), topic) == {0: 3}
