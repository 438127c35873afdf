"""Fuzzing the live broker (`loglake serve`) over TCP with the in-process fuzzers' requests.

Each case is one connection: a mutated (or freshly sampled, or random) request of any API and
version, framed, followed by a valid ApiVersions v0 "sentinel" request. The broker must either
close the connection or answer up to the sentinel within `ANSWER_TIMEOUT_S` (40 s: a Fetch may
be held for the 30 s long-poll cap). A frame it cannot decode is closed, a request it can is
answered (with an error code where it is wrong; an acks=0 Produce gets no answer, the sentinel
does). Between batches of `BATCH_CASES` a fresh
kafka-python producer and consumer round-trip records through the broker, and its log must hold
no traceback. Replay: LOGLAKE_FUZZ_SEED=<seed> LOGLAKE_FUZZ_CASE=broker:<index> runs cases 0..index
on a fresh broker (a case may need what earlier ones created, such as a topic).
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

import fuzz_protocol
from fuzzkit import (
    CASE_ENV,
    DEFAULT_SAMPLE_SEED,
    SEED_ENV,
    TargetResult,
    case_rng,
    replay_line,
    run_seed,
    write_report,
)
from loglake.broker.handlers.fetch import FETCH_WAIT_MS_MAX

from brokerkit import Broker, serving_broker

#: Cases of `make test`'s sample and of `make test-long`.
SAMPLE_CASES = 300
LONG_CASES = 10_000
#: Cases between two well-behaved round trips.
BATCH_CASES = 500
#: A connection neither answered nor closed after this long is a failure (a hang detector). A
#: Fetch may legitimately be held for the broker's long-poll cap (a fuzzed max_wait_ms is days).
ANSWER_TIMEOUT_S = FETCH_WAIT_MS_MAX / 1000 + 10.0
SENTINEL_CORRELATION_ID = 0x7FFF_FFF0
HEALTH_TOPIC = "fuzz-health"
#: ApiVersions v0 request (framed) with the sentinel correlation id and client id "fuzz".
SENTINEL = struct.pack(">ihhih", 14, 18, 0, SENTINEL_CORRELATION_ID, 4) + b"fuzz"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    data = Path(tmp_path_factory.mktemp("fuzz")) / "data"
    with serving_broker(data, env={"LOGLAKE_LOG_RATE_LIMIT_MS": "0"}) as b:
        yield b


def make_connection_bytes(rng: random.Random) -> tuple[bytes, bool]:
    """What one fuzz connection sends, and whether a sentinel answer may be expected after it."""
    kind = rng.random()
    if kind < 0.75:
        body = fuzz_protocol.make_mutated_request(rng)
    elif kind < 0.85:
        body = fuzz_protocol.make_fresh_request(rng)
    elif kind < 0.95:
        body = fuzz_protocol.make_random_frame(rng)
    else:  # a size prefix the broker must refuse outright
        bad = rng.choice([-1, -(2**31), 2**31 - 1, 200 * 1024 * 1024])
        return struct.pack(">i", bad) + rng.randbytes(rng.randint(0, 16)), False
    return struct.pack(">i", len(body)) + body, True


def _read_until_sentinel_or_close(sock: socket.socket) -> str | None:
    """None when closed or when the sentinel was answered; else what went wrong."""
    buf = b""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"neither answered nor closed within {ANSWER_TIMEOUT_S} s"
        sock.settimeout(left)
        try:
            data = sock.recv(1 << 16)
        except (ConnectionResetError, BrokenPipeError):
            return None
        except TimeoutError:
            continue
        if not data:
            return None
        buf += data
        while len(buf) >= 8:
            size, corr = struct.unpack_from(">ii", buf, 0)
            if size < 4:
                return f"response frame of size {size}"
            if len(buf) < 4 + size:
                break
            if corr == SENTINEL_CORRELATION_ID:
                return None
            buf = buf[4 + size :]


def fuzz_case(bootstrap: str, seed: int, index: int) -> str | None:
    payload, _framed = make_connection_bytes(case_rng(seed, "broker", index))
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=ANSWER_TIMEOUT_S) as sock:
        try:
            sock.sendall(payload + SENTINEL)
        except (ConnectionResetError, BrokenPipeError):
            return None  # closed while we were still sending: refused
        return _read_until_sentinel_or_close(sock)


def round_trip(bootstrap: str, n: int = 10) -> None:
    """A well-behaved client: kafka-python produce (acks=1) then fetch of the same records."""
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    futures = [producer.send(HEALTH_TOPIC, key=b"k%d" % i, value=b"v%d" % i) for i in range(n)]
    producer.flush(timeout=20)
    offsets = [f.get(timeout=20).offset for f in futures]
    producer.close(timeout=10)
    assert offsets == list(range(offsets[0], offsets[0] + n))
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, consumer_timeout_ms=10_000)
    tp = TopicPartition(HEALTH_TOPIC, 0)
    consumer.assign([tp])
    consumer.seek(tp, offsets[0])
    got = []
    for msg in consumer:
        got.append((msg.offset, msg.value))
        if len(got) == n:
            break
    consumer.close()
    assert got == [(offsets[0] + i, b"v%d" % i) for i in range(n)]


def run_broker_fuzz(broker: Broker, kind: str, seed: int, first: int, count: int) -> None:
    result = TargetResult("broker", seed, first)
    t0 = time.perf_counter()
    round_trip(broker.bootstrap)
    for start in range(first, first + count, BATCH_CASES):
        for index in range(start, min(first + count, start + BATCH_CASES)):
            problem = fuzz_case(broker.bootstrap, seed, index)
            result.cases += 1
            if problem is not None:
                result.failure_count += 1
                result.failures.append({"index": index, "error": problem, "traceback": "",
                                        "replay": replay_line("broker", seed, index).replace("test_fuzz.py -k replay",
                                                                                             "test_fuzz_broker.py")})
        assert broker.proc is not None and broker.proc.poll() is None, f"broker died in cases {start}.. (seed {seed})"
        assert "Traceback" not in broker.log_text(), f"traceback in the broker log in cases {start}.. (seed {seed})"
        round_trip(broker.bootstrap)
    result.seconds = time.perf_counter() - t0
    write_report(kind, seed, [result], result.seconds)
    assert not result.failures, "\n".join(f"case {f['index']}: {f['error']}\n  replay: {f['replay']}" for f in result.failures)


def _replay_case() -> int | None:
    raw = os.environ.get(CASE_ENV, "")
    return int(raw.split(":", 1)[1]) if raw.startswith("broker:") else None


def test_fuzz_broker_sample(broker: Broker) -> None:
    seed = int(os.environ.get(SEED_ENV) or DEFAULT_SAMPLE_SEED)
    index = _replay_case()
    print(f"broker fuzz sample seed {seed}")
    if index is not None:  # from case 0: a case may need the topics earlier cases created
        run_broker_fuzz(broker, "broker_replay", seed, 0, index + 1)
    else:
        run_broker_fuzz(broker, "broker_sample", seed, 0, SAMPLE_CASES)


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_fuzz_broker_long(broker: Broker) -> None:
    seed = run_seed()
    print(f"broker fuzz long-run seed {seed} (replay: {SEED_ENV}={seed} {CASE_ENV}=broker:<index>)")
    run_broker_fuzz(broker, "broker_long", seed, 0, LONG_CASES)
