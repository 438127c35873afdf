"""Operating the real broker: /metrics parsed whole by prometheus-client under hostile label values,
request errors by Kafka error name, the advertised address of a wildcard listener, and warnings a
client can repeat at will rate-limited (with HTTP and TLS clients on the Kafka port diagnosed)."""

from __future__ import annotations

import re
import socket
import struct
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import ProduceRequest
from prometheus_client.parser import text_string_to_metric_families

from loglake.broker.listeners import canonical_host_name
from loglake.records import build_batch
from test_broker_malformed import RawClient

from brokerkit import InProcessBroker, free_port, serving_broker, serving_in_process

#: A consumer group id with everything the text format must escape, and non-ASCII.
HOSTILE_GROUP = 'g "quoted" back\\slash\nnew line ü€ 日本'
#: Every character class Kafka allows in a topic name ([a-zA-Z0-9._-]).
TOPIC = "Ops.metrics_topic-9"
SMALL_TOPIC = "ops-small"
SMALL_MAX_MESSAGE_BYTES = 2000


def scrape(url: str) -> tuple[dict[str, Any], str]:
    """The families of the whole /metrics page (the parser raises on anything malformed) and its text."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}, text


def samples(families: dict[str, Any], family: str, name: str | None = None) -> list[Any]:
    return [s for s in families[family].samples if name is None or s.name == name]


@pytest.fixture(scope="module")
def metrics_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    port = free_port()
    with serving_in_process(tmp_path_factory.mktemp("obs") / "data", ["--metrics-listen", f"127.0.0.1:{port}"]) as b:
        b.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
        yield b


def test_metrics_page_parses_with_hostile_labels_and_counts_errors_by_name(metrics_broker: InProcessBroker) -> None:
    b = metrics_broker
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    futures = admin.create_topics(
        [NewTopic(TOPIC, 1), NewTopic(SMALL_TOPIC, 1, config={"max.message.bytes": str(SMALL_MAX_MESSAGE_BYTES)})]
    )
    for fut in futures.values():
        fut.result(timeout=30)

    # A good produce, and one the broker refuses (over the topic's max.message.bytes).
    results: list[Any] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "message.max.bytes": 1_000_000, "linger.ms": 0, "retries": 0})
    for _ in range(5):
        p.produce(TOPIC, b"v" * 10, on_delivery=lambda err, _msg: results.append(err))
    p.flush(30)
    p.produce(SMALL_TOPIC, b"x" * 50_000, on_delivery=lambda err, _msg: results.append(err))
    p.flush(30)
    assert results[:5] == [None] * 5
    assert results[5] is not None, "the oversized record was accepted"
    # A produce to a partition that does not exist (no client sends one: raw) fails as Kafka's would.
    P = ProduceRequest.TopicProduceData
    request = ProduceRequest[9](
        transactional_id=None, acks=-1, timeout_ms=10_000,
        topic_data=[P(name=TOPIC, partition_data=[P.PartitionProduceData(index=7, records=build_batch([(0, b"k", b"v", [])]))])],
    )
    with RawClient(b.bootstrap) as raw:
        response = raw.request(request)
    assert response.responses[0].partition_responses[0].error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION

    # Committed offsets of a group with a hostile id: the lag metric carries it as a label.
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": HOSTILE_GROUP, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(TOPIC, 0, 2)], asynchronous=False)
    finally:
        c.close()

    families, text = scrape(b.metrics_url)  # type: ignore[attr-defined]
    # Every family has HELP and TYPE, and is written in one piece.
    for name in families:
        family_name = name + "_total" if families[name].type == "counter" else name
        assert f"# HELP {family_name} " in text, name
        assert f"# TYPE {family_name} " in text, name
        assert families[name].documentation, name
        assert families[name].type != "unknown", name
    seen: list[str] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            seen.append(line.split()[2])
    assert len(seen) == len(set(seen)) == len(families)

    lag = {(s.labels["group"], s.labels["topic"], s.labels["partition"]): s.value for s in samples(families, "loglake_consumer_group_lag")}
    assert lag[(HOSTILE_GROUP, TOPIC, "0")] == 3  # 5 records, committed offset 2

    hw = {(s.labels["topic"], s.labels["partition"]): s.value for s in samples(families, "loglake_partition_high_watermark")}
    assert hw[(TOPIC, "0")] == 5

    produce = {
        s.labels["error"]: s.value
        for s in samples(families, "loglake_requests", "loglake_requests_total")
        if s.labels["api"] == "Produce"
    }
    assert produce.get("NONE", 0) >= 1, produce
    assert produce.get("MESSAGE_TOO_LARGE", 0) >= 1, produce
    assert produce.get("UNKNOWN_TOPIC_OR_PARTITION", 0) == 1, produce
    assert all(not label.lstrip("-").isdigit() for label in produce), produce
    for s in samples(families, "loglake_requests", "loglake_requests_total"):
        assert re.fullmatch(r"[A-Z_]+", s.labels["error"]), s

    # The names operators' dashboards use are all still there.
    for name in (
        "loglake_request_seconds",
        "loglake_bytes_in",
        "loglake_bytes_out",
        "loglake_connections_open",
        "loglake_connections",
        "loglake_connections_rejected",
        "loglake_protocol_errors",
        "loglake_memory_pool_used_bytes",
        "loglake_memory_pool_budget_bytes",
        "loglake_memory_pool_waits",
        "loglake_wal_fsyncs",
        "loglake_wal_fsync_seconds",
        "loglake_wal_groups",
        "loglake_wal_frames",
        "loglake_wal_spare_rolls",
        "loglake_wal_recycled_rolls",
        "loglake_partition_log_start_offset",
        "loglake_partition_segments",
        "loglake_partition_unsealed_bytes",
        "loglake_partition_dirty_ratio",
        "loglake_cleaner_compactions",
        "loglake_cleaner_last_run_timestamp_seconds",
        "loglake_cleaner_partition_last_compaction_timestamp_seconds",
        "loglake_cleaner_partition_errors",
        "loglake_ready",
    ):
        assert name in families, name
    assert samples(families, "loglake_ready")[0].value == 1
    assert not any(n.endswith("_created") for n in families)


# ---------------------------------------------------------------------------- advertised address


def _advertised(bootstrap: str) -> tuple[str, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    brokers = admin.list_topics(timeout=15).brokers
    assert len(brokers) == 1
    meta = next(iter(brokers.values()))
    return meta.host, meta.port


def test_serve_freezes_its_startup_objects_and_reports_collector_pauses(tmp_path: Path) -> None:
    """`loglake serve` moves what it holds at start out of the cyclic collector's reach (a full
    collection stalls every request) and shows each generation's collections and pauses.

    A broker process: the collector is the process's, an in-process broker leaves it alone."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with serving_broker(tmp_path / "data", ["--metrics-listen", f"127.0.0.1:{port}"]) as b:
        families, _ = scrape(url)
        frozen = samples(families, "loglake_gc_frozen_objects")[0].value
        assert frozen > 10_000, frozen  # modules, engine and config objects: tens of thousands
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for _ in range(20):  # requests allocate: young collections run and are counted
            admin.list_topics(timeout=10)
        families, _ = scrape(url)
    by_gen = {
        name: {s.labels["generation"]: s.value for s in samples(families, family, name)}
        for family, name in (
            ("loglake_gc_collections", "loglake_gc_collections_total"),
            ("loglake_gc_pause_seconds", "loglake_gc_pause_seconds_total"),
            ("loglake_gc_pause_max_seconds", "loglake_gc_pause_max_seconds"),
        )
    }
    counts, total, longest = by_gen.values()
    assert set(counts) == set(total) == set(longest) == {"0", "1", "2"}
    assert counts["0"] >= 1, counts
    assert 0 < longest["0"] <= total["0"], (longest, total)


