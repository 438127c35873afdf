"""Raw sockets against the real broker (in-process): truncated frames, bad size prefixes, unknown APIs
and versions, garbage, idle and many connections.

Every test runs while a well-behaved confluent-kafka producer keeps producing on its own
connection (the `prober` fixture) and ends with a kafka-python produce/consume round trip on a
fresh connection; the broker must still be serving at the end of the module.
"""

from __future__ import annotations

import random
import re
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.protocol.parser import KafkaProtocol

from brokerkit import InProcessBroker, serving_in_process

IDLE_TIMEOUT_MS = 2000
PROBE_TOPIC = "probe"


# ---------------------------------------------------------------------------------------- helpers


def _host_port(bootstrap: str) -> tuple[str, int]:
    host, port = bootstrap.rsplit(":", 1)
    return host, int(port)


class RawClient:
    """One socket speaking the Kafka protocol through kafka-python's (sans-IO) protocol classes."""

    def __init__(self, bootstrap: str, timeout: float = 10.0, client_id: str = "raw-test") -> None:
        self.sock = socket.create_connection(_host_port(bootstrap), timeout=timeout)
        self.proto = KafkaProtocol(client_id=client_id)
        self._ready: deque[tuple[int, Any]] = deque()

    @property
    def local_port(self) -> int:
        return int(self.sock.getsockname()[1])

    def send(self, request: Any, correlation_id: int | None = None) -> int:
        corr = self.proto.send_request(request, correlation_id=correlation_id)
        self.sock.sendall(self.proto.send_bytes())
        return int(corr)

    def receive(self) -> tuple[int, Any]:
        """The next response: (correlation id, decoded response)."""
        while not self._ready:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("broker closed the connection")
            self._ready.extend(self.proto.receive_bytes(data))
        return self._ready.popleft()

    def request(self, request: Any) -> Any:
        corr = self.send(request)
        got_corr, response = self.receive()
        assert got_corr == corr
        return response

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def raw_header(api_key: int, version: int, correlation_id: int, client_id: bytes = b"raw") -> bytes:
    """A v1 request header (non-flexible): key, version, correlation id, client id."""
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def metadata_frame(correlation_id: int = 1) -> bytes:
    """A complete framed Metadata v1 request for all topics, as kafka-python encodes it."""
    proto = KafkaProtocol(client_id="raw-test")
    proto.send_request(MetadataRequest[1](topics=None), correlation_id=correlation_id)
    return bytes(proto.send_bytes())


def wait_closed(sock: socket.socket, timeout: float) -> float:
    """Read until the broker closes `sock`; seconds it took. Fails if it stays open."""
    sock.settimeout(timeout)
    started = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"broker kept the connection open for {timeout} s")
    return time.monotonic() - started


