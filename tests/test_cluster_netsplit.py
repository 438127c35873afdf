"""Network partitions: a broker cut off from etcd, or from the bucket, while its clients still
reach it (issue "Cluster mode at parity").

Each broker runs on a host of its own (a network namespace, tests/netkit.py); the cut is a
blackhole route for one service's address inside the broker's namespace, so the broker's
packets to etcd (or the S3 proxy) vanish as in a real partition while producers and consumers
still talk to it. Two idempotent producers and a consumer group run throughout (tests/
clusterload.py); the history is held to the model of a log at the end (tests/logcheck.py):
nothing acknowledged is lost or duplicated, no offset is acknowledged twice — which is what two
brokers acknowledging one partition in overlapping leadership epochs would produce.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import clusterkit
import clusterload
from etcdkit import needs_etcd
from logcheck import History
from netkit import needs_netns
from test_cluster_faults import AFTER, BEFORE, BROKER_ARGS, CARRY_ON_S, PARTITIONS, RATE, finish, note

pytestmark = [needs_etcd, needs_netns]

#: How long a cut lasts: several leases (3 s), so the cut broker's lease runs out while its
#: clients are still connected to it.
CUT_S = 20.0
#: By then the cut broker's partitions are led by others (the lease for an etcd cut; the
#: default `cluster_unreachable_release_ms` of 5 s for a bucket cut; then the clients' next
#: Metadata), and every partition is acknowledged again until the cut heals.
MOVED_S = 12.0


def busiest(c: clusterkit.Cluster, topic: str) -> clusterkit.ClusterBroker:
    leaders = list(c.leaders(topic).values())
    return c.by_node(max(set(leaders), key=leaders.count))


@pytest.mark.parametrize("service", ["etcd", "bucket"])
def test_a_broker_cut_off_from_a_service_loses_nothing_acknowledged(tmp_path: Path, service: str) -> None:
    with clusterkit.running_cluster(tmp_path, brokers=3, broker_args=BROKER_ARGS, netns=True) as c:
        c.create_topic("t", PARTITIONS)
        h = History()
        with clusterload.Load(h, c.bootstrap, "t", producers=2, consumers=3, rate=RATE) as load:
            load.wait_acked(BEFORE, CARRY_ON_S)
            victim = busiest(c, "t")
            assert victim.host is not None
            note(f"cut node {victim.node_id} off from {service}")
            victim.host.cut(service)
            cut_at = time.monotonic()
            # The clients carry on through the other brokers while the cut lasts.
            load.wait_acked(AFTER, CARRY_ON_S)
            time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
            healed_at = time.monotonic()
            note(f"heal node {victim.node_id}'s path to {service}")
            victim.host.heal(service)
            acked = load.partitions_acked(cut_at + MOVED_S, healed_at)
            assert acked == set(range(PARTITIONS)), (
                f"partitions acknowledged from {MOVED_S} s into the cut to its end: {sorted(acked)}"
            )
            load.wait_acked(AFTER, CARRY_ON_S)
            assert victim.alive(), victim.log_text()[-3000:]
            # every partition is led by a live broker again, and written through
            c.wait_leaders("t", PARTITIONS, CARRY_ON_S)
            finish(c, h, load)
