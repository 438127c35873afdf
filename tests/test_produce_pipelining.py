"""Produce requests of one connection stay pipelined while earlier ones wait for durability.

In cluster mode an acknowledgement waits for the object flush (`object_flush_ms`). A producer that
sends a small request per millisecond to one partition (librdkafka with linger.ms 1) has hundreds
in flight on one connection. The regression: the broker read at most `max_inflight_per_connection`
(64) requests of a connection and then stopped until the oldest was answered, so one partition got
64 requests per flush — 20,000 records/s of 100 B were acknowledged at p50 11 s (benchmarks/
cluster.py, section "partitions"). Produce requests are now bounded by their bytes and
PRODUCE_INFLIGHT_PER_CONNECTION; the other requests keep the count bound (their answers may be
far larger than they are).

Real etcd, moto's S3 server behind the counting proxy and a real `loglake serve --cluster`
(tests/clusterkit.py); the client is a raw socket that sends every request before it reads.
"""

from __future__ import annotations

import time
from pathlib import Path

from kafka.protocol.metadata import MetadataRequest

import clusterkit
from etcdkit import needs_etcd
from test_broker_malformed import RawClient
from test_overload import produce_request

pytestmark = needs_etcd

#: Requests pipelined on one connection: five times the count bound of other requests.
REQUESTS = 320
#: Long enough that the requests all arrive within one flush window, even on a loaded machine.
FLUSH_MS = 3000


def test_produce_requests_beyond_the_inflight_count_land_in_one_flush(tmp_path: Path) -> None:
    args = ["--object-flush-ms", str(FLUSH_MS)]
    with clusterkit.running_cluster(tmp_path, brokers=1, broker_args=args) as c:
        c.create_topic("hot", 1)
        assert c.proxy is not None
        with RawClient(c.bootstrap, timeout=60.0) as client:
            client.request(MetadataRequest[1](topics=["hot"]))
            before = c.put_counts()["flush"]
            started = time.monotonic()
            sent = [client.send(produce_request("hot", 100, 1)) for _ in range(REQUESTS)]
            answers = [client.receive() for _ in sent]
            took = time.monotonic() - started
        flushes = c.put_counts()["flush"] - before
    assert [corr for corr, _ in answers] == sent  # in request order
    offsets = []
    for _, response in answers:
        part = response.responses[0].partition_responses[0]
        assert part.error_code == 0
        offsets.append(part.base_offset)
    assert offsets == list(range(offsets[0], offsets[0] + REQUESTS))
    # One flush window holds them all (two if the window closed while they arrived); at 64 per
    # flush they needed five, one after the other.
    assert flushes <= 2, f"{REQUESTS} pipelined produce requests took {flushes} flushes ({took:.1f} s)"
