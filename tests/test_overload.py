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
    CONNECTION_FLOOR_BYTES,
    CONNECTION_SHARE_DIVISOR,
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
    gate = RequestBytes(10, 10)
    assert produce_throttle_ms(pool(0), 0.0, gate) == 0
    assert produce_throttle_ms(pool(74), 0.0, gate) == 0
    assert produce_throttle_ms(pool(75), 0.0, gate) == THROTTLE_MS_MIN
    assert THROTTLE_MS_MIN < produce_throttle_ms(pool(90), 0.0, gate) < THROTTLE_MS_MAX
    assert produce_throttle_ms(pool(100), 0.0, gate) == THROTTLE_MS_MAX
    assert produce_throttle_ms(pool(0), 0.2, gate) == 200  # waited for memory: at least that long
    assert produce_throttle_ms(pool(0), 30.0, gate) == THROTTLE_MS_MAX
    gate.connection().add(CONNECTION_FLOOR_BYTES + 10)
    assert produce_throttle_ms(pool(0), 0.0, gate) == THROTTLE_MS_MIN  # request bytes spent


def test_every_connection_keeps_its_floor_however_full_the_bound_is() -> None:
    gate = RequestBytes(MIB, 100 * MIB)
    hog, other = gate.connection(), gate.connection()
    hog.add(CONNECTION_FLOOR_BYTES + gate.share)  # its floor and its whole share
    assert hog.pooled == gate.share and gate.used == gate.share
    assert hog.allowance(0) == 0  # between frames and at its share: not read
    assert other.allowance(0) == CONNECTION_FLOOR_BYTES + gate.share  # the rest is the others'
    for _ in range(CONNECTION_SHARE_DIVISOR - 1):  # spend the bound
        gate.connection().add(CONNECTION_FLOOR_BYTES + gate.share)
    assert gate.full
    assert other.allowance(0) == CONNECTION_FLOOR_BYTES  # its floor still: small requests are read
    other.add(CONNECTION_FLOOR_BYTES)
    assert other.allowance(0) == 0
    other.add(-CONNECTION_FLOOR_BYTES)  # answered
    assert other.held == 0 and gate.full


def test_frames_in_progress_finish_one_at_a_time_under_the_overdraft_lease() -> None:
    async def main() -> None:
        gate = RequestBytes(MIB, 2 * MIB)
        frame = 3 * MIB // 2
        a, b = gate.connection(), gate.connection()
        for c in (a, b):  # each in the middle of a 1.5 MiB frame, at its floor and share
            c.add(CONNECTION_FLOOR_BYTES + gate.share)
        filler = gate.connection()
        filler.add(CONNECTION_FLOOR_BYTES + gate.limit - gate.used)
        assert gate.full and a.allowance(frame - a.held) == 0
        got_a = await asyncio.wait_for(a.room(frame - a.held), 1)  # the lease: at once
        assert a.leased and got_a == frame - a.held  # the rest of its frame, past the bound
        waiting_b = asyncio.ensure_future(b.room(frame - b.held))
        await asyncio.sleep(0.05)
        assert not waiting_b.done() and gate.paused == 1  # B waits for the lease
        a.add(got_a)
        a.frame_done()  # A's frame is complete: the lease goes to B
        got_b = await asyncio.wait_for(waiting_b, 1)
        assert b.leased and not a.leased and gate.leases == 1
        # the overdraft is bounded (one frame in all): B gets what is left of it, not its whole rest
        assert got_b == gate.limit + gate.overdraft - gate.used < frame - b.held
        b.add(got_b)
        assert gate.used == gate.limit + gate.overdraft
        waiting_more = asyncio.ensure_future(b.room(frame - b.held))
        await asyncio.sleep(0.05)
        assert not waiting_more.done()
        a.add(-frame)  # A's request answered: its bytes come back
        assert await asyncio.wait_for(waiting_more, 1) == frame - b.held  # B finishes
        for c in (a, b, filler):
            c.close()
        assert gate.used == 0 and gate.paused == 0

    asyncio.run(main())


def test_a_stalled_reader_does_not_head_the_lease_line() -> None:
    async def main() -> None:
        gate = RequestBytes(MIB, 2 * MIB)
        holder, stalled, waiter = gate.connection(), gate.connection(), gate.connection()
        filler = gate.connection()
        filler.add(CONNECTION_FLOOR_BYTES + gate.limit)
        holder.add(CONNECTION_FLOOR_BYTES)
        assert await holder.room(MIB) > 0 and holder.leased
        stalled.add(CONNECTION_FLOOR_BYTES)
        queued = asyncio.ensure_future(stalled.room(MIB))
        await asyncio.sleep(0.01)
        filler.add(-MIB)  # room again: `stalled` reads without the lease, then waits on its socket
        assert await asyncio.wait_for(queued, 1) > 0 and not stalled.leased
        holder.frame_done()
        waiter.add(CONNECTION_FLOOR_BYTES)
        filler.add(MIB)
        assert await asyncio.wait_for(waiter.room(MIB), 1) > 0 and waiter.leased  # not behind `stalled`

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


def test_the_rss_budget_counts_the_serving_engines_pool() -> None:
    """Cluster mode's pool is its flush buffer (64 MiB), not memory_budget_bytes: the server passes
    the engine's pool budget, the config alone gives memory_budget_bytes."""
    config = BrokerConfig.load(env={"LOGLAKE_MAX_CONNECTIONS": "100"})
    local = rss_budget(config)
    assert local.memory_pool == config.engine_config().memory_budget_bytes
    flush = rss_budget(config, 64 * MIB)
    assert flush.memory_pool == 64 * MIB and local.total - flush.total == local.memory_pool - 64 * MIB


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
    """queued_max_request_bytes = 1 MiB on the real broker (a share of 256 KiB per connection). A
    and B each send the first half of a 1.2 MB Produce: A takes the overdraft lease and reads on,
    B waits for it (not read); C's ApiVersions is answered at once (its floor). Once the second
    halves come, A finishes, the lease goes to B, both are answered; the gauge returns to 0."""
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
            paused = scrape(metrics_port)
            assert paused["loglake_request_read_paused_connections"] == 1, str({k: v for k, v in paused.items() if "request_" in k or "bytes_" in k})
            assert paused["loglake_request_queue_bytes"] > MIB // 2  # A past its share (the lease), B at it
            started = time.monotonic()
            assert c.request(ApiVersionsRequest[0]()).error_code == 0  # answered while B waits
            assert time.monotonic() - started < 2
            bb.sock.sendall(frames[1][half:])
            a.sock.sendall(frames[0][half:])
            for client in (a, bb):
                _corr, resp = client.receive()
                assert [p.error_code for p in resp.responses[0].partition_responses] == [0, 0]
        deadline = time.monotonic() + 5
        while scrape(metrics_port)["loglake_request_queue_bytes"] != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        after = scrape(metrics_port)
        assert after["loglake_request_queue_bytes"] == 0 and after["loglake_request_read_paused_connections"] == 0
        assert after["loglake_request_read_pauses_total"] >= 1 and after["loglake_request_overdraft_leases_total"] >= 2
