"""Compacted topics through a real broker or a three-broker cluster (tests/modekit.py MODES),
with real clients.

One broker: its cleaner runs every 200 ms and the topics seal small segments after 200 records
or 300 ms with a dirty ratio of 0.01, so compaction (and merging of the small rewritten
segments) happens by itself while the tests watch. A cluster: each partition's leader merges its
committed ranges and compacts the merged segments every 200 ms (loglake.cluster.compact); the
tests look at the segments its published metadata lists (the replaced ones stay in the bucket
for the sweep's grace, unreferenced). Either way:

- confluent-kafka writes updates and tombstones over a set of keys; once compacted, confluent-kafka,
  kafka-python and kcat read from the beginning one record per key, the newest, at increasing
  offsets;
- a schema-registry style workload (few keys, many updates) keeps the partition's segment bytes
  bounded by the number of keys, not the number of updates;
- a consumer group consuming while the cleaner rewrites under it never sees an offset go back,
  also across a restart from its committed offset;
- a transactional workload keeps every key's newest committed value.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition
from prometheus_client.parser import text_string_to_metric_families

import s3kit
from loglake.cluster.verify import PlogSource
from loglake.engine.partition_log import Feature
from modekit import MODES, Served, serving

from brokerkit import free_port

KCAT = shutil.which("kcat")
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.records": "200",
    "segment.ms": "300",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "86400000",
    "retention.ms": "-1",
}
BROKER_TOML = """\
group_initial_rebalance_delay_ms = 0
group_min_session_timeout_ms = 1000

