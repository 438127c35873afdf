"""Overload bounds (loglake.broker.overload; the 60 s run is tests/test_long_overload.py).

* `produce_throttle_ms`: 0 while memory is plentiful, growing with pool pressure, at least the
  time an append waited, at least the minimum while the request-bytes bound is spent;
* `RequestBytes`: readers wait while the bound is spent and go on once bytes are released;
* the real broker: a Produce while the memory pool is under pressure is answered with
  throttle_time_ms > 0 (kafka-python sees it), every record acknowledged is read back, the
  request-bytes gauge is back to 0 once the clients are gone, and a connection over
  max_connections is closed at once with one log line;
* `queued_max_request_bytes` is range-checked and `--print-config` names the RSS budget.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from loglake.broker.config import BrokerConfig
from loglake.broker.overload import (
    THROTTLE_MS_MAX,
    THROTTLE_MS_MIN,
    RequestBytes,
    produce_throttle_ms,
    rss_budget,
)
from loglake.errors import ConfigError
from loglake.records import build_batch

from brokerkit import free_port, serving_broker

MIB = 1024 * 1024


def pool(used: int, budget: int = 100, pressure: int = 75) -> SimpleNamespace:
    return SimpleNamespace(used_bytes=used, budget_bytes=budget, pressure_bytes=pressure)


def test_throttle_is_zero_until_pressure_then_grows_to_the_max() -> None:
    gate = RequestBytes(10)
    assert produce_throttle_ms(pool(0), 0.0, gate) == 0
    assert produce_throttle_ms(pool(74), 0.0, gate) == 0
    assert produce_throttle_ms(pool(75), 0.0, gate) == THROTTLE_MS_MIN
    assert THROTTLE_MS_MIN < produce_throttle_ms(pool(90), 0.0, gate) < THROTTLE_MS_MAX
    assert produce_throttle_ms(pool(100), 0.0, gate) == THROTTLE_MS_MAX
    assert produce_throttle_ms(pool(0), 0.2, gate) == 200  # waited for memory: at least that long
    assert produce_throttle_ms(pool(0), 30.0, gate) == THROTTLE_MS_MAX
    gate.add(10)
    assert produce_throttle_ms(pool(0), 0.0, gate) == THROTTLE_MS_MIN  # request bytes spent


def test_request_bytes_pause_readers_until_released() -> None:
    async def main() -> None:
        gate = RequestBytes(100)
        await asyncio.wait_for(gate.wait_for_room(), 1)  # room: at once
        gate.add(100)
        waiters = [asyncio.ensure_future(gate.wait_for_room()) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiters) and gate.paused == 3 and gate.pauses == 3
        gate.add(-1)
        await asyncio.wait_for(asyncio.gather(*waiters), 1)
        assert gate.paused == 0 and gate.used == 99

    asyncio.run(main())


def test_queued_max_request_bytes_is_range_checked_and_print_config_names_the_budget(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="queued_max_request_bytes"):
        BrokerConfig.load(env={"LOGLAKE_QUEUED_MAX_REQUEST_BYTES": "1000"})
    config = BrokerConfig.load(env={"LOGLAKE_MAX_CONNECTIONS": "100", "LOGLAKE_QUEUED_MAX_REQUEST_BYTES": str(8 * MIB)})
    budget = rss_budget(config)
    assert budget.queued_requests == 8 * MIB and budget.total > budget.memory_pool + budget.connections
    out = subprocess.run(
        [sys.executable, "-m", "loglake.cli.main", "serve", "--data-dir", str(tmp_path / "d"), "--print-config"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "LOGLAKE_MAX_CONNECTIONS": "100", "LOGLAKE_QUEUED_MAX_REQUEST_BYTES": str(8 * MIB)},
    ).stdout
    assert f"# rss budget: {budget.total // MIB} MiB" in out or f"# rss budget: {round(budget.total / MIB)} MiB" in out


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        name: float(value)
        for line in text.splitlines()
        if line and not line.startswith("#") and "{" not in line
        for name, _, value in [line.partition(" ")]
    }


def produce_request(topic: str, value_bytes: int, count: int) -> ProduceRequest:
    now = int(time.time() * 1000)
    batch = build_batch([(now, None, b"v" * value_bytes, [])] * count)
    P = ProduceRequest.TopicProduceData
    return ProduceRequest[9](
        transactional_id=None, acks=-1, timeout_ms=30_000,
        topic_data=[P(name=topic, partition_data=[P.PartitionProduceData(index=0, records=batch)])],
    )


def two_partition_produce(topic: str, value_bytes: int) -> ProduceRequest:
    now = int(time.time() * 1000)
    P = ProduceRequest.TopicProduceData
    parts = [P.PartitionProduceData(index=i, records=build_batch([(now, None, b"v" * value_bytes, [])])) for i in (0, 1)]
    return ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[P(name=topic, partition_data=parts)])


def test_produce_under_memory_pressure_is_throttled_and_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    from test_broker_malformed import RawClient

    metrics_port = free_port()
    env = {"LOGLAKE_MEMORY_BUDGET_BYTES": str(8 * MIB), "LOGLAKE_MAX_CONNECTIONS": "3"}
    with serving_broker(tmp_path / "data", ["--metrics-listen", f"127.0.0.1:{metrics_port}"], env=env) as b:
        throttles = []
        acked: list[int] = []
        with RawClient(b.bootstrap) as c:
            c.request(MetadataRequest[1](topics=["t"]))  # auto-creates it
            # 0.5 MiB batches into one partition of an 8 MiB pool: its pressure mark (6 MiB) is
            # crossed long before a segment (64 MiB) is due, so emergency seals keep it busy.
            for _ in range(40):
                resp = c.request(produce_request("t", 1000, 500))
                part = resp.responses[0].partition_responses[0]
                error, offset = part.error_code, part.base_offset
                assert error in (0, 7), error  # NONE, or REQUEST_TIMED_OUT (retriable)
                if error == 0:
                    acked.extend(range(offset, offset + 500))
                throttles.append(resp.throttle_time_ms)
            # max_connections=3: with this one open, two more fit; the fourth is closed at once
            extra = [socket.create_connection(("127.0.0.1", b.port)) for _ in range(3)]
            try:
                time.sleep(0.3)
                closed = 0
                for s in extra:
                    s.settimeout(5)
                    try:
                        closed += s.recv(1) == b""
                    except (TimeoutError, OSError):
                        pass
                assert closed == 1, closed
            finally:
                for s in extra:
                    s.close()
        assert max(throttles) > 0, throttles
        metrics = scrape(metrics_port)
        assert metrics["loglake_produce_throttled_total"] >= 1
        assert metrics["loglake_connections_rejected_total"] == 1
        deadline = time.monotonic() + 5
        while scrape(metrics_port)["loglake_request_queue_bytes"] != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert scrape(metrics_port)["loglake_request_queue_bytes"] == 0
        assert scrape(metrics_port)["loglake_rss_budget_bytes"] > 0
        consumer = KafkaConsumer(bootstrap_servers=b.bootstrap, consumer_timeout_ms=5000, auto_offset_reset="earliest")
        consumer.assign([TopicPartition("t", 0)])
        offsets = [m.offset for m in consumer]
        consumer.close()
        assert offsets == list(range(len(offsets))) and set(acked) <= set(offsets) and acked
    assert b.log_text().count("refusing connection") == 1


def test_request_bytes_bound_pauses_reading_and_a_frame_in_progress_finishes(tmp_path: Path) -> None:
    """queued_max_request_bytes = 1 MiB on the real broker. A sends the first half of a 1.2 MB
    Produce and B the first half of another: A reserves its whole frame, which spends the bound,
    so B's chunk and C's ApiVersions are held undecoded and nothing more is read from them. A's second half is read anyway (a frame in
    progress finishes), A is answered, and then B and C are too; the gauge returns to 0."""
    from test_broker_malformed import RawClient

    metrics_port = free_port()
    env = {"LOGLAKE_QUEUED_MAX_REQUEST_BYTES": str(MIB)}
    args = ["--metrics-listen", f"127.0.0.1:{metrics_port}", "--default-partitions", "2"]
    with serving_broker(tmp_path / "data", args, env=env) as b:
        with RawClient(b.bootstrap) as a, RawClient(b.bootstrap) as bb, RawClient(b.bootstrap) as c:
            a.request(MetadataRequest[1](topics=["t"]))  # auto-creates it
            frames = []
            for client in (a, bb):
                client.proto.send_request(two_partition_produce("t", 600_000))  # a frame over 1 MiB
                frames.append(client.proto.send_bytes())
            half = len(frames[0]) // 2
            a.sock.sendall(frames[0][:half])
            time.sleep(0.5)
            bb.sock.sendall(frames[1][:half])
            time.sleep(0.5)
            c.proto.send_request(ApiVersionsRequest[0]())
            c.sock.sendall(c.proto.send_bytes())
            time.sleep(0.5)
            paused = scrape(metrics_port)
            assert paused["loglake_request_read_paused_connections"] == 2, str({k: v for k, v in paused.items() if "request_" in k or "bytes_" in k})
            assert paused["loglake_request_queue_bytes"] >= MIB
            c.sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                c.sock.recv(1)  # not read, so not answered
            c.sock.settimeout(10)
            bb.sock.sendall(frames[1][half:])
            a.sock.sendall(frames[0][half:])
            for client in (a, bb):
                _corr, resp = client.receive()
                assert [p.error_code for p in resp.responses[0].partition_responses] == [0, 0]
            _corr, versions = c.receive()
            assert versions.error_code == 0
        deadline = time.monotonic() + 5
        while scrape(metrics_port)["loglake_request_queue_bytes"] != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        after = scrape(metrics_port)
        assert after["loglake_request_queue_bytes"] == 0 and after["loglake_request_read_paused_connections"] == 0
        assert after["loglake_request_read_pauses_total"] >= 2
