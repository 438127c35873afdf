"""A broker on uvloop (`--event-loop uvloop`, the `fast` extra) serves the same data.

uvloop has no `loop.sendfile`: a Fetch of sealed segment data on a PLAINTEXT listener, which goes
out with sendfile on the standard loop, must fall back to buffered writes there instead of
failing the response. The topic's small `segment.bytes` makes most of the data sealed before it
is read. TLS listeners are refused on uvloop (some handshakes stall there).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tlskit import Pki, make_pki, ssl_args

from brokerkit import Broker, serving_broker

#: Records produced: 1 KiB each, so 4 MiB in 64 KiB segments.
RECORDS = 4096
#: The loglake command of this venv.
LOGLAKE = [sys.executable, "-m", "loglake.cli.main"]
#: How long a client call may take before the test gives up.
WAIT_S = 60.0

pytest.importorskip("uvloop", reason="uvloop is the fast extra's event loop; make test installs it")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Broker]:
    args = ["--listen", "127.0.0.1:0", "--event-loop", "uvloop"]
    with serving_broker(tmp_path_factory.mktemp("uvloop") / "data", args) as b:
        yield b


def consume_all(conf: dict[str, object], topic: str) -> list[bytes]:
    c = Consumer({**conf, "group.id": "g", "enable.auto.commit": False, "log_level": 0})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < RECORDS and time.monotonic() < deadline:
        for m in c.consume(500, 0.5):
            assert m.error() is None, m.error()
            got.append(m.value())
    c.close()
    return got


def test_sealed_data_through_plaintext_on_uvloop(broker: Broker) -> None:
    assert "event loop: uvloop" in broker.log_text()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    admin.create_topics([NewTopic("u", 1, 1, config={"segment.bytes": "65536"})])["u"].result(WAIT_S)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "log_level": 0})
    values = [b"%06d" % i + b"x" * 1018 for i in range(RECORDS)]
    for v in values:
        p.produce("u", v, partition=0)
    assert p.flush(WAIT_S) == 0
    assert consume_all({"bootstrap.servers": broker.bootstrap}, "u") == values


def test_tls_listeners_are_refused_on_uvloop(pki: Pki) -> None:
    args = ["serve", "--listen", "SSL://127.0.0.1:0", *ssl_args(pki), "--event-loop", "uvloop", "--print-config"]
    proc = subprocess.run([*LOGLAKE, *args], capture_output=True, text=True, timeout=WAIT_S)
    assert proc.returncode == 3, proc
    assert "event_loop=uvloop is not supported with SSL or SASL_SSL listeners" in proc.stderr
