"""Client quotas against the real broker: confluent-kafka producers and consumers held to their
byte rates while another client id is not slowed, the request quota, DescribeClientQuotas /
AlterClientQuotas over the wire (no maintained AdminClient has them), persistence across a
restart, Kafka's error codes for bad alterations, and `loglake configs` for quotas.

The byte-rate tests run the broker with 2 samples of 1 s (`quota_window_num` 2) instead of
Kafka's 11: a quota window lets a client send what the window allows at once, and a greedy client
repeats that burst each time the sample holding the previous one expires, so a measurement is
within one window's worth of the quota. Over 30 s that is a 3 % error with 1 s of window; with
Kafka's 10 s it would take minutes to tell 10 % apart. The rules are the same either way
(tests/test_quotas.py checks them with Kafka's defaults).
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.parser import KafkaProtocol

from loglake.broker.protocol import request_class
from loglake.cli.remote_raw import build as _build
from loglake.kafka_errors import ErrorCode
from tlskit import make_pki, ssl_args

from brokerkit import InProcessBroker, free_port, serving_in_process

#: The byte-rate quota the throttled clients get (bytes per second).
QUOTA = 128 * 1024
#: Before measuring: the first window's burst is over.
WARMUP_S = 4.0
#: How long rates are measured (long enough that one window's burst is a few percent).
MEASURE_S = 30.0
VALUE = b"q" * 1000
#: An unthrottled client must do at least this many times the quota (it does far more).
UNSLOWED_FACTOR = 4
TIMEOUT_S = 15.0
#: Batch size of the throttled producer: each request costs it a round trip of its quota's time,
#: so fewer, larger requests lose less of it (Kafka's producers behave the same).
PRODUCE_BATCH_BYTES = 64 * 1024
#: Record batch and fetch size of the consumer test.
FETCH_BYTES = 8 * 1024


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    tmp = tmp_path_factory.mktemp("quotas")
    env = {"LOGLAKE_QUOTA_WINDOW_NUM": "2", "LOGLAKE_QUOTA_WINDOW_SIZE_SECONDS": "1"}
    with serving_in_process(tmp / "data", ["--metrics-listen", f"127.0.0.1:{free_port()}"], env=env) as b:
        yield b


def metrics_port(broker: InProcessBroker) -> int:
    return int(broker.extra_args[broker.extra_args.index("--metrics-listen") + 1].rsplit(":", 1)[1])


def scrape(broker: InProcessBroker) -> str:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{metrics_port(broker)}/metrics", timeout=TIMEOUT_S
    ) as resp:
        return str(resp.read().decode())


class RawConnection:
    """One Kafka connection with a client id of our choosing (over TLS with `tls`); one request at a time."""

    def __init__(
        self, broker: InProcessBroker, client_id: str, port: int | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        self.proto = KafkaProtocol(client_id=client_id)
        sock = socket.create_connection(("127.0.0.1", port or broker.port), timeout=TIMEOUT_S)
        self.sock = tls.wrap_socket(sock, server_hostname="localhost") if tls is not None else sock

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        cls = request_class(api_key)
        self.proto.send_request(cls[version](**_build(cls._struct, version, fields)))
        self.sock.sendall(self.proto.send_bytes())
        while True:
            data = self.sock.recv(65536)
            assert data, "broker closed the connection"
            responses = self.proto.receive_bytes(data)
            if responses:
                return responses[0][1]

    def metadata(self) -> Any:
        return self.call(
            3, 12, topics=[], allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )

    def close(self) -> None:
        self.sock.close()


def entity(**parts: str | None) -> list[dict[str, Any]]:
    return [{"entity_type": t.replace("_", "-"), "entity_name": n} for t, n in parts.items()]


def alter(
    broker: InProcessBroker, ents: list[dict[str, Any]], ops: dict[str, float | None], validate_only: bool = False
) -> Any:
    """One AlterClientQuotas entry: value None removes the key."""
    conn = RawConnection(broker, "admin")
    try:
        entry = {
            "entity": ents,
            "ops": [{"key": k, "value": v or 0.0, "remove": v is None} for k, v in ops.items()],
        }
        return conn.call(49, 1, entries=[entry], validate_only=validate_only)
    finally:
        conn.close()


def describe(broker: InProcessBroker, components: list[tuple[str, int, str | None]], strict: bool = False) -> Any:
    conn = RawConnection(broker, "admin")
    try:
        comps = [{"entity_type": t, "match_type": m, "match": n} for t, m, n in components]
        return conn.call(48, 1, components=comps, strict=strict)
    finally:
        conn.close()


def described(resp: Any) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    assert resp.error_code == 0, resp
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
        for entry in resp.entries
    }


def rate_between(deliveries: list[tuple[float, int]], start: float, end: float) -> float:
    return sum(n for t, n in deliveries if start <= t < end) / (end - start)


# ---- byte rates ----------------------------------------------------------------------------------------


def _produce(
    bootstrap: str,
    topic: str,
    client_id: str,
    stop_at: float,
    budget: int | None,
    out: list[tuple[float, int]],
    batch_bytes: int = 32 * 1024,
) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 5,
            "batch.size": batch_bytes,
            "queue.buffering.max.kbytes": 256,
        }
    )

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            out.append((time.monotonic(), len(msg.value())))

    sent = 0
    while time.monotonic() < stop_at and (budget is None or sent < budget):
        try:
            producer.produce(topic, VALUE, on_delivery=delivered)
            sent += len(VALUE)
        except BufferError:
            producer.poll(0.05)
            continue
        producer.poll(0)
    producer.flush(TIMEOUT_S)


def test_producer_is_held_to_its_quota_while_another_client_is_not(broker: InProcessBroker) -> None:
    assert (
        alter(broker, entity(client_id="capped-producer"), {"producer_byte_rate": QUOTA})
        .entries[0]
        .error_code
        == 0
    )
    start = time.monotonic()
    measure_from, stop_at = start + WARMUP_S, start + WARMUP_S + MEASURE_S
    capped: list[tuple[float, int]] = []
    worker = threading.Thread(
        target=_produce,
        args=(
            broker.bootstrap,
            "quota-produce",
            "capped-producer",
            stop_at,
            None,
            capped,
            PRODUCE_BATCH_BYTES,
        ),
    )
    worker.start()
    time.sleep(WARMUP_S + 2)
    free: list[tuple[float, int]] = []  # meanwhile, another client id on the same broker and topic
    budget = UNSLOWED_FACTOR * QUOTA * 10
    began = time.monotonic()
    _produce(broker.bootstrap, "quota-produce", "free-producer", stop_at, budget, free)
    free_rate = sum(n for _, n in free) / (max(t for t, _ in free) - began)
    worker.join()
    rate = rate_between(capped, measure_from, stop_at)
    assert 0.9 * QUOTA <= rate <= 1.1 * QUOTA, f"capped producer ran at {rate / QUOTA:.2f} x its quota"
    assert sum(n for _, n in free) >= budget
    print(f"producer quota {QUOTA} B/s: capped {rate:.0f} B/s ({rate / QUOTA:.3f}), free {free_rate:.0f} B/s")
    assert free_rate > UNSLOWED_FACTOR * QUOTA, (
        f"free producer ran at {free_rate / QUOTA:.2f} x the other's quota"
    )
    text = scrape(broker)
    throttled = [line for line in text.splitlines() if line.startswith("loglake_quota_throttled_total{")]
    assert any('client_id="capped-producer"' in line and not line.endswith(" 0.0") for line in throttled), (
        throttled
    )
    assert not any("free-producer" in line for line in text.splitlines())  # no quota: no sensor, no series


def test_consumer_is_held_to_its_quota_while_another_client_is_not(broker: InProcessBroker) -> None:
    topic = "quota-fetch"
    total = 8 * 1024 * 1024
    loaded: list[tuple[float, int]] = []
    # Small batches, fetched one at a time: Kafka answers a fetch that would go over the quota
    # empty and does not count it, so a consumer loses a little of its quota per throttled fetch,
    # more the larger its fetches are against the quota window (with 1 s of window and 128 KiB
    # fetches it gets half of it; Kafka's consumers have the same).
    _produce(
        broker.bootstrap, topic, "loader", time.monotonic() + 120, total, loaded, batch_bytes=FETCH_BYTES
    )
    total = sum(n for _, n in loaded)
    assert total >= 8 * 1024 * 1024
    assert (
        alter(broker, entity(client_id="capped-consumer"), {"consumer_byte_rate": QUOTA})
        .entries[0]
        .error_code
        == 0
    )

    def consume(client_id: str, stop_at: float, want: int, out: list[tuple[float, int]]) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "client.id": client_id,
                "group.id": client_id,
                "enable.auto.commit": False,
                "fetch.max.bytes": FETCH_BYTES,
                "max.partition.fetch.bytes": FETCH_BYTES,
                "message.max.bytes": FETCH_BYTES,
            }
        )
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = 0
        try:
            while time.monotonic() < stop_at and got < want:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    out.append((time.monotonic(), len(msg.value())))
                    got += len(msg.value())
        finally:
            consumer.close()

    start = time.monotonic()
    measure_from, stop_at = start + WARMUP_S, start + WARMUP_S + MEASURE_S
    capped: list[tuple[float, int]] = []
    worker = threading.Thread(target=consume, args=("capped-consumer", stop_at, total, capped))
    worker.start()
    time.sleep(WARMUP_S + 2)
    free: list[tuple[float, int]] = []
    began = time.monotonic()
    consume("free-consumer", stop_at, total, free)
    worker.join()
    assert sum(n for _, n in free) == total, "the free consumer did not read everything"
    free_rate = total / (max(t for t, _ in free) - began)
    rate = rate_between(capped, measure_from, stop_at)
    assert 0.9 * QUOTA <= rate <= 1.1 * QUOTA, f"capped consumer ran at {rate / QUOTA:.2f} x its quota"
    assert free_rate > UNSLOWED_FACTOR * QUOTA, (
        f"free consumer ran at {free_rate / QUOTA:.2f} x the other's quota"
    )
    print(f"consumer quota {QUOTA} B/s: capped {rate:.0f} B/s ({rate / QUOTA:.3f}), free {free_rate:.0f} B/s")


# ---- request quota, dynamic change, muting ---------------------------------------------------------------


def test_request_percentage_throttles_and_mutes_an_open_connection(broker: InProcessBroker) -> None:
    busy, other = RawConnection(broker, "busy-client"), RawConnection(broker, "other-client")
    try:
        assert busy.metadata().throttle_time_ms == 0
        # Set while the connection is open: its next requests are measured against it.
        assert (
            alter(broker, entity(client_id="busy-client"), {"request_percentage": 0.0001})
            .entries[0]
            .error_code
            == 0
        )
        throttles = [busy.metadata().throttle_time_ms for _ in range(3)]
        assert all(ms > 0 for ms in throttles), throttles
        assert max(throttles) <= 1000  # Kafka bounds a request-quota throttle by one sample window
        # Muted: a request sent at once after a throttled answer is only read once the throttle is over.
        ms = busy.metadata().throttle_time_ms
        sent = time.monotonic()
        busy.metadata()
        assert time.monotonic() - sent >= 0.9 * ms / 1000.0
        assert all(other.metadata().throttle_time_ms == 0 for _ in range(5))  # another client id is not
        assert (
            alter(broker, entity(client_id="busy-client"), {"request_percentage": None}).entries[0].error_code
            == 0
        )
        time.sleep(1.0)  # the mute the last throttled answer set
        assert busy.metadata().throttle_time_ms == 0
    finally:
        busy.close()
        other.close()


def test_user_quota_follows_the_mtls_principal(tmp_path: Path) -> None:
    """A /users quota applies to the user a client certificate maps to, whatever the client id;
    an unauthenticated connection with the same client id is another user and is not slowed."""
    pki = make_pki(tmp_path / "pki")
    args = [
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "SSL://127.0.0.1:0",
        *ssl_args(pki, client_auth="requested"),
        "--allow-everyone-if-no-acl-found",  # quota tests, not ACL tests (client auth turns the default off)
    ]
    with serving_in_process(tmp_path / "data", args) as b:
        user = "CN=alice,OU=eng,O=loglake"  # Kafka's DEFAULT mapping: the subject DN
        assert alter(b, entity(user=user), {"request_percentage": 0.0001}).entries[0].error_code == 0
        tls = ssl.create_default_context(cafile=str(pki.ca))
        tls.load_cert_chain(str(pki.alice.cert), str(pki.alice.key))
        alice = RawConnection(b, "shared-id", port=b.ports[1], tls=tls)
        anonymous = RawConnection(b, "shared-id")
        try:
            assert all(alice.metadata().throttle_time_ms > 0 for _ in range(2))
            assert all(anonymous.metadata().throttle_time_ms == 0 for _ in range(3))
        finally:
            alice.close()
            anonymous.close()


# ---- the admin APIs ----------------------------------------------------------------------------------------


def test_alter_describe_round_trip_persists_across_restart(tmp_path: Path) -> None:
    with serving_in_process(tmp_path / "data") as b:
        assert (
            alter(b, entity(user="alice"), {"producer_byte_rate": 1048576, "request_percentage": 50})
            .entries[0]
            .error_code
            == 0
        )
        assert (
            alter(b, entity(user="alice", client_id=None), {"consumer_byte_rate": 2048}).entries[0].error_code
            == 0
        )
        assert alter(b, entity(client_id=None), {"controller_mutation_rate": 2.5}).entries[0].error_code == 0
        dry = alter(b, entity(user="bob"), {"producer_byte_rate": 1}, validate_only=True)
        assert dry.entries[0].error_code == 0
        # the CLI sets one the way an operator would (kafka-configs' flags)
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "loglake.cli.main",
                "configs",
                "alter",
                "--bootstrap-server",
                b.bootstrap,
                "--entity-type",
                "users",
                "--entity-default",
                "--add-config",
                "producer_byte_rate=4096",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        want = {
            (("user", "alice"),): {"producer_byte_rate": 1048576.0, "request_percentage": 50.0},
            (("client-id", None), ("user", "alice")): {"consumer_byte_rate": 2048.0},
            (("client-id", None),): {"controller_mutation_rate": 2.5},
            (("user", None),): {"producer_byte_rate": 4096.0},
        }
        assert described(describe(b, [])) == want
        b.restart()
        assert described(describe(b, [])) == want
        assert described(describe(b, [("user", 0, "alice")], strict=True)) == {
            (("user", "alice"),): want[(("user", "alice"),)]
        }
        assert set(described(describe(b, [("user", 2, None)]))) == {
            k for k in want if any(t == "user" for t, _ in k)
        }
        assert set(described(describe(b, [("client-id", 1, None)]))) == {
            (("client-id", None), ("user", "alice")),
            (("client-id", None),),
        }
        # removing every key removes the entity
        alter(b, entity(user="alice"), {"producer_byte_rate": None, "request_percentage": None})
        b.restart()
        assert (("user", "alice"),) not in described(describe(b, []))
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "loglake.cli.main",
                "configs",
                "describe",
                "--bootstrap-server",
                b.bootstrap,
                "--entity-type",
                "users",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0 and '"user=<default>"' in cli.stdout, cli.stdout + cli.stderr


BAD_ALTERATIONS = [
    ([], {"producer_byte_rate": 1.0}, "Invalid empty client quota entity"),
    (
        [{"entity_type": "user", "entity_name": "a"}, {"entity_type": "user", "entity_name": "b"}],
        {"producer_byte_rate": 1.0},
        "duplicate entity entry user",
    ),
    (
        [{"entity_type": "topic", "entity_name": "a"}],
        {"producer_byte_rate": 1.0},
        "Unhandled client quota entity type: topic",
    ),
    ([{"entity_type": "user", "entity_name": ""}], {"producer_byte_rate": 1.0}, "Empty user not supported"),
    (entity(user="a"), {"bytes_per_hour": 1.0}, "Invalid configuration key bytes_per_hour"),
    (entity(user="a"), {"producer_byte_rate": 0.0}, "Quota producer_byte_rate must be greater than 0"),
    (entity(user="a"), {"request_percentage": -1.0}, "Quota request_percentage must be greater than 0"),
    (entity(user="a"), {"consumer_byte_rate": 100.5}, "consumer_byte_rate cannot be a fractional value."),
]


def test_malformed_alterations_get_kafkas_error_codes(broker: InProcessBroker) -> None:
    conn = RawConnection(broker, "admin")
    try:
        entries = [
            {"entity": ents, "ops": [{"key": k, "value": v, "remove": False} for k, v in ops.items()]}
            for ents, ops, _ in BAD_ALTERATIONS
        ]
        good = {
            "entity": entity(user="fine"),
            "ops": [{"key": "producer_byte_rate", "value": 10.0, "remove": False}],
        }
        resp = conn.call(49, 0, entries=[*entries, good], validate_only=False)
        for (_, _, message), got in zip(BAD_ALTERATIONS, resp.entries, strict=False):
            assert got.error_code == ErrorCode.INVALID_REQUEST and message in got.error_message, got
        assert resp.entries[-1].error_code == 0  # each entry stands on its own
        bad_filters = [
            ([{"entity_type": "user", "match_type": 0, "match": None}], ErrorCode.INVALID_REQUEST),
            ([{"entity_type": "user", "match_type": 9, "match": None}], ErrorCode.UNSUPPORTED_VERSION),
            ([{"entity_type": "group", "match_type": 2, "match": None}], ErrorCode.UNSUPPORTED_VERSION),
            ([{"entity_type": "user", "match_type": 2, "match": None}] * 2, ErrorCode.INVALID_REQUEST),
        ]
        for comps, code in bad_filters:
            resp = conn.call(48, 0, components=comps, strict=False)
            assert resp.error_code == code and resp.entries is None, resp
        assert conn.metadata().throttle_time_ms == 0  # the connection is still served
    finally:
        conn.close()
    assert described(describe(broker, [("user", 0, "fine")])) == {
        (("user", "fine"),): {"producer_byte_rate": 10.0}
    }
    assert described(describe(broker, [("user", 0, "a")])) == {}


def _create(conn: RawConnection, version: int, name: str, partitions: int) -> Any:
    topic = {"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [], "configs": []}
    return conn.call(19, version, topics=[topic], timeout_ms=10_000, validate_only=False)


def test_controller_mutation_rate_throttles_topic_creation_and_deletion(broker: InProcessBroker) -> None:
    """KIP-599: 0.5 partitions/s with this broker's 2-second window is a bucket of 1 partition. A
    4-partition topic is still admitted (the bucket is not below zero before it) and leaves it
    3 below: 6 s to wait. Until then a strict request (CreateTopics v6+, DeleteTopics v5+) fails
    with THROTTLING_QUOTA_EXCEEDED; an older version is admitted and only throttled; another
    client id is not slowed."""
    rate = {"controller_mutation_rate": 0.5}
    for client in ("mut-new", "mut-old"):
        assert alter(broker, entity(client_id=client), rate).entries[0].error_code == 0
    try:
        new, again, old, other = (RawConnection(broker, c) for c in ("mut-new", "mut-new", "mut-old", "mut-free"))
        first = _create(new, 7, "mut-a", 4)
        assert first.topics[0].error_code == 0
        assert 5000 < first.throttle_time_ms <= 6000, first.throttle_time_ms
        refused = _create(again, 7, "mut-b", 1)  # a new connection: the first one is muted
        assert refused.topics[0].error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED
        assert refused.throttle_time_ms > 0
        fresh = RawConnection(broker, "mut-new")  # `again` is muted until the bucket is back at zero
        gone = fresh.call(20, 6, topics=[{"name": "mut-a", "topic_id": None}], timeout_ms=10_000)
        assert gone.responses[0].error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED
        # permissive (CreateTopics v5): admitted, counted and throttled
        assert _create(old, 5, "mut-c", 4).topics[0].error_code == 0
        late = _create(RawConnection(broker, "mut-old"), 5, "mut-d", 1)
        assert late.topics[0].error_code == 0 and late.throttle_time_ms > 0
        for i in range(3):
            free = _create(other, 7, f"mut-free-{i}", 4)
            assert free.topics[0].error_code == 0 and free.throttle_time_ms == 0
        meta = other.call(3, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        names = {t.name for t in meta.topics}
        for conn in (new, again, old, other, fresh):
            conn.close()
        assert {"mut-a", "mut-c", "mut-d"} <= names and "mut-b" not in names
    finally:
        for client in ("mut-new", "mut-old"):
            alter(broker, entity(client_id=client), {"controller_mutation_rate": None})
