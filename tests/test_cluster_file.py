"""Cluster mode over a shared folder: brokers on one host, `--cold-store file:///...`, real etcd.

docs/CLUSTER.md "One host, every core": N `loglake serve --cluster` processes share etcd and one
local directory, which gives them what a bucket gives (loglake.store.local: whole objects,
create-only merges, durable directory entries). Here two brokers take a real idempotent producer,
one is killed with `kill -9` in the middle, and every acknowledged record is read back exactly
once at its acknowledged offset, from the survivor, while the survivor's merges write ordinary
segments into the same folder.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from clusterkit import running_cluster
from etcdkit import needs_etcd
from test_cluster_serve import read_log

pytestmark = [needs_etcd]

PARTITIONS = 4
RECORDS = 3000
KILL_AT = 1000
WAIT_S = 90.0
#: flags of both brokers: a short lease, so the survivor takes over quickly
BROKER_ARGS = ["--cluster-lease-ttl-s", "2", "--object-flush-ms", "50"]
#: merge and sweep every second rather than every 10 s, so the test sees merged segments
BROKER_ENV = {"LOGLAKE_CLUSTER_MAINTENANCE_INTERVAL_MS": "1000"}


def read_all(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    """Every record of the topic from offset 0, by (partition, offset)."""
    return read_log(bootstrap, topic, PARTITIONS)


def test_two_brokers_over_one_folder_keep_every_acknowledged_record_through_a_kill_9(tmp_path: Path) -> None:
    with running_cluster(
        tmp_path, brokers=2, cold_store="file", broker_args=BROKER_ARGS, broker_env=BROKER_ENV
    ) as cluster:
        assert cluster.cold_store_url == f"file://{tmp_path / 'shared'}"
        cluster.create_topic("orders", PARTITIONS)
        leaders = cluster.wait_leaders("orders", PARTITIONS)
        assert set(leaders.values()) == {1, 2}, leaders  # both brokers lead: both write the folder
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
            }
        )
        acked: dict[tuple[int, int], bytes] = {}
        failed: list[Any] = []

        def done(err: Any, m: Any) -> None:
            if err is not None:
                failed.append(err)
            else:
                assert (m.partition(), m.offset()) not in acked
                acked[(m.partition(), m.offset())] = m.value()

        for i in range(RECORDS):
            producer.produce("orders", value=f"o-{i}".encode(), partition=i % PARTITIONS, on_delivery=done)
            producer.poll(0)
            if i == KILL_AT:
                producer.flush(WAIT_S)
                cluster.by_node(2).kill()  # kill -9: its lease lapses, node 1 takes its partitions
            time.sleep(0.001)
        assert producer.flush(WAIT_S + 30) == 0
        assert not failed, failed[:3]
        assert len(acked) == RECORDS
        assert set(cluster.wait_leaders("orders", PARTITIONS, avoid=2).values()) == {1}

        log = read_all(cluster.bootstrap, "orders")
        assert {k: log.get(k) for k in acked} == acked  # every acknowledged record, at its offset
        assert len(set(log.values())) == len(log), "a record written twice"

        # Both brokers' flush objects are in the one folder; the survivor merges all four
        # partitions into ordinary segments there (create-only puts), and what it serves after
        # the merge is still exactly the acknowledged records.
        shared = tmp_path / "shared"
        flushed = {p.relative_to(shared).parts[2] for p in shared.glob("loglake-*/flush/*/*/*.lfo")}
        assert flushed == {"1", "2"}, flushed
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            merged = {p.parent.name for p in shared.glob("loglake-*/orders-*/*/*.seg")}
            if merged == {str(p) for p in range(PARTITIONS)}:
                break
            time.sleep(0.5)
        assert merged == {str(p) for p in range(PARTITIONS)}, merged
        assert read_all(cluster.bootstrap, "orders") == log
