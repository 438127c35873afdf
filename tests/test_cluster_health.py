"""Health-gated leadership (loglake.cluster.health, loglake.cluster.view): a cluster broker leads
partitions only while it reaches etcd and the bucket.

Unit: `ClusterHealth` on a fake clock (never answered: down at once; silent or failing writes for
`release_s`: down; a write probe while not standing). Real processes (tests/clusterkit.py: etcd,
moto behind fault proxies, `loglake serve --cluster`): a broker started without S3 credentials is
given no partition, produce to every partition works, its /readyz says why and its /metrics show
it; a broker whose bucket goes away (its own proxy blackholed) hands its partitions to the others
within the bound, nothing acknowledged is lost, and it leads again once the bucket is back.
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer

import clusterkit
import clusterload
import s3kit
from logcheck import History, value_for

import brokerkit

if TYPE_CHECKING:  # imported where used, so that the process tests run against a tree without it
    from loglake.cluster.health import ClusterHealth

PARTITIONS = 6
#: The broker setting's default (cluster_unreachable_release_ms), which these tests run with.
RELEASE_S = 5.0
#: Slack over RELEASE_S for a round, a watch event, acquiring and a Metadata refresh on the shared
#: 2-core machine.
MOVE_SLACK_S = 15.0
#: How long a produce to any partition may take with one broker unable to reach the bucket.
PRODUCE_BOUND_S = 30.0
#: Generous bound for clients carrying on.
CARRY_ON_S = 90.0


def note(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


# ---- unit: the verdict -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def health(clock: Clock, *, fail_list: list[bool], writes: list[str]) -> ClusterHealth:
    def probe_list() -> None:
        if fail_list[0]:
            raise OSError("connection refused")

    def probe_write() -> None:
        writes.append("put+delete")
        probe_list()

    from loglake.cluster.health import ClusterHealth

    return ClusterHealth(
        7, RELEASE_S, bucket_url="s3://b/p", etcd_url="etcd://e/p",
        probe_list=probe_list, probe_write=probe_write, etcd_answered=lambda: clock.now, clock=clock,
    )  # fmt: skip


def test_never_answered_is_down_at_once_and_a_write_probe_brings_it_up() -> None:
    clock, fail, writes = Clock(), [True], []
    h = health(clock, fail_list=fail, writes=writes)
    assert h.check() == (True, False)
    assert not h.start(first_wait_s=10)  # the prober probes at once; the start waits for it
    h.stop()
    assert writes == ["put+delete"] and not h.probe()
    lines = h.not_ready()
    assert len(lines) == 1 and "s3://b/p" in lines[0] and "connection refused" in lines[0]
    assert "credentials" in lines[0]  # the hint
    fail[0] = False
    assert h.probe() and writes == ["put+delete"] * 3  # not standing: it writes
    assert h.check() == (True, True) and h.not_ready() == []


def test_silence_or_failing_writes_for_the_release_time_is_down() -> None:
    clock, fail, writes = Clock(), [False], []
    h = health(clock, fail_list=fail, writes=writes)
    assert h.probe()
    h.standing = True
    assert h.probe() and writes == ["put+delete"]  # standing: a LIST, no write
    clock.now += RELEASE_S - 0.1
    assert h.check()[1]
    clock.now += 0.2
    assert not h.check()[1]  # nothing answered for RELEASE_S
    assert h.probe() and h.check()[1]
    # LISTs answer, flush PUTs fail (credentials that may read, not write): down after RELEASE_S
    h.bucket_failed(PermissionError("AccessDenied"), write=True)
    clock.now += RELEASE_S / 2
    assert h.probe() and h.check()[1]
    clock.now += RELEASE_S / 2
    assert h.probe() and not h.check()[1]
    assert "AccessDenied" in h.not_ready()[0]
    h.bucket_answered(write=True)
    assert h.check()[1]


def test_etcd_silent_for_the_release_time_is_down() -> None:
    clock, answered = Clock(), [100.0]
    from loglake.cluster.health import ClusterHealth

    h = ClusterHealth(
        7, RELEASE_S, bucket_url="s3://b/p", etcd_url="etcd://e/p", probe_list=lambda: None,
        probe_write=lambda: None, etcd_answered=lambda: answered[0], clock=clock,
    )  # fmt: skip
    h.probe()
    clock.now += RELEASE_S + 1
    h.bucket_answered(write=False)
    assert h.check() == (False, True)
    assert "etcd://e/p" in h.not_ready()[0]
    answered[0] = clock.now
    assert h.check() == (True, True)


# ---- real processes ----------------------------------------------------------------------------


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(port: int, name: str) -> float:
    """A sample of /metrics without labels (the first whose name is `name` exactly)."""
    _status, text = http_get(port, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics:\n{text[-3000:]}")


def add_broker(c: clusterkit.Cluster, node_id: int, cold_store: str, env: dict[str, str]) -> tuple[clusterkit.ClusterBroker, int]:
    """A broker with its own cold-store URL and environment, and its metrics port."""
    mport = brokerkit.free_port()
    args = ["--cluster", c.etcd_url, "--cold-store", cold_store, "--metrics-listen", f"127.0.0.1:{mport}"]
    b = clusterkit.ClusterBroker(node_id, c.tmp / f"node{node_id}", brokerkit.free_port(), args, env)
    c.brokers.append(b)
    b.start()
    return b, mport


class Prober(threading.Thread):
    """An idempotent producer sending one record to each partition in turn every `interval_s`,
    recording every ack's time per partition (the produce failure window) and into a History."""

    def __init__(self, h: History, bootstrap: str, topic: str, interval_s: float = 0.05) -> None:
        super().__init__(name="prober", daemon=True)
        self.h, self.topic, self.interval_s = h, topic, interval_s
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "message.timeout.ms": 120_000, "topic.metadata.refresh.interval.ms": 1000,
        })  # fmt: skip
        self.acks: dict[int, list[float]] = defaultdict(list)
        self.errors: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        seq = 0
        while not self.halt.is_set():
            value = value_for("prober", seq, 50)
            op = self.h.attempt(self.topic, value)

            def report(err: Any, msg: Any, op: Any = op) -> None:
                if err is None:
                    self.h.acked(op, msg.partition(), msg.offset())
                    self.acks[msg.partition()].append(time.monotonic())
                else:
                    self.h.unknown(op, str(err))
                    self.errors.append(str(err))

            self.producer.produce(self.topic, value, partition=seq % PARTITIONS, on_delivery=report)
            seq += 1
            self.producer.poll(self.interval_s)
        self.producer.flush(150)

    def stop(self) -> None:
        self.halt.set()
        self.join(200)

    def acked(self) -> int:
        return sum(len(v) for v in self.acks.values())

    def wait_acked(self, n: int, timeout_s: float) -> None:
        want = self.acked() + n
        deadline = time.monotonic() + timeout_s
        while self.acked() < want:
            assert time.monotonic() < deadline, f"{self.acked()} of {want} acked; {self.errors[-3:]}"
            time.sleep(0.1)

    def longest_gap(self, partitions: set[int], since: float) -> float:
        """The longest time without an ack on any of `partitions` from `since` until now."""
        gap = 0.0
        for p in partitions:
            times = [since] + [t for t in self.acks[p] if t > since] + [time.monotonic()]
            gap = max([gap] + [b - a for a, b in itertools.pairwise(times)])
        return gap