def test_wildcard_listen_advertises_the_canonical_host_name(tmp_path: Path) -> None:
    with serving_in_process(tmp_path / "data", ["--listen", "0.0.0.0:0", "--allow-unauthenticated-public-listener"]) as b:
        host, port = _advertised(b.bootstrap)
        assert host == canonical_host_name()
        fqdn = socket.getfqdn()
        if not fqdn.startswith("localhost"):
            assert host == fqdn
        assert host not in ("0.0.0.0", "127.0.0.1")
        assert port == b.port
        lines = [line for line in b.log_text().splitlines() if "advertising" in line]
        assert len(lines) == 1 and f"{host}:{port}" in lines[0], lines


def test_advertised_listener_overrides_the_wildcard(tmp_path: Path) -> None:
    args = ["--listen", "0.0.0.0:0", "--advertised-listener", "kafka.example.internal:19092", "--allow-unauthenticated-public-listener"]
    with serving_in_process(tmp_path / "data", args) as b:
        assert _advertised(b.bootstrap) == ("kafka.example.internal", 19092)
        assert "advertising" not in b.log_text()


# ------------------------------------------------------------------------------ rate-limited logs


def _send_and_wait_close(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(data)
            while s.recv(4096):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass


def _wait_for_log(b: InProcessBroker, pattern: str, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in b.log_text().splitlines() if pattern in line]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_oversized_frames_from_many_connections_log_one_line_and_a_summary(tmp_path: Path) -> None:
    connections = 200
    oversized = struct.pack(">i", 200 * 1024 * 1024) + b"\x00" * 64  # a 200 MiB request
    b = InProcessBroker(tmp_path / "data").start()
    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda _i: _send_and_wait_close(b.port, oversized), range(connections)))
        # The broker still serves a well-behaved client.
        assert _advertised(b.bootstrap)[1] == b.port
    finally:
        assert b.stop() == 0
    log = b.log_text()
    assert "Traceback" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if "a request over max_frame_bytes" in line]
    assert len(lines) == 2, lines
    assert "message.max.bytes" in lines[0]
    assert f"({connections - 1} more in the last" in lines[1], lines[1]


def test_http_and_tls_clients_on_the_kafka_port_are_diagnosed(tmp_path: Path) -> None:
    client_hello = bytes.fromhex("16030100f8010000f40303") + b"\x00" * 240
    with serving_in_process(tmp_path / "data") as b:
        for _ in range(3):
            _send_and_wait_close(b.port, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        http = _wait_for_log(b, "looks like an HTTP request")
        assert len(http) == 1, http
        assert "is a web client pointed at the Kafka port?" in http[0]
        _send_and_wait_close(b.port, client_hello)
        tls = _wait_for_log(b, "looks like a TLS handshake")
        assert len(tls) == 1, tls
        assert "the client uses SSL but this listener is PLAINTEXT" in tls[0]
        assert "frame size" not in b.log_text()

