"""A cluster engine whose bucket is slower than its producers: appends wait for room in the flush
buffer and all get in — nothing deadlocks, nothing times out.

Real etcd (tests/etcdkit.py), moto behind the fault proxy (tests/s3kit.py) holding every PUT back.
The regression: an append waited for flush-buffer room while holding its partition's lock, and
the flusher's thread, settling the previous flush, waited for that same lock in the appends'
completion callback — so room never came and producers got BackPressureTimeoutError (seen as
"Local: Message timed out" from the broker benchmark's 1 KiB cluster runs).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

import etcdkit
import s3kit
from etcdkit import EtcdCluster, needs_etcd
from loglake.cluster.flusher import FlushSettings
from loglake.cluster.node import cluster_parts
from loglake.cluster.shared_log import ClusterSettings
from loglake.engine.config import EngineConfig
from loglake.engine.engine import Engine
from loglake.engine.types import AppendResult
from loglake.records.batch import build_batch

pytestmark = needs_etcd
etcd1 = etcdkit.etcd1
moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket
fault_proxy = s3kit.fault_proxy
_proxy_server = s3kit._proxy_server

VALUE = b"v" * 1000
ONE = len(build_batch([(0, None, VALUE, [])]))  # one record of 1 KiB in a batch
PRODUCERS, BATCHES = 6, 8
WAIT_S = 60.0


@pytest.fixture
def engine(
    tmp_path: Path, etcd1: EtcdCluster, bucket: str, fault_proxy: s3kit.FaultProxy
) -> Iterator[Engine]:
    settings = ClusterSettings(
        f"etcd://{etcd1.endpoints[0]}/bp-{uuid.uuid4().hex[:8]}",
        1,
        # room for four batches; a flush at two; each PUT held back (below)
        flush=FlushSettings(
            object_flush_bytes=2 * ONE, object_flush_ms=10, buffer_bytes_max=4 * ONE, append_wait_s=WAIT_S
        ),
    )
    store = s3kit.make_store(fault_proxy.endpoint, bucket)
    e = Engine(
        str(tmp_path),
        EngineConfig(),
        parts=cluster_parts(str(tmp_path), EngineConfig(), settings, store=store),
    )
    e.open()
    e.join(["PLAINTEXT://127.0.0.1:9"])  # registers: the balancer gives this only broker every partition
    yield e
    e.close()


def test_appends_to_one_partition_wait_for_a_slow_bucket_and_all_get_in(
    engine: Engine, fault_proxy: s3kit.FaultProxy
) -> None:
    engine.create_topic("t", 1)
    deadline = time.monotonic() + WAIT_S
    while engine.view.leader_of(engine.catalog.topic("t").topic_id, 0) != 1:
        assert time.monotonic() < deadline, "the only broker never led t-0"
        time.sleep(0.05)
    fault_proxy.delay(0.2, method="PUT")  # the bucket: slower than the producers below
    results: list[Future[AppendResult]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce() -> None:
        try:
            for _ in range(BATCHES):
                f = engine.append_batch("t", 0, build_batch([(0, None, VALUE, [])]))
                with lock:
                    results.append(f)
        except BaseException as exc:  # reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=produce, daemon=True) for _ in range(PRODUCERS)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads), "appends stuck waiting for flush-buffer room"
    assert errors == []
    offsets = sorted(f.result(WAIT_S).base_offset for f in results)
    assert offsets == list(range(PRODUCERS * BATCHES))
    # well under the wait bound: room came from each flush, not from a timeout
    assert time.monotonic() - start < WAIT_S / 2
    assert engine.memory_pool.waits > 0, "the buffer never filled: the test did not test back-pressure"
    assert engine.memory_pool.used_bytes == 0