[engine]
cleaner_backoff_ms = 200
maintenance_interval_ms = 100
merge_min_segments = 4
"""
#: Cluster brokers merge and compact in their maintenance round: every 200 ms here.
ENV = {"LOGLAKE_CLUSTER_MAINTENANCE_INTERVAL_MS": "200"}
#: Longest a test waits for the cleaner to catch up (it usually takes about a second).
DEADLINE_S = 30.0

Record = tuple[int, bytes | None, bytes | None]  # offset, key, value


@pytest.fixture(scope="module", params=MODES)
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = Path(tmp_path_factory.mktemp(f"compaction-{request.param}"))
    (root / "broker.toml").write_text(BROKER_TOML)
    metrics_port = free_port()
    metrics = ["--metrics-listen", f"127.0.0.1:{metrics_port}"]  # one broker's: the cluster's would collide
    with serving(request.param, root, ["--config", str(root / "broker.toml")], ENV, single_args=metrics) as b:
        b.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"  # type: ignore[attr-defined]
        yield b
    text = b.log_text()
    assert "retried each round" not in text, text[-5000:]  # no cleaner failure
    for failed in ("compaction of ", "compaction round failed"):  # no cluster compaction failure either
        assert failed not in text, text[-5000:]


def create_topic(broker: Served, prefix: str, partitions: int = 1) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, config=TOPIC_CONFIG)])[topic].result(10)
    broker.leaders(topic, partitions)
    return topic


#: A segment as the tests see it: (name, bytes, whether compaction or merging rewrote it).
Seg = tuple[str, int, bool]


def segment_files(broker: Served, topic: str) -> list[Seg]:
    """The topic's segments: one broker's hot segment files in its data directory; a cluster's
    merged segments, as its published metadata lists them (a compacted one is rewritten)."""
    if broker.cluster is None:
        data_dir = broker.first.data_dir
        files = sorted(p for p in (data_dir / "segments").rglob("*.seg") if p.parent.parent.name.startswith(topic + "-"))
        out = []
        for p in files:
            try:
                out.append((p.name, p.stat().st_size, "-g" in p.name))
            except FileNotFoundError:  # replaced meanwhile
                continue
        return out
    store = s3kit.make_store(broker.cluster.moto.endpoint, broker.cluster.bucket, "data")
    try:
        source = PlogSource(store)
    finally:
        store.close()
    return [
        (s.key, s.size, s.gen > 0) for name, _tid, _p, plog in source.plogs() if name == topic for s in plog.segments
    ]


def rewritten(files: list[Seg]) -> list[Seg]:
    return [f for f in files if f[2]]


def wait_for(what: str, check: Callable[[], bool], timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def produce(broker: Served, topic: str, records: Sequence[tuple[bytes, bytes | None]], partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    for i, (k, v) in enumerate(records):
        p.produce(topic, key=k, value=v, partition=partition)
        if i % 100 == 99:
            p.poll(0)
    assert p.flush(30) == 0


def read_confluent(broker: Served, topic: str, partition: int = 0) -> list[Record]:
    """Everything in the partition, from the beginning to its end."""
    c = Consumer({
        "bootstrap.servers": broker.bootstrap,
        "group.id": "reader",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    })
    c.assign([TopicPartition(topic, partition, 0)])
    out: list[Record] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(err)
            offset = m.offset()
            assert offset is not None
            out.append((offset, m.key(), m.value()))
    finally:
        c.close()
    raise AssertionError(f"no end of partition after {len(out)} records")


def newest(records: Sequence[tuple[bytes, bytes | None]]) -> dict[bytes, bytes | None]:
    out: dict[bytes, bytes | None] = {}
    for k, v in records:
        out[k] = v
    return out


def one_per_key(broker: Served, topic: str, keys: int) -> Callable[[], bool]:
    """True once the partition reads as exactly one record per key (fully compacted)."""
    return lambda: len(read_confluent(broker, topic)) == keys


def assert_compacted_view(got: list[Record], expected: dict[bytes, bytes | None], produced: int) -> None:
    offsets = [o for o, _k, _v in got]
    assert all(a < b for a, b in itertools.pairwise(offsets)), "offsets must strictly increase"
    assert len(got) < produced
    assert len(got) == len(expected)
    assert {k: v for _o, k, v in got} == expected
    assert offsets[-1] < produced


def test_compacted_topic_read_by_three_clients(broker: Served) -> None:
    topic = create_topic(broker, "compact")
    keys = [b"user-%03d" % i for i in range(50)]
    records: list[tuple[bytes, bytes | None]] = [
        (keys[i % len(keys)], b"%s=v%05d" % (keys[i % len(keys)], i)) for i in range(3000)
    ]
    records += [(k, None) for k in keys[::10]]  # tombstones: kept (delete.retention.ms is a day)
    records += [(keys[0], b"revived")]  # a tombstoned key written again
    produce(broker, topic, records)
    expected = newest(records)

    wait_for("the cleaner to compact the topic", one_per_key(broker, topic, len(expected)))
    assert rewritten(segment_files(broker, topic)), "compaction leaves <base>-g<n>.seg files"

    got = read_confluent(broker, topic)
    assert_compacted_view(got, expected, len(records))
    assert sum(1 for _o, _k, v in got if v is None) == len(keys[::10]) - 1
    # the newest record of each key keeps the offset it was produced at
    assert all(records[o] == (k, v) for o, k, v in got)

    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, consumer_timeout_ms=3000)
    tp = KTopicPartition(topic, 0)
    kc.assign([tp])
    kc.seek_to_beginning(tp)
    kp: list[Record] = []
    for msg in kc:
        kp.append((msg.offset, msg.key, msg.value))
        if msg.offset == got[-1][0]:
            break
    kc.close()
    assert kp == got

    if KCAT is None:
        pytest.skip("kcat is not installed: the kcat part of this test did not run")
    proc = subprocess.run(
        [KCAT, "-b", broker.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-f", "%o|%k|%S|%s\\n"],
        capture_output=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    kcat_view = []
    for line in proc.stdout.decode().splitlines():
        offset, key, size, value = line.split("|", 3)
        kcat_view.append((int(offset), key.encode(), None if size == "-1" else value.encode()))
    assert kcat_view == got


def test_schema_registry_workload_stays_bounded(broker: Served) -> None:
    """20 subjects, 500 updates each in 5 rounds: the partition's bytes follow the keys."""

    def settled(segs: list[Seg]) -> bool:
        # a cluster's published metadata may lag the compaction the reads already show (by up
        # to its publish interval): wait until it lists the compacted segments only
        return 0 < len(segs) < 4 and (not broker.is_cluster or all(r for _name, _size, r in segs))

    topic = create_topic(broker, "schemas")
    subjects = [b"subject-%02d" % i for i in range(20)]
    sizes = []
    produced = 0
    for rnd in range(5):
        batch = [
            (s, b'{"subject": "%s", "version": %d, "schema": "%s"}' % (s, rnd * 100 + u, b"x" * 150))
            for u in range(100)
            for s in subjects
        ]
        produce(broker, topic, batch)
        produced += len(batch)
        wait_for(f"round {rnd} to be compacted", one_per_key(broker, topic, len(subjects)))
        # a few segment files remain: the compacted output (small runs of them get merged)
        wait_for(f"round {rnd} to be merged", lambda: settled(segment_files(broker, topic)))
        sizes.append(sum(size for _name, size, _rewritten in segment_files(broker, topic)))
        got = read_confluent(broker, topic)
        assert {k: v for _o, k, v in got} == newest(batch)
    live = 20 * 250  # about the bytes of one record per subject
    assert produced == 5 * 2000
    assert max(sizes) <= 2 * sizes[0], sizes
    assert sizes[-1] < 10 * live, sizes  # proportional to the keys, far below the ~2 MB produced


