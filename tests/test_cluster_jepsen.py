"""A seeded random schedule of the cluster faults under load (make test-long), Jepsen-style: the
clients' history is held to the model of a log at the end (tests/logcheck.py).

Three brokers over a 3-member etcd and moto behind the fault proxy; two idempotent producers
and a consumer group of three run throughout, and beside them, on a topic of their own, two
transactional producers (transactions of a few records over two partitions or more, one in five
aborted on purpose), a read-process-write processor turning their committed records into a
second topic exactly once (send_offsets_to_transaction), and a read_committed reader; their
history is held to Kafka's transactional model (tests/txncheck.py) after a read_committed and a
read_uncommitted read of both topics. For `LOGLAKE_CLUSTER_MINUTES` (default 10) the
schedule draws one fault at a time — kill -9 of a broker (restarted after a while, its data dir
sometimes wiped), SIGSTOP of a broker past its lease, the loss of one etcd member, a bucket
outage of 5-30 s, a graceful restart, one broker's network path to etcd or to the bucket cut
for 3-24 s while its clients still reach it (each broker in a network namespace of its own,
tests/netkit.py) — heals it, and waits until the producers make progress
(records acked, transactions committed) again before the next. The seed comes from `LOGLAKE_CLUSTER_SEED` (default: drawn) and is
printed first and in every failure message, with the schedule as it ran, so a failing run
replays with `LOGLAKE_CLUSTER_SEED=<seed> make test-long` (the faults repeat; the timing of a
shared machine does not).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

import clusterkit
import clusterload
from logcheck import History
from netkit import needs_netns
from test_cluster_faults import BROKER_ARGS, CARRY_ON_S, PARTITIONS, RATE
from txncheck import TxnHistory, check_processed

pytestmark = [pytest.mark.long, needs_netns]

SEED_ENV = "LOGLAKE_CLUSTER_SEED"
MINUTES_ENV = "LOGLAKE_CLUSTER_MINUTES"
#: Records the producers must get acked after each fault is healed before the next is drawn.
PROGRESS = 200
#: Transactions that must commit after each fault is healed before the next is drawn.
TXN_PROGRESS = 3
#: The transactional workload's topic, its partitions and each producer's transactions/s.
TXN_TOPIC = "tx"
#: Where the read-process-write processor writes what it read from TXN_TOPIC.
TXN_SINK = "tx-out"
TXN_PARTITIONS = 3
TXN_RATE = 2.0
#: The broker lease the schedule pauses past (the default; see docs/CLUSTER.md).
LEASE_S = 3.0
#: "cut-etcd" / "cut-bucket": one broker's network path to etcd or to the bucket is cut while its
#: clients still reach it (each broker on a host of its own: tests/netkit.py).
FAULTS = ("kill", "pause", "etcd", "bucket", "restart", "cut-etcd", "cut-bucket")


def run_fault(c: clusterkit.Cluster, rng: random.Random, kind: str) -> str:
    """Inject one fault of `kind`, wait, heal it; returns what was done (for the log)."""
    assert c.proxy is not None
    if kind == "kill":
        b = rng.choice(c.brokers)
        wipe = rng.random() < 0.3
        down = rng.uniform(0.0, 2 * LEASE_S)
        b.kill()
        time.sleep(down)
        b.restart(wipe=wipe)
        return f"kill -9 node {b.node_id}, down {down:.1f} s, restarted{' wiped' if wipe else ''}"
    if kind == "pause":
        b = rng.choice(c.brokers)
        paused = rng.uniform(LEASE_S + 1.0, 3 * LEASE_S)
        b.pause()
        time.sleep(paused)
        b.resume()
        return f"SIGSTOP node {b.node_id} for {paused:.1f} s"
    if kind == "etcd":
        i = rng.randrange(len(c.etcd.members))
        down = rng.uniform(3.0, 15.0)
        c.etcd.stop_member(i)
        time.sleep(down)
        c.etcd.start_member(i)
        return f"etcd member {i} down {down:.1f} s"
    if kind in ("cut-etcd", "cut-bucket"):
        b = rng.choice(c.brokers)
        service = kind.removeprefix("cut-")
        down = rng.uniform(LEASE_S, 8 * LEASE_S)
        assert b.host is not None
        b.host.cut(service)
        time.sleep(down)
        b.host.heal(service)
        return f"node {b.node_id} cut off from {service} for {down:.1f} s"
    if kind == "bucket":
        down = rng.uniform(5.0, 30.0)
        hole = c.proxy.blackhole()
        time.sleep(down)
        c.proxy.heal(hole)
        return f"bucket unreachable {down:.1f} s"
    b = rng.choice(c.brokers)
    b.restart()
    return f"graceful restart of node {b.node_id}"


#: The schedule's length unless LOGLAKE_CLUSTER_MINUTES says otherwise (the issue asks for >= 10).
DEFAULT_MINUTES = 10.0
#: The schedule, plus the cluster's start, the last fault's heal and the checker's reads (the
#: suite's 300 s timeout would end a 10-minute schedule half way).
TIMEOUT_S = float(os.environ.get(MINUTES_ENV) or DEFAULT_MINUTES) * 60 + 600


@pytest.mark.timeout(TIMEOUT_S)
def test_random_fault_schedule(tmp_path: Path) -> None:
    seed = int(os.environ.get(SEED_ENV) or random.randrange(2**32))
    minutes = float(os.environ.get(MINUTES_ENV) or DEFAULT_MINUTES)
    print(f"cluster fault schedule: {SEED_ENV}={seed} {MINUTES_ENV}={minutes}", flush=True)
    rng = random.Random(seed)
    ran: list[str] = []

    def context() -> str:
        return f"{SEED_ENV}={seed}; schedule so far: {ran}"

    with clusterkit.running_cluster(
        tmp_path, brokers=3, etcd_members=3, broker_args=BROKER_ARGS, netns=True
    ) as c:
        c.create_topic("t", PARTITIONS)
        c.create_topic(TXN_TOPIC, TXN_PARTITIONS)
        c.create_topic(TXN_SINK, TXN_PARTITIONS)
        h = History()
        th, sink = TxnHistory(TXN_TOPIC), TxnHistory(TXN_SINK)
        with (
            clusterload.Load(h, c.bootstrap, "t", producers=2, consumers=3, rate=RATE) as load,
            clusterload.TxnLoad(
                th, c.bootstrap, TXN_TOPIC, TXN_PARTITIONS, rate=TXN_RATE, seed=seed, sink=sink
            ) as txns,
        ):
            load.wait_acked(PROGRESS, CARRY_ON_S)
            txns.wait_committed(TXN_PROGRESS, CARRY_ON_S)
            end = time.monotonic() + minutes * 60
            while time.monotonic() < end:
                kind = rng.choice(FAULTS)
                started = time.monotonic()
                try:
                    what = run_fault(c, rng, kind)
                    ran.append(f"{started - end + minutes * 60:.0f}s {what}")
                    load.wait_acked(PROGRESS, CARRY_ON_S)
                    txns.wait_committed(TXN_PROGRESS, CARRY_ON_S)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; {context()}") from exc
                time.sleep(rng.uniform(1.0, 5.0))
            try:
                load.stop_producers()
                txns.stop()
                load.drain_consumers(CARRY_ON_S)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; {context()}") from exc
            clients = [*txns.producers, *txns.processors]
            client_notes = {t.name: (len(t.errors), t.errors[-3:]) for t in clients}
            hung = sum(t.hung for t in txns.processors)
        c.wait_leaders("t", PARTITIONS, CARRY_ON_S)
        c.wait_leaders(TXN_TOPIC, TXN_PARTITIONS, CARRY_ON_S)
        c.wait_leaders(TXN_SINK, TXN_PARTITIONS, CARRY_ON_S)
        clusterload.final_read(h, c.bootstrap, "t", PARTITIONS)
        clusterload.final_txn_read(th, c.bootstrap, TXN_PARTITIONS)
        clusterload.final_txn_read(sink, c.bootstrap, TXN_PARTITIONS)
        offsets = clusterload.group_offsets(c.bootstrap, clusterload.PROCESS_GROUP, TXN_TOPIC, TXN_PARTITIONS)
    rep = h.check()
    txn_rep, sink_rep, eo_rep = th.check(), sink.check(), check_processed(th, sink, offsets)
    print(
        f"{len(ran)} faults: {ran}\n{rep}\ntransactions: {txn_rep}\nread-process-write: {sink_rep}\n"
        f"exactly once (group offsets {offsets}): {eo_rep}\ntransactional clients' errors (count, last): {client_notes}\n"
        f"send_offsets_to_transaction hung (librdkafka #5456/#5511; producer replaced): {hung}",
        flush=True,
    )
    assert rep.ok, f"{rep}\n{context()}"
    assert txn_rep.ok, f"transactions: {txn_rep}\n{context()}"
    assert sink_rep.ok, f"read-process-write transactions: {sink_rep}\n{context()}"
    assert eo_rep.ok, f"read-process-write exactly once: {eo_rep}\n{context()}"
    assert sink_rep.stats.get("txn_committed", 0) > 0, context()
    assert rep.stats.get("acked", 0) >= PROGRESS * (len(ran) + 1), context()
    assert txn_rep.stats.get("txn_committed", 0) >= TXN_PROGRESS * (len(ran) + 1), context()