def wait_for_log(broker: InProcessBroker, needle: str, timeout: float = 10.0) -> str:
    """The first broker log line containing `needle` (the broker logs asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in broker.log_text().splitlines():
            if needle in line:
                return line
        if time.monotonic() > deadline:
            pytest.fail(f"no broker log line containing {needle!r}; log tail:\n{broker.log_text()[-3000:]}")
        time.sleep(0.05)


def closing_line(broker: InProcessBroker, local_port: int) -> str:
    return wait_for_log(broker, f"closing 127.0.0.1:{local_port}:")


def assert_round_trip(bootstrap: str, topic: str, n: int = 20) -> None:
    """A fresh kafka-python producer and consumer (default settings) round-trip `n` records."""
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    futures = [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i) for i in range(n)]
    producer.flush(timeout=20)
    offsets = [f.get(timeout=20).offset for f in futures]
    producer.close(timeout=10)
    first = offsets[0]
    assert offsets == list(range(first, first + n))
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, consumer_timeout_ms=10_000)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, first)
    got = []
    for msg in consumer:
        got.append((msg.offset, msg.key, msg.value))
        if len(got) == n:
            break
    consumer.close()
    assert got == [(first + i, b"k%d" % i, b"v%d" % i) for i in range(n)]


class Prober(threading.Thread):
    """A confluent-kafka producer (acks=all) sending one record every 20 ms, counting delivery reports."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True, name="prober")
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 0,
                "message.timeout.ms": 15_000,
                "log_level": 3,
            }
        )
        self.delivered = 0
        self.failures: list[str] = []
        self.stopping = threading.Event()

    def _report(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failures.append(str(err))
        else:
            self.delivered += 1

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            self.producer.produce(PROBE_TOPIC, value=b"probe-%d" % i, on_delivery=self._report)
            i += 1
            self.producer.poll(0.02)
        left = self.producer.flush(20)
        if left:
            self.failures.append(f"{left} records not delivered at the end")

    def wait_delivered(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.delivered < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.delivered >= count, f"prober stalled at {self.delivered} deliveries: {self.failures}"


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data = Path(tmp_path_factory.mktemp("malformed")) / "data"
    # Every malformed connection is checked for its own log line: no rate limiting of warnings here.
    env = {"LOGLAKE_IDLE_TIMEOUT_MS": str(IDLE_TIMEOUT_MS), "LOGLAKE_LOG_RATE_LIMIT_MS": "0"}
    with serving_in_process(data, env=env) as b:
        yield b


@pytest.fixture(scope="module")
def prober(broker: InProcessBroker) -> Iterator[Prober]:
    p = Prober(broker.bootstrap)
    p.start()
    p.wait_delivered(1)
    yield p
    p.stopping.set()
    p.join(30)
    assert not p.failures


@pytest.fixture(autouse=True)
def keeps_serving(broker: InProcessBroker, prober: Prober, request: pytest.FixtureRequest) -> Iterator[None]:
    """The well-behaved producer makes progress during the test and a fresh client works after it."""
    before = prober.delivered
    yield
    prober.wait_delivered(before + 5)
    assert not prober.failures
    assert broker.running, "the broker died"
    assert_round_trip(broker.bootstrap, "after-" + re.sub(r"[^A-Za-z0-9._-]", "_", request.node.name))


# ---------------------------------------------------------------------------------------- tests


def test_truncated_frame_then_close(broker: InProcessBroker) -> None:
    whole = metadata_frame()
    for cut in (1, 3, 4, 6, len(whole) // 2, len(whole) - 1):
        with socket.create_connection(_host_port(broker.bootstrap), timeout=5) as s:
            s.sendall(whole[:cut])
        # And a half-sent request followed by a half-close (FIN): the broker gives up on it.
        with socket.create_connection(_host_port(broker.bootstrap), timeout=5) as s:
            s.sendall(whole[:cut])
            s.shutdown(socket.SHUT_WR)
            wait_closed(s, 10)


def test_truncated_frame_then_wait_then_rest(broker: InProcessBroker) -> None:
    """Half a request, a pause (other clients are served meanwhile), then the rest: answered."""
    whole = metadata_frame(correlation_id=7)
    with (
        RawClient(broker.bootstrap) as other,
        socket.create_connection(_host_port(broker.bootstrap), timeout=10) as s,
    ):
        s.sendall(whole[: len(whole) // 2])
        time.sleep(0.5)
        assert (
            other.request(
                ApiVersionsRequest[3](client_software_name="t", client_software_version="1")
            ).error_code
            == 0
        )
        s.sendall(whole[len(whole) // 2 :])
        proto = KafkaProtocol(client_id="raw-test")
        proto.send_request(MetadataRequest[1](topics=None), correlation_id=7)
        proto.send_bytes()
        responses: list[Any] = []
        while not responses:
            data = s.recv(65536)
            assert data, "closed instead of answering"
            responses = proto.receive_bytes(data)
        ((corr, resp),) = responses
        assert corr == 7
        assert [b.port for b in resp.brokers] == [broker.port]


def test_request_sent_one_byte_at_a_time(broker: InProcessBroker) -> None:
    whole = metadata_frame(correlation_id=9)
    with socket.create_connection(_host_port(broker.bootstrap), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(whole)):
            s.sendall(whole[i : i + 1])
            time.sleep(0.005)
        head = s.recv(8)
        assert len(head) == 8 and struct.unpack(">i", head[4:8])[0] == 9


def test_truncated_frame_idle_is_closed(broker: InProcessBroker) -> None:
    """A partial request that is never completed is dropped after the idle timeout."""
    whole = metadata_frame()
    with socket.create_connection(_host_port(broker.bootstrap), timeout=10) as s:
        port = s.getsockname()[1]
        s.sendall(whole[:5])
        took = wait_closed(s, IDLE_TIMEOUT_MS / 1000 + 10)
    assert took >= IDLE_TIMEOUT_MS / 1000 * 0.9
    assert "idle" in closing_line(broker, port)


@pytest.mark.parametrize(
    "size",
    [2**31 - 1, 2**31 - 2**20, 100 * 1024 * 1024 + 1, -1, -(2**31), -4096],
    ids=["2GiB", "2GiB-1MiB", "limit+1", "minus1", "int32min", "minus4096"],
)
def test_bad_size_prefix_closes_with_log_line(broker: InProcessBroker, size: int) -> None:
    with socket.create_connection(_host_port(broker.bootstrap), timeout=10) as s:
        port = s.getsockname()[1]
        s.sendall(struct.pack(">i", size) + b"\x00" * 64)
        wait_closed(s, 10)
    line = closing_line(broker, port)
    assert f"frame size {size} outside 0..{100 * 1024 * 1024}" in line, line
    assert "WARNING" in line


def test_size_prefix_split_over_packets(broker: InProcessBroker) -> None:
    """The limit is checked from the 4 prefix bytes even when they arrive one by one."""
    with socket.create_connection(_host_port(broker.bootstrap), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        port = s.getsockname()[1]
        for b in struct.pack(">i", 2**31 - 1):
            s.sendall(bytes([b]))
            time.sleep(0.05)
        wait_closed(s, 10)
    assert "frame size 2147483647" in closing_line(broker, port)


def test_zero_length_frame(broker: InProcessBroker) -> None:
    with socket.create_connection(_host_port(broker.bootstrap), timeout=10) as s:
        port = s.getsockname()[1]
        s.sendall(struct.pack(">i", 0))
        wait_closed(s, 10)
    assert "malformed request" in closing_line(broker, port)


@pytest.mark.parametrize("api_key", [999, 4, -1, 32767])  # 4: LeaderAndIsr, between brokers only
def test_unknown_api_key(broker: InProcessBroker, api_key: int) -> None:
    with socket.create_connection(_host_port(broker.bootstrap), timeout=10) as s:
        port = s.getsockname()[1]
        s.sendall(framed(raw_header(api_key, 0, 31)))
        wait_closed(s, 10)
    line = closing_line(broker, port)
    assert f"unknown api key {api_key} (correlation id 31)" in line, line


@pytest.mark.parametrize(("api_key", "version"), [(3, 99), (3, -1), (0, 2), (1, 3), (0, 99)])
def test_unsupported_version(broker: InProcessBroker, api_key: int, version: int) -> None:
    """Metadata v99 etc.: the connection is closed with a log line (Kafka does the same)."""
    with socket.create_connection(_host_port(broker.bootstrap), timeout=10) as s:
        port = s.getsockname()[1]
        s.sendall(framed(raw_header(api_key, version, 32) + b"\x00" * 16))
        wait_closed(s, 10)
    line = closing_line(broker, port)
    assert f"api key {api_key} version {version} not supported (correlation id 32)" in line, line


def test_api_versions_v99_gets_kip511_answer(broker: InProcessBroker) -> None:
    """KIP-511: a v0 response with UNSUPPORTED_VERSION and our version list; the connection stays usable."""
    with RawClient(broker.bootstrap) as c:
        c.sock.sendall(framed(raw_header(18, 99, 4242) + b"\x00\x00future bytes we cannot parse"))
        head = b""
        while len(head) < 4:
            chunk = c.sock.recv(4 - len(head))
            assert chunk
            head += chunk
        (size,) = struct.unpack(">i", head)
        body = b""
        while len(body) < size:
            chunk = c.sock.recv(size - len(body))
            assert chunk
            body += chunk
        (corr,) = struct.unpack_from(">i", body)
        assert corr == 4242
        resp = ApiVersionsResponse.decode(body[4:], version=0)  # v0 header: correlation id only
        assert resp.error_code == 35  # UNSUPPORTED_VERSION
        kip511 = {(k.api_key, k.min_version, k.max_version) for k in resp.api_keys}
        assert (18, 0, 4) in kip511 and any(k == 3 for k, _lo, _hi in kip511)
        # Same connection: the client retries with a version we support, and gets the same list.
        normal = c.request(ApiVersionsRequest[3](client_software_name="raw", client_software_version="1"))
        assert normal.error_code == 0
        advertised = {(k.api_key, k.min_version, k.max_version) for k in normal.api_keys}
        assert kip511 == advertised, (
            f"KIP-511 list has {sorted(kip511 - advertised)} not advertised by ApiVersions v3; "
            f"missing {sorted(advertised - kip511)}"
        )


def test_malformed_body_after_valid_header(broker: InProcessBroker) -> None:
    # Metadata v1 whose topic array claims 1000 entries that are not there.
    with socket.create_connection(_host_port(broker.bootstrap), timeout=10) as s:
        port = s.getsockname()[1]
        s.sendall(framed(raw_header(3, 1, 33) + struct.pack(">i", 1000) + b"\x00\x01a"))
        wait_closed(s, 10)
    assert "malformed request (correlation id 33)" in closing_line(broker, port)


def _garbage_connection(bootstrap: str, seed: int) -> None:
    rng = random.Random(seed)
    kind = seed % 4
    if kind == 0:  # pure noise
        data = rng.randbytes(rng.randint(1, 4096))
    elif kind == 1:  # a plausible size prefix, noise inside
        body = rng.randbytes(rng.randint(0, 2048))
        data = framed(body)
    elif kind == 2:  # a valid header of a served API, noise body
        api_key, version = rng.choice([(0, 9), (1, 12), (2, 7), (3, 12), (3, 1), (10, 4), (18, 3), (22, 4)])
        data = framed(raw_header(api_key, version, seed) + rng.randbytes(rng.randint(0, 512)))
    else:  # a valid request with some bytes flipped
        buf = bytearray(metadata_frame(seed))
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(4, len(buf))
            buf[pos] ^= 1 << rng.randrange(8)
        data = bytes(buf)
    try:
        with socket.create_connection(_host_port(bootstrap), timeout=5) as s:
            s.sendall(data)
            s.settimeout(0.3)
            try:
                while s.recv(65536):
                    pass
            except (TimeoutError, ConnectionResetError):
                pass
    except (ConnectionResetError, BrokenPipeError):
        pass  # the broker closed while we were still sending: fine


def test_garbage_connections(broker: InProcessBroker) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda seed: _garbage_connection(broker.bootstrap, seed), range(400)))
    assert broker.running


def test_silent_client_is_closed_after_idle_timeout(broker: InProcessBroker) -> None:
    with socket.create_connection(_host_port(broker.bootstrap), timeout=10) as s:
        port = s.getsockname()[1]
        took = wait_closed(s, IDLE_TIMEOUT_MS / 1000 + 10)
    assert took >= IDLE_TIMEOUT_MS / 1000 * 0.9
    line = closing_line(broker, port)
    assert f"idle for {IDLE_TIMEOUT_MS / 1000:.0f} s" in line, line


def test_many_connections_at_once(broker: InProcessBroker) -> None:
    """1000 sockets open together, each pipelining ApiVersions + Metadata; all answered in order.

    Each sends right after connecting (opening 1000 takes longer than the 2 s idle timeout here)."""
    socks: list[RawClient] = []
    try:
        for i in range(1000):
            c = RawClient(broker.bootstrap, timeout=20)
            socks.append(c)
            c.proto.send_request(ApiVersionsRequest[0](), correlation_id=2 * i)
            c.proto.send_request(MetadataRequest[1](topics=None), correlation_id=2 * i + 1)
            c.sock.sendall(c.proto.send_bytes())
        for i, c in enumerate(socks):
            corr, resp = c.receive()
            assert corr == 2 * i and resp.error_code == 0
            corr, resp = c.receive()
            assert corr == 2 * i + 1 and [b.port for b in resp.brokers] == [broker.port]
    finally:
        for c in socks:
            c.close()


def test_pipelined_requests_beyond_inflight_limit(broker: InProcessBroker) -> None:
    """300 requests sent before reading any answer (the in-flight cap is 64): all answered in order."""
    with RawClient(broker.bootstrap, timeout=20) as c:
        for corr in range(300):
            c.proto.send_request(MetadataRequest[1](topics=None), correlation_id=corr)
        c.sock.sendall(c.proto.send_bytes())
        got = [c.receive()[0] for _ in range(300)]
    assert got == list(range(300))


def test_client_leaves_during_long_poll(broker: InProcessBroker) -> None:
    """A Fetch waiting for data whose client goes away: nothing to answer, the broker goes on."""
    assert_round_trip(broker.bootstrap, "longpoll-gone", 1)
    F = FetchRequest.FetchTopic
    req = FetchRequest[12](
        max_wait_ms=3000,
        min_bytes=1,
        topics=[
            F(
                topic="longpoll-gone",
                partitions=[F.FetchPartition(partition=0, fetch_offset=1, partition_max_bytes=1 << 20)],
            )
        ],
    )
    for _ in range(20):
        c = RawClient(broker.bootstrap)
        c.send(req)
        c.close()
    time.sleep(3.5)  # the parked fetches time out and find their connections gone
    assert broker.running


def test_pending_requests_of_a_reset_connection(broker: InProcessBroker) -> None:
    """RST (SO_LINGER 0) right after pipelining requests whose answers are still being written."""
    for _ in range(20):
        s = socket.create_connection(_host_port(broker.bootstrap), timeout=5)
        s.sendall(b"".join(metadata_frame(i) for i in range(50)))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    assert broker.running