def test_consumer_group_never_sees_offsets_go_back(broker: Served) -> None:
    topic = create_topic(broker, "group", partitions=2)
    keys = [b"k%02d" % i for i in range(30)]
    total = 4000
    stop = threading.Event()

    def producer() -> None:
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
        for i in range(total):
            if stop.is_set():
                break
            p.produce(topic, key=keys[i % len(keys)], value=b"v%06d" % i, partition=i % 2)
            if i % 200 == 199:
                p.flush(30)  # rounds: segments seal and get compacted while the group reads
        p.flush(30)

    conf = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": f"g-{topic}",
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "enable.auto.commit": True,
        "auto.commit.interval.ms": 200,
    }
    last: dict[int, int] = {}
    seen_while_rewritten = 0

    def consume(c: Consumer, until: Callable[[], bool]) -> None:
        nonlocal seen_while_rewritten
        deadline = time.monotonic() + DEADLINE_S * 2
        while not until():
            assert time.monotonic() < deadline, f"consumer stuck at {last}"
            batch = c.consume(500, timeout=0.5)
            under_rewrite = bool(rewritten(segment_files(broker, topic)))  # once a batch: a cluster's is a GET
            for m in batch:
                if m.error():
                    continue
                part, offset = m.partition(), m.offset()
                assert part is not None and offset is not None
                prev = last.get(part, -1)
                assert offset > prev, f"partition {part}: offset {offset} after {prev}"
                last[part] = offset
                if under_rewrite:
                    seen_while_rewritten += 1

    c = Consumer(conf)
    c.subscribe([topic])
    thread = threading.Thread(target=producer)
    thread.start()
    try:
        # A quarter read while the producer writes and the cleaner rewrites what sealed meanwhile.
        consume(c, lambda: sum(last.values()) > total // 4)
    finally:
        c.close()  # commits its position, far from the end
        thread.join(60)
        stop.set()
    assert not thread.is_alive()
    # The next member resumes from that position into rewritten segments: wait for the cleaner
    # (under load it may not have run yet; then the whole rest would be read before it did).
    wait_for("a rewritten segment", lambda: bool(rewritten(segment_files(broker, topic))))
    ends = {}
    for part in (0, 1):
        _low, high = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x"}).get_watermark_offsets(
            TopicPartition(topic, part), timeout=10
        )
        ends[part] = high
    assert ends == {0: total // 2, 1: total // 2}
    c = Consumer(conf)
    c.subscribe([topic])
    try:
        # the newest record of each key stays, so every partition's last offset is read again
        consume(c, lambda: all(last.get(p, -1) == ends[p] - 1 for p in (0, 1)))
    finally:
        c.close()
    assert seen_while_rewritten > 0


def test_cleaner_metrics_and_dirty_ratio_on_metrics(broker: Served) -> None:
    if broker.is_cluster:
        pytest.skip("cluster mode has no loglake_cleaner_* counters: each pass is logged (docs/CLUSTER.md)")
    topic = create_topic(broker, "metrics")
    produce(broker, topic, [(b"k%d" % (i % 5), b"v%d" % i) for i in range(500)])
    wait_for("the topic to be compacted", one_per_key(broker, topic, 5))
    text = urllib.request.urlopen(broker.metrics_url, timeout=5).read().decode()  # type: ignore[attr-defined]
    # The whole page through prometheus-client's parser (label order in the text is the library's).
    values = {
        s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert values["loglake_cleaner_compactions_total"] >= 1
    assert values["loglake_cleaner_bytes_read_total"] > 0 and values["loglake_cleaner_bytes_written_total"] > 0
    assert values["loglake_cleaner_errors_total"] == 0
    ratio = values[f"loglake_partition_dirty_ratio,partition=0,topic={topic}"]
    last = values[f"loglake_cleaner_partition_last_compaction_timestamp_seconds,partition=0,topic={topic}"]
    assert abs(last - time.time()) < 600
    assert 0.0 <= ratio <= 1.0
    assert "# TYPE loglake_cleaner_compactions_total counter" in text


def test_aborted_transactions_never_supersede_committed_records(broker: Served) -> None:
    """A compacted topic written in transactions: the cleaner maps and keeps committed records
    only, so a key's newest *committed* value survives an aborted overwrite, and the aborted
    records are gone for read_uncommitted readers too (Kafka's cleaner removes them)."""
    topic = create_topic(broker, "ctxn")
    keys = [b"k%02d" % i for i in range(20)]
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"{topic}-app", "linger.ms": 5})
    if broker.refuses(Feature.TRANSACTIONS):
        with pytest.raises(KafkaException, match="UNSUPPORTED_VERSION"):
            producer.init_transactions(10)
        return
    producer.init_transactions(30)
    committed: dict[bytes, bytes | None] = {}
    for round_ in range(30):
        producer.begin_transaction()
        for k in keys:
            producer.produce(topic, key=k, value=b"%s-r%d" % (k, round_), partition=0)
        if round_ % 3 == 2:
            assert producer.flush(30) == 0  # written to the log (else abort purges them unsent)
            producer.abort_transaction(30)  # every third round's values must never win
        else:
            producer.commit_transaction(30)
            committed.update({k: b"%s-r%d" % (k, round_) for k in keys})
    # a last aborted overwrite of every key, then committed padding so it is sealed and cleaned
    producer.begin_transaction()
    for k in keys:
        producer.produce(topic, key=k, value=b"aborted", partition=0)
    assert producer.flush(30) == 0
    producer.abort_transaction(30)
    # committed records of other keys after it, so that the aborted overwrites are sealed and in
    # the cleaned part, where (mapped) they would supersede every key's committed value
    producer.begin_transaction()
    for i in range(600):
        producer.produce(topic, key=b"pad-%03d" % i, value=b"p", partition=0)
        committed[b"pad-%03d" % i] = b"p"
    producer.commit_transaction(30)

    def view() -> dict[bytes, bytes | None]:
        return {k: v for _o, k, v in read_confluent(broker, topic) if k is not None}

    wait_for("compaction of the transactional topic", lambda: len(read_confluent(broker, topic)) <= len(committed) + 4)
    got = view()
    assert {k: got[k] for k in committed} == committed
    assert b"aborted" not in got.values() and all(not v.endswith((b"-r2", b"-r5")) for v in got.values() if v)