def test_a_broker_without_bucket_credentials_leads_nothing_and_says_why(tmp_path: Path) -> None:
    with clusterkit.running_cluster(tmp_path, brokers=2) as c:
        # as in the incident: restarted without its S3 credentials (and no instance metadata to fall back on)
        env = {
            **c.broker_env, "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "",
            "AWS_EC2_METADATA_DISABLED": "true",
        }  # fmt: skip
        bad, bad_metrics = add_broker(c, 3, c.cold_store_url, env)
        c.create_topic("t", PARTITIONS)
        # It is live (Metadata lists it, it coordinates groups) but given no partition: watched for
        # longer than a few leadership rounds.
        deadline = time.monotonic() + 2 * RELEASE_S
        while time.monotonic() < deadline:
            leaders = c.leaders("t")
            assert 3 not in leaders.values(), leaders
            time.sleep(0.5)
        # produce to every partition works, each within the bound
        p = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all"})
        done: dict[int, float] = {}
        errors: list[Any] = []
        started = time.monotonic()

        def report(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                done.setdefault(msg.partition(), time.monotonic() - started)

        for i in range(PARTITIONS * 20):
            p.produce("t", b"v%d" % i, partition=i % PARTITIONS, on_delivery=report)
        assert p.flush(PRODUCE_BOUND_S) == 0, (done, errors)
        assert not errors and len(done) == PARTITIONS, (done, errors)
        note(f"first ack per partition (s): {sorted(done.items())}")
        assert max(done.values()) < PRODUCE_BOUND_S
        # /readyz: not ready, with the reason and what to check
        status, body = http_get(bad_metrics, "/readyz")
        assert status == 503, body
        assert body.startswith("not ready\n") and "cannot reach bucket" in body and "credentials" in body, body
        assert metric(bad_metrics, "loglake_cluster_bucket_reachable") == 0
        assert metric(bad_metrics, "loglake_cluster_etcd_reachable") == 1
        assert metric(bad_metrics, "loglake_cluster_leader_candidate") == 0
        assert metric(bad_metrics, "loglake_cluster_partitions_led") == 0
        assert metric(bad_metrics, "loglake_cluster_lease_expires_in_seconds") > 0
        # one warning with the hint, no line per round or per partition
        text = bad.log_text()
        assert text.count("cannot reach bucket") == 1, text[-3000:]
        assert "acquiring" not in text and "could not acquire" not in text, text[-3000:]


def test_a_broker_whose_bucket_goes_away_hands_its_partitions_over_and_leads_again_when_it_is_back(
    tmp_path: Path,
) -> None:
    proxies: list[s3kit.FaultProxy] = []
    try:
        with clusterkit.running_cluster(tmp_path, brokers=2) as c:
            # broker 3 reaches the same bucket through a proxy of its own: the switch for its outage only
            proxy = s3kit.FaultProxy(("127.0.0.1", c.moto.port)).start()
            proxies.append(proxy)
            bucket_goes_away(c, proxy)
    finally:  # after the brokers stopped: broker 3 stops with its bucket there
        for proxy in proxies:
            proxy.clear()
            proxy.stop()


def bucket_goes_away(c: clusterkit.Cluster, proxy: s3kit.FaultProxy) -> None:
    b3, m3 = add_broker(c, 3, s3kit.store_url(proxy.endpoint, c.bucket, "data"), c.broker_env)
    c.create_topic("t", PARTITIONS)
    # Leadership is taken after the topic is created, and node 3 (registered last) gets its share
    # when the balancer next runs: wait for both, not one look right after the create.
    deadline = time.monotonic() + CARRY_ON_S
    while not (led := {p for p, n in c.wait_leaders("t", PARTITIONS, CARRY_ON_S).items() if n == 3}):
        assert time.monotonic() < deadline, f"node 3 leads nothing after {CARRY_ON_S} s: {c.leaders('t')}"
        time.sleep(0.2)
    assert http_get(m3, "/readyz")[0] == 200
    h = History()
    prober = Prober(h, c.bootstrap, "t")
    prober.start()
    try:
        prober.wait_acked(PARTITIONS * 10, CARRY_ON_S)
        # what /metrics says of a healthy leader
        assert metric(m3, "loglake_cluster_partitions_led") == len(led)
        assert metric(m3, "loglake_cluster_flush_put_seconds_count") > 0
        assert metric(m3, "loglake_cluster_etcd_commit_seconds_count") > 0
        assert metric(m3, "loglake_cluster_bucket_reachable") == 1
        assert 0 < metric(m3, "loglake_cluster_lease_expires_in_seconds") <= 3
        assert metric(m3, "loglake_cluster_leader_candidate") == 1
        note(f"node 3 leads {sorted(led)}; its bucket goes away")
        hole = proxy.blackhole()
        gone = time.monotonic()
        moved = c.wait_leaders("t", PARTITIONS, RELEASE_S + MOVE_SLACK_S, avoid=3)
        moved_after = time.monotonic() - gone
        note(f"node 3's partitions moved {moved_after:.1f} s after its bucket went away: {moved}")
        status, body = http_get(m3, "/readyz")
        assert status == 503 and "cannot reach bucket" in body, body
        assert metric(m3, "loglake_cluster_leader_candidate") == 0
        prober.wait_acked(PARTITIONS * 20, CARRY_ON_S)  # produce carries on through the others
        window = prober.longest_gap(led, gone)
        note(f"produce failure window on node 3's partitions: {window:.1f} s")
        assert window < RELEASE_S + MOVE_SLACK_S, window
        proxy.heal(hole)
        back = time.monotonic()
        note("node 3's bucket is back")
        deadline = back + CARRY_ON_S
        while 3 not in c.leaders("t").values():
            assert time.monotonic() < deadline, c.leaders("t")
            time.sleep(0.2)
        note(f"node 3 leads again {time.monotonic() - back:.1f} s after its bucket came back")
        assert http_get(m3, "/readyz")[0] == 200
        assert metric(m3, "loglake_cluster_leader_candidate") == 1
        prober.wait_acked(PARTITIONS * 10, CARRY_ON_S)
    finally:
        prober.stop()
    assert not prober.is_alive()
    clusterload.final_read(h, c.bootstrap, "t", PARTITIONS)
    rep = h.check()
    assert rep.ok, str(rep)
    assert rep.stats.get("acked", 0) >= PARTITIONS * 40
    text = b3.log_text()
    assert text.count("cannot reach bucket") == 1, text[-3000:]


def test_a_partition_a_broker_cannot_acquire_is_handed_to_another(tmp_path: Path) -> None:
    proxies: list[s3kit.FaultProxy] = []
    try:
        with clusterkit.running_cluster(tmp_path, brokers=2) as c:
            proxy = s3kit.FaultProxy(("127.0.0.1", c.moto.port)).start()
            proxies.append(proxy)
            cannot_acquire(c, proxy)
    finally:
        for proxy in proxies:
            proxy.clear()
            proxy.stop()


def produce_to_all(c: clusterkit.Cluster, n: int, bound_s: float) -> dict[int, float]:
    """Produce `n` records to each partition; the seconds until each partition's first ack."""
    p = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all"})
    done: dict[int, float] = {}
    errors: list[Any] = []
    started = time.monotonic()

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            done.setdefault(msg.partition(), time.monotonic() - started)

    for i in range(PARTITIONS * n):
        p.produce("t", b"v%d" % i, partition=i % PARTITIONS, on_delivery=report)
    assert p.flush(bound_s) == 0, (done, errors)
    assert not errors and len(done) == PARTITIONS, (done, errors)
    return done


def cannot_acquire(c: clusterkit.Cluster, proxy: s3kit.FaultProxy) -> None:
    """Broker 3 reaches the bucket (its LIST and write probes answer) but may not read flush
    objects, so it cannot rebuild a partition's producers at acquire: it hands the partition back."""
    b3, m3 = add_broker(c, 3, s3kit.store_url(proxy.endpoint, c.bucket, "data"), c.broker_env)
    c.create_topic("t", PARTITIONS)
    produce_to_all(c, 10, CARRY_ON_S)  # every partition has a committed tail to rebuild from
    proxy.fail(10**9, 403, "AccessDenied", method="GET", path_contains=f"/{c.bucket}/data/loglake-")
    victim = next(n for n in c.leaders("t").values() if n != 3)
    note(f"kill -9 node {victim}: node 3 is given partitions it cannot acquire")
    c.by_node(victim).kill()
    killed = time.monotonic()
    moved = c.wait_leaders("t", PARTITIONS, CARRY_ON_S, avoid=victim)
    note(f"every partition led by a live broker {time.monotonic() - killed:.1f} s after the kill: {moved}")
    done = produce_to_all(c, 10, PRODUCE_BOUND_S)  # the partition node 3 cannot acquire included
    note(f"first ack per partition (s): {sorted(done.items())}")
    assert metric(m3, 'loglake_cluster_leadership_changes_total{change="acquire_failed"}') >= 1
    assert metric(m3, "loglake_cluster_leader_candidate") == 1  # it still reaches the bucket
    assert http_get(m3, "/readyz")[0] == 200
    text = b3.log_text()
    assert 1 <= text.count("could not acquire") <= 3, text[-3000:]  # rate-limited, not per round
    assert "acquiring" not in text
