"""The cluster harness's own parts that do not need a broker: etcd, moto's server in its own
process, and the fault proxy's blackhole (the bucket outage of the cluster fault tests)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import clusterkit
import s3kit
from loglake.errors import LoglakeError
from loglake.store.retry import RetryPolicy


def test_harness_without_brokers_and_a_bucket_outage(tmp_path: Path) -> None:
    with clusterkit.running_cluster(tmp_path, brokers=0) as c:
        assert c.etcd.members[0].healthy()
        assert c.proxy is not None
        assert c.etcd_url.startswith("etcd://127.0.0.1:") and c.etcd_url.endswith(c.prefix)
        store = s3kit.make_store(
            c.proxy.endpoint, c.bucket, "data", retry=RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02),
            read_timeout=0.5,
        )  # fmt: skip
        store.put("a/flush/1/s/0.lfo", [b"one"])
        store.put("a/seg/0.seg", [b"two"])
        assert c.put_counts() == {"flush": 1, "other": 1}

        hole = c.proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(LoglakeError):
            store.put("a/flush/1/s/1.lfo", [b"lost in the hole"])
        assert time.monotonic() - started >= 0.5  # it hung until the read timeout, unanswered
        assert [s.fault for s in c.proxy.requests("PUT")][-1] == "blackhole"
        c.proxy.heal(hole)

        # moto kept everything across the outage; the store works again.
        assert store.get("a/flush/1/s/0.lfo") == b"one"
        store.put("a/flush/1/s/2.lfo", [b"three"])
        assert store.get("a/flush/1/s/2.lfo") == b"three"


def test_blackhole_for_a_while_ends_by_itself(tmp_path: Path) -> None:
    with clusterkit.running_cluster(tmp_path, brokers=0) as c:
        assert c.proxy is not None
        store = s3kit.make_store(c.proxy.endpoint, c.bucket, "", read_timeout=5.0)
        c.proxy.blackhole(seconds=1.0)
        started = time.monotonic()
        store.put("k", [b"x"])  # held ~1 s, hung up on unanswered, then the store's retry lands
        assert 0.9 <= time.monotonic() - started < 5.0
        assert [s.fault for s in c.proxy.requests("PUT")][-2:] == ["blackhole", None]
        assert store.get("k") == b"x"


def test_stop_ends_every_process(tmp_path: Path) -> None:
    c = clusterkit.Cluster(tmp_path, brokers=0)
    c.start()
    procs = [m.proc for m in c.etcd.members] + [c.moto.proc]
    c.stop()
    assert all(p is not None and p.poll() is not None for p in procs)
