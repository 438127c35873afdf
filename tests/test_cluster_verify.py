"""`loglake verify --cold-store URL` proves a cluster's bucket as it proves a single node's.

Real etcd, moto's S3 server behind the proxy and a real `loglake serve --cluster` (tests/
clusterkit.py); `loglake verify` runs as a subprocess against the bucket alone (no data dir, no
etcd). Before, it refused: "belongs to a cluster-mode cluster (loglake serve --cluster): not
restorable here". Merged segments are checked like sealed ones (CRCs, index, the hash chain from
one to the next); flush ranges not merged yet against the CRC-32C their commit recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

import clusterkit
import s3kit
from etcdkit import needs_etcd

pytestmark = needs_etcd

RECORDS = 2000
WAIT_S = 60.0


def verify(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loglake.cli.main", "verify", "--cold-store", url, *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def produce(bootstrap: str, topic: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        p.produce(topic, b"value-%06d" % i, partition=i % 2)
    assert p.flush(60) == 0


def wait_report(url: str, done: Any) -> dict[str, Any]:
    """The JSON report, once `done(report)` (the broker merges and publishes in the background)."""
    deadline = time.monotonic() + WAIT_S
    report: dict[str, Any] = {}
    while time.monotonic() < deadline:
        got = verify(url, "--json")
        if got.stdout.strip():
            report = json.loads(got.stdout)
            if done(report):
                return report
        time.sleep(0.5)
    raise AssertionError(f"the bucket never got there: {report}")


def flip_byte(c: clusterkit.Cluster, key_part: str, at: int | None = None) -> str:
    """Flip one byte (at `at`, else in the middle) of the first object whose key holds
    `key_part`; its key."""
    s3 = s3kit.raw_client(c.moto.endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=c.bucket).get("Contents", []) if key_part in o["Key"]]
    assert keys, key_part
    body = bytearray(s3.get_object(Bucket=c.bucket, Key=keys[0])["Body"].read())
    body[len(body) // 2 if at is None else at] ^= 0x40
    s3.put_object(Bucket=c.bucket, Key=keys[0], Body=bytes(body))
    return str(keys[0])


def test_verify_proves_a_clusters_merged_segments_and_finds_a_flipped_byte(tmp_path: Path) -> None:
    env = {"LOGLAKE_CLUSTER_MAINTENANCE_INTERVAL_MS": "500"}  # merge at once
    with clusterkit.running_cluster(tmp_path, brokers=1, broker_env=env) as c:
        c.create_topic("v", 2)
        produce(c.bootstrap, "v")
        url = c.cold_store_url
        report = wait_report(url, lambda r: r["segments_checked"] >= 2)
        assert report["ok"], report
        assert report["partitions"] == 2
        got = verify(url)
        assert got.returncode == 0, got.stderr
        assert got.stdout.startswith("verify ok: "), got.stdout
        key = flip_byte(c, ".seg")
        bad = verify(url)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "verify FAILED" in bad.stderr and key.rsplit("/", 1)[-1] in bad.stderr, bad.stderr


def test_verify_checks_flush_ranges_not_merged_yet(tmp_path: Path) -> None:
    env = {"LOGLAKE_CLUSTER_MAINTENANCE_INTERVAL_MS": str(3_600_000)}  # nothing is merged
    with clusterkit.running_cluster(tmp_path, brokers=1, broker_env=env) as c:
        c.create_topic("v", 2)
        produce(c.bootstrap, "v")
        url = c.cold_store_url
        report = wait_report(url, lambda r: r["bytes_checked"] >= RECORDS * 10)
        assert report["ok"] and report["segments_checked"] == 0, report
        # past the object's 32-byte header: in its first range's first batch (docs/FORMAT.md)
        flip_byte(c, clusterkit.FLUSH_KEY_PART, at=40)
        bad = verify(url)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "CRC-32C mismatch" in bad.stderr, bad.stderr


def test_verify_proves_a_compacted_clusters_bucket(tmp_path: Path) -> None:
    """The leader compacts merged segments (loglake.cluster.compact): the rewritten segments keep
    the hash chain and, below the clean end, no key twice; a flipped byte in one is found."""
    env = {"LOGLAKE_CLUSTER_MAINTENANCE_INTERVAL_MS": "300"}  # merge and compact at once
    config = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"}
    with clusterkit.running_cluster(tmp_path, brokers=1, broker_env=env) as c:
        c.create_topic("kv", 1, config=config)
        p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5})
        for rnd in range(4):  # rounds: several merged segments, compacted as they come
            for i in range(500):
                p.produce("kv", key=b"key-%02d" % (i % 20), value=b"r%d-%04d" % (rnd, i), partition=0)
            assert p.flush(60) == 0
            time.sleep(0.5)
        url = c.cold_store_url
        s3 = s3kit.raw_client(c.moto.endpoint)

        def compacted() -> list[str]:
            """Compacted segments' keys, the newest (the one referenced now) first: a compaction's
            generation is its epoch's, epoch x 1000 + n (a merge's is the epoch); those it
            replaced stay until the sweep's grace has passed."""
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=c.bucket).get("Contents", [])]
            gens = {k: int(k[: -len(".seg")].rsplit("-g", 1)[-1]) for k in keys if k.endswith(".seg") and "-g" in k}
            return sorted((k for k, g in gens.items() if g > 1000), key=lambda k: -gens[k])

        deadline = time.monotonic() + WAIT_S
        while not compacted():
            assert time.monotonic() < deadline, "nothing was compacted"
            time.sleep(0.3)
        report = wait_report(url, lambda r: r["segments_checked"] >= 1 and r["ok"])
        assert report["errors"] == [], report
        got = verify(url)
        assert got.returncode == 0, got.stderr
        key = flip_byte(c, compacted()[0].rsplit("/", 1)[-1])
        bad = verify(url)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "verify FAILED" in bad.stderr and key.rsplit("/", 1)[-1] in bad.stderr, bad.stderr
